//! Prometheus metrics of the journeys, for `dnstrace agent`: lookups and
//! their latency as each client pod saw them, the queries resolvers sent
//! upstream, anomalies, the kernel's drops, and the capture's own health.
//! Label names follow CoreDNS's where they mean the same (`type`, `rcode`,
//! `proto`, `family`, `server`, `to`), so its dashboards port by the
//! metric's name. Query names are labels only when asked for.
//!
//! Lookups over UDP, and resolvers' queries upstream, are counted where
//! the kernel counted them (`ingest::lookups`), before the ring: exact
//! whatever is sampled out or lost. Lookups over TCP, which sampling
//! never leaves out, are counted from their journeys, as are anomalies,
//! drops and, when asked for, lookups by name.
pub mod family;

use std::{collections::BTreeSet, fmt::Write as _, net::IpAddr};

use family::{single, Budget, Family, Histogram};

use crate::{
    correlate::{Journey, Outcome},
    decode::KernelNames,
    diagnose::{Anomaly, AnomalyKind},
    ingest::lookups::{CountStats, Counted, Ended},
    naming::Names,
    pipeline::Health,
    target::is_coredns,
};

/// What the metrics are asked for.
#[derive(Clone, Debug)]
pub struct MetricsOptions {
    /// Series of all metrics together; past it, observations go to an
    /// overflow series (`_overflow` labels) and are counted.
    pub max_series: usize,
    /// A series not observed for this long goes (a pod gone).
    pub series_ttl_ns: u64,
    /// Followed lookups by query name (`dnstrace_lookup_names_total`).
    pub query_names: bool,
    /// The node, in `dnstrace_build_info`.
    pub node: String,
}

impl Default for MetricsOptions {
    fn default() -> Self {
        Self {
            max_series: 10_000,
            series_ttl_ns: 15 * 60 * 1_000_000_000,
            query_names: false,
            node: String::new(),
        }
    }
}

const CLIENT: [&str; 4] = ["namespace", "pod", "workload", "workload_kind"];
const LOOKUP_LABELS: &[&str] = &[
    CLIENT[0], CLIENT[1], CLIENT[2], CLIENT[3], "server", "type", "rcode", "proto", "family",
];
const NAME_LABELS: &[&str] = &["namespace", "pod", "name", "type", "rcode"];
const DURATION_LABELS: &[&str] = &[
    CLIENT[0], CLIENT[1], CLIENT[2], CLIENT[3], "server", "rcode",
];

/// The capture's own counters, read each second where the kernel keeps
/// them (not through the pipeline).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Events the ring buffer had no room for.
    pub lost: u64,
    /// Packets left out by the kernel's sampling.
    pub sampled_out: u64,
    /// Laps of a query going round one place, counted and not sent.
    pub laps_left_out: u64,
    /// Runs of the programs the kernel skipped.
    pub skipped_runs: u64,
    /// Events that failed their checks.
    pub bad_events: u64,
    /// The node's conntrack race counters (`conntrack -S`), by name.
    pub conntrack: Vec<(&'static str, u64)>,
    /// The kernel's counting of lookups: what its tables had no room for.
    pub counting: CountStats,
}

/// Every metric the agent serves.
pub struct Metrics {
    options: MetricsOptions,
    budget: Budget,
    lookups: Family<u64>,
    names: Family<u64>,
    lookup_seconds: Family<Histogram>,
    upstream: Family<u64>,
    upstream_seconds: Family<Histogram>,
    anomalies: Family<u64>,
    drops: Family<u64>,
    health: Health,
    stats: Stats,
    journeys: u64,
    incomplete: u64,
    last_expiry_ns: u64,
}

/// A client as its labels: namespace, pod, workload and its kind, as
/// `Names` has them (empty where unknown).
struct Client<'a> {
    namespace: &'a str,
    pod: &'a str,
    workload: &'a str,
    kind: &'static str,
}

/// What a count is of: the server asked (or sent to), the question's type,
/// how it ended, and over what.
struct Seen<'a> {
    server: String,
    qtype: &'a str,
    rcode: &'a str,
    proto: &'static str,
}

impl<'a> Client<'a> {
    /// Its labels' values, in `CLIENT`'s order.
    fn labels(&self) -> [&'a str; 4] {
        [self.namespace, self.pod, self.workload, self.kind]
    }

    fn of(ip: IpAddr, names: &'a Names) -> Self {
        let (namespace, pod) = names
            .get(&ip)
            .and_then(|n| n.split_once('/'))
            .unwrap_or_default();
        let (workload, kind) = names
            .workload(&ip)
            .map_or(("", ""), |w| (w.name.as_str(), w.kind.as_str()));
        Self {
            namespace,
            pod,
            workload,
            kind,
        }
    }
}

impl Metrics {
    pub fn new(options: MetricsOptions) -> Self {
        Self {
            budget: Budget::new(options.max_series),
            lookups: Family::new(
                "dnstrace_lookups_total",
                "DNS queries clients sent, by the client pod, the server it asked, and how it ended (rcode, or TIMEOUT, DROPPED, UNKNOWN where the capture missed part of a TCP one). A retry is another query.",
                LOOKUP_LABELS,
            ),
            names: Family::new(
                "dnstrace_lookup_names_total",
                "Lookups followed whole, by query name (--metrics-query-names): under sampling, the followed share only (dnstrace_sampling_one_in).",
                NAME_LABELS,
            ),
            lookup_seconds: Family::new(
                "dnstrace_lookup_duration_seconds",
                "Time from a client's query to its answer, as the client's own interface saw them (answered queries only).",
                DURATION_LABELS,
            ),
            upstream: Family::new(
                "dnstrace_upstream_queries_total",
                "Queries a resolver on this node sent on for a client's query, by resolver pod and the server it sent to.",
                &["resolver_namespace", "resolver", "to", "type", "rcode", "proto"],
            ),
            upstream_seconds: Family::new(
                "dnstrace_upstream_duration_seconds",
                "Time from a resolver's upstream query to its answer (answered queries only).",
                &["resolver_namespace", "resolver", "to", "rcode"],
            ),
            anomalies: Family::new(
                "dnstrace_anomalies_total",
                "Journeys that showed an anomaly of this kind; an anomaly of the node (no journey) counts once when raised.",
                &["kind", "severity"],
            ),
            drops: Family::new(
                "dnstrace_kernel_drops_total",
                "DNS packets the kernel dropped, by its drop reason.",
                &["reason"],
            ),
            health: Health::default(),
            stats: Stats::default(),
            journeys: 0,
            incomplete: 0,
            last_expiry_ns: 0,
            options,
        }
    }

    /// Counts a closed journey: a lookup over TCP and its upstream
    /// queries over TCP (the kernel counts UDP), its name when asked for,
    /// its drops and anomalies.
    pub fn journey(
        &mut self,
        j: &Journey,
        badges: &[(AnomalyKind, String)],
        names: &Names,
        kernel: &KernelNames,
        now_ns: u64,
    ) {
        self.journeys += 1;
        self.incomplete += u64::from(j.incomplete.is_some());
        let client = Client::of(j.client.ip(), names);
        if j.tcp {
            self.tcp_lookup(j, &client, now_ns);
        }
        if self.options.query_names {
            let values = [
                client.namespace,
                client.pod,
                &j.name,
                j.qtype.name(),
                rcode(j),
            ];
            *self.names.at(&values, &mut self.budget, now_ns) += 1;
        }
        self.tcp_upstream(j, names, now_ns);
        self.drops_of(j, kernel, now_ns);
        let mut kinds: Vec<AnomalyKind> = badges.iter().map(|(k, _)| *k).collect();
        kinds.sort_unstable_by_key(|k| k.as_str());
        kinds.dedup();
        for k in kinds {
            self.anomaly_kind(k, now_ns);
        }
        self.expire(now_ns);
    }

    /// Anomalies fed by journeys already counted (see `JourneyOut::late`).
    pub fn late(&mut self, hits: &[(AnomalyKind, String)], now_ns: u64) {
        for (k, _) in hits {
            self.anomaly_kind(*k, now_ns);
        }
    }

    fn tcp_lookup(&mut self, j: &Journey, client: &Client, now_ns: u64) {
        let seen = Seen {
            server: j.origin().map(|o| o.dst.to_string()).unwrap_or_default(),
            qtype: j.qtype.name(),
            rcode: rcode(j),
            proto: "tcp",
        };
        let latency = answered_in(j).map(Histogram::of);
        self.lookups_of(client, family(j.client.ip()), &seen, 1, latency, now_ns);
    }

    /// Lookups the kernel counted: a resolver's are its queries upstream.
    pub fn counted(
        &mut self,
        c: &Counted,
        names: &Names,
        resolvers: &BTreeSet<IpAddr>,
        now_ns: u64,
    ) {
        let client = Client::of(c.client, names);
        let latency = Histogram::from_buckets(&c.buckets, c.answered, c.sum_ns as f64 / 1e9);
        // 0: the kernel could not read past the name.
        let qtype = if c.qtype.0 == 0 {
            "other"
        } else {
            c.qtype.name()
        };
        let seen = Seen {
            server: c.server.to_string(),
            qtype,
            rcode: ended(c.ended),
            proto: "udp",
        };
        let latency = (c.answered > 0).then_some(latency);
        if resolvers.contains(&c.client) || is_coredns(names.get(&c.client).unwrap_or_default()) {
            self.upstream_of(&client, &seen, c.count, latency, now_ns);
        } else {
            self.lookups_of(&client, family(c.client), &seen, c.count, latency, now_ns);
        }
        self.expire(now_ns);
    }

    /// An anomaly raised for the first time: counted here when no journey
    /// carries it (the node's own).
    pub fn anomaly(&mut self, a: &Anomaly, now_ns: u64) {
        if a.journeys.is_empty() {
            self.anomaly_kind(a.kind, now_ns);
        }
    }

    pub fn health(&mut self, h: &Health) {
        self.health = h.clone();
    }

    pub fn stats(&mut self, s: &Stats) {
        self.stats = s.clone();
    }

    fn anomaly_kind(&mut self, k: AnomalyKind, now_ns: u64) {
        let severity = k.severity().as_str();
        *self
            .anomalies
            .at(&[k.as_str(), severity], &mut self.budget, now_ns) += 1;
    }

    /// `n` lookups of `client`, and the answered ones' latency.
    fn lookups_of(
        &mut self,
        client: &Client,
        family: &str,
        seen: &Seen,
        n: u64,
        latency: Option<Histogram>,
        now_ns: u64,
    ) {
        let (who, server) = (client.labels(), seen.server.as_str());
        let values = [
            &who[..],
            &[server, seen.qtype, seen.rcode, seen.proto, family],
        ]
        .concat();
        *self.lookups.at(&values, &mut self.budget, now_ns) += n;
        if let Some(latency) = latency {
            let values = [&who[..], &[server, seen.rcode]].concat();
            self.lookup_seconds
                .at(&values, &mut self.budget, now_ns)
                .merge(&latency);
        }
    }

    /// `n` queries resolver `r` sent upstream, and the answered ones' latency.
    fn upstream_of(
        &mut self,
        r: &Client,
        seen: &Seen,
        n: u64,
        latency: Option<Histogram>,
        now_ns: u64,
    ) {
        let to = seen.server.as_str();
        let values = [r.namespace, r.pod, to, seen.qtype, seen.rcode, seen.proto];
        *self.upstream.at(&values, &mut self.budget, now_ns) += n;
        if let Some(latency) = latency {
            let values = [r.namespace, r.pod, to, seen.rcode];
            self.upstream_seconds
                .at(&values, &mut self.budget, now_ns)
                .merge(&latency);
        }
    }

    /// The queries over TCP a journey's resolvers sent upstream, at every
    /// depth (the kernel counts those over UDP).
    fn tcp_upstream(&mut self, j: &Journey, names: &Names, now_ns: u64) {
        for u in &j.upstream {
            if u.tcp {
                let seen = Seen {
                    server: u.origin().map(|o| o.dst.to_string()).unwrap_or_default(),
                    qtype: u.qtype.name(),
                    rcode: rcode(u),
                    proto: "tcp",
                };
                let latency = answered_in(u).map(Histogram::of);
                let resolver = Client::of(u.client.ip(), names);
                self.upstream_of(&resolver, &seen, 1, latency, now_ns);
            }
            self.tcp_upstream(u, names, now_ns);
        }
    }

    fn drops_of(&mut self, j: &Journey, kernel: &KernelNames, now_ns: u64) {
        for (reason, _) in j.legs.iter().filter_map(|l| l.drop.as_deref()) {
            let name = kernel.drop_reason(*reason);
            *self.drops.at(&[&name], &mut self.budget, now_ns) += 1;
        }
        for u in &j.upstream {
            self.drops_of(u, kernel, now_ns);
        }
    }

    /// Series quiet past the time to live go, at most once a minute.
    fn expire(&mut self, now_ns: u64) {
        const EVERY_NS: u64 = 60_000_000_000;
        if now_ns.saturating_sub(self.last_expiry_ns) < EVERY_NS {
            return;
        }
        self.last_expiry_ns = now_ns;
        let before = now_ns.saturating_sub(self.options.series_ttl_ns);
        let b = &mut self.budget;
        self.lookups.expire(before, b);
        self.names.expire(before, b);
        self.lookup_seconds.expire(before, b);
        self.upstream.expire(before, b);
        self.upstream_seconds.expire(before, b);
        self.anomalies.expire(before, b);
        self.drops.expire(before, b);
    }

    /// The page `/metrics` serves.
    pub fn render(&self, out: &mut String) {
        for f in [
            &self.lookups,
            &self.names,
            &self.upstream,
            &self.anomalies,
            &self.drops,
        ] {
            f.write(out);
        }
        self.lookup_seconds.write(out);
        self.upstream_seconds.write(out);
        self.render_health(out);
    }

    fn render_health(&self, out: &mut String) {
        let (h, s) = (&self.health, &self.stats);
        let counters: [(&str, &str, u64); 11] = [
            ("dnstrace_journeys_total", "Journeys closed (lookups and the upstream queries not linked under one).", self.journeys),
            ("dnstrace_journeys_incomplete_total", "Journeys that may miss legs or their answer (events lost, capture ended, TCP bytes missed).", self.incomplete),
            ("dnstrace_journeys_evicted_total", "Journeys evicted because too many were open at once.", h.evicted),
            ("dnstrace_events_lost_total", "Kernel events lost because the ring buffer was full.", s.lost),
            ("dnstrace_sampled_out_total", "Packets the kernel left out by sampling (whole lookups, never counted above).", s.sampled_out),
            ("dnstrace_query_laps_left_out_total", "Laps of a query going round one place (a forwarding loop) the kernel counted and did not send (the 1st, 2nd, 4th, 8th... are).", s.laps_left_out),
            ("dnstrace_skipped_runs_total", "Runs of the eBPF programs the kernel skipped (one already running on that CPU).", s.skipped_runs),
            ("dnstrace_bad_events_total", "Kernel events that failed their checks and were not decoded.", s.bad_events),
            ("dnstrace_lookups_unfollowed_total", "UDP queries the kernel could not follow to their answer: its table of pending queries was full (not in dnstrace_lookups_total).", s.counting.pending_full),
            ("dnstrace_lookups_uncounted_total", "UDP lookups the kernel could not count: its table of counts was full (not in dnstrace_lookups_total).", s.counting.counts_full),
            ("dnstrace_metric_series_overflow_total", "Observations counted in an _overflow series because the series limit was reached.", self.budget.overflowed),
        ];
        for (name, help, v) in counters {
            single(out, name, "counter", help, v);
        }
        let gauges: [(&str, &str, u64); 4] = [
            (
                "dnstrace_journeys_open",
                "Journeys being followed now.",
                h.open as u64,
            ),
            (
                "dnstrace_sampling_one_in",
                "The sampling level: 1 lookup in this many is followed (1: every one; 0: none now, between the agent's windows of following).",
                u64::from(h.one_in),
            ),
            (
                "dnstrace_metric_series",
                "Series of the metrics above.",
                self.budget.used() as u64,
            ),
            (
                "dnstrace_metric_series_limit",
                "The most series kept (--max-series).",
                self.budget.limit() as u64,
            ),
        ];
        for (name, help, v) in gauges {
            single(out, name, "gauge", help, v);
        }
        if !s.conntrack.is_empty() {
            let _ = writeln!(out, "# HELP dnstrace_conntrack_stat_total The node's conntrack statistics that move when inserts race or fail (conntrack -S).\n# TYPE dnstrace_conntrack_stat_total counter");
            for (name, v) in &s.conntrack {
                let _ = writeln!(out, "dnstrace_conntrack_stat_total{{stat=\"{name}\"}} {v}");
            }
        }
        let _ = writeln!(
            out,
            "# HELP dnstrace_build_info dnstrace's version, and the node it runs on.\n# TYPE dnstrace_build_info gauge\ndnstrace_build_info{{version=\"{}\",node=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            self.options.node.replace(['\\', '"', '\n'], "_"),
        );
    }
}

/// How a lookup the kernel counted ended, as `rcode` says it.
fn ended(e: Ended) -> &'static str {
    match e {
        Ended::Answered(rcode) => rcode.name(),
        Ended::Timeout => "TIMEOUT",
        Ended::Dropped => "DROPPED",
    }
}

/// Seconds from the client's query to its answer, for an answered journey.
fn answered_in(j: &Journey) -> Option<f64> {
    let answered = matches!(j.outcome, Outcome::Answered { .. });
    Some(j.answered_in_ns().filter(|_| answered)? as f64 / 1e9)
}

fn rcode(j: &Journey) -> &'static str {
    match (&j.outcome, j.incomplete) {
        (Outcome::Answered { rcode, .. }, _) => rcode.name(),
        (Outcome::Dropped { .. }, _) => "DROPPED",
        (Outcome::Timeout, Some(_)) => "UNKNOWN",
        (Outcome::Timeout, None) => "TIMEOUT",
    }
}

/// CoreDNS's `family`: 1 for IPv4, 2 for IPv6.
fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "1"
    } else {
        "2"
    }
}

#[cfg(test)]
mod tests;
