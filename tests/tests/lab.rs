//! The lab, checked without dnstrace's tracing: each fault's symptom is shown
//! with the usual tools (dig, conntrack, resolver logs, iptables counters).
use std::{collections::BTreeSet, process::Command};

use dnstrace_tests::*;

const KUBERNETES: &str = "kubernetes.default.svc.cluster.local";

#[test]
fn healthy_lab_answers_every_lookup_and_spreads_over_both_coredns() {
    require_root();
    let lab = Lab::up(&[]);
    let names = [
        "kubernetes.default",
        "kube-dns.kube-system.svc.cluster.local",
        "db.default",
        "www.example.com",
        "chain.example.com",
        "many.example.com",
    ];
    let mut args = vec!["--rate", "50", "--count", "50"];
    args.extend(names.iter().flat_map(|n| ["--name", n]));
    let outcomes = lab.traffic(&args);
    assert_eq!(outcomes.len(), 100, "50 lookups from each client pod");
    for o in &outcomes {
        assert_eq!(o["ok"], true, "{o}");
    }
    let chain = outcomes
        .iter()
        .find(|o| o["name"] == "chain.example.com")
        .unwrap();
    assert_eq!(chain["addresses"][0], "198.51.100.90");
    let many = outcomes
        .iter()
        .find(|o| o["name"] == "many.example.com")
        .unwrap();
    assert_eq!(
        many["addresses"].as_array().unwrap().len(),
        40,
        "answer fetched over TCP after truncation"
    );
    for pod in [COREDNS_A, COREDNS_B] {
        assert!(
            lab.log(pod)
                .contains("query[A] kubernetes.default.svc.cluster.local from 10.244.0."),
            "{pod} got no queries"
        );
    }
}

#[test]
fn dual_stack_lab_answers_over_ipv6() {
    require_root();
    let lab = Lab::up(&["--ipv6"]);
    let out = lab.dig(&WEB, &format!("@fd00:10:96::a {KUBERNETES}"));
    assert_eq!(dig_status(&out), "NOERROR", "{out}");
    assert!(out.contains("10.96.0.1"));
    let out = lab.dig(&WEB, "@fd00:10:96::a www.example.com AAAA");
    assert!(out.contains("2001:db8:5100::80"), "{out}");
}

#[test]
fn bridge_nf_off_breaks_lookups_via_the_service_until_fixed() {
    require_root();
    let lab = Lab::up(&[]);
    lab.fault("bridge-nf-off", true);
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"))),
        "timeout"
    );
    // As in the field: asking the CoreDNS pod directly still works.
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@10.244.0.53 {KUBERNETES}"))),
        "NOERROR"
    );
    lab.fault("bridge-nf-off", false);
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"))),
        "NOERROR"
    );
}

#[test]
fn no_dnat_leaves_queries_untranslated() {
    require_root();
    let lab = Lab::up(&["--fault", "no-dnat"]);
    flush_node_conntrack();
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"))),
        "timeout"
    );
    let table = node_flows("udp", SERVICE).join("\n");
    assert!(
        table.contains(&format!("dst={SERVICE}")),
        "no conntrack entry: {table}"
    );
    assert!(
        !table.contains("src=10.244.0.53") && !table.contains("src=10.244.0.54"),
        "DNAT happened: {table}"
    );
    lab.fault("no-dnat", false);
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"))),
        "NOERROR"
    );
}

/// The node's conntrack entries of `proto` flows to `dst`, one line each.
fn node_flows(proto: &str, dst: &str) -> Vec<String> {
    let table = run(Command::new("ip").args([
        "netns",
        "exec",
        &NODE,
        "conntrack",
        "-L",
        "-p",
        proto,
        "--orig-dst",
        dst,
    ]))
    .unwrap();
    table.lines().map(str::to_owned).collect()
}

fn flush_node_conntrack() {
    run(Command::new("ip").args(["netns", "exec", &NODE, "conntrack", "-F"])).unwrap();
}

#[test]
fn no_dns_tcp_fails_lookups_over_tcp_only() {
    require_root();
    let lab = Lab::up(&[]);
    let tcp = format!("@{SERVICE} +tcp {KUBERNETES}");
    // An answer over TCP may take a while on a loaded machine (dnsmasq
    // forks for each connection): it has 5 s where it works.
    let works = format!("{tcp} +time=5");
    assert_eq!(dig_status(&lab.dig(&WEB, &works)), "NOERROR");
    lab.fault("no-dns-tcp", true);
    let nat = run(Command::new("ip").args(["netns", "exec", &NODE, "iptables-save", "-t", "nat"]))
        .unwrap();
    assert!(
        nat.contains("kube-system/kube-dns:dns cluster IP") && !nat.contains("dns-tcp"),
        "{nat}"
    );
    let out = lab.dig(&WEB, &tcp);
    assert_eq!(dig_status(&out), "timeout", "{out}");
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"))),
        "NOERROR"
    );
    // An answer too big for UDP is truncated, and its retry over TCP lost.
    let out = lab.dig(&WEB, &format!("@{SERVICE} {BIG_NAME} TXT"));
    assert!(
        out.contains("Truncated, retrying in TCP mode") && dig_status(&out) == "timeout",
        "{out}"
    );
    lab.fault("no-dns-tcp", false);
    assert_eq!(dig_status(&lab.dig(&WEB, &works)), "NOERROR");
}

#[test]
fn forward_loop_sends_the_query_back_to_coredns_itself() {
    require_root();
    let lab = Lab::up(&["--fault", "forward-loop"]);
    let name = fresh("loop");
    assert_ne!(
        dig_status(&lab.dig(&WEB, &format!("@10.244.0.53 {name}"))),
        "NXDOMAIN"
    );
    let log = lab.log(COREDNS_A);
    assert!(
        log.contains(&format!("forwarded {name} to 127.0.0.53")),
        "{log}"
    );
    assert!(
        log.contains(&format!("query[A] {name} from 127.0.0.1")),
        "the query did not come back: {log}"
    );
    lab.fault("forward-loop", false);
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@10.244.0.53 {}", fresh("loop")))),
        "NXDOMAIN"
    );
}

#[test]
fn nodelocaldns_asks_kube_dns_over_tcp_and_the_rest_upstream() {
    require_root();
    let lab = Lab::up(&["--nodelocaldns"]);
    flush_node_conntrack();
    let out = lab.dig(&WEB, &format!("@{NODELOCAL} {KUBERNETES}"));
    assert!(
        dig_status(&out) == "NOERROR" && out.contains("10.96.0.1"),
        "{out}"
    );
    let tcp = node_flows("tcp", SERVICE);
    assert!(
        !tcp.is_empty() && tcp.iter().all(|f| f.contains("dport=53")),
        "{tcp:?}"
    );
    assert_eq!(node_flows("udp", SERVICE), Vec::<String>::new());
    let out = lab.dig(&WEB, &format!("@{NODELOCAL} www.example.com"));
    assert!(out.contains("198.51.100.80"), "{out}");
    assert!(!node_flows("udp", "198.51.100.53").is_empty());
    // As in the field: kube-dns without its TCP port fails cluster names
    // through NodeLocalDNS, while kube-dns itself answers over UDP.
    lab.fault("no-dns-tcp", true);
    let name = "kube-dns.kube-system.svc.cluster.local";
    let out = lab.dig(&WEB, &format!("@{NODELOCAL} {name}"));
    assert_ne!(dig_status(&out), "NOERROR", "{out}");
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {name}"))),
        "NOERROR"
    );
}

#[test]
fn nodelocaldns_loop_goes_round_between_nodelocaldns_and_coredns() {
    require_root();
    let lab = Lab::up(&["--nodelocaldns", "--fault", "nodelocaldns-loop"]);
    let name = fresh("nl");
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@169.254.20.10 {name}"))),
        "timeout"
    );
    // unbound logs each query it gets as `<client> <name>. A IN`.
    let nodelocal = lab
        .log("nodelocaldns")
        .matches(&format!(" {name}. A IN\n"))
        .count();
    let coredns = lab
        .log(COREDNS_A)
        .matches(&format!("query[A] {name}"))
        .count()
        + lab
            .log(COREDNS_B)
            .matches(&format!("query[A] {name}"))
            .count();
    assert!(
        nodelocal >= 2 && coredns >= 1,
        "nodelocaldns saw it {nodelocal}x, CoreDNS {coredns}x"
    );
}

#[test]
fn upstream_timeout_fails_external_names_only() {
    require_root();
    let lab = Lab::up(&["--fault", "upstream-timeout"]);
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {}", fresh("ut")))),
        "timeout"
    );
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"))),
        "NOERROR"
    );
    lab.fault("upstream-timeout", false);
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {}", fresh("ut")))),
        "NXDOMAIN"
    );
}

#[test]
fn servfail_and_slow_upstream() {
    require_root();
    let lab = Lab::up(&["--fault", "servfail"]);
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {}", fresh("sf")))),
        "SERVFAIL"
    );
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"))),
        "NOERROR"
    );
    lab.fault("servfail", false);
    lab.fault("slow-upstream", true);
    let out = lab.dig(&WEB, &format!("@{SERVICE} {}", fresh("slow")));
    assert_eq!(dig_status(&out), "NXDOMAIN", "{out}");
    let ms: u64 = out
        .lines()
        .find_map(|l| {
            l.strip_prefix(";; Query time: ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap();
    assert!(ms >= 700, "answered in {ms} ms despite the delay");
}

#[test]
fn search_leak_sends_foreign_suffixes_upstream() {
    require_root();
    let lab = Lab::up(&["--fault", "search-leak"]);
    let out = lab.traffic(&["--pod", "web", "--name", "orders"]);
    assert_eq!(out[0]["error"], "NXDOMAIN");
    assert!(
        lab.log("unbound").contains("orders.corp.example.com."),
        "upstream never saw the leaked name"
    );
}

#[test]
fn loopback_nameserver_refuses_the_one_pod() {
    require_root();
    let lab = Lab::up(&["--fault", "loopback-nameserver"]);
    let out = lab.traffic(&["--name", "kubernetes.default"]);
    let web = out
        .iter()
        .find(|o| o["pod"].as_str().unwrap().starts_with("default/"))
        .unwrap();
    let checkout = out
        .iter()
        .find(|o| o["pod"].as_str().unwrap().starts_with("shop/"))
        .unwrap();
    assert_eq!(web["error"], "connection refused", "{web}");
    assert_eq!(checkout["ok"], true);
}

#[test]
fn drop_rule_loses_queries_to_one_endpoint() {
    require_root();
    let lab = Lab::up(&["--fault", "drop"]);
    // DNAT picks at random: ask until both endpoints were tried.
    let mut statuses = BTreeSet::new();
    for _ in 0..40 {
        statuses.insert(dig_status(
            &lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}")),
        ));
        if statuses.len() == 2 {
            break;
        }
    }
    assert!(
        statuses.contains("timeout") && statuses.contains("NOERROR"),
        "{statuses:?}"
    );
    let counters = run(Command::new("ip").args([
        "netns", "exec", &NODE, "iptables", "-L", "FORWARD", "-v", "-n", "-x",
    ]))
    .unwrap();
    let dropped: u64 = counters
        .lines()
        .find(|l| l.contains("DROP") && l.contains("udp"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(dropped > 0, "{counters}");
}

/// A counter of the `Ip:` lines of /proc/net/snmp in `ns`.
fn ip_counter(ns: &str, name: &str) -> u64 {
    let snmp =
        run(Command::new("ip").args(["netns", "exec", ns, "cat", "/proc/net/snmp"])).unwrap();
    let mut ip = snmp.lines().filter(|l| l.starts_with("Ip: "));
    let (names, values) = (ip.next().unwrap(), ip.next().unwrap());
    let at = names.split_whitespace().position(|n| n == name).unwrap();
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

/// Answers the CoreDNS pods sent in IP fragments.
fn coredns_fragmented() -> u64 {
    [COREDNS_A, COREDNS_B]
        .iter()
        .map(|pod| ip_counter(&lab_ns(pod), "FragOKs"))
        .sum()
}

#[test]
fn huge_answers_come_in_fragments_and_fragments_dropped_loses_them() {
    require_root();
    let lab = Lab::up(&[]);
    // Over dig's default 1,232-byte buffer: truncated, then over TCP.
    let out = lab.dig(&WEB, &format!("@{SERVICE} {BIG_NAME} TXT"));
    assert!(
        dig_status(&out) == "NOERROR" && out.contains("(TCP)"),
        "{out}"
    );
    let huge = format!("@{SERVICE} +bufsize=4096 {HUGE_NAME} TXT");
    let before = (coredns_fragmented(), ip_counter(&WEB, "ReasmOKs"));
    let out = lab.dig(&WEB, &huge);
    assert!(
        dig_status(&out) == "NOERROR" && out.contains("(UDP)"),
        "{out}"
    );
    assert!(
        coredns_fragmented() > before.0 && ip_counter(&WEB, "ReasmOKs") > before.1,
        "the answer was not fragmented"
    );
    // Cached in both CoreDNS pods (30 s), so that what is lost is their
    // answer to the client.
    for pod in ["10.244.0.53", "10.244.0.54"] {
        let out = lab.dig(&WEB, &format!("@{pod} +bufsize=4096 {HUGE_NAME} TXT"));
        assert_eq!(dig_status(&out), "NOERROR", "{out}");
    }
    lab.fault("fragments-dropped", true);
    let before = (coredns_fragmented(), ip_counter(&WEB, "ReasmOKs"));
    assert_eq!(dig_status(&lab.dig(&WEB, &huge)), "timeout");
    assert!(coredns_fragmented() > before.0, "CoreDNS sent no answer");
    assert_eq!(ip_counter(&WEB, "ReasmOKs"), before.1);
    let rules = run(Command::new("ip").args([
        "netns",
        "exec",
        &NODE,
        "nft",
        "list",
        "table",
        "inet",
        "dnstrace_lab",
    ]))
    .unwrap();
    let dropped: u64 = rules
        .split("counter packets ")
        .nth(1)
        .and_then(|c| c.split(' ').next()?.parse().ok())
        .unwrap();
    assert!(dropped > 0, "{rules}");
    // What fits one packet still comes.
    let out = lab.dig(&WEB, &format!("@{SERVICE} +bufsize=4096 {BIG_NAME} TXT"));
    assert!(
        dig_status(&out) == "NOERROR" && out.contains("(UDP)"),
        "{out}"
    );
    lab.fault("fragments-dropped", false);
    assert_eq!(dig_status(&lab.dig(&WEB, &huge)), "NOERROR");
}

fn clash_counters() -> (u64, u64) {
    let stat = run(Command::new("ip").args([
        "netns",
        "exec",
        &NODE,
        "cat",
        "/proc/net/stat/nf_conntrack",
    ]))
    .unwrap();
    let mut lines = stat.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (clash, failed) = (col("clashres"), col("insert_failed"));
    lines.fold((0, 0), |(c, f), l| {
        let v: Vec<u64> = l
            .split_whitespace()
            .map(|x| u64::from_str_radix(x, 16).unwrap())
            .collect();
        (c + v[clash], f + v[failed])
    })
}

#[test]
fn conntrack_race_makes_parallel_a_and_aaaa_clash() {
    require_root();
    let lab = Lab::up(&["--fault", "conntrack-race"]);
    let before = clash_counters();
    let out = lab.traffic(&[
        "--name",
        "kubernetes.default.svc.cluster.local.",
        "--rate",
        "200",
        "--duration",
        "3s",
    ]);
    let after = clash_counters();
    let clashes = (after.0 - before.0) + (after.1 - before.1);
    // Linux 6.18 resolves these clashes (clashres) rather than dropping (insert_failed).
    assert!(clashes > 0, "no conntrack clash in {} lookups", out.len());
}

#[test]
fn up_and_down_twice_leave_the_machine_as_before() {
    require_root();
    let snapshot = || {
        // Without its comments, which hold the time of the dump.
        let root_rules: String = run(&mut Command::new("iptables-save"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        let root_links = run(Command::new("ip").args(["-o", "link"])).unwrap();
        let netns = run(Command::new("ip").args(["netns", "list"])).unwrap();
        let etc = std::fs::read_dir("/etc/netns")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name())
                    .filter(|n| n.to_string_lossy().starts_with(lab_prefix()))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let sysctls = run(Command::new("sysctl")
            .args(["net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables"]))
        .unwrap();
        // Not the lab's directory alone: others waiting for the lab lock
        // match it. This lab's alone: others may be up beside it.
        let mine = format!("{}/|{}", lab_dir(), lab_prefix());
        let procs = run(Command::new("pgrep").args(["-c", "-f", &mine])).unwrap_or_default();
        (
            root_rules,
            root_links,
            netns
                .lines()
                .filter(|l| l.starts_with(lab_prefix()))
                .count(),
            etc.len(),
            sysctls,
            procs,
            std::path::Path::new(lab_dir()).exists(),
        )
    };
    let lock = Lab::lock();
    let before = snapshot();
    for _ in 0..2 {
        let up = dnstrace(&["lab", "up", "--ipv6", "--nodelocaldns"]);
        assert!(
            up.status.success(),
            "{}",
            String::from_utf8_lossy(&up.stderr)
        );
        let down = dnstrace(&["lab", "down"]);
        assert!(
            down.status.success(),
            "{}",
            String::from_utf8_lossy(&down.stderr)
        );
    }
    assert_eq!(snapshot(), before);
    drop(lock);
}

#[test]
fn bad_input_gets_one_clear_line() {
    require_root();
    let lab = Lab::up(&[]);
    let again = dnstrace(&["lab", "up"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already up"));
    let unknown = dnstrace(&["lab", "fault", "gremlins", "on"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("invalid value 'gremlins'"));
    let not_root = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(dnstrace_bin())
        .args(["lab", "status"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&not_root.stderr).contains("run it as root"));
    drop(lab);
    // A machine without dnsmasq: every other tool present.
    let bin = std::env::temp_dir().join(format!("dtlab-nodnsmasq-{}", std::process::id()));
    std::fs::create_dir_all(&bin).unwrap();
    for tool in [
        "ip",
        "bridge",
        "iptables-restore",
        "ip6tables-restore",
        "iptables",
        "sysctl",
        "unbound",
        "dig",
        "ss",
    ] {
        let path = run(Command::new("sh").args(["-c", &format!("command -v {tool}")])).unwrap();
        let _ = std::os::unix::fs::symlink(path.trim(), bin.join(tool));
    }
    let out = Command::new(dnstrace_bin())
        .args(["lab", "up"])
        .env("PATH", &bin)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&bin).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("apt-get install dnsmasq-base"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn up_after_a_crash_cleans_and_rebuilds() {
    require_root();
    let lab = Lab::up(&[]);
    // A crash: the lab's processes die, namespaces and files stay.
    let conf = lab_path("unbound.conf");
    let unbound = ["-f", &conf];
    let _ = run(Command::new("pkill").arg("-9").args(unbound));
    // SIGKILL is asynchronous: wait until the process is really gone.
    wait_for(|| {
        run(Command::new("pgrep").args(unbound))
            .is_err()
            .then_some(())
    })
    .unwrap();
    let again = dnstrace(&["lab", "up"]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("cleaning up what an earlier lab left"));
    assert_eq!(
        dig_status(&lab.dig(&WEB, &format!("@{SERVICE} www.example.com"))),
        "NOERROR"
    );
}

#[test]
fn traffic_with_dig_reports_what_dig_saw() {
    require_root();
    let lab = Lab::up(&[]);
    let out = lab.traffic(&[
        "--client",
        "dig",
        "--pod",
        "shop/checkout",
        "--name",
        "kubernetes.default",
        "--name",
        "nosuch",
    ]);
    let by_name = |n: &str| out.iter().find(|o| o["name"] == n).unwrap().clone();
    assert_eq!(by_name("kubernetes.default")["addresses"][0], "10.96.0.1");
    assert_eq!(by_name("nosuch")["error"], "NXDOMAIN");
}

#[test]
fn traffic_over_tcp_makes_every_query_over_tcp() {
    require_root();
    let lab = Lab::up(&[]);
    flush_node_conntrack();
    let out = lab.traffic(&[
        "--tcp",
        "--name",
        "kubernetes.default",
        "--name",
        "www.example.com",
        "--name",
        "many.example.com",
    ]);
    assert_eq!(out.len(), 6);
    for o in &out {
        assert_eq!(o["ok"], true, "{o}");
    }
    let many = out
        .iter()
        .find(|o| o["name"] == "many.example.com")
        .unwrap();
    assert_eq!(many["addresses"].as_array().unwrap().len(), 40);
    // One connection per query, and not one datagram.
    let queries: u64 = out.iter().map(|o| o["queries"].as_u64().unwrap()).sum();
    assert_eq!(node_flows("tcp", SERVICE).len() as u64, queries);
    assert_eq!(node_flows("udp", SERVICE), Vec::<String>::new());
    flush_node_conntrack();
    let out = lab.traffic(&[
        "--tcp",
        "--client",
        "dig",
        "--pod",
        "web",
        "--name",
        "kubernetes.default",
    ]);
    assert_eq!(out[0]["addresses"][0], "10.96.0.1");
    assert!(!node_flows("tcp", SERVICE).is_empty());
    assert_eq!(node_flows("udp", SERVICE), Vec::<String>::new());
}
