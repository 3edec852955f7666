//! The README's first command: the built-in lab with a classic failure, and
//! dnstrace watching the node's pod veths while a client pod looks names up;
//! then the lab as three nodes, one dnstrace each, and a lookup lost
//! between nodes.
use std::{
    path::Path,
    process::{Child, Command, Stdio},
    thread::sleep,
    time::Duration,
};

use anyhow::{bail, Context, Result};

use crate::{cargo, check, setup::is_root, workspace_root};

const NODE: &str = "dtlab-node";

pub fn run() -> Result<()> {
    if !is_root() {
        bail!("the demo loads eBPF programs and makes network namespaces: run it as root");
    }
    cargo(&["build", "--release", "--quiet", "--package", "dnstrace"])?;
    let bin = workspace_root().join("target/release/dnstrace");
    step("building the lab: a node, two client pods, two CoreDNS pods behind kube-dns 10.96.0.10");
    dnstrace(&bin, &["lab", "up"])?;
    let result = story(&bin).and_then(|()| {
        step("building a cluster instead: three nodes over a VXLAN overlay as flannel links them, CoreDNS on nodes 2 and 3");
        dnstrace(&bin, &["lab", "down"])?;
        dnstrace(&bin, &["lab", "up", "--nodes", "3"])?;
        across_nodes(&bin)
    });
    step("removing the lab");
    dnstrace(&bin, &["lab", "down"])?;
    if result.is_ok() {
        step("next, the live view, in a terminal: `target/release/dnstrace lab up --fault bridge-nf-off`, then `target/release/dnstrace trace --node-netns /run/netns/dtlab-node --containerd-root /run/dnstrace-lab/containerd --cri-socket /run/dnstrace-lab/cri/containerd.sock --pod web` and, from another terminal, `target/release/dnstrace lab traffic --pod web`; ? lists the keys, q quits, `lab down` removes the lab");
    }
    result
}

fn story(bin: &Path) -> Result<()> {
    step("tracing every DNS query on the machine, end to end (dnstrace trace)");
    let node_netns = format!("/run/netns/{NODE}");
    let mut trace = Kill(
        Command::new(bin)
            // Lines between the demo's steps; `dnstrace trace` alone on a
            // terminal opens the live view instead.
            .args([
                "trace",
                "--no-tui",
                "--node-netns",
                &node_netns,
                "--timeout",
                "3s",
            ])
            .stdin(Stdio::null())
            .spawn()
            .context("starting dnstrace")?,
    );
    sleep(Duration::from_secs(3));
    step("a healthy lookup from default/web: to the service IP, DNAT to a CoreDNS pod, the answer back from the service IP");
    traffic(bin, "kubernetes.default.svc.cluster.local.")?;
    sleep(Duration::from_secs(1));
    step("fault bridge-nf-off (net.bridge.bridge-nf-call-iptables=0 on the node): watch where the answer comes from");
    dnstrace(bin, &["lab", "fault", "bridge-nf-off", "on"])?;
    traffic(bin, "kube-dns.kube-system.svc.cluster.local.")?;
    sleep(Duration::from_secs(1));
    step("the answer reached the client from the CoreDNS pod's own address, un-NATed: its socket dropped it and it timed out");
    dnstrace(bin, &["lab", "fault", "bridge-nf-off", "off"])?;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(trace.0.id() as i32, libc::SIGINT) };
    trace.0.wait()?;
    Ok(())
}

/// One dnstrace per node, each seeing its node alone and recording it; a
/// lookup lost between nodes; the client node's word on it, then the
/// three recordings merged into whole journeys.
fn across_nodes(bin: &Path) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("dnstrace-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    step("one dnstrace per node, as a DaemonSet runs them: each sees only its node's namespaces and records them (node1's lines below)");
    let mut tracers = Vec::new();
    for node in 1..=3 {
        let file = dir.join(format!("node{node}.pcapng"));
        let mut cmd = Command::new(bin);
        cmd.args(["trace", "--no-tui", "--timeout", "3s"])
            .args(node_flags(node))
            .arg("--record")
            .arg(&file)
            .stdin(Stdio::null());
        if node != 1 {
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
        tracers.push(Kill(cmd.spawn().context("starting dnstrace")?));
    }
    sleep(Duration::from_secs(3));
    step("three healthy lookups from default/web on node 1: DNATed there to CoreDNS on node 2 or 3, across the overlay and back");
    for _ in 0..3 {
        traffic(bin, "kube-dns.kube-system.svc.cluster.local.")?;
    }
    step("fault overlay-drop: the underlay drops VXLAN from node 1 to node 3; web (node 1) looks kube-dns up until a lookup DNATed to node 3's CoreDNS is lost");
    dnstrace(bin, &["lab", "fault", "overlay-drop", "on", "--node", "3"])?;
    lost_lookup()?;
    sleep(Duration::from_secs(4));
    for t in &mut tracers {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(t.0.id() as i32, libc::SIGINT) };
        t.0.wait()?;
    }
    dnstrace(bin, &["lab", "fault", "overlay-drop", "off"])?;
    step("node1 alone could only say the query left it for node 3's CoreDNS; the three recordings merged show each lookup whole, every leg named by its node, the clocks' offsets, and the lost one said lost between node 1 and node 3: node 3 never saw it");
    let files: Vec<_> = (1..=3)
        .map(|n| dir.join(format!("node{n}.pcapng")))
        .collect();
    let result = check(Command::new(bin).arg("replay").args(&files));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The flags of `lab status` that make a dnstrace node `n`'s.
fn node_flags(n: u8) -> Vec<String> {
    vec![
        "--node".into(),
        format!("node{n}"),
        "--node-netns".into(),
        format!("/run/netns/dtlab-node{n}"),
        "--containerd-root".into(),
        format!("/run/dnstrace-lab/node{n}/containerd"),
        "--cri-socket".into(),
        format!("/run/dnstrace-lab/node{n}/cri/containerd.sock"),
    ]
}

/// Lookups from web, one a second at most, until one times out (half go
/// to node 3's CoreDNS: twenty answered in a row would be one in a million).
fn lost_lookup() -> Result<()> {
    for _ in 0..20 {
        let out = Command::new("ip")
            .args(["netns", "exec", "dtlab-web-7d9f8c6b5-x2x4k", "dig"])
            .args([
                "+tries=1",
                "+time=1",
                "kube-dns.kube-system.svc.cluster.local.",
            ])
            .output()
            .context("running dig")?;
        if String::from_utf8_lossy(&out.stdout).contains("timed out") {
            return Ok(());
        }
    }
    bail!("twenty lookups from web were answered with overlay-drop on: the fault is not in effect")
}

fn traffic(bin: &Path, name: &str) -> Result<()> {
    dnstrace(
        bin,
        &["lab", "traffic", "--pod", "default/web", "--name", name],
    )
}

fn dnstrace(bin: &Path, args: &[&str]) -> Result<()> {
    check(Command::new(bin).args(args))
}

fn step(what: &str) {
    eprintln!("\n### {what}");
}

/// Ends the tracer on every path out of the demo.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
