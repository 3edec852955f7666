//! The wire layout of events sent from the kernel, and their checked decoding.

/// Bumped whenever the layout of any event changes.
pub const SCHEMA_VERSION: u16 = 4;

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

/// A DNS packet as seen by a hook. On the wire it is sent in parts: its
/// fixed part (from `header` to `cap_len`), then each section its
/// `sections` bits name, in the order of [`SECTIONS`], then `cap_len`
/// payload bytes. A hop sends only what it has: most carry no conntrack
/// entry, and only drops a reason.
///
/// In memory the sections other than the name come first: in the kernel's
/// scratch event the fixed part, the name and the payload are then one run
/// of bytes, and a hop with none of the others is sent in one copy.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketMeta {
    /// [`SECTION_DROP`]: where the kernel dropped it, and its
    /// `skb_drop_reason`.
    pub drop_location: u64,
    pub drop_reason: u32,
    pub _pad_drop: u32,
    /// [`SECTION_FRAGMENT`]: the IP datagram's identification (IPv6: of its
    /// fragment header), and the fragment's data's byte offset in it.
    pub frag_id: u32,
    pub frag_offset: u16,
    pub _pad_frag: u16,
    /// [`SECTION_APART`]: the CPU that sent a payload apart, and its
    /// sequence there.
    pub apart_seq: u32,
    pub cpu: u16,
    pub _pad_apart: u16,
    /// [`SECTION_CONNTRACK`].
    pub ct: CtInfo,
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
    /// `SECTION_*` bits: the sections sent after the fixed part.
    pub sections: u8,
    /// Payload bytes that follow the sections.
    pub cap_len: u16,
    /// [`SECTION_NAME`]: the device's name (tracepoint hooks), NUL-padded.
    pub ifname: [u8; 16],
}

/// Size of a whole [`PacketMeta`], every section included.
pub const PACKET_META_SIZE: usize = core::mem::size_of::<PacketMeta>();

/// Where in a [`PacketMeta`] the part every event carries starts, and its
/// size: it comes first on the wire, before the sections.
pub const PACKET_FIXED_AT: usize = core::mem::offset_of!(PacketMeta, header);
pub const PACKET_FIXED_SIZE: usize = core::mem::offset_of!(PacketMeta, ifname) - PACKET_FIXED_AT;

/// Where a field of the fixed part, at `in_meta` in a [`PacketMeta`], lies
/// in an event's bytes.
pub const fn wire_offset(in_meta: usize) -> usize {
    in_meta - PACKET_FIXED_AT
}

pub const SECTION_NAME: u8 = 1;
pub const SECTION_DROP: u8 = 2;
pub const SECTION_FRAGMENT: u8 = 4;
pub const SECTION_APART: u8 = 8;
pub const SECTION_CONNTRACK: u8 = 16;

/// Each section: its bit, and where its bytes lie in a [`PacketMeta`]
/// (offset, length). On the wire they follow the fixed part in this order.
pub const SECTIONS: [(u8, usize, usize); 5] = [
    (SECTION_NAME, core::mem::offset_of!(PacketMeta, ifname), 16),
    (
        SECTION_DROP,
        core::mem::offset_of!(PacketMeta, drop_location),
        16,
    ),
    (
        SECTION_FRAGMENT,
        core::mem::offset_of!(PacketMeta, frag_id),
        8,
    ),
    (
        SECTION_APART,
        core::mem::offset_of!(PacketMeta, apart_seq),
        8,
    ),
    (
        SECTION_CONNTRACK,
        core::mem::offset_of!(PacketMeta, ct),
        core::mem::size_of::<CtInfo>(),
    ),
];

/// Every section bit this version knows.
pub const SECTIONS_KNOWN: u8 =
    SECTION_NAME | SECTION_DROP | SECTION_FRAGMENT | SECTION_APART | SECTION_CONNTRACK;

impl PacketMeta {
    /// The sections its name, hook and flags call for.
    #[inline(always)]
    pub fn needed_sections(&self) -> u8 {
        let mut bits = 0;
        if self.ifname[0] != 0 {
            bits |= SECTION_NAME;
        }
        if self.hook == Hook::Drop as u8 {
            bits |= SECTION_DROP;
        }
        if self.flags & FLAG_FRAGMENT != 0 {
            bits |= SECTION_FRAGMENT;
        }
        if self.flags & FLAG_PAYLOAD_APART != 0 {
            bits |= SECTION_APART;
        }
        if self.flags & FLAG_CONNTRACK != 0 {
            bits |= SECTION_CONNTRACK;
        }
        bits
    }

    /// Bytes before the payload of an event with `sections`.
    #[inline(always)]
    pub const fn head_size(sections: u8) -> usize {
        let mut size = PACKET_FIXED_SIZE;
        let mut i = 0;
        while i < SECTIONS.len() {
            if sections & SECTIONS[i].0 != 0 {
                size += SECTIONS[i].2;
            }
            i += 1;
        }
        size
    }

    /// Its bytes as sent: the fixed part, then each section in `sections`,
    /// in order. `sections` and the header are taken as they are.
    pub fn wire_parts(&self) -> impl Iterator<Item = &[u8]> {
        // SAFETY: reading the bytes of a plain-data struct.
        let raw = unsafe {
            core::slice::from_raw_parts((self as *const Self).cast::<u8>(), PACKET_META_SIZE)
        };
        let fixed = core::iter::once(&raw[PACKET_FIXED_AT..][..PACKET_FIXED_SIZE]);
        fixed.chain(
            SECTIONS
                .iter()
                .filter(|(bit, _, _)| self.sections & bit != 0)
                .map(move |&(_, at, len)| &raw[at..at + len]),
        )
    }
}

/// Writes `meta` and `payload` into `out` as the kernel sends an event:
/// the sections its fields call for, the header's size to match.
pub fn encode_packet(mut meta: PacketMeta, payload: &[u8], out: &mut impl Extend<u8>) {
    meta.sections = meta.needed_sections();
    meta.cap_len = payload.len() as u16;
    meta.header.size = (PacketMeta::head_size(meta.sections) + payload.len()) as u32;
    for part in meta.wire_parts() {
        out.extend(part.iter().copied());
    }
    out.extend(payload.iter().copied());
}

/// Why a byte buffer is not a valid event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    TooShort { need: usize, have: usize },
    UnknownKind(u16),
    Version { found: u16, expected: u16 },
    SizeMismatch { header: u32, have: usize },
    BadPayload { cap_len: u16, left: usize },
    UnknownSections(u8),
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
            Self::UnknownSections(bits) => {
                write!(
                    f,
                    "event announces sections {bits:#04x} this dnstrace does not know"
                )
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

/// Decodes a packet event into its metadata, the sections it did not
/// carry zeroed, and its captured payload.
pub fn decode_packet(buf: &[u8]) -> Result<(PacketMeta, &[u8]), DecodeError> {
    let (_, header) = decode_header(buf)?;
    let event = &buf[..header.size as usize];
    let fixed = event
        .get(..PACKET_FIXED_SIZE)
        .ok_or(DecodeError::TooShort {
            need: PACKET_FIXED_SIZE,
            have: event.len(),
        })?;
    // SAFETY: plain integers and byte arrays, for which zero is valid.
    let mut meta: PacketMeta = unsafe { core::mem::zeroed() };
    // SAFETY: the bytes of a plain-data struct without padding (asserted
    // below), for which any bytes are a valid value; written in place, one
    // copy per part on this per-packet path.
    let raw =
        unsafe { core::slice::from_raw_parts_mut((&raw mut meta).cast::<u8>(), PACKET_META_SIZE) };
    raw[PACKET_FIXED_AT..][..PACKET_FIXED_SIZE].copy_from_slice(fixed);
    let sections = raw[core::mem::offset_of!(PacketMeta, sections)];
    if sections & !SECTIONS_KNOWN != 0 {
        return Err(DecodeError::UnknownSections(sections));
    }
    let mut rest = &event[PACKET_FIXED_SIZE..];
    for &(bit, at, len) in &SECTIONS {
        if sections & bit == 0 {
            continue;
        }
        let (part, after) = rest.split_at_checked(len).ok_or(DecodeError::TooShort {
            need: PacketMeta::head_size(sections),
            have: event.len(),
        })?;
        raw[at..at + len].copy_from_slice(part);
        rest = after;
    }
    let payload = rest
        .get(..meta.cap_len as usize)
        .ok_or(DecodeError::BadPayload {
            cap_len: meta.cap_len,
            left: rest.len(),
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
const _: () = assert!(core::mem::size_of::<PacketMeta>() == 80 + 48 + 88);
const _: () = assert!(PACKET_FIXED_SIZE == 80);
// The name follows the fixed part, and ends the struct: the payload follows.
const _: () = assert!(core::mem::offset_of!(PacketMeta, ifname) + 16 == PACKET_META_SIZE);
const _: () = assert!(PacketMeta::head_size(SECTIONS_KNOWN) == PACKET_META_SIZE);
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

    fn meta() -> PacketMeta {
        // SAFETY: plain integers and byte arrays, for which zero is valid.
        let mut m: PacketMeta = unsafe { core::mem::zeroed() };
        m.header = EventHeader {
            kind: EventKind::Packet as u16,
            version: SCHEMA_VERSION,
            size: 0,
        };
        (m.ts_ns, m.netns, m.ifindex, m.wire_len) = (1, 2, 3, 4);
        (m.saddr, m.daddr, m.sport, m.dport) = ([1; 16], [2; 16], 53, 5353);
        (m.ip_version, m.l4_proto, m.hook) = (4, 17, Hook::TcEgress as u8);
        m
    }

    fn packet(cap_len: u16, payload: &[u8]) -> Vec<u8> {
        let mut m = meta();
        m.payload_len = payload.len() as u32;
        let mut buf = Vec::new();
        encode_packet(m, payload, &mut buf);
        buf[wire_offset(core::mem::offset_of!(PacketMeta, cap_len))..][..2]
            .copy_from_slice(&cap_len.to_ne_bytes());
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
        let mut buf = packet(3, b"abc");
        buf[wire_offset(core::mem::offset_of!(PacketMeta, sections))] = 0x40;
        assert_eq!(decode_packet(&buf), Err(DecodeError::UnknownSections(0x40)));
        let mut buf = packet(0, b"");
        buf[wire_offset(core::mem::offset_of!(PacketMeta, sections))] = SECTION_CONNTRACK;
        assert!(matches!(
            decode_packet(&buf),
            Err(DecodeError::TooShort { .. })
        ));
    }

    /// A hop sends only the sections it has, and each comes back in its
    /// place; those it did not send read as zero.
    #[test]
    fn sections_are_sent_only_when_there_and_come_back_in_place() {
        let mut m = meta();
        assert_eq!(m.needed_sections(), 0);
        let mut plain = Vec::new();
        encode_packet(m, b"abc", &mut plain);
        assert_eq!(plain.len(), PACKET_FIXED_SIZE + 3);
        m.ifname[..4].copy_from_slice(b"eth0");
        m.hook = Hook::Drop as u8;
        (m.drop_reason, m.drop_location) = (77, 0xffff_8000_0000_1234);
        m.flags = FLAG_FRAGMENT | FLAG_CONNTRACK;
        (m.frag_id, m.frag_offset) = (9, 1480);
        m.ct.status = 0x1a8;
        m.ct.original.sport = 4242;
        let mut full = Vec::new();
        encode_packet(m, b"abc", &mut full);
        let want = SECTION_NAME | SECTION_DROP | SECTION_FRAGMENT | SECTION_CONNTRACK;
        assert_eq!(full.len(), PacketMeta::head_size(want) + 3);
        assert_eq!(
            full.len(),
            PACKET_META_SIZE - 8 + 3,
            "all but the apart section"
        );
        let (back, payload) = decode_packet(&full).unwrap();
        assert_eq!(payload, b"abc");
        assert_eq!(back.sections, want);
        assert_eq!(
            (back.drop_reason, back.drop_location),
            (77, 0xffff_8000_0000_1234)
        );
        assert_eq!((back.frag_id, back.frag_offset), (9, 1480));
        assert_eq!((back.ct.status, back.ct.original.sport), (0x1a8, 4242));
        assert_eq!(&back.ifname[..5], b"eth0\0");
        m.flags = FLAG_CONNTRACK;
        m.hook = Hook::DevXmit as u8;
        m.ifname = [0; 16];
        let mut ct_only = Vec::new();
        encode_packet(m, b"", &mut ct_only);
        let (back, _) = decode_packet(&ct_only).unwrap();
        assert_eq!(
            (back.drop_reason, back.frag_id, back.ifname),
            (0, 0, [0; 16])
        );
        assert_eq!(back.ct, m.ct);
    }
}
