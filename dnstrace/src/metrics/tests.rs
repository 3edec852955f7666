use std::collections::{BTreeMap, BTreeSet, HashMap};

use dnstrace_common::Hook;

use super::*;
use crate::{
    correlate::{
        fixtures::{self, journey, leg},
        Gap,
    },
    decode::Rcode,
    pods::workload::{Workload, WorkloadKind},
};

const POD_NS: u32 = 4026532246;
const MS: u64 = 1_000_000;

/// A lookup of `web` over TCP through the service (the kernel counts
/// those over UDP): asked at 0, answered at `ms`.
fn lookup(outcome: Outcome, ms: u64) -> Journey {
    let (client, svc) = ("10.244.0.10:40000", "10.96.0.10:53");
    let mut legs = vec![leg(0, Hook::DevXmit, POD_NS, client, svc, false)];
    if matches!(outcome, Outcome::Answered { .. }) {
        legs.push(leg(ms * MS, Hook::DevReceive, POD_NS, svc, client, true));
    }
    let mut j = journey(
        client,
        "kubernetes.default.svc.cluster.local.",
        legs,
        outcome,
    );
    j.tcp = true;
    j
}

fn answered(rcode: Rcode) -> Outcome {
    fixtures::answered(rcode, &[])
}

fn names() -> Names {
    let mut pods = BTreeMap::new();
    pods.insert(
        "10.244.0.10".parse().unwrap(),
        "default/web-7d9f8c6b5-x2x4k".to_owned(),
    );
    pods.insert(
        "10.244.0.53".parse().unwrap(),
        "kube-system/coredns-a".to_owned(),
    );
    let mut workloads = BTreeMap::new();
    workloads.insert(
        "10.244.0.10".parse().unwrap(),
        Workload {
            kind: WorkloadKind::Deployment,
            name: "web".into(),
        },
    );
    Names::from_entries(pods).with_workloads(workloads)
}

fn kernel() -> KernelNames {
    KernelNames::recorded(
        HashMap::from([(2, "NOT_SPECIFIED".into()), (7, "NETFILTER_DROP".into())]),
        HashMap::new(),
    )
}

/// `j` counted, with no anomaly, at `now_ns`.
fn count(m: &mut Metrics, j: &Journey, now_ns: u64) {
    m.journey(j, &[], &names(), &kernel(), now_ns);
}

fn page(m: &Metrics) -> String {
    let mut out = String::new();
    m.render(&mut out);
    out
}

const WEB: &str = "namespace=\"default\",pod=\"web-7d9f8c6b5-x2x4k\",workload=\"web\",workload_kind=\"Deployment\",server=\"10.96.0.10:53\"";

#[test]
fn a_lookup_counts_by_pod_workload_server_type_rcode_proto_and_family() {
    let mut m = Metrics::new(MetricsOptions::default());
    for outcome in [
        answered(Rcode::NOERROR),
        answered(Rcode::NOERROR),
        answered(Rcode::NXDOMAIN),
        Outcome::Timeout,
    ] {
        count(&mut m, &lookup(outcome, 3), 0);
    }
    let out = page(&m);
    for line in [
        format!("dnstrace_lookups_total{{{WEB},type=\"A\",rcode=\"NOERROR\",proto=\"tcp\",family=\"1\"}} 2\n"),
        format!("dnstrace_lookups_total{{{WEB},type=\"A\",rcode=\"NXDOMAIN\",proto=\"tcp\",family=\"1\"}} 1\n"),
        format!("dnstrace_lookups_total{{{WEB},type=\"A\",rcode=\"TIMEOUT\",proto=\"tcp\",family=\"1\"}} 1\n"),
        format!("dnstrace_lookup_duration_seconds_bucket{{{WEB},rcode=\"NOERROR\",le=\"0.005\"}} 2\n"),
        format!("dnstrace_lookup_duration_seconds_count{{{WEB},rcode=\"NOERROR\"}} 2\n"),
        "dnstrace_journeys_total 4\n".to_owned(),
    ] {
        assert!(out.contains(&line), "{line} not in\n{out}");
    }
    assert!(
        !out.contains("rcode=\"TIMEOUT\",le="),
        "timeouts have no latency:\n{out}"
    );
}

#[test]
fn a_lookup_whose_legs_may_be_missing_is_unknown_not_a_timeout() {
    let mut m = Metrics::new(MetricsOptions::default());
    let mut j = lookup(Outcome::Timeout, 0);
    j.incomplete = Some(Gap::Lost);
    count(&mut m, &j, 0);
    let out = page(&m);
    assert!(out.contains("rcode=\"UNKNOWN\""), "{out}");
    assert!(
        out.contains("dnstrace_journeys_incomplete_total 1\n"),
        "{out}"
    );
}

#[test]
fn upstream_queries_count_by_resolver_and_drops_by_reason() {
    let mut m = Metrics::new(MetricsOptions::default());
    let mut j = lookup(answered(Rcode::SERVFAIL), 40);
    let mut up = lookup(
        Outcome::Dropped {
            reason: 7,
            location: 0,
        },
        0,
    );
    up.client = "10.244.0.53:5353".parse().unwrap();
    up.tcp = true;
    let mut drop = leg(
        MS,
        Hook::Drop,
        POD_NS,
        "10.244.0.53:5353",
        "192.0.2.1:53",
        false,
    );
    drop.drop = Some(Box::new((7, 0)));
    up.legs = vec![
        leg(
            0,
            Hook::DevXmit,
            POD_NS,
            "10.244.0.53:5353",
            "192.0.2.1:53",
            false,
        ),
        drop,
    ];
    j.upstream.push(up);
    m.journey(
        &j,
        &[(AnomalyKind::Dropped, "x".into())],
        &names(),
        &kernel(),
        0,
    );
    let out = page(&m);
    for line in [
        "dnstrace_upstream_queries_total{resolver_namespace=\"kube-system\",resolver=\"coredns-a\",to=\"192.0.2.1:53\",type=\"A\",rcode=\"DROPPED\",proto=\"tcp\"} 1\n",
        "dnstrace_kernel_drops_total{reason=\"NETFILTER_DROP\"} 1\n",
        "dnstrace_anomalies_total{kind=\"dropped\",severity=\"critical\"} 1\n",
    ] {
        assert!(out.contains(line), "{line} not in\n{out}");
    }
}

#[test]
fn query_names_are_labels_only_when_asked_for() {
    let mut m = Metrics::new(MetricsOptions::default());
    count(&mut m, &lookup(answered(Rcode::NOERROR), 1), 0);
    assert!(!page(&m).contains("kubernetes.default"));
    let mut m = Metrics::new(MetricsOptions {
        query_names: true,
        ..MetricsOptions::default()
    });
    let mut udp = lookup(answered(Rcode::NOERROR), 1);
    udp.tcp = false;
    count(&mut m, &udp, 0);
    assert!(page(&m).contains("dnstrace_lookup_names_total{namespace=\"default\",pod=\"web-7d9f8c6b5-x2x4k\",name=\"kubernetes.default.svc.cluster.local.\",type=\"A\",rcode=\"NOERROR\"} 1\n"));
}

/// What the kernel counted over UDP: by pod, with its latency, and a
/// resolver's as its queries upstream.
fn kernel_counted(client: &str, server: &str, ended: Ended, count: u64) -> Counted {
    let mut buckets = [0; family::BOUNDS.len()];
    buckets[1] = count;
    let answered = matches!(ended, Ended::Answered(_));
    Counted {
        client: client.parse().unwrap(),
        server: server.parse().unwrap(),
        qtype: crate::decode::Qtype::AAAA,
        ended,
        count,
        buckets: if answered {
            buckets
        } else {
            [0; family::BOUNDS.len()]
        },
        answered: if answered { count } else { 0 },
        sum_ns: if answered { count * 7 * MS } else { 0 },
    }
}

#[test]
fn kernel_counts_are_lookups_or_a_resolvers_queries_upstream() {
    let mut m = Metrics::new(MetricsOptions::default());
    let resolvers = BTreeSet::new();
    let web = "10.244.0.10";
    for c in [
        kernel_counted(web, "10.96.0.10:53", Ended::Answered(Rcode::NOERROR), 5),
        kernel_counted(web, "10.96.0.10:53", Ended::Answered(Rcode::NOERROR), 2),
        kernel_counted(web, "10.96.0.10:53", Ended::Timeout, 1),
        kernel_counted(web, "10.96.0.10:53", Ended::Dropped, 1),
        kernel_counted(
            "10.244.0.53",
            "192.0.2.1:53",
            Ended::Answered(Rcode::SERVFAIL),
            3,
        ),
    ] {
        m.counted(&c, &names(), &resolvers, 0);
    }
    // A journey over UDP is the kernel's to count, not counted again.
    let mut udp = lookup(answered(Rcode::NOERROR), 1);
    udp.tcp = false;
    count(&mut m, &udp, 0);
    let out = page(&m);
    let web = "namespace=\"default\",pod=\"web-7d9f8c6b5-x2x4k\",workload=\"web\",workload_kind=\"Deployment\",server=\"10.96.0.10:53\"";
    for line in [
        format!("dnstrace_lookups_total{{{web},type=\"AAAA\",rcode=\"NOERROR\",proto=\"udp\",family=\"1\"}} 7\n"),
        format!("dnstrace_lookups_total{{{web},type=\"AAAA\",rcode=\"TIMEOUT\",proto=\"udp\",family=\"1\"}} 1\n"),
        format!("dnstrace_lookups_total{{{web},type=\"AAAA\",rcode=\"DROPPED\",proto=\"udp\",family=\"1\"}} 1\n"),
        format!("dnstrace_lookup_duration_seconds_bucket{{{web},rcode=\"NOERROR\",le=\"0.005\"}} 0\n"),
        format!("dnstrace_lookup_duration_seconds_bucket{{{web},rcode=\"NOERROR\",le=\"0.01\"}} 7\n"),
        format!("dnstrace_lookup_duration_seconds_sum{{{web},rcode=\"NOERROR\"}} 0.049\n"),
        "dnstrace_upstream_queries_total{resolver_namespace=\"kube-system\",resolver=\"coredns-a\",to=\"192.0.2.1:53\",type=\"AAAA\",rcode=\"SERVFAIL\",proto=\"udp\"} 3\n".to_owned(),
    ] {
        assert!(out.contains(&line), "{line} not in\n{out}");
    }
    let total: u64 = out
        .lines()
        .filter(|l| l.starts_with("dnstrace_lookups_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, 9, "{out}");
    assert!(!out.contains("rcode=\"TIMEOUT\",le="), "{out}");
}

/// With the series budget spent, counts go on in `_overflow` series: the
/// sum over a family stays the number of lookups. (Two series: the first
/// lookup and its latency; three lookups and three latencies overflow.)
#[test]
fn past_the_series_limit_every_lookup_is_still_counted() {
    let mut m = Metrics::new(MetricsOptions {
        max_series: 2,
        ..MetricsOptions::default()
    });
    for rcode in [
        Rcode::NOERROR,
        Rcode::NXDOMAIN,
        Rcode::SERVFAIL,
        Rcode::REFUSED,
    ] {
        count(&mut m, &lookup(answered(rcode), 1), 0);
    }
    let out = page(&m);
    let total: u64 = out
        .lines()
        .filter(|l| l.starts_with("dnstrace_lookups_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, 4, "{out}");
    assert!(
        out.contains("dnstrace_metric_series_overflow_total 6\n"),
        "{out}"
    );
    assert!(out.contains("dnstrace_metric_series 2\n"), "{out}");
}

#[test]
fn a_pod_gone_quiet_past_the_ttl_loses_its_series() {
    let mut m = Metrics::new(MetricsOptions {
        series_ttl_ns: 60_000 * MS,
        ..MetricsOptions::default()
    });
    count(&mut m, &lookup(answered(Rcode::NOERROR), 1), 0);
    let mut other = lookup(answered(Rcode::NOERROR), 1);
    other.client = "10.244.0.99:40000".parse().unwrap();
    count(&mut m, &other, 200_000 * MS);
    let out = page(&m);
    assert!(!out.contains("web-7d9f8c6b5-x2x4k"), "{out}");
    assert!(
        out.contains("dnstrace_lookups_total{namespace=\"\",pod=\"\""),
        "{out}"
    );
}

/// A journey counts once for each kind it showed, however its badges fall.
#[test]
fn a_journey_counts_once_per_anomaly_kind() {
    let mut m = Metrics::new(MetricsOptions::default());
    let badges = [
        (AnomalyKind::Dropped, "a".to_owned()),
        (AnomalyKind::UpstreamTimeout, "b".to_owned()),
        (AnomalyKind::Dropped, "c".to_owned()),
    ];
    let j = lookup(Outcome::Timeout, 0);
    m.journey(&j, &badges, &names(), &kernel(), 0);
    let out = page(&m);
    assert!(
        out.contains("dnstrace_anomalies_total{kind=\"dropped\",severity=\"critical\"} 1\n"),
        "{out}"
    );
    assert!(
        out.contains(
            "dnstrace_anomalies_total{kind=\"upstream_timeout\",severity=\"critical\"} 1\n"
        ),
        "{out}"
    );
}

/// A finding about a journey already counted (a TCP set-up that failed
/// after the truncated answer that led there) counts when it is made.
#[test]
fn anomalies_of_journeys_already_counted_count_when_found() {
    let mut m = Metrics::new(MetricsOptions::default());
    let hit = (AnomalyKind::DnsTcpUnreachable, "10.96.0.10:53".to_owned());
    m.late(std::slice::from_ref(&hit), 1);
    m.late(&[hit], 2);
    let out = page(&m);
    assert!(
        out.contains(
            "dnstrace_anomalies_total{kind=\"dns_tcp_unreachable\",severity=\"critical\"} 2\n"
        ),
        "{out}"
    );
}

/// A journey's upstream queries over TCP count at any depth, those over
/// UDP never (the kernel counts them).
#[test]
fn upstream_queries_over_tcp_count_at_every_depth() {
    let mut m = Metrics::new(MetricsOptions::default());
    let upstream = |tcp: bool, to: &str| {
        let mut u = lookup(answered(Rcode::NOERROR), 2);
        u.client = "10.244.0.53:5353".parse().unwrap();
        u.legs = vec![leg(0, Hook::DevXmit, POD_NS, "10.244.0.53:5353", to, false)];
        u.tcp = tcp;
        u
    };
    let mut udp = upstream(false, "192.0.2.1:53");
    udp.upstream.push(upstream(true, "192.0.2.2:53"));
    let mut tcp = upstream(true, "192.0.2.3:53");
    tcp.upstream.push(upstream(false, "192.0.2.4:53"));
    let mut j = lookup(answered(Rcode::NOERROR), 5);
    j.upstream = vec![udp, tcp];
    count(&mut m, &j, 0);
    let out = page(&m);
    let counted: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("dnstrace_upstream_queries_total{"))
        .collect();
    assert_eq!(counted.len(), 2, "{out}");
    assert!(counted.iter().all(|l| l.contains("proto=\"tcp\"")), "{out}");
    assert!(
        counted.iter().any(|l| l.contains("to=\"192.0.2.2:53\"")),
        "{out}"
    );
    assert!(
        counted.iter().any(|l| l.contains("to=\"192.0.2.3:53\"")),
        "{out}"
    );
}
