//! A healthy lab raises nothing, in every combination of its shapes:
//! kube-proxy's mode × NodeLocalDNS's mode × the client's retry habits.
//! Each client kind makes 1,000 lookups of cluster and external names,
//! after CoreDNS was restarted (an empty cache, new loop probes), while
//! dnstrace traces the node. A failure lists what each run saw, so that a
//! CI log is enough to act on.
use std::time::Instant;

use serde_json::Value;

use dnstrace_tests::*;

/// `lab up --proxy-mode` values: a new mode is one more line.
const PROXY_MODES: [&str; 3] = ["iptables", "nftables", "socket-lb"];

/// NodeLocalDNS: off, link-local, NOTRACK (on kube-dns's own IP).
const NODELOCALDNS: [&[&str]; 3] = [&[], &["--nodelocaldns"], &["--nodelocaldns=notrack"]];

/// `lab traffic --client` values.
const CLIENTS: [&str; 3] = ["stub", "glibc", "musl"];

/// Per client pod (the lab has two): 30 a second for 17 s is 1,000
/// lookups per client kind, which the release build follows whole; 18
/// runs with their restarts, traces and 6 labs (before socket-lb) took 409
/// to 453 s on a shared 2-core machine (at 25 a second for 20 s: 505 s).
const RATE: &str = "30";
const DURATION: &str = "17s";
const LOOKUPS: usize = 1_000;

/// The client pods' addresses: their journeys are the lookups.
const CLIENT_IPS: [&str; 2] = ["10.244.0.10:", "10.244.0.11:"];

/// The name of `lab traffic`'s mix that does not exist: NXDOMAIN is its answer.
const NONEXISTENT: &str = "nosuchname.example.com";

#[test]
fn a_healthy_lab_raises_nothing_in_any_mode_with_any_client() {
    require_root();
    let started = Instant::now();
    let mut failures = Vec::new();
    for proxy in PROXY_MODES {
        for nodelocal in NODELOCALDNS.into_iter().filter(|n| shape_exists(proxy, n)) {
            let mode = format!("--proxy-mode={proxy}");
            let lab_args = [&[mode.as_str()], nodelocal].concat();
            let lab = Lab::up(&lab_args);
            for client in CLIENTS {
                let run = format!("lab up {} / --client {client}", lab_args.join(" "));
                failures.extend(check_client(&lab, client).map(|f| format!("{run}: {f}")));
            }
        }
    }
    eprintln!("all combinations in {:.0?}", started.elapsed());
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

/// NodeLocalDNS's NOTRACK mode is iptables rules of its own on kube-dns's
/// IP, which a node balancing at the socket does not have (the lab refuses
/// the pair).
fn shape_exists(proxy: &str, nodelocal: &[&str]) -> bool {
    !(proxy == "socket-lb" && nodelocal == ["--nodelocaldns=notrack"])
}

/// CoreDNS restarted, then `LOOKUPS` lookups by `client` while dnstrace
/// traces: what went wrong, if anything.
fn check_client(lab: &Lab, client: &str) -> Option<String> {
    let mut lookups = Vec::new();
    let (lines, _) =
        lab.trace_during_with(dnstrace_release_bin(), &["--ring-buffer-mib", "64"], || {
            lab.restart_coredns();
            lookups = lab.traffic(&["--client", client, "--rate", RATE, "--duration", DURATION]);
        });
    let mut wrong = Vec::new();
    if lookups.len() < LOOKUPS {
        wrong.push(format!("{} lookups, not {LOOKUPS}", lookups.len()));
    }
    let unanswered: Vec<&Value> = lookups.iter().filter(|l| !answered(l)).collect();
    if !unanswered.is_empty() {
        wrong.push(format!(
            "{} lookups unanswered, the first: {:#}",
            unanswered.len(),
            unanswered[0]
        ));
    }
    // Each lookup is at least an A and an AAAA journey.
    let whole = whole_client_journeys(&lines);
    if whole < 2 * LOOKUPS {
        wrong.push(format!(
            "{whole} client journeys seen whole, fewer than {}: an empty trace proves nothing",
            2 * LOOKUPS
        ));
    }
    let anomalies = anomalies(&lines);
    if !anomalies.is_empty() {
        wrong.push(format!(
            "{} anomalies:\n{}",
            anomalies.len(),
            anomalies.join("\n")
        ));
    }
    (!wrong.is_empty()).then(|| wrong.join("; "))
}

/// An answer with addresses, or NXDOMAIN for the name that does not exist.
fn answered(lookup: &Value) -> bool {
    lookup["ok"] == true || (lookup["name"] == NONEXISTENT && lookup["error"] == "NXDOMAIN")
}

fn whole_client_journeys(lines: &[Value]) -> usize {
    lines
        .iter()
        .filter(|j| j["type"] == "journey" && j["incomplete"] == false)
        .filter(|j| {
            j["client"]
                .as_str()
                .is_some_and(|c| CLIENT_IPS.iter().any(|ip| c.starts_with(ip)))
        })
        .count()
}

/// Each anomaly of the summary: its kind, summary and evidence.
fn anomalies(lines: &[Value]) -> Vec<String> {
    let summary = lines
        .iter()
        .find(|l| l["type"] == "summary")
        .expect("a summary at exit");
    summary["anomalies"]
        .as_array()
        .expect("anomalies in the summary")
        .iter()
        .map(|a| {
            format!(
                "  {}: {}\n    evidence: {:#}",
                a["kind"], a["summary"], a["evidence"]
            )
        })
        .collect()
}
