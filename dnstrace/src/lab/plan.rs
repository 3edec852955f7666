//! What the lab is made of: namespaces, pods, addresses. Plain data, so the
//! configuration derived from it is tested without root.
use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    str::FromStr,
    sync::OnceLock,
};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Which of the labs on this machine a command works on (`--instance`).
/// Each has namespaces, a directory and a bpffs of its own, so several can
/// be up side by side; inside their namespaces the addresses are the
/// same, as two clusters' may be. Chosen once, before anything is named.
static NAMES: OnceLock<Names> = OnceLock::new();

/// The names of one lab: its instance's number in each (none for the
/// first, whose names are those of a lab without `--instance`).
#[derive(Debug)]
struct Names {
    prefix: String,
    node: String,
    upstream: String,
    dir: PathBuf,
}

impl Names {
    fn of(instance: Option<u8>) -> Self {
        let n = instance.map_or_else(String::new, |n| n.to_string());
        let prefix = format!("dtlab{n}-");
        Self {
            node: format!("{prefix}node"),
            upstream: format!("{prefix}upstream"),
            dir: PathBuf::from(format!("/run/dnstrace-lab{n}")),
            prefix,
        }
    }
}

/// Picks the lab this process works on; the first pick stands.
pub fn select(instance: Option<u8>) -> Result<(), String> {
    let names = NAMES.get_or_init(|| Names::of(instance));
    if names.prefix != Names::of(instance).prefix {
        return Err(format!(
            "this process already works on the lab {}",
            names.node
        ));
    }
    Ok(())
}

fn names() -> &'static Names {
    NAMES.get_or_init(|| Names::of(None))
}

/// Every namespace name of this lab starts with this; `lab down` removes
/// them all (another lab's prefix differs before the dash).
pub fn ns_prefix() -> &'static str {
    &names().prefix
}

pub fn node_ns() -> &'static str {
    &names().node
}

pub fn upstream_ns() -> &'static str {
    &names().upstream
}

/// Where the lab keeps its state, configs, logs and runtime-state tree.
pub fn lab_dir() -> &'static Path {
    &names().dir
}

pub const BRIDGE: &str = "cni0";
pub const POD_GW4: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
pub const POD_CIDR4: &str = "10.244.0.0/16";
pub const POD_CIDR6: &str = "fd00:10:244::/56";
pub const SERVICE4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const SERVICE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0xa);
/// kube-dns-upstream, NodeLocalDNS's way to CoreDNS in its NOTRACK mode.
pub const UPSTREAM_SERVICE4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);
pub const UPSTREAM_SERVICE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0xb);
pub const API_SERVICE4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// The node's uplink and the "internet" resolver behind it (TEST-NET-2).
pub const UPLINK: &str = "eth0";
pub const NODE_UPLINK4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
pub const UPSTREAM4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 53);
pub const NODE_UPLINK6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x5100, 0, 0, 0, 0, 1);
pub const UPSTREAM6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x5100, 0, 0, 0, 0, 0x53);
/// NodeLocalDNS's link-local listen address, as in its manifests.
pub const NODELOCAL4: Ipv4Addr = Ipv4Addr::new(169, 254, 20, 10);
/// What a systemd-resolved node puts in resolv.conf.
pub const RESOLVED_STUB: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 53);
/// The kubelet's default `clusterDomain`.
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// The foreign search domain the `search-leak` fault adds.
pub const LEAK_DOMAIN: &str = "corp.example.com";
/// An upstream name (TXT) whose answer outgrows the 1,232-byte EDNS buffer
/// clients offer by default but fits one 1,500-byte packet.
pub const BIG_NAME: &str = "big.example.com";
/// One whose answer outgrows the path MTU: asked with a 4,096-byte EDNS
/// buffer, it comes over UDP as IP fragments.
pub const HUGE_NAME: &str = "huge.example.com";

/// How the CNI plugin wires pods to the node.
#[derive(clap::ValueEnum, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Cni {
    /// Every pod's host veth is a port of bridge cni0 (the bridge plugin,
    /// flannel): packets between pods are bridged.
    #[default]
    Bridge,
    /// Each host veth alone, holding the gateway's address, with a /32
    /// route per pod (the CNI ptp plugin; Calico alike): packets between
    /// pods are routed.
    Routed,
}

impl Cni {
    pub fn name(self) -> &'static str {
        match self {
            Self::Bridge => "bridge",
            Self::Routed => "routed",
        }
    }
}

/// Where NodeLocalDNS listens, as its manifests set it up.
#[derive(clap::ValueEnum, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum NodeLocal {
    /// On 169.254.20.10 alone; pods are pointed at it (the kubelet's
    /// clusterDNS), and it asks kube-dns through kube-proxy's DNAT.
    LinkLocal,
    /// Also on kube-dns's own IP, whose queries raw-table NOTRACK rules keep
    /// from the DNAT: pods ask kube-dns and get NodeLocalDNS. It reaches
    /// CoreDNS through the kube-dns-upstream service.
    Notrack,
}

impl NodeLocal {
    /// The addresses it listens on.
    pub fn listen(self) -> Vec<Ipv4Addr> {
        match self {
            Self::LinkLocal => vec![NODELOCAL4],
            Self::Notrack => vec![NODELOCAL4, SERVICE4],
        }
    }

    /// The service it sends cluster names to.
    pub fn cluster_dns(self) -> Ipv4Addr {
        match self {
            Self::LinkLocal => SERVICE4,
            Self::Notrack => UPSTREAM_SERVICE4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::LinkLocal => "link-local",
            Self::Notrack => "notrack",
        }
    }
}

/// A DNS domain as the kubelet takes it (`clusterDomain`, a search
/// domain): lower-case labels of letters, digits and hyphens, no final dot.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(try_from = "String", into = "String")]
pub struct Domain(String);

impl Domain {
    pub fn cluster_default() -> Self {
        Self(CLUSTER_DOMAIN.to_owned())
    }
}

/// The cluster domain of a lab brought up without `--cluster-domain`.
impl Default for Domain {
    fn default() -> Self {
        Self::cluster_default()
    }
}

impl FromStr for Domain {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let name = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
        let label_ok = |l: &str| {
            (1..=63).contains(&l.len())
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        // Room under the 253-byte limit for the names searched in it.
        if name.len() > 200 || !name.split('.').all(label_ok) {
            return Err(format!("{s:?} is not a DNS domain (labels of letters, digits and hyphens, like cluster.local)"));
        }
        Ok(Self(name))
    }
}

impl TryFrom<String> for Domain {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Domain> for String {
    fn from(d: Domain) -> String {
        d.0
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Client,
    CoreDns,
    /// A client with `hostNetwork: true`: the node's namespace, and its own
    /// resolv.conf (dnsPolicy ClusterFirstWithHostNet).
    HostClient,
    /// NodeLocalDNS's DaemonSet pod: `hostNetwork: true`, dnsPolicy
    /// Default; its cache runs in the node's namespace.
    NodeLocalDns,
}

impl Role {
    /// Whether its pods share the node's network namespace.
    pub fn host_network(self) -> bool {
        matches!(self, Role::HostClient | Role::NodeLocalDns)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pod {
    pub namespace: &'static str,
    pub name: &'static str,
    pub ip4: Ipv4Addr,
    pub ip6: Ipv6Addr,
    pub role: Role,
}

const fn v6(last: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0x244, 0, 0, 0, 0, last)
}

pub const PODS: [Pod; 4] = [
    Pod {
        namespace: "default",
        name: "web-7d9f8c6b5-x2x4k",
        ip4: Ipv4Addr::new(10, 244, 0, 10),
        ip6: v6(0x10),
        role: Role::Client,
    },
    Pod {
        namespace: "shop",
        name: "checkout-5f6d7c9b8-q7w2e",
        ip4: Ipv4Addr::new(10, 244, 0, 11),
        ip6: v6(0x11),
        role: Role::Client,
    },
    Pod {
        namespace: "kube-system",
        name: "coredns-7db6d8ff4d-4xk9m",
        ip4: Ipv4Addr::new(10, 244, 0, 53),
        ip6: v6(0x53),
        role: Role::CoreDns,
    },
    Pod {
        namespace: "kube-system",
        name: "coredns-7db6d8ff4d-vz8lp",
        ip4: Ipv4Addr::new(10, 244, 0, 54),
        ip6: v6(0x54),
        role: Role::CoreDns,
    },
];

/// The hostNetwork client of `lab up --host-network-client`: a log shipper
/// that looks up cluster names from the node's own network.
pub const HOST_CLIENT: Pod = Pod {
    namespace: "logging",
    name: "fluent-bit-5lq8z",
    ip4: NODE_UPLINK4,
    ip6: NODE_UPLINK6,
    role: Role::HostClient,
};

/// NodeLocalDNS's pod of `lab up --nodelocaldns`, as its DaemonSet names it.
pub const NODE_LOCAL_DNS: Pod = Pod {
    namespace: "kube-system",
    name: "node-local-dns-7qx4m",
    ip4: NODE_UPLINK4,
    ip6: NODE_UPLINK6,
    role: Role::NodeLocalDns,
};

/// Every pod of the lab: PODS, and the hostNetwork client and
/// NodeLocalDNS's pod where it has them.
pub fn pods(host_client: bool, nodelocal: bool) -> impl Iterator<Item = &'static Pod> {
    PODS.iter()
        .chain(host_client.then_some(&HOST_CLIENT))
        .chain(nodelocal.then_some(&NODE_LOCAL_DNS))
}

pub fn coredns_pods() -> impl Iterator<Item = &'static Pod> {
    PODS.iter().filter(|p| p.role == Role::CoreDns)
}

impl Pod {
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn netns(&self) -> String {
        if self.role.host_network() {
            node_ns().to_owned()
        } else {
            format!("{}{}", ns_prefix(), self.name)
        }
    }

    /// The file the pod sees as /etc/resolv.conf: what `ip netns exec`
    /// mounts for its namespace, or, sharing the node's, a file of its own.
    pub fn resolv_conf(&self) -> PathBuf {
        if self.role.host_network() {
            lab_dir().join(format!("{}.resolv.conf", self.name))
        } else {
            Path::new("/etc/netns")
                .join(self.netns())
                .join("resolv.conf")
        }
    }

    /// A stable pod uid and sandbox id, as a runtime would hand out.
    pub fn uid(&self) -> String {
        let h = hex_digest(&format!("uid/{}", self.full_name()));
        format!(
            "{}-{}-{}-{}-{}",
            &h[..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }

    pub fn sandbox_id(&self) -> String {
        hex_digest(&format!("sandbox/{}", self.full_name()))
    }

    pub fn ip(&self, v6: bool) -> IpAddr {
        if v6 {
            self.ip6.into()
        } else {
            self.ip4.into()
        }
    }

    /// The kubelet's search list for a ClusterFirst pod: the cluster's,
    /// then the node's own search domains (`node_search`) not already in it.
    pub fn search_list(&self, cluster: &Domain, node_search: &[Domain]) -> Vec<String> {
        let mut list = vec![
            format!("{}.svc.{cluster}", self.namespace),
            format!("svc.{cluster}"),
            cluster.to_string(),
        ];
        for d in node_search.iter().map(Domain::to_string) {
            if !list.contains(&d) {
                list.push(d);
            }
        }
        list
    }
}

/// A lab pod by `name`, `namespace/name`, or a prefix of either name part.
pub fn find_pod(query: &str) -> Option<&'static Pod> {
    let (namespace, name) = query
        .split_once('/')
        .map_or((None, query), |(ns, n)| (Some(ns), n));
    pods(true, false)
        .find(|p| namespace.is_none_or(|ns| ns == p.namespace) && p.name.starts_with(name))
}

fn hex_digest(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_and_fit_linux_limits() {
        for pod in &PODS {
            assert_eq!(pod.sandbox_id().len(), 64);
            assert_eq!(pod.uid().len(), 36);
        }
        assert_eq!(PODS[0].sandbox_id(), PODS[0].sandbox_id());
        assert_ne!(PODS[0].sandbox_id(), PODS[1].sandbox_id());
    }

    #[test]
    fn each_instance_names_its_own_namespaces_and_directory() {
        let first = Names::of(None);
        assert_eq!(first.prefix, "dtlab-");
        assert_eq!(first.node, "dtlab-node");
        assert_eq!(first.upstream, "dtlab-upstream");
        assert_eq!(first.dir, Path::new("/run/dnstrace-lab"));
        let third = Names::of(Some(3));
        assert_eq!(third.node, "dtlab3-node");
        assert_eq!(third.dir, Path::new("/run/dnstrace-lab3"));
        // `lab down` of one never takes another's namespaces.
        for (a, b) in [(&first, &third), (&third, &first)] {
            assert!(!b.node.starts_with(&a.prefix) && !b.upstream.starts_with(&a.prefix));
        }
    }

    #[test]
    fn pods_are_found_by_name_namespace_and_prefix() {
        assert_eq!(find_pod("web").map(|p| p.ip4), Some(PODS[0].ip4));
        assert_eq!(find_pod("shop/checkout").map(|p| p.ip4), Some(PODS[1].ip4));
        assert_eq!(
            find_pod("kube-system/coredns-7db6d8ff4d-vz8lp").map(|p| p.ip4),
            Some(PODS[3].ip4)
        );
        assert!(find_pod("shop/web").is_none());
    }

    #[test]
    fn search_list_is_the_kubelet_one() {
        assert_eq!(
            PODS[1].search_list(&Domain::cluster_default(), &[]),
            vec![
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local"
            ]
        );
    }

    #[test]
    fn another_cluster_domain_and_node_search_domains_follow_the_kubelet() {
        let domain: Domain = "Corp.Internal.".parse().unwrap();
        assert_eq!(domain.to_string(), "corp.internal");
        let node: Vec<Domain> = ["ec2.internal", "corp.internal"]
            .iter()
            .map(|d| d.parse().unwrap())
            .collect();
        assert_eq!(
            PODS[0].search_list(&domain, &node),
            vec![
                "default.svc.corp.internal",
                "svc.corp.internal",
                "corp.internal",
                "ec2.internal"
            ]
        );
        for bad in ["", "a..b", "-a.b", "a_b.c", "x y"] {
            assert!(bad.parse::<Domain>().is_err(), "{bad:?}");
        }
    }
}
