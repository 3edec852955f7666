//! What dnstrace follows: the whole node, or one target (a pod found in the
//! container runtime's state, a network namespace, a process, an address),
//! resolved to the namespace and addresses the kernel keeps.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use dnstrace_common::{MAX_WATCHED, ROLE_RESOLVER, ROLE_TARGET};

use crate::{
    naming::Services,
    pods::{
        self,
        net::{inspect, Attachment},
        resolv::ResolvConf,
        workload::Workload,
        Pod,
    },
    probes::{address_key, KernelFilter, KernelScope},
};

pub mod follow;

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Target {
    /// What the user asked for, e.g. `pod default/web-7d9f`.
    pub label: String,
    pub netns_inode: u32,
    pub addrs: Vec<IpAddr>,
    pub host_veth: Option<String>,
    pub resolv: Option<ResolvConf>,
    /// The pod's Kubernetes namespace, for its expected search list.
    pub namespace: Option<String>,
}

/// What to follow, as asked: at most one of a pod, a network namespace, a
/// process or an address (none: the whole node).
#[derive(Clone, Debug, Default)]
pub struct Query {
    pub pod: Option<String>,
    pub netns: Option<PathBuf>,
    pub pid: Option<u32>,
    pub ip: Option<IpAddr>,
    /// The node's network namespace (none: the one dnstrace runs in).
    pub node_netns: Option<PathBuf>,
    pub runtime: pods::RuntimeDirs,
    /// The runtime's CRI socket (none: each runtime's default, if there).
    pub cri_socket: Option<PathBuf>,
    /// This instance is this node, of several on this kernel: it sees only
    /// the node's network namespace and its pods' (`Scope`).
    pub node: Option<String>,
}

/// The node's pods, from the runtimes' state and, where it answers, their
/// CRI socket; what could not be read is said once.
pub async fn inventory(args: &Query) -> (pods::Inventory, pods::CriAnswer) {
    let sockets = pods::cri_sockets(args.cri_socket.as_deref());
    let (inventory, answer) = pods::discover_with_cri(&args.runtime, &sockets).await;
    answer.warn_if_unanswered();
    for e in &inventory.errors {
        log::warn!("{e}");
    }
    (inventory, answer)
}

/// The target the arguments name, if any, a pod among `inventory`'s; a
/// name that matches no pod (or several) is an error listing the
/// candidates.
pub fn resolve(args: &Query, inventory: &pods::Inventory) -> Result<Option<Target>> {
    let node = args.node_netns.as_deref();
    if let Some(query) = &args.pod {
        let pod = pods::select(&inventory.pods, query)?;
        return of_pod(pod, node).map(Some);
    }
    if let Some(path) = &args.netns {
        return of_netns(
            format!("network namespace {}", path.display()),
            path,
            node,
            None,
        )
        .map(Some);
    }
    if let Some(pid) = args.pid {
        let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
        let resolv = pods::resolv::read_for_pid(pid).ok();
        return of_netns(format!("process {pid}"), &path, node, resolv).map(Some);
    }
    Ok(args.ip.map(|ip| Target {
        label: format!("address {ip}"),
        netns_inode: 0,
        addrs: vec![ip],
        host_veth: None,
        resolv: None,
        namespace: None,
    }))
}

fn of_pod(pod: &Pod, node: Option<&Path>) -> Result<Target> {
    let netns = pod.netns_path().with_context(|| {
        format!(
            "pod {}: the runtime records no network namespace",
            pod.full_name()
        )
    })?;
    let resolv = pods::resolv::read_for_pod(pod)
        .map_err(|e| log::warn!("pod {}: resolv.conf: {e:#}", pod.full_name()))
        .ok();
    let mut t = of_netns(format!("pod {}", pod.full_name()), &netns, node, resolv)?;
    t.namespace = Some(pod.namespace.clone());
    Ok(t)
}

fn of_netns(
    label: String,
    netns: &Path,
    node: Option<&Path>,
    resolv: Option<ResolvConf>,
) -> Result<Target> {
    let net = inspect(netns, node).with_context(|| label.clone())?;
    Ok(Target {
        label,
        netns_inode: net.netns_inode,
        addrs: net.ips,
        host_veth: net.host_veth.map(|(name, _)| name),
        resolv,
        namespace: None,
    })
}

impl Target {
    /// Keeps the target's own packets (its namespace and addresses) and its
    /// resolvers' queries upstream.
    pub fn kernel_filter(&self, resolvers: &BTreeSet<IpAddr>) -> Result<KernelFilter> {
        Ok(KernelFilter {
            netns: self.netns_inode,
            watched: watched(&self.addrs, resolvers)?,
        })
    }

    /// One line for the start of a capture.
    pub fn describe(&self) -> String {
        let addrs: Vec<String> = self.addrs.iter().map(IpAddr::to_string).collect();
        let mut s = format!("tracing {}", self.label);
        if self.netns_inode != 0 {
            s += &format!(" (netns {})", self.netns_inode);
        }
        s += &format!(
            ": {}",
            if addrs.is_empty() {
                "no address".into()
            } else {
                addrs.join(", ")
            }
        );
        if let Some(veth) = &self.host_veth {
            s += &format!("; host veth {veth}");
        }
        if let Some(r) = &self.resolv {
            let ns: Vec<String> = r.nameservers.iter().map(IpAddr::to_string).collect();
            s += &format!(
                "; nameserver {}, search {}, ndots {}",
                ns.join(" "),
                if r.search.is_empty() {
                    "-".to_owned()
                } else {
                    r.search.join(" ")
                },
                r.ndots
            );
        }
        s
    }
}

/// One node of several that share this kernel (kind, the lab), as its
/// own kernel would see it: the node's network namespace and its pods'.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    pub node: String,
    /// The node's own namespace's inode, in `netns` too.
    pub node_netns: u32,
    pub netns: BTreeSet<u32>,
}

/// The scope `--node` asks for, the node's own namespace in it; None
/// without it. A node namespace that cannot be read is an error.
pub fn scope(args: &Query) -> Result<Option<Scope>> {
    let Some(node) = &args.node else {
        return Ok(None);
    };
    let node_netns = crate::netns::inode(args.node_netns.as_deref())
        .with_context(|| format!("node {node}: its network namespace (--node-netns)"))?;
    Ok(Some(Scope {
        node: node.clone(),
        node_netns,
        netns: [node_netns].into(),
    }))
}

impl Scope {
    /// The same node with `pods` (those the runtime lists) in scope.
    #[must_use]
    pub fn with_pods(mut self, pods: &[Pod]) -> Self {
        self.netns = Self::of(self.node_netns, pods);
        self
    }

    /// The node's namespace and each pod's that can be read (a pod gone
    /// since it was listed has none).
    pub fn of<'a>(node_netns: u32, pods: impl IntoIterator<Item = &'a Pod>) -> BTreeSet<u32> {
        let pods = pods
            .into_iter()
            .filter_map(|p| crate::netns::inode(Some(&p.netns_path()?)).ok());
        std::iter::once(node_netns).chain(pods).collect()
    }

    pub fn kernel(&self) -> KernelScope {
        KernelScope {
            netns: self.netns.clone(),
        }
    }

    /// One line for the start of a capture.
    pub fn describe(&self) -> String {
        format!(
            "node {}: only its network namespaces, {} in scope (the node's, netns {}, and its pods')",
            self.node,
            self.netns.len(),
            self.node_netns
        )
    }
}

/// The kernel's watched addresses: a target's and its resolvers', each
/// once with its roles.
fn watched(target: &[IpAddr], resolvers: &BTreeSet<IpAddr>) -> Result<Vec<([u8; 16], u8)>> {
    let mut watched: Vec<([u8; 16], u8)> = Vec::new();
    let roles = target
        .iter()
        .map(|ip| (*ip, ROLE_TARGET))
        .chain(resolvers.iter().map(|ip| (*ip, ROLE_RESOLVER)));
    for (ip, role) in roles {
        let key = address_key(ip);
        match watched.iter_mut().find(|(k, _)| *k == key) {
            Some((_, r)) => *r |= role,
            None => watched.push((key, role)),
        }
    }
    anyhow::ensure!(
        watched.len() <= MAX_WATCHED as usize,
        "{} addresses to watch, more than {MAX_WATCHED}",
        watched.len()
    );
    Ok(watched)
}

/// The node's running pods, as the runtime's state and their namespaces
/// tell.
#[derive(Debug, Default)]
pub struct NodePods {
    /// Each pod's `namespace/name` and addresses, for naming.
    pub addresses: Vec<(String, Vec<IpAddr>)>,
    /// Addresses of pods with a socket on port 53: resolvers, whatever
    /// they are called.
    pub dns_servers: BTreeSet<IpAddr>,
    /// Nameservers of the pods with dnsPolicy ClusterFirst: the cluster's
    /// DNS service, where no proxy rules name it.
    pub cluster_nameservers: Vec<IpAddr>,
    /// Each pod address, with where its pod's host veth sits.
    pub attachments: BTreeMap<IpAddr, Attachment>,
}

/// The resolvers a target's queries reach: the DNS services' endpoints in
/// kube-proxy's rules, CoreDNS pods by name, and pods serving port 53. The
/// last holds where the first two fail: with no proxy rules (a balancer
/// at the socket) and a resolver named otherwise (OpenShift's dns-default).
pub fn resolvers(services: &Services, pods: &NodePods) -> BTreeSet<IpAddr> {
    let coredns = pods
        .addresses
        .iter()
        .filter(|(name, _)| is_coredns(name))
        .flat_map(|(_, ips)| ips.iter().copied());
    services
        .dns_endpoints()
        .into_iter()
        .chain(coredns)
        .chain(pods.dns_servers.iter().copied())
        .collect()
}

/// The kubelet's resolv.conf for dnsPolicy ClusterFirst (and
/// ClusterFirstWithHostNet): the search list starts with the pod's own
/// namespace's service domain, `NAMESPACE.svc.DOMAIN`. A resolver's own
/// (dnsPolicy Default) is the node's, without it.
fn is_cluster_first(r: &ResolvConf, namespace: &str) -> bool {
    r.search.first().is_some_and(|s| {
        s.strip_prefix(namespace)
            .is_some_and(|rest| rest.starts_with(".svc."))
    })
}

/// `kube-system/coredns-...` or `kube-system/kube-dns-...`.
pub fn is_coredns(full_name: &str) -> bool {
    full_name
        .strip_prefix("kube-system/")
        .is_some_and(|n| n.starts_with("coredns") || n.starts_with("kube-dns"))
}

/// Every running pod's name and addresses (from inside its namespace,
/// else as its runtime's CRI reported them), and which serve DNS; what
/// cannot be read is left out (names are a help, not a requirement).
/// A hostNetwork pod names no address: the node's are every such pod's,
/// and the node's own processes'.
pub fn node_pods(args: &Query, inventory: &pods::Inventory) -> NodePods {
    let node = args.node_netns.as_deref();
    let node_inode = crate::netns::inode(node).ok();
    let mut found = NodePods::default();
    for p in &inventory.pods {
        let inside = p.netns_path().and_then(|path| inspect(&path, node).ok());
        let host_network = inside
            .as_ref()
            .is_some_and(|net| Some(net.netns_inode) == node_inode);
        let ips = match &inside {
            Some(net) => net.ips.clone(),
            None => match inventory.metadata(p) {
                Some(meta) => meta.ips.clone(),
                None => continue,
            },
        };
        if let Some(a) = inside.as_ref().and_then(|net| net.attachment.as_ref()) {
            found
                .attachments
                .extend(ips.iter().map(|ip| (*ip, a.clone())));
        }
        // A hostNetwork pod shares the node's sockets, NodeLocalDNS's too.
        if inside.is_some_and(|net| net.serves_dns) && !host_network {
            found.dns_servers.extend(&ips);
        }
        if let Some(r) = pods::resolv::read_for_pod(p)
            .ok()
            .filter(|r| is_cluster_first(r, &p.namespace))
        {
            let new: Vec<IpAddr> = r
                .nameservers
                .into_iter()
                .filter(|ip| !found.cluster_nameservers.contains(ip))
                .collect();
            found.cluster_nameservers.extend(new);
        }
        if !host_network {
            found.addresses.push((p.full_name(), ips));
        }
    }
    found
}

/// The workload of each pod's addresses, where the CRI said it.
pub fn workloads(
    inventory: &pods::Inventory,
    pods: &[(String, Vec<IpAddr>)],
) -> BTreeMap<IpAddr, Workload> {
    by_address(inventory, pods, |p| inventory.metadata(p)?.workload.clone())
}

/// The UID of each pod's addresses, from the runtime's state.
pub fn uids(
    inventory: &pods::Inventory,
    pods: &[(String, Vec<IpAddr>)],
) -> BTreeMap<IpAddr, String> {
    by_address(inventory, pods, |p| {
        Some(p.uid.clone()).filter(|u| !u.is_empty())
    })
}

/// What `of` says of each pod in `pods` (by name), for each of its addresses.
fn by_address<T: Clone>(
    inventory: &pods::Inventory,
    pods: &[(String, Vec<IpAddr>)],
    of: impl Fn(&pods::Pod) -> Option<T>,
) -> BTreeMap<IpAddr, T> {
    let by_name: BTreeMap<String, T> = inventory
        .pods
        .iter()
        .filter_map(|p| Some((p.full_name(), of(p)?)))
        .collect();
    pods.iter()
        .filter_map(|(name, ips)| Some((by_name.get(name)?, ips)))
        .flat_map(|(v, ips)| ips.iter().map(|ip| (*ip, v.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_filter_watches_the_target_and_its_resolvers() {
        let t = Target {
            label: "pod default/web".into(),
            netns_inode: 42,
            addrs: vec![ip("10.244.0.10"), ip("fd00::10")],
            host_veth: None,
            resolv: None,
            namespace: Some("default".into()),
        };
        let resolvers = [ip("10.244.0.53"), ip("10.244.0.10")].into();
        let k = t.kernel_filter(&resolvers).unwrap();
        assert_eq!(k.netns, 42);
        let role = |s: &str| {
            k.watched
                .iter()
                .find(|(a, _)| *a == address_key(ip(s)))
                .map(|(_, r)| *r)
        };
        assert_eq!(role("10.244.0.10"), Some(ROLE_TARGET | ROLE_RESOLVER));
        assert_eq!(role("10.244.0.53"), Some(ROLE_RESOLVER));
        assert_eq!(role("fd00::10"), Some(ROLE_TARGET));
        assert_eq!(address_key(ip("10.1.2.3"))[..5], [10, 1, 2, 3, 0]);
    }

    #[test]
    fn coredns_pods_are_known_by_name() {
        assert!(is_coredns("kube-system/coredns-7db6d8ff4d-4xk9m"));
        assert!(!is_coredns("default/coredns-lookalike"));
        let services = Services::parse("-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment \"kube-system/kube-dns:dns cluster IP\" -m udp --dport 53 -j KUBE-SVC-X\n-A KUBE-SEP-Y -p udp -m comment --comment \"kube-system/kube-dns:dns\" -m udp -j DNAT --to-destination 10.244.0.54:53\n");
        let pods = NodePods {
            addresses: vec![("kube-system/coredns-a".to_owned(), vec![ip("10.244.0.53")])],
            ..NodePods::default()
        };
        assert_eq!(
            resolvers(&services, &pods),
            [ip("10.244.0.53"), ip("10.244.0.54")].into()
        );
    }

    #[test]
    fn cluster_first_pods_are_known_by_their_search_list() {
        let r = |text: &str| crate::pods::resolv::parse(text);
        let client = r("search shop.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\n");
        assert!(is_cluster_first(&client, "shop"));
        assert!(
            !is_cluster_first(&client, "sho"),
            "another namespace's list"
        );
        let coredns = r("nameserver 198.51.100.53\nsearch ec2.internal\n");
        assert!(!is_cluster_first(&coredns, "kube-system"));
        assert!(!is_cluster_first(&r("nameserver 10.96.0.10\n"), "default"));
    }

    /// No proxy rules and a resolver not named CoreDNS: it is known by
    /// the socket it serves DNS on.
    #[test]
    fn pods_serving_port_53_are_resolvers_without_rules_or_names() {
        let pods = NodePods {
            addresses: vec![
                (
                    "openshift-dns/dns-default-x".to_owned(),
                    vec![ip("10.128.0.5")],
                ),
                ("default/web".to_owned(), vec![ip("10.128.0.9")]),
            ],
            dns_servers: [ip("10.128.0.5")].into(),
            ..NodePods::default()
        };
        assert_eq!(
            resolvers(&Services::default(), &pods),
            [ip("10.128.0.5")].into()
        );
    }
}
