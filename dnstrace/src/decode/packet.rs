//! Kernel packet events, decoded with checks into `Packet`.
use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::Arc,
};

use bytes::Bytes;
use dnstrace_common::{
    decode_packet, DecodeError, Hook, PacketMeta, FLAG_CONNTRACK, FLAG_FRAGMENT,
    FLAG_MORE_FRAGMENTS, FLAG_TRUNCATED,
};
use serde::Serialize;

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp { seq: u32, flags: u8 },
}

/// Which node a packet was seen on, among the recordings of a merged
/// replay: 0 for none named (a live capture, one file), else the node's
/// place in the replay's list plus one. Namespace inodes and device
/// indexes are a node's own: two nodes' may be the same numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u16);

/// A DNS packet seen by a hook.
#[derive(Clone, Debug)]
pub struct Packet {
    /// CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
    pub node: NodeId,
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
    /// Where the packet sits in a fragmented IP datagram, if it is a
    /// fragment. A later one (offset > 0) carries the first one's ports and
    /// fragment data in `payload`, not a UDP payload.
    pub frag: Option<Fragment>,
    pub payload: Bytes,
    /// The device name, for hooks that see every device; shared (see
    /// `Interned`).
    pub ifname: Option<Arc<str>>,
    /// Boxed: a third of hops have one, and a packet is moved several
    /// times on its way to a leg.
    pub ct: Option<Box<Conntrack>>,
    pub drop: Option<Dropped>,
    /// The tunnel it was captured inside, on a node's underlay. Boxed:
    /// only captures have any.
    pub underlay: Option<Box<Underlay>>,
}

impl Packet {
    /// Its IP packet's length as its headers make it (without IP or TCP
    /// options; a reassembled datagram's whole): what a path's MTU limits.
    /// The device's length (`wire_len`) counts a link-layer header on some
    /// hooks and not on others.
    pub fn ip_len(&self) -> u16 {
        let ip = if self.src.is_ipv4() { 20 } else { 40 };
        let l4 = match self.transport {
            Transport::Udp => 8,
            Transport::Tcp { .. } => 20,
        };
        u16::try_from(self.payload_len.saturating_add(ip + l4)).unwrap_or(u16::MAX)
    }
}

/// An encapsulation between nodes, as an underlay capture shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tunnel {
    Vxlan,
    Geneve,
    /// IP in IP (IPv4 or IPv6 inside IPv4 or IPv6).
    Ipip,
    Gre,
}

impl Tunnel {
    pub fn name(self) -> &'static str {
        match self {
            Self::Vxlan => "vxlan",
            Self::Geneve => "geneve",
            Self::Ipip => "ipip",
            Self::Gre => "gre",
        }
    }
}

/// The outer packet a DNS message was carried in: the two nodes (tunnel
/// endpoints) it crossed between.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Underlay {
    pub tunnel: Tunnel,
    pub src: IpAddr,
    pub dst: IpAddr,
    /// VXLAN's or Geneve's network identifier, GRE's key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vni: Option<u32>,
}

impl std::fmt::Display for Underlay {
    /// `vxlan node 192.168.0.1 → node 192.168.0.2 (vni 1)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (tunnel, src, dst) = (self.tunnel.name(), self.src, self.dst);
        write!(f, "{tunnel} node {src} → node {dst}")?;
        match self.vni {
            Some(vni) if self.tunnel == Tunnel::Gre => write!(f, " (key {vni})"),
            Some(vni) => write!(f, " (vni {vni})"),
            None => Ok(()),
        }
    }
}

/// A packet's place in a fragmented IP datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Fragment {
    /// The IP identification (IPv6: of the fragment header).
    pub id: u32,
    /// Byte offset of the fragment's data in the datagram (0 for the
    /// first, whose data starts with the UDP header).
    pub offset: u16,
    /// IP's MF bit: more fragments follow.
    pub more: bool,
}

impl Fragment {
    /// The first fragment carries the UDP header (and the ports).
    pub fn is_first(&self) -> bool {
        self.offset == 0
    }
}

/// One direction of a conntrack entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtTuple {
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

/// The conntrack entry a packet carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conntrack {
    pub original: CtTuple,
    pub reply: CtTuple,
    pub status: u32,
    /// The packet travels in the reply direction.
    pub is_reply: bool,
}

impl Conntrack {
    const DST_NAT: u32 = 1 << 5;
    const SRC_NAT: u32 = 1 << 4;

    /// The destination rewrite: (what the client asked, who answers).
    pub fn dnat(&self) -> Option<(SocketAddr, SocketAddr)> {
        (self.status & Self::DST_NAT != 0 || self.original.dst != self.reply.src)
            .then_some((self.original.dst, self.reply.src))
    }

    /// The source rewrite: (the real source, what the peer sees).
    pub fn snat(&self) -> Option<(SocketAddr, SocketAddr)> {
        (self.status & Self::SRC_NAT != 0 || self.original.src != self.reply.dst)
            .then_some((self.original.src, self.reply.dst))
    }
}

/// Where and why the kernel dropped a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dropped {
    pub reason: u32,
    pub location: u64,
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
    /// The device's name: reported by the hook, or among the `known` (the
    /// --iface ones), or else its index.
    pub fn device_name(&self, known: &HashMap<u32, String>) -> String {
        device_name(self.ifname.as_deref(), self.ifindex, known)
    }

    pub fn from_event(buf: &[u8], seen: &mut Interned) -> Result<Self, EventError> {
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
            node: NodeId::default(),
            netns: meta.netns,
            ifindex: meta.ifindex,
            hook,
            src: SocketAddr::new(src, meta.sport),
            dst: SocketAddr::new(dst, meta.dport),
            transport,
            wire_len: meta.wire_len,
            payload_len: meta.payload_len,
            truncated: meta.flags & FLAG_TRUNCATED != 0,
            frag: (meta.flags & FLAG_FRAGMENT != 0).then_some(Fragment {
                id: meta.frag_id,
                offset: meta.frag_offset,
                more: meta.flags & FLAG_MORE_FRAGMENTS != 0,
            }),
            payload: seen.payloads.get(payload),
            ifname: seen.names.get(&meta.ifname),
            ct: (meta.flags & FLAG_CONNTRACK != 0)
                .then(|| conntrack(&meta))
                .flatten()
                .map(Box::new),
            drop: (hook == Hook::Drop).then_some(Dropped {
                reason: meta.drop_reason,
                location: meta.drop_location,
            }),
            underlay: None,
        })
    }
}

/// A device's name: `reported` by the hook, or among the `known`, or else
/// its index.
pub(super) fn device_name(
    reported: Option<&str>,
    ifindex: u32,
    known: &HashMap<u32, String>,
) -> String {
    reported
        .map(str::to_owned)
        .or_else(|| known.get(&ifindex).cloned())
        .unwrap_or_else(|| format!("if{ifindex}"))
}

/// What repeats from event to event, each made once: a few devices'
/// names, and the payload of a message seen at each of its hooks.
#[derive(Default)]
pub struct Interned {
    names: IfNames,
    payloads: Payloads,
}

/// Device names as events carry them, each turned into text once: every
/// event names one of a few devices, and a `String` each was an allocation
/// per packet.
#[derive(Default)]
struct IfNames(HashMap<u128, Arc<str>, foldhash::fast::RandomState>);

impl IfNames {
    /// Names kept at most: pods come and go, and past this the table
    /// starts again.
    const MAX: usize = 4096;

    /// The NUL-padded name `raw`, or none if empty.
    fn get(&mut self, raw: &[u8; 16]) -> Option<Arc<str>> {
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        if end == 0 {
            return None;
        }
        // What follows the NUL may be left from an older, longer name. The
        // key is masked in a register: a copy into a cleared array stalled
        // each lookup on reading back bytes it had just stored.
        let key = u128::from_le_bytes(*raw) & (u128::MAX >> (8 * (raw.len() - end)));
        if let Some(name) = self.0.get(&key) {
            return Some(name.clone());
        }
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        let name: Arc<str> = String::from_utf8_lossy(&raw[..end]).into();
        self.0.insert(key, name.clone());
        Some(name)
    }
}

/// Places for recent payloads, by hash.
const PAYLOADS: usize = 256;

/// Recent payloads, each by its hash in one place: a message crosses
/// several hooks within microseconds, and each of its events after the
/// first shares the first one's bytes instead of allocating a copy.
struct Payloads {
    hasher: foldhash::fast::FixedState,
    places: Vec<Option<(u64, Bytes)>>,
}

impl Default for Payloads {
    fn default() -> Self {
        Self {
            hasher: foldhash::fast::FixedState::default(),
            places: vec![None; PAYLOADS],
        }
    }
}

impl Payloads {
    fn get(&mut self, payload: &[u8]) -> Bytes {
        use std::hash::BuildHasher as _;
        let hash = self.hasher.hash_one(payload);
        let place = &mut self.places[hash as usize % PAYLOADS];
        match place {
            Some((h, bytes)) if *h == hash && bytes.as_ref() == payload => bytes.clone(),
            _ => {
                let bytes = Bytes::copy_from_slice(payload);
                *place = Some((hash, bytes.clone()));
                bytes
            }
        }
    }
}

fn conntrack(meta: &PacketMeta) -> Option<Conntrack> {
    let ct = &meta.ct;
    Some(Conntrack {
        original: tuple(&ct.original)?,
        reply: tuple(&ct.reply)?,
        status: ct.status,
        is_reply: ct.ctinfo >= 3,
    })
}

/// AF_INET 2, AF_INET6 10.
fn tuple(t: &dnstrace_common::CtTuple) -> Option<CtTuple> {
    let ip = |a: &[u8; 16]| match t.l3num {
        2 => Some(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))),
        10 => Some(IpAddr::V6(Ipv6Addr::from(*a))),
        _ => None,
    };
    Some(CtTuple {
        src: SocketAddr::new(ip(&t.src)?, t.sport),
        dst: SocketAddr::new(ip(&t.dst)?, t.dport),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn t(src: &str, dst: &str) -> CtTuple {
        CtTuple {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
        }
    }

    /// One shared name per device, whatever an older name left after the
    /// NUL; the table stays bounded however many devices come and go.
    #[test]
    fn device_names_are_made_once_and_kept_bounded() {
        let mut names = IfNames::default();
        let raw = |text: &[u8]| {
            let mut r = [0u8; 16];
            r[..text.len()].copy_from_slice(text);
            r
        };
        let eth0 = names.get(&raw(b"eth0")).unwrap();
        let renamed = names.get(&raw(b"eth0\0ab1234")).unwrap();
        assert_eq!(&*eth0, "eth0");
        assert!(Arc::ptr_eq(&eth0, &renamed));
        assert_eq!(names.get(&[0; 16]), None);
        for i in 0..3 * IfNames::MAX {
            names.get(&raw(format!("veth{i}").as_bytes()));
        }
        assert!(names.0.len() <= IfNames::MAX);
        let longest = names.get(b"vethabcdef012345").unwrap();
        assert_eq!(&*longest, "vethabcdef012345");
        assert_eq!(&*names.get(&raw(b"v")).unwrap(), "v");
    }

    /// A message's events share one copy of its bytes; other bytes in the
    /// same place get their own.
    #[test]
    fn a_payload_seen_again_shares_its_bytes() {
        let mut payloads = Payloads::default();
        let first = payloads.get(b"\x12\x34query");
        let again = payloads.get(b"\x12\x34query");
        assert_eq!(first.as_ptr(), again.as_ptr());
        let other = payloads.get(b"\x12\x35query");
        assert_eq!(other.as_ref(), b"\x12\x35query");
        assert_ne!(other.as_ptr(), first.as_ptr());
        for i in 0..4 * PAYLOADS {
            let bytes = i.to_be_bytes();
            assert_eq!(payloads.get(&bytes).as_ref(), bytes);
        }
        assert_eq!(payloads.places.len(), PAYLOADS);
    }

    #[test]
    fn nat_is_read_from_the_tuples() {
        // kube-proxy's DNAT: asked 10.96.0.10, answered by 10.244.0.53.
        let ct = Conntrack {
            original: t("10.244.0.10:4000", "10.96.0.10:53"),
            reply: t("10.244.0.53:53", "10.244.0.10:4000"),
            status: 1 << 5,
            is_reply: false,
        };
        assert_eq!(
            ct.dnat(),
            Some((
                "10.96.0.10:53".parse().unwrap(),
                "10.244.0.53:53".parse().unwrap()
            ))
        );
        assert_eq!(ct.snat(), None);
        // The node's masquerade towards the upstream.
        let masq = Conntrack {
            original: t("10.244.0.53:3300", "198.51.100.53:53"),
            reply: t("198.51.100.53:53", "198.51.100.1:3300"),
            status: 1 << 4,
            is_reply: true,
        };
        assert_eq!(masq.dnat(), None);
        assert_eq!(
            masq.snat().map(|(_, seen)| seen),
            Some("198.51.100.1:3300".parse().unwrap())
        );
    }
}
