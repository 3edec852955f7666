//! The lab in kube-proxy's nftables mode (`lab up --proxy-mode nftables`):
//! dnstrace finds kube-dns in the `ip kube-proxy` table, follows lookups
//! through its DNAT, and still diagnoses a service left untranslated. And
//! in socket-lb mode (no rules; the lab's cgroup programs rewrite the
//! service address at the socket): lookups leave already translated.
use std::process::Command;

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
            let out = lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"));
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
        lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"));
    });
    assert!(stderr.iter().any(|l| l.contains(FOUND)), "{stderr:#?}");
    assert_eq!(anomaly_kinds(&lines), ["service_not_translated"]);
}

#[test]
fn dual_stack_nftables_mode_answers_over_ipv6_through_the_ip6_table() {
    require_root();
    let lab = Lab::up(&[NFTABLES, "--ipv6"]);
    let (lines, stderr) = trace(&lab, || {
        let out = lab.dig(&WEB, &format!("@fd00:10:96::a {KUBERNETES}"));
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
            &NODE,
            "nft",
            "delete",
            "table",
            "ip",
            "kube-proxy",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (lines, stderr) = lab.trace_during(&["--pod", "web"], || {
        lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"));
    });
    let fallback = "services: no proxy rules on the node (socket-level balancing?); DNS at 10.96.0.10, from the pods' resolv.conf";
    assert!(stderr.iter().any(|l| l.contains(fallback)), "{stderr:#?}");
    assert_eq!(anomaly_kinds(&lines), ["service_not_translated"]);
}

const SOCKET_LB: &str = "--proxy-mode=socket-lb";
const FROM_RESOLV_CONF: &str = "services: no proxy rules on the node (socket-level balancing?); DNS at 10.96.0.10, from the pods' resolv.conf";
const COREDNS_PODS: [&str; 2] = ["10.244.0.53:53", "10.244.0.54:53"];
const CLIENT_PODS: [&str; 2] = ["10.244.0.10", "10.244.0.11"];

/// Lookups from both client pods with `client`'s habits, `per_pod` each.
fn socket_lb_traffic(lab: &Lab, client: &str, per_pod: u32) -> Vec<Value> {
    let count = per_pod.to_string();
    let args = [
        "--client",
        client,
        "--rate",
        "10",
        "--count",
        &count,
        "--name",
        "kubernetes.default",
        "--name",
        "www.example.com",
    ];
    lab.traffic(&args)
}

#[test]
fn socket_lb_lookups_leave_translated_to_a_coredns_pod_and_raise_nothing() {
    require_root();
    let lab = Lab::up(&[SOCKET_LB]);
    let mut outcomes = Vec::new();
    // The lab's traces know its pods: with no target, trace takes the DNS
    // service from the ClusterFirst pods' resolv.conf.
    let (lines, stderr) = lab.trace_during(&[], || {
        for client in ["stub", "glibc"] {
            outcomes.extend(socket_lb_traffic(&lab, client, 30));
        }
    });
    assert!(
        stderr.iter().any(|l| l.contains(FROM_RESOLV_CONF)),
        "{stderr:#?}"
    );
    assert_eq!(outcomes.len(), 120, "30 from each pod, with each client");
    assert!(outcomes.iter().all(|o| o["ok"] == true), "{outcomes:#?}");
    let journeys: Vec<&Value> = lines.iter().filter(|j| j["type"] == "journey").collect();
    assert!(journeys.len() >= outcomes.len(), "{lines:#?}");
    for j in &journeys {
        let client = j["client"].as_str().unwrap();
        assert!(
            CLIENT_PODS
                .iter()
                .any(|ip| client.starts_with(&format!("{ip}:"))),
            "a client's journey: {j:#}"
        );
        assert_eq!(j["dnat"], Value::Null, "no DNAT on the wire: {j:#}");
        let to = j["legs"][0]["dst"].as_str().unwrap();
        assert!(COREDNS_PODS.contains(&to), "left for a CoreDNS pod: {j:#}");
        assert_eq!(j["outcome"]["status"], "answered", "{j:#}");
    }
    let upstream = journeys
        .iter()
        .filter(|j| {
            j["name"] == "www.example.com."
                && j["upstream"].as_array().is_some_and(|u| !u.is_empty())
        })
        .count();
    assert!(
        upstream > 0,
        "CoreDNS's upstream queries linked under their clients': {lines:#?}"
    );
    assert_eq!(anomaly_kinds(&lines), Vec::<String>::new());
}

#[test]
fn socket_lb_without_backends_is_a_service_not_translated_by_the_socket_balancer() {
    require_root();
    let lab = Lab::up(&[SOCKET_LB, "--fault", "no-dnat"]);
    let (lines, stderr) = lab.trace_during(&[], || {
        let out = lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"));
        assert!(
            out.contains("timed out"),
            "nobody answers the service IP: {out}"
        );
    });
    assert!(
        stderr.iter().any(|l| l.contains(FROM_RESOLV_CONF)),
        "{stderr:#?}"
    );
    assert_eq!(anomaly_kinds(&lines), ["service_not_translated"]);
    let found = lines.iter().find(|l| l["type"] == "anomaly").unwrap();
    let cause = found["cause"].as_str().unwrap();
    assert!(
        cause.contains("at the socket") && !cause.contains("kube-proxy's rules"),
        "{found:#}"
    );
}

/// The balancer's programs, by name and kernel id, as its pinned links
/// hold them (other labs may have balancers of their own).
fn balancer_programs() -> Vec<(&'static str, u64)> {
    let pins = format!("{}-bpf", lab_dir());
    BALANCER
        .iter()
        .map(|&name| {
            let pin = format!("{pins}/{name}");
            let link = run(Command::new("bpftool").args(["-j", "link", "show", "pinned", &pin]))
                .unwrap_or_else(|e| panic!("{name} is not pinned: {e}"));
            let link: Value = serde_json::from_str(&link).unwrap();
            (name, link["prog_id"].as_u64().unwrap())
        })
        .collect()
}

const BALANCER: [&str; 4] = [
    "lb_connect4",
    "lb_sendmsg4",
    "lb_recvmsg4",
    "lb_getpeername4",
];

/// A fault that changes nothing without kube-proxy's DNAT is refused; the
/// balancer is attached at the root cgroup and `lab down` detaches it.
#[test]
fn socket_lb_refuses_bridge_nf_off_and_lab_down_detaches_the_balancer() {
    require_root();
    let lab = Lab::up(&[SOCKET_LB]);
    let programs = || -> Vec<u64> {
        let all: Vec<Value> = serde_json::from_str(
            &run(Command::new("bpftool").args(["-j", "prog", "show"])).unwrap(),
        )
        .unwrap();
        all.iter().filter_map(|p| p["id"].as_u64()).collect()
    };
    let balancer = balancer_programs();
    assert!(balancer.iter().all(|(_, id)| programs().contains(id)));
    let out = dnstrace(&["lab", "fault", "bridge-nf-off", "on"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not apply with --proxy-mode socket-lb"),
        "{err}"
    );
    let out = dnstrace(&["lab", "down"]);
    assert!(out.status.success(), "{out:?}");
    let loaded = programs();
    for (name, id) in balancer {
        assert!(!loaded.contains(&id), "{name} is still loaded");
    }
    assert!(!std::path::Path::new(&format!("{}-bpf", lab_dir())).exists());
    drop(lab);
}

/// The faults that do not live in the proxy's rules raise what they raise
/// under kube-proxy: the drop cuts the way to one CoreDNS pod, which the
/// balancer still picks; the upstream ones are past CoreDNS.
#[test]
fn socket_lb_faults_beyond_the_proxy_raise_their_usual_anomalies() {
    require_root();
    let lab = Lab::up(&[SOCKET_LB]);
    let kinds_with = |fault: &str, work: &dyn Fn()| {
        lab.fault(fault, true);
        let (lines, _) = lab.trace_during(&[], work);
        lab.fault(fault, false);
        anomaly_kinds(&lines)
    };
    let dropped = kinds_with("drop", &|| {
        for _ in 0..30 {
            if dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"))) == "timeout" {
                break;
            }
        }
    });
    assert_eq!(dropped, ["dropped"]);
    let timeout = kinds_with("upstream-timeout", &|| {
        lab.dig(&WEB, &format!("@{SERVICE} {}", fresh("slb-ut")));
    });
    assert!(
        timeout.contains(&"upstream_timeout".to_owned()),
        "{timeout:?}"
    );
    assert!(
        timeout
            .iter()
            .all(|k| ["upstream_timeout", "unanswered"].contains(&k.as_str())),
        "{timeout:?}"
    );
    let servfail = kinds_with("servfail", &|| {
        lab.dig(&WEB, &format!("@{SERVICE} {}", fresh("slb-sf")));
    });
    assert_eq!(servfail, ["failing_answers"]);
}

/// A UDP socket connected to kube-dns from network namespace `ns`: the
/// peer the kernel keeps (its /proc/net/udp row, `0A00600A:0035` for
/// 10.96.0.10:53) and the one getpeername() tells.
fn connect_to_kube_dns(ns: &str) -> (String, std::net::SocketAddr) {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        // SAFETY: setns on this thread only, with a namespace fd.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        socket.connect((SERVICE, 53)).unwrap();
        let local = format!(":{:04X}", socket.local_addr().unwrap().port());
        let table = std::fs::read_to_string("/proc/thread-self/net/udp").unwrap();
        let row: Vec<&str> = table
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.get(1).is_some_and(|a| a.ends_with(&local)))
            .unwrap();
        (row[2].to_owned(), socket.peer_addr().unwrap())
    })
    .join()
    .unwrap()
}

/// The balancer runs for every socket of the machine (the root cgroup)
/// but rewrites only those of the lab's namespaces: one made elsewhere
/// keeps the service as its peer.
#[cfg(target_endian = "little")]
#[test]
fn socket_lb_rewrites_only_sockets_of_the_labs_namespaces() {
    require_root();
    let _lab = Lab::up(&[SOCKET_LB]);
    let (kernel, named) = connect_to_kube_dns(&WEB);
    assert!(
        ["3500F40A:0035", "3600F40A:0035"].contains(&kernel.as_str()),
        "connected to a CoreDNS pod: {kernel}"
    );
    assert_eq!(
        named.to_string(),
        "10.96.0.10:53",
        "getpeername gives the service"
    );
    let outside = Netns::new("slb").unwrap();
    outside.ip("route add 10.0.0.0/8 dev lo").unwrap();
    let (kernel, named) = connect_to_kube_dns(&outside.name);
    assert_eq!(kernel, "0A00600A:0035", "left as it was");
    assert_eq!(named.to_string(), "10.96.0.10:53");
}
