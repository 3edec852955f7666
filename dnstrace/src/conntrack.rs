//! Conntrack seen from user space: ctnetlink events of the node's network
//! namespace (DNS flows only) and its conntrack statistics.
use std::{
    collections::BTreeMap,
    fs::File,
    io::{self, Read as _, Seek as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::{
    decode::packet::CtTuple,
    netlink::{attrs, Subscription},
    netns::in_netns,
};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NLM_F_CREATE: u16 = 0x400;
/// NFNLGRP_CONNTRACK_NEW, _UPDATE, _DESTROY.
const GROUPS: u32 = 0b111;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CtEventKind {
    New,
    Update,
    Destroy,
}

/// One ctnetlink event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtEvent {
    pub kind: CtEventKind,
    pub original: CtTuple,
    pub reply: CtTuple,
    pub proto: u8,
    pub status: u32,
}

fn find(buf: &[u8], kind: u16) -> Result<Option<&[u8]>> {
    for a in attrs(buf) {
        let (k, p) = a?;
        if k == kind {
            return Ok(Some(p));
        }
    }
    Ok(None)
}

/// CTA_TUPLE_*: (addresses, protocol number).
fn tuple(buf: &[u8]) -> Result<(CtTuple, u8)> {
    let ip = find(buf, 1)?.ok_or_else(|| anyhow!("tuple without CTA_TUPLE_IP"))?;
    let proto = find(buf, 2)?.ok_or_else(|| anyhow!("tuple without CTA_TUPLE_PROTO"))?;
    let addr = |kind: u16| -> Result<Option<IpAddr>> {
        Ok(match find(ip, kind)? {
            Some(a) if a.len() == 4 => Some(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))),
            Some(a) if a.len() == 16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(a)?))),
            _ => None,
        })
    };
    let (src, dst) = match (addr(1)?, addr(2)?, addr(3)?, addr(4)?) {
        (Some(s), Some(d), _, _) | (_, _, Some(s), Some(d)) => (s, d),
        _ => bail!("tuple without addresses"),
    };
    let port = |kind: u16| -> Result<u16> {
        Ok(find(proto, kind)?
            .and_then(|p| p.get(..2))
            .map_or(0, |p| u16::from_be_bytes([p[0], p[1]])))
    };
    let num = find(proto, 1)?
        .and_then(|p| p.first().copied())
        .unwrap_or(0);
    Ok((
        CtTuple {
            src: SocketAddr::new(src, port(2)?),
            dst: SocketAddr::new(dst, port(3)?),
        },
        num,
    ))
}

/// Parses one netlink message; `None` for messages that are not conntrack events.
pub fn parse_event(msg: &[u8]) -> Result<Option<CtEvent>> {
    if msg.len() < 20 {
        bail!("netlink message of {} bytes is too short", msg.len());
    }
    let kind = u16::from_ne_bytes([msg[4], msg[5]]);
    let flags = u16::from_ne_bytes([msg[6], msg[7]]);
    if kind >> 8 != NFNL_SUBSYS_CTNETLINK {
        return Ok(None);
    }
    let kind = match kind & 0xff {
        IPCTNL_MSG_CT_NEW if flags & NLM_F_CREATE != 0 => CtEventKind::New,
        IPCTNL_MSG_CT_NEW => CtEventKind::Update,
        IPCTNL_MSG_CT_DELETE => CtEventKind::Destroy,
        _ => return Ok(None),
    };
    let body = &msg[20..];
    let (original, proto) =
        tuple(find(body, 1)?.ok_or_else(|| anyhow!("event without CTA_TUPLE_ORIG"))?)?;
    let (reply, _) =
        tuple(find(body, 2)?.ok_or_else(|| anyhow!("event without CTA_TUPLE_REPLY"))?)?;
    let status = find(body, 3)?
        .and_then(|s| s.get(..4))
        .map_or(0, |s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]));
    Ok(Some(CtEvent {
        kind,
        original,
        reply,
        proto,
        status,
    }))
}

/// ctnetlink event subscription.
pub struct CtWatcher {
    sub: Subscription,
}

impl CtWatcher {
    pub fn open(netns: Option<&Path>) -> Result<Self> {
        // A deep queue rides out bursts.
        let sub = Subscription::open(netns, libc::NETLINK_NETFILTER, GROUPS, 8 << 20)
            .context("subscribing to conntrack events")?;
        Ok(Self { sub })
    }

    /// Events the kernel could not queue for us (ENOBUFS).
    pub fn overruns(&self) -> u64 {
        self.sub.overruns
    }

    /// Waits for events and returns those of DNS flows (by `is_dns` port).
    pub async fn next(&mut self, is_dns: impl Fn(u16) -> bool) -> io::Result<Vec<CtEvent>> {
        let mut out = Vec::new();
        self.sub
            .next(|msg| {
                if let Ok(Some(ev)) = parse_event(msg) {
                    if is_dns(ev.original.dst.port()) || is_dns(ev.original.src.port()) {
                        out.push(ev);
                    }
                }
            })
            .await?;
        Ok(out)
    }
}

/// /proc/net/stat/nf_conntrack of a namespace, opened there and re-read.
pub struct CtStats {
    file: File,
}

impl CtStats {
    pub fn open(netns: Option<&Path>) -> Result<Self> {
        // The file belongs to the namespace it was opened in.
        let file = in_netns(netns, || {
            File::open("/proc/thread-self/net/stat/nf_conntrack")
                .context("opening conntrack statistics")
        })?;
        Ok(Self { file })
    }

    /// Every counter, summed over CPUs.
    pub fn read(&mut self) -> Result<BTreeMap<String, u64>> {
        let mut text = String::new();
        self.file.rewind()?;
        self.file.read_to_string(&mut text)?;
        parse_stats(&text)
    }
}

pub fn parse_stats(text: &str) -> Result<BTreeMap<String, u64>> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .ok_or_else(|| anyhow!("empty conntrack statistics"))?
        .split_whitespace()
        .collect();
    let mut sums: BTreeMap<String, u64> = header.iter().map(|h| ((*h).to_owned(), 0)).collect();
    for line in lines {
        for (name, value) in header.iter().zip(line.split_whitespace()) {
            let v =
                u64::from_str_radix(value, 16).with_context(|| format!("bad counter {value:?}"))?;
            // `entries` is global, repeated on every CPU line.
            let sum = sums.entry((*name).to_owned()).or_default();
            *sum = if *name == "entries" { v } else { *sum + v };
        }
    }
    Ok(sums)
}

/// The counters that say a conntrack insert lost or clashed.
pub const RACE_COUNTERS: [&str; 4] = ["insert_failed", "drop", "early_drop", "clashres"];

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = ((payload.len() + 4) as u16).to_ne_bytes().to_vec();
        v.extend(kind.to_ne_bytes());
        v.extend(payload);
        while !v.len().is_multiple_of(4) {
            v.push(0);
        }
        v
    }

    fn nested(kind: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        attr(kind | 0x8000, &parts.concat())
    }

    fn tuple_attr(kind: u16, src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        nested(
            kind,
            &[
                nested(1, &[attr(1, &src), attr(2, &dst)]),
                nested(
                    2,
                    &[
                        attr(1, &[17]),
                        attr(2, &sport.to_be_bytes()),
                        attr(3, &dport.to_be_bytes()),
                    ],
                ),
            ],
        )
    }

    fn message(kind: u16, flags: u16) -> Vec<u8> {
        let body = [
            vec![2, 0, 0, 0],
            tuple_attr(1, [10, 244, 0, 10], [10, 96, 0, 10], 4000, 53),
            tuple_attr(2, [10, 244, 0, 53], [10, 244, 0, 10], 53, 4000),
            attr(3, &0x1a8u32.to_be_bytes()),
        ]
        .concat();
        let mut m = ((16 + body.len()) as u32).to_ne_bytes().to_vec();
        m.extend(((NFNL_SUBSYS_CTNETLINK << 8) | kind).to_ne_bytes());
        m.extend(flags.to_ne_bytes());
        m.extend([0; 8]);
        m.extend(body);
        m
    }

    #[test]
    fn parses_new_update_and_destroy() {
        let ev = parse_event(&message(IPCTNL_MSG_CT_NEW, NLM_F_CREATE))
            .unwrap()
            .unwrap();
        assert_eq!(ev.kind, CtEventKind::New);
        assert_eq!(ev.original.dst, "10.96.0.10:53".parse().unwrap());
        assert_eq!(ev.reply.src, "10.244.0.53:53".parse().unwrap());
        assert_eq!((ev.proto, ev.status), (17, 0x1a8));
        assert_eq!(
            parse_event(&message(IPCTNL_MSG_CT_NEW, 0))
                .unwrap()
                .unwrap()
                .kind,
            CtEventKind::Update
        );
        assert_eq!(
            parse_event(&message(IPCTNL_MSG_CT_DELETE, 0))
                .unwrap()
                .unwrap()
                .kind,
            CtEventKind::Destroy
        );
    }

    #[test]
    fn damaged_messages_are_errors_not_panics() {
        let good = message(IPCTNL_MSG_CT_NEW, NLM_F_CREATE);
        for cut in [0, 10, 19, 24, 40, good.len() - 3] {
            let _ = parse_event(&good[..cut]);
        }
        let mut lying = good.clone();
        lying[20] = 0xff; // the first attribute claims more bytes than there are
        lying[21] = 0x7f;
        assert!(parse_event(&lying).is_err());
    }

    #[test]
    fn stats_sum_over_cpus() {
        let text = "entries  clashres found insert_failed drop\n0000000a  00000002 00000000 00000001 00000000\n0000000a  00000003 00000000 00000000 00000004\n";
        let s = parse_stats(text).unwrap();
        assert_eq!(
            (s["entries"], s["clashres"], s["insert_failed"], s["drop"]),
            (10, 5, 1, 4)
        );
        assert!(parse_stats("").is_err());
        assert!(parse_stats("a b\nzz 1\n").is_err());
    }
}
