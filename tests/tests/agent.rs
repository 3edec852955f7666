//! `dnstrace agent` on the lab, scraped by a real Prometheus: the counts
//! per pod match what `lab traffic` sent, the latency histogram gives a
//! quantile, a fault shows in the anomaly and drop counters, and the page
//! passes `promtool check metrics`.
use std::{collections::BTreeMap, process::Command, time::Duration};

use dnstrace_tests::{prometheus::*, *};

/// How long counts may take to settle: a journey closes once answered or
/// past the agent's timeout (5.5 s), then the next scrape (1 s) shows it.
const SETTLE: Duration = Duration::from_secs(30);

const KUBERNETES: &str = "kubernetes.default.svc.cluster.local.";

#[test]
fn prometheus_scrapes_the_agent_and_its_counts_match_the_traffic() {
    require_root();
    let lab = Lab::up(&[]);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let agent = Dnstrace::start_here(
        Keep::Sampled,
        &[
            "agent",
            "--node-netns",
            NODE_NETNS,
            "--metrics-addr",
            &listen,
            "--node-name",
            "lab-node",
        ],
    )
    .unwrap();
    let prom = Prometheus::scraping(&listen).unwrap();

    let lookups = lab.traffic(&["--rate", "20", "--duration", "5s"]);
    let mut sent: BTreeMap<String, u64> = BTreeMap::new();
    for l in &lookups {
        let pod = l["pod"].as_str().unwrap().to_owned();
        *sent.entry(pod).or_default() += l["queries"].as_u64().unwrap();
    }
    assert_eq!(sent.len(), 2, "two client pods: {sent:?}");
    for (pod, queries) in &sent {
        let (ns, name) = pod.split_once('/').unwrap();
        let promql = format!("sum(dnstrace_lookups_total{{namespace=\"{ns}\",pod=\"{name}\"}})");
        let counted = prom.wait_for(&promql, SETTLE, |v| v >= *queries as f64);
        assert_eq!(
            counted,
            Some(*queries as f64),
            "{promql}: lab traffic sent {queries}"
        );
    }
    let p99 = prom
        .scalar("histogram_quantile(0.99, sum by (le) (dnstrace_lookup_duration_seconds_bucket{rcode=\"NOERROR\"}))")
        .expect("a latency quantile");
    assert!(p99 > 0.0 && p99 <= 1.0, "p99 {p99} s on a healthy lab");
    let noerror = prom.scalar("sum(dnstrace_lookup_duration_seconds_count{rcode=\"NOERROR\"})");
    assert!(
        noerror.is_some_and(|n| n > 0.0),
        "answered lookups in the histogram: {noerror:?}"
    );

    let page = Command::new("curl")
        .args(["-sf", &format!("http://{listen}/metrics")])
        .output()
        .unwrap();
    assert!(page.status.success());
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    check.stdin.take().unwrap().write_all(&page.stdout).unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    lab.fault("drop", true);
    for _ in 0..30 {
        if dig_status(&lab.dig(WEB, &format!("@{SERVICE} {KUBERNETES}"))) == "timeout" {
            break;
        }
    }
    let dropped = prom.wait_for(
        "sum(dnstrace_anomalies_total{kind=\"dropped\",severity=\"critical\"})",
        SETTLE,
        |v| v > 0.0,
    );
    assert!(
        dropped.is_some_and(|v| v > 0.0),
        "no dropped anomaly counted: {dropped:?}"
    );
    let drops = prom.scalar("sum(dnstrace_kernel_drops_total{reason=\"NETFILTER_DROP\"})");
    assert!(
        drops.is_some_and(|v| v > 0.0),
        "no NETFILTER_DROP counted: {drops:?}"
    );
    let lost = prom.scalar("dnstrace_events_lost_total");
    assert_eq!(lost, Some(0.0), "events lost");

    let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
}
