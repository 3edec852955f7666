//! A journey as one JSON line, written by hand: legs are most of the line,
//! and serde spent more on each leg's field names than on its values
//! (a fifth of live tracing's CPU). Strings that may need escaping, the
//! outcome and the names still go through serde_json.
use std::{io::Write, net::IpAddr};

use serde::Serialize;

use super::{addr, places::Places, Labels};
use crate::{
    correlate::{Connection, FragmentNote, Journey, Leg, Outcome},
    pods::workload::Workload,
};

/// `,"k":` in one copy of a known length; keys are ours, nothing to escape.
macro_rules! key {
    ($out:expr, $k:literal) => {
        $out.extend_from_slice(concat!(",\"", $k, "\":").as_bytes())
    };
}

/// A journey line: the journey's own fields, and what labels add.
pub(super) struct JourneyJson<'a> {
    pub time: humantime::Rfc3339Timestamp,
    pub j: &'a Journey,
    pub outcome: OutcomeJson<'a>,
    pub upstream: Vec<JourneyJson<'a>>,
    /// Sorted by address, each once.
    pub names: Vec<(IpAddr, &'a str)>,
    /// The workloads of the named pods that have one, in the same order.
    pub workloads: Vec<(IpAddr, &'a Workload)>,
    /// Names the nodes of a merged replay's legs.
    pub labels: &'a Labels,
}

#[derive(Serialize)]
pub(super) struct OutcomeJson<'a> {
    #[serde(flatten)]
    pub outcome: &'a Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location_name: Option<String>,
}

impl JourneyJson<'_> {
    pub(super) fn write(&self, out: &mut Vec<u8>, places: &mut Places) -> serde_json::Result<()> {
        let j = self.j;
        out.extend_from_slice(b"{\"type\":\"journey\",\"time\":\"");
        write!(out, "{}\"", self.time).map_err(serde_json::Error::io)?;
        key!(out, "total_ms");
        value(out, &(j.total_ns() as f64 / 1e6))?;
        key!(out, "id");
        number(out, j.id);
        key!(out, "lookup");
        number(out, j.lookup);
        key!(out, "client");
        places.addrs.json(out, &j.client);
        key!(out, "dns_id");
        number(out, j.dns_id);
        key!(out, "name");
        value(out, j.shown_name())?;
        key!(out, "qtype");
        value(out, j.qtype.name())?;
        if let Some(op) = &j.opcode {
            key!(out, "opcode");
            value(out, op)?;
        }
        key!(out, "tcp");
        boolean(out, j.tcp);
        key!(out, "started_ns");
        number(out, j.started_ns);
        key!(out, "ended_ns");
        number(out, j.ended_ns);
        key!(out, "outcome");
        value(out, &self.outcome)?;
        key!(out, "dnat");
        places.addrs.pair(out, j.dnat.as_deref());
        key!(out, "legs");
        list(out, &j.legs, |out, l| leg(out, l, self.labels, places))?;
        key!(out, "incomplete");
        boolean(out, j.incomplete.is_some());
        if let Some(gap) = j.incomplete {
            key!(out, "incomplete_why");
            plain(out, gap.why());
        }
        if let Some(c) = &j.connection {
            key!(out, "connection");
            value(out, &ConnectionJson::of(c))?;
        }
        if j.sampled.shift > 0 {
            out.extend_from_slice(b",\"sampled\":{\"one_in\":");
            number(out, j.sampled.one_in());
            key!(out, "seed");
            number(out, j.sampled.seed);
            out.push(b'}');
        }
        key!(out, "upstream");
        list(out, &self.upstream, |out, u| u.write(out, places))?;
        key!(out, "names");
        out.push(b'{');
        for (i, (ip, name)) in self.names.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            addr::json_ip(out, ip);
            out.push(b':');
            value(out, name)?;
        }
        out.push(b'}');
        // Only where the CRI said one: lines without are as they were.
        if !self.workloads.is_empty() {
            key!(out, "workloads");
            out.push(b'{');
            for (i, (ip, workload)) in self.workloads.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                addr::json_ip(out, ip);
                out.push(b':');
                value(out, workload)?;
            }
            out.push(b'}');
        }
        out.push(b'}');
        Ok(())
    }
}

/// A TCP connection's set-up and end, times in ms from its SYN.
#[derive(Serialize)]
struct ConnectionJson {
    syn_ns: u64,
    syns: u32,
    syn_ack_ms: Option<f64>,
    reset: Option<ResetJson>,
    fin_ms: Option<f64>,
    retransmits: u32,
    /// The kernel dropped one of its segments: [reason, location].
    dropped: Option<(u32, u64)>,
}

#[derive(Serialize)]
struct ResetJson {
    ms: f64,
    to_client: bool,
}

impl ConnectionJson {
    fn of(c: &Connection) -> Self {
        Self {
            syn_ns: c.syn_ns,
            syns: c.syns,
            syn_ack_ms: c.syn_ack_ns.map(|t| c.ms_after_syn(t)),
            reset: c.reset.map(|r| ResetJson {
                ms: c.ms_after_syn(r.ts_ns),
                to_client: r.to_client,
            }),
            fin_ms: c.fin_ns.map(|t| c.ms_after_syn(t)),
            retransmits: c.retransmits,
            dropped: c.dropped,
        }
    }
}

fn leg(out: &mut Vec<u8>, l: &Leg, labels: &Labels, places: &mut Places) -> serde_json::Result<()> {
    out.extend_from_slice(b"{\"ts_ns\":");
    number(out, l.ts_ns);
    key!(out, "since_prev_ns");
    number(out, l.since_prev_ns);
    // Hook and direction names are ours: nothing to escape.
    key!(out, "hook");
    plain(out, l.hook.name());
    key!(out, "direction");
    plain(out, l.direction().name());
    places.write(out, l, |out| device(out, l, labels))?;
    key!(out, "src");
    places.addrs.json(out, &l.src);
    key!(out, "dst");
    places.addrs.json(out, &l.dst);
    key!(out, "response");
    boolean(out, l.response);
    key!(out, "dnat");
    places.addrs.pair(out, l.dnat.as_deref());
    key!(out, "snat");
    places.addrs.pair(out, l.snat.as_deref());
    key!(out, "drop");
    match l.drop.as_deref() {
        Some(&(reason, location)) => {
            out.push(b'[');
            number(out, reason);
            out.push(b',');
            number(out, location);
            out.push(b']');
        }
        None => out.extend_from_slice(b"null"),
    }
    if let Some(f) = l.fragment.as_deref() {
        key!(out, "fragment");
        value(out, &FragmentJson::of(f))?;
    }
    if let Some(u) = l.underlay.as_deref() {
        key!(out, "underlay");
        value(out, u)?;
    }
    out.push(b'}');
    Ok(())
}

/// A leg's part of a fragmented message: the fragment it saw dropped, or
/// the one it went without and where that was seen last.
#[derive(Serialize)]
struct FragmentJson<'a> {
    offset: u16,
    missing: bool,
    last_seen: Option<SeenJson<'a>>,
}

#[derive(Serialize)]
struct SeenJson<'a> {
    ts_ns: u64,
    iface: Option<&'a str>,
    ifindex: u32,
    netns: u32,
    hook: &'static str,
}

impl<'a> FragmentJson<'a> {
    fn of(f: &'a FragmentNote) -> Self {
        Self {
            offset: f.offset,
            missing: f.missing,
            last_seen: f.last_seen.as_ref().map(|s| SeenJson {
                ts_ns: s.ts_ns,
                iface: s.ifname.as_deref(),
                ifindex: s.ifindex,
                netns: s.netns,
                hook: s.hook.name(),
            }),
        }
    }
}

/// `s` quoted as it is: only for our own names, which need no escaping.
fn plain(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
}

pub(crate) fn number(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

pub(crate) fn boolean(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

fn value(out: &mut Vec<u8>, v: &(impl Serialize + ?Sized)) -> serde_json::Result<()> {
    serde_json::to_writer(out, v)
}

/// A leg's device: the same for every leg there (see `Places`).
fn device(out: &mut Vec<u8>, l: &Leg, labels: &Labels) -> serde_json::Result<()> {
    key!(out, "iface");
    // A device may be named almost anything: escaped as needed.
    value(out, &l.iface)?;
    key!(out, "ifindex");
    number(out, l.ifindex);
    // Only in a merged replay: one node's lines are as they were.
    if let Some(node) = labels.node(l.node) {
        key!(out, "node");
        value(out, &node)?;
    }
    key!(out, "netns");
    number(out, l.netns);
    Ok(())
}

fn list<T>(
    out: &mut Vec<u8>,
    items: &[T],
    mut each: impl FnMut(&mut Vec<u8>, &T) -> serde_json::Result<()>,
) -> serde_json::Result<()> {
    out.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        each(out, item)?;
    }
    out.push(b']');
    Ok(())
}
