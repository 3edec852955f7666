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
