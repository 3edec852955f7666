//! A healthy lab raises nothing, in every combination of its shapes:
//! kube-proxy's mode × NodeLocalDNS's mode × the client's retry habits.
//! Each client kind makes its lookups of cluster and external names,
//! after CoreDNS was restarted (an empty cache, new loop probes), while
//! dnstrace traces the node. One test per shape, so that the shapes run
//! side by side. A failure lists what each run saw, so that a CI log is
//! enough to act on.
//!
//! What it shows: with no false alarm in n lookups of a combination, the
//! chance that a lookup raises one is below 3/n at 95% confidence (the
//! rule of three: 0.95 = 1 - (1 - p)^n gives p = -ln(0.05)/n, about 3/n).
//! The suite makes 300 a combination: below 1% each, and below 0.042%
//! over the 24 combinations (7,200 lookups). `cargo xtask soak` makes
//! 1,000 a combination (below 0.3% each, 0.0125% over all: 24,000
//! lookups), its figure in docs/PERFORMANCE.md.
use std::collections::BTreeMap;

use serde_json::Value;

use dnstrace_tests::*;

/// NodeLocalDNS: off, link-local, NOTRACK (on kube-dns's own IP).
const LINK_LOCAL: &[&str] = &["--nodelocaldns"];
const NOTRACK: &[&str] = &["--nodelocaldns=notrack"];

/// `lab traffic --client` values.
const CLIENTS: [&str; 3] = ["stub", "glibc", "musl"];

/// Per client pod (the lab has two): 30 a second, which the release
/// build follows whole.
const RATE: u32 = 30;
/// Lookups a client kind makes in the suite (`cargo xtask soak` sets
/// DNSTRACE_HEALTHY_LOOKUPS).
const LOOKUPS: usize = 300;

/// The client pods' addresses: their journeys are the lookups.
const CLIENT_IPS: [&str; 2] = ["10.244.0.10:", "10.244.0.11:"];

/// The name of `lab traffic`'s mix that does not exist: NXDOMAIN is its answer.
const NONEXISTENT: &str = "nosuchname.example.com";

#[test]
fn healthy_iptables() {
    raises_nothing("iptables", &[]);
}

#[test]
fn healthy_iptables_with_nodelocaldns() {
    raises_nothing("iptables", LINK_LOCAL);
}

#[test]
fn healthy_iptables_with_notrack_nodelocaldns() {
    raises_nothing("iptables", NOTRACK);
}

#[test]
fn healthy_nftables() {
    raises_nothing("nftables", &[]);
}

#[test]
fn healthy_nftables_with_nodelocaldns() {
    raises_nothing("nftables", LINK_LOCAL);
}

#[test]
fn healthy_nftables_with_notrack_nodelocaldns() {
    raises_nothing("nftables", NOTRACK);
}

/// NodeLocalDNS's NOTRACK mode is iptables rules of its own on kube-dns's
/// IP, which a node balancing at the socket does not have (the lab refuses
/// the pair): two shapes in this mode.
#[test]
fn healthy_socket_lb() {
    raises_nothing("socket-lb", &[]);
}

#[test]
fn healthy_socket_lb_with_nodelocaldns() {
    raises_nothing("socket-lb", LINK_LOCAL);
}

/// The lab in `proxy` mode with `nodelocal`, each client kind in turn.
fn raises_nothing(proxy: &str, nodelocal: &[&str]) {
    require_root();
    let mode = format!("--proxy-mode={proxy}");
    let lab_args = [&[mode.as_str()], nodelocal].concat();
    let lab = Lab::up(&lab_args);
    let lookups = lookups();
    let failures: Vec<String> = CLIENTS
        .iter()
        .filter_map(|client| {
            let run = format!("lab up {} / --client {client}", lab_args.join(" "));
            check_client(&lab, client, lookups).map(|f| format!("{run}: {f}"))
        })
        .collect();
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

/// How many lookups each client kind makes.
fn lookups() -> usize {
    std::env::var("DNSTRACE_HEALTHY_LOOKUPS").map_or(LOOKUPS, |n| {
        n.parse().expect("DNSTRACE_HEALTHY_LOOKUPS is a number")
    })
}

/// CoreDNS restarted, then `wanted` lookups by `client` while dnstrace
/// traces: what went wrong, if anything.
fn check_client(lab: &Lab, client: &str, wanted: usize) -> Option<String> {
    let mut lookups = Vec::new();
    // Half from each client pod.
    let count = wanted.div_ceil(2).to_string();
    let rate = RATE.to_string();
    let overflows = socket_overflows();
    let (lines, _) =
        lab.trace_during_with(dnstrace_release_bin(), &["--ring-buffer-mib", "64"], || {
            lab.restart_coredns();
            lookups = lab.traffic(&["--client", client, "--rate", &rate, "--count", &count]);
        });
    let mut wrong = Vec::new();
    if lookups.len() < wanted {
        wrong.push(format!("{} lookups, not {wanted}", lookups.len()));
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
    if whole < 2 * wanted {
        wrong.push(format!(
            "{whole} client journeys seen whole, fewer than {}: an empty trace proves nothing",
            2 * wanted
        ));
    }
    let anomalies = anomalies(&lines, &overflows);
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

/// Each anomaly of the summary but the socket overflows the kernel
/// counted since `overflows` and the slow answers its journeys timed: its
/// kind, summary and evidence.
fn anomalies(lines: &[Value], overflows: &BTreeMap<u64, u64>) -> Vec<String> {
    let summary = lines
        .iter()
        .find(|l| l["type"] == "summary")
        .expect("a summary at exit");
    let all = summary["anomalies"]
        .as_array()
        .expect("anomalies in the summary");
    false_alarms(all, lines, overflows)
        .into_iter()
        .map(|a| {
            format!(
                "  {}: {}\n    evidence: {:#}",
                a["kind"], a["summary"], a["evidence"]
            )
        })
        .collect()
}
