//! Each fault raises its anomaly in each mode where it applies: kube-proxy's
//! nftables mode, and NodeLocalDNS's NOTRACK mode under either proxy mode
//! (diagnose.rs has them under iptables without NodeLocalDNS). One lab per
//! mode (in NOTRACK mode, one per fault), its faults switched on one at a
//! time, each with a trace of its own; a test per mode, so that the modes
//! run side by side.
use std::collections::BTreeSet;

use serde_json::Value;

use dnstrace_tests::*;

const KUBERNETES: &str = "kubernetes.default.svc.cluster.local.";

/// The modes, as `lab up` arguments: a new mode is one more line.
const MODES: [&[&str]; 3] = [
    &["--proxy-mode=nftables"],
    &["--proxy-mode=iptables", "--nodelocaldns=notrack"],
    &["--proxy-mode=nftables", "--nodelocaldns=notrack"],
];

/// A fault, what brings it out, and what it raises.
struct Case {
    fault: &'static str,
    /// Done before the fault is on (a cache filled, say).
    prepare: fn(&Lab),
    /// What a client does while dnstrace traces.
    work: fn(&Lab),
    /// The anomaly kinds raised, exactly.
    raises: &'static [&'static str],
    /// Kinds also allowed: the same fault seen from another place.
    also: &'static [&'static str],
}

impl Case {
    const fn new(fault: &'static str, work: fn(&Lab), raises: &'static [&'static str]) -> Self {
        Self {
            fault,
            prepare: |_| {},
            work,
            raises,
            also: &[],
        }
    }
}

/// A cluster name no cache has seen: CoreDNS answers it NXDOMAIN.
fn fresh_cluster_name(label: &str) -> String {
    format!(
        "{}.default.svc.cluster.local.",
        fresh(label).trim_end_matches(".example.com")
    )
}

fn dig_service(lab: &Lab, name: &str) {
    lab.dig(&WEB, &format!("@{SERVICE} {name}"));
}

/// A cluster name asked of NodeLocalDNS, then past the 3 s timeout after
/// its SYN to CoreDNS: that connection's set-up has failed.
fn dig_cluster_name_through_tcp(lab: &Lab) {
    dig_service(lab, &fresh_cluster_name("tcp"));
    std::thread::sleep(std::time::Duration::from_secs(2));
}

/// The faults of docs/LAB.md's table in a mode with (`notrack`) or without
/// NodeLocalDNS's NOTRACK mode. Left out: conntrack-race (whether the
/// kernel drops or resolves the clash is its own; diagnose.rs), and where
/// NodeLocalDNS takes the pods' queries off the path the fault breaks
/// (`dnstrace lab fault` says so, checked below): bridge-nf-off, drop,
/// fragments-dropped.
fn cases(notrack: bool) -> Vec<Case> {
    let mut cases = vec![
        Case::new(
            "forward-loop",
            |lab| {
                lab.dig(&WEB, &format!("@10.244.0.53 {}", fresh("loop")));
            },
            &["forwarding_loop"],
        ),
        Case {
            // NodeLocalDNS goes on asking upstream after the client gave
            // up: its late tries, with no lookup open to link to, are
            // journeys of their own, dropped at the upstream's firewall.
            also: if notrack {
                &["unanswered", "dropped"]
            } else {
                &["unanswered"]
            },
            ..Case::new(
                "upstream-timeout",
                |lab| dig_service(lab, &fresh("ut")),
                &["upstream_timeout"],
            )
        },
        Case::new(
            "search-leak",
            |lab| {
                lab.traffic(&["--pod", "web", "--name", "orders"]);
            },
            &["search_domain_leak"],
        ),
        Case::new(
            "loopback-nameserver",
            |lab| {
                lab.traffic(&["--pod", "web", "--name", KUBERNETES]);
            },
            &["loopback_nameserver"],
        ),
        Case::new(
            "servfail",
            |lab| dig_service(lab, &fresh("sf")),
            &["failing_answers"],
        ),
    ];
    cases.extend(if notrack {
        notrack_cases()
    } else {
        proxied_cases()
    });
    cases
}

/// In NOTRACK mode: the pods ask NodeLocalDNS on kube-dns's IP, and only
/// NodeLocalDNS's TCP queries to CoreDNS (kube-dns-upstream) meet
/// kube-proxy's rules.
fn notrack_cases() -> Vec<Case> {
    vec![
        Case {
            // NodeLocalDNS falls back to UDP, which is not translated either.
            also: &["unanswered", "service_not_translated"],
            ..Case::new(
                "no-dnat",
                dig_cluster_name_through_tcp,
                &["dns_tcp_unreachable"],
            )
        },
        Case {
            // The client's own lookup, unanswered, is the same fault seen from it.
            also: &["unanswered"],
            ..Case::new(
                "no-dns-tcp",
                dig_cluster_name_through_tcp,
                &["dns_tcp_unreachable"],
            )
        },
        // The lab's NodeLocalDNS (unbound) gives a try some 400 ms: the
        // upstream's answers come after it gave up. The client may see
        // the answer slow, or none.
        Case {
            also: &["slow_answers", "unanswered"],
            ..Case::new(
                "slow-upstream",
                |lab| dig_service(lab, &fresh("slow")),
                &["upstream_timeout"],
            )
        },
        Case::new(
            "nodelocaldns-loop",
            |lab| {
                lab.dig(&WEB, &format!("@{NODELOCAL} {}", fresh("nl")));
            },
            &["forwarding_loop"],
        ),
    ]
}

/// Without NodeLocalDNS: the pods' queries go through kube-proxy's DNAT to
/// the CoreDNS pods, over the bridge.
fn proxied_cases() -> Vec<Case> {
    vec![
        Case::new(
            "no-dnat",
            |lab| dig_service(lab, &fresh_cluster_name("nd")),
            &["service_not_translated"],
        ),
        // Slow answers are a finding as a pattern: three of them.
        Case::new(
            "slow-upstream",
            |lab| (0..3).for_each(|_| dig_service(lab, &fresh("slow"))),
            &["slow_answers"],
        ),
        Case::new(
            "no-dns-tcp",
            |lab| {
                lab.dig(&WEB, &format!("@{SERVICE} +bufsize=1232 {BIG_NAME} TXT"));
                // Past the 3 s timeout after the SYN: its set-up has failed.
                std::thread::sleep(std::time::Duration::from_secs(2));
            },
            &["dns_tcp_unreachable"],
        ),
        Case::new(
            "bridge-nf-off",
            |lab| dig_service(lab, KUBERNETES),
            &[
                "bridge_nf_call_iptables_off",
                "reply_from_unexpected_source",
            ],
        ),
        Case::new(
            "drop",
            |lab| {
                for _ in 0..30 {
                    if dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"))) == "timeout"
                    {
                        break;
                    }
                }
            },
            &["dropped"],
        ),
        Case {
            prepare: |lab| {
                // Cached in both CoreDNS pods, so that what is lost is their answer.
                for pod in ["10.244.0.53", "10.244.0.54"] {
                    lab.dig(&WEB, &format!("@{pod} +bufsize=4096 {HUGE_NAME} TXT"));
                }
            },
            ..Case::new(
                "fragments-dropped",
                |lab| {
                    lab.dig(&WEB, &format!("@{SERVICE} +bufsize=4096 {HUGE_NAME} TXT"));
                },
                &["fragment_lost"],
            )
        },
    ]
}

/// The faults NodeLocalDNS takes the pods' path away from.
const OFF_NODELOCAL_PATH: [&str; 3] = ["bridge-nf-off", "drop", "fragments-dropped"];

/// A loop fault stands for a CoreDNS without the loop plugin and its own
/// retries: only a restart (as `lab up --fault` starts it) gives it that.
fn is_loop(fault: &str) -> bool {
    fault.ends_with("loop")
}

fn switch(lab: &Lab, fault: &str, on: bool) {
    lab.fault(fault, on);
    if is_loop(fault) {
        lab.restart_coredns();
    }
}

#[test]
fn each_fault_raises_its_anomaly_in_nftables_mode() {
    each_fault_raises_its_anomaly_in(MODES[0]);
}

#[test]
fn each_fault_raises_its_anomaly_with_notrack_nodelocaldns_under_iptables() {
    each_fault_raises_its_anomaly_in(MODES[1]);
}

#[test]
fn each_fault_raises_its_anomaly_with_notrack_nodelocaldns_under_nftables() {
    each_fault_raises_its_anomaly_in(MODES[2]);
}

/// Each fault of the mode, with a trace of its own; every failure said
/// at the end.
fn each_fault_raises_its_anomaly_in(mode: &[&str]) {
    require_root();
    let mut failures = Vec::new();
    let notrack = mode.contains(&"--nodelocaldns=notrack");
    let mut lab = Lab::up(mode);
    for case in cases(notrack) {
        if notrack {
            // NodeLocalDNS goes on retrying what a fault broke for
            // longer than a trace: each fault gets a lab of its own.
            drop(lab);
            lab = Lab::up(mode);
        }
        (case.prepare)(&lab);
        switch(&lab, case.fault, true);
        let (lines, _) = lab.trace_during_with(dnstrace_release_bin(), &[], || (case.work)(&lab));
        switch(&lab, case.fault, false);
        if let Some(wrong) = check(&case, &lines) {
            failures.push(format!(
                "lab up {} --fault {}: {wrong}",
                mode.join(" "),
                case.fault
            ));
        }
    }
    if notrack {
        failures.extend(OFF_NODELOCAL_PATH.iter().filter_map(|f| says_off_path(f)));
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

/// What is wrong with the anomalies raised, if anything.
fn check(case: &Case, lines: &[Value]) -> Option<String> {
    let summary = lines
        .iter()
        .find(|l| l["type"] == "summary")
        .expect("a summary at exit");
    let anomalies = summary["anomalies"].as_array().expect("anomalies");
    let kinds: BTreeSet<&str> = anomalies
        .iter()
        .filter_map(|a| a["kind"].as_str())
        .collect();
    let required: BTreeSet<&str> = case.raises.iter().copied().collect();
    let allowed = |k: &&str| required.contains(k) || case.also.contains(k);
    let right = required.is_subset(&kinds) && kinds.iter().all(allowed);
    (!right).then(|| {
        format!(
            "raised {kinds:?}, expected {:?} (or also {:?}):\n{anomalies:#?}",
            case.raises, case.also
        )
    })
}

/// `lab fault FAULT on` with NodeLocalDNS warns that it changes nothing on
/// the pods' path; what is wrong if it does not.
fn says_off_path(fault: &str) -> Option<String> {
    let on = dnstrace(&["lab", "fault", fault, "on"]);
    let said = String::from_utf8_lossy(&on.stderr).into_owned();
    let off = dnstrace(&["lab", "fault", fault, "off"]);
    let warned = said.contains(&format!(
        "warning: {fault} changes nothing on the pods' DNS path with NodeLocalDNS"
    ));
    (!(on.status.success() && off.status.success() && warned))
        .then(|| format!("lab fault {fault} on, with NodeLocalDNS: {said}"))
}
