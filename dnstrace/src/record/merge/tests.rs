//! Recordings of two nodes made here, one lookup crossing between them,
//! merged back into one journey.
use std::path::{Path, PathBuf};

use dnstrace_common::Hook;
use hickory_proto::op::ResponseCode;

use super::{Clocks, Merge, Recording};
use crate::{
    clock::Clock,
    correlate::Limits,
    decode::{KernelNames, NodeId, Packet, Transport},
    diagnose::Context,
    output::{Format, Labels, LineSink},
    pipeline::{Input, JourneySink, Pipeline, Sink as _, Tap as _},
    pods::testdir::TestDir,
    record::{
        replay::Speed,
        tests::{dns_message, packet},
        RecordOptions, Recorder,
    },
};

const US: u64 = 1_000;
/// Node 1's wall clock less its monotonic one.
const OFFSET_1: i64 = 1_700_000_000_000_000_000;
/// Node 3 booted 3 s before node 1: its monotonic clock reads 3 s more.
const BOOTED_EARLIER: u64 = 3_000_000_000;
/// Node 3's wall clock is this far ahead of node 1's.
const ERROR_NS: i64 = 150_000;
/// The same inode on both nodes: each node's first namespace.
const HOST_NETNS: u32 = 4026531840;

const CLIENT: &str = "10.244.1.10:40000";
const SERVICE: &str = "10.96.0.10:53";
const COREDNS: &str = "10.244.3.53:53";
const NAME: &str = "web.default.svc.cluster.local.";

/// A query (or its answer) from `src` to `dst` at `ts_ns`, seen at `hook`
/// on `dev` (its name, namespace and index).
fn seen(
    ts_ns: u64,
    hook: Hook,
    dev: (&str, u32, u32),
    src: &str,
    dst: &str,
    answer: bool,
) -> Packet {
    let rcode = answer.then_some(ResponseCode::NoError);
    let mut p = packet(src, dst, Transport::Udp, &dns_message(7, NAME, rcode));
    (p.ts_ns, p.hook) = (ts_ns, hook);
    (p.ifname, p.netns, p.ifindex) = (Some(dev.0.into()), dev.1, dev.2);
    p
}

/// Node 1's half, in its own monotonic time from `t0`: the client's
/// query out through flannel.1, the answer back in.
fn client_half(t0: u64) -> Vec<Packet> {
    let pod = ("eth0", 4026532001, 2);
    let flannel = ("flannel.1", HOST_NETNS, 5);
    vec![
        seen(t0, Hook::DevXmit, pod, CLIENT, SERVICE, false),
        seen(t0 + 10 * US, Hook::DevXmit, flannel, CLIENT, COREDNS, false),
        seen(
            t0 + 330 * US,
            Hook::DevReceive,
            flannel,
            COREDNS,
            CLIENT,
            true,
        ),
        seen(t0 + 340 * US, Hook::DevReceive, pod, SERVICE, CLIENT, true),
    ]
}

/// Node 3's half, in node 1's monotonic time from `t0` (the same `t0`):
/// 100 µs over the overlay each way, CoreDNS answering in 100 µs.
fn server_half(t0: u64) -> Vec<Packet> {
    let flannel = ("flannel.1", HOST_NETNS, 5);
    let coredns = ("eth0", 4026532003, 2);
    vec![
        seen(
            t0 + 110 * US,
            Hook::DevReceive,
            flannel,
            CLIENT,
            COREDNS,
            false,
        ),
        seen(
            t0 + 120 * US,
            Hook::DevReceive,
            coredns,
            CLIENT,
            COREDNS,
            false,
        ),
        seen(t0 + 220 * US, Hook::DevXmit, coredns, COREDNS, CLIENT, true),
        seen(t0 + 230 * US, Hook::DevXmit, flannel, COREDNS, CLIENT, true),
    ]
}

/// Records `inputs` as node `node` with the clock offset `offset_ns`.
fn record(path: &Path, node: &str, offset_ns: i64, inputs: &[Input]) {
    let labels = Labels::new(
        Default::default(),
        Clock::with_offset(offset_ns),
        KernelNames::default(),
    );
    let mut meta = crate::record::meta(&labels, &Context::default(), Limits::default());
    meta.header.node = node.into();
    let options = RecordOptions {
        path: path.to_owned(),
        max_bytes: None,
        files: None,
    };
    let mut rec = Recorder::create(options, meta).unwrap();
    let first = inputs.iter().find_map(super::time_of).unwrap_or(0);
    rec.start(first);
    inputs.iter().for_each(|i| rec.input(i));
    rec.end(first + 10_000_000_000);
}

/// Shifted by `by` ns: the same moments on another node's monotonic clock.
fn later(mut packets: Vec<Packet>, by: u64) -> Vec<Packet> {
    packets.iter_mut().for_each(|p| p.ts_ns += by);
    packets
}

/// The two nodes' recordings of one lookup at 1 s of node 1's clock;
/// `node3_offset_ns` is node 3's clock offset as its header says it.
fn two_nodes(dir: &TestDir, node3_offset_ns: i64) -> Vec<PathBuf> {
    let t0 = 1_000_000_000;
    let (a, b) = (dir.path().join("a.pcapng"), dir.path().join("b.pcapng"));
    let tick = |t: u64| Input::Tick(t + 1_000_000);
    record(
        &a,
        "node1",
        OFFSET_1,
        &[Input::Packets(client_half(t0)), tick(t0)],
    );
    let server = later(server_half(t0), BOOTED_EARLIER);
    let b_tick = tick(t0 + BOOTED_EARLIER);
    record(
        &b,
        "node3",
        node3_offset_ns,
        &[Input::Packets(server), b_tick],
    );
    vec![a, b]
}

/// Node 3's clock offset as its header says it: right, but for its wall
/// clock's error.
fn node3_offset() -> i64 {
    OFFSET_1 - BOOTED_EARLIER as i64 + ERROR_NS
}

/// The journeys `paths` replay to, as JSON lines or text, and the clocks.
fn replay(paths: &[PathBuf], format: Format) -> (String, Clocks) {
    let recs = Recording::read_all(paths).unwrap();
    let clocks = Clocks::estimate(&recs, &[53]).unwrap();
    let mut merge = Merge::open(&recs, &clocks, &[53], Speed::Fast).unwrap();
    let about = super::about(&recs);
    let lines = LineSink::new(format, super::labels(&recs), Vec::new());
    let mut sink = JourneySink::new(about.limits(), about.context(), lines);
    let mut pipe = Pipeline::default();
    while let Some(input) = merge.next_input() {
        pipe.step(input, &mut sink).unwrap();
    }
    sink.finish(crate::pipeline::Source::now(&merge)).unwrap();
    let out = String::from_utf8(sink.out.written().clone()).unwrap();
    (out, clocks)
}

fn journeys(json: &str) -> Vec<serde_json::Value> {
    json.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["type"] == "journey")
        .collect()
}

/// Each leg as (node, device, answer), in the journey's order.
fn legs(j: &serde_json::Value) -> Vec<(String, String, bool)> {
    let legs = j["legs"].as_array().unwrap();
    legs.iter()
        .map(|l| {
            let node = l["node"].as_str().unwrap_or("").to_owned();
            let iface = l["iface"].as_str().unwrap().to_owned();
            (node, iface, l["response"].as_bool().unwrap())
        })
        .collect()
}

#[test]
fn a_lookup_across_two_nodes_is_one_journey_in_order() {
    let dir = TestDir::new();
    let paths = two_nodes(&dir, node3_offset());
    let (json, clocks) = replay(&paths, Format::Json);
    let node3 = &clocks.0[1];
    assert_eq!(node3.against.as_deref(), Some("node1"));
    assert_eq!(node3.pairs, 2, "the query one way, the answer the other");
    assert!((node3.error_ns - ERROR_NS).abs() < 3_000, "{node3:?}");
    let all = journeys(&json);
    assert_eq!(all.len(), 1, "{json}");
    let leg = |node: &str, iface: &str, answer| (node.to_owned(), iface.to_owned(), answer);
    assert_eq!(
        legs(&all[0]),
        [
            leg("node1", "eth0", false),
            leg("node1", "flannel.1", false),
            leg("node3", "flannel.1", false),
            leg("node3", "eth0", false),
            leg("node3", "eth0", true),
            leg("node3", "flannel.1", true),
            leg("node1", "flannel.1", true),
            leg("node1", "eth0", true),
        ]
    );
    assert_eq!(all[0]["outcome"]["status"], "answered");
    assert_eq!(all[0]["total_ms"], 0.34);

    let (text, _) = replay(&paths, Format::Text);
    assert!(text.contains(" node3 flannel.1@4026531840 "), "{text}");
}

/// Without the estimate (its headers' clocks alone), node 3's legs come
/// 150 µs late: its answer leaves after node 1 has it. The test above
/// would see that.
#[test]
fn without_the_estimate_the_legs_are_out_of_order() {
    let dir = TestDir::new();
    let paths = two_nodes(&dir, node3_offset());
    let recs = Recording::read_all(&paths).unwrap();
    let mut clocks = Clocks::estimate(&recs, &[53]).unwrap();
    clocks.0[1].shift_ns += clocks.0[1].error_ns;
    let mut merge = Merge::open(&recs, &clocks, &[53], Speed::Fast).unwrap();
    let times: Vec<(u64, NodeId, bool)> = std::iter::from_fn(|| merge.next_input())
        .filter_map(|i| match i {
            Input::Packets(b) => Some(b),
            _ => None,
        })
        .flatten()
        .map(|p| (p.ts_ns, p.node, p.src.to_string() == COREDNS))
        .collect();
    let node3_answer_out = times.iter().find(|(_, n, a)| *n == NodeId(2) && *a);
    let node1_answer_in = times.iter().find(|(_, n, a)| *n == NodeId(1) && *a);
    assert!(node3_answer_out.unwrap().0 > node1_answer_in.unwrap().0);
}

#[test]
fn one_nodes_recording_alone_gives_its_half() {
    let dir = TestDir::new();
    let paths = two_nodes(&dir, node3_offset());
    let (json, clocks) = replay(&paths[..1], Format::Json);
    assert_eq!(clocks.0.len(), 1);
    let all = journeys(&json);
    assert_eq!(all.len(), 1);
    let nodes: Vec<_> = legs(&all[0]).into_iter().map(|(n, ..)| n).collect();
    assert_eq!(
        nodes,
        ["", "", "", ""],
        "no node named: the lines as they were"
    );
}

/// Packets and ticks of two files, 1 ms apart in turn, and the second
/// file's monotonic clock 10 s ahead: handed on in one order, each tagged
/// with its node.
#[test]
fn inputs_of_several_files_are_handed_on_in_time_order() {
    let dir = TestDir::new();
    let (a, b) = (dir.path().join("a.pcapng"), dir.path().join("b.pcapng"));
    let ms = 1_000_000;
    let at = |t: u64, shift: u64| {
        let p = seen(
            t + shift,
            Hook::DevXmit,
            ("eth0", 1, 2),
            CLIENT,
            SERVICE,
            false,
        );
        vec![Input::Packets(vec![p]), Input::Tick(t + shift + ms / 2)]
    };
    let odd: Vec<_> = [1, 3, 5].iter().flat_map(|t| at(t * ms, 0)).collect();
    let even: Vec<_> = [2, 4, 6]
        .iter()
        .flat_map(|t| at(t * ms, 10_000 * ms))
        .collect();
    record(&a, "node1", OFFSET_1, &odd);
    record(&b, "node2", OFFSET_1 - 10_000 * ms as i64, &even);
    let recs = Recording::read_all(&[a, b]).unwrap();
    let clocks = Clocks::estimate(&recs, &[53]).unwrap();
    assert_eq!(clocks.0[1].pairs, 0, "no message crossed");
    let mut merge = Merge::open(&recs, &clocks, &[53], Speed::Fast).unwrap();
    let mut packets = Vec::new();
    let mut times = Vec::new();
    while let Some(input) = merge.next_input() {
        times.extend(super::time_of(&input));
        if let Input::Packets(b) = input {
            packets.extend(b.iter().map(|p| (p.ts_ns / ms, p.node.0)));
        }
    }
    assert_eq!(
        packets,
        [(1, 1), (2, 2), (3, 1), (4, 2), (5, 1), (6, 2)],
        "by time, each with its node"
    );
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
}

#[test]
fn the_same_capture_twice_is_refused() {
    let dir = TestDir::new();
    let paths = two_nodes(&dir, node3_offset());
    let twice = [paths[0].clone(), paths[0].clone()];
    let e = Recording::read_all(&twice).err().unwrap().to_string();
    assert!(e.contains("the same node's capture"), "{e}");
    let copy = dir.path().join("copy.pcapng");
    std::fs::copy(&paths[0], &copy).unwrap();
    let e = Recording::read_all(&[paths[0].clone(), copy]).err();
    assert!(e.is_some(), "a copy is the same capture");
}

/// Nodes that share a host name (the lab's, on one kernel) are named
/// after their files.
#[test]
fn nodes_of_one_name_are_named_after_their_files() {
    let dir = TestDir::new();
    let paths = two_nodes(&dir, node3_offset());
    let recs = Recording::read_all(&paths).unwrap();
    let names: Vec<_> = recs.iter().map(|r| r.node.as_str()).collect();
    assert_eq!(names, ["node1", "node3"]);
    let (c, d) = (dir.path().join("c.pcapng"), dir.path().join("d.pcapng"));
    let tick = [Input::Tick(1_000_000_000)];
    record(&c, "host", OFFSET_1, &tick);
    record(&d, "host", OFFSET_1 + 1, &tick);
    let recs = Recording::read_all(&[c, d]).unwrap();
    let names: Vec<_> = recs.iter().map(|r| r.node.as_str()).collect();
    assert_eq!(names, ["c", "d"]);
}

#[test]
fn a_file_that_is_no_recording_is_said_so() {
    let dir = TestDir::new();
    let junk = dir.path().join("junk.pcapng");
    std::fs::write(&junk, b"not a capture at all").unwrap();
    let missing = dir.path().join("missing.pcapng");
    for bad in [junk, missing] {
        let e = Recording::read_all(std::slice::from_ref(&bad))
            .err()
            .unwrap();
        assert!(
            format!("{e:#}").contains(&bad.display().to_string()),
            "{e:#}"
        );
    }
}

/// The clock estimate's pass stops a crossing's span after its sample
/// is full: a message seen again later (a retry) is not read, one seen
/// again within the span is.
#[test]
fn the_estimate_reads_no_further_than_it_needs() {
    use super::{Message, Sample, MAX_SAMPLE, MAX_SPAN_NS};
    let dir = TestDir::new();
    let path = dir.path().join("full.pcapng");
    let (t0, flannel, eth0) = (
        1_000_000_000,
        ("flannel.1", HOST_NETNS, 5),
        ("eth0", HOST_NETNS, 2),
    );
    let client = |i: usize| format!("10.244.1.10:{}", 20_000 + i);
    let mut packets: Vec<Packet> = (0..MAX_SAMPLE)
        .map(|i| {
            seen(
                t0 + i as u64 * US,
                Hook::DevXmit,
                flannel,
                &client(i),
                COREDNS,
                false,
            )
        })
        .collect();
    let filled = t0 + MAX_SAMPLE as u64 * US;
    let last = client(MAX_SAMPLE - 1);
    packets.push(seen(
        filled + 500 * US,
        Hook::DevXmit,
        eth0,
        &last,
        COREDNS,
        false,
    ));
    let retry = filled + 3 * MAX_SPAN_NS as u64;
    let again = seen(retry, Hook::DevXmit, eth0, &client(0), COREDNS, false);
    // The tick ends the replay's batch: the retry comes in one of its own.
    let inputs = [
        Input::Packets(packets),
        Input::Tick(filled + 600 * US),
        Input::Packets(vec![again]),
        Input::Tick(retry + 1),
    ];
    record(&path, "node1", OFFSET_1, &inputs);
    let recs = Recording::read_all(&[path]).unwrap();
    let sample = Sample::read(&recs[0], &[53], i64::MIN).unwrap();
    assert_eq!(sample.0.len(), MAX_SAMPLE);
    let span_of = |src: &str| {
        let m = Message::of(&seen(0, Hook::DevXmit, eth0, src, COREDNS, false)).unwrap();
        sample.0[&m].span()
    };
    assert_eq!(span_of(&last), 500 * US as i64 + US as i64);
    assert_eq!(span_of(&client(0)), 0);
}

/// Node 1's recorder ran a minute before node 3's, and saw more messages
/// in that minute than a sample holds: the sample starts where both files
/// have begun, so the lookup that crossed later is still matched.
#[test]
fn a_file_begun_earlier_is_sampled_from_where_the_others_begin() {
    use super::MAX_SAMPLE;
    let dir = TestDir::new();
    let (a, b) = (dir.path().join("a.pcapng"), dir.path().join("b.pcapng"));
    let t0 = 100_000_000_000;
    let pod = ("eth0", 4026532001, 2);
    let early: Vec<Packet> = (0..=MAX_SAMPLE)
        .map(|i| {
            let src = format!("10.244.1.10:{}", 20_000 + i);
            seen(
                t0 - 60_000_000_000 + i as u64 * US,
                Hook::DevXmit,
                pod,
                &src,
                SERVICE,
                false,
            )
        })
        .collect();
    let tick = |t: u64| Input::Tick(t + 1_000_000);
    record(
        &a,
        "node1",
        OFFSET_1,
        &[
            Input::Packets(early),
            tick(t0 - 50_000_000_000),
            Input::Packets(client_half(t0)),
            tick(t0),
        ],
    );
    let server = later(server_half(t0), BOOTED_EARLIER);
    record(
        &b,
        "node3",
        node3_offset(),
        &[Input::Packets(server), tick(t0 + BOOTED_EARLIER)],
    );
    let recs = Recording::read_all(&[a, b]).unwrap();
    let clocks = Clocks::estimate(&recs, &[53]).unwrap();
    let node3 = &clocks.0[1];
    assert_eq!(node3.pairs, 2, "{node3:?}");
    assert!((node3.error_ns - ERROR_NS).abs() < 3_000, "{node3:?}");
}
