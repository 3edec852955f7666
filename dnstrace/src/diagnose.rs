//! Diagnosis: rules over finished journeys (and the node's conntrack
//! counters) that name what went wrong, show the evidence, and give the
//! likely cause and the usual fix. Pure: journeys in, anomalies out.
//! Repeats of one problem are one anomaly with a rising count.
mod anomaly;
mod config;
mod conntrack;
mod context;
mod kind;
mod legs;
mod loops;
mod memory;
mod nat;
mod outcome;
mod rules;
mod search;
mod transport;
mod upstream;

use std::{collections::BTreeMap, net::IpAddr};

pub use self::{
    anomaly::Anomaly,
    context::{ConntrackAtStart, Context},
    kind::{AnomalyKind, Severity},
};
use self::{
    anomaly::{Finding, JOURNEYS_KEPT, MAX_ANOMALIES},
    memory::{Asked, Recent},
    rules::Seen,
    transport::Pending,
    upstream::Upstreams,
};
use crate::{
    correlate::{Connection, Journey},
    decode::KernelNames,
};

pub struct Diagnoser {
    ctx: Context,
    active: BTreeMap<(AnomalyKind, String), Anomaly>,
    upstream: Upstreams,
    recent: Recent,
    truncated: Pending,
    /// (kind, summary) of every anomaly the last journey checked fed.
    hits: Vec<(AnomalyKind, String)>,
    /// When kernel event losses were last noticed.
    lost_ns: Option<u64>,
}

impl Diagnoser {
    pub fn new(ctx: Context) -> Self {
        Self {
            ctx,
            active: BTreeMap::new(),
            upstream: Upstreams::default(),
            recent: Recent::default(),
            truncated: Pending::default(),
            hits: Vec::new(),
            lost_ns: None,
        }
    }

    /// Checks what can be known before any traffic; returns what it raises.
    pub fn static_checks(&mut self, now_ns: u64) -> Vec<Anomaly> {
        let ctx = &self.ctx;
        let mut found: Vec<Finding> = [
            config::bridge_nf_off(ctx),
            config::br_netfilter_not_loaded(ctx),
        ]
        .into_iter()
        .flatten()
        .collect();
        if let Some(ct) = &ctx.conntrack {
            found.extend(conntrack::conntrack_drops_before_start(ct));
            found.extend(conntrack::conntrack_table_full(ct));
        }
        if let Some(t) = &ctx.target {
            found.extend(config::resolv_loopback(t));
            found.extend(config::resolv_foreign_search(t));
        }
        self.record(found, now_ns, None)
    }

    /// The node's conntrack counters moved: (name, increase).
    pub fn counters_moved(&mut self, moved: &[(&'static str, u64)], now_ns: u64) -> Vec<Anomaly> {
        let found = conntrack::insert_failed(moved).into_iter().collect();
        self.record(found, now_ns, None)
    }

    /// The kernel lost events, noticed at `now_ns`: what was not seen since
    /// is no evidence.
    pub fn lost(&mut self, now_ns: u64) {
        self.lost_ns = Some(now_ns);
    }

    /// Checks a finished journey; returns anomalies raised for the first time.
    pub fn journey(&mut self, j: &Journey, names: &KernelNames) -> Vec<Anomaly> {
        self.hits.clear();
        self.upstream.count(j);
        self.truncated.await_tcp_retry(j);
        let found = self.findings(j, &self.recent.of(j), names);
        self.recent.remember(j);
        self.record(found, j.ended_ns, Some(j.id))
    }

    /// Raises truncated answers whose TCP retry did not come in time;
    /// `retried(client, name, qtype, since_ns)` says whether the client
    /// turned to TCP after all (a journey not finished yet, or one whose
    /// messages could not be read).
    pub fn tick(
        &mut self,
        now_ns: u64,
        retried: impl Fn(IpAddr, &str, &str, u64) -> bool,
    ) -> Vec<Anomaly> {
        self.hits.clear();
        let mut new = Vec::new();
        for t in self.truncated.expired(now_ns) {
            // Events lost since the answer: the retry may be among them.
            let unseen = self.lost_ns.is_some_and(|l| l >= t.answered_ns);
            if !unseen && !retried(t.client, &t.name, t.qtype, t.answered_ns) {
                let found = vec![transport::no_tcp_retry(&t)];
                new.extend(self.record(found, now_ns, Some(t.journey)));
            }
        }
        new
    }

    /// TCP connections to a DNS server that were never set up (reset, or
    /// no SYN-ACK within a timeout), with the truncated UDP answer that
    /// sent the client there, if one did.
    pub fn connections_failed(
        &mut self,
        failed: &[Connection],
        names: &KernelNames,
        now_ns: u64,
    ) -> Vec<Anomaly> {
        self.hits.clear();
        let mut new = Vec::new();
        // Events lost since its SYN: the SYN-ACK may be among them.
        let lost_ns = self.lost_ns;
        let unseen = |c: &&Connection| lost_ns.is_some_and(|l| l >= c.syn_ns);
        for c in failed.iter().filter(|c| !unseen(c)) {
            let led = self.recent.truncated_before(c);
            let found = transport::tcp_unreachable(c, led, names);
            new.extend(self.record(vec![found], now_ns, led.map(|a| a.journey)));
        }
        new
    }

    /// The anomalies (kind, summary) the last checked journey fed, new or
    /// already raised: a view's badges.
    pub fn hits(&self) -> &[(AnomalyKind, String)] {
        &self.hits
    }

    /// Every anomaly raised so far, most severe first.
    pub fn summary(&self) -> Vec<&Anomaly> {
        let mut all: Vec<&Anomaly> = self.active.values().collect();
        all.sort_by(|a, b| b.severity.cmp(&a.severity).then(b.count.cmp(&a.count)));
        all
    }

    /// What the journey rules find in `j`, given what its client asked
    /// lately.
    fn findings(&self, j: &Journey, recent: &[&Asked], names: &KernelNames) -> Vec<Finding> {
        let seen = Seen {
            ctx: &self.ctx,
            upstream: &self.upstream,
            recent,
            names,
        };
        let raised = |kind, key: &str| self.active.contains_key(&(kind, key.to_owned()));
        rules::findings(j, &seen, &raised)
    }

    fn record(&mut self, found: Vec<Finding>, now_ns: u64, journey: Option<u64>) -> Vec<Anomaly> {
        let mut new = Vec::new();
        for f in found {
            let key = (f.kind, f.key);
            if !self.active.contains_key(&key) && self.active.len() >= MAX_ANOMALIES {
                continue;
            }
            let a = self.active.entry(key).or_insert_with(|| Anomaly {
                kind: f.kind,
                severity: f.severity,
                summary: f.summary,
                evidence: f.evidence,
                cause: f.cause,
                fix: f.fix,
                journeys: Vec::new(),
                count: 0,
                first_ns: now_ns,
                last_ns: now_ns,
            });
            a.count += 1;
            a.last_ns = a.last_ns.max(now_ns);
            if let Some(id) = journey {
                self.hits.push((a.kind, a.summary.clone()));
                if a.journeys.len() == JOURNEYS_KEPT {
                    a.journeys.remove(0);
                }
                a.journeys.push(id);
            }
            if a.count == 1 {
                new.push(a.clone());
            }
        }
        new
    }
}

#[cfg(test)]
mod tests;
