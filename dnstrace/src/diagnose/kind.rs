//! The kinds of anomaly: one list, each with its stable name.
use std::fmt;

use serde::{Serialize, Serializer};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Warning => "warning",
            Self::Critical => "critical",
        }
    }
}

/// Every kind of anomaly the rules raise: the one list of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AnomalyKind {
    BrNetfilterNotLoaded,
    BridgeNfCallIptablesOff,
    ConntrackDropsBeforeStart,
    ConntrackInsertFailed,
    ConntrackTableNearlyFull,
    DnsTcpUnreachable,
    Dropped,
    FailingAnswers,
    ForeignSearchDomain,
    ForwardingLoop,
    FragmentLost,
    LoopbackNameserver,
    LostBetweenNodes,
    MalformedAnswer,
    NdotsAmplification,
    OverlayMtu,
    ParallelQueryLost,
    ReplyFromUnexpectedSource,
    ResolverEndpointDown,
    SearchDomainLeak,
    ServiceNotTranslated,
    SlowAnswers,
    TruncatedWithoutTcpRetry,
    Unanswered,
    UpstreamTimeout,
}

impl AnomalyKind {
    /// The stable name the outputs print, e.g. `reply_from_unexpected_source`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BrNetfilterNotLoaded => "br_netfilter_not_loaded",
            Self::BridgeNfCallIptablesOff => "bridge_nf_call_iptables_off",
            Self::ConntrackDropsBeforeStart => "conntrack_drops_before_start",
            Self::ConntrackInsertFailed => "conntrack_insert_failed",
            Self::ConntrackTableNearlyFull => "conntrack_table_nearly_full",
            Self::DnsTcpUnreachable => "dns_tcp_unreachable",
            Self::Dropped => "dropped",
            Self::FailingAnswers => "failing_answers",
            Self::ForeignSearchDomain => "foreign_search_domain",
            Self::ForwardingLoop => "forwarding_loop",
            Self::FragmentLost => "fragment_lost",
            Self::LoopbackNameserver => "loopback_nameserver",
            Self::LostBetweenNodes => "lost_between_nodes",
            Self::MalformedAnswer => "malformed_answer",
            Self::NdotsAmplification => "ndots_amplification",
            Self::OverlayMtu => "overlay_mtu",
            Self::ParallelQueryLost => "parallel_query_lost",
            Self::ReplyFromUnexpectedSource => "reply_from_unexpected_source",
            Self::ResolverEndpointDown => "resolver_endpoint_down",
            Self::SearchDomainLeak => "search_domain_leak",
            Self::ServiceNotTranslated => "service_not_translated",
            Self::SlowAnswers => "slow_answers",
            Self::TruncatedWithoutTcpRetry => "truncated_without_tcp_retry",
            Self::Unanswered => "unanswered",
            Self::UpstreamTimeout => "upstream_timeout",
        }
    }

    /// How bad it is, where the evidence is whole; a rule lowers it for an
    /// anomaly whose evidence leaves the cause in doubt.
    pub fn severity(self) -> Severity {
        match self {
            Self::BrNetfilterNotLoaded
            | Self::BridgeNfCallIptablesOff
            | Self::ConntrackInsertFailed
            | Self::ConntrackTableNearlyFull
            | Self::DnsTcpUnreachable
            | Self::Dropped
            | Self::ForwardingLoop
            | Self::FragmentLost
            | Self::LoopbackNameserver
            | Self::LostBetweenNodes
            | Self::OverlayMtu
            | Self::ParallelQueryLost
            | Self::ReplyFromUnexpectedSource
            | Self::ResolverEndpointDown
            | Self::ServiceNotTranslated
            | Self::UpstreamTimeout => Severity::Critical,
            Self::ConntrackDropsBeforeStart
            | Self::FailingAnswers
            | Self::ForeignSearchDomain
            | Self::MalformedAnswer
            | Self::NdotsAmplification
            | Self::SearchDomainLeak
            | Self::SlowAnswers
            | Self::TruncatedWithoutTcpRetry
            | Self::Unanswered => Severity::Warning,
        }
    }

    /// The likely cause, where it is the same every time; the rules word
    /// the others from what they saw.
    pub(super) fn cause(self) -> Option<&'static str> {
        match self {
            Self::BrNetfilterNotLoaded => Some("without br_netfilter, packets bridged between pods skip iptables, so kube-proxy's reverse NAT never runs on replies from a CoreDNS pod on the same node"),
            Self::BridgeNfCallIptablesOff => Some("packets bridged between pods skip iptables, so kube-proxy's reverse NAT never runs on replies from a CoreDNS pod on the same node"),
            Self::ConntrackDropsBeforeStart => Some("conntrack could not insert entries at some time before now (the parallel A/AAAA race, or a full table); whether it still happens shows when the counters move while tracing"),
            Self::ConntrackInsertFailed => Some("conntrack could not insert or keep entries (the parallel A/AAAA race lost, or the table is full); the client waits 5 s for its retry"),
            Self::ConntrackTableNearlyFull => Some("when the table is full new flows, DNS queries through the service IP included, are dropped (\"nf_conntrack: table full, dropping packet\" in dmesg)"),
            Self::DnsTcpUnreachable => Some("TCP port 53 is not open along the way: the service's TCP port is missing from kube-proxy's rules (a Service that lists only UDP 53), the DNS pod does not listen on TCP, or a NetworkPolicy or firewall lets only UDP through. Large answers (truncated over UDP) and clients that always use TCP then fail"),
            Self::Dropped => None,
            Self::FailingAnswers => None,
            Self::ForeignSearchDomain => None,
            Self::ForwardingLoop => Some("the resolver forwards to what its resolv.conf says, inherited from the node: 127.0.0.53 (systemd-resolved's stub, which is the resolver itself in its pod) or a NodeLocalDNS address that forwards back into the cluster"),
            Self::FragmentLost => Some("the message was larger than the path's MTU and went as IP fragments, and something on the path does not let later fragments through: a firewall, security group or NetworkPolicy that drops fragments (they carry no ports), or an overlay (VXLAN, IPIP) whose smaller MTU they do not fit"),
            Self::LoopbackNameserver => Some("the pod's resolv.conf names a loopback nameserver: dnsPolicy Default (or kubelet --resolv-conf) on a node whose resolv.conf points at systemd-resolved (127.0.0.53); inside the pod nothing listens there (or, in a resolver's own pod, the resolver itself does: a loop)"),
            Self::LostBetweenNodes => Some("the network between the two nodes lost it: the underlay drops the overlay's packets (a firewall or security group without VXLAN's UDP 8472, or a route gone), the nodes' overlay state is stale (a VTEP's FDB or neighbour entry), or the packet outgrew what the underlay carries (its MTU below the overlay's and VXLAN's 50 bytes)"),
            Self::MalformedAnswer => Some("the answer that came back cannot be read whole: the resolver wrote it wrong (a bug, or a record type it mangles), or something on the path rewrote it (a DNS proxy, a firewall's DNS inspection, a NAT that edits payloads); stub resolvers throw such answers away, so the client waits for its timeout or retries"),
            Self::NdotsAmplification => Some("with ndots:5 every name with fewer than five dots is tried with each search suffix first, and those NXDOMAINs are slow here"),
            Self::OverlayMtu => None,
            Self::ParallelQueryLost => Some("A and AAAA sent at once from one socket race to insert the same conntrack entry through DNAT; the loser is dropped (insert_failed) and the client waits for its 5 s timeout"),
            Self::ReplyFromUnexpectedSource => None,
            Self::ResolverEndpointDown => Some("the resolver behind that endpoint does not answer (hung, overloaded, or crashed while its pod stays Ready), or the way to it (its node, the overlay to it) loses what is sent there; kube-proxy keeps sending it its share of the lookups while its pod is Ready, and each of those waits for the client's timeout while the other endpoints answer theirs"),
            Self::SearchDomainLeak => None,
            Self::ServiceNotTranslated => Some("kube-proxy's rules for the service are missing or broken (no KUBE-SERVICES jump for it, or no endpoints)"),
            Self::SlowAnswers => None,
            Self::TruncatedWithoutTcpRetry => Some("the client's resolver does not fall back to TCP (musl libc before 1.2.4, as in older Alpine images, some custom stubs), or its TCP connection to port 53 never got through (a NetworkPolicy or firewall that allows only UDP)"),
            Self::Unanswered => Some("the query or its answer was lost after the last place it was seen"),
            Self::UpstreamTimeout => Some("the upstream server is down, unreachable, or a firewall drops DNS to it"),
        }
    }

    /// The usual fix, where it is the same every time.
    pub(super) fn fix(self) -> Option<&'static str> {
        match self {
            Self::BrNetfilterNotLoaded => Some("modprobe br_netfilter, and list it in /etc/modules-load.d so it is loaded at boot"),
            Self::BridgeNfCallIptablesOff => Some("sysctl -w net.bridge.bridge-nf-call-iptables=1 (and set it in /etc/sysctl.d so it survives a reboot)"),
            Self::ConntrackDropsBeforeStart => Some("watch for conntrack_insert_failed while tracing; `conntrack -S` shows the counters per CPU"),
            Self::ConntrackInsertFailed => Some("`options single-request-reopen` (glibc) or use-vc in the pods' resolv.conf, NodeLocalDNS, or a larger nf_conntrack_max"),
            Self::ConntrackTableNearlyFull => Some("raise net.netfilter.nf_conntrack_max (kube-proxy's --conntrack-max-per-core), or shorten UDP timeouts (nf_conntrack_udp_timeout)"),
            Self::DnsTcpUnreachable => Some("list TCP 53 (dns-tcp) in the kube-dns Service and check kube-proxy's rules for it (iptables-save | grep 'dns-tcp', or nft list ruleset), make the DNS server listen on TCP, and let TCP 53 through NetworkPolicies and firewalls"),
            Self::Dropped => None,
            Self::FailingAnswers => Some("query the server directly with dig to see its answer, and check its logs and ACLs"),
            Self::ForeignSearchDomain => Some("remove them from the node's resolv.conf (or point kubelet --resolv-conf at a file without them), or from the pod's dnsConfig.searches"),
            Self::ForwardingLoop => Some("point CoreDNS's `forward .` at real upstream servers (e.g. /run/systemd/resolve/resolv.conf), and NodeLocalDNS's upstream away from kube-dns"),
            Self::FragmentLost => Some("keep DNS answers under the path MTU: a smaller EDNS buffer (CoreDNS `bufsize 1232`), and DNS over TCP for the rest; fix the overlay's MTU, or let fragments through the firewall"),
            Self::LoopbackNameserver => Some("use dnsPolicy ClusterFirst, or point kubelet --resolv-conf at /run/systemd/resolve/resolv.conf"),
            Self::LostBetweenNodes => Some("check the underlay between the two nodes: that UDP 8472 (VXLAN) passes both ways, the overlay's routes and FDB entries on each (`ip route`, `bridge fdb show dev flannel.1`), and the underlay's MTU against the overlay's (`ping -M do -s 1422` between the nodes)"),
            Self::MalformedAnswer => Some("ask the resolver the same question directly (`dig @<server> <name> <type>`) and from the client's node, and compare: broken both ways is the resolver (upgrade it, or drop the record or option it mangles); broken only on the path is a middlebox that rewrites DNS"),
            Self::NdotsAmplification => Some("use fully qualified names with a trailing dot, lower ndots in the pod's dnsConfig, or add NodeLocalDNS to answer the misses quickly"),
            Self::OverlayMtu => Some("set the overlay's MTU (flannel's, and the pods' interfaces) to the underlay's less the encapsulation (VXLAN: 50 bytes) and check it with `ping -M do -s <size>` between the nodes; until then keep answers small (CoreDNS `bufsize 1232`, or less) so that large ones go over TCP"),
            Self::ParallelQueryLost => Some("`options single-request-reopen` in the pods' resolv.conf (dnsConfig), NodeLocalDNS, or a kernel that resolves the clash"),
            Self::ReplyFromUnexpectedSource => Some("modprobe br_netfilter; sysctl -w net.bridge.bridge-nf-call-iptables=1, and persist both (/etc/modules-load.d, /etc/sysctl.d)"),
            Self::ResolverEndpointDown => Some("check the pod behind the endpoint: its readiness and the service's endpoints (`kubectl -n kube-system get endpointslices -l k8s.io/service-name=kube-dns`), its logs, and its node; a readiness probe that resolves (CoreDNS's `ready` plugin) takes a hung resolver out of the service; delete the pod to have it replaced"),
            Self::SearchDomainLeak => Some("remove the domain from the search list (node resolv.conf or dnsConfig.searches), or use fully qualified names with a trailing dot"),
            Self::ServiceNotTranslated => Some("check `iptables -t nat -S KUBE-SERVICES | grep <ip>` on the node and kube-proxy's logs; restart kube-proxy"),
            Self::SlowAnswers => Some("look at the part named: the upstream's latency, the resolver's CPU and cache, or the path"),
            Self::TruncatedWithoutTcpRetry => Some("let TCP/53 through to the resolver, use an image whose resolver retries over TCP, or keep answers small (fewer records, no ANY)"),
            Self::Unanswered => Some("follow the journey from where it was last seen; check the server's health and the path to it"),
            Self::UpstreamTimeout => Some("check the upstream from the node (`dig @server`), its firewall, and CoreDNS's forward list"),
        }
    }
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for AnomalyKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Ordered by name, as the kinds' strings were: anomalies of equal
/// severity and count keep their order in the summary.
impl Ord for AnomalyKind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for AnomalyKind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
