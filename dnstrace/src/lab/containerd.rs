//! A real containerd (Debian's 1.6, with its CRI plugin), started privately:
//! its own root, state, socket, config and CNI network under its directories,
//! never the machine's own containerd. `lab up` runs the lab's pods in it
//! (`sandboxes`) through the CRI API as the kubelet does, on the real CNI
//! `bridge` plugin with `host-local` addresses. No registry is reachable, so the sandbox (pause)
//! image is built here from busybox-static and imported.
//!
//! Facts of containerd 1.6 this follows:
//! - root lacks CAP_SYS_RESOURCE here, and runc fails to give the pause
//!   process its `oom_score_adj` of -998: `restrict_oom_score_adj` keeps
//!   it at containerd's own;
//! - the shims' sockets go under `/run/containerd/s/` whatever `state`
//!   says, and CNI caches results under `/var/lib/cni/results/`: `stop`
//!   removes those directories where they are left empty;
//! - the bridge plugin never deletes its bridge: `stop` does;
//! - its CRI plugin reloads the CNI config when a file is renamed in its
//!   directory, and says what it loaded in its verbose status
//!   (`cniconfig`): `run_pod_at` pins a pod's addresses that way, with
//!   host-local's own range limits.
use std::{
    fs::File,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use super::sys;
use crate::pods::{
    cri::{sandbox::SandboxRequest, Cri},
    Metadata, Pod,
};

/// The sandbox image, built and imported at start.
const PAUSE_IMAGE: &str = "dnstrace.local/pause:lab";
/// Where Debian's packages put what this needs, and which package.
const NEEDS: &[(&str, &str)] = &[
    ("/usr/bin/containerd", "containerd"),
    ("/usr/bin/ctr", "containerd"),
    ("/usr/sbin/runc", "runc"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/lib/cni/ptp", "containernetworking-plugins"),
    ("/usr/lib/cni/host-local", "containernetworking-plugins"),
    ("/usr/lib/cni/loopback", "containernetworking-plugins"),
    ("/bin/busybox", "busybox-static"),
];
const CNI_BIN: &str = "/usr/lib/cni";
/// What containerd 1.6 makes outside its own directories, deepest first:
/// its shims' sockets go under /run/containerd/s whatever its state is,
/// and CNI (libcni) caches results under /var/lib/cni.
const MADE_OUTSIDE: &[&str] = &[
    "/run/containerd/s",
    "/run/containerd",
    "/var/lib/cni/results",
    "/var/lib/cni",
];
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The CRI plugin reloads a changed CNI config within milliseconds.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(10);
const NETWORK_FILE: &str = "10-dnstrace.conflist";
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how the private containerd runs.
#[derive(Clone, Debug)]
pub struct Setup {
    /// Everything of this containerd lives here; `stop` removes it.
    pub dir: PathBuf,
    /// Its state directory (the shims' task bundles, which `dnstrace pods`
    /// reads): under `dir` or beside it; `stop` removes it too.
    pub state: PathBuf,
    /// The network namespace (its name under /run/netns) containerd, so
    /// its CNI bridge, runs in: the node's; None for this process's own.
    pub netns: Option<String>,
    /// How pods are wired to the node.
    pub plugin: CniPlugin,
    /// The CNI network's name (and the bridge's, with `CniPlugin::Bridge`),
    /// and the pods' IPv4 subnet on it.
    pub bridge: String,
    pub subnet: Subnet,
    /// The pods' IPv6 subnet, for a dual-stack network.
    pub subnet6: Option<Subnet6>,
    /// The pods' MTU, where the node's network is an overlay (the bridge
    /// plugin's `mtu`); None: the link's default.
    pub mtu: Option<u32>,
}

/// An IPv4 subnet, `10.245.0.0/24`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subnet {
    pub base: Ipv4Addr,
    pub prefix: u8,
}

impl std::str::FromStr for Subnet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: expected an IPv4 subnet, e.g. 10.245.0.0/24");
        let (base, prefix) = s.split_once('/').ok_or_else(bad)?;
        let base = base.parse().map_err(|_| bad())?;
        let prefix = prefix.parse().ok().filter(|p| *p <= 32).ok_or_else(bad)?;
        Ok(Self { base, prefix })
    }
}

impl std::fmt::Display for Subnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

/// The CNI plugin that wires pods to the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CniPlugin {
    /// `bridge`: each pod's host veth a port of one bridge, its gateway.
    Bridge,
    /// `ptp`: each host veth alone, holding the gateway's address, with a
    /// route to its pod: packets between pods are routed.
    Ptp,
}

/// An IPv6 subnet, `fd00:10:244::/64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subnet6 {
    pub base: Ipv6Addr,
    pub prefix: u8,
}

impl std::fmt::Display for Subnet6 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

/// The addresses a pod is to get: host-local's range pinned to them.
#[derive(Clone, Copy, Debug)]
pub struct Addresses {
    pub v4: Ipv4Addr,
    pub v6: Option<Ipv6Addr>,
}

impl Setup {
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    fn pid_file(&self) -> PathBuf {
        self.dir.join("containerd.pid")
    }

    fn config(&self) -> PathBuf {
        self.dir.join("config.toml")
    }

    fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("net.d")
    }
}

/// The running containerd, through its CRI socket.
pub struct Containerd {
    setup: Setup,
    cri: Cri,
}

/// Starts containerd in `setup.dir` (which must not hold one already) and
/// imports the pause image.
pub async fn start(setup: &Setup) -> Result<Containerd> {
    require_packages()?;
    if setup.pid_file().exists() {
        bail!(
            "{} already holds a containerd: stop it first",
            setup.dir.display()
        );
    }
    write_files(setup)?;
    spawn(setup)?;
    let mut cri = connect_when_up(setup).await?;
    import_pause_image(setup)?;
    pause_image_known(&mut cri).await?;
    Ok(Containerd {
        setup: setup.clone(),
        cri,
    })
}

/// The containerd `start` left running in `setup.dir`.
pub async fn attach(setup: &Setup) -> Result<Containerd> {
    let cri = Cri::connect(&setup.socket()).await?;
    Ok(Containerd {
        setup: setup.clone(),
        cri,
    })
}

impl Containerd {
    /// Runs a pod sandbox; its id.
    pub async fn run_pod(&mut self, request: &SandboxRequest) -> Result<String> {
        std::fs::create_dir_all(&request.log_directory)
            .with_context(|| format!("creating {}", request.log_directory.display()))?;
        self.cri.run_pod(request).await
    }

    #[cfg_attr(
        not(feature = "harness"),
        allow(dead_code, reason = "the tests' cri-lab removes one pod")
    )]
    pub async fn remove_pod(&mut self, id: &str) -> Result<()> {
        self.cri.remove_pod(id).await
    }

    /// Runs a pod sandbox on `addresses`: the CNI config is rewritten with
    /// host-local's range limited to them, and used once the CRI plugin
    /// says it has loaded it. Its id, and the pod as the CRI sees it.
    pub async fn run_pod_at(
        &mut self,
        request: &SandboxRequest,
        addresses: Addresses,
    ) -> Result<(String, Pod, Metadata)> {
        if !request.host_network {
            self.use_network(&cni_network(&self.setup, Some(addresses)))
                .await?;
        }
        let id = self.run_pod(request).await?;
        let (pod, metadata) = self.cri.pod(&id).await?;
        let wanted = IpAddr::V4(addresses.v4);
        if !request.host_network && !metadata.ips.contains(&wanted) {
            bail!(
                "{}/{} got {:?}, not {wanted}",
                request.namespace,
                request.name,
                metadata.ips
            );
        }
        Ok((id, pod, metadata))
    }

    /// Replaces the CNI config with `network` and waits until the CRI
    /// plugin has loaded it. It reloads on a rename in its directory (not
    /// on a file created there), and reads only `.conf*` and `.json` files.
    async fn use_network(&mut self, network: &serde_json::Value) -> Result<()> {
        let next = self.setup.cni_conf_dir().join("network.next");
        write(&next, &serde_json::to_string_pretty(network)?)?;
        let path = self.setup.cni_conf_dir().join(NETWORK_FILE);
        std::fs::rename(&next, &path).with_context(|| format!("replacing {}", path.display()))?;
        let asked = Instant::now();
        while !self.loaded(network).await? {
            if asked.elapsed() > RELOAD_TIMEOUT {
                let loaded = self.cri.status_info("cniconfig").await?;
                bail!(
                    "containerd did not load the new {} within {RELOAD_TIMEOUT:?}; it has {loaded:?}",
                    path.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// The CRI plugin's loaded networks include `network`.
    async fn loaded(&mut self, network: &serde_json::Value) -> Result<bool> {
        let Some(text) = self.cri.status_info("cniconfig").await? else {
            return Ok(false);
        };
        let config: serde_json::Value =
            serde_json::from_str(&text).context("containerd's cniconfig status")?;
        let loaded = config["Networks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n["Config"]["Source"].as_str())
            .filter_map(|source| serde_json::from_str::<serde_json::Value>(source).ok())
            .any(|source| &source == network);
        Ok(loaded)
    }

    /// Removes every pod left, stops containerd, and removes what it
    /// leaves: the bridge, the shims' socket directory, `state` and `dir`.
    pub async fn stop(mut self) -> Result<()> {
        for id in self.cri.sandbox_ids().await? {
            self.cri.remove_pod(&id).await?;
        }
        drop(self.cri);
        stop_process(&self.setup.pid_file()).await?;
        remove_bridge(&self.setup)?;
        remove_empty_dirs(MADE_OUTSIDE);
        if self.setup.state.exists() {
            remove_dir(&self.setup.state)?;
        }
        remove_dir(&self.setup.dir)
    }
}

fn require_packages() -> Result<()> {
    for (path, package) in NEEDS {
        if !Path::new(path).exists() {
            bail!(
                "a real containerd needs {path}, which is not installed: apt-get install {package}"
            );
        }
    }
    Ok(())
}

fn write_files(setup: &Setup) -> Result<()> {
    let conf_dir = setup.cni_conf_dir();
    std::fs::create_dir_all(&conf_dir)
        .with_context(|| format!("creating {}", conf_dir.display()))?;
    write(&setup.config(), &config_toml(setup))?;
    let network = serde_json::to_string_pretty(&cni_network(setup, None))?;
    write(&conf_dir.join(NETWORK_FILE), &network)
}

/// containerd's config: everything under `dir`, the CRI plugin on the
/// pause image and the CNI network of its own.
fn config_toml(setup: &Setup) -> String {
    let dir = setup.dir.display();
    let state = setup.state.display();
    let socket = setup.socket();
    let socket = socket.display();
    let conf_dir = setup.cni_conf_dir();
    let conf_dir = conf_dir.display();
    format!(
        r#"version = 2
root = "{dir}/root"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{conf_dir}"
  max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  Root = "{dir}/runc"
"#
    )
}

/// The pods' network: the bridge or ptp plugin, the node side the gateway,
/// with host-local addresses kept under `dir` (not /var/lib/cni), from the
/// whole subnets or only from `at`. No masquerade: that would leave
/// iptables chains on the node.
fn cni_network(setup: &Setup, at: Option<Addresses>) -> serde_json::Value {
    let pinned = |range: &mut serde_json::Value, ip: Option<String>| {
        if let Some(ip) = ip {
            range["rangeStart"] = json!(ip);
            range["rangeEnd"] = json!(ip);
        }
    };
    let mut v4 = json!({ "subnet": setup.subnet.to_string() });
    pinned(&mut v4, at.map(|a| a.v4.to_string()));
    let mut ranges = vec![json!([v4])];
    let mut routes = vec![json!({ "dst": "0.0.0.0/0" })];
    if let Some(subnet6) = setup.subnet6 {
        let mut v6 = json!({ "subnet": subnet6.to_string() });
        pinned(&mut v6, at.and_then(|a| a.v6).map(|ip| ip.to_string()));
        ranges.push(json!([v6]));
        routes.push(json!({ "dst": "::/0" }));
    }
    let ipam = json!({
        "type": "host-local",
        "ranges": ranges,
        "routes": routes,
        "dataDir": setup.dir.join("ipam"),
    });
    let plugin = match setup.plugin {
        CniPlugin::Bridge => {
            let mut bridge = json!({
                "type": "bridge",
                "bridge": setup.bridge,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": ipam,
            });
            if let Some(mtu) = setup.mtu {
                bridge["mtu"] = json!(mtu);
            }
            bridge
        }
        CniPlugin::Ptp => json!({ "type": "ptp", "ipMasq": false, "ipam": ipam }),
    };
    json!({
        "cniVersion": "0.4.0",
        "name": setup.bridge,
        "plugins": [plugin]
    })
}

/// containerd in its own session (it outlives a short-lived caller), in
/// the node's network namespace, its output in `dir/containerd.log`.
fn spawn(setup: &Setup) -> Result<()> {
    let log = File::create(setup.dir.join("containerd.log")).context("creating containerd.log")?;
    let netns = setup
        .netns
        .as_ref()
        .map(|name| {
            let path = Path::new("/run/netns").join(name);
            File::open(&path).with_context(|| format!("opening {}", path.display()))
        })
        .transpose()?;
    let mut cmd = Command::new("containerd");
    cmd.arg("--config")
        .arg(setup.config())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: only async-signal-safe calls (setsid, setns) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if let Some(ns) = &netns {
                if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn().context("starting containerd")?;
    write(&setup.pid_file(), &child.id().to_string())
}

async fn connect_when_up(setup: &Setup) -> Result<Cri> {
    let started = Instant::now();
    loop {
        match Cri::connect(&setup.socket()).await {
            Ok(cri) => return Ok(cri),
            Err(e) if started.elapsed() > START_TIMEOUT => {
                let log =
                    std::fs::read_to_string(setup.dir.join("containerd.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                bail!("containerd did not answer on its CRI socket: {e:#}; its log ends: {tail:?}");
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Waits until the CRI knows the imported pause image. containerd's CRI
/// learns of images from its events, after `ctr import` returns; a pod run
/// before then makes it pull the image from the network, and fail.
async fn pause_image_known(cri: &mut Cri) -> Result<()> {
    let started = Instant::now();
    while !cri.has_image(PAUSE_IMAGE).await? {
        if started.elapsed() > START_TIMEOUT {
            bail!("containerd's CRI does not know the pause image {PAUSE_IMAGE} it imported");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Builds the pause image (busybox-static sleeping until killed) as an
/// OCI image layout tarball and imports it into the CRI's namespace.
fn import_pause_image(setup: &Setup) -> Result<()> {
    let build = setup.dir.join("pause");
    let rootfs = build.join("rootfs/bin");
    std::fs::create_dir_all(&rootfs).context("creating the pause image's rootfs")?;
    std::fs::copy("/bin/busybox", rootfs.join("busybox")).context("copying busybox")?;
    let layout = build.join("layout");
    std::fs::create_dir_all(layout.join("blobs/sha256")).context("creating the image layout")?;
    let layer = build.join("layer.tar");
    let rootfs_top = build.join("rootfs");
    tar(&rootfs_top, &layer)?;
    let layer = std::fs::read(&layer).context("reading the pause layer")?;
    let layer_digest = blob(&layout, &layer)?;
    let config = json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": { "Entrypoint": ["/bin/busybox", "sleep", "2147483647"] },
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
    });
    let config = serde_json::to_vec(&config)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &blob(&layout, &config)?, config.len()),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", &layer_digest, layer.len())],
    });
    let manifest = serde_json::to_vec(&manifest)?;
    let mut entry = descriptor(
        "application/vnd.oci.image.manifest.v1+json",
        &blob(&layout, &manifest)?,
        manifest.len(),
    );
    entry["annotations"] = json!({ "io.containerd.image.name": PAUSE_IMAGE });
    let index = json!({ "schemaVersion": 2, "manifests": [entry] });
    write(&layout.join("index.json"), &index.to_string())?;
    write(
        &layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    let image = build.join("pause.tar");
    tar(&layout, &image)?;
    let socket = setup.socket();
    let socket = socket.to_str().context("a socket path in UTF-8")?;
    let image = image.to_str().context("an image path in UTF-8")?;
    sys::run(
        "ctr",
        &[
            "--address",
            socket,
            "-n",
            "k8s.io",
            "images",
            "import",
            image,
        ],
    )?;
    Ok(())
}

fn tar(dir: &Path, out: &Path) -> Result<()> {
    let dir = dir.to_str().context("a path in UTF-8")?;
    let out = out.to_str().context("a path in UTF-8")?;
    sys::run(
        "tar",
        &[
            "--numeric-owner",
            "--owner=0",
            "--group=0",
            "-C",
            dir,
            "-cf",
            out,
            ".",
        ],
    )?;
    Ok(())
}

/// Stores `data` as a blob of the layout; its digest.
fn blob(layout: &Path, data: &[u8]) -> Result<String> {
    let hex: String = Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let path = layout.join("blobs/sha256").join(&hex);
    std::fs::write(&path, data).with_context(|| format!("writing {}", path.display()))?;
    Ok(format!("sha256:{hex}"))
}

fn descriptor(media_type: &str, digest: &str, size: usize) -> serde_json::Value {
    json!({ "mediaType": media_type, "digest": digest, "size": size })
}

/// The OCI name of this machine's architecture.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// SIGTERM to the process in `pid_file`, then SIGKILL if it lingers.
async fn stop_process(pid_file: &Path) -> Result<()> {
    let text = std::fs::read_to_string(pid_file)
        .with_context(|| format!("reading {}", pid_file.display()))?;
    let pid: libc::pid_t = text.trim().parse().context("containerd's pid")?;
    // SAFETY: signals to the pid we started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let asked = Instant::now();
    while !gone(pid) {
        if asked.elapsed() > STOP_TIMEOUT {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The process has exited (reaped here if it is our child).
fn gone(pid: libc::pid_t) -> bool {
    // SAFETY: WNOHANG never blocks; a pid not our child is ECHILD.
    if unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) } == pid {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => true,
    }
}

/// The bridge plugin leaves its bridge after the last pod.
fn remove_bridge(setup: &Setup) -> Result<()> {
    let bridge = setup.bridge.as_str();
    let ip = |args: &[&str]| match &setup.netns {
        Some(ns) => sys::run("ip", &[&["-n", ns.as_str()], args].concat()),
        None => sys::run("ip", args),
    };
    if ip(&["link", "show", bridge]).is_ok() {
        ip(&["link", "del", bridge])?;
    }
    Ok(())
}

/// Where containerd 1.6 puts the socket of the shim of task `id` in the
/// CRI's namespace: named by the SHA-256 of `<address>/k8s.io/<id>`.
pub fn shim_socket(setup: &Setup, id: &str) -> PathBuf {
    let key = format!("{}/k8s.io/{id}", setup.socket().display());
    let hex: String = Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Path::new(MADE_OUTSIDE[0]).join(hex)
}

/// libcni's cached results of sandbox `id`: its network's and loopback's.
pub fn cni_results(setup: &Setup, id: &str) -> [PathBuf; 2] {
    let dir = Path::new(MADE_OUTSIDE[2]);
    [
        dir.join(format!("{}-{id}-eth0", setup.bridge)),
        dir.join(format!("cni-loopback-{id}-lo")),
    ]
}

/// Removes what containerd made outside its directories, where it is left
/// empty.
pub fn remove_outside() {
    remove_empty_dirs(MADE_OUTSIDE);
}

/// Removes each of `dirs` that is empty: one still holding something is
/// another runtime's, and stays.
fn remove_empty_dirs(dirs: &[&str]) {
    for dir in dirs {
        let _ = std::fs::remove_dir(dir);
    }
}

/// Removes `dir` once nothing is mounted under it: a mount left is an
/// error, not a recursive removal into it.
fn remove_dir(dir: &Path) -> Result<()> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    let under: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .collect();
    if !under.is_empty() {
        bail!(
            "still mounted under {}: {}",
            dir.display(),
            under.join(", ")
        );
    }
    std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> Setup {
        Setup {
            dir: "/run/dnstrace-lab/cri".into(),
            state: "/run/dnstrace-lab/cri/state".into(),
            netns: Some("dtlab-node".into()),
            plugin: CniPlugin::Bridge,
            bridge: "cni0".into(),
            subnet: "10.244.0.0/16".parse().unwrap(),
            subnet6: None,
            mtu: None,
        }
    }

    #[test]
    fn a_subnet_reads_and_shows_alike_and_rejects_what_is_not_one() {
        let subnet: Subnet = "10.245.0.0/24".parse().unwrap();
        assert_eq!(subnet.to_string(), "10.245.0.0/24");
        for bad in ["10.245.0.0", "10.245.0.0/33", "fd00::/64", "x/8"] {
            assert!(bad.parse::<Subnet>().is_err(), "{bad}");
        }
    }

    #[test]
    fn everything_containerd_keeps_is_under_its_directory() {
        let config = config_toml(&setup());
        for key in ["root", "state", "address", "path", "conf_dir", "Root"] {
            for line in config
                .lines()
                .filter(|l| l.trim_start().starts_with(&format!("{key} = ")))
            {
                assert!(line.contains("\"/run/dnstrace-lab/cri/"), "{line}");
            }
        }
        assert!(config.contains("restrict_oom_score_adj = true"));
        assert!(config.contains(&format!("sandbox_image = \"{PAUSE_IMAGE}\"")));
        let network = cni_network(&setup(), None);
        let bridge = &network["plugins"][0];
        assert_eq!(bridge["bridge"], "cni0");
        assert_eq!(bridge["ipMasq"], false, "no iptables rules left behind");
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.244.0.0/16");
        assert_eq!(bridge["ipam"]["dataDir"], "/run/dnstrace-lab/cri/ipam");
    }

    #[test]
    fn a_pinned_network_limits_each_range_to_the_pod_addresses() {
        let mut dual = setup();
        dual.subnet6 = Some(Subnet6 {
            base: "fd00:10:244::".parse().unwrap(),
            prefix: 64,
        });
        let at = Addresses {
            v4: Ipv4Addr::new(10, 244, 0, 53),
            v6: Some("fd00:10:244::53".parse().unwrap()),
        };
        let network = cni_network(&dual, Some(at));
        let ipam = &network["plugins"][0]["ipam"];
        let v4 = &ipam["ranges"][0][0];
        assert_eq!(
            (&v4["rangeStart"], &v4["rangeEnd"]),
            (&json!("10.244.0.53"), &json!("10.244.0.53"))
        );
        let v6 = &ipam["ranges"][1][0];
        assert_eq!(v6["subnet"], "fd00:10:244::/64");
        assert_eq!(v6["rangeEnd"], "fd00:10:244::53");
        assert_eq!(ipam["routes"][1]["dst"], "::/0");
        let free = cni_network(&dual, None);
        assert!(free["plugins"][0]["ipam"]["ranges"][0][0]
            .get("rangeStart")
            .is_none());
    }
}
