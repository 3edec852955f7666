//! Rules on how a lookup ended: dropped, failed, malformed or unanswered.
use std::{collections::BTreeSet, net::IpAddr};

use super::{
    anomaly::{Finding, Words},
    legs::the_message,
    memory::Asked,
    places::{addr, name, place},
    AnomalyKind, Context,
};
use crate::decode::Rcode;
use crate::{
    correlate::{Journey, Leg, Outcome},
    decode::{KernelNames, NodeId},
    routes::Route,
};
use dnstrace_common::Direction;

pub(super) fn dropped<'a>(
    j: &'a Journey,
    names: &KernelNames,
    ctx: &'a Context,
) -> Option<Finding<'a>> {
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
            the_message(ctx, j, leg),
            place(ctx, leg)
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
    let server = j.origin()?.dst;
    let upstream_said = j.upstream.iter().find_map(|u| match &u.outcome {
        Outcome::Answered { rcode: r, .. } if r == rcode => u.legs.first().map(|l| l.dst),
        _ => None,
    });
    // A resolver on another node asks its upstream out of sight.
    let unseen_upstream = upstream_said.is_none() && !resolver_here(j);
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
        if unseen_upstream {
            evidence.push("the resolver is on another node: whether its upstream answered so first is not visible from here".into());
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
        } else if unseen_upstream {
            "the resolver or its upstream failed or refused the query; which one is out of sight from this node"
        } else {
            "the resolver failed or refused the query"
        };
        Words::new(summary, evidence).cause(cause.into())
    }))
}

pub(super) fn unanswered<'a>(
    j: &'a Journey,
    recent: &'a [&'a Asked],
    ctx: &'a Context,
) -> Option<Finding<'a>> {
    if j.outcome != Outcome::Timeout {
        return None;
    }
    let o = j.origin()?;
    let last = j.legs.last()?;
    if let Some(left) = left_unanswered(j) {
        return Some(left_node(j, left, recent, ctx));
    }
    Some(Finding::new(
        AnomalyKind::Unanswered,
        o.dst.to_string(),
        move || {
            let mut evidence = vec![format!(
                "{} asked {} for {} {}; last seen by {} at {}, {} → {}",
                addr(ctx, j.client),
                addr(ctx, o.dst),
                j.name,
                j.qtype,
                last.hook.name(),
                place(ctx, last),
                last.src,
                last.dst
            )];
            evidence.extend(earlier_attempts(j, recent));
            Words::new(format!("lookups sent to {} get no answer", o.dst), evidence)
        },
    ))
}

/// The query's leaving this node, where that was its last sighting and
/// nothing came back: its resolver is elsewhere, out of this node's sight.
fn left_unanswered(j: &Journey) -> Option<&Leg> {
    if resolver_here(j) || j.legs.iter().any(|l| l.response) {
        return None;
    }
    j.legs
        .iter()
        .rfind(|l| !l.response && l.direction() == Direction::Egress)
}

/// What one node can say of a lookup lost past it: where the query went,
/// and where to look next, as the node's routes tell it.
fn left_node<'a>(
    j: &'a Journey,
    left: &'a Leg,
    recent: &'a [&'a Asked],
    ctx: &'a Context,
) -> Finding<'a> {
    Finding::new(AnomalyKind::Unanswered, left.dst.to_string(), move || {
        let node = which_node(ctx, left.node);
        let ip = left.dst.ip();
        let route = ctx.routes.get(&left.node).and_then(|r| r.toward(ip));
        let mut evidence = vec![format!(
            "{} asked {} for {} {}; the query left {} for {}, and nothing came back",
            addr(ctx, j.client),
            addr(ctx, j.origin().map_or(left.dst, |o| o.dst)),
            j.name,
            j.qtype,
            place(ctx, left),
            addr(ctx, left.dst)
        )];
        evidence.extend(route.map(|r| routed(ip, r)));
        evidence.extend(earlier_attempts(j, recent));
        Words::new(
            format!(
                "lookups sent to {} get no answer past {node}: look at {} next",
                left.dst,
                next_hop(ip, route)
            ),
            evidence,
        )
        .about(vec![ip])
    })
}

/// "this node" for one node's view; in a replay of several, its name.
fn which_node(ctx: &Context, node: NodeId) -> String {
    if ctx.nodes.len() < 2 {
        return "this node".into();
    }
    name(ctx, node)
}

/// Where to look for `ip`: on the node its overlay route leads to, past
/// its gateway, or, with no route known, on its own node.
fn next_hop(ip: IpAddr, route: Option<&Route>) -> String {
    match route {
        Some(Route {
            node: Some(node),
            dev,
            ..
        }) => format!("{ip} on the node at {node} (over {dev})"),
        Some(r) => format!(
            "{ip} and its node, past the gateway {} ({})",
            r.gateway, r.dev
        ),
        None => format!("{ip} and its node"),
    }
}

/// The route `ip` took, as evidence.
fn routed(ip: IpAddr, r: &Route) -> String {
    let via = format!(
        "the node routes {ip} by {}/{} via {} dev {}",
        r.dst, r.len, r.gateway, r.dev
    );
    match r.node {
        Some(node) => format!(
            "{via}, whose neighbour entry gives {} a VTEP MAC that {}'s FDB sends to {node}",
            r.gateway, r.dev
        ),
        None => via,
    }
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

/// The query's last sighting was its arrival (an ingress), not its
/// leaving (an egress): it ended its way on this node, at the resolver.
pub(super) fn resolver_here(j: &Journey) -> bool {
    let last = j
        .legs
        .iter()
        .rfind(|l| !l.response && matches!(l.direction(), Direction::Ingress | Direction::Egress));
    last.is_some_and(|l| l.direction() == Direction::Ingress)
}

/// An answer arrived and could not be read whole: its own finding, not
/// silence. Per server: which one sends them is the finding.
pub(super) fn malformed_answer<'a>(j: &'a Journey, ctx: &'a Context) -> Option<Finding<'a>> {
    let Outcome::Answered {
        malformed: Some(why),
        rcode,
        ..
    } = &j.outcome
    else {
        return None;
    };
    let reply = j.legs.iter().find(|l| l.response)?;
    let from = reply.src;
    Some(Finding::new(
        AnomalyKind::MalformedAnswer,
        from.ip().to_string(),
        move || {
            let summary = format!("answers from {from} cannot be read whole");
            let evidence = vec![format!(
                "{} {}: the {rcode} answer from {}, seen on {}, breaks at the {why}",
                j.name,
                j.qtype,
                addr(ctx, from),
                place(ctx, reply)
            )];
            Words::new(summary, evidence).about(vec![from.ip()])
        },
    ))
}
