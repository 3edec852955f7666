//! Forwarding loops between resolvers.
use std::net::IpAddr;

use super::{
    anomaly::{Finding, Words},
    legs::is_loopback,
    AnomalyKind,
};
use crate::correlate::{Journey, Outcome};
use crate::decode::Qtype;

/// CoreDNS's loop plugin asks `HINFO <random number>.<random number>.<zone>`.
pub(super) fn is_loop_probe(name: &str, qtype: Qtype) -> bool {
    let mut labels = name.split('.');
    let numeric =
        |l: Option<&str>| l.is_some_and(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()));
    qtype == Qtype::HINFO && numeric(labels.next()) && numeric(labels.next())
}

/// A server that asks a server already on the journey, or its own loopback.
pub(super) fn forwarding_loop(j: &Journey) -> Option<Finding<'_>> {
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
