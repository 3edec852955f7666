//! Helpers shared by the recording tests, and recordings against the real
//! tools: what tshark makes of ours, and what we make of tcpdump's.
use std::{net::SocketAddr, path::Path, process::Command, str::FromStr as _};

use bytes::Bytes;
use dnstrace_common::Hook;
use hickory_proto::{
    op::{Message, MessageType, Query, ResponseCode},
    rr::{rdata::A, Name, RData, Record as Rr, RecordType},
};

use super::{
    frame::{self, LINKTYPE_LINUX_SLL2, LINKTYPE_RAW},
    layout,
    notes::Note,
    pcapng::{Block, Interface, PacketOpt, Reader, SectionInfo, Writer, FLAG_OUTBOUND},
};
use crate::{
    decode::{Body, Fragment, Packet, Transport},
    pods::testdir::TestDir,
};

/// xorshift64: reproducible noise without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A UDP query for `name` at `ts`.
pub fn query(src: &str, dst: &str, name: &str, ts: u64) -> Packet {
    let mut msg = vec![0u8; 12];
    for label in name.split('.').filter(|l| !l.is_empty()) {
        msg.push(label.len() as u8);
        msg.extend_from_slice(label.as_bytes());
    }
    msg.extend_from_slice(&[0, 0, 1, 0, 1]);
    let mut p = packet(src, dst, Transport::Udp, &msg);
    p.ts_ns = ts;
    p
}

pub fn packet(src: &str, dst: &str, transport: Transport, payload: &[u8]) -> Packet {
    Packet {
        ts_ns: 1,
        node: Default::default(),
        netns: 4026531840,
        ifindex: 2,
        hook: Hook::TcEgress,
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        transport,
        wire_len: 0,
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

/// `payload`'s UDP datagram in fragments of `size` IP data bytes, as the
/// kernel sends them: the first with the UDP payload it holds (the UDP
/// header announcing all of it), the later ones with their data and the
/// first one's ports.
pub fn fragments(payload: &[u8], size: usize, src: &str, dst: &str, id: u32) -> Vec<Packet> {
    let mut data = vec![0; 8];
    data.extend_from_slice(payload);
    data.chunks(size)
        .enumerate()
        .map(|(i, chunk)| {
            let offset = i * size;
            let bytes = if i == 0 { &chunk[8..] } else { chunk };
            let mut p = packet(src, dst, Transport::Udp, bytes);
            if i == 0 {
                (p.payload_len, p.truncated) = (payload.len() as u32, true);
            }
            p.frag = Some(Fragment {
                id,
                offset: offset as u16,
                more: offset + chunk.len() < data.len(),
            });
            p
        })
        .collect()
}

/// An answer for big.example.test. with `answers` A records: 34 bytes and
/// 16 per record.
pub fn big_answer(id: u16, answers: u8) -> Vec<u8> {
    let name = Name::from_str("big.example.test.").unwrap();
    let mut m = Message::new();
    m.set_id(id)
        .set_message_type(MessageType::Response)
        .set_recursion_desired(true)
        .add_query(Query::query(name.clone(), RecordType::A));
    for i in 0..answers {
        m.add_answer(Rr::from_rdata(
            name.clone(),
            30,
            RData::A(A::new(192, 0, 2, i)),
        ));
    }
    m.to_vec().unwrap()
}

pub(crate) fn dns_message(id: u16, name: &str, rcode: Option<ResponseCode>) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(id)
        .set_recursion_desired(true)
        .add_query(Query::query(Name::from_str(name).unwrap(), RecordType::A));
    if let Some(rcode) = rcode {
        m.set_message_type(MessageType::Response)
            .set_response_code(rcode);
    }
    m.to_vec().unwrap()
}

fn tshark(args: &[&str]) -> String {
    let out = Command::new("tshark")
        .args(args)
        .output()
        .expect("tshark must be installed (cargo xtask setup)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tshark {args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// Bad checksums and malformed packets, as tshark's expert reports errors,
/// in the packets `only` matches (a display filter; "" for all).
fn tshark_errors(path: &str, only: &str) -> String {
    let checks = [
        "ip.check_checksum:TRUE",
        "udp.check_checksum:TRUE",
        "tcp.check_checksum:TRUE",
    ];
    let expert = format!(
        "expert,error{}{only}",
        if only.is_empty() { "" } else { "," }
    );
    let mut args = vec!["-r", path, "-q", "-z", &expert];
    for c in &checks {
        args.extend(["-o", c]);
    }
    tshark(&args)
}

#[test]
fn tshark_reads_our_recordings_without_complaint() {
    let dir = TestDir::new();
    let path = dir.path().join("dns.pcapng");
    let file = std::fs::File::create(&path).unwrap();
    let info = SectionInfo {
        user_appl: "dnstrace test".into(),
        ..Default::default()
    };
    let mut w = Writer::new(file, &info).unwrap();
    let notes = w
        .interface(&layout::notes_interface(&[Note::Start { now_ns: 1 }]).unwrap())
        .unwrap();
    let iface = |name: &str| Interface {
        linktype: LINKTYPE_LINUX_SLL2,
        snaplen: 0,
        name: name.into(),
        description: "netns 4026531840 tc_egress".into(),
        comment: vec![],
    };
    let eth0 = w.interface(&iface("eth0")).unwrap();
    let cni0 = w.interface(&iface("cni0")).unwrap();
    let query = dns_message(0x1234, "kubernetes.default.svc.cluster.local.", None);
    let answer = dns_message(
        0x1234,
        "kubernetes.default.svc.cluster.local.",
        Some(ResponseCode::NXDomain),
    );
    let tcp_query = [&(query.len() as u16).to_be_bytes()[..], &query].concat();
    let push_ack = Transport::Tcp {
        seq: 1,
        flags: 0x18,
    };
    let packets = [
        (
            eth0,
            packet("10.244.0.10:40000", "10.96.0.10:53", Transport::Udp, &query),
        ),
        (
            cni0,
            packet("[fd00::53]:53", "[fd00::10]:40001", Transport::Udp, &answer),
        ),
        (
            eth0,
            packet("10.244.0.10:40002", "10.96.0.10:53", push_ack, &tcp_query),
        ),
    ];
    let opts = [
        PacketOpt::Comment("seen at tc_egress".into()),
        PacketOpt::Flags(FLAG_OUTBOUND),
        layout::packet_note_comment(b"{}"),
    ];
    for (i, (iface, p)) in packets.iter().enumerate() {
        let f = frame::cooked(p);
        let ts = 1_700_000_000_000_000_000 + i as u64 * 1_000;
        w.packet(*iface, ts, &f.data, f.orig_len, &opts).unwrap();
    }
    let tick = layout::note_packets(&Note::Tick { now_ns: 2 }).unwrap();
    let tick = &tick[0].data;
    let ts = 1_700_000_000_000_010_000;
    w.packet(notes, ts, tick, tick.len() as u32, &[]).unwrap();
    w.flush().unwrap();
    drop(w);

    let path = path.to_str().unwrap();
    let fields = [
        "frame.interface_name",
        "dns.id",
        "dns.qry.name",
        "dns.flags.rcode",
        "ip.src",
        "ipv6.src",
        "udp.srcport",
        "tcp.srcport",
        "frame.comment",
    ];
    let mut args = vec!["-r", path, "-T", "fields", "-E", "separator=|"];
    for f in &fields {
        args.extend(["-e", f]);
    }
    let name = "kubernetes.default.svc.cluster.local";
    // Queries carry no rcode field; both comments show, the note after
    // the text. The note's packet has no DNS fields.
    let seen = "seen at tc_egress,dnstrace packet note: {}";
    let expected = [
        format!("eth0|0x1234|{name}||10.244.0.10||40000||{seen}"),
        format!("cni0|0x1234|{name}|3||fd00::53|53||{seen}"),
        format!("eth0|0x1234|{name}||10.244.0.10|||40002|{seen}"),
        "dnstrace||||||||".to_string(),
    ];
    assert_eq!(tshark(&args).lines().collect::<Vec<_>>(), expected);
    let errors = tshark_errors(path, "");
    assert!(!errors.contains("Errors"), "{errors}");
    // The same check does see errors: loopback's offloaded checksums.
    let lo = concat!(env!("CARGO_MANIFEST_DIR"), "/src/record/fixtures/lo.pcap");
    assert!(tshark_errors(lo, "").contains("Bad checksum"));
}

/// What the fixtures hold. Made with tcpdump (`-i lo -w lo.pcap -c 4 'udp
/// port 53535'`, and `-i any --time-stamp-precision=nano -s 70 -w
/// any-cut.pcap`) while fixtures/send.py sent four queries: 127.0.0.1 and ::1
/// in turn, from port 40000 + i, for fixture-<i>.test.
fn fixture_queries() -> Vec<(SocketAddr, SocketAddr, Vec<u8>)> {
    (0..4)
        .map(|i| {
            let ip = if i % 2 == 0 { "127.0.0.1" } else { "[::1]" };
            let src = format!("{ip}:{}", 40000 + i).parse().unwrap();
            let dst = format!("{ip}:53535").parse().unwrap();
            let name = format!("fixture-{i}.test.");
            (src, dst, dns_message(0x1000 + i, &name, None))
        })
        .collect()
}

/// Each packet's link type and frame.
fn read_fixture(name: &str) -> Vec<(u16, u64, Vec<u8>, u32)> {
    let path = format!("{}/src/record/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let reader = Reader::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut linktype = None;
    let mut frames = Vec::new();
    for block in reader {
        match block.unwrap() {
            Block::Interface { iface, .. } => linktype = Some(iface.linktype),
            Block::Packet {
                ts_ns,
                data,
                orig_len,
                ..
            } => frames.push((linktype.unwrap(), ts_ns, data, orig_len)),
            b => panic!("unexpected {b:?}"),
        }
    }
    frames
}

#[test]
fn tcpdump_captures_read_as_the_packets_sent() {
    let frames = read_fixture("lo.pcap");
    assert_eq!(frames.len(), 4);
    let mut last_ts = 0;
    for ((linktype, ts_ns, data, orig_len), (src, dst, query)) in
        frames.iter().zip(fixture_queries())
    {
        assert_eq!(
            (*linktype, data.len()),
            (frame::LINKTYPE_ETHERNET, *orig_len as usize)
        );
        assert!(*ts_ns > last_ts && *ts_ns > 1_700_000_000_000_000_000);
        last_ts = *ts_ns;
        let d = frame::decode(*linktype, data).unwrap().unwrap();
        assert_eq!((d.src, d.dst, d.transport), (src, dst, Transport::Udp));
        assert_eq!((d.payload, d.truncated, d.frag), (&query[..], false, None));
        let Body::Dns(msg) = crate::decode::parse(d.payload) else {
            panic!("not DNS");
        };
        assert_eq!(msg.id, 0x1000 + (src.port() - 40000));
    }
}

#[test]
fn cut_tcpdump_captures_read_as_cut() {
    let frames = read_fixture("any-cut.pcap");
    assert_eq!(frames.len(), 4);
    for ((linktype, ts_ns, data, orig_len), (src, dst, query)) in
        frames.iter().zip(fixture_queries())
    {
        // 70 bytes captured of each; nanosecond timestamps.
        assert_eq!((*linktype, data.len()), (frame::LINKTYPE_LINUX_SLL2, 70));
        assert!(*orig_len as usize > data.len());
        assert_ne!(ts_ns % 1_000, 0);
        let d = frame::decode(*linktype, data).unwrap().unwrap();
        assert_eq!((d.src, d.dst), (src, dst));
        assert_eq!(d.payload_len as usize, query.len());
        assert!(d.truncated);
        assert_eq!(d.payload, &query[..d.payload.len()]);
    }
}

/// Everything the pipeline can be fed, with every optional fact set.
pub fn inputs() -> Vec<crate::pipeline::Input> {
    use crate::{
        conntrack::{CtEvent, CtEventKind},
        decode::{Conntrack, CtTuple, Dropped},
        pipeline::Input,
    };
    let a = |s: &str| s.parse::<SocketAddr>().unwrap();
    let query = dns_message(7, "kubernetes.default.svc.cluster.local.", None);
    let mut out = packet("10.244.0.10:4000", "10.96.0.10:53", Transport::Udp, &query);
    out.ts_ns = 5_000_000_000;
    out.hook = Hook::DevXmit;
    out.ifname = Some("eth0".into());
    let tuple = |src: &str, dst: &str| CtTuple {
        src: a(src),
        dst: a(dst),
    };
    let answer = dns_message(
        7,
        "kubernetes.default.svc.cluster.local.",
        Some(ResponseCode::NoError),
    );
    let mut back = packet(
        "10.244.0.53:53",
        "10.244.0.10:4000",
        Transport::Udp,
        &answer,
    );
    back.ts_ns = 5_000_300_000;
    back.hook = Hook::Drop;
    back.ct = Some(Box::new(Conntrack {
        original: tuple("10.244.0.10:4000", "10.96.0.10:53"),
        reply: tuple("10.244.0.53:53", "10.244.0.10:4000"),
        status: 1 << 5,
        is_reply: true,
    }));
    back.drop = Some(Dropped {
        reason: 3,
        location: 0xffff_ffff_8100_0000,
    });
    let tcp = packet(
        "10.244.0.10:4001",
        "10.96.0.10:53",
        Transport::Tcp {
            seq: 99,
            flags: 0x18,
        },
        &query,
    );
    // An answer in two fragments.
    let mut frags = fragments(
        &big_answer(7, 100),
        1480,
        "10.244.0.53:53",
        "10.244.0.10:4000",
        0xbeef,
    );
    for (i, f) in frags.iter_mut().enumerate() {
        (f.ts_ns, f.hook) = (5_000_350_000 + i as u64, Hook::DevReceive);
    }
    let event = CtEvent {
        kind: CtEventKind::New,
        original: tuple("10.244.0.10:4000", "10.96.0.10:53"),
        reply: tuple("10.244.0.53:53", "10.244.0.10:4000"),
        proto: 17,
        status: 8,
    };
    vec![
        Input::Packets([vec![out, back, tcp], frags].concat()),
        Input::Conntrack {
            now_ns: 5_000_400_000,
            events: vec![event],
        },
        Input::Counters {
            now_ns: 5_000_500_000,
            moved: vec![("insert_failed", 2)],
        },
        Input::Lost {
            since_ns: 5_000_550_000,
            now_ns: 5_000_600_000,
            total: 12,
        },
        Input::Sample(crate::ingest::SampleChange {
            since_ns: 5_000_700_000,
            now_ns: 5_000_700_100,
            level: dnstrace_common::SampleLevel {
                shift: 3,
                seed: 0xdead_beef,
            },
            budget: false,
            node: Default::default(),
            viewed: Default::default(),
        }),
        Input::Sample(crate::ingest::SampleChange {
            since_ns: 5_000_750_000,
            now_ns: 5_000_750_100,
            level: dnstrace_common::SampleLevel::PAUSED,
            budget: false,
            // A cluster view's recording: whose, and whom it followed.
            node: crate::decode::NodeId(2),
            viewed: crate::ingest::Viewed::new(["10.244.0.10".parse().unwrap()]),
        }),
        Input::Pods {
            now_ns: 5_000_800_000,
            refresh: crate::target::follow::Refresh {
                names: vec![("10.244.0.11".parse().unwrap(), "default/web".into())],
                workloads: vec![(
                    "10.244.0.11".parse().unwrap(),
                    crate::pods::workload::Workload {
                        kind: crate::pods::workload::WorkloadKind::Deployment,
                        name: "web".into(),
                    },
                )],
                uids: vec![(
                    "10.244.0.11".parse().unwrap(),
                    "0b7e3f52-6a1d-4c8e-9f2b-5d4a3c2b1e0f".into(),
                )],
                target: Some(crate::target::follow::Moved {
                    netns_inode: 4_026_532_999,
                    addrs: vec!["10.244.0.11".parse().unwrap()],
                    resolv: Some(crate::pods::resolv::ResolvConf {
                        nameservers: vec!["10.96.0.10".parse().unwrap()],
                        search: vec!["default.svc.cluster.local".into()],
                        ndots: 5,
                        options: vec![],
                    }),
                }),
                // A node a cluster view joined.
                joined: Some(Box::new(crate::target::follow::Joined {
                    id: 3,
                    name: "node3".into(),
                    attachments: [(
                        "10.244.3.53".parse().unwrap(),
                        crate::pods::net::Attachment::Routed,
                    )]
                    .into(),
                    routes: Default::default(),
                    resolvers: vec!["10.244.3.53".parse().unwrap()],
                    service_ips: vec!["10.96.0.10".parse().unwrap()],
                    node_netns: 4_026_532_300,
                })),
            },
        },
        Input::Tick(5_100_000_000),
    ]
}

/// Records [`inputs`] to `path` (eth0, a drop reason and a symbol named)
/// and returns them.
pub fn record_inputs(path: &Path, clock: crate::clock::Clock) -> Vec<crate::pipeline::Input> {
    use super::{RecordOptions, Recorder};
    use crate::{
        correlate::Limits, decode::KernelNames, diagnose::Context, output::Labels, pipeline::Tap,
    };
    let kernel = KernelNames::new(
        [(3, "SKB_DROP_REASON_NO_SOCKET".to_owned())].into(),
        "ffffffff81000000 T __udp4_lib_rcv\n".as_bytes(),
    );
    let labels = Labels::new([(2, "eth0".to_owned())].into(), clock, kernel);
    let meta = super::meta(&labels, &Context::default(), Limits::default());
    let options = RecordOptions {
        path: path.to_owned(),
        max_bytes: None,
        files: None,
    };
    let mut rec = Recorder::create(options, meta).unwrap();
    rec.start(4_000_000_000);
    let fed = inputs();
    fed.iter().for_each(|i| rec.input(i));
    rec.end(6_000_000_000);
    fed
}

#[tokio::test]
async fn a_recording_replays_the_inputs_it_was_fed() {
    use super::replay::{About, Replay, Speed};
    use crate::{clock::Clock, pipeline::Source};
    let dir = TestDir::new();
    let path = dir.path().join("r.pcapng");
    let fed = record_inputs(&path, Clock::EPOCH);

    let about = About::read(&path).unwrap();
    assert_eq!(about.started_ns, Some(4_000_000_000));
    assert_eq!(about.labels().kernel().drop_reason(3), "NO_SOCKET");
    assert_eq!(
        about.labels().iface_names().get(&2).map(String::as_str),
        Some("eth0")
    );
    assert_eq!(
        about.labels().kernel().location(0xffff_ffff_8100_0000),
        "__udp4_lib_rcv+0x0"
    );
    let mut replay = Replay::open(&path, &about, vec![53], Speed::Fast).unwrap();
    let mut back = Vec::new();
    while let Some(i) = replay.next().await.unwrap() {
        back.push(i);
    }
    assert_eq!(format!("{back:?}"), format!("{fed:?}"));
    assert_eq!(replay.now(), 6_000_000_000);
    assert!(replay.error.is_none());
}

/// `--node`: the recording names the node it saw alone, and its replay
/// says so; a header written before it was noted reads as no node.
#[test]
fn a_recording_names_the_node_it_was_scoped_to() {
    use super::{replay::About, RecordOptions, Recorder};
    use crate::{
        clock::Clock, correlate::Limits, decode::KernelNames, diagnose::Context, output::Labels,
        pipeline::Tap,
    };
    let dir = TestDir::new();
    let path = dir.path().join("node.pcapng");
    let labels = Labels::new(Default::default(), Clock::EPOCH, KernelNames::default());
    let meta = super::meta(&labels, &Context::default(), Limits::default()).of_node(Some("n-2"));
    let options = RecordOptions {
        path: path.clone(),
        max_bytes: None,
        files: None,
    };
    let mut rec = Recorder::create(options, meta).unwrap();
    rec.start(1);
    rec.end(2);
    drop(rec);
    let about = About::read(&path).unwrap();
    assert_eq!(about.header.as_ref().unwrap().scope.as_deref(), Some("n-2"));
    assert_eq!(about.headline("x.pcapng"), "replay of x.pcapng (node n-2)");
    let mut old = serde_json::to_value(about.header.unwrap()).unwrap();
    old.as_object_mut().unwrap().remove("scope");
    let old: super::notes::Header = serde_json::from_value(old).unwrap();
    assert_eq!(old.scope, None);
}

/// Found by fuzzing (on the `fuzz` branch): a capture's timestamp near the
/// end of time (pcapng's 64-bit units saturate to u64::MAX nanoseconds)
/// overflowed the next tick.
#[tokio::test]
async fn a_capture_at_the_end_of_time_replays() {
    use super::replay::{About, Replay, Speed};
    use crate::pipeline::{Input, Source};
    let dir = TestDir::new();
    let path = dir.path().join("end.pcapng");
    let file = std::fs::File::create(&path).unwrap();
    let mut w = Writer::new(file, &SectionInfo::default()).unwrap();
    let raw = Interface {
        linktype: LINKTYPE_RAW,
        ..Default::default()
    };
    let id = w.interface(&raw).unwrap();
    let query = dns_message(1, "end.test.", None);
    let f = frame::encode(&packet(
        "10.0.0.1:4000",
        "10.0.0.2:53",
        Transport::Udp,
        &query,
    ));
    for ts_ns in [u64::MAX - 1, u64::MAX] {
        w.packet(id, ts_ns, &f.data, f.orig_len, &[]).unwrap();
    }
    w.flush().unwrap();
    drop(w);
    let about = About::read(&path).unwrap();
    let mut replay = Replay::open(&path, &about, vec![53], Speed::Fast).unwrap();
    let mut inputs = Vec::new();
    while let Some(input) = replay.next().await.unwrap() {
        inputs.push(input);
    }
    assert!(matches!(
        &inputs[..],
        [Input::Tick(t), Input::Packets(p)] if *t == u64::MAX - 1 && p.len() == 2
    ));
}

/// A datagram in three fragments (IP data [0, 600), [600, 1200), [1200,
/// 1642)) at two hook points, the middle one lost at the second, and a
/// tick past the timeout.
fn fragment_inputs() -> Vec<crate::pipeline::Input> {
    use crate::pipeline::Input;
    let three = fragments(
        &big_answer(0x2a, 100),
        600,
        "10.96.0.10:53",
        "10.244.0.10:40000",
        9,
    );
    let mut packets = Vec::new();
    for (i, f) in three.into_iter().enumerate() {
        let ts_ns = 5_000_000_000 + i as u64 * 1_000;
        let mut veth = f.clone();
        (veth.ts_ns, veth.hook, veth.ifindex) = (ts_ns, Hook::DevXmit, 5);
        veth.ifname = Some("veth0".into());
        packets.push(veth);
        if i != 1 {
            let mut pod = f;
            (pod.ts_ns, pod.hook, pod.netns) = (ts_ns + 500, Hook::DevReceive, 4026532318);
            pod.ifname = Some("eth0".into());
            packets.push(pod);
        }
    }
    vec![Input::Packets(packets), Input::Tick(8_000_000_000)]
}

/// The records the pipeline makes of `inputs` (its packets and ticks).
fn records_of(inputs: Vec<crate::pipeline::Input>) -> Vec<crate::decode::Record> {
    use crate::{decode::Decoder, pipeline::Input};
    let mut decoder = Decoder::default();
    let mut out = Vec::new();
    for input in inputs {
        match input {
            Input::Packets(b) => b.into_iter().for_each(|p| decoder.decode(p, &mut out)),
            Input::Tick(now_ns) => decoder.tick(now_ns, &mut out),
            _ => {}
        }
    }
    out
}

/// Every input replayed from `path`.
pub(crate) fn replayed(path: &Path) -> Vec<crate::pipeline::Input> {
    use super::replay::{About, Replay, Speed};
    let about = About::read(path).unwrap();
    let mut replay = Replay::open(path, &about, vec![53], Speed::Fast).unwrap();
    std::iter::from_fn(|| replay.next_input()).collect()
}

/// Fragments recorded by dnstrace replay into the records they made live:
/// whole where all came, cut where one was lost, and where it was last
/// seen.
#[test]
fn recorded_fragments_replay_to_the_same_records() {
    use super::{RecordOptions, Recorder};
    use crate::{correlate::Limits, diagnose::Context, output::Labels, pipeline::Tap};
    let dir = TestDir::new();
    let path = dir.path().join("frags.pcapng");
    let labels = Labels::new(
        Default::default(),
        crate::clock::Clock::EPOCH,
        Default::default(),
    );
    let meta = super::meta(&labels, &Context::default(), Limits::default());
    let options = RecordOptions {
        path: path.clone(),
        max_bytes: None,
        files: None,
    };
    let mut rec = Recorder::create(options, meta).unwrap();
    rec.start(4_000_000_000);
    fragment_inputs().iter().for_each(|i| rec.input(i));
    rec.end(9_000_000_000);
    drop(rec);
    let live = records_of(fragment_inputs());
    let back = records_of(replayed(&path));
    assert_eq!(format!("{back:?}"), format!("{live:?}"));
    let [whole, cut] = &live[..] else {
        panic!("{live:?}")
    };
    assert!(matches!(&whole.body, Body::Dns(m) if m.answers.len() == 100));
    assert!(matches!(&cut.body, Body::Cut(m) if m.id == 0x2a));
    let missing = cut.missing.as_ref().unwrap();
    assert_eq!(missing.offset, 600);
    assert_eq!(missing.last_seen.as_ref().map(|s| s.ifindex), Some(5));
    let errors = tshark_errors(path.to_str().unwrap(), "");
    assert!(!errors.contains("Errors"), "{errors}");
}

/// A capture of fragments, as tcpdump writes it (later fragments without
/// ports), replays into the whole datagrams; tshark puts them together
/// too, without complaint. (Only where it checks UDP checksums, which it
/// does not unless asked, does it find the IPv6 datagram's wrong: its first
/// fragment was written before the data the checksum covers was seen, and
/// IPv6 has no "no checksum".)
#[test]
fn captured_fragments_replay_whole_and_tshark_reads_them() {
    let dir = TestDir::new();
    let path = dir.path().join("frags.pcapng");
    let mut w = Writer::new(
        std::fs::File::create(&path).unwrap(),
        &SectionInfo::default(),
    )
    .unwrap();
    let raw = Interface {
        linktype: LINKTYPE_RAW,
        ..Default::default()
    };
    let id = w.interface(&raw).unwrap();
    let answer = big_answer(0x2a, 100);
    let v4 = fragments(&answer, 600, "10.96.0.10:53", "10.244.0.10:40000", 9);
    let v6 = fragments(
        &answer,
        1232,
        "[fd00::53]:53",
        "[fd00::10]:40000",
        0xdead_beef,
    );
    for (i, p) in v4.iter().chain(&v6).rev().enumerate() {
        let f = frame::encode(p);
        let ts_ns = 1_700_000_000_000_000_000 + i as u64 * 1_000;
        w.packet(id, ts_ns, &f.data, f.orig_len, &[]).unwrap();
    }
    w.flush().unwrap();
    drop(w);
    let records = records_of(replayed(&path));
    let got: Vec<_> = records
        .iter()
        .map(|r| match &r.body {
            Body::Dns(m) => (r.packet.src.to_string(), m.answers.len()),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        got,
        [("[fd00::53]:53".into(), 100), ("10.96.0.10:53".into(), 100)]
    );
    let path = path.to_str().unwrap();
    let fields = [
        "-r",
        path,
        "-T",
        "fields",
        "-e",
        "dns.id",
        "-e",
        "dns.count.answers",
    ];
    let shown: Vec<_> = tshark(&fields)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect();
    assert_eq!(shown, ["0x002a\t100", "0x002a\t100"]);
    let errors = tshark(&["-r", path, "-q", "-z", "expert,error"]);
    assert!(!errors.contains("Errors"), "{errors}");
    let errors = tshark_errors(path, "ip");
    assert!(!errors.contains("Errors"), "{errors}");
}

mod formats;
mod tools;
