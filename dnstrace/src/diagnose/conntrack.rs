//! Conntrack: the A/AAAA insert race, and the node's counters and table.
use super::{
    anomaly::{Finding, Words},
    memory::Asked,
    places::addr,
    AnomalyKind, ConntrackAtStart, Context, Severity,
};
use crate::{
    correlate::{Journey, Outcome},
    decode::{KernelNames, Qtype},
};

/// The drop reason of a netfilter verdict, conntrack's among them.
const NETFILTER_DROP: &str = "NETFILTER_DROP";

/// A drop inside a ruleset's evaluation is a rule's verdict, not
/// conntrack's confirm losing the race (which drops in `nf_hook_slow`).
fn by_a_rule(location: &str) -> bool {
    ["nft_do_chain", "ipt_do_table", "ip6t_do_table"]
        .iter()
        .any(|f| location.starts_with(f))
}

/// The other half of a parallel pair: A for AAAA and AAAA for A.
fn other_half(q: Qtype) -> Option<Qtype> {
    match q {
        Qtype::A => Some(Qtype::AAAA),
        Qtype::AAAA => Some(Qtype::A),
        _ => None,
    }
}

/// The question (same socket and name) whose journey must close before
/// `j` can be judged a lost half: an unanswered A or AAAA that never
/// reached a resolver, whose sibling may still be waiting for its answer.
pub(super) fn sibling_of(j: &Journey) -> Option<Qtype> {
    let lost = !matches!(j.outcome, Outcome::Answered { .. });
    (lost && j.incomplete.is_none() && j.upstream.is_empty())
        .then(|| other_half(j.qtype))
        .flatten()
}

/// The two queries of a parallel pair leave their socket this close together.
const PAIR_NS: u64 = 50_000_000;

/// One of a parallel A/AAAA pair got no answer while its sibling, sent
/// from the same socket at the same moment, did: the conntrack insert race.
pub(super) fn half_pair_lost<'a>(
    j: &'a Journey,
    ctx: &Context,
    recent: &[&Asked],
    names: &KernelNames,
) -> Option<Finding<'a>> {
    // A query a resolver forwarded was not lost to the race: its upstream
    // queries tell what became of it.
    sibling_of(j)?;
    match j.outcome {
        // The race's loser is dropped by conntrack's confirm, a netfilter
        // verdict; a drop the kernel gives another reason for is that reason's.
        Outcome::Dropped { reason, location } => {
            let why = names.drop_reason(reason);
            if why != NETFILTER_DROP && why != "NOT_SPECIFIED"
                || by_a_rule(&names.location(location))
            {
                return None;
            }
        }
        // Where drops show as legs, the loser would have one: a silent
        // loss is not the race.
        Outcome::Timeout if ctx.drops_visible => return None,
        _ => {}
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
        addr(ctx, j.client),
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
    Some(Finding::new(
        AnomalyKind::ParallelQueryLost,
        j.client.ip().to_string(),
        move || {
            let summary = format!(
                "one of a parallel A/AAAA pair is lost: lookups from {} wait for the retry",
                j.client.ip()
            );
            Words::new(summary, evidence)
        },
    ))
}

/// Counters of lost packets: a resolved clash (`clashres`) lost nothing,
/// and `early_drop` evicts an unconfirmed entry to make room, no packet.
fn is_loss(counter: &str) -> bool {
    !matches!(counter, "clashres" | "early_drop")
}

/// A DNS packet netfilter dropped this close to a counter's rise backs it.
const BACKING_S: u64 = 10;
const BACKING_NS: u64 = BACKING_S * 1_000_000_000;

/// What the rules saw of conntrack while tracing: its counters' rises,
/// and DNS packets netfilter dropped (conntrack's drops among them).
#[derive(Default)]
pub(super) struct CtSeen {
    /// Packets the counters said conntrack lost since tracing started.
    pub(super) lost: u64,
    /// When a DNS packet was last dropped by a netfilter verdict.
    dns_drop_ns: Option<u64>,
    /// The last rise no DNS drop has backed yet: (when, what rose).
    unbacked: Option<(u64, Vec<String>)>,
}

impl CtSeen {
    /// Notes `j`'s netfilter drops; a rise of the counters they back,
    /// raised as node-wide a moment ago, is raised again as DNS's.
    pub(super) fn journey(&mut self, j: &Journey, names: &KernelNames) -> Option<Finding<'static>> {
        let at = netfilter_drop(j, names)?;
        self.dns_drop_ns = Some(self.dns_drop_ns.map_or(at, |t| t.max(at)));
        let (when, _) = self.unbacked.as_ref()?;
        if when.abs_diff(at) > BACKING_NS {
            return None;
        }
        let (_, lost) = self.unbacked.take()?;
        Some(dns_lost(lost))
    }

    fn backed(&self, now_ns: u64) -> bool {
        self.dns_drop_ns
            .is_some_and(|t| t.abs_diff(now_ns) <= BACKING_NS)
    }
}

/// When a leg of `j` or of its upstream queries was dropped by a
/// netfilter verdict, if one was.
fn netfilter_drop(j: &Journey, names: &KernelNames) -> Option<u64> {
    let own = j.legs.iter().find_map(|l| {
        let &(reason, _) = l.drop.as_deref()?;
        (names.drop_reason(reason) == NETFILTER_DROP).then_some(l.ts_ns)
    });
    own.or_else(|| j.upstream.iter().find_map(|u| netfilter_drop(u, names)))
}

/// The node's conntrack counters moved: (name, increase). They count
/// every flow of the node: DNS's only where a DNS drop backs them.
pub(super) fn insert_failed(
    moved: &[(&'static str, u64)],
    now_ns: u64,
    seen: &mut CtSeen,
    ctx: &Context,
) -> Option<Finding<'static>> {
    let rose: Vec<&(&str, u64)> = moved.iter().filter(|(n, _)| is_loss(n)).collect();
    if rose.is_empty() {
        return None;
    }
    seen.lost += rose.iter().map(|(_, d)| d).sum::<u64>();
    let lost: Vec<String> = rose.iter().map(|(n, d)| format!("{n} +{d}")).collect();
    if seen.backed(now_ns) {
        return Some(dns_lost(lost));
    }
    seen.unbacked = Some((now_ns, lost.clone()));
    Some(node_lost(lost, ctx.drops_visible))
}

/// Conntrack losses that DNS packets dropped by netfilter back.
fn dns_lost(lost: Vec<String>) -> Finding<'static> {
    Finding::new(
        AnomalyKind::ConntrackInsertFailed,
        "dns".into(),
        move || {
            let summary = format!("conntrack dropped DNS packets: {}", lost.join(", "));
            let counters = format!(
                "/proc/net/stat/nf_conntrack on the node: {}",
                lost.join(", ")
            );
            let dns = format!("DNS packets were dropped by a netfilter verdict (NETFILTER_DROP legs) within {BACKING_S} s of the rise");
            Words::new(summary, vec![counters, dns])
        },
    )
}

/// Conntrack losses no DNS drop backs: the node's, maybe not DNS's.
fn node_lost(lost: Vec<String>, drops_visible: bool) -> Finding<'static> {
    Finding::new(
        AnomalyKind::ConntrackInsertFailed,
        String::new(),
        move || {
            let summary = format!(
                "conntrack dropped packets on the node (node-wide, not shown to be DNS): {}",
                lost.join(", ")
            );
            let dns = if drops_visible {
                format!("no DNS packet was dropped by a netfilter verdict within {BACKING_S} s of the rise, though kfree_skb is traced")
            } else {
                "kfree_skb is not traced: whether DNS packets were among those dropped is not visible".into()
            };
            let evidence = vec![
                format!(
                    "/proc/net/stat/nf_conntrack on the node: {}",
                    lost.join(", ")
                ),
                dns,
            ];
            let cause = "these counters count every flow on the node: UDP races in other traffic (statsd, NodePorts, other clients) or a full table raise them as well as DNS's parallel A/AAAA race".to_owned();
            let words = Words::new(summary, evidence)
            .cause(cause)
            .fix("`conntrack -S` shows the counters per CPU and `conntrack -L -p udp` the flows; if DNS lookups stall for 5 s, see parallel_query_lost, and `options single-request-reopen` or NodeLocalDNS");
            if drops_visible {
                words.severity(Severity::Warning)
            } else {
                words
            }
        },
    )
}

pub(super) fn conntrack_drops_before_start(ct: &ConntrackAtStart) -> Option<Finding<'_>> {
    let dropped: Vec<String> = ct
        .dropped
        .iter()
        .filter(|(n, v)| *v > 0 && is_loss(n))
        .map(|(n, v)| format!("{n} {v}"))
        .collect();
    (!dropped.is_empty()).then(|| {
        Finding::new(
            AnomalyKind::ConntrackDropsBeforeStart,
            String::new(),
            move || {
                let summary = format!(
                    "conntrack has dropped packets since boot: {}",
                    dropped.join(", ")
                );
                let evidence = vec![format!(
                    "/proc/net/stat/nf_conntrack on the node when tracing started: {}",
                    dropped.join(", ")
                )];
                Words::new(summary, evidence)
            },
        )
    })
}

/// A conntrack table this full starts dropping new flows soon.
const TABLE_FULL_PERCENT: u64 = 90;

/// How full the table was at the start (percent, of how many), when it
/// was that full.
fn nearly_full(ct: &ConntrackAtStart) -> Option<(u64, u64)> {
    let max = ct.max.filter(|m| *m > 0)?;
    let percent = ct.entries.saturating_mul(100) / max;
    (percent >= TABLE_FULL_PERCENT).then_some((percent, max))
}

/// What conntrack showed of losing packets, in words, if it did: a full
/// table or a drop drops a query before NAT, as missing rules would.
pub(super) fn trouble(ctx: &Context, seen: &CtSeen) -> Option<String> {
    let full = ctx.conntrack.as_ref().and_then(|ct| {
        let (percent, max) = nearly_full(ct)?;
        Some(format!(
            "its table was {percent}% full ({} of {max}) when tracing started",
            ct.entries
        ))
    });
    let lost = (seen.lost > 0).then(|| {
        format!(
            "its counters counted {} lost packets while tracing",
            seen.lost
        )
    });
    let all: Vec<String> = full.into_iter().chain(lost).collect();
    (!all.is_empty()).then(|| all.join(", and "))
}

pub(super) fn conntrack_table_full(ct: &ConntrackAtStart) -> Option<Finding<'_>> {
    let (percent, max) = nearly_full(ct)?;
    Some(Finding::new(
        AnomalyKind::ConntrackTableNearlyFull,
        String::new(),
        move || {
            let summary = format!(
                "the node's conntrack table is {percent}% full ({} of {max})",
                ct.entries
            );
            let evidence = vec![format!(
                "nf_conntrack entries {} of net.netfilter.nf_conntrack_max {max} when tracing started",
                ct.entries
            )];
            Words::new(summary, evidence)
        },
    ))
}
