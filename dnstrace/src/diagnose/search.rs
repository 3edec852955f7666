//! Search domains and ndots: leaks to the outside, and the cost of misses.
use super::{
    anomaly::{Finding, Words},
    memory::Asked,
    AnomalyKind,
};
use crate::correlate::{Journey, Outcome};
use crate::decode::Rcode;

/// Search-list NXDOMAINs costing this much before an answer are worth a word.
const AMPLIFICATION_NS: u64 = 100_000_000;

/// The cluster's own suffix; names under it never leave the cluster.
const CLUSTER_SUFFIX: &str = ".cluster.local.";

/// `B.cluster.local.` then `B.S.` with S foreign: S came from the client's
/// search list, and a cluster-style name went to the outside world.
pub(super) fn search_leak<'a>(j: &'a Journey, recent: &[&'a Asked]) -> Option<Finding<'a>> {
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
    Some(Finding::new(
        AnomalyKind::SearchDomainLeak,
        suffix.to_owned(),
        move || {
            let summary =
                format!("cluster-style names leak out with the foreign search domain {suffix}");
            let evidence = vec![format!(
                "{} asked {}, then {}{upstream}",
                j.client.ip(),
                tried.join(", "),
                j.name
            )];
            let cause = format!("the client's search list includes {suffix} (the node's resolv.conf, inherited through dnsPolicy, or the pod's dnsConfig), so every short name is also asked of the outside world");
            Words::new(summary, evidence).cause(cause)
        },
    ))
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
pub(super) fn ndots_amplification<'a>(j: &'a Journey, recent: &[&'a Asked]) -> Option<Finding<'a>> {
    let Outcome::Answered { rcode, answers, .. } = &j.outcome else {
        return None;
    };
    if *rcode != Rcode::NOERROR || answers.is_empty() || j.incomplete.is_some() {
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
    Some(Finding::new(
        AnomalyKind::NdotsAmplification,
        String::new(),
        move || {
            let summary = format!("lookups pay for search-list misses: {} NXDOMAINs ({:.0} ms) before {} was answered", misses.len(), cost as f64 / 1e6, j.name);
            let evidence = vec![format!(
                "{} asked {} first",
                j.client.ip(),
                tried.join(", ")
            )];
            Words::new(summary, evidence)
        },
    ))
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
