//! Journey rules about NAT and where answers come from.
use std::{collections::BTreeSet, net::IpAddr};

use super::{
    anomaly::{Finding, Words},
    bridged::{between, Way},
    conntrack::{trouble, CtSeen},
    legs::is_loopback,
    places::{addr, place},
    AnomalyKind, Context, Translation,
};
use crate::correlate::{Journey, Outcome};
use dnstrace_common::Direction;

pub(super) fn unexpected_source<'a>(j: &'a Journey, ctx: &'a Context) -> Option<Finding<'a>> {
    let o = j.origin()?;
    // One socket may ask several servers under one id (musl asks every
    // nameserver at once): an answer from any of them is its own.
    let asked = |from: std::net::SocketAddr| {
        j.legs.iter().any(|l| {
            !l.response
                && l.dst == from
                && (l.node, l.netns, l.ifindex, l.direction())
                    == (o.node, o.netns, o.ifindex, o.direction())
        })
    };
    let wrong = j.answers_at_client().find(|l| !asked(l.src))?;
    let mut evidence = vec![
        format!(
            "the query {} → {} left {}",
            addr(ctx, j.client),
            addr(ctx, o.dst),
            place(ctx, o)
        ),
        format!(
            "its answer reached {} from {}, not from {}",
            place(ctx, wrong),
            addr(ctx, wrong.src),
            o.dst
        ),
    ];
    if let Outcome::Dropped { .. } = j.outcome {
        evidence.push(format!(
            "the kernel dropped it there: the client's socket, connected to {}, does not take it",
            o.dst
        ));
    }
    let way = between(ctx, j.client.ip(), wrong.src.ip());
    evidence.extend(way.evidence());
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
            if way == Way::NotBridged {
                return Words::new(summary, evidence)
                    .cause(NOT_BRIDGED_CAUSE.into())
                    .fix(NOT_BRIDGED_FIX);
            }
            let cause = format!(
            "the reverse NAT of kube-proxy's DNAT did not run on the reply: br_netfilter not loaded or net.bridge.bridge-nf-call-iptables=0 on the node, so replies bridged between pods skip iptables{sysctl}"
        );
            Words::new(summary, evidence).cause(cause)
        },
    ))
}

/// An un-NATed answer between pods that share no bridge: routed, it passed
/// conntrack, so br_netfilter is not why.
const NOT_BRIDGED_CAUSE: &str = "the answer missed the conntrack entry of the query's DNAT, so its reverse NAT did not run; the client and the resolver share no bridge on this node (routed pods), so br_netfilter is not why: the answer came back another way than the query went (another node or interface, asymmetric routing), or a rule keeps it from conntrack (NOTRACK)";
const NOT_BRIDGED_FIX: &str = "follow the answer's legs back to the resolver to see which way it took; `conntrack -L -p udp --orig-dst <service IP>` shows the query's entry, and `iptables -t raw -S` any NOTRACK rule";

pub(super) fn loopback_nameserver<'a>(j: &'a Journey, ctx: &'a Context) -> Option<Finding<'a>> {
    let o = j.origin()?;
    let in_pod = o.netns != 0 && o.netns != ctx.node_netns;
    // Answered: something listens there (CoreDNS's loop plugin probing
    // itself at start, a DNS sidecar). Loops are forwarding_loop's.
    if matches!(j.outcome, Outcome::Answered { .. }) || super::loops::laps(j).is_some() {
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
                    addr(ctx, j.client),
                    o.dst,
                    j.name,
                    place(ctx, o)
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
        let Some(o) = j.origin() else {
            return;
        };
        let service = o.dst.ip();
        let from_it = || j.answers_at_client().any(|l| l.src == o.dst);
        if j.dnat.is_none() && ctx.service_ips.contains(&service) && from_it() {
            self.0.insert(service);
        }
    }
}

pub(super) fn not_translated<'a>(
    j: &'a Journey,
    ctx: &'a Context,
    local: &LocalListeners,
    ct: &CtSeen,
) -> Option<Finding<'a>> {
    let o = j.origin()?;
    let unanswered = !matches!(j.outcome, Outcome::Answered { .. });
    let asked_service = ctx.service_ips.contains(&o.dst.ip());
    if !(unanswered && asked_service && j.dnat.is_none()) {
        return None;
    }
    // A listener on the service IP took it (it asked upstream, or answered
    // others un-NATed): no DNAT is meant; the rules after this one tell
    // what became of it.
    if !j.upstream.is_empty() || local.0.contains(&o.dst.ip()) {
        return None;
    }
    // Conntrack does no NAT for a balancer at the socket.
    let trouble = (ctx.translation == Translation::Dnat)
        .then(|| trouble(ctx, ct))
        .flatten();
    // Lost before the node's NAT had its turn, nothing says it would have
    // failed; conntrack counting lost packets is evidence of its own.
    if trouble.is_none() && !left_untranslated(j, ctx, o.dst.ip()) {
        return None;
    }
    let socket = ctx.translation == Translation::Socket;
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
                    addr(ctx, j.client),
                    addr(ctx, o.dst),
                    j.name
                ),
                format!(
                    "last seen by {} at {}, still addressed to {}",
                    last.hook.name(),
                    place(ctx, last),
                    last.dst
                ),
            ];
            match trouble {
                Some(t) => {
                    evidence.push(format!("the node's conntrack is in trouble: {t}"));
                    let cause = format!("conntrack could not track the query, so no NAT ran on it ({t}): a full table drops new flows before kube-proxy's DNAT");
                    Words::new(summary, evidence).cause(cause).fix("raise net.netfilter.nf_conntrack_max (kube-proxy's --conntrack-max-per-core) or shorten UDP timeouts; `conntrack -S` and dmesg (\"nf_conntrack: table full\") confirm it")
                }
                None if socket => Words::new(summary, evidence)
                    .cause(SOCKET_CAUSE.into())
                    .fix(SOCKET_FIX),
                None => Words::new(summary, evidence),
            }
        },
    ))
}

/// Why a query leaves addressed to the service where no proxy rules are:
/// the balancer at the socket let it through.
const SOCKET_CAUSE: &str = "the node has no proxy rules, so a kube-proxy replacement is to rewrite the service address at the socket (Cilium's or Calico's eBPF socket load balancing); this query left still addressed to the service: the replacement's programs are not attached over the pod's cgroup, or its service map has no backends for this IP and port";

const SOCKET_FIX: &str = "check the replacement's agent on this node: its service list (`cilium-dbg service list`, `calico-node -bpf nat dump`) should show the IP with its CoreDNS backends, and `bpftool cgroup tree` its connect4 and sendmsg4 programs; restart the agent if either is missing";

/// The query left a device of the node's namespace still addressed to the
/// service: DNAT (PREROUTING for pods, OUTPUT for the node) had run by then.
fn left_untranslated(j: &Journey, ctx: &Context, service: IpAddr) -> bool {
    j.legs.iter().any(|l| {
        !l.response
            && l.netns == ctx.node_netns
            && l.direction() == Direction::Egress
            && l.dst.ip() == service
    })
}
