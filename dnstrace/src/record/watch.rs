//! What a viewer watches on a node: the lookups of some client addresses,
//! with what they cause there. A query from a watched address names its
//! question; for a while after, that name's queries and answers between
//! any two addresses on the node are the same lookup's other legs (the
//! CoreDNS pod's to its upstream, NodeLocalDNS's to CoreDNS). Each packet
//! kept marks its flow, so that TCP segments and later IP fragments,
//! which carry no question, follow their flow, and so do its conntrack
//! events.
use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, SocketAddr},
};

use crate::{
    decode::{Packet, Transport},
    pipeline::Input,
};

/// How long a name or a flow learned stays watched after it was last seen:
/// longer than a resolver's retries and its upstream's timeout.
const LEARNED_NS: u64 = 10_000_000_000;

/// A DNS name's wire form, as long as it may be (RFC 1035).
const MAX_NAME: usize = 255;

#[derive(Debug, Default)]
pub struct Watch {
    ips: HashSet<IpAddr>,
    /// Question names (wire form, lower case) and when last seen.
    names: HashMap<Vec<u8>, u64>,
    /// Flows (either way) and when last seen.
    flows: HashMap<(SocketAddr, SocketAddr), u64>,
    pruned_ns: u64,
}

impl Watch {
    pub fn of(ips: impl IntoIterator<Item = IpAddr>) -> Self {
        Self {
            ips: ips.into_iter().collect(),
            ..Self::default()
        }
    }

    /// The share of `input` the viewer gets, if any: the packets and
    /// conntrack events of the lookups watched; every tick, count and
    /// pod change, which say how the node goes.
    pub fn share(&mut self, input: &Input) -> Option<Input> {
        match input {
            Input::Packets(batch) => {
                let kept: Vec<Packet> = batch.iter().filter(|p| self.packet(p)).cloned().collect();
                (!kept.is_empty()).then_some(Input::Packets(kept))
            }
            Input::Conntrack { now_ns, events } => {
                let kept: Vec<_> = events
                    .iter()
                    .filter(|e| {
                        self.involves(e.original.src, e.original.dst)
                            || self.involves(e.reply.src, e.reply.dst)
                    })
                    .cloned()
                    .collect();
                (!kept.is_empty()).then(|| Input::Conntrack {
                    now_ns: *now_ns,
                    events: kept,
                })
            }
            Input::Tick(now) => {
                self.prune(*now);
                Some(input.clone())
            }
            _ => Some(input.clone()),
        }
    }

    /// Whether a packet is of a lookup watched; learns its name and flow.
    fn packet(&mut self, p: &Packet) -> bool {
        let name = question(p);
        let by_address = self.watched(p.src.ip())
            || self.watched(p.dst.ip())
            || p.ct.as_deref().is_some_and(|ct| {
                [ct.original.src, ct.original.dst, ct.reply.src, ct.reply.dst]
                    .iter()
                    .any(|a| self.watched(a.ip()))
            });
        let by_name = name
            .as_ref()
            .is_some_and(|n| self.names.get(n).is_some_and(|&t| fresh(t, p.ts_ns)));
        let kept = by_address || by_name || self.flow_seen(p.src, p.dst, p.ts_ns);
        if kept {
            if let (true, Some(n)) = (by_address, name) {
                self.names.insert(n, p.ts_ns);
            }
            self.flows.insert(flow(p.src, p.dst), p.ts_ns);
        }
        kept
    }

    /// The client addresses watched.
    pub fn ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ips.iter().copied()
    }

    fn watched(&self, ip: IpAddr) -> bool {
        self.ips.contains(&ip)
    }

    fn flow_seen(&self, a: SocketAddr, b: SocketAddr, now_ns: u64) -> bool {
        self.flows
            .get(&flow(a, b))
            .is_some_and(|&t| fresh(t, now_ns))
    }

    /// A conntrack entry of a watched address or of a flow kept.
    fn involves(&self, src: SocketAddr, dst: SocketAddr) -> bool {
        self.watched(src.ip()) || self.watched(dst.ip()) || self.flows.contains_key(&flow(src, dst))
    }

    fn prune(&mut self, now_ns: u64) {
        if now_ns.saturating_sub(self.pruned_ns) < LEARNED_NS {
            return;
        }
        self.pruned_ns = now_ns;
        self.names.retain(|_, t| fresh(*t, now_ns));
        self.flows.retain(|_, t| fresh(*t, now_ns));
    }
}

fn fresh(seen_ns: u64, now_ns: u64) -> bool {
    now_ns.saturating_sub(seen_ns) <= LEARNED_NS
}

/// A flow whichever way a packet goes.
fn flow(a: SocketAddr, b: SocketAddr) -> (SocketAddr, SocketAddr) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

/// The question's name of a UDP message (or of a first fragment), wire
/// form in lower case; None for anything else.
fn question(p: &Packet) -> Option<Vec<u8>> {
    if p.transport != Transport::Udp || p.frag.is_some_and(|f| f.offset > 0) {
        return None;
    }
    let msg = p.payload.get(12..)?;
    let mut at = 0;
    loop {
        let len = usize::from(*msg.get(at)?);
        // Compression pointers have no place in a question's name.
        if len & 0xc0 != 0 {
            return None;
        }
        at += 1 + len;
        if at > MAX_NAME {
            return None;
        }
        if len == 0 {
            return Some(msg.get(..at)?.to_ascii_lowercase());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::{packet, query};

    const S: u64 = 1_000_000_000;

    fn kept(w: &mut Watch, p: Packet) -> bool {
        w.share(&Input::Packets(vec![p])).is_some()
    }

    /// On a CoreDNS pod's node: the watched pod's query, the upstream leg
    /// of its name (any case), not another pod's lookup of another name;
    /// and the name no more once it has not been seen for a while.
    #[test]
    fn a_watched_address_brings_its_names_upstream_legs_for_a_while() {
        let mut w = Watch::of(["10.244.1.5".parse().unwrap()]);
        let client = "10.244.1.5:40000";
        let coredns = "10.244.2.7:53";
        let upstream = "10.0.0.2:53";
        assert!(kept(&mut w, query(client, coredns, "db.example.com", S)));
        assert!(kept(
            &mut w,
            query("10.244.2.7:5000", upstream, "DB.example.COM", 2 * S)
        ));
        assert!(!kept(
            &mut w,
            query("10.244.3.9:41000", coredns, "www.example.com", 2 * S)
        ));
        w.share(&Input::Tick(30 * S));
        assert!(!kept(
            &mut w,
            query("10.244.2.7:5001", upstream, "db.example.com", 30 * S)
        ));
    }

    /// A TCP segment carries no question: its flow, once a packet of it
    /// was kept, brings it; a stranger's does not come.
    #[test]
    fn segments_follow_their_flow() {
        let mut w = Watch::of(["10.244.1.5".parse().unwrap()]);
        let tcp = Transport::Tcp {
            seq: 1,
            flags: 0x18,
        };
        assert!(kept(
            &mut w,
            packet("10.244.1.5:40000", "10.96.0.10:53", tcp, &[0, 1])
        ));
        assert!(kept(
            &mut w,
            packet("10.96.0.10:53", "10.244.1.5:40000", tcp, &[0, 1])
        ));
        assert!(!kept(
            &mut w,
            packet("10.244.3.9:40000", "10.96.0.10:53", tcp, &[0, 1])
        ));
    }

    /// What says how the node goes reaches every viewer, watched or not.
    #[test]
    fn ticks_and_counts_always_pass() {
        let mut w = Watch::of([]);
        assert!(w.share(&Input::Tick(S)).is_some());
        let lost = Input::Lost {
            since_ns: 0,
            now_ns: S,
            total: 3,
        };
        assert!(w.share(&lost).is_some());
    }
}
