//! `lab up --nodes N`: a cluster of N nodes sharing this kernel, each its
//! own network namespace with its own pod subnet (10.244.K.0/24), bridge,
//! containerd and kube-proxy rules, linked the way flannel's vxlan backend
//! links nodes: a VXLAN device per node (`flannel.1`, VNI 1, port 8472) over
//! an underlay bridge, a route per other node's subnet through it, and that
//! node's VTEP address and MAC written in by hand (no learning). Clients run
//! on every node, CoreDNS on the last two, and the upstream resolver sits
//! behind node 1, where the other nodes send what leaves the cluster
//! (masqueraded, as the CNI does).
use std::{net::Ipv4Addr, path::PathBuf};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use super::{
    containerd::{CniPlugin, Setup},
    plan::{self, lab_dir, upstream_ns, Pod, Role},
    sys, Fault, LabState,
};

/// How many nodes `--nodes` takes.
pub const NODES: std::ops::RangeInclusive<u8> = 2..=3;
/// The underlay: the nodes' own network (kind's is 172.18.0.0/16).
pub fn underlay_ns() -> String {
    format!("{}underlay", plan::ns_prefix())
}
const UNDERLAY_NET: &str = "172.18.0.0/24";
const UNDERLAY_BRIDGE: &str = "underlay0";
/// flannel's VXLAN device, VNI and port.
pub const VXLAN: &str = "flannel.1";
const VNI: u32 = 1;
const VXLAN_PORT: u16 = 8472;
/// The overlay's MTU: the underlay's 1,500 less VXLAN's 50 bytes, as
/// flannel gives the pods.
pub const OVERLAY_MTU: u32 = 1450;
/// Node 1's link to the upstream resolver ("the internet").
const UPLINK: &str = "eth1";

/// A node of the cluster, numbered from 1.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Node(pub u8);

impl Node {
    /// Its name, as Kubernetes knows it (and `dnstrace --node` takes).
    pub fn name(self) -> String {
        format!("node{}", self.0)
    }

    pub fn netns(self) -> String {
        format!("{}node{}", plan::ns_prefix(), self.0)
    }

    /// Its address on the underlay.
    pub fn underlay(self) -> Ipv4Addr {
        Ipv4Addr::new(172, 18, 0, 1 + self.0)
    }

    /// Its VTEP's address on the overlay: its subnet's network address,
    /// as flannel gives it.
    pub fn vtep(self) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, self.0, 0)
    }

    fn vtep_mac(self) -> String {
        format!("0a:58:ac:12:00:{:02x}", 1 + self.0)
    }

    pub fn subnet(self) -> String {
        format!("10.244.{}.0/24", self.0)
    }

    fn dir(self) -> PathBuf {
        lab_dir().join(self.name())
    }

    /// Its containerd's state directory: what `--containerd-root` takes.
    pub fn containerd_root(self) -> PathBuf {
        self.dir().join("containerd")
    }

    /// Its containerd: under the node's directory, in its namespace, the
    /// pods on its bridge with the overlay's MTU.
    pub fn setup(self) -> Setup {
        Setup {
            dir: self.dir().join("cri"),
            state: self.containerd_root(),
            netns: Some(self.netns()),
            plugin: CniPlugin::Bridge,
            bridge: plan::BRIDGE.to_owned(),
            subnet: self.subnet().parse().expect("a subnet"),
            subnet6: None,
            mtu: Some(OVERLAY_MTU),
        }
    }

    /// The flags that make a dnstrace this node's.
    pub fn flags(self) -> String {
        format!(
            "--node {} --node-netns /run/netns/{} --containerd-root {} --cri-socket {}",
            self.name(),
            self.netns(),
            self.containerd_root().display(),
            self.setup().socket().display()
        )
    }
}

/// The nodes of a cluster of `n`.
pub fn nodes(n: u8) -> impl Iterator<Item = Node> {
    (1..=n).map(Node)
}

/// A pod and the node it runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    pub node: Node,
    pub pod: Pod,
}

/// A client on each node (web, checkout, then api) and CoreDNS on the
/// last two nodes, each the `.53` of its node's subnet.
pub fn pods(n: u8) -> Vec<Placed> {
    const CLIENTS: [(&str, &str); 3] = [
        ("default", "web-7d9f8c6b5-x2x4k"),
        ("shop", "checkout-5f6d7c9b8-q7w2e"),
        ("default", "api-6c8d7f5b4-m3n8p"),
    ];
    let coredns = plan::coredns_pods().map(|p| p.name);
    let clients = nodes(n)
        .zip(CLIENTS)
        .map(|(node, (namespace, name))| (node, namespace, name, 10, Role::Client));
    let resolvers = nodes(n)
        .skip(usize::from(n) - 2)
        .zip(coredns)
        .map(|(node, name)| (node, "kube-system", name, 53, Role::CoreDns));
    clients
        .chain(resolvers)
        .map(|(node, namespace, name, last, role)| Placed {
            node,
            pod: Pod {
                namespace,
                name,
                ip4: Ipv4Addr::new(10, 244, node.0, last),
                ip6: std::net::Ipv6Addr::UNSPECIFIED,
                role,
            },
        })
        .collect()
}

/// The network namespaces of the underlay, the nodes and upstream.
pub fn namespaces(n: u8) -> Vec<String> {
    let mut all = vec![underlay_ns(), upstream_ns().to_owned()];
    all.extend(nodes(n).map(Node::netns));
    all
}

/// Wires the nodes: the underlay, node 1's uplink, and each node's
/// forwarding, bridge netfilter, overlay and routes. The namespaces exist.
pub fn wire(n: u8) -> Result<()> {
    if !NODES.contains(&n) {
        bail!("--nodes {n}: the lab builds 2 or 3 nodes");
    }
    sys::ip(
        &underlay_ns(),
        &format!("link add {UNDERLAY_BRIDGE} type bridge"),
    )?;
    sys::ip(&underlay_ns(), &format!("link set {UNDERLAY_BRIDGE} up"))?;
    for node in nodes(n) {
        underlay(node)?;
    }
    uplink()?;
    for node in nodes(n) {
        for (key, value) in [
            ("net.ipv4.ip_forward", "1"),
            ("net.bridge.bridge-nf-call-iptables", "1"),
        ] {
            sys::sysctl(&node.netns(), key, value)?;
        }
        overlay(node, n)?;
    }
    Ok(())
}

/// The node's eth0 on the underlay bridge; its default route through
/// node 1, which holds the uplink.
fn underlay(node: Node) -> Result<()> {
    let (ns, port) = (node.netns(), node.name());
    sys::run(
        "ip",
        &[
            "link",
            "add",
            "eth0",
            "netns",
            &ns,
            "type",
            "veth",
            "peer",
            "name",
            &port,
            "netns",
            &underlay_ns(),
        ],
    )?;
    sys::ip(
        &underlay_ns(),
        &format!("link set {port} master {UNDERLAY_BRIDGE} up"),
    )?;
    sys::ip(&ns, &format!("addr add {}/24 dev eth0", node.underlay()))?;
    sys::ip(&ns, "link set eth0 up")?;
    if node != Node(1) {
        sys::ip(
            &ns,
            &format!("route add default via {}", Node(1).underlay()),
        )?;
    }
    Ok(())
}

/// Node 1 to the upstream resolver, which routes the underlay back to it
/// (the other nodes' pods reach it masqueraded as their node).
fn uplink() -> Result<()> {
    super::link_upstream(&Node(1).netns(), UPLINK)?;
    sys::ip(
        upstream_ns(),
        &format!("route add {UNDERLAY_NET} via {}", plan::NODE_UPLINK4),
    )
    .map(drop)
}

/// flannel's vxlan backend on `node`: its VTEP, and for each other node
/// a route to its subnet via its VTEP address, that address's MAC, and
/// where to send frames for that MAC.
fn overlay(node: Node, n: u8) -> Result<()> {
    let ns = node.netns();
    sys::ip(
        &ns,
        &format!(
            "link add {VXLAN} type vxlan id {VNI} local {} dev eth0 dstport {VXLAN_PORT} nolearning",
            node.underlay()
        ),
    )?;
    sys::ip(
        &ns,
        &format!(
            "link set {VXLAN} address {} mtu {OVERLAY_MTU} up",
            node.vtep_mac()
        ),
    )?;
    sys::ip(&ns, &format!("addr add {}/32 dev {VXLAN}", node.vtep()))?;
    for other in nodes(n).filter(|&o| o != node) {
        sys::ip(
            &ns,
            &format!(
                "route add {} via {} dev {VXLAN} onlink",
                other.subnet(),
                other.vtep()
            ),
        )?;
        sys::ip(
            &ns,
            &format!(
                "neigh add {} lladdr {} dev {VXLAN} nud permanent",
                other.vtep(),
                other.vtep_mac()
            ),
        )?;
        sys::run(
            "ip",
            &[
                "netns",
                "exec",
                &ns,
                "bridge",
                "fdb",
                "append",
                &other.vtep_mac(),
                "dev",
                VXLAN,
                "dst",
                &other.underlay().to_string(),
            ],
        )?;
    }
    Ok(())
}

/// The underlay's nftables tables, holding the faults' rules.
const FAULT_TABLE: &str = "dnstrace_lab_overlay";
/// The longest packet `overlay-mtu` lets through the underlay to its
/// node: a link (a VPN, a tunnel) narrower than the overlay was set up for.
const SHORT_MTU: u32 = 1300;

/// Makes or undoes a cluster fault on `node`.
pub fn set_fault(state: &LabState, fault: Fault, node: Node, on: bool) -> Result<()> {
    match fault {
        Fault::OverlayDrop | Fault::OverlayMtu => {
            sys::nft(&underlay_ns(), &underlay_filter(fault, node, on))
        }
        Fault::CorednsDown => {
            let pod = pods(state.nodes)
                .into_iter()
                .find(|p| p.node == node && p.pod.role == Role::CoreDns)
                .map(|p| p.pod);
            let Some(pod) = pod else {
                bail!("{} has no CoreDNS pod: give --node with one", node.name());
            };
            let pid = state.pids.get(pod.name).copied();
            let Some(pid) = pid else {
                bail!("{} is not running", pod.full_name());
            };
            sys::freeze(pid, on);
            Ok(())
        }
        other => bail!("{} is not a fault between nodes", other.name()),
    }
}

/// The underlay bridge's filter of `fault` (each fault a table of its own,
/// declared and deleted first so the script starts clean either way):
/// VXLAN from node 1 to `node` dropped, or, on its way to `node`, VXLAN
/// frames longer than a narrower link carries. Lowering the link's MTU did
/// not stop them in the lab (the bridge and the veths passed the frames),
/// so the narrow link is a rule.
fn underlay_filter(fault: Fault, node: Node, on: bool) -> String {
    let table = format!("{FAULT_TABLE}_{}", fault.name().replace('-', "_"));
    let mut t = format!("table bridge {table}\ndelete table bridge {table}\n");
    if !on {
        return t;
    }
    let (from, size) = match fault {
        Fault::OverlayMtu => (String::new(), format!("meta length > {SHORT_MTU} ")),
        _ => (format!("ip saddr {} ", Node(1).underlay()), String::new()),
    };
    t += &format!(
        "table bridge {table} {{\n  chain forward {{\n    type filter hook forward priority 0; policy accept;\n    {from}ip daddr {} udp dport {VXLAN_PORT} {size}counter drop comment \"dnstrace lab: {} fault\"\n  }}\n}}\n",
        node.underlay(),
        fault.name()
    );
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_nodes_have_a_client_each_and_coredns_on_the_last_two() {
        let placed: Vec<(u8, &str, String)> = pods(3)
            .iter()
            .map(|p| (p.node.0, p.pod.name, p.pod.ip4.to_string()))
            .collect();
        assert_eq!(
            placed,
            [
                (1, "web-7d9f8c6b5-x2x4k", "10.244.1.10".to_owned()),
                (2, "checkout-5f6d7c9b8-q7w2e", "10.244.2.10".to_owned()),
                (3, "api-6c8d7f5b4-m3n8p", "10.244.3.10".to_owned()),
                (2, "coredns-7db6d8ff4d-4xk9m", "10.244.2.53".to_owned()),
                (3, "coredns-7db6d8ff4d-vz8lp", "10.244.3.53".to_owned()),
            ]
        );
        let two: Vec<u8> = pods(2).iter().map(|p| p.node.0).collect();
        assert_eq!(two, [1, 2, 1, 2]);
    }

    #[test]
    fn the_underlay_faults_drop_vxlan_toward_their_node_only_while_on() {
        let drop = underlay_filter(Fault::OverlayDrop, Node(3), true);
        assert!(
            drop.contains("ip saddr 172.18.0.2 ip daddr 172.18.0.4 udp dport 8472 counter drop")
        );
        let mtu = underlay_filter(Fault::OverlayMtu, Node(1), true);
        assert!(mtu.contains("ip daddr 172.18.0.2 udp dport 8472 meta length > 1300 counter drop"));
        assert!(!mtu.contains("saddr"));
        let off = underlay_filter(Fault::OverlayMtu, Node(1), false);
        assert!(off.contains("delete table") && !off.contains("drop"));
        assert_ne!(drop.lines().next(), mtu.lines().next());
    }

    #[test]
    fn each_node_has_its_own_subnet_runtime_and_overlay_addresses() {
        let (one, three) = (Node(1), Node(3));
        assert_eq!(three.subnet(), "10.244.3.0/24");
        assert_eq!(three.vtep().to_string(), "10.244.3.0");
        assert_eq!(one.underlay().to_string(), "172.18.0.2");
        assert_ne!(one.vtep_mac(), three.vtep_mac());
        let setup = three.setup();
        assert_eq!(setup.netns.as_deref(), Some("dtlab-node3"));
        assert_eq!(setup.mtu, Some(OVERLAY_MTU));
        assert_ne!(setup.socket(), one.setup().socket());
        assert!(three
            .flags()
            .contains("--containerd-root /run/dnstrace-lab/node3/containerd"));
    }
}
