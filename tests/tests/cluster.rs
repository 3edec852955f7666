//! The lab as a cluster (`lab up --nodes 3`): nodes sharing this kernel,
//! linked by a VXLAN overlay as flannel links them. A lookup from node 1's
//! client is DNATed there to a CoreDNS pod on another node, crosses the
//! overlay, and its answer crosses back.
use std::{os::unix::fs::MetadataExt as _, time::Duration};

use serde_json::Value;

use dnstrace_tests::{otlp, prometheus::free_port, *};

/// node1's client, and the kube-dns service every node DNATs.
const WEB_IP: &str = "10.244.1.10";

/// A node's network namespace inode, as legs name it.
fn node_netns(node: u8) -> u64 {
    std::fs::metadata(format!("/run/netns/{}", lab_ns(&format!("node{node}"))))
        .expect("the node's namespace")
        .ino()
}

/// The legs of `j` as (netns, device, hook, response).
fn legs(j: &Value) -> Vec<(u64, String, String, bool)> {
    j["legs"]
        .as_array()
        .expect("legs")
        .iter()
        .map(|l| {
            (
                l["netns"].as_u64().unwrap_or(0),
                l["iface"].as_str().unwrap_or("").to_owned(),
                l["hook"].as_str().unwrap_or("").to_owned(),
                l["response"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

#[test]
fn a_lookup_crosses_nodes_over_the_overlay_and_back() {
    // The whole cluster's namespaces, every node's.
    require_alone();
    let lab = Lab::up(&["--nodes", "3"]);
    let (lines, stderr) = lab.trace_everywhere_during(dnstrace_bin(), &[], || {
        let out = lab.dig(&WEB, "kube-dns.kube-system.svc.cluster.local");
        assert_eq!(dig_status(&out), "NOERROR", "{out}");
        std::thread::sleep(Duration::from_millis(200));
    });
    let journey = lines
        .iter()
        .find(|j| {
            j["client"]
                .as_str()
                .is_some_and(|c| c.starts_with(&format!("{WEB_IP}:")))
                && j["name"] == "kube-dns.kube-system.svc.cluster.local."
        })
        .unwrap_or_else(|| panic!("no journey of web's lookup: {lines:?} {stderr:?}"));
    let legs = legs(journey);
    // DNATed on node 1 to a CoreDNS pod on node 2 or 3, whose node it
    // reaches over the overlay; the answer comes back the same way.
    let dnat = journey["dnat"][1].as_str().expect("a DNAT");
    let node: u8 = dnat
        .strip_prefix("10.244.")
        .and_then(|s| s.split('.').next())
        .and_then(|n| n.parse().ok())
        .expect("a CoreDNS pod address");
    assert!(node == 2 || node == 3, "{dnat}");
    let at = |netns: u64, response: bool, hook: &str| {
        legs.iter()
            .position(|l| l.0 == netns && l.1 == "flannel.1" && l.2 == hook && l.3 == response)
            .unwrap_or_else(|| panic!("no {hook} on flannel.1 in {netns}: {legs:?}"))
    };
    let (one, other) = (node_netns(1), node_netns(node));
    let steps = [
        at(one, false, "dev_xmit"),
        at(other, false, "dev_receive"),
        at(other, true, "dev_xmit"),
        at(one, true, "dev_receive"),
    ];
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "{steps:?}: {legs:?}");
    assert_eq!(journey["outcome"]["rcode"], "NOERROR", "{journey}");
}

/// The network namespace inodes of node `n` and of its pods.
fn node_scope(n: u8, pods: &[&str]) -> Vec<u64> {
    let mut all = vec![node_netns(n)];
    all.extend(pods.iter().map(|p| {
        std::fs::metadata(format!("/run/netns/{}", lab_ns(p)))
            .expect("a pod's namespace")
            .ino()
    }));
    all
}

const NODE_PODS: [&[&str]; 3] = [
    &["web-7d9f8c6b5-x2x4k"],
    &["checkout-5f6d7c9b8-q7w2e", "coredns-7db6d8ff4d-4xk9m"],
    &["api-6c8d7f5b4-m3n8p", "coredns-7db6d8ff4d-vz8lp"],
];

/// web's lookups of `name`, one a time, while one dnstrace per node
/// records its node alone; each node's live journeys and its recording.
fn record_each_node(
    lab: &Lab,
    dir: &Dir,
    name: &str,
    lookups: usize,
) -> Vec<(Vec<Value>, std::path::PathBuf)> {
    record_nodes(dir, "", || {
        for _ in 0..lookups {
            let out = lab.dig(&WEB, name);
            assert_eq!(dig_status(&out), "NOERROR", "{out}");
        }
    })
}

/// One dnstrace per node, each recording its node alone (to files named
/// with `tag`) while `work` runs: each node's live lines and its file.
fn record_nodes(
    dir: &Dir,
    tag: &str,
    work: impl FnOnce(),
) -> Vec<(Vec<Value>, std::path::PathBuf)> {
    let tracers: Vec<(Dnstrace, std::path::PathBuf)> = (1..=3u8)
        .map(|n| {
            let file = dir.file(&format!("{tag}node{n}.pcapng"));
            let mut args: Vec<String> = ["trace", "-o", "json", "--timeout", "3s", "--record"]
                .map(String::from)
                .to_vec();
            args.push(file.display().to_string());
            args.extend(node_flags(n));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            (Dnstrace::start_here(Keep::Every, &args).unwrap(), file)
        })
        .collect();
    work();
    std::thread::sleep(Duration::from_millis(1500));
    tracers
        .into_iter()
        .map(|(t, file)| {
            let (status, out, stderr) = t.stop(libc::SIGINT).unwrap();
            assert!(status.success(), "{status}: {stderr:?}");
            (json_lines(&out), file)
        })
        .collect()
}

/// The merged replay of `nodes`' recordings, as JSON lines.
fn merged(nodes: &[(Vec<Value>, std::path::PathBuf)]) -> Vec<Value> {
    let files: Vec<String> = nodes.iter().map(|(_, f)| f.display().to_string()).collect();
    let mut args = vec!["replay", "-o", "json"];
    args.extend(files.iter().map(String::as_str));
    let out = dnstrace(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_lines(&String::from_utf8_lossy(&out.stdout))
}

/// The summaries of the anomalies of `kind` in `lines`' summary.
fn anomalies(lines: &[Value], kind: &str) -> Vec<String> {
    anomalies_of(lines, kind)
        .iter()
        .map(|a| a["summary"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// Journeys of `lines` from web's address.
fn web_journeys(lines: &[Value]) -> Vec<&Value> {
    lines
        .iter()
        .filter(|j| {
            j["client"]
                .as_str()
                .is_some_and(|c| c.starts_with(&format!("{WEB_IP}:")))
        })
        .collect()
}

#[test]
fn each_node_sees_its_half_and_the_merged_recordings_give_whole_journeys() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let dir = Dir::new("cluster");
    const LOOKUPS: usize = 6;
    let name = "kube-dns.kube-system.svc.cluster.local";
    let nodes = record_each_node(&lab, &dir, name, LOOKUPS);

    // Live, each instance sees only its node's namespaces: web's lookups
    // whole on node 1 up to the overlay, and on the nodes of CoreDNS from it.
    for (i, (lines, _)) in nodes.iter().enumerate() {
        let scope = node_scope(i as u8 + 1, NODE_PODS[i]);
        for j in lines.iter().filter(|j| j["legs"].is_array()) {
            for (netns, iface, hook, _) in legs(j) {
                assert!(
                    scope.contains(&netns),
                    "node{}'s dnstrace saw {iface} {hook} in {netns}, another node's: {j}",
                    i + 1
                );
            }
        }
    }
    assert_eq!(web_journeys(&nodes[0].0).len(), LOOKUPS, "{:?}", nodes[0].0);
    let elsewhere = web_journeys(&nodes[1].0).len() + web_journeys(&nodes[2].0).len();
    assert_eq!(elsewhere, LOOKUPS, "each lookup on one CoreDNS node");

    // Merged: one journey per lookup, legs from node 1 and the CoreDNS
    // pod's node in time order, each leg naming its node.
    let merged = merged(&nodes);
    let web = web_journeys(&merged);
    assert_eq!(web.len(), LOOKUPS, "{merged:?}");
    for j in web {
        let legs = j["legs"].as_array().unwrap();
        let node_of = |l: &Value| l["node"].as_str().unwrap_or("").to_owned();
        let named: Vec<String> = legs.iter().map(node_of).collect();
        assert!(named.iter().all(|n| n.starts_with("node")), "{named:?}");
        assert_eq!(named.first().map(String::as_str), Some("node1"), "{j}");
        assert_eq!(named.last().map(String::as_str), Some("node1"), "{j}");
        assert!(named.iter().any(|n| n == "node2" || n == "node3"), "{j}");
        let times: Vec<u64> = legs.iter().filter_map(|l| l["ts_ns"].as_u64()).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{j}");
        // The query leaves node 1 on the overlay before it reaches the
        // other node, whose answer leaves before node 1 has it.
        let first_other = named.iter().position(|n| n != "node1").unwrap();
        let last_other = named.iter().rposition(|n| n != "node1").unwrap();
        assert_eq!(legs[first_other - 1]["iface"], "flannel.1", "{j}");
        assert_eq!(legs[last_other + 1]["iface"], "flannel.1", "{j}");
        assert_eq!(j["outcome"]["rcode"], "NOERROR", "{j}");
    }
}

/// The window a trace id rounds a lookup's start to (`otlp::convert`).
const TRACE_WINDOW_NS: u64 = 10_000_000_000;

/// One agent per node, each scoped to its node, export to one collector:
/// the spans of a lookup seen on the client's node and on the CoreDNS
/// pod's node share its trace id, derived from what both can see.
#[test]
fn the_agents_of_two_nodes_give_a_lookup_one_trace_id() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let collector = otlp::Receiver::start(0);
    let endpoint = format!("http://{}", collector.addr);
    let listens: Vec<String> = (1..=3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let agents: Vec<Dnstrace> = (1..=3u8)
        .map(|n| {
            let listen = &listens[usize::from(n) - 1];
            let mut args: Vec<String> = [
                "agent",
                "--metrics-addr",
                listen,
                "--api-addr",
                "127.0.0.1:0",
            ]
            .map(String::from)
            .to_vec();
            args.extend(["--otlp-endpoint".into(), endpoint.clone()]);
            args.push("--no-flight-recorder".into());
            args.extend(node_flags(n));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Dnstrace::start_here(Keep::Every, &args).unwrap()
        })
        .collect();
    const LOOKUPS: usize = 6;
    start_inside_a_window();
    for _ in 0..LOOKUPS {
        let out = lab.dig(&WEB, "kube-dns.kube-system.svc.cluster.local");
        assert_eq!(dig_status(&out), "NOERROR", "{out}");
    }
    // The roots of web's lookups, by the node whose agent sent them.
    let roots = |node: &str| {
        collector.received(|r| {
            r.spans
                .iter()
                .filter(|(res, s)| {
                    s.parent_span_id.is_empty()
                        && otlp::attr(&res.attributes, "k8s.node.name") == Some(node)
                        && otlp::attr(&s.attributes, "client.address") == Some(WEB_IP)
                })
                .map(|(_, s)| (s.trace_id.clone(), s.start_time_unix_nano))
                .collect::<Vec<_>>()
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while (roots("node1").len() < LOOKUPS || roots("node2").len() + roots("node3").len() < LOOKUPS)
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(500));
    }
    // Counted once in the cluster: on web's node; the others never see it
    // leave a device of theirs.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while web_lookups(&listens[0]) < LOOKUPS as u64 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let counted: Vec<u64> = listens.iter().map(|l| web_lookups(l)).collect();
    assert_eq!(counted, [LOOKUPS as u64, 0, 0], "web's lookups by node");
    for agent in agents {
        let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
        assert!(status.success(), "{status}: {stderr:?}");
    }
    let client_side = roots("node1");
    let server_side: Vec<_> = [roots("node2"), roots("node3")].concat();
    assert_eq!(client_side.len(), LOOKUPS, "{client_side:?}");
    assert_eq!(server_side.len(), LOOKUPS, "{server_side:?}");
    let ids: std::collections::BTreeSet<&Vec<u8>> = server_side.iter().map(|(id, _)| id).collect();
    for (id, start) in &client_side {
        assert!(
            inside_a_window(*start),
            "started at {start}, near a window's edge"
        );
        assert!(
            ids.contains(id),
            "node1's trace {id:02x?} is not the CoreDNS node's"
        );
    }
}

/// Whether wall time `ns` is more than a second from its trace window's
/// edges: a lookup seen on two nodes either side of an edge would round
/// to two windows, and two ids.
fn inside_a_window(ns: u64) -> bool {
    let at = ns % TRACE_WINDOW_NS;
    at > 1_000_000_000 && at < TRACE_WINDOW_NS - 1_000_000_000
}

/// Waits until the wall clock is 1.5 s into a trace window, with 5.5 s of
/// it left for the lookups (which take well under a second).
fn start_inside_a_window() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let at = now % TRACE_WINDOW_NS;
    let wait = if (1_500_000_000..4_500_000_000).contains(&at) {
        0
    } else {
        (TRACE_WINDOW_NS + 1_500_000_000 - at) % TRACE_WINDOW_NS
    };
    std::thread::sleep(Duration::from_nanos(wait));
}

/// The lab's three clients, one a node: 3,400 lookups each at 100 a
/// second, 10,200 in all, of `lab traffic`'s mix (cluster names through
/// their search lists, external names, one that does not exist).
const HEALTHY_RATE: &str = "100";
const HEALTHY_EACH: &str = "3400";
const HEALTHY_LOOKUPS: usize = 10_200;

/// A healthy cluster raises nothing: the lookups cross nodes both ways,
/// CoreDNS forwards through node 1, and every one is answered.
#[test]
fn a_healthy_cluster_raises_nothing_over_ten_thousand_lookups() {
    // The whole cluster's namespaces, every node's.
    require_alone();
    let lab = Lab::up(&["--nodes", "3"]);
    let mut lookups = Vec::new();
    let overflows = socket_overflows();
    let (lines, stderr) =
        lab.trace_everywhere_during(dnstrace_release_bin(), &["--ring-buffer-mib", "64"], || {
            lookups = lab.traffic(&["--rate", HEALTHY_RATE, "--count", HEALTHY_EACH])
        });
    assert_eq!(lookups.len(), HEALTHY_LOOKUPS);
    let failed: Vec<&Value> = lookups
        .iter()
        .filter(|l| {
            l["ok"] != true && !(l["name"] == "nosuchname.example.com" && l["error"] == "NXDOMAIN")
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..1]
    );
    // Each lookup is at least an A and an AAAA journey, seen whole.
    let whole = lines
        .iter()
        .filter(|j| j["type"] == "journey" && j["incomplete"] == false)
        .filter(|j| {
            j["client"]
                .as_str()
                .is_some_and(|c| c.starts_with("10.244."))
        })
        .count();
    assert!(whole >= 20_000, "{whole} whole journeys: {stderr:?}");
    let summary = lines
        .iter()
        .find(|l| l["type"] == "summary")
        .expect("a summary at exit");
    let false_alarms = false_alarms(summary["anomalies"].as_array().unwrap(), &lines, &overflows);
    assert!(false_alarms.is_empty(), "{false_alarms:#?}");
}

/// web's lookups in an agent's `dnstrace_lookups_total`, summed over its
/// series.
fn web_lookups(listen: &str) -> u64 {
    let page =
        run(std::process::Command::new("curl").args(["-sf", &format!("http://{listen}/metrics")]))
            .expect("the agent's /metrics");
    page.lines()
        .filter(|l| l.starts_with("dnstrace_lookups_total{") && l.contains("pod=\"web-"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Queries lost on the overlay toward node 3, and large answers lost on
/// an underlay narrower than the overlay: the client's node alone names
/// where its queries went; the merged recordings, between which nodes
/// and which way.
#[test]
fn faults_between_nodes_are_diagnosed_from_the_merged_recordings() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let dir = Dir::new("cluster-faults");
    let nodes = record_a_lookup_lost_on_the_overlay(&lab, &dir, "drop-");
    let alone = anomalies(&nodes[0].0, "unanswered");
    assert!(
        alone
            .iter()
            .any(|a| a.contains("past this node: look at 10.244.3.53")),
        "node1 alone: {alone:?}"
    );
    let lines = merged(&nodes);
    assert_eq!(
        anomalies(&lines, "lost_between_nodes"),
        ["DNS queries lost between node1 and node3"]
    );
    // Named as the recordings know them: web on node1, the CoreDNS pod on
    // node3, and node1's own namespace the query left, by its inode.
    let lost = anomalies_of(&lines, "lost_between_nodes");
    let evidence = lost[0]["evidence"][0].as_str().unwrap_or("");
    assert!(
        evidence.starts_with(&format!("{WEB_IP}:"))
            && evidence.contains(" (default/web-7d9f8c6b5-x2x4k on node node1) asked ")
            && evidence.contains(&format!(
                " left flannel.1 on node node1 (netns {})",
                node_netns(1)
            ))
            && evidence.contains(
                "where 10.244.3.53 (kube-system/coredns-7db6d8ff4d-vz8lp on node node3) is"
            ),
        "{evidence}"
    );

    lab.fault_on("overlay-mtu", true, "1");
    // Straight to node 3's CoreDNS pod, so that every answer takes one
    // path: large ones lost before any small one arrived, then after.
    let big = "@10.244.3.53 +bufsize=4096 +ignore big.example.com TXT";
    let nodes = record_nodes(&dir, "mtu-", || {
        let dig = |args: &str, status: &str| {
            let out = lab.dig(&WEB, args);
            assert_eq!(dig_status(&out), status, "{out}");
        };
        for _ in 0..3 {
            dig(big, "timeout");
        }
        dig("@10.244.3.53 www.example.com", "NOERROR");
        dig(big, "timeout");
    });
    lab.fault_on("overlay-mtu", false, "1");
    let lines = merged(&nodes);
    // Lost before a small answer showed what passes: the generic loss.
    assert_eq!(
        anomalies(&lines, "lost_between_nodes"),
        ["DNS answers lost between node3 and node1"]
    );
    let mtu = anomalies_of(&lines, "overlay_mtu");
    assert_eq!(mtu.len(), 1, "{:?}", lines.last());
    let (lost, delivered) = mtu_sizes(&mtu[0]);
    // Over what 1,300 bytes of underlay carry with VXLAN's 50, within the
    // overlay's 1,450; the small answer well under.
    assert!((1251..=1450).contains(&lost), "{lost}: {}", mtu[0]);
    assert!(delivered < 300, "{delivered}: {}", mtu[0]);
    assert_eq!(
        mtu[0]["summary"],
        format!("DNS answers of {lost} bytes lost between node3 and node1; smaller ones arrive")
    );
    // Worded when the small answer's journey closed, after the large ones
    // closed before it (a lost one waits for its answer to arrive, the
    // small one does not: two or three); each closed after it fed it.
    let evidence = mtu[0]["evidence"][0].as_str().unwrap_or("");
    let before: u64 = evidence
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", mtu[0]));
    assert!((1..=3).contains(&before), "{}", mtu[0]);
    assert!(
        evidence.contains(" answers from node3 to node1 lost on the way")
            && evidence.contains("left by flannel.1 on node node3 (netns "),
        "{}",
        mtu[0]
    );
    assert_eq!(mtu[0]["count"].as_u64(), Some(1 + 4 - before), "{}", mtu[0]);
    let generic = anomalies_of(&lines, "lost_between_nodes");
    assert_eq!(generic[0]["count"].as_u64(), Some(before), "{generic:?}");
}

/// The anomalies of `kind` in `lines`' summary, whole.
fn anomalies_of(lines: &[Value], kind: &str) -> Vec<Value> {
    let summary = lines
        .iter()
        .find(|l| l["type"] == "summary")
        .expect("a summary");
    summary["anomalies"]
        .as_array()
        .expect("anomalies")
        .iter()
        .filter(|a| a["kind"] == kind)
        .cloned()
        .collect()
}

/// An `overlay_mtu` anomaly's smallest lost answer and largest delivered
/// one, in bytes, from its evidence.
fn mtu_sizes(a: &Value) -> (u64, u64) {
    let bytes = |line: &Value, after: &str| -> u64 {
        line.as_str()
            .and_then(|e| e.split(after).nth(1))
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no size after {after:?}: {a}"))
    };
    (
        bytes(&a["evidence"][0], "lost on the way, of "),
        bytes(&a["evidence"][1], "reached node1: "),
    )
}

/// Lookups a down endpoint left unanswered, and the other answered, that
/// the rule needs (3) and one more: the last may be cut off by the end.
const ENDPOINT_LOOKUPS: usize = 4;

/// Node 3's CoreDNS hung while kube-dns still sends it its share: node 1
/// alone names the endpoint that does not answer, the merged recordings
/// its node too.
#[test]
fn faults_in_one_coredns_pod_name_the_endpoint_that_does_not_answer() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let dir = Dir::new("cluster-endpoint-down");
    lab.fault_on("coredns-down", true, "3");
    let nodes = record_nodes(&dir, "down-", || {
        // kube-proxy picks an endpoint at random: until each has its share.
        let (mut answered, mut lost) = (0, 0);
        for _ in 0..40 {
            let out = lab.dig(&WEB, "kube-dns.kube-system.svc.cluster.local");
            match dig_status(&out).as_str() {
                "NOERROR" => answered += 1,
                "timeout" => lost += 1,
                other => panic!("{other}: {out}"),
            }
            if answered >= ENDPOINT_LOOKUPS && lost >= ENDPOINT_LOOKUPS {
                return;
            }
        }
        panic!("40 lookups: {answered} answered, {lost} timed out");
    });
    lab.fault_on("coredns-down", false, "3");
    let summary = |view: &str| {
        format!("the resolver endpoint 10.244.3.53{view} of 10.96.0.10 does not answer; 10.244.2.53 does")
    };
    assert_eq!(
        anomalies(&nodes[0].0, "resolver_endpoint_down"),
        [summary("")],
        "node1 alone"
    );
    let lines = merged(&nodes);
    assert_eq!(
        anomalies(&lines, "resolver_endpoint_down"),
        [summary(" on node3")]
    );
    let down = &anomalies_of(&lines, "resolver_endpoint_down")[0];
    assert!(
        down["evidence"][0]
            .as_str()
            .is_some_and(|e| e.contains(&format!(" lookups to 10.96.0.10 (service kube-system/kube-dns) went to 10.244.3.53 (kube-system/{COREDNS_B} on node node3) and got no answer; 10.244.2.53 (kube-system/{COREDNS_A} on node node2) answered its "))),
        "{down}"
    );
    // Its pod, by node 3's own recording of its pods.
    assert_eq!(
        down["names"]["10.244.3.53"], "kube-system/coredns-7db6d8ff4d-vz8lp",
        "{down}"
    );
}

/// Each node's recording while web looks up, with `overlay-drop` on
/// node 3, until a lookup is lost: half of web's go to node 3's CoreDNS,
/// so twenty answered in a row is a one-in-a-million chance.
fn record_a_lookup_lost_on_the_overlay(
    lab: &Lab,
    dir: &Dir,
    prefix: &str,
) -> Vec<(Vec<Value>, std::path::PathBuf)> {
    lab.fault_on("overlay-drop", true, "3");
    let nodes = record_nodes(dir, prefix, || {
        let lost = (0..20).any(|_| {
            let out = lab.dig(&WEB, "kube-dns.kube-system.svc.cluster.local");
            dig_status(&out) == "timeout"
        });
        assert!(lost, "twenty lookups answered with overlay-drop on");
    });
    lab.fault_on("overlay-drop", false, "3");
    nodes
}

/// A rule inside node 3's CoreDNS pod drops the queries sent to it: the
/// merged recordings name the pod and its node where the query was
/// dropped, with its namespace's inode beside them, and the client by its
/// pod and node.
#[test]
fn a_drop_in_a_coredns_pod_on_another_node_names_the_pod_and_its_node() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let dir = Dir::new("cluster-pod-drop");
    let pod = lab_ns(COREDNS_B);
    let nodes = {
        let _rule = DropInPod::add(&pod);
        record_nodes(&dir, "pod-drop-", || {
            let out = lab.dig(&WEB, "@10.244.3.53 kube-dns.kube-system.svc.cluster.local");
            assert_eq!(dig_status(&out), "timeout", "{out}");
        })
    };
    let inode = std::fs::metadata(format!("/run/netns/{pod}"))
        .expect("the pod's namespace")
        .ino();
    let lines = merged(&nodes);
    let dropped = anomalies_of(&lines, "dropped");
    assert_eq!(dropped.len(), 1, "{:?}", lines.last());
    let evidence = dropped[0]["evidence"][0].as_str().unwrap_or("");
    assert!(
        evidence.contains(&format!(
            " (default/web-7d9f8c6b5-x2x4k on node node1) to 10.244.3.53:53 (kube-system/{COREDNS_B} on node node3) was dropped on eth0 in pod kube-system/{COREDNS_B} on node node3 (netns {inode}): NETFILTER_DROP at "
        )),
        "{evidence}"
    );
}

/// An nftables rule in a pod's namespace that drops DNS queries coming in,
/// while it lives.
struct DropInPod(String);

impl DropInPod {
    const TABLE: &str = "dnstrace_test_pod_drop";

    fn add(ns: &str) -> Self {
        let table = Self::TABLE;
        let out = nft_in(
            ns,
            &format!("table inet {table} {{ chain input {{ type filter hook input priority 0; policy accept; udp dport 53 counter drop; }}; }}"),
        );
        assert!(
            out.status.success(),
            "nft in {ns}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(ns.to_owned())
    }
}

impl Drop for DropInPod {
    fn drop(&mut self) {
        // Gone with the lab's namespaces already, if they went first.
        let _ = nft_in(&self.0, &format!("delete table inet {}", Self::TABLE));
    }
}

/// Runs an nft command in the namespace `ns`.
fn nft_in(ns: &str, command: &str) -> std::process::Output {
    std::process::Command::new("ip")
        .args(["netns", "exec", ns, "nft", command])
        .output()
        .expect("running nft")
}

/// Node 1 alone names the node its lost queries went to, from its own
/// routes, neighbour and FDB entries over flannel.1, live and replayed
/// from its file; replayed with node 2's, the node they left is named
/// rather than "this node". Also what goes with it: a frozen CoreDNS
/// shows as stopped, and --iface outside the node's namespace is refused.
#[test]
fn one_node_names_the_node_its_lost_queries_went_to() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let dir = Dir::new("cluster-next-hop");
    let nodes = record_a_lookup_lost_on_the_overlay(&lab, &dir, "next-");
    let next = "lookups sent to 10.244.3.53:53 get no answer past this node: look at 10.244.3.53 on the node at 172.18.0.4 (over flannel.1) next";
    let live = anomalies(&nodes[0].0, "unanswered");
    assert!(live.iter().any(|a| a == next), "node1 live: {live:?}");
    let alone = anomalies(&merged(&nodes[..1]), "unanswered");
    assert!(alone.iter().any(|a| a == next), "node1 replayed: {alone:?}");
    // With node 2's recording (node 3's is not there to say more).
    let two = anomalies(&merged(&nodes[..2]), "unanswered");
    assert!(
        two.iter().any(|a| a
            == "lookups sent to 10.244.3.53:53 get no answer past node1: look at 10.244.3.53 on the node at 172.18.0.4 (over flannel.1) next"),
        "node1 and node2 merged: {two:?}"
    );
    let all = merged(&nodes);
    for kind in ["unanswered", "lost_between_nodes"] {
        let said = anomalies(&all, kind);
        assert!(
            said.iter().all(|a| !a.contains("this node")),
            "{kind}: {said:?}"
        );
    }

    lab.fault_on("coredns-down", true, "3");
    let status = String::from_utf8_lossy(&dnstrace(&["lab", "status"]).stdout).into_owned();
    lab.fault_on("coredns-down", false, "3");
    let line = |status: &str| {
        status
            .lines()
            .find(|l| l.starts_with("process coredns-7db6d8ff4d-vz8lp:"))
            .map(str::to_owned)
    };
    let frozen = line(&status).unwrap_or_default();
    assert!(frozen.ends_with(" stopped"), "{status}");
    let status = String::from_utf8_lossy(&dnstrace(&["lab", "status"]).stdout).into_owned();
    assert!(
        line(&status).unwrap_or_default().ends_with(" running"),
        "{status}"
    );

    let mut args = vec!["trace".to_owned(), "--iface".to_owned(), "lo".to_owned()];
    args.extend(node_flags(1));
    let out = std::process::Command::new("timeout")
        .arg("60")
        .arg(dnstrace_bin())
        .args(&args)
        .output()
        .expect("running dnstrace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("--iface lo is in this network namespace, not the --node's"),
        "{}: {stderr}",
        out.status
    );
}

/// What an SRE captures on a node's underlay (`tcpdump -i eth0` in node1,
/// where flannel's VXLAN on port 8472 carries every cross-node packet):
/// replayed, each of web's lookups to a CoreDNS pod on another node is a
/// journey, answered, each leg saying it crossed in VXLAN between node1's
/// underlay address and that node's.
#[test]
fn an_underlay_capture_shows_the_lookups_between_nodes_and_the_nodes() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let dir = Dir::new("underlay");
    let file = dir.file("node1-eth0.pcap");
    let mut tcpdump = std::process::Command::new("ip")
        .args(["netns", "exec", &lab_ns("node1"), "tcpdump", "-i", "eth0"])
        // Each packet to the file as it comes: SIGINT drops what the
        // kernel's buffer still holds.
        .args(["--immediate-mode", "-U", "-n", "-w"])
        .arg(&file)
        .args(["udp", "port", "8472"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("tcpdump");
    wait_for(|| std::fs::metadata(&file).ok().filter(|m| m.len() > 0)).unwrap();
    let ids: Vec<u16> = (0..6)
        .map(|_| {
            let out = lab.dig(&WEB, "kube-dns.kube-system.svc.cluster.local");
            assert_eq!(dig_status(&out), "NOERROR", "{out}");
            dig_id(&out).expect("dig's id")
        })
        .collect();
    // Each query and its answer, in the file before tcpdump stops.
    wait_for(|| (pcap_records(&file) >= 2 * ids.len()).then_some(())).unwrap();
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(tcpdump.id() as i32, libc::SIGINT) };
    tcpdump.wait().unwrap();
    let out = dnstrace(&["replay", file.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "{out:?}");
    let lines = json_lines(&String::from_utf8_lossy(&out.stdout));
    let journeys: Vec<&Value> = lines.iter().filter(|l| l["type"] == "journey").collect();
    // Only lookups that crossed are on the underlay: the CoreDNS pods are
    // on nodes 2 and 3, so all of them did.
    for id in ids {
        let j = journeys
            .iter()
            .find(|j| j["dns_id"] == id && j["client"].as_str().unwrap().starts_with(WEB_IP))
            .unwrap_or_else(|| panic!("lookup {id} not on the underlay: {journeys:#?} {out:?}"));
        assert_eq!(j["outcome"]["status"], "answered", "{j}");
        // Past node1's DNAT: a CoreDNS pod's address, 10.244.N.x.
        let server = j["legs"][0]["dst"].as_str().unwrap();
        let node: u8 = server.split('.').nth(2).unwrap().parse().unwrap();
        let remote = format!("172.18.0.{}", node + 1);
        let crossed: Vec<(String, String, String)> = j["legs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                let u = &l["underlay"];
                let s = |v: &Value| v.as_str().unwrap_or("none").to_owned();
                (s(&u["tunnel"]), s(&u["src"]), s(&u["dst"]))
            })
            .collect();
        let way = |src: &str, dst: &str| ("vxlan".to_owned(), src.to_owned(), dst.to_owned());
        assert_eq!(
            crossed,
            [way("172.18.0.2", &remote), way(&remote, "172.18.0.2")],
            "{j}"
        );
        assert!(j["legs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["underlay"]["vni"] == 1));
    }
}

/// The packets a classic pcap file holds so far, counted from its record
/// headers.
fn pcap_records(file: &std::path::Path) -> usize {
    let data = std::fs::read(file).unwrap_or_default();
    let mut at = 24;
    let mut n = 0;
    while let Some(head) = data.get(at..at + 16) {
        let len = u32::from_le_bytes(head[8..12].try_into().unwrap()) as usize;
        at += 16 + len;
        n += usize::from(at <= data.len());
    }
    n
}
