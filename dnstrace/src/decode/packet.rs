//! Kernel packet events, decoded with checks into `Packet`.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::Bytes;
use dnstrace_common::{
    decode_packet, DecodeError, Hook, PacketMeta, FLAG_FRAGMENT, FLAG_TRUNCATED,
};

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp { seq: u32, flags: u8 },
}

/// A DNS packet seen by a hook.
#[derive(Clone, Debug)]
pub struct Packet {
    /// CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
    pub netns: u32,
    pub ifindex: u32,
    pub hook: Hook,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub transport: Transport,
    pub wire_len: u32,
    /// L4 payload length the headers announce.
    pub payload_len: u32,
    /// Fewer bytes captured than the packet held.
    pub truncated: bool,
    pub fragment: bool,
    pub payload: Bytes,
}

/// Why an event could not become a packet.
#[derive(Debug, PartialEq, Eq)]
pub enum EventError {
    Decode(DecodeError),
    Field(&'static str, u32),
}

impl std::fmt::Display for EventError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Decode(e) => e.fmt(f),
            Self::Field(name, v) => write!(f, "event has invalid {name} {v}"),
        }
    }
}

impl Packet {
    pub fn from_event(buf: &[u8]) -> Result<Self, EventError> {
        let (meta, payload) = decode_packet(buf).map_err(EventError::Decode)?;
        let hook = Hook::from_u8(meta.hook).ok_or(EventError::Field("hook", meta.hook.into()))?;
        let (src, dst) = addrs(&meta)?;
        let transport = match meta.l4_proto {
            IPPROTO_UDP => Transport::Udp,
            IPPROTO_TCP => Transport::Tcp {
                seq: meta.tcp_seq,
                flags: meta.tcp_flags,
            },
            p => return Err(EventError::Field("l4 protocol", p.into())),
        };
        Ok(Self {
            ts_ns: meta.ts_ns,
            netns: meta.netns,
            ifindex: meta.ifindex,
            hook,
            src: SocketAddr::new(src, meta.sport),
            dst: SocketAddr::new(dst, meta.dport),
            transport,
            wire_len: meta.wire_len,
            payload_len: meta.payload_len,
            truncated: meta.flags & FLAG_TRUNCATED != 0,
            fragment: meta.flags & FLAG_FRAGMENT != 0,
            payload: Bytes::copy_from_slice(payload),
        })
    }
}

fn addrs(meta: &PacketMeta) -> Result<(IpAddr, IpAddr), EventError> {
    match meta.ip_version {
        4 => {
            let v4 = |a: &[u8; 16]| IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]));
            Ok((v4(&meta.saddr), v4(&meta.daddr)))
        }
        6 => Ok((
            IpAddr::V6(Ipv6Addr::from(meta.saddr)),
            IpAddr::V6(Ipv6Addr::from(meta.daddr)),
        )),
        v => Err(EventError::Field("ip version", v.into())),
    }
}
