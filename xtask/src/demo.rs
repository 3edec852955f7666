//! The README's first command: the built-in lab with a classic failure, and
//! dnstrace watching the node's pod veths while a client pod looks names up;
//! then the lab as three nodes, an agent on each as the DaemonSet runs
//! them, and the cluster view run in node 1's agent pod (`lab exec`, as
//! `kubectl exec` runs it) saying a lookup was lost between nodes as it
//! happens.
use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{cargo, check, setup::is_root, workspace_root};

/// The lab's client pod on node 1 (its network namespace's name, after
/// the lab's prefix).
const WEB: &str = "web-7d9f8c6b5-x2x4k";

pub fn run() -> Result<()> {
    if !is_root() {
        bail!("the demo loads eBPF programs and makes network namespaces: run it as root");
    }
    cargo(&["build", "--release", "--quiet", "--package", "dnstrace"])?;
    let bin = workspace_root().join("target/release/dnstrace");
    step("building the lab: a node, two client pods, two CoreDNS pods behind kube-dns 10.96.0.10");
    dnstrace(&bin, &["lab", "up"])?;
    let result = story(&bin).and_then(|()| {
        step("building a cluster instead: three nodes over a VXLAN overlay as flannel links them, CoreDNS on nodes 2 and 3, and (--agents) the DaemonSet: a dnstrace agent in each node's namespace, as its hostNetwork pod, serving cluster views with mutual TLS on the node's address, the certificates made for the lab, the agents' Service name in CoreDNS");
        dnstrace(&bin, &["lab", "down"])?;
        dnstrace(&bin, &["lab", "up", "--nodes", "3", "--agents"])?;
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
    let node_netns = format!("/run/netns/{}node", lab_prefix());
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

/// The cluster view of web's lookups over the lab's agents, run in node
/// 1's agent pod: a lookup whole across nodes, then one lost between node
/// 1 and node 3 (`overlay-drop`), said so as it happens.
fn across_nodes(bin: &Path) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("dnstrace-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = cluster_view(bin, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn cluster_view(bin: &Path, dir: &Path) -> Result<()> {
    let pod = format!("default/{WEB}");
    step(&format!("dnstrace lab exec node1 -- dnstrace cluster --pod {pod}: on a cluster, exactly `kubectl exec -it -n dnstrace ds/dnstrace -- dnstrace cluster --pod {pod}`. In node1's agent pod the view finds the agents by their Service's name (dnstrace-agents.dnstrace.svc.cluster.local, through CoreDNS) and is let in by the pod's certificate; it asks every agent which node runs the pod, then each for its part of the pod's lookups, and shows each lookup whole, its legs named by node"));
    let ready = dir.join("view.ready");
    let mut view = View::start(
        Command::new(bin)
            .args([
                "lab", "exec", "node1", "--", "dnstrace", "cluster", "--pod", &pod,
            ])
            .args(["-o", "text", "--ready-file"])
            .arg(&ready),
    )?;
    wait_ready(&mut view.child, &ready)?;
    step("a healthy lookup from web on node 1: DNATed there to CoreDNS on node 2 or 3, across the overlay and back");
    traffic(bin, "kube-dns.kube-system.svc.cluster.local.")?;
    view.wait_for("NOERROR", Duration::from_secs(15))?;
    view.settle();
    step("fault overlay-drop: the underlay drops VXLAN from node 1 to node 3; web looks kube-dns up until a lookup DNATed to node 3's CoreDNS is lost (5.5 s after it, the view calls it timed out and says where it was lost)");
    dnstrace(bin, &["lab", "fault", "overlay-drop", "on", "--node", "3"])?;
    let lost = lost_lookup()
        .and_then(|()| view.wait_for("lost between node1 and node3", Duration::from_secs(30)));
    dnstrace(bin, &["lab", "fault", "overlay-drop", "off", "--node", "3"])?;
    lost?;
    step("the view stopped (SIGINT): its summary, every anomaly raised");
    view.stop()
}

/// The cluster view, its lines shown as they come and watched for.
struct View {
    child: Kill,
    lines: mpsc::Receiver<String>,
    echo: Option<std::thread::JoinHandle<()>>,
}

impl View {
    fn start(cmd: &mut Command) -> Result<Self> {
        let mut child = Kill(
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .context("starting dnstrace cluster")?,
        );
        let out = child.0.stdout.take().context("the view's stdout")?;
        let (tx, lines) = mpsc::channel();
        let echo = std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                println!("{line}");
                let _ = tx.send(line);
            }
        });
        Ok(Self {
            child,
            lines,
            echo: Some(echo),
        })
    }

    /// Waits until the view has shown a line with `needle`.
    fn wait_for(&self, needle: &str, wait: Duration) -> Result<()> {
        let deadline = Instant::now() + wait;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return Ok(()),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        bail!("the cluster view showed no line with {needle:?} in {wait:?}")
    }

    /// Lets what is being shown end (a journey's legs follow its first
    /// line) before the demo says its next step: until no line has come
    /// for a moment, two seconds at most.
    fn settle(&self) {
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until && self.lines.recv_timeout(Duration::from_millis(300)).is_ok()
        {
        }
    }

    /// SIGINT, as Ctrl-C: the view prints its summary and ends.
    fn stop(mut self) -> Result<()> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.0.id() as i32, libc::SIGINT) };
        let status = self.child.0.wait()?;
        if let Some(echo) = self.echo.take() {
            let _ = echo.join();
        }
        if !status.success() {
            bail!("dnstrace cluster ended with {status}");
        }
        Ok(())
    }
}

/// Waits for `child`'s `--ready-file`; fails if it exits first.
fn wait_ready(child: &mut Kill, ready: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        if let Some(status) = child.0.try_wait()? {
            bail!("it ended with {status} before it was ready");
        }
        if Instant::now() > deadline {
            bail!("not ready in a minute");
        }
        sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The lab's instance (`DNSTRACE_LAB_INSTANCE`, as `dnstrace lab` reads
/// it): none is the first lab's, `dtlab-*`.
fn instance() -> String {
    std::env::var("DNSTRACE_LAB_INSTANCE").unwrap_or_default()
}

/// The prefix of the lab's namespaces' names.
fn lab_prefix() -> String {
    format!("dtlab{}-", instance())
}

/// Lookups from web, one a second at most, until one times out (half go
/// to node 3's CoreDNS: twenty answered in a row would be one in a million).
fn lost_lookup() -> Result<()> {
    for _ in 0..20 {
        let out = Command::new("ip")
            .args(["netns", "exec", &format!("{}{WEB}", lab_prefix()), "dig"])
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
