//! The agent's container image: built by deploy/image.sh with podman, with
//! no registry and no network, then run as deploy/dnstrace.yaml runs it
//! (its capabilities and nothing more, host network and PIDs, a read-only
//! root, the runtime's state and the namespaces mounted). From inside the
//! container it traces the lab, and a real Prometheus scrapes it.
use std::{
    collections::BTreeMap,
    process::{Command, Output},
    time::{Duration, Instant},
};

use dnstrace_tests::{prometheus::*, *};

const TAG: &str = "localhost/dnstrace:test";
const NAME: &str = "dnstrace-image-test";

/// The capabilities the manifest gives the container.
fn manifest_caps() -> Vec<String> {
    let yaml = std::fs::read_to_string(workspace().join("deploy/dnstrace.yaml")).unwrap();
    let line = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("add: ["))
        .expect("the manifest's added capabilities");
    line.trim_end_matches(']')
        .split(',')
        .map(|c| c.trim().trim_matches('"').to_owned())
        .collect()
}

fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .expect("running podman")
}

/// Removes the container however the test ends.
struct Container;

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "5", NAME]);
    }
}

/// This VM's root may lower its limits but not raise them (no
/// CAP_SYS_RESOURCE); podman would set its own defaults, above them.
fn lowered_limits() -> [String; 4] {
    let limit = |r| {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given.
        unsafe { libc::getrlimit(r, &mut l) };
        l.rlim_cur.min(8192)
    };
    let (files, procs) = (limit(libc::RLIMIT_NOFILE), limit(libc::RLIMIT_NPROC));
    [
        "--ulimit".into(),
        format!("nofile={files}:{files}"),
        "--ulimit".into(),
        format!("nproc={procs}:{procs}"),
    ]
}

#[test]
fn the_image_runs_as_the_daemonset_would_and_traces_the_lab() {
    require_root();
    let lab = Lab::up(&[]);
    let built = Command::new(workspace().join("deploy/image.sh"))
        .arg(dnstrace_release_bin())
        .arg(TAG)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "image.sh: {}",
        String::from_utf8_lossy(&built.stderr)
    );

    let _ = podman(&["rm", "-f", NAME]);
    let _container = Container;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut run: Vec<String> = [
        "run",
        "-d",
        "--name",
        NAME,
        "--network",
        "host",
        "--pid",
        "host",
        "--read-only",
        "--cap-drop",
        "all",
    ]
    .map(String::from)
    .to_vec();
    for cap in manifest_caps() {
        run.extend(["--cap-add".into(), cap]);
    }
    run.extend(lowered_limits());
    let lab_state = format!("{}:{}", lab_dir(), lab_dir());
    for mount in [
        "/sys/kernel/btf:/sys/kernel/btf:ro",
        "/run/netns:/run/netns",
        // The manifest's too: CRI names the pods' namespaces there.
        "/run/netns:/var/run/netns",
        &lab_state,
        "/sys/fs/cgroup:/host/sys/fs/cgroup:ro",
    ] {
        run.extend(["-v".into(), mount.into()]);
    }
    run.extend([
        "-e".into(),
        "DNSTRACE_CGROUP_ROOT=/host/sys/fs/cgroup".into(),
        // An https collector with no CA named: the agent starts only if
        // the image has the system's roots (nothing listens there; the
        // failures are counted).
        "-e".into(),
        "OTEL_EXPORTER_OTLP_ENDPOINT=https://127.0.0.1:9".into(),
    ]);
    run.extend(["--tmpfs".into(), "/var/lib/dnstrace".into(), TAG.into()]);
    run.extend(agent_args(&listen, &[]).into_iter().map(String::from));
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    let started = podman(&run);
    assert!(
        started.status.success(),
        "podman run: {}",
        String::from_utf8_lossy(&started.stderr)
    );

    let deadline = Instant::now() + Duration::from_secs(60);
    let ready = || {
        Command::new("curl")
            .args(["-sf", &format!("http://{listen}/readyz")])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    while !ready() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
    }
    let logs = || String::from_utf8_lossy(&podman(&["logs", NAME]).stderr).into_owned();
    assert!(
        ready(),
        "the agent in the container never became ready:\n{}",
        logs()
    );
    // The image's own iptables-save read kube-proxy's rules.
    assert!(logs().contains("services from iptables"), "{}", logs());
    // At the host's cgroup root, not the container's: answers count as
    // every socket of the node takes them.
    assert!(
        logs().contains("attached to cgroup_skb/ingress /host/sys/fs/cgroup"),
        "{}",
        logs()
    );

    let prom = Prometheus::scraping(&listen).unwrap();
    let lookups = lab.traffic(&["--rate", "10", "--duration", "3s"]);
    let mut sent: BTreeMap<String, u64> = BTreeMap::new();
    for l in &lookups {
        *sent
            .entry(l["pod"].as_str().unwrap().to_owned())
            .or_default() += l["queries"].as_u64().unwrap();
    }
    for (pod, queries) in &sent {
        let (ns, name) = pod.split_once('/').unwrap();
        let promql = format!("sum(dnstrace_lookups_total{{namespace=\"{ns}\",pod=\"{name}\"}})");
        let counted = prom.wait_for(&promql, Duration::from_secs(30), |v| v >= *queries as f64);
        assert_eq!(
            counted,
            Some(*queries as f64),
            "{promql}: lab traffic sent {queries}\n{}",
            logs()
        );
    }
    let build = prom.scalar("dnstrace_build_info{node=\"lab-node\"}");
    assert_eq!(build, Some(1.0));
}
