//! After Ctrl-C, SIGTERM (or, with TCX links, SIGKILL) nothing of dnstrace
//! is left in the kernel.
use std::process::Command;

use dnstrace_tests::*;

fn live_prog_ids() -> Vec<u32> {
    let out = run(Command::new("bpftool").args(["-j", "prog", "show"])).unwrap();
    let progs: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    progs
        .iter()
        .filter_map(|p| p["id"].as_u64())
        .map(|id| id as u32)
        .collect()
}

fn tc_state(ns: &Netns) -> String {
    let mut s = ns
        .cmd("tc")
        .args(["qdisc", "show", "dev", Pair::SERVER_IF])
        .output()
        .unwrap()
        .stdout;
    for dir in ["ingress", "egress"] {
        s.extend(
            ns.cmd("tc")
                .args(["filter", "show", "dev", Pair::SERVER_IF, dir])
                .output()
                .unwrap()
                .stdout,
        );
    }
    String::from_utf8(s).unwrap()
}

fn stop_leaves_nothing(mode: &str, signal: i32) {
    require_root();
    let pair = Pair::new().unwrap();
    let before = tc_state(&pair.server);
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
    let ids = trace.prog_ids();
    assert_eq!(
        ids.len(),
        2,
        "expected two attached programs: {:?}",
        trace.stderr_lines
    );
    assert!(ids.iter().all(|id| live_prog_ids().contains(id)));
    if mode == "netlink" {
        let during = tc_state(&pair.server);
        assert!(
            during.contains("clsact") && during.contains("dns_tc_ingress"),
            "{during}"
        );
    }
    let (status, _, stderr) = trace.stop(signal).unwrap();
    if signal == libc::SIGKILL {
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(signal)
        );
    } else {
        assert!(status.success(), "exit {status}: {stderr:?}");
        assert!(
            exit_summary(&stderr)["detached_from"]
                .as_array()
                .is_some_and(|from| from.contains(&"vs".into())),
            "{stderr:?}"
        );
    }
    // The kernel frees programs of deleted tc filters after an RCU grace period.
    wait_for(|| {
        let live = live_prog_ids();
        ids.iter().all(|id| !live.contains(id)).then_some(())
    })
    .unwrap_or_else(|_| panic!("programs {ids:?} still loaded"));
    assert_eq!(tc_state(&pair.server), before, "tc state changed");
}

#[test]
fn sigint_detaches_tcx_links() {
    stop_leaves_nothing("tcx", libc::SIGINT);
}

#[test]
fn sigterm_detaches_tcx_links() {
    stop_leaves_nothing("tcx", libc::SIGTERM);
}

#[test]
fn sigint_removes_netlink_filters_and_the_qdisc_it_added() {
    stop_leaves_nothing("netlink", libc::SIGINT);
}

#[test]
fn sigterm_removes_netlink_filters_and_the_qdisc_it_added() {
    stop_leaves_nothing("netlink", libc::SIGTERM);
}

#[test]
fn an_existing_clsact_qdisc_is_left_in_place() {
    require_root();
    let pair = Pair::new().unwrap();
    run(pair
        .server
        .cmd("tc")
        .args(["qdisc", "add", "dev", Pair::SERVER_IF, "clsact"]))
    .unwrap();
    let trace = Dnstrace::start(
        &pair.server,
        Keep::Every,
        &["--iface", Pair::SERVER_IF, "--tc-attach", "netlink"],
    )
    .unwrap();
    let (status, _, _) = trace.stop(libc::SIGTERM).unwrap();
    assert!(status.success());
    let after = tc_state(&pair.server);
    assert!(
        after.contains("clsact") && !after.contains("dns_tc"),
        "{after}"
    );
}

#[test]
fn sigkill_with_tcx_links_leaves_nothing_attached() {
    // No exit path runs at all: the kernel drops TCX links with their last fd.
    stop_leaves_nothing("tcx", libc::SIGKILL);
}

/// SIGKILL runs no exit path, and netlink filters outlive their process:
/// the next start removes them (and the qdisc the dead one added), then
/// cleans up after itself as usual.
fn next_start_removes_what_sigkill_left(existing_qdisc: bool) {
    require_root();
    let pair = Pair::new().unwrap();
    if existing_qdisc {
        run(pair
            .server
            .cmd("tc")
            .args(["qdisc", "add", "dev", Pair::SERVER_IF, "clsact"]))
        .unwrap();
    }
    let before = tc_state(&pair.server);
    let args = ["--iface", Pair::SERVER_IF, "--tc-attach", "netlink"];
    let killed = Dnstrace::start(&pair.server, Keep::Every, &args).unwrap();
    let pid = killed.pid();
    killed.stop(libc::SIGKILL).unwrap();
    let left = tc_state(&pair.server);
    assert!(
        left.contains("dns_tc_ingress"),
        "SIGKILL leaves filters: {left}"
    );

    let next = Dnstrace::start(&pair.server, Keep::Every, &args).unwrap();
    let said = format!("removed the tc filters a dead dnstrace (pid {pid}) left on vs");
    assert!(
        next.stderr_lines.iter().any(|l| l.contains(&said)),
        "{:?}",
        next.stderr_lines
    );
    let during = tc_state(&pair.server);
    assert_eq!(
        during
            .lines()
            .filter(|l| l.contains("dns_tc_ingress"))
            .count(),
        1,
        "only the new instance's filter: {during}"
    );
    let (status, _, stderr) = next.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{stderr:?}");
    assert_eq!(tc_state(&pair.server), before, "tc state changed");
    assert!(
        !std::path::Path::new(&format!("/run/dnstrace/tc-{pid}.json")).exists(),
        "the dead instance's ledger is gone"
    );
}

#[test]
fn the_next_start_removes_filters_and_qdisc_a_sigkill_left() {
    next_start_removes_what_sigkill_left(false);
}

#[test]
fn the_next_start_removes_only_the_filters_from_an_existing_qdisc() {
    next_start_removes_what_sigkill_left(true);
}

/// What of the lab a machine shows: its namespaces (`dtlab-*`, this lab's
/// prefix, and its sandboxes' `cni-*`), mounts, links in this namespace,
/// and live processes.
#[derive(Debug, PartialEq)]
struct Trace {
    namespaces: Vec<String>,
    mounts: Vec<String>,
    links: Vec<String>,
    processes: Vec<u32>,
}

/// The lab's part of the machine; `sandbox_netns` and `pids` are the lab's
/// own (other tests run containerd pods meanwhile, with namespaces alike).
fn lab_trace(sandbox_netns: &[String], pids: &[u32]) -> Trace {
    let dir = format!("{}/", lab_dir());
    let ours = |s: &str| {
        s.contains(lab_prefix())
            || s == lab_dir()
            || s.contains(&dir)
            || sandbox_netns.iter().any(|n| s.contains(n))
    };
    let namespaces = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| ours(n))
                .collect()
        })
        .unwrap_or_default();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| ours(m))
        .map(str::to_owned)
        .collect();
    let links = run(Command::new("ip").args(["-o", "link", "show"]))
        .unwrap()
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(str::to_owned)
        .collect();
    let processes = pids.iter().copied().filter(|&p| running(p)).collect();
    Trace {
        namespaces,
        mounts,
        links,
        processes,
    }
}

/// Alive and not a zombie (PID 1 reaps the shims late here).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, r)| !r.starts_with('Z'))
    })
}

/// The lab's sandbox namespaces and processes while it is up: its
/// resolvers, containerd, the shims and the pause processes.
fn lab_parts() -> (Vec<String>, Vec<u32>) {
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lab_path("state.json")).unwrap()).unwrap();
    let sandboxes = state["sandboxes"].as_object().unwrap();
    let netns = sandboxes
        .values()
        .filter_map(|s| s["netns"].as_str())
        .map(|p| p.rsplit('/').next().unwrap().to_owned())
        .collect();
    let mut pids: Vec<u32> = sandboxes
        .values()
        .chain(state["pids"].as_object().unwrap().values())
        .filter_map(|v| v.get("pid").unwrap_or(v).as_u64())
        .map(|p| p as u32)
        .collect();
    let containerd = std::fs::read_to_string(lab_path("cri/containerd.pid")).unwrap();
    pids.push(containerd.trim().parse().unwrap());
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&lab_path("")) {
            pids.extend(entry.file_name().to_string_lossy().parse::<u32>().ok());
        }
    }
    (netns, pids)
}

#[test]
fn lab_down_leaves_no_namespace_mount_link_process_or_file() {
    require_root();
    // Holds the lab lock; its own `lab down` on drop finds nothing.
    let _lab = Lab::up(&[]);
    assert!(dnstrace(&["lab", "down"]).status.success());
    let before = lab_trace(&[], &[]);
    let up = dnstrace(&[
        "lab",
        "up",
        "--ipv6",
        "--host-network-client",
        "--nodelocaldns",
    ]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let (netns, pids) = lab_parts();
    assert_eq!(netns.len(), 4, "a namespace per pod sandbox: {netns:?}");
    let during = lab_trace(&netns, &pids);
    assert!(
        during.namespaces.len() > before.namespaces.len() && !during.mounts.is_empty(),
        "{during:?}"
    );
    assert!(during.processes.len() >= 8, "{during:?}");
    assert!(dnstrace(&["lab", "down"]).status.success());
    assert_eq!(lab_trace(&netns, &pids), before);
    assert!(!std::path::Path::new(lab_dir()).exists());
    let left_in_etc = std::fs::read_dir("/etc/netns")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(lab_prefix()))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(left_in_etc, 0, "/etc/netns entries");
}
