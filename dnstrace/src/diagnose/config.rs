//! Static checks: the node's and the target's settings, before any traffic.
use std::net::IpAddr;

use super::{
    anomaly::Finding,
    nat::{LOOPBACK_CAUSE, LOOPBACK_FIX},
    AnomalyKind, Context, Severity,
};
use crate::target::Target;

/// Bridged packets skip iptables: kube-proxy's reverse NAT does not run.
pub(super) fn bridge_nf_off(ctx: &Context) -> Option<Finding> {
    (ctx.bridge_nf_call_iptables.as_deref() == Some("0")).then(|| Finding {
        kind: AnomalyKind::BridgeNfCallIptablesOff,
        severity: Severity::Critical,
        key: String::new(),
        summary: "net.bridge.bridge-nf-call-iptables is 0 on the node".into(),
        evidence: vec!["sysctl net.bridge.bridge-nf-call-iptables = 0 in the node's network namespace".into()],
        cause: "packets bridged between pods skip iptables, so kube-proxy's reverse NAT never runs on replies from a CoreDNS pod on the same node".into(),
        fix: "sysctl -w net.bridge.bridge-nf-call-iptables=1 (and set it in /etc/sysctl.d so it survives a reboot)",
    })
}

/// No bridge sysctls at all: br_netfilter is not loaded. That matters
/// only on a Kubernetes node (one with kube-proxy's service rules).
pub(super) fn br_netfilter_not_loaded(ctx: &Context) -> Option<Finding> {
    let missing = ctx.bridge_nf_call_iptables.is_none() && !ctx.service_ips.is_empty();
    missing.then(|| Finding {
        kind: AnomalyKind::BrNetfilterNotLoaded,
        severity: Severity::Critical,
        key: String::new(),
        summary: "br_netfilter is not loaded on this Kubernetes node".into(),
        evidence: vec!["/proc/sys/net/bridge/bridge-nf-call-iptables does not exist in the node's network namespace".into()],
        cause: "without br_netfilter, packets bridged between pods skip iptables, so kube-proxy's reverse NAT never runs on replies from a CoreDNS pod on the same node".into(),
        fix: "modprobe br_netfilter, and list it in /etc/modules-load.d so it is loaded at boot",
    })
}

/// The target's resolv.conf names a loopback nameserver.
pub(super) fn resolv_loopback(t: &Target) -> Option<Finding> {
    let r = t.resolv.as_ref()?;
    let lo: Vec<String> = r
        .nameservers
        .iter()
        .filter(|ip| ip.is_loopback())
        .map(IpAddr::to_string)
        .collect();
    (!lo.is_empty() && t.netns_inode != 0).then(|| Finding {
        kind: AnomalyKind::LoopbackNameserver,
        severity: Severity::Critical,
        key: format!("resolv.conf of {}", t.label),
        summary: format!(
            "the resolv.conf of {} names a loopback nameserver: {}",
            t.label,
            lo.join(", ")
        ),
        evidence: vec![format!(
            "{}'s /etc/resolv.conf: nameserver {}",
            t.label,
            lo.join(", ")
        )],
        cause: LOOPBACK_CAUSE.into(),
        fix: LOOPBACK_FIX,
    })
}

/// Search domains outside the cluster's in a pod's resolv.conf: every short
/// name is also asked of whoever serves that domain.
pub(super) fn resolv_foreign_search(t: &Target) -> Option<Finding> {
    let r = t.resolv.as_ref()?;
    // ClusterFirst pods search `<ns>.svc.<cluster>`, `svc.<cluster>`, `<cluster>`.
    let cluster = r.search.iter().find_map(|d| d.strip_prefix("svc."))?;
    let foreign: Vec<&str> = r
        .search
        .iter()
        .map(|d| d.trim_end_matches('.'))
        .filter(|d| *d != cluster && !d.ends_with(&format!(".{cluster}")))
        .collect();
    if foreign.is_empty() {
        return None;
    }
    Some(Finding {
        kind: AnomalyKind::ForeignSearchDomain,
        severity: Severity::Warning,
        key: format!("resolv.conf of {}", t.label),
        summary: format!("{} searches outside the cluster: {}", t.label, foreign.join(", ")),
        evidence: vec![format!(
            "{}'s /etc/resolv.conf: search {}; ndots:{}, so a name with fewer than {} dots is tried with each of the {} suffixes before as it is",
            t.label,
            r.search.join(" "),
            r.ndots,
            r.ndots,
            r.search.len()
        )],
        cause: format!("the node's search domains ({}) are appended to every ClusterFirst pod's list by the kubelet, or the pod's dnsConfig adds them; cluster-style names then leak to the outside resolvers", foreign.join(", ")),
        fix: "remove them from the node's resolv.conf (or point kubelet --resolv-conf at a file without them), or from the pod's dnsConfig.searches",
    })
}
