//! Recordings through Debian's pcapng tools: tcpdump reads every packet,
//! editcap cuts a time window, mergecap merges rotated files and windows;
//! what they write replays to the original's journeys, those of the
//! packets kept.
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
        merge::{self, Clocks, Merge, Recording},
        pcapng::{Block, Reader},
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
    let clock = Clock::with_offset(OFFSET_NS);
    let labels = Labels::new(
        [(2, "eth0".to_owned())].into(),
        clock,
        KernelNames::default(),
    )
    .with_names(names());
    let mut meta = crate::record::meta(&labels, &Context::default(), Limits::default());
    (meta.header.node, meta.header.started_ns) = (node.into(), START_NS - 1);
    let options = RecordOptions {
        path: path.to_owned(),
        max_bytes,
        files: None,
    };
    let mut rec = Recorder::create(options, meta).unwrap();
    rec.start(START_NS - 1);
    lookups().iter().for_each(|i| rec.input(i));
    rec.end(START_NS + LOOKUPS * EVERY_NS);
}

/// The journeys `paths` replay to, without their numbers (a window's
/// count from its first).
pub(super) fn journeys(paths: &[PathBuf]) -> Result<Vec<Value>> {
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
    let mut js: Vec<Value> = out
        .lines()
        .map(serde_json::from_str::<Value>)
        .collect::<Result<_, _>>()?;
    js.retain(|j| j["type"] == "journey");
    for j in &mut js {
        let j = j.as_object_mut().unwrap();
        j.remove("id");
        j.remove("lookup");
    }
    Ok(js)
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

/// Two nodes' recordings merged into one file cannot be told apart: the
/// replay says so, and how to replay them.
#[test]
fn two_recordings_merged_by_mergecap_are_refused_in_one_line() {
    let dir = TestDir::new();
    let (one, two) = (dir.path().join("one.pcapng"), dir.path().join("two.pcapng"));
    record(&one, "node1", None);
    record(&two, "node2", None);
    let both = dir.path().join("both.pcapng");
    run("mergecap", &["-w", path(&both), path(&one), path(&two)]);
    let e = journeys(&[both]).unwrap_err().to_string();
    assert!(
        e.contains("two recordings (of node1 and node2) merged into one file"),
        "{e}"
    );
    assert!(e.contains("dnstrace replay A.pcapng B.pcapng"), "{e}");
    assert!(!e.contains('\n'), "{e}");
    // Both files replay together, as two nodes that saw the same lookups.
    assert_eq!(journeys(&[one, two]).unwrap().len(), LOOKUPS as usize);
}
