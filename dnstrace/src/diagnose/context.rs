//! What the rules know about the node besides journeys.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use serde::{Deserialize, Serialize};

use super::places::Namespaces;
use crate::{
    decode::NodeId,
    naming::Names,
    pods::net::Attachment,
    routes::Routes,
    target::{follow::Joined, Target},
};

/// What the rules know about the node besides journeys.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// Cluster IPs of services with port 53, from kube-proxy's rules.
    pub service_ips: BTreeSet<IpAddr>,
    /// Who turns those IPs into an endpoint's.
    pub translation: Translation,
    /// The node's net.bridge.bridge-nf-call-iptables, when it could be read.
    pub bridge_nf_call_iptables: Option<String>,
    /// Inode of the node's network namespace: other namespaces are pods.
    pub node_netns: u32,
    /// The node's conntrack counters and table size when tracing started.
    pub conntrack: Option<ConntrackAtStart>,
    /// The pod (or namespace, process) being traced, with its resolv.conf.
    pub target: Option<Target>,
    /// The kfree_skb tracepoint is attached: a DNS packet the kernel drops
    /// shows as a leg, so a loss without one was no drop.
    pub drops_visible: bool,
    /// The node's own search domains (its resolv.conf), which the kubelet
    /// appends to ClusterFirst pods' search lists: by design on managed
    /// clusters (EKS's ec2.internal, GKE's google.internal, ...).
    pub node_search: Vec<String>,
    /// The node's pod addresses, each with where its pod's host veth sits
    /// (on which bridge, or routed). Empty when the runtimes' state was not
    /// read: whether pods are bridged is then not known.
    pub attachments: BTreeMap<IpAddr, Attachment>,
    /// The cluster's resolvers (DNS services' endpoints, CoreDNS pods).
    pub resolvers: BTreeSet<IpAddr>,
    /// In a replay of several nodes' recordings: their names, by `NodeId`
    /// less one, and the node each pod address lives on.
    pub nodes: Vec<String>,
    pub homes: BTreeMap<IpAddr, NodeId>,
    /// Each node's routes through a gateway (over VXLAN, to which node),
    /// by the `NodeId` its legs carry: where a query leaving it went next.
    pub routes: BTreeMap<NodeId, Routes>,
    /// In a replay of several nodes' recordings: each node's own network
    /// namespace, by `NodeId` (`node_netns` is the first's).
    pub node_namespaces: BTreeMap<NodeId, u32>,
    /// Pods and services by address, as the node (or the recording)
    /// knows them now: what evidence names addresses and places after.
    pub names: Names,
    /// Which pod each network namespace is, learned from legs.
    pub namespaces: Namespaces,
}

impl Context {
    /// Pods (re-)named since the start: evidence names them from now on.
    pub fn rename(&mut self, names: &[(IpAddr, String)]) {
        self.names.extend(names, &[], &[]);
    }

    /// A node a cluster view joined: its name, its pods' homes and
    /// routes; the resolvers and services it knows besides.
    pub fn join(&mut self, j: &Joined) {
        let id = NodeId(j.id);
        j.name_in(&mut self.nodes);
        for (ip, a) in &j.attachments {
            self.homes.entry(*ip).or_insert(id);
            self.attachments.entry(*ip).or_insert_with(|| a.clone());
        }
        self.routes.insert(id, j.routes.clone());
        self.node_namespaces.insert(id, j.node_netns);
        self.resolvers.extend(&j.resolvers);
        self.service_ips.extend(&j.service_ips);
    }
}

/// Who gives a query to a service IP an endpoint's address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Translation {
    /// The service proxy's NAT rules on the node (kube-proxy's DNAT).
    #[default]
    Dnat,
    /// No proxy rules on the node: a kube-proxy replacement rewrites the
    /// address at the socket (Cilium's or Calico's eBPF), so a translated
    /// query is never seen addressed to the service, and conntrack and
    /// br_netfilter play no part in it.
    Socket,
}

#[derive(Clone, Debug, Default)]
pub struct ConntrackAtStart {
    /// Counters of packets conntrack dropped since boot (name, value).
    pub dropped: Vec<(&'static str, u64)>,
    pub entries: u64,
    /// net.netfilter.nf_conntrack_max, when it could be read.
    pub max: Option<u64>,
}
