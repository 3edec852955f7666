//! The shapes real clusters have, in the lab: CoreDNS's loop plugin probe
//! and per-try deadline upstream. Each is checked for real: resolver logs,
//! rule counters, and what `dnstrace trace -o json` sees.
use std::process::Command;

use serde_json::Value;

use dnstrace_tests::*;

/// `dnstrace trace -o json` over the lab node while `work` runs: its JSON
/// lines.
fn trace(lab: &Lab, work: impl FnOnce()) -> Vec<Value> {
    lab.trace_during(&[], work).0
}

fn trace_with(lab: &Lab, extra: &[&str], work: impl FnOnce()) -> Vec<Value> {
    lab.trace_during(extra, work).0
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
    let summary = lines.iter().find(|l| l["type"] == "summary").unwrap();
    eprintln!(
        "anomalies raised around the probes: {:?}\n{:#}",
        anomaly_kinds(&lines),
        summary["anomalies"]
    );
}

/// The DROP counter of the upstream's filter INPUT rule for UDP.
fn upstream_drops() -> u64 {
    let rules =
        run(Command::new("ip").args(["netns", "exec", &UPSTREAM_NS, "iptables", "-nvxL", "INPUT"]))
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
        .args(["netns", "exec", &WEB, "dig", "+tries=1", "+time=7"])
        .arg(format!("@{SERVICE}"))
        .arg(&name)
        .output()
        .unwrap();
    assert_eq!(dig_status(&String::from_utf8_lossy(&out.stdout)), "timeout");
    assert_eq!(upstream_drops() - before, 2, "a first try and one retry");
}

fn in_node(program: &str, args: &[&str]) -> String {
    run(Command::new("ip")
        .args(["netns", "exec", &NODE, program])
        .args(args))
    .unwrap()
}

/// The node's conntrack entries of `proto` flows to `dst`, one line each.
fn node_flows(proto: &str, dst: &str) -> Vec<String> {
    let table = in_node("conntrack", &["-L", "-p", proto, "--orig-dst", dst]);
    table.lines().map(str::to_owned).collect()
}

/// Names every healthy lab answers (`lab traffic`'s default adds a
/// nonexistent one), with kube-dns's full name in the cluster domain.
const ANSWERED: [&str; 5] = [
    "kubernetes.default",
    "db.default",
    "www.example.com",
    "chain.example.com",
    "many.example.com",
];

/// `lab traffic` with `args` from every client pod while `dnstrace trace`
/// watches: every lookup answered; the anomalies raised, shown for the
/// report.
fn healthy_traffic(lab: &Lab, args: &[&str]) -> Vec<String> {
    healthy_traffic_in(lab, "cluster.local", args)
}

fn healthy_traffic_in(lab: &Lab, domain: &str, args: &[&str]) -> Vec<String> {
    let kube_dns = format!("kube-dns.kube-system.svc.{domain}");
    let mut traffic = args.to_vec();
    traffic.extend(ANSWERED.iter().flat_map(|n| ["--name", n]));
    traffic.extend(["--name", &kube_dns]);
    let mut outcomes = Vec::new();
    let lines = trace(lab, || outcomes = lab.traffic(&traffic));
    assert!(!outcomes.is_empty());
    for o in &outcomes {
        assert_eq!(o["ok"], true, "{o}");
    }
    let kinds = anomaly_kinds(&lines);
    let summary = lines.iter().find(|l| l["type"] == "summary").unwrap();
    eprintln!(
        "anomalies during `lab traffic {}`: {kinds:?}\n{:#}",
        traffic.join(" "),
        summary["anomalies"]
    );
    kinds
}

#[test]
fn notrack_nodelocaldns_answers_kube_dns_queries_without_dnat() {
    require_root();
    let lab = Lab::up(&["--nodelocaldns=notrack"]);
    let resolv = std::fs::read_to_string(format!("/etc/netns/{WEB}/resolv.conf")).unwrap();
    assert!(
        resolv.starts_with(&format!("nameserver {SERVICE}\n")),
        "{resolv}"
    );
    let raw = in_node("iptables-save", &["-t", "raw"]);
    for rule in [
        "-A PREROUTING -d 10.96.0.10/32 -p udp -m comment --comment \"NodeLocal DNS Cache: skip conntrack\" -m udp --dport 53 -j NOTRACK",
        "-A OUTPUT -s 10.96.0.10/32 -p udp -m comment --comment \"NodeLocal DNS Cache: skip conntrack\" -m udp --sport 53 -j NOTRACK",
        "-A PREROUTING -d 169.254.20.10/32 -p tcp -m comment --comment \"NodeLocal DNS Cache: skip conntrack\" -m tcp --dport 53 -j NOTRACK",
    ] {
        assert!(raw.contains(rule), "{rule}\n{raw}");
    }
    let filter = in_node("iptables-save", &["-t", "filter"]);
    assert!(filter.contains("-A INPUT -d 10.96.0.10/32 -p udp -m comment --comment \"NodeLocal DNS Cache: allow DNS traffic\" -m udp --dport 53 -j ACCEPT"), "{filter}");
    let addrs = in_node("ip", &["-4", "addr", "show", "dev", "nodelocaldns"]);
    assert!(
        addrs.contains("169.254.20.10/32") && addrs.contains("10.96.0.10/32"),
        "{addrs}"
    );

    in_node("conntrack", &["-F"]);
    let name = "kube-dns.kube-system.svc.cluster.local";
    let out = lab.dig(&WEB, &format!("@{SERVICE} {name}"));
    assert!(
        dig_status(&out) == "NOERROR" && out.contains("10.96.0.10"),
        "{out}"
    );
    assert!(
        lab.log("nodelocaldns").contains(&format!(" {name}. A IN")),
        "NodeLocalDNS answered"
    );
    assert_eq!(
        node_flows("udp", SERVICE),
        Vec::<String>::new(),
        "untracked, so never DNATed"
    );
    let upstream = node_flows("tcp", "10.96.0.11");
    assert!(
        upstream
            .iter()
            .any(|f| f.contains("src=10.244.0.53") || f.contains("src=10.244.0.54")),
        "kube-dns-upstream DNATed to CoreDNS: {upstream:?}"
    );
    let out = lab.dig(&WEB, &format!("@{SERVICE} www.example.com"));
    assert!(out.contains("198.51.100.80"), "{out}");
    healthy_traffic(&lab, &["--rate", "20", "--duration", "2s"]);
}

fn resolv_conf(ns: &str) -> String {
    std::fs::read_to_string(format!("/etc/netns/{ns}/resolv.conf")).unwrap()
}

#[test]
fn another_cluster_domain_is_served_searched_and_cached_under_its_name() {
    require_root();
    let lab = Lab::up(&["--cluster-domain", "corp.internal", "--nodelocaldns"]);
    assert!(
        resolv_conf(&WEB)
            .contains("\nsearch default.svc.corp.internal svc.corp.internal corp.internal\n"),
        "{}",
        resolv_conf(&WEB)
    );
    for server in [SERVICE, NODELOCAL] {
        let out = lab.dig(
            &WEB,
            &format!("@{server} kubernetes.default.svc.corp.internal"),
        );
        assert!(
            dig_status(&out) == "NOERROR" && out.contains("10.96.0.1"),
            "{out}"
        );
    }
    let out = lab.dig(
        &WEB,
        &format!("@{SERVICE} kubernetes.default.svc.cluster.local"),
    );
    assert_eq!(dig_status(&out), "NXDOMAIN", "{out}");
    healthy_traffic_in(&lab, "corp.internal", &["--rate", "20", "--duration", "2s"]);
}

#[test]
fn node_search_domains_end_the_pods_search_lists_as_the_kubelet_appends_them() {
    require_root();
    let lab = Lab::up(&[
        "--node-search",
        "ec2.internal",
        "--node-search",
        "corp.example",
    ]);
    let search = "search default.svc.cluster.local svc.cluster.local cluster.local ec2.internal corp.example\n";
    assert!(resolv_conf(&WEB).contains(search), "{}", resolv_conf(&WEB));
    for ns in [NODE.to_owned(), lab_ns(COREDNS_A)] {
        assert!(
            resolv_conf(&ns).ends_with("\nsearch ec2.internal corp.example\n"),
            "{ns}: {}",
            resolv_conf(&ns)
        );
    }
    let outcomes = lab.traffic(&["--pod", "web", "--name", "www.example.com"]);
    assert_eq!(outcomes[0]["ok"], true, "{outcomes:?}");
    let upstream = lab.log("unbound");
    assert!(
        upstream.contains(" www.example.com.ec2.internal. A IN"),
        "the node's domains are searched upstream"
    );
    // As on EKS or GKE: the kubelet appended the node's domains by design.
    let kinds = healthy_traffic(&lab, &["--rate", "20", "--duration", "2s"]);
    assert!(
        !kinds.iter().any(|k| k == "search_domain_leak"),
        "{kinds:?}"
    );
}

const KUBERNETES: &str = "kubernetes.default.svc.cluster.local";

#[test]
fn a_host_network_client_asks_cluster_dns_from_the_nodes_namespace() {
    require_root();
    let lab = Lab::up(&["--host-network-client"]);
    let resolv = std::fs::read_to_string(lab_path("fluent-bit-5lq8z.resolv.conf")).unwrap();
    assert!(
        resolv.starts_with("nameserver 10.96.0.10\nsearch logging.svc.cluster.local svc.cluster.local cluster.local\n"),
        "ClusterFirstWithHostNet: {resolv}"
    );
    let out = dnstrace(&[
        "pods",
        "-o",
        "json",
        "--node-netns",
        node_netns(),
        "--containerd-root",
        lab_containerd(),
    ]);
    let rows = json_lines(&String::from_utf8_lossy(&out.stdout));
    let row = rows
        .iter()
        .find(|r| r["name"] == "fluent-bit-5lq8z")
        .unwrap_or_else(|| panic!("{rows:#?}"));
    assert_eq!(row["namespace"], "logging");
    assert_eq!(
        row["resolv"]["nameservers"],
        serde_json::json!(["10.96.0.10"]),
        "{row:#}"
    );
    let node = std::fs::metadata(node_netns()).unwrap();
    assert_eq!(
        row["net"]["netns_inode"].as_u64(),
        Some(std::os::unix::fs::MetadataExt::ino(&node)),
        "{row:#}"
    );
    let pod = ["--pod", "logging/fluent-bit"];
    let mut outcomes = Vec::new();
    let lines = trace_with(&lab, &pod, || {
        outcomes = lab.traffic(&["--pod", "fluent-bit", "--name", "kubernetes.default"]);
    });
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0]["ok"], true, "{outcomes:?}");
    assert_eq!(
        outcomes[0]["last_name"],
        "kubernetes.default.svc.cluster.local."
    );
    assert!(
        lines.iter().any(|j| j["type"] == "journey" && j["name"] == "kubernetes.default.svc.cluster.local."),
        "{lines:#?}"
    );
    // The node's addresses are every hostNetwork pod's and the node's own
    // processes': none is named after the one pod.
    let named_after_it = lines
        .iter()
        .filter(|j| j["type"] == "journey")
        .flat_map(|j| j["names"].as_object().into_iter().flatten())
        .find(|(_, name)| name.as_str().is_some_and(|n| n.contains("fluent-bit")));
    assert!(named_after_it.is_none(), "{named_after_it:?}");
    let kinds = anomaly_kinds(&lines);
    let summary = lines.iter().find(|l| l["type"] == "summary").unwrap();
    eprintln!(
        "anomalies for the hostNetwork client: {kinds:?}\n{:#}",
        summary["anomalies"]
    );
    // And the whole node, with every client at once.
    healthy_traffic(&lab, &["--rate", "20", "--duration", "2s"]);
}

#[test]
fn glibc_and_musl_clients_are_answered_in_a_healthy_lab() {
    require_root();
    let lab = Lab::up(&[]);
    for client in [
        &["--client", "glibc"][..],
        &["--client", "glibc", "--single-request-reopen"],
        &["--client", "musl"],
    ] {
        let mut args = client.to_vec();
        args.extend(["--rate", "20", "--duration", "2s"]);
        healthy_traffic(&lab, &args);
    }
}

/// How long a lookup of `name` from web took, and how many queries it sent.
fn stall(lab: &Lab, client: &[&str], name: &str) -> (f64, u64) {
    let mut args = client.to_vec();
    args.extend(["--pod", "web", "--name", name]);
    let outcomes = lab.traffic(&args);
    assert_eq!(outcomes[0]["ok"], false, "{outcomes:?}");
    (
        outcomes[0]["elapsed_ms"].as_f64().unwrap(),
        outcomes[0]["queries"].as_u64().unwrap(),
    )
}

/// The stall signatures when the upstream never answers: glibc waits 5 s,
/// sends the same pair again and gives up at 10 s; musl sends again at
/// 2.5 s and gives up at 5 s. Each first walks the three cluster suffixes
/// (ndots:5), answered NXDOMAIN at once: 6 queries, then 4 to the end.
#[test]
fn glibc_and_musl_clients_stall_each_their_own_way() {
    require_root();
    let lab = Lab::up(&["--fault", "upstream-timeout"]);
    let (glibc_ms, glibc_queries) = stall(&lab, &["--client", "glibc"], &fresh("glibc"));
    let (musl_ms, musl_queries) = stall(&lab, &["--client", "musl"], &fresh("musl"));
    eprintln!("glibc {glibc_ms:.0} ms {glibc_queries} queries, musl {musl_ms:.0} ms {musl_queries} queries");
    assert!(
        (9_900.0..11_000.0).contains(&glibc_ms),
        "glibc {glibc_ms} ms"
    );
    assert!((4_900.0..5_600.0).contains(&musl_ms), "musl {musl_ms} ms");
    assert_eq!((glibc_queries, musl_queries), (10, 10));
}

/// NOTRACK NodeLocalDNS behind kube-proxy's nftables mode, with the
/// hostNetwork client too: its queries to kube-dns's IP skip conntrack on
/// the way out (raw OUTPUT) and are answered on the node.
#[test]
fn notrack_nodelocaldns_in_nftables_mode_answers_pods_and_the_host_network_client() {
    require_root();
    let lab = Lab::up(&[
        "--nodelocaldns=notrack",
        "--proxy-mode=nftables",
        "--host-network-client",
    ]);
    let table = in_node("nft", &["list", "table", "ip", "kube-proxy"]);
    assert!(
        table.contains("10.96.0.11 . udp . 53 : goto service-"),
        "{table}"
    );
    in_node("conntrack", &["-F"]);
    let outcomes = lab.traffic(&["--pod", "fluent-bit", "--name", "kubernetes.default"]);
    assert_eq!(outcomes[0]["ok"], true, "{outcomes:?}");
    assert_eq!(
        node_flows("udp", SERVICE),
        Vec::<String>::new(),
        "untracked"
    );
    assert!(
        !node_flows("tcp", "10.96.0.11").is_empty(),
        "NodeLocalDNS asked kube-dns-upstream"
    );
    healthy_traffic(&lab, &["--rate", "20", "--duration", "2s"]);
}

/// With routed pods (`--cni routed`, as Calico or the ptp plugin wire
/// them) replies pass conntrack: bridge-nf-call-iptables=0 breaks nothing,
/// and nothing blames it.
#[test]
fn bridge_nf_off_on_routed_pods_breaks_no_lookup_and_raises_nothing() {
    require_root();
    let lab = Lab::up(&["--cni", "routed", "--fault", "bridge-nf-off"]);
    // The CNI plugin names the host veth: dnstrace finds it.
    let out = dnstrace(&[
        "pods",
        "-o",
        "json",
        "--node-netns",
        node_netns(),
        "--containerd-root",
        lab_containerd(),
        "web",
    ]);
    let web = json_lines(&String::from_utf8_lossy(&out.stdout));
    let name = web[0]["net"]["host_veth"][0].as_str().unwrap().to_owned();
    let veth = in_node("ip", &["-d", "link", "show", &name]);
    assert!(!veth.contains("master"), "{veth}");
    // The lab's traces know its pods (and so their host veths): what the
    // bridge findings need.
    let lines = trace(&lab, || {
        for name in [KUBERNETES, "www.example.com"] {
            let out = lab.dig(&WEB, &format!("@{SERVICE} {name}"));
            assert_eq!(dig_status(&out), "NOERROR", "{out}");
        }
    });
    assert_eq!(anomaly_kinds(&lines), Vec::<String>::new());
}

/// The same fault on bridged pods, with the pods known: the finding names
/// the bridge a client and a resolver share.
#[test]
fn bridge_nf_off_on_bridged_pods_names_their_bridge() {
    require_root();
    let lab = Lab::up(&["--fault", "bridge-nf-off"]);
    let lines = trace(&lab, || {
        lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"));
    });
    let kinds = anomaly_kinds(&lines);
    assert!(
        kinds.contains(&"bridge_nf_call_iptables_off".to_owned()),
        "{kinds:?}"
    );
    let summary = lines.iter().find(|l| l["type"] == "summary").unwrap();
    let off = summary["anomalies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == "bridge_nf_call_iptables_off")
        .unwrap();
    assert!(
        off["evidence"].to_string().contains("ports of bridge cni0"),
        "{off}"
    );
}

/// Routed pods keep the rest of the lab: NOTRACK NodeLocalDNS answers
/// every client, and kube-proxy's missing DNAT is still found.
#[test]
fn routed_pods_keep_nodelocaldns_and_the_faults() {
    require_root();
    let lab = Lab::up(&["--cni", "routed", "--nodelocaldns=notrack"]);
    let kinds = healthy_traffic(&lab, &["--rate", "20", "--duration", "2s"]);
    assert_eq!(kinds, Vec::<String>::new());
    drop(lab);
    let lab = Lab::up(&["--cni", "routed", "--fault", "no-dnat"]);
    let lines = trace(&lab, || {
        lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"));
    });
    assert_eq!(anomaly_kinds(&lines), ["service_not_translated"]);
}
