//! Faults: each reproduces an entry of the DNS failure catalogue by changing
//! real configuration, the way it goes wrong in the field.
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

#[derive(
    ValueEnum, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// bridge-nf-call-iptables=0 on the node: replies from CoreDNS arrive un-NATed.
    BridgeNfOff,
    /// kube-proxy's KUBE-SERVICES jump for kube-dns is missing: no DNAT.
    NoDnat,
    /// A CoreDNS pod forwards upstream to a loopback address where it listens itself.
    ForwardLoop,
    /// The node's resolv.conf points at NodeLocalDNS, which sends everything to CoreDNS.
    NodelocaldnsLoop,
    /// The upstream resolver silently drops queries.
    UpstreamTimeout,
    /// The pods' search list gets a foreign domain.
    SearchLeak,
    /// Clients send A and AAAA at once from one socket, from two CPUs.
    ConntrackRace,
    /// An iptables rule on the node drops DNS towards one CoreDNS endpoint.
    Drop,
    /// A client pod's nameserver is 127.0.0.53 (dnsPolicy Default on a systemd-resolved node).
    LoopbackNameserver,
    /// The upstream resolver answers SERVFAIL.
    Servfail,
    /// The upstream resolver answers after a delay.
    SlowUpstream,
    /// The kube-dns Service lists only UDP 53: kube-proxy writes no rules for
    /// TCP, so lookups over TCP (truncated answers, NodeLocalDNS) time out.
    NoDnsTcp,
    /// A firewall on the node drops IP fragments but the first: answers too
    /// large for one packet never arrive.
    FragmentsDropped,
    /// (`--nodes`) The underlay drops VXLAN from node 1 to `--node` (the
    /// last by default): node 1's queries to that node's CoreDNS pod are
    /// lost between the nodes.
    OverlayDrop,
    /// (`--nodes`) The underlay's path to `--node` (node 1 by default)
    /// carries packets of 1,300 bytes at most, less than the overlay's
    /// 1,450-byte MTU and VXLAN's 50 bytes: large answers are lost, small
    /// ones arrive.
    OverlayMtu,
    /// (`--nodes`) The CoreDNS pod on `--node` (the last by default) hangs
    /// (its process stopped), while kube-dns still sends it its share of
    /// queries.
    CorednsDown,
}

impl Fault {
    pub fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default()
    }

    /// Why the fault changes nothing on the pods' DNS path with NodeLocalDNS,
    /// if it does not: the pods' queries end on the node and NodeLocalDNS's
    /// start there, so nothing of DNS is bridged or forwarded between pods.
    pub fn off_nodelocal_path(self) -> Option<&'static str> {
        match self {
            Self::BridgeNfOff => Some("no DNS reply is bridged between pods"),
            Self::Drop => Some("no DNS query to a CoreDNS pod goes through the node's FORWARD chain"),
            Self::FragmentsDropped => Some("NodeLocalDNS answers over UDP in at most 1,232 bytes, asks CoreDNS over TCP and the upstream with a 1,232-byte buffer: no answer comes in fragments"),
            _ => None,
        }
    }

    /// A fault of a cluster lab (`lab up --nodes`), made on one node.
    pub fn of_cluster(self) -> bool {
        matches!(
            self,
            Self::OverlayDrop | Self::OverlayMtu | Self::CorednsDown
        )
    }

    /// The node a cluster fault is made on when none is given, in a
    /// cluster of `nodes`.
    pub fn default_node(self, nodes: u8) -> u8 {
        match self {
            Self::OverlayMtu => 1,
            _ => nodes,
        }
    }

    /// A loop fault: CoreDNS stands for one without the loop plugin.
    pub fn is_loop(self) -> bool {
        matches!(self, Self::ForwardLoop | Self::NodelocaldnsLoop)
    }
}

/// Delay the `slow-upstream` fault adds to every upstream answer.
pub const SLOW_UPSTREAM_MS: u64 = 800;
/// Where the delay line listens in the upstream namespace.
pub const DELAY_LINE_PORT: u16 = 5353;
