//! Journey rules about NAT and where answers come from.
use super::{
    anomaly::Finding,
    legs::{answers_at_client, is_loopback, origin, place},
    AnomalyKind, Context, Severity,
};
use crate::correlate::{Journey, Outcome};

pub(super) fn unexpected_source(j: &Journey, ctx: &Context) -> Option<Finding> {
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
    Some(Finding {
        kind: AnomalyKind::ReplyFromUnexpectedSource,
        severity: Severity::Critical,
        key: wrong.src.ip().to_string(),
        summary: format!("answers to queries for {} come back from {} un-NATed", o.dst, wrong.src),
        evidence,
        cause: format!(
            "the reverse NAT of kube-proxy's DNAT did not run on the reply: br_netfilter not loaded or net.bridge.bridge-nf-call-iptables=0 on the node, so replies bridged between pods skip iptables{sysctl}"
        ),
        fix: "modprobe br_netfilter; sysctl -w net.bridge.bridge-nf-call-iptables=1, and persist both (/etc/modules-load.d, /etc/sysctl.d)",
    })
}

pub(super) const LOOPBACK_CAUSE: &str = "the pod's resolv.conf names a loopback nameserver: dnsPolicy Default (or kubelet --resolv-conf) on a node whose resolv.conf points at systemd-resolved (127.0.0.53); inside the pod nothing listens there (or, in a resolver's own pod, the resolver itself does: a loop)";
pub(super) const LOOPBACK_FIX: &str =
    "use dnsPolicy ClusterFirst, or point kubelet --resolv-conf at /run/systemd/resolve/resolv.conf";

pub(super) fn loopback_nameserver(j: &Journey, ctx: &Context) -> Option<Finding> {
    let o = origin(j)?;
    let in_pod = o.netns != 0 && o.netns != ctx.node_netns;
    (is_loopback(o.dst.ip()) && in_pod).then(|| Finding {
        kind: AnomalyKind::LoopbackNameserver,
        severity: Severity::Critical,
        key: format!("{}@{}", o.dst.ip(), o.netns),
        summary: format!(
            "a pod (network namespace {}) sends its DNS queries to {}",
            o.netns, o.dst
        ),
        evidence: vec![format!(
            "{} asked {} for {} on {}",
            j.client,
            o.dst,
            j.name,
            place(o)
        )],
        cause: LOOPBACK_CAUSE.into(),
        fix: LOOPBACK_FIX,
    })
}

pub(super) fn not_translated(j: &Journey, ctx: &Context) -> Option<Finding> {
    let o = origin(j)?;
    let unanswered = !matches!(j.outcome, Outcome::Answered { .. });
    let asked_service = ctx.service_ips.contains(&o.dst.ip());
    if !(unanswered && asked_service && j.dnat.is_none()) {
        return None;
    }
    let last = j.legs.iter().rfind(|l| !l.response).unwrap_or(o);
    Some(Finding {
        kind: AnomalyKind::ServiceNotTranslated,
        severity: Severity::Critical,
        key: o.dst.ip().to_string(),
        summary: format!("queries to the service IP {} are never translated to an endpoint", o.dst.ip()),
        evidence: vec![
            format!("{} asked {} for {}; no leg shows a DNAT", j.client, o.dst, j.name),
            format!("last seen at {} ({}), still addressed to {}", place(last), last.hook.name(), last.dst),
        ],
        cause: "kube-proxy's rules for the service are missing or broken (no KUBE-SERVICES jump for it, or no endpoints)".into(),
        fix: "check `iptables -t nat -S KUBE-SERVICES | grep <ip>` on the node and kube-proxy's logs; restart kube-proxy",
    })
}
