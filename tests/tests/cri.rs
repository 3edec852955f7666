//! A real containerd (Debian's, with its CRI plugin), started privately by
//! `dnstrace-harness cri-lab` (the lab's `lab::containerd`), runs a pod
//! sandbox through CRI on the real CNI bridge; `dnstrace pods` asks its
//! CRI socket and lists the pod with its address, host veth, resolver and
//! Deployment. Removing the pod and stopping containerd leaves nothing.
//!
//! Not the lab: containerd runs in a network namespace of this test's own,
//! so its bridge and pod subnet (10.245.0.0/24, beside the lab's
//! 10.244.0.0/16) meet nothing else, and the lab's lock is not needed.
use std::path::Path;

use serde_json::{json, Value};

use dnstrace_tests::{
    cri::{require_containerd, Runtime},
    *,
};

const BRIDGE: &str = "dtcri0";
const SUBNET: &str = "10.245.0.0/24";
const NAMESERVER: &str = "10.96.0.10";

/// What a runtime can leave on the node beside its pods' own namespaces
/// (checked one by one: other runtimes on the machine make `cni-` ones).
#[derive(Debug, PartialEq)]
struct Traces {
    mounts: Vec<String>,
    processes: Vec<String>,
}

fn traces(dir: &Path) -> Traces {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mounts = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .map(str::to_owned)
        .collect();
    Traces {
        mounts,
        processes: processes_mentioning(dir),
    }
}

/// Live processes whose command line names `dir` (containerd's config,
/// its shims' `-address`).
fn processes_mentioning(dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
        let path = entry.path();
        let zombie = std::fs::read_to_string(path.join("stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
            .unwrap_or(true);
        let cmdline = std::fs::read(path.join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !zombie && cmdline.contains(&dir) {
            found.push(cmdline);
        }
    }
    found
}

fn link_exists(node: &Netns, link: &str) -> bool {
    node.cmd("ip")
        .args(["link", "show", link])
        .output()
        .unwrap()
        .status
        .success()
}

fn pods(runtime: &Runtime, extra: &[&str]) -> (String, String) {
    let node_netns = format!("/run/netns/{}", runtime.node.name);
    let socket = runtime.socket();
    let mut args = vec!["pods", "--cri-socket", &socket, "--node-netns", &node_netns];
    args.extend_from_slice(extra);
    let out = dnstrace(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

fn check_row(row: &Value, id: &str, node: &Netns) -> String {
    assert_eq!(row["runtime"], "containerd", "{row:#}");
    assert_eq!(row["sandbox_id"], id);
    assert_eq!(row["namespace"], "shop");
    assert_eq!(row["name"], "checkout-5f6d7c9b8-q7w2e");
    assert_eq!(row["uid"], "c0ffee00-1111-2222-3333-444455556666");
    assert_eq!(
        row["workload"],
        json!({ "kind": "Deployment", "name": "checkout" })
    );
    assert_eq!(row["labels"]["pod-template-hash"], "5f6d7c9b8");
    assert_eq!(row["annotations"]["dnstrace.test/owner"], "cri");
    let ip = row["net"]["ips"][0].as_str().unwrap();
    assert!(ip.starts_with("10.245.0."), "{row:#}");
    assert_eq!(
        row["pod_ips"],
        json!([ip]),
        "the CRI's address is the pod's"
    );
    let veth = row["net"]["host_veth"][0].as_str().unwrap().to_owned();
    assert!(link_exists(node, &veth), "{veth} is on the node");
    assert_eq!(row["resolv"]["nameservers"], json!([NAMESERVER]));
    assert_eq!(
        row["resolv"]["search"],
        json!([
            "shop.svc.cluster.local",
            "svc.cluster.local",
            "cluster.local"
        ])
    );
    assert_eq!(row["resolv"]["ndots"], 5);
    veth
}

#[test]
fn a_real_containerd_runs_a_pod_that_dnstrace_lists_with_its_workload_and_leaves_nothing() {
    require_root();
    require_containerd();
    let dir = std::env::temp_dir().join(format!("dnstrace-cri-{}", std::process::id()));
    let runtime = Runtime {
        dir: dir.clone(),
        node: Netns::new("cri").unwrap(),
        bridge: BRIDGE,
        subnet: SUBNET,
    };
    let before = traces(&dir);
    runtime.cri_lab("up", &[]);
    let id = runtime.cri_lab(
        "run-pod",
        &[
            "--namespace=shop",
            "--name=checkout-5f6d7c9b8-q7w2e",
            "--uid=c0ffee00-1111-2222-3333-444455556666",
            "--label=app=checkout",
            "--label=pod-template-hash=5f6d7c9b8",
            "--annotation=dnstrace.test/owner=cri",
            &format!("--dns-server={NAMESERVER}"),
            "--dns-search=shop.svc.cluster.local",
            "--dns-search=svc.cluster.local",
            "--dns-search=cluster.local",
            "--dns-option=ndots:5",
        ],
    );
    let (out, stderr) = pods(&runtime, &["-o", "json"]);
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 1, "{rows:#?} {stderr}");
    let veth = check_row(&rows[0], &id, &runtime.node);
    let (out, _) = pods(&runtime, &["shop/checkout"]);
    assert!(
        out.lines()
            .nth(1)
            .is_some_and(|l| l.ends_with("Deployment/checkout")),
        "{out}"
    );
    let netns = rows[0]["netns"].as_str().unwrap().to_owned();

    runtime.cri_lab("remove-pod", &[&id]);
    assert!(
        !link_exists(&runtime.node, &veth),
        "{veth} went with the pod"
    );
    assert!(!Path::new(&netns).exists(), "{netns} went with the pod");
    let (_, stderr) = pods(&runtime, &[]);
    assert!(
        stderr.contains("no running pod found") && stderr.contains("0 ready sandboxes"),
        "{stderr}"
    );

    runtime.cri_lab("down", &[]);
    assert!(!dir.exists(), "{} is removed", dir.display());
    assert!(!link_exists(&runtime.node, BRIDGE), "the bridge is removed");
    assert_eq!(traces(&dir), before);
}
