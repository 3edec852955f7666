//! Diagnosis: rules over finished journeys (and the node's conntrack
//! counters) that name what went wrong, show the evidence, and give the
//! likely cause and the usual fix. Pure: journeys in, anomalies out.
//! Repeats of one problem are one anomaly with a rising count.
mod anomaly;
mod bridged;
mod config;
mod conntrack;
mod context;
mod endpoints;
mod kind;
mod legs;
mod loops;
mod memory;
mod mtu;
mod nat;
mod nodes;
mod outcome;
mod places;
mod rules;
mod search;
mod slow;
mod transport;
mod upstream;

use std::net::IpAddr;

pub use self::{
    anomaly::{Anomaly, Checked},
    context::{ConntrackAtStart, Context, Translation},
    kind::{AnomalyKind, Severity},
};
use self::{
    anomaly::{Finding, Raised},
    conntrack::CtSeen,
    endpoints::{Endpoints, Whose},
    memory::Recent,
    mtu::PathSizes,
    nat::LocalListeners,
    rules::Known,
    search::MissCosts,
    slow::SlowAnswers,
    transport::Pending,
    upstream::Upstreams,
};
use crate::{
    correlate::{Connection, Journey},
    decode::{KernelNames, Qtype},
    pods::resolv::ResolvConf,
    target::follow::Refresh,
};

pub struct Diagnoser {
    ctx: Context,
    raised: Raised,
    upstream: Upstreams,
    endpoints: Endpoints,
    paths: PathSizes,
    recent: Recent,
    miss_costs: MissCosts,
    slow: SlowAnswers,
    truncated: Pending,
    local: LocalListeners,
    ct: CtSeen,
    /// When kernel event losses were last noticed.
    lost_ns: Option<u64>,
}

impl Diagnoser {
    pub fn new(ctx: Context) -> Self {
        Self {
            ctx,
            raised: Raised::default(),
            upstream: Upstreams::default(),
            endpoints: Endpoints::default(),
            paths: PathSizes::default(),
            recent: Recent::default(),
            miss_costs: MissCosts::default(),
            slow: SlowAnswers::default(),
            truncated: Pending::default(),
            local: LocalListeners::default(),
            ct: CtSeen::default(),
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
        found.extend(target_checks(ctx));
        self.raised.record(found, now_ns, None).raised
    }

    /// The target's pod was re-created: its new sandbox is judged from
    /// now on, its resolv.conf too where it was read; returns what that
    /// raises.
    pub fn retarget(&mut self, to: Retarget, now_ns: u64) -> Vec<Anomaly> {
        let Some(t) = &mut self.ctx.target else {
            return Vec::new();
        };
        t.netns_inode = to.netns_inode;
        t.addrs = to.addrs;
        if to.resolv.is_some() {
            t.resolv = to.resolv;
        }
        let found = target_checks(&self.ctx);
        self.raised.record(found, now_ns, None).raised
    }

    /// The node's pods changed: names for evidence, and a node a cluster
    /// view joined, for the rules that know nodes.
    pub fn pods(&mut self, refresh: &Refresh) {
        self.ctx.rename(&refresh.names);
        if let Some(j) = &refresh.joined {
            self.ctx.join(j);
        }
    }

    /// The node's conntrack counters moved: (name, increase).
    pub fn counters_moved(&mut self, moved: &[(&'static str, u64)], now_ns: u64) -> Vec<Anomaly> {
        let found = conntrack::insert_failed(moved, now_ns, &mut self.ct, &self.ctx);
        self.raised
            .record(found.into_iter().collect(), now_ns, None)
            .raised
    }

    /// The kernel lost events, noticed at `now_ns`: what was not seen since
    /// is no evidence.
    pub fn lost(&mut self, now_ns: u64) {
        self.lost_ns = Some(now_ns);
    }

    /// The other half of a parallel A/AAAA pair that `j`'s diagnosis
    /// needs closed first, if it does: a caller holds `j` back while a
    /// journey for that question (same socket and name) is still open.
    pub fn awaits(&self, j: &Journey) -> Option<Qtype> {
        conntrack::sibling_of(j)
    }

    /// Checks a finished journey: the anomalies it raised for the first
    /// time, and those it fed (its badges).
    pub fn journey(&mut self, j: &Journey, names: &KernelNames) -> Checked {
        self.ctx.learn_namespaces(&j.legs);
        self.upstream.count(j);
        let (down, down_before): (Vec<_>, Vec<_>) = self
            .endpoints
            .count(j, &self.ctx)
            .into_iter()
            .partition(|(_, whose)| *whose == Whose::This);
        // Findings about earlier journeys, not this one.
        let mut before: Vec<Finding> = down_before.into_iter().map(|(f, _)| f).collect();
        before.extend(self.paths.count(j, &self.ctx));
        self.truncated.await_tcp_retry(j);
        let backed = self.ct.journey(j, names);
        let recent = self.recent.of(j);
        let miss_cost = self.miss_costs.count(j, &recent);
        let known = Known {
            ctx: &self.ctx,
            upstream: &self.upstream,
            paths: &self.paths,
            recent: &recent,
            names,
            local: &self.local,
            ct: &self.ct,
            miss_costs: &self.miss_costs,
            miss_cost,
        };
        let mut found = rules::findings(j, &known);
        if j.is_lookup() {
            found.extend(self.slow.judge(j, &self.ctx));
        }
        found.extend(backed);
        found.extend(down.into_iter().map(|(f, _)| f));
        let mut checked = self.raised.record(found, j.ended_ns, Some(j.id));
        let earlier = self.raised.record(before, j.ended_ns, None);
        checked.raised.extend(earlier.raised);
        self.local.note(j, &self.ctx);
        self.recent.remember(j);
        checked
    }

    /// Raises truncated answers whose TCP retry did not come in time;
    /// `retried(client, name, qtype, since_ns)` says whether the client
    /// turned to TCP after all (a journey not finished yet, or one whose
    /// messages could not be read). Its hits are of journeys already out.
    pub fn tick(
        &mut self,
        now_ns: u64,
        retried: impl Fn(IpAddr, &str, Qtype, u64) -> bool,
    ) -> Checked {
        let mut checked = Checked::default();
        for t in self.truncated.expired(now_ns) {
            // Events lost since the answer: the retry may be among them.
            let unseen = self.lost_ns.is_some_and(|l| l >= t.answered_ns);
            if !unseen && !retried(t.client, &t.name, t.qtype, t.answered_ns) {
                let found = vec![transport::no_tcp_retry(&t)];
                checked.merge(self.raised.record(found, now_ns, Some(t.journey)));
            }
        }
        checked
    }

    /// TCP connections to a DNS server that were never set up (reset, or
    /// no SYN-ACK within a timeout), with the truncated UDP answer that
    /// sent the client there, if one did: its hits are of that journey,
    /// already out.
    pub fn connections_failed(
        &mut self,
        failed: &[Connection],
        names: &KernelNames,
        now_ns: u64,
    ) -> Checked {
        let mut checked = Checked::default();
        // Events lost since its SYN: the SYN-ACK may be among them.
        let lost_ns = self.lost_ns;
        let unseen = |c: &&Connection| lost_ns.is_some_and(|l| l >= c.syn_ns);
        for c in failed.iter().filter(|c| !unseen(c)) {
            let led = self.recent.truncated_before(c);
            let found = transport::tcp_unreachable(c, led, names);
            let journey = led.map(|a| a.journey);
            checked.merge(self.raised.record(vec![found], now_ns, journey));
        }
        checked
    }

    /// Every anomaly raised so far, most severe first.
    pub fn summary(&self) -> Vec<&Anomaly> {
        let mut all: Vec<&Anomaly> = self.raised.all().collect();
        all.sort_by(|a, b| b.severity.cmp(&a.severity).then(b.count.cmp(&a.count)));
        all
    }
}

/// Where the target's pod went when it was re-created.
pub struct Retarget {
    pub netns_inode: u32,
    pub addrs: Vec<IpAddr>,
    pub resolv: Option<ResolvConf>,
}

/// What the target's resolv.conf says, before any traffic.
fn target_checks(ctx: &Context) -> Vec<Finding<'_>> {
    let Some(t) = &ctx.target else {
        return Vec::new();
    };
    [
        config::resolv_loopback(t),
        config::resolv_foreign_search(t, &ctx.node_search),
    ]
    .into_iter()
    .flatten()
    .collect()
}

#[cfg(test)]
mod tests;
