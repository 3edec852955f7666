//! A pod's life while tracing, on a real containerd through CRI (the
//! private one of `cri.rs`, on a bridge and subnet of this test's own:
//! dtcri1, 10.245.1.0/24, so both run at once, and not the lab).
//!
//! A "coredns" pod forwards to a resolver on the node (dnsmasq on the
//! bridge's address, answering `life.test`). `trace --pod web` and a trace
//! of the whole node run while `web` is deleted and re-created, CoreDNS is
//! restarted and a pod `late` is started; each lookup is made only once
//! dnstrace has said it saw the change, so nothing depends on timing.
use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use dnstrace_tests::{
    cri::{require_containerd, Runtime},
    *,
};

const BRIDGE: &str = "dtcri1";
const SUBNET: &str = "10.245.1.0/24";
/// The bridge's address: the node's end of the pods' network.
const NODE_RESOLVER: &str = "10.245.1.1";
/// What the node's resolver answers for every name in `life.test`.
const ANSWER: &str = "192.0.2.7";
/// How long dnstrace may take to see a pod come or go (it reads the CRI
/// each second).
const SEEN_WITHIN: Duration = Duration::from_secs(10);

/// A pod sandbox run through CRI, with what `dnstrace pods` says of it.
struct Pod {
    id: String,
    ip: String,
    /// Its network namespace's name under /run/netns.
    netns: String,
}

fn run_pod(runtime: &Runtime, namespace: &str, name: &str, uid: &str, labels: &[&str]) -> Pod {
    let mut args = vec![
        format!("--namespace={namespace}"),
        format!("--name={name}"),
        format!("--uid={uid}"),
    ];
    args.extend(labels.iter().map(|l| format!("--label={l}")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let id = runtime.cri_lab("run-pod", &args);
    let node_netns = format!("/run/netns/{}", runtime.node.name);
    let socket = runtime.socket();
    let full = format!("{namespace}/{name}");
    let out = dnstrace(&[
        "pods",
        "--cri-socket",
        &socket,
        "--node-netns",
        &node_netns,
        "-o",
        "json",
        &full,
    ]);
    assert!(out.status.success(), "{out:?}");
    let row = json_lines(&String::from_utf8_lossy(&out.stdout)).remove(0);
    assert_eq!(row["sandbox_id"], id.as_str(), "{row:#}");
    let netns = row["netns"].as_str().unwrap();
    Pod {
        id,
        ip: row["pod_ips"][0].as_str().unwrap().to_owned(),
        netns: Path::new(netns)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned(),
    }
}

/// dnsmasq in the namespace `netns` (a name under /run/netns), on
/// `listen`, with `args`, caching nothing.
fn dnsmasq_at(netns: &str, listen: &str, args: &[&str]) -> Proc {
    let args = [&["--cache-size=0"], args].concat();
    dnsmasq_in(netns, &[listen], &args).unwrap()
}

/// Looks `name` up at `server` from the namespace `netns`: whether the
/// answer came.
fn dig(netns: &str, server: &str, name: &str) -> bool {
    let out = Command::new("ip")
        .args([
            "netns", "exec", netns, "dig", "+short", "+tries=1", "+time=2",
        ])
        .arg(format!("@{server}"))
        .arg(name)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == ANSWER
}

/// CoreDNS: a pod named as its Deployment names it, forwarding to the
/// node's resolver.
fn coredns(runtime: &Runtime, suffix: &str) -> (Pod, Proc) {
    let pod = run_pod(
        runtime,
        "kube-system",
        &format!("coredns-5d78c9869d-{suffix}"),
        &format!("c0ffee00-0000-0000-0000-00000000{suffix}"),
        &["k8s-app=kube-dns", "pod-template-hash=5d78c9869d"],
    );
    let server = format!("--server={NODE_RESOLVER}");
    let proc = dnsmasq_at(&pod.netns, &pod.ip, &[&server]);
    (pod, proc)
}

fn trace(runtime: &Runtime, extra: &[&str]) -> Dnstrace {
    let node_netns = format!("/run/netns/{}", runtime.node.name);
    let socket = runtime.socket();
    let mut args = vec![
        "trace",
        "-o",
        "json",
        "--timeout",
        "3s",
        "--cri-socket",
        &socket,
        "--node-netns",
        &node_netns,
    ];
    args.extend_from_slice(extra);
    Dnstrace::start_here(Keep::Every, &args).unwrap()
}

/// The journey of the lookup of `name`: the one, or a failure showing all.
fn journey<'a>(journeys: &'a [Value], name: &str) -> &'a Value {
    let found: Vec<&Value> = journeys
        .iter()
        .filter(|j| j["type"] == "journey" && j["name"] == name)
        .collect();
    match found.as_slice() {
        [j] => j,
        _ => panic!("{} journeys of {name}: {journeys:#?}", found.len()),
    }
}

/// The journey of the lookup of `name` from `ip` (a trace of the whole
/// node also has CoreDNS's own query, where it is not linked).
fn journey_from<'a>(journeys: &'a [Value], name: &str, ip: &str) -> &'a Value {
    journeys
        .iter()
        .find(|j| j["type"] == "journey" && j["name"] == name && client(j).0 == ip)
        .unwrap_or_else(|| panic!("no journey of {name} from {ip}: {journeys:#?}"))
}

/// The client's address and the name the journey gives it.
fn client(j: &Value) -> (String, String) {
    let addr = j["client"].as_str().unwrap();
    let ip = addr.rsplit_once(':').map_or(addr, |(ip, _)| ip).to_owned();
    let name = j["names"][&ip].as_str().unwrap_or("").to_owned();
    (ip, name)
}

/// Whether the journey names `ip` as `name`.
fn names(j: &Value, ip: &str, name: &str) -> bool {
    j["names"][ip] == name
}

fn stop(trace: Dnstrace) -> (Vec<Value>, Vec<String>) {
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:#?}");
    (json_lines(&out), stderr)
}

#[test]
fn trace_follows_pods_re_created_restarted_and_started_while_tracing() {
    require_root();
    require_containerd();
    let began = Instant::now();
    let dir = std::env::temp_dir().join(format!("dnstrace-crilife-{}", std::process::id()));
    let runtime = Runtime {
        dir: dir.clone(),
        node: Netns::new("crilife").unwrap(),
        bridge: BRIDGE,
        subnet: SUBNET,
    };
    runtime.cri_lab("up", &[]);
    // The bridge exists once a pod is on it: CoreDNS first, then the node's
    // resolver it forwards to.
    let old_dns = run_pod(
        &runtime,
        "kube-system",
        "coredns-5d78c9869d-aaaaa",
        "c0ffee00-0000-0000-0000-0000000aaaaa",
        &["k8s-app=kube-dns", "pod-template-hash=5d78c9869d"],
    );
    let _node_resolver = dnsmasq_at(
        &runtime.node.name,
        NODE_RESOLVER,
        &[&format!("--address=/life.test/{ANSWER}")],
    );
    let server = format!("--server={NODE_RESOLVER}");
    let old_dns_proc = dnsmasq_at(&old_dns.netns, &old_dns.ip, &[&server]);
    let web = run_pod(
        &runtime,
        "default",
        "web",
        "c0ffee00-0000-0000-0000-000000000001",
        &[],
    );
    let setup = began.elapsed();

    let mut pod_trace = trace(&runtime, &["--pod", "web"]);
    // The node's namespaces alone, as on its own kernel: the suite's other
    // labs share this one, and their lookups would crowd this node's out.
    let mut node_trace = trace(&runtime, &["--node", "crilife"]);
    let traced = Instant::now();
    assert!(dig(&web.netns, &old_dns.ip, "one.life.test."));

    // web deleted and re-created: a new sandbox at a new address.
    runtime.cri_lab("remove-pod", &[&web.id]);
    let web2 = run_pod(
        &runtime,
        "default",
        "web",
        "c0ffee00-0000-0000-0000-000000000002",
        &[],
    );
    assert_ne!(
        web2.ip, web.ip,
        "host-local gives the new sandbox a new address"
    );
    let recreated = Instant::now();
    pod_trace
        .wait_stderr_for(
            "following pod default/web into its new sandbox",
            SEEN_WITHIN,
        )
        .unwrap();
    let followed_in = recreated.elapsed();
    // The node's trace says so once its kernel scope holds the sandbox.
    let web2_started = format!("pod default/web started: {}", web2.ip);
    node_trace
        .wait_stderr_for(&web2_started, SEEN_WITHIN)
        .unwrap();
    assert!(dig(&web2.netns, &old_dns.ip, "two.life.test."));
    // A resolver on the new sandbox's loopback: its packets carry no
    // address of web's, only its namespace says they are web's.
    let loopback = dnsmasq_at(
        &web2.netns,
        "127.0.0.1",
        &[&format!("--address=/life.test/{ANSWER}")],
    );
    assert!(dig(&web2.netns, "127.0.0.1", "local.life.test."));
    drop(loopback);

    // CoreDNS restarted: a new sandbox at a new address.
    drop(old_dns_proc);
    runtime.cri_lab("remove-pod", &[&old_dns.id]);
    let (new_dns, _new_dns_proc) = coredns(&runtime, "bbbbb");
    assert_ne!(new_dns.ip, old_dns.ip);
    let started = "pod kube-system/coredns-5d78c9869d-bbbbb started";
    pod_trace.wait_stderr_for(started, SEEN_WITHIN).unwrap();
    node_trace.wait_stderr_for(started, SEEN_WITHIN).unwrap();
    assert!(dig(&web2.netns, &new_dns.ip, "three.life.test."));

    // A pod started after the traces.
    let late = run_pod(
        &runtime,
        "default",
        "late",
        "c0ffee00-0000-0000-0000-000000000003",
        &[],
    );
    node_trace
        .wait_stderr_for("pod default/late started", SEEN_WITHIN)
        .unwrap();
    assert!(dig(&late.netns, &new_dns.ip, "four.life.test."));
    let lifecycle = traced.elapsed();

    let (journeys, stderr) = stop(pod_trace);
    let (everything, node_stderr) = stop(node_trace);
    eprintln!(
        "timings: setup {setup:?}, traced lifecycle {lifecycle:?}, web followed {followed_in:?} after its re-creation"
    );

    // --pod web: web's lookups from both sandboxes, named web; nothing else.
    let one = journey(&journeys, "one.life.test.");
    assert_eq!(client(one), (web.ip.clone(), "default/web".into()));
    assert!(
        names(one, &old_dns.ip, "kube-system/coredns-5d78c9869d-aaaaa"),
        "{one:#}"
    );
    let two = journey(&journeys, "two.life.test.");
    assert_eq!(client(two), (web2.ip.clone(), "default/web".into()));
    let local = journey(&journeys, "local.life.test.");
    assert_eq!(client(local).0, "127.0.0.1", "{local:#}");
    let three = journey(&journeys, "three.life.test.");
    assert_eq!(client(three), (web2.ip.clone(), "default/web".into()));
    assert!(
        names(three, &new_dns.ip, "kube-system/coredns-5d78c9869d-bbbbb"),
        "{three:#}"
    );
    // CoreDNS's workload, from the CRI's labels: known at the start for
    // the old pod, learnt while tracing for the new one.
    let coredns = serde_json::json!({ "kind": "Deployment", "name": "coredns" });
    assert_eq!(one["workloads"][&old_dns.ip], coredns, "{one:#}");
    assert_eq!(three["workloads"][&new_dns.ip], coredns, "{three:#}");
    assert!(one["workloads"].get(&web.ip).is_none(), "web is a bare pod");
    // The restarted CoreDNS is watched as a resolver: its query upstream
    // reaches dnstrace and is linked under web's, as the old one's was.
    for (j, dns) in [(one, &old_dns), (three, &new_dns)] {
        let upstream = j["upstream"].as_array().unwrap();
        assert!(
            upstream.iter().any(|u| client(u).0 == dns.ip),
            "CoreDNS's ({}) query to the node's resolver is linked: {j:#}",
            dns.ip
        );
    }
    assert!(
        journeys.iter().all(|j| j["name"] != "four.life.test."),
        "late's lookup is not web's"
    );
    let follows = stderr
        .iter()
        .filter(|l| l.contains("following pod default/web into its new sandbox"))
        .count();
    assert_eq!(follows, 1, "said once: {stderr:#?}");

    // The whole node: the pod started after the start is named, and so
    // is web's new sandbox.
    let four = journey_from(&everything, "four.life.test.", &late.ip);
    assert!(
        names(four, &late.ip, "default/late"),
        "{four:#} {node_stderr:#?}"
    );
    let two = journey_from(&everything, "two.life.test.", &web2.ip);
    assert!(names(two, &web2.ip, "default/web"), "{two:#}");

    // `check` asks the same socket: three pods are ready (web, CoreDNS, late).
    let socket = runtime.socket();
    let out = dnstrace(&["check", "--cri-socket", &socket]);
    let checked = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{checked}");
    let said = format!("check: pods' labels and workload: CRI socket {socket} (containerd ");
    assert!(
        checked.contains(&said) && checked.contains("): 3 ready sandboxes"),
        "{checked}"
    );

    runtime.cri_lab("down", &[]);
    assert!(!dir.exists(), "{} is removed", dir.display());
}
