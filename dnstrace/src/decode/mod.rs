//! Bytes to typed records: kernel events to packets, packets to DNS messages.
pub mod dns;
pub mod kernel;
pub mod packet;
pub mod tcp;

pub use dns::DnsMessage;
pub use kernel::KernelNames;
pub use packet::{Conntrack, CtTuple, Dropped, Packet, Transport};

use bytes::Bytes;
use serde::Serialize;

/// What one DNS payload turned out to be.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Body {
    Dns(DnsMessage),
    /// Not a DNS message: why, and how many bytes there were.
    Malformed {
        reason: String,
        len: usize,
    },
}

/// One decoded DNS message (or malformed payload) with the packet that carried it.
#[derive(Clone, Debug)]
pub struct Record {
    pub packet: Packet,
    pub body: Body,
}

/// Turns packets into records: UDP payloads directly, TCP through reassembly.
pub struct Decoder {
    tcp: tcp::Reassembler,
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
        }
    }

    pub fn decode(&mut self, packet: Packet, out: &mut Vec<Record>) {
        match packet.transport {
            Transport::Udp => {
                let body = if packet.truncated {
                    cut_payload(&packet)
                } else {
                    dns::parse(&packet.payload)
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
