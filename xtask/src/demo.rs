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
    result
}

fn story(bin: &Path) -> Result<()> {
    let veths = pod_veths()?;
    step(&format!(
        "tracing DNS on the node's pod interfaces ({})",
        veths.join(", ")
    ));
    let mut args = vec![
        "netns",
        "exec",
        NODE,
        bin.to_str().context("non UTF-8 path")?,
    ];
    for v in &veths {
        args.extend(["--iface", v.as_str()]);
    }
    let mut trace = Kill(
        Command::new("ip")
            .args(&args)
            .stdin(Stdio::null())
            .spawn()
            .context("starting dnstrace")?,
    );
    sleep(Duration::from_secs(2));
    step("a healthy lookup from default/web: query to the service IP, DNAT to a CoreDNS pod, reply from the service IP");
    traffic(bin, "kubernetes.default.svc.cluster.local.")?;
    step("fault bridge-nf-off (net.bridge.bridge-nf-call-iptables=0 on the node): watch the reply's source");
    dnstrace(bin, &["lab", "fault", "bridge-nf-off", "on"])?;
    traffic(bin, "kube-dns.kube-system.svc.cluster.local.")?;
    step("the reply left CoreDNS from its pod IP and reached the client un-NATed: the client's socket never saw it");
    dnstrace(bin, &["lab", "fault", "bridge-nf-off", "off"])?;
    sleep(Duration::from_millis(500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(trace.0.id() as i32, libc::SIGINT) };
    trace.0.wait()?;
    Ok(())
}

fn pod_veths() -> Result<Vec<String>> {
    let out = Command::new("ip")
        .args(["-n", NODE, "-o", "link", "show", "master", "cni0"])
        .output()?;
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1)?.split('@').next().map(str::to_owned))
        .collect();
    if names.is_empty() {
        bail!("the lab's bridge has no pod interfaces");
    }
    Ok(names)
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
