//! `--pod` on the lab: pods found in the runtime's state (containerd's
//! layout, and CRI-O's), one pod traced while another also makes lookups,
//! and addresses named after pods and services.
use std::collections::BTreeSet;

use serde_json::Value;

use dnstrace_tests::*;

fn pods(args: &[&str]) -> (bool, Vec<Value>, String) {
    let mut all = vec!["pods", "-o", "json", "--node-netns", node_netns()];
    all.extend_from_slice(args);
    let out = dnstrace(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), json_lines(&stdout), stderr)
}

fn check_web(row: &Value, runtime: &str) {
    assert_eq!(row["namespace"], "default");
    assert_eq!(row["name"], "web-7d9f8c6b5-x2x4k");
    assert_eq!(row["runtime"], runtime);
    assert_eq!(row["net"]["ips"], serde_json::json!(["10.244.0.10"]));
    let veth = row["net"]["host_veth"][0].as_str().unwrap();
    let link = std::process::Command::new("ip")
        .args(["-n", &NODE, "-o", "link", "show", veth])
        .output()
        .unwrap();
    assert!(link.status.success(), "{veth} is on the node");
    let inode = std::fs::metadata(format!("/run/netns/{WEB}")).unwrap();
    assert_eq!(
        row["net"]["netns_inode"].as_u64(),
        Some(std::os::unix::fs::MetadataExt::ino(&inode))
    );
    assert_eq!(
        row["resolv"]["nameservers"],
        serde_json::json!(["10.96.0.10"])
    );
    assert_eq!(row["resolv"]["ndots"], 5);
}

#[test]
fn pods_are_found_in_containerd_state_by_name_namespace_and_prefix() {
    require_root();
    let _lab = Lab::up(&[]);
    let (ok, all, stderr) = pods(&["--containerd-root", lab_containerd()]);
    assert!(ok, "{stderr}");
    assert_eq!(all.len(), 4, "{all:?}");
    let coredns: Vec<bool> = all
        .iter()
        .map(|p| p["resolver"].as_bool().unwrap())
        .collect();
    assert_eq!(
        coredns.iter().filter(|c| **c).count(),
        2,
        "the two CoreDNS pods"
    );
    for query in [
        "web-7d9f8c6b5-x2x4k",
        "default/web-7d9f8c6b5-x2x4k",
        "web",
        "default/w",
    ] {
        let (ok, one, stderr) = pods(&["--containerd-root", lab_containerd(), query]);
        assert!(ok, "{query}: {stderr}");
        check_web(&one[0], "containerd");
    }
    let (ok, _, stderr) = pods(&["--containerd-root", lab_containerd(), "coredns"]);
    assert!(!ok && stderr.contains("matches 2 pods"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let (ok, _, stderr) = pods(&["--containerd-root", lab_containerd(), "nope"]);
    assert!(
        !ok && stderr.contains("no pod matches \"nope\""),
        "{stderr}"
    );
    // The same errors from `trace --pod`, before anything is attached.
    let out = dnstrace(&[
        "trace",
        "--containerd-root",
        lab_containerd(),
        "--pod",
        "coredns",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("give namespace/name"),
        "{stderr}"
    );
    assert!(!stderr.contains("attached"), "{stderr}");
}

#[test]
fn pods_are_found_in_crio_state() {
    require_root();
    let _lab = Lab::up(&["--runtime", "crio"]);
    let (ok, one, stderr) = pods(&[
        "--crio-root",
        &lab_path("crio"),
        "--containerd-root",
        "/nonexistent",
        "web",
    ]);
    assert!(ok, "{stderr}");
    check_web(&one[0], "cri-o");
}

#[test]
fn tracing_one_pod_keeps_only_its_journeys_complete_and_named() {
    require_root();
    let lab = Lab::up(&[]);
    let trace = lab.trace_every_lookup(&["--timeout", "3s", "--pod", "default/web"]);
    lab.traffic(&[
        "--pod",
        "checkout",
        "--name",
        "kubernetes.default",
        "--name",
        "other.example.com",
    ]);
    lab.traffic(&["--pod", "web", "--name", "www.example.com"]);
    lab.traffic(&["--pod", "checkout", "--name", "kubernetes.default"]);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{stderr:?}");
    assert!(
        stderr
            .iter()
            .any(|l| l.contains("tracing pod default/web-7d9f8c6b5-x2x4k")
                && l.contains("10.244.0.10")
                && l.contains("nameserver 10.96.0.10")),
        "{stderr:#?}"
    );
    let journeys: Vec<Value> = json_lines(&out)
        .into_iter()
        .filter(|l| l["type"] == "journey")
        .collect();
    let clients: BTreeSet<&str> = journeys
        .iter()
        .map(|j| j["client"].as_str().unwrap().split(':').next().unwrap())
        .collect();
    assert_eq!(clients, ["10.244.0.10"].into(), "only web's journeys");
    // The search list, then the name itself: 4 names, A and AAAA each.
    assert_eq!(journeys.len(), 8, "{journeys:#?}");
    let answered = journeys
        .iter()
        .find(|j| j["name"] == "www.example.com." && j["qtype"] == "A")
        .expect("the external name's journey");
    assert_eq!(answered["outcome"]["status"], "answered");
    assert!(
        !answered["upstream"].as_array().unwrap().is_empty(),
        "CoreDNS's upstream leg"
    );
    let names = &answered["names"];
    assert_eq!(names["10.244.0.10"], "default/web-7d9f8c6b5-x2x4k");
    assert_eq!(names["10.96.0.10"], "kube-system/kube-dns");
    let endpoint = answered["dnat"][1]
        .as_str()
        .unwrap()
        .split(':')
        .next()
        .unwrap();
    assert!(
        names[endpoint]
            .as_str()
            .unwrap()
            .starts_with("kube-system/coredns-7db6d8ff4d-"),
        "{names}"
    );
}

/// The packet view has no journey filter in user space: what it prints is
/// what the kernel passed.
#[test]
fn the_kernel_passes_only_the_target_pods_packets() {
    require_root();
    let lab = Lab::up(&[]);
    let args = [&["-o", "json", "--pod", "default/web"][..], &lab_scope()].concat();
    let trace = Dnstrace::start_here(Keep::Every, &args).unwrap();
    lab.traffic(&["--pod", "checkout", "--name", "kubernetes.default"]);
    lab.traffic(&["--pod", "web", "--name", "kubernetes.default"]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{stderr:?}");
    let packets = json_lines(&out);
    let touches = |ip: &str| {
        packets.iter().any(|p| {
            [&p["src"], &p["dst"]]
                .iter()
                .any(|a| a.as_str().is_some_and(|a| a.starts_with(&format!("{ip}:"))))
        })
    };
    assert!(touches("10.244.0.10"), "web's packets: {packets:#?}");
    assert!(!touches("10.244.0.11"), "none of checkout's");
}

/// The selectors for namespaces that are in no runtime's state: a network
/// namespace path, a process inside it, an address. Each must keep web's
/// lookups, complete through DNAT, and none of checkout's.
#[test]
fn netns_pid_and_ip_select_the_same_client() {
    require_root();
    let lab = Lab::up(&[]);
    // `ip netns exec` execs in place: this pid lives in web's namespace and
    // sees web's resolv.conf through its own root.
    let mut inside = std::process::Command::new("ip")
        .args(["netns", "exec", &WEB, "sleep", "120"])
        .spawn()
        .unwrap();
    let pid = inside.id().to_string();
    let netns = format!("/run/netns/{WEB}");
    let cases = [
        (
            "--netns",
            netns.as_str(),
            format!("network namespace {netns}"),
        ),
        ("--pid", pid.as_str(), format!("process {pid}")),
        ("--ip", "10.244.0.10", "address 10.244.0.10".to_owned()),
    ];
    for (flag, value, label) in &cases {
        let journeys = trace_while_both_ask(&lab, flag, value, label);
        let clients: BTreeSet<&str> = journeys
            .iter()
            .map(|j| j["client"].as_str().unwrap().split(':').next().unwrap())
            .collect();
        assert_eq!(clients, ["10.244.0.10"].into(), "{flag}: only web's");
        let answered = journeys
            .iter()
            .find(|j| j["name"] == "kubernetes.default.svc.cluster.local." && j["qtype"] == "A")
            .unwrap_or_else(|| panic!("{flag}: {journeys:#?}"));
        assert_eq!(answered["outcome"]["status"], "answered", "{flag}");
        assert_eq!(answered["dnat"][0], "10.96.0.10:53", "{flag}");
    }
    let _ = inside.kill();
    let _ = inside.wait();
}

/// Traces with one selector while checkout, then web, look a name up;
/// returns the journeys, after checking the start line named the target.
fn trace_while_both_ask(lab: &Lab, flag: &str, value: &str, label: &str) -> Vec<Value> {
    let trace = lab.trace_every_lookup(&["--timeout", "3s", flag, value]);
    lab.traffic(&["--pod", "checkout", "--name", "kubernetes.default"]);
    lab.traffic(&["--pod", "web", "--name", "kubernetes.default"]);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{flag}: {stderr:?}");
    let described = format!("tracing {label}");
    assert!(
        stderr
            .iter()
            .any(|l| l.contains(&described) && l.contains("10.244.0.10")),
        "{flag}: {stderr:#?}"
    );
    if flag == "--pid" {
        assert!(
            stderr.iter().any(|l| l.contains("nameserver 10.96.0.10")),
            "--pid reads resolv.conf through the process: {stderr:#?}"
        );
    }
    json_lines(&out)
        .into_iter()
        .filter(|l| l["type"] == "journey")
        .collect()
}

/// The lab's pods are CRI sandboxes of its own containerd: its socket
/// alone lists them, with their workload and labels, on their planned
/// addresses, in namespaces of the runtime's own naming; NodeLocalDNS's
/// and the log shipper's are hostNetwork DaemonSet pods.
#[test]
fn the_lab_cri_socket_alone_lists_its_pods_with_their_workload() {
    require_root();
    let _lab = Lab::up(&["--host-network-client", "--nodelocaldns=notrack"]);
    let (ok, all, stderr) = pods(&[
        "--cri-socket",
        lab_runtime()[3],
        "--containerd-root",
        "/nonexistent",
    ]);
    assert!(ok, "{stderr}");
    let found: BTreeSet<(String, String)> = all
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["workload"].to_string(),
            )
        })
        .collect();
    let want = |name: &str, kind: &str, owner: &str| {
        let workload = serde_json::json!({ "kind": kind, "name": owner }).to_string();
        (name.to_owned(), workload)
    };
    let expected: BTreeSet<_> = [
        want("web-7d9f8c6b5-x2x4k", "Deployment", "web"),
        want("checkout-5f6d7c9b8-q7w2e", "Deployment", "checkout"),
        want(COREDNS_A, "Deployment", "coredns"),
        want(COREDNS_B, "Deployment", "coredns"),
        want("fluent-bit-5lq8z", "DaemonSet", "fluent-bit"),
        want("node-local-dns-7qx4m", "DaemonSet", "node-local-dns"),
    ]
    .into();
    assert_eq!(found, expected, "{all:#?}");
    let web = all
        .iter()
        .find(|p| p["name"] == "web-7d9f8c6b5-x2x4k")
        .unwrap();
    check_web(web, "containerd");
    let node_local = all
        .iter()
        .find(|p| p["name"] == "node-local-dns-7qx4m")
        .unwrap();
    let node = std::fs::metadata(format!("/run/netns/{NODE}")).unwrap();
    assert_eq!(
        node_local["net"]["netns_inode"].as_u64(),
        Some(std::os::unix::fs::MetadataExt::ino(&node)),
        "the node's network: {node_local:#}"
    );
    assert_eq!(web["labels"]["pod-template-hash"], "7d9f8c6b5");
    assert!(
        web["netns"]
            .as_str()
            .unwrap()
            .starts_with("/var/run/netns/cni-"),
        "{web}"
    );
}
