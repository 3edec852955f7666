//! `dnstrace trace` on the lab: one journey per query, end to end.
use serde_json::Value;

use dnstrace_tests::*;

const KUBERNETES: &str = "kubernetes.default.svc.cluster.local.";

/// Runs `dnstrace trace -o json` while `work` makes traffic; returns the journeys.
fn journeys(work: impl FnOnce()) -> Vec<Value> {
    let args = [
        &["trace", "-o", "json", "--timeout", "3s"][..],
        &lab_scope(),
    ]
    .concat();
    let trace = Dnstrace::start_here(Keep::Every, &args).unwrap();
    work();
    // Journeys without an answer close after the timeout.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    json_lines(&out)
}

fn from_web<'a>(js: &'a [Value], name: &str, qtype: &str) -> Vec<&'a Value> {
    js.iter()
        .filter(|j| {
            j["type"] == "journey"
                && j["client"].as_str().unwrap().starts_with("10.244.0.10:")
                && j["name"] == name
                && j["qtype"] == qtype
        })
        .collect()
}

#[test]
fn a_healthy_lookup_is_one_complete_journey() {
    require_root();
    let lab = Lab::up(&[]);
    let js = journeys(|| {
        lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"));
    });
    let found = from_web(&js, KUBERNETES, "A");
    assert_eq!(found.len(), 1, "{js:#?}");
    let j = found[0];
    assert_eq!(j["outcome"]["status"], "answered");
    assert_eq!(j["outcome"]["answers"][0], "A 10.96.0.1");
    let legs = j["legs"].as_array().unwrap();
    let endpoint = j["dnat"][1].as_str().unwrap();
    assert_eq!(j["dnat"][0], "10.96.0.10:53");
    // In order: client egress to the service, DNAT to one endpoint, arrival
    // at CoreDNS, CoreDNS's answer, reverse NAT, arrival at the client.
    let steps: Vec<(&str, bool, &str, &str)> = vec![
        ("dev_xmit", false, "10.244.0.10", "10.96.0.10:53"),
        ("dev_xmit", false, "10.244.0.10", endpoint),
        ("dev_receive", false, "10.244.0.10", endpoint),
        ("dev_xmit", true, endpoint, "10.244.0.10"),
        ("dev_xmit", true, "10.96.0.10:53", "10.244.0.10"),
        ("dev_receive", true, "10.96.0.10:53", "10.244.0.10"),
    ];
    let mut at = 0;
    for (hook, response, src, dst) in &steps {
        let found = legs[at..].iter().position(|l| {
            l["hook"] == *hook
                && l["response"] == *response
                && l["src"].as_str().unwrap().starts_with(src)
                && l["dst"].as_str().unwrap().starts_with(dst)
        });
        at += found
            .unwrap_or_else(|| panic!("no leg {hook} {src} → {dst} after leg {at}: {legs:#?}"))
            + 1;
    }
    let reverse = legs
        .iter()
        .find(|l| l["hook"] == "dev_xmit" && l["response"] == true && l["src"] == "10.96.0.10:53")
        .unwrap();
    assert_eq!(
        reverse["dnat"][1], endpoint,
        "the reverse NAT leg names the endpoint"
    );
    let sum: u64 = legs
        .iter()
        .map(|l| l["since_prev_ns"].as_u64().unwrap())
        .sum();
    let total = j["ended_ns"].as_u64().unwrap() - j["started_ns"].as_u64().unwrap();
    assert_eq!(sum, total, "leg times add up to the total");
    assert_eq!(j["incomplete"], false);
}

#[test]
fn over_200_lookups_both_coredns_endpoints_answer() {
    require_root();
    let lab = Lab::up(&[]);
    let js = journeys(|| {
        lab.traffic(&[
            "--pod", "web", "--name", KUBERNETES, "--rate", "150", "--count", "200",
        ]);
    });
    let found = from_web(&js, KUBERNETES, "A");
    assert!(found.len() >= 200, "{} journeys", found.len());
    let endpoints: std::collections::BTreeSet<&str> =
        found.iter().filter_map(|j| j["dnat"][1].as_str()).collect();
    assert_eq!(
        endpoints.into_iter().collect::<Vec<_>>(),
        vec!["10.244.0.53:53", "10.244.0.54:53"]
    );
}

#[test]
fn an_external_name_has_its_upstream_journey_linked() {
    require_root();
    let lab = Lab::up(&[]);
    let name = format!("{}.", fresh("ext"));
    let js = journeys(|| {
        lab.dig(&WEB, &format!("@{SERVICE} {name}"));
    });
    let found = from_web(&js, &name, "A");
    assert_eq!(found.len(), 1, "{js:#?}");
    let up = found[0]["upstream"].as_array().unwrap();
    assert_eq!(up.len(), 1, "{:#?}", found[0]);
    assert_eq!(up[0]["legs"][0]["dst"], "198.51.100.53:53");
    assert_eq!(up[0]["outcome"]["rcode"], "NXDOMAIN");
    // It left the node masqueraded, and came back.
    assert!(up[0]["legs"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l["snat"][1]
            .as_str()
            .is_some_and(|s| s.starts_with("198.51.100.1:"))));
    assert_eq!(found[0]["outcome"]["rcode"], "NXDOMAIN");
}

#[test]
fn a_dropped_query_ends_its_journey_with_the_kernel_reason() {
    require_root();
    let lab = Lab::up(&["--fault", "drop"]);
    let js = journeys(|| {
        for _ in 0..30 {
            if dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"))) == "timeout" {
                break;
            }
        }
    });
    let dropped = from_web(&js, KUBERNETES, "A")
        .into_iter()
        .find(|j| j["outcome"]["status"] == "dropped")
        .expect("a dropped journey");
    assert_eq!(dropped["outcome"]["reason_name"], "NETFILTER_DROP");
    assert_eq!(dropped["dnat"][1], "10.244.0.54:53");
    let last = dropped["legs"].as_array().unwrap().last().unwrap();
    assert_eq!(last["hook"], "kfree_skb");
}

#[test]
fn bridge_nf_off_shows_the_unnated_answer_dropped_at_the_client() {
    require_root();
    let lab = Lab::up(&["--fault", "bridge-nf-off"]);
    let js = journeys(|| {
        lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"));
    });
    let j = from_web(&js, KUBERNETES, "A")
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("{js:#?}"));
    let endpoint = j["dnat"][1].as_str().unwrap();
    let legs = j["legs"].as_array().unwrap();
    let at_client = legs
        .iter()
        .find(|l| {
            l["response"] == true
                && l["hook"] == "dev_receive"
                && l["dst"].as_str().unwrap().starts_with("10.244.0.10:")
                && l["iface"] == "eth0"
        })
        .unwrap_or_else(|| panic!("the answer never reached the client: {legs:#?}"));
    assert_eq!(
        at_client["src"], endpoint,
        "un-NATed: from the CoreDNS pod, not {SERVICE}"
    );
    assert_eq!(j["outcome"]["status"], "dropped");
    assert_eq!(j["outcome"]["reason_name"], "NO_SOCKET");
}

/// A hostNetwork client (in the node's namespace) asks NodeLocalDNS over
/// lo; NodeLocalDNS's own query upstream, sent from the node's namespace
/// under another address, is linked under that lookup.
#[test]
fn a_host_network_lookup_through_nodelocaldns_has_its_upstream_journey_linked() {
    require_root();
    let lab = Lab::up(&["--nodelocaldns"]);
    let name = format!("{}.", fresh("hostnet"));
    let js = journeys(|| {
        lab.dig(&NODE, &format!("@{NODELOCAL} {name}"));
    });
    let asked = format!("{NODELOCAL}:53");
    let found: Vec<&Value> = js
        .iter()
        .filter(|j| j["type"] == "journey" && j["name"] == name && j["legs"][0]["dst"] == asked)
        .collect();
    assert_eq!(found.len(), 1, "{js:#?}");
    let up = found[0]["upstream"].as_array().unwrap();
    assert!(
        up.iter().any(|u| u["legs"][0]["dst"] == "198.51.100.53:53"),
        "{:#?}",
        found[0]
    );
}
