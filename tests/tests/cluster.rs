//! The lab as a cluster (`lab up --nodes 3`): nodes sharing this kernel,
//! linked by a VXLAN overlay as flannel links them. A lookup from node 1's
//! client is DNATed there to a CoreDNS pod on another node, crosses the
//! overlay, and its answer crosses back.
use std::{os::unix::fs::MetadataExt as _, time::Duration};

use serde_json::Value;

use dnstrace_tests::*;

/// node1's client, and the kube-dns service every node DNATs.
const WEB_IP: &str = "10.244.1.10";

/// A node's network namespace inode, as legs name it.
fn node_netns(node: u8) -> u64 {
    std::fs::metadata(format!("/run/netns/dtlab-node{node}"))
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
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let (lines, stderr) = lab.trace_during(&[], || {
        let out = lab.dig(
            "dtlab-web-7d9f8c6b5-x2x4k",
            "kube-dns.kube-system.svc.cluster.local",
        );
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
