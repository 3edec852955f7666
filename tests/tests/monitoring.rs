//! What comes with the agent for the tools SREs run (deploy/prometheus,
//! deploy/grafana): the alert rules pass `promtool check rules` and their
//! unit tests, the PrometheusRule holds the same groups, the PodMonitor
//! scrapes the DaemonSet's metrics port, the dashboard is well formed;
//! and, live on the lab, Prometheus scraping the agent and evaluating the
//! shipped rules file fires no alert while the lab is healthy, the alert
//! that names each fault once it is on, and every dashboard panel's query
//! returns series.
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value as Json;
use serde_yaml_ng::Value as Yaml;

use dnstrace_tests::{otlp, prometheus::*, *};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

const RULES: &str = "deploy/prometheus/dnstrace-rules.yaml";
const DASHBOARD: &str = "deploy/grafana/dnstrace.json";

fn yaml_documents(rel: &str) -> Vec<Yaml> {
    use serde::Deserialize as _;
    let text = std::fs::read_to_string(repo(rel)).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Yaml::deserialize(d).unwrap_or_else(|e| panic!("{rel}: {e}")))
        .collect()
}

fn yaml(rel: &str) -> Yaml {
    let mut docs = yaml_documents(rel);
    assert_eq!(docs.len(), 1, "{rel}: one document");
    docs.remove(0)
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(repo("deploy/prometheus"))
        .output()
        .expect("promtool (Debian's prometheus package)");
    assert!(
        out.status.success(),
        "promtool {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn alerting_rules() -> Vec<Yaml> {
    let rules = yaml(RULES);
    let groups = rules["groups"].as_sequence().unwrap();
    groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap().iter().cloned())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

#[test]
fn the_rules_pass_promtool_and_their_unit_tests() {
    promtool(&["check", "rules", "dnstrace-rules.yaml"]);
    promtool(&["test", "rules", "dnstrace-rules.test.yaml"]);
}

/// Every alert says how bad, what and what next (a dnstrace command), has
/// a section of docs/ALERTS.md, and is tested by promtool.
#[test]
fn every_alert_has_a_runbook_a_section_and_a_unit_test() {
    let alerts_doc = std::fs::read_to_string(repo("docs/ALERTS.md")).unwrap();
    let anchors: BTreeSet<String> = alerts_doc
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(str::to_lowercase)
        .collect();
    let unit_tests =
        std::fs::read_to_string(repo("deploy/prometheus/dnstrace-rules.test.yaml")).unwrap();
    let rules = alerting_rules();
    assert!(rules.len() >= 10, "{} alerts", rules.len());
    for r in rules {
        let name = r["alert"].as_str().unwrap();
        let severity = r["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("warning" | "critical")),
            "{name}: severity {severity:?}"
        );
        for a in ["summary", "description", "runbook", "runbook_url"] {
            assert!(r["annotations"][a].as_str().is_some(), "{name}: no {a}");
        }
        let runbook = r["annotations"]["runbook"].as_str().unwrap();
        assert!(
            runbook.contains("dnstrace ") && runbook.contains("{{ $labels."),
            "{name}: the runbook names the command with its labels: {runbook}"
        );
        let url = r["annotations"]["runbook_url"].as_str().unwrap();
        let anchor = url.rsplit_once("docs/ALERTS.md#").map(|(_, a)| a);
        assert!(
            anchor.is_some_and(|a| anchors.contains(a)),
            "{name}: {url} is no section of docs/ALERTS.md"
        );
        assert!(
            unit_tests.contains(&format!("alertname: {name}\n")),
            "{name}: no promtool unit test"
        );
    }
}

#[test]
fn the_prometheusrule_holds_the_rules_files_groups() {
    let rule = yaml("deploy/prometheus/prometheusrule.yaml");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    assert_eq!(
        rule["spec"]["groups"],
        yaml(RULES)["groups"],
        "deploy/prometheus/prometheusrule.yaml's groups are {RULES}'s"
    );
}

#[test]
fn the_podmonitor_scrapes_the_daemonsets_metrics_port() {
    let docs = yaml_documents("deploy/dnstrace.yaml");
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet in deploy/dnstrace.yaml");
    let pm = yaml("deploy/prometheus/podmonitor.yaml");
    assert_eq!(pm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(pm["kind"], "PodMonitor");

    let labels = ds["spec"]["template"]["metadata"]["labels"]
        .as_mapping()
        .unwrap();
    let wanted = pm["spec"]["selector"]["matchLabels"].as_mapping().unwrap();
    assert!(!wanted.is_empty());
    for (k, v) in wanted {
        assert_eq!(labels.get(k), Some(v), "the pods' label {k:?}");
    }
    let names = pm["spec"]["namespaceSelector"]["matchNames"]
        .as_sequence()
        .unwrap();
    assert_eq!(names, &[ds["metadata"]["namespace"].clone()]);

    let template = &ds["spec"]["template"];
    let annotations = &template["metadata"]["annotations"];
    let containers = template["spec"]["containers"].as_sequence().unwrap();
    let ports: Vec<&Yaml> = containers
        .iter()
        .flat_map(|c| c["ports"].as_sequence().unwrap())
        .collect();
    let endpoints = pm["spec"]["podMetricsEndpoints"].as_sequence().unwrap();
    assert!(!endpoints.is_empty());
    for e in endpoints {
        let port = ports
            .iter()
            .find(|p| p["name"] == e["port"])
            .unwrap_or_else(|| panic!("{:?} is no container port", e["port"]));
        // The port the annotations say serves /metrics.
        assert_eq!(
            port["containerPort"].as_u64().map(|p| p.to_string()),
            annotations["prometheus.io/port"]
                .as_str()
                .map(str::to_owned)
        );
        assert_eq!(e["path"], annotations["prometheus.io/path"]);
        assert_eq!(e["honorLabels"], Yaml::Bool(true));
    }
}

/// Grafana's own variables, set by Grafana itself.
const GRAFANA_VARIABLES: [&str; 4] = ["__rate_interval", "__interval", "__range", "__all"];

fn panels(dashboard: &Json) -> Vec<&Json> {
    let top = dashboard["panels"].as_array().unwrap();
    top.iter()
        .chain(
            top.iter()
                .flat_map(|p| p["panels"].as_array().into_iter().flatten()),
        )
        .collect()
}

/// `$name` and `${name}` in `text`.
fn variables(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        rest = &rest[i + 1..];
        let braced = rest.strip_prefix('{');
        let s = braced.unwrap_or(rest);
        let n = s
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        if n > 0 {
            found.push(s[..n].to_owned());
        }
    }
    found
}

#[test]
fn the_dashboard_is_well_formed() {
    let text = std::fs::read_to_string(repo(DASHBOARD)).unwrap();
    let d: Json = serde_json::from_str(&text).expect("the dashboard is JSON");
    let defined: BTreeSet<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    for v in ["datasource", "node", "namespace", "workload"] {
        assert!(defined.contains(v), "no variable {v}");
    }
    let mut ids = BTreeSet::new();
    let mut queried = 0;
    for p in panels(&d) {
        let id = p["id"].as_u64().expect("a panel id");
        assert!(ids.insert(id), "panel id {id} twice");
        if p["type"] == "row" {
            continue;
        }
        let title = p["title"].as_str().unwrap();
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "{title}: an empty query");
            queried += 1;
        }
    }
    assert!(queried >= 15, "{queried} queries");
    for v in variables(&text) {
        assert!(
            defined.contains(v.as_str()) || GRAFANA_VARIABLES.contains(&v.as_str()),
            "${v} is used and not defined"
        );
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        for used in variables(&v.to_string()) {
            assert!(defined.contains(used.as_str()), "{}: ${used}", v["name"]);
        }
    }
}

/// A panel's query as Grafana sends it with every variable at All.
fn as_grafana_sends(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$__range", "1h")
        .replace("$node", ".*")
        .replace("$namespace", ".*")
        .replace("$workload", ".*")
}

/// The alerts active now (pending or firing), as `/api/v1/alerts` has them.
fn active(prom: &Prometheus) -> Vec<Json> {
    let data = prom.api("alerts").unwrap();
    data["alerts"].as_array().cloned().unwrap_or_default()
}

/// Waits for alert `name` with `labels` to be active (pending or
/// firing), and returns it.
fn wait_for_alert(prom: &Prometheus, name: &str, labels: &[(&str, &str)]) -> Json {
    match alert_within(prom, name, labels, SETTLE) {
        Some(a) => a,
        None => panic!("{name} {labels:?} not active; active: {:#?}", active(prom)),
    }
}

/// Alert `name` with `labels`, once active, if it is within `wait`.
fn alert_within(
    prom: &Prometheus,
    name: &str,
    labels: &[(&str, &str)],
    wait: Duration,
) -> Option<Json> {
    let deadline = Instant::now() + wait;
    loop {
        let found = active(prom).into_iter().find(|a| {
            let l = &a["labels"];
            l["alertname"] == name && labels.iter().all(|(k, v)| l[*k] == *v)
        });
        if found.is_some() || Instant::now() >= deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// How long a fault's alert may take: its lookups end (a timeout is 5 s,
/// twice), the next scrape and rule evaluation (1 s each) see them.
const SETTLE: Duration = Duration::from_secs(60);

const KUBERNETES: &str = "kubernetes.default.svc.cluster.local.";

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Waits until every rule group has been evaluated after `after` (Unix
/// seconds).
fn wait_for_evaluation(prom: &Prometheus, after: f64) {
    let evaluated = || {
        let groups = prom.api("rules").unwrap()["groups"].clone();
        groups.as_array().is_some_and(|gs| {
            !gs.is_empty()
                && gs.iter().all(|g| {
                    g["lastEvaluation"]
                        .as_str()
                        .and_then(rfc3339_s)
                        .is_some_and(|t| t > after)
                })
        })
    };
    let deadline = Instant::now() + SETTLE;
    while !evaluated() {
        assert!(Instant::now() < deadline, "the rules were not evaluated");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Seconds since the epoch of an RFC 3339 time in UTC, as Prometheus
/// writes them (`2024-05-01T10:00:00.123456789Z`), by `date`.
fn rfc3339_s(t: &str) -> Option<f64> {
    let out = Command::new("date")
        .args(["-u", "-d", t, "+%s.%N"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// Switches `fault` on and makes the lookups that show it, as
/// tests/tests/diagnose.rs does for each.
fn bring_out(lab: &Lab, fault: &str) {
    let huge = format!("+bufsize=4096 {HUGE_NAME} TXT");
    if fault == "fragments-dropped" {
        // Cached in both CoreDNS pods: what is lost is their answer.
        for pod in ["10.244.0.53", "10.244.0.54"] {
            lab.dig(&WEB, &format!("@{pod} {huge}"));
        }
    }
    lab.fault(fault, true);
    match fault {
        "forward-loop" => drop(lab.dig(&WEB, &format!("@10.244.0.53 {}", fresh("loop")))),
        "upstream-timeout" => drop(lab.dig(&WEB, &format!("@{SERVICE} {}", fresh("ut")))),
        "no-dns-tcp" => drop(lab.dig(&WEB, &format!("@{SERVICE} +bufsize=1232 {BIG_NAME} TXT"))),
        "loopback-nameserver" => drop(lab.traffic(&["--pod", "web", "--name", KUBERNETES])),
        "fragments-dropped" => drop(lab.dig(&WEB, &format!("@{SERVICE} {huge}"))),
        "search-leak" => drop(lab.traffic(&["--pod", "web", "--name", "orders"])),
        _ => panic!("no way to bring out {fault}"),
    }
}

fn fresh_names(label: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| fresh(&format!("{label}{i}"))).collect()
}

/// `lab traffic` from `pod` for each of `names`, once.
fn look_up(lab: &Lab, pod: &str, names: &[String]) {
    let mut args = vec!["--pod", pod, "--rate", "20"];
    for n in names {
        args.extend(["--name", n]);
    }
    lab.traffic(&args);
}

/// The shipped rules file, unchanged, on a real Prometheus scraping the
/// real agent on one lab, its faults switched on one after the other.
/// Alerts are asserted active (pending or firing): their `for:` (2 to 15
/// minutes) would make this test wait that long, and promtool's unit tests
/// (above) hold the `for:` timing. An earlier fault's alert may still be
/// active (5 and 10 minute windows): each step asserts its own alert, with
/// the labels that name the fault's workload, node, kind or reason. The
/// lab's faults not here are in docs/ALERTS.md, with why.
#[test]
fn the_shipped_alerts_fire_on_the_labs_faults_and_every_panel_has_data() {
    require_root();
    let lab = Lab::up(&[]);
    let mut collector = otlp::Receiver::start(0);
    let endpoint = format!("http://{}", collector.addr);
    let listen = format!("127.0.0.1:{}", free_port());
    let flights = std::env::temp_dir().join(format!("dnstrace-alerts-{}", std::process::id()));
    let flight_dir = flights.display().to_string();
    let extra = ["--otlp-endpoint", &endpoint, "--flight-dir", &flight_dir];
    let agent = Dnstrace::start_here(Keep::Sampled, &agent_args(&listen, &extra)).unwrap();
    let rules = repo(RULES);
    let prom = Prometheus::evaluating(&listen, &[&rules]).unwrap();

    // Healthy: no alert at any evaluation, once the rules have seen the
    // traffic whole.
    let sent: u64 = lab
        .traffic(&["--rate", "5", "--duration", "4s"])
        .iter()
        .map(|l| l["queries"].as_u64().unwrap())
        .sum();
    let counted = prom.wait_for("sum(dnstrace_lookups_total)", SETTLE, |v| v >= sent as f64);
    assert_eq!(counted, Some(sent as f64), "lab traffic sent {sent}");
    wait_for_evaluation(&prom, now_s());
    let healthy = prom.query("max_over_time(ALERTS[10m])").unwrap();
    assert!(healthy.is_empty(), "alerts on a healthy lab: {healthy:#?}");

    // drop: half of web's queries never reach a CoreDNS pod.
    lab.fault("drop", true);
    lab.traffic(&["--pod", "web", "--rate", "10", "--duration", "4s"]);
    wait_for_alert(
        &prom,
        "DnstraceKernelDroppingLookups",
        &[("node", LAB_NODE), ("reason", "NETFILTER_DROP")],
    );
    wait_for_alert(
        &prom,
        "DnstraceCriticalAnomaly",
        &[("node", LAB_NODE), ("kind", "dropped")],
    );
    let failing = wait_for_alert(
        &prom,
        "DnstraceWorkloadLookupFailures",
        &[
            ("namespace", "default"),
            ("workload", "web"),
            ("severity", "warning"),
        ],
    );
    let runbook = failing["annotations"]["runbook"].as_str().unwrap();
    assert!(
        runbook.contains("dnstrace cluster --pod default/web-"),
        "the runbook names web's pod: {runbook}"
    );
    lab.fault("drop", false);

    // servfail: checkout's external names fail.
    lab.fault("servfail", true);
    look_up(&lab, "checkout", &fresh_names("sf", 30));
    wait_for_alert(
        &prom,
        "DnstraceWorkloadLookupFailures",
        &[("namespace", "shop"), ("workload", "checkout")],
    );
    lab.fault("servfail", false);

    // slow-upstream: web's external names take 800 ms.
    lab.fault("slow-upstream", true);
    look_up(&lab, "web", &fresh_names("slow", 30));
    wait_for_alert(
        &prom,
        "DnstraceWorkloadLookupLatencyHigh",
        &[("namespace", "default"), ("workload", "web")],
    );
    lab.fault("slow-upstream", false);

    // bridge-nf-off: replies bridged back from the CoreDNS pod un-NATed.
    lab.fault("bridge-nf-off", true);
    for _ in 0..3 {
        lab.dig(
            &WEB,
            &format!("@{SERVICE} kubernetes.default.svc.cluster.local."),
        );
    }
    wait_for_alert(
        &prom,
        "DnstraceUnNATedReplies",
        &[("node", LAB_NODE), ("kind", "reply_from_unexpected_source")],
    );
    lab.fault("bridge-nf-off", false);

    // no-dnat: queries to kube-dns are never translated.
    lab.fault("no-dnat", true);
    lab.dig(
        &WEB,
        &format!("@{SERVICE} kubernetes.default.svc.cluster.local."),
    );
    wait_for_alert(
        &prom,
        "DnstraceCriticalAnomaly",
        &[("node", LAB_NODE), ("kind", "service_not_translated")],
    );
    lab.fault("no-dnat", false);

    // The lab's other faults, each a critical anomaly of its own kind (or,
    // search-leak, a warning): its alert names the kind. Every fault is
    // tried before the test says which did not show.
    let mut missing = Vec::new();
    for (fault, kind) in [
        ("forward-loop", "forwarding_loop"),
        ("upstream-timeout", "upstream_timeout"),
        ("no-dns-tcp", "dns_tcp_unreachable"),
        ("loopback-nameserver", "loopback_nameserver"),
        ("fragments-dropped", "fragment_lost"),
        ("search-leak", "search_domain_leak"),
    ] {
        bring_out(&lab, fault);
        let alert = if fault == "search-leak" {
            "DnstraceAnomaly"
        } else {
            "DnstraceCriticalAnomaly"
        };
        let labels = [("node", LAB_NODE), ("kind", kind)];
        if alert_within(&prom, alert, &labels, SETTLE).is_none() {
            missing.push(format!("{fault}: {alert} {kind}"));
        }
        lab.fault(fault, false);
    }
    assert!(
        missing.is_empty(),
        "alerts not active: {missing:?}; active: {:#?}",
        active(&prom)
    );

    // The collector away: the agent's exports fail, retried.
    collector.stop();
    lab.traffic(&["--pod", "web", "--rate", "5", "--duration", "2s"]);
    wait_for_alert(&prom, "DnstraceOTLPExportFailing", &[("node", LAB_NODE)]);

    // Every panel's query has series, now that the faults made them.
    let d: Json = serde_json::from_str(&std::fs::read_to_string(repo(DASHBOARD)).unwrap()).unwrap();
    for p in panels(&d).into_iter().filter(|p| p["type"] != "row") {
        for t in p["targets"].as_array().unwrap() {
            let expr = as_grafana_sends(t["expr"].as_str().unwrap());
            let result = prom.query(&expr).unwrap();
            assert!(!result.is_empty(), "{}: no series for {expr}", p["title"]);
        }
    }

    // The agent gone: its target is down.
    let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    wait_for_alert(&prom, "DnstraceAgentDown", &[("node", LAB_NODE)]);
    let _ = std::fs::remove_dir_all(&flights);
}
