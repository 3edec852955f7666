//! `--node`: an instance that is one node of several on a kernel sees only
//! that node's network namespaces, as on the node's own kernel. The lab's
//! upstream resolver, in a namespace of its own, stands for another machine.
use std::{
    collections::BTreeSet, net::UdpSocket, os::unix::fs::MetadataExt as _, process::Command,
    time::Duration,
};

use serde_json::Value;

use dnstrace_tests::*;

fn inode(ns: &str) -> u64 {
    std::fs::metadata(format!("/run/netns/{ns}"))
        .unwrap_or_else(|e| panic!("{ns}: {e}"))
        .ino()
}

/// The web pod's journey for `name`, A, among `lines`.
fn journey<'a>(lines: &'a [Value], name: &str) -> &'a Value {
    let found: Vec<&Value> = lines
        .iter()
        .filter(|j| {
            j["type"] == "journey"
                && j["name"] == name
                && j["qtype"] == "A"
                && j["client"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("10.244.0.10:"))
        })
        .collect();
    assert_eq!(found.len(), 1, "{lines:#?}");
    found[0]
}

/// The namespaces a journey's legs, and its upstream queries', were seen in.
fn namespaces(j: &Value) -> BTreeSet<u64> {
    let legs = |j: &Value| -> Vec<u64> {
        j["legs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|l| l["netns"].as_u64())
            .collect()
    };
    let upstream = j["upstream"].as_array().cloned().unwrap_or_default();
    legs(j)
        .into_iter()
        .chain(upstream.iter().flat_map(legs))
        .collect()
}

fn start(extra: &[&str]) -> Dnstrace {
    let mut args = vec![
        "trace",
        "-o",
        "json",
        "--timeout",
        "3s",
        "--node-netns",
        node_netns(),
    ];
    args.extend_from_slice(extra);
    Dnstrace::start_binary(dnstrace_release_bin(), Keep::Every, &args).unwrap()
}

fn stop(trace: Dnstrace) -> Vec<Value> {
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    json_lines(&out)
}

#[test]
fn a_node_sees_its_pods_and_not_the_upstream_machine() {
    require_root();
    let lab = Lab::up(&[]);
    let whole = start(&[]);
    let scoped = start(&[&["--node", "lab-node"][..], &lab_runtime()].concat());
    assert_eq!(scoped.ready["node"], "lab-node", "{}", scoped.ready);
    // The node's own namespace and the four pods'.
    assert_eq!(scoped.ready["scope_netns"], 5, "{}", scoped.ready);
    assert!(
        scoped
            .stderr_lines
            .iter()
            .any(|l| l.contains("node lab-node: only its network namespaces, 5 in scope")),
        "{:?}",
        scoped.stderr_lines
    );
    let name = format!("{}.", fresh("scope"));
    lab.dig(&WEB, &format!("@{SERVICE} {name}"));
    std::thread::sleep(Duration::from_millis(1500));
    let (all, node) = (stop(whole), stop(scoped));

    let upstream = inode(&UPSTREAM_NS);
    let seen_all = namespaces(journey(&all, &name));
    assert!(seen_all.contains(&upstream), "unscoped: {seen_all:?}");
    let j = journey(&node, &name);
    let seen = namespaces(j);
    assert!(!seen.contains(&upstream), "scoped: {seen:?}");
    assert_eq!(seen, &seen_all - &[upstream].into(), "the rest alike");
    assert!(
        seen.contains(&inode(&WEB)),
        "the client pod's legs: {seen:?}"
    );
    let coredns = [COREDNS_A, COREDNS_B].map(|p| inode(&lab_ns(p)));
    assert!(
        coredns.iter().any(|c| seen.contains(c)),
        "a CoreDNS pod's legs: {seen:?}"
    );
    assert_eq!(j["upstream"].as_array().map(Vec::len), Some(1), "{j:#}");
    assert_eq!(j["outcome"]["rcode"], "NXDOMAIN", "{j:#}");
}

/// Queries queued at a socket of another namespace, dropped when it
/// closes unread: such a drop has no device (UDP keeps scratch in that
/// field of a queued packet), and its socket says whose it is. The whole
/// machine's view sees the drops; the node's does not, as another node's
/// are not its own.
#[test]
fn another_namespaces_socket_drops_are_not_the_nodes() {
    require_root();
    let _lab = Lab::up(&[]);
    // A port of its own: the whole machine's view does not carry the
    // lookups of the tests beside it.
    let packets = |scope: &[&str]| {
        let args = [&["-o", "json", "--port", "5399"][..], scope].concat();
        Dnstrace::start_here(Keep::Every, &args).unwrap()
    };
    let (whole, node) = (packets(&[]), packets(&lab_scope()));
    let other = Netns::new("drops").unwrap();
    let name = fresh("queued");
    let queries: Vec<Vec<u8>> = (0..5).map(|id| query_bytes(id, &name, 1)).collect();
    other
        .enter(move || {
            let unread = UdpSocket::bind("127.0.0.1:5399").unwrap();
            let client = UdpSocket::bind("127.0.0.1:0").unwrap();
            for q in &queries {
                client.send_to(q, "127.0.0.1:5399").unwrap();
            }
            // Queued: then closed with them unread.
            unread.peek_from(&mut [0u8; 512]).unwrap();
        })
        .unwrap();
    let is_drop =
        |l: &Value| l["hook"] == "kfree_skb" && l["questions"][0]["name"] == format!("{name}.");
    // A UDP socket is freed after an RCU grace period, and its queue with
    // it: the drops come when the whole view shows the fifth, not at close.
    let mut whole = whole;
    let mut seen = 0;
    whole
        .wait_stdout_for(Duration::from_secs(20), |l| {
            seen += usize::from(is_drop(l));
            seen == 5
        })
        .unwrap();
    let dropped = |trace: Dnstrace| {
        let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
        assert!(status.success(), "{status}: {stderr:?}");
        json_lines(&out).iter().filter(|l| is_drop(l)).count()
    };
    assert_eq!(dropped(whole), 5, "the machine's view sees the drops");
    // The node's view has read its ring up to now when it stops.
    assert_eq!(dropped(node), 0, "another namespace's drops");
}

#[test]
fn a_node_whose_namespace_is_missing_is_a_clear_error() {
    require_root();
    let out = Command::new(dnstrace_release_bin())
        .args([
            "trace",
            "--node",
            "n-1",
            "--node-netns",
            "/run/netns/no-such-node",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit status {}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line: {stderr}");
    assert!(
        lines[0].starts_with("dnstrace: error: node n-1")
            && lines[0].contains("/run/netns/no-such-node"),
        "{stderr}"
    );
}
