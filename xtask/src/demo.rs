//! The README's first command: the built-in lab with a classic failure, and
//! dnstrace watching the node's pod veths while a client pod looks names up.
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
    let result = story(&bin);
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
