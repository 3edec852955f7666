//! `dnstrace agent` on the lab, scraped by a real Prometheus: the counts
//! per pod match what `lab traffic` sent, the latency histogram gives a
//! quantile, a fault shows in the anomaly and drop counters, and the page
//! passes `promtool check metrics`.
//!
//! Each agent is the lab's node's (`--node`): it counts the sockets of its
//! namespaces and its pods' alone, so that other labs run beside it.
use std::{
    collections::BTreeMap,
    net::UdpSocket,
    os::{fd::AsRawFd as _, unix::fs::PermissionsExt as _},
    process::Command,
    time::Duration,
};

use dnstrace_common::{
    lookups::{slot_of, PendingKey},
    sample::{message_label_hash, MAX_SHIFT},
    SampleLevel,
};
use dnstrace_tests::{otlp, prometheus::*, *};

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
    let flights = std::env::temp_dir().join(format!("dnstrace-flights-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&flights);
    let flight_dir = flights.display().to_string();
    let extra = [
        "--flight-dir",
        &flight_dir,
        "--flight-after",
        "3s",
        "--reread-services",
        "1s",
    ];
    let args = agent_args(&listen, &extra);
    let mut agent = Dnstrace::start_here(Keep::Sampled, &args).unwrap();
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
        if dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"))) == "timeout" {
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

    // The flight recorder wrote the minutes around the first anomaly: a
    // replay has the healthy lookups from before the fault, and the fault.
    let recording = prom
        .query("dnstrace_flight_recording_info")
        .unwrap()
        .first()
        .and_then(|r| r["metric"]["file"].as_str().map(str::to_owned))
        .expect("a flight recording named in the metrics");
    assert!(recording.starts_with(&flight_dir), "{recording}");
    std::thread::sleep(Duration::from_secs(4));
    let mode = std::fs::metadata(&recording).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{recording}");
    let replay = dnstrace(&["replay", "-o", "json", &recording]);
    assert!(
        replay.status.success(),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    let lines = json_lines(&String::from_utf8_lossy(&replay.stdout));
    let healthy = lines
        .iter()
        .filter(|l| {
            l["type"] == "journey"
                && l["outcome"]["status"] == "answered"
                && l["outcome"]["rcode"] == "NOERROR"
        })
        .count();
    assert!(
        healthy > 10,
        "{healthy} answered lookups from before the fault in the flight recording"
    );
    let summary = lines
        .iter()
        .find(|l| l["type"] == "summary")
        .expect("a summary");
    assert!(
        summary.to_string().contains("\"dropped\""),
        "the fault in the flight recording: {summary}"
    );
    let _ = std::fs::remove_dir_all(&flights);

    // A service made while it runs is named from kube-proxy's rules.
    let added = Command::new("ip")
        .args([
            "netns",
            "exec",
            &NODE,
            "iptables",
            "-t",
            "nat",
            "-A",
            "KUBE-SERVICES",
        ])
        .args([
            "-d",
            "10.96.7.7/32",
            "-p",
            "tcp",
            "-m",
            "comment",
            "--comment",
        ])
        .args([
            "default/new-svc:http cluster IP",
            "-m",
            "tcp",
            "--dport",
            "80",
            "-j",
            "RETURN",
        ])
        .status()
        .unwrap();
    assert!(added.success());
    agent
        .wait_stderr_for("new: default/new-svc", Duration::from_secs(10))
        .unwrap();

    let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
}

/// The agent's OTLP queue in the test below: more than the traces of its
/// first part (155), so that none is dropped there however late the
/// exporter runs; less than the outage's, with the batch held for
/// retrying (`OTLP_BATCH`, the agent's), so that some surely are.
const OTLP_QUEUE: u64 = 256;
const OTLP_BATCH: u64 = 512;

/// Traces and logs to a receiver built on the OpenTelemetry protos: one
/// trace per lookup with its spans and attributes, anomalies as logs tied
/// to a trace, and a collector that goes away and comes back loses only
/// what the queue could not hold, counted.
#[test]
fn journeys_reach_an_otlp_collector_as_traces_and_anomalies_as_logs() {
    require_root();
    let lab = Lab::up(&[]);
    let mut collector = otlp::Receiver::start(0);
    let listen = format!("127.0.0.1:{}", free_port());
    let endpoint = format!("http://{}", collector.addr);
    let queue = OTLP_QUEUE.to_string();
    let args = agent_args(
        &listen,
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-queue",
            &queue,
            "--no-flight-recorder",
        ],
    );
    let agent = Dnstrace::start_here(Keep::Sampled, &args).unwrap();
    let metric = |name: &str| scrape(&listen, name);

    let mut lookups = lab.traffic(&["--pod", "web", "--rate", "10", "--duration", "2s"]);
    // A name no cache holds: CoreDNS asks upstream.
    let fresh = format!("otlp-{}.example.com", std::process::id());
    lookups.extend(lab.traffic(&["--pod", "web", "--name", &fresh]));
    let queries: u64 = lookups.iter().map(|l| l["queries"].as_u64().unwrap()).sum();
    assert!(queries < OTLP_QUEUE, "{queries} traces fit the queue");
    let pod = lookups[0]["pod"]
        .as_str()
        .unwrap()
        .split_once('/')
        .unwrap()
        .1
        .to_owned();
    let roots_of_web = || {
        collector.received(|r| {
            r.spans
                .iter()
                .filter(|(_, s)| {
                    s.parent_span_id.is_empty()
                        && otlp::attr(&s.attributes, "k8s.pod.name") == Some(&pod)
                })
                .count() as u64
        })
    };
    wait_until(SETTLE, || roots_of_web() >= queries);
    assert_eq!(roots_of_web(), queries, "one trace per query of {pod}");
    collector.received(|r| check_traces(r, &pod, &fresh));

    // The collector away: what the queue cannot hold is dropped and
    // counted; what it held, and the batch being retried, arrive after.
    collector.stop();
    let away = lab.traffic(&["--pod", "checkout", "--rate", "40", "--duration", "3s"]);
    let offered: u64 = away.iter().map(|l| l["queries"].as_u64().unwrap()).sum();
    assert!(
        offered > OTLP_QUEUE + OTLP_BATCH,
        "{offered} journeys overflow the queue and a batch"
    );
    std::thread::sleep(Duration::from_secs(8));
    collector.restart();
    let roots = || {
        collector.received(|r| {
            r.spans
                .iter()
                .filter(|(_, s)| s.parent_span_id.is_empty())
                .count() as f64
        })
    };
    let accounted = || {
        let (journeys, dropped) = (
            metric("dnstrace_journeys_total"),
            metric("dnstrace_otlp_dropped_total{signal=\"traces\"}"),
        );
        (journeys, roots() + dropped, dropped)
    };
    wait_until(SETTLE, || {
        let (journeys, sent_or_dropped, _) = accounted();
        journeys == sent_or_dropped && metric("dnstrace_otlp_queued") == 0.0
    });
    let (journeys, sent_or_dropped, dropped) = accounted();
    assert_eq!(
        journeys, sent_or_dropped,
        "every journey exported or counted as dropped"
    );
    assert!(
        dropped > 0.0,
        "the queue held the outage's journeys: nothing dropped"
    );
    assert!(metric("dnstrace_otlp_failures_total{signal=\"traces\"}") > 0.0);

    lab.fault("drop", true);
    for _ in 0..30 {
        if dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {KUBERNETES}"))) == "timeout" {
            break;
        }
    }
    let dropped_log = || {
        collector.received(|r| {
            r.logs
                .iter()
                .find(|(_, l)| {
                    otlp::attr(&l.attributes, "dnstrace.anomaly.kind") == Some("dropped")
                })
                .map(|(_, l)| l.clone())
        })
    };
    wait_until(SETTLE, || dropped_log().is_some());
    let log = dropped_log().expect("the dropped anomaly as a log record");
    assert_eq!(log.severity_number, 17, "critical is ERROR");
    for key in [
        "dnstrace.anomaly.evidence",
        "dnstrace.anomaly.cause",
        "dnstrace.anomaly.fix",
    ] {
        assert!(
            otlp::has(&log.attributes, key),
            "{key} in {:?}",
            log.attributes
        );
    }
    let traced = collector.received(|r| r.spans.iter().any(|(_, s)| s.trace_id == log.trace_id));
    assert!(
        log.trace_id.len() == 16 && traced,
        "the log's trace id is a trace the collector has"
    );

    let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");

    // The lab's drop fault still on: each lookup is a trace and an anomaly.
    let certs = otlp::Certs::make();
    for transport in [otlp::Transport::Grpc, otlp::Transport::Http] {
        secure_collector_gets_traces_and_logs(&lab, &certs, transport);
    }
    collectors_that_refuse_are_counted_and_tracing_goes_on(&lab, &certs);
}

/// `dnstrace agent` on the lab with `args` and the variables `env`.
fn agent_with_env(listen: &str, args: &[&str], env: &[(&str, String)]) -> Dnstrace {
    let mut cmd = Command::new(dnstrace_bin());
    cmd.args(agent_args(listen, args)).args(EVERY_LOOKUP);
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    Dnstrace::start_command(cmd).unwrap()
}

/// A lookup of a name of its own from web that the drop fault lost (it
/// loses some): its trace, and its anomaly's log record.
fn lost_lookup(lab: &Lab, tag: &str) -> String {
    for n in 0..30 {
        let name = format!("{tag}-{n}-{}.example.com", std::process::id());
        if dig_status(&lab.dig(&WEB, &format!("@{SERVICE} {name}"))) == "timeout" {
            return format!("{name}.");
        }
    }
    panic!("no lookup of {tag} lost to the drop fault");
}

/// A collector that takes only mutual TLS with its CA's client
/// certificate and `authorization: Bearer x` gets the trace of a lookup
/// the test made and the log of its anomaly, gzipped: over gRPC set by
/// the specification's variables (an endpoint without a scheme is TLS),
/// over HTTP/protobuf by the flags.
fn secure_collector_gets_traces_and_logs(lab: &Lab, certs: &otlp::Certs, t: otlp::Transport) {
    let collector = otlp::Receiver::secure(t, certs.demands());
    let listen = format!("127.0.0.1:{}", free_port());
    let agent = match t {
        otlp::Transport::Grpc => {
            let env = [
                ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.addr.to_string()),
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", certs.path("ca.pem")),
                (
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                    certs.path("agent.pem"),
                ),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", certs.path("agent.key")),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "authorization=Bearer%20x".into(),
                ),
                ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip".into()),
            ];
            agent_with_env(&listen, &["--no-flight-recorder"], &env)
        }
        otlp::Transport::Http => {
            let (endpoint, ca, cert, key) = (
                format!("https://{}", collector.addr),
                certs.path("ca.pem"),
                certs.path("agent.pem"),
                certs.path("agent.key"),
            );
            let args = [
                "--no-flight-recorder",
                "--otlp-endpoint",
                &endpoint,
                "--otlp-protocol",
                "http/protobuf",
                "--otlp-certificate",
                &ca,
                "--otlp-client-certificate",
                &cert,
                "--otlp-client-key",
                &key,
                "--otlp-header",
                "authorization=Bearer%20x",
                "--otlp-compression",
                "gzip",
            ];
            agent_with_env(&listen, &args, &[])
        }
    };
    let name = lost_lookup(lab, &format!("{t:?}").to_lowercase());
    let got = || {
        collector.received(|r| {
            let trace = r.spans.iter().find(|(_, s)| {
                otlp::attr(&s.attributes, "dns.question.name") == Some(name.as_str())
            });
            let log =
                trace.and_then(|(_, s)| r.logs.iter().find(|(_, l)| l.trace_id == s.trace_id));
            log.map(|(_, l)| {
                let kind = otlp::attr(&l.attributes, "dnstrace.anomaly.kind").map(str::to_owned);
                (kind, r.encodings.clone())
            })
        })
    };
    wait_until(SETTLE, || got().is_some());
    let Some((kind, encodings)) = got() else {
        let page = page(&listen);
        let otlp: Vec<_> = page
            .lines()
            .filter(|l| l.starts_with("dnstrace_otlp"))
            .collect();
        let (names, kinds): (Vec<_>, Vec<_>) = collector.received(|r| {
            let names = r.spans.iter().map(|(_, s)| s.name.clone()).collect();
            let kinds = r
                .logs
                .iter()
                .map(|(_, l)| otlp::attr(&l.attributes, "dnstrace.anomaly.kind").map(str::to_owned))
                .collect();
            (names, kinds)
        });
        let (_, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
        panic!("{t:?}: no trace of {name} with its anomaly's log; spans {names:?}, logs {kinds:?}, {otlp:?}; the agent said {stderr:?}");
    };
    assert_eq!(
        kind.as_deref(),
        Some("dropped"),
        "{t:?}: the log of {name}'s anomaly"
    );
    assert!(
        encodings.iter().all(|e| e == "gzip"),
        "{t:?}: every request gzipped: {encodings:?}"
    );
    assert_eq!(
        scrape(&listen, "dnstrace_otlp_failures_total{signal=\"traces\"}"),
        0.0
    );
    let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
}

/// Traces to a gRPC collector whose certificate another CA signed than
/// the one the traces' own variable names, logs to an HTTP/protobuf one
/// without the header it demands: neither keeps anything, the failures
/// are counted by signal and said once each with their reason, and the
/// agent goes on counting journeys.
fn collectors_that_refuse_are_counted_and_tracing_goes_on(lab: &Lab, certs: &otlp::Certs) {
    let (grpc, http) = (
        otlp::Receiver::secure(otlp::Transport::Grpc, certs.demands()),
        otlp::Receiver::secure(otlp::Transport::Http, certs.demands()),
    );
    let listen = format!("127.0.0.1:{}", free_port());
    let env = [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("https://{}", grpc.addr),
        ),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", certs.path("ca.pem")),
        (
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            certs.path("other.pem"),
        ),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            certs.path("agent.pem"),
        ),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", certs.path("agent.key")),
        (
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
            format!("https://{}/v1/logs", http.addr),
        ),
        ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "http/protobuf".into()),
    ];
    let agent = agent_with_env(&listen, &["--no-flight-recorder"], &env);
    let metric = |name: &str| scrape(&listen, name);
    let failures = |signal: &str| {
        metric(&format!(
            "dnstrace_otlp_failures_total{{signal=\"{signal}\"}}"
        ))
    };
    lost_lookup(lab, "refused");
    wait_until(SETTLE, || {
        failures("traces") >= 1.0 && failures("logs") >= 1.0
    });
    let (journeys, traces, logs) = (
        metric("dnstrace_journeys_total"),
        failures("traces"),
        failures("logs"),
    );
    assert!(
        journeys >= 1.0 && traces >= 1.0 && logs >= 1.0,
        "{journeys} {traces} {logs}"
    );
    lost_lookup(lab, "refused-again");
    wait_until(SETTLE, || {
        metric("dnstrace_journeys_total") > journeys
            && failures("traces") > traces
            && failures("logs") > logs
    });
    assert!(
        metric("dnstrace_journeys_total") > journeys,
        "tracing goes on"
    );
    assert!(
        failures("traces") > traces && failures("logs") > logs,
        "failures grow"
    );
    assert!(
        grpc.received(|r| r.spans.is_empty() && r.encodings.is_empty()),
        "the handshake refused"
    );
    assert!(
        http.received(|r| r.logs.is_empty() && !r.encodings.is_empty()),
        "asked, refused"
    );
    let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    let said = |what: &str| {
        let start = format!("OTLP {what} export to");
        stderr
            .iter()
            .filter(|l| l.contains(&start))
            .collect::<Vec<_>>()
    };
    let (traces, logs) = (said("traces"), said("logs"));
    assert!(
        traces.len() == 1 && traces[0].contains("UnknownIssuer"),
        "one line for the streak, with its reason: {traces:?}"
    );
    assert!(
        logs.len() == 1 && logs[0].contains("401"),
        "one line for the streak, with its reason: {logs:?}"
    );
}

/// of `fresh`, a name no cache held, has the service, the resolver and its
/// upstream query under it, legs as events.
fn check_traces(r: &otlp::Received, pod: &str, fresh: &str) {
    let roots: Vec<_> = r
        .spans
        .iter()
        .filter(|(_, s)| {
            s.parent_span_id.is_empty() && otlp::attr(&s.attributes, "k8s.pod.name") == Some(pod)
        })
        .collect();
    let ids: std::collections::BTreeSet<_> = roots.iter().map(|(_, s)| &s.trace_id).collect();
    assert_eq!(ids.len(), roots.len(), "two lookups share a trace id");
    for (resource, s) in &roots {
        assert_eq!(
            otlp::attr(&resource.attributes, "k8s.node.name"),
            Some("lab-node")
        );
        for key in [
            "dns.question.name",
            "k8s.namespace.name",
            "k8s.pod.uid",
            "client.address",
            "server.address",
            "network.transport",
            "network.type",
        ] {
            assert!(otlp::has(&s.attributes, key), "{key} missing on {}", s.name);
        }
        assert!(
            s.events
                .iter()
                .all(|e| otlp::has(&e.attributes, "dnstrace.hook")),
            "legs as events"
        );
    }
    // Its search-list tries end at CoreDNS; the name itself goes upstream.
    let absolute = format!("{fresh}.");
    let traces: Vec<Vec<&str>> = roots
        .iter()
        .filter(|(_, s)| otlp::attr(&s.attributes, "dns.question.name") == Some(&absolute))
        .map(|(_, root)| {
            r.spans
                .iter()
                .filter(|(_, s)| s.trace_id == root.trace_id)
                .map(|(_, s)| s.name.as_str())
                .collect()
        })
        .collect();
    let whole = |trace: &Vec<&str>| {
        trace.iter().any(|n| n.starts_with("service 10.96.0.10:53"))
            && trace
                .iter()
                .any(|n| n.starts_with("resolver kube-system/coredns"))
            && trace.iter().any(|n| n.starts_with("upstream "))
    };
    assert!(traces.iter().any(whole), "{absolute}: {traces:?}");
}

/// The agent's `/metrics` page.
fn page(listen: &str) -> String {
    let page = Command::new("curl")
        .args(["-sf", &format!("http://{listen}/metrics")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&page.stdout).into_owned()
}

/// One sample of the agent's `/metrics` page (0 when absent).
fn scrape(listen: &str, series: &str) -> f64 {
    page(listen)
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// The number after `key` in dnsperf's report (its statistics, or a
/// response code's count on the `Response codes:` line).
fn dnsperf_field(out: &str, key: &str) -> u64 {
    out.lines()
        .find_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("Response codes:").map_or(l, str::trim);
            let at = l.find(key)?;
            l[at + key.len()..].split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no {key:?} in dnsperf's report: {out}"))
}

fn wait_until(wait: Duration, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + wait;
    while !done() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Under load, and with events lost, the counts are still exact: the
/// kernel counts lookups before the ring. dnsperf's queries from one pod
/// at 5,000 a second, with the agent (release build, every lookup
/// followed, a 1 MiB ring) stopped for 2 s in the middle, so that the ring
/// surely overflows; its count of the pod's lookups, by rcode, against
/// dnsperf's own.
#[test]
fn counts_stay_exact_under_load_and_lost_events() {
    require_root();
    let _lab = Lab::up(&[]);
    let listen = format!("127.0.0.1:{}", free_port());
    let extra = [
        "--no-flight-recorder",
        "--ring-buffer-mib",
        "1",
        "--follow-max",
        "0",
    ];
    let args = agent_args(&listen, &extra);
    let agent = Dnstrace::start_binary(dnstrace_release_bin(), Keep::Sampled, &args).unwrap();
    let queries = std::env::temp_dir().join(format!("dnstrace-load-{}.txt", std::process::id()));
    std::fs::write(
        &queries,
        "kubernetes.default.svc.cluster.local A\ndb.default.svc.cluster.local A\nwww.example.com A\nnothing.example.com A\n",
    )
    .unwrap();
    let perf = Command::new("ip")
        .args(["netns", "exec", &WEB, "dnsperf", "-s", SERVICE, "-d"])
        .arg(&queries)
        .args(["-l", "5", "-Q", "5000", "-c", "8", "-t", "2"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("running dnsperf");
    std::thread::sleep(Duration::from_millis(1_500));
    agent.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(2));
    agent.signal(libc::SIGCONT);
    let perf = perf.wait_with_output().expect("running dnsperf");
    let _ = std::fs::remove_file(&queries);
    let out = String::from_utf8_lossy(&perf.stdout);
    let sent = dnsperf_field(&out, "Queries sent:");
    assert!(sent > 20_000, "dnsperf sent only {sent}: {out}");
    let counted = |rcode: &str| web_lookups(&listen, rcode);
    wait_until(SETTLE, || counted("") >= sent);
    assert_eq!(counted(""), sent, "dnsperf sent {sent}: {out}");
    for rcode in ["NOERROR", "NXDOMAIN"] {
        let theirs = dnsperf_field(&out, &format!("{rcode} "));
        assert_eq!(
            counted(&format!("rcode=\"{rcode}\"")),
            theirs,
            "{rcode}: {out}"
        );
    }
    let lost = dnsperf_field(&out, "Queries lost:");
    assert_eq!(
        counted("rcode=\"TIMEOUT\"") + counted("rcode=\"DROPPED\""),
        lost,
        "{out}"
    );
    assert!(scrape(&listen, "dnstrace_events_lost_total") > 0.0);
    assert_eq!(scrape(&listen, "dnstrace_lookups_unfollowed_total"), 0.0);
    assert_eq!(scrape(&listen, "dnstrace_lookups_uncounted_total"), 0.0);
    let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
}

/// web's lookups in the agent's `dnstrace_lookups_total`, in the series
/// whose line holds `with`.
fn web_lookups(listen: &str, with: &str) -> u64 {
    // The pod's name; WEB is its network namespace's.
    let web = format!("pod=\"{}\"", WEB.pod());
    page(listen)
        .lines()
        .filter(|l| l.starts_with("dnstrace_lookups_total{") && l.contains(&web))
        .filter(|l| l.contains(with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum::<u64>()
}

/// Lookups never answered leave the kernel's table by the agent's sweep,
/// each counted once: `DROPPED` where the kernel dropped the query on its
/// way (the `drop` fault, at one CoreDNS endpoint), else `TIMEOUT` (a
/// socket in checkout that never answers).
#[test]
fn unanswered_lookups_count_once_as_dropped_or_timeouts() {
    require_root();
    let lab = Lab::up(&[]);
    let (listen, agent, _blackhole) = agent_and_blackhole("2s");
    for _ in 0..2 {
        let out = lab.dig(&WEB, &format!("@{CHECKOUT_IP} {KUBERNETES}"));
        assert_eq!(dig_status(&out), "timeout", "{out}");
    }
    lab.fault("drop", true);
    let statuses: Vec<String> = ["10.244.0.53", "10.244.0.54"]
        .iter()
        .map(|pod| dig_status(&lab.dig(&WEB, &format!("@{pod} {KUBERNETES}"))))
        .collect();
    lab.fault("drop", false);
    statuses
        .iter()
        .for_each(|s| assert!(s == "timeout" || s == "NOERROR", "{s}"));
    assert_ne!(
        statuses[0], statuses[1],
        "one endpoint dropped: {statuses:?}"
    );

    let pod = WEB.pod();
    let counted = |rcode: &str| web_counts(&listen, pod, rcode);
    let all = || counted("NOERROR") + counted("DROPPED") + counted("TIMEOUT");
    wait_until(SETTLE, || all() >= 4);
    // Two sweeps later: none counted twice.
    std::thread::sleep(Duration::from_secs(3));
    let page = page(&listen);
    assert_eq!(counted("TIMEOUT"), 2, "{page}");
    assert_eq!(counted("DROPPED"), 1, "{page}");
    assert_eq!(counted("NOERROR"), 1, "{page}");
    let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
}

const CHECKOUT_IP: &str = "10.244.0.11";

/// The agent, giving up on a query after `timeout`, its address, and a
/// socket that never answers at `CHECKOUT_IP`.
fn agent_and_blackhole(timeout: &str) -> (String, Dnstrace, UdpSocket) {
    let listen = format!("127.0.0.1:{}", free_port());
    let args = agent_args(&listen, &["--no-flight-recorder", "--timeout", timeout]);
    let agent = Dnstrace::start_binary(dnstrace_release_bin(), Keep::Sampled, &args).unwrap();
    (listen, agent, blackhole(&CHECKOUT))
}

/// A UDP socket on port 53 in the lab's namespace `ns` that nothing reads.
fn blackhole(ns: &str) -> UdpSocket {
    in_lab_netns(ns, || UdpSocket::bind("0.0.0.0:53").expect("port 53"))
}

/// `f`'s result, run on a thread in the lab's namespace `ns` (sockets made
/// there stay in it).
fn in_lab_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("the lab's namespace");
        // SAFETY: setns on this thread only, with a valid namespace fd.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap()
}

/// Queries whose keys share a slot of the kernel's table: the first holds
/// it, the others wait in its hash map, where their answer and the sweep
/// find them. From three sockets of web's, each with a DNS id that puts
/// its query in one slot: to the blackhole (holding the slot), to a
/// CoreDNS pod (answered), to the blackhole again (swept from the hash map).
#[test]
fn queries_that_share_a_slot_are_counted_all_the_same() {
    require_root();
    let _lab = Lab::up(&[]);
    // Long enough that the first query surely still holds the slot when
    // the others are sent, so that they go to the hash map.
    let (listen, agent, _blackhole) = agent_and_blackhole("5s");
    let keys = keys_of_one_slot(WEB_IP.parse().unwrap());
    let socks = in_lab_netns(&WEB, move || {
        keys.map(|(port, id)| {
            (
                UdpSocket::bind(("0.0.0.0", port)).expect("a port in web"),
                id,
            )
        })
    });
    let ask = |(sock, id): &(UdpSocket, u16), server: &str| {
        let q = query_bytes(*id, KUBERNETES, 1);
        sock.send_to(&q, format!("{server}:53")).unwrap();
    };
    ask(&socks[0], CHECKOUT_IP);
    ask(&socks[1], "10.244.0.53");
    let mut buf = [0; 512];
    socks[1]
        .0
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let (n, _) = socks[1].0.recv_from(&mut buf).expect("CoreDNS's answer");
    assert_eq!(buf[..2], socks[1].1.to_be_bytes(), "{:?}", &buf[..n]);
    ask(&socks[2], CHECKOUT_IP);

    let pod = WEB.pod();
    let counted = |rcode: &str| web_counts(&listen, pod, rcode);
    wait_until(SETTLE, || counted("NOERROR") + counted("TIMEOUT") >= 3);
    std::thread::sleep(Duration::from_secs(3));
    let page = page(&listen);
    assert_eq!(counted("NOERROR"), 1, "{page}");
    assert_eq!(counted("TIMEOUT"), 2, "{page}");
    let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
}

const WEB_IP: &str = "10.244.0.10";

/// Three source ports from 40000 on, each with a DNS id, whose queries
/// from `ip` hash to one slot. A port's 65,536 ids cover only two of the
/// 32,768 slots on average, so each key has a port of its own.
fn keys_of_one_slot(ip: std::net::Ipv4Addr) -> [(u16, u16); 3] {
    let slot = |port, id| {
        slot_of(&PendingKey {
            client: [u32::from_ne_bytes(ip.octets()), 0, 0, 0],
            port,
            id,
        })
    };
    let first = slot(40000, 1);
    let mut keys = (40001..41000u16).filter_map(|port| {
        (0..=u16::MAX)
            .find(|&id| slot(port, id) == first)
            .map(|id| (port, id))
    });
    [(40000, 1), keys.next().unwrap(), keys.next().unwrap()]
}

/// Web's lookups in the agent's page that ended `rcode`.
fn web_counts(listen: &str, pod: &str, rcode: &str) -> u64 {
    let web = format!("pod=\"{pod}\"");
    let rcode = format!("rcode=\"{rcode}\"");
    page(listen)
        .lines()
        .filter(|l| l.starts_with("dnstrace_lookups_total{") && l.contains(&web))
        .filter(|l| l.contains(&rcode))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum::<u64>()
}

/// A query from another node's pod arrives on a device (here a tun device
/// in the lab's node, written to as a remote node would send it, with the
/// DNAT done there) and is answered by a CoreDNS pod here: that node's
/// agent counts it, not this one. A lookup of web's, meanwhile, counts.
///
/// The agent serves `/metrics` as a web config file says (TLS, a client
/// certificate required, basic auth): a Prometheus given the certificate
/// scrapes it and has web's lookup, one without is refused, and the same
/// file secures that Prometheus's own API. Then slow clients: the issue's
/// 40 half-sent requests, then hundreds, silent connections and half
/// ClientHellos; a scrape is answered while they are open, past the cap
/// the oldest of them are closed for it, and none else.
#[test]
fn another_nodes_query_is_not_counted_here_and_a_secured_prometheus_scrapes_the_rest() {
    require_root();
    // Before any file is made: while the release build is pending, this
    // exits to the runner, and nothing would remove them.
    let bin = dnstrace_release_bin();
    let lab = Lab::up(&[]);
    let listen = format!("127.0.0.1:{}", free_port());
    let secure = WebFiles::make();
    let config = secure.config();
    let args = agent_args(
        &listen,
        &["--no-flight-recorder", "--web-config-file", &config],
    );
    let agent = Dnstrace::start_binary(bin, Keep::Sampled, &args).unwrap();
    let pod = WEB.pod();
    let sum = |filter: &str| {
        secure
            .page(&listen)
            .lines()
            .filter(|l| l.starts_with("dnstrace_lookups_total{") && l.contains(filter))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>()
    };
    let web = format!("pod=\"{pod}\"");
    let (web_before, unnamed_before) = (sum(&web), sum("pod=\"\""));
    let tun = remote_node::Tun::open(&NODE).unwrap();
    let answer = tun.ask(&query_bytes(
        0x5eed,
        "kubernetes.default.svc.cluster.local",
        1,
    ));
    assert_eq!(
        &answer[..2],
        &[0x5e, 0xed],
        "CoreDNS answered the remote query"
    );
    let out = lab.dig(
        &WEB,
        &format!("@{SERVICE} kubernetes.default.svc.cluster.local"),
    );
    assert_eq!(dig_status(&out), "NOERROR", "{out}");
    wait_until(SETTLE, || sum(&web) > web_before);
    assert_eq!(sum(&web), web_before + 1);
    assert_eq!(sum("pod=\"\""), unnamed_before, "{}", secure.page(&listen));
    drop(tun);

    prometheus_scrapes_over_tls(&secure, &listen, pod, web_before + 1);
    slow_clients_cannot_starve_a_scrape(&secure, &listen);
    let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
}

/// Debian's Prometheus scrapes the agent with the client certificate and
/// user, and has `pod`'s `lookups`; its job without a certificate is down
/// for TLS; curl without one, or with a wrong password, is refused; and
/// Prometheus's own API, behind the same web config file, likewise.
fn prometheus_scrapes_over_tls(secure: &WebFiles, listen: &str, pod: &str, lookups: u64) {
    let prom = Prometheus::scraping_securely(listen, secure.secured()).unwrap();
    let promql = format!("sum(dnstrace_lookups_total{{pod=\"{pod}\"}})");
    let counted = prom.wait_for(&promql, SETTLE, |v| v >= lookups as f64);
    assert_eq!(counted, Some(lookups as f64), "{promql} over TLS");
    assert_eq!(prom.scalar("up{job=\"dnstrace\"}"), Some(1.0));
    let refused = || prom.targets("no-client-cert").unwrap();
    wait_until(SETTLE, || refused().iter().any(|(_, e)| !e.is_empty()));
    let refused = refused();
    let (health, error) = &refused[0];
    assert_eq!(health, "down", "{refused:?}");
    assert!(error.contains("tls"), "{error}");

    let metrics = format!("https://{listen}/metrics");
    let ca = secure.dir.file("ca.pem").display().to_string();
    let no_cert = Command::new("curl")
        .args(["-s", "--cacert", &ca, &metrics])
        .output()
        .unwrap();
    assert!(!no_cert.status.success(), "curl without a certificate");
    let mut wrong = secure.curl_args();
    *wrong.last_mut().unwrap() = "scraper:wrong".into();
    assert_eq!(http_code(&wrong, &metrics), "401", "a wrong password");
    wrong.truncate(wrong.len() - 2);
    assert_eq!(http_code(&wrong, &metrics), "401", "no user");
    assert_eq!(http_code(&secure.curl_args(), &metrics), "200");
    let own = format!("https://127.0.0.1:{}/api/v1/query?query=up", prom.port);
    let no_cert = Command::new("curl")
        .args(["-s", "--cacert", &ca, &own])
        .output()
        .unwrap();
    assert!(
        !no_cert.status.success(),
        "Prometheus's API without a certificate"
    );
    let mut wrong = secure.curl_args();
    *wrong.last_mut().unwrap() = "scraper:wrong".into();
    assert_eq!(
        http_code(&wrong, &own),
        "401",
        "Prometheus, a wrong password"
    );
}

/// The HTTP status curl with `args` gets from `url`.
fn http_code(args: &[String], url: &str) -> String {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The agent's connections at once (its `MAX_CONNECTIONS`).
const MAX_CONNECTIONS: usize = 256;

/// Slow clients cannot starve a scrape. The 40 half-sent requests
/// first: a scrape is answered while all 40 stay open (no slot is held for
/// them). Then 240 more, 20 silent connections and 20 half ClientHellos:
/// past `MAX_CONNECTIONS` the agent closed exactly the oldest for the new
/// ones and the scrape, and every newer one is still open after it.
fn slow_clients_cannot_starve_a_scrape(secure: &WebFiles, listen: &str) {
    let addr: std::net::SocketAddr = listen.parse().unwrap();
    let tls = secure.client();
    let gauge = |name: &str| {
        let page = secure.page(listen);
        page.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .parse::<usize>()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no {name}: {page}"))
    };
    // Alone: the only connection open is this scrape's own.
    wait_until(SETTLE, || gauge("dnstrace_http_connections") == 1);
    assert_eq!(gauge("dnstrace_http_connections"), 1);
    let evicted = "dnstrace_http_connections_closed_total{reason=\"evicted\"}";
    let evicted_before = gauge(evicted);

    let mut slow: Vec<TcpStream> = (0..40).map(|_| half_request(addr, &tls)).collect();
    assert!(secure.page(listen).contains("dnstrace_lookups_total"));
    assert!(slow.iter_mut().all(still_open), "the 40 closed");

    slow.extend((0..240).map(|_| half_request(addr, &tls)));
    slow.extend((0..20).map(|_| TcpStream::connect(addr).unwrap()));
    slow.extend((0..20).map(|_| half_hello(addr, &tls)));
    assert!(secure.page(listen).contains("dnstrace_lookups_total"));
    // The newer ones first: checked at once, long before any deadline.
    let closed = slow.len() + 1 - MAX_CONNECTIONS;
    for (i, s) in slow.iter_mut().enumerate().skip(closed) {
        assert!(
            still_open(s),
            "slow connection {i} of {} closed",
            slow.len()
        );
    }
    for (i, s) in slow.iter_mut().enumerate().take(closed) {
        assert!(closes(s), "slow connection {i} still open");
    }
    // Counted as evicted; this scrape takes the room the last one left.
    assert_eq!(gauge(evicted) - evicted_before, closed);
}

use std::{io::Read as _, io::Write as _, net::TcpStream, sync::Arc};

/// A TLS connection, handshake done with the client certificate, that
/// sends half a request head and waits.
fn half_request(addr: std::net::SocketAddr, tls: &Arc<rustls::ClientConfig>) -> TcpStream {
    let mut sock = TcpStream::connect(addr).unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let mut conn = rustls::ClientConnection::new(tls.clone(), name).unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).unwrap();
    }
    conn.writer()
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    while conn.wants_write() {
        conn.write_tls(&mut sock).unwrap();
    }
    sock
}

/// A connection that sends the first half of a ClientHello and waits.
fn half_hello(addr: std::net::SocketAddr, tls: &Arc<rustls::ClientConfig>) -> TcpStream {
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let mut conn = rustls::ClientConnection::new(tls.clone(), name).unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.write_all(&hello[..hello.len() / 2]).unwrap();
    sock
}

/// Open: what the agent sent read, nothing more to read yet.
fn still_open(sock: &mut TcpStream) -> bool {
    sock.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match sock.read(&mut buf) {
            Ok(0) => return false,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
}

/// Closed by the agent, or closing: its end of the stream arrives.
fn closes(sock: &mut TcpStream) -> bool {
    sock.set_nonblocking(false).unwrap();
    sock.set_read_timeout(Some(SETTLE)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match sock.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

/// A web config as Prometheus's: the agent's certificate (127.0.0.1), a
/// client certificate required from `ca`, and `scraper`'s bcrypt hash,
/// made with openssl and htpasswd.
struct WebFiles {
    dir: Dir,
}

const PASSWORD: &str = "s3cret-scrape";

impl WebFiles {
    fn make() -> Self {
        let dir = Dir::new("web");
        let ext =
            |san: &str| format!("subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n");
        dir.certificates(&[
            ("agent", "ca", &ext("IP:127.0.0.1")),
            ("prometheus", "ca", &ext("DNS:prometheus")),
        ]);
        let htpasswd = Command::new("htpasswd")
            .args(["-nbBC", "10", "scraper", PASSWORD])
            .output()
            .expect("htpasswd (Debian's apache2-utils)");
        let line = String::from_utf8(htpasswd.stdout).unwrap();
        let hash = line.trim().strip_prefix("scraper:").expect("user:hash");
        std::fs::write(
            dir.file("web.yml"),
            format!("tls_server_config:\n  cert_file: agent.pem\n  key_file: agent.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n  min_version: TLS12\nbasic_auth_users:\n  scraper: '{hash}'\n"),
        )
        .unwrap();
        Self { dir }
    }

    fn config(&self) -> String {
        self.dir.file("web.yml").display().to_string()
    }

    fn secured(&self) -> Secured {
        Secured {
            ca: self.dir.file("ca.pem"),
            cert: self.dir.file("prometheus.pem"),
            key: self.dir.file("prometheus.key"),
            basic_auth: ("scraper".into(), PASSWORD.into()),
            web_config: self.dir.file("web.yml"),
        }
    }

    fn curl_args(&self) -> Vec<String> {
        self.secured().curl_args()
    }

    /// The agent's `/metrics` page, fetched as Prometheus does.
    fn page(&self, listen: &str) -> String {
        let out = Command::new("curl")
            .arg("-sf")
            .args(self.curl_args())
            .arg(format!("https://{listen}/metrics"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// rustls trusting `ca`, with Prometheus's client certificate.
    fn client(&self) -> Arc<rustls::ClientConfig> {
        use rustls::pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(self.dir.file("ca.pem")).unwrap())
            .unwrap();
        let cert = CertificateDer::from_pem_file(self.dir.file("prometheus.pem")).unwrap();
        let key = PrivateKeyDer::from_pem_file(self.dir.file("prometheus.key")).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![cert], key)
            .unwrap();
        Arc::new(config)
    }
}

/// A host-network client whose query leaves through an upper device (a
/// macvlan here; a VLAN device, a bond and a team take the same path): the
/// kernel's receive tracepoint sees the answer on the lower device only,
/// before its handler passes it up, yet the lookup counts as answered, not
/// as a timeout. The node reaches the lab's upstream unbound through a
/// macvlan on a veth pair of this test's.
#[test]
fn a_lookup_through_an_upper_device_is_answered() {
    require_root();
    let lab = Lab::up(&[]);
    let _upper = Macvlan::up(None).unwrap();
    three_lookups_are_answered(&lab, agent_args, &NODE, UPSTREAM, "www.example.com");
}

/// A macvlan in a network namespace of its own, as Multus gives a pod a
/// second interface: its lower device is in the node's namespace, so no
/// device hook in the pod's sees the answer; its socket does.
#[test]
fn a_lookup_from_a_macvlan_pod_is_answered() {
    // The pod is a namespace no runtime lists: the agent counts every
    // socket of the machine.
    require_alone();
    let lab = Lab::up(&[]);
    let pod = lab_ns("mv-pod");
    let _pod = Macvlan::up(Some(pod.clone())).unwrap();
    let args = agent_args_everywhere;
    three_lookups_are_answered(&lab, args, &pod, UPSTREAM, "www.example.com");
}

/// A host-network client's query to the service IP is DNATed in OUTPUT
/// and masqueraded in POSTROUTING before a socket's egress sees it, and
/// its answer un-NATed before its socket takes it: counted as its socket
/// sent it (the conntrack entry's original direction), it is answered.
#[test]
fn a_host_network_lookup_through_the_service_is_answered() {
    require_root();
    let lab = Lab::up(&[]);
    three_lookups_are_answered(&lab, agent_args, &NODE, SERVICE, KUBERNETES);
}

/// How an agent is started: `agent_args` or `agent_args_everywhere`.
type AgentArgs = for<'a> fn(&'a str, &[&'a str]) -> Vec<&'a str>;

/// Three lookups of `name` at `server` from `ns`, no pod's, under the
/// agent started with `args`: each counted answered, none as a timeout.
fn three_lookups_are_answered(lab: &Lab, args: AgentArgs, ns: &str, server: &str, name: &str) {
    let listen = format!("127.0.0.1:{}", free_port());
    let args = args(&listen, &["--no-flight-recorder"]);
    let agent = Dnstrace::start_binary(dnstrace_release_bin(), Keep::Sampled, &args).unwrap();
    let counted = |rcode: &str| {
        let series = format!("server=\"{server}:53\",type=\"A\",rcode=\"{rcode}\"");
        page(&listen)
            .lines()
            .filter(|l| l.starts_with("dnstrace_lookups_total{namespace=\"\",pod=\"\""))
            .filter(|l| l.contains(&series))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>()
    };
    for _ in 0..3 {
        let out = lab.dig(ns, &format!("@{server} {name}"));
        assert_eq!(dig_status(&out), "NOERROR", "{out}");
    }
    wait_until(SETTLE, || counted("NOERROR") + counted("TIMEOUT") >= 3);
    assert_eq!(counted("NOERROR"), 3, "{}", page(&listen));
    assert_eq!(counted("TIMEOUT"), 0, "{}", page(&listen));
    let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
}

/// The lab's upstream resolver, and its network namespace.
const UPSTREAM: &str = "198.51.100.53";

/// A veth pair from the lab's node to its upstream namespace, and a macvlan
/// on the node's end: in the node's namespace, or moved into `pod`, one of
/// its own (as Multus gives a pod a second interface). Where the macvlan
/// is, the route to the upstream resolver goes through it; all of it goes
/// on drop (the macvlan with its lower device).
struct Macvlan {
    pod: Option<String>,
}

impl Macvlan {
    fn up(pod: Option<String>) -> anyhow::Result<Self> {
        let macvlan = Self { pod };
        let pod = macvlan.pod.as_deref();
        let ns = pod.unwrap_or(&NODE);
        let mut lines = Vec::new();
        if let Some(pod) = pod {
            lines.push(format!("ip netns add {pod}"));
        }
        lines.extend([
            format!("ip -n {NODE} link add dtup0 type veth peer name dtup1 netns {UPSTREAM_NS}"),
            format!("ip -n {NODE} link add link dtup0 name dtmv0 type macvlan mode bridge"),
        ]);
        if let Some(pod) = pod {
            lines.push(format!("ip -n {NODE} link set dtmv0 netns {pod}"));
        }
        lines.extend([
            format!("ip -n {ns} addr add 198.18.7.1/30 dev dtmv0"),
            format!("ip -n {UPSTREAM_NS} addr add 198.18.7.2/30 dev dtup1"),
            format!("ip -n {NODE} link set dtup0 up"),
            format!("ip -n {ns} link set dtmv0 up"),
            format!("ip -n {UPSTREAM_NS} link set dtup1 up"),
            format!("ip -n {ns} route add {UPSTREAM}/32 via 198.18.7.2 dev dtmv0"),
        ]);
        for line in &lines {
            sh(line)?;
        }
        Ok(macvlan)
    }
}

impl Drop for Macvlan {
    fn drop(&mut self) {
        let _ = sh(&format!("ip -n {NODE} link del dtup0"));
        if let Some(pod) = &self.pod {
            let _ = sh(&format!("ip netns del {pod}"));
        }
    }
}

/// What another node sends: IPv4 packets written to a tun device in the
/// lab's node, arriving as from the wire (no device sent them here).
mod remote_node {
    use std::{
        fs::File,
        io::{Read as _, Write as _},
        os::fd::{AsRawFd as _, FromRawFd as _},
        time::{Duration, Instant},
    };

    use anyhow::{bail, Context as _, Result};

    /// The remote pod's address: a documentation range, routed only
    /// inside the lab's node, to the tun device.
    const REMOTE: [u8; 4] = [198, 18, 0, 7];
    const COREDNS: [u8; 4] = [10, 244, 0, 53];
    const PORT: u16 = 40_000;
    const NAME: &str = "dttun0";

    pub struct Tun {
        file: File,
        node: String,
    }

    impl Tun {
        /// A tun device in network namespace `node`, up, with the remote
        /// pods' range routed to it.
        pub fn open(node: &str) -> Result<Self> {
            let path = format!("/run/netns/{node}");
            let ns = File::open(&path).with_context(|| path.clone())?;
            let file = std::thread::spawn(move || -> Result<File> {
                // SAFETY: setns on this thread only, with a valid namespace fd.
                if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    bail!("setns: {}", std::io::Error::last_os_error());
                }
                tun()
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the tun thread panicked"))??;
            let tun = Self {
                file,
                node: node.to_owned(),
            };
            for args in [
                format!("link set {NAME} up"),
                format!("route add 198.18.0.0/24 dev {NAME}"),
            ] {
                dnstrace_tests::sh(&format!("ip -n {node} {args}"))?;
            }
            Ok(tun)
        }

        /// Sends `query` from the remote pod to CoreDNS's pod and returns
        /// the DNS answer that comes back out of the tun device.
        pub fn ask(&self, query: &[u8]) -> Vec<u8> {
            (&self.file)
                .write_all(&packet(query))
                .expect("writing to the tun device");
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut buf = [0u8; 2048];
            while Instant::now() < deadline {
                let n = match (&self.file).read(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    Err(e) => panic!("reading the tun device: {e}"),
                };
                let p = &buf[..n];
                let to_us = p.len() > 28 && p[0] >> 4 == 4 && p[9] == 17 && p[16..20] == REMOTE;
                if to_us && u16::from_be_bytes([p[22], p[23]]) == PORT {
                    return p[28..].to_vec();
                }
            }
            panic!("no answer came back out of the tun device");
        }
    }

    impl Drop for Tun {
        fn drop(&mut self) {
            let _ = dnstrace_tests::sh(&format!("ip -n {} route del 198.18.0.0/24", self.node));
        }
    }

    /// A non-blocking tun device named `NAME`, without packet information.
    fn tun() -> Result<File> {
        const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
        #[repr(C)]
        struct IfReq {
            name: [u8; 16],
            flags: libc::c_short,
            _pad: [u8; 22],
        }
        // SAFETY: open(2) of a device path, checked below.
        let fd = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            bail!("opening /dev/net/tun: {}", std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened and owned from here.
        let file = unsafe { File::from_raw_fd(fd) };
        let mut req = IfReq {
            name: [0; 16],
            flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
            _pad: [0; 22],
        };
        req.name[..NAME.len()].copy_from_slice(NAME.as_bytes());
        // SAFETY: TUNSETIFF with an ifreq that outlives the call.
        if unsafe { libc::ioctl(fd, TUNSETIFF, &mut req) } != 0 {
            bail!("TUNSETIFF: {}", std::io::Error::last_os_error());
        }
        Ok(file)
    }

    /// IPv4 and UDP (no checksum, which IPv4 allows) around `payload`.
    fn packet(payload: &[u8]) -> Vec<u8> {
        let total = (20 + 8 + payload.len()) as u16;
        let mut p = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 17, 0, 0];
        p[2..4].copy_from_slice(&total.to_be_bytes());
        p.extend_from_slice(&REMOTE);
        p.extend_from_slice(&COREDNS);
        let sum = checksum(&p);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        p.extend_from_slice(&PORT.to_be_bytes());
        p.extend_from_slice(&53u16.to_be_bytes());
        p.extend_from_slice(&(total - 20).to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(payload);
        p
    }

    fn checksum(header: &[u8]) -> u16 {
        let sum: u32 = header
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        let folded = (sum & 0xffff) + (sum >> 16);
        !((folded & 0xffff) + (folded >> 16)) as u16
    }
}

/// A level keeps names, not lookups: with three names asked 1,500 times a
/// second and `--follow-max 100`, the budget's level keeps one of them,
/// 500 lookups a second, under the pinned seed. The
/// agent sees it follows past twice its budget, draws the next seed, under
/// which none of the three passes, and then follows nothing more. The
/// names are chosen for the pinned seed and the one after it.
#[test]
fn following_past_the_budget_turns_to_other_names() {
    require_root();
    let _lab = Lab::up(&[]);
    const SEED: u32 = 0x1d0e;
    let next = next_seed(SEED);
    let level = |shift, seed| SampleLevel { shift, seed };
    let name = |i: u32| format!("hot{i}");
    let mut labels = (0..).map(name);
    // A level's names are a subset of the level below's: passing at the
    // highest passes at every one, failing at 1 in 2 fails at every one.
    let hot = labels
        .find(|l| keeps(level(MAX_SHIFT, SEED), l) && !keeps(level(1, next), l))
        .unwrap();
    let cold: Vec<String> = (0..)
        .map(name)
        .filter(|l| !keeps(level(1, SEED), l) && !keeps(level(1, next), l))
        .take(2)
        .collect();
    let listen = format!("127.0.0.1:{}", free_port());
    let seed = SEED.to_string();
    // At every moment: windows would draw a seed each (see the test
    // after this one).
    let extra = [
        "--no-flight-recorder",
        "--follow-max",
        "100",
        "--sample-seed",
        &seed,
        "--metrics-query-names",
        "--no-follow-windows",
    ];
    let args = agent_args(&listen, &extra);
    let mut agent = Dnstrace::start_binary(dnstrace_release_bin(), Keep::Sampled, &args).unwrap();
    let queries = std::env::temp_dir().join(format!("dnstrace-hot-{}.txt", std::process::id()));
    let text: String = std::iter::once(&hot)
        .chain(&cold)
        .map(|l| format!("{l}.default.svc.cluster.local A\n"))
        .collect();
    std::fs::write(&queries, text).unwrap();
    let perf = Command::new("ip")
        .args(["netns", "exec", &WEB, "dnsperf", "-s", SERVICE, "-d"])
        .arg(&queries)
        .args(["-l", "12", "-Q", "1500", "-c", "4"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("running dnsperf");
    agent
        .wait_stderr_for("past twice --follow-max: following others", SETTLE)
        .expect("the names followed turned");
    // Journeys of lookups started before the turn close within 5.5 s.
    std::thread::sleep(Duration::from_secs(6));
    let followed = || {
        page(&listen)
            .lines()
            .filter(|l| l.starts_with("dnstrace_lookup_names_total{") && l.contains(&hot))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>()
    };
    let before = followed();
    std::thread::sleep(Duration::from_secs(2));
    let after = followed();
    let perf = perf.wait_with_output().expect("running dnsperf");
    assert!(perf.status.success());
    let _ = std::fs::remove_file(&queries);
    assert!(before > 0, "{hot} was followed before the turn");
    assert_eq!(after, before, "{hot} followed still");
    let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
}

/// Past level 0 the agent follows in windows of 1 s and detaches the
/// device tracepoints between them. At 3,000 lookups a second of 64 names
/// with `--follow-max 100` (level 5: a window in 8 of the time, 1 name in
/// 4 in it), `bpftool` sees the agent's links go and come back, journeys close
/// from a window after the first, and the counts stay exact throughout.
#[test]
fn the_agent_follows_in_windows_and_counts_between_them() {
    require_root();
    let _lab = Lab::up(&[]);
    let listen = format!("127.0.0.1:{}", free_port());
    let extra = [
        "--no-flight-recorder",
        "--follow-max",
        "100",
        "--sample-seed",
        "7",
    ];
    let args = agent_args(&listen, &extra);
    let mut agent = Dnstrace::start_binary(dnstrace_release_bin(), Keep::Sampled, &args).unwrap();
    let ids = agent.prog_ids();
    let queries = std::env::temp_dir().join(format!("dnstrace-win-{}.txt", std::process::id()));
    let names: String = (0..64)
        .map(|i| format!("n{i}.default.svc.cluster.local A\n"))
        .collect();
    std::fs::write(&queries, names).unwrap();
    let mut perf = Command::new("ip")
        .args(["netns", "exec", &WEB, "dnsperf", "-s", SERVICE, "-d"])
        .arg(&queries)
        .args(["-l", "20", "-Q", "3000", "-c", "4"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("running dnsperf");
    agent
        .wait_stderr_for("following in windows of 1 s", SETTLE)
        .expect("windows from the budget's level");
    // Past the first window, and the journeys open in it.
    std::thread::sleep(Duration::from_secs(2));
    let journeys = || scrape(&listen, "dnstrace_journeys_total");
    let before = journeys();
    // The agent's programs with a link, every 100 ms while dnsperf runs,
    // as they change.
    let mut linked = Vec::new();
    while perf.try_wait().unwrap().is_none() {
        let now = linked_programs(&ids);
        if linked.last() != Some(&now) {
            linked.push(now);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let perf = perf.wait_with_output().expect("running dnsperf");
    let _ = std::fs::remove_file(&queries);
    let out = String::from_utf8_lossy(&perf.stdout);
    // Closed, then opened again by the agent, whose capabilities are gone
    // by then (the kernel asks only for the programs' descriptors).
    let all = ids.len();
    assert!(
        linked.windows(2).any(|w| w == [all - 2, all]),
        "the send and receive tracepoints' links, closed between windows: {linked:?} of {ids:?}"
    );
    assert!(
        linked.iter().all(|n| *n == all || *n == all - 2),
        "{linked:?}"
    );
    let sent = dnsperf_field(&out, "Queries sent:");
    let counted = || web_lookups(&listen, "");
    wait_until(SETTLE, || counted() >= sent);
    assert_eq!(counted(), sent, "{out}");
    assert!(journeys() > before, "journeys from a later window");
    let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
}

/// How many of the programs `ids` have a link now.
fn linked_programs(ids: &[u32]) -> usize {
    let out = Command::new("bpftool")
        .args(["-j", "link", "show"])
        .output()
        .expect("running bpftool");
    let links: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).expect("bpftool's JSON");
    let linked: std::collections::BTreeSet<u64> =
        links.iter().filter_map(|l| l["prog_id"].as_u64()).collect();
    ids.iter()
        .filter(|id| linked.contains(&u64::from(**id)))
        .count()
}

/// The seed the governor draws after `seed` (xorshift32, as in
/// `ingest::sampler`).
fn next_seed(seed: u32) -> u32 {
    let mut x = seed | 1;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    x
}

/// Whether `level` keeps lookups of names whose first label is `label`.
fn keeps(level: SampleLevel, label: &str) -> bool {
    let mut wire = vec![0u8; 12];
    wire.push(label.len() as u8);
    wire.extend_from_slice(label.as_bytes());
    level.keeps(message_label_hash(&wire))
}
