use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
};

use dnstrace_common::Hook;

use super::{
    anomaly::{Finding, Raised, JOURNEYS_KEPT},
    loops::is_loop_probe,
    outcome::unanswered,
    *,
};
use crate::decode::{NodeId, Qtype, Rcode};
use crate::pods::net::Attachment;
use crate::routes::Route;
use crate::{
    correlate::{Connection, FragmentNote, Gap, Journey, Leg, Outcome, Reset},
    decode::Seen,
};

const CLIENT_NS: u32 = 100;
const NODE_NS: u32 = 200;
const DNS_NS: u32 = 300;

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn leg(
    ts: u64,
    hook: &'static str,
    netns: u32,
    ifindex: u32,
    src: &str,
    dst: &str,
    response: bool,
) -> Leg {
    let hook = match hook {
        "dev_xmit" => Hook::DevXmit,
        "dev_receive" => Hook::DevReceive,
        _ => Hook::Drop,
    };
    Leg {
        ts_ns: ts,
        since_prev_ns: 0,
        hook,
        iface: Some("eth0".into()),
        ifindex,
        node: Default::default(),
        netns,
        src: a(src),
        dst: a(dst),
        response,
        ip_len: 0,
        dnat: None,
        snat: None,
        drop: (hook == Hook::Drop).then(|| Box::new((3, 0x10))),
        fragment: None,
        underlay: None,
    }
}

fn answered(rcode: Rcode) -> Outcome {
    Outcome::Answered {
        rcode,
        answers: vec!["A 10.96.0.1".into()],
        truncated: false,
        malformed: None,
    }
}

/// A lookup through the service IP, answered by 10.244.0.53 and reverse-NATed.
fn healthy() -> Journey {
    Journey {
        id: 1,
        lookup: 1,
        client: a("10.244.0.10:4000"),
        dns_id: 7,
        name: "kubernetes.default.svc.cluster.local.".into(),
        qtype: Qtype::A,
        tcp: false,
        started_ns: 0,
        ended_ns: 300_000,
        outcome: answered(Rcode::NOERROR),
        dnat: Some(Box::new((a("10.96.0.10:53"), a("10.244.0.53:53")))),
        legs: vec![
            leg(
                0,
                "dev_xmit",
                CLIENT_NS,
                2,
                "10.244.0.10:4000",
                "10.96.0.10:53",
                false,
            ),
            leg(
                50_000,
                "dev_receive",
                DNS_NS,
                2,
                "10.244.0.10:4000",
                "10.244.0.53:53",
                false,
            ),
            leg(
                250_000,
                "dev_xmit",
                DNS_NS,
                2,
                "10.244.0.53:53",
                "10.244.0.10:4000",
                true,
            ),
            leg(
                300_000,
                "dev_receive",
                CLIENT_NS,
                2,
                "10.96.0.10:53",
                "10.244.0.10:4000",
                true,
            ),
        ],
        upstream: vec![],
        incomplete: None,
        sampled: Default::default(),
        connection: None,
        opcode: None,
        asked_as: None,
    }
}

fn upstream(server: &str, outcome: Outcome, total: u64) -> Journey {
    Journey {
        id: 2,
        client: a("10.244.0.53:5555"),
        started_ns: 60_000,
        ended_ns: 60_000 + total,
        outcome,
        dnat: None,
        legs: vec![leg(
            60_000,
            "dev_xmit",
            DNS_NS,
            2,
            "10.244.0.53:5555",
            server,
            false,
        )],
        ..healthy()
    }
}

fn ctx() -> Context {
    Context {
        service_ips: ["10.96.0.10".parse().unwrap()].into(),
        translation: Translation::Dnat,
        bridge_nf_call_iptables: Some("1".into()),
        node_netns: NODE_NS,
        conntrack: None,
        target: None,
        drops_visible: false,
        node_search: Vec::new(),
        attachments: Default::default(),
        resolvers: Default::default(),
        ..Context::default()
    }
}

fn kinds(j: &Journey) -> Vec<&'static str> {
    Diagnoser::new(ctx())
        .journey(j, &KernelNames::default())
        .raised
        .iter()
        .map(|a| a.kind.as_str())
        .collect()
}

#[test]
fn a_healthy_journey_raises_nothing() {
    assert!(kinds(&healthy()).is_empty());
    let mut external = healthy();
    external.upstream.push(upstream(
        "198.51.100.53:53",
        answered(Rcode::NOERROR),
        100_000,
    ));
    assert!(kinds(&external).is_empty());
}

/// musl asks every nameserver at once, from one socket under one id: here
/// the service and, as a second nameserver, the CoreDNS pod behind it. The
/// pod's own answer to the query sent to it is no un-NATed reply.
#[test]
fn an_answer_to_a_query_sent_to_its_source_is_not_unnated() {
    let mut j = healthy();
    let to_pod = leg(
        10_000,
        "dev_xmit",
        CLIENT_NS,
        2,
        "10.244.0.10:4000",
        "10.244.0.53:53",
        false,
    );
    let from_pod = leg(
        200_000,
        "dev_receive",
        CLIENT_NS,
        2,
        "10.244.0.53:53",
        "10.244.0.10:4000",
        true,
    );
    j.legs.insert(1, to_pod);
    j.legs.insert(3, from_pod);
    assert_eq!(kinds(&j), Vec::<&str>::new());
    // Without the query to the pod, its answer is un-NATed.
    j.legs.remove(1);
    assert_eq!(kinds(&j), ["reply_from_unexpected_source"]);
}

#[test]
fn an_unnated_answer_is_named_and_its_drop_not_repeated() {
    let mut j = healthy();
    j.legs[3].src = a("10.244.0.53:53");
    j.legs.push(leg(
        301_000,
        "kfree_skb",
        CLIENT_NS,
        2,
        "10.244.0.53:53",
        "10.244.0.10:4000",
        true,
    ));
    j.outcome = Outcome::Dropped {
        reason: 3,
        location: 0x10,
    };
    let found = Diagnoser::new(ctx())
        .journey(&j, &KernelNames::default())
        .raised;
    assert_eq!(
        found.iter().map(|a| a.kind.as_str()).collect::<Vec<_>>(),
        vec!["reply_from_unexpected_source"]
    );
    let a = &found[0];
    assert!(
        a.evidence[1].contains("from 10.244.0.53:53, not from 10.96.0.10:53"),
        "{:?}",
        a.evidence
    );
    assert!(a.cause.contains("bridge-nf-call-iptables is 1 now"));
}

#[test]
fn a_pod_asking_loopback_is_flagged_but_not_the_node() {
    let mut j = healthy();
    j.legs = vec![leg(
        0,
        "dev_xmit",
        CLIENT_NS,
        1,
        "127.0.0.1:4000",
        "127.0.0.53:53",
        false,
    )];
    j.outcome = Outcome::Timeout;
    assert_eq!(kinds(&j), vec!["loopback_nameserver"]);
    j.legs[0].netns = NODE_NS;
    assert_eq!(
        kinds(&j),
        vec!["unanswered"],
        "systemd-resolved on the node is normal"
    );
}

/// A query DNATed here that left on the overlay for a CoreDNS pod on
/// another node, and got no answer.
fn lost_past_this_node() -> Journey {
    let mut j = healthy();
    j.legs.truncate(1);
    let mut left = leg(
        40_000,
        "dev_xmit",
        NODE_NS,
        5,
        "10.244.0.10:4000",
        "10.244.3.53:53",
        false,
    );
    left.iface = Some("flannel.1".into());
    j.legs.push(left);
    j.outcome = Outcome::Timeout;
    j
}

#[test]
fn a_query_lost_past_this_node_names_where_it_went() {
    let mut j = lost_past_this_node();
    let raised = |j: &Journey| {
        Diagnoser::new(ctx())
            .journey(j, &KernelNames::default())
            .raised
    };
    let found = raised(&j);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].summary,
        "lookups sent to 10.244.3.53:53 get no answer past this node: look at 10.244.3.53 and its node next"
    );
    assert!(
        found[0].evidence[0]
            .contains("the query left flannel.1 on the node (netns 200) for 10.244.3.53:53"),
        "{:?}",
        found[0].evidence
    );
    // An answer back, even one dropped here, was not lost past the node.
    j.legs.push(leg(
        90_000,
        "drop",
        NODE_NS,
        5,
        "10.244.3.53:53",
        "10.244.0.10:4000",
        true,
    ));
    assert!(raised(&j)
        .iter()
        .all(|a| !a.summary.contains("past this node")));
}

/// The lost query of the test above, and node 1's route to node 3's
/// subnet over flannel.1; with `overlay`, its FDB names node 3.
fn lost_with_a_route(overlay: bool) -> (Journey, Context) {
    let j = lost_past_this_node();
    let mut cx = ctx();
    let route = Route {
        dst: "10.244.3.0".parse().unwrap(),
        len: 24,
        gateway: "10.244.3.0".parse().unwrap(),
        dev: if overlay { "flannel.1" } else { "eth0" }.into(),
        node: overlay.then(|| "172.18.0.4".parse().unwrap()),
    };
    cx.routes = [(NodeId::default(), [route].into_iter().collect())].into();
    (j, cx)
}

#[test]
fn a_query_lost_past_this_node_names_the_node_its_route_leads_to() {
    let raised = |(j, cx): (Journey, Context)| {
        Diagnoser::new(cx)
            .journey(&j, &KernelNames::default())
            .raised
    };
    let over = raised(lost_with_a_route(true));
    assert_eq!(
        over[0].summary,
        "lookups sent to 10.244.3.53:53 get no answer past this node: look at 10.244.3.53 on the node at 172.18.0.4 (over flannel.1) next"
    );
    assert!(
        over[0].evidence[1].contains("by 10.244.3.0/24 via 10.244.3.0 dev flannel.1, whose neighbour entry gives 10.244.3.0 a VTEP MAC that flannel.1's FDB sends to 172.18.0.4"),
        "{:?}",
        over[0].evidence
    );
    let routed = raised(lost_with_a_route(false));
    assert_eq!(
        routed[0].summary,
        "lookups sent to 10.244.3.53:53 get no answer past this node: look at 10.244.3.53 and its node, past the gateway 10.244.3.0 (eth0) next"
    );
    // Replayed with other nodes (none of them node 3): the leg's node by
    // name, and its own routes.
    let (mut j, mut cx) = lost_with_a_route(true);
    cx.nodes = ["node1", "node2"].map(String::from).to_vec();
    cx.routes = [(NodeId(1), cx.routes[&NodeId::default()].clone())].into();
    for l in &mut j.legs {
        l.node = NodeId(1);
    }
    let merged = raised((j, cx));
    assert_eq!(
        merged[0].summary,
        "lookups sent to 10.244.3.53:53 get no answer past node1: look at 10.244.3.53 on the node at 172.18.0.4 (over flannel.1) next"
    );
    assert!(
        merged[0].evidence[0].contains("left flannel.1 on node node1 (netns 200)"),
        "{:?}",
        merged[0].evidence
    );
}

/// web on node1 asks kube-dns, DNATed there to CoreDNS on node3: the
/// query leaves node1 on the overlay; with `arrives`, node3 has it and
/// its answer leaves node3 for node1.
fn across_nodes(arrives: bool) -> (Journey, Context) {
    let (one, three) = (NodeId(1), NodeId(3));
    let mut j = healthy();
    j.outcome = Outcome::Timeout;
    let on = |node: NodeId, mut l: Leg| {
        l.node = node;
        l
    };
    let (client, server) = ("10.244.1.10:4000", "10.244.3.53:53");
    j.client = a(client);
    j.legs = vec![
        on(
            one,
            leg(0, "dev_xmit", CLIENT_NS, 2, client, "10.96.0.10:53", false),
        ),
        on(
            one,
            leg(30_000, "dev_xmit", NODE_NS, 5, client, server, false),
        ),
    ];
    if arrives {
        j.legs.extend([
            on(
                three,
                leg(60_000, "dev_receive", NODE_NS, 5, client, server, false),
            ),
            on(
                three,
                leg(90_000, "dev_xmit", NODE_NS, 5, server, client, true),
            ),
        ]);
    }
    let cx = Context {
        nodes: ["node1", "node2", "node3"].map(String::from).to_vec(),
        homes: [
            ("10.244.1.10".parse().unwrap(), one),
            ("10.244.3.53".parse().unwrap(), three),
        ]
        .into(),
        ..ctx()
    };
    (j, cx)
}

#[test]
fn a_message_that_left_one_node_and_never_reached_the_other_was_lost_between_them() {
    let raised = |(j, cx): (Journey, Context)| {
        Diagnoser::new(cx)
            .journey(&j, &KernelNames::default())
            .raised
    };
    let query = raised(across_nodes(false));
    assert_eq!(query.len(), 1, "{query:?}");
    assert_eq!(query[0].summary, "DNS queries lost between node1 and node3");
    assert!(
        query[0].evidence[0].contains(
            "the query 10.244.1.10:4000 → 10.244.3.53:53 left eth0 on node node1 (netns 200), and node3"
        ),
        "{:?}",
        query[0].evidence
    );
    let answer = raised(across_nodes(true));
    assert_eq!(answer.len(), 1, "{answer:?}");
    assert_eq!(
        answer[0].summary,
        "DNS answers lost between node3 and node1"
    );
    // The server answered (its answer was seen): lost all the same.
    let (mut j, cx) = across_nodes(true);
    j.outcome = answered(Rcode::NOERROR);
    let kinds: Vec<AnomalyKind> = raised((j, cx)).iter().map(|a| a.kind).collect();
    assert!(kinds.contains(&AnomalyKind::LostBetweenNodes), "{kinds:?}");
    // One node's recording alone knows no other node: the rule is silent.
    let (j, mut cx) = across_nodes(false);
    cx.nodes.clear();
    assert!(raised((j, cx))
        .iter()
        .all(|a| a.kind != AnomalyKind::LostBetweenNodes));
}

#[test]
fn a_service_query_without_dnat_is_not_translated() {
    let mut j = healthy();
    j.dnat = None;
    j.legs.truncate(1);
    // It left the node still addressed to the service: past the DNAT.
    j.legs.push(leg(
        40_000,
        "dev_xmit",
        NODE_NS,
        3,
        "10.244.0.10:4000",
        "10.96.0.10:53",
        false,
    ));
    j.outcome = Outcome::Timeout;
    assert_eq!(kinds(&j), vec!["service_not_translated"]);
    j.legs[0].dst = a("10.244.0.53:53");
    assert_eq!(kinds(&j), vec!["unanswered"], "a pod IP is not a service");
}

#[test]
fn a_service_query_lost_before_the_nodes_nat_is_no_evidence_of_missing_rules() {
    // The first query of a trace, before any through the service was
    // answered: seen leaving the pod and entering the node, then nothing.
    let mut j = healthy();
    j.dnat = None;
    j.legs.truncate(1);
    j.legs.push(leg(
        10_000,
        "dev_receive",
        NODE_NS,
        4,
        "10.244.0.10:4000",
        "10.96.0.10:53",
        false,
    ));
    j.outcome = Outcome::Timeout;
    assert_eq!(kinds(&j), vec!["unanswered"]);
}

#[test]
fn forwarding_to_loopback_or_back_into_the_path_is_a_loop() {
    let mut j = healthy();
    j.outcome = Outcome::Timeout;
    j.upstream
        .push(upstream("127.0.0.53:53", Outcome::Timeout, 0));
    assert_eq!(
        kinds(&j),
        vec!["forwarding_loop"],
        "the upstream timeout is the loop's, not another problem"
    );
    let mut round = healthy();
    let mut nodelocal = upstream("169.254.20.10:53", Outcome::Timeout, 0);
    nodelocal
        .upstream
        .push(upstream("10.96.0.10:53", Outcome::Timeout, 0));
    round.upstream.push(nodelocal);
    assert_eq!(kinds(&round), vec!["forwarding_loop"]);
}

/// A resolver that keeps the query's id asking itself (dnsmasq): the same
/// query seen again and again at one place, in a journey of its own once
/// the one that led there has closed. A forwarding loop, not a pod's
/// loopback nameserver; a client's retry a second later is neither.
#[test]
fn a_query_going_round_one_place_is_a_loop() {
    let lap = |ts| {
        let at = (DNS_NS, 1, "127.0.0.1:51836", "127.0.0.53:53");
        leg(ts, "dev_xmit", at.0, at.1, at.2, at.3, false)
    };
    let mut j = healthy();
    j.legs = vec![lap(0), lap(20_000), lap(60_000), lap(140_000)];
    j.outcome = Outcome::Timeout;
    let raised = Diagnoser::new(ctx())
        .journey(&j, &KernelNames::default())
        .raised;
    assert_eq!(kinds(&j), vec!["forwarding_loop"]);
    let a = &raised[0];
    assert_eq!(
        a.summary,
        "DNS forwarding loop: 127.0.0.1 forwards to 127.0.0.53"
    );
    assert!(
        a.evidence[0].contains("seen 4 times at eth0@300, the first two 0.020 ms apart"),
        "{:?}",
        a.evidence
    );
    j.legs = vec![lap(0), lap(1_000_000_000)];
    assert_eq!(kinds(&j), vec!["loopback_nameserver"], "a retry");
}

#[test]
fn drops_name_reason_and_place() {
    let mut j = healthy();
    j.legs.truncate(1);
    j.legs.push(leg(
        40_000,
        "kfree_skb",
        NODE_NS,
        7,
        "10.244.0.10:4000",
        "10.244.0.54:53",
        false,
    ));
    j.outcome = Outcome::Dropped {
        reason: 3,
        location: 0x10,
    };
    let found = Diagnoser::new(ctx())
        .journey(
            &j,
            &KernelNames::new(
                [(3, "SKB_DROP_REASON_NETFILTER_DROP".to_owned())].into(),
                "0000000000000000 T x\n0000000000000008 t nf_hook_slow\n".as_bytes(),
            ),
        )
        .raised;
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].summary,
        "DNS packets to 10.244.0.54 dropped in the kernel: NETFILTER_DROP at nf_hook_slow+0x8"
    );
}

#[test]
fn an_upstream_that_does_not_answer_is_named_with_its_counts() {
    let mut j = healthy();
    j.outcome = answered(Rcode::SERVFAIL);
    j.upstream
        .push(upstream("198.51.100.53:53", Outcome::Timeout, 0));
    let found = Diagnoser::new(named(ctx()))
        .journey(&j, &KernelNames::default())
        .raised;
    let up = found
        .iter()
        .find(|a| a.kind.as_str() == "upstream_timeout")
        .unwrap();
    assert_eq!(
        up.evidence[0],
        "10.244.0.53 (kube-system/coredns-abc) asked 198.51.100.53:53 for kubernetes.default.svc.cluster.local.: no answer came"
    );
    assert!(
        up.evidence[1].contains("1 queries, 0 answers, 1 timeouts"),
        "{:?}",
        up.evidence
    );
}

#[test]
fn servfail_from_upstream_says_so() {
    let mut j = healthy();
    j.outcome = answered(Rcode::SERVFAIL);
    j.upstream.push(upstream(
        "198.51.100.53:53",
        answered(Rcode::SERVFAIL),
        100_000,
    ));
    let found = Diagnoser::new(ctx())
        .journey(&j, &KernelNames::default())
        .raised;
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].summary,
        "SERVFAIL answers coming from the upstream 198.51.100.53:53"
    );
}

#[test]
fn a_slow_answer_says_where_the_time_went() {
    let mut j = healthy();
    j.legs[2].ts_ns = 850_000_000;
    j.legs[3].ts_ns = 850_100_000;
    j.ended_ns = 850_100_000;
    j.upstream.push(upstream(
        "198.51.100.53:53",
        answered(Rcode::NOERROR),
        800_000_000,
    ));
    let found = thrice(&j);
    assert_eq!(
        found.iter().map(|a| a.kind.as_str()).collect::<Vec<_>>(),
        vec!["slow_answers"]
    );
    assert!(
        found[0].summary.contains("most of it in upstream"),
        "{}",
        found[0].summary
    );
}

#[test]
fn repeats_are_one_anomaly_with_a_rising_count() {
    let mut d = Diagnoser::new(ctx());
    let mut j = healthy();
    j.legs.truncate(1);
    j.dnat = None;
    j.outcome = Outcome::Timeout;
    assert_eq!(d.journey(&j, &KernelNames::default()).raised.len(), 1);
    for id in 2..50 {
        j.id = id;
        assert!(d.journey(&j, &KernelNames::default()).raised.is_empty());
    }
    let all = d.summary();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].count, 49);
    assert_eq!(all[0].journeys.len(), JOURNEYS_KEPT);
    assert_eq!(all[0].journeys.last(), Some(&49));
}

#[test]
fn counters_and_static_checks() {
    let mut d = Diagnoser::new(Context {
        bridge_nf_call_iptables: Some("0".into()),
        ..ctx()
    });
    assert_eq!(
        d.static_checks(0)[0].kind.as_str(),
        "bridge_nf_call_iptables_off"
    );
    assert!(
        d.counters_moved(&[("clashres", 12)], 1).is_empty(),
        "a resolved clash lost nothing"
    );
    let raised = d.counters_moved(&[("insert_failed", 1), ("clashres", 3)], 2);
    assert_eq!(
        raised.iter().map(|a| a.kind.as_str()).collect::<Vec<_>>(),
        vec!["conntrack_insert_failed"]
    );
    assert_eq!(d.summary()[0].severity, Severity::Critical);
}

#[test]
fn a_cache_forwarding_to_another_resolver_on_loopback_is_no_loop() {
    let mut j = healthy();
    let mut up = upstream("198.51.100.53:53", answered(Rcode::NOERROR), 100_000);
    up.upstream
        .push(upstream("127.0.0.1:53", answered(Rcode::NOERROR), 50_000));
    j.upstream.push(up);
    assert!(kinds(&j).is_empty());
}

#[test]
fn an_upstream_query_dropped_on_the_way_explains_the_client_timeout() {
    let mut j = healthy();
    j.outcome = Outcome::Timeout;
    j.upstream.push(upstream(
        "198.51.100.53:53",
        Outcome::Dropped {
            reason: 3,
            location: 0x10,
        },
        0,
    ));
    assert_eq!(kinds(&j), vec!["upstream_timeout"]);
}

/// A journey for `name` from the web pod, ended at `end_ms`, `ms` long.
fn asked(id: u64, name: &str, rcode: Rcode, end_ms: u64, ms: u64) -> Journey {
    let end = end_ms * 1_000_000;
    Journey {
        id,
        name: name.into(),
        started_ns: end - ms * 1_000_000,
        ended_ns: end,
        outcome: answered(rcode),
        ..healthy()
    }
}

/// The search list's cluster candidates of `orders`, NXDOMAIN, then
/// `orders.corp.example.com.` sent upstream and NXDOMAIN there: what the
/// rules raise of it, on a node whose own search domains are `node_search`.
fn corp_example_candidate(node_search: &[&str]) -> Vec<Anomaly> {
    let mut d = Diagnoser::new(Context {
        node_search: node_search.iter().map(|d| (*d).to_owned()).collect(),
        ..named(ctx())
    });
    let names = KernelNames::default();
    for (i, n) in [
        "orders.default.svc.cluster.local.",
        "orders.svc.cluster.local.",
        "orders.cluster.local.",
    ]
    .iter()
    .enumerate()
    {
        assert!(d
            .journey(
                &asked(i as u64, n, Rcode::NXDOMAIN, 10 + i as u64, 1),
                &names
            )
            .raised
            .is_empty());
    }
    let mut leak = asked(9, "orders.corp.example.com.", Rcode::NXDOMAIN, 20, 1);
    leak.upstream.push(upstream(
        "198.51.100.53:53",
        answered(Rcode::NXDOMAIN),
        100_000,
    ));
    d.journey(&leak, &names).raised
}

#[test]
fn a_foreign_search_domain_after_the_cluster_ones_is_a_leak() {
    let found = corp_example_candidate(&[]);
    assert_eq!(
        found.iter().map(|a| a.kind.as_str()).collect::<Vec<_>>(),
        vec!["search_domain_leak"]
    );
    assert!(found[0].summary.contains("corp.example.com"));
    assert!(
        found[0].evidence[0]
            .starts_with("10.244.0.10 (default/web) asked orders.default.svc.cluster.local., "),
        "{:?}",
        found[0].evidence
    );
    assert!(found[0].evidence[0].contains("orders.cluster.local., then orders.corp.example.com. (sent upstream to 198.51.100.53:53)"), "{:?}", found[0].evidence);
}

/// A name written with the cluster domain but fewer than ndots dots, on a
/// node with two search domains: the suffix is the node's second domain,
/// not the cluster domain and it (the lab's `--node-search` run).
#[test]
fn a_full_cluster_name_searched_is_no_leak_under_the_node_s_domains() {
    let full = "kube-dns.kube-system.svc.cluster.local.";
    let raised = |node_search: &[&str]| {
        let mut d = Diagnoser::new(Context {
            node_search: node_search.iter().map(|d| (*d).to_owned()).collect(),
            ..ctx()
        });
        let names = KernelNames::default();
        // An earlier lookup of the same name, answered as it is.
        d.journey(&asked(0, full, Rcode::NOERROR, 5, 1), &names);
        for (i, suffix) in [
            "shop.svc.cluster.local.",
            "svc.cluster.local.",
            "cluster.local.",
            "ec2.internal.",
        ]
        .iter()
        .enumerate()
        {
            let name = format!("{full}{suffix}");
            d.journey(
                &asked(1 + i as u64, &name, Rcode::NXDOMAIN, 10 + i as u64, 1),
                &names,
            );
        }
        let mut last = asked(9, &format!("{full}corp.example."), Rcode::NXDOMAIN, 20, 1);
        last.upstream.push(upstream(
            "198.51.100.53:53",
            answered(Rcode::NXDOMAIN),
            100_000,
        ));
        d.journey(&last, &names).raised
    };
    assert!(raised(&["ec2.internal", "corp.example"]).is_empty());
    let foreign = raised(&["ec2.internal"]);
    assert_eq!(foreign.len(), 1);
    assert!(
        foreign[0]
            .summary
            .ends_with("foreign search domain corp.example"),
        "{}",
        foreign[0].summary
    );
}

/// Managed clusters' nodes (EKS's ec2.internal, GKE's google.internal)
/// have search domains the kubelet appends to every pod's list by design.
#[test]
fn the_node_s_own_search_domain_is_no_leak() {
    assert!(corp_example_candidate(&["corp.example.com"]).is_empty());
    assert!(corp_example_candidate(&["other.example", "corp.example.com."]).is_empty());
    assert_eq!(corp_example_candidate(&["example.com"]).len(), 1);
}

#[test]
fn the_absolute_name_after_the_search_list_is_no_leak() {
    let mut d = Diagnoser::new(ctx());
    let names = KernelNames::default();
    for (i, n) in [
        "www.example.com.default.svc.cluster.local.",
        "www.example.com.svc.cluster.local.",
        "www.example.com.cluster.local.",
    ]
    .iter()
    .enumerate()
    {
        d.journey(
            &asked(i as u64, n, Rcode::NXDOMAIN, 10 + i as u64, 1),
            &names,
        );
    }
    assert!(d
        .journey(&asked(9, "www.example.com.", Rcode::NOERROR, 20, 1), &names)
        .raised
        .is_empty());
}

/// www.example.com's search-list candidates with ndots:5, in order.
const WWW_MISSES: [&str; 3] = [
    "www.example.com.default.svc.cluster.local.",
    "www.example.com.svc.cluster.local.",
    "www.example.com.cluster.local.",
];

/// A lookup of www.example.com that starts at `start_ms` with its
/// search-list misses, one after the other, each asked as `qtypes` at once
/// and answered in `ms`: the ndots_amplification summaries it raised.
fn www_lookup(
    d: &mut Diagnoser,
    id: &mut u64,
    start_ms: u64,
    ms: u64,
    qtypes: &[Qtype],
    incomplete: bool,
) -> Vec<String> {
    let names = KernelNames::default();
    for (i, n) in WWW_MISSES.iter().enumerate() {
        for &qtype in qtypes {
            *id += 1;
            let mut miss = Journey {
                qtype,
                ..asked(*id, n, Rcode::NXDOMAIN, start_ms + ms * (i as u64 + 1), ms)
            };
            miss.incomplete = incomplete.then_some(Gap::Lost);
            d.journey(&miss, &names);
        }
    }
    *id += 1;
    let end = start_ms + 3 * ms + 1;
    let answer = asked(*id, "www.example.com.", Rcode::NOERROR, end, 1);
    d.journey(&answer, &names)
        .raised
        .into_iter()
        .filter(|a| a.kind.as_str() == "ndots_amplification")
        .map(|a| a.summary)
        .collect()
}

/// Lookups at these times (ms): three, ten seconds apart from first to last.
const HABIT_MS: [u64; 3] = [0, 5_000, 10_000];

#[test]
fn costly_search_list_misses_lookup_after_lookup_are_amplification() {
    // Misses that lost events have times that are no evidence.
    for (ms, incomplete, expect) in [(1, false, 0), (60, false, 1), (60, true, 0)] {
        let (mut d, mut id) = (Diagnoser::new(ctx()), 0);
        let raised: Vec<usize> = HABIT_MS
            .iter()
            .map(|&at| www_lookup(&mut d, &mut id, at, ms, &[Qtype::A], incomplete).len())
            .collect();
        // The third lookup makes the habit.
        assert_eq!(
            raised,
            [0, 0, expect],
            "{ms} ms per miss, incomplete {incomplete}"
        );
    }
}

/// A restarted CoreDNS or a stalled machine makes a burst of lookups pay
/// once; a few slow lookups among many quick ones are no habit either.
#[test]
fn a_burst_or_a_few_costly_lookups_are_no_amplification() {
    let (mut d, mut id) = (Diagnoser::new(ctx()), 0);
    for at in [0, 300, 600, 900, 1_200] {
        assert!(www_lookup(&mut d, &mut id, at, 60, &[Qtype::A], false).is_empty());
    }
    let (mut d, mut id) = (Diagnoser::new(ctx()), 0);
    for at in (0..=10_000).step_by(500) {
        let ms = if HABIT_MS.contains(&at) { 60 } else { 1 };
        assert!(www_lookup(&mut d, &mut id, at, ms, &[Qtype::A], false).is_empty());
    }
}

/// glibc asks A and AAAA of each candidate together: a pair costs the
/// client its longer query, and an earlier lookup's misses are not this
/// one's.
#[test]
fn parallel_misses_cost_their_wall_time_not_their_sum() {
    // Pairs of 20 ms (120 ms summed, 60 ms waited), then of 40 ms.
    for (ms, expect) in [(20, None), (40, Some("6 NXDOMAINs (120 ms)"))] {
        let (mut d, mut id) = (Diagnoser::new(ctx()), 0);
        let pair = [Qtype::A, Qtype::AAAA];
        let summaries: Vec<String> = HABIT_MS
            .iter()
            .flat_map(|&at| www_lookup(&mut d, &mut id, at, ms, &pair, false))
            .collect();
        assert_eq!(
            summaries.len(),
            usize::from(expect.is_some()),
            "{ms} ms per pair: {summaries:?}"
        );
        if let Some(e) = expect {
            assert!(summaries[0].contains(e), "{}", summaries[0]);
        }
    }
}

#[test]
fn br_netfilter_missing_matters_only_on_a_kubernetes_node() {
    let mut d = Diagnoser::new(Context {
        bridge_nf_call_iptables: None,
        ..ctx()
    });
    assert_eq!(
        d.static_checks(0)[0].kind.as_str(),
        "br_netfilter_not_loaded"
    );
    let mut plain_host = Diagnoser::new(Context {
        bridge_nf_call_iptables: None,
        service_ips: BTreeSet::new(),
        ..ctx()
    });
    assert!(plain_host.static_checks(0).is_empty());
}

/// The healthy client 10.244.0.10 and the resolver 10.244.0.53, their
/// host veths each on `client` and `resolver` (None: a bridge port).
fn pods_on(client: Option<&str>, resolver: Option<&str>) -> Context {
    let at = |bridge: Option<&str>| match bridge {
        Some(b) => Attachment::Bridge(b.into()),
        None => Attachment::Routed,
    };
    Context {
        attachments: [
            ("10.244.0.10".parse().unwrap(), at(client)),
            ("10.244.0.53".parse().unwrap(), at(resolver)),
        ]
        .into(),
        resolvers: ["10.244.0.53".parse().unwrap()].into(),
        ..ctx()
    }
}

fn static_kinds(c: Context) -> Vec<&'static str> {
    kinds_of(&Diagnoser::new(c).static_checks(0))
}

#[test]
fn bridge_findings_need_a_client_and_a_resolver_on_one_bridge() {
    let unloaded = |c: Context| Context {
        bridge_nf_call_iptables: None,
        ..c
    };
    let off = |c: Context| Context {
        bridge_nf_call_iptables: Some("0".into()),
        ..c
    };
    let cni0 = || pods_on(Some("cni0"), Some("cni0"));
    assert_eq!(static_kinds(unloaded(cni0())), ["br_netfilter_not_loaded"]);
    assert_eq!(static_kinds(off(cni0())), ["bridge_nf_call_iptables_off"]);
    let found = Diagnoser::new(off(cni0())).static_checks(0);
    assert!(
        found[0].evidence[1]
            .contains("10.244.0.10 and of the resolver 10.244.0.53 are ports of bridge cni0"),
        "{:?}",
        found[0].evidence
    );
    // Routed pods (Calico, Cilium, ptp), or two bridges: replies pass
    // conntrack either way.
    for c in [pods_on(None, None), pods_on(Some("cni0"), Some("cni1"))] {
        assert!(static_kinds(unloaded(c.clone())).is_empty(), "{c:?}");
        assert!(static_kinds(off(c.clone())).is_empty(), "{c:?}");
    }
}

/// An answer that reached the client from the resolver's own address.
fn unnated_answer() -> Journey {
    let mut j = healthy();
    j.legs[3].src = a("10.244.0.53:53");
    j
}

#[test]
fn an_unnated_answer_between_routed_pods_does_not_blame_br_netfilter() {
    let raised = |c: Context| {
        Diagnoser::new(c)
            .journey(&unnated_answer(), &KernelNames::default())
            .raised
    };
    let routed = raised(pods_on(None, None));
    assert_eq!(kinds_of(&routed), ["reply_from_unexpected_source"]);
    assert!(
        !routed[0].cause.contains("br_netfilter not loaded") && !routed[0].fix.contains("modprobe"),
        "{:?}",
        routed[0]
    );
    assert!(
        routed[0].cause.contains("share no bridge"),
        "{}",
        routed[0].cause
    );
    let bridged = raised(pods_on(Some("cni0"), Some("cni0")));
    assert!(bridged[0].cause.contains("br_netfilter not loaded"));
    assert!(bridged[0]
        .evidence
        .iter()
        .any(|e| e.contains("ports of bridge cni0")));
}

/// The answered AAAA of a parallel A/AAAA pair from the healthy client.
fn answered_aaaa() -> Journey {
    Journey {
        id: 1,
        qtype: Qtype::AAAA,
        started_ns: 100_000,
        ended_ns: 400_000,
        ..healthy()
    }
}

#[test]
fn a_lost_half_of_a_parallel_pair_is_the_conntrack_race() {
    let names = KernelNames::default();
    let mut d = Diagnoser::new(named(ctx()));
    assert!(d.journey(&answered_aaaa(), &names).raised.is_empty());
    let retry = Journey {
        id: 3,
        started_ns: 5_000_000_000,
        ended_ns: 5_000_300_000,
        client: a("10.244.0.10:4001"),
        ..healthy()
    };
    assert!(d.journey(&retry, &names).raised.is_empty());
    let mut lost = Journey {
        id: 2,
        started_ns: 0,
        ended_ns: 10_000,
        ..healthy()
    };
    lost.legs.truncate(1);
    lost.outcome = Outcome::Timeout;
    let found = d.journey(&lost, &names).raised;
    assert_eq!(
        found.iter().map(|a| a.kind.as_str()).collect::<Vec<_>>(),
        vec!["parallel_query_lost"],
        "not also unanswered"
    );
    assert!(
        found[0].evidence[0].contains("left 10.244.0.10:4000 (default/web) 0.")
            && found[0].evidence[0].contains("the AAAA was answered, the A was not"),
        "{:?}",
        found[0].evidence
    );
    assert!(
        found[0].evidence[1].contains("asked again 5.0 s later"),
        "{:?}",
        found[0].evidence
    );
}

/// A query from `client` dropped at `server`'s socket for `reason` (a
/// kernel number named by `drop_names`).
fn dropped_at(client: &str, server: &str, reason: u32) -> Journey {
    let mut j = healthy();
    j.client = a(client);
    j.legs.truncate(1);
    j.legs
        .push(leg(40_000, "kfree_skb", DNS_NS, 2, client, server, false));
    j.outcome = Outcome::Dropped {
        reason,
        location: 0x10,
    };
    j
}

fn drop_names() -> KernelNames {
    KernelNames::new(
        [
            (3, "SKB_DROP_REASON_NETFILTER_DROP".to_owned()),
            (7, "SKB_DROP_REASON_SOCKET_RCVBUFF".to_owned()),
        ]
        .into(),
        "0000000000000008 t udp_queue_rcv_one_skb\n".as_bytes(),
    )
}

#[test]
fn a_lost_half_dropped_for_a_full_socket_is_not_the_conntrack_race() {
    let names = drop_names();
    let mut d = Diagnoser::new(ctx());
    assert!(d.journey(&answered_aaaa(), &names).raised.is_empty());
    let full = dropped_at("10.244.0.10:4000", "10.244.0.54:53", 7);
    let found = d.journey(&full, &names).raised;
    assert_eq!(
        found.iter().map(|a| a.kind.as_str()).collect::<Vec<_>>(),
        vec!["dropped"]
    );
    assert!(
        found[0]
            .cause
            .contains("10.244.0.54:53 was not read as fast as queries arrived")
            && found[0].fix.contains("UdpRcvbufErrors"),
        "{found:?}"
    );
    // Dropped by a netfilter verdict, as the race's loser is, it is the race.
    let raced = Journey {
        id: 3,
        ..dropped_at("10.244.0.10:4000", "10.244.0.54:53", 3)
    };
    let found = d.journey(&raced, &names).raised;
    assert_eq!(
        found.iter().map(|a| a.kind.as_str()).collect::<Vec<_>>(),
        vec!["parallel_query_lost"]
    );
    assert!(found[0].evidence[1].contains("NETFILTER_DROP"), "{found:?}");
}

#[test]
fn a_full_socket_at_each_server_is_its_own_anomaly() {
    let names = drop_names();
    let mut d = Diagnoser::new(ctx());
    for (i, server) in ["10.244.0.54:53", "10.244.0.55:53", "10.244.0.54:53"]
        .into_iter()
        .enumerate()
    {
        let j = Journey {
            id: i as u64,
            qtype: Qtype::TXT,
            ..dropped_at("10.244.0.10:4000", server, 7)
        };
        d.journey(&j, &names);
    }
    let summary = d.summary();
    let counts: Vec<(u64, bool)> = summary
        .iter()
        .map(|a| (a.count, a.cause.contains("10.244.0.55:53")))
        .collect();
    assert_eq!(counts, [(2, false), (1, true)], "{summary:?}");
}

#[test]
fn absence_proves_nothing_on_a_journey_that_lost_events() {
    let mut untranslated = healthy();
    untranslated.dnat = None;
    untranslated.legs.truncate(1);
    untranslated.outcome = Outcome::Timeout;
    let mut looped = healthy();
    looped.outcome = Outcome::Timeout;
    looped
        .upstream
        .push(upstream("127.0.0.53:53", Outcome::Timeout, 0));
    for gap in [Gap::Lost, Gap::Ended] {
        for mut j in [untranslated.clone(), looped.clone()] {
            assert!(!kinds(&j).is_empty());
            // Every journey open at the time is marked, upstream ones too.
            j.incomplete = Some(gap);
            j.upstream.iter_mut().for_each(|u| u.incomplete = Some(gap));
            assert!(kinds(&j).is_empty(), "{gap:?}: {:?}", kinds(&j));
        }
    }
}

fn truncated_answer() -> Journey {
    Journey {
        name: "big.example.com.".into(),
        qtype: Qtype::TXT,
        outcome: Outcome::Answered {
            rcode: Rcode::NOERROR,
            answers: vec![],
            truncated: true,
            malformed: None,
        },
        ..healthy()
    }
}

#[test]
fn a_truncated_answer_needs_its_tcp_retry() {
    let names = KernelNames::default();
    let no_retry = |_: IpAddr, _: &str, _: Qtype, _: u64| false;
    let mut d = Diagnoser::new(ctx());
    assert!(d.journey(&truncated_answer(), &names).raised.is_empty());
    assert!(
        d.tick(900_000_000, no_retry).raised.is_empty(),
        "too early to say"
    );
    let raised = d.tick(1_300_000_000, no_retry).raised;
    assert_eq!(raised[0].kind.as_str(), "truncated_without_tcp_retry");
    assert!(
        raised[0].summary.contains("10.96.0.10:53"),
        "{}",
        raised[0].summary
    );
    assert_eq!(raised[0].journeys, vec![1]);

    // The retry came and was answered, or is still on its way.
    let mut d = Diagnoser::new(ctx());
    d.journey(&truncated_answer(), &names);
    let tcp = Journey {
        id: 2,
        tcp: true,
        client: a("10.244.0.10:4100"),
        ..truncated_answer()
    };
    d.journey(&tcp, &names);
    assert!(d.tick(2_000_000_000, no_retry).raised.is_empty());
    let mut d = Diagnoser::new(ctx());
    d.journey(&truncated_answer(), &names);
    let asking = |ip: IpAddr, name: &str, qtype: Qtype, since: u64| {
        ip.to_string() == "10.244.0.10"
            && name == "big.example.com."
            && qtype == Qtype::TXT
            && since == 300_000
    };
    assert!(d.tick(2_000_000_000, asking).raised.is_empty());

    // Events were lost after the answer: the retry may be among them.
    let mut d = Diagnoser::new(ctx());
    d.journey(&truncated_answer(), &names);
    d.lost(800_000_000);
    assert!(d.tick(2_000_000_000, no_retry).raised.is_empty());
}

#[test]
fn a_tcp_connection_never_set_up_is_raised_with_the_truncated_answer_behind_it() {
    let names = KernelNames::default();
    let mut d = Diagnoser::new(ctx());
    d.journey(&truncated_answer(), &names);
    let failed = |syns, reset| Connection {
        client: a("10.244.0.10:4200"),
        server: a("10.96.0.10:53"),
        syn_ns: 400_000,
        syns,
        syn_ack_ns: None,
        reset,
        fin_ns: None,
        retransmits: 0,
        dropped: None,
    };
    let checked = d.connections_failed(&[failed(3, None)], &names, 6_000_000_000);
    assert_eq!(checked.hits.len(), 1, "a hit of journey 1, already out");
    let raised = checked.raised;
    assert_eq!(raised.len(), 1);
    let r = &raised[0];
    assert_eq!(
        (r.kind.as_str(), r.severity),
        ("dns_tcp_unreachable", Severity::Critical)
    );
    assert!(r.summary.contains("10.96.0.10:53"), "{}", r.summary);
    assert!(
        r.evidence[0].contains("3 SYNs and no SYN-ACK"),
        "{:?}",
        r.evidence
    );
    assert!(
        r.evidence[1].contains("truncated UDP answer for big.example.com. TXT (journey 1"),
        "{:?}",
        r.evidence
    );
    assert_eq!(r.journeys, vec![1]);
    let reset = Some(Reset {
        ts_ns: 500_000,
        to_client: true,
    });
    let again = d.connections_failed(&[failed(1, reset)], &names, 7_000_000_000);
    assert!(again.raised.is_empty(), "one anomaly per server, counted");
    assert_eq!(again.hits.len(), 1, "each failure a hit, for the metrics");
    assert_eq!(d.summary()[0].count, 2);
    let reset = Diagnoser::new(ctx())
        .connections_failed(&[failed(1, reset)], &names, 1)
        .raised;
    assert!(reset[0].evidence[0].contains("reset towards the client 0.1 ms after its SYN"));
    assert_eq!(reset[0].evidence.len(), 1, "no UDP answer led there");
    // Events lost since the SYN: its SYN-ACK may be among them.
    let mut d = Diagnoser::new(ctx());
    d.lost(450_000);
    assert!(d
        .connections_failed(&[failed(1, None)], &names, 6_000_000_000)
        .raised
        .is_empty());
}

#[test]
fn an_answer_missing_a_fragment_is_a_fragment_lost_with_the_fragment_and_its_place() {
    let names = KernelNames::default();
    let mut j = truncated_answer();
    j.outcome = Outcome::Timeout;
    // The answer reached the client without its second fragment, which
    // was last seen leaving the node's bridge.
    let last = j.legs.last_mut().unwrap();
    last.fragment = Some(Box::new(FragmentNote {
        offset: 1480,
        missing: true,
        last_seen: Some(Seen {
            ts_ns: 1,
            netns: NODE_NS,
            ifindex: 3,
            ifname: Some("cni0".into()),
            hook: Hook::DevXmit,
        }),
    }));
    let found = Diagnoser::new(ctx()).journey(&j, &names).raised;
    let kinds: Vec<&str> = found.iter().map(|a| a.kind.as_str()).collect();
    assert_eq!(kinds, ["fragment_lost"], "it explains the timeout");
    let evidence = &found[0].evidence[0];
    assert!(
        evidence.contains("without its fragment at offset 1480, last seen on cni0@200 (dev_xmit)"),
        "{evidence}"
    );
    // Events lost while it was open: the fragment may be among them.
    let mut lost = j.clone();
    lost.incomplete = Some(Gap::Lost);
    assert!(Diagnoser::new(ctx())
        .journey(&lost, &names)
        .raised
        .iter()
        .all(|a| a.kind.as_str() != "fragment_lost"));
    // A whole answer with a fragment note elsewhere is no loss.
    let mut ok = j.clone();
    ok.outcome = answered(Rcode::NOERROR);
    assert!(Diagnoser::new(ctx()).journey(&ok, &names).raised.is_empty());
}

#[test]
fn conntrack_trouble_before_the_start_is_a_static_finding() {
    let at_start = |dropped: u64, entries: u64| ConntrackAtStart {
        dropped: vec![("insert_failed", dropped), ("drop", 0)],
        entries,
        max: Some(1000),
    };
    let static_kinds = |ct| {
        let mut d = Diagnoser::new(Context {
            conntrack: Some(ct),
            ..ctx()
        });
        d.static_checks(0)
            .iter()
            .map(|a| a.kind.as_str())
            .collect::<Vec<_>>()
    };
    assert!(static_kinds(at_start(0, 10)).is_empty());
    assert_eq!(
        static_kinds(at_start(7, 950)),
        vec![
            "conntrack_drops_before_start",
            "conntrack_table_nearly_full"
        ]
    );
}

#[test]
fn retries_of_an_unanswered_lookup_are_counted_as_one_lookup() {
    let names = KernelNames::default();
    let mut d = Diagnoser::new(ctx());
    let attempt = |id: u64, port: u16, start_s: u64| {
        let mut j = Journey {
            id,
            client: SocketAddr::new("10.244.0.10".parse().unwrap(), port),
            started_ns: start_s * 1_000_000_000,
            ended_ns: start_s * 1_000_000_000 + 5_500_000_000,
            ..healthy()
        };
        j.legs.truncate(2);
        j.outcome = Outcome::Timeout;
        j
    };
    assert_eq!(
        d.journey(&attempt(1, 4000, 0), &names).raised[0]
            .kind
            .as_str(),
        "unanswered"
    );
    d.journey(&attempt(2, 4001, 5), &names);
    let all = d.summary();
    assert_eq!(
        (all.len(), all[0].count),
        (1, 2),
        "one anomaly, two attempts"
    );
    let mut d2 = Diagnoser::new(ctx());
    d2.journey(&attempt(1, 4000, 0), &names);
    d2.journey(&attempt(2, 4001, 5), &names);
    let third = attempt(3, 4001, 10);
    // The rule in full, as when its anomaly is not raised yet: once it is,
    // a repeat carries no evidence (see the next test).
    let recent = d2.recent.of(&third);
    let cx = ctx();
    let found = unanswered(&third, &recent, &cx).unwrap();
    let found = &Raised::default().record(vec![found], 0, None).raised[0];
    assert!(
        found.evidence[1].contains("attempt 3 of this lookup without an answer, 10.0 s after the first (from 2 source ports)"),
        "{:?}",
        found.evidence
    );
}

/// A journey's badges: every anomaly it fed, the first one or a repeat.
#[test]
fn a_journey_returns_the_anomalies_it_fed() {
    let names = KernelNames::default();
    let mut d = Diagnoser::new(ctx());
    let mut timeout = healthy();
    timeout.legs.truncate(2);
    timeout.outcome = Outcome::Timeout;
    let first = d.journey(&timeout, &names);
    let again = d.journey(&Journey { id: 2, ..timeout }, &names);
    assert!(again.raised.is_empty());
    let summary = first.raised[0].summary.clone();
    assert_eq!(first.hits, [(AnomalyKind::Unanswered, summary.clone())]);
    assert_eq!(again.hits, [(AnomalyKind::Unanswered, summary)]);
}

/// A storm repeats one anomaly thousands of times a second: once raised,
/// its repeats are counted and linked, and their evidence is not written.
#[test]
fn repeats_of_a_raised_anomaly_are_counted_without_evidence() {
    let names = KernelNames::default();
    let mut d = Diagnoser::new(ctx());
    let timeout = |id: u64, port: u16| {
        let mut j = Journey {
            id,
            client: SocketAddr::new("10.244.0.10".parse().unwrap(), port),
            ..healthy()
        };
        j.legs.truncate(2);
        j.outcome = Outcome::Timeout;
        j
    };
    let first = d.journey(&timeout(1, 4000), &names).raised;
    assert_eq!(first.len(), 1);
    assert!(!first[0].evidence.is_empty());
    let again = timeout(2, 4001);
    let key = {
        let recent = d.recent.of(&again);
        let known = Known {
            ctx: &d.ctx,
            upstream: &d.upstream,
            paths: &d.paths,
            recent: &recent,
            names: &names,
            local: &d.local,
            ct: &d.ct,
            miss_costs: &d.miss_costs,
            miss_cost: None,
        };
        let found = rules::findings(&again, &known);
        assert_eq!(found[0].kind.as_str(), "unanswered");
        found[0].key.clone()
    };
    assert!(d.journey(&again, &names).raised.is_empty(), "raised once");
    let all = d.summary();
    assert_eq!(
        (all.len(), all[0].count, all[0].journeys.clone()),
        (1, 2, vec![1, 2])
    );
    assert_eq!(
        all[0].evidence, first[0].evidence,
        "the first one's evidence stays"
    );
    let repeat = Finding::new(AnomalyKind::Unanswered, key, || {
        unreachable!("a repeat's evidence is written")
    });
    assert!(d.raised.record(vec![repeat], 0, None).raised.is_empty());
}

#[test]
fn coredns_loop_probes_are_recognised_by_their_shape() {
    assert!(is_loop_probe(
        "8471638447265532841.4526581924823745234.",
        Qtype::HINFO
    ));
    assert!(is_loop_probe("1.2.cluster.local.", Qtype::HINFO));
    assert!(!is_loop_probe(
        "8471638447265532841.4526581924823745234.",
        Qtype::A
    ));
    assert!(!is_loop_probe("host.example.com.", Qtype::HINFO));
    let mut j = healthy();
    j.name = "8471638447265532841.4526581924823745234.".into();
    j.qtype = Qtype::HINFO;
    j.outcome = Outcome::Timeout;
    let mut up = upstream("127.0.0.53:53", Outcome::Timeout, 0);
    up.name = j.name.clone();
    up.qtype = Qtype::HINFO;
    j.upstream.push(up);
    let raised = Diagnoser::new(ctx())
        .journey(&j, &KernelNames::default())
        .raised;
    assert_eq!(raised[0].kind.as_str(), "forwarding_loop");
    assert!(raised[0]
        .evidence
        .iter()
        .any(|e| e.contains("loop-plugin probe")));
}

#[test]
fn the_target_pods_resolv_conf_is_checked_at_start() {
    let target = |text: &str| crate::target::Target {
        label: "pod default/web".into(),
        netns_inode: 7,
        addrs: vec![],
        host_veth: None,
        resolv: Some(crate::pods::resolv::parse(text)),
        namespace: Some("default".into()),
    };
    let static_kinds = |text: &str| {
        let mut d = Diagnoser::new(Context {
            target: Some(target(text)),
            ..ctx()
        });
        d.static_checks(0)
            .iter()
            .map(|a| a.kind.as_str())
            .collect::<Vec<_>>()
    };
    let healthy = "nameserver 10.96.0.10\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n";
    assert!(static_kinds(healthy).is_empty());
    assert_eq!(
        static_kinds("nameserver 127.0.0.53\n"),
        vec!["loopback_nameserver"]
    );
    let leak = "nameserver 10.96.0.10\nsearch default.svc.cluster.local svc.cluster.local cluster.local corp.example.com\noptions ndots:5\n";
    let mut d = Diagnoser::new(Context {
        target: Some(target(leak)),
        ..ctx()
    });
    let raised = d.static_checks(0);
    assert_eq!(raised[0].kind.as_str(), "foreign_search_domain");
    assert!(
        raised[0].summary.ends_with("corp.example.com"),
        "{}",
        raised[0].summary
    );
    assert!(raised[0].evidence[0].contains("ndots:5"));
    // The node's own domain, as EKS's ec2.internal: appended by design.
    let mut d = Diagnoser::new(Context {
        target: Some(target(leak)),
        node_search: vec!["corp.example.com".into()],
        ..ctx()
    });
    assert!(d.static_checks(0).is_empty());
}

/// `--pod web` re-created with dnsPolicy Default on a node whose resolver
/// is systemd-resolved's stub: its new resolv.conf is judged when it is
/// followed there; a sandbox whose file could not be read keeps the last.
#[test]
fn a_target_re_created_is_judged_by_its_new_resolv_conf() {
    let healthy = "nameserver 10.96.0.10\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n";
    let mut d = Diagnoser::new(Context {
        target: Some(crate::target::Target {
            label: "pod default/web".into(),
            netns_inode: 7,
            addrs: vec![],
            host_veth: None,
            resolv: Some(crate::pods::resolv::parse(healthy)),
            namespace: Some("default".into()),
        }),
        ..ctx()
    });
    assert!(d.static_checks(0).is_empty());
    let to = |resolv: Option<&str>| Retarget {
        netns_inode: 8,
        addrs: vec!["10.244.0.12".parse().unwrap()],
        resolv: resolv.map(crate::pods::resolv::parse),
    };
    assert!(d.retarget(to(None), 1).is_empty());
    let raised = d.retarget(to(Some("nameserver 127.0.0.53\n")), 2);
    assert_eq!(raised.len(), 1);
    assert_eq!(raised[0].kind.as_str(), "loopback_nameserver");
    let t = d.ctx.target.as_ref().unwrap();
    assert_eq!((t.netns_inode, t.addrs.len()), (8, 1));
}

// Issue 33: false alarms and wrong causes on real clusters.

/// Kernel names for the drops these tests make: 3 NETFILTER_DROP, 5
/// NO_SOCKET.
fn more_drop_names() -> KernelNames {
    KernelNames::new(
        [
            (3, "SKB_DROP_REASON_NETFILTER_DROP".to_owned()),
            (5, "SKB_DROP_REASON_NO_SOCKET".to_owned()),
        ]
        .into(),
        "0000000000000008 t udp_queue_rcv_one_skb\n".as_bytes(),
    )
}

fn kinds_of(found: &[Anomaly]) -> Vec<&'static str> {
    found.iter().map(|a| a.kind.as_str()).collect()
}

/// A leg on the CoreDNS pod's loopback at `ts`: the query from port 4000
/// to its own port 53, or the answer back.
fn on_lo(ts: u64, hook: &'static str, response: bool) -> Leg {
    let (query, answer) = ("127.0.0.1:4000", "127.0.0.1:53");
    let (src, dst) = if response {
        (answer, query)
    } else {
        (query, answer)
    };
    leg(ts, hook, DNS_NS, 1, src, dst, response)
}

#[test]
fn coredns_answering_its_own_loop_probe_is_no_loopback_nameserver() {
    let probe = |outcome: Outcome| {
        let mut j = healthy();
        j.name = "4113301637412838290.6170474838446418181.cluster.local.".into();
        j.qtype = Qtype::HINFO;
        j.dnat = None;
        j.legs = vec![
            on_lo(0, "dev_xmit", false),
            on_lo(10, "dev_receive", false),
            on_lo(90, "dev_xmit", true),
            on_lo(99, "dev_receive", true),
        ];
        j.outcome = outcome;
        j
    };
    assert!(
        kinds(&probe(answered(Rcode::NXDOMAIN))).is_empty(),
        "the loop plugin's start-up probe, answered: a healthy CoreDNS"
    );
    let mut lost = probe(Outcome::Timeout);
    lost.legs.truncate(1);
    assert_eq!(kinds(&lost), vec!["loopback_nameserver"]);
}

/// What `j` raises, seen three times a second apart (ids 1 to 3): slow
/// answers are a finding only as a pattern.
fn thrice(j: &Journey) -> Vec<Anomaly> {
    let mut d = Diagnoser::new(ctx());
    (0..3u64)
        .flat_map(|i| {
            d.journey(&shifted(j, i, i * 1_000_000_000), &KernelNames::default())
                .raised
        })
        .collect()
}

/// `j` as journey `i + 1`, `by_ns` later.
fn shifted(j: &Journey, i: u64, by_ns: u64) -> Journey {
    let mut j = j.clone();
    j.id = i + 1;
    j.started_ns += by_ns;
    j.ended_ns += by_ns;
    for l in &mut j.legs {
        l.ts_ns += by_ns;
    }
    j
}

#[test]
fn one_slow_answer_is_no_pattern_and_three_within_a_minute_are() {
    let slow = answered_after(healthy(), 372);
    let quick = answered_after(healthy(), 2);
    let mut d = Diagnoser::new(ctx());
    let names = KernelNames::default();
    assert!(d.journey(&shifted(&slow, 0, 0), &names).raised.is_empty());
    for i in 1..20 {
        let at = i * 100_000_000;
        assert!(d.journey(&shifted(&quick, i, at), &names).raised.is_empty());
    }
    // Past the minute the first one no longer counts.
    let later = 61_000_000_000;
    assert!(d
        .journey(&shifted(&slow, 20, later), &names)
        .raised
        .is_empty());
    let worse = answered_after(healthy(), 1312);
    assert!(d
        .journey(&shifted(&worse, 21, later + 1), &names)
        .raised
        .is_empty());
    let raised = d.journey(&shifted(&slow, 22, later + 2), &names).raised;
    assert_eq!(kinds_of(&raised), vec!["slow_answers"]);
    let a = &raised[0];
    assert_eq!(
        a.summary,
        "slow answers: typically 372 ms, worst 1312 ms, most of it in the resolver itself"
    );
    assert_eq!(
        a.evidence[1],
        "3 answers from the server 10.244.0.53 took over 200 ms within 60 s"
    );
    assert_eq!((a.count, a.journeys.clone()), (3, vec![21, 22, 23]));
    let all = d.summary();
    assert_eq!(all[0].count, 3, "the pattern's answers, no more");
}

/// The answer legs of `healthy` moved to `ms` after the query.
fn answered_after(mut j: Journey, ms: u64) -> Journey {
    let at = ms * 1_000_000;
    j.legs[2].ts_ns = at;
    j.legs[3].ts_ns = at + 100_000;
    j.ended_ns = at + 100_000;
    j
}

#[test]
fn a_slow_answer_from_a_resolver_on_another_node_is_not_blamed_on_it() {
    let mut j = answered_after(healthy(), 800);
    // The query leaves the node (eth0, towards the other node) and the
    // answer comes back there: the resolver's own time is out of sight.
    j.legs[1] = leg(
        50_000,
        "dev_xmit",
        NODE_NS,
        9,
        "10.244.0.10:4000",
        "10.244.1.53:53",
        false,
    );
    j.legs[2] = leg(
        800_000_000,
        "dev_receive",
        NODE_NS,
        9,
        "10.244.1.53:53",
        "10.244.0.10:4000",
        true,
    );
    let found = thrice(&j);
    assert_eq!(kinds_of(&found), vec!["slow_answers"]);
    let a = &found[0];
    assert!(
        a.summary
            .contains("the resolver's node, out of sight from here"),
        "{}",
        a.summary
    );
    assert!(
        a.evidence[0].contains("the resolver is on another node: its own time and its upstream queries are not visible from here"),
        "{:?}",
        a.evidence
    );
    assert!(!a.cause.contains("the resolver is slow"), "{}", a.cause);
}

#[test]
fn a_servfail_from_a_resolver_on_another_node_does_not_blame_it_alone() {
    let mut j = healthy();
    j.outcome = answered(Rcode::SERVFAIL);
    // The query leaves the node towards the resolver's node.
    j.legs[1] = leg(
        50_000,
        "dev_xmit",
        NODE_NS,
        9,
        "10.244.0.10:4000",
        "10.244.1.53:53",
        false,
    );
    let found = Diagnoser::new(ctx())
        .journey(&j, &KernelNames::default())
        .raised;
    assert_eq!(kinds_of(&found), vec!["failing_answers"]);
    assert!(
        found[0].cause.contains("out of sight from this node"),
        "{}",
        found[0].cause
    );
    assert!(found[0].evidence[1].contains("the resolver is on another node"));
}

#[test]
fn an_unanswered_upstream_try_counts_until_the_next_try() {
    let mut j = answered_after(healthy(), 850);
    // CoreDNS's first try gets nothing; it tries the next upstream at 500 ms.
    j.upstream
        .push(upstream("198.51.100.53:53", Outcome::Timeout, 0));
    let mut second = upstream("198.51.100.54:53", answered(Rcode::NOERROR), 20_000_000);
    second.started_ns = 500_000_000;
    second.ended_ns = 520_000_000;
    j.upstream.push(second);
    let found = thrice(&j);
    let slow = found
        .iter()
        .find(|a| a.kind.as_str() == "slow_answers")
        .expect("slow");
    assert!(
        slow.summary.contains("most of it in upstream"),
        "{}: {:?}",
        slow.summary,
        slow.evidence
    );
    assert!(
        slow.evidence[0].contains("519.9 ms upstream"),
        "{:?}",
        slow.evidence
    );
}

/// An A query from the healthy client, lost with `outcome`.
fn lost_a(outcome: Outcome) -> Journey {
    let mut lost = Journey {
        id: 2,
        started_ns: 0,
        ended_ns: 10_000,
        ..healthy()
    };
    lost.legs.truncate(1);
    lost.outcome = outcome;
    lost
}

#[test]
fn a_silent_loss_is_no_conntrack_race_where_drops_are_traced() {
    let names = more_drop_names();
    let traced = Context {
        drops_visible: true,
        ..ctx()
    };
    let mut d = Diagnoser::new(traced.clone());
    d.journey(&answered_aaaa(), &names);
    let found = d.journey(&lost_a(Outcome::Timeout), &names).raised;
    assert_eq!(
        kinds_of(&found),
        vec!["unanswered"],
        "the race's loser would show as a NETFILTER_DROP leg"
    );
    // A NETFILTER_DROP leg is the race's mark.
    let mut d = Diagnoser::new(traced);
    d.journey(&answered_aaaa(), &names);
    let raced = dropped_at("10.244.0.10:4000", "10.244.0.54:53", 3);
    let found = d.journey(&Journey { id: 2, ..raced }, &names).raised;
    assert_eq!(kinds_of(&found), vec!["parallel_query_lost"]);
}

#[test]
fn a_lost_half_whose_upstream_failed_is_the_upstreams_timeout() {
    let names = KernelNames::default();
    let mut d = Diagnoser::new(ctx());
    d.journey(&answered_aaaa(), &names);
    let mut lost = lost_a(Outcome::Timeout);
    lost.legs = healthy().legs[..2].to_vec();
    lost.upstream
        .push(upstream("198.51.100.53:53", Outcome::Timeout, 0));
    let found = d.journey(&lost, &names).raised;
    assert_eq!(
        kinds_of(&found),
        vec!["upstream_timeout"],
        "it reached the resolver, which forwarded it: no race lost it"
    );
}

#[test]
fn an_unanswered_a_or_aaaa_that_never_reached_a_resolver_awaits_its_sibling() {
    let d = Diagnoser::new(ctx());
    assert_eq!(d.awaits(&lost_a(Outcome::Timeout)), Some(Qtype::AAAA));
    assert_eq!(
        d.awaits(&Journey {
            qtype: Qtype::AAAA,
            ..lost_a(Outcome::Timeout)
        }),
        Some(Qtype::A)
    );
    assert_eq!(d.awaits(&healthy()), None, "answered");
    let mut txt = lost_a(Outcome::Timeout);
    txt.qtype = Qtype::TXT;
    assert_eq!(d.awaits(&txt), None, "no pair");
}

#[test]
fn an_unnated_service_ip_answered_by_a_local_listener_is_not_untranslated() {
    let names = KernelNames::default();
    let mut d = Diagnoser::new(ctx());
    // NodeLocalDNS bound to the kube-dns IP, NOTRACK: no DNAT, and the
    // answer comes from the service IP itself.
    let mut local = healthy();
    local.dnat = None;
    local.legs[1].dst = a("10.96.0.10:53");
    local.legs[2].src = a("10.96.0.10:53");
    assert!(d.journey(&local, &names).raised.is_empty());
    let mut lost = local.clone();
    lost.id = 2;
    lost.legs.truncate(2);
    lost.outcome = Outcome::Timeout;
    assert_eq!(
        kinds_of(&d.journey(&lost, &names).raised),
        vec!["unanswered"],
        "the listener is there: not kube-proxy's rules"
    );
}

#[test]
fn an_untranslated_query_on_a_full_conntrack_table_names_conntrack() {
    let mut d = Diagnoser::new(Context {
        conntrack: Some(ConntrackAtStart {
            dropped: vec![],
            entries: 990,
            max: Some(1000),
        }),
        ..ctx()
    });
    let mut j = healthy();
    j.dnat = None;
    j.legs.truncate(1);
    j.outcome = Outcome::Timeout;
    let found = d.journey(&j, &KernelNames::default()).raised;
    assert_eq!(kinds_of(&found), vec!["service_not_translated"]);
    assert!(
        found[0]
            .cause
            .contains("conntrack could not track the query")
            && found[0].cause.contains("99% full (990 of 1000)"),
        "{}",
        found[0].cause
    );
    assert!(
        found[0].fix.contains("nf_conntrack_max"),
        "{}",
        found[0].fix
    );
}

/// The web pod's search-list candidates for `base` under `domain`, A and
/// AAAA each, NXDOMAIN, given to `d`.
fn search_candidates(d: &mut Diagnoser, base: &str, domain: &str) {
    let names = KernelNames::default();
    let mut id = 0;
    for n in [
        format!("{base}.default.svc.{domain}."),
        format!("{base}.svc.{domain}."),
        format!("{base}.{domain}."),
    ] {
        for qtype in [Qtype::A, Qtype::AAAA] {
            id += 1;
            let j = Journey {
                qtype,
                ..asked(id, &n, Rcode::NXDOMAIN, 10 + id, 1)
            };
            d.journey(&j, &names);
        }
    }
}

/// `orders.corp.example.com.` after its candidates, sent upstream to
/// 198.51.100.53 with `outcome`, or not sent (None).
fn orders_leak(upstream_outcome: Option<Outcome>) -> Journey {
    let mut leak = asked(99, "orders.corp.example.com.", Rcode::NXDOMAIN, 40, 1);
    leak.upstream
        .extend(upstream_outcome.map(|o| upstream("198.51.100.53:53", o, 100_000)));
    leak
}

#[test]
fn a_leak_under_another_cluster_domain_is_found_and_lists_each_candidate_once() {
    let mut d = Diagnoser::new(ctx());
    search_candidates(&mut d, "orders", "k8s.example.net");
    let found = d
        .journey(
            &orders_leak(Some(answered(Rcode::NXDOMAIN))),
            &KernelNames::default(),
        )
        .raised;
    assert_eq!(kinds_of(&found), vec!["search_domain_leak"]);
    assert_eq!(
        found[0].evidence,
        vec![
            "10.244.0.10 asked orders.default.svc.k8s.example.net., orders.svc.k8s.example.net., orders.k8s.example.net., then orders.corp.example.com. (sent upstream to 198.51.100.53:53)",
            "198.51.100.53:53: answered NXDOMAIN",
        ]
    );
}

#[test]
fn a_foreign_candidate_not_sent_upstream_or_resolved_there_is_no_leak() {
    for outcome in [None, Some(answered(Rcode::NOERROR))] {
        let mut d = Diagnoser::new(ctx());
        search_candidates(&mut d, "orders", "cluster.local");
        let found = d
            .journey(&orders_leak(outcome.clone()), &KernelNames::default())
            .raised;
        assert!(found.is_empty(), "{outcome:?}: {found:?}");
    }
}

#[test]
fn the_cluster_domain_comes_from_the_traced_pods_search_list() {
    use crate::{pods::resolv::ResolvConf, target::Target};
    let target = Target {
        label: "pod default/web".into(),
        netns_inode: CLIENT_NS,
        addrs: vec!["10.244.0.10".parse().unwrap()],
        host_veth: None,
        resolv: Some(ResolvConf {
            nameservers: vec!["10.96.0.10".parse().unwrap()],
            search: vec![
                "default.svc.k8s.example.net".into(),
                "svc.k8s.example.net".into(),
                "k8s.example.net".into(),
            ],
            ndots: 5,
            options: vec![],
        }),
        namespace: Some("default".into()),
    };
    let mut d = Diagnoser::new(Context {
        target: Some(target),
        ..ctx()
    });
    let names = KernelNames::default();
    // Only the last cluster candidate was seen (the others before the start).
    d.journey(
        &asked(1, "orders.k8s.example.net.", Rcode::NXDOMAIN, 10, 1),
        &names,
    );
    let found = d
        .journey(&orders_leak(Some(Outcome::Timeout)), &names)
        .raised;
    let leak = found
        .iter()
        .find(|a| a.kind.as_str() == "search_domain_leak")
        .expect("a leak");
    assert_eq!(leak.evidence[1], "198.51.100.53:53: no answer");
}

#[test]
fn early_drop_is_no_loss_and_counters_alone_are_node_wide() {
    let mut d = Diagnoser::new(ctx());
    assert!(
        d.counters_moved(&[("early_drop", 4)], 1).is_empty(),
        "early_drop evicts an entry to make room; no packet is lost"
    );
    let raised = d.counters_moved(&[("insert_failed", 2), ("early_drop", 4)], 2);
    assert_eq!(kinds_of(&raised), vec!["conntrack_insert_failed"]);
    assert!(
        raised[0].summary.contains("node-wide, not shown to be DNS")
            && !raised[0].summary.contains("early_drop"),
        "{}",
        raised[0].summary
    );
    assert!(raised[0].evidence[1].contains("kfree_skb is not traced"));
    assert_eq!(raised[0].severity, Severity::Critical, "DNS's part unknown");
    // Traced drops, none of them DNS's: it is someone else's race.
    let mut traced = Diagnoser::new(Context {
        drops_visible: true,
        ..ctx()
    });
    let raised = traced.counters_moved(&[("insert_failed", 2)], 2);
    assert_eq!(raised[0].severity, Severity::Warning);
}

#[test]
fn conntrack_losses_backed_by_dns_drops_are_dnss() {
    let names = more_drop_names();
    let second = 1_000_000_000;
    // The counters rise first; the dropped DNS query closes after.
    let mut d = Diagnoser::new(Context {
        drops_visible: true,
        ..ctx()
    });
    d.counters_moved(&[("insert_failed", 1)], second);
    let raced = dropped_at("10.244.0.10:4000", "10.244.0.54:53", 3);
    let found = d.journey(&raced, &names).raised;
    let ct = found
        .iter()
        .find(|a| a.kind.as_str() == "conntrack_insert_failed")
        .expect("raised again as DNS's");
    assert_eq!(
        ct.summary,
        "conntrack dropped DNS packets: insert_failed +1"
    );
    // The DNS drop first; the counters rise after.
    let mut d = Diagnoser::new(ctx());
    d.journey(&raced, &names);
    let raised = d.counters_moved(&[("insert_failed", 1)], second);
    assert_eq!(
        raised[0].summary,
        "conntrack dropped DNS packets: insert_failed +1"
    );
}

#[test]
fn an_upstream_answer_after_the_resolver_gave_up_is_named_late() {
    let names = more_drop_names();
    let mut j = healthy();
    j.outcome = answered(Rcode::SERVFAIL);
    let mut late = upstream(
        "198.51.100.53:53",
        Outcome::Dropped {
            reason: 5,
            location: 0x8,
        },
        2_100_000_000,
    );
    // The answer came 2.1 s after the query, to a socket CoreDNS had closed.
    let mut answer = leg(
        60_000 + 2_100_000_000,
        "kfree_skb",
        DNS_NS,
        2,
        "198.51.100.53:53",
        "10.244.0.53:5555",
        true,
    );
    answer.drop = Some(Box::new((5, 0x8)));
    late.legs.push(answer);
    j.upstream.push(late);
    let found = Diagnoser::new(ctx()).journey(&j, &names).raised;
    let up = found
        .iter()
        .find(|a| a.kind.as_str() == "upstream_timeout")
        .expect("upstream_timeout");
    assert_eq!(
        up.summary,
        "the upstream resolver 198.51.100.53:53 answers after 10.244.0.53 gave up"
    );
    assert!(
        up.evidence[0].contains("the answer came 2100.0 ms later and found no socket"),
        "{:?}",
        up.evidence
    );
    assert!(!up.evidence[0].contains("dropped on the way"));
}

#[test]
fn a_drop_by_a_ruleset_is_a_rules_verdict_not_the_race() {
    let names = KernelNames::new(
        [(3, "SKB_DROP_REASON_NETFILTER_DROP".to_owned())].into(),
        "0000000000000008 t nft_do_chain\n".as_bytes(),
    );
    let mut d = Diagnoser::new(ctx());
    d.journey(&answered_aaaa(), &names);
    let dropped = dropped_at("10.244.0.10:4000", "10.244.0.54:53", 3);
    let found = d.journey(&Journey { id: 2, ..dropped }, &names).raised;
    assert_eq!(
        kinds_of(&found),
        vec!["dropped"],
        "an nftables rule (nft_do_chain) dropped it"
    );
}

/// Where no proxy rules are, the service IP comes from resolv.conf and a
/// balancer at the socket was to rewrite it: neither kube-proxy nor
/// conntrack is to blame, and br_netfilter does not matter.
#[test]
fn an_untranslated_query_without_proxy_rules_blames_the_socket_balancer() {
    let socket = Context {
        translation: Translation::Socket,
        conntrack: Some(ConntrackAtStart {
            dropped: vec![],
            entries: 990,
            max: Some(1000),
        }),
        ..ctx()
    };
    let mut j = healthy();
    j.dnat = None;
    j.legs.truncate(1);
    // It left the node still addressed to the service.
    j.legs.push(leg(
        40_000,
        "dev_xmit",
        NODE_NS,
        3,
        "10.244.0.10:4000",
        "10.96.0.10:53",
        false,
    ));
    j.outcome = Outcome::Timeout;
    let found = Diagnoser::new(socket.clone())
        .journey(&j, &KernelNames::default())
        .raised;
    assert_eq!(kinds_of(&found), vec!["service_not_translated"]);
    let a = &found[0];
    assert!(
        a.cause
            .contains("rewrite the service address at the socket"),
        "{}",
        a.cause
    );
    assert!(
        !a.cause.contains("conntrack") && !a.cause.contains("kube-proxy's rules"),
        "{}",
        a.cause
    );
    assert!(a.fix.contains("service list"), "{}", a.fix);
    for sysctl in [None, Some("0".to_owned())] {
        let mut d = Diagnoser::new(Context {
            bridge_nf_call_iptables: sysctl,
            conntrack: None,
            ..socket.clone()
        });
        assert!(d.static_checks(0).is_empty());
    }
}

/// Journeys that leave already translated (to a CoreDNS pod's IP, no DNAT
/// on the way) and are answered from it are healthy.
#[test]
fn a_query_balanced_at_the_socket_raises_nothing() {
    let mut d = Diagnoser::new(Context {
        translation: Translation::Socket,
        ..ctx()
    });
    let mut j = healthy();
    j.dnat = None;
    for l in &mut j.legs {
        if l.response {
            l.src = a("10.244.0.53:53");
        } else {
            l.dst = a("10.244.0.53:53");
        }
    }
    assert!(d.journey(&j, &KernelNames::default()).raised.is_empty());
}

/// NodeLocalDNS's query to CoreDNS over TCP, from `port`, `outcome` after
/// `at_ms`.
fn over_tcp(port: u16, at_ms: u64, outcome: Outcome) -> Journey {
    let client = format!("198.51.100.1:{port}");
    let mut u = upstream("10.244.0.54:53", outcome, 200_000);
    u.tcp = true;
    u.client = a(&client);
    u.started_ns = at_ms * 1_000_000;
    u.legs[0].src = a(&client);
    u.legs[0].ts_ns = u.started_ns;
    u
}

/// A CoreDNS pod restarted (a rollout) under NodeLocalDNS's open TCP
/// connection: the next query on it finds no socket, and NodeLocalDNS asks
/// again on a new connection, answered. The server answers; the old
/// connection had gone from under it.
#[test]
fn a_tcp_query_asked_again_on_a_new_connection_and_answered_is_no_upstream_timeout() {
    let mut j = healthy();
    j.upstream.push(over_tcp(40001, 1, Outcome::Timeout));
    j.upstream
        .push(over_tcp(40002, 2, answered(Rcode::NXDOMAIN)));
    assert!(kinds(&j).is_empty(), "{:?}", kinds(&j));
    // Never answered on any connection: the upstream does not answer.
    let mut j = healthy();
    j.upstream.push(over_tcp(40001, 1, Outcome::Timeout));
    j.upstream.push(over_tcp(40002, 2, Outcome::Timeout));
    assert_eq!(kinds(&j), vec!["upstream_timeout"]);
}

/// A loopback query answered: something listens there (a DNS sidecar, or a
/// resolver asking itself). One the capture cut short is no evidence.
#[test]
fn a_loopback_query_answered_or_cut_short_is_no_loopback_nameserver() {
    let mut j = healthy();
    j.dnat = None;
    j.legs = vec![on_lo(0, "dev_xmit", false), on_lo(90, "dev_xmit", true)];
    assert!(kinds(&j).is_empty(), "{:?}", kinds(&j));
    j.legs.truncate(1);
    j.outcome = Outcome::Timeout;
    j.incomplete = Some(Gap::Ended);
    assert!(kinds(&j).is_empty(), "{:?}", kinds(&j));
    j.incomplete = None;
    assert_eq!(kinds(&j), vec!["loopback_nameserver"]);
}

/// NodeLocalDNS's NOTRACK mode: a pod's query to the kube-dns IP is taken
/// on the node, without DNAT, by design. Unanswered (NodeLocalDNS could not
/// reach CoreDNS), it is no untranslated service: it arrived in the node's
/// namespace and went no further, never seen leaving it untranslated,
/// whether drops are watched or not.
#[test]
fn a_query_taken_by_a_listener_on_the_node_is_no_service_not_translated() {
    let mut j = healthy();
    j.dnat = None;
    j.outcome = Outcome::Timeout;
    // The client's query (healthy's first leg), then the node's receive.
    j.legs.truncate(1);
    j.legs.push(leg(
        9,
        "dev_receive",
        NODE_NS,
        2,
        "10.244.0.10:4000",
        "10.96.0.10:53",
        false,
    ));
    let kinds_with = |drops_visible: bool| {
        let found = Diagnoser::new(Context {
            drops_visible,
            ..ctx()
        })
        .journey(&j, &KernelNames::default())
        .raised;
        kinds_of(&found)
    };
    for drops_visible in [true, false] {
        assert!(!kinds_with(drops_visible).contains(&"service_not_translated"));
    }
}

/// Two pods ask the same name at once and NodeLocalDNS asks CoreDNS once:
/// its retry on a new connection may be linked to the other pod's lookup,
/// closed first. Still the connection failed, not the server.
#[test]
fn a_tcp_retry_answered_for_another_lookup_is_no_upstream_timeout() {
    let mut d = Diagnoser::new(ctx());
    let mut other = healthy();
    other.id = 10;
    other.client = a("10.244.0.11:4000");
    other
        .upstream
        .push(over_tcp(40002, 2, answered(Rcode::NXDOMAIN)));
    assert!(kinds_of(&d.journey(&other, &KernelNames::default()).raised).is_empty());
    let mut j = healthy();
    j.upstream.push(over_tcp(40001, 1, Outcome::Timeout));
    let found = d.journey(&j, &KernelNames::default()).raised;
    assert!(kinds_of(&found).is_empty(), "{:?}", kinds_of(&found));
}

/// A TCP query to a CoreDNS pod whose end of the connection was closing or
/// gone (an idle timeout, a restart: no upstream timeout): its kernel threw
/// the query away (TCP_ABORT_ON_DATA on a closing socket, TCP_FLAGS where a
/// restarted server's listener got the old connection's data, TCP_CLOSE,
/// NO_SOCKET), and NodeLocalDNS asked again on a new connection, judged
/// later. A netfilter drop on the way is the upstream's path failing.
#[test]
fn a_tcp_query_thrown_away_by_a_closing_connection_is_no_upstream_timeout() {
    let reasons = [
        "TCP_ABORT_ON_DATA",
        "TCP_FLAGS",
        "TCP_CLOSE",
        "NO_SOCKET",
        "NETFILTER_DROP",
    ];
    let names = KernelNames::new(
        (0..)
            .zip(reasons)
            .map(|(n, r)| (n, format!("SKB_DROP_REASON_{r}")))
            .collect(),
        "".as_bytes(),
    );
    for (reason, name) in (0..).zip(reasons) {
        let mut j = healthy();
        j.upstream.push(over_tcp(
            40001,
            1,
            Outcome::Dropped {
                reason,
                location: 0,
            },
        ));
        let found = Diagnoser::new(ctx()).journey(&j, &names).raised;
        assert_eq!(
            kinds_of(&found).contains(&"upstream_timeout"),
            name == "NETFILTER_DROP",
            "{name}: {:?}",
            kinds_of(&found)
        );
    }
}

/// web's lookup answered by CoreDNS on node3 with an answer of `size`
/// bytes, which reaches node1 if `arrives`.
fn answer_across(size: u16, arrives: bool, id: u64) -> (Journey, Context) {
    let (mut j, cx) = across_nodes(true);
    j.id = id;
    j.outcome = answered(Rcode::NOERROR);
    j.legs[3].ip_len = size;
    if arrives {
        let mut back = leg(
            120_000,
            "dev_receive",
            NODE_NS,
            5,
            "10.244.3.53:53",
            "10.244.1.10:4000",
            true,
        );
        (back.node, back.ip_len) = (NodeId(1), size);
        j.legs.push(back);
    }
    (j, cx)
}

fn checked(d: &mut Diagnoser, (j, _): &(Journey, Context)) -> Checked {
    d.journey(j, &KernelNames::default())
}

fn hit(c: &Checked, kind: AnomalyKind) -> bool {
    c.hits.iter().any(|(k, _)| *k == kind)
}

#[test]
fn large_answers_lost_between_nodes_where_small_ones_arrive_are_the_overlay_s_mtu() {
    let mut d = Diagnoser::new(answer_across(0, false, 0).1);
    // Lost before any answer showed what passes: the generic loss.
    let first = checked(&mut d, &answer_across(1342, false, 1));
    assert!(hit(&first, AnomalyKind::LostBetweenNodes), "{first:?}");
    assert!(!hit(&first, AnomalyKind::OverlayMtu), "{first:?}");
    // A small one arrives: it explains the one lost before, raised once.
    let small = checked(&mut d, &answer_across(112, true, 2));
    assert_eq!(small.raised.len(), 1, "{small:?}");
    let mtu = &small.raised[0];
    assert_eq!(mtu.kind, AnomalyKind::OverlayMtu);
    assert_eq!(
        mtu.summary,
        "DNS answers of 1342 bytes lost between node3 and node1; smaller ones arrive"
    );
    assert!(
        mtu.evidence[0].contains("of 1342 bytes (IP packets)")
            && mtu.evidence[0].contains("left by eth0 on node node3 (netns 200) at dev_xmit")
            && mtu.evidence[1].contains(": 112 bytes"),
        "{:?}",
        mtu.evidence
    );
    assert!(
        mtu.journeys.is_empty(),
        "the small answer's journey is fine"
    );
    assert!(!hit(&small, AnomalyKind::OverlayMtu));
    assert!(checked(&mut d, &answer_across(200, true, 3))
        .raised
        .is_empty());
    // Large ones lost later are the MTU's, not the generic loss.
    let later = checked(&mut d, &answer_across(1400, false, 4));
    assert!(hit(&later, AnomalyKind::OverlayMtu), "{later:?}");
    assert!(!hit(&later, AnomalyKind::LostBetweenNodes), "{later:?}");
}

#[test]
fn an_answer_lost_no_larger_than_one_delivered_is_no_mtu() {
    let mut d = Diagnoser::new(answer_across(0, false, 0).1);
    // A small answer arrived first: the large one lost after is the MTU's.
    checked(&mut d, &answer_across(112, true, 1));
    let large = checked(&mut d, &answer_across(1342, false, 2));
    let kinds: Vec<AnomalyKind> = large.raised.iter().map(|a| a.kind).collect();
    assert_eq!(kinds, [AnomalyKind::OverlayMtu]);
    // Elsewhere, small answers lost where larger ones arrive are no MTU.
    let mut d = Diagnoser::new(answer_across(0, false, 0).1);
    checked(&mut d, &answer_across(1342, true, 1));
    let small = checked(&mut d, &answer_across(112, false, 2));
    assert!(hit(&small, AnomalyKind::LostBetweenNodes), "{small:?}");
    assert!(!hit(&small, AnomalyKind::OverlayMtu), "{small:?}");
    assert!(checked(&mut d, &answer_across(100, true, 3))
        .raised
        .is_empty());
    // One node's recording knows no paths between nodes.
    let mut cx = answer_across(0, false, 0).1;
    cx.nodes.clear();
    let mut d = Diagnoser::new(cx);
    checked(&mut d, &answer_across(112, true, 1));
    let alone = checked(&mut d, &answer_across(1342, false, 2));
    assert!(!hit(&alone, AnomalyKind::OverlayMtu), "{alone:?}");
}

/// A lookup of web's to kube-dns DNATed to `endpoint`, answered or not
/// (the query reached it, no answer came), the `n`th.
fn to_endpoint(endpoint: &str, answers: bool, n: u64) -> Journey {
    let mut j = healthy();
    (j.id, j.started_ns) = (n, n * 1_000_000);
    j.ended_ns = j.started_ns + 300_000;
    j.dnat = Some(Box::new((a("10.96.0.10:53"), a(endpoint))));
    for l in &mut j.legs {
        l.ts_ns += j.started_ns;
    }
    j.legs[1].dst = a(endpoint);
    j.legs[2].src = a(endpoint);
    if !answers {
        j.legs.truncate(2);
        j.outcome = Outcome::Timeout;
    }
    j
}

const UP: &str = "10.244.2.53:53";
const HUNG: &str = "10.244.3.53:53";

/// Lookups sent to UP and HUNG in turn, UP answering, HUNG answering if
/// `hung_answers`: what each raised and fed.
fn alternate(d: &mut Diagnoser, from: u64, pairs: u64, hung_answers: bool) -> Vec<Checked> {
    (from..from + pairs)
        .flat_map(|i| {
            [
                to_endpoint(UP, true, 2 * i),
                to_endpoint(HUNG, hung_answers, 2 * i + 1),
            ]
        })
        .map(|j| d.journey(&j, &KernelNames::default()))
        .collect()
}

fn down_raised(all: &[Checked]) -> Vec<&Anomaly> {
    all.iter()
        .flat_map(|c| &c.raised)
        .filter(|a| a.kind == AnomalyKind::ResolverEndpointDown)
        .collect()
}

#[test]
fn an_endpoint_that_answers_none_of_its_share_while_another_answers_is_named() {
    let mut d = Diagnoser::new(ctx());
    let all = alternate(&mut d, 0, 4, false);
    let down = down_raised(&all);
    assert_eq!(down.len(), 1, "{all:?}");
    assert_eq!(
        down[0].summary,
        "the resolver endpoint 10.244.3.53 of 10.96.0.10 does not answer; 10.244.2.53 does"
    );
    assert_eq!(
        down[0].evidence,
        ["3 of 6 lookups to 10.96.0.10 went to 10.244.3.53 and got no answer; 10.244.2.53 answered its 3"]
    );
    // Raised by the third lookup it left unanswered, once while it stays down.
    assert_eq!(down[0].journeys, [5]);
    assert_eq!(
        all.iter()
            .filter(|c| hit(c, AnomalyKind::ResolverEndpointDown))
            .count(),
        1
    );
    // It answers again, then hangs again: counted again.
    alternate(&mut d, 4, 1, true);
    let again = alternate(&mut d, 5, 3, false);
    assert_eq!(
        again
            .iter()
            .filter(|c| hit(c, AnomalyKind::ResolverEndpointDown))
            .count(),
        1
    );
    // The per-lookup finding stays.
    assert!(hit(&all[7], AnomalyKind::Unanswered), "{:?}", all[7]);
}

#[test]
fn healthy_endpoints_and_a_lone_endpoint_timing_out_are_no_endpoint_down() {
    let mut d = Diagnoser::new(ctx());
    assert!(down_raised(&alternate(&mut d, 0, 8, true)).is_empty());
    // One endpoint alone, timing out: nothing answers to compare with.
    let mut d = Diagnoser::new(ctx());
    let lone: Vec<Checked> = (0..6)
        .map(|i| d.journey(&to_endpoint(HUNG, false, i), &KernelNames::default()))
        .collect();
    assert!(down_raised(&lone).is_empty(), "{lone:?}");
    assert!(lone.iter().all(|c| hit(c, AnomalyKind::Unanswered)));
}

/// Names that fail at one endpoint and are never answered by another (an
/// upstream down for external names, out of this node's sight), and a
/// timeout the endpoint forwarded upstream, are not the endpoint's.
#[test]
fn names_no_endpoint_answers_and_queries_forwarded_upstream_are_no_endpoint_down() {
    let lookups = |hung: &dyn Fn(u64) -> Journey| {
        let mut d = Diagnoser::new(ctx());
        let all: Vec<Checked> = (0..5)
            .flat_map(|i| [to_endpoint(UP, true, 2 * i), hung(2 * i + 1)])
            .map(|j| d.journey(&j, &KernelNames::default()))
            .collect();
        down_raised(&all).len()
    };
    let external = |n| {
        let mut j = to_endpoint(HUNG, false, n);
        j.name = "example.com.".into();
        j
    };
    assert_eq!(lookups(&external), 0);
    let forwarded = |n| {
        let mut j = to_endpoint(HUNG, false, n);
        let mut up = to_endpoint("192.0.2.53:53", false, n);
        up.dnat = None;
        j.upstream.push(up);
        j
    };
    assert_eq!(lookups(&forwarded), 0);
    // The same lookups without either: the endpoint is down.
    assert_eq!(lookups(&|n| to_endpoint(HUNG, false, n)), 1);
}

#[test]
fn in_a_merged_replay_the_down_endpoint_s_node_is_named_and_queries_lost_on_the_way_are_not_its() {
    let (_, cx) = across_nodes(false);
    // Seen on node1, but where it reached the endpoint's pod, on its node.
    let merged = |d: &mut Diagnoser, j: Journey| {
        let mut j = j;
        for l in &mut j.legs {
            l.node = NodeId(1);
        }
        j.legs[1].node = NodeId(3);
        d.journey(&j, &KernelNames::default())
    };
    let mut d = Diagnoser::new(named(cx.clone()));
    let all: Vec<Checked> = (0..4)
        .flat_map(|i| {
            [
                to_endpoint(UP, true, 2 * i),
                to_endpoint(HUNG, false, 2 * i + 1),
            ]
        })
        .map(|j| merged(&mut d, j))
        .collect();
    let down = down_raised(&all);
    assert_eq!(down.len(), 1, "{all:?}");
    assert_eq!(
        down[0].summary,
        "the resolver endpoint 10.244.3.53 on node3 of 10.96.0.10 does not answer; 10.244.2.53 does"
    );
    assert!(
        down[0].evidence[0].starts_with("3 of 6 lookups to 10.96.0.10 (service kube-system/kube-dns) went to 10.244.3.53 (kube-system/coredns-xyz on node node3) and got no answer; 10.244.2.53 answered its "),
        "{:?}",
        down[0].evidence
    );
    assert_eq!(down[0].evidence[1], "10.244.3.53 is a pod on node3");
    // Queries that left node1 for node3 and never arrived: the path's.
    let mut d = Diagnoser::new(cx);
    let lost: Vec<Checked> = (0..4)
        .flat_map(|i| {
            let mut hung = to_endpoint(HUNG, false, 2 * i + 1);
            (hung.legs[1].hook, hung.legs[1].netns) = (Hook::DevXmit, NODE_NS);
            [to_endpoint(UP, true, 2 * i), hung]
        })
        .map(|mut j| {
            for l in &mut j.legs {
                l.node = NodeId(1);
            }
            d.journey(&j, &KernelNames::default())
        })
        .collect();
    assert!(down_raised(&lost).is_empty(), "{lost:?}");
    assert!(lost.iter().any(|c| hit(c, AnomalyKind::LostBetweenNodes)));
}

#[test]
fn an_endpoint_silent_before_another_answered_is_named_once_that_one_has() {
    let mut d = Diagnoser::new(ctx());
    let names = KernelNames::default();
    let hung: Vec<Checked> = (0..4)
        .map(|i| d.journey(&to_endpoint(HUNG, false, i), &names))
        .collect();
    assert!(down_raised(&hung).is_empty(), "nothing answered yet");
    let up: Vec<Checked> = (4..7)
        .map(|i| d.journey(&to_endpoint(UP, true, i), &names))
        .collect();
    let down = down_raised(&up);
    assert_eq!(down.len(), 1, "{up:?}");
    assert_eq!(
        down[0].evidence,
        ["4 of 7 lookups to 10.96.0.10 went to 10.244.3.53 and got no answer; 10.244.2.53 answered its 3"]
    );
    // Raised by the third answer elsewhere, which is not its journey.
    assert!(down[0].journeys.is_empty());
    assert!(!up.iter().any(|c| hit(c, AnomalyKind::ResolverEndpointDown)));
    // Once only while it stays down.
    let more = alternate(&mut d, 10, 3, false);
    assert!(down_raised(&more).is_empty(), "{more:?}");
}

/// `ctx` with the names the node knows: the client, CoreDNS and the DNS
/// service of `healthy`, and `across_nodes`'s client and resolver.
fn named(cx: Context) -> Context {
    let names = [
        ("10.244.0.10", "default/web"),
        ("10.244.0.53", "kube-system/coredns-abc"),
        ("10.96.0.10", "kube-system/kube-dns"),
        ("10.244.1.10", "default/web-1"),
        ("10.244.3.53", "kube-system/coredns-xyz"),
    ];
    let names = names.map(|(ip, n)| (ip.parse().unwrap(), n.to_owned()));
    Context {
        names: crate::naming::Names::from_entries(names.into()),
        ..cx
    }
}

/// The healthy query reaching CoreDNS's namespace and dropped there for
/// `reason` (drop_names: 7 a full socket, 3 a netfilter rule).
fn dropped_in_coredns(reason: u32) -> Journey {
    let mut j = healthy();
    j.legs.truncate(2);
    let (client, server) = ("10.244.0.10:4000", "10.244.0.53:53");
    j.legs
        .push(leg(60_000, "kfree_skb", DNS_NS, 2, client, server, false));
    j.outcome = Outcome::Dropped {
        reason,
        location: 0x10,
    };
    j
}

fn drop_evidence(d: &mut Diagnoser, j: &Journey) -> String {
    let found = d.journey(j, &drop_names()).raised;
    let drop = found.iter().find(|a| a.kind == AnomalyKind::Dropped);
    drop.unwrap_or_else(|| panic!("{found:?}")).evidence[0].clone()
}

#[test]
fn a_drop_in_a_known_pods_namespace_names_the_pod_with_its_inode() {
    let j = dropped_in_coredns(7);
    assert_eq!(
        drop_evidence(&mut Diagnoser::new(named(ctx())), &j),
        "the query for kubernetes.default.svc.cluster.local. A from 10.244.0.10:4000 (default/web) to 10.244.0.53:53 (kube-system/coredns-abc) was dropped on eth0 in pod kube-system/coredns-abc (netns 300): SOCKET_RCVBUFF at udp_queue_rcv_one_skb+0x8"
    );
    // Nothing names the namespace: its inode, and the addresses alone.
    assert_eq!(
        drop_evidence(&mut Diagnoser::new(ctx()), &j),
        "the query for kubernetes.default.svc.cluster.local. A from 10.244.0.10:4000 to 10.244.0.53:53 was dropped on eth0 in netns 300: SOCKET_RCVBUFF at udp_queue_rcv_one_skb+0x8"
    );
}

#[test]
fn a_drop_in_a_pod_on_another_node_names_the_pod_and_its_node() {
    let (one, three) = (NodeId(1), NodeId(3));
    let mut j = dropped_in_coredns(7);
    for l in &mut j.legs {
        l.node = if l.netns == DNS_NS { three } else { one };
    }
    let cx = Context {
        nodes: ["node1", "node2", "node3"].map(String::from).to_vec(),
        homes: [
            ("10.244.0.10".parse().unwrap(), one),
            ("10.244.0.53".parse().unwrap(), three),
        ]
        .into(),
        node_namespaces: [(one, NODE_NS), (three, NODE_NS + 3)].into(),
        ..named(ctx())
    };
    assert_eq!(
        drop_evidence(&mut Diagnoser::new(cx.clone()), &j),
        "the query for kubernetes.default.svc.cluster.local. A from 10.244.0.10:4000 (default/web on node node1) to 10.244.0.53:53 (kube-system/coredns-abc on node node3) was dropped on eth0 in pod kube-system/coredns-abc on node node3 (netns 300): SOCKET_RCVBUFF at udp_queue_rcv_one_skb+0x8"
    );
    // The same inode on node1 is another namespace, no one's known.
    for l in &mut j.legs {
        l.node = one;
    }
    j.legs[1].netns = NODE_NS + 1;
    assert!(drop_evidence(&mut Diagnoser::new(cx), &j)
        .contains(" was dropped on eth0 in netns 300 on node node1: "));
}

#[test]
fn a_pod_named_after_the_start_is_named_in_findings_raised_since() {
    let mut d = Diagnoser::new(ctx());
    let before = drop_evidence(&mut d, &dropped_in_coredns(7));
    assert!(before.contains("dropped on eth0 in netns 300:"), "{before}");
    d.pods(&Refresh {
        names: vec![(
            "10.244.0.53".parse().unwrap(),
            "kube-system/coredns-abc".into(),
        )],
        ..Refresh::default()
    });
    let after = drop_evidence(&mut d, &dropped_in_coredns(3));
    assert!(
        after.contains(
            "to 10.244.0.53:53 (kube-system/coredns-abc) was dropped on eth0 in pod kube-system/coredns-abc (netns 300): NETFILTER_DROP"
        ),
        "{after}"
    );
}

#[test]
fn the_nodes_namespace_and_one_showing_two_pods_are_no_pods() {
    let mut cx = named(ctx());
    let (web, coredns) = ("10.244.0.10:4000", "10.244.0.53:53");
    // The node forwards both ways; namespace 400 shows both as its own.
    let legs = [
        leg(0, "dev_xmit", NODE_NS, 5, web, coredns, false),
        leg(1, "dev_xmit", 400, 6, web, coredns, false),
        leg(2, "dev_receive", 400, 6, web, coredns, false),
    ];
    cx.learn_namespaces(&legs);
    assert_eq!(places::place(&cx, &legs[0]), "eth0 on the node (netns 200)");
    assert_eq!(places::place(&cx, &legs[1]), "eth0 in netns 400");
    // An address no one named is no pod's either.
    let unnamed = leg(3, "dev_xmit", 500, 7, "10.244.9.9:4000", coredns, false);
    cx.learn_namespaces(std::slice::from_ref(&unnamed));
    assert_eq!(places::place(&cx, &unnamed), "eth0 in netns 500");
}

#[test]
fn an_unnated_answer_names_the_client_pod_and_the_resolver() {
    let found = Diagnoser::new(named(ctx()))
        .journey(&unnated_answer(), &KernelNames::default())
        .raised;
    assert_eq!(kinds_of(&found), ["reply_from_unexpected_source"]);
    assert_eq!(
        found[0].evidence[..2],
        [
            "the query 10.244.0.10:4000 (default/web) → 10.96.0.10:53 (service kube-system/kube-dns) left eth0 in pod default/web (netns 100)",
            "its answer reached eth0 in pod default/web (netns 100) from 10.244.0.53:53 (kube-system/coredns-abc), not from 10.96.0.10:53",
        ]
    );
}

#[test]
fn a_message_lost_between_nodes_names_the_pods_and_their_nodes() {
    let (j, cx) = across_nodes(false);
    let found = Diagnoser::new(named(cx))
        .journey(&j, &KernelNames::default())
        .raised;
    assert_eq!(kinds_of(&found), ["lost_between_nodes"]);
    assert_eq!(
        found[0].evidence,
        ["10.244.1.10:4000 (default/web-1 on node node1) asked 10.96.0.10:53 (service kube-system/kube-dns) for kubernetes.default.svc.cluster.local. A; the query 10.244.1.10:4000 → 10.244.3.53:53 left eth0 on node node1 (netns 200), and node3, where 10.244.3.53 (kube-system/coredns-xyz on node node3) is, never saw it"]
    );
}

#[test]
fn slow_answers_name_the_client_and_the_resolver_they_left_for() {
    let mut j = answered_after(healthy(), 800);
    let (web, other) = ("10.244.0.10:4000", "10.244.3.53:53");
    j.legs[1] = leg(50_000, "dev_xmit", NODE_NS, 9, web, other, false);
    j.legs[2] = leg(800_000_000, "dev_receive", NODE_NS, 9, other, web, true);
    j.dnat = Some(Box::new((a("10.96.0.10:53"), a(other))));
    let mut d = Diagnoser::new(named(ctx()));
    let found: Vec<Anomaly> = (0..3u64)
        .flat_map(|i| {
            d.journey(&shifted(&j, i, i * 1_000_000_000), &KernelNames::default())
                .raised
        })
        .collect();
    assert_eq!(kinds_of(&found), ["slow_answers"]);
    let evidence = &found[0].evidence;
    assert!(
        evidence[0].contains(
            "left this node at eth0 on the node (netns 200) for 10.244.3.53:53 (kube-system/coredns-xyz) until"
        ),
        "{evidence:?}"
    );
    assert!(
        evidence[1]
            .starts_with("3 answers from the server 10.244.3.53 (kube-system/coredns-xyz) took"),
        "{evidence:?}"
    );
}
