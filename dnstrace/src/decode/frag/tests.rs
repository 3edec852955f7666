use std::str::FromStr as _;

use bytes::Bytes;
use hickory_proto::{
    op::{Message, Query},
    rr::{Name, RecordType},
};

use super::*;
use crate::{
    correlate::{Engine, Limits as JourneyLimits, Outcome},
    decode::{tcp, Body, Decoder, DnsMessage, Dropped, Record, Transport},
    record::tests::{big_answer, fragments, packet},
};

const MS: u64 = 1_000_000;
const SERVER: &str = "10.96.0.10:53";
const CLIENT: &str = "10.244.0.10:40000";

/// An answer of 1,634 bytes: 100 A records.
fn answer() -> Vec<u8> {
    big_answer(0x2a, 100)
}

/// Where a packet is seen.
#[derive(Clone, Copy)]
struct Place {
    netns: u32,
    ifindex: u32,
    hook: Hook,
    name: &'static str,
}

/// The client pod's eth0, as the answer arrives.
const POD: Place = Place {
    netns: 2,
    ifindex: 2,
    hook: Hook::DevReceive,
    name: "eth0",
};
/// The host side of the pod's veth, as the answer leaves for the pod.
const VETH: Place = Place {
    netns: 1,
    ifindex: 5,
    hook: Hook::DevXmit,
    name: "veth0",
};

/// The answer in three fragments: IP data [0, 600), [600, 1200) and
/// [1200, 1642).
fn three() -> Vec<Packet> {
    fragments(&answer(), 600, SERVER, CLIENT, 0x1234)
}

fn at(mut p: Packet, place: Place, ts_ns: u64) -> Packet {
    (p.netns, p.ifindex, p.hook, p.ts_ns) = (place.netns, place.ifindex, place.hook, ts_ns);
    p.ifname = Some(place.name.into());
    p
}

/// Decodes `packets` at `place`, the n-th at `n` ms.
fn decode_at(d: &mut Decoder, place: Place, packets: Vec<Packet>) -> Vec<Record> {
    let mut out = Vec::new();
    for (i, p) in packets.into_iter().enumerate() {
        d.decode(at(p, place, i as u64 * MS), &mut out);
    }
    out
}

fn whole(r: &Record) -> &DnsMessage {
    match &r.body {
        Body::Dns(m) => m,
        other => panic!("not whole: {other:?}"),
    }
}

fn cut(r: &Record) -> &DnsMessage {
    match &r.body {
        Body::Cut(m) => m,
        other => panic!("not cut: {other:?}"),
    }
}

/// In order, a datagram reads as the packet that carried it all: the
/// first fragment's addresses and ports, the whole payload, the last
/// fragment's time.
#[test]
fn fragments_in_order_make_the_whole_datagram() {
    let mut d = Decoder::default();
    let out = decode_at(&mut d, POD, three());
    let [r] = &out[..] else { panic!("{out:?}") };
    assert_eq!(whole(r).answers.len(), 100);
    let p = &r.packet;
    assert_eq!(
        (p.src, p.dst),
        (SERVER.parse().unwrap(), CLIENT.parse().unwrap())
    );
    assert_eq!((p.frag, p.truncated, p.ts_ns), (None, false, 2 * MS));
    assert_eq!((p.payload.len(), p.payload_len), (1634, 1634));
    assert_eq!((r.missing.as_ref(), p.hook), (None, Hook::DevReceive));
}

#[test]
fn fragments_out_of_order_and_twice_make_it_once() {
    let mut d = Decoder::default();
    let f = three();
    let shuffled = vec![
        f[2].clone(),
        f[0].clone(),
        f[2].clone(),
        f[0].clone(),
        f[1].clone(),
    ];
    let out = decode_at(&mut d, POD, shuffled);
    let [r] = &out[..] else { panic!("{out:?}") };
    assert_eq!(whole(r).answers.len(), 100);
    assert_eq!(r.packet.ts_ns, 4 * MS);
    // Nothing is left to time out.
    let mut late = Vec::new();
    d.tick(10_000 * MS, &mut late);
    assert!(late.is_empty());
    assert_eq!((d.incomplete_datagrams(), d.evicted_datagrams()), (0, 0));
}

/// Overlapping fragments, one past the length the UDP header announced,
/// two last ones: the datagram is given up at once, said cut where its
/// first fragment was, and its later fragments are ignored.
#[test]
fn inconsistent_fragments_give_the_datagram_up() {
    let f = three();
    let mut overlapping = f[1].clone();
    overlapping.frag = Some(Fragment {
        id: 0x1234,
        offset: 592,
        more: true,
    });
    let mut past_the_end = f[2].clone();
    past_the_end.payload = Bytes::from(vec![0; 450]);
    let mut ends_early = f[1].clone();
    ends_early.frag = Some(Fragment {
        more: false,
        ..f[1].frag.unwrap()
    });
    let cases = [
        (
            vec![f[0].clone(), overlapping, f[1].clone(), f[2].clone()],
            592,
        ),
        (
            vec![f[0].clone(), f[1].clone(), past_the_end, f[2].clone()],
            1200,
        ),
        (
            vec![f[0].clone(), f[2].clone(), ends_early, f[1].clone()],
            600,
        ),
    ];
    for (packets, offset) in cases {
        let mut d = Decoder::default();
        let out = decode_at(&mut d, POD, packets);
        let [r] = &out[..] else { panic!("{out:?}") };
        assert_eq!(cut(r).id, 0x2a);
        assert_eq!(r.missing.as_ref().map(|m| m.offset), Some(offset));
        assert_eq!(r.packet.frag.map(|f| f.offset), Some(0));
        let mut late = Vec::new();
        d.tick(10_000 * MS, &mut late);
        assert!(late.is_empty(), "{late:?}");
        assert_eq!(d.incomplete_datagrams(), 1);
    }
}

/// The last fragment never comes: past the timeout (a tick, or any later
/// packet's time), the first fragment is said cut, with its header and
/// question, no answer, and the offset of the fragment that never came.
#[test]
fn a_missing_last_fragment_times_out_as_a_cut_message() {
    let timeout = Limits::default().timeout_ns;
    let mut d = Decoder::default();
    let mut f = three();
    f.pop();
    assert!(decode_at(&mut d, POD, f.clone()).is_empty());
    let mut out = Vec::new();
    d.tick(timeout - MS, &mut out);
    assert!(out.is_empty());
    d.tick(timeout, &mut out);
    let [r] = &out[..] else { panic!("{out:?}") };
    let m = cut(r);
    assert_eq!(
        (m.id, m.response, m.questions[0].name.as_str()),
        (0x2a, true, "big.example.test.")
    );
    assert!(m.answers.is_empty());
    assert_eq!(
        r.missing.as_deref(),
        Some(&Missing {
            offset: 1200,
            last_seen: None
        })
    );
    assert_eq!(
        (r.packet.frag.map(|f| f.offset), r.packet.truncated),
        (Some(0), true)
    );
    assert_eq!(d.incomplete_datagrams(), 1);
    // The same on packet time: said before the packet that passed it.
    let mut d = Decoder::default();
    decode_at(&mut d, POD, f);
    let mut query = packet(CLIENT, SERVER, Transport::Udp, &[0; 12]);
    query.ts_ns = timeout;
    let mut out = Vec::new();
    d.decode(query, &mut out);
    assert!(matches!(&out[..], [r, q] if r.missing.is_some() && q.missing.is_none()));
}

/// A middle fragment seen leaving the node's veth never reaches the pod:
/// the pod's record says which one, and where it was seen last.
#[test]
fn a_missing_middle_fragment_says_where_it_was_last_seen() {
    let mut d = Decoder::default();
    let f = three();
    let mut out = Vec::new();
    for (i, p) in f.iter().enumerate() {
        let ts = i as u64 * MS;
        d.decode(at(p.clone(), VETH, ts), &mut out);
        if i != 1 {
            d.decode(at(p.clone(), POD, ts + 10_000), &mut out);
        }
    }
    let [r] = &out[..] else { panic!("{out:?}") };
    assert_eq!(
        (r.packet.ifindex, whole(r).answers.len()),
        (VETH.ifindex, 100)
    );
    out.clear();
    d.tick(3_000 * MS, &mut out);
    let [r] = &out[..] else { panic!("{out:?}") };
    assert_eq!((r.packet.netns, r.packet.ifindex), (POD.netns, POD.ifindex));
    let seen = Seen {
        ts_ns: MS,
        netns: VETH.netns,
        ifindex: VETH.ifindex,
        ifname: Some("veth0".into()),
        hook: Hook::DevXmit,
    };
    assert_eq!(
        r.missing.as_deref(),
        Some(&Missing {
            offset: 600,
            last_seen: Some(seen)
        })
    );
}

/// Past the most datagrams held, the oldest goes: counted, and said cut
/// where its first fragment was.
#[test]
fn datagrams_held_are_bounded_and_evictions_counted() {
    let limits = Limits {
        max_datagrams: 2,
        ..Limits::default()
    };
    let mut d = Decoder::new(tcp::Limits::default(), limits);
    let mut out = Vec::new();
    for id in 1..=5 {
        let first = fragments(&answer(), 600, SERVER, CLIENT, id).remove(0);
        d.decode(at(first, POD, u64::from(id)), &mut out);
    }
    assert_eq!(d.frags.held.map.len(), 2);
    assert!(d.frags.held.order.len() <= 4);
    assert_eq!((d.evicted_datagrams(), d.incomplete_datagrams()), (3, 0));
    let offsets: Vec<_> = out
        .iter()
        .map(|r| r.missing.as_ref().unwrap().offset)
        .collect();
    assert_eq!(offsets, [600; 3]);
}

#[test]
fn ipv6_fragments_make_the_whole_datagram() {
    let mut d = Decoder::default();
    let f = fragments(
        &answer(),
        1232,
        "[fd00::53]:53",
        "[fd00::10]:40000",
        0xdead_beef,
    );
    let out = decode_at(&mut d, POD, f.into_iter().rev().collect());
    let [r] = &out[..] else { panic!("{out:?}") };
    assert_eq!(whole(r).answers.len(), 100);
    assert_eq!(r.packet.src, "[fd00::53]:53".parse().unwrap());
}

/// The kernel drops the last fragment: its record has the drop and the
/// datagram's message as the first fragment had it (so the drop joins the
/// lookup), but no answer. A drop of a datagram never seen says nothing.
#[test]
fn a_dropped_later_fragment_carries_its_datagrams_message() {
    let mut d = Decoder::default();
    let f = three();
    let mut out = decode_at(&mut d, VETH, f[..2].to_vec());
    let drop = Place {
        hook: Hook::Drop,
        ..VETH
    };
    let mut dropped = at(f[2].clone(), drop, 5 * MS);
    dropped.drop = Some(Dropped {
        reason: 2,
        location: 0xffff_ffff_8100_0000,
    });
    d.decode(dropped, &mut out);
    let [r] = &out[..] else { panic!("{out:?}") };
    let m = cut(r);
    assert_eq!(
        (m.id, m.questions[0].name.as_str()),
        (0x2a, "big.example.test.")
    );
    assert!(m.answers.is_empty());
    assert_eq!(r.packet.hook, Hook::Drop);
    assert_eq!(r.packet.frag.map(|f| f.offset), Some(1200));
    assert_eq!(
        (r.packet.src, r.missing.as_ref()),
        (SERVER.parse().unwrap(), None)
    );
    let mut stranger = at(f[2].clone(), drop, 6 * MS);
    stranger.frag = Some(Fragment {
        id: 99,
        ..f[2].frag.unwrap()
    });
    out.clear();
    d.decode(stranger, &mut out);
    assert!(out.is_empty());
    // A dropped first fragment reads as any payload cut short.
    d.decode(at(f[0].clone(), drop, 7 * MS), &mut out);
    let [r] = &out[..] else { panic!("{out:?}") };
    assert_eq!((cut(r).id, r.missing.as_ref()), (0x2a, None));
}

/// A journey whose answer reached the client cut is not answered: the
/// cut message's answers (it has none) never count. Whole, the same
/// answer answers it.
#[test]
fn a_cut_answer_never_counts_as_answered() {
    let outcome = |lose_one: bool| {
        let mut d = Decoder::default();
        let mut engine = Engine::new(JourneyLimits::default());
        let query = {
            let mut m = Message::new();
            m.set_id(0x2a)
                .set_recursion_desired(true)
                .add_query(Query::query(
                    Name::from_str("big.example.test.").unwrap(),
                    RecordType::A,
                ));
            m.to_vec().unwrap()
        };
        let sent = Place {
            hook: Hook::DevXmit,
            ..POD
        };
        let mut out = decode_at(
            &mut d,
            sent,
            vec![packet(CLIENT, SERVER, Transport::Udp, &query)],
        );
        let mut answer = three();
        if lose_one {
            answer.remove(1);
        }
        for (i, p) in answer.into_iter().enumerate() {
            d.decode(at(p, POD, (10 + i as u64) * MS), &mut out);
        }
        d.tick(3_000 * MS, &mut out);
        out.iter().for_each(|r| engine.push(r));
        let journeys = engine.finish(10_000 * MS);
        let [j] = &journeys[..] else {
            panic!("{journeys:?}")
        };
        j.outcome.clone()
    };
    assert!(matches!(outcome(false), Outcome::Answered { answers, .. } if answers.len() == 100));
    assert_eq!(outcome(true), Outcome::Timeout);
}
