//! Static checks: the node's and the target's settings, before any traffic.
use std::net::IpAddr;

use super::{
    anomaly::{Finding, Words},
    bridged::{any_bridged, Way},
    AnomalyKind, Context, Translation,
};
use crate::target::Target;

/// Bridged packets skip iptables: kube-proxy's reverse NAT does not run.
/// A balancer at the socket leaves no NAT to reverse; routed pods (no
/// client on a resolver's bridge) are not concerned.
pub(super) fn bridge_nf_off(ctx: &Context) -> Option<Finding<'_>> {
    let way = any_bridged(ctx);
    let off = ctx.bridge_nf_call_iptables.as_deref() == Some("0");
    (off && ctx.translation == Translation::Dnat && way != Way::NotBridged).then(|| {
        Finding::new(
            AnomalyKind::BridgeNfCallIptablesOff,
            String::new(),
            move || {
                let summary = "net.bridge.bridge-nf-call-iptables is 0 on the node".into();
                let mut evidence = vec![
                    "sysctl net.bridge.bridge-nf-call-iptables = 0 in the node's network namespace"
                        .into(),
                ];
                evidence.extend(way.evidence());
                Words::new(summary, evidence)
            },
        )
    })
}

/// No bridge sysctls at all: br_netfilter is not loaded. That matters
/// only on a Kubernetes node with kube-proxy's service rules (not where
/// services are balanced at the socket) whose clients share a bridge with
/// a resolver.
pub(super) fn br_netfilter_not_loaded(ctx: &Context) -> Option<Finding<'_>> {
    let way = any_bridged(ctx);
    let missing = ctx.bridge_nf_call_iptables.is_none()
        && !ctx.service_ips.is_empty()
        && ctx.translation == Translation::Dnat;
    (missing && way != Way::NotBridged).then(|| {
        Finding::new(AnomalyKind::BrNetfilterNotLoaded, String::new(), move || {
            let summary = "br_netfilter is not loaded on this Kubernetes node".into();
            let mut evidence = vec![
                "/proc/sys/net/bridge/bridge-nf-call-iptables does not exist in the node's network namespace"
                    .into(),
            ];
            evidence.extend(way.evidence());
            Words::new(summary, evidence)
        })
    })
}

/// The target's resolv.conf names a loopback nameserver.
pub(super) fn resolv_loopback(t: &Target) -> Option<Finding<'_>> {
    let r = t.resolv.as_ref()?;
    let lo: Vec<String> = r
        .nameservers
        .iter()
        .filter(|ip| ip.is_loopback())
        .map(IpAddr::to_string)
        .collect();
    (!lo.is_empty() && t.netns_inode != 0).then(|| {
        Finding::new(
            AnomalyKind::LoopbackNameserver,
            format!("resolv.conf of {}", t.label),
            move || {
                let summary = format!(
                    "the resolv.conf of {} names a loopback nameserver: {}",
                    t.label,
                    lo.join(", ")
                );
                let evidence = vec![format!(
                    "{}'s /etc/resolv.conf: nameserver {}",
                    t.label,
                    lo.join(", ")
                )];
                Words::new(summary, evidence)
            },
        )
    })
}

/// Search domains outside the cluster's in a pod's resolv.conf: every short
/// name is also asked of whoever serves that domain. Not the node's own
/// (`node_search`), which the kubelet appends by design (managed clusters).
pub(super) fn resolv_foreign_search<'a>(
    t: &'a Target,
    node_search: &[String],
) -> Option<Finding<'a>> {
    let r = t.resolv.as_ref()?;
    // ClusterFirst pods search `<ns>.svc.<cluster>`, `svc.<cluster>`, `<cluster>`.
    let cluster = r.search.iter().find_map(|d| d.strip_prefix("svc."))?;
    let foreign: Vec<&str> = r
        .search
        .iter()
        .map(|d| d.trim_end_matches('.'))
        .filter(|d| *d != cluster && !d.ends_with(&format!(".{cluster}")))
        .filter(|d| !node_search.iter().any(|n| n.trim_end_matches('.') == *d))
        .collect();
    if foreign.is_empty() {
        return None;
    }
    Some(Finding::new(
        AnomalyKind::ForeignSearchDomain,
        format!("resolv.conf of {}", t.label),
        move || {
            let summary = format!(
                "{} searches outside the cluster: {}",
                t.label,
                foreign.join(", ")
            );
            let evidence = vec![format!(
            "{}'s /etc/resolv.conf: search {}; ndots:{}, so a name with fewer than {} dots is tried with each of the {} suffixes before as it is",
            t.label,
            r.search.join(" "),
            r.ndots,
            r.ndots,
            r.search.len()
        )];
            let cause = format!("the node's search domains ({}) are appended to every ClusterFirst pod's list by the kubelet, or the pod's dnsConfig adds them; cluster-style names then leak to the outside resolvers", foreign.join(", "));
            Words::new(summary, evidence).cause(cause)
        },
    ))
}
