//! Where evidence says things happened, in the words a person knows: the
//! pod or node a leg's network namespace is, and the pod or service an
//! address is, with the numbers beside them.
use std::{
    collections::HashMap,
    fmt::Display,
    net::{IpAddr, SocketAddr},
};

use dnstrace_common::Direction;

use super::Context;
use crate::{correlate::Leg, decode::NodeId};

/// Namespaces remembered at most; past this the memory starts again (a
/// node has far fewer pods, so only churn over a long run gets here).
const MAX_NAMESPACES: usize = 4096;

/// Which pod each network namespace is, learned from the legs seen in it:
/// the recordings and the node know pods by address, not by namespace.
#[derive(Clone, Debug, Default)]
pub struct Namespaces(HashMap<(NodeId, u32), Owner>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// The pod with this address.
    Pod(IpAddr),
    /// Legs in it showed two pods' addresses as its own: no one pod's.
    Several,
}

impl Namespaces {
    /// `pod` was seen as `at`'s own; `same`: as the pod noted before, if any.
    fn note(&mut self, at: (NodeId, u32), pod: IpAddr, same: bool) {
        if self.0.len() >= MAX_NAMESPACES && !self.0.contains_key(&at) {
            self.0.clear();
        }
        let owner = self.0.entry(at).or_insert(Owner::Pod(pod));
        if !same {
            *owner = Owner::Several;
        }
    }

    fn pod(&self, at: (NodeId, u32)) -> Option<IpAddr> {
        match self.0.get(&at)? {
            Owner::Pod(ip) => Some(*ip),
            Owner::Several => None,
        }
    }
}

impl Context {
    /// Learns whose namespaces `legs` were seen in.
    pub(super) fn learn_namespaces(&mut self, legs: &[Leg]) {
        for l in legs {
            let Some(ip) = self.own_address(l) else {
                continue;
            };
            let at = (l.node, l.netns);
            // Two addresses of one pod (IPv4 and IPv6) have one name.
            let same = self
                .namespaces
                .pod(at)
                .is_none_or(|was| was == ip || self.names.get(&was) == self.names.get(&ip));
            self.namespaces.note(at, ip, same);
        }
    }

    /// The address of the pod whose namespace `l` was seen in, where it
    /// shows: what arrives in a pod is for it, what leaves is from it. A
    /// node's namespace forwards others' packets, and a service address
    /// is no pod's.
    fn own_address(&self, l: &Leg) -> Option<IpAddr> {
        if l.netns == 0 || self.is_node_netns(l.node, l.netns) {
            return None;
        }
        let ip = match l.direction() {
            Direction::Ingress => l.dst.ip(),
            Direction::Egress => l.src.ip(),
            _ => return None,
        };
        let pod = !self.service_ips.contains(&ip) && self.names.get(&ip).is_some();
        pod.then_some(ip)
    }

    /// The pod whose namespace `netns` is, on `node`: learned, or the
    /// target's.
    fn pod_in(&self, node: NodeId, netns: u32) -> Option<&str> {
        let target = || {
            let t = self.target.as_ref()?;
            let here = node == NodeId::default() && t.netns_inode == netns;
            here.then(|| t.addrs.first()).flatten().copied()
        };
        let pod = self.namespaces.pod((node, netns)).or_else(target)?;
        self.names.get(&pod)
    }

    /// Whether `netns` is the node `node`'s own namespace.
    fn is_node_netns(&self, node: NodeId, netns: u32) -> bool {
        let own = self.node_namespaces.get(&node).copied();
        own.unwrap_or(self.node_netns) == netns
    }
}

/// Where `l` was seen: `eth0 in pod default/web (netns 4026532177)`,
/// `cni0 on the node (netns 4026532178)`, or `eth0 in netns 4026532245`
/// where the namespace is no one's known; with the node's name where
/// legs are from several.
pub(super) fn place(ctx: &Context, l: &Leg) -> String {
    let iface = l.iface.as_deref().unwrap_or("?");
    let on = node_of(ctx, l.node).map_or_else(String::new, |n| format!(" on node {n}"));
    let netns = l.netns;
    if netns == 0 {
        return format!("{iface}{on}");
    }
    if ctx.is_node_netns(l.node, netns) {
        let node = node_of(ctx, l.node).map_or_else(|| "the node".into(), |n| format!("node {n}"));
        return format!("{iface} on {node} (netns {netns})");
    }
    match ctx.pod_in(l.node, netns) {
        Some(pod) => format!("{iface} in pod {pod}{on} (netns {netns})"),
        None => format!("{iface} in netns {netns}{on}"),
    }
}

/// `10.244.1.5:53 (kube-system/coredns-abc on node node3)`,
/// `10.96.0.10:53 (service kube-system/kube-dns)`, or the address alone
/// where it has no name.
pub(super) fn addr(ctx: &Context, a: SocketAddr) -> String {
    named(ctx, a, a.ip())
}

/// `addr` for an address without a port.
pub(super) fn ip(ctx: &Context, ip: IpAddr) -> String {
    named(ctx, ip, ip)
}

fn named(ctx: &Context, shown: impl Display, ip: IpAddr) -> String {
    let Some(name) = ctx.names.get(&ip) else {
        return shown.to_string();
    };
    if ctx.service_ips.contains(&ip) {
        return format!("{shown} (service {name})");
    }
    let home = ctx.homes.get(&ip).and_then(|n| node_of(ctx, *n));
    match home {
        Some(node) => format!("{shown} ({name} on node {node})"),
        None => format!("{shown} ({name})"),
    }
}

/// The node's name where legs are from several nodes (numbered from 1).
fn node_of(ctx: &Context, node: NodeId) -> Option<String> {
    (node.0 > 0).then(|| name(ctx, node))
}

/// The node's name in the replay, or its number.
pub(super) fn name(ctx: &Context, node: NodeId) -> String {
    usize::from(node.0)
        .checked_sub(1)
        .and_then(|i| ctx.nodes.get(i))
        .cloned()
        .unwrap_or_else(|| format!("node #{}", node.0))
}
