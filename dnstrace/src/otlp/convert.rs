//! Journeys as OTLP spans and anomalies as OTLP log records, with the
//! OpenTelemetry semantic conventions' attribute names where one exists
//! and the rest under `dnstrace.`.
//!
//! A journey is a trace: its root span is the lookup as the client saw it;
//! under it the service (where the DNAT was), the resolver pod that
//! answered, and each of its upstream queries. Legs are span events.
use std::net::{IpAddr, SocketAddr};

use opentelemetry_proto::tonic::{
    common::v1::{any_value, AnyValue, ArrayValue, KeyValue},
    logs::v1::{LogRecord, SeverityNumber},
    trace::v1::{
        span::{Event, SpanKind},
        status::StatusCode,
        Span, Status,
    },
};
use sha2::{Digest, Sha256};

use crate::{
    clock::Clock,
    correlate::{Journey, Leg, Outcome},
    decode::{KernelNames, Rcode},
    diagnose::{Anomaly, Severity},
    naming::Names,
};

/// Lookups starting within one window share it in their trace id: the
/// same lookup seen by two nodes (their clocks a little apart) gets one.
pub const WINDOW_NS: u64 = 10_000_000_000;

/// What a conversion needs besides the journey.
pub struct Context<'a> {
    pub clock: Clock,
    pub names: &'a Names,
    pub kernel: &'a KernelNames,
    /// Makes span ids differ between nodes that see the same trace.
    pub node: &'a str,
}

/// The trace id of a lookup: from what every node on its path can see,
/// the client's socket, the DNS id, the question and its start's window.
pub fn trace_id(j: &Journey, clock: Clock) -> [u8; 16] {
    let start = wall_ns(clock, j.started_ns) / WINDOW_NS;
    let mut h = Sha256::new();
    match j.client.ip() {
        IpAddr::V4(a) => h.update(a.octets()),
        IpAddr::V6(a) => h.update(a.octets()),
    }
    h.update(j.client.port().to_be_bytes());
    h.update(j.dns_id.to_be_bytes());
    h.update(j.name.to_ascii_lowercase().as_bytes());
    h.update(j.qtype.0.to_be_bytes());
    h.update(start.to_be_bytes());
    h.finalize()[..16].try_into().expect("16 of 32 bytes")
}

fn span_id(trace: &[u8; 16], node: &str, n: u32) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(trace);
    h.update(node.as_bytes());
    h.update(n.to_be_bytes());
    h.finalize()[..8].to_vec()
}

fn wall_ns(clock: Clock, mono_ns: u64) -> u64 {
    clock
        .wall(mono_ns)
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The spans of `j`: the root first.
pub fn spans(j: &Journey, cx: &Context) -> Vec<Span> {
    let trace = trace_id(j, cx.clock);
    let mut b = Builder {
        cx,
        trace,
        spans: Vec::new(),
    };
    let root = b.root(j);
    let mut parent = root.clone();
    if let Some(dnat) = &j.dnat {
        parent = b.service(j, &root, dnat.0, dnat.1);
    }
    let server = j
        .dnat
        .as_ref()
        .map_or_else(|| j.origin().map(|o| o.dst), |d| Some(d.1));
    if let Some(server) = server {
        let resolver = b.resolver(j, &parent, server);
        for u in &j.upstream {
            b.upstream(u, &resolver);
        }
    }
    b.spans
}

struct Builder<'a> {
    cx: &'a Context<'a>,
    trace: [u8; 16],
    spans: Vec<Span>,
}

impl Builder<'_> {
    fn span(
        &mut self,
        name: String,
        kind: SpanKind,
        parent: &[u8],
        start: u64,
        end: u64,
    ) -> &mut Span {
        let id = span_id(&self.trace, self.cx.node, self.spans.len() as u32);
        self.spans.push(Span {
            trace_id: self.trace.to_vec(),
            span_id: id,
            parent_span_id: parent.to_vec(),
            name,
            kind: kind as i32,
            start_time_unix_nano: wall_ns(self.cx.clock, start),
            end_time_unix_nano: wall_ns(self.cx.clock, end.max(start)),
            ..Span::default()
        });
        self.spans.last_mut().expect("just pushed")
    }

    fn root(&mut self, j: &Journey) -> Vec<u8> {
        let cx = self.cx;
        let mut attrs = vec![
            kv("dns.question.name", s(j.shown_name())),
            kv("dnstrace.dns.type", s(j.qtype.name())),
            kv("dnstrace.dns.id", i(i64::from(j.dns_id))),
            kv("client.address", s(&j.client.ip().to_string())),
            kv("client.port", i(i64::from(j.client.port()))),
            kv("network.transport", s(if j.tcp { "tcp" } else { "udp" })),
            kv(
                "network.type",
                s(if j.client.is_ipv4() { "ipv4" } else { "ipv6" }),
            ),
            kv("dnstrace.outcome", s(outcome(j))),
            kv("dnstrace.journey.id", i(j.id as i64)),
            kv("dnstrace.lookup.id", i(j.lookup as i64)),
        ];
        if let Some(o) = j.origin() {
            attrs.push(kv("server.address", s(&o.dst.ip().to_string())));
            attrs.push(kv("server.port", i(i64::from(o.dst.port()))));
        }
        attrs.extend(pod(j.client.ip(), cx.names, "k8s"));
        if let Outcome::Answered { rcode, answers, .. } = &j.outcome {
            attrs.push(kv("dnstrace.dns.rcode", s(rcode.name())));
            let addrs: Vec<AnyValue> = answers.iter().map(|a| s(answer_data(a))).collect();
            attrs.push(kv("dns.answers", array(addrs)));
        }
        if let Some(gap) = j.incomplete {
            attrs.push(kv("dnstrace.incomplete", s(gap.why())));
        }
        let (code, message) = status(j);
        if code == StatusCode::Error {
            attrs.push(kv("error.type", s(&message)));
        }
        let events = self.events(&j.legs);
        let end = answered_at(j).unwrap_or(j.ended_ns);
        let name = format!("lookup {}", j.qtype.name());
        let span = self.span(name, SpanKind::Client, &[], j.started_ns, end);
        span.attributes = attrs;
        span.events = events;
        span.status = Some(Status {
            message,
            code: code as i32,
        });
        span.span_id.clone()
    }

    fn service(
        &mut self,
        j: &Journey,
        parent: &[u8],
        svc: SocketAddr,
        endpoint: SocketAddr,
    ) -> Vec<u8> {
        let attrs = vec![
            kv("dnstrace.service.address", s(&svc.to_string())),
            kv(
                "dnstrace.service.name",
                s(self.cx.names.get(&svc.ip()).unwrap_or_default()),
            ),
            kv("dnstrace.endpoint.address", s(&endpoint.to_string())),
        ];
        let end = answered_at(j).unwrap_or(j.ended_ns);
        let span = self.span(
            format!("service {svc}"),
            SpanKind::Internal,
            parent,
            j.started_ns,
            end,
        );
        span.attributes = attrs;
        span.span_id.clone()
    }

    /// The resolver that answered: from the query reaching it to its
    /// answer leaving it, as its legs show.
    fn resolver(&mut self, j: &Journey, parent: &[u8], server: SocketAddr) -> Vec<u8> {
        let at: Vec<&Leg> = j
            .legs
            .iter()
            .filter(|l| (!l.response && l.dst == server) || (l.response && l.src == server))
            .collect();
        let start = at.first().map_or(j.started_ns, |l| l.ts_ns);
        let end = at.last().map_or(j.ended_ns, |l| l.ts_ns);
        let mut attrs = vec![kv("server.address", s(&server.ip().to_string()))];
        attrs.extend(pod(server.ip(), self.cx.names, "k8s"));
        let who = self
            .cx
            .names
            .get(&server.ip())
            .map_or_else(|| server.ip().to_string(), str::to_owned);
        let span = self.span(
            format!("resolver {who}"),
            SpanKind::Server,
            parent,
            start,
            end,
        );
        span.attributes = attrs;
        span.span_id.clone()
    }

    fn upstream(&mut self, u: &Journey, parent: &[u8]) {
        let mut attrs = vec![
            kv("dns.question.name", s(u.shown_name())),
            kv("dnstrace.dns.type", s(u.qtype.name())),
            kv("network.transport", s(if u.tcp { "tcp" } else { "udp" })),
            kv("dnstrace.outcome", s(outcome(u))),
        ];
        if let Some(o) = u.origin() {
            attrs.push(kv("server.address", s(&o.dst.ip().to_string())));
            attrs.push(kv("server.port", i(i64::from(o.dst.port()))));
        }
        if let Outcome::Answered { rcode, .. } = &u.outcome {
            attrs.push(kv("dnstrace.dns.rcode", s(rcode.name())));
        }
        let events = self.events(&u.legs);
        let (code, message) = status(u);
        let to = u.origin().map_or_else(String::new, |o| o.dst.to_string());
        let span = self.span(
            format!("upstream {to}"),
            SpanKind::Client,
            parent,
            u.started_ns,
            u.ended_ns,
        );
        span.attributes = attrs;
        span.events = events;
        span.status = Some(Status {
            message,
            code: code as i32,
        });
        let me = span.span_id.clone();
        for deeper in &u.upstream {
            self.upstream(deeper, &me);
        }
    }

    fn events(&self, legs: &[Leg]) -> Vec<Event> {
        legs.iter().map(|l| self.event(l)).collect()
    }

    /// A leg: where (device, namespace, hook), what (query or answer, the
    /// addresses), and any NAT or drop there.
    fn event(&self, l: &Leg) -> Event {
        let mut attrs = vec![
            kv("dnstrace.hook", s(l.hook.name())),
            kv("dnstrace.netns", i(i64::from(l.netns))),
            kv("dnstrace.ifindex", i(i64::from(l.ifindex))),
            kv("dnstrace.src", s(&l.src.to_string())),
            kv("dnstrace.dst", s(&l.dst.to_string())),
        ];
        if let Some(dev) = &l.iface {
            attrs.push(kv("dnstrace.device", s(dev)));
        }
        if let Some(nat) = &l.dnat {
            attrs.push(kv("dnstrace.dnat", s(&format!("{} → {}", nat.0, nat.1))));
        }
        if let Some(nat) = &l.snat {
            attrs.push(kv("dnstrace.snat", s(&format!("{} → {}", nat.0, nat.1))));
        }
        if let Some((reason, location)) = l.drop.as_deref() {
            attrs.push(kv(
                "dnstrace.drop.reason",
                s(&self.cx.kernel.drop_reason(*reason)),
            ));
            attrs.push(kv(
                "dnstrace.drop.location",
                s(&self.cx.kernel.location(*location)),
            ));
        }
        Event {
            time_unix_nano: wall_ns(self.cx.clock, l.ts_ns),
            name: if l.response { "answer" } else { "query" }.to_owned(),
            attributes: attrs,
            dropped_attributes_count: 0,
        }
    }
}

/// An anomaly as a log record, tied to the trace of a journey behind it
/// when there is one.
pub fn log_record(
    a: &Anomaly,
    trace: Option<[u8; 16]>,
    flight: Option<&std::path::Path>,
    clock: Clock,
) -> LogRecord {
    let (number, text) = match a.severity {
        Severity::Warning => (SeverityNumber::Warn, "WARN"),
        Severity::Critical => (SeverityNumber::Error, "ERROR"),
    };
    let evidence: Vec<AnyValue> = a.evidence.iter().map(|e| s(e)).collect();
    let time = wall_ns(clock, a.last_ns);
    let mut attributes = vec![
        kv("dnstrace.anomaly.kind", s(a.kind.as_str())),
        kv("dnstrace.anomaly.severity", s(a.severity.as_str())),
        kv("dnstrace.anomaly.evidence", array(evidence)),
        kv("dnstrace.anomaly.cause", s(&a.cause)),
        kv("dnstrace.anomaly.fix", s(a.fix)),
        kv("dnstrace.anomaly.count", i(a.count as i64)),
    ];
    if !a.about.is_empty() {
        let about = a.about.iter().map(|ip| s(&ip.to_string())).collect();
        attributes.push(kv("dnstrace.anomaly.about", array(about)));
    }
    if let Some(path) = flight {
        let path = path.display().to_string();
        attributes.push(kv("dnstrace.flight_recording", s(&path)));
    }
    LogRecord {
        time_unix_nano: time,
        observed_time_unix_nano: time,
        severity_number: number as i32,
        severity_text: text.to_owned(),
        body: Some(s(&a.summary)),
        attributes,
        trace_id: trace.map(|t| t.to_vec()).unwrap_or_default(),
        event_name: "dnstrace.anomaly".to_owned(),
        ..LogRecord::default()
    }
}

/// `k8s.namespace.name`, `k8s.pod.name`, `k8s.pod.uid` and the workload's
/// name of the pod at `ip`, where known.
fn pod(ip: IpAddr, names: &Names, prefix: &str) -> Vec<KeyValue> {
    let Some((ns, pod)) = names.get(&ip).and_then(|n| n.split_once('/')) else {
        return Vec::new();
    };
    let mut attrs = vec![
        kv(&format!("{prefix}.namespace.name"), s(ns)),
        kv(&format!("{prefix}.pod.name"), s(pod)),
    ];
    if let Some(uid) = names.uid(&ip) {
        attrs.push(kv(&format!("{prefix}.pod.uid"), s(uid)));
    }
    if let Some(w) = names.workload(&ip) {
        let kind = w.kind.as_str().to_ascii_lowercase();
        attrs.push(kv(&format!("{prefix}.{kind}.name"), s(&w.name)));
    }
    attrs
}

/// When the answer came back where the query left, if it did.
fn answered_at(j: &Journey) -> Option<u64> {
    Some(j.origin()?.ts_ns + j.answered_in_ns()?)
}

fn outcome(j: &Journey) -> &'static str {
    match &j.outcome {
        Outcome::Answered { .. } => "answered",
        Outcome::Dropped { .. } => "dropped",
        Outcome::Timeout if j.incomplete.is_some() => "unknown",
        Outcome::Timeout => "timeout",
    }
}

/// Error for what failed the client (a server failure, a refusal, no
/// answer, one it cannot read); NXDOMAIN is an answer.
fn status(j: &Journey) -> (StatusCode, String) {
    match &j.outcome {
        Outcome::Answered {
            malformed: Some(_), ..
        } => (StatusCode::Error, "malformed answer".to_owned()),
        Outcome::Answered { rcode, .. } if [Rcode::NOERROR, Rcode::NXDOMAIN].contains(rcode) => {
            (StatusCode::Unset, String::new())
        }
        Outcome::Answered { rcode, .. } => (StatusCode::Error, rcode.name().to_owned()),
        Outcome::Dropped { .. } => (StatusCode::Error, "dropped".to_owned()),
        Outcome::Timeout if j.incomplete.is_some() => (StatusCode::Unset, String::new()),
        Outcome::Timeout => (StatusCode::Error, "timeout".to_owned()),
    }
}

/// `A 10.1.2.3` → `10.1.2.3`: the record's data, as `dns.answers` has it.
fn answer_data(a: &str) -> &str {
    a.split_once(' ').map_or(a, |(_, data)| data)
}

pub fn kv(key: &str, value: AnyValue) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(value),
        ..KeyValue::default()
    }
}

pub fn s(v: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(v.to_owned())),
    }
}

fn i(v: i64) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::IntValue(v)),
    }
}

fn array(values: Vec<AnyValue>) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::ArrayValue(ArrayValue { values })),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use dnstrace_common::Hook;

    use super::*;
    use crate::correlate::fixtures::{self, leg};

    const MS: u64 = 1_000_000;

    fn journey(client: &str, legs: Vec<Leg>, outcome: Outcome) -> Journey {
        fixtures::journey(client, "www.example.com.", legs, outcome)
    }

    /// web asks the service, DNATed to coredns-a, which asks 192.0.2.1.
    fn through_the_service() -> Journey {
        let (web, svc, dns) = ("10.244.0.10:40000", "10.96.0.10:53", "10.244.0.53:53");
        let answered = fixtures::answered(Rcode::NOERROR, &["A 93.184.216.34"]);
        let mut j = journey(
            web,
            vec![
                leg(0, Hook::DevXmit, 10, web, svc, false),
                leg(MS, Hook::DevReceive, 53, web, dns, false),
                leg(9 * MS, Hook::DevXmit, 53, dns, web, true),
                leg(10 * MS, Hook::DevReceive, 10, svc, web, true),
            ],
            answered.clone(),
        );
        j.dnat = Some(Box::new((svc.parse().unwrap(), dns.parse().unwrap())));
        let up = "10.244.0.53:5353";
        j.upstream.push(journey(
            up,
            vec![
                leg(2 * MS, Hook::DevXmit, 53, up, "192.0.2.1:53", false),
                leg(8 * MS, Hook::DevReceive, 53, "192.0.2.1:53", up, true),
            ],
            answered,
        ));
        j
    }

    fn names() -> Names {
        let mut n = BTreeMap::new();
        n.insert("10.244.0.10".parse().unwrap(), "default/web".to_owned());
        n.insert(
            "10.244.0.53".parse().unwrap(),
            "kube-system/coredns-a".to_owned(),
        );
        n.insert(
            "10.96.0.10".parse().unwrap(),
            "kube-system/kube-dns".to_owned(),
        );
        let uid = "0b7e3f52-6a1d-4c8e-9f2b-5d4a3c2b1e0f".to_owned();
        Names::from_entries(n).with_uids(BTreeMap::from([("10.244.0.10".parse().unwrap(), uid)]))
    }

    fn spans_of(j: &Journey, node: &str) -> Vec<Span> {
        let (names, kernel) = (
            names(),
            KernelNames::recorded(HashMap::new(), HashMap::new()),
        );
        let cx = Context {
            clock: Clock::with_offset(1_700_000_000_000_000_000),
            names: &names,
            kernel: &kernel,
            node,
        };
        spans(j, &cx)
    }

    fn attr<'a>(s: &'a Span, key: &str) -> Option<&'a any_value::Value> {
        s.attributes
            .iter()
            .find(|kv| kv.key == key)?
            .value
            .as_ref()?
            .value
            .as_ref()
    }

    #[test]
    fn a_journey_is_a_trace_of_the_lookup_the_service_the_resolver_and_its_upstream_query() {
        let spans = spans_of(&through_the_service(), "n1");
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "lookup A",
                "service 10.96.0.10:53",
                "resolver kube-system/coredns-a",
                "upstream 192.0.2.1:53"
            ]
        );
        let parent_of = |i: usize| &spans[i].parent_span_id;
        assert!(parent_of(0).is_empty());
        assert_eq!(parent_of(1), &spans[0].span_id);
        assert_eq!(parent_of(2), &spans[1].span_id);
        assert_eq!(parent_of(3), &spans[2].span_id);
        assert!(spans.iter().all(|s| s.trace_id == spans[0].trace_id));
        let root = &spans[0];
        let text = |v: Option<&any_value::Value>| match v {
            Some(any_value::Value::StringValue(s)) => s.clone(),
            other => format!("{other:?}"),
        };
        assert_eq!(text(attr(root, "dns.question.name")), "www.example.com.");
        assert_eq!(text(attr(root, "k8s.pod.name")), "web");
        assert_eq!(text(attr(root, "k8s.namespace.name")), "default");
        assert_eq!(
            text(attr(root, "k8s.pod.uid")),
            "0b7e3f52-6a1d-4c8e-9f2b-5d4a3c2b1e0f"
        );
        assert_eq!(text(attr(root, "server.address")), "10.96.0.10");
        assert_eq!(text(attr(root, "network.transport")), "udp");
        assert_eq!(text(attr(root, "network.type")), "ipv4");
        assert!(
            matches!(attr(root, "dns.answers"), Some(any_value::Value::ArrayValue(a)) if a.values == vec![s("93.184.216.34")])
        );
        assert_eq!(root.events.len(), 4, "each leg an event");
        assert_eq!(
            root.end_time_unix_nano - root.start_time_unix_nano,
            10 * MS,
            "as the client saw it"
        );
        let resolver = &spans[2];
        assert_eq!(
            resolver.end_time_unix_nano - resolver.start_time_unix_nano,
            8 * MS
        );
    }

    #[test]
    fn two_nodes_give_one_trace_id_and_different_span_ids() {
        let j = through_the_service();
        let (a, b) = (spans_of(&j, "node-1"), spans_of(&j, "node-2"));
        assert_eq!(a[0].trace_id, b[0].trace_id);
        assert_ne!(a[0].span_id, b[0].span_id);
        let mut other = j.clone();
        other.dns_id = 8;
        assert_ne!(spans_of(&other, "node-1")[0].trace_id, a[0].trace_id);
    }

    #[test]
    fn a_timeout_is_an_error_an_nxdomain_is_not() {
        let web = "10.244.0.10:40000";
        let timeout = journey(
            web,
            vec![leg(0, Hook::DevXmit, 10, web, "10.96.0.10:53", false)],
            Outcome::Timeout,
        );
        let root = &spans_of(&timeout, "n")[0];
        assert_eq!(root.status.as_ref().unwrap().code, StatusCode::Error as i32);
        assert!(
            matches!(attr(root, "error.type"), Some(any_value::Value::StringValue(e)) if e == "timeout")
        );
        let mut j = timeout.clone();
        j.outcome = fixtures::answered(Rcode::NXDOMAIN, &[]);
        assert_eq!(
            spans_of(&j, "n")[0].status.as_ref().unwrap().code,
            StatusCode::Unset as i32
        );
    }
}
