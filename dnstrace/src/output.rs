//! Line output: one text line or one JSON object per DNS message.
pub mod addr;
pub(crate) mod journey_json;
mod places;
mod timeline;

use std::{
    collections::HashMap,
    io::{self, Write},
    net::{IpAddr, SocketAddr},
};

use serde::Serialize;

use crate::{
    clock::Clock,
    conntrack::CtEvent,
    correlate::{Journey, Leg, Outcome},
    decode::{
        Body, Conntrack, DnsMessage, Fragment, KernelNames, Missing, NodeId, Packet, Record, Seen,
        Transport, Underlay,
    },
    diagnose::{Anomaly, AnomalyKind},
    naming::Names,
    pipeline::{JourneyOut, Sink, Tally},
    target::follow::Refresh,
};
use dnstrace_common::Direction;
use journey_json::{number, JourneyJson, OutcomeJson};

/// How lines are written: text for people, one JSON object a line for
/// programs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// What turns numbers into words: device names, wall time, kernel drop
/// reasons and locations, pod and service names. Shared by every view.
#[derive(Clone)]
pub struct Labels {
    iface_names: HashMap<u32, String>,
    clock: Clock,
    kernel: KernelNames,
    names: Names,
    /// The nodes of a merged replay, by `NodeId` less one; empty for one.
    nodes: Vec<String>,
}

/// Briefly: the view's updates are Debug, and the kernel's names are large.
impl std::fmt::Debug for Labels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Labels")
            .field("names", &self.names.entries().len())
            .finish_non_exhaustive()
    }
}

impl Labels {
    pub fn new(iface_names: HashMap<u32, String>, clock: Clock, kernel: KernelNames) -> Self {
        Self {
            iface_names,
            clock,
            kernel,
            names: Names::default(),
            nodes: Vec::new(),
        }
    }

    /// The nodes a merged replay's legs were seen on, in `NodeId` order.
    pub fn with_nodes(mut self, nodes: Vec<String>) -> Self {
        self.nodes = nodes;
        self
    }

    /// The nodes of a merged replay; none for one node.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The name of the node `id`, where legs are from more than one.
    pub fn node(&self, id: NodeId) -> Option<&str> {
        let at = usize::from(id.0).checked_sub(1)?;
        self.nodes.get(at).map(String::as_str)
    }

    /// Pods and services to name addresses after in journeys.
    pub fn with_names(mut self, names: Names) -> Self {
        self.names = names;
        self
    }

    pub fn kernel(&self) -> &KernelNames {
        &self.kernel
    }

    pub fn iface_names(&self) -> &HashMap<u32, String> {
        &self.iface_names
    }

    pub fn names(&self) -> &Names {
        &self.names
    }

    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Addresses named while tracing (a pod started, or re-created), and
    /// a node a cluster view joined.
    pub fn rename(&mut self, refresh: &Refresh) {
        self.names
            .extend(&refresh.names, &refresh.workloads, &refresh.uids);
        if let Some(j) = &refresh.joined {
            j.name_in(&mut self.nodes);
        }
    }

    /// The pod or service at `ip`, if known.
    pub fn name(&self, ip: &std::net::IpAddr) -> Option<&str> {
        self.names.get(ip)
    }

    /// `namespace/name (address)`, or the address where it has no name.
    pub fn named(&self, addr: SocketAddr) -> String {
        let mut out = Vec::new();
        self.write_named(&mut out, &addr);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// `named`, written at the end of `out`.
    pub fn write_named(&self, out: &mut Vec<u8>, a: &SocketAddr) {
        match self.names.get(&a.ip()) {
            Some(name) => {
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(b" (");
                addr::text(out, a);
                out.push(b')');
            }
            None => addr::text(out, a),
        }
    }

    /// Wall-clock time of day with microseconds, UTC.
    pub fn time_of_day(&self, mono_ns: u64) -> String {
        let mut out = Vec::with_capacity(15);
        self.write_time_of_day(&mut out, mono_ns);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// `time_of_day`, written at the end of `out` from integers (as RFC
    /// 3339 with microseconds has it): a journey's text wrote a whole date
    /// through `fmt` to keep its middle.
    pub fn write_time_of_day(&self, out: &mut Vec<u8>, mono_ns: u64) {
        let since = self
            .clock
            .wall(mono_ns)
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let secs = since.as_secs() % 86_400;
        let two = |n: u64| [b'0' + (n / 10) as u8, b'0' + (n % 10) as u8];
        out.extend_from_slice(&two(secs / 3600));
        out.push(b':');
        out.extend_from_slice(&two(secs / 60 % 60));
        out.push(b':');
        out.extend_from_slice(&two(secs % 60));
        out.push(b'.');
        let micros = since.subsec_micros();
        out.extend(
            (0..6)
                .rev()
                .map(|i| b'0' + (micros / 10u32.pow(i) % 10) as u8),
        );
    }

    /// Where a leg was seen: `device@netns` for hooks that see every
    /// namespace, else the --iface device.
    pub fn place(&self, leg: &Leg) -> String {
        let mut out = Vec::new();
        self.write_place(&mut out, leg);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// `place`, written at the end of `out`; after its node's name where
    /// legs are from more than one.
    pub fn write_place(&self, out: &mut Vec<u8>, leg: &Leg) {
        if let Some(node) = self.node(leg.node) {
            out.extend_from_slice(node.as_bytes());
            out.push(b' ');
        }
        match &leg.iface {
            Some(name) => {
                out.extend_from_slice(name.as_bytes());
                out.push(b'@');
                number(out, leg.netns);
            }
            None => match self.iface_names.get(&leg.ifindex) {
                Some(name) => out.extend_from_slice(name.as_bytes()),
                None => {
                    out.extend_from_slice(b"if");
                    number(out, leg.ifindex);
                }
            },
        }
    }

    /// How a journey ended: rcode and answers, a drop, or no answer.
    pub fn outcome(&self, o: &Outcome) -> String {
        let mut out = Vec::new();
        self.write_outcome(&mut out, o);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// `outcome`, written at the end of `out`.
    pub fn write_outcome(&self, out: &mut Vec<u8>, o: &Outcome) {
        match o {
            Outcome::Answered {
                rcode,
                answers,
                truncated,
                malformed,
            } => {
                let _ = write!(out, "{rcode}");
                if *truncated {
                    out.extend_from_slice(b" (truncated)");
                }
                if let Some(why) = malformed {
                    let _ = write!(out, " MALFORMED ({why})");
                }
                for (i, a) in answers.iter().take(3).enumerate() {
                    out.extend_from_slice(if i == 0 { " → " } else { ", " }.as_bytes());
                    write_short(out, a);
                }
                if answers.len() > 3 {
                    let _ = write!(out, " (+{} more)", answers.len() - 3);
                }
            }
            Outcome::Dropped { reason, location } => {
                let _ = write!(out, "DROPPED ({})", self.drop_text(*reason, *location));
            }
            Outcome::Timeout => out.extend_from_slice(b"NO ANSWER"),
        }
    }

    /// `reason at location` of a kernel drop.
    pub fn drop_text(&self, reason: u32, location: u64) -> String {
        format!(
            "{} at {}",
            self.kernel.drop_reason(reason),
            self.kernel.location(location)
        )
    }
}

pub struct LineSink<W: Write> {
    format: Format,
    labels: Labels,
    out: W,
    /// A journey's text or a JSON line is built here, in room kept from
    /// line to line: growing a fresh string for each was a tenth of live
    /// tracing's CPU.
    line: Vec<u8>,
    places: places::Places,
}

#[derive(Serialize)]
struct JsonLine<'a> {
    time: String,
    mono_ns: u64,
    hook: &'static str,
    iface: String,
    ifindex: u32,
    netns: u32,
    direction: &'static str,
    src: String,
    dst: String,
    transport: &'static str,
    wire_len: u32,
    captured_truncated: bool,
    /// The packet is an IP fragment, at `fragment`.
    ip_fragment: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    fragment: Option<Fragment>,
    #[serde(skip_serializing_if = "Option::is_none")]
    missing: Option<JsonMissing>,
    #[serde(skip_serializing_if = "Option::is_none")]
    conntrack: Option<JsonConntrack>,
    #[serde(skip_serializing_if = "Option::is_none")]
    drop: Option<JsonDrop>,
    #[serde(skip_serializing_if = "Option::is_none")]
    underlay: Option<Underlay>,
    #[serde(flatten)]
    body: &'a Body,
}

#[derive(Serialize)]
struct JsonConntrack {
    original: [String; 2],
    reply: [String; 2],
    status: u32,
    is_reply: bool,
    /// [asked for, rewritten to]
    dnat: Option<[String; 2]>,
    snat: Option<[String; 2]>,
}

/// The fragment a datagram lacked here, and where it was last seen.
#[derive(Serialize)]
struct JsonMissing {
    offset: u16,
    last_seen: Option<JsonSeen>,
}

#[derive(Serialize)]
struct JsonSeen {
    time: String,
    mono_ns: u64,
    hook: &'static str,
    iface: String,
    ifindex: u32,
    netns: u32,
}

#[derive(Serialize)]
struct JsonDrop {
    reason: String,
    location: String,
}

impl<W: Write> LineSink<W> {
    pub fn new(format: Format, labels: Labels, out: W) -> Self {
        Self {
            format,
            labels,
            out,
            line: Vec::new(),
            places: places::Places::default(),
        }
    }

    /// Names learnt while tracing; a node's name is in a leg's place.
    fn rename(&mut self, refresh: &Refresh) {
        self.labels.rename(refresh);
        if refresh.joined.is_some() {
            self.places.clear();
        }
    }

    /// What was written, for tests.
    #[cfg(test)]
    pub(crate) fn written(&self) -> &W {
        &self.out
    }

    /// What `write` writes into the line buffer, then out.
    fn buffered(
        &mut self,
        write: impl FnOnce(&Self, &mut Vec<u8>) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut line = std::mem::take(&mut self.line);
        line.clear();
        let done = write(self, &mut line).and_then(|()| self.out.write_all(&line));
        self.line = line;
        done
    }

    /// One JSON line, as `write` writes it into the line buffer.
    fn json_line(
        &mut self,
        write: impl FnOnce(&Self, &mut Vec<u8>) -> serde_json::Result<()>,
    ) -> io::Result<()> {
        self.buffered(|s, line| {
            write(s, line).map_err(io::Error::other)?;
            line.push(b'\n');
            Ok(())
        })
    }

    /// The names of a journey's addresses, for JSON readers: each named
    /// address once, in address order, looked up once.
    fn names_of(&self, j: &Journey) -> Vec<(IpAddr, &str)> {
        // A handful of addresses, each seen on many legs: a scan of the
        // few kept is cheaper than sorting them all.
        let mut ips: Vec<IpAddr> = Vec::with_capacity(8);
        let mut add = |a: &SocketAddr| {
            let ip = a.ip();
            if !ips.contains(&ip) {
                ips.push(ip);
            }
        };
        add(&j.client);
        for l in &j.legs {
            add(&l.src);
            add(&l.dst);
            for (a, b) in l.dnat.iter().chain(&l.snat).map(|p| &**p) {
                add(a);
                add(b);
            }
        }
        ips.sort_unstable();
        ips.into_iter()
            .filter_map(|ip| Some((ip, self.labels.name(&ip)?)))
            .collect()
    }

    pub fn write(&mut self, rec: &Record) -> io::Result<()> {
        match self.format {
            Format::Text => {
                let line = self.text(rec);
                writeln!(self.out, "{line}")
            }
            Format::Json => self.json_line(|s, line| serde_json::to_writer(line, &s.json(rec))),
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// A ctnetlink event (packet view).
    pub fn write_conntrack(&mut self, ev: &CtEvent, now_ns: u64) -> io::Result<()> {
        let ct = Conntrack {
            original: ev.original,
            reply: ev.reply,
            status: ev.status,
            is_reply: false,
        };
        let proto = if ev.proto == 6 { "tcp" } else { "udp" };
        match self.format {
            Format::Text => {
                let time =
                    humantime::format_rfc3339_micros(self.labels.clock.wall(now_ns)).to_string();
                let mut line = format!(
                    "{} conntrack {:?} {proto} {} → {} reply {} → {}",
                    time.get(11..26).unwrap_or(&time),
                    ev.kind,
                    ev.original.src,
                    ev.original.dst,
                    ev.reply.src,
                    ev.reply.dst
                );
                if let Some((asked, to)) = ct.dnat() {
                    line += &format!(" [DNAT {asked} → {to}]");
                }
                writeln!(self.out, "{line}")
            }
            Format::Json => {
                let v = serde_json::json!({
                    "time": humantime::format_rfc3339_nanos(self.labels.clock.wall(now_ns)).to_string(),
                    "kind": "conntrack",
                    "event": ev.kind,
                    "transport": proto,
                    "original": [ev.original.src.to_string(), ev.original.dst.to_string()],
                    "reply": [ev.reply.src.to_string(), ev.reply.dst.to_string()],
                    "status": ev.status,
                    "dnat": ct.dnat().map(|(a, b)| [a.to_string(), b.to_string()]),
                });
                writeln!(self.out, "{v}")
            }
        }
    }

    pub fn labels(&self) -> &Labels {
        &self.labels
    }

    /// An anomaly, as it is raised.
    pub fn write_anomaly(&mut self, a: &Anomaly) -> io::Result<()> {
        match self.format {
            Format::Text => {
                let mut text = format!("!! {:?} {}: {}\n", a.severity, a.kind, a.summary);
                for e in &a.evidence {
                    text += &format!("   evidence: {e}\n");
                }
                for (ip, name) in self.names_about(a) {
                    text += &format!("   about: {name} ({ip})\n");
                }
                text += &format!("   cause: {}\n   fix: {}\n", a.cause, a.fix);
                write!(self.out, "{text}")
            }
            Format::Json => {
                let mut v = self.anomaly_json(a)?;
                v["type"] = "anomaly".into();
                writeln!(self.out, "{v}")
            }
        }
    }

    /// An anomaly as JSON, with the names of what it is about.
    fn anomaly_json(&self, a: &Anomaly) -> io::Result<serde_json::Value> {
        let mut v = serde_json::to_value(a).map_err(io::Error::other)?;
        let names: serde_json::Map<String, serde_json::Value> = self
            .names_about(a)
            .map(|(ip, name)| (ip.to_string(), name.into()))
            .collect();
        if !names.is_empty() {
            v["names"] = names.into();
        }
        Ok(v)
    }

    /// The names of the addresses an anomaly is about, where known.
    fn names_about<'a>(&'a self, a: &'a Anomaly) -> impl Iterator<Item = (IpAddr, &'a str)> {
        a.about
            .iter()
            .filter_map(|ip| Some((*ip, self.labels.name(ip)?)))
    }

    /// Every anomaly of the run, at exit.
    pub fn write_summary(&mut self, all: &[&Anomaly]) -> io::Result<()> {
        match self.format {
            Format::Text => write!(self.out, "{}", summary_text(all)),
            Format::Json => {
                let all = all
                    .iter()
                    .map(|a| self.anomaly_json(a))
                    .collect::<io::Result<Vec<_>>>()?;
                writeln!(
                    self.out,
                    "{}",
                    serde_json::json!({ "type": "summary", "anomalies": all })
                )
            }
        }
    }

    pub fn write_journey(&mut self, j: &Journey) -> io::Result<()> {
        let mut places = std::mem::take(&mut self.places);
        let done = match self.format {
            Format::Text => self.buffered(|s, text| {
                timeline::write(text, &s.labels, &mut places, j, "");
                Ok(())
            }),
            Format::Json => self.json_line(|s, line| s.journey_json(j).write(line, &mut places)),
        };
        self.places = places;
        done
    }

    /// Written straight from the journey (no intermediate JSON tree): the
    /// pipeline's hottest output path.
    fn journey_json<'a>(&'a self, j: &'a Journey) -> JourneyJson<'a> {
        let (reason_name, location_name) = match j.outcome {
            Outcome::Dropped { reason, location } => (
                Some(self.labels.kernel.drop_reason(reason)),
                Some(self.labels.kernel.location(location)),
            ),
            _ => (None, None),
        };
        let names = self.names_of(j);
        JourneyJson {
            time: humantime::format_rfc3339_nanos(self.labels.clock.wall(j.started_ns)),
            j,
            outcome: OutcomeJson {
                outcome: &j.outcome,
                reason_name,
                location_name,
            },
            upstream: j.upstream.iter().map(|u| self.journey_json(u)).collect(),
            labels: &self.labels,
            workloads: names
                .iter()
                .filter_map(|(ip, _)| Some((*ip, self.labels.names.workload(ip)?)))
                .collect(),
            names,
        }
    }

    /// The device's name: reported by the hook, or known from --iface.
    fn iface(&self, p: &Packet) -> String {
        p.device_name(&self.labels.iface_names)
    }

    fn text(&self, rec: &Record) -> String {
        let p = &rec.packet;
        let time = humantime::format_rfc3339_micros(self.labels.clock.wall(p.ts_ns)).to_string();
        let time = time.get(11..26).unwrap_or(&time);
        let place = match p.ifname {
            // Hooks that see every namespace: say which one.
            Some(_) => format!("{}@{}", self.iface(p), p.netns),
            None => self.iface(p),
        };
        let dir = direction_word(p.hook.direction());
        let mut line = format!(
            "{time} {place:<10} {dir} {} → {} {}",
            p.src,
            p.dst,
            transport(p.transport)
        );
        match &rec.body {
            Body::Dns(m) => {
                line += &format!(" {}", dns_text(m));
                if let Some(why) = &m.malformed {
                    line += &format!(" MALFORMED at the {why}");
                }
            }
            Body::Cut(m) => line += &format!(" {} CUT", dns_text(m)),
            Body::Malformed { reason, len } => line += &format!(" MALFORMED {len} bytes: {reason}"),
            Body::Gap { reason } => line += &format!(" GAP: {reason}"),
        }
        if let Some(m) = &rec.missing {
            line += &self.missing_text(m);
        }
        if let Some((asked, to)) = p.ct.as_deref().and_then(Conntrack::dnat) {
            line += &format!(" [DNAT {asked} → {to}]");
        }
        if let Some((real, seen)) = p.ct.as_deref().and_then(Conntrack::snat) {
            line += &format!(" [SNAT {real} → {seen}]");
        }
        if let Some(d) = p.drop {
            line += &format!(
                " [dropped: {} at {}]",
                self.labels.kernel.drop_reason(d.reason),
                self.labels.kernel.location(d.location)
            );
        }
        if let Some(u) = &p.underlay {
            line += &format!(" [in {u}]");
        }
        line
    }

    /// ` [fragment at 1480 missing, last seen eth0@4026532177 out 06:14:27.264998]`
    fn missing_text(&self, m: &Missing) -> String {
        let seen = match &m.last_seen {
            Some(s) => format!(
                "last seen {} {} {}",
                self.seen_place(s),
                direction_word(s.hook.direction()).trim_end(),
                self.labels.time_of_day(s.ts_ns)
            ),
            None => "seen nowhere".to_owned(),
        };
        format!(" [fragment at {} missing, {seen}]", m.offset)
    }

    /// Where a fragment was seen, written as a packet's place.
    fn seen_place(&self, s: &Seen) -> String {
        let name = s.device_name(&self.labels.iface_names);
        match s.ifname {
            Some(_) => format!("{name}@{}", s.netns),
            None => name,
        }
    }

    fn json<'a>(&'a self, rec: &'a Record) -> JsonLine<'a> {
        let p = &rec.packet;
        let pair =
            |(a, b): (std::net::SocketAddr, std::net::SocketAddr)| [a.to_string(), b.to_string()];
        JsonLine {
            time: humantime::format_rfc3339_nanos(self.labels.clock.wall(p.ts_ns)).to_string(),
            mono_ns: p.ts_ns,
            hook: p.hook.name(),
            iface: self.iface(p),
            ifindex: p.ifindex,
            netns: p.netns,
            direction: p.hook.direction().name(),
            src: p.src.to_string(),
            dst: p.dst.to_string(),
            transport: transport(p.transport),
            wire_len: p.wire_len,
            captured_truncated: p.truncated,
            ip_fragment: p.frag.is_some(),
            fragment: p.frag,
            missing: rec.missing.as_ref().map(|m| JsonMissing {
                offset: m.offset,
                last_seen: m.last_seen.as_ref().map(|s| JsonSeen {
                    time: humantime::format_rfc3339_nanos(self.labels.clock.wall(s.ts_ns))
                        .to_string(),
                    mono_ns: s.ts_ns,
                    hook: s.hook.name(),
                    iface: s.device_name(&self.labels.iface_names),
                    ifindex: s.ifindex,
                    netns: s.netns,
                }),
            }),
            conntrack: p.ct.as_deref().map(|ct| JsonConntrack {
                original: [ct.original.src.to_string(), ct.original.dst.to_string()],
                reply: [ct.reply.src.to_string(), ct.reply.dst.to_string()],
                status: ct.status,
                is_reply: ct.is_reply,
                dnat: ct.dnat().map(pair),
                snat: ct.snat().map(pair),
            }),
            drop: p.drop.map(|d| JsonDrop {
                reason: self.labels.kernel.drop_reason(d.reason),
                location: self.labels.kernel.location(d.location),
            }),
            underlay: p.underlay.as_deref().copied(),
            body: &rec.body,
        }
    }
}

/// Every anomaly of the run, as text lines.
pub fn summary_text(all: &[&Anomaly]) -> String {
    if all.is_empty() {
        return "no anomalies\n".into();
    }
    let mut s = format!("{} anomalies:\n", all.len());
    for a in all {
        let ids: Vec<String> = a.journeys.iter().map(u64::to_string).collect();
        s += &format!(
            "  {:?} {} x{}: {} (journeys {})\n",
            a.severity,
            a.kind,
            a.count,
            a.summary,
            ids.join(" ")
        );
    }
    s
}

/// The short word the text views use for a hook's direction.
fn direction_word(direction: Direction) -> &'static str {
    match direction {
        Direction::Ingress => "in ",
        Direction::Egress => "out",
        Direction::Drop => "DROP",
        Direction::Nat => "NAT",
        Direction::Clash => "CLASH",
    }
}

fn transport(t: Transport) -> &'static str {
    match t {
        Transport::Udp => "udp",
        Transport::Tcp { .. } => "tcp",
    }
}

fn dns_text(m: &DnsMessage) -> String {
    let mut s = format!("id={} {}", m.id, if m.response { "R" } else { "Q" });
    if m.opcode != "QUERY" {
        s += &format!(" {}", m.opcode);
    }
    if m.response {
        s += &format!(" {}", m.rcode);
    }
    let f = &m.flags;
    for (on, name) in [
        (f.aa, "aa"),
        (f.tc, "tc"),
        (f.rd, "rd"),
        (f.ra, "ra"),
        (f.ad, "ad"),
        (f.cd, "cd"),
    ] {
        if on {
            s += " ";
            s += name;
        }
    }
    for q in &m.questions {
        s += &format!(" {} {}", q.name, q.qtype);
    }
    if !m.answers.is_empty() {
        let answers: Vec<String> = m
            .answers
            .iter()
            .map(|a| format!("{} {}", a.rtype, shorten(&a.data)))
            .collect();
        s += &format!(" → {}", answers.join(", "));
    }
    s
}

/// Long record data (TXT, keys) cut for the line view; JSON keeps it whole.
fn shorten(data: &str) -> String {
    let mut out = Vec::new();
    write_short(&mut out, data);
    String::from_utf8_lossy(&out).into_owned()
}

/// An answer's data, cut after 60 characters, at the end of `out`.
fn write_short(out: &mut Vec<u8>, data: &str) {
    const MAX: usize = 60;
    match data.char_indices().nth(MAX) {
        Some((cut, _)) => {
            let _ = write!(out, "{}…({} bytes)", &data[..cut], data.len());
        }
        None => out.extend_from_slice(data.as_bytes()),
    }
}

// The pipeline's sinks, as lines.
impl<W: io::Write> Sink for LineSink<W> {
    fn record(&mut self, rec: &Record) -> io::Result<()> {
        self.write(rec)
    }
    fn conntrack(&mut self, ev: &CtEvent, now_ns: u64) -> io::Result<()> {
        self.write_conntrack(ev, now_ns)
    }
    fn tick(&mut self, _: u64) -> io::Result<()> {
        self.flush()
    }
    fn lost(&mut self, _: u64, _: u64, _: u64) {}
    fn pods(&mut self, refresh: &Refresh, _: u64) -> io::Result<()> {
        self.rename(refresh);
        Ok(())
    }
    fn finish(&mut self, _: u64) -> io::Result<()> {
        self.flush()
    }
    fn summary(&self) -> Option<Tally> {
        None
    }
}

impl<W: io::Write> JourneyOut for LineSink<W> {
    fn kernel(&self) -> &KernelNames {
        LineSink::labels(self).kernel()
    }
    fn journey(&mut self, j: Journey, _: &[(AnomalyKind, String)]) -> io::Result<()> {
        self.write_journey(&j)
    }
    fn anomaly(&mut self, a: &Anomaly) -> io::Result<()> {
        self.write_anomaly(a)
    }
    fn pods(&mut self, refresh: &Refresh) {
        self.rename(refresh);
    }
    fn summary(&mut self, all: &[&Anomaly]) -> io::Result<()> {
        self.write_summary(all)
    }
    fn flush(&mut self) -> io::Result<()> {
        LineSink::flush(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Qtype, Rcode};
    use crate::{
        correlate::Gap,
        decode::{dns, Packet},
    };
    use bytes::Bytes;
    use dnstrace_common::Hook;

    fn record(body: Body) -> Record {
        Record {
            packet: Packet {
                ts_ns: 0,
                node: Default::default(),
                netns: 1,
                ifindex: 7,
                hook: dnstrace_common::Hook::TcEgress,
                src: "10.0.0.2:53".parse().unwrap(),
                dst: "10.0.0.1:40000".parse().unwrap(),
                transport: Transport::Udp,
                wire_len: 100,
                payload_len: 58,
                truncated: false,
                frag: None,
                payload: Bytes::new(),
                ifname: None,
                ct: None,
                drop: None,
                underlay: None,
            },
            body,
            missing: None,
        }
    }

    fn answer() -> Body {
        let m = DnsMessage {
            id: 9,
            response: true,
            opcode: "QUERY".into(),
            flags: dns::Flags {
                aa: true,
                rd: true,
                ..Default::default()
            },
            rcode: Rcode::NOERROR,
            questions: vec![dns::Question::new("a.test.".into(), Qtype::A, "IN")],
            answers: vec![dns::Answer {
                name: "a.test.".into(),
                rtype: "A",
                ttl: 5,
                data: "10.1.2.3".into(),
            }],
            authority_count: 0,
            additional_count: 0,
            malformed: None,
        };
        Body::Dns(m.into())
    }

    fn sink(format: Format) -> LineSink<Vec<u8>> {
        LineSink::new(
            format,
            Labels::new(
                HashMap::from([(7, "veth-s".to_string())]),
                Clock::EPOCH,
                KernelNames::default(),
            ),
            Vec::new(),
        )
    }

    /// The rules know addresses: the output names those an anomaly is
    /// about where it knows them, as text and JSON, at once and at exit.
    #[test]
    fn an_anomaly_names_what_it_is_about() {
        use crate::diagnose::{AnomalyKind, Severity};
        let (pod, unknown) = ("10.244.3.53".parse().unwrap(), "10.9.9.9".parse().unwrap());
        let a = Anomaly {
            kind: AnomalyKind::ResolverEndpointDown,
            severity: Severity::Critical,
            summary: "down".into(),
            evidence: Vec::new(),
            cause: String::new(),
            fix: "",
            about: vec![pod, unknown],
            journeys: Vec::new(),
            count: 1,
            first_ns: 0,
            last_ns: 0,
        };
        let names = Names::from_entries([(pod, "kube-system/coredns-1".to_owned())].into());
        let named = |format| {
            let mut s = sink(format);
            s.labels = s.labels.with_names(names.clone());
            s.write_anomaly(&a).unwrap();
            s.write_summary(&[&a]).unwrap();
            String::from_utf8(s.out).unwrap()
        };
        let text = named(Format::Text);
        assert!(
            text.contains("   about: kube-system/coredns-1 (10.244.3.53)\n"),
            "{text}"
        );
        assert!(!text.contains("10.9.9.9"), "{text}");
        let json = named(Format::Json);
        let lines: Vec<serde_json::Value> = json
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let expected = serde_json::json!({"10.244.3.53": "kube-system/coredns-1"});
        assert_eq!(lines[0]["names"], expected);
        assert_eq!(lines[1]["anomalies"][0]["names"], expected);
    }

    #[test]
    fn text_line_has_every_field() {
        let mut s = sink(Format::Text);
        s.write(&record(answer())).unwrap();
        let line = String::from_utf8(s.out).unwrap();
        assert_eq!(line, "00:00:00.000000 veth-s     out 10.0.0.2:53 → 10.0.0.1:40000 udp id=9 R NOERROR aa rd a.test. A → A 10.1.2.3\n");
    }

    /// Written from integers, the time of day reads as RFC 3339 has it:
    /// midnight, the end of a day, a leap day, whole and odd microseconds.
    #[test]
    fn time_of_day_reads_as_rfc3339_writes_it() {
        let labels = Labels::new(HashMap::new(), Clock::EPOCH, KernelNames::default());
        let day = 86_400 * 1_000_000_000u64;
        for ns in [
            0,
            999,
            1_000,
            day - 1,
            day,
            11_016 * day + 3_599_999_999_999,
            20_787 * day + 50_204_783_822_718,
            u64::MAX,
        ] {
            let rfc = humantime::format_rfc3339_micros(Clock::EPOCH.wall(ns)).to_string();
            assert_eq!(labels.time_of_day(ns), rfc[11..26], "{ns}");
        }
    }

    #[test]
    fn long_data_is_cut_in_text_only() {
        assert_eq!(shorten("short"), "short");
        let long = "x".repeat(100);
        assert_eq!(shorten(&long), format!("{}…(100 bytes)", "x".repeat(60)));
    }

    #[test]
    fn json_line_is_one_object_with_the_same_fields() {
        let mut s = sink(Format::Json);
        s.write(&record(answer())).unwrap();
        s.write(&record(Body::Malformed {
            reason: "bad".into(),
            len: 3,
        }))
        .unwrap();
        let out = String::from_utf8(s.out).unwrap();
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["kind"], "dns");
        assert_eq!(lines[0]["iface"], "veth-s");
        assert_eq!(lines[0]["direction"], "egress");
        assert_eq!(lines[0]["answers"][0]["data"], "10.1.2.3");
        assert_eq!(lines[0]["time"], "1970-01-01T00:00:00.000000000Z");
        assert_eq!(lines[1]["kind"], "malformed");
        assert_eq!(lines[1]["len"], 3);
        assert_eq!(lines[1]["ip_fragment"], false);
        assert!(lines[1].get("fragment").is_none() && lines[1].get("missing").is_none());
    }

    /// A first fragment whose datagram never came whole: its message says
    /// it is cut, and where the missing fragment was last seen.
    fn cut_record() -> Record {
        let Body::Dns(m) = answer() else {
            unreachable!()
        };
        let mut r = record(Body::Cut(
            DnsMessage {
                answers: Vec::new(),
                ..(*m).clone()
            }
            .into(),
        ));
        r.packet.frag = Some(Fragment {
            id: 77,
            offset: 0,
            more: true,
        });
        r.missing = Some(Box::new(Missing {
            offset: 1480,
            last_seen: Some(Seen {
                ts_ns: 1_500,
                netns: 4026532177,
                ifindex: 5,
                ifname: Some("veth0".into()),
                hook: Hook::DevXmit,
            }),
        }));
        r
    }

    #[test]
    fn a_cut_message_says_so_and_what_it_lacked() {
        let mut s = sink(Format::Text);
        s.write(&cut_record()).unwrap();
        let line = String::from_utf8(s.out).unwrap();
        assert_eq!(line, "00:00:00.000000 veth-s     out 10.0.0.2:53 → 10.0.0.1:40000 udp id=9 R NOERROR aa rd a.test. A CUT [fragment at 1480 missing, last seen veth0@4026532177 out 00:00:00.000001]\n");
        let mut s = sink(Format::Json);
        s.write(&cut_record()).unwrap();
        let line: serde_json::Value = serde_json::from_slice(&s.out).unwrap();
        assert_eq!(
            (&line["kind"], &line["ip_fragment"]),
            (&"cut".into(), &true.into())
        );
        assert_eq!(
            line["fragment"],
            serde_json::json!({"id": 77, "offset": 0, "more": true})
        );
        assert_eq!(line["missing"]["offset"], 1480);
        assert_eq!(line["missing"]["last_seen"]["iface"], "veth0");
        assert_eq!(line["missing"]["last_seen"]["hook"], "dev_xmit");
        assert_eq!(line["answers"], serde_json::json!([]));
    }

    fn leg(hook: Hook, src: &str, dst: &str) -> Leg {
        Leg {
            ts_ns: 1_000,
            since_prev_ns: 0,
            hook,
            iface: Some("eth0".into()),
            ifindex: 2,
            node: Default::default(),
            netns: 4026532246,
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            response: false,
            ip_len: 0,
            dnat: None,
            snat: None,
            drop: None,
            fragment: None,
            underlay: None,
        }
    }

    /// A leg's place is kept as text by device; a node the cluster view
    /// joins names legs seen there from then on, cached or not.
    #[test]
    fn a_joined_node_names_places_already_written() {
        let mut at_node = leg(Hook::DevXmit, "10.0.0.2:40000", "10.96.0.10:53");
        at_node.node = crate::decode::NodeId(3);
        let j = crate::correlate::fixtures::journey(
            "10.0.0.2:40000",
            "a.test.",
            vec![at_node],
            Outcome::Timeout,
        );
        let mut text = sink(Format::Text);
        let mut json = sink(Format::Json);
        for s in [&mut text, &mut json] {
            s.write_journey(&j).unwrap();
        }
        let joined = crate::target::follow::Joined {
            id: 3,
            name: "node3".into(),
            attachments: Default::default(),
            routes: Default::default(),
            resolvers: Vec::new(),
            service_ips: Vec::new(),
            node_netns: 0,
        };
        let refresh = Refresh {
            joined: Some(Box::new(joined)),
            ..Default::default()
        };
        for s in [&mut text, &mut json] {
            Sink::pods(s, &refresh, 0).unwrap();
            s.write_journey(&j).unwrap();
        }
        let out = String::from_utf8(text.out).unwrap();
        let places: Vec<_> = out.lines().filter(|l| l.starts_with("  +")).collect();
        assert_eq!(places.len(), 2, "{out}");
        assert!(places[0].contains(" eth0@4026532246 "), "{out}");
        assert!(places[1].contains(" node3 eth0@4026532246 "), "{out}");
        let out = String::from_utf8(json.out).unwrap();
        let nodes: Vec<_> = out
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["legs"][0]["node"].clone()
            })
            .collect();
        assert_eq!(nodes, [serde_json::Value::Null, "node3".into()], "{out}");
    }

    /// The hand-written journey line against the same journey as a JSON
    /// value, every optional field both present and absent.
    #[test]
    fn journey_line_has_every_field() {
        let mut nat = leg(Hook::DevXmit, "10.0.0.2:40000", "10.0.0.9:53");
        nat.iface = Some("we\"ird\u{1}".into());
        nat.dnat = Some(Box::new(("10.96.0.10:53".parse().unwrap(), nat.dst)));
        nat.snat = Some(Box::new((nat.src, "10.0.0.3:40000".parse().unwrap())));
        let mut dropped = leg(Hook::Drop, "[fd00::2]:40000", "[fd00::9]:53");
        dropped.iface = None;
        dropped.drop = Some(Box::new((6, 0xffff_ffff_8100_0000)));
        dropped.since_prev_ns = 5;
        let up = Journey {
            id: 2,
            lookup: 2,
            client: "10.0.0.9:33000".parse().unwrap(),
            dns_id: 7,
            name: "a.test.".into(),
            qtype: Qtype::AAAA,
            tcp: true,
            started_ns: 1_000,
            ended_ns: 2_500_000,
            outcome: Outcome::Dropped {
                reason: 6,
                location: 0xffff_ffff_8100_0000,
            },
            dnat: None,
            legs: vec![dropped],
            upstream: Vec::new(),
            incomplete: None,
            sampled: Default::default(),
            connection: None,
            opcode: None,
            asked_as: None,
        };
        let j = Journey {
            id: 1,
            lookup: 1,
            client: "10.0.0.2:40000".parse().unwrap(),
            dns_id: 9,
            name: "a.\"test\".".into(),
            qtype: Qtype::A,
            tcp: false,
            started_ns: 1_000,
            ended_ns: 1_500,
            outcome: Outcome::Answered {
                rcode: Rcode::NOERROR,
                answers: vec!["A 10.1.2.3".into()],
                truncated: false,
                malformed: None,
            },
            dnat: Some(Box::new((
                "10.96.0.10:53".parse().unwrap(),
                "10.0.0.9:53".parse().unwrap(),
            ))),
            legs: vec![leg(Hook::DevXmit, "10.0.0.2:40000", "10.96.0.10:53"), nat],
            upstream: vec![up],
            incomplete: Some(Gap::Lost),
            sampled: dnstrace_common::SampleLevel { shift: 2, seed: 77 },
            connection: None,
            opcode: None,
            asked_as: None,
        };
        // Twice: the second line's devices are those the first wrote.
        let mut s = sink(Format::Json);
        s.write_journey(&j).unwrap();
        s.write_journey(&j).unwrap();
        let out = String::from_utf8(s.out).unwrap();
        let (first, second) = out.split_once('\n').unwrap();
        assert!(
            second.ends_with("}\n") && second.matches('\n').count() == 1,
            "{out}"
        );
        assert_eq!(first, second.trim_end());
        let v: serde_json::Value = serde_json::from_str(first).unwrap();
        let leg0 = serde_json::json!({"ts_ns": 1000, "since_prev_ns": 0, "hook": "dev_xmit",
            "direction": "egress", "iface": "eth0", "ifindex": 2, "netns": 4026532246u64,
            "src": "10.0.0.2:40000", "dst": "10.96.0.10:53", "response": false,
            "dnat": null, "snat": null, "drop": null});
        let mut leg1 = leg0.clone();
        leg1["iface"] = "we\"ird\u{1}".into();
        leg1["dst"] = "10.0.0.9:53".into();
        leg1["dnat"] = serde_json::json!(["10.96.0.10:53", "10.0.0.9:53"]);
        leg1["snat"] = serde_json::json!(["10.0.0.2:40000", "10.0.0.3:40000"]);
        let up_leg = serde_json::json!({"ts_ns": 1000, "since_prev_ns": 5, "hook": "kfree_skb",
            "direction": "drop", "iface": null, "ifindex": 2, "netns": 4026532246u64,
            "src": "[fd00::2]:40000", "dst": "[fd00::9]:53", "response": false,
            "dnat": null, "snat": null, "drop": [6, 0xffff_ffff_8100_0000u64]});
        let up_outcome = serde_json::json!({"status": "dropped", "reason": 6,
            "location": 0xffff_ffff_8100_0000u64, "reason_name": "reason 6",
            "location_name": "0xffffffff81000000"});
        let up = serde_json::json!({
            "type": "journey", "time": "1970-01-01T00:00:00.000001000Z", "total_ms": 2.499,
            "id": 2, "lookup": 2, "client": "10.0.0.9:33000", "dns_id": 7,
            "name": "a.test.", "qtype": "AAAA", "tcp": true,
            "started_ns": 1000, "ended_ns": 2500000, "outcome": up_outcome, "dnat": null,
            "legs": [up_leg], "incomplete": false, "upstream": [], "names": {},
        });
        let outcome = serde_json::json!({"status": "answered", "rcode": "NOERROR",
            "answers": ["A 10.1.2.3"], "truncated": false});
        let expect = serde_json::json!({
            "type": "journey", "time": "1970-01-01T00:00:00.000001000Z", "total_ms": 0.0005,
            "id": 1, "lookup": 1, "client": "10.0.0.2:40000", "dns_id": 9,
            "name": "a.\"test\".", "qtype": "A", "tcp": false,
            "started_ns": 1000, "ended_ns": 1500, "outcome": outcome,
            "dnat": ["10.96.0.10:53", "10.0.0.9:53"], "legs": [leg0, leg1],
            "incomplete": true, "incomplete_why": Gap::Lost.why(),
            "sampled": {"one_in": 4, "seed": 77}, "upstream": [up], "names": {},
        });
        assert_eq!(v, expect);
    }
}
