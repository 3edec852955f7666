//! Conntrack: the A/AAAA insert race, and the node's counters and table.
use super::{
    anomaly::{Finding, Words},
    memory::Asked,
    AnomalyKind, ConntrackAtStart,
};
use crate::{
    correlate::{Journey, Outcome},
    decode::{KernelNames, Qtype},
};

/// The two queries of a parallel pair leave their socket this close together.
const PAIR_NS: u64 = 50_000_000;

/// One of a parallel A/AAAA pair got no answer while its sibling, sent
/// from the same socket at the same moment, did: the conntrack insert race.
pub(super) fn half_pair_lost<'a>(
    j: &'a Journey,
    recent: &[&Asked],
    names: &KernelNames,
) -> Option<Finding<'a>> {
    if matches!(j.outcome, Outcome::Answered { .. }) || !matches!(j.qtype, Qtype::A | Qtype::AAAA) {
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

/// The node's conntrack counters moved: (name, increase). A resolved
/// clash (`clashres`) lost nothing and is no failure; packets conntrack
/// dropped are.
pub(super) fn insert_failed(moved: &[(&'static str, u64)]) -> Option<Finding<'static>> {
    let lost: Vec<String> = moved
        .iter()
        .filter(|(n, _)| *n != "clashres")
        .map(|(n, d)| format!("{n} +{d}"))
        .collect();
    if lost.is_empty() {
        return None;
    }
    Some(Finding::new(
        AnomalyKind::ConntrackInsertFailed,
        String::new(),
        move || {
            let summary = format!("conntrack dropped packets: {}", lost.join(", "));
            let evidence = vec![format!(
                "/proc/net/stat/nf_conntrack on the node: {}",
                lost.join(", ")
            )];
            Words::new(summary, evidence)
        },
    ))
}

pub(super) fn conntrack_drops_before_start(ct: &ConntrackAtStart) -> Option<Finding<'_>> {
    let dropped: Vec<String> = ct
        .dropped
        .iter()
        .filter(|(_, v)| *v > 0)
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

pub(super) fn conntrack_table_full(ct: &ConntrackAtStart) -> Option<Finding<'_>> {
    let max = ct.max.filter(|m| *m > 0)?;
    let percent = ct.entries.saturating_mul(100) / max;
    (percent >= TABLE_FULL_PERCENT).then(|| {
        Finding::new(AnomalyKind::ConntrackTableNearlyFull, String::new(), move || {
            let summary = format!(
                "the node's conntrack table is {percent}% full ({} of {max})",
                ct.entries
            );
            let evidence = vec![format!(
                "nf_conntrack entries {} of net.netfilter.nf_conntrack_max {max} when tracing started",
                ct.entries
            )];
            Words::new(summary, evidence)
        })
    })
}
