//! Recordings through Debian's pcapng tools: tcpdump reads every packet,
//! editcap cuts a time window, mergecap merges rotated files, windows and
//! several nodes' recordings; what they write replays to the originals'
//! journeys, those of the packets kept.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, UNIX_EPOCH},
};

use anyhow::Result;
use dnstrace_common::Hook;
use hickory_proto::op::ResponseCode;
use serde_json::Value;

use super::{dns_message, packet};
use crate::{
    clock::Clock,
    conntrack::{CtEvent, CtEventKind},
    correlate::Limits,
    decode::{CtTuple, KernelNames, Transport},
    diagnose::Context,
    naming::Names,
    output::{Format, Labels, LineSink},
    pipeline::{Input, JourneySink, Pipeline, Sink as _, Source as _, Tap as _},
    pods::testdir::TestDir,
    record::{
        layout,
        merge::{self, Clocks, Merge, Recording},
        pcapng::{Block, Reader, Writer},
        replay::Speed,
        RecordOptions, Recorder,
    },
};

/// The wall clock less the kernel's monotonic one.
const OFFSET_NS: i64 = 1_764_460_800_000_000_000;
const START_NS: u64 = 1_000_000_000;
/// A lookup every 100 ms, answered in 1 ms, a tick between.
const EVERY_NS: u64 = 100_000_000;
const LOOKUPS: u64 = 40;

/// A burst of 20,000 conntrack events of other traffic: a note of over a
/// megabyte, more than tcpdump or editcap take of a packet.
fn burst(now_ns: u64) -> Input {
    let tuple = |src: &str, dst: &str| CtTuple {
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
    };
    let event = CtEvent {
        kind: CtEventKind::New,
        proto: 17,
        status: 8,
        original: tuple("192.0.2.1:40000", "192.0.2.2:123"),
        reply: tuple("192.0.2.2:123", "192.0.2.1:40000"),
    };
    Input::Conntrack {
        now_ns,
        events: vec![event; 20_000],
    }
}

/// Lookup `i`'s query and answer, then a tick; a burst of conntrack
/// events after the 16th.
fn lookups() -> Vec<Input> {
    let mut inputs = Vec::new();
    for i in 0..LOOKUPS {
        let t = START_NS + i * EVERY_NS;
        let name = format!("n{i}.example.test.");
        let client = format!("10.244.0.10:{}", 40_000 + i);
        let mut q = packet(
            &client,
            "10.96.0.10:53",
            Transport::Udp,
            &dns_message(i as u16, &name, None),
        );
        (q.ts_ns, q.hook, q.ifname) = (t, Hook::TcEgress, Some("eth0".into()));
        let answer = dns_message(i as u16, &name, Some(ResponseCode::NoError));
        let mut a = packet("10.96.0.10:53", &client, Transport::Udp, &answer);
        (a.ts_ns, a.hook, a.ifname) = (t + 1_000_000, Hook::TcIngress, Some("eth0".into()));
        inputs.push(Input::Packets(vec![q, a]));
        if i == 15 {
            inputs.push(burst(t + EVERY_NS / 4));
        }
        inputs.push(Input::Tick(t + EVERY_NS / 2));
    }
    inputs
}

/// A large cluster's pod names: the file's notes take several comments.
fn names() -> Names {
    let names = (0..4_000u32).map(|i| {
        let ip = std::net::Ipv4Addr::from(0x0af5_0000 + i).into();
        (ip, format!("namespace-{i}/pod-{i:0>40}"))
    });
    Names::from_entries(names.collect())
}

/// Records [`lookups`] on `node` to `path`, in files of `max_bytes`.
fn record(path: &Path, node: &str, max_bytes: Option<u64>) {
    record_as(path, (node, OFFSET_NS, 0), &lookups(), max_bytes);
}

/// Records `inputs` on `node`, whose wall clock less its monotonic one
/// is `offset_ns` and whose monotonic clock is `ahead_ns` ahead of node
/// 1's, from [`START_NS`] to past [`LOOKUPS`] on node 1's clock.
fn record_as(
    path: &Path,
    (node, offset_ns, ahead_ns): (&str, i64, u64),
    inputs: &[Input],
    max_bytes: Option<u64>,
) {
    let clock = Clock::with_offset(offset_ns);
    let labels = Labels::new(
        [(2, "eth0".to_owned())].into(),
        clock,
        KernelNames::default(),
    )
    .with_names(names());
    let mut meta = crate::record::meta(&labels, &Context::default(), Limits::default());
    let started_ns = START_NS - 1 + ahead_ns;
    (meta.header.node, meta.header.started_ns) = (node.into(), started_ns);
    let options = RecordOptions {
        path: path.to_owned(),
        max_bytes,
        files: None,
    };
    let mut rec = Recorder::create(options, meta).unwrap();
    rec.start(started_ns);
    inputs.iter().for_each(|i| rec.input(i));
    rec.end(START_NS + LOOKUPS * EVERY_NS + ahead_ns);
}

/// The journeys `paths` replay to, without their numbers (a window's
/// count from its first).
pub(super) fn journeys(paths: &[PathBuf]) -> Result<Vec<Value>> {
    let (mut js, _) = replayed(paths)?;
    js.retain(|j| j["type"] == "journey");
    for j in &mut js {
        let j = j.as_object_mut().unwrap();
        j.remove("id");
        j.remove("lookup");
    }
    Ok(js)
}

/// Every line `paths` replay to (journeys, anomalies), and the clocks
/// they were put on.
fn replayed(paths: &[PathBuf]) -> Result<(Vec<Value>, Clocks)> {
    let recs = Recording::read_all(paths)?;
    let clocks = Clocks::estimate(&recs, &[53])?;
    let mut replay = Merge::open(&recs, &clocks, &[53], Speed::Fast)?;
    let about = merge::about(&recs);
    let lines = LineSink::new(Format::Json, merge::labels(&recs), Vec::new());
    let mut sink = JourneySink::new(about.limits(), about.context(), lines);
    let mut pipe = Pipeline::default();
    while let Some(input) = replay.next_input() {
        pipe.step(input, &mut sink)?;
    }
    sink.finish(replay.now())?;
    assert_eq!(replay.skipped(), 0, "no frame of a recording is skipped");
    let out = String::from_utf8(sink.out.written().clone())?;
    let lines = out.lines().map(serde_json::from_str::<Value>);
    Ok((lines.collect::<Result<_, _>>()?, clocks))
}

/// The journeys of lookups `first..=last`.
fn of_lookups(js: &[Value], lookups: std::ops::RangeInclusive<u64>) -> Vec<Value> {
    let names: Vec<String> = lookups.map(|i| format!("n{i}.example.test.")).collect();
    js.iter()
        .filter(|j| names.iter().any(|n| j["name"] == n.as_str()))
        .cloned()
        .collect()
}

fn run(program: &str, args: &[&str]) -> (String, String) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} must be installed (cargo xtask setup): {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{program} {args:?}: {stderr}");
    (stdout, stderr)
}

/// The time, as editcap's -A and -B take it, at which lookup `i` starts,
/// less 10 ms.
fn before_lookup(i: u64) -> String {
    let mono = START_NS + i * EVERY_NS - 10_000_000;
    let wall = UNIX_EPOCH + Duration::from_nanos(mono.saturating_add_signed(OFFSET_NS));
    humantime::format_rfc3339_nanos(wall).to_string()
}

/// Lookups `first..=last`, cut from `from` by editcap into `to`.
fn window(from: &Path, to: &Path, lookups: std::ops::RangeInclusive<u64>) {
    let (a, b) = (
        before_lookup(*lookups.start()),
        before_lookup(lookups.end() + 1),
    );
    let args = ["-A", &a, "-B", &b, path(from), path(to)];
    run("editcap", &args);
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Packets in the file, as dnstrace reads it.
fn packets_in(p: &Path) -> usize {
    let reader = Reader::new(std::fs::File::open(p).unwrap()).unwrap();
    let blocks = reader.map(Result::unwrap);
    blocks.filter(|b| matches!(b, Block::Packet { .. })).count()
}

/// tcpdump reads every packet of `p`, our lookups' with their direction.
fn tcpdump_reads_all_of(p: &Path) {
    let (out, err) = run("tcpdump", &["-nr", path(p)]);
    assert!(!err.contains("tcpdump:"), "{err}");
    // A note's packet comes with its bytes, on lines of their own.
    let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with('\t')).collect();
    assert_eq!(lines.len(), packets_in(p), "{out}");
    let queries = lines.iter().filter(|l| l.contains(" Out IP 10.244.0.10."));
    let answers = lines
        .iter()
        .filter(|l| l.contains(" In  IP 10.96.0.10.53 > "));
    assert_eq!(queries.count(), answers.count(), "{out}");
}

#[test]
fn tcpdump_editcap_and_mergecap_keep_what_a_recording_replays_to() {
    let dir = TestDir::new();
    let whole = dir.path().join("whole.pcapng");
    record(&whole, "node1", None);
    let all = journeys(std::slice::from_ref(&whole)).unwrap();
    assert_eq!(all.len(), LOOKUPS as usize);
    assert!(all.iter().all(|j| j["outcome"]["status"] == "answered"));
    tcpdump_reads_all_of(&whole);

    // A window from the middle: the lookups it holds whole.
    let middle = dir.path().join("middle.pcapng");
    window(&whole, &middle, 10..=24);
    assert!(packets_in(&middle) < packets_in(&whole));
    tcpdump_reads_all_of(&middle);
    assert_eq!(journeys(&[middle]).unwrap(), of_lookups(&all, 10..=24));

    // Two windows merged.
    let (early, late) = (
        dir.path().join("early.pcapng"),
        dir.path().join("late.pcapng"),
    );
    window(&whole, &early, 3..=8);
    window(&whole, &late, 30..=36);
    let both = dir.path().join("both.pcapng");
    run("mergecap", &["-w", path(&both), path(&late), path(&early)]);
    tcpdump_reads_all_of(&both);
    let expected = [of_lookups(&all, 3..=8), of_lookups(&all, 30..=36)].concat();
    assert_eq!(journeys(&[both]).unwrap(), expected);

    // The rotated files of the same recording, merged: the whole again.
    let rotated = dir.path().join("rotated.pcapng");
    // Past the 300 KB of notes each file starts with, a few lookups each.
    record(&rotated, "node1", Some(313_000));
    let mut parts = vec![rotated.clone()];
    parts.extend(
        (1..)
            .map(|n| dir.path().join(format!("rotated.pcapng.{n}")))
            .take_while(|p| p.exists()),
    );
    assert!((4..=12).contains(&parts.len()), "{parts:?}");
    let merged = dir.path().join("merged.pcapng");
    let mut args = vec!["-w", path(&merged)];
    args.extend(parts.iter().rev().map(|p| path(p)));
    run("mergecap", &args);
    tcpdump_reads_all_of(&merged);
    assert_eq!(journeys(&[merged]).unwrap(), all);
}

/// Node 2's monotonic clock reads this much more than node 1's (booted
/// earlier)...
const BOOTED_EARLIER: u64 = 3_000_000_000;
/// ...and its wall clock is this far ahead.
const ERROR_NS: i64 = 150_000;

/// Lookup `i` of a client on node 1, answered by CoreDNS on node 2 (every
/// other answer SERVFAIL), as each node saw it on its own clock: node 1
/// sends the query at 0 and has the answer at 340 µs, node 2 has it at
/// 110 µs and answers at 230 µs; a tick on each between lookups.
fn crossing(i: u64) -> [Input; 4] {
    let t = START_NS + i * EVERY_NS;
    let client = format!("10.244.1.10:{}", 40_000 + i);
    let coredns = "10.244.2.53:53";
    let name = format!("n{i}.example.test.");
    let rcode = [ResponseCode::NoError, ResponseCode::ServFail][i as usize % 2];
    let at = |us: u64, hook, (src, dst): (&str, &str), answer: bool| {
        let m = dns_message(i as u16, &name, answer.then_some(rcode));
        let mut p = packet(src, dst, Transport::Udp, &m);
        (p.ts_ns, p.hook, p.ifname) = (t + us * 1_000, hook, Some("flannel.1".into()));
        p
    };
    let (query, answer) = ((&*client, coredns), (coredns, &*client));
    let node1 = vec![
        at(0, Hook::DevXmit, query, false),
        at(340, Hook::DevReceive, answer, true),
    ];
    let mut node2 = vec![
        at(110, Hook::DevReceive, query, false),
        at(230, Hook::DevXmit, answer, true),
    ];
    node2.iter_mut().for_each(|p| p.ts_ns += BOOTED_EARLIER);
    let tick = t + EVERY_NS / 2;
    [
        Input::Packets(node1),
        Input::Tick(tick),
        Input::Packets(node2),
        Input::Tick(tick + BOOTED_EARLIER),
    ]
}

/// Node 1's and node 2's recordings of [`crossing`] lookups.
fn two_nodes(dir: &TestDir) -> [PathBuf; 2] {
    let (one, two) = (dir.path().join("one.pcapng"), dir.path().join("two.pcapng"));
    let inputs: Vec<[Input; 4]> = (0..LOOKUPS).map(crossing).collect();
    let of = |k: usize| -> Vec<Input> {
        let each = inputs
            .iter()
            .flat_map(|i| [i[2 * k].clone(), i[2 * k + 1].clone()]);
        each.collect()
    };
    record_as(&one, ("node1", OFFSET_NS, 0), &of(0), None);
    let offset2 = OFFSET_NS - BOOTED_EARLIER as i64 + ERROR_NS;
    record_as(&two, ("node2", offset2, BOOTED_EARLIER), &of(1), None);
    [one, two]
}

/// Two nodes' recordings merged into one file by mergecap, in either
/// order, replay as the two files given together: the same clocks, the
/// same journeys across both nodes, the same anomalies.
#[test]
fn two_recordings_merged_by_mergecap_replay_as_both_files() {
    let dir = TestDir::new();
    let [one, two] = two_nodes(&dir);
    let (lines, clocks) = replayed(&[one.clone(), two.clone()]).unwrap();
    let of_type = |t: &str| lines.iter().filter(|l| l["type"] == t).count();
    assert_eq!(of_type("journey"), LOOKUPS as usize, "{lines:?}");
    assert!(of_type("anomaly") >= 1, "the SERVFAILs: {lines:?}");
    assert_eq!(clocks.0[1].pairs, 2 * LOOKUPS as usize, "{:?}", clocks.0);
    let nodes: Vec<&Value> = lines[0]["legs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| &l["node"])
        .collect();
    assert_eq!(nodes, ["node1", "node2", "node2", "node1"], "{}", lines[0]);
    for (name, order) in [("both", [&one, &two]), ("reversed", [&two, &one])] {
        let both = dir.path().join(format!("{name}.pcapng"));
        run(
            "mergecap",
            &["-w", path(&both), path(order[0]), path(order[1])],
        );
        tcpdump_reads_all_of(&both);
        let (merged, merged_clocks) = replayed(&[both]).unwrap();
        assert_eq!(merged_clocks.0, clocks.0, "{name}");
        assert_eq!(merged, lines, "{name}");
    }

    // A window of the merged file: what both windows replay to.
    let both = dir.path().join("both.pcapng");
    let cut = |from: &Path, name: &str| {
        let to = dir.path().join(name);
        window(from, &to, 10..=24);
        to
    };
    let (middle, one_middle, two_middle) = (
        cut(&both, "middle.pcapng"),
        cut(&one, "one-middle.pcapng"),
        cut(&two, "two-middle.pcapng"),
    );
    let (windowed, _) = replayed(&[middle]).unwrap();
    let (expected, _) = replayed(&[one_middle, two_middle]).unwrap();
    assert_eq!(windowed, expected);
    let journeys = windowed.iter().filter(|l| l["type"] == "journey");
    assert_eq!(journeys.count(), 15, "{windowed:?}");
}

/// `from` written again without the recordings' marks: as a file of
/// format 2 merged before there were any.
fn unmarked(from: &Path, to: &Path) {
    let reader = Reader::new(std::fs::File::open(from).unwrap()).unwrap();
    let mut w = None;
    for block in reader.map(Result::unwrap) {
        match block {
            Block::Section { info } => {
                let file = std::fs::File::create(to).unwrap();
                w = Some(Writer::new(file, &info).unwrap());
            }
            Block::Interface { mut iface, .. } => {
                iface.comment.retain(|c| !c.starts_with(layout::RECORDING));
                w.as_mut().unwrap().interface(&iface).unwrap();
            }
            Block::Packet {
                iface,
                ts_ns,
                data,
                orig_len,
                opts,
            } => {
                let w = w.as_mut().unwrap();
                w.packet(iface, ts_ns, &data, orig_len, &opts).unwrap();
            }
            Block::Custom { .. } => panic!("format 2 has none"),
        }
    }
    w.unwrap().flush().unwrap();
}

/// Two nodes' recordings merged before interfaces were marked cannot be
/// told apart: the replay says so, and how to replay them.
#[test]
fn two_recordings_merged_without_marks_are_refused_in_one_line() {
    let dir = TestDir::new();
    let [one, two] = two_nodes(&dir);
    let both = dir.path().join("both.pcapng");
    run("mergecap", &["-w", path(&both), path(&one), path(&two)]);
    let old = dir.path().join("old.pcapng");
    unmarked(&both, &old);
    assert_eq!(packets_in(&old), packets_in(&both));
    let e = journeys(&[old]).unwrap_err().to_string();
    assert!(
        e.contains("two recordings (of node1 and node2) merged into one file"),
        "{e}"
    );
    assert!(e.contains("dnstrace replay A.pcapng B.pcapng"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

/// Recordings of nodes that share a host name (the lab's, on one kernel),
/// merged into one file: each its own node, named after the file.
#[test]
fn one_files_recordings_of_one_name_are_numbered() {
    let dir = TestDir::new();
    let (c, d) = (dir.path().join("c.pcapng"), dir.path().join("d.pcapng"));
    let tick = [Input::Tick(START_NS)];
    record_as(&c, ("host", OFFSET_NS, 0), &tick, None);
    record_as(&d, ("host", OFFSET_NS + 1, 0), &tick, None);
    let hosts = dir.path().join("hosts.pcapng");
    run("mergecap", &["-w", path(&hosts), path(&d), path(&c)]);
    let recs = Recording::read_all(&[hosts]).unwrap();
    let names: Vec<_> = recs.iter().map(|r| r.node.as_str()).collect();
    assert_eq!(names, ["hosts", "hosts #2"]);
    assert_eq!(
        recs[1].about.header.as_ref().unwrap().clock_offset_ns,
        OFFSET_NS + 1
    );
}
