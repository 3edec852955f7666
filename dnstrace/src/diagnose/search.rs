//! Search domains and ndots: leaks to the outside, and the cost of misses.
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
};

use super::{
    anomaly::{Finding, Words},
    memory::Asked,
    places::ip,
    AnomalyKind, Context,
};
use crate::correlate::{Journey, Outcome};
use crate::decode::Rcode;

/// Search-list NXDOMAINs costing this much before an answer are worth a word.
const AMPLIFICATION_NS: u64 = 100_000_000;

/// `B.<cluster domain>.` then `B.S.` with S foreign, sent upstream and
/// failed there: S came from the client's search list, and a
/// cluster-style name went to the outside world for nothing. Not when S is
/// one of the node's own search domains, which the kubelet appends by
/// design.
pub(super) fn search_leak<'a>(
    j: &'a Journey,
    recent: &[&'a Asked],
    ctx: &'a Context,
) -> Option<Finding<'a>> {
    let sent = failed_upstream(j)?;
    let domains = cluster_domains(ctx, recent);
    if domains.iter().any(|d| j.name.ends_with(d.as_str())) {
        return None;
    }
    // The longest base: for `a.svc.cluster.local` looked up as it is
    // written, `a.svc.cluster.local.cluster.local.` was asked as well as
    // `a.svc.cluster.local.`, and the suffix is what follows the longer.
    let base = recent
        .iter()
        .filter_map(|a| {
            let base = domains
                .iter()
                .find_map(|d| a.name.strip_suffix(d.as_str()))?;
            j.name
                .strip_prefix(base)?
                .strip_prefix('.')
                .filter(|rest| !rest.is_empty())
                .map(|_| base)
        })
        .max_by_key(|base| base.len())?;
    let suffix = j.name[base.len() + 1..].trim_end_matches('.');
    // The node's own domain, appended by the kubelet: a cost of ndots
    // (`ndots_amplification`), not a leak.
    if ctx
        .node_search
        .iter()
        .any(|d| d.trim_end_matches('.') == suffix)
    {
        return None;
    }
    // A and AAAA of each candidate: each once, in the order asked.
    let mut tried: Vec<&str> = Vec::new();
    for a in recent
        .iter()
        .filter(|a| under(&a.name, base) && a.name != j.name)
    {
        if !tried.contains(&&*a.name) {
            tried.push(&a.name);
        }
    }
    Some(Finding::new(
        AnomalyKind::SearchDomainLeak,
        suffix.to_owned(),
        move || {
            let summary =
                format!("cluster-style names leak out with the foreign search domain {suffix}");
            let evidence = vec![
                format!(
                    "{} asked {}, then {} (sent upstream to {})",
                    ip(ctx, j.client.ip()),
                    tried.join(", "),
                    j.name,
                    sent.0
                ),
                format!("{}: {}", sent.0, sent.1),
            ];
            let cause = format!("the client's search list includes {suffix} (the node's resolv.conf, inherited through dnsPolicy, or the pod's dnsConfig), so every short name is also asked of the outside world");
            Words::new(summary, evidence).cause(cause)
        },
    ))
}

/// Where `j`'s resolver sent it upstream and what came of it, if it was
/// sent and no upstream resolved it (no answer, or one without records).
fn failed_upstream(j: &Journey) -> Option<(SocketAddr, String)> {
    let resolved = j.upstream.iter().any(|u| {
        matches!(&u.outcome, Outcome::Answered { rcode, answers, .. } if *rcode == Rcode::NOERROR && !answers.is_empty())
    });
    let u = j.upstream.first()?;
    let fate = match &u.outcome {
        Outcome::Answered { rcode, .. } => format!("answered {rcode}"),
        Outcome::Dropped { .. } => "the query was dropped".to_owned(),
        Outcome::Timeout => "no answer".to_owned(),
    };
    (!resolved).then_some((u.legs.first()?.dst, fate))
}

/// The cluster's domains as `.<domain>.`: from the traced pod's search
/// list (`<ns>.svc.<domain>`), and from the client's names under `.svc.`
/// (the first candidate of its search list).
fn cluster_domains(ctx: &Context, recent: &[&Asked]) -> Vec<String> {
    let listed = ctx
        .target
        .iter()
        .filter_map(|t| t.resolv.as_ref())
        .flat_map(|r| &r.search)
        .filter_map(|d| {
            d.split_once(".svc.")
                .map(|(_, domain)| domain)
                .or_else(|| d.strip_prefix("svc."))
        })
        .map(|d| format!(".{}.", d.trim_end_matches('.')));
    let asked = recent.iter().filter_map(|a| {
        a.name
            .split_once(".svc.")
            .map(|(_, domain)| format!(".{domain}"))
    });
    let mut domains: Vec<String> = Vec::new();
    for d in listed.chain(asked) {
        if d.len() > 2 && !domains.contains(&d) {
            domains.push(d);
        }
    }
    domains
}

/// `name` is `stem` followed by a dot and more: `stem` with a suffix.
fn under(name: &str, stem: &str) -> bool {
    name.strip_prefix(stem)
        .is_some_and(|rest| rest.starts_with('.'))
}

/// A client's lookups that went through the search list in its current
/// minute: how many, and how many paid for their misses, from when to when.
#[derive(Clone, Copy, Debug)]
struct Window {
    since_ns: u64,
    lookups: u32,
    costly: u32,
    first_costly_ns: u64,
    last_costly_ns: u64,
}

/// How long a client's window runs before it starts again.
const WINDOW_NS: u64 = 60_000_000_000;

/// Costly lookups must recur at least this many times over at least this
/// long: a restart or a stalled machine slows a burst of lookups once.
const HABIT_LOOKUPS: u32 = 3;
const HABIT_SPAN_NS: u64 = 10_000_000_000;

/// Clients remembered, as for their questions.
const CLIENTS: usize = 4096;

/// What each client's lookups pay for search-list misses: amplification is
/// a habit of a client's configuration, not one slow lookup.
#[derive(Default)]
pub(super) struct MissCosts(BTreeMap<IpAddr, Window>);

impl MissCosts {
    /// Counts `j` if it was answered after search-list misses; returns
    /// what they cost it.
    pub(super) fn count(&mut self, j: &Journey, recent: &[&Asked]) -> Option<u64> {
        let cost = miss_cost(j, recent)?;
        let at = j.started_ns;
        if !self.0.contains_key(&j.client.ip()) && self.0.len() >= CLIENTS {
            // Forget the client whose window is oldest.
            let oldest = self.0.iter().min_by_key(|(_, w)| w.since_ns);
            if let Some(ip) = oldest.map(|(ip, _)| *ip) {
                self.0.remove(&ip);
            }
        }
        let w = self.0.entry(j.client.ip()).or_insert(Window::new(at));
        if at.saturating_sub(w.since_ns) > WINDOW_NS {
            *w = Window::new(at);
        }
        w.lookups += 1;
        if cost >= AMPLIFICATION_NS {
            if w.costly == 0 {
                w.first_costly_ns = at;
            }
            w.costly += 1;
            w.last_costly_ns = w.last_costly_ns.max(at);
        }
        Some(cost)
    }

    /// `client`'s window, if most of its lookups through the search list
    /// paid for their misses, again and again.
    fn habit(&self, client: IpAddr) -> Option<Window> {
        let w = *self.0.get(&client)?;
        let recurs = w.costly >= HABIT_LOOKUPS
            && w.last_costly_ns.saturating_sub(w.first_costly_ns) >= HABIT_SPAN_NS;
        (recurs && 2 * w.costly >= w.lookups).then_some(w)
    }
}

impl Window {
    fn new(since_ns: u64) -> Self {
        Self {
            since_ns,
            lookups: 0,
            costly: 0,
            first_costly_ns: 0,
            last_costly_ns: 0,
        }
    }
}

/// What `j`'s search-list misses cost its client, if it was answered after
/// at least three of them. Journeys that lost events are left out, as
/// their times are no evidence.
fn miss_cost(j: &Journey, recent: &[&Asked]) -> Option<u64> {
    let Outcome::Answered { rcode, answers, .. } = &j.outcome else {
        return None;
    };
    if *rcode != Rcode::NOERROR || answers.is_empty() || j.incomplete.is_some() {
        return None;
    }
    let misses = search_misses(j, recent);
    (misses.len() >= 3).then(|| time_covered(&misses))
}

/// An answer that came only after several search-list NXDOMAINs that cost
/// real time (`cost`, as `MissCosts::count` found it), for a client whose
/// lookups mostly pay so: the price of ndots:5 for names outside the cluster.
pub(super) fn ndots_amplification<'a>(
    j: &'a Journey,
    recent: &[&'a Asked],
    cost: Option<u64>,
    costs: &MissCosts,
    ctx: &'a Context,
) -> Option<Finding<'a>> {
    let cost = cost.filter(|&c| c >= AMPLIFICATION_NS)?;
    let w = costs.habit(j.client.ip())?;
    let misses = search_misses(j, recent);
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
            let evidence = vec![
                format!(
                    "{} asked {} first",
                    ip(ctx, j.client.ip()),
                    tried.join(", ")
                ),
                format!(
                    "{} of its {} answers after search-list misses waited {} ms or more for them, over {:.0} s",
                    w.costly,
                    w.lookups,
                    AMPLIFICATION_NS / 1_000_000,
                    w.last_costly_ns.saturating_sub(w.first_costly_ns) as f64 / 1e9
                ),
            ];
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
