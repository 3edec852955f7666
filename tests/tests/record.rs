//! Recordings made on the lab: tshark reads them and agrees with
//! dnstrace's decoding; a replay gives back the journeys and anomalies of
//! the live run, without root; tcpdump captures replay into journeys;
//! files are 0600, rotate, survive being cut, and a full disk stops the
//! recording but not the tracing.
use std::{
    collections::BTreeSet, os::unix::fs::PermissionsExt, path::Path, process::Command,
    time::Duration,
};

use serde_json::Value;

use dnstrace_tests::*;

/// `dnstrace VIEW -o json` on the lab's node, recording to `file`, with
/// `extra` arguments.
fn recording<'a>(view: &[&'a str], file: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = view.to_vec();
    args.extend(["-o", "json"]);
    args.extend(lab_scope());
    args.push("--record");
    args.push(file.to_str().unwrap());
    args.extend_from_slice(extra);
    args
}

/// Runs dnstrace with `args`, keeping `keep`, while `work` runs; returns
/// stdout's JSON lines and stderr.
fn traced(keep: Keep, args: &[&str], work: impl FnOnce()) -> (Vec<Value>, Vec<String>) {
    let trace = Dnstrace::start_here(keep, args).unwrap();
    work();
    std::thread::sleep(Duration::from_millis(1500));
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:#?}");
    (json_lines(&out), stderr)
}

fn replay(file: &Path, extra: &[&str]) -> (bool, Vec<Value>, String) {
    let mut args = vec!["replay", file.to_str().unwrap(), "-o", "json"];
    args.extend_from_slice(extra);
    let out = dnstrace(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (
        out.status.success(),
        json_lines(&String::from_utf8_lossy(&out.stdout)),
        stderr,
    )
}

/// `dnstrace report FILE`: its Markdown, which it must have written.
fn report(file: &Path) -> String {
    let out = dnstrace(&["report", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn of_type<'a>(lines: &'a [Value], t: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["type"] == t).collect()
}

/// tshark's numbers for the record types the lab asks for.
fn qtype_name(n: &str) -> &str {
    match n {
        "1" => "A",
        "28" => "AAAA",
        "13" => "HINFO",
        "33" => "SRV",
        "12" => "PTR",
        "16" => "TXT",
        other => other,
    }
}

fn rcode_name(n: &str) -> &str {
    match n {
        "0" => "NOERROR",
        "2" => "SERVFAIL",
        "3" => "NXDOMAIN",
        "5" => "REFUSED",
        other => other,
    }
}

#[test]
fn tshark_reads_a_recording_and_agrees_with_dnstrace_on_every_packet() {
    require_root();
    let lab = Lab::up(&["--fault", "bridge-nf-off"]);
    let dir = Dir::new("tshark");
    let file = dir.file("lab.pcapng");
    let (packets, _) = traced(Keep::Every, &recording(&[], &file, &[]), || {
        lab.traffic(&["--pod", "checkout", "--name", "www.example.com"]);
        lab.dig(
            &WEB,
            &format!("@{SERVICE} kubernetes.default.svc.cluster.local."),
        );
    });
    let ours: Vec<String> = packets
        .iter()
        .filter(|p| p["kind"] == "dns")
        .map(|p| {
            let q = &p["questions"][0];
            let rcode = if p["response"] == true {
                p["rcode"].as_str().unwrap()
            } else {
                "-"
            };
            format!(
                "{} {} {} {}",
                p["id"],
                q["name"].as_str().unwrap(),
                q["type"].as_str().unwrap(),
                rcode
            )
        })
        .collect();
    assert!(ours.len() > 20, "{ours:#?}");
    let out = Command::new("tshark")
        .arg("-r")
        .arg(&file)
        .args(["-T", "fields", "-E", "separator=/t"])
        .args(["-e", "dns.id", "-e", "dns.qry.name", "-e", "dns.qry.type"])
        .args(["-e", "dns.flags.response", "-e", "dns.flags.rcode"])
        .output()
        .expect("running tshark");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = String::from_utf8_lossy(&out.stdout).lines().count();
    let theirs: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        // Notes' packets are rows of their own, with no DNS fields.
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let id = u16::from_str_radix(f[0].trim_start_matches("0x"), 16).unwrap();
            let rcode = if matches!(f[3], "1" | "True" | "true") {
                rcode_name(f[4])
            } else {
                "-"
            };
            format!("{id} {}. {} {rcode}", f[1], qtype_name(f[2]))
        })
        .collect();
    assert_eq!(ours, theirs, "dnstrace and tshark, packet by packet");
    // tcpdump reads every record too (a note's bytes on lines of their own).
    let tcpdump = Command::new("tcpdump")
        .arg("-nr")
        .arg(&file)
        .output()
        .expect("running tcpdump");
    let err = String::from_utf8_lossy(&tcpdump.stderr);
    assert!(
        tcpdump.status.success() && !err.contains("tcpdump:"),
        "{err}"
    );
    let read = String::from_utf8_lossy(&tcpdump.stdout)
        .lines()
        .filter(|l| !l.starts_with('\t'))
        .count();
    assert_eq!(read, rows, "tcpdump and tshark, record by record");
    let expert = Command::new("tshark")
        .arg("-r")
        .arg(&file)
        .args(["-q", "-z", "expert,error"])
        .output()
        .unwrap();
    let expert = String::from_utf8_lossy(&expert.stdout);
    assert!(!expert.contains("Malformed"), "{expert}");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "DNS traffic is for its owner only");
}

#[test]
fn a_replay_gives_the_live_runs_journeys_and_anomalies_without_root() {
    require_root();
    let lab = Lab::up(&["--fault", "bridge-nf-off"]);
    let dir = Dir::new("replay");
    let file = dir.file("lab.pcapng");
    let pod = ["--timeout", "2s", "--pod", "web"];
    let (live, _) = traced(Keep::Every, &recording(&["trace"], &file, &pod), || {
        lab.traffic(&["--pod", "checkout", "--name", "www.example.com"]);
        lab.traffic(&["--pod", "web", "--name", "www.example.com"]);
        lab.dig(
            &WEB,
            &format!("@{SERVICE} kubernetes.default.svc.cluster.local."),
        );
    });
    assert!(of_type(&live, "journey").len() >= 2, "{live:#?}");
    let kinds: BTreeSet<&str> = of_type(&live, "anomaly")
        .iter()
        .map(|a| a["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains("reply_from_unexpected_source"), "{kinds:?}");
    // Another user, on a copy it may read: replay needs no privilege.
    let copy = dir.file("copy.pcapng");
    std::fs::copy(&file, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(dnstrace_bin())
        .args(["replay", copy.to_str().unwrap(), "-o", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let replayed = json_lines(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(live, replayed, "the same lines, in the same order");
}

/// A capture that sampled replays to the same lines, so the level and its
/// changes travel in the recording; every journey says its level, and the
/// report says its counts are of a sample.
#[test]
fn a_sampled_recording_replays_the_same_and_its_report_says_so() {
    require_root();
    let lab = Lab::up(&[]);
    let dir = Dir::new("sampled");
    let file = dir.file("lab.pcapng");
    let names: Vec<String> = (0..16).map(|n| format!("r{n}")).collect();
    let (live, _) = traced(
        Keep::Sampled,
        &recording(&["trace"], &file, &["--sample", "2"]),
        || {
            let mut args = vec!["--pod", "default/web", "--rate", "40"];
            for n in &names {
                args.extend(["--name", n.as_str()]);
            }
            lab.traffic(&args);
        },
    );
    let journeys = of_type(&live, "journey");
    assert!(!journeys.is_empty(), "{live:#?}");
    assert!(
        journeys.iter().all(|j| j["sampled"]["one_in"] == 2),
        "{live:#?}"
    );
    let (ok, replayed, stderr) = replay(&file, &[]);
    assert!(ok, "{stderr}");
    assert_eq!(live, replayed, "the same lines, in the same order");
    let md = report(&file);
    assert!(
        md.contains("as few as 1 lookup in 2 kept, each whole"),
        "{md}"
    );
}

#[test]
fn a_tcpdump_capture_replays_into_a_journey_per_lookup() {
    require_root();
    let lab = Lab::up(&[]);
    let dir = Dir::new("tcpdump");
    let file = dir.file("web.pcap");
    let mut tcpdump = Command::new("ip")
        .args(["netns", "exec", &WEB, "tcpdump", "-i", "eth0", "-U", "-w"])
        .arg(&file)
        .args(["udp", "port", "53"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(|| std::fs::metadata(&file).ok().filter(|m| m.len() > 0)).unwrap();
    let lookups = lab.traffic(&[
        "--pod",
        "web",
        "--name",
        "www.example.com",
        "--name",
        "kubernetes.default",
    ]);
    std::thread::sleep(Duration::from_millis(500));
    unsafe { libc::kill(tcpdump.id() as i32, libc::SIGINT) };
    tcpdump.wait().unwrap();
    let (ok, lines, stderr) = replay(&file, &[]);
    assert!(ok, "{stderr}");
    let journeys = of_type(&lines, "journey");
    for l in &lookups {
        let name = format!(
            "{}.",
            l["last_name"].as_str().unwrap().trim_end_matches('.')
        );
        for qtype in ["A", "AAAA"] {
            let j = journeys
                .iter()
                .find(|j| j["name"] == name.as_str() && j["qtype"] == qtype)
                .unwrap_or_else(|| panic!("{name} {qtype}: {journeys:#?}"));
            assert_eq!(j["outcome"]["status"], "answered", "{j}");
        }
    }
    // The search list, A and AAAA each: 4 + 3 names (kubernetes.default
    // is answered at its second candidate).
    assert_eq!(journeys.len(), 2 * (4 + 2), "{journeys:#?}");
}

#[test]
fn recordings_rotate_and_cut_or_damaged_files_are_clear_errors() {
    require_root();
    let lab = Lab::up(&[]);
    let dir = Dir::new("rotate");
    let file = dir.file("r.pcapng");
    // About 3 KiB a lookup: each file holds a dozen or more, and the last
    // three of about six files are kept.
    let rotate = ["--record-size", "64k", "--record-files", "3"];
    traced(Keep::Every, &recording(&["trace"], &file, &rotate), || {
        lab.traffic(&["--rate", "40", "--duration", "3s"]);
    });
    // Each file stands alone: its own header, names and interfaces.
    let mut journeys = Vec::new();
    let mut full = 0;
    for f in ["r.pcapng", "r.pcapng.1", "r.pcapng.2"] {
        let path = dir.file(f);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{f}");
        full += usize::from(meta.len() >= 64 << 10);
        let (ok, lines, stderr) = replay(&path, &[]);
        assert!(ok, "{f}: {stderr}");
        journeys.push((of_type(&lines, "journey").len(), path));
        // Lookups cut by the rotation are incomplete, not failures.
        assert!(of_type(&lines, "anomaly").is_empty(), "{f}: {lines:#?}");
    }
    assert!(full >= 2, "files are rotated once full");
    assert!(journeys.iter().map(|(n, _)| n).sum::<usize>() > 0);
    assert!(!dir.file("r.pcapng.3").exists(), "at most 3 files");

    // The kept files (the last three) merged by mergecap replay as one:
    // every lookup of each, those cut by a rotation whole again.
    let merged = dir.file("merged.pcapng");
    let parts = ["r.pcapng", "r.pcapng.1", "r.pcapng.2"].map(|f| dir.file(f));
    let status = Command::new("mergecap")
        .arg("-w")
        .arg(&merged)
        .args(parts)
        .status()
        .expect("running mergecap");
    assert!(status.success());
    let (ok, lines, stderr) = replay(&merged, &[]);
    assert!(ok, "{stderr}");
    let counts: Vec<usize> = journeys.iter().map(|(n, _)| *n).collect();
    let n = of_type(&lines, "journey").len();
    let most = *counts.iter().max().unwrap();
    assert!(n >= most && n <= counts.iter().sum(), "{n}: {counts:?}");
    assert!(of_type(&lines, "anomaly").is_empty(), "{lines:#?}");
    assert!(stderr.contains(" 0 frames skipped"), "{stderr}");

    // Killed outright: the file reads up to its last whole block.
    let killed = dir.file("killed.pcapng");
    let trace = Dnstrace::start_here(Keep::Every, &recording(&["trace"], &killed, &[])).unwrap();
    lab.traffic(&["--pod", "web", "--name", "www.example.com"]);
    std::thread::sleep(Duration::from_millis(800));
    trace.stop(libc::SIGKILL).unwrap();
    let (ok, lines, stderr) = replay(&killed, &[]);
    assert!(ok, "{stderr}");
    assert!(!of_type(&lines, "journey").is_empty(), "{stderr}");

    // Cut inside a block: what came before is replayed, and said so. The
    // rotated file that starts the most journeys: files fill to the same
    // size, but one may be mostly the tail of lookups begun in the one
    // before (8 to 19 journeys a full file here).
    let (_, fullest) = journeys.iter().max_by_key(|(n, _)| *n).unwrap();
    let whole = std::fs::read(fullest).unwrap();
    let cut = dir.file("cut.pcapng");
    std::fs::write(&cut, &whole[..whole.len() * 2 / 3 + 1]).unwrap();
    let (ok, lines, stderr) = replay(&cut, &[]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("cut short at byte"), "{stderr}");
    let cut_journeys = of_type(&lines, "journey");
    assert!(cut_journeys.len() >= 5, "{cut_journeys:#?}");
    assert!(of_type(&lines, "anomaly").is_empty(), "{lines:#?}");

    // Not a capture at all; a block claiming 2 GiB: one line, no panic.
    let bad = dir.file("bad.pcapng");
    std::fs::write(&bad, b"this is not a capture file at all").unwrap();
    let (ok, _, stderr) = replay(&bad, &[]);
    assert!(!ok);
    assert!(stderr.contains("not a pcap or pcapng file"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    let mut huge = whole.clone();
    let second = u32::from_le_bytes(whole[4..8].try_into().unwrap()) as usize;
    huge[second + 4..second + 8].copy_from_slice(&0x8000_0000u32.to_le_bytes());
    std::fs::write(&bad, &huge).unwrap();
    let (ok, _, stderr) = replay(&bad, &[]);
    assert!(!ok);
    // The block at `second`, by its start or its length field.
    assert!(
        [second, second + 4]
            .iter()
            .any(|at| stderr.contains(&format!("at byte {at}: block length 2147483648"))),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_full_disk_stops_the_recording_and_tracing_goes_on() {
    require_root();
    let lab = Lab::up(&[]);
    let dir = Dir::new("full");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&dir.0)
        .status()
        .unwrap();
    assert!(mounted.success());
    let file = dir.file("r.pcapng");
    let (lines, stderr) = traced(Keep::Every, &recording(&["trace"], &file, &[]), || {
        lab.traffic(&["--rate", "40", "--duration", "3s"]);
        std::thread::sleep(Duration::from_millis(500));
        lab.traffic(&["--pod", "web", "--name", "after.example.com"]);
    });
    assert!(
        stderr
            .iter()
            .any(|l| l.contains("recording stopped: No space left on device")),
        "{stderr:#?}"
    );
    assert!(
        of_type(&lines, "journey")
            .iter()
            .any(|j| j["name"] == "after.example.com."),
        "journeys after the disk filled"
    );
    // What was written before is readable.
    let (ok, _, stderr) = replay(&file, &[]);
    assert!(ok, "{stderr}");
}

#[test]
fn a_report_names_the_anomaly_and_the_failed_lookups() {
    require_root();
    let lab = Lab::up(&["--fault", "bridge-nf-off"]);
    let dir = Dir::new("report");
    let file = dir.file("lab.pcapng");
    traced(
        Keep::Every,
        &recording(&["trace"], &file, &["--timeout", "2s"]),
        || {
            lab.dig(
                &WEB,
                &format!("@{SERVICE} kubernetes.default.svc.cluster.local."),
            );
        },
    );
    let md = report(&file);
    for needle in [
        "# dnstrace report",
        "## Anomalies",
        "`reply_from_unexpected_source`",
        "`bridge_nf_call_iptables_off`",
        "fix: sysctl -w net.bridge.bridge-nf-call-iptables=1",
        "## Failed lookups",
        "kubernetes.default.svc.cluster.local. | A | dropped",
    ] {
        assert!(md.contains(needle), "{needle}: {md}");
    }
    let html = dir.file("report.html");
    let out = dnstrace(&[
        "report",
        file.to_str().unwrap(),
        "--format",
        "html",
        "-w",
        html.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(html).unwrap();
    assert!(html.contains("<svg") && html.contains("reply_from_unexpected_source"));
}
