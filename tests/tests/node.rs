//! dnstrace without --iface: every device of every network namespace, on the lab.
use serde_json::Value;

use dnstrace_tests::*;

const NAME: &str = "kubernetes.default.svc.cluster.local.";

/// The lines of one query id for NAME, in kernel time order.
fn legs(lines: &[Value], id: u16) -> Vec<&Value> {
    let mut legs: Vec<&Value> = lines
        .iter()
        .filter(|l| l["id"] == id && l["questions"][0]["name"] == NAME)
        .collect();
    legs.sort_by_key(|l| l["mono_ns"].as_u64());
    legs
}

fn position(legs: &[&Value], what: &str, f: impl Fn(&Value) -> bool) -> usize {
    legs.iter()
        .position(|l| f(l))
        .unwrap_or_else(|| panic!("no leg {what} in {legs:#?}"))
}

#[test]
fn every_leg_of_a_lookup_is_seen_with_namespace_and_nat() {
    let said = every_leg_seen(dnstrace_bin(), &[], "every netns)");
    assert!(
        !said.iter().any(|l| l.contains("direct loads in")),
        "{said:?}"
    );
}

/// The programs a kernel runs where its verifier refuses direct loads:
/// the probes' `probe_reads` (the harness's `--probe-reads`) takes the way
/// such a refusal does, and says so.
#[test]
fn every_leg_is_seen_with_probe_reads_too() {
    let said = every_leg_seen(
        harness_bin(),
        &["--probe-reads"],
        "every netns, probe reads)",
    );
    let fallbacks = said
        .iter()
        .filter(|l| {
            l.contains("off: direct loads in dns_") && l.ends_with("reads with probe reads instead")
        })
        .count();
    assert_eq!(fallbacks, 3, "{said:?}");
}

/// Traces one lookup through the lab with `bin`, its `switches` first;
/// returns what dnstrace said at start.
fn every_leg_seen(bin: &std::path::Path, switches: &[&str], how: &str) -> Vec<String> {
    // Every namespace of the machine, other labs' too.
    require_alone();
    let lab = Lab::up(&[]);
    let trace =
        Dnstrace::start_binary(bin, Keep::Every, &[switches, &["-o", "json"]].concat()).unwrap();
    let tracepoints = trace
        .stderr_lines
        .iter()
        .filter(|l| l.contains("attached to tp_btf/") && l.ends_with(how))
        .count();
    assert_eq!(tracepoints, 3, "{:?}", trace.stderr_lines);
    let trace_start = trace.stderr_lines.clone();
    let out = lab.dig(&WEB, &format!("@{SERVICE} {NAME}"));
    let id = dig_id(&out).unwrap();
    let (status, stdout, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    let lines = json_lines(&stdout);
    let legs = legs(&lines, id);
    let client_out = position(&legs, "leaving the client pod", |l| {
        l["iface"] == "eth0"
            && l["direction"] == "egress"
            && l["dst"] == "10.96.0.10:53"
            && l["response"] == false
    });
    let dnat = position(&legs, "towards CoreDNS after DNAT", |l| {
        l["direction"] == "egress"
            && l["iface"].as_str().unwrap().starts_with("veth")
            && l["response"] == false
            && l["conntrack"]["dnat"][0] == "10.96.0.10:53"
    });
    let endpoint = legs[dnat]["dst"].as_str().unwrap().to_owned();
    assert!(
        endpoint == "10.244.0.53:53" || endpoint == "10.244.0.54:53",
        "{endpoint}"
    );
    let coredns_in = position(&legs, "arriving at CoreDNS", |l| {
        l["iface"] == "eth0" && l["direction"] == "ingress" && l["dst"] == endpoint.as_str()
    });
    let coredns_out = position(&legs, "leaving CoreDNS", |l| {
        l["iface"] == "eth0" && l["direction"] == "egress" && l["src"] == endpoint.as_str()
    });
    let reverse = position(&legs, "back to the client, reverse-NATed", |l| {
        l["direction"] == "egress"
            && l["iface"].as_str().unwrap().starts_with("veth")
            && l["src"] == "10.96.0.10:53"
            && l["conntrack"]["is_reply"] == true
    });
    let client_in = position(&legs, "reaching the client", |l| {
        l["iface"] == "eth0" && l["direction"] == "ingress" && l["src"] == "10.96.0.10:53"
    });
    assert!(
        client_out < dnat
            && dnat < coredns_in
            && coredns_in < coredns_out
            && coredns_out < reverse
            && reverse < client_in,
        "{legs:#?}"
    );
    // Three namespaces: the client pod's, the node's, the CoreDNS pod's.
    let netns = |i: usize| legs[i]["netns"].as_u64().unwrap();
    assert!(
        netns(client_out) != netns(dnat)
            && netns(dnat) != netns(coredns_in)
            && netns(client_out) == netns(client_in)
    );
    assert_eq!(legs[client_in]["answers"][0]["data"], "10.96.0.1");
    trace_start
}

#[test]
fn drops_carry_the_kernel_reason_and_place() {
    require_root();
    let lab = Lab::up(&["--fault", "drop"]);
    let args = [&["-o", "json"][..], &lab_scope()].concat();
    let trace = Dnstrace::start_here(Keep::Every, &args).unwrap();
    // DNAT picks the endpoint at random: ask until a query hits the dropped one.
    let dropped =
        (0..30).any(|_| dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {NAME}"))) == "timeout");
    assert!(dropped, "30 queries, none sent to the dropped endpoint");
    let (_, stdout, _) = trace.stop(libc::SIGTERM).unwrap();
    let lines = json_lines(&stdout);
    let drop = lines
        .iter()
        .find(|l| l["hook"] == "kfree_skb" && l["dst"] == "10.244.0.54:53")
        .unwrap_or_else(|| panic!("no drop seen in {} lines", lines.len()));
    assert_eq!(drop["drop"]["reason"], "NETFILTER_DROP");
    let location = drop["drop"]["location"].as_str().unwrap();
    assert!(
        location.contains('+') && !location.starts_with("0x"),
        "{location}"
    );
}

/// Kernel ids of the BPF links that run any of `progs`.
fn links_of(progs: &[u32]) -> Vec<u64> {
    let out = run(std::process::Command::new("bpftool").args(["-j", "link", "show"])).unwrap();
    let links: Vec<Value> = serde_json::from_str(&out).unwrap();
    links
        .iter()
        .filter(|l| {
            l["prog_id"]
                .as_u64()
                .is_some_and(|p| progs.contains(&(p as u32)))
        })
        .filter_map(|l| l["id"].as_u64())
        .collect()
}

#[test]
fn tracepoints_are_detached_on_exit() {
    require_root();
    let trace = Dnstrace::start_here(Keep::Every, &[]).unwrap();
    let ids = trace.prog_ids();
    assert_eq!(
        links_of(&ids).len(),
        3,
        "one link per tracepoint while running"
    );
    let (status, _, stderr) = trace.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    // Links go at once; the programs' memory follows after an RCU grace period.
    assert_eq!(links_of(&ids), Vec::<u64>::new());
}

/// What `dnstrace check` said; it loads every program, kprobes and the
/// tracepoints' probe-read twins too, where they are not attached.
fn check() -> String {
    let out = dnstrace(&["check"]);
    let checked = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{checked}");
    assert!(checked.contains("dnstrace: check: "), "{checked}");
    checked
}

/// The first line of `checked` that holds `needle`.
fn said_about<'a>(checked: &'a str, needle: &str) -> &'a str {
    checked
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("nothing said about {needle}: {checked}"))
}

/// The verifier's walk of each device program, most of every start-up,
/// stays short: it had grown a feature at a time, unseen (105,450
/// to 134,492 instructions, 1 to 1.3 s of CPU each), until the header
/// parse's ways merged (`Scratch::opaque`: 29,356 to 31,943).
#[test]
fn the_device_programs_verify_in_few_instructions() {
    require_root();
    let checked = check();
    for program in ["dns_dev_xmit", "dns_dev_receive", "dns_kfree_skb"] {
        let line = said_about(&checked, &format!("{program} (prog id"));
        let verified: u32 = line
            .split(", ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no instructions verified said: {line}"));
        assert!(verified < 60_000, "{line}");
    }
}

#[test]
fn probe_read_twins_pass_the_verifier_on_standby() {
    require_root();
    let checked = check();
    for twin in ["dns_xmit_read", "dns_recv_read", "dns_kfree_read"] {
        let line = said_about(&checked, twin);
        assert!(
            line.contains("loaded and verified (prog id")
                && line.contains("attached only where dns_"),
            "{line}"
        );
    }
}

#[test]
fn kprobes_pass_the_verifier_and_say_why_they_are_off() {
    require_root();
    let checked = check();
    let trace = Dnstrace::start_here(Keep::Every, &[]).unwrap();
    let traced = trace.stderr_lines.clone();
    let (status, _, _) = trace.stop(libc::SIGTERM).unwrap();
    assert!(status.success());
    for function in [
        "nf_nat_manip_pkt",
        "__nf_conntrack_confirm",
        "nf_ct_resolve_clash",
    ] {
        let said = |lines: Vec<&str>| {
            lines
                .into_iter()
                .find(|l| l.contains(function))
                .unwrap_or_else(|| panic!("nothing said about {function}"))
                .to_owned()
        };
        // Attached where the kernel has kprobes; here, verified by `check`
        // and left unloaded by tracing, each saying why.
        let line = said(checked.lines().collect());
        assert!(
            line.contains("attached to k") || line.contains("loaded and verified (prog id"),
            "{line}"
        );
        let line = said(traced.iter().map(String::as_str).collect());
        assert!(
            line.contains("attached to k") || line.contains("not loaded: this kernel has no"),
            "{line}"
        );
    }
}
