//! Sampling whole lookups: the kernel keeps the lookups whose name's first
//! label passes the level (and drops the rest before the ring), user space
//! knows which by the same hash, and what it shows is whole. Under
//! overload dnstrace raises the level itself rather than losing events
//! from every lookup.
use std::collections::BTreeSet;

use dnstrace_common::{sample::message_label_hash, SampleLevel};
use serde_json::Value;

use dnstrace_tests::*;

/// The level a journey says it was kept under.
fn level_of(j: &Value) -> Option<SampleLevel> {
    let s = j.get("sampled")?;
    let one_in = s["one_in"].as_u64().expect("one_in") as u32;
    Some(SampleLevel {
        shift: one_in.trailing_zeros(),
        seed: s["seed"].as_u64().expect("seed") as u32,
    })
}

/// Whether `level` keeps lookups of `name`, hashed as the kernel does.
fn keeps(level: SampleLevel, name: &str) -> bool {
    let first = name.split('.').next().unwrap_or_default();
    let mut wire = vec![0u8; 12];
    wire.push(first.len() as u8);
    wire.extend_from_slice(first.as_bytes());
    level.keeps(message_label_hash(&wire))
}

fn journeys(out: &str) -> Vec<Value> {
    json_lines(out)
        .into_iter()
        .filter(|l| l["type"] == "journey")
        .collect()
}

fn first_label(j: &Value) -> String {
    let name = j["name"].as_str().expect("a name");
    name.split('.').next().unwrap_or_default().to_owned()
}

/// dnstrace said `what` on stderr, and its exit summary counted packets
/// the sampling level left out in the kernel.
fn said_and_left_out(stderr: &[String], what: &str) {
    assert!(stderr.iter().any(|l| l.contains(what)), "{stderr:?}");
    let shed = exit_summary(stderr)["sampled_out"].as_u64();
    assert!(shed.is_some_and(|n| n > 0), "{stderr:?}");
}

/// `--sample 4`: the kernel keeps exactly the lookups whose names the
/// hash picks, with all their search-list tries, A and AAAA and upstream
/// queries, and leaves the others out before the ring buffer.
#[test]
fn a_sample_asked_for_keeps_exactly_the_names_its_hash_picks_each_whole() {
    require_root();
    let lab = Lab::up(&[]);
    let trace = lab.trace(Keep::Sampled, &["--sample", "4"]);
    let names: Vec<String> = (0..64).map(|n| format!("s{n}")).collect();
    let mut args = vec!["--pod", "default/web", "--rate", "40"];
    for n in &names {
        args.extend(["--name", n.as_str()]);
    }
    lab.traffic(&args);
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{stderr:?}");
    let journeys = journeys(&out);
    let level = level_of(journeys.first().expect("some lookups kept")).unwrap();
    assert_eq!(level.shift, 2, "1 in 4");
    let kept: BTreeSet<String> = journeys.iter().map(first_label).collect();
    let picked: BTreeSet<String> = names.iter().filter(|n| keeps(level, n)).cloned().collect();
    assert_eq!(
        kept, picked,
        "the kernel keeps what user space's hash picks"
    );
    for j in &journeys {
        assert_eq!(level_of(j), Some(level), "{j}");
        assert_eq!(j["incomplete"], false, "{j}");
        assert_eq!(j["outcome"]["status"], "answered", "whole: {j}");
        let legs = j["legs"].as_array().unwrap();
        assert!(legs.len() >= 8, "from the pod to CoreDNS and back: {j}");
    }
    said_and_left_out(&stderr, "sampling: keeping 1 lookup in 4, each whole");
}

/// A pipeline stalled for seconds (its stdout unread, as a terminal that
/// stops reading) while lookups are few: the reader's queue fills with
/// ticks and small batches and then waits, the ring takes the rest and
/// stays far from full, nothing is lost, so the defaults keep every
/// lookup. Before sampling looked at the ring, a queue half full of ticks
/// left out half the lookups.
#[test]
fn a_stall_that_loses_nothing_keeps_every_lookup() {
    require_root();
    let lab = Lab::up(&[]);
    let args = [&["trace", "-o", "json"][..], &lab_scope()].concat();
    let mut trace = Dnstrace::start_unread(Keep::Sampled, &args).unwrap();
    let names: Vec<String> = (0..32).map(|n| format!("stall{n}")).collect();
    let mut traffic = vec!["--pod", "default/web", "--rate", "20"];
    for n in &names {
        traffic.extend(["--name", n.as_str()]);
    }
    // Their journeys (a search list each) fill the pipe; the pipeline
    // then waits 3 s on the write, 60 ticks.
    lab.traffic(&traffic);
    wait_for(|| trace.waits_on_a_pipe().then_some(())).expect("the pipeline waiting on stdout");
    std::thread::sleep(std::time::Duration::from_secs(3));
    trace.read_stdout();
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{stderr:?}");
    assert_eq!(exit_summary(&stderr)["lost"], 0, "nothing lost: {stderr:?}");
    assert!(
        !stderr.iter().any(|l| l.contains("keeping 1 lookup in")),
        "nothing left out: {stderr:?}"
    );
    let kept: BTreeSet<String> = journeys(&out).iter().map(first_label).collect();
    let all: BTreeSet<String> = names.into_iter().collect();
    assert!(all.is_subset(&kept), "missing: {:?}", all.difference(&kept));
}

/// dnstrace held to 3% of a CPU while the lab's pods look names up 300
/// times a second each: it falls behind, says so, and keeps fewer lookups,
/// each whole, rather than losing events from all of them; every journey
/// it shows passes the level it was kept under, and healthy traffic
/// raises nothing the kernel did not count or time (the load may overflow
/// a CoreDNS pod's socket, or stall it). The seed is pinned and two of the
/// names pass every level under it, so whatever level the load brings,
/// some journeys are kept under it and the check over them is never empty.
#[test]
fn a_starved_tracer_samples_whole_lookups() {
    require_root();
    let lab = Lab::up(&[]);
    const SEED: u32 = 0x5eed;
    let always = names_kept_at_every_level(SEED, 2);
    let overflows = socket_overflows();
    let trace = lab.trace(Keep::Sampled, &["--sample-seed", &SEED.to_string()]);
    let limit = CpuLimit::new(trace.pid(), 3);
    let mut names: Vec<String> = [
        "kubernetes.default",
        "db.default",
        "www.example.com",
        "many.example.com",
        "nosuchname.example.com",
    ]
    .map(str::to_owned)
    .to_vec();
    names.extend(always.iter().map(|l| format!("{l}.example.com")));
    let mut args = vec!["--rate", "300", "--duration", "10s"];
    for n in &names {
        args.extend(["--name", n.as_str()]);
    }
    lab.traffic(&args);
    // What was kept was chosen under the load; the rest of the ring is
    // read at full speed.
    drop(limit);
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{stderr:?}");
    said_and_left_out(&stderr, "falling behind the kernel: keeping 1 lookup in");
    let lines = json_lines(&out);
    let sampled: Vec<&Value> = lines
        .iter()
        .filter(|l| l.get("sampled").is_some())
        .collect();
    for j in &sampled {
        let level = level_of(j).unwrap();
        assert_eq!(level.seed, SEED, "no reseed within 30 s: {j}");
        let name = j["name"].as_str().unwrap();
        assert!(
            keeps(level, name),
            "kept under {level:?} though it does not pass: {j}"
        );
    }
    let kept: BTreeSet<String> = sampled.iter().map(|j| first_label(j)).collect();
    for l in &always {
        assert!(kept.contains(l), "{l} passes every level: {kept:?}");
    }
    let summary = lines.iter().find(|l| l["type"] == "summary").unwrap();
    let anomalies = summary["anomalies"].as_array().unwrap();
    let false_alarms = false_alarms(anomalies, &lines, &overflows);
    assert!(false_alarms.is_empty(), "healthy traffic: {false_alarms:?}");
}

/// `n` first labels that the highest level keeps under `seed`, and so
/// every level (a level keeps a hash whose low `shift` bits are 0).
fn names_kept_at_every_level(seed: u32, n: usize) -> Vec<String> {
    let top = SampleLevel {
        shift: dnstrace_common::sample::MAX_SHIFT,
        seed,
    };
    (0..)
        .map(|i| format!("kept{i}"))
        .filter(|l| keeps(top, l))
        .take(n)
        .collect()
}
