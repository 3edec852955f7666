//! Entry points of the fuzz targets in `fuzz/` (feature `fuzzing`): each
//! hands untrusted bytes to the code the binary runs on them, and most then
//! print what came out as the packet lines do (into nothing). A panic
//! anywhere is a bug: hostile input must end as an error or a `Malformed`
//! body.
use std::{collections::HashMap, io, net::Ipv6Addr, path::Path};

use bytes::Bytes;
use dnstrace_common::Hook;

use crate::{
    clock::Clock,
    decode::{
        dns, frag, packet::Interned, tcp, wire, Body, Decoder, Fragment, KernelNames, Packet,
        Record, Transport,
    },
    output::{Format, Labels, LineSink},
    pipeline::Input,
    record::{
        frame::{self, LINKTYPE_LINUX_SLL2},
        notes::PacketNote,
        pcapng::Reader,
        replay::{About, Replay, Speed},
    },
};

/// A DNS message, as a UDP payload would bring it.
pub fn dns(data: &[u8]) {
    let packet = udp_packet(data);
    let body = crate::decode::parse(data);
    // What the wire reader takes, hickory must read the same.
    if let Some(quick) = wire::common(data) {
        let Body::Dns(h) = dns::hickory(data) else {
            panic!("the wire reader read what hickory refuses");
        };
        assert_eq!(quick, *h, "the wire reader and hickory disagree");
    }
    show(
        labels,
        &[Record {
            packet,
            body,
            missing: None,
        }],
    );
}

/// DNS over TCP: segments of a few streams through the reassembler, with
/// limits small enough to reach (streams evicted, out-of-order data given
/// up on, idle streams swept), each message it completes decoded. Not
/// printed: the other targets cover that, and it made this one 2.5 times
/// slower.
///
/// Input: a 4-byte initial sequence number, then segments of a 4-byte
/// head (control byte, 16-bit sequence offset, payload length) and their
/// payload. Control byte: bits 0-2 FIN/SYN/RST, bit 3 cut by the capture,
/// bits 4-5 which of 4 streams, bits 6-7 time passing.
pub fn tcp_stream(data: &[u8]) {
    tcp_records(data);
}

fn tcp_records(data: &[u8]) -> Vec<Record> {
    let mut out = Vec::new();
    let Some((isn, mut rest)) = data.split_first_chunk::<4>() else {
        return out;
    };
    let isn = u32::from_be_bytes(*isn);
    let mut decoder = Decoder::new(
        tcp::Limits {
            max_streams: 3,
            max_pending: 4,
            idle_ns: 1_000,
        },
        frag::Limits::default(),
    );
    let mut ts_ns = 0;
    while let Some((&[ctl, seq_hi, seq_lo, len], tail)) = rest.split_first_chunk::<4>() {
        let (payload, tail) = tail.split_at(usize::from(len).min(tail.len()));
        rest = tail;
        ts_ns += u64::from(ctl >> 6) * 300;
        let mut p = udp_packet(payload);
        p.ts_ns = ts_ns;
        p.src.set_port(40_000 + u16::from(ctl >> 4 & 3));
        p.transport = Transport::Tcp {
            seq: isn.wrapping_add(u32::from(u16::from_be_bytes([seq_hi, seq_lo]))),
            flags: ctl & 0x07,
        };
        if ctl & 0x08 != 0 {
            p.truncated = true;
            p.payload_len += 1;
        }
        decoder.decode(p, &mut out);
    }
    out
}

/// Fragmented UDP: fragments of two datagrams (one over IPv4, one over
/// IPv6) at three hook points and a drop, and ticks, through the decoder
/// with limits small enough to reach (datagrams evicted, timed out). What
/// comes out must never pretend to be whole where it was not.
///
/// Input: a 2-byte length and the datagram's UDP payload (a DNS message,
/// say), then fragments of a 4-byte head (control byte, 16-bit IP offset,
/// data length) each. A fragment's data is the datagram's at its offset
/// (the first's from the payload's start). Control byte: bits 0-1 the
/// hook point (3: a drop), bit 2 MF, bit 3 which datagram, bit 4 its data
/// altered, bit 5 a tick instead, bits 6-7 time passing.
pub fn fragments(data: &[u8]) {
    for r in fragment_records(data) {
        let later = r.packet.frag.is_some_and(|f| !f.is_first());
        match &r.body {
            Body::Dns(_) => assert!(
                r.missing.is_none() && !later,
                "a datagram not all there read as whole"
            ),
            Body::Cut(m) => assert!(m.answers.is_empty(), "a cut message has answers"),
            Body::Malformed { .. } | Body::Gap { .. } => {}
        }
        // Only reassembly makes packets that are no fragment here.
        if r.packet.frag.is_none() {
            assert!(r.missing.is_none() && !r.packet.truncated);
            assert_eq!(r.packet.payload.len(), r.packet.payload_len as usize);
        }
    }
}

fn fragment_records(data: &[u8]) -> Vec<Record> {
    let mut out = Vec::new();
    let Some((len, rest)) = data.split_first_chunk::<2>() else {
        return out;
    };
    let (payload, mut rest) = rest.split_at(usize::from(u16::from_be_bytes(*len)).min(rest.len()));
    let mut decoder = Decoder::new(
        tcp::Limits::default(),
        frag::Limits {
            max_datagrams: 3,
            max_bytes: 65_535,
            timeout_ns: 1_000,
        },
    );
    let mut ts_ns = 0;
    while let Some((&[ctl, off_hi, off_lo, len], tail)) = rest.split_first_chunk::<4>() {
        rest = tail;
        ts_ns += u64::from(ctl >> 6) * 400;
        if ctl & 0x20 != 0 {
            decoder.tick(ts_ns, &mut out);
            continue;
        }
        let offset = u16::from_be_bytes([off_hi, off_lo]);
        let mut p = fragment(payload, ctl, offset, usize::from(len));
        p.ts_ns = ts_ns;
        decoder.decode(p, &mut out);
    }
    out
}

/// A fragment of `payload`'s datagram, as `fragments` describes.
fn fragment(payload: &[u8], ctl: u8, offset: u16, len: usize) -> Packet {
    let more = ctl & 0x04 != 0;
    let v6 = ctl & 0x08 != 0;
    // The datagram's IP data: the UDP header, then the payload.
    let start = usize::from(offset).saturating_sub(if offset == 0 { 0 } else { 8 });
    let mut bytes: Vec<u8> = payload.iter().skip(start).take(len).copied().collect();
    bytes.resize(len, 0);
    if ctl & 0x10 != 0 {
        bytes.iter_mut().for_each(|b| *b ^= 0xa5);
    }
    let mut p = udp_packet(&bytes);
    (p.src, p.dst) = if v6 {
        let ip = |last| Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last);
        ((ip(0x53), 53).into(), (ip(0x10), 40_000).into())
    } else {
        (p.dst, p.src)
    };
    if offset == 0 {
        p.payload_len = payload.len() as u32;
        p.truncated = bytes.len() < payload.len();
    }
    (p.netns, p.ifindex, p.hook) = match ctl & 3 {
        0 => (1, 2, Hook::DevXmit),
        1 => (1, 3, Hook::DevReceive),
        2 => (2, 2, Hook::DevReceive),
        _ => (1, 3, Hook::Drop),
    };
    p.frag = Some(Fragment {
        id: u32::from(v6) + 7,
        offset,
        more,
    });
    p
}

/// A kernel packet event, as read from the ring buffer: decoded as the
/// capture does, printed, and turned into the frame a recording keeps
/// (and back).
pub fn event(data: &[u8]) {
    let Ok(packet) = Packet::from_event(data, &mut Interned::default()) else {
        return;
    };
    let f = frame::cooked(&packet);
    if let Ok(Some(d)) = frame::decode(LINKTYPE_LINUX_SLL2, &f.data) {
        // A later fragment's ports travel in its note.
        let ports = match packet.frag {
            Some(f) if !f.is_first() => (0, 0),
            _ => (packet.src.port(), packet.dst.port()),
        };
        assert_eq!(
            (d.src.port(), d.dst.port()),
            ports,
            "a recorded frame gives the packet's ports back"
        );
    }
    let note = PacketNote::of(&packet, |at| format!("{at:#x}"));
    serde_json::to_vec(&note).expect("a packet note serializes");
    let mut out = Vec::new();
    Decoder::default().decode(packet, &mut out);
    show(labels, &out);
}

/// A recording (pcapng or pcap, ours or a capture's), replayed as
/// `dnstrace replay` does: the first pass over its notes, then every
/// input, the packets decoded and printed with the recording's labels.
pub fn recording(data: &[u8]) {
    let path = Path::new("fuzz.pcapng");
    let Ok(about) = Reader::new(data)
        .map_err(anyhow::Error::from)
        .and_then(|r| About::scan(r, path))
    else {
        return;
    };
    let _ = (about.context(), about.limits());
    let Ok(reader) = Reader::new(data) else {
        return;
    };
    // `--port 53 --port 53535`: the tcpdump seeds' queries go to 53535.
    let mut replay = Replay::with_reader(path, reader, &about, vec![53, 53535], Speed::Fast);
    let mut decoder = Decoder::default();
    let mut out = Vec::new();
    while let Some(input) = replay.next_input() {
        match input {
            Input::Packets(batch) => batch.into_iter().for_each(|p| decoder.decode(p, &mut out)),
            Input::Tick(now_ns) => decoder.tick(now_ns, &mut out),
            _ => continue,
        }
        show(|| about.labels(), &out);
        out.clear();
    }
}

fn labels() -> Labels {
    Labels::new(
        HashMap::new(),
        Clock::with_offset(0),
        KernelNames::default(),
    )
}

/// A UDP packet from a client to a resolver, carrying `payload`.
fn udp_packet(payload: &[u8]) -> Packet {
    Packet {
        ts_ns: 1,
        node: Default::default(),
        netns: 4026531840,
        ifindex: 2,
        hook: Hook::TcIngress,
        src: ([10, 0, 0, 1], 40_000).into(),
        dst: ([10, 0, 0, 2], 53).into(),
        transport: Transport::Udp,
        wire_len: payload.len() as u32 + 28,
        payload_len: payload.len() as u32,
        truncated: false,
        frag: None,
        payload: Bytes::copy_from_slice(payload),
        ifname: None,
        ct: None,
        drop: None,
        underlay: None,
    }
}

/// The packet lines, text and JSON, of `records`.
fn show(labels: impl Fn() -> Labels, records: &[Record]) {
    for format in [Format::Text, Format::Json] {
        let mut sink = LineSink::new(format, labels(), io::sink());
        for r in records {
            sink.write(r).expect("writing into nothing");
        }
    }
}

#[cfg(test)]
mod tests {
    //! The seeds the fuzz targets start from (fuzz/seeds/<target>), made
    //! here with dnstrace's own writers: `cargo test -p dnstrace --features
    //! fuzzing --lib fuzz::tests::write_seeds -- --ignored` rewrites them.
    use std::{path::PathBuf, str::FromStr as _};

    use dnstrace_common::{
        CtInfo, CtTuple, EventHeader, EventKind, PacketMeta, FLAG_CONNTRACK, FLAG_FRAGMENT,
        FLAG_MORE_FRAGMENTS, FLAG_TRUNCATED, SCHEMA_VERSION,
    };
    use hickory_proto::{
        op::{Edns, Message, MessageType, Query, ResponseCode},
        rr::{
            rdata::{A, AAAA, CNAME, SOA, SRV, TXT},
            Name, RData, Record as Rr, RecordType,
        },
    };

    use super::*;
    use crate::{
        pods::testdir::TestDir,
        record::tests::{big_answer, record_inputs},
    };

    type Target = fn(&[u8]);
    /// (file name, contents)
    type Seeds = Vec<(&'static str, Vec<u8>)>;
    const TARGETS: [(&str, Target); 5] = [
        ("dns", dns),
        ("tcp_stream", tcp_stream),
        ("fragments", fragments),
        ("event", event),
        ("recording", recording),
    ];

    fn seeds_dir(target: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/seeds")
            .join(target)
    }

    fn name(s: &str) -> Name {
        Name::from_str(s).unwrap()
    }

    fn query(id: u16, qname: &str, qtype: RecordType) -> Message {
        let mut m = Message::new();
        m.set_id(id)
            .set_recursion_desired(true)
            .add_query(Query::query(name(qname), qtype));
        m
    }

    fn dns_seeds() -> Seeds {
        let mut edns = query(1, "kubernetes.default.svc.cluster.local.", RecordType::AAAA);
        edns.set_edns(Edns::new());
        let mut answer = query(2, "www.example.test.", RecordType::A);
        let www = name("www.example.test.");
        answer
            .set_message_type(MessageType::Response)
            .set_recursion_available(true)
            .add_answers([
                Rr::from_rdata(
                    www.clone(),
                    60,
                    RData::CNAME(CNAME(name("web.example.test."))),
                ),
                Rr::from_rdata(
                    name("web.example.test."),
                    30,
                    RData::A(A::new(192, 0, 2, 7)),
                ),
                Rr::from_rdata(
                    www.clone(),
                    30,
                    RData::AAAA(AAAA::from_str("2001:db8::7").unwrap()),
                ),
                Rr::from_rdata(
                    www.clone(),
                    30,
                    RData::TXT(TXT::new(vec!["v=\"1\"\u{1}".into()])),
                ),
                Rr::from_rdata(
                    www,
                    30,
                    RData::SRV(SRV::new(10, 5, 53, name("ns.example.test."))),
                ),
            ]);
        let mut nx = query(3, "nope.example.test.", RecordType::A);
        let soa = SOA::new(
            name("ns.example.test."),
            name("admin.example.test."),
            1,
            2,
            3,
            4,
            5,
        );
        nx.set_message_type(MessageType::Response)
            .set_response_code(ResponseCode::NXDomain)
            .add_name_server(Rr::from_rdata(name("example.test."), 5, RData::SOA(soa)));
        vec![
            (
                "query",
                query(0xbeef, "www.example.test.", RecordType::A)
                    .to_vec()
                    .unwrap(),
            ),
            ("edns", edns.to_vec().unwrap()),
            ("malformed-answer", malformed(&answer)),
            ("answers", answer.to_vec().unwrap()),
            ("nxdomain", nx.to_vec().unwrap()),
        ]
    }

    /// `answer` with one more record, an A whose data runs past the end:
    /// what the lenient read keeps the rest of.
    fn malformed(answer: &Message) -> Vec<u8> {
        let mut bytes = answer.to_vec().unwrap();
        let count = u16::from_be_bytes([bytes[6], bytes[7]]) + 1;
        bytes[6..8].copy_from_slice(&count.to_be_bytes());
        bytes.extend_from_slice(b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x1e\x00\x04\x0a");
        bytes
    }

    /// DNS over TCP's framing: a 16-bit length first.
    fn framed(msg: &[u8]) -> Vec<u8> {
        let mut v = (msg.len() as u16).to_be_bytes().to_vec();
        v.extend_from_slice(msg);
        v
    }

    /// One segment in `tcp_stream`'s input format.
    fn segment(ctl: u8, offset: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![ctl];
        v.extend_from_slice(&offset.to_be_bytes());
        v.push(payload.len() as u8);
        v.extend_from_slice(payload);
        v
    }

    fn tcp_seeds() -> Seeds {
        const SYN: u8 = 0x02;
        const FIN: u8 = 0x01;
        const RST: u8 = 0x04;
        const CUT: u8 = 0x08;
        let q = query(7, "www.example.test.", RecordType::A)
            .to_vec()
            .unwrap();
        let mut two = framed(&q);
        two.extend(framed(&q));
        let one = framed(&q);
        let n = one.len() as u16;
        let stream = |s: u8, ctl: u8| s << 4 | ctl;
        // In order: two messages in one segment, then FIN.
        let mut in_order = 0u32.to_be_bytes().to_vec();
        in_order.extend(segment(SYN, 0, b""));
        in_order.extend(segment(0, 1, &two));
        in_order.extend(segment(FIN, 1 + two.len() as u16, b""));
        // Sequence numbers that wrap; split, out of order, retransmitted.
        let mut reordered = 0xffff_fff0u32.to_be_bytes().to_vec();
        reordered.extend(segment(SYN, 0, b""));
        reordered.extend(segment(0, 11, &one[10..]));
        reordered.extend(segment(0, 1, &one[..1]));
        reordered.extend(segment(0, 1, &one[..1]));
        reordered.extend(segment(0, 2, &one[1..10]));
        reordered.extend(segment(0x40, 1 + n, &one[..5]));
        // Several streams: one cut by the capture, one reset, time passing.
        let mut streams = 1000u32.to_be_bytes().to_vec();
        streams.extend(segment(stream(1, SYN), 0, b""));
        streams.extend(segment(stream(2, SYN), 100, b""));
        streams.extend(segment(stream(1, CUT), 1, &one[..4]));
        streams.extend(segment(stream(2, 0), 101, &one));
        streams.extend(segment(stream(3, 0), 7, &one));
        streams.extend(segment(stream(2, RST), 101 + n, b""));
        streams.extend(segment(stream(0, 0xc0), 0, &one));
        vec![
            ("in_order", in_order),
            ("reordered", reordered),
            ("streams", streams),
        ]
    }

    /// An IPv4 address as events hold it: the first 4 of 16 bytes.
    fn v4(a: [u8; 4]) -> [u8; 16] {
        let mut v = [0; 16];
        v[..4].copy_from_slice(&a);
        v
    }

    fn tuple(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> CtTuple {
        CtTuple {
            src: v4(src),
            dst: v4(dst),
            sport,
            dport,
            l3num: 2,
            proto: 17,
            _pad: 0,
        }
    }

    /// A packet event as the kernel programs write it.
    fn event_bytes(meta: PacketMeta, payload: &[u8]) -> Vec<u8> {
        let mut buf = Vec::new();
        dnstrace_common::encode_packet(meta, payload, &mut buf);
        buf
    }

    fn event_seeds() -> Seeds {
        let q = query(9, "www.example.test.", RecordType::A)
            .to_vec()
            .unwrap();
        let udp = PacketMeta {
            header: EventHeader {
                kind: EventKind::Packet as u16,
                version: SCHEMA_VERSION,
                size: 0,
            },
            ts_ns: 5_000_000_000,
            netns: 4026531840,
            ifindex: 2,
            wire_len: q.len() as u32 + 28,
            payload_len: q.len() as u32,
            saddr: v4([10, 244, 0, 10]),
            daddr: v4([10, 96, 0, 10]),
            sport: 40_000,
            dport: 53,
            tcp_seq: 0,
            ip_version: 4,
            l4_proto: 17,
            hook: Hook::TcEgress as u8,
            flags: 0,
            tcp_flags: 0,
            sections: 0,
            cap_len: 0,
            ifname: [0; 16],
            drop_location: 0,
            drop_reason: 0,
            _pad_drop: 0,
            frag_id: 0,
            frag_offset: 0,
            _pad_frag: 0,
            apart_seq: 0,
            cpu: 0,
            _pad_apart: 0,
            ct: CtInfo::default(),
        };
        let mut nat = udp;
        nat.hook = Hook::Drop as u8;
        nat.flags = FLAG_CONNTRACK;
        nat.ifname[..4].copy_from_slice(b"cni0");
        nat.drop_reason = 3;
        nat.drop_location = 0xffff_ffff_8100_0000;
        nat.ct = CtInfo {
            original: tuple([10, 244, 0, 10], 40_000, [10, 96, 0, 10], 53),
            reply: tuple([10, 244, 0, 53], 53, [10, 244, 0, 10], 40_000),
            status: 1 << 5 | 1 << 3,
            ctinfo: 0,
            _pad: [0; 3],
        };
        let mut tcp6 = udp;
        tcp6.ip_version = 6;
        tcp6.l4_proto = 6;
        tcp6.saddr = std::net::Ipv6Addr::from_str("fd00::a").unwrap().octets();
        tcp6.daddr = std::net::Ipv6Addr::from_str("fd00::35").unwrap().octets();
        tcp6.tcp_seq = 1;
        tcp6.tcp_flags = 0x18;
        tcp6.payload_len += 2;
        let mut first = udp;
        first.flags = FLAG_FRAGMENT | FLAG_MORE_FRAGMENTS | FLAG_TRUNCATED;
        first.frag_id = 0x4d2;
        first.payload_len = 3000;
        let mut later = first;
        later.flags = FLAG_FRAGMENT;
        later.frag_offset = 1480;
        later.payload_len = q.len() as u32;
        vec![
            ("udp4", event_bytes(udp, &q)),
            ("nat_drop", event_bytes(nat, &q)),
            ("tcp6", event_bytes(tcp6, &framed(&q))),
            ("first_fragment", event_bytes(first, &q)),
            ("later_fragment", event_bytes(later, &q)),
        ]
    }

    /// One fragment in `fragments`' input format.
    fn frag_op(ctl: u8, offset: u16, len: u8) -> Vec<u8> {
        let [hi, lo] = offset.to_be_bytes();
        vec![ctl, hi, lo, len]
    }

    /// `payload`'s datagram in fragments of 248 data bytes, in order, each
    /// with `ctl` (and MF on all but the last).
    fn split(payload: &[u8], ctl: u8) -> Vec<Vec<u8>> {
        const MF: u8 = 0x04;
        let end = payload.len() + 8;
        let mut ops = vec![frag_op(ctl | MF, 0, 248)];
        let mut at = 256;
        while at < end {
            let len = (end - at).min(248);
            let more = if at + len < end { MF } else { 0 };
            ops.push(frag_op(ctl | more, at as u16, len as u8));
            at += len;
        }
        ops
    }

    fn fragments_seed(payload: &[u8], ops: Vec<Vec<u8>>) -> Vec<u8> {
        let mut seed = (payload.len() as u16).to_be_bytes().to_vec();
        seed.extend_from_slice(payload);
        seed.extend(ops.concat());
        seed
    }

    fn fragments_seeds() -> Seeds {
        const TICK: u8 = 0x20;
        const LATER: u8 = 0xc0;
        // 514 bytes: 34 and 30 records.
        let answer = big_answer(11, 30);
        // Whole at two hook points (IPv4), then at a third over IPv6.
        let mut in_order = split(&answer, 0);
        in_order.extend(split(&answer, 1));
        in_order.extend(split(&answer, 2 | 0x08));
        // Backwards with a fragment twice; then with a fragment coming
        // twice, altered the first time (given up).
        let mut reordered = split(&answer, 0);
        reordered.reverse();
        reordered.insert(1, reordered[0].clone());
        let mut altered = split(&answer, 1);
        altered.insert(1, frag_op(altered[1][0] | 0x10, 256, 248));
        reordered.extend(altered);
        // The last fragment lost at one hook point and dropped at another;
        // the time passes and a tick gives the datagram up.
        let mut lost = split(&answer, 0);
        let last = lost.pop().unwrap();
        lost.extend(split(&answer, 1));
        lost.pop();
        lost.push(vec![last[0] | 3, last[1], last[2], last[3]]);
        lost.push(frag_op(LATER | TICK, 0, 0));
        lost.push(frag_op(LATER | TICK, 0, 0));
        vec![
            ("in_order", fragments_seed(&answer, in_order)),
            ("reordered", fragments_seed(&answer, reordered)),
            ("lost", fragments_seed(&answer, lost)),
        ]
    }

    /// A whole recording by `--record`, tcpdump's captures, and scapy's.
    fn recording_seeds() -> Seeds {
        let dir = TestDir::new();
        let path = dir.path().join("r.pcapng");
        record_inputs(&path, Clock::with_offset(7));
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/record/fixtures");
        let fixture = |f: &str| std::fs::read(fixtures.join(f)).unwrap();
        // A lab recording of format 1 (custom blocks), still read.
        let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden");
        let format_1 = std::fs::read(golden.join("loopback-nameserver.pcapng")).unwrap();
        // Captures that bend the rules: tunnels, broken answers and options.
        let capture = |f: &str| std::fs::read(golden.join("captures").join(f)).unwrap();
        vec![
            ("dnstrace.pcapng", std::fs::read(&path).unwrap()),
            ("dnstrace-format-1.pcapng", format_1),
            ("tcpdump-lo.pcap", fixture("lo.pcap")),
            ("tcpdump-any-cut.pcap", fixture("any-cut.pcap")),
            ("tunnels.pcap", capture("tunnels.pcap")),
            ("malformed-answers.pcap", capture("malformed-answers.pcap")),
            ("odd-edns.pcap", capture("odd-edns.pcap")),
        ]
    }

    fn all_seeds() -> Vec<(&'static str, Seeds)> {
        vec![
            ("dns", dns_seeds()),
            ("tcp_stream", tcp_seeds()),
            ("fragments", fragments_seeds()),
            ("event", event_seeds()),
            ("recording", recording_seeds()),
        ]
    }

    #[test]
    #[ignore = "rewrites fuzz/seeds"]
    fn write_seeds() {
        for (target, seeds) in all_seeds() {
            let dir = seeds_dir(target);
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            for (name, bytes) in seeds {
                std::fs::write(dir.join(name), bytes).unwrap();
            }
        }
    }

    /// Every committed seed (and any crash reproducer kept beside them)
    /// runs through its target.
    #[test]
    fn seeds_run_clean() {
        for (target, run) in TARGETS {
            let dir = seeds_dir(target);
            let entries =
                std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            for entry in entries {
                run(&std::fs::read(entry.unwrap().path()).unwrap());
            }
        }
    }

    /// The seeds are what these tests make, and reach past the first checks.
    #[test]
    fn seeds_are_meaningful() {
        for (name, seed) in dns_seeds() {
            let crate::decode::Body::Dns(m) = crate::decode::parse(&seed) else {
                panic!("{name}: not read as DNS");
            };
            assert_eq!(m.malformed.is_some(), name == "malformed-answer", "{name}");
        }
        let events = event_seeds();
        let frags: Vec<_> = events
            .iter()
            .map(|(_, seed)| {
                Packet::from_event(seed, &mut Interned::default())
                    .unwrap()
                    .frag
            })
            .collect();
        let frag = |offset, more| {
            Some(Fragment {
                id: 0x4d2,
                offset,
                more,
            })
        };
        assert_eq!(frags, [None, None, None, frag(0, true), frag(1480, false)]);
        let dns_records = |seed: &[u8]| {
            tcp_records(seed)
                .iter()
                .filter(|r| matches!(r.body, crate::decode::Body::Dns(_)))
                .count()
        };
        let tcp = tcp_seeds();
        assert_eq!(dns_records(&tcp[0].1), 2);
        assert_eq!(dns_records(&tcp[1].1), 1);
        assert_eq!(dns_records(&tcp[2].1), 3);
        let kinds = |seed: &[u8]| {
            fragment_records(seed)
                .iter()
                .map(|r| match &r.body {
                    Body::Dns(m) => format!("dns {}", m.answers.len()),
                    Body::Cut(_) => format!("cut {:?}", r.missing.as_ref().map(|m| m.offset)),
                    Body::Malformed { .. } | Body::Gap { .. } => "malformed".into(),
                })
                .collect::<Vec<_>>()
        };
        let frags = fragments_seeds();
        assert_eq!(kinds(&frags[0].1), ["dns 30"; 3]);
        assert_eq!(kinds(&frags[1].1), ["dns 30", "cut Some(256)"]);
        assert_eq!(
            kinds(&frags[2].1),
            ["cut None", "cut Some(504)", "cut Some(504)"]
        );
        let mut out = Vec::new();
        Decoder::default().decode(
            Packet::from_event(&event_seeds()[2].1, &mut Interned::default()).unwrap(),
            &mut out,
        );
        assert_eq!(out.len(), 1);
        for (_, seed) in recording_seeds() {
            let about = About::scan(Reader::new(&seed[..]).unwrap(), Path::new("seed")).unwrap();
            let mut replay = Replay::with_reader(
                Path::new("seed"),
                Reader::new(&seed[..]).unwrap(),
                &about,
                vec![53, 53535],
                Speed::Fast,
            );
            let mut packets = 0;
            while let Some(input) = replay.next_input() {
                if let Input::Packets(b) = input {
                    packets += b.len();
                }
            }
            assert!(packets > 0);
        }
    }
}
