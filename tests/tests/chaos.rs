//! Chaos on the lab while dnstrace traces the whole machine: the conntrack
//! table flushed, CoreDNS restarted, a pod's namespace deleted, a veth
//! removed and put back, a new pod started. dnstrace keeps running, says
//! what it saw happen, and follows the lookups made afterwards, the new
//! pod's included.
use std::process::Command;

use serde_json::Value;

use dnstrace_tests::*;

const KUBERNETES: &str = "kubernetes.default.svc.cluster.local.";

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn pids_in(ns: &str) -> Vec<i32> {
    let out = Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Kills the CoreDNS pod's server and starts the same command again;
/// returns the new processes, for the test to reap after `lab down`.
fn restart_coredns(ns: &str) -> Vec<std::process::Child> {
    let mut started = Vec::new();
    for pid in pids_in(ns) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !argv.first().is_some_and(|a| a.contains("dnsmasq")) {
            continue;
        }
        // SAFETY: signalling a process of the lab.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        std::thread::sleep(std::time::Duration::from_millis(200));
        // It runs in the foreground, as the lab started it; `lab down` ends it.
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(&argv)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        started.push(child);
    }
    started
}

/// The host veth of a pod, as the node names it.
fn host_veth(pod_ns: &str) -> String {
    let out = Command::new("ip")
        .args(["-n", &NODE, "-o", "link", "show", "master", "cni0"])
        .output()
        .unwrap();
    let peer_index = Command::new("ip")
        .args(["-n", pod_ns, "-o", "link", "show", "eth0"])
        .output()
        .unwrap();
    // `eth0@if12:` in the pod names the host end's ifindex.
    let text = String::from_utf8_lossy(&peer_index.stdout);
    let index = text
        .split("@if")
        .nth(1)
        .and_then(|s| s.split(':').next())
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with(&format!("{index}: ")))
        .and_then(|l| l.split(": ").nth(1))
        .and_then(|n| n.split('@').next())
        .unwrap()
        .to_owned()
}

/// A pod's network as the lab plumbs it: a veth on the node's bridge.
fn plumb(pod_ns: &str, veth: &str, addr: &str) {
    sh(&[
        "ip", "-n", &NODE, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns",
        pod_ns,
    ]);
    sh(&[
        "ip", "-n", &NODE, "link", "set", veth, "master", "cni0", "up",
    ]);
    sh(&[
        "ip",
        "-n",
        pod_ns,
        "addr",
        "add",
        &format!("{addr}/24"),
        "dev",
        "eth0",
    ]);
    sh(&["ip", "-n", pod_ns, "link", "set", "eth0", "up"]);
    sh(&[
        "ip",
        "-n",
        pod_ns,
        "route",
        "add",
        "default",
        "via",
        "10.244.0.1",
    ]);
}

fn dig_from(ns: &str) -> String {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "dig",
            "+tries=2",
            "+time=2",
            &format!("@{SERVICE}"),
            KUBERNETES,
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// dig from `ns` until it is answered, three times at most: the lab's own
/// settling (a re-plumbed pod's veth coming up) is not what the test is
/// about. Err is dig's last output.
fn dig_until_answered(ns: &str) -> Result<(), String> {
    let mut out = String::new();
    for _ in 0..3 {
        out = dig_from(ns);
        if out.contains("status: NOERROR") {
            return Ok(());
        }
    }
    Err(out)
}

/// Waits, 5 s at most, until a server listens on UDP port 53 in `ns`.
fn wait_listening(ns: &str) {
    for _ in 0..50 {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "ss", "-Hlun", "sport = :53"])
            .output()
            .unwrap();
        if !out.stdout.is_empty() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("nothing listens on port 53 in {ns} after the restart");
}

fn answered_from(journeys: &[Value], client: &str) -> bool {
    journeys.iter().any(|j| {
        j["client"]
            .as_str()
            .is_some_and(|c| c.starts_with(&format!("{client}:")))
            && j["name"] == KUBERNETES
            && j["outcome"]["status"] == "answered"
    })
}

#[test]
fn tracing_goes_on_through_chaos_and_follows_a_new_pod() {
    // The new pod is a namespace of its own, which no runtime lists: the
    // trace watches every namespace.
    require_alone();
    let lab = Lab::up(&[]);
    let trace = lab.trace_everywhere(Keep::Every, &["--timeout", "3s"]);
    let new_pod = lab_ns("chaos-new");
    let pid = trace.pid();
    assert!(dig_from(&WEB).contains("status: NOERROR"));

    sh(&["ip", "netns", "exec", &NODE, "conntrack", "-F"]);
    let coredns = [COREDNS_A, COREDNS_B].map(lab_ns);
    let restarted: Vec<_> = coredns.iter().flat_map(|ns| restart_coredns(ns)).collect();
    for p in pids_in(&CHECKOUT) {
        // SAFETY: signalling a process of the lab.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    sh(&["ip", "netns", "del", &CHECKOUT]);
    let veth = host_veth(&WEB);
    sh(&["ip", "-n", &NODE, "link", "del", &veth]);
    plumb(&WEB, &veth, "10.244.0.10");
    // web's neighbours forget its old MAC, as a gratuitous ARP of the new
    // one would make them: otherwise their answers go to a MAC that is no
    // more until the entry goes stale (15 to 45 s).
    for ns in coredns.iter().map(String::as_str).chain([&*NODE]) {
        sh(&["ip", "-n", ns, "neigh", "flush", "to", "10.244.0.10"]);
    }
    sh(&["ip", "netns", "add", &new_pod]);
    sh(&["ip", "-n", &new_pod, "link", "set", "lo", "up"]);
    plumb(&new_pod, "vethchaosnew", "10.244.0.30");

    coredns.iter().for_each(|ns| wait_listening(ns));
    if let Err(dig) = dig_until_answered(&WEB) {
        panic!("web after the chaos: {dig}");
    }
    if let Err(dig) = dig_until_answered(&new_pod) {
        panic!("the new pod: {dig}");
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok(),
        "dnstrace is still running"
    );
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{stderr:?}");
    let journeys: Vec<Value> = json_lines(&out)
        .into_iter()
        .filter(|l| l["type"] == "journey")
        .collect();
    assert!(
        answered_from(&journeys, "10.244.0.10"),
        "web after the chaos: {journeys:#?}"
    );
    assert!(
        answered_from(&journeys, "10.244.0.30"),
        "the new pod: {journeys:#?}"
    );
    for (link, what) in [
        (veth.as_str(), "went away"),
        (veth.as_str(), "appeared"),
        ("vethchaosnew", "appeared"),
    ] {
        let said = |l: &String| l.contains(&format!("interface {link} ")) && l.ends_with(what);
        assert!(stderr.iter().any(said), "{link} {what}: {stderr:#?}");
    }
    drop(lab);
    for mut c in restarted {
        let _ = c.wait();
    }
}
