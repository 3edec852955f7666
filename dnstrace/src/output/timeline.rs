//! A journey as text: a header line, a line per leg, and upstream journeys
//! nested under it. Written by hand into one buffer: through `format!`, a
//! string for each leg and for each piece of it, the text output was half
//! of live tracing's CPU.
use std::{convert::Infallible, io::Write, net::SocketAddr};

use super::{addr, direction_word, journey_json::number, places::Places, Labels};
use crate::correlate::{Journey, Leg};

/// Columns of a leg's time since the previous leg (right-aligned) and of
/// its place (left-aligned).
const SINCE_WIDTH: usize = 9;
const PLACE_WIDTH: usize = 28;

pub(super) fn write(
    out: &mut Vec<u8>,
    labels: &Labels,
    places: &mut Places,
    j: &Journey,
    indent: &str,
) {
    header(out, labels, j, indent);
    for l in &j.legs {
        leg(out, labels, places, l, indent);
    }
    if !j.upstream.is_empty() {
        let nested = format!("{indent}    upstream ");
        for up in &j.upstream {
            write(out, labels, places, up, &nested);
        }
    }
}

/// `time client → server udp id=N name type: outcome in T [DNAT …]`.
fn header(out: &mut Vec<u8>, labels: &Labels, j: &Journey, indent: &str) {
    out.extend_from_slice(indent.as_bytes());
    labels.write_time_of_day(out, j.started_ns);
    out.push(b' ');
    labels.write_named(out, &j.client);
    out.extend_from_slice(" → ".as_bytes());
    if let Some(first) = j.legs.first() {
        labels.write_named(out, &first.dst);
    }
    out.extend_from_slice(if j.tcp { b" tcp id=" } else { b" udp id=" });
    number(out, j.dns_id);
    if let Some(op) = &j.opcode {
        out.push(b' ');
        out.extend_from_slice(op.as_bytes());
    }
    for part in [" ", j.shown_name(), " ", j.qtype.name(), ": "] {
        out.extend_from_slice(part.as_bytes());
    }
    labels.write_outcome(out, &j.outcome);
    out.extend_from_slice(b" in ");
    ms(out, j.total_ns());
    if let Some((a, b)) = j.dnat.as_deref() {
        out.extend_from_slice(b" [DNAT ");
        labels.write_named(out, a);
        out.extend_from_slice(" → ".as_bytes());
        labels.write_named(out, b);
        out.push(b']');
    }
    if let Some(gap) = j.incomplete {
        for part in [" [incomplete: ", gap.why(), "]"] {
            out.extend_from_slice(part.as_bytes());
        }
    }
    out.push(b'\n');
    if let Some(c) = &j.connection {
        for part in [indent, "  tcp connection: ", &c.describe()] {
            out.extend_from_slice(part.as_bytes());
        }
        if let Some((reason, at)) = c.dropped {
            out.extend_from_slice(b", set-up dropped: ");
            out.extend_from_slice(labels.drop_text(reason, at).as_bytes());
        }
        out.push(b'\n');
    }
}

/// `  +   0.008 ms veth0@4026532177    in  query    src → dst  DNAT …`.
fn leg(out: &mut Vec<u8>, labels: &Labels, places: &mut Places, leg: &Leg, indent: &str) {
    out.extend_from_slice(indent.as_bytes());
    out.extend_from_slice(b"  +");
    let since = out.len();
    ms(out, leg.since_prev_ns);
    pad(out, since, SINCE_WIDTH, since);
    out.push(b' ');
    let Ok(()) = places.write(out, leg, |text| {
        labels.write_place(text, leg);
        let end = text.len();
        pad(text, 0, PLACE_WIDTH, end);
        Ok::<_, Infallible>(())
    });
    out.push(b' ');
    out.extend_from_slice(direction_word(leg.direction()).as_bytes());
    out.extend_from_slice(if leg.response {
        b" answer   "
    } else {
        b" query    "
    });
    places.addrs.text(out, &leg.src);
    out.extend_from_slice(" → ".as_bytes());
    places.addrs.text(out, &leg.dst);
    nat(out, &mut places.addrs, "  DNAT ", leg.dnat.as_deref());
    nat(out, &mut places.addrs, "  SNAT ", leg.snat.as_deref());
    if let Some(f) = leg.fragment.as_deref() {
        out.extend_from_slice(b"  ");
        out.extend_from_slice(f.describe().as_bytes());
    }
    if let Some(&(reason, at)) = leg.drop.as_deref() {
        out.extend_from_slice(b"  dropped: ");
        out.extend_from_slice(labels.drop_text(reason, at).as_bytes());
    }
    if let Some(u) = leg.underlay.as_deref() {
        let _ = write!(out, "  in {u}");
    }
    out.push(b'\n');
}

/// Inlined: most legs have no NAT, and a call to learn that cost more than
/// the check.
#[inline(always)]
fn nat(
    out: &mut Vec<u8>,
    addrs: &mut addr::Texts,
    what: &str,
    pair: Option<&(SocketAddr, SocketAddr)>,
) {
    if let Some((a, b)) = pair {
        out.extend_from_slice(what.as_bytes());
        addrs.text(out, a);
        out.extend_from_slice(" → ".as_bytes());
        addrs.text(out, b);
    }
}

/// Pads the text written since `start` with spaces, inserted at `at`, to
/// `width` characters, as `format!`'s `{:>width}` or `{:<width}` would.
fn pad(out: &mut Vec<u8>, start: usize, width: usize, at: usize) {
    // Characters, not bytes: UTF-8 continuation bytes are 0b10xxxxxx.
    // Most text is ASCII, checked a word at a time.
    let text = &out[start..];
    let chars = if text.is_ascii() {
        text.len()
    } else {
        text.iter().filter(|&&b| b & 0xc0 != 0x80).count()
    };
    let missing = width.saturating_sub(chars);
    if missing == 0 {
        return;
    }
    let end = out.len();
    out.resize(end + missing, b' ');
    out.copy_within(at..end, at + missing);
    out[at..at + missing].fill(b' ');
}

/// Nanoseconds as milliseconds, `0.054 ms`: what `{:.3}` writes of
/// `ns as f64 / 1e6`, from integers. A time exactly on a half microsecond
/// is a tie the nearest f64 breaks one way or the other: it goes through
/// `fmt`, so that the text stays what every other view writes.
fn ms(out: &mut Vec<u8>, ns: u64) {
    let (us, rest) = (ns / 1000, ns % 1000);
    if rest == 500 {
        let _ = write!(out, "{:.3} ms", ns as f64 / 1e6);
        return;
    }
    let us = us + u64::from(rest > 500);
    number(out, us / 1000);
    let frac = us % 1000;
    out.extend_from_slice(&[
        b'.',
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
    out.extend_from_slice(b" ms");
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use dnstrace_common::Hook;

    use super::*;
    use crate::decode::{Qtype, Rcode};
    use crate::{
        clock::Clock,
        correlate::{Gap, Outcome},
        decode::KernelNames,
        naming::Names,
    };

    /// The text as `format!` wrote it before, piece by piece.
    fn by_format(labels: &Labels, j: &Journey, indent: &str) -> String {
        let ms = |ns: u64| format!("{:.3} ms", ns as f64 / 1e6);
        let named = |a: SocketAddr| match labels.name(&a.ip()) {
            Some(name) => format!("{name} ({a})"),
            None => a.to_string(),
        };
        let first_dst = j.legs.first().map_or_else(String::new, |l| named(l.dst));
        let mut out = format!(
            "{indent}{} {} → {first_dst} {} id={} {} {}: {} in {}{}{}\n",
            labels.time_of_day(j.started_ns),
            named(j.client),
            if j.tcp { "tcp" } else { "udp" },
            j.dns_id,
            j.shown_name(),
            j.qtype,
            labels.outcome(&j.outcome),
            ms(j.total_ns()),
            j.dnat
                .as_deref()
                .map(|&(a, b)| format!(" [DNAT {} → {}]", named(a), named(b)))
                .unwrap_or_default(),
            j.incomplete
                .map(|g| format!(" [incomplete: {}]", g.why()))
                .unwrap_or_default(),
        );
        for leg in &j.legs {
            let place = match &leg.iface {
                Some(name) => format!("{name}@{}", leg.netns),
                None => labels
                    .iface_names()
                    .get(&leg.ifindex)
                    .cloned()
                    .unwrap_or_else(|| format!("if{}", leg.ifindex)),
            };
            out += &format!(
                "{indent}  +{:>9} {place:<28} {} {:<8} {} → {}",
                ms(leg.since_prev_ns),
                direction_word(leg.direction()),
                if leg.response { "answer" } else { "query" },
                leg.src,
                leg.dst
            );
            if let Some(&(a, b)) = leg.dnat.as_deref() {
                out += &format!("  DNAT {a} → {b}");
            }
            if let Some(&(a, b)) = leg.snat.as_deref() {
                out += &format!("  SNAT {a} → {b}");
            }
            if let Some(&(reason, at)) = leg.drop.as_deref() {
                out += &format!("  dropped: {}", labels.drop_text(reason, at));
            }
            out.push('\n');
        }
        for up in &j.upstream {
            out += &by_format(labels, up, &format!("{indent}    upstream "));
        }
        out
    }

    fn leg(hook: Hook, iface: Option<&str>, src: &str, dst: &str, since_prev_ns: u64) -> Leg {
        Leg {
            ts_ns: 0,
            since_prev_ns,
            hook,
            iface: iface.map(Into::into),
            ifindex: 7,
            node: Default::default(),
            netns: 4026532246,
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            response: since_prev_ns % 2 == 1,
            ip_len: 0,
            dnat: None,
            snat: None,
            drop: None,
            fragment: None,
            underlay: None,
        }
    }

    fn journey(client: &str, legs: Vec<Leg>, ended_ns: u64) -> Journey {
        Journey {
            id: 1,
            lookup: 1,
            client: client.parse().unwrap(),
            dns_id: 4711,
            name: "api.example.com.".into(),
            qtype: Qtype::AAAA,
            tcp: false,
            started_ns: 1_000,
            ended_ns,
            outcome: Outcome::Timeout,
            dnat: None,
            legs,
            upstream: Vec::new(),
            incomplete: None,
            sampled: Default::default(),
            connection: None,
            opcode: None,
            asked_as: None,
        }
    }

    fn labels() -> Labels {
        let names = BTreeMap::from([
            (
                "10.96.0.10".parse().unwrap(),
                "kube-system/kube-dns".to_string(),
            ),
            ("fd00::a".parse().unwrap(), "default/web-ü".to_string()),
        ]);
        Labels::new(
            HashMap::from([(7, "veth-s".to_string())]),
            Clock::with_offset(1_764_000_000_123_456_789),
            KernelNames::default(),
        )
        .with_names(Names::from_entries(names))
    }

    /// Every piece of the text: named and unnamed, IPv4 and IPv6 addresses,
    /// NAT, drops, places short, long, non-ASCII and from `--iface`, times
    /// on and off a half microsecond, gaps, nesting, and no legs at all.
    #[test]
    fn writes_what_format_wrote() {
        let mut nat = leg(
            Hook::DevXmit,
            Some("veth0cf73899"),
            "10.0.0.2:40000",
            "10.244.0.53:53",
            61_499,
        );
        nat.dnat = Some(Box::new(("10.96.0.10:53".parse().unwrap(), nat.dst)));
        nat.snat = Some(Box::new((nat.src, "198.51.100.1:40000".parse().unwrap())));
        let mut dropped = leg(Hook::Drop, None, "[fd00::2]:40000", "[fd00::a]:53", 4_500);
        dropped.drop = Some(Box::new((6, 0xffff_ffff_8100_0000)));
        let mut unknown = leg(
            Hook::DevReceive,
            None,
            "[fe80::1%2]:53",
            "10.0.0.2:40000",
            999_999_500,
        );
        unknown.ifindex = 9;
        let mut up = journey("10.244.0.53:1053", vec![dropped, unknown], 2_500_000);
        up.tcp = true;
        up.outcome = Outcome::Dropped {
            reason: 6,
            location: 0xffff_ffff_8100_0000,
        };
        up.incomplete = Some(Gap::Ended);
        let mut j = journey(
            "10.0.0.2:40000",
            vec![
                leg(
                    Hook::DevXmit,
                    Some("eth0"),
                    "10.0.0.2:40000",
                    "10.96.0.10:53",
                    0,
                ),
                nat,
                leg(
                    Hook::DevReceive,
                    Some("vethüßçñ"),
                    "10.0.0.2:40000",
                    "10.244.0.53:53",
                    1_500,
                ),
                leg(
                    Hook::TcIngress,
                    Some("a-device-name-far-too-long-for"),
                    "[fd00::a]:53",
                    "[fd00::2]:1",
                    12_345_678_901,
                ),
            ],
            1_500,
        );
        j.outcome = Outcome::Answered {
            rcode: Rcode::NOERROR,
            answers: vec!["A 10.1.2.3".into(); 5],
            truncated: true,
            malformed: None,
        };
        j.dnat = Some(Box::new((
            "10.96.0.10:53".parse().unwrap(),
            "[fd00::a]:53".parse().unwrap(),
        )));
        j.incomplete = Some(Gap::Lost);
        j.upstream = vec![up, journey("[fd00::a]:53", Vec::new(), 0)];
        let labels = labels();
        // Twice: the second time the places come from the first's. Legs on
        // different devices share an index and namespace here, and so a
        // spot.
        let mut places = Places::default();
        for _ in 0..2 {
            let mut out = Vec::new();
            write(&mut out, &labels, &mut places, &j, "");
            assert_eq!(String::from_utf8(out).unwrap(), by_format(&labels, &j, ""));
        }
    }

    #[test]
    fn milliseconds_are_what_format_writes() {
        let samples = (0..3_000_000)
            .step_by(7)
            .chain((0..40).map(|i| 1u64 << i))
            .chain([
                499,
                500,
                501,
                999_999_500,
                999_999_501,
                86_400_000_000_499,
                86_400_000_000_500,
            ]);
        let mut out = Vec::new();
        for ns in samples {
            out.clear();
            ms(&mut out, ns);
            assert_eq!(out, format!("{:.3} ms", ns as f64 / 1e6).as_bytes(), "{ns}");
        }
    }
}
