//! `lab up --nodes N --agents`: the DaemonSet on the lab. One `dnstrace
//! agent` per node, in the node's network namespace as its hostNetwork
//! pod is, serving cluster views with mutual TLS on the node's underlay
//! address, with a certificate made as docs/CLUSTER.md makes the Secret;
//! CoreDNS gives their headless Service. `lab exec` runs a command as in
//! a node's agent pod, as `kubectl exec -n dnstrace ds/dnstrace` does.
use std::{
    fs::File,
    io::{BufRead as _, BufReader},
    net::Ipv4Addr,
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{
    cluster::{self, Node},
    plan::{self, lab_dir, Domain},
    resolvers, sys, LabState,
};
use crate::commands::agent::api::PORT as API_PORT;

/// The agent's metrics port, as the DaemonSet's.
const METRICS_PORT: u16 = 9355;
/// How long an agent has to attach its programs (a debug build, on a
/// machine shared with other labs, takes seconds).
const READY_WAIT: Duration = Duration::from_secs(60);
/// How long a stopped agent has to detach its programs before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// Everything of the agents: the Secret's files, ready files, the pod's
/// resolv.conf and PATH.
fn dir() -> PathBuf {
    lab_dir().join("agents")
}

/// The Secret dnstrace-api's files, as mounted in the pod.
pub struct Secret {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

pub fn secret() -> Secret {
    let d = dir();
    Secret {
        cert: d.join("agent.pem"),
        key: d.join("agent.key"),
        ca: d.join("ca.pem"),
    }
}

/// The agents' addresses: each node's on the underlay.
pub fn addresses(nodes: u8) -> Vec<Ipv4Addr> {
    cluster::nodes(nodes).map(Node::underlay).collect()
}

fn log_name(node: Node) -> String {
    format!("agent-{}", node.name())
}

fn ready_file(node: Node) -> PathBuf {
    dir().join(format!("{}.ready", node.name()))
}

/// Makes the Secret, the pod's files, and starts an agent on every node,
/// each pid kept in `state` as it starts; returns once all are ready.
pub fn start(state: &mut LabState) -> Result<()> {
    sys::require("openssl", "openssl")?;
    std::fs::create_dir_all(dir())?;
    make_secret()?;
    write_pod_files(state)?;
    let exe = std::env::current_exe().context("finding the dnstrace binary")?;
    for node in cluster::nodes(state.nodes) {
        let pid = spawn(&exe, node)?;
        state.agent_pids.insert(node.name(), pid);
        state.save()?;
    }
    for node in cluster::nodes(state.nodes) {
        wait_ready(node, state.agent_pids[&node.name()])?;
    }
    Ok(())
}

/// A CA and one certificate for the agents, good for both ends, with
/// docs/CLUSTER.md's commands.
fn make_secret() -> Result<()> {
    let d = dir();
    let at = |name: &str| d.join(name).display().to_string();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let ca = [&["req", "-x509"][..], &ec, &["-nodes", "-days", "365"]].concat();
    let (ca_key, ca_pem) = (at("ca.key"), at("ca.pem"));
    let ca_out = [
        "-subj",
        "/CN=dnstrace CA",
        "-keyout",
        &ca_key,
        "-out",
        &ca_pem,
    ];
    sys::run("openssl", &[&ca[..], &ca_out].concat())?;
    let (key, csr, ext, pem) = (
        at("agent.key"),
        at("agent.csr"),
        at("agent.ext"),
        at("agent.pem"),
    );
    let req = [
        &["req"][..],
        &ec,
        &["-nodes", "-subj", "/CN=dnstrace-agent"],
    ]
    .concat();
    sys::run(
        "openssl",
        &[&req[..], &["-keyout", &key, "-out", &csr]].concat(),
    )?;
    std::fs::write(
        &ext,
        "subjectAltName=DNS:dnstrace-agent\nextendedKeyUsage=serverAuth,clientAuth\n",
    )?;
    let sign = [
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca_pem,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-days",
        "365",
        "-extfile",
        &ext,
        "-out",
        &pem,
    ];
    sys::run("openssl", &sign).map(drop)
}

/// What the agent pod has of its own: a ClusterFirstWithHostNet
/// resolv.conf, names looked up in files and DNS alone (as a container
/// image's nsswitch.conf has it), and the lab's dnstrace on its PATH.
fn write_pod_files(state: &LabState) -> Result<()> {
    let domain = &state.cluster_domain;
    // The kubelet's search list for a pod of namespace dnstrace, the
    // node's own search domains after it.
    let search: Vec<String> = [format!("dnstrace.svc.{domain}"), format!("svc.{domain}")]
        .into_iter()
        .chain(
            std::iter::once(domain)
                .chain(&state.node_search)
                .map(Domain::to_string),
        )
        .collect();
    let resolv = resolvers::pod_resolv_conf(plan::SERVICE4.into(), &search);
    std::fs::write(resolv_conf(), resolv)?;
    std::fs::write(nsswitch_conf(), "hosts: files dns\n")?;
    std::fs::create_dir_all(bin_dir())?;
    let exe = std::env::current_exe().context("finding the dnstrace binary")?;
    std::os::unix::fs::symlink(exe, bin_dir().join("dnstrace")).context("linking dnstrace")
}

fn resolv_conf() -> PathBuf {
    dir().join("resolv.conf")
}

fn nsswitch_conf() -> PathBuf {
    dir().join("nsswitch.conf")
}

fn bin_dir() -> PathBuf {
    dir().join("bin")
}

/// `dnstrace agent` as node `node`'s DaemonSet pod: in the node's network
/// namespace (and the machine's mounts: bpffs, cgroups, tracefs), its
/// log to the lab's logs.
fn spawn(exe: &Path, node: Node) -> Result<u32> {
    let s = secret();
    let addr = |port: u16| format!("{}:{port}", node.underlay());
    let log = File::create(resolvers::log_path(&log_name(node)))?;
    let _ = std::fs::remove_file(ready_file(node));
    let mut cmd = Command::new(exe);
    // The pod's environment is the DaemonSet's, none of the shell's
    // DNSTRACE_* settings: its flags say what the DaemonSet's env would.
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("NODE_NAME", node.name())
        .arg("agent")
        .args(node.flags().split_whitespace())
        .args([
            "--api-addr",
            &addr(API_PORT),
            "--metrics-addr",
            &addr(METRICS_PORT),
        ])
        .arg("--api-cert")
        .arg(&s.cert)
        .arg("--api-key")
        .arg(&s.key)
        .arg("--api-ca")
        .arg(&s.ca)
        .arg("--ready-file")
        .arg(ready_file(node))
        // The lab's, gone with it: not the node's /var/lib.
        .arg("--flight-dir")
        .arg(dir().join("flights").join(node.name()))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    let netns = open_netns(node)?;
    // SAFETY: setns(2) in the child before exec, on a descriptor it inherited.
    unsafe {
        cmd.pre_exec(move || enter_netns(&netns));
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting the agent of {}", node.name()))?;
    Ok(child.id())
}

fn open_netns(node: Node) -> Result<File> {
    let path = Path::new("/run/netns").join(node.netns());
    File::open(&path).with_context(|| format!("opening {}", path.display()))
}

fn enter_netns(netns: &File) -> std::io::Result<()> {
    // SAFETY: a valid namespace descriptor.
    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Waits for the agent's ready file: its programs attached, its API up.
fn wait_ready(node: Node, pid: u32) -> Result<()> {
    let deadline = Instant::now() + READY_WAIT;
    let why = loop {
        if ready_file(node).exists() {
            return Ok(());
        }
        if !sys::alive(pid) {
            break "exited";
        }
        if Instant::now() > deadline {
            break "was not ready in 60 s";
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = resolvers::log_path(&log_name(node));
    bail!(
        "the agent of {} {why}; the last lines of {}:\n{}",
        node.name(),
        log.display(),
        last_lines(&log, 10)
    )
}

fn last_lines(path: &Path, n: usize) -> String {
    let Ok(file) = File::open(path) else {
        return String::new();
    };
    let lines: Vec<String> = BufReader::new(file).lines().map_while(Result::ok).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Stops every agent of `state` as the DaemonSet's pods are stopped:
/// SIGTERM, and time to detach their programs; killed after that.
pub fn stop(state: &LabState) {
    for &pid in state.agent_pids.values() {
        sys::terminate(pid);
    }
    let deadline = Instant::now() + STOP_WAIT;
    for (node, &pid) in &state.agent_pids {
        while sys::alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if sys::alive(pid) {
            log::warn!(target: "lab", "the agent of {node} did not stop in 10 s: killed");
            sys::kill(pid);
        }
    }
}

/// The status lines of the agents.
pub fn status(state: &LabState) -> Vec<String> {
    let mut lines: Vec<String> = state
        .agent_pids
        .iter()
        .map(|(node, &pid)| {
            let ip = state_node(state, node).map_or_else(String::new, |n| n.underlay().to_string());
            format!(
                "agent {node}: pid {pid} {}, API {ip}:{API_PORT} (mutual TLS), log {}",
                sys::Liveness::of(pid).name(),
                resolvers::log_path(&format!("agent-{node}")).display()
            )
        })
        .collect();
    if state.agents {
        let web = cluster::pods(state.nodes)[0].pod.full_name();
        lines.push(format!(
            "agents: {} in CoreDNS, certificates in {}; try `dnstrace lab exec node1 -- dnstrace cluster --pod {web}`",
            resolvers::agents_name(&state.cluster_domain),
            dir().display()
        ));
    }
    lines
}

/// The node of `state` named `name` (`node2`, or `2`).
fn state_node(state: &LabState, name: &str) -> Option<Node> {
    let n: u8 = name.strip_prefix("node").unwrap_or(name).parse().ok()?;
    (1..=state.nodes).contains(&n).then_some(Node(n))
}

/// `lab exec NODE -- COMMAND`: `command` run as in `node`'s agent pod,
/// in place of this process (its pid, its signals): the node's network
/// namespace, the pod's resolv.conf and nsswitch.conf in a mount
/// namespace of its own, the DaemonSet's environment.
pub fn exec(state: &LabState, node: &str, command: &[String]) -> Result<()> {
    if !state.agents {
        bail!("the lab runs no agents: bring it up with `dnstrace lab up --nodes 3 --agents`");
    }
    let Some(node) = state_node(state, node) else {
        bail!(
            "the lab has no node {node}: its nodes are node1 to node{}",
            state.nodes
        );
    };
    let Some((program, args)) = command.split_first() else {
        bail!("give the command to run after `--`");
    };
    let netns = open_netns(node)?;
    enter_pod(&netns).context("entering the agent pod")?;
    let s = secret();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![bin_dir()];
    paths.extend(std::env::split_paths(&path));
    let e = Command::new(program)
        .args(args)
        .env("PATH", std::env::join_paths(paths)?)
        .env("NODE_NAME", node.name())
        .env(
            "DNSTRACE_AGENTS",
            resolvers::agents_name(&state.cluster_domain),
        )
        .env("DNSTRACE_API_CERT", &s.cert)
        .env("DNSTRACE_API_KEY", &s.key)
        .env("DNSTRACE_API_CA", &s.ca)
        .exec();
    bail!("running {program}: {e}")
}

/// This thread (which execs) into a mount namespace of its own, private,
/// with the pod's files over /etc's, and into the node's network namespace.
fn enter_pod(netns: &File) -> Result<()> {
    // SAFETY: unshare(2) with no pointers.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        bail!("unshare: {}", std::io::Error::last_os_error());
    }
    // Nothing mounted here reaches the machine's mount namespace.
    mount(None, Path::new("/"), libc::MS_REC | libc::MS_PRIVATE)?;
    mount(
        Some(&resolv_conf()),
        Path::new("/etc/resolv.conf"),
        libc::MS_BIND,
    )?;
    mount(
        Some(&nsswitch_conf()),
        Path::new("/etc/nsswitch.conf"),
        libc::MS_BIND,
    )?;
    enter_netns(netns).context("setns")
}

fn mount(source: Option<&Path>, target: &Path, flags: libc::c_ulong) -> Result<()> {
    use std::{ffi::CString, os::unix::ffi::OsStrExt as _};
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes());
    let source = source.map(c).transpose()?;
    let target_c = c(target)?;
    let none = c"none";
    // SAFETY: NUL-terminated strings that outlive the call; no data.
    let rc = unsafe {
        libc::mount(
            source.as_ref().map_or(none.as_ptr(), |s| s.as_ptr()),
            target_c.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "mounting over {}: {}",
            target.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_pods_names_are_the_nodes_and_their_addresses_the_underlays() {
        let state = LabState {
            nodes: 3,
            ..LabState::default()
        };
        assert_eq!(state_node(&state, "node2"), Some(Node(2)));
        assert_eq!(state_node(&state, "3"), Some(Node(3)));
        assert_eq!(state_node(&state, "node4"), None);
        assert_eq!(state_node(&state, "node0"), None);
        assert_eq!(state_node(&state, "web"), None);
        let ips: Vec<String> = addresses(3).iter().map(Ipv4Addr::to_string).collect();
        assert_eq!(ips, ["172.18.0.2", "172.18.0.3", "172.18.0.4"]);
    }
}
