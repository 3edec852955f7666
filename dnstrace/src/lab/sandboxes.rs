//! The lab's pods as real CRI sandboxes in the lab's own containerd
//! (`containerd`), made as the kubelet makes them: metadata, labels,
//! annotations, DNS config, and the node's network for hostNetwork pods.
//! The lab runs each pod's processes in its sandbox's network namespace
//! under a name of its own (`ip netns attach dtlab-<pod>`), and its
//! resolv.conf is the one the runtime wrote (linked where `Pod::resolv_conf`
//! says, so the lab's faults rewrite the runtime's file).
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv6Addr},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use super::{
    containerd::{self, Addresses, CniPlugin, Setup, Subnet6},
    plan::{self, lab_dir, node_ns, Cni, Pod, Role},
    sys,
};
use crate::pods::cri::sandbox::{Dns, SandboxRequest};

/// The pods' subnets on the bridge: the node's /24 (and /64) of the
/// cluster's pod CIDR, the bridge its first address (`plan::POD_GW4`).
const SUBNET4: &str = "10.244.0.0/24";
const SUBNET6_BASE: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 0, 0, 0, 0, 0);
const SUBNET6_PREFIX: u8 = 64;

/// What the lab keeps of a pod's sandbox.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Sandbox {
    pub id: String,
    /// The runtime's name for its network namespace (`/var/run/netns/cni-...`);
    /// None for a hostNetwork pod.
    pub netns: Option<PathBuf>,
    /// Its pause process.
    pub pid: u32,
}

/// containerd's state directory, where its shims keep the task bundles:
/// what `--containerd-root` takes.
pub fn state_dir() -> PathBuf {
    lab_dir().join("containerd")
}

/// The lab's containerd: config, socket, root and IPAM under the lab's cri/,
/// run in the node's namespace, its pods wired as `cni` says.
pub fn setup(ipv6: bool, cni: Cni) -> Setup {
    Setup {
        plugin: match cni {
            Cni::Bridge => CniPlugin::Bridge,
            Cni::Routed => CniPlugin::Ptp,
        },
        dir: lab_dir().join("cri"),
        state: state_dir(),
        netns: Some(node_ns().to_owned()),
        bridge: plan::BRIDGE.to_owned(),
        subnet: SUBNET4.parse().expect("a subnet"),
        subnet6: ipv6.then_some(Subnet6 {
            base: SUBNET6_BASE,
            prefix: SUBNET6_PREFIX,
        }),
        mtu: None,
    }
}

/// The lab's CRI socket: what `--cri-socket` takes.
pub fn socket() -> PathBuf {
    setup(false, Cni::default()).socket()
}

/// Starts the lab's containerd and runs `pods` in it, in order, each on
/// its planned addresses and with its DNS config; the sandboxes by pod.
pub async fn run_all(
    pods: &[(&Pod, Dns)],
    ipv6: bool,
    cni: Cni,
) -> Result<BTreeMap<String, Sandbox>> {
    run_all_in(&setup(ipv6, cni), pods, ipv6).await
}

/// Starts the containerd of `setup` and runs `pods` in it, as `run_all`.
pub async fn run_all_in(
    setup: &Setup,
    pods: &[(&Pod, Dns)],
    ipv6: bool,
) -> Result<BTreeMap<String, Sandbox>> {
    let mut runtime = containerd::start(setup).await?;
    let mut sandboxes = BTreeMap::new();
    for (pod, dns) in pods {
        let addresses = Addresses {
            v4: pod.ip4,
            v6: ipv6.then_some(pod.ip6),
        };
        let request = request(setup, pod, dns);
        let (id, found, _) = runtime
            .run_pod_at(&request, addresses)
            .await
            .with_context(|| format!("running {}", pod.full_name()))?;
        let pid = found
            .pid
            .with_context(|| format!("{}: no sandbox process", pod.full_name()))?;
        if !pod.role.host_network() {
            sys::run("ip", &["netns", "attach", &pod.netns(), &pid.to_string()])?;
        }
        let resolv = found
            .resolv_conf
            .with_context(|| format!("{}: no resolv.conf mounted", pod.full_name()))?;
        link(&resolv, &pod.resolv_conf())?;
        let netns = found.netns;
        sandboxes.insert(pod.full_name(), Sandbox { id, netns, pid });
    }
    Ok(sandboxes)
}

/// Removes the pods through CRI and stops the containerd of `setup`, if it runs;
/// whether there was one. A containerd that no longer answers (killed) has
/// its leftovers removed by hand: its processes, the mounts under the lab's
/// directory, and what `sandboxes` had outside it.
pub async fn remove_all(setup: &Setup, sandboxes: &[Sandbox]) -> Result<bool> {
    if !setup.dir.join("containerd.pid").exists() {
        return Ok(false);
    }
    match containerd::attach(setup).await {
        Ok(runtime) => runtime.stop().await?,
        Err(e) => {
            log::warn!(target: "lab", "the lab's containerd does not answer ({e:#}): removing what it left");
            remove_left(setup, sandboxes)?;
        }
    }
    Ok(true)
}

/// What a dead containerd leaves: its shims (which name its socket) and
/// their sockets, the mounts under the lab's directory (deepest first),
/// and the sandboxes' namespaces and cached CNI results.
fn remove_left(setup: &Setup, sandboxes: &[Sandbox]) -> Result<()> {
    let socket = setup.socket().display().to_string();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&socket) {
            sys::kill(pid);
        }
    }
    // /var/run is /run: mountinfo says the latter.
    let netns: Vec<PathBuf> = sandboxes
        .iter()
        .filter_map(|s| s.netns.as_ref()?.file_name())
        .map(|name| Path::new("/run/netns").join(name))
        .collect();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut mounts: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|m| m.starts_with(lab_dir()) || netns.contains(m))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for mount in &mounts {
        sys::unmount(mount)?;
    }
    for path in &netns {
        let _ = std::fs::remove_file(path);
    }
    for sandbox in sandboxes {
        let _ = std::fs::remove_file(containerd::shim_socket(setup, &sandbox.id));
        for cached in containerd::cni_results(setup, &sandbox.id) {
            let _ = std::fs::remove_file(cached);
        }
    }
    containerd::remove_outside();
    Ok(())
}

/// `pod` as the kubelet asks for it.
fn request(setup: &Setup, pod: &Pod, dns: &Dns) -> SandboxRequest {
    let uid = pod.uid();
    let host_network = pod.role.host_network();
    SandboxRequest {
        namespace: pod.namespace.to_owned(),
        name: pod.name.to_owned(),
        // The node's, in its UTS namespace: the kubelet gives none.
        hostname: if host_network {
            String::new()
        } else {
            pod.name.to_owned()
        },
        labels: labels(pod),
        annotations: BTreeMap::from([("kubernetes.io/config.source".into(), "api".into())]),
        dns: dns.clone(),
        host_network,
        log_directory: setup
            .dir
            .join("pods")
            .join(format!("{}_{}_{uid}", pod.namespace, pod.name)),
        uid,
    }
}

/// The labels its controller gives `pod`: a Deployment's pods carry the
/// app's label and the ReplicaSet's `pod-template-hash` (their name's
/// middle part), the DaemonSet's its revision and generation.
fn labels(pod: &Pod) -> BTreeMap<String, String> {
    // The name less its random suffix: the ReplicaSet's, or the DaemonSet's.
    let owner = pod
        .name
        .rsplit_once('-')
        .map_or(pod.name, |(owner, _)| owner);
    let deployment = owner.rsplit_once('-');
    let pairs: Vec<(&str, &str)> = match (pod.role, deployment) {
        (Role::CoreDns, Some((_, hash))) => {
            vec![("k8s-app", "kube-dns"), ("pod-template-hash", hash)]
        }
        (Role::Client, Some((app, hash))) => vec![("app", app), ("pod-template-hash", hash)],
        (Role::HostClient | Role::NodeLocalDns, _) => vec![
            ("k8s-app", owner),
            ("controller-revision-hash", "6b8d4f7c9"),
            ("pod-template-generation", "1"),
        ],
        _ => Vec::new(),
    };
    pairs
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The DNS config the kubelet gives a pod: its resolv.conf's servers,
/// search list and options.
pub fn dns(server: IpAddr, searches: Vec<String>, ndots: bool) -> Dns {
    Dns {
        servers: vec![server],
        searches,
        options: ndots.then(|| "ndots:5".to_owned()).into_iter().collect(),
    }
}

/// `at` made a link to `target`, its directory made first.
fn link(target: &Path, at: &Path) -> Result<()> {
    if let Some(dir) = at.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(at);
    std::os::unix::fs::symlink(target, at)
        .with_context(|| format!("linking {} to {}", at.display(), target.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::workload::Workload;

    fn workload(pod: &Pod) -> Option<String> {
        Workload::of(pod.name, &labels(pod)).map(|w| w.to_string())
    }

    #[test]
    fn the_pods_carry_their_controllers_labels() {
        let workloads: Vec<Option<String>> = plan::pods(true, true).map(workload).collect();
        assert_eq!(
            workloads,
            [
                "Deployment/web",
                "Deployment/checkout",
                "Deployment/coredns",
                "Deployment/coredns",
                "DaemonSet/fluent-bit",
                "DaemonSet/node-local-dns",
            ]
            .map(|w| Some(w.to_owned()))
        );
        assert_eq!(labels(&plan::PODS[2])["k8s-app"], "kube-dns");
    }

    #[test]
    fn the_lab_runtime_lives_under_the_lab_directory_on_the_bridge_subnets() {
        let dual = setup(true, Cni::Bridge);
        assert!(dual.dir.starts_with(lab_dir()) && dual.state.starts_with(lab_dir()));
        assert_eq!(dual.subnet.to_string(), SUBNET4);
        assert_eq!(
            dual.subnet6.map(|s| s.to_string()).as_deref(),
            Some("fd00:10:244::/64")
        );
        assert!(setup(false, Cni::Bridge).subnet6.is_none());
        assert_eq!(setup(false, Cni::Routed).plugin, CniPlugin::Ptp);
    }
}
