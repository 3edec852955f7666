//! Bytes to typed records: kernel events to packets, packets to DNS messages.
pub mod dns;
pub mod kernel;
pub mod packet;
pub mod tcp;
pub mod wire;

pub use dns::DnsMessage;
pub use kernel::KernelNames;
pub use packet::{Conntrack, CtTuple, Dropped, Packet, Transport};

use std::sync::Arc;

use bytes::Bytes;
use foldhash::fast::FixedState;
use serde::Serialize;

/// What one DNS payload turned out to be.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Body {
    /// Shared: one message is seen at many hooks and decoded once.
    Dns(Arc<DnsMessage>),
    /// Not a DNS message: why, and how many bytes there were.
    Malformed { reason: String, len: usize },
}

/// One decoded DNS message (or malformed payload) with the packet that carried it.
#[derive(Clone, Debug)]
pub struct Record {
    pub packet: Packet,
    pub body: Body,
}

/// Recently decoded UDP payloads: a message crosses several hooks (pod,
/// veth, bridge, CoreDNS) within microseconds, and is parsed only once.
const RECENT: usize = 64;

/// Turns packets into records: UDP payloads directly, TCP through reassembly.
pub struct Decoder {
    tcp: tcp::Reassembler,
    recent: Vec<(u64, Bytes, Arc<DnsMessage>)>,
    next: usize,
    hasher: FixedState,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new(tcp::Limits::default())
    }
}

impl Decoder {
    pub fn new(limits: tcp::Limits) -> Self {
        Self {
            tcp: tcp::Reassembler::new(limits),
            recent: Vec::with_capacity(RECENT),
            next: 0,
            hasher: FixedState::default(),
        }
    }

    /// A whole UDP payload, parsed or found among the recent ones.
    fn udp(&mut self, payload: &Bytes) -> Body {
        use std::hash::BuildHasher as _;
        let hash = self.hasher.hash_one(payload.as_ref());
        if let Some((_, _, msg)) = self
            .recent
            .iter()
            .find(|(h, p, _)| *h == hash && p == payload)
        {
            return Body::Dns(msg.clone());
        }
        let body = dns::parse(payload);
        if let Body::Dns(msg) = &body {
            let entry = (hash, payload.clone(), msg.clone());
            if self.recent.len() < RECENT {
                self.recent.push(entry);
            } else {
                self.recent[self.next] = entry;
                self.next = (self.next + 1) % RECENT;
            }
        }
        body
    }

    pub fn decode(&mut self, packet: Packet, out: &mut Vec<Record>) {
        match packet.transport {
            Transport::Udp => {
                let body = if packet.truncated {
                    cut_payload(&packet)
                } else {
                    self.udp(&packet.payload)
                };
                out.push(Record { packet, body });
            }
            Transport::Tcp { .. } => {
                for piece in self.tcp.push(&packet) {
                    let body = match piece {
                        tcp::Piece::Message(msg) => dns::parse(&msg),
                        tcp::Piece::Gap(reason) => Body::Malformed {
                            reason,
                            len: packet.payload_len as usize,
                        },
                    };
                    out.push(Record {
                        packet: packet.without_payload(),
                        body,
                    });
                }
            }
        }
    }

    /// TCP streams dropped because too many were open at once.
    pub fn evicted_streams(&self) -> u64 {
        self.tcp.evicted()
    }
}

fn cut_payload(packet: &Packet) -> Body {
    // A cut UDP payload still shows its header and question most of the time.
    match dns::parse(&packet.payload) {
        Body::Dns(msg) => Body::Dns(msg),
        Body::Malformed { .. } => Body::Malformed {
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
