//! Line output: one text line or one JSON object per DNS message.
use std::{
    collections::HashMap,
    io::{self, Write},
    time::{Duration, SystemTime},
};

use dnstrace_common::Hook;
use serde::Serialize;

use crate::{
    cli::OutputFormat,
    decode::{Body, DnsMessage, Record, Transport},
};

/// Converts kernel CLOCK_MONOTONIC timestamps to wall-clock time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC, in nanoseconds.
    offset_ns: i128,
}

impl Clock {
    pub fn now() -> Self {
        let read = |id| {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: clock_gettime writes into the provided timespec.
            unsafe { libc::clock_gettime(id, &mut ts) };
            i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
        };
        Self {
            offset_ns: read(libc::CLOCK_REALTIME) - read(libc::CLOCK_MONOTONIC),
        }
    }

    pub fn wall(&self, mono_ns: u64) -> SystemTime {
        let ns = (i128::from(mono_ns) + self.offset_ns).max(0) as u64;
        SystemTime::UNIX_EPOCH + Duration::from_nanos(ns)
    }
}

pub struct LineSink<W: Write> {
    format: OutputFormat,
    iface_names: HashMap<u32, String>,
    clock: Clock,
    out: W,
}

#[derive(Serialize)]
struct JsonLine<'a> {
    time: String,
    mono_ns: u64,
    iface: &'a str,
    ifindex: u32,
    netns: u32,
    direction: &'static str,
    src: String,
    dst: String,
    transport: &'static str,
    wire_len: u32,
    captured_truncated: bool,
    ip_fragment: bool,
    #[serde(flatten)]
    body: &'a Body,
}

impl<W: Write> LineSink<W> {
    pub fn new(
        format: OutputFormat,
        iface_names: HashMap<u32, String>,
        clock: Clock,
        out: W,
    ) -> Self {
        Self {
            format,
            iface_names,
            clock,
            out,
        }
    }

    pub fn write(&mut self, rec: &Record) -> io::Result<()> {
        match self.format {
            OutputFormat::Text => {
                let line = self.text(rec);
                writeln!(self.out, "{line}")
            }
            OutputFormat::Json => {
                let line = serde_json::to_string(&self.json(rec)).map_err(io::Error::other)?;
                writeln!(self.out, "{line}")
            }
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    fn iface(&self, ifindex: u32) -> String {
        self.iface_names
            .get(&ifindex)
            .cloned()
            .unwrap_or_else(|| format!("if{ifindex}"))
    }

    fn text(&self, rec: &Record) -> String {
        let p = &rec.packet;
        let time = humantime::format_rfc3339_micros(self.clock.wall(p.ts_ns)).to_string();
        let time = time.get(11..26).unwrap_or(&time);
        let dir = match p.hook {
            Hook::TcIngress => "in ",
            Hook::TcEgress => "out",
        };
        let head = format!(
            "{time} {:<10} {dir} {} → {} {}",
            self.iface(p.ifindex),
            p.src,
            p.dst,
            transport(p.transport)
        );
        match &rec.body {
            Body::Dns(m) => format!("{head} {}", dns_text(m)),
            Body::Malformed { reason, len } => format!("{head} MALFORMED {len} bytes: {reason}"),
        }
    }

    fn json<'a>(&'a self, rec: &'a Record) -> JsonLine<'a> {
        let p = &rec.packet;
        JsonLine {
            time: humantime::format_rfc3339_nanos(self.clock.wall(p.ts_ns)).to_string(),
            mono_ns: p.ts_ns,
            iface: self.iface_names.get(&p.ifindex).map_or("", String::as_str),
            ifindex: p.ifindex,
            netns: p.netns,
            direction: match p.hook {
                Hook::TcIngress => "ingress",
                Hook::TcEgress => "egress",
            },
            src: p.src.to_string(),
            dst: p.dst.to_string(),
            transport: transport(p.transport),
            wire_len: p.wire_len,
            captured_truncated: p.truncated,
            ip_fragment: p.fragment,
            body: &rec.body,
        }
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
    const MAX: usize = 60;
    match data.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…({} bytes)", &data[..cut], data.len()),
        None => data.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{dns, Packet};
    use bytes::Bytes;

    fn record(body: Body) -> Record {
        Record {
            packet: Packet {
                ts_ns: 0,
                netns: 1,
                ifindex: 7,
                hook: Hook::TcEgress,
                src: "10.0.0.2:53".parse().unwrap(),
                dst: "10.0.0.1:40000".parse().unwrap(),
                transport: Transport::Udp,
                wire_len: 100,
                payload_len: 58,
                truncated: false,
                fragment: false,
                payload: Bytes::new(),
            },
            body,
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
            rcode: "NOERROR".into(),
            questions: vec![dns::Question {
                name: "a.test.".into(),
                qtype: "A".into(),
                class: "IN".into(),
            }],
            answers: vec![dns::Answer {
                name: "a.test.".into(),
                rtype: "A".into(),
                ttl: 5,
                data: "10.1.2.3".into(),
            }],
            authority_count: 0,
            additional_count: 0,
        };
        Body::Dns(m)
    }

    fn sink(format: OutputFormat) -> LineSink<Vec<u8>> {
        LineSink::new(
            format,
            HashMap::from([(7, "veth-s".to_string())]),
            Clock { offset_ns: 0 },
            Vec::new(),
        )
    }

    #[test]
    fn text_line_has_every_field() {
        let mut s = sink(OutputFormat::Text);
        s.write(&record(answer())).unwrap();
        let line = String::from_utf8(s.out).unwrap();
        assert_eq!(line, "00:00:00.000000 veth-s     out 10.0.0.2:53 → 10.0.0.1:40000 udp id=9 R NOERROR aa rd a.test. A → A 10.1.2.3\n");
    }

    #[test]
    fn long_data_is_cut_in_text_only() {
        assert_eq!(shorten("short"), "short");
        let long = "x".repeat(100);
        assert_eq!(shorten(&long), format!("{}…(100 bytes)", "x".repeat(60)));
    }

    #[test]
    fn json_line_is_one_object_with_the_same_fields() {
        let mut s = sink(OutputFormat::Json);
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
    }
}
