//! The shapes real clusters have, in the lab: CoreDNS's loop plugin probe
//! and per-try deadline upstream. Each is checked for real: resolver logs,
//! rule counters, and what `dnstrace trace -o json` sees.
use std::process::Command;

use serde_json::Value;

use dnstrace_tests::*;

/// `dnstrace trace -o json` over the lab node while `work` runs: its JSON
/// lines.
fn trace(lab: &Lab, work: impl FnOnce()) -> Vec<Value> {
    let trace = lab.trace_every_lookup(&["--timeout", "3s"]);
    work();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    json_lines(&out)
}

fn anomaly_kinds(lines: &[Value]) -> Vec<String> {
    let summary = lines.iter().find(|l| l["type"] == "summary").unwrap();
    summary["anomalies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// The loop plugin's name: two integers under the root.
fn is_probe_name(name: &str) -> bool {
    let labels: Vec<&str> = name.trim_end_matches('.').split('.').collect();
    name.ends_with('.')
        && labels.len() == 2
        && labels
            .iter()
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()))
}

/// The loop probes each CoreDNS pod's dnsmasq logged (`query[HINFO] NAME from 127.0.0.1`).
fn logged_probes(lab: &Lab, pod: &str) -> Vec<String> {
    lab.log(pod)
        .lines()
        .filter_map(|l| l.split("query[HINFO] ").nth(1))
        .filter_map(|rest| rest.strip_suffix(" from 127.0.0.1"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn coredns_probes_itself_for_loops_at_start_and_on_reload() {
    require_root();
    let lab = Lab::up(&[]);
    for pod in [COREDNS_A, COREDNS_B] {
        let probes = logged_probes(&lab, pod);
        assert_eq!(probes.len(), 1, "{pod}: {probes:?}");
        assert!(is_probe_name(&format!("{}.", probes[0])), "{probes:?}");
    }
    let lines = trace(&lab, || {
        let out = dnstrace(&["lab", "reload"]);
        assert!(out.status.success(), "{out:?}");
    });
    for pod in [COREDNS_A, COREDNS_B] {
        let probes = logged_probes(&lab, pod);
        assert_eq!(probes.len(), 2, "a new probe on reload: {probes:?}");
        assert_ne!(probes[0], probes[1], "a new name each time");
    }
    let probes: Vec<&Value> = lines
        .iter()
        .filter(|j| j["type"] == "journey" && j["qtype"] == "HINFO")
        .filter(|j| is_probe_name(j["name"].as_str().unwrap_or_default()))
        .collect();
    assert!(probes.len() >= 2, "{lines:#?}");
    for j in &probes {
        assert_eq!(j["outcome"]["status"], "answered", "{j:#}");
        assert_eq!(j["outcome"]["rcode"], "NXDOMAIN", "{j:#}");
    }
    eprintln!(
        "anomalies raised around the probes: {:?}",
        anomaly_kinds(&lines)
    );
}

/// The DROP counter of the upstream's filter INPUT rule for UDP.
fn upstream_drops() -> u64 {
    let rules = run(Command::new("ip").args([
        "netns",
        "exec",
        "dtlab-upstream",
        "iptables",
        "-nvxL",
        "INPUT",
    ]))
    .unwrap();
    rules
        .lines()
        .find(|l| l.contains("DROP") && l.contains("udp"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn coredns_tries_upstream_again_after_two_seconds_and_stops_at_five() {
    require_root();
    let _lab = Lab::up(&["--fault", "upstream-timeout"]);
    let before = upstream_drops();
    let name = fresh("try");
    let out = Command::new("ip")
        .args(["netns", "exec", WEB, "dig", "+tries=1", "+time=7"])
        .arg(format!("@{SERVICE}"))
        .arg(&name)
        .output()
        .unwrap();
    assert_eq!(dig_status(&String::from_utf8_lossy(&out.stdout)), "timeout");
    assert_eq!(upstream_drops() - before, 2, "a first try and one retry");
}
