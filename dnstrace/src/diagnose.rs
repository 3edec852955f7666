//! Diagnosis: rules over finished journeys (and the node's conntrack
//! counters) that name what went wrong, show the evidence, and give the
//! likely cause and the usual fix. Pure: journeys in, anomalies out.
//! Repeats of one problem are one anomaly with a rising count.
use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fmt,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use serde::{Serialize, Serializer};

use crate::{
    correlate::{Connection, Journey, Leg, Outcome, Reset},
    decode::KernelNames,
    target::Target,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Critical,
}

/// Every kind of anomaly the rules raise: the one list of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AnomalyKind {
    BrNetfilterNotLoaded,
    BridgeNfCallIptablesOff,
    ConntrackDropsBeforeStart,
    ConntrackInsertFailed,
    ConntrackTableNearlyFull,
    DnsTcpUnreachable,
    Dropped,
    FailingAnswers,
    ForeignSearchDomain,
    ForwardingLoop,
    FragmentLost,
    LoopbackNameserver,
    NdotsAmplification,
    ParallelQueryLost,
    ReplyFromUnexpectedSource,
    SearchDomainLeak,
    ServiceNotTranslated,
    SlowAnswers,
    TruncatedWithoutTcpRetry,
    Unanswered,
    UpstreamTimeout,
}

impl AnomalyKind {
    /// The stable name the outputs print, e.g. `reply_from_unexpected_source`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BrNetfilterNotLoaded => "br_netfilter_not_loaded",
            Self::BridgeNfCallIptablesOff => "bridge_nf_call_iptables_off",
            Self::ConntrackDropsBeforeStart => "conntrack_drops_before_start",
            Self::ConntrackInsertFailed => "conntrack_insert_failed",
            Self::ConntrackTableNearlyFull => "conntrack_table_nearly_full",
            Self::DnsTcpUnreachable => "dns_tcp_unreachable",
            Self::Dropped => "dropped",
            Self::FailingAnswers => "failing_answers",
            Self::ForeignSearchDomain => "foreign_search_domain",
            Self::ForwardingLoop => "forwarding_loop",
            Self::FragmentLost => "fragment_lost",
            Self::LoopbackNameserver => "loopback_nameserver",
            Self::NdotsAmplification => "ndots_amplification",
            Self::ParallelQueryLost => "parallel_query_lost",
            Self::ReplyFromUnexpectedSource => "reply_from_unexpected_source",
            Self::SearchDomainLeak => "search_domain_leak",
            Self::ServiceNotTranslated => "service_not_translated",
            Self::SlowAnswers => "slow_answers",
            Self::TruncatedWithoutTcpRetry => "truncated_without_tcp_retry",
            Self::Unanswered => "unanswered",
            Self::UpstreamTimeout => "upstream_timeout",
        }
    }
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for AnomalyKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Ordered by name, as the kinds' strings were: anomalies of equal
/// severity and count keep their order in the summary.
impl Ord for AnomalyKind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for AnomalyKind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Anomaly {
    pub kind: AnomalyKind,
    pub severity: Severity,
    pub summary: String,
    pub evidence: Vec<String>,
    pub cause: String,
    pub fix: &'static str,
    /// The most recent journeys behind it (at most `JOURNEYS_KEPT`).
    pub journeys: Vec<u64>,
    pub count: u64,
    pub first_ns: u64,
    pub last_ns: u64,
}

const JOURNEYS_KEPT: usize = 16;
/// Distinct anomalies kept; a flood of new keys stops growing memory here.
const MAX_ANOMALIES: usize = 1024;
/// An answer slower than this, most of it in one place, is worth a word.
const SLOW_NS: u64 = 200_000_000;
/// Search-list NXDOMAINs costing this much before an answer are worth a word.
const AMPLIFICATION_NS: u64 = 100_000_000;
/// Questions remembered per client, and clients remembered, for the
/// lookup-level rules.
const RECENT_PER_CLIENT: usize = 32;
const RECENT_CLIENTS: usize = 4096;
/// How far back a lookup's earlier search-list queries are looked for.
const LOOKUP_WINDOW_NS: u64 = 15_000_000_000;

/// A client's recent question: what, from which port, how it ended, when.
#[derive(Clone, Debug)]
struct Asked {
    name: Arc<str>,
    qtype: &'static str,
    port: u16,
    answered: bool,
    nxdomain: bool,
    /// Answered with TC set over UDP: the client should turn to TCP.
    truncated: bool,
    journey: u64,
    started_ns: u64,
    ended_ns: u64,
    /// It may miss legs (see `Gap`): its times may be wrong.
    incomplete: bool,
}

/// The two queries of a parallel pair leave their socket this close together.
const PAIR_NS: u64 = 50_000_000;

/// What the rules know about the node besides journeys.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// Cluster IPs of services with port 53, from kube-proxy's rules.
    pub service_ips: BTreeSet<IpAddr>,
    /// The node's net.bridge.bridge-nf-call-iptables, when it could be read.
    pub bridge_nf_call_iptables: Option<String>,
    /// Inode of the node's network namespace: other namespaces are pods.
    pub node_netns: u32,
    /// The node's conntrack counters and table size when tracing started.
    pub conntrack: Option<ConntrackAtStart>,
    /// The pod (or namespace, process) being traced, with its resolv.conf.
    pub target: Option<Target>,
}

#[derive(Clone, Debug, Default)]
pub struct ConntrackAtStart {
    /// Counters of packets conntrack dropped since boot (name, value).
    pub dropped: Vec<(&'static str, u64)>,
    pub entries: u64,
    /// net.netfilter.nf_conntrack_max, when it could be read.
    pub max: Option<u64>,
}

/// A conntrack table this full starts dropping new flows soon.
const TABLE_FULL_PERCENT: u64 = 90;
/// How long a client has to retry over TCP after a truncated answer.
const TCP_RETRY_NS: u64 = 1_000_000_000;
/// Truncated answers waiting for their TCP retry, at most.
const MAX_PENDING: usize = 4096;

/// A truncated UDP answer whose TCP retry has not been seen yet.
struct Truncated {
    client: IpAddr,
    server: SocketAddr,
    name: Arc<str>,
    qtype: &'static str,
    journey: u64,
    answered_ns: u64,
}

/// One rule's verdict on one journey, before deduplication.
struct Finding {
    kind: AnomalyKind,
    severity: Severity,
    /// What makes two findings the same problem (with `kind`).
    key: String,
    summary: String,
    evidence: Vec<String>,
    cause: String,
    fix: &'static str,
}

/// Whether the anomaly of this kind and key is raised already.
type Raised<'a> = dyn Fn(AnomalyKind, &str) -> bool + 'a;

impl Finding {
    /// One more of an anomaly already raised: only what makes it the same
    /// problem, as the rules that fire on every journey of a storm (drops,
    /// timeouts, failing or slow answers) would otherwise write evidence
    /// thousands of times a second for nobody.
    fn again(kind: AnomalyKind, key: String) -> Self {
        Self {
            kind,
            severity: Severity::Warning,
            key,
            summary: String::new(),
            evidence: Vec::new(),
            cause: String::new(),
            fix: "",
        }
    }
}

pub struct Diagnoser {
    ctx: Context,
    active: BTreeMap<(AnomalyKind, String), Anomaly>,
    upstream: BTreeMap<SocketAddr, UpstreamStats>,
    recent: BTreeMap<IpAddr, VecDeque<Asked>>,
    truncated: VecDeque<Truncated>,
    /// (kind, summary) of every anomaly the last journey checked fed.
    hits: Vec<(AnomalyKind, String)>,
    /// When kernel event losses were last noticed.
    lost_ns: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default)]
struct UpstreamStats {
    queries: u64,
    answers: u64,
    timeouts: u64,
    total_ns: u64,
}

impl Diagnoser {
    pub fn new(ctx: Context) -> Self {
        Self {
            ctx,
            active: BTreeMap::new(),
            upstream: BTreeMap::new(),
            recent: BTreeMap::new(),
            truncated: VecDeque::new(),
            hits: Vec::new(),
            lost_ns: None,
        }
    }

    /// Checks what can be known before any traffic; returns what it raises.
    pub fn static_checks(&mut self, now_ns: u64) -> Vec<Anomaly> {
        let mut found = Vec::new();
        if self.ctx.bridge_nf_call_iptables.as_deref() == Some("0") {
            found.push(Finding {
                kind: AnomalyKind::BridgeNfCallIptablesOff,
                severity: Severity::Critical,
                key: String::new(),
                summary: "net.bridge.bridge-nf-call-iptables is 0 on the node".into(),
                evidence: vec!["sysctl net.bridge.bridge-nf-call-iptables = 0 in the node's network namespace".into()],
                cause: "packets bridged between pods skip iptables, so kube-proxy's reverse NAT never runs on replies from a CoreDNS pod on the same node".into(),
                fix: "sysctl -w net.bridge.bridge-nf-call-iptables=1 (and set it in /etc/sysctl.d so it survives a reboot)",
            });
        }
        // No bridge sysctls at all: br_netfilter is not loaded. That matters
        // only on a Kubernetes node (one with kube-proxy's service rules).
        if self.ctx.bridge_nf_call_iptables.is_none() && !self.ctx.service_ips.is_empty() {
            found.push(Finding {
                kind: AnomalyKind::BrNetfilterNotLoaded,
                severity: Severity::Critical,
                key: String::new(),
                summary: "br_netfilter is not loaded on this Kubernetes node".into(),
                evidence: vec!["/proc/sys/net/bridge/bridge-nf-call-iptables does not exist in the node's network namespace".into()],
                cause: "without br_netfilter, packets bridged between pods skip iptables, so kube-proxy's reverse NAT never runs on replies from a CoreDNS pod on the same node".into(),
                fix: "modprobe br_netfilter, and list it in /etc/modules-load.d so it is loaded at boot",
            });
        }
        found.extend(
            self.ctx
                .conntrack
                .as_ref()
                .and_then(conntrack_drops_before_start),
        );
        found.extend(self.ctx.conntrack.as_ref().and_then(conntrack_table_full));
        if let Some(t) = &self.ctx.target {
            found.extend(resolv_loopback(t));
            found.extend(resolv_foreign_search(t));
        }
        self.record(found, now_ns, None)
    }

    /// The node's conntrack counters moved: (name, increase). A resolved
    /// clash (`clashres`) lost nothing and is no failure; packets conntrack
    /// dropped are.
    pub fn counters_moved(&mut self, moved: &[(&'static str, u64)], now_ns: u64) -> Vec<Anomaly> {
        let lost: Vec<String> = moved
            .iter()
            .filter(|(n, _)| *n != "clashres")
            .map(|(n, d)| format!("{n} +{d}"))
            .collect();
        if lost.is_empty() {
            return Vec::new();
        }
        let found = vec![Finding {
            kind: AnomalyKind::ConntrackInsertFailed,
            severity: Severity::Critical,
            key: String::new(),
            summary: format!("conntrack dropped packets: {}", lost.join(", ")),
            evidence: vec![format!("/proc/net/stat/nf_conntrack on the node: {}", lost.join(", "))],
            cause: "conntrack could not insert or keep entries (the parallel A/AAAA race lost, or the table is full); the client waits 5 s for its retry".into(),
            fix: "`options single-request-reopen` (glibc) or use-vc in the pods' resolv.conf, NodeLocalDNS, or a larger nf_conntrack_max",
        }];
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
        self.count_upstream(j);
        self.await_tcp_retry(j);
        let recent = self.recent_of(j);
        let mut found = self.findings(j, &recent, names);
        found.extend(search_leak(j, &recent));
        found.extend(ndots_amplification(j, &recent));
        self.remember(j);
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
        let mut found = Vec::new();
        while let Some(t) = self.truncated.front() {
            if now_ns.saturating_sub(t.answered_ns) < TCP_RETRY_NS {
                break;
            }
            if let Some(t) = self.truncated.pop_front() {
                // Events lost since the answer: the retry may be among them.
                let unseen = self.lost_ns.is_some_and(|l| l >= t.answered_ns);
                if !unseen && !retried(t.client, &t.name, t.qtype, t.answered_ns) {
                    found.push((no_tcp_retry(&t), t.journey));
                }
            }
        }
        found
            .into_iter()
            .flat_map(|(f, id)| self.record(vec![f], now_ns, Some(id)))
            .collect()
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
            let led = self.truncated_before(c);
            let found = tcp_unreachable(c, led, names);
            new.extend(self.record(vec![found], now_ns, led.map(|a| a.journey)));
        }
        new
    }

    /// The client's latest truncated UDP answer before `c`'s SYN.
    fn truncated_before(&self, c: &Connection) -> Option<&Asked> {
        self.recent
            .get(&c.client.ip())?
            .iter()
            .rev()
            .find(|a| a.truncated && a.ended_ns <= c.syn_ns)
    }

    /// Truncated UDP answers wait for a TCP retry; a TCP lookup settles them.
    fn await_tcp_retry(&mut self, j: &Journey) {
        if j.tcp {
            let client = j.client.ip();
            self.truncated
                .retain(|t| !(t.client == client && t.name == j.name && t.qtype == j.qtype));
            return;
        }
        let truncated = matches!(
            j.outcome,
            Outcome::Answered {
                truncated: true,
                ..
            }
        );
        let Some(o) = origin(j).filter(|_| truncated) else {
            return;
        };
        if self.truncated.len() == MAX_PENDING {
            self.truncated.pop_front();
        }
        self.truncated.push_back(Truncated {
            client: j.client.ip(),
            server: o.dst,
            name: j.name.clone(),
            qtype: j.qtype,
            journey: j.id,
            answered_ns: j.ended_ns,
        });
    }

    /// What this journey's client asked lately, within the lookup window.
    fn recent_of(&self, j: &Journey) -> Vec<&Asked> {
        let Some(r) = self.recent.get(&j.client.ip()) else {
            return Vec::new();
        };
        // Sized once: a filter's collect would grow it step by step.
        let mut recent = Vec::with_capacity(r.len());
        recent.extend(
            r.iter()
                .filter(|a| j.started_ns.saturating_sub(a.ended_ns) <= LOOKUP_WINDOW_NS),
        );
        recent
    }

    fn remember(&mut self, j: &Journey) {
        let client = j.client.ip();
        if !self.recent.contains_key(&client) && self.recent.len() >= RECENT_CLIENTS {
            // Forget the client that has been quiet longest.
            let oldest = self
                .recent
                .iter()
                .min_by_key(|(_, r)| r.back().map_or(0, |a| a.ended_ns))
                .map(|(ip, _)| *ip);
            if let Some(ip) = oldest {
                self.recent.remove(&ip);
            }
        }
        let r = self.recent.entry(client).or_default();
        if r.len() == RECENT_PER_CLIENT {
            r.pop_front();
        }
        let nxdomain = matches!(&j.outcome, Outcome::Answered { rcode, .. } if rcode == "NXDOMAIN");
        let truncated = !j.tcp
            && matches!(
                j.outcome,
                Outcome::Answered {
                    truncated: true,
                    ..
                }
            );
        r.push_back(Asked {
            name: j.name.clone(),
            qtype: j.qtype,
            port: j.client.port(),
            answered: matches!(j.outcome, Outcome::Answered { .. }),
            nxdomain,
            truncated,
            journey: j.id,
            started_ns: j.started_ns,
            ended_ns: j.ended_ns,
            incomplete: j.incomplete.is_some(),
        });
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

    fn count_upstream(&mut self, j: &Journey) {
        for u in &j.upstream {
            let Some(server) = u.legs.first().map(|l| l.dst) else {
                continue;
            };
            let s = self.upstream.entry(server).or_default();
            s.queries += 1;
            match u.outcome {
                Outcome::Answered { .. } => {
                    s.answers += 1;
                    s.total_ns += u.total_ns();
                }
                // Cut off or missing legs: no evidence of a timeout.
                Outcome::Timeout if u.incomplete.is_none() => s.timeouts += 1,
                Outcome::Timeout | Outcome::Dropped { .. } => {}
            }
            self.count_upstream(u);
        }
    }

    /// Every rule, in order; a rule that explains a journey silences the
    /// generic ones (drop, no answer) that would only repeat it. Absence is
    /// no evidence when events were lost: incomplete journeys raise nothing
    /// for what was not seen.
    fn findings(&self, j: &Journey, recent: &[&Asked], names: &KernelNames) -> Vec<Finding> {
        let mut out = Vec::new();
        let raised = |kind, key: &str| self.active.contains_key(&(kind, key.to_owned()));
        // Rules that conclude from what is missing (no DNAT, no answer).
        let seen_all = j.incomplete.is_none();
        let specific = [
            unexpected_source(j, &self.ctx),
            loopback_nameserver(j, &self.ctx),
            seen_all.then(|| not_translated(j, &self.ctx)).flatten(),
            seen_all.then(|| forwarding_loop(j)).flatten(),
            seen_all.then(|| half_pair_lost(j, recent, names)).flatten(),
            fragment_lost(j, names),
        ];
        let explained = specific.iter().any(Option::is_some);
        out.extend(specific.into_iter().flatten());
        if !explained {
            let upstream = upstream_failures(j, &self.upstream, names);
            let upstream_failed = !upstream.is_empty();
            out.extend(upstream);
            out.extend(dropped(j, names, &raised));
            out.extend(failing_answer(j, &raised));
            if !upstream_failed && seen_all {
                out.extend(unanswered(j, recent, &raised));
            }
        }
        out.extend(slow(j, &raised));
        out
    }
}

/// An answer came in IP fragments and one of them did not come through:
/// dropped by the kernel on the way, or missing where the rest arrived.
fn fragment_lost(j: &Journey, names: &KernelNames) -> Option<Finding> {
    if matches!(j.outcome, Outcome::Answered { .. }) {
        return None;
    }
    let with_note = |dropped: bool| {
        j.legs.iter().rev().find_map(|l| {
            let f = l.fragment.as_deref()?;
            (l.drop.is_some() == dropped).then_some((l, f))
        })
    };
    // A fragment missing is evidence only where no event was lost.
    let missing = || with_note(false).filter(|_| j.incomplete.is_none());
    let (leg, f) = with_note(true).or_else(missing)?;
    let what = match leg.drop.as_deref() {
        Some(&(reason, at)) => format!(
            "{} was dropped on {}: {} at {}",
            f.describe(),
            place(leg),
            names.drop_reason(reason),
            names.location(at)
        ),
        None => format!("it reached {} {}", place(leg), f.describe()),
    };
    Some(Finding {
        kind: AnomalyKind::FragmentLost,
        severity: Severity::Critical,
        key: format!("{} → {}", leg.src.ip(), leg.dst.ip()),
        summary: format!(
            "answers from {} to {} in IP fragments do not arrive whole",
            leg.src.ip(),
            leg.dst.ip()
        ),
        evidence: vec![format!(
            "{} came in IP fragments; {what}",
            the_message(j, leg)
        )],
        cause: "the message was larger than the path's MTU and went as IP fragments, and something on the path does not let later fragments through: a firewall, security group or NetworkPolicy that drops fragments (they carry no ports), or an overlay (VXLAN, IPIP) whose smaller MTU they do not fit".into(),
        fix: "keep DNS answers under the path MTU: a smaller EDNS buffer (CoreDNS `bufsize 1232`), and DNS over TCP for the rest; fix the overlay's MTU, or let fragments through the firewall",
    })
}

/// `the answer 10.244.0.53:53 → 10.244.0.10:4000 (name A)`: the message a
/// leg saw.
fn the_message(j: &Journey, leg: &Leg) -> String {
    format!(
        "the {} {} → {} ({} {})",
        if leg.response { "answer" } else { "query" },
        leg.src,
        leg.dst,
        j.name,
        j.qtype
    )
}

/// One of a parallel A/AAAA pair got no answer while its sibling, sent
/// from the same socket at the same moment, did: the conntrack insert race.
fn half_pair_lost(j: &Journey, recent: &[&Asked], names: &KernelNames) -> Option<Finding> {
    if matches!(j.outcome, Outcome::Answered { .. }) || !matches!(j.qtype, "A" | "AAAA") {
        return None;
    }
    // The race's loser is dropped by conntrack's confirm, a netfilter
    // verdict; a drop the kernel gives another reason for is that reason's.
    if let Outcome::Dropped { reason, .. } = j.outcome {
        if !matches!(
            names.drop_reason(reason).as_str(),
            "NETFILTER_DROP" | "NOT_SPECIFIED"
        ) {
            return None;
        }
    }
    let sibling = recent.iter().find(|a| {
        a.answered
            && a.name == j.name
            && a.port == j.client.port()
            && a.qtype != j.qtype
            && a.started_ns.abs_diff(j.started_ns) < PAIR_NS
    })?;
    let mut evidence = vec![format!(
        "{} and {} for {} left {} {:.3} ms apart; the {} was answered, the {} was not",
        sibling.qtype,
        j.qtype,
        j.name,
        j.client,
        sibling.started_ns.abs_diff(j.started_ns) as f64 / 1e6,
        sibling.qtype,
        j.qtype
    )];
    if let Outcome::Dropped { reason, location } = j.outcome {
        evidence.push(format!(
            "the kernel dropped the {}: {} at {}",
            j.qtype,
            names.drop_reason(reason),
            names.location(location)
        ));
    }
    let retry = recent.iter().find(|a| {
        a.name == j.name && a.qtype == j.qtype && a.started_ns > j.started_ns + 1_000_000_000
    });
    if let Some(r) = retry {
        evidence.push(format!(
            "the client asked again {:.1} s later",
            (r.started_ns - j.started_ns) as f64 / 1e9
        ));
    }
    Some(Finding {
        kind: AnomalyKind::ParallelQueryLost,
        severity: Severity::Critical,
        key: j.client.ip().to_string(),
        summary: format!("one of a parallel A/AAAA pair is lost: lookups from {} wait for the retry", j.client.ip()),
        evidence,
        cause: "A and AAAA sent at once from one socket race to insert the same conntrack entry through DNAT; the loser is dropped (insert_failed) and the client waits for its 5 s timeout".into(),
        fix: "`options single-request-reopen` in the pods' resolv.conf (dnsConfig), NodeLocalDNS, or a kernel that resolves the clash",
    })
}

/// The cluster's own suffix; names under it never leave the cluster.
const CLUSTER_SUFFIX: &str = ".cluster.local.";

/// `B.cluster.local.` then `B.S.` with S foreign: S came from the client's
/// search list, and a cluster-style name went to the outside world.
fn search_leak(j: &Journey, recent: &[&Asked]) -> Option<Finding> {
    if j.name.ends_with(CLUSTER_SUFFIX) {
        return None;
    }
    let base = recent.iter().rev().find_map(|a| {
        let base = a.name.strip_suffix(CLUSTER_SUFFIX)?;
        j.name
            .strip_prefix(base)?
            .strip_prefix('.')
            .filter(|rest| !rest.is_empty())
            .map(|_| base)
    })?;
    let suffix = j.name[base.len() + 1..].trim_end_matches('.');
    let tried: Vec<&str> = recent
        .iter()
        .filter(|a| under(&a.name, base))
        .map(|a| &*a.name)
        .collect();
    let upstream = j
        .upstream
        .first()
        .and_then(|u| u.legs.first())
        .map(|l| format!(" (sent upstream to {})", l.dst))
        .unwrap_or_default();
    Some(Finding {
        kind: AnomalyKind::SearchDomainLeak,
        severity: Severity::Warning,
        key: suffix.to_owned(),
        summary: format!("cluster-style names leak out with the foreign search domain {suffix}"),
        evidence: vec![format!("{} asked {}, then {}{upstream}", j.client.ip(), tried.join(", "), j.name)],
        cause: format!("the client's search list includes {suffix} (the node's resolv.conf, inherited through dnsPolicy, or the pod's dnsConfig), so every short name is also asked of the outside world"),
        fix: "remove the domain from the search list (node resolv.conf or dnsConfig.searches), or use fully qualified names with a trailing dot",
    })
}

/// `name` is `stem` followed by a dot and more: `stem` with a suffix.
fn under(name: &str, stem: &str) -> bool {
    name.strip_prefix(stem)
        .is_some_and(|rest| rest.starts_with('.'))
}

/// An answer that came only after several search-list NXDOMAINs that cost
/// real time: the price of ndots:5 for names outside the cluster.
/// A cost rule: journeys that lost events are left out, as their times are
/// no evidence.
fn ndots_amplification(j: &Journey, recent: &[&Asked]) -> Option<Finding> {
    let Outcome::Answered { rcode, answers, .. } = &j.outcome else {
        return None;
    };
    if rcode != "NOERROR" || answers.is_empty() || j.incomplete.is_some() {
        return None;
    }
    let misses = search_misses(j, recent);
    let cost = time_covered(&misses);
    if misses.len() < 3 || cost < AMPLIFICATION_NS {
        return None;
    }
    let mut tried: Vec<&str> = Vec::new();
    for m in &misses {
        if !tried.contains(&&*m.name) {
            tried.push(&m.name);
        }
    }
    Some(Finding {
        kind: AnomalyKind::NdotsAmplification,
        severity: Severity::Warning,
        key: String::new(),
        summary: format!("lookups pay for search-list misses: {} NXDOMAINs ({:.0} ms) before {} was answered", misses.len(), cost as f64 / 1e6, j.name),
        evidence: vec![format!("{} asked {} first", j.client.ip(), tried.join(", "))],
        cause: "with ndots:5 every name with fewer than five dots is tried with each search suffix first, and those NXDOMAINs are slow here".into(),
        fix: "use fully qualified names with a trailing dot, lower ndots in the pod's dnsConfig, or add NodeLocalDNS to answer the misses quickly",
    })
}

/// The search-list candidates of `j`'s name that came back NXDOMAIN before
/// it was asked: the latest of each name and type (the client may have
/// looked the name up before), in the order they were asked.
fn search_misses<'a>(j: &Journey, recent: &[&'a Asked]) -> Vec<&'a Asked> {
    let stem = j.name.trim_end_matches('.');
    let mut misses: Vec<&Asked> = Vec::new();
    for a in recent.iter().rev() {
        let candidate = a.nxdomain
            && !a.incomplete
            && a.started_ns < j.started_ns
            && a.name.len() > j.name.len()
            && under(&a.name, stem);
        if candidate
            && !misses
                .iter()
                .any(|m| m.name == a.name && m.qtype == a.qtype)
        {
            misses.push(a);
        }
    }
    misses.sort_by_key(|a| a.started_ns);
    misses
}

/// The time during which at least one of `asked` (sorted by start) was
/// waiting: parallel A and AAAA queries cost the client their longer one,
/// not their sum.
fn time_covered(asked: &[&Asked]) -> u64 {
    let (mut total, mut until) = (0, 0);
    for a in asked {
        let start = a.started_ns.max(until);
        total += a.ended_ns.saturating_sub(start);
        until = until.max(a.ended_ns);
    }
    total
}

fn place(l: &Leg) -> String {
    format!("{}@{}", l.iface.as_deref().unwrap_or("?"), l.netns)
}

/// The first query leg: where the client sent it.
fn origin(j: &Journey) -> Option<&Leg> {
    j.legs.iter().find(|l| !l.response)
}

/// Answers that came back through the place the query left.
fn answers_at_client(j: &Journey) -> impl Iterator<Item = &Leg> {
    let o = origin(j);
    j.legs.iter().filter(move |l| {
        l.response
            && o.is_some_and(|o| {
                l.netns == o.netns
                    && l.ifindex == o.ifindex
                    && l.direction() != o.direction()
                    && l.direction() != "drop"
            })
    })
}

fn unexpected_source(j: &Journey, ctx: &Context) -> Option<Finding> {
    let o = origin(j)?;
    let wrong = answers_at_client(j).find(|l| l.src != o.dst)?;
    let mut evidence = vec![
        format!("the query {} → {} left {}", j.client, o.dst, place(o)),
        format!(
            "its answer reached {} from {}, not from {}",
            place(wrong),
            wrong.src,
            o.dst
        ),
    ];
    if let Outcome::Dropped { .. } = j.outcome {
        evidence.push(format!(
            "the kernel dropped it there: the client's socket, connected to {}, does not take it",
            o.dst
        ));
    }
    let sysctl = match ctx.bridge_nf_call_iptables.as_deref() {
        Some(v) => format!(" (the node's net.bridge.bridge-nf-call-iptables is {v} now)"),
        None => String::new(),
    };
    Some(Finding {
        kind: AnomalyKind::ReplyFromUnexpectedSource,
        severity: Severity::Critical,
        key: wrong.src.ip().to_string(),
        summary: format!("answers to queries for {} come back from {} un-NATed", o.dst, wrong.src),
        evidence,
        cause: format!(
            "the reverse NAT of kube-proxy's DNAT did not run on the reply: br_netfilter not loaded or net.bridge.bridge-nf-call-iptables=0 on the node, so replies bridged between pods skip iptables{sysctl}"
        ),
        fix: "modprobe br_netfilter; sysctl -w net.bridge.bridge-nf-call-iptables=1, and persist both (/etc/modules-load.d, /etc/sysctl.d)",
    })
}

fn is_loopback(ip: IpAddr) -> bool {
    ip.is_loopback()
}

const LOOPBACK_CAUSE: &str = "the pod's resolv.conf names a loopback nameserver: dnsPolicy Default (or kubelet --resolv-conf) on a node whose resolv.conf points at systemd-resolved (127.0.0.53); inside the pod nothing listens there (or, in a resolver's own pod, the resolver itself does: a loop)";
const LOOPBACK_FIX: &str =
    "use dnsPolicy ClusterFirst, or point kubelet --resolv-conf at /run/systemd/resolve/resolv.conf";

fn loopback_nameserver(j: &Journey, ctx: &Context) -> Option<Finding> {
    let o = origin(j)?;
    let in_pod = o.netns != 0 && o.netns != ctx.node_netns;
    (is_loopback(o.dst.ip()) && in_pod).then(|| Finding {
        kind: AnomalyKind::LoopbackNameserver,
        severity: Severity::Critical,
        key: format!("{}@{}", o.dst.ip(), o.netns),
        summary: format!(
            "a pod (network namespace {}) sends its DNS queries to {}",
            o.netns, o.dst
        ),
        evidence: vec![format!(
            "{} asked {} for {} on {}",
            j.client,
            o.dst,
            j.name,
            place(o)
        )],
        cause: LOOPBACK_CAUSE.into(),
        fix: LOOPBACK_FIX,
    })
}

fn not_translated(j: &Journey, ctx: &Context) -> Option<Finding> {
    let o = origin(j)?;
    let unanswered = !matches!(j.outcome, Outcome::Answered { .. });
    let asked_service = ctx.service_ips.contains(&o.dst.ip());
    if !(unanswered && asked_service && j.dnat.is_none()) {
        return None;
    }
    let last = j.legs.iter().rfind(|l| !l.response).unwrap_or(o);
    Some(Finding {
        kind: AnomalyKind::ServiceNotTranslated,
        severity: Severity::Critical,
        key: o.dst.ip().to_string(),
        summary: format!("queries to the service IP {} are never translated to an endpoint", o.dst.ip()),
        evidence: vec![
            format!("{} asked {} for {}; no leg shows a DNAT", j.client, o.dst, j.name),
            format!("last seen at {} ({}), still addressed to {}", place(last), last.hook.name(), last.dst),
        ],
        cause: "kube-proxy's rules for the service are missing or broken (no KUBE-SERVICES jump for it, or no endpoints)".into(),
        fix: "check `iptables -t nat -S KUBE-SERVICES | grep <ip>` on the node and kube-proxy's logs; restart kube-proxy",
    })
}

/// CoreDNS's loop plugin asks `HINFO <random number>.<random number>.<zone>`.
fn is_loop_probe(name: &str, qtype: &str) -> bool {
    let mut labels = name.split('.');
    let numeric =
        |l: Option<&str>| l.is_some_and(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()));
    qtype == "HINFO" && numeric(labels.next()) && numeric(labels.next())
}

/// A server that asks a server already on the journey, or its own loopback.
fn forwarding_loop(j: &Journey) -> Option<Finding> {
    fn walk<'a>(j: &'a Journey, path: &mut Vec<IpAddr>) -> Option<(&'a Journey, IpAddr)> {
        for u in &j.upstream {
            let server = u.legs.first()?.dst.ip();
            // Another resolver on loopback (a cache in front of unbound) answers;
            // a query that went round to itself does not.
            let unanswered = !matches!(u.outcome, Outcome::Answered { .. });
            if unanswered && (is_loopback(server) || path.contains(&server)) {
                return Some((u, server));
            }
            path.push(server);
            if let Some(found) = walk(u, path) {
                return Some(found);
            }
            path.pop();
        }
        None
    }
    let first = origin(j)?.dst.ip();
    let mut path = vec![first];
    if let Some(endpoint) = j.dnat.as_deref().map(|(_, to)| to.ip()) {
        path.push(endpoint);
    }
    let (u, server) = walk(j, &mut path)?;
    let probe = is_loop_probe(&u.name, u.qtype);
    let mut evidence = vec![format!("{} asked {} for {}", j.client, first, j.name)];
    evidence.push(format!(
        "{} forwarded it to {}, {}",
        u.client.ip(),
        server,
        if is_loopback(server) {
            "a loopback address: itself"
        } else {
            "a resolver already on this journey"
        }
    ));
    if probe {
        evidence.push("the question is a CoreDNS loop-plugin probe (random labels, HINFO)".into());
    }
    Some(Finding {
        kind: AnomalyKind::ForwardingLoop,
        severity: Severity::Critical,
        key: format!("{}>{}", u.client.ip(), server),
        summary: format!("DNS forwarding loop: {} forwards to {}", u.client.ip(), server),
        evidence,
        cause: "the resolver forwards to what its resolv.conf says, inherited from the node: 127.0.0.53 (systemd-resolved's stub, which is the resolver itself in its pod) or a NodeLocalDNS address that forwards back into the cluster".into(),
        fix: "point CoreDNS's `forward .` at real upstream servers (e.g. /run/systemd/resolve/resolv.conf), and NodeLocalDNS's upstream away from kube-dns",
    })
}

fn dropped(j: &Journey, names: &KernelNames, raised: &Raised) -> Option<Finding> {
    let Outcome::Dropped { reason, location } = j.outcome else {
        return None;
    };
    let leg = j.legs.iter().rfind(|l| l.drop.is_some())?;
    let (why, at) = (names.drop_reason(reason), names.location(location));
    // Per receiver: which server (or client) it happens to is the finding.
    let key = format!("{why}@{at} to {}", leg.dst.ip());
    if raised(AnomalyKind::Dropped, &key) {
        return Some(Finding::again(AnomalyKind::Dropped, key));
    }
    let (cause, fix) = drop_cause(&why, leg);
    Some(Finding {
        kind: AnomalyKind::Dropped,
        severity: Severity::Critical,
        key,
        summary: format!(
            "DNS packets to {} dropped in the kernel: {why} at {at}",
            leg.dst.ip()
        ),
        evidence: vec![format!(
            "{} was dropped on {}: {why} at {at}",
            the_message(j, leg),
            place(leg)
        )],
        cause,
        fix,
    })
}

/// What the kernel's reason says happened, and what to do, for the
/// reasons DNS meets; a query's socket is the server's, an answer's the
/// client's.
fn drop_cause(why: &str, leg: &Leg) -> (String, &'static str) {
    let (dst, client) = (leg.dst, leg.dst.ip());
    match (why, leg.response) {
        ("SOCKET_RCVBUFF", false) => (
            format!("the server's socket at {dst} was not read as fast as queries arrived, and its receive buffer was full: the server is overloaded or starved of CPU"),
            "give the server CPU or replicas (CoreDNS: its autoscaler, or NodeLocalDNS to take load off it); `nstat -az UdpRcvbufErrors` in its namespace counts these drops; a larger net.core.rmem_default only absorbs bursts",
        ),
        ("SOCKET_RCVBUFF", true) => (
            format!("the client at {client} did not read its socket as fast as answers arrived, and its receive buffer was full"),
            "the client is starved of CPU or stuck: see its process; `nstat -az UdpRcvbufErrors` in its namespace counts these drops",
        ),
        ("NO_SOCKET", false) => (
            format!("nothing listens on {dst} there: the server is down or restarting"),
            "check the server listens: `ss -lun` in its namespace; a Service should not send to a pod that is not ready",
        ),
        ("NO_SOCKET", true) => (
            format!("no socket at {client} takes this answer: the client gave up and closed it, or asked another address than the answer comes from"),
            "an answer slower than the client's timeout: see where the time went (slow_answers); one from an unexpected address: see reply_from_unexpected_source",
        ),
        ("NETFILTER_DROP", _) => (
            "a netfilter rule (iptables/nftables DROP) or conntrack (an insert that lost a race) dropped it".into(),
            "find the rule: `iptables-save | grep -i drop` (or `nft list ruleset`) in that namespace; `conntrack -S` shows insert_failed",
        ),
        _ => (
            format!("the kernel's drop reason is {why}, at the function named"),
            "see the reason in include/net/dropreason-core.h",
        ),
    }
}

/// An upstream query that got no answer.
struct UpstreamFailure {
    server: SocketAddr,
    resolver: IpAddr,
    /// Dropped on the way (reason, location), or timed out.
    drop: Option<(u32, u64)>,
}

fn failed_upstream(j: &Journey, out: &mut Vec<UpstreamFailure>) {
    for u in &j.upstream {
        let drop = match u.outcome {
            Outcome::Answered { .. } => None,
            Outcome::Timeout => Some(None),
            Outcome::Dropped { reason, location } => Some(Some((reason, location))),
        };
        if let (Some(drop), Some(first)) = (drop, u.legs.first()) {
            // A timeout is no evidence when events were lost; a drop is.
            if u.incomplete.is_none() || drop.is_some() {
                out.push(UpstreamFailure {
                    server: first.dst,
                    resolver: u.client.ip(),
                    drop,
                });
            }
        }
        failed_upstream(u, out);
    }
}

/// Upstream queries that got no answer: timed out, or dropped on the way.
fn upstream_failures(
    j: &Journey,
    stats: &BTreeMap<SocketAddr, UpstreamStats>,
    names: &KernelNames,
) -> Vec<Finding> {
    let mut found = Vec::new();
    failed_upstream(j, &mut found);
    found
        .into_iter()
        .map(|UpstreamFailure { server, resolver, drop }| {
            let s = stats.get(&server).copied().unwrap_or_default();
            let mean = if s.answers > 0 { format!(", mean answer {:.1} ms", s.total_ns as f64 / s.answers as f64 / 1e6) } else { String::new() };
            let how = match drop {
                Some((reason, at)) => format!("the query was dropped on the way: {} at {}", names.drop_reason(reason), names.location(at)),
                None => "no answer came".to_owned(),
            };
            Finding {
                kind: AnomalyKind::UpstreamTimeout,
                severity: Severity::Critical,
                key: server.to_string(),
                summary: format!("the upstream resolver {server} does not answer"),
                evidence: vec![
                    format!("{resolver} asked {server} for {}: {how}", j.name),
                    format!("{server} so far: {} queries, {} answers, {} timeouts{mean}", s.queries, s.answers, s.timeouts),
                ],
                cause: "the upstream server is down, unreachable, or a firewall drops DNS to it".into(),
                fix: "check the upstream from the node (`dig @server`), its firewall, and CoreDNS's forward list",
            }
        })
        .collect()
}

fn failing_answer(j: &Journey, raised: &Raised) -> Option<Finding> {
    let Outcome::Answered { rcode, .. } = &j.outcome else {
        return None;
    };
    if rcode != "SERVFAIL" && rcode != "REFUSED" {
        return None;
    }
    let server = origin(j)?.dst;
    let upstream_said = j.upstream.iter().find_map(|u| match &u.outcome {
        Outcome::Answered { rcode: r, .. } if r == rcode => u.legs.first().map(|l| l.dst),
        _ => None,
    });
    let key = format!("{rcode}:{}", upstream_said.unwrap_or(server));
    if raised(AnomalyKind::FailingAnswers, &key) {
        return Some(Finding::again(AnomalyKind::FailingAnswers, key));
    }
    let mut evidence = vec![format!(
        "{} asked {server} for {} {}: {rcode}",
        j.client, j.name, j.qtype
    )];
    if let Some(up) = upstream_said {
        evidence.push(format!(
            "the upstream {up} answered {rcode} first: the failure comes from upstream"
        ));
    }
    Some(Finding {
        kind: AnomalyKind::FailingAnswers,
        severity: Severity::Warning,
        key,
        summary: format!(
            "{rcode} answers {}",
            upstream_said.map_or_else(
                || format!("from {server}"),
                |u| format!("coming from the upstream {u}")
            )
        ),
        evidence,
        cause: if upstream_said.is_some() {
            "the upstream resolver fails to resolve (its own upstreams unreachable, DNSSEC failure, or it refuses the client)".into()
        } else {
            "the resolver failed or refused the query".into()
        },
        fix: "query the server directly with dig to see its answer, and check its logs and ACLs",
    })
}

fn unanswered(j: &Journey, recent: &[&Asked], raised: &Raised) -> Option<Finding> {
    if j.outcome != Outcome::Timeout {
        return None;
    }
    let o = origin(j)?;
    let last = j.legs.last()?;
    let key = o.dst.to_string();
    if raised(AnomalyKind::Unanswered, &key) {
        return Some(Finding::again(AnomalyKind::Unanswered, key));
    }
    let mut evidence = vec![format!(
        "{} asked {} for {} {}; last seen at {} ({} {} → {})",
        j.client,
        o.dst,
        j.name,
        j.qtype,
        place(last),
        last.hook.name(),
        last.src,
        last.dst
    )];
    evidence.extend(earlier_attempts(j, recent));
    Some(Finding {
        kind: AnomalyKind::Unanswered,
        severity: Severity::Warning,
        key,
        summary: format!("lookups sent to {} get no answer", o.dst),
        evidence,
        cause: "the query or its answer was lost after the last place it was seen".into(),
        fix: "follow the journey from where it was last seen; check the server's health and the path to it",
    })
}

/// The client's earlier unanswered tries of the same question (its retries,
/// from the same socket or new ones), as one line.
fn earlier_attempts(j: &Journey, recent: &[&Asked]) -> Option<String> {
    let tries: Vec<&&Asked> = recent
        .iter()
        .filter(|a| !a.answered && a.name == j.name && a.qtype == j.qtype)
        .collect();
    let first = tries.first()?;
    let ports: BTreeSet<u16> = tries
        .iter()
        .map(|a| a.port)
        .chain([j.client.port()])
        .collect();
    Some(format!(
        "attempt {} of this lookup without an answer, {:.1} s after the first (from {} source port{})",
        tries.len() + 1,
        j.started_ns.saturating_sub(first.started_ns) as f64 / 1e9,
        ports.len(),
        if ports.len() == 1 { "" } else { "s" }
    ))
}

fn no_tcp_retry(t: &Truncated) -> Finding {
    Finding {
        kind: AnomalyKind::TruncatedWithoutTcpRetry,
        severity: Severity::Warning,
        key: t.server.to_string(),
        summary: format!("truncated answers from {} are not retried over TCP", t.server),
        evidence: vec![format!(
            "{} got a truncated (TC) answer for {} {} from {}, and no TCP query followed within {} s",
            t.client,
            t.name,
            t.qtype,
            t.server,
            TCP_RETRY_NS / 1_000_000_000
        )],
        cause: "the client's resolver does not fall back to TCP (musl libc before 1.2.4, as in older Alpine images, some custom stubs), or its TCP connection to port 53 never got through (a NetworkPolicy or firewall that allows only UDP)".into(),
        fix: "let TCP/53 through to the resolver, use an image whose resolver retries over TCP, or keep answers small (fewer records, no ANY)",
    }
}

fn tcp_unreachable(c: &Connection, led: Option<&Asked>, names: &KernelNames) -> Finding {
    let fate = match c.reset {
        Some(Reset {
            ts_ns,
            to_client: true,
        }) => format!(
            "reset towards the client {:.1} ms after its SYN",
            c.ms_after_syn(ts_ns)
        ),
        Some(Reset { .. }) => "reset by the client before any SYN-ACK".into(),
        None => format!(
            "{} SYN{} and no SYN-ACK",
            c.syns,
            if c.syns == 1 { "" } else { "s" }
        ),
    };
    let mut evidence = vec![format!("{} → {}: {fate}", c.client, c.server)];
    evidence.extend(c.dropped.map(|(reason, at)| {
        format!(
            "the kernel dropped its set-up: {} at {}",
            names.drop_reason(reason),
            names.location(at)
        )
    }));
    evidence.extend(led.map(|a| {
        format!(
            "it followed a truncated UDP answer for {} {} (journey {}, {:.1} s before)",
            a.name,
            a.qtype,
            a.journey,
            c.syn_ns.saturating_sub(a.ended_ns) as f64 / 1e9
        )
    }));
    Finding {
        kind: AnomalyKind::DnsTcpUnreachable,
        severity: Severity::Critical,
        key: c.server.to_string(),
        summary: format!("DNS over TCP to {} does not get through", c.server),
        evidence,
        cause: "TCP port 53 is not open along the way: the service's TCP port is missing from kube-proxy's rules (a Service that lists only UDP 53), the DNS pod does not listen on TCP, or a NetworkPolicy or firewall lets only UDP through. Large answers (truncated over UDP) and clients that always use TCP then fail".into(),
        fix: "list TCP 53 (dns-tcp) in the kube-dns Service and check kube-proxy's rules for it (iptables-save | grep 'dns-tcp', or nft list ruleset), make the DNS server listen on TCP, and let TCP 53 through NetworkPolicies and firewalls",
    }
}

/// The target's resolv.conf names a loopback nameserver.
fn resolv_loopback(t: &Target) -> Option<Finding> {
    let r = t.resolv.as_ref()?;
    let lo: Vec<String> = r
        .nameservers
        .iter()
        .filter(|ip| ip.is_loopback())
        .map(IpAddr::to_string)
        .collect();
    (!lo.is_empty() && t.netns_inode != 0).then(|| Finding {
        kind: AnomalyKind::LoopbackNameserver,
        severity: Severity::Critical,
        key: format!("resolv.conf of {}", t.label),
        summary: format!(
            "the resolv.conf of {} names a loopback nameserver: {}",
            t.label,
            lo.join(", ")
        ),
        evidence: vec![format!(
            "{}'s /etc/resolv.conf: nameserver {}",
            t.label,
            lo.join(", ")
        )],
        cause: LOOPBACK_CAUSE.into(),
        fix: LOOPBACK_FIX,
    })
}

/// Search domains outside the cluster's in a pod's resolv.conf: every short
/// name is also asked of whoever serves that domain.
fn resolv_foreign_search(t: &Target) -> Option<Finding> {
    let r = t.resolv.as_ref()?;
    // ClusterFirst pods search `<ns>.svc.<cluster>`, `svc.<cluster>`, `<cluster>`.
    let cluster = r.search.iter().find_map(|d| d.strip_prefix("svc."))?;
    let foreign: Vec<&str> = r
        .search
        .iter()
        .map(|d| d.trim_end_matches('.'))
        .filter(|d| *d != cluster && !d.ends_with(&format!(".{cluster}")))
        .collect();
    if foreign.is_empty() {
        return None;
    }
    Some(Finding {
        kind: AnomalyKind::ForeignSearchDomain,
        severity: Severity::Warning,
        key: format!("resolv.conf of {}", t.label),
        summary: format!("{} searches outside the cluster: {}", t.label, foreign.join(", ")),
        evidence: vec![format!(
            "{}'s /etc/resolv.conf: search {}; ndots:{}, so a name with fewer than {} dots is tried with each of the {} suffixes before as it is",
            t.label,
            r.search.join(" "),
            r.ndots,
            r.ndots,
            r.search.len()
        )],
        cause: format!("the node's search domains ({}) are appended to every ClusterFirst pod's list by the kubelet, or the pod's dnsConfig adds them; cluster-style names then leak to the outside resolvers", foreign.join(", ")),
        fix: "remove them from the node's resolv.conf (or point kubelet --resolv-conf at a file without them), or from the pod's dnsConfig.searches",
    })
}

fn conntrack_drops_before_start(ct: &ConntrackAtStart) -> Option<Finding> {
    let dropped: Vec<String> = ct
        .dropped
        .iter()
        .filter(|(_, v)| *v > 0)
        .map(|(n, v)| format!("{n} {v}"))
        .collect();
    (!dropped.is_empty()).then(|| Finding {
        kind: AnomalyKind::ConntrackDropsBeforeStart,
        severity: Severity::Warning,
        key: String::new(),
        summary: format!("conntrack has dropped packets since boot: {}", dropped.join(", ")),
        evidence: vec![format!("/proc/net/stat/nf_conntrack on the node when tracing started: {}", dropped.join(", "))],
        cause: "conntrack could not insert entries at some time before now (the parallel A/AAAA race, or a full table); whether it still happens shows when the counters move while tracing".into(),
        fix: "watch for conntrack_insert_failed while tracing; `conntrack -S` shows the counters per CPU",
    })
}

fn conntrack_table_full(ct: &ConntrackAtStart) -> Option<Finding> {
    let max = ct.max.filter(|m| *m > 0)?;
    let percent = ct.entries.saturating_mul(100) / max;
    (percent >= TABLE_FULL_PERCENT).then(|| Finding {
        kind: AnomalyKind::ConntrackTableNearlyFull,
        severity: Severity::Critical,
        key: String::new(),
        summary: format!("the node's conntrack table is {percent}% full ({} of {max})", ct.entries),
        evidence: vec![format!("nf_conntrack entries {} of net.netfilter.nf_conntrack_max {max} when tracing started", ct.entries)],
        cause: "when the table is full new flows, DNS queries through the service IP included, are dropped (\"nf_conntrack: table full, dropping packet\" in dmesg)".into(),
        fix: "raise net.netfilter.nf_conntrack_max (kube-proxy's --conntrack-max-per-core), or shorten UDP timeouts (nf_conntrack_udp_timeout)",
    })
}

/// Where the time of a slow answer went: the server's own work, its
/// upstream queries, or the network in between.
fn slow(j: &Journey, raised: &Raised) -> Option<Finding> {
    if !matches!(j.outcome, Outcome::Answered { .. }) || j.total_ns() < SLOW_NS {
        return None;
    }
    let arrival = j.legs.iter().rfind(|l| !l.response)?;
    let reply = j.legs.iter().find(|l| l.response)?;
    let at_server = reply.ts_ns.saturating_sub(arrival.ts_ns);
    let upstream: u64 = j.upstream.iter().map(Journey::total_ns).max().unwrap_or(0);
    let network = j.total_ns().saturating_sub(at_server);
    let (where_, _) = [
        ("upstream", upstream),
        ("the resolver itself", at_server.saturating_sub(upstream)),
        ("the network", network),
    ]
    .into_iter()
    .max_by_key(|(_, ns)| *ns)?;
    if raised(AnomalyKind::SlowAnswers, where_) {
        return Some(Finding::again(AnomalyKind::SlowAnswers, where_.to_owned()));
    }
    let ms = |ns: u64| ns as f64 / 1e6;
    Some(Finding {
        kind: AnomalyKind::SlowAnswers,
        severity: Severity::Warning,
        key: where_.to_owned(),
        summary: format!("slow answers: {:.0} ms, most of it in {where_}", ms(j.total_ns())),
        evidence: vec![format!(
            "{} {}: {:.1} ms in all; {:.1} ms upstream, {:.1} ms in the resolver, {:.1} ms on the network",
            j.name,
            j.qtype,
            ms(j.total_ns()),
            ms(upstream),
            ms(at_server.saturating_sub(upstream)),
            ms(network)
        )],
        cause: match where_ {
            "upstream" => "the upstream resolver is slow to answer".into(),
            "the resolver itself" => "the resolver is slow (overloaded, throttled CPU, or waiting on something other than its upstream)".into(),
            _ => "the network between the client and the resolver is slow or lossy".into(),
        },
        fix: "look at the part named: the upstream's latency, the resolver's CPU and cache, or the path",
    })
}

#[cfg(test)]
mod tests;
