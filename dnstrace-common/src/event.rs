//! The wire layout of events sent from the kernel, and their checked decoding.

/// Bumped whenever the layout of any event changes.
pub const SCHEMA_VERSION: u16 = 3;

/// Most payload bytes a packet event carries in the ring; DNS over UDP fits.
pub const PAYLOAD_MAX: usize = 4096;

/// Most payload bytes of a TCP segment the tracepoints send apart (see
/// [`FLAG_PAYLOAD_APART`]): a DNS message over TCP is at most 65,535 bytes,
/// and the larger part of one segment is kept.
pub const APART_MAX: usize = 32 << 10;

/// The head of a payload sent apart, before the skb's bytes: which ring
/// event it belongs to, and where in the bytes that follow the payload starts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApartHead {
    /// The event's `apart_seq` on the CPU in `cpu`.
    pub seq: u32,
    pub cpu: u32,
    /// Offset of the payload in the skb's bytes (from `skb->data`).
    pub start: u32,
    /// Bytes of the skb copied, payload included.
    pub len: u32,
}

pub const APART_HEAD_SIZE: usize = core::mem::size_of::<ApartHead>();

/// Event kinds. Ids are never reused: a removed kind leaves a hole here.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A DNS packet seen by a hook ([`PacketMeta`] followed by its payload).
    Packet = 1,
}

impl EventKind {
    pub const fn from_u16(v: u16) -> Option<Self> {
        match v {
            1 => Some(Self::Packet),
            _ => None,
        }
    }
}

/// Where a packet was seen. Ids are never reused.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    TcIngress = 1,
    TcEgress = 2,
    /// `net_dev_start_xmit`: a device is about to send it.
    DevXmit = 3,
    /// `netif_receive_skb`: a device has received it.
    DevReceive = 4,
    /// `kfree_skb`: the kernel dropped it.
    Drop = 5,
    /// kprobe `nf_nat_manip_pkt`: NAT is about to rewrite it (headers as before).
    NatRewrite = 6,
    /// kretprobe `__nf_conntrack_confirm` returned NF_DROP: its entry could not be inserted.
    CtInsertFailed = 7,
    /// kprobe `nf_ct_resolve_clash`: its entry clashed with another one.
    CtClash = 8,
}

impl Hook {
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::TcIngress),
            2 => Some(Self::TcEgress),
            3 => Some(Self::DevXmit),
            4 => Some(Self::DevReceive),
            5 => Some(Self::Drop),
            6 => Some(Self::NatRewrite),
            7 => Some(Self::CtInsertFailed),
            8 => Some(Self::CtClash),
            _ => None,
        }
    }

    /// The hook's stable name in output and recordings.
    pub const fn name(self) -> &'static str {
        match self {
            Self::TcIngress => "tc_ingress",
            Self::TcEgress => "tc_egress",
            Self::DevXmit => "dev_xmit",
            Self::DevReceive => "dev_receive",
            Self::Drop => "kfree_skb",
            Self::NatRewrite => "nat_rewrite",
            Self::CtInsertFailed => "ct_insert_failed",
            Self::CtClash => "ct_clash",
        }
    }

    /// Which way the packet went through a device, or what happened to it.
    pub const fn direction(self) -> Direction {
        match self {
            Self::TcIngress | Self::DevReceive => Direction::Ingress,
            Self::TcEgress | Self::DevXmit => Direction::Egress,
            Self::Drop | Self::CtInsertFailed => Direction::Drop,
            Self::NatRewrite => Direction::Nat,
            Self::CtClash => Direction::Clash,
        }
    }
}

/// Which way a hook saw a packet go through a device, or what happened to
/// it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Ingress,
    Egress,
    Drop,
    Nat,
    Clash,
}

impl Direction {
    /// Its name in JSON and recordings.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
            Self::Drop => "drop",
            Self::Nat => "nat",
            Self::Clash => "clash",
        }
    }

    /// Through a device, one way or the other.
    pub const fn through_device(self) -> bool {
        matches!(self, Self::Ingress | Self::Egress)
    }
}

/// A conntrack tuple, in network byte order as the kernel keeps it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtTuple {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub l3num: u16,
    pub proto: u8,
    pub _pad: u8,
}

/// The conntrack entry attached to a packet, when it has one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtInfo {
    pub original: CtTuple,
    pub reply: CtTuple,
    /// `IPS_*` status bits (CONFIRMED 3, SRC_NAT 4, DST_NAT 5...).
    pub status: u32,
    /// `skb->_nfct & 7`: 3 and above is the reply direction.
    pub ctinfo: u8,
    pub _pad: [u8; 3],
}

/// Struct offsets in the running kernel, found in its BTF by user space and
/// handed to the tracepoint programs as a global (all 0 until then).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub skb_head: u32,
    pub skb_data: u32,
    pub skb_len: u32,
    pub skb_data_len: u32,
    pub skb_protocol: u32,
    pub skb_network_header: u32,
    pub skb_dev: u32,
    pub dev_ifindex: u32,
    pub dev_name: u32,
    pub dev_nd_net: u32,
    pub net_ns_inum: u32,
    /// `skb->sk`, and a socket's namespace (`sock.__sk_common.skc_net`):
    /// where a packet's device field holds something else (a UDP packet
    /// queued at its socket keeps scratch there).
    pub skb_sk: u32,
    pub sk_net: u32,
    /// 0 when conntrack fields were not found: events then carry no entry.
    pub skb_nfct: u32,
    pub ct_status: u32,
    pub ct_tuple_original: u32,
    pub ct_tuple_reply: u32,
    pub tuple_src_u3: u32,
    pub tuple_src_port: u32,
    pub tuple_l3num: u32,
    pub tuple_dst_u3: u32,
    pub tuple_dst_port: u32,
    pub tuple_protonum: u32,
    /// Bytes from the original tuple to the end of the status: one read
    /// (at most [`CT_SPAN_MAX`]).
    pub ct_span: u32,
}

/// Most bytes of an `nf_conn` read at once: both tuples and the status.
pub const CT_SPAN_MAX: usize = 128;

impl KernelOffsets {
    pub const UNSET: Self = Self {
        skb_head: 0,
        skb_data: 0,
        skb_len: 0,
        skb_data_len: 0,
        skb_protocol: 0,
        skb_network_header: 0,
        skb_dev: 0,
        dev_ifindex: 0,
        dev_name: 0,
        dev_nd_net: 0,
        net_ns_inum: 0,
        skb_sk: 0,
        sk_net: 0,
        skb_nfct: 0,
        ct_status: 0,
        ct_tuple_original: 0,
        ct_tuple_reply: 0,
        tuple_src_u3: 0,
        tuple_src_port: 0,
        tuple_l3num: 0,
        tuple_dst_u3: 0,
        tuple_dst_port: 0,
        tuple_protonum: 0,
        ct_span: 0,
    };
}

/// First bytes of every event.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventHeader {
    pub kind: u16,
    pub version: u16,
    /// Size of the whole event in bytes, header and trailing payload included.
    pub size: u32,
}

/// `PacketMeta::flags`: fewer payload bytes were captured than the packet holds.
pub const FLAG_TRUNCATED: u8 = 1;
/// `PacketMeta::flags`: the packet is a fragment of an IP datagram (at
/// `frag_offset`; the first one at 0). A later fragment carries no ports:
/// its event has those of the first, and its payload is the fragment's data.
pub const FLAG_FRAGMENT: u8 = 2;
/// `PacketMeta::flags`: `ct` holds the packet's conntrack entry.
pub const FLAG_CONNTRACK: u8 = 4;
/// `PacketMeta::flags`: more fragments follow this one (IP's MF).
pub const FLAG_MORE_FRAGMENTS: u8 = 8;
/// `PacketMeta::flags`: the payload in the skb's pages was sent apart, on the
/// `PAYLOADS` perf buffer of `cpu`, under `apart_seq` (BTF tracepoints have
/// no helper that reads an skb's pages into the ring).
pub const FLAG_PAYLOAD_APART: u8 = 16;

/// A DNS packet as seen by a hook; `cap_len` payload bytes follow it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketMeta {
    pub header: EventHeader,
    /// CLOCK_MONOTONIC nanoseconds (`bpf_ktime_get_ns`).
    pub ts_ns: u64,
    /// Inode number of the network namespace of the device.
    pub netns: u32,
    pub ifindex: u32,
    /// Length of the packet on the wire (`skb->len`).
    pub wire_len: u32,
    /// L4 payload length the headers announce.
    pub payload_len: u32,
    /// Source and destination; IPv4 addresses use the first 4 bytes.
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub tcp_seq: u32,
    /// 4 or 6.
    pub ip_version: u8,
    /// IPPROTO_UDP or IPPROTO_TCP.
    pub l4_proto: u8,
    /// A [`Hook`].
    pub hook: u8,
    /// `FLAG_*` bits.
    pub flags: u8,
    pub tcp_flags: u8,
    pub _pad: u8,
    /// Payload bytes that follow this struct.
    pub cap_len: u16,
    /// Device name (tracepoint hooks), NUL-padded.
    pub ifname: [u8; 16],
    /// For `Hook::Drop`: the kernel's `skb_drop_reason` and where it dropped.
    pub drop_reason: u32,
    /// The IP datagram's identification (IPv6: of its fragment header),
    /// for fragments.
    pub frag_id: u32,
    pub drop_location: u64,
    /// Byte offset of a fragment's data in its datagram.
    pub frag_offset: u16,
    /// The CPU that sent a payload apart, and its sequence there.
    pub cpu: u16,
    pub apart_seq: u32,
    pub ct: CtInfo,
}

/// Size of [`PacketMeta`] on the wire.
pub const PACKET_META_SIZE: usize = core::mem::size_of::<PacketMeta>();

/// Why a byte buffer is not a valid event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    TooShort { need: usize, have: usize },
    UnknownKind(u16),
    Version { found: u16, expected: u16 },
    SizeMismatch { header: u32, have: usize },
    BadPayload { cap_len: u16, left: usize },
}

impl core::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::TooShort { need, have } => {
                write!(f, "event too short: {have} bytes, need {need}")
            }
            Self::UnknownKind(k) => write!(f, "unknown event kind {k}"),
            Self::Version { found, expected } => {
                write!(
                    f,
                    "event schema version {found}, this dnstrace reads {expected}"
                )
            }
            Self::SizeMismatch { header, have } => {
                write!(f, "event header says {header} bytes, buffer has {have}")
            }
            Self::BadPayload { cap_len, left } => {
                write!(f, "event announces {cap_len} payload bytes, {left} present")
            }
        }
    }
}

/// Reads the header of an event, checking kind and schema version.
pub fn decode_header(buf: &[u8]) -> Result<(EventKind, EventHeader), DecodeError> {
    let header: EventHeader = read(buf)?;
    let kind = EventKind::from_u16(header.kind).ok_or(DecodeError::UnknownKind(header.kind))?;
    if header.version != SCHEMA_VERSION {
        return Err(DecodeError::Version {
            found: header.version,
            expected: SCHEMA_VERSION,
        });
    }
    if header.size as usize > buf.len() {
        return Err(DecodeError::SizeMismatch {
            header: header.size,
            have: buf.len(),
        });
    }
    Ok((kind, header))
}

/// Decodes a packet event into its metadata and captured payload.
pub fn decode_packet(buf: &[u8]) -> Result<(PacketMeta, &[u8]), DecodeError> {
    let (_, header) = decode_header(buf)?;
    let meta: PacketMeta = read(buf)?;
    let event = &buf[..header.size as usize];
    let payload = event.get(PACKET_META_SIZE..).unwrap_or_default();
    let payload = payload
        .get(..meta.cap_len as usize)
        .ok_or(DecodeError::BadPayload {
            cap_len: meta.cap_len,
            left: payload.len(),
        })?;
    Ok((meta, payload))
}

/// Copies a `#[repr(C)]` plain-data value out of the front of `buf`.
fn read<T: Copy>(buf: &[u8]) -> Result<T, DecodeError> {
    let need = core::mem::size_of::<T>();
    if buf.len() < need {
        return Err(DecodeError::TooShort {
            need,
            have: buf.len(),
        });
    }
    // SAFETY: length checked above; T is plain data made only of integers and
    // byte arrays, for which every bit pattern is valid.
    Ok(unsafe { core::ptr::read_unaligned(buf.as_ptr().cast::<T>()) })
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain `#[repr(C)]` data without implicit padding.
    unsafe impl aya::Pod for super::PacketMeta {}
    // SAFETY: plain `#[repr(C)]` u32 fields.
    unsafe impl aya::Pod for super::KernelOffsets {}
    // SAFETY: plain `#[repr(C)]` u32 fields.
    unsafe impl aya::Pod for super::ApartHead {}
    // SAFETY: plain `#[repr(C)]` u32 fields.
    unsafe impl aya::Pod for crate::TargetFilter {}
    // SAFETY: plain `#[repr(C)]` u32 fields.
    unsafe impl aya::Pod for crate::IfaceConfig {}
}

// The layouts are shared with the kernel programs: no implicit padding allowed.
const _: () = assert!(core::mem::size_of::<CtTuple>() == 40);
const _: () = assert!(core::mem::size_of::<CtInfo>() == 88);
const _: () = assert!(core::mem::size_of::<PacketMeta>() == 80 + 40 + 88);
const _: () = assert!(APART_HEAD_SIZE == 16);
// The programs clear the name as two words and read addresses as four.
const _: () = assert!(core::mem::offset_of!(PacketMeta, ifname) % 8 == 0);
const _: () = assert!(core::mem::offset_of!(PacketMeta, saddr) % 4 == 0);
const _: () = assert!(core::mem::offset_of!(PacketMeta, daddr) % 4 == 0);
const _: () = assert!(
    (core::mem::offset_of!(PacketMeta, ct) + core::mem::offset_of!(CtInfo, original)) % 4 == 0
);
const _: () = assert!(core::mem::offset_of!(CtTuple, src) % 4 == 0);

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    fn packet(cap_len: u16, payload: &[u8]) -> Vec<u8> {
        let meta = PacketMeta {
            header: EventHeader {
                kind: EventKind::Packet as u16,
                version: SCHEMA_VERSION,
                size: (PACKET_META_SIZE + payload.len()) as u32,
            },
            ts_ns: 1,
            netns: 2,
            ifindex: 3,
            wire_len: 4,
            payload_len: payload.len() as u32,
            saddr: [1; 16],
            daddr: [2; 16],
            sport: 53,
            dport: 5353,
            tcp_seq: 0,
            ip_version: 4,
            l4_proto: 17,
            hook: Hook::TcEgress as u8,
            flags: 0,
            tcp_flags: 0,
            _pad: 0,
            cap_len,
            ifname: [0; 16],
            drop_reason: 0,
            frag_id: 0,
            drop_location: 0,
            frag_offset: 0,
            cpu: 0,
            apart_seq: 0,
            ct: CtInfo::default(),
        };
        // SAFETY: reading the bytes of a plain-data struct.
        let raw = unsafe {
            core::slice::from_raw_parts((&meta as *const PacketMeta).cast::<u8>(), PACKET_META_SIZE)
        };
        let mut buf = raw.to_vec();
        buf.extend_from_slice(payload);
        buf
    }

    #[test]
    fn round_trip() {
        let buf = packet(3, b"abc");
        let (meta, payload) = decode_packet(&buf).unwrap();
        assert_eq!(meta.dport, 5353);
        assert_eq!(payload, b"abc");
    }

    #[test]
    fn rejects_short_unknown_and_lying_events() {
        assert!(matches!(
            decode_packet(&[0; 4]),
            Err(DecodeError::TooShort { .. })
        ));
        let mut buf = packet(3, b"abc");
        buf[0] = 99;
        assert_eq!(decode_packet(&buf), Err(DecodeError::UnknownKind(99)));
        let mut buf = packet(3, b"abc");
        buf[2] = 7;
        assert!(matches!(
            decode_packet(&buf),
            Err(DecodeError::Version { found: 7, .. })
        ));
        let buf = packet(200, b"abc");
        assert!(matches!(
            decode_packet(&buf),
            Err(DecodeError::BadPayload { .. })
        ));
        let buf = packet(3, b"abc");
        assert!(matches!(
            decode_packet(&buf[..buf.len() - 1]),
            Err(DecodeError::SizeMismatch { .. })
        ));
    }
}
