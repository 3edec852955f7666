//! `dnstrace lab`: a simulated Kubernetes node in network namespaces, with the
//! real DNS path (bridge, kube-proxy DNAT, conntrack, resolvers) and
//! switchable faults. It touches nothing outside its namespaces, its
//! /etc/netns entries and its directory under /run (its containerd's
//! included); in socket-lb mode, also cgroup programs at the root cgroup
//! that act only on its namespaces' sockets (`socketlb`).
mod agents;
mod cluster;
pub mod containerd;
mod delay;
mod dnswire;
mod faults;
mod kubeproxy;
mod libc_clients;
mod loopprobe;
mod nodelocal;
mod plan;
mod resolvers;
mod restart;
mod runtime;
mod sandboxes;
mod socketlb;
mod sys;
pub mod traffic;

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write as _,
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

pub use delay::delay_line;
pub use faults::Fault;
use kubeproxy::ProxyMode;
use plan::{lab_dir, node_ns, upstream_ns, Cni, Domain, NodeLocal, Pod, Role};

use crate::pods::cri::sandbox::Dns;

#[derive(clap::Subcommand, Debug)]
pub enum LabCommand {
    /// Build the lab: a node, two client pods, two CoreDNS pods, an upstream resolver.
    Up {
        /// Switch a fault on from the start (repeatable).
        #[arg(long = "fault", value_enum)]
        faults: Vec<Fault>,
        /// Add NodeLocalDNS, a cache on the node asking CoreDNS over TCP:
        /// `link-local` (the default) on 169.254.20.10, pods pointed at it;
        /// `notrack` also on kube-dns's IP, with the raw-table NOTRACK rules
        /// of its manifest, asking CoreDNS through kube-dns-upstream.
        #[arg(long, value_enum, num_args = 0..=1, require_equals = true, default_missing_value = "link-local")]
        nodelocaldns: Option<NodeLocal>,
        /// Dual-stack: IPv6 pod addresses, service IP and ip6tables rules too.
        #[arg(long)]
        ipv6: bool,
        /// The pods always run in the lab's own containerd; `crio` also
        /// writes CRI-O's state layout for them under /run/dnstrace-lab/crio
        /// (there is no real CRI-O here), for `--crio-root`.
        #[arg(long, value_enum, default_value_t = runtime::Runtime::Containerd)]
        runtime: runtime::Runtime,
        /// Which kube-proxy mode writes the kube-dns rules: iptables (its nat
        /// table) or nftables (its `ip kube-proxy` table); or socket-lb, no
        /// rules but cgroup programs that rewrite kube-dns's address at the
        /// socket, as Cilium's kube-proxy replacement does (IPv4 only).
        #[arg(long, value_enum, default_value_t = ProxyMode::Iptables)]
        proxy_mode: ProxyMode,
        /// The cluster's DNS domain (the kubelet's clusterDomain): CoreDNS's
        /// records, the pods' search lists and NodeLocalDNS's zones follow it.
        #[arg(long, default_value_t = Domain::cluster_default())]
        cluster_domain: Domain,
        /// A search domain of the node's resolv.conf (repeatable), which the
        /// kubelet appends to pods' search lists, as on EKS (ec2.internal).
        #[arg(long = "node-search")]
        node_search: Vec<Domain>,
        /// Add a hostNetwork client pod (logging/fluent-bit-5lq8z): the
        /// node's namespace, resolv.conf as dnsPolicy ClusterFirstWithHostNet.
        #[arg(long)]
        host_network_client: bool,
        /// How pods are wired to the node: `bridge` (cni0, the CNI bridge
        /// plugin, as flannel does) or `routed` (no bridge: the CNI ptp
        /// plugin's /32 route and gateway address per host veth, as Calico).
        #[arg(long, value_enum, default_value_t = Cni::Bridge)]
        cni: Cni,
        /// A cluster of 2 or 3 nodes instead of one: each its own namespace,
        /// pod subnet (10.244.N.0/24), containerd and kube-proxy rules,
        /// linked by a VXLAN overlay as flannel links them; a client on
        /// every node, CoreDNS on the last two, upstream behind node 1.
        #[arg(long, value_parser = clap::value_parser!(u8).range(2..=3))]
        nodes: Option<u8>,
        /// With --nodes: the DaemonSet, a `dnstrace agent` per node in its
        /// network namespace, serving cluster views with mutual TLS on
        /// the node's address (a CA and certificate made for the lab);
        /// CoreDNS answers their Service's name,
        /// dnstrace-agents.dnstrace.svc.<cluster domain>.
        #[arg(long, requires = "nodes")]
        agents: bool,
    },
    /// Remove every namespace, process, rule and file the lab made.
    Down,
    /// Show what of the lab exists.
    Status,
    /// Run a command as in a node's agent pod (`lab up --agents`), as
    /// `kubectl exec -n dnstrace ds/dnstrace -- COMMAND` does: in the
    /// node's network namespace, with the pod's resolv.conf and the
    /// DaemonSet's environment (the agents' name and certificate).
    Exec {
        /// node1, node2 or node3.
        node: String,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Switch a fault on or off in the running lab.
    Fault {
        #[arg(value_enum)]
        fault: Fault,
        #[arg(value_enum)]
        state: Switch,
        /// The node a cluster's fault is made on (`lab up --nodes`), by
        /// number: 1, 2 or 3.
        #[arg(long)]
        node: Option<u8>,
    },
    /// Run lookups from the client pods the way applications do.
    Traffic(traffic::TrafficArgs),
    /// Reload CoreDNS, as a Corefile change does: each CoreDNS pod re-reads
    /// its resolv.conf and sends the loop plugin's probe again.
    Reload,
    /// Restart CoreDNS, as a rollout or a crash does: each pod's resolver
    /// stops and starts again (an empty cache, a new loop probe), one pod
    /// after the other.
    Restart {
        #[arg(value_enum)]
        target: restart::Target,
    },
    /// (internal) a delay line in front of the upstream resolver.
    #[command(hide = true)]
    DelayLine {
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[arg(long)]
        to: std::net::SocketAddr,
        #[arg(long)]
        delay_ms: u64,
    },
    /// (internal) CoreDNS's loop plugin probe, from inside a CoreDNS pod.
    #[command(hide = true)]
    LoopProbe,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switch {
    On,
    Off,
}

/// What `lab up` built, kept in the lab's directory (`plan::lab_dir`), state.json.
#[derive(Serialize, Deserialize, Default, Debug)]
pub struct LabState {
    pub ipv6: bool,
    pub nodelocaldns: Option<NodeLocal>,
    pub faults: BTreeSet<Fault>,
    #[serde(default)]
    pub runtime: runtime::Runtime,
    #[serde(default)]
    pub proxy_mode: ProxyMode,
    #[serde(default = "Domain::cluster_default")]
    pub cluster_domain: Domain,
    #[serde(default)]
    pub node_search: Vec<Domain>,
    #[serde(default)]
    pub host_client: bool,
    #[serde(default)]
    pub cni: Cni,
    /// Nodes of a cluster lab (`--nodes`); 1: the single node.
    #[serde(default = "one_node")]
    pub nodes: u8,
    /// The node each cluster fault that is on was made on.
    #[serde(default)]
    pub fault_nodes: BTreeMap<Fault, u8>,
    /// The pods' CRI sandboxes, by namespace/name.
    #[serde(default)]
    pub sandboxes: BTreeMap<String, sandboxes::Sandbox>,
    /// Long-running processes by name.
    pub pids: BTreeMap<String, u32>,
    /// An agent per node (`--agents`).
    #[serde(default)]
    pub agents: bool,
    /// The agents' pids by node name, stopped first and gently.
    #[serde(default)]
    pub agent_pids: BTreeMap<String, u32>,
}

fn one_node() -> u8 {
    1
}

fn state_path() -> PathBuf {
    lab_dir().join("state.json")
}

impl LabState {
    pub fn load() -> Result<Self> {
        let text = std::fs::read_to_string(state_path())
            .map_err(|_| anyhow::anyhow!("the lab is not up: run `dnstrace lab up`"))?;
        serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is damaged: run `dnstrace lab down`",
                state_path().display()
            )
        })
    }

    fn save(&self) -> Result<()> {
        std::fs::write(state_path(), serde_json::to_string_pretty(self)?)
            .context("saving the lab state")
    }

    fn has(&self, fault: Fault) -> bool {
        self.faults.contains(&fault)
    }

    /// The faults on, each with its node in a cluster (`overlay-drop@node3`).
    fn fault_names(&self) -> Vec<String> {
        self.faults
            .iter()
            .map(|f| match self.fault_nodes.get(f) {
                Some(n) => format!("{}@{}", f.name(), cluster::Node(*n).name()),
                None => f.name(),
            })
            .collect()
    }

    fn is_cluster(&self) -> bool {
        self.nodes > 1
    }
}

/// The pods of the lab `state` describes.
fn lab_pods(state: &LabState) -> Vec<Pod> {
    if state.is_cluster() {
        cluster::pods(state.nodes)
            .into_iter()
            .map(|p| p.pod)
            .collect()
    } else {
        plan::pods(state.host_client, state.nodelocaldns.is_some())
            .copied()
            .collect()
    }
}

fn coredns_pods(state: &LabState) -> Vec<Pod> {
    let mut pods = lab_pods(state);
    pods.retain(|p| p.role == Role::CoreDns);
    pods
}

/// The lab's client pods.
pub fn client_pods(state: &LabState) -> Vec<Pod> {
    let mut pods = lab_pods(state);
    pods.retain(|p| matches!(p.role, Role::Client | Role::HostClient));
    pods
}

/// A pod of the lab by `name`, `namespace/name`, or a prefix of either name part.
pub fn find_pod(state: &LabState, query: &str) -> Option<Pod> {
    if !state.is_cluster() {
        return plan::find_pod(query).copied();
    }
    let (namespace, name) = query
        .split_once('/')
        .map_or((None, query), |(ns, n)| (Some(ns), n));
    lab_pods(state)
        .into_iter()
        .find(|p| namespace.is_none_or(|ns| ns == p.namespace) && p.name.starts_with(name))
}

/// Runs `cmd` on the lab `instance` (None: the first).
pub async fn run(cmd: LabCommand, instance: Option<u8>) -> Result<()> {
    plan::select(instance).map_err(anyhow::Error::msg)?;
    // The delay line and the probe run inside the lab, started by it; the
    // rest changes the machine.
    if !matches!(cmd, LabCommand::DelayLine { .. } | LabCommand::LoopProbe) {
        require_root()?;
    }
    match cmd {
        LabCommand::Up {
            faults,
            nodelocaldns,
            ipv6,
            runtime,
            proxy_mode,
            cluster_domain,
            node_search,
            host_network_client,
            cni,
            nodes,
            agents,
        } => {
            let state = LabState {
                ipv6,
                nodelocaldns: nodelocaldns.or(faults
                    .contains(&Fault::NodelocaldnsLoop)
                    .then_some(NodeLocal::LinkLocal)),
                runtime,
                proxy_mode,
                cluster_domain,
                node_search,
                host_client: host_network_client,
                cni,
                nodes: nodes.unwrap_or(1),
                agents,
                ..LabState::default()
            };
            up(faults, state).await
        }
        LabCommand::Down => down(true).await,
        LabCommand::Status => status(),
        LabCommand::Exec { node, command } => agents::exec(&LabState::load()?, &node, &command),
        LabCommand::Fault { fault, state, node } => switch_fault(fault, state == Switch::On, node),
        LabCommand::Traffic(args) => traffic::run(args),
        LabCommand::Reload => reload_coredns(&LabState::load()?),
        LabCommand::Restart { target } => {
            let mut state = LabState::load()?;
            refuse_in_cluster(&state, "`lab restart` and its targets")?;
            restart(&mut state, target)
        }
        LabCommand::LoopProbe => loopprobe::run(),
        LabCommand::DelayLine {
            listen,
            to,
            delay_ms,
        } => delay_line(listen, to, Duration::from_millis(delay_ms)).await,
    }
}

/// Switches a fault of a cluster on or off, on `node` (its default if
/// None); a fault already on elsewhere is moved.
fn cluster_fault(state: &mut LabState, fault: Fault, on: bool, node: Option<u8>) -> Result<()> {
    let node = node.unwrap_or_else(|| fault.default_node(state.nodes));
    if !(1..=state.nodes).contains(&node) {
        bail!("--node {node}: the lab's nodes are 1 to {}", state.nodes);
    }
    if on && fault == Fault::OverlayDrop && node == 1 {
        bail!("overlay-drop drops VXLAN from node 1 to another node: give --node 2 or 3");
    }
    if let Some(&before) = state.fault_nodes.get(&fault) {
        cluster::set_fault(state, fault, cluster::Node(before), false)?;
        state.faults.remove(&fault);
        state.fault_nodes.remove(&fault);
    }
    if on {
        cluster::set_fault(state, fault, cluster::Node(node), true)?;
        state.faults.insert(fault);
        state.fault_nodes.insert(fault, node);
    }
    state.save()?;
    log::info!(target: "lab", "{} {} on node{node}", fault.name(), if on { "on" } else { "off" });
    Ok(())
}

/// What only the single-node lab has yet.
fn refuse_in_cluster(state: &LabState, what: &str) -> Result<()> {
    if state.is_cluster() {
        bail!("{what} are for the single-node lab: bring it up without --nodes");
    }
    Ok(())
}

fn require_root() -> Result<()> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the lab makes network namespaces and iptables rules: run it as root (sudo dnstrace lab ...)");
    }
    Ok(())
}

/// Builds the lab `state` describes, with `faults` on.
async fn up(faults: Vec<Fault>, mut state: LabState) -> Result<()> {
    sys::require_programs()?;
    check_options(&state, &faults)?;
    if let Ok(state) = LabState::load() {
        if state.pids.values().all(|&p| sys::alive(p)) && !sys::lab_namespaces().is_empty() {
            bail!(
                "the lab is already up (see `dnstrace lab status`; `dnstrace lab down` removes it)"
            );
        }
    }
    if !sys::lab_namespaces().is_empty() || lab_dir().exists() {
        log::info!(target: "lab", "cleaning up what an earlier lab left behind");
        down(false).await?;
    }
    let looped = faults.iter().any(|f| f.is_loop());
    if let Err(e) = build(&mut state, !looped).await {
        let _ = down(false).await;
        return Err(e.context("building the lab failed; everything it made was removed"));
    }
    for fault in faults {
        set_fault(&mut state, fault, true)?;
    }
    state.save()?;
    print_summary(&state);
    Ok(())
}

/// Refuses what the socket-lb mode, or a cluster, cannot be combined
/// with, before anything is built.
fn check_options(state: &LabState, faults: &[Fault]) -> Result<()> {
    if state.is_cluster() {
        return check_cluster_options(state, faults);
    }
    if state.proxy_mode != ProxyMode::SocketLb {
        return Ok(());
    }
    if let Some(why) = faults.iter().find_map(|&f| socketlb::inapplicable(f)) {
        bail!("{why}");
    }
    if state.ipv6 {
        bail!("--proxy-mode socket-lb balances IPv4 only: leave out --ipv6");
    }
    if state.nodelocaldns == Some(NodeLocal::Notrack) {
        bail!("--nodelocaldns=notrack needs iptables to skip kube-proxy's DNAT; with --proxy-mode socket-lb the balancer would send its queries past it (Cilium needs a Local Redirect Policy for it, which the lab has not)");
    }
    Ok(())
}

/// What a cluster lab builds yet: the single node's options and faults
/// are refused with `--nodes`.
fn check_cluster_options(state: &LabState, faults: &[Fault]) -> Result<()> {
    let single = [
        (state.ipv6, "--ipv6"),
        (state.nodelocaldns.is_some(), "--nodelocaldns"),
        (
            state.proxy_mode == ProxyMode::SocketLb,
            "--proxy-mode socket-lb",
        ),
        (state.host_client, "--host-network-client"),
        (state.cni != Cni::Bridge, "--cni routed"),
        (
            state.runtime != runtime::Runtime::Containerd,
            "--runtime crio",
        ),
        (!faults.is_empty(), "--fault"),
    ];
    if let Some((_, what)) = single.iter().find(|(on, _)| *on) {
        bail!("{what} is for the single-node lab: leave it out with --nodes, or leave out --nodes");
    }
    Ok(())
}

/// `forward_retries`: CoreDNS's own retries upstream (see `start_coredns`).
async fn build(state: &mut LabState, forward_retries: bool) -> Result<()> {
    std::fs::create_dir_all(lab_dir().join("logs"))?;
    if state.is_cluster() {
        return build_cluster(state).await;
    }
    for ns in [node_ns(), upstream_ns()] {
        add_netns(ns, state.ipv6)?;
    }
    build_node(state)?;
    add_pods(state).await?;
    write_resolv_confs(state)?;
    apply_rules(state)?;
    balance(state)?;
    start_upstream(state)?;
    start_resolvers(state, forward_retries)
}

/// The nodes, wired; each node's pods in its own containerd; kube-proxy's
/// rules on every node; the resolvers.
async fn build_cluster(state: &mut LabState) -> Result<()> {
    for ns in cluster::namespaces(state.nodes) {
        add_netns(&ns, false)?;
    }
    cluster::wire(state.nodes)?;
    let placed = cluster::pods(state.nodes);
    for node in cluster::nodes(state.nodes) {
        let pods: Vec<_> = placed
            .iter()
            .filter(|p| p.node == node)
            .map(|p| (&p.pod, pod_dns(state, &p.pod)))
            .collect();
        let sandboxes = sandboxes::run_all_in(&node.setup(), &pods, false).await?;
        state.sandboxes.extend(sandboxes);
    }
    write_resolv_confs(state)?;
    for node in cluster::nodes(state.nodes) {
        cluster_rules(state, &node.netns())?;
    }
    start_upstream(state)?;
    start_resolvers(state, true)?;
    if state.agents {
        agents::start(state)?;
    }
    Ok(())
}

/// kube-proxy's rules on one node of a cluster: every node has the
/// service's, with every CoreDNS pod of the cluster its endpoint.
fn cluster_rules(state: &LabState, ns: &str) -> Result<()> {
    let endpoints: Vec<IpAddr> = coredns_pods(state).iter().map(|p| p.ip4.into()).collect();
    let nat = kubeproxy::NatConfig {
        proxy: state.proxy_mode,
        service: IpAddr::V4(plan::SERVICE4),
        endpoints: &endpoints,
        pod_cidr: plan::POD_CIDR4,
        service_jumps: true,
        tcp_port: true,
    };
    sys::restore(ns, false, &kubeproxy::nat_table_with(&nat, &[]))?;
    if state.proxy_mode == ProxyMode::Nftables {
        sys::nft(ns, &kubeproxy::nft_table_with(&nat, &[]))?;
    }
    Ok(())
}

/// CoreDNS (and NodeLocalDNS), once every pod runs; then waits for them.
fn start_resolvers(state: &mut LabState, forward_retries: bool) -> Result<()> {
    for pod in coredns_pods(state) {
        start_coredns(state, &pod, forward_retries)?;
    }
    if state.nodelocaldns.is_some() {
        start_nodelocal(state)?;
    }
    state.save()?;
    wait_listening(state)?;
    loop_probes(state)
}

fn add_netns(ns: &str, ipv6: bool) -> Result<()> {
    sys::run("ip", &["netns", "add", ns])?;
    if ipv6 {
        // No duplicate address detection on the lab's links (as CNI plugins
        // do): a tentative link-local address holds up neighbour discovery.
        for key in [
            "net.ipv6.conf.all.accept_dad",
            "net.ipv6.conf.default.accept_dad",
        ] {
            sys::sysctl(ns, key, "0")?;
        }
    }
    sys::ip(ns, "link set lo up").map(drop)
}

/// The node's device `dev` linked to the upstream resolver's namespace
/// (its `eth0`), both ends addressed and up, and the node's default route
/// through it.
fn link_upstream(node: &str, dev: &str) -> Result<()> {
    sys::run(
        "ip",
        &[
            "link",
            "add",
            dev,
            "netns",
            node,
            "type",
            "veth",
            "peer",
            "name",
            plan::UPLINK,
            "netns",
            upstream_ns(),
        ],
    )?;
    sys::ip(
        node,
        &format!("addr add {}/24 dev {dev}", plan::NODE_UPLINK4),
    )?;
    sys::ip(
        upstream_ns(),
        &format!("addr add {}/24 dev {}", plan::UPSTREAM4, plan::UPLINK),
    )?;
    sys::ip(node, &format!("link set {dev} up"))?;
    sys::ip(upstream_ns(), &format!("link set {} up", plan::UPLINK))?;
    // Locally made packets to the service IP need a route before DNAT applies.
    sys::ip(node, &format!("route add default via {}", plan::UPSTREAM4)).map(drop)
}

fn build_node(state: &LabState) -> Result<()> {
    // The pods' bridge (`--cni bridge`) is the CNI bridge plugin's, made
    // with the first pod.
    let node = node_ns();
    link_upstream(node, plan::UPLINK)?;
    sys::sysctl(node, "net.ipv4.ip_forward", "1")?;
    sys::sysctl(node, "net.bridge.bridge-nf-call-iptables", "1")?;
    if state.ipv6 {
        sys::ip(
            node,
            &format!(
                "-6 addr add {}/64 dev {} nodad",
                plan::NODE_UPLINK6,
                plan::UPLINK
            ),
        )?;
        sys::ip(
            upstream_ns(),
            &format!(
                "-6 addr add {}/64 dev {} nodad",
                plan::UPSTREAM6,
                plan::UPLINK
            ),
        )?;
        sys::ip(
            node,
            &format!("-6 route add default via {}", plan::UPSTREAM6),
        )?;
        sys::sysctl(node, "net.ipv6.conf.all.forwarding", "1")?;
        sys::sysctl(node, "net.bridge.bridge-nf-call-ip6tables", "1")?;
    }
    if let Some(mode) = state.nodelocaldns {
        // NodeLocalDNS holds its addresses on a dummy device; an empty bridge
        // does the same where the kernel has no dummy driver.
        if sys::ip(node, "link add nodelocaldns type dummy").is_err() {
            sys::ip(node, "link add nodelocaldns type bridge")?;
        }
        for ip in mode.listen() {
            sys::ip(node, &format!("addr add {ip}/32 dev nodelocaldns"))?;
        }
        sys::ip(node, "link set nodelocaldns up")?;
    }
    Ok(())
}

/// Runs every pod in the lab's containerd, through CRI, in plan order (so
/// each gets its planned addresses); with `--runtime crio`, writes CRI-O's
/// layout for them too.
async fn add_pods(state: &mut LabState) -> Result<()> {
    let pods: Vec<_> = plan::pods(state.host_client, state.nodelocaldns.is_some())
        .map(|pod| (pod, pod_dns(state, pod)))
        .collect();
    state.sandboxes = sandboxes::run_all(&pods, state.ipv6, state.cni).await?;
    if state.runtime == runtime::Runtime::Crio {
        for (pod, _) in pods {
            let pid = state.sandboxes[&pod.full_name()].pid;
            runtime::write_crio_sandbox(&runtime::crio_root(), pod, pid)?;
        }
    }
    Ok(())
}

/// `ip netns exec NS` bind-mounts the files here over /etc.
fn netns_etc(ns: &str) -> PathBuf {
    Path::new("/etc/netns").join(ns)
}

fn nameserver_for(state: &LabState, pod: &Pod) -> IpAddr {
    match pod.role {
        // dnsPolicy Default: CoreDNS and NodeLocalDNS inherit the node's resolv.conf.
        Role::CoreDns | Role::NodeLocalDns => node_nameserver(state),
        Role::Client if state.has(Fault::LoopbackNameserver) && pod.name == plan::PODS[0].name => {
            plan::RESOLVED_STUB.into()
        }
        // ClusterFirstWithHostNet gives a hostNetwork pod the same.
        Role::Client | Role::HostClient if state.nodelocaldns == Some(NodeLocal::LinkLocal) => {
            plan::NODELOCAL4.into()
        }
        Role::Client | Role::HostClient => plan::SERVICE4.into(),
    }
}

/// The DNS config the kubelet gives `pod` (its dnsPolicy's), before faults.
fn pod_dns(state: &LabState, pod: &Pod) -> Dns {
    let server = nameserver_for(state, pod);
    match pod.role {
        Role::CoreDns | Role::NodeLocalDns => sandboxes::dns(server, node_search(state), false),
        Role::Client | Role::HostClient => sandboxes::dns(
            server,
            pod.search_list(&state.cluster_domain, &state.node_search),
            true,
        ),
    }
}

fn node_search(state: &LabState) -> Vec<String> {
    state.node_search.iter().map(Domain::to_string).collect()
}

fn node_nameserver(state: &LabState) -> IpAddr {
    if state.has(Fault::NodelocaldnsLoop) {
        plan::NODELOCAL4.into()
    } else {
        plan::UPSTREAM4.into()
    }
}

fn write_resolv_confs(state: &LabState) -> Result<()> {
    for pod in &lab_pods(state) {
        let text = match pod.role {
            Role::CoreDns if state.has(Fault::ForwardLoop) && pod.name == plan::PODS[2].name => {
                // The node's systemd-resolved stub, inherited: in the pod it is CoreDNS itself.
                format!("nameserver {}\n", plan::RESOLVED_STUB)
            }
            Role::CoreDns | Role::NodeLocalDns => {
                node_resolv_conf(state, nameserver_for(state, pod))
            }
            Role::Client | Role::HostClient => {
                let mut search = pod.search_list(&state.cluster_domain, &state.node_search);
                if state.has(Fault::SearchLeak) {
                    search.push(plan::LEAK_DOMAIN.to_owned());
                }
                resolvers::pod_resolv_conf(nameserver_for(state, pod), &search)
            }
        };
        sys::rewrite(&pod.resolv_conf(), &text)?;
    }
    for node in node_namespaces(state) {
        std::fs::create_dir_all(netns_etc(&node))?;
        sys::rewrite(
            &netns_etc(&node).join("resolv.conf"),
            &node_resolv_conf(state, node_nameserver(state)),
        )?;
    }
    Ok(())
}

/// The node namespaces: the one node's, or each of a cluster's.
fn node_namespaces(state: &LabState) -> Vec<String> {
    if state.is_cluster() {
        cluster::nodes(state.nodes)
            .map(cluster::Node::netns)
            .collect()
    } else {
        vec![node_ns().to_owned()]
    }
}

/// The node's resolv.conf, which dnsPolicy Default pods (CoreDNS) inherit.
fn node_resolv_conf(state: &LabState, nameserver: IpAddr) -> String {
    let mut text = format!("nameserver {nameserver}\n");
    if !state.node_search.is_empty() {
        let search: Vec<String> = state.node_search.iter().map(Domain::to_string).collect();
        text += &format!("search {}\n", search.join(" "));
    }
    text
}

/// All iptables and nftables state of the lab, derived from options and faults.
fn apply_rules(state: &LabState) -> Result<()> {
    node_rules(state, false)?;
    sys::nft(node_ns(), &node_nft(state))?;
    if state.ipv6 {
        node_rules(state, true)?;
        sys::restore(upstream_ns(), true, &upstream_filter(state))?;
    }
    sys::restore(upstream_ns(), false, &upstream_filter(state))?;
    sys::restore(upstream_ns(), false, &upstream_nat(state))
}

/// The socket-level balancer in socket-lb mode, attached anew: only at
/// build and for `no-dnat`, as a new one forgets which sockets it rewrote.
fn balance(state: &LabState) -> Result<()> {
    if state.proxy_mode != ProxyMode::SocketLb {
        return Ok(());
    }
    socketlb::attach(&balanced(state), &sys::lab_namespaces())
}

/// kube-dns for the socket-level balancer; `no-dnat` leaves it no
/// backends, so its sockets go out addressed to the service.
fn balanced(state: &LabState) -> Vec<socketlb::Service> {
    let backends = if state.has(Fault::NoDnat) {
        Vec::new()
    } else {
        plan::coredns_pods().map(|p| p.ip4).collect()
    };
    vec![socketlb::Service {
        ip: plan::SERVICE4,
        backends,
    }]
}

/// kube-proxy's nat table and the node's filter table, for one family.
fn node_rules(state: &LabState, v6: bool) -> Result<()> {
    let (service, pod_cidr, upstream_service) = if v6 {
        (
            IpAddr::V6(plan::SERVICE6),
            plan::POD_CIDR6,
            IpAddr::V6(plan::UPSTREAM_SERVICE6),
        )
    } else {
        (
            IpAddr::V4(plan::SERVICE4),
            plan::POD_CIDR4,
            IpAddr::V4(plan::UPSTREAM_SERVICE4),
        )
    };
    let endpoints: Vec<IpAddr> = plan::coredns_pods().map(|p| p.ip(v6)).collect();
    let nat = kubeproxy::NatConfig {
        proxy: state.proxy_mode,
        service,
        endpoints: &endpoints,
        pod_cidr,
        service_jumps: !state.has(Fault::NoDnat),
        tcp_port: !state.has(Fault::NoDnsTcp),
    };
    // NodeLocalDNS's NOTRACK mode comes with its own way to CoreDNS.
    let more: Vec<kubeproxy::Service> = (state.nodelocaldns == Some(NodeLocal::Notrack))
        .then_some(kubeproxy::Service {
            name: kubeproxy::UPSTREAM_SERVICE,
            ip: upstream_service,
        })
        .into_iter()
        .collect();
    sys::restore(node_ns(), v6, &kubeproxy::nat_table_with(&nat, &more))?;
    if state.proxy_mode == ProxyMode::Nftables {
        sys::nft(node_ns(), &kubeproxy::nft_table_with(&nat, &more))?;
    }
    let local_ips = nodelocal_notrack_ips(state, v6);
    if !local_ips.is_empty() {
        sys::restore(node_ns(), v6, &nodelocal::raw_table(&local_ips))?;
    }
    // The drop fault cuts the path to the second CoreDNS pod.
    sys::restore(
        node_ns(),
        v6,
        &node_filter(state, &endpoints[1].to_string(), &local_ips),
    )
}

/// The IPv4 addresses NodeLocalDNS keeps from conntrack, in its NOTRACK mode.
fn nodelocal_notrack_ips(state: &LabState, v6: bool) -> Vec<std::net::Ipv4Addr> {
    match state.nodelocaldns {
        Some(mode @ NodeLocal::Notrack) if !v6 => mode.listen(),
        _ => Vec::new(),
    }
}

fn node_filter(state: &LabState, endpoint: &str, notrack_ips: &[std::net::Ipv4Addr]) -> String {
    let mut t = String::from("*filter\n");
    for rule in nodelocal::rules("filter", notrack_ips) {
        t += &rule;
        t.push('\n');
    }
    if state.has(Fault::Drop) {
        for proto in ["udp", "tcp"] {
            t += &format!(
                "-A FORWARD -d {endpoint} -p {proto} -m {proto} --dport 53 -m comment --comment \"dnstrace lab: drop fault\" -j DROP\n"
            );
        }
    }
    t + "COMMIT\n"
}

/// The node's own nftables table, holding the `fragments-dropped` firewall.
const NFT_TABLE: &str = "dnstrace_lab";

/// The table as the faults want it: declared and deleted first, so the
/// script starts clean whether the table existed or not. The drop must run
/// before conntrack reassembles fragments (priority -400), bridged packets
/// included (br_netfilter).
fn node_nft(state: &LabState) -> String {
    let mut t = format!("table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n");
    if state.has(Fault::FragmentsDropped) {
        let drop = "counter drop comment \"dnstrace lab: fragments-dropped fault\"";
        t += &[
            format!("table inet {NFT_TABLE} {{"),
            "  chain fragments {".into(),
            "    type filter hook prerouting priority -450; policy accept;".into(),
            // IPv4: an offset; IPv6: a fragment header with an offset.
            format!("    ip frag-off & 0x1fff != 0 {drop}"),
            format!("    frag frag-off != 0 {drop}"),
            "  }\n}\n".into(),
        ]
        .join("\n");
    }
    t
}

fn upstream_filter(state: &LabState) -> String {
    let mut t = String::from("*filter\n");
    if state.has(Fault::UpstreamTimeout) {
        for proto in ["udp", "tcp"] {
            t += &format!(
                "-A INPUT -i {} -p {proto} -m {proto} --dport 53 -j DROP\n",
                plan::UPLINK
            );
        }
    }
    t + "COMMIT\n"
}

/// The delay line of `slow-upstream`: queries to the resolver go through it.
fn upstream_nat(state: &LabState) -> String {
    let mut t = String::from("*nat\n");
    if state.has(Fault::SlowUpstream) {
        t += &format!(
            "-A PREROUTING -i {} -p udp -m udp --dport 53 -j REDIRECT --to-ports {}\n",
            plan::UPLINK,
            faults::DELAY_LINE_PORT
        );
    }
    t + "COMMIT\n"
}

fn start_upstream(state: &mut LabState) -> Result<()> {
    std::fs::write(resolvers::zone_path(), resolvers::example_zone())?;
    let conf = resolvers::unbound_conf(state.ipv6, state.has(Fault::Servfail));
    start_unbound(state, upstream_ns(), "unbound", &conf)
}

/// Starts (or restarts) an unbound named `name` with `conf`, in `ns`.
fn start_unbound(state: &mut LabState, ns: &str, name: &str, conf: &str) -> Result<()> {
    stop(state, name);
    let path = lab_dir().join(format!("{name}.conf"));
    std::fs::write(&path, conf)?;
    let _ = std::fs::remove_file(resolvers::pid_path(name));
    sys::in_ns(ns, "unbound", &["-c", &path.to_string_lossy()])?;
    let pid = read_pid(name)?;
    state.pids.insert(name.to_owned(), pid);
    Ok(())
}

/// Without `forward_retries` dnsmasq leaves retries to its clients: a lab
/// that starts with a loop fault would have each looping query multiplied
/// every 2 s, a storm no real CoreDNS meets (its loop plugin stops it).
fn start_coredns(state: &mut LabState, pod: &Pod, forward_retries: bool) -> Result<()> {
    let agents = if state.agents {
        agents::addresses(state.nodes)
    } else {
        Vec::new()
    };
    let mut args = resolvers::coredns_args(
        pod,
        state.ipv6,
        &state.cluster_domain,
        &lab_pods(state),
        &agents,
    );
    if !forward_retries {
        args.retain(|a| a != resolvers::FORWARD_TRIES);
    }
    start_dnsmasq(state, &pod.netns(), pod.name, &args)
}

fn start_nodelocal(state: &mut LabState) -> Result<()> {
    let mode = state.nodelocaldns.unwrap_or(NodeLocal::LinkLocal);
    let conf = resolvers::nodelocal_conf(
        mode,
        &state.cluster_domain,
        state.has(Fault::NodelocaldnsLoop),
    );
    start_unbound(state, node_ns(), "nodelocaldns", &conf)
}

fn start_dnsmasq(state: &mut LabState, ns: &str, name: &str, args: &[String]) -> Result<()> {
    stop(state, name);
    let _ = std::fs::remove_file(resolvers::pid_path(name));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    sys::in_ns(ns, "dnsmasq", &args)?;
    let pid = read_pid(name)?;
    state.pids.insert(name.to_owned(), pid);
    Ok(())
}

fn stop(state: &mut LabState, name: &str) {
    if let Some(pid) = state.pids.remove(name) {
        sys::kill(pid);
        wait_gone(pid);
    }
}

fn read_pid(name: &str) -> Result<u32> {
    let path = resolvers::pid_path(name);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(pid) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return Ok(pid);
        }
        if Instant::now() > deadline {
            bail!(
                "{name} did not start (no pid in {}); see {}",
                path.display(),
                resolvers::log_path(name).display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while sys::alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until every resolver has its port 53 open.
fn wait_listening(state: &LabState) -> Result<()> {
    let mut namespaces: Vec<String> = coredns_pods(state).iter().map(Pod::netns).collect();
    namespaces.push(upstream_ns().to_owned());
    if state.nodelocaldns.is_some() {
        namespaces.push(node_ns().to_owned());
    }
    namespaces.iter().try_for_each(|ns| wait_listening_in(ns))
}

fn wait_listening_in(ns: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sys::in_ns(ns, "ss", &["-Hlun", "sport", "=", ":53"]).is_ok_and(|o| !o.trim().is_empty())
    {
        if Instant::now() > deadline {
            bail!("the resolver in {ns} is not listening on port 53");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn switch_fault(fault: Fault, on: bool, node: Option<u8>) -> Result<()> {
    let mut state = LabState::load()?;
    match (state.is_cluster(), fault.of_cluster()) {
        (true, true) => return cluster_fault(&mut state, fault, on, node),
        (true, false) => refuse_in_cluster(
            &state,
            &format!("{} and the single node's other faults", fault.name()),
        )?,
        (false, true) => bail!(
            "{} is a fault between nodes: bring the lab up with --nodes 3",
            fault.name()
        ),
        (false, false) if node.is_some() => {
            bail!("--node is for a cluster's faults (lab up --nodes): leave it out")
        }
        (false, false) => {}
    }
    if state.has(fault) == on {
        log::info!(target: "lab",
            "{} is already {}",
            fault.name(),
            if on { "on" } else { "off" }
        );
        return Ok(());
    }
    set_fault(&mut state, fault, on)?;
    state.save()?;
    log::info!(target: "lab", "{} {}", fault.name(), if on { "on" } else { "off" });
    Ok(())
}

/// Changes the real configuration a fault lives in.
fn set_fault(state: &mut LabState, fault: Fault, on: bool) -> Result<()> {
    if fault == Fault::NodelocaldnsLoop && state.nodelocaldns.is_none() {
        bail!("nodelocaldns-loop needs NodeLocalDNS: bring the lab up with `dnstrace lab up --nodelocaldns`");
    }
    if let Some(why) = (state.proxy_mode == ProxyMode::SocketLb)
        .then(|| socketlb::inapplicable(fault))
        .flatten()
    {
        bail!("{why}");
    }
    if on {
        warn_off_path(state, fault);
        state.faults.insert(fault);
    } else {
        state.faults.remove(&fault);
    }
    match fault {
        Fault::BridgeNfOff => {
            let value = if on { "0" } else { "1" };
            sys::sysctl(node_ns(), "net.bridge.bridge-nf-call-iptables", value)?;
            if state.ipv6 {
                sys::sysctl(node_ns(), "net.bridge.bridge-nf-call-ip6tables", value)?;
            }
            Ok(())
        }
        Fault::Drop | Fault::UpstreamTimeout | Fault::FragmentsDropped => apply_rules(state),
        Fault::NoDnat | Fault::NoDnsTcp => {
            apply_rules(state)?;
            if fault == Fault::NoDnat {
                balance(state)?;
            }
            if on {
                forget_tcp_flows(state);
            }
            Ok(())
        }
        Fault::SlowUpstream => {
            set_delay_line(state, on)?;
            apply_rules(state)
        }
        Fault::Servfail => start_upstream(state),
        Fault::SearchLeak | Fault::LoopbackNameserver => write_resolv_confs(state),
        Fault::ForwardLoop => {
            write_resolv_confs(state)?;
            reload_coredns(state)
        }
        Fault::NodelocaldnsLoop => {
            write_resolv_confs(state)?;
            reload_coredns(state)?;
            start_nodelocal(state)
        }
        // Read by `lab traffic`, which then sends A and AAAA from two CPUs at once.
        Fault::ConntrackRace => Ok(()),
        Fault::OverlayDrop | Fault::OverlayMtu | Fault::CorednsDown => {
            bail!(
                "{} is a fault between nodes: bring the lab up with --nodes 3",
                fault.name()
            )
        }
    }
}

/// Says so when `fault` misses the pods' path in this lab.
fn warn_off_path(state: &LabState, fault: Fault) {
    if let (Some(mode), Some(why)) = (state.nodelocaldns, fault.off_nodelocal_path()) {
        log::warn!(target: "lab",
            "{} changes nothing on the pods' DNS path with NodeLocalDNS ({}): their queries end on the node and its own start there, so {why}",
            fault.name(),
            mode.name()
        );
    }
}

/// Closes connections to kube-dns (and kube-dns-upstream) open through the
/// DNAT, which conntrack would keep translating: NodeLocalDNS keeps its
/// connection to CoreDNS open, and a fault on the rules must meet its next.
fn forget_tcp_flows(state: &LabState) {
    let mut services = vec![("ipv4", plan::SERVICE4.to_string())];
    if state.nodelocaldns == Some(NodeLocal::Notrack) {
        services.push(("ipv4", plan::UPSTREAM_SERVICE4.to_string()));
    }
    if state.ipv6 {
        services.push(("ipv6", plan::SERVICE6.to_string()));
    }
    for (family, service) in services {
        // It exits 1 when there was none to delete.
        let _ = sys::in_ns(
            node_ns(),
            "conntrack",
            &["-D", "-f", family, "-p", "tcp", "--orig-dst", &service],
        );
    }
}

/// What a CoreDNS reload does: read /etc/resolv.conf again, and probe for loops.
fn reload_coredns(state: &LabState) -> Result<()> {
    for pod in coredns_pods(state) {
        let pid = state
            .pids
            .get(pod.name)
            .with_context(|| format!("{} is not running", pod.full_name()))?;
        sys::hangup(*pid);
    }
    loop_probes(state)
}

/// How long a start or reload waits for the probes; unanswered ones go on
/// trying in the background, as CoreDNS's do, for 30 s.
const PROBE_WAIT: Duration = Duration::from_secs(3);

/// The loop plugin's probe from each CoreDNS pod. The lab's loop faults
/// stand for a CoreDNS without the plugin: with it, CoreDNS would exit at
/// start ("Loop ... detected").
fn loop_probes(state: &LabState) -> Result<()> {
    loop_probes_from(state, coredns_pods(state).iter())
}

fn loop_probes_from<'a>(state: &LabState, pods: impl Iterator<Item = &'a Pod>) -> Result<()> {
    if state.faults.iter().any(|f| f.is_loop()) {
        return Ok(());
    }
    let exe = std::env::current_exe().context("finding the dnstrace binary")?;
    let probes: Vec<u32> = pods
        .map(|pod| {
            sys::spawn_detached(&pod.netns(), &exe.to_string_lossy(), &["lab", "loop-probe"])
        })
        .collect::<Result<_>>()?;
    let deadline = Instant::now() + PROBE_WAIT;
    while probes.iter().any(|&p| sys::alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Kills every process of `pod` but its sandbox's, as a container's end
/// does: the resolver, and what it left running (dnsmasq's TCP children
/// hold port 53 too).
fn stop_container(state: &mut LabState, pod: &Pod) -> Result<()> {
    stop(state, pod.name);
    let pause = state.sandboxes.get(&pod.full_name()).map(|s| s.pid);
    let pids = sys::run("ip", &["netns", "pids", &pod.netns()])?;
    for pid in pids
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|&p| Some(p) != pause)
    {
        sys::kill(pid);
        wait_gone(pid);
    }
    Ok(())
}

/// `lab restart`: the steps of `restart::plan`, the new pids kept.
fn restart(state: &mut LabState, target: restart::Target) -> Result<()> {
    let forward_retries = !state.faults.iter().any(|f| f.is_loop());
    for step in restart::plan(target) {
        match step {
            restart::Step::Stop(pod) => stop_container(state, pod)?,
            restart::Step::Start(pod) => start_coredns(state, pod, forward_retries)?,
            restart::Step::WaitListening(pod) => wait_listening_in(&pod.netns())?,
            restart::Step::Probe(pod) => loop_probes_from(state, std::iter::once(pod))?,
        }
        state.save()?;
    }
    log::info!(target: "lab", "CoreDNS restarted");
    Ok(())
}

fn set_delay_line(state: &mut LabState, on: bool) -> Result<()> {
    stop(state, "delay-line");
    if on {
        let exe = std::env::current_exe().context("finding the dnstrace binary")?;
        let listen = format!("0.0.0.0:{}", faults::DELAY_LINE_PORT);
        let args = [
            "lab",
            "delay-line",
            "--listen",
            &listen,
            "--to",
            "127.0.0.1:53",
            "--delay-ms",
            &faults::SLOW_UPSTREAM_MS.to_string(),
        ];
        let pid = sys::spawn_detached(upstream_ns(), &exe.to_string_lossy(), &args)?;
        state.pids.insert("delay-line".into(), pid);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !sys::in_ns(
            upstream_ns(),
            "ss",
            &[
                "-Hlun",
                "sport",
                "=",
                &format!(":{}", faults::DELAY_LINE_PORT),
            ],
        )
        .is_ok_and(|o| !o.trim().is_empty())
        {
            if Instant::now() > deadline {
                bail!("the delay line did not start");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// Removes everything; `loud` reports what was there.
async fn down(loud: bool) -> Result<()> {
    let mut sandboxes = Vec::new();
    if let Ok(state) = LabState::load() {
        // Before the node's processes are killed: their programs detached.
        agents::stop(&state);
        for &pid in state.pids.values() {
            sys::kill(pid);
        }
        sandboxes.extend(state.sandboxes.into_values());
    }
    // Before the namespaces' processes go: containerd and its shims run
    // in the node's (each node's own, in a cluster).
    let mut had_runtime = false;
    let setups = std::iter::once(sandboxes::setup(false, Cni::default()))
        .chain(cluster::nodes(*cluster::NODES.end()).map(cluster::Node::setup));
    for setup in setups {
        had_runtime |= match sandboxes::remove_all(&setup, &sandboxes).await {
            Ok(had) => had,
            Err(e) => {
                log::warn!(target: "lab", "removing the pods through CRI failed: {e:#}");
                true
            }
        };
    }
    let namespaces = sys::lab_namespaces();
    for ns in &namespaces {
        if let Ok(pids) = sys::run("ip", &["netns", "pids", ns]) {
            pids.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .for_each(sys::kill);
        }
    }
    let had_balancer = socketlb::detach()?;
    for ns in &namespaces {
        sys::run("ip", &["netns", "del", ns])?;
        let _ = std::fs::remove_dir_all(netns_etc(ns));
    }
    if let Ok(entries) = std::fs::read_dir("/etc/netns") {
        for e in entries.flatten().filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(plan::ns_prefix())
        }) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let had_dir = lab_dir().exists();
    if had_dir {
        std::fs::remove_dir_all(lab_dir())
            .with_context(|| format!("removing {}", lab_dir().display()))?;
    }
    if loud {
        if namespaces.is_empty() && !had_dir && !had_runtime && !had_balancer {
            log::info!(target: "lab", "nothing to remove");
        } else {
            log::info!(target: "lab",
                "removed the pods (through CRI) and the lab's containerd, {} namespaces, their processes and rules, and {}",
                namespaces.len(),
                lab_dir().display()
            );
        }
    }
    Ok(())
}

/// A line into the String `out`.
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{
        $out.push_str(&format!($($arg)*));
        $out.push('\n');
    }};
}

/// `lab status`: what is up, as lines on stdout (a reader that goes away,
/// `| head`, ends it quietly).
fn status() -> Result<()> {
    let text = status_text();
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn status_text() -> String {
    let mut out = String::new();
    let namespaces = sys::lab_namespaces();
    let state = LabState::load().ok();
    if namespaces.is_empty() && state.is_none() {
        return "the lab is down\n".to_owned();
    }
    say!(out, "namespaces: {}", namespaces.join(" "));
    if let Some(state) = state {
        sandbox_lines(&state, &mut out);
        for (name, pid) in &state.pids {
            say!(
                out,
                "process {name}: pid {pid} {}",
                sys::Liveness::of(*pid).name()
            );
        }
        for line in agents::status(&state) {
            say!(out, "{line}");
        }
        let faults = state.fault_names();
        say!(
            out,
            "faults: {}",
            if faults.is_empty() {
                "none".to_owned()
            } else {
                faults.join(" ")
            }
        );
        say!(out,
            "options: ipv6={} nodelocaldns={} proxy-mode={} cluster-domain={} node-search={} host-network-client={} cni={}",
            state.ipv6,
            state.nodelocaldns.map_or("no", NodeLocal::name),
            state.proxy_mode.name(),
            state.cluster_domain,
            state
                .node_search
                .iter()
                .map(Domain::to_string)
                .collect::<Vec<_>>()
                .join(","),
            state.host_client,
            state.cni.name()
        );
    }
    out
}

/// Each pod's sandbox, addresses, and the namespace the lab and the
/// runtime know it by.
fn sandbox_lines(state: &LabState, out: &mut String) {
    if state.is_cluster() {
        for node in cluster::nodes(state.nodes) {
            say!(
                out,
                "node {}: netns {}, containerd socket {}; trace it with {}",
                node.name(),
                node.netns(),
                node.setup().socket().display(),
                node.flags()
            );
        }
    } else {
        say!(
            out,
            "pods: CRI sandboxes of the lab's containerd (socket {})",
            sandboxes::socket().display()
        );
    }
    for pod in &lab_pods(state) {
        let Some(sandbox) = state.sandboxes.get(&pod.full_name()) else {
            say!(out, "pod {}: no sandbox", pod.full_name());
            continue;
        };
        let ips = if state.ipv6 && !pod.role.host_network() {
            format!("{} {}", pod.ip4, pod.ip6)
        } else {
            pod.ip4.to_string()
        };
        let netns = sandbox.netns.as_ref().map_or_else(
            || "the node's (hostNetwork)".to_owned(),
            |n| format!("{} (lab name {})", n.display(), pod.netns()),
        );
        say!(
            out,
            "pod {}: sandbox {} ips {ips} netns {netns}",
            pod.full_name(),
            &sandbox.id[..12.min(sandbox.id.len())]
        );
    }
}

fn print_summary(state: &LabState) {
    if state.is_cluster() {
        return print_cluster_summary(state);
    }
    let pods = match state.cni {
        Cni::Bridge => format!("bridge {} {}", plan::BRIDGE, plan::POD_GW4),
        Cni::Routed => format!(
            "pods routed by the CNI ptp plugin (a /32 route each, gateway {} on each host veth)",
            plan::POD_GW4
        ),
    };
    let balancing = match state.proxy_mode {
        ProxyMode::SocketLb => format!(
            "rewritten to a CoreDNS pod at the socket by the lab's cgroup programs (proxy mode socket-lb, pinned in {})",
            socketlb::pin_dir().display()
        ),
        mode => format!(
            "DNAT to the CoreDNS pods by kube-proxy's {} rules",
            mode.name()
        ),
    };
    log::info!(target: "lab",
        "up. Node namespace {}: {pods}, kube-dns {} ({balancing})",
        node_ns(),
        plan::SERVICE4,
    );
    for pod in plan::pods(state.host_client, state.nodelocaldns.is_some()) {
        log::info!(target: "lab",
            "  {:<40} {:<12} netns {:<36} sandbox {}",
            pod.full_name(),
            pod.ip4.to_string(),
            pod.netns(),
            state
                .sandboxes
                .get(&pod.full_name())
                .map_or("", |s| &s.id[..12.min(s.id.len())])
        );
    }
    log::info!(target: "lab",
        "  upstream resolver {} (unbound) in {}",
        plan::UPSTREAM4,
        upstream_ns()
    );
    match state.nodelocaldns {
        Some(NodeLocal::LinkLocal) => log::info!(target: "lab",
            "  NodeLocalDNS {} (unbound) on the node, cluster names to kube-dns over TCP",
            plan::NODELOCAL4
        ),
        Some(NodeLocal::Notrack) => log::info!(target: "lab",
            "  NodeLocalDNS {} and {} (unbound, NOTRACK rules) on the node, cluster names to kube-dns-upstream {} over TCP",
            plan::NODELOCAL4, plan::SERVICE4, plan::UPSTREAM_SERVICE4
        ),
        None => {}
    }
    let faults: Vec<String> = state.faults.iter().map(|f| f.name()).collect();
    if !faults.is_empty() {
        log::info!(target: "lab", "faults on: {}", faults.join(" "));
    }
    log::info!(target: "lab", "try `dnstrace lab traffic`, and `dnstrace lab down` to remove it");
    log::info!(target: "lab",
        "trace one pod: dnstrace trace {}",
        runtime_flags(state.runtime)
    );
}

fn print_cluster_summary(state: &LabState) {
    log::info!(target: "lab",
        "up: {} nodes over a VXLAN overlay ({}, MTU {}) on the underlay {}; kube-dns {} DNATed on every node to the CoreDNS pods by kube-proxy's {} rules",
        state.nodes,
        cluster::VXLAN,
        cluster::OVERLAY_MTU,
        cluster::underlay_ns(),
        plan::SERVICE4,
        state.proxy_mode.name()
    );
    for placed in cluster::pods(state.nodes) {
        let pod = placed.pod;
        log::info!(target: "lab",
            "  {:<6} {:<40} {:<12} netns {}",
            placed.node.name(),
            pod.full_name(),
            pod.ip4.to_string(),
            pod.netns()
        );
    }
    log::info!(target: "lab",
        "  upstream resolver {} (unbound) in {}, behind node1",
        plan::UPSTREAM4,
        upstream_ns()
    );
    log::info!(target: "lab", "try `dnstrace lab traffic`, and `dnstrace lab down` to remove it");
    for node in cluster::nodes(state.nodes) {
        log::info!(target: "lab", "trace {}: dnstrace trace {}", node.name(), node.flags());
    }
    for line in agents::status(state) {
        log::info!(target: "lab", "{line}");
    }
}

/// The flags that point dnstrace at the lab's node and runtime state.
pub fn runtime_flags(runtime: runtime::Runtime) -> String {
    let root = match runtime {
        runtime::Runtime::Containerd => format!(
            "--containerd-root {} --cri-socket {}",
            sandboxes::state_dir().display(),
            sandboxes::socket().display()
        ),
        runtime::Runtime::Crio => format!("--crio-root {}", runtime::crio_root().display()),
    };
    format!("--node-netns /run/netns/{} {root} --pod web", node_ns())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_lb_refuses_what_it_cannot_be_combined_with_before_building() {
        let socket_lb = || LabState {
            proxy_mode: ProxyMode::SocketLb,
            ..LabState::default()
        };
        assert!(check_options(&socket_lb(), &[Fault::NoDnat, Fault::Drop]).is_ok());
        for (state, faults) in [
            (socket_lb(), vec![Fault::BridgeNfOff]),
            (socket_lb(), vec![Fault::NoDnsTcp]),
            (
                LabState {
                    ipv6: true,
                    ..socket_lb()
                },
                vec![],
            ),
            (
                LabState {
                    nodelocaldns: Some(NodeLocal::Notrack),
                    ..socket_lb()
                },
                vec![],
            ),
        ] {
            assert!(
                check_options(&state, &faults).is_err(),
                "{state:?} {faults:?}"
            );
        }
        let iptables = LabState {
            ipv6: true,
            ..LabState::default()
        };
        assert!(check_options(&iptables, &[Fault::BridgeNfOff]).is_ok());
    }
}
