//! The lab in kube-proxy's nftables mode (`lab up --proxy-mode nftables`):
//! dnstrace finds kube-dns in the `ip kube-proxy` table, follows lookups
//! through its DNAT, and still diagnoses a service left untranslated.
use serde_json::Value;

use dnstrace_tests::*;

const KUBERNETES: &str = "kubernetes.default.svc.cluster.local.";
const NFTABLES: &str = "--proxy-mode=nftables";
/// What `trace` says at start when the service came from nftables.
const FOUND: &str = "services from kube-proxy's nftables table: DNS at 10.96.0.10";

/// Runs `dnstrace trace -o json` on the lab node while `work` runs;
/// returns the JSON lines and stderr.
fn trace(lab: &Lab, work: impl FnOnce()) -> (Vec<Value>, Vec<String>) {
    lab.trace_during(&[], work)
}

#[test]
fn nftables_mode_is_found_and_lookups_go_through_its_dnat_to_coredns() {
    require_root();
    let lab = Lab::up(&[NFTABLES]);
    let (lines, stderr) = trace(&lab, || {
        for _ in 0..3 {
            let out = lab.dig(WEB, &format!("@{SERVICE} {KUBERNETES}"));
            assert_eq!(dig_status(&out), "NOERROR", "{out}");
        }
    });
    assert!(stderr.iter().any(|l| l.contains(FOUND)), "{stderr:#?}");
    let journeys: Vec<&Value> = lines
        .iter()
        .filter(|j| j["type"] == "journey" && j["name"] == KUBERNETES && j["qtype"] == "A")
        .collect();
    assert_eq!(journeys.len(), 3, "{lines:#?}");
    for j in journeys {
        assert_eq!(j["outcome"]["status"], "answered", "{j:#}");
        assert_eq!(j["dnat"][0], "10.96.0.10:53", "{j:#}");
        let endpoint = j["dnat"][1].as_str().unwrap();
        assert!(
            ["10.244.0.53:53", "10.244.0.54:53"].contains(&endpoint),
            "DNAT to a CoreDNS pod: {j:#}"
        );
    }
    assert_eq!(anomaly_kinds(&lines), Vec::<String>::new());
}

#[test]
fn nftables_mode_without_its_dnat_is_a_service_not_translated() {
    require_root();
    let lab = Lab::up(&[NFTABLES, "--fault", "no-dnat"]);
    let (lines, stderr) = trace(&lab, || {
        lab.dig(WEB, &format!("@{SERVICE} {KUBERNETES}"));
    });
    assert!(stderr.iter().any(|l| l.contains(FOUND)), "{stderr:#?}");
    assert_eq!(anomaly_kinds(&lines), ["service_not_translated"]);
}

#[test]
fn dual_stack_nftables_mode_answers_over_ipv6_through_the_ip6_table() {
    require_root();
    let lab = Lab::up(&[NFTABLES, "--ipv6"]);
    let (lines, stderr) = trace(&lab, || {
        let out = lab.dig(WEB, &format!("@fd00:10:96::a {KUBERNETES}"));
        assert_eq!(dig_status(&out), "NOERROR", "{out}");
    });
    let both = format!("{FOUND}, fd00:10:96::a");
    assert!(stderr.iter().any(|l| l.contains(&both)), "{stderr:#?}");
    let j = lines
        .iter()
        .find(|j| j["type"] == "journey" && j["name"] == KUBERNETES)
        .unwrap();
    assert_eq!(j["dnat"][0], "[fd00:10:96::a]:53", "{j:#}");
    assert_eq!(anomaly_kinds(&lines), Vec::<String>::new());
}

#[test]
fn iptables_mode_names_its_backend_at_start() {
    require_root();
    let lab = Lab::up(&[]);
    let (_, stderr) = trace(&lab, || {});
    assert!(
        stderr
            .iter()
            .any(|l| l.contains("services from iptables") && l.contains("DNS at 10.96.0.10")),
        "{stderr:#?}"
    );
}

/// A node without proxy rules (as with a kube-proxy replacement): the
/// traced pod's nameserver stands for the DNS service, so a query to it
/// that nothing translates is still a service_not_translated.
#[test]
fn without_proxy_rules_the_pods_nameserver_stands_for_the_service() {
    require_root();
    let lab = Lab::up(&[NFTABLES]);
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            NODE,
            "nft",
            "delete",
            "table",
            "ip",
            "kube-proxy",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let pod = [
        "--containerd-root",
        "/run/dnstrace-lab/containerd",
        "--pod",
        "web",
    ];
    let (lines, stderr) = lab.trace_during(&pod, || {
        lab.dig(WEB, &format!("@{SERVICE} {KUBERNETES}"));
    });
    let fallback = "services: no proxy rules on the node (socket-level balancing?); DNS at 10.96.0.10, from the pods' resolv.conf";
    assert!(stderr.iter().any(|l| l.contains(fallback)), "{stderr:#?}");
    assert_eq!(anomaly_kinds(&lines), ["service_not_translated"]);
}
