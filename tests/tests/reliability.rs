//! Never making the incident worse: what dnstrace keeps of its privileges,
//! how it refuses a setuid bit, and how it degrades when it cannot keep up
//! (losses and evictions counted and said, never wrong anomalies).
use std::{collections::BTreeSet, os::unix::fs::PermissionsExt, process::Command};

use serde_json::Value;

use dnstrace_tests::*;

/// A capability set from /proc/PID/status, e.g. `CapEff`, the same in each
/// of the process's threads: capabilities are a thread's, and a thread
/// started before they were dropped keeps them.
fn caps(pid: u32, set: &str) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    let each: BTreeSet<u64> = tasks
        .map(|t| {
            let status = std::fs::read_to_string(t.unwrap().path().join("status")).unwrap();
            status
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{set}:")))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or_else(|| panic!("no {set} in {status}"))
        })
        .collect();
    assert_eq!(each.len(), 1, "{set} differs between threads: {each:x?}");
    each.into_iter().next().unwrap()
}

/// dnsmasq on the pair's server, answering www.test with 10.77.0.80.
fn www_test(pair: &Pair) -> Proc {
    dnsmasq(
        &pair.server,
        &["--local=/test/", "--host-record=www.test,10.77.0.80"],
    )
    .unwrap()
}

fn dig_through(pair: &Pair) -> String {
    run(pair.client.cmd("dig").args([
        "+tries=1",
        "+time=3",
        &format!("@{}", Pair::SERVER4),
        "www.test",
    ]))
    .unwrap()
}

/// Digs through `trace`, then stops it: it must exit cleanly. Its output
/// and stderr; `what` names the case in failures.
fn dig_and_stop(pair: &Pair, trace: Dnstrace, what: &str) -> (String, Vec<String>) {
    assert!(dig_through(pair).contains("10.77.0.80"), "{what}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{what}: {stderr:?}");
    (out, stderr)
}

/// The JSON output `out` has the query for www.test.
fn shows_www_test(out: &str, what: &str) {
    let names: Vec<Value> = json_lines(out);
    assert!(
        names
            .iter()
            .any(|p| p["questions"][0]["name"] == "www.test."),
        "{what}: {out}"
    );
}

#[test]
fn after_attaching_only_what_detaching_needs_is_kept() {
    require_root();
    const CAP_NET_ADMIN: u64 = 1 << 12;
    for (mode, kept) in [("tcx", 0), ("netlink", CAP_NET_ADMIN)] {
        let pair = Pair::new().unwrap();
        let _dns = www_test(&pair);
        let trace = Dnstrace::start(
            &pair.server,
            Keep::Every,
            &[
                "--iface",
                Pair::SERVER_IF,
                "--tc-attach",
                mode,
                "-o",
                "json",
            ],
        )
        .unwrap();
        let pid = trace.pid();
        for set in ["CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb"] {
            let want = if matches!(set, "CapInh" | "CapAmb") {
                0
            } else {
                kept
            };
            assert_eq!(caps(pid, set), want, "{mode}: {set}");
        }
        assert!(std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .contains("NoNewPrivs:\t1"));
        // Capture goes on without them, and the exit still detaches.
        let (out, stderr) = dig_and_stop(&pair, trace, mode);
        shows_www_test(&out, mode);
        assert!(
            exit_summary(&stderr)["detached_from"]
                .as_array()
                .is_some_and(|from| from.contains(&"vs".into())),
            "{stderr:?}"
        );
    }
}

#[test]
fn a_setuid_dnstrace_refuses_to_run() {
    require_root();
    let dir = std::env::temp_dir().join(format!("dnstrace-setuid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("dnstrace");
    std::fs::copy(dnstrace_bin(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .arg("pods")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("refuses to run as a setuid"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

/// The anomaly kinds and the journeys of a `trace -o json` run.
fn outcome(out: &str) -> (BTreeSet<String>, Vec<Value>) {
    let lines = json_lines(out);
    let kinds = lines
        .iter()
        .filter(|l| l["type"] == "anomaly")
        .map(|l| l["kind"].as_str().unwrap().to_owned())
        .collect();
    let journeys = lines
        .into_iter()
        .filter(|l| l["type"] == "journey")
        .collect();
    (kinds, journeys)
}

/// The count `what` in dnstrace's exit summary.
fn counted(stderr: &[String], what: &str) -> u64 {
    let exit = exit_summary(stderr);
    exit[what]
        .as_u64()
        .unwrap_or_else(|| panic!("no `{what}` in {exit}"))
}

/// User space stopped for a while (as a starved or stalled reader would
/// be) with a 1 MiB ring: the kernel drops and counts, dnstrace says so,
/// marks the journeys it cannot vouch for, and invents no problem.
#[test]
fn a_stalled_reader_loses_events_counts_them_and_raises_nothing_false() {
    require_root();
    let lab = Lab::up(&[]);
    let trace = lab.trace_every_lookup(&["--ring-buffer-mib", "1"]);
    let pid = trace.pid() as i32;
    std::thread::scope(|s| {
        s.spawn(|| lab.traffic(&["--rate", "25", "--duration", "6s"]));
        std::thread::sleep(std::time::Duration::from_secs(2));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        std::thread::sleep(std::time::Duration::from_secs(2));
        unsafe { libc::kill(pid, libc::SIGCONT) };
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{stderr:?}");
    let lost = counted(&stderr, "lost");
    assert!(
        lost > 0,
        "a stalled reader with a 1 MiB ring loses: {stderr:?}"
    );
    assert!(
        stderr
            .iter()
            .any(|l| l.contains("events lost so far (ring buffer full")),
        "said while it happens: {stderr:?}"
    );
    let (kinds, journeys) = outcome(&out);
    assert!(
        journeys.iter().any(|j| j["incomplete"] == true),
        "journeys open while events were lost are marked"
    );
    assert!(journeys.iter().any(|j| j["incomplete"] == false));
    // Healthy traffic: losing events must not invent a problem.
    let anomalies: Vec<Value> = json_lines(&out)
        .into_iter()
        .filter(|l| l["type"] == "anomaly")
        .collect();
    assert_eq!(kinds, BTreeSet::new(), "{lost} events lost: {anomalies:#?}");
}

#[test]
fn too_many_open_journeys_are_evicted_and_counted() {
    require_root();
    let lab = Lab::up(&["--fault", "upstream-timeout"]);
    let trace = lab.trace_every_lookup(&["--max-open", "8"]);
    // External names hang upstream: their journeys stay open.
    lab.traffic(&["--rate", "20", "--duration", "2s"]);
    let (status, _, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{stderr:?}");
    assert!(counted(&stderr, "evicted") > 0, "{stderr:?}");
}

/// Events discarded undecoded (the harness's `--discard-events`), the
/// bench's measure of the kernel side alone: the events are read off the
/// ring and counted, and none is decoded.
#[test]
fn discarded_events_are_read_and_counted_not_decoded() {
    require_root();
    let pair = Pair::new().unwrap();
    let _dns = www_test(&pair);
    let trace = Dnstrace::start_harness(
        &pair.server,
        Keep::Every,
        &["--discard-events"],
        &["--iface", Pair::SERVER_IF, "-o", "json"],
    )
    .unwrap();
    let (out, stderr) = dig_and_stop(&pair, trace, "--discard-events");
    assert_eq!(out.trim(), "", "nothing decoded, nothing printed");
    assert_eq!(counted(&stderr, "packets"), 0, "{stderr:?}");
    let discarded = counted(&stderr, "discarded");
    // The query in and the answer out, at ingress and egress of vs.
    assert!(discarded >= 2, "{stderr:?}");
}

/// Bytes of the process's mappings of BPF maps (the ring buffer's).
fn bpf_map_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| l.ends_with("anon_inode:bpf-map"))
        .map(|l| {
            let (start, end) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            u64::from_str_radix(end, 16).unwrap() - u64::from_str_radix(start, 16).unwrap()
        })
        .sum()
}

#[test]
fn the_ring_buffer_is_mapped_once_and_read() {
    require_root();
    let pair = Pair::new().unwrap();
    let _dns = www_test(&pair);
    let trace = Dnstrace::start(
        &pair.server,
        Keep::Every,
        &[
            "--iface",
            Pair::SERVER_IF,
            "--ring-buffer-mib",
            "1",
            "-o",
            "json",
        ],
    )
    .unwrap();
    // The data once and two pages of positions, not the data twice (RSS
    // would count each page twice).
    let mapped = bpf_map_bytes(trace.pid());
    assert!(
        (1 << 20..2 << 20).contains(&mapped),
        "{mapped} bytes mapped"
    );
    let (out, _) = dig_and_stop(&pair, trace, "a 1 MiB ring");
    shows_www_test(&out, "a 1 MiB ring");
}
