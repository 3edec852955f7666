//! Forwarding loops between resolvers.
use std::net::IpAddr;

use super::{
    anomaly::{Finding, Words},
    legs::is_loopback,
    AnomalyKind,
};
use crate::correlate::{Journey, Leg, Outcome};
use crate::decode::Qtype;

/// CoreDNS's loop plugin asks `HINFO <random number>.<random number>.<zone>`.
pub(super) fn is_loop_probe(name: &str, qtype: Qtype) -> bool {
    let mut labels = name.split('.');
    let numeric =
        |l: Option<&str>| l.is_some_and(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()));
    qtype == Qtype::HINFO && numeric(labels.next()) && numeric(labels.next())
}

/// Within this of each other, the same query seen twice at one place is a
/// lap: the kernel's window (dnstrace-ebpf's `laps`). A client's retry
/// comes a second or more later.
const LAP_NS: u64 = 10_000_000;

/// Where the journey's query came back to a place it had been seen at
/// (the same hook of the same device, the same ends) within `LAP_NS`: the
/// first sighting there, how many the journey has there, and the time
/// from the first to the next. It runs on every journey judged: no
/// allocation, over a lookup's few legs.
pub(super) fn laps(j: &Journey) -> Option<(&Leg, usize, u64)> {
    let same = |a: &Leg, b: &Leg| {
        !b.response
            && (a.node, a.netns, a.ifindex, a.hook, a.src, a.dst)
                == (b.node, b.netns, b.ifindex, b.hook, b.src, b.dst)
    };
    let mut queries = j.legs.iter().enumerate().filter(|(_, l)| !l.response);
    queries.find_map(|(i, a)| {
        let next = j.legs[i + 1..].iter().find(|b| same(a, b))?;
        let apart = next.ts_ns.abs_diff(a.ts_ns);
        (apart <= LAP_NS).then(|| (a, j.legs.iter().filter(|b| same(a, b)).count(), apart))
    })
}

/// A server that asks a server already on the journey, or its own
/// loopback; or a query seen going round one place.
pub(super) fn forwarding_loop(j: &Journey) -> Option<Finding<'_>> {
    asked_again(j).or_else(|| went_round(j))
}

/// The query came back where it was, again and again, in a journey of its
/// own: a resolver that keeps the query's id asking itself (dnsmasq), seen
/// from after its first lap (the journey that led there has closed).
fn went_round(j: &Journey) -> Option<Finding<'_>> {
    let (at, n, apart) = laps(j)?;
    let (client, server) = (at.src.ip(), at.dst.ip());
    let iface = at.iface.as_deref().unwrap_or("?");
    let evidence = vec![
        format!(
            "{} {} from {} to {} was seen {n} times at {}@{}, the first two {:.3} ms apart",
            j.name,
            j.qtype,
            at.src,
            at.dst,
            iface,
            at.netns,
            apart as f64 / 1e6
        ),
        "the kernel sends a loop's 1st, 2nd, 4th, 8th... lap and counts the rest (dnstrace_query_laps_left_out_total)".into(),
    ];
    Some(Finding::new(
        AnomalyKind::ForwardingLoop,
        format!("{client}>{server}"),
        move || {
            let summary = format!("DNS forwarding loop: {client} forwards to {server}");
            Words::new(summary, evidence)
        },
    ))
}

/// A server that asks a server already on the journey, or its own loopback.
fn asked_again(j: &Journey) -> Option<Finding<'_>> {
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
    // Most journeys asked no one further: no path to walk (nor allocate).
    if j.upstream.is_empty() {
        return None;
    }
    let first = j.origin()?.dst.ip();
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
    Some(Finding::new(
        AnomalyKind::ForwardingLoop,
        format!("{}>{}", u.client.ip(), server),
        move || {
            let summary = format!(
                "DNS forwarding loop: {} forwards to {}",
                u.client.ip(),
                server
            );
            Words::new(summary, evidence)
        },
    ))
}
