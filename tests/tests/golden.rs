//! Golden replays: recordings made on the lab (tests/golden), one per
//! scenario, replay to exactly the JSON lines committed next to them, so a
//! change of user space that changes what dnstrace says shows here.
//! `GOLDEN_BLESS=1` rewrites the expectations instead (tests/golden/README.md).
//! No root needed: a replay reads a file.
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use dnstrace_tests::*;

/// Each scenario's `NAME.pcapng` and `NAME.jsonl`, as tests/golden/record.sh
/// makes them.
const SCENARIOS: &[&str] = &[
    "healthy",
    "bridge-nf-off",
    "no-dnat",
    "forward-loop",
    "truncated",
    "upstream-timeout",
    "stalled-resolver",
    "servfail",
    "slow-search-leak",
    "drop",
    "loopback-nameserver",
    "no-dns-tcp",
    "fragments-dropped",
];

/// The anomaly kinds the recordings are meant to raise between them: every
/// kind a lab recording can produce on replay (the README says which cannot).
const COVERED: &[&str] = &[
    "bridge_nf_call_iptables_off",
    "reply_from_unexpected_source",
    "service_not_translated",
    "forwarding_loop",
    "truncated_without_tcp_retry",
    "upstream_timeout",
    "unanswered",
    "failing_answers",
    "slow_answers",
    "search_domain_leak",
    "foreign_search_domain",
    "ndots_amplification",
    "dropped",
    "loopback_nameserver",
    "dns_tcp_unreachable",
    "fragment_lost",
];

/// How many times each recording is replayed to show its output is stable.
const REPLAYS: usize = 3;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden")
}

fn recording(scenario: &str) -> PathBuf {
    golden_dir().join(format!("{scenario}.pcapng"))
}

fn expectation(scenario: &str) -> PathBuf {
    golden_dir().join(format!("{scenario}.jsonl"))
}

/// Whether this run rewrites the expectations rather than compares.
fn blessing() -> bool {
    std::env::var_os("GOLDEN_BLESS").is_some_and(|v| v == "1")
}

/// `dnstrace replay FILE -o json`'s stdout; fails on an error exit.
fn replay(scenario: &str) -> String {
    let file = recording(scenario);
    assert!(file.is_file(), "{} is missing", file.display());
    let out = dnstrace(&["replay", file.to_str().expect("utf-8 path"), "-o", "json"]);
    assert!(
        out.status.success(),
        "replay of {} failed: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("JSON lines are UTF-8")
}

fn read_expectation(scenario: &str) -> String {
    let file = expectation(scenario);
    std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{}: {e} (GOLDEN_BLESS=1 writes it)", file.display()))
}

/// Where `got` first differs from `expected`, line by line, in a few lines;
/// None when they are the same bytes.
fn first_difference(expected: &str, got: &str) -> Option<String> {
    if expected == got {
        return None;
    }
    let (mut want, mut have) = (expected.split_inclusive('\n'), got.split_inclusive('\n'));
    for number in 1.. {
        match (want.next(), have.next()) {
            (Some(w), Some(h)) if w == h => continue,
            (w, h) => {
                let column = common_prefix(w.unwrap_or(""), h.unwrap_or("")) + 1;
                return Some(format!(
                    "line {number}, from character {column}:\n  expected: {}\n  got:      {}",
                    w.map_or("(end of output)".into(), |l| format!("{l:?}")),
                    h.map_or("(end of output)".into(), |l| format!("{l:?}"))
                ));
            }
        }
    }
    unreachable!("two different texts differ at some line")
}

/// How many characters `a` and `b` share from the start.
fn common_prefix(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

#[test]
fn every_recording_replays_to_its_expected_lines() {
    let mut failures = Vec::new();
    for scenario in SCENARIOS {
        let got = replay(scenario);
        if blessing() {
            std::fs::write(expectation(scenario), &got).expect("writing the expectation");
            continue;
        }
        if let Some(diff) = first_difference(&read_expectation(scenario), &got) {
            failures.push(format!("{scenario}: {diff}"));
        }
    }
    assert!(
        failures.is_empty(),
        "replays differ from tests/golden/*.jsonl (GOLDEN_BLESS=1 to accept on purpose):\n{}",
        failures.join("\n")
    );
}

#[test]
fn a_replay_says_the_same_every_time() {
    for scenario in SCENARIOS {
        let first = replay(scenario);
        for _ in 1..REPLAYS {
            if let Some(diff) = first_difference(&first, &replay(scenario)) {
                panic!("{scenario} replayed differently: {diff}");
            }
        }
    }
}

/// The kinds of the anomaly lines of an expectation.
fn kinds(jsonl: &str) -> BTreeSet<String> {
    json_lines(jsonl)
        .iter()
        .filter(|l| l["type"] == "anomaly")
        .filter_map(|l| l["kind"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn the_expectations_raise_every_kind_they_cover() {
    let raised: BTreeSet<String> = SCENARIOS
        .iter()
        .flat_map(|s| kinds(&read_expectation(s)))
        .collect();
    let missing: Vec<&&str> = COVERED.iter().filter(|k| !raised.contains(**k)).collect();
    assert!(missing.is_empty(), "no scenario raises {missing:?}");
}

#[test]
fn the_healthy_recording_raises_nothing() {
    let raised = kinds(&read_expectation("healthy"));
    assert!(raised.is_empty(), "{raised:?}");
}

/// A recording nobody lists would silently go untested.
#[test]
fn every_recording_is_a_scenario() {
    let listed: BTreeSet<String> = SCENARIOS.iter().map(|s| format!("{s}.pcapng")).collect();
    let unlisted: Vec<String> = std::fs::read_dir(golden_dir())
        .expect("tests/golden")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.ends_with(".pcapng") && !listed.contains(f))
        .collect();
    assert!(unlisted.is_empty(), "not in SCENARIOS: {unlisted:?}");
}
