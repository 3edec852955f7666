use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use bytes::Bytes;
use dnstrace_common::{sample, Hook};
use hickory_proto::rr::RecordType;

use super::*;
use crate::correlate::{devices::DEVICES_LIMIT, journey::Outcome, table::Table};
use crate::decode::{
    dns,
    packet::{CtTuple, Dropped},
    Body, Conntrack, DnsMessage, Fragment, Packet, Record, Transport,
};
use crate::decode::{Qtype, Rcode};
use crate::ingest::SampleChange;

const CLIENT_NS: u32 = 100;
const NODE_NS: u32 = 200;
const DNS_NS: u32 = 300;
const MS: u64 = 1_000_000;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn msg(id: u16, name: &str, qtype: &'static str, response: bool) -> DnsMessage {
    DnsMessage {
        id,
        response,
        opcode: "QUERY".into(),
        flags: dns::Flags::default(),
        rcode: Rcode::NOERROR,
        questions: vec![dns::Question::new(
            name.into(),
            Qtype(qtype.parse::<RecordType>().unwrap().into()),
            "IN",
        )],
        answers: if response {
            vec![dns::Answer {
                name: name.into(),
                rtype: "A",
                ttl: 5,
                data: "10.96.0.1".into(),
            }]
        } else {
            vec![]
        },
        authority_count: 0,
        additional_count: 0,
        malformed: None,
    }
}

struct Ev {
    ts: u64,
    hook: Hook,
    netns: u32,
    ifindex: u32,
    src: &'static str,
    dst: &'static str,
}

fn ev(ts: u64, hook: Hook, netns: u32, ifindex: u32, src: &'static str, dst: &'static str) -> Ev {
    Ev {
        ts,
        hook,
        netns,
        ifindex,
        src,
        dst,
    }
}

fn rec(e: &Ev, m: DnsMessage, ct: Option<Conntrack>, drop: Option<Dropped>) -> Record {
    Record {
        packet: Packet {
            ts_ns: e.ts,
            node: Default::default(),
            netns: e.netns,
            ifindex: e.ifindex,
            hook: e.hook,
            src: addr(e.src),
            dst: addr(e.dst),
            transport: Transport::Udp,
            wire_len: 0,
            payload_len: 0,
            truncated: false,
            frag: None,
            payload: Bytes::new(),
            ifname: None,
            ct: ct.map(Box::new),
            drop,
            underlay: None,
        },
        body: Body::Dns(m.into()),
        missing: None,
    }
}

fn dnat_ct(client: &str, endpoint: &str) -> Conntrack {
    Conntrack {
        original: CtTuple {
            src: addr(client),
            dst: addr("10.96.0.10:53"),
        },
        reply: CtTuple {
            src: addr(endpoint),
            dst: addr(client),
        },
        status: 1 << 5,
        is_reply: false,
    }
}

/// The six legs of a healthy lookup through kube-proxy's DNAT, from `client`.
fn healthy(t0: u64, client: &'static str, client_ns: u32, id: u16) -> Vec<Record> {
    let ct = dnat_ct(client, "10.244.0.53:53");
    let leg = |response, ts, hook, netns, ifindex, src, dst, ct| {
        let ev = Ev {
            ts: t0 + ts,
            hook,
            netns,
            ifindex,
            src,
            dst,
        };
        rec(
            &ev,
            msg(id, "kubernetes.default.svc.cluster.local.", "A", response),
            ct,
            None,
        )
    };
    let q =
        |ts, hook, netns, ifindex, src, dst, ct| leg(false, ts, hook, netns, ifindex, src, dst, ct);
    let r =
        |ts, hook, netns, ifindex, src, dst, ct| leg(true, ts, hook, netns, ifindex, src, dst, ct);
    vec![
        q(
            0,
            Hook::DevXmit,
            client_ns,
            2,
            client,
            "10.96.0.10:53",
            None,
        ),
        q(
            10_000,
            Hook::DevReceive,
            NODE_NS,
            5,
            client,
            "10.96.0.10:53",
            None,
        ),
        q(
            30_000,
            Hook::DevXmit,
            NODE_NS,
            7,
            client,
            "10.244.0.53:53",
            Some(ct),
        ),
        q(
            31_000,
            Hook::DevReceive,
            DNS_NS,
            2,
            client,
            "10.244.0.53:53",
            None,
        ),
        r(
            200_000,
            Hook::DevXmit,
            DNS_NS,
            2,
            "10.244.0.53:53",
            client,
            None,
        ),
        r(
            201_000,
            Hook::DevReceive,
            NODE_NS,
            7,
            "10.244.0.53:53",
            client,
            None,
        ),
        r(
            210_000,
            Hook::DevXmit,
            NODE_NS,
            5,
            "10.96.0.10:53",
            client,
            Some(Conntrack {
                is_reply: true,
                ..ct
            }),
        ),
        r(
            211_000,
            Hook::DevReceive,
            client_ns,
            2,
            "10.96.0.10:53",
            client,
            None,
        ),
    ]
}

fn run(records: &[Record], end: u64) -> (Engine, Vec<Journey>) {
    let mut e = Engine::new(Limits::default());
    let mut out = Vec::new();
    for r in records {
        e.push(r);
        out.extend(e.tick(r.packet.ts_ns));
    }
    out.extend(e.tick(end));
    (e, out)
}

#[test]
fn a_healthy_lookup_is_one_complete_journey_with_its_dnat() {
    let (e, js) = run(&healthy(0, "10.244.0.10:4000", CLIENT_NS, 7), 2_000 * MS);
    assert_eq!(js.len(), 1);
    let j = &js[0];
    assert_eq!(j.legs.len(), 8);
    assert_eq!(
        j.dnat.as_deref(),
        Some(&(addr("10.96.0.10:53"), addr("10.244.0.53:53")))
    );
    assert!(matches!(j.outcome, Outcome::Answered { rcode, .. } if rcode == Rcode::NOERROR));
    let sum: u64 = j.legs.iter().map(|l| l.since_prev_ns).sum();
    assert_eq!(sum, j.total_ns(), "leg times add up to the total");
    assert_eq!(j.total_ns(), 211_000);
    assert_eq!(j.incomplete, None);
    assert_eq!(e.open_count(), 0);
}

#[test]
fn closes_soon_after_the_answer_not_at_the_timeout() {
    let recs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    let mut e = Engine::new(Limits::default());
    recs.iter().for_each(|r| e.push(r));
    assert!(e.tick(100 * MS).is_empty(), "still settling");
    assert_eq!(e.tick(300 * MS).len(), 1);
}

/// A client behind a macvlan sends on the upper device, and the kernel's
/// receive tracepoint fires on the lower one only: the answer is still with
/// the client once it enters the client's namespace.
#[test]
fn an_answer_received_on_the_lower_device_closes_the_journey_soon() {
    let mut recs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    let last = recs.last_mut().unwrap();
    last.packet.ifindex = 9;
    let mut e = Engine::new(Limits::default());
    recs.iter().for_each(|r| e.push(r));
    assert!(e.tick(100 * MS).is_empty(), "still settling");
    let js = e.tick(300 * MS);
    assert_eq!(js.len(), 1, "closed at the answer, not at the timeout");
    assert!(matches!(js[0].outcome, Outcome::Answered { .. }));
}

/// Through tc, a reply leaving by another interface of the namespace has
/// not yet reached the client.
#[test]
fn a_reply_on_another_tc_interface_is_not_yet_with_the_client() {
    let client = "10.244.0.10:4000";
    let at = |ts, hook, ifindex, src, dst, response| {
        rec(
            &ev(ts, hook, NODE_NS, ifindex, src, dst),
            msg(7, "kubernetes.default.svc.cluster.local.", "A", response),
            None,
            None,
        )
    };
    let recs = [
        at(0, Hook::TcIngress, 5, client, "10.244.0.53:53", false),
        at(10_000, Hook::TcEgress, 7, client, "10.244.0.53:53", false),
        at(200_000, Hook::TcIngress, 7, "10.244.0.53:53", client, true),
        at(201_000, Hook::TcEgress, 8, "10.244.0.53:53", client, true),
    ];
    let mut e = Engine::new(Limits::default());
    recs.iter().for_each(|r| e.push(r));
    assert!(e.tick(300 * MS).is_empty(), "not delivered: waits");
}

#[test]
fn reordered_and_duplicate_events_make_the_same_journey() {
    let mut recs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    recs.swap(1, 2);
    recs.swap(5, 6);
    let dup = recs[3].clone();
    recs.push(dup);
    let (_, js) = run(&recs, 2_000 * MS);
    assert_eq!(js.len(), 1);
    assert_eq!(js[0].legs.len(), 8);
    assert!(js[0].legs.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
    assert_eq!(js[0].legs[0].hook, Hook::DevXmit);
    assert_eq!(js[0].legs[0].netns, CLIENT_NS);
}

#[test]
fn lost_events_mark_open_journeys_incomplete() {
    let recs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    let mut e = Engine::new(Limits::default());
    recs[..3].iter().for_each(|r| e.push(r));
    e.lost(0, 1);
    recs[3..].iter().for_each(|r| e.push(r));
    let js = e.tick(2_000 * MS);
    assert_eq!(js[0].incomplete, Some(Gap::Lost));
}

/// A stalled reader notices the loss before it reads the events queued
/// ahead of it: journeys that start in those events overlap the loss too.
#[test]
fn a_journey_read_after_the_loss_was_noticed_is_incomplete() {
    let recs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    let mut e = Engine::new(Limits::default());
    e.lost(0, 50 * MS);
    recs[..3].iter().for_each(|r| e.push(r));
    let js = e.tick(10_000 * MS);
    assert_eq!(js[0].incomplete, Some(Gap::Lost));
    // Later journeys, clear of the loss, are whole.
    let later = healthy(20_000 * MS, "10.244.0.10:4001", CLIENT_NS, 8);
    later.iter().for_each(|r| e.push(r));
    let js = e.tick(22_000 * MS);
    assert_eq!(js[0].incomplete, None);
}

/// A capture whose clock is coarse gives a query and its answer the same
/// time at the one place it saw them: the answer is not the query seen
/// twice, and it answers the lookup.
#[test]
fn an_answer_with_its_querys_timestamp_answers_it() {
    let at = |src, dst| ev(MS, Hook::DevReceive, 0, 2, src, dst);
    const CLIENT: &str = "10.244.1.10:40001";
    const SERVICE: &str = "10.96.0.10:53";
    let name = "a.example.com.";
    let query = rec(&at(CLIENT, SERVICE), msg(7, name, "A", false), None, None);
    let answer = rec(&at(SERVICE, CLIENT), msg(7, name, "A", true), None, None);
    let mut e = Engine::new(Limits::default());
    [query, answer].iter().for_each(|r| e.push(r));
    let js = e.finish(10 * MS);
    assert_eq!(js.len(), 1);
    assert!(
        matches!(js[0].outcome, Outcome::Answered { .. }),
        "{:?}",
        js[0].outcome
    );
    assert_eq!(js[0].legs.len(), 2);
}

/// A capture taken at two points stamps answers a little before their
/// queries: one up to 10 ms early answers its query, at the query's time;
/// one earlier than that, or for another socket, answers nothing; and no
/// more than 64 wait at once.
#[test]
fn an_answer_a_little_before_its_query_answers_it() {
    const SERVICE: &str = "10.96.0.10:53";
    let name = "a.example.com.";
    let at = |ms: u64, src, dst| ev(ms * MS, Hook::DevReceive, 0, 2, src, dst);
    let message = |ms, client, id, response| {
        let e = if response {
            at(ms, SERVICE, client)
        } else {
            at(ms, client, SERVICE)
        };
        rec(&e, msg(id, name, "A", response), None, None)
    };
    let answer = |ms, client, id| message(ms, client, id, true);
    let query = |ms, client, id| message(ms, client, id, false);
    let mut e = Engine::new(Limits::default());
    let early = answer(100, "10.244.1.10:40001", 7);
    let too_early = answer(100, "10.244.1.10:40002", 8);
    let elsewhere = answer(100, "10.244.1.11:40001", 7);
    for r in [&early, &too_early, &elsewhere] {
        e.push(r);
    }
    e.push(&query(108, "10.244.1.10:40001", 7));
    e.push(&query(111, "10.244.1.10:40002", 8));
    for i in 0..100 {
        e.push(&answer(112, "10.244.2.10:40001", i));
    }
    assert_eq!(e.early.len(), 64);
    let js = e.finish(200 * MS);
    assert_eq!(js.len(), 2);
    assert!(
        matches!(js[0].outcome, Outcome::Answered { .. }),
        "{:?}",
        js[0]
    );
    assert_eq!((js[0].started_ns, js[0].ended_ns), (108 * MS, 108 * MS));
    assert_eq!(js[0].legs.len(), 2);
    assert_eq!(js[1].outcome, Outcome::Timeout);
}

/// A capture that stops (or a recording cut short) mid-lookup has not seen
/// it time out: the journey says it was cut off, which silences the rules.
#[test]
fn the_end_of_a_capture_cuts_off_what_had_not_finished() {
    let done = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    let cut = healthy(500 * MS, "10.244.0.10:4001", CLIENT_NS, 8);
    let mut e = Engine::new(Limits::default());
    done.iter().chain(&cut[..3]).for_each(|r| e.push(r));
    let js = e.finish(500 * MS + 1);
    assert_eq!(js.len(), 2);
    assert_eq!(js[0].incomplete, None, "answered before the end");
    assert_eq!(js[1].outcome, Outcome::Timeout);
    assert_eq!(js[1].incomplete, Some(Gap::Ended));
}

#[test]
fn the_same_id_from_two_clients_and_the_same_question_from_two_pods_stay_apart() {
    let mut recs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    recs.extend(healthy(5_000, "10.244.0.11:4000", CLIENT_NS + 1, 7));
    recs.sort_by_key(|r| r.packet.ts_ns);
    let (_, js) = run(&recs, 2_000 * MS);
    assert_eq!(js.len(), 2);
    assert!(js
        .iter()
        .all(|j| j.legs.len() == 8 && matches!(j.outcome, Outcome::Answered { .. })));
    assert_ne!(js[0].client, js[1].client);
}

#[test]
fn a_query_without_answer_times_out() {
    let recs = &healthy(0, "10.244.0.10:4000", CLIENT_NS, 7)[..4];
    let (_, js) = run(recs, 10_000 * MS);
    assert_eq!(js[0].outcome, Outcome::Timeout);
    assert_eq!(js[0].legs.len(), 4);
}

/// A query going round one place without end (a forwarding loop that
/// keeps its id), every lap recorded: one journey, its legs bounded.
#[test]
fn a_query_going_round_keeps_a_bounded_number_of_legs() {
    let lap = |i: u64| {
        let e = ev(
            i * 1_000,
            Hook::DevXmit,
            DNS_NS,
            1,
            "127.0.0.1:5000",
            "127.0.0.53:53",
        );
        rec(&e, msg(9, "loop.example.com.", "A", false), None, None)
    };
    let recs: Vec<Record> = (0..20_000).map(lap).collect();
    let (_, js) = run(&recs, 10_000 * MS);
    assert_eq!(js.len(), 1);
    assert_eq!(js[0].legs.len(), 1024);
    assert_eq!(js[0].outcome, Outcome::Timeout);
}

#[test]
fn a_drop_ends_the_journey_with_the_reason() {
    let mut recs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7)[..2].to_vec();
    let ev = Ev {
        ts: 40_000,
        hook: Hook::Drop,
        netns: NODE_NS,
        ifindex: 7,
        src: "10.244.0.10:4000",
        dst: "10.244.0.53:53",
    };
    recs.push(rec(
        &ev,
        msg(7, "kubernetes.default.svc.cluster.local.", "A", false),
        None,
        Some(Dropped {
            reason: 6,
            location: 0xffff,
        }),
    ));
    let (_, js) = run(&recs, 1_000 * MS);
    assert_eq!(
        js[0].outcome,
        Outcome::Dropped {
            reason: 6,
            location: 0xffff
        }
    );
    // Without conntrack, the change of destination still shows the DNAT.
    assert_eq!(
        js[0].dnat.as_deref(),
        Some(&(addr("10.96.0.10:53"), addr("10.244.0.53:53")))
    );
}

#[test]
fn upstream_queries_of_the_server_are_linked_to_the_client_query() {
    let client = "10.244.0.10:4000";
    let mut recs = healthy(0, client, CLIENT_NS, 7);
    // The server asks upstream with its own id and socket while the client waits.
    let up = |ts, hook, netns, ifindex, src, dst, response, ct| {
        rec(
            &ev(ts, hook, netns, ifindex, src, dst),
            msg(999, "kubernetes.default.svc.cluster.local.", "A", response),
            ct,
            None,
        )
    };
    // The node masquerades the server's query on its way out.
    let masq = Conntrack {
        original: CtTuple {
            src: addr("10.244.0.53:5555"),
            dst: addr("198.51.100.53:53"),
        },
        reply: CtTuple {
            src: addr("198.51.100.53:53"),
            dst: addr("198.51.100.1:5555"),
        },
        status: 1 << 4,
        is_reply: false,
    };
    const UPSTREAM_NS: u32 = 400;
    recs.extend([
        up(
            50_000,
            Hook::DevXmit,
            DNS_NS,
            2,
            "10.244.0.53:5555",
            "198.51.100.53:53",
            false,
            None,
        ),
        up(
            60_000,
            Hook::DevXmit,
            NODE_NS,
            9,
            "198.51.100.1:5555",
            "198.51.100.53:53",
            false,
            Some(masq),
        ),
        // In the upstream's namespace only the masqueraded address is known.
        up(
            61_000,
            Hook::DevReceive,
            UPSTREAM_NS,
            2,
            "198.51.100.1:5555",
            "198.51.100.53:53",
            false,
            None,
        ),
        up(
            140_000,
            Hook::DevXmit,
            UPSTREAM_NS,
            2,
            "198.51.100.53:53",
            "198.51.100.1:5555",
            true,
            None,
        ),
        up(
            150_000,
            Hook::DevReceive,
            NODE_NS,
            9,
            "198.51.100.53:53",
            "198.51.100.1:5555",
            true,
            Some(Conntrack {
                is_reply: true,
                ..masq
            }),
        ),
        up(
            160_000,
            Hook::DevReceive,
            DNS_NS,
            2,
            "198.51.100.53:53",
            "10.244.0.53:5555",
            true,
            None,
        ),
    ]);
    recs.sort_by_key(|r| r.packet.ts_ns);
    let (_, js) = run(&recs, 2_000 * MS);
    assert_eq!(
        js.len(),
        1,
        "the upstream query is not a journey of its own"
    );
    let up = &js[0].upstream;
    assert_eq!(up.len(), 1);
    assert_eq!(up[0].dns_id, 999);
    assert_eq!(up[0].legs.len(), 6);
    assert_eq!(up[0].client, addr("10.244.0.53:5555"));
    assert!(matches!(up[0].outcome, Outcome::Answered { .. }));
}

#[test]
fn a_and_aaaa_from_one_socket_are_siblings_of_one_lookup() {
    let mut recs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    let mut aaaa = healthy(1_000, "10.244.0.10:4000", CLIENT_NS, 8);
    for r in &mut aaaa {
        if let Body::Dns(m) = &mut r.body {
            let q = &mut std::sync::Arc::make_mut(m).questions[0];
            q.qtype = Qtype::AAAA;
        }
    }
    recs.extend(aaaa);
    recs.sort_by_key(|r| r.packet.ts_ns);
    let (_, js) = run(&recs, 2_000 * MS);
    assert_eq!(js.len(), 2);
    assert_eq!(js[0].lookup, js[1].lookup);
    assert_ne!(js[0].id, js[1].id);
}

/// A resolver's one socket with thousands of questions open (an upstream
/// down): each is found by its own index entry, not by the socket's.
#[test]
fn a_question_asked_from_a_busy_socket_is_found_by_its_own_entry() {
    let mut e = Engine::new(Limits::default());
    let client = "10.244.0.10:4000";
    for i in 0..2_000u16 {
        let name = format!("n{i}.example.");
        e.push(&healthy_named(u64::from(i), client, i, &name)[0]);
    }
    let socket = short(e.hasher.hash_one(addr(client)));
    assert_eq!(e.by_client.get(&socket).count(), 2_000);
    let asked = question_key(
        &e.hasher,
        addr(client),
        Qtype::A,
        dns::name_hash("n7.example."),
    );
    assert_eq!(e.by_question.get(&asked).count(), 1);
    assert!(e.asking(addr(client), "n7.example.", Qtype::A));
    assert!(!e.asking(addr(client), "n7.example.", Qtype::AAAA));
    assert!(!e.asking(addr("10.244.0.10:4001"), "n7.example.", Qtype::A));
    // Found through that entry alone, not by the socket's 2,000.
    let slot = e.by_question.get(&asked).next().expect("filed");
    e.by_question.remove(&asked, slot);
    assert!(!e.asking(addr(client), "n7.example.", Qtype::A));
    e.by_question.add(asked, slot);
    let closed = e.finish(10_000 * MS);
    assert_eq!(closed.len(), 2_000);
    assert!(!e.asking(addr(client), "n7.example.", Qtype::A));
    assert!(e.by_question.is_empty());
}

/// Unanswered queries are the many open at once when an upstream is down:
/// each keeps room for the 4 legs a query passes through a DNAT, not for
/// an answer's too; an answered journey grows to hold all 8.
#[test]
fn an_unanswered_query_keeps_room_for_its_own_legs_only() {
    let mut e = Engine::new(Limits::default());
    let legs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    for r in &legs[..4] {
        e.push(r);
    }
    let rooms: Vec<(usize, usize)> = e
        .open
        .iter()
        .map(|(_, o)| (o.legs.len(), o.legs.capacity()))
        .collect();
    assert_eq!(rooms, vec![(4, 4)]);
    for r in &legs[4..] {
        e.push(r);
    }
    let (_, o) = e.open.iter().next().expect("still open until settled");
    assert_eq!(o.legs.len(), 8);
}

#[test]
fn open_journeys_are_capped_and_evictions_counted() {
    let mut e = Engine::new(Limits {
        max_open: 3,
        ..Limits::default()
    });
    for i in 0..10u16 {
        e.push(&healthy(u64::from(i), "10.244.0.10:4000", CLIENT_NS, i)[0]);
    }
    assert_eq!(e.open_count(), 3);
    assert_eq!(e.evicted(), 7);
}

#[test]
fn eviction_takes_the_oldest_open_journey_after_many_closed_and_indexes_empty() {
    let mut e = Engine::new(Limits {
        max_open: 3,
        ..Limits::default()
    });
    let mut done = 0;
    for i in 0..3_000u16 {
        let t0 = u64::from(i) * MS;
        for r in healthy(t0, "10.244.0.10:4000", CLIENT_NS, i) {
            e.push(&r);
        }
        done += e.tick(t0 + 500 * MS).len();
    }
    assert_eq!((done, e.evicted()), (3_000, 0));
    let t0 = 10_000 * MS;
    for i in 0..5u16 {
        e.push(&healthy(t0 + u64::from(i), "10.244.0.10:4000", CLIENT_NS, i)[0]);
    }
    assert_eq!((e.open_count(), e.evicted()), (3, 2));
    let left: Vec<u16> = e.finish(t0).iter().map(|j| j.dns_id).collect();
    assert_eq!(left, vec![2, 3, 4]);
    assert!(
        e.waiting.is_empty()
            && e.tcp_by_name.is_empty()
            && e.by_client.is_empty()
            && e.by_question.is_empty()
            && e.by_key.slots.is_empty()
    );
    assert!(e.order.len() <= 1024 + 5);
}

#[test]
fn a_reply_without_its_query_starts_nothing() {
    let recs = &healthy(0, "10.244.0.10:4000", CLIENT_NS, 7)[5..];
    let (e, js) = run(recs, 10_000 * MS);
    assert!(js.is_empty());
    assert_eq!(e.open_count(), 0);
}

/// One socket may ask two names under one DNS id: an answer, whatever the
/// case of its name, ends the journey of that name only, and an answer to
/// a name never asked ends none.
#[test]
fn two_names_under_one_id_from_one_socket_stay_apart() {
    let (client, service) = ("10.244.0.10:4000", "10.96.0.10:53");
    let ev = |ts, hook, src, dst| Ev {
        ts,
        hook,
        netns: CLIENT_NS,
        ifindex: 2,
        src,
        dst,
    };
    let recs = [
        (ev(0, Hook::DevXmit, client, service), "a.test.", false),
        (ev(10, Hook::DevXmit, client, service), "b.test.", false),
        (ev(MS, Hook::DevReceive, service, client), "B.Test.", true),
        (
            ev(2 * MS, Hook::DevReceive, service, client),
            "c.test.",
            true,
        ),
    ]
    .map(|(e, name, response)| rec(&e, msg(7, name, "A", response), None, None));
    let (e, js) = run(&recs, 10_000 * MS);
    assert_eq!(js.len(), 2);
    let named = |n: &str| js.iter().find(|j| &*j.name == n).unwrap();
    assert_eq!(named("a.test.").outcome, Outcome::Timeout);
    assert_eq!(named("a.test.").legs.len(), 1);
    assert!(matches!(named("b.test.").outcome, Outcome::Answered { .. }));
    assert_eq!(named("b.test.").legs.len(), 2);
    assert_eq!(e.open_count(), 0);
}

#[test]
fn ctnetlink_supplies_the_dnat_when_no_leg_carried_conntrack() {
    // A tc capture on the client's interface only: query out, answer in.
    let recs: Vec<Record> = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7)
        .into_iter()
        .filter(|r| r.packet.netns == CLIENT_NS)
        .collect();
    let mut e = Engine::new(Limits::default());
    e.push(&recs[0]);
    let ct = dnat_ct("10.244.0.10:4000", "10.244.0.54:53");
    e.conntrack(&crate::conntrack::CtEvent {
        kind: crate::conntrack::CtEventKind::New,
        original: ct.original,
        reply: ct.reply,
        proto: 17,
        status: ct.status,
    });
    e.push(&recs[1]);
    let js = e.tick(2_000 * MS);
    assert_eq!(
        js[0].dnat.as_deref(),
        Some(&(addr("10.96.0.10:53"), addr("10.244.0.54:53")))
    );
}

#[test]
fn an_answer_dropped_at_the_client_ends_the_journey_as_dropped() {
    // bridge-nf-call-iptables=0: the answer comes back un-NATed and the
    // client's connected socket does not take it.
    let mut recs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    let ev = Ev {
        ts: 212_000,
        hook: Hook::Drop,
        netns: CLIENT_NS,
        ifindex: 2,
        src: "10.244.0.53:53",
        dst: "10.244.0.10:4000",
    };
    let no_socket = Dropped {
        reason: 3,
        location: 0xbeef,
    };
    recs.push(rec(
        &ev,
        msg(7, "kubernetes.default.svc.cluster.local.", "A", true),
        None,
        Some(no_socket),
    ));
    // Arriving before the answer it follows changes nothing.
    recs.swap(7, 8);
    let (_, js) = run(&recs, 2_000 * MS);
    assert_eq!(
        js[0].outcome,
        Outcome::Dropped {
            reason: 3,
            location: 0xbeef
        }
    );
}

#[test]
fn dns_over_tcp_counts_as_a_retry_even_when_unreadable() {
    let mut e = Engine::new(Limits::default());
    let client: IpAddr = "10.244.0.10".parse().unwrap();
    let name = "big.example.com.";
    assert!(!e.asked_over_tcp(client, name, Qtype::TXT, 0));
    let ev = Ev {
        ts: 5 * MS,
        hook: Hook::DevXmit,
        netns: CLIENT_NS,
        ifindex: 2,
        src: "10.244.0.10:4100",
        dst: "10.96.0.10:53",
    };
    let mut cut = rec(&ev, msg(1, name, "TXT", false), None, None);
    cut.packet.transport = Transport::Tcp {
        seq: 1,
        flags: 0x18,
    };
    cut.body = Body::Malformed {
        reason: "payload cut".into(),
        len: 40,
    };
    e.push(&cut);
    assert!(e.asked_over_tcp(client, name, Qtype::TXT, 4 * MS));
    assert!(
        !e.asked_over_tcp(client, name, Qtype::TXT, 6 * MS),
        "before the answer"
    );
}

#[test]
fn many_journeys_close_in_batches_earliest_first() {
    let mut e = Engine::new(Limits::default());
    let n = CLOSE_BATCH + 5;
    // Pushed latest first, so that start order is not push order.
    for i in 0..n {
        let t0 = (n - i) as u64 * MS;
        e.push(&healthy(t0, "10.244.0.10:4000", CLIENT_NS, i as u16)[0]);
    }
    let starts = |js: Vec<Journey>| js.iter().map(|j| j.started_ns).collect::<Vec<_>>();
    let end = (n + 1) as u64 * MS;
    let first = starts(e.finish(end));
    let rest = starts(e.finish(end));
    assert_eq!((first.len(), rest.len()), (CLOSE_BATCH, 5));
    let all: Vec<u64> = first.into_iter().chain(rest).collect();
    assert!(all.is_sorted(), "closed out of start order");
    assert!(e.finish(end).is_empty() && e.open_count() == 0);
}

/// With most journeys unanswered a tick asks only the settling ones and
/// the oldest; a journey whose first event came late is still found.
#[test]
fn timeouts_are_found_when_few_journeys_settle_even_out_of_order() {
    let mut e = Engine::new(Limits::default());
    let timeout = Limits::default().timeout_ns;
    let late = 50;
    for i in (0..100u16).filter(|&i| i != late).chain([late]) {
        e.push(&healthy(u64::from(i) * MS, "10.244.0.10:4000", CLIENT_NS, i)[0]);
    }
    for r in healthy(10 * MS, "10.244.0.20:4000", CLIENT_NS, 500) {
        e.push(&r);
    }
    let ids = |js: Vec<Journey>| js.iter().map(|j| j.dns_id).collect::<Vec<u16>>();
    assert_eq!(ids(e.tick(400 * MS)), [500]);
    assert_eq!(ids(e.tick(timeout + 60 * MS)), Vec::from_iter(0..=60));
    assert_eq!(ids(e.tick(timeout + 99 * MS)), Vec::from_iter(61..100));
}

#[test]
fn legs_with_the_same_nat_share_one_copy_and_a_drop_keeps_its_own() {
    let client = "10.244.0.10:4000";
    let mut recs = healthy(0, client, CLIENT_NS, 7)[..4].to_vec();
    recs[3].packet.ct = recs[2].packet.ct.clone();
    let mut dropped = recs[3].clone();
    dropped.packet.ts_ns = 40_000;
    dropped.packet.hook = Hook::Drop;
    dropped.packet.drop = Some(Dropped {
        reason: 6,
        location: 0xffff,
    });
    recs.push(dropped);
    let mut e = Engine::new(Limits::default());
    recs.iter().for_each(|r| e.push(r));
    let (_, o) = e.open.iter().next().unwrap();
    let marks: Vec<_> = o.legs.iter().map(|l| l.marks.clone()).collect();
    assert!(marks[..2].iter().all(Option::is_none));
    let (nat, also, drop) = (marks[2].as_ref(), marks[3].as_ref(), marks[4].as_ref());
    assert!(Arc::ptr_eq(nat.unwrap(), also.unwrap()), "one copy");
    assert!(!Arc::ptr_eq(nat.unwrap(), drop.unwrap()));
    let js = e.finish(1_000 * MS);
    let dnat = Some(&(addr("10.96.0.10:53"), addr("10.244.0.53:53")));
    let legs = &js[0].legs;
    assert_eq!(legs[2].dnat.as_deref(), dnat);
    assert_eq!(legs[3].dnat.as_deref(), dnat);
    assert_eq!(
        (legs[3].drop.as_deref(), legs[4].drop.as_deref()),
        (None, Some(&(6, 0xffff)))
    );
    assert_eq!(legs[4].dnat.as_deref(), dnat);
}

#[test]
fn ipv6_legs_keep_their_addresses_each_stored_once() {
    let (client, service, pod) = ("[fd00::10]:4000", "[fd00:96::a]:53", "[fd00::53]:53");
    let name = "kubernetes.default.svc.cluster.local.";
    let recs = [
        (ev(0, Hook::DevXmit, CLIENT_NS, 2, client, service), false),
        (
            ev(10_000, Hook::DevReceive, NODE_NS, 5, client, service),
            false,
        ),
        (ev(30_000, Hook::DevXmit, NODE_NS, 7, client, pod), false),
        (ev(200_000, Hook::DevReceive, NODE_NS, 7, pod, client), true),
    ]
    .map(|(e, response)| rec(&e, msg(7, name, "AAAA", response), None, None));
    let mut e = Engine::new(Limits::default());
    recs.iter().for_each(|r| e.push(r));
    let (_, o) = e.open.iter().next().unwrap();
    assert_eq!(o.v6().len(), 3, "client, service and pod, once each");
    let js = e.finish(1_000 * MS);
    let seen: Vec<_> = js[0].legs.iter().map(|l| (l.src, l.dst)).collect();
    let sent: Vec<_> = recs.iter().map(|r| (r.packet.src, r.packet.dst)).collect();
    assert_eq!(seen, sent);
    assert_eq!(js[0].client, addr(client));
}

#[test]
fn devices_of_pods_long_gone_are_forgotten_and_open_legs_keep_theirs() {
    let mut e = Engine::new(Limits {
        timeout_ns: 36_000_000 * MS,
        ..Limits::default()
    });
    let named = |mut r: Record, name: &str| {
        r.packet.ifname = Some(name.into());
        r
    };
    let waiting = healthy(30_000 * MS, "10.244.0.10:4000", CLIENT_NS, 7);
    // A pod a lookup, answered: its devices are new, and soon unused.
    let pods = 3 * DEVICES_LIMIT as u32;
    for i in 0..pods {
        let t0 = u64::from(i) * 300 * MS;
        if i == 100 {
            e.push(&named(waiting[0].clone(), "eth0"));
        }
        for r in healthy(t0 + MS, "10.244.1.10:5000", 1_000 + i, i as u16) {
            e.push(&named(r, &format!("veth{i}")));
        }
        e.tick(t0 + 250 * MS);
    }
    assert_eq!(e.open_count(), 1, "the waiting journey");
    assert!(
        e.devices.list.len() <= DEVICES_LIMIT,
        "{}",
        e.devices.list.len()
    );
    e.push(&named(waiting[1].clone(), "veth-node"));
    let js = e.finish(u64::from(pods) * 300 * MS);
    let j = js.iter().find(|j| j.dns_id == 7).unwrap();
    let at: Vec<_> = j
        .legs
        .iter()
        .map(|l| (l.iface.as_deref(), l.netns, l.ifindex))
        .collect();
    assert_eq!(
        at,
        [
            (Some("eth0"), CLIENT_NS, 2),
            (Some("veth-node"), NODE_NS, 5)
        ]
    );
}

/// The largest room a map has had while `n` entries come and go, oldest
/// out, new in, after it first held `n`: (room then, largest room since).
fn room_under_turnover(
    n: u64,
    mut insert: impl FnMut(u64),
    mut remove: impl FnMut(u64),
    room: impl Fn() -> usize,
) -> (usize, usize) {
    (0..n).for_each(&mut insert);
    let ramped = room();
    let mut most = ramped;
    for k in n..20 * n {
        remove(k - n);
        insert(k);
        most = most.max(room());
    }
    (ramped, most)
}

/// std's map, past half full, doubles once deleted slots use up its room
/// (the soak's step, minutes into a steady load); a `Table` does not.
#[test]
fn a_table_under_steady_turnover_never_grows() {
    let map = std::cell::RefCell::new(Map::<u64, u64>::default());
    let (ramped, most) = room_under_turnover(
        10_000,
        |k| {
            map.borrow_mut().insert(k, k);
        },
        |k| {
            map.borrow_mut().remove(&k);
        },
        || map.borrow().capacity(),
    );
    assert!(
        most > ramped,
        "std's map did not grow: the test shows nothing"
    );
    let table = std::cell::RefCell::new(Table::<u64, u64>::new());
    let (ramped, most) = room_under_turnover(
        10_000,
        |k| {
            table.borrow_mut().insert(k, k);
        },
        |k| {
            table.borrow_mut().remove(&k);
        },
        || table.borrow().capacity(),
    );
    assert_eq!(most, ramped);
}

/// Lookups expire a timeout after their latest query: a table of them is
/// pruned before it grows, so it keeps to a few times what is live (it
/// doubled past its pruning point and held 4.5 times the in-flight load).
#[test]
fn a_table_of_expiring_entries_prunes_before_it_grows() {
    let live = 1_000;
    let mut table = Table::<u64, u64>::new();
    let mut most = 0;
    for k in 0..100 * live {
        table.make_room_pruning(|m| m.retain(|_, made| k - *made < live));
        table.insert(k, k);
        most = most.max(table.capacity());
    }
    assert!(table.len() <= 2 * live as usize, "{}", table.len());
    assert!(most <= 4 * live as usize, "grew to {most}");
}

/// `ByKey` slots hash the name as its lowercase: a name asked in one case
/// and answered in another lands in one slot, however long; the decoded
/// question carries the same hash as its name.
#[test]
fn names_in_any_case_hash_alike() {
    let long = "a-rather-long-label-of-sixty-three-characters-to-pass-one-chunk.Example.COM.";
    assert!(long.len() > 64);
    for name in ["WWW.Example.COM.", long] {
        let lower = name.to_ascii_lowercase();
        assert_eq!(dns::name_hash(name), dns::name_hash(&lower));
        assert_ne!(dns::name_hash(name), dns::name_hash("other."));
        let q = dns::Question::new(name.into(), Qtype::A, "IN");
        assert_eq!(q.name_hash, dns::name_hash(&lower));
    }
}

/// A journey's slot goes to the next one: a child whose parent was evicted
/// must not take the stranger in that slot for it, and wait on it.
#[test]
fn a_slot_reused_is_not_the_journey_that_held_it() {
    let name = "kubernetes.default.svc.cluster.local.";
    let up = |ts, src, dst, response| {
        let e = ev(ts, Hook::DevXmit, DNS_NS, 2, src, dst);
        rec(&e, msg(999, name, "A", response), None, None)
    };
    let mut e = Engine::new(Limits {
        max_open: 2,
        ..Limits::default()
    });
    // The client's query reaches CoreDNS, which asks upstream.
    for r in &healthy(0, "10.244.0.10:4000", CLIENT_NS, 7)[..4] {
        e.push(r);
    }
    e.push(&up(50_000, "10.244.0.53:5555", "198.51.100.53:53", false));
    // A third journey evicts the client's and takes its slot.
    let other = ev(
        60_000,
        Hook::DevXmit,
        CLIENT_NS,
        2,
        "10.244.0.11:4000",
        "10.96.0.10:53",
    );
    e.push(&rec(&other, msg(8, "other.test.", "A", false), None, None));
    assert_eq!(e.evicted(), 1);
    // The upstream answer comes back; the child is finished on its own.
    let mut back = up(140_000, "198.51.100.53:53", "10.244.0.53:5555", true);
    back.packet.hook = Hook::DevReceive;
    e.push(&back);
    let js = e.tick(400 * MS);
    let ids: Vec<u16> = js.iter().map(|j| j.dns_id).collect();
    assert_eq!(ids, [999]);
}

/// Events were lost while a query crossed the node, and its first legs
/// were read only after the loss was noticed. The journey closes a minute
/// later, as when the pipeline has fallen far behind or drains a backlog at
/// the end: it still overlaps the loss, and is marked, not shown as a
/// query that got no answer.
#[test]
fn a_journey_closed_long_after_a_loss_it_overlaps_is_marked() {
    let legs = healthy(MS, "10.244.0.10:40000", CLIENT_NS, 7);
    let mut e = Engine::new(Limits::default());
    e.lost(0, 5 * MS);
    legs[..2].iter().for_each(|r| e.push(r));
    let out = e.tick(60_000 * MS);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].incomplete, Some(Gap::Lost));
}

/// Windows no journey can reach any more are forgotten, and past the limit
/// the oldest are merged rather than dropped.
#[test]
fn loss_windows_are_forgotten_only_when_out_of_reach() {
    let mut e = Engine::new(Limits::default());
    e.lost(0, MS);
    healthy(100 * MS, "10.244.0.10:40000", CLIENT_NS, 7)
        .iter()
        .for_each(|r| e.push(r));
    assert_eq!(e.tick(1000 * MS).len(), 1);
    assert!(e.losses.is_empty(), "ended before any journey to come");
    for n in 0..(MAX_LOSSES as u64 + 10) {
        e.lost(2000 * MS + n * MS, 2000 * MS + n * MS + 1);
    }
    assert_eq!(e.losses.len(), MAX_LOSSES);
    assert_eq!(e.losses.front().map(|w| w.0), Some(2000 * MS));
}

/// `healthy`'s legs asking for `name`, with the bytes the kernel's sampling
/// level hashes (a header, then the name).
fn healthy_named(t0: u64, client: &'static str, id: u16, name: &str) -> Vec<Record> {
    let mut wire = vec![0u8; 12];
    for label in name.trim_end_matches('.').split('.') {
        wire.push(label.len() as u8);
        wire.extend_from_slice(label.as_bytes());
    }
    wire.push(0);
    healthy(t0, client, CLIENT_NS, id)
        .into_iter()
        .map(|mut r| {
            let Body::Dns(m) = &r.body else {
                unreachable!("healthy legs are DNS")
            };
            let mut m = (**m).clone();
            let q = &m.questions[0];
            m.questions[0] = dns::Question::new(name.into(), q.qtype, q.class);
            r.body = Body::Dns(m.into());
            r.packet.payload = Bytes::from(wire.clone());
            r
        })
        .collect()
}

/// A name whose lookup `level` keeps, or leaves out.
fn name_kept_by(level: SampleLevel, kept: bool) -> String {
    (0..)
        .map(|n| format!("host{n}.test."))
        .find(|name| {
            let first = name.split('.').next().unwrap();
            let mut wire = vec![0u8; 12];
            wire.push(first.len() as u8);
            wire.extend_from_slice(first.as_bytes());
            level.keeps(sample::message_label_hash(&wire)) == kept
        })
        .unwrap()
}

/// The level rose to 1 in 2 while two lookups waited for their answers.
/// The kernel then left out the answers of the one the new level does not
/// keep: that journey is left out whole (and counted), never shown
/// unanswered; the other is shown whole, marked with the level.
#[test]
fn a_rise_leaves_out_whole_the_journeys_it_may_have_cut() {
    let level = SampleLevel { shift: 1, seed: 5 };
    let (kept, cut) = (name_kept_by(level, true), name_kept_by(level, false));
    let kept_legs = healthy_named(0, "10.244.0.10:40001", 1, &kept);
    let cut_legs = healthy_named(0, "10.244.0.10:40002", 2, &cut);
    let mut e = Engine::new(Limits::default());
    for r in kept_legs[..4].iter().chain(&cut_legs[..4]) {
        e.push(r);
    }
    e.sampling(SampleChange {
        since_ns: 100_000,
        now_ns: 110_000,
        level,
        budget: false,
        node: Default::default(),
        viewed: Default::default(),
    });
    for r in &kept_legs[4..] {
        e.push(r);
    }
    // Past the other's timeout too.
    let mut out = e.tick(2000 * MS);
    out.extend(e.tick(7000 * MS));
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(&*out[0].name, kept);
    assert_eq!(out[0].legs.len(), 8);
    assert!(matches!(out[0].outcome, Outcome::Answered { .. }));
    assert_eq!(out[0].sampled, level);
    assert_eq!((e.shed(), e.sampling_level()), (1, level));
}

/// Lookups wholly before any change, or wholly under one level, are shown
/// as they are: nothing is left out for a level that did not touch them.
#[test]
fn journeys_under_one_level_are_all_shown() {
    let level = SampleLevel { shift: 1, seed: 5 };
    let before = healthy_named(0, "10.244.0.10:40001", 1, &name_kept_by(level, false));
    let mut e = Engine::new(Limits::default());
    before.iter().for_each(|r| e.push(r));
    let out = e.tick(1000 * MS);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].sampled.shift, 0);
    e.sampling(SampleChange {
        since_ns: 2000 * MS,
        now_ns: 2000 * MS,
        level,
        budget: false,
        node: Default::default(),
        viewed: Default::default(),
    });
    let after = healthy_named(
        3000 * MS,
        "10.244.0.10:40003",
        3,
        &name_kept_by(level, true),
    );
    after.iter().for_each(|r| e.push(r));
    let out = e.tick(4000 * MS);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].sampled, level);
    assert_eq!(e.shed(), 0);
}

/// A TCP segment without a message: `flags` as on the wire.
fn seg(e: &Ev, seq: u32, flags: u8, len: u32, ct: Option<Conntrack>) -> Packet {
    let mut p = rec(e, msg(0, "x.", "A", false), ct, None).packet;
    p.transport = Transport::Tcp { seq, flags };
    p.payload_len = len;
    p
}

fn tcp(mut r: Record, seq: u32) -> Record {
    r.packet.transport = Transport::Tcp { seq, flags: 0x18 };
    r
}

const SYN: u8 = 0x02;
const SYN_ACK: u8 = 0x12;
const ACK: u8 = 0x10;
const FIN_ACK: u8 = 0x11;
const RST: u8 = 0x04;

#[test]
fn a_tcp_journey_shows_its_connection_set_up_retransmission_and_end() {
    let (client, svc) = ("10.244.0.10:4200", "10.96.0.10:53");
    let out = ev(0, Hook::DevXmit, CLIENT_NS, 2, client, svc);
    let node = ev(0, Hook::DevReceive, NODE_NS, 4, client, svc);
    let back = ev(0, Hook::DevReceive, CLIENT_NS, 2, svc, client);
    let at = |e: &Ev, ts: u64| Ev { ts, ..*e };
    let mut e = Engine::new(Limits::default());
    e.segment(&seg(&at(&out, 0), 100, SYN, 0, None));
    e.segment(&seg(&at(&node, MS / 100), 100, SYN, 0, None));
    e.segment(&seg(&at(&back, MS / 10), 900, SYN_ACK, 0, None));
    let query = tcp(
        rec(&at(&out, MS), msg(7, "a.example.", "A", false), None, None),
        101,
    );
    e.segment(&query.packet);
    e.push(&query);
    // The same data again from the client, and again past it (not counted).
    let again = tcp(
        rec(
            &at(&out, 2 * MS),
            msg(7, "a.example.", "A", false),
            None,
            None,
        ),
        101,
    );
    let mut again_seg = again.packet.clone();
    again_seg.payload_len = 30;
    let mut first_seg = query.packet.clone();
    first_seg.payload_len = 30;
    e.segment(&first_seg);
    e.segment(&again_seg);
    e.segment(&seg(&at(&node, 2 * MS), 101, ACK, 30, None));
    let answer = tcp(
        rec(
            &at(&back, 3 * MS),
            msg(7, "a.example.", "A", true),
            None,
            None,
        ),
        901,
    );
    e.segment(&answer.packet);
    e.push(&answer);
    e.segment(&seg(&at(&out, 4 * MS), 131, FIN_ACK, 0, None));
    let js = e.tick(1_000 * MS);
    assert_eq!(js.len(), 1);
    let c = js[0]
        .connection
        .as_deref()
        .expect("a TCP journey has its connection");
    assert_eq!((c.client, c.server), (addr(client), addr(svc)));
    assert_eq!(c.syns, 1, "the SYN seen again on the node is the same SYN");
    assert_eq!(c.syn_ack_ns, Some(MS / 10));
    assert_eq!(c.fin_ns, Some(4 * MS));
    assert_eq!(c.retransmits, 1);
    assert_eq!(c.reset, None);
}

/// A gap in the server's stream toward a socket: its queries still
/// waiting lost nothing anyone saw, so they are not timeouts; the answered
/// one, another socket's, and one asked after the gap are whole.
#[test]
fn a_gap_toward_a_tcp_socket_leaves_its_waiting_journeys_unseen() {
    let (client, other, svc) = ("10.244.0.1:4200", "10.244.0.1:4201", "10.244.0.53:53");
    let mut e = Engine::new(Limits::default());
    let ask = |e: &mut Engine, ts: u64, from: &'static str, id: u16| {
        let at = ev(ts, Hook::DevXmit, NODE_NS, 4, from, svc);
        e.push(&tcp(
            rec(&at, msg(id, "a.example.", "A", false), None, None),
            1,
        ));
    };
    ask(&mut e, 0, client, 1);
    ask(&mut e, MS, client, 2);
    ask(&mut e, MS, other, 3);
    let back = ev(2 * MS, Hook::DevReceive, NODE_NS, 4, svc, client);
    e.push(&tcp(
        rec(&back, msg(1, "a.example.", "A", true), None, None),
        1,
    ));
    let mut gap = tcp(rec(&back, msg(0, "x.", "A", true), None, None), 50);
    gap.body = Body::Gap {
        reason: "14 bytes missed".into(),
    };
    e.push(&gap);
    ask(&mut e, 3 * MS, client, 4);
    let js = e.finish(10_000 * MS);
    let gaps: Vec<(u16, Option<Gap>)> = js.iter().map(|j| (j.dns_id, j.incomplete)).collect();
    assert_eq!(
        gaps,
        [(1, None), (2, Some(Gap::Missed)), (3, None), (4, None)]
    );
}

#[test]
fn a_tcp_retry_after_a_truncated_answer_is_the_same_lookup() {
    let name = "big.example.com.";
    let (udp, svc) = ("10.244.0.10:4300", "10.96.0.10:53");
    let mut e = Engine::new(Limits::default());
    e.push(&rec(
        &ev(0, Hook::DevXmit, CLIENT_NS, 2, udp, svc),
        msg(1, name, "TXT", false),
        None,
        None,
    ));
    let mut tc = msg(1, name, "TXT", true);
    tc.flags.tc = true;
    e.push(&rec(
        &ev(MS, Hook::DevReceive, CLIENT_NS, 2, svc, udp),
        tc,
        None,
        None,
    ));
    let other = ev(2 * MS, Hook::DevXmit, CLIENT_NS, 2, "10.244.0.11:4300", svc);
    e.push(&tcp(rec(&other, msg(2, name, "TXT", false), None, None), 1));
    let retry = ev(2 * MS, Hook::DevXmit, CLIENT_NS, 2, "10.244.0.10:4301", svc);
    e.push(&tcp(rec(&retry, msg(2, name, "TXT", false), None, None), 1));
    let js = e.finish(10 * MS);
    let lookup = |port: u16, ip: &str| {
        js.iter()
            .find(|j| j.client == SocketAddr::new(ip.parse().unwrap(), port))
            .map(|j| j.lookup)
            .unwrap()
    };
    assert_eq!(lookup(4301, "10.244.0.10"), lookup(4300, "10.244.0.10"));
    assert_ne!(
        lookup(4300, "10.244.0.11"),
        lookup(4300, "10.244.0.10"),
        "another client's TCP query is its own lookup"
    );
}

/// A socket-level balancer picks a backend per socket: the TCP retry may
/// go to another one, from a TCP port equal to the UDP socket's. Its legs
/// are its own journey's, never the UDP query's answers.
#[test]
fn a_tcp_retry_from_the_udp_sockets_port_is_a_journey_of_its_own() {
    let name = "many.example.com.";
    let (client, a, b) = ("10.244.0.11:47102", "10.244.0.53:53", "10.244.0.54:53");
    let mut e = Engine::new(Limits::default());
    e.push(&rec(
        &ev(0, Hook::DevXmit, CLIENT_NS, 2, client, a),
        msg(7, name, "A", false),
        None,
        None,
    ));
    let mut tc = msg(7, name, "A", true);
    tc.flags.tc = true;
    e.push(&rec(
        &ev(MS, Hook::DevReceive, CLIENT_NS, 2, a, client),
        tc,
        None,
        None,
    ));
    let retry = ev(2 * MS, Hook::DevXmit, CLIENT_NS, 2, client, b);
    e.push(&tcp(rec(&retry, msg(7, name, "A", false), None, None), 1));
    let answer = ev(3 * MS, Hook::DevReceive, CLIENT_NS, 2, b, client);
    e.push(&tcp(rec(&answer, msg(7, name, "A", true), None, None), 1));
    let js = e.finish(10 * MS);
    assert_eq!(js.len(), 2, "{js:#?}");
    let udp = js.iter().find(|j| !j.tcp).unwrap();
    let over_tcp = js.iter().find(|j| j.tcp).unwrap();
    assert!(udp
        .legs
        .iter()
        .all(|l| l.src == addr(a) || l.dst == addr(a)));
    assert_eq!(over_tcp.legs.len(), 2);
    assert_eq!(over_tcp.lookup, udp.lookup, "the retry is the same lookup");
}

#[test]
fn a_syn_never_answered_fails_after_the_timeout_counted_once_past_a_snat() {
    let (client, svc, masq) = ("10.244.0.10:4400", "10.96.0.10:53", "198.51.100.1:40000");
    let snat = Conntrack {
        original: CtTuple {
            src: addr(client),
            dst: addr(svc),
        },
        reply: CtTuple {
            src: addr(svc),
            dst: addr(masq),
        },
        status: 1 << 4,
        is_reply: false,
    };
    let mut e = Engine::new(Limits::default());
    for (ts, sent) in [(0, true), (1_000 * MS, true), (1_000 * MS + 1, false)] {
        e.segment(&seg(
            &ev(ts, Hook::DevXmit, CLIENT_NS, 2, client, svc),
            5,
            SYN,
            0,
            None,
        ));
        if sent {
            e.segment(&seg(
                &ev(ts + 1, Hook::DevXmit, NODE_NS, 9, masq, svc),
                5,
                SYN,
                0,
                Some(snat),
            ));
            e.segment(&seg(
                &ev(ts + 2, Hook::DevReceive, 400, 2, masq, svc),
                5,
                SYN,
                0,
                None,
            ));
        }
    }
    e.tick(5_000 * MS);
    assert!(
        e.failed_connections().is_empty(),
        "not yet: the client may still get through"
    );
    e.tick(6_000 * MS);
    let failed = e.failed_connections();
    assert_eq!(
        failed.len(),
        1,
        "one connection, whatever its source past the SNAT"
    );
    assert_eq!(failed[0].client, addr(client));
    assert_eq!(failed[0].syns, 3);
    assert!(e.failed_connections().is_empty(), "each is said once");
}

/// A node process (NodeLocalDNS) to a service, masqueraded to another
/// port, its SYN-ACK seen only where it enters the node from a routed pod:
/// before conntrack, so addressed to the masqueraded port.
#[test]
fn a_syn_ack_to_the_masqueraded_port_without_conntrack_sets_the_connection_up() {
    let (client, svc) = ("198.51.100.1:4700", "10.96.0.11:53");
    let (endpoint, masq) = ("10.244.0.53:53", "198.51.100.1:17961");
    let nat = Conntrack {
        original: CtTuple {
            src: addr(client),
            dst: addr(svc),
        },
        reply: CtTuple {
            src: addr(endpoint),
            dst: addr(masq),
        },
        status: 0,
        is_reply: false,
    };
    let mut e = Engine::new(Limits::default());
    let syn = ev(0, Hook::DevXmit, NODE_NS, 5, masq, endpoint);
    e.segment(&seg(&syn, 5, SYN, 0, Some(nat)));
    let back = ev(MS, Hook::DevReceive, NODE_NS, 5, endpoint, masq);
    e.segment(&seg(&back, 9, SYN_ACK, 0, None));
    e.tick(10_000 * MS);
    assert!(e.failed_connections().is_empty());
}

#[test]
fn a_reset_syn_fails_at_once_and_a_new_syn_from_the_port_starts_again() {
    let (client, svc) = ("10.244.0.10:4500", "10.96.0.10:53");
    let mut e = Engine::new(Limits::default());
    e.segment(&seg(
        &ev(0, Hook::DevXmit, CLIENT_NS, 2, client, svc),
        5,
        SYN,
        0,
        None,
    ));
    e.segment(&seg(
        &ev(MS, Hook::DevReceive, CLIENT_NS, 2, svc, client),
        0,
        RST | ACK,
        0,
        None,
    ));
    e.tick(2 * MS);
    let failed = e.failed_connections();
    assert_eq!(failed.len(), 1);
    assert!(failed[0]
        .reset
        .is_some_and(|r| r.to_client && r.ts_ns == MS));
    e.segment(&seg(
        &ev(3 * MS, Hook::DevXmit, CLIENT_NS, 2, client, svc),
        77,
        SYN,
        0,
        None,
    ));
    e.segment(&seg(
        &ev(4 * MS, Hook::DevReceive, CLIENT_NS, 2, svc, client),
        9,
        SYN_ACK,
        0,
        None,
    ));
    e.tick(10_000 * MS);
    assert!(e.failed_connections().is_empty(), "the second was set up");
}

/// A query and, at the client, its answer in fragments: `answer` is the
/// record of what the client's hook made of it.
fn fragmented(answer: impl FnOnce(&Ev) -> Vec<Record>) -> Journey {
    let (client, svc) = ("10.244.0.10:4600", "10.96.0.10:53");
    let mut e = Engine::new(Limits::default());
    e.push(&rec(
        &ev(0, Hook::DevXmit, CLIENT_NS, 2, client, svc),
        msg(5, "huge.example.", "TXT", false),
        None,
        None,
    ));
    for r in answer(&ev(MS, Hook::DevReceive, CLIENT_NS, 2, svc, client)) {
        e.push(&r);
    }
    let mut js = e.finish(10_000 * MS);
    assert_eq!(js.len(), 1);
    js.remove(0)
}

#[test]
fn an_answer_without_a_fragment_is_never_the_answer() {
    let j = fragmented(|at| {
        let mut r = rec(at, msg(5, "huge.example.", "TXT", true), None, None);
        r.body = Body::Cut(Arc::new(msg(5, "huge.example.", "TXT", true)));
        r.packet.frag = Some(Fragment {
            id: 9,
            offset: 0,
            more: true,
        });
        r.missing = Some(Box::new(crate::decode::Missing {
            offset: 1480,
            last_seen: None,
        }));
        vec![r]
    });
    assert_eq!(
        j.outcome,
        Outcome::Timeout,
        "it never reached the application whole"
    );
    let note = j.legs[1]
        .fragment
        .as_deref()
        .expect("the leg says what it lacked");
    assert_eq!((note.offset, note.missing), (1480, true));
    assert_eq!(
        note.describe(),
        "without its fragment at offset 1480, never seen"
    );
}

#[test]
fn a_later_fragment_dropped_ends_the_journey_as_dropped_there() {
    let j = fragmented(|at| {
        let drop = Ev {
            hook: Hook::Drop,
            netns: NODE_NS,
            ..*at
        };
        let mut r = rec(
            &drop,
            msg(5, "huge.example.", "TXT", true),
            None,
            Some(Dropped {
                reason: 12,
                location: 0x10,
            }),
        );
        r.body = Body::Cut(Arc::new(msg(5, "huge.example.", "TXT", true)));
        r.packet.frag = Some(Fragment {
            id: 9,
            offset: 2960,
            more: false,
        });
        vec![r]
    });
    assert_eq!(
        j.outcome,
        Outcome::Dropped {
            reason: 12,
            location: 0x10
        }
    );
    let l = &j.legs[1];
    assert_eq!(
        l.fragment.as_deref().map(|f| (f.offset, f.missing)),
        Some((2960, false))
    );
}

const UPSTREAM: &str = "198.51.100.53:53";
const POD2_NS: u32 = 101;

/// A resolver's upstream query (`id`, from `from`) sent from `netns`, and
/// its answer back there 100 µs later.
fn upstream(ts: u64, netns: u32, from: &'static str, id: u16, qtype: &'static str) -> [Record; 2] {
    let name = "kubernetes.default.svc.cluster.local.";
    let out = ev(ts, Hook::DevXmit, netns, 9, from, UPSTREAM);
    let back = ev(ts + 100_000, Hook::DevReceive, netns, 9, UPSTREAM, from);
    [
        rec(&out, msg(id, name, qtype, false), None, None),
        rec(&back, msg(id, name, qtype, true), None, None),
    ]
}

/// `healthy`'s legs asking for the AAAA record.
fn healthy_aaaa(t0: u64, client: &'static str, id: u16) -> Vec<Record> {
    healthy(t0, client, CLIENT_NS, id)
        .into_iter()
        .map(|mut r| {
            let Body::Dns(m) = &r.body else {
                unreachable!("healthy legs are DNS")
            };
            let mut m = (**m).clone();
            m.questions[0].qtype = Qtype::AAAA;
            r.body = Body::Dns(m.into());
            r
        })
        .collect()
}

fn sorted(mut recs: Vec<Record>) -> Vec<Record> {
    recs.sort_by_key(|r| r.packet.ts_ns);
    recs
}

/// Each top-level journey's client and type, with its upstream queries' DNS ids.
fn upstream_ids(js: &[Journey]) -> Vec<(SocketAddr, Qtype, Vec<u16>)> {
    let mut v: Vec<_> = js
        .iter()
        .map(|j| {
            (
                j.client,
                j.qtype,
                j.upstream.iter().map(|u| u.dns_id).collect(),
            )
        })
        .collect();
    v.sort_by_key(|(c, q, _)| (*c, q.0));
    v
}

/// CoreDNS's forward plugin does not coalesce: two clients asking one name
/// at once each cause an upstream query, sent in their arrival order.
#[test]
fn clients_asking_one_name_at_once_each_get_the_upstream_query_sent_for_them() {
    let mut recs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    recs.extend(healthy(5_000, "10.244.0.11:4001", POD2_NS, 8));
    recs.extend(upstream(50_000, DNS_NS, "10.244.0.53:5555", 901, "A"));
    recs.extend(upstream(55_000, DNS_NS, "10.244.0.53:5556", 902, "A"));
    let (_, js) = run(&sorted(recs), 2_000 * MS);
    assert_eq!(
        upstream_ids(&js),
        [
            (addr("10.244.0.10:4000"), Qtype::A, vec![901]),
            (addr("10.244.0.11:4001"), Qtype::A, vec![902]),
        ]
    );
}

/// Once every waiting journey has its upstream query, another (a retry)
/// goes to the oldest.
#[test]
fn an_upstream_retry_goes_to_the_oldest_waiting_journey() {
    let mut recs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    recs.extend(healthy(5_000, "10.244.0.11:4001", POD2_NS, 8));
    recs.extend(upstream(40_000, DNS_NS, "10.244.0.53:5555", 901, "A"));
    recs.extend(upstream(45_000, DNS_NS, "10.244.0.53:5556", 902, "A"));
    recs.extend(upstream(50_000, DNS_NS, "10.244.0.53:5557", 903, "A"));
    let (_, js) = run(&sorted(recs), 2_000 * MS);
    assert_eq!(
        upstream_ids(&js),
        [
            (addr("10.244.0.10:4000"), Qtype::A, vec![901, 903]),
            (addr("10.244.0.11:4001"), Qtype::A, vec![902]),
        ]
    );
}

/// A and AAAA asked at once: each upstream query serves its own type,
/// whichever the resolver sends first.
#[test]
fn an_upstream_query_serves_the_journey_of_its_own_type() {
    let mut recs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    recs.extend(healthy_aaaa(1_000, "10.244.0.10:4000", 8));
    recs.extend(upstream(50_000, DNS_NS, "10.244.0.53:5556", 902, "AAAA"));
    recs.extend(upstream(55_000, DNS_NS, "10.244.0.53:5555", 901, "A"));
    let (_, js) = run(&sorted(recs), 2_000 * MS);
    assert_eq!(
        upstream_ids(&js),
        [
            (addr("10.244.0.10:4000"), Qtype::A, vec![901]),
            (addr("10.244.0.10:4000"), Qtype::AAAA, vec![902]),
        ]
    );
}

/// A DNS header answering `id` with `rcode` and no question (QDCOUNT 0),
/// decoded as the pipeline decodes it.
fn no_question_answer(id: u16, rcode: u8) -> Body {
    let [hi, lo] = id.to_be_bytes();
    crate::decode::parse(&[hi, lo, 0x81, 0x80 | rcode, 0, 0, 0, 0, 0, 0, 0, 0])
}

/// Some FORMERR and REFUSED answers carry no question: such an answer still
/// ends its journey, found by client socket and DNS id where it is seen.
#[test]
fn an_answer_without_a_question_ends_its_journey_with_its_rcode() {
    let recs: Vec<Record> = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7)
        .into_iter()
        .map(|mut r| {
            if r.packet.src.port() == 53 {
                r.body = no_question_answer(7, 5);
            }
            r
        })
        .collect();
    let (e, js) = run(&recs, 2_000 * MS);
    assert_eq!(js.len(), 1);
    let j = &js[0];
    assert_eq!(j.legs.len(), 8, "every answer leg joins it");
    assert!(
        matches!(&j.outcome, Outcome::Answered { rcode, answers, .. } if *rcode == Rcode::REFUSED && answers.is_empty()),
        "{:?}",
        j.outcome
    );
    assert_eq!(e.open_count(), 0);
}

/// One under another id, or from elsewhere than the query went, answers
/// nothing.
#[test]
fn an_answer_without_a_question_joins_only_its_own_journey() {
    let mut recs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    recs.truncate(4);
    let mut other_id = rec(
        &ev(
            100_000,
            Hook::DevReceive,
            CLIENT_NS,
            2,
            "10.96.0.10:53",
            "10.244.0.10:4000",
        ),
        msg(7, "x.", "A", true),
        None,
        None,
    );
    other_id.body = no_question_answer(8, 5);
    let mut elsewhere = rec(
        &ev(
            110_000,
            Hook::DevReceive,
            CLIENT_NS,
            2,
            "10.96.0.99:53",
            "10.244.0.10:4000",
        ),
        msg(7, "x.", "A", true),
        None,
        None,
    );
    elsewhere.body = no_question_answer(7, 5);
    recs.extend([other_id, elsewhere]);
    let (_, js) = run(&recs, 10_000 * MS);
    assert_eq!(js.len(), 1);
    assert_eq!(js[0].legs.len(), 4);
    assert_eq!(js[0].outcome, Outcome::Timeout);
}

/// A hostNetwork client asks a resolver in the node's namespace (over lo);
/// the resolver's own query, sent from that namespace, serves it.
#[test]
fn a_local_resolvers_upstream_query_serves_a_host_network_client() {
    let name = "kubernetes.default.svc.cluster.local.";
    let (client, resolver) = ("169.254.20.10:40000", "169.254.20.10:53");
    let lo = |ts, hook, src, dst, response| {
        rec(
            &ev(ts, hook, NODE_NS, 1, src, dst),
            msg(7, name, "A", response),
            None,
            None,
        )
    };
    let mut recs = vec![
        lo(0, Hook::DevXmit, client, resolver, false),
        lo(2_000, Hook::DevReceive, client, resolver, false),
        lo(300_000, Hook::DevXmit, resolver, client, true),
        lo(302_000, Hook::DevReceive, resolver, client, true),
    ];
    recs.extend(upstream(50_000, NODE_NS, "198.51.100.1:5555", 901, "A"));
    let (_, js) = run(&sorted(recs), 2_000 * MS);
    assert_eq!(upstream_ids(&js), [(addr(client), Qtype::A, vec![901])]);
}

/// NodeLocalDNS on the node serves a pod; a hostNetwork client asking it
/// the same name at once is a journey of its own, not NodeLocalDNS's
/// upstream query, which goes to the pod's journey.
#[test]
fn a_host_network_clients_query_is_not_a_resolvers_upstream_query() {
    let name = "kubernetes.default.svc.cluster.local.";
    let (pod, host, resolver) = (
        "10.244.0.10:4000",
        "169.254.20.10:40000",
        "169.254.20.10:53",
    );
    let at = |ts, hook, netns, ifindex, src, dst, id, response| {
        let e = ev(ts, hook, netns, ifindex, src, dst);
        rec(&e, msg(id, name, "A", response), None, None)
    };
    let mut recs = vec![
        at(0, Hook::DevXmit, CLIENT_NS, 2, pod, resolver, 7, false),
        at(3_000, Hook::DevReceive, NODE_NS, 5, pod, resolver, 7, false),
        at(10_000, Hook::DevXmit, NODE_NS, 1, host, resolver, 8, false),
        at(
            12_000,
            Hook::DevReceive,
            NODE_NS,
            1,
            host,
            resolver,
            8,
            false,
        ),
        at(300_000, Hook::DevXmit, NODE_NS, 5, resolver, pod, 7, true),
        at(
            303_000,
            Hook::DevReceive,
            CLIENT_NS,
            2,
            resolver,
            pod,
            7,
            true,
        ),
        at(310_000, Hook::DevXmit, NODE_NS, 1, resolver, host, 8, true),
        at(
            312_000,
            Hook::DevReceive,
            NODE_NS,
            1,
            resolver,
            host,
            8,
            true,
        ),
    ];
    recs.extend(upstream(50_000, NODE_NS, "198.51.100.1:5555", 901, "A"));
    let (_, js) = run(&sorted(recs), 2_000 * MS);
    assert_eq!(
        upstream_ids(&js),
        [
            (addr(pod), Qtype::A, vec![901]),
            (addr(host), Qtype::A, vec![]),
        ]
    );
}

/// A resolver that forwards to its own pod address, asked through the
/// service: its query to the address the client's was translated to is
/// its upstream query (a loop), not another client's.
#[test]
fn a_resolver_asking_its_own_address_behind_the_service_is_its_upstream_query() {
    let name = "kubernetes.default.svc.cluster.local.";
    let mut recs = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    let (from, to) = ("10.244.0.53:5555", "10.244.0.53:53");
    for (ts, hook) in [(50_000, Hook::DevXmit), (51_000, Hook::DevReceive)] {
        let e = ev(ts, hook, DNS_NS, 1, from, to);
        recs.push(rec(&e, msg(901, name, "A", false), None, None));
    }
    let (_, js) = run(&sorted(recs), 10_000 * MS);
    assert_eq!(
        upstream_ids(&js),
        [(addr("10.244.0.10:4000"), Qtype::A, vec![901])]
    );
}

#[test]
fn an_answer_s_legs_carry_its_ip_packet_length_and_a_query_s_none() {
    let mut records = healthy(0, "10.244.0.10:4000", CLIENT_NS, 7);
    for r in &mut records {
        let response = matches!(&r.body, Body::Dns(m) if m.response);
        // The answer is 1,314 bytes of DNS: 1,342 as an IPv4 UDP packet.
        r.packet.payload_len = if response { 1314 } else { 60 };
    }
    let (_, js) = run(&records, 2_000 * MS);
    let lens: Vec<(bool, u16)> = js[0].legs.iter().map(|l| (l.response, l.ip_len)).collect();
    assert!(lens.iter().any(|l| l.0), "{lens:?}");
    assert!(
        lens.iter()
            .all(|&(response, len)| len == if response { 1342 } else { 0 }),
        "{lens:?}"
    );
}
