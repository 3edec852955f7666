//! What a cluster view follows, from what the agents say of their nodes:
//! the clients' addresses (`--pod`, `--node`, `--ip`), and the nodes their
//! lookups reach, the clients' own and their resolvers', which are the
//! only ones asked for evidence. Where a client or a resolver lives on no
//! node that answered, every node is asked.
use std::{collections::BTreeSet, net::IpAddr};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::commands::observer::{NodeReply, Pod};

/// What the view follows.
#[derive(Debug, PartialEq, Eq)]
pub struct Chosen {
    /// The clients' addresses.
    pub ips: Vec<IpAddr>,
    /// The nodes asked, by their place among the replies, in order.
    pub nodes: Vec<usize>,
    /// Why every node is asked, when it is.
    pub everyone: Option<String>,
}

/// `pod` (`[namespace/]name`, looked for on `node` if given), every pod of
/// `node` but its resolvers, and `ips`.
pub fn choose(
    pod: Option<&str>,
    node: Option<&str>,
    ips: &[IpAddr],
    replies: &[NodeReply],
) -> Result<Chosen> {
    let on = node.map(|n| node_at(n, replies)).transpose()?;
    let mut clients = BTreeSet::new();
    let mut watched = Vec::new();
    if let Some(pod) = pod {
        let (i, p) = find_pod(pod, on, replies)?;
        log::info!("{}/{} runs on {}", p.namespace, p.name, replies[i].node);
        clients.insert(i);
        watched.extend(addrs(p)?);
    } else if let Some(i) = on {
        let resolvers = resolvers_of(&replies[i])?;
        for p in &replies[i].pods {
            let a = addrs(p)?;
            if !a.iter().any(|a| resolvers.contains(a)) {
                watched.extend(a);
            }
        }
        if watched.is_empty() && ips.is_empty() {
            bail!(
                "the agent on {} knows no pods there but resolvers: give --pod or --ip",
                replies[i].node
            );
        }
        clients.insert(i);
    }
    let mut everyone = None;
    for ip in ips {
        watched.push(*ip);
        match home(*ip, replies)? {
            Some(i) => {
                clients.insert(i);
            }
            None => everyone = Some(format!("no agent runs a pod at {ip}")),
        }
    }
    if watched.is_empty() {
        bail!("nothing to watch: give --pod, --node or --ip");
    }
    let mut resolvers = BTreeSet::new();
    for &i in &clients {
        resolvers.extend(resolvers_of(&replies[i])?);
    }
    let mut reached = clients.clone();
    for r in &resolvers {
        match home(*r, replies)? {
            Some(i) => {
                reached.insert(i);
            }
            None => everyone = Some(format!("no agent runs the resolver at {r}")),
        }
    }
    if resolvers.is_empty() && everyone.is_none() {
        everyone = Some("the clients' nodes know no resolvers".into());
    }
    let nodes = match everyone {
        Some(_) => (0..replies.len()).collect(),
        None => reached.into_iter().collect(),
    };
    Ok(Chosen {
        ips: watched,
        nodes,
        everyone,
    })
}

fn node_at(node: &str, replies: &[NodeReply]) -> Result<usize> {
    replies.iter().position(|r| r.node == node).ok_or_else(|| {
        let names: Vec<&str> = replies.iter().map(|r| r.node.as_str()).collect();
        anyhow!(
            "no agent answered for node {node}: those that did are on {}",
            names.join(", ")
        )
    })
}

/// The one pod `pod` names (`name`, `namespace/name`, or a unique prefix
/// of either, an exact match winning, as `trace --pod` takes it), on node
/// `on` if given, and its node.
fn find_pod<'a>(
    pod: &str,
    on: Option<usize>,
    replies: &'a [NodeReply],
) -> Result<(usize, &'a Pod)> {
    let candidates: Vec<(usize, &Pod)> = replies
        .iter()
        .enumerate()
        .filter(|(i, _)| on.is_none_or(|on| on == *i))
        .flat_map(|(i, r)| r.pods.iter().map(move |p| (i, p)))
        .collect();
    let matching = |exact: bool| -> Vec<(usize, &'a Pod)> {
        candidates
            .iter()
            .filter(|(_, p)| {
                let full = format!("{}/{}", p.namespace, p.name);
                [p.name.as_str(), full.as_str()].iter().any(|c| {
                    if exact {
                        *c == pod
                    } else {
                        c.starts_with(pod)
                    }
                })
            })
            .copied()
            .collect()
    };
    let exact = matching(true);
    let found = if exact.is_empty() {
        matching(false)
    } else {
        exact
    };
    match found.as_slice() {
        [] => bail!(
            "no agent runs a pod {pod}{}: `kubectl get pod -A -o wide` says where it runs; is the agent on its node up?",
            on.map_or(String::new(), |i| format!(" on {}", replies[i].node))
        ),
        [one] => Ok(*one),
        several => {
            let names: Vec<String> = several
                .iter()
                .map(|(i, p)| format!("{}/{} on {}", p.namespace, p.name, replies[*i].node))
                .collect();
            bail!(
                "{pod} is several pods: {}; give namespace/name or a longer prefix",
                names.join(", ")
            )
        }
    }
}

fn addrs(p: &Pod) -> Result<Vec<IpAddr>> {
    p.ips
        .iter()
        .map(|ip| {
            ip.parse()
                .with_context(|| format!("the agent's address {ip} of {}/{}", p.namespace, p.name))
        })
        .collect()
}

fn resolvers_of(r: &NodeReply) -> Result<BTreeSet<IpAddr>> {
    r.resolvers
        .iter()
        .map(|ip| {
            ip.parse()
                .with_context(|| format!("the resolver {ip} the agent on {} gave", r.node))
        })
        .collect()
}

/// The node whose agent runs a pod at `ip`.
fn home(ip: IpAddr, replies: &[NodeReply]) -> Result<Option<usize>> {
    for (i, r) in replies.iter().enumerate() {
        for p in &r.pods {
            if addrs(p)?.contains(&ip) {
                return Ok(Some(i));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, ip: &str) -> Pod {
        Pod {
            namespace: ns.into(),
            name: name.into(),
            ips: vec![ip.into()],
        }
    }

    const RESOLVERS: [&str; 2] = ["10.244.2.53", "10.244.3.53"];

    /// The lab's shape with a fourth node: a client on each of nodes 1
    /// and 2, CoreDNS on 2 and 3, node 4 running neither.
    fn lab() -> Vec<NodeReply> {
        let node = |name: &str, pods: Vec<Pod>| NodeReply {
            node: name.into(),
            pods,
            resolvers: RESOLVERS.map(String::from).to_vec(),
            ..NodeReply::default()
        };
        vec![
            node("node1", vec![pod("default", "web", "10.244.1.10")]),
            node(
                "node2",
                vec![
                    pod("shop", "checkout", "10.244.2.10"),
                    pod("kube-system", "coredns-a", "10.244.2.53"),
                ],
            ),
            node(
                "node3",
                vec![pod("kube-system", "coredns-b", "10.244.3.53")],
            ),
            node("node4", vec![pod("default", "batch", "10.244.4.10")]),
        ]
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_pods_lookups_are_asked_of_its_node_and_its_resolvers_nodes_only() {
        let web = choose(Some("default/web"), None, &[], &lab()).unwrap();
        assert_eq!(web.ips, [ip("10.244.1.10")]);
        assert_eq!(web.nodes, [0, 1, 2]);
        assert_eq!(web.everyone, None);
        let checkout = choose(Some("checkout"), None, &[], &lab()).unwrap();
        assert_eq!(checkout.nodes, [1, 2]);
    }

    #[test]
    fn a_node_gives_its_pods_but_its_resolvers() {
        let two = choose(None, Some("node2"), &[], &lab()).unwrap();
        assert_eq!(two.ips, [ip("10.244.2.10")]);
        assert_eq!(two.nodes, [1, 2]);
        let e = choose(None, Some("node3"), &[], &lab()).unwrap_err();
        assert!(e.to_string().contains("no pods there but resolvers"), "{e}");
        let e = choose(Some("web"), Some("node2"), &[], &lab()).unwrap_err();
        assert!(
            e.to_string().contains("no agent runs a pod web on node2"),
            "{e}"
        );
        let e = choose(None, Some("node9"), &[], &lab()).unwrap_err();
        assert!(e.to_string().contains("node1, node2, node3, node4"), "{e}");
    }

    #[test]
    fn what_lives_on_no_node_that_answered_asks_every_node() {
        let stranger = choose(None, None, &[ip("192.0.2.1")], &lab()).unwrap();
        assert_eq!(stranger.nodes, [0, 1, 2, 3]);
        assert!(stranger.everyone.unwrap().contains("192.0.2.1"));
        let mut gone = lab();
        gone.remove(2);
        let web = choose(Some("web"), None, &[], &gone).unwrap();
        assert_eq!(web.nodes, [0, 1, 2]);
        assert!(web.everyone.unwrap().contains(RESOLVERS[1]));
        let mut blind = lab();
        blind[0].resolvers.clear();
        let web = choose(Some("web"), None, &[], &blind).unwrap();
        assert_eq!(web.nodes, [0, 1, 2, 3]);
    }

    #[test]
    fn a_pod_is_named_as_trace_takes_it_a_unique_prefix_too() {
        let mut lab = lab();
        lab[0].pods[0].name = "web-7d9f8c6b5-x2x4k".into();
        for name in ["default/web", "web-7d9f", "default/web-7d9f8c6b5-x2x4k"] {
            let web = choose(Some(name), None, &[], &lab).unwrap();
            assert_eq!(web.ips, [ip("10.244.1.10")], "{name}");
        }
        let e = choose(Some("kube-system/coredns"), None, &[], &lab).unwrap_err();
        assert!(e.to_string().contains("a longer prefix"), "{e}");
    }

    #[test]
    fn a_name_on_two_nodes_needs_its_namespace() {
        let mut two = lab();
        two[3].pods.push(pod("other", "web", "10.244.4.11"));
        let e = choose(Some("web"), None, &[], &two).unwrap_err();
        assert!(
            e.to_string()
                .contains("default/web on node1, other/web on node4"),
            "{e}"
        );
        let web = choose(Some("default/web"), None, &[], &two).unwrap();
        assert_eq!(web.nodes, [0, 1, 2]);
    }
}
