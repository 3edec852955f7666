//! Journey rules about NAT and where answers come from.
use std::{collections::BTreeSet, net::IpAddr};

use super::{
    anomaly::{Finding, Words},
    conntrack::{trouble, CtSeen},
    legs::{answers_at_client, is_loopback, origin, place},
    AnomalyKind, Context,
};
use crate::correlate::{Journey, Outcome};
use dnstrace_common::Hook;

pub(super) fn unexpected_source<'a>(j: &'a Journey, ctx: &Context) -> Option<Finding<'a>> {
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
    Some(Finding::new(
        AnomalyKind::ReplyFromUnexpectedSource,
        wrong.src.ip().to_string(),
        move || {
            let summary = format!(
                "answers to queries for {} come back from {} un-NATed",
                o.dst, wrong.src
            );
            let cause = format!(
            "the reverse NAT of kube-proxy's DNAT did not run on the reply: br_netfilter not loaded or net.bridge.bridge-nf-call-iptables=0 on the node, so replies bridged between pods skip iptables{sysctl}"
        );
            Words::new(summary, evidence).cause(cause)
        },
    ))
}

pub(super) fn loopback_nameserver<'a>(j: &'a Journey, ctx: &Context) -> Option<Finding<'a>> {
    let o = origin(j)?;
    let in_pod = o.netns != 0 && o.netns != ctx.node_netns;
    // Answered: something listens there (CoreDNS's loop plugin probing
    // itself at start, a DNS sidecar). Loops are forwarding_loop's.
    if matches!(j.outcome, Outcome::Answered { .. }) {
        return None;
    }
    (is_loopback(o.dst.ip()) && in_pod).then(|| {
        Finding::new(
            AnomalyKind::LoopbackNameserver,
            format!("{}@{}", o.dst.ip(), o.netns),
            move || {
                let summary = format!(
                    "a pod (network namespace {}) sends its DNS queries to {}",
                    o.netns, o.dst
                );
                let evidence = vec![format!(
                    "{} asked {} for {} on {}",
                    j.client,
                    o.dst,
                    j.name,
                    place(o)
                )];
                Words::new(summary, evidence)
            },
        )
    })
}

/// Service IPs a local listener answers on without DNAT: NodeLocalDNS
/// bound to the kube-dns IP, whose NOTRACK rules skip kube-proxy's NAT
/// on purpose.
#[derive(Default)]
pub(super) struct LocalListeners(BTreeSet<IpAddr>);

impl LocalListeners {
    /// Notes the service IP `j` asked if an answer came from it un-NATed.
    pub(super) fn note(&mut self, j: &Journey, ctx: &Context) {
        let Some(o) = origin(j) else {
            return;
        };
        let service = o.dst.ip();
        let from_it = || answers_at_client(j).any(|l| l.src == o.dst);
        if j.dnat.is_none() && ctx.service_ips.contains(&service) && from_it() {
            self.0.insert(service);
        }
    }
}

/// Last seen coming into the node's namespace, and neither sent on nor
/// dropped there (kfree_skb watched): a socket on the node took it, a
/// listener on the service IP (NodeLocalDNS bound to it, with no answer to
/// give: its own way to CoreDNS failed).
fn taken_on_the_node(j: &Journey, ctx: &Context) -> bool {
    ctx.drops_visible
        && matches!(j.outcome, Outcome::Timeout)
        && j.legs
            .last()
            .is_some_and(|l| !l.response && l.netns == ctx.node_netns && l.hook == Hook::DevReceive)
}

pub(super) fn not_translated<'a>(
    j: &'a Journey,
    ctx: &Context,
    local: &LocalListeners,
    ct: &CtSeen,
) -> Option<Finding<'a>> {
    let o = origin(j)?;
    let unanswered = !matches!(j.outcome, Outcome::Answered { .. });
    let asked_service = ctx.service_ips.contains(&o.dst.ip());
    if !(unanswered && asked_service && j.dnat.is_none()) {
        return None;
    }
    // A listener on the service IP took it (it asked upstream, or answered
    // others un-NATed): no DNAT is meant; the rules after this one tell
    // what became of it.
    if !j.upstream.is_empty() || local.0.contains(&o.dst.ip()) || taken_on_the_node(j, ctx) {
        return None;
    }
    let trouble = trouble(ctx, ct);
    let last = j.legs.iter().rfind(|l| !l.response).unwrap_or(o);
    Some(Finding::new(
        AnomalyKind::ServiceNotTranslated,
        o.dst.ip().to_string(),
        move || {
            let summary = format!(
                "queries to the service IP {} are never translated to an endpoint",
                o.dst.ip()
            );
            let mut evidence = vec![
                format!(
                    "{} asked {} for {}; no leg shows a DNAT",
                    j.client, o.dst, j.name
                ),
                format!(
                    "last seen at {} ({}), still addressed to {}",
                    place(last),
                    last.hook.name(),
                    last.dst
                ),
            ];
            match trouble {
                Some(t) => {
                    evidence.push(format!("the node's conntrack is in trouble: {t}"));
                    let cause = format!("conntrack could not track the query, so no NAT ran on it ({t}): a full table drops new flows before kube-proxy's DNAT");
                    Words::new(summary, evidence).cause(cause).fix("raise net.netfilter.nf_conntrack_max (kube-proxy's --conntrack-max-per-core) or shorten UDP timeouts; `conntrack -S` and dmesg (\"nf_conntrack: table full\") confirm it")
                }
                None => Words::new(summary, evidence),
            }
        },
    ))
}
