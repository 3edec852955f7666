//! Every DNS message whatever its transport, the lab's node traced whole: DNS over TCP through the service's DNAT, a truncated
//! answer and its TCP retry, NodeLocalDNS's TCP leg, and an answer in IP
//! fragments.
use serde_json::Value;

use dnstrace_tests::*;

const KUBE_DNS: &str = "kube-dns.kube-system.svc.cluster.local.";

/// Traces the lab node keeping every lookup while `work` runs; returns the
/// JSON lines and the exit summary.
fn trace(work: impl FnOnce()) -> (Vec<Value>, Value) {
    let args = [&["trace", "-o", "json"][..], &lab_scope()].concat();
    let trace = Dnstrace::start_here(Keep::Every, &args).unwrap();
    work();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    (json_lines(&out), exit_summary(&stderr))
}

fn journeys<'a>(lines: &'a [Value], name: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["type"] == "journey" && l["name"] == name)
        .collect()
}

/// (hook, iface's netns is the client's, src, dst, dnat) of each leg.
fn places(j: &Value) -> Vec<(String, String, String, Value)> {
    j["legs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["direction"].as_str().unwrap().to_owned(),
                l["src"].as_str().unwrap().to_owned(),
                l["dst"].as_str().unwrap().to_owned(),
                l["dnat"].clone(),
            )
        })
        .collect()
}

#[test]
fn a_tcp_lookup_through_the_service_is_a_journey_with_every_leg_and_its_connection() {
    require_root();
    let lab = Lab::up(&[]);
    let (lines, exit) = trace(|| {
        let out = lab.dig(&WEB, &format!("@{SERVICE} +tcp {KUBE_DNS}"));
        assert_eq!(dig_status(&out), "NOERROR", "{out}");
    });
    assert!(
        exit["packets"].as_u64() > Some(0) && exit["cut"] == 0,
        "DNS over TCP is read whole: {exit}"
    );
    let js = journeys(&lines, KUBE_DNS);
    assert_eq!(js.len(), 1, "{js:#?}");
    let j = js[0];
    assert_eq!(j["tcp"], true);
    assert_eq!(j["outcome"]["status"], "answered");
    assert_eq!(j["outcome"]["answers"][0], "A 10.96.0.10");
    let (asked, to) = (&j["dnat"][0], &j["dnat"][1]);
    assert_eq!(asked, "10.96.0.10:53");
    assert!(
        to.as_str().unwrap().starts_with("10.244.0.5"),
        "to a CoreDNS pod: {to}"
    );
    let client = j["client"].as_str().unwrap();
    let legs = places(j);
    // Out of the client to the service, DNATed on the node, into CoreDNS,
    // and the answer back the same way, reverse-NATed.
    let has = |dir: &str, src: &str, dst: &str| {
        legs.iter()
            .any(|(d, s, t, _)| d == dir && s == src && t == dst)
    };
    let pod = to.as_str().unwrap();
    assert!(has("egress", client, "10.96.0.10:53"), "{legs:#?}");
    assert!(has("ingress", client, pod), "{legs:#?}");
    assert!(has("egress", pod, client), "{legs:#?}");
    assert!(has("ingress", "10.96.0.10:53", client), "{legs:#?}");
    assert!(
        legs.iter().any(|(_, _, _, dnat)| dnat[1] == *to),
        "a leg past the DNAT shows it: {legs:#?}"
    );
    let c = &j["connection"];
    assert_eq!(c["syns"], 1, "{c}");
    assert!(c["syn_ack_ms"].as_f64().is_some(), "{c}");
    assert_eq!(c["reset"], Value::Null, "{c}");
}

#[test]
fn a_truncated_answer_and_its_tcp_retry_are_one_lookup() {
    require_root();
    let lab = Lab::up(&[]);
    let name = format!("{BIG_NAME}.");
    let (lines, _) = trace(|| {
        let out = lab.dig(&WEB, &format!("@{SERVICE} +bufsize=1232 {BIG_NAME} TXT"));
        assert!(out.contains("Truncated, retrying in TCP mode"), "{out}");
        assert_eq!(dig_status(&out), "NOERROR", "{out}");
    });
    let js = journeys(&lines, &name);
    let udp: Vec<_> = js.iter().filter(|j| j["tcp"] == false).collect();
    let tcp: Vec<_> = js.iter().filter(|j| j["tcp"] == true).collect();
    assert_eq!((udp.len(), tcp.len()), (1, 1), "{js:#?}");
    assert_eq!(udp[0]["outcome"]["truncated"], true);
    assert_eq!(tcp[0]["outcome"]["status"], "answered");
    assert!(!tcp[0]["outcome"]["answers"].as_array().unwrap().is_empty());
    assert_eq!(udp[0]["lookup"], tcp[0]["lookup"], "one lookup");
    assert_ne!(udp[0]["client"], tcp[0]["client"], "from two sockets");
}

#[test]
fn an_answer_in_ip_fragments_is_answered_whole() {
    require_root();
    let lab = Lab::up(&[]);
    let name = format!("{HUGE_NAME}.");
    let (lines, exit) = trace(|| {
        let out = lab.dig(&WEB, &format!("@{SERVICE} +bufsize=4096 {HUGE_NAME} TXT"));
        assert!(out.contains("(UDP)"), "{out}");
        assert_eq!(dig_status(&out), "NOERROR", "{out}");
    });
    let js = journeys(&lines, &name);
    assert_eq!(js.len(), 1, "{js:#?}\n{exit}");
    let j = js[0];
    assert_eq!(j["tcp"], false);
    assert_eq!(j["outcome"]["status"], "answered", "{j}");
    assert_eq!(j["outcome"]["truncated"], false);
    let answer = j["outcome"]["answers"][0].as_str().unwrap();
    assert!(answer.len() > 2500, "the whole record: {answer}");
}

#[test]
fn nodelocaldns_tcp_leg_is_under_the_clients_lookup() {
    require_root();
    let lab = Lab::up(&["--nodelocaldns"]);
    let (lines, _) = trace(|| {
        let out = lab.dig(&WEB, &format!("@{NODELOCAL} {KUBE_DNS}"));
        assert_eq!(dig_status(&out), "NOERROR", "{out}");
    });
    let top: Vec<_> = journeys(&lines, KUBE_DNS)
        .into_iter()
        .filter(|j| j["client"].as_str().unwrap().starts_with("10.244.0.10:"))
        .collect();
    assert_eq!(top.len(), 1, "{top:#?}");
    let j = top[0];
    assert_eq!(j["tcp"], false);
    assert_eq!(j["outcome"]["status"], "answered");
    let up = j["upstream"].as_array().unwrap();
    let to_kube_dns: Vec<_> = up
        .iter()
        .filter(|u| u["tcp"] == true && u["dnat"][0] == "10.96.0.10:53")
        .collect();
    assert_eq!(to_kube_dns.len(), 1, "NodeLocalDNS's TCP query: {up:#?}");
    let u = to_kube_dns[0];
    assert_eq!(u["outcome"]["status"], "answered", "{u}");
    assert!(u["connection"]["syn_ack_ms"].as_f64().is_some(), "{u}");
}

#[test]
fn several_queries_on_one_connection_are_journeys_sharing_it() {
    require_root();
    let lab = Lab::up(&[]);
    let names = [KUBE_DNS, "kubernetes.default.svc.cluster.local."];
    let (lines, _) = trace(|| {
        let out = lab.dig(
            &WEB,
            &format!("@{SERVICE} +tcp +keepopen {} {}", names[0], names[1]),
        );
        assert_eq!(out.matches("status: NOERROR").count(), 2, "{out}");
    });
    let js: Vec<&Value> = names.iter().flat_map(|n| journeys(&lines, n)).collect();
    assert_eq!(js.len(), 2, "{js:#?}");
    assert_eq!(js[0]["client"], js[1]["client"], "one socket");
    assert_ne!(js[0]["id"], js[1]["id"], "two journeys");
    let syn = |j: &Value| j["connection"]["syn_ns"].clone();
    assert!(syn(js[0]).is_u64(), "{}", js[0]);
    assert_eq!(syn(js[0]), syn(js[1]), "one connection");
}
