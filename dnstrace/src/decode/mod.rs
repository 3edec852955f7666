//! Bytes to typed records: kernel events to packets, packets to DNS messages.
pub mod dns;
pub mod frag;
pub mod kernel;
pub mod packet;
pub mod tcp;
pub mod wire;

pub use dns::{DnsMessage, Qtype, Rcode};
pub use frag::{Missing, Seen};
pub use kernel::KernelNames;
pub use packet::{
    Conntrack, CtTuple, Dropped, Fragment, NodeId, Packet, Transport, Tunnel, Underlay,
};

use std::sync::Arc;

use bytes::Bytes;
use dnstrace_common::Hook;
use foldhash::fast::FixedState;
use serde::Serialize;

/// What one DNS payload turned out to be.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Body {
    /// Shared: one message is seen at many hooks and decoded once.
    Dns(Arc<DnsMessage>),
    /// A message not all there (a fragment of its datagram missing, or its
    /// payload cut by the capture): its header and questions only, never
    /// an answer's records, so never a whole answer.
    Cut(Arc<DnsMessage>),
    /// Not a DNS message: why, and how many bytes there were.
    Malformed { reason: String, len: usize },
    /// Bytes of a TCP stream the capture missed or cut, in the direction
    /// of `packet`: the messages in them are lost.
    Gap { reason: String },
}

/// One decoded DNS message (or malformed payload) with the packet that carried it.
#[derive(Clone, Debug)]
pub struct Record {
    pub packet: Packet,
    pub body: Body,
    /// For a fragmented datagram this hook point never got whole (`packet`
    /// is its first fragment): the fragment it lacked.
    /// Boxed: every packet's record carries the field, few a value.
    pub missing: Option<Box<Missing>>,
}

/// Recently decoded UDP payloads: a message crosses several hooks (pod,
/// veth, bridge, CoreDNS) within microseconds, and is parsed only once.
/// Each has one place, by its hash: found in one probe, where a scan of
/// them all cost more than a parse saved at 20,000 lookups a second.
const RECENT: usize = 256;

/// Turns packets into records: UDP payloads directly, fragmented UDP and
/// TCP through reassembly.
pub struct Decoder {
    tcp: tcp::Reassembler,
    frags: frag::Reassembler,
    recent: Vec<Option<(u64, Bytes, Arc<DnsMessage>)>>,
    hasher: FixedState,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new(tcp::Limits::default(), frag::Limits::default())
    }
}

impl Decoder {
    pub fn new(tcp: tcp::Limits, frags: frag::Limits) -> Self {
        Self {
            tcp: tcp::Reassembler::new(tcp),
            frags: frag::Reassembler::new(frags),
            recent: vec![None; RECENT],
            hasher: FixedState::default(),
        }
    }

    /// A whole UDP payload, parsed or found among the recent ones.
    #[inline]
    fn udp(&mut self, payload: &Bytes) -> Body {
        use std::hash::BuildHasher as _;
        let hash = self.hasher.hash_one(payload.as_ref());
        let place = &mut self.recent[hash as usize % RECENT];
        if let Some((h, p, msg)) = place {
            // Events of one message share its bytes (`Interned`): the
            // same pointer needs no compare.
            let same = p.as_ptr() == payload.as_ptr() && p.len() == payload.len();
            if *h == hash && (same || p == payload) {
                return Body::Dns(msg.clone());
            }
        }
        let body = parse(payload);
        if let Body::Dns(msg) = &body {
            *place = Some((hash, payload.clone(), msg.clone()));
        }
        body
    }

    /// The common case (a whole UDP datagram, nothing held for
    /// reassembly) stays in this function: each call a packet passes
    /// through by value copies its few hundred bytes.
    #[inline]
    pub fn decode(&mut self, packet: Packet, out: &mut Vec<Record>) {
        if self.frags.holds_any() {
            self.tick(packet.ts_ns, out);
        }
        match (packet.transport, packet.frag) {
            (Transport::Udp, None) => {
                let body = self.udp_body(&packet);
                out.push(Record {
                    packet,
                    body,
                    missing: None,
                });
            }
            (Transport::Udp, Some(f)) if packet.hook == Hook::Drop => {
                self.dropped_fragment(packet, f, out);
            }
            (Transport::Udp, Some(_)) => {
                let mut done = Vec::new();
                self.frags.push(packet, &mut done);
                self.finish(done, out);
            }
            (Transport::Tcp { .. }, _) => self.tcp(packet, out),
        }
    }

    /// Kernel time has reached `now_ns`: fragmented datagrams past their
    /// time are given up, each said where its first fragment was seen.
    pub fn tick(&mut self, now_ns: u64, out: &mut Vec<Record>) {
        let mut done = Vec::new();
        self.frags.expire(now_ns, &mut done);
        self.finish(done, out);
    }

    /// A UDP packet on its own: a whole datagram, or a fragment that went
    /// no further.
    fn whole_udp(&mut self, packet: Packet, out: &mut Vec<Record>) {
        let body = self.udp_body(&packet);
        out.push(Record {
            packet,
            body,
            missing: None,
        });
    }

    #[inline]
    fn udp_body(&mut self, packet: &Packet) -> Body {
        // A first fragment alone holds part of the payload, cut or not.
        if packet.truncated || packet.frag.is_some() {
            cut_payload(packet)
        } else {
            self.udp(&packet.payload)
        }
    }

    /// A fragment the kernel dropped. The first one reads as any cut
    /// payload; a later one carries no DNS, and is shown with its
    /// datagram's message as its first fragment had it, when that was seen.
    fn dropped_fragment(&mut self, packet: Packet, f: Fragment, out: &mut Vec<Record>) {
        let first = self.frags.dropped(&packet);
        if f.is_first() {
            return self.whole_udp(packet, out);
        }
        if let Some(body) = first.map(cut_message) {
            out.push(Record {
                packet,
                body,
                missing: None,
            });
        }
    }

    fn finish(&mut self, done: Vec<frag::Done>, out: &mut Vec<Record>) {
        for d in done {
            out.push(match d {
                frag::Done::Whole(packet) => Record {
                    body: self.udp(&packet.payload),
                    packet,
                    missing: None,
                },
                frag::Done::Cut(packet, missing) => Record {
                    body: cut_message(&packet),
                    packet,
                    missing: Some(Box::new(missing)),
                },
            });
        }
    }

    fn tcp(&mut self, packet: Packet, out: &mut Vec<Record>) {
        for piece in self.tcp.push(&packet) {
            let body = match piece {
                tcp::Piece::Message(msg) => parse(&msg),
                tcp::Piece::Gap(reason) => Body::Gap { reason },
            };
            out.push(Record {
                packet: packet.without_payload(),
                body,
                missing: None,
            });
        }
    }

    /// TCP streams dropped because too many were open at once.
    pub fn evicted_streams(&self) -> u64 {
        self.tcp.evicted()
    }

    /// Fragmented datagrams given up at a hook point: timed out, or their
    /// fragments inconsistent (overlapping, past the announced length).
    pub fn incomplete_datagrams(&self) -> u64 {
        self.frags.given_up()
    }

    /// Fragmented datagrams given up because too many were held at once.
    pub fn evicted_datagrams(&self) -> u64 {
        self.frags.evicted()
    }
}

/// Parses a DNS message: the common kind straight from the wire, the
/// rest with hickory; anything hickory rejects becomes `Malformed`.
pub fn parse(payload: &[u8]) -> Body {
    match wire::common(payload) {
        Some(msg) => Body::Dns(std::sync::Arc::new(msg)),
        None => dns::hickory(payload),
    }
}

/// A payload the capture cut: the message may still be whole in what it
/// kept (the rest padding); otherwise its header and questions, never what
/// reading past the cut made of it.
fn cut_payload(packet: &Packet) -> Body {
    match parse(&packet.payload) {
        Body::Dns(msg) if msg.malformed.is_none() => Body::Dns(msg),
        _ => cut_message(packet),
    }
}

/// The message of a datagram not all there, from its first fragment:
/// never whole, whatever that fragment holds.
fn cut_message(packet: &Packet) -> Body {
    match dns::header_and_questions(&packet.payload) {
        Some(msg) => Body::Cut(Arc::new(msg)),
        None => Body::Malformed {
            reason: format!(
                "payload cut at {} of {} bytes",
                packet.payload.len(),
                packet.payload_len
            ),
            len: packet.payload_len as usize,
        },
    }
}

impl Packet {
    fn without_payload(&self) -> Packet {
        Packet {
            payload: Bytes::new(),
            ..self.clone()
        }
    }
}
