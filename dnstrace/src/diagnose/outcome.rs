//! Rules on how a lookup ended: dropped, failed, unanswered or slow.
use std::collections::BTreeSet;

use super::{
    anomaly::{Finding, Words},
    legs::{origin, place, the_message},
    memory::Asked,
    AnomalyKind,
};
use crate::decode::Rcode;
use crate::{
    correlate::{Journey, Leg, Outcome},
    decode::KernelNames,
};

/// An answer slower than this, most of it in one place, is worth a word.
const SLOW_NS: u64 = 200_000_000;

pub(super) fn dropped<'a>(j: &'a Journey, names: &KernelNames) -> Option<Finding<'a>> {
    let Outcome::Dropped { reason, location } = j.outcome else {
        return None;
    };
    let leg = j.legs.iter().rfind(|l| l.drop.is_some())?;
    let (why, at) = (names.drop_reason(reason), names.location(location));
    // Per receiver: which server (or client) it happens to is the finding.
    let key = format!("{why}@{at} to {}", leg.dst.ip());
    Some(Finding::new(AnomalyKind::Dropped, key, move || {
        let (cause, fix) = drop_cause(&why, leg);
        let summary = format!(
            "DNS packets to {} dropped in the kernel: {why} at {at}",
            leg.dst.ip()
        );
        let evidence = vec![format!(
            "{} was dropped on {}: {why} at {at}",
            the_message(j, leg),
            place(leg)
        )];
        Words::new(summary, evidence).cause(cause).fix(fix)
    }))
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

pub(super) fn failing_answer(j: &Journey) -> Option<Finding<'_>> {
    let Outcome::Answered { rcode, .. } = &j.outcome else {
        return None;
    };
    if ![Rcode::SERVFAIL, Rcode::REFUSED].contains(rcode) {
        return None;
    }
    let server = origin(j)?.dst;
    let upstream_said = j.upstream.iter().find_map(|u| match &u.outcome {
        Outcome::Answered { rcode: r, .. } if r == rcode => u.legs.first().map(|l| l.dst),
        _ => None,
    });
    let key = format!("{rcode}:{}", upstream_said.unwrap_or(server));
    Some(Finding::new(AnomalyKind::FailingAnswers, key, move || {
        let mut evidence = vec![format!(
            "{} asked {server} for {} {}: {rcode}",
            j.client, j.name, j.qtype
        )];
        if let Some(up) = upstream_said {
            evidence.push(format!(
                "the upstream {up} answered {rcode} first: the failure comes from upstream"
            ));
        }
        let summary = format!(
            "{rcode} answers {}",
            upstream_said.map_or_else(
                || format!("from {server}"),
                |u| format!("coming from the upstream {u}")
            )
        );
        let cause = if upstream_said.is_some() {
            "the upstream resolver fails to resolve (its own upstreams unreachable, DNSSEC failure, or it refuses the client)"
        } else {
            "the resolver failed or refused the query"
        };
        Words::new(summary, evidence).cause(cause.into())
    }))
}

pub(super) fn unanswered<'a>(j: &'a Journey, recent: &'a [&'a Asked]) -> Option<Finding<'a>> {
    if j.outcome != Outcome::Timeout {
        return None;
    }
    let o = origin(j)?;
    let last = j.legs.last()?;
    Some(Finding::new(
        AnomalyKind::Unanswered,
        o.dst.to_string(),
        move || {
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
            Words::new(format!("lookups sent to {} get no answer", o.dst), evidence)
        },
    ))
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

/// Where the time of a slow answer went: the server's own work, its
/// upstream queries, or the network in between.
pub(super) fn slow(j: &Journey) -> Option<Finding<'_>> {
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
    Some(Finding::new(
        AnomalyKind::SlowAnswers,
        where_.to_owned(),
        move || {
            let ms = |ns: u64| ns as f64 / 1e6;
            let summary = format!(
                "slow answers: {:.0} ms, most of it in {where_}",
                ms(j.total_ns())
            );
            let evidence = vec![format!(
            "{} {}: {:.1} ms in all; {:.1} ms upstream, {:.1} ms in the resolver, {:.1} ms on the network",
            j.name,
            j.qtype,
            ms(j.total_ns()),
            ms(upstream),
            ms(at_server.saturating_sub(upstream)),
            ms(network)
        )];
            let cause = match where_ {
            "upstream" => "the upstream resolver is slow to answer",
            "the resolver itself" => "the resolver is slow (overloaded, throttled CPU, or waiting on something other than its upstream)",
            _ => "the network between the client and the resolver is slow or lossy",
        };
            Words::new(summary, evidence).cause(cause.into())
        },
    ))
}
