//! Packets to frames for recordings (Linux cooked v2 around the IP packet),
//! and link-layer frames (ours or any capture's) back to addresses, ports
//! and the DNS payload.
//!
//! Decoding follows the kernel side (dnstrace-ebpf's parse.rs): the same
//! extension headers, fragments and announced lengths.
use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use dnstrace_common::Direction;

use crate::decode::{Fragment, Packet, Transport, Tunnel, Underlay};

pub const LINKTYPE_NULL: u16 = 0;
pub const LINKTYPE_ETHERNET: u16 = 1;
pub const LINKTYPE_RAW: u16 = 101;
pub const LINKTYPE_LOOP: u16 = 108;
pub const LINKTYPE_LINUX_SLL: u16 = 113;
pub const LINKTYPE_IPV4: u16 = 228;
pub const LINKTYPE_IPV6: u16 = 229;
pub const LINKTYPE_LINUX_SLL2: u16 = 276;
/// DLT_RAW's values on some BSDs, found in old files instead of 101.
const DLT_RAW_BSD: [u16; 2] = [12, 14];

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const ETH_P_TEB: u16 = 0x6558;
const IPPROTO_IPIP: u8 = 4;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_IPV6: u8 = 41;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_GRE: u8 = 47;
/// VXLAN's IANA port, and the Linux kernel's (flannel's) before it.
const VXLAN_PORTS: [u16; 2] = [4789, 8472];
const GENEVE_PORT: u16 = 6081;
/// Tunnels opened inside one another before giving up: a node's overlay
/// over a cloud's own is two.
const MAX_TUNNELS: usize = 2;
const IPV4_MF: u16 = 0x2000;
/// IPv6 extension headers walked before giving up, as in the kernel.
const MAX_EXT_HEADERS: usize = 6;
const TTL: u8 = 64;

/// A frame and the length the packet had.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub data: Vec<u8>,
    pub orig_len: u32,
}

/// Linux cooked v2's header length.
pub const SLL2_LEN: usize = 20;
/// `ARPHRD_NONE`: no link layer to speak of.
const ARPHRD_NONE: u16 = 0xfffe;

/// A cooked frame's `sll2_pkttype`: which way the packet went, as
/// `tcpdump` prints it (In, Out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketType {
    /// `PACKET_HOST`: to this host.
    Host = 0,
    /// `PACKET_OUTGOING`: sent by it.
    Outgoing = 4,
}

/// A Linux cooked v2 header for `protocol` (an ethertype): no interface
/// index (a reader names it after its own machine's device of that index)
/// and no link-layer address.
pub fn cooked_header(protocol: u16, kind: PacketType) -> [u8; SLL2_LEN] {
    let mut h = [0; SLL2_LEN];
    h[0..2].copy_from_slice(&protocol.to_be_bytes());
    h[8..10].copy_from_slice(&ARPHRD_NONE.to_be_bytes());
    h[10] = kind as u8;
    h
}

/// The ethertype of a cooked frame (LINKTYPE_LINUX_SLL2), if it has a whole
/// header, and what follows the header.
pub fn cooked_protocol(data: &[u8]) -> Option<(u16, &[u8])> {
    let protocol = u16::from_be_bytes(data.get(..2)?.try_into().ok()?);
    Some((protocol, data.get(SLL2_LEN..)?))
}

/// Rebuilds the IP and UDP/TCP headers around `p.payload`: lengths as the
/// packet announced them, checksums over the bytes captured (so correct
/// unless the payload was cut). IPv4 options and IPv6 extension headers are
/// not kept, but fragments are: a fragment's header holds its id, offset
/// and MF bit, and a later one its data alone, as on the wire. A raw IP
/// frame (LINKTYPE_RAW), as recordings of format 1 held: the tests' and
/// their old files'.
#[cfg(test)]
pub fn encode(p: &Packet) -> Frame {
    build(p, &[])
}

/// A recording's frame of `p` (LINKTYPE_LINUX_SLL2): a cooked header that
/// says which way it went (a hook that saw no direction, a drop, says
/// "to this host"), then the IP packet [`encode`] builds.
pub fn cooked(p: &Packet) -> Frame {
    let protocol = match ips(p).0 {
        IpAddr::V4(_) => ETH_P_IP,
        IpAddr::V6(_) => ETH_P_IPV6,
    };
    let kind = match p.hook.direction() {
        Direction::Egress => PacketType::Outgoing,
        _ => PacketType::Host,
    };
    build(p, &cooked_header(protocol, kind))
}

/// `link`'s header, then the packet: built in one buffer.
fn build(p: &Packet, link: &[u8]) -> Frame {
    match p.frag {
        Some(f) if !f.is_first() => later_fragment(p, link),
        _ => with_transport(p, link),
    }
}

fn with_transport(p: &Packet, link: &[u8]) -> Frame {
    let payload_len = p.payload_len.max(p.payload.len() as u32);
    let (mut l4, checksum_at, proto) = match p.transport {
        Transport::Udp => (udp_header(p, payload_len), 6, IPPROTO_UDP),
        Transport::Tcp { seq, flags } => (tcp_header(p, seq, flags), 16, IPPROTO_TCP),
    };
    // A first fragment holds what was captured; its transport header
    // announces the whole datagram.
    let in_ip = if p.frag.is_some() {
        p.payload.len() as u32
    } else {
        payload_len
    };
    let l4_len = (l4.len() as u32).saturating_add(in_ip);
    let (ip, pseudo) = ip_header(p, proto, l4_len);
    let sum = sum16(sum16(pseudo, &l4), &p.payload);
    let sum = match (fold(sum), p.transport, p.frag, ip[0] >> 4) {
        // A fragmented datagram's checksum covers data this packet lacks:
        // IPv4 can say there is none (IPv6 cannot).
        (_, Transport::Udp, Some(_), 4) => 0,
        // 0 means "no checksum" in UDP.
        (0, Transport::Udp, ..) => 0xffff,
        (s, ..) => s,
    };
    l4[checksum_at..checksum_at + 2].copy_from_slice(&sum.to_be_bytes());
    let orig_len = ((link.len() + ip.len()) as u32).saturating_add(l4_len);
    let data = [link, &ip[..], &l4[..], &p.payload[..]].concat();
    Frame { data, orig_len }
}

/// A fragment past the first: IP header and data, no transport header.
fn later_fragment(p: &Packet, link: &[u8]) -> Frame {
    let proto = match p.transport {
        Transport::Udp => IPPROTO_UDP,
        Transport::Tcp { .. } => IPPROTO_TCP,
    };
    let len = p.payload_len.max(p.payload.len() as u32);
    let (ip, _) = ip_header(p, proto, len);
    let orig_len = ((link.len() + ip.len()) as u32).saturating_add(len);
    let data = [link, &ip[..], &p.payload[..]].concat();
    Frame { data, orig_len }
}

/// The IP header (with its fragment fields) for `l4_len` bytes of `proto`,
/// and the pseudo-header sum for the transport checksum.
fn ip_header(p: &Packet, proto: u8, l4_len: u32) -> (Vec<u8>, u64) {
    match ips(p) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => ipv4_header(src, dst, proto, l4_len, p.frag),
        (src, dst) => ipv6_header(v6(src), v6(dst), proto, l4_len, p.frag),
    }
}

/// Both addresses of one family (IPv4-mapped IPv6 if they differ).
fn ips(p: &Packet) -> (IpAddr, IpAddr) {
    match (p.src.ip(), p.dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => (s.into(), d.into()),
        (s, d) => (v6(s).into(), v6(d).into()),
    }
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

fn u16_len(len: u32) -> [u8; 2] {
    u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes()
}

fn udp_header(p: &Packet, payload_len: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(8);
    h.extend_from_slice(&p.src.port().to_be_bytes());
    h.extend_from_slice(&p.dst.port().to_be_bytes());
    h.extend_from_slice(&u16_len(payload_len.saturating_add(8)));
    h.extend_from_slice(&[0, 0]);
    h
}

/// No acknowledgement number is known; the window is the largest unscaled.
fn tcp_header(p: &Packet, seq: u32, flags: u8) -> Vec<u8> {
    let mut h = Vec::with_capacity(20);
    h.extend_from_slice(&p.src.port().to_be_bytes());
    h.extend_from_slice(&p.dst.port().to_be_bytes());
    h.extend_from_slice(&seq.to_be_bytes());
    h.extend_from_slice(&[0; 4]);
    h.extend_from_slice(&[5 << 4, flags, 0xff, 0xff, 0, 0, 0, 0]);
    h
}

/// The header, and the pseudo-header sum for the transport checksum.
/// Offsets travel in units of 8 bytes, as IP has them.
fn ipv4_header(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    l4_len: u32,
    frag: Option<Fragment>,
) -> (Vec<u8>, u64) {
    let (id, flags) = match frag {
        // IPv4's identification is 16 bits.
        Some(f) => (
            f.id as u16,
            (f.offset / 8) | if f.more { IPV4_MF } else { 0 },
        ),
        None => (0, 0),
    };
    let mut h = Vec::with_capacity(20);
    h.extend_from_slice(&[0x45, 0]);
    h.extend_from_slice(&u16_len(l4_len.saturating_add(20)));
    h.extend_from_slice(&id.to_be_bytes());
    h.extend_from_slice(&flags.to_be_bytes());
    h.extend_from_slice(&[TTL, proto, 0, 0]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    let sum = fold(sum16(0, &h));
    h[10..12].copy_from_slice(&sum.to_be_bytes());
    let pseudo = sum16(sum16(0, &h[12..20]), &[0, proto]) + u64::from(l4_len);
    (h, pseudo)
}

fn ipv6_header(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    proto: u8,
    l4_len: u32,
    frag: Option<Fragment>,
) -> (Vec<u8>, u64) {
    let ext = if frag.is_some() { 8 } else { 0 };
    let mut h = Vec::with_capacity(48);
    h.extend_from_slice(&[0x60, 0, 0, 0]);
    h.extend_from_slice(&u16_len(l4_len.saturating_add(ext)));
    h.extend_from_slice(&[
        if frag.is_some() {
            IPPROTO_FRAGMENT
        } else {
            proto
        },
        TTL,
    ]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    if let Some(f) = frag {
        let offset_m = (f.offset & 0xfff8) | u16::from(f.more);
        h.extend_from_slice(&[proto, 0]);
        h.extend_from_slice(&offset_m.to_be_bytes());
        h.extend_from_slice(&f.id.to_be_bytes());
    }
    let pseudo = sum16(sum16(0, &h[8..40]), &[0, proto]) + u64::from(l4_len);
    (h, pseudo)
}

/// Adds big-endian 16-bit words (an odd last byte padded with zero).
fn sum16(acc: u64, bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(2);
    let mut sum = acc;
    for w in &mut words {
        sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

/// The ones' complement of the ones' complement sum.
fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A UDP or TCP packet found in a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub transport: Transport,
    /// The L4 payload captured (without link-layer padding).
    pub payload: &'a [u8],
    /// L4 payload length the headers announce.
    pub payload_len: u32,
    /// Fewer payload bytes captured than announced.
    pub truncated: bool,
    /// A fragment of an IP datagram. A later one has no ports (0 here) and
    /// its payload is the fragment's data.
    pub frag: Option<Fragment>,
    /// The outermost tunnel it came out of.
    pub underlay: Option<Underlay>,
}

/// A frame that does not parse as what its headers say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameError(pub String);

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FrameError {}

fn bad<T>(what: impl Into<String>) -> Result<T, FrameError> {
    Err(FrameError(what.into()))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ip {
    V4,
    V6,
}

/// `Ok(None)`: not UDP or TCP over IP (nor a later fragment of UDP),
/// directly or inside VXLAN, Geneve, IP-in-IP or GRE.
pub fn decode(linktype: u16, data: &[u8]) -> Result<Option<Decoded<'_>>, FrameError> {
    let Some((mut ip, mut packet)) = link(linktype, data)? else {
        return Ok(None);
    };
    let mut underlay = None;
    for depth in 0..=MAX_TUNNELS {
        let Some(l3) = network(ip, packet)? else {
            return Ok(None);
        };
        let inner = match depth < MAX_TUNNELS {
            true => tunnel(&l3)?,
            false => None,
        };
        let Some((outer, (inner_ip, inner_packet))) = inner else {
            let mut d = transport(l3)?;
            if let Some(d) = &mut d {
                d.underlay = underlay;
            }
            return Ok(d);
        };
        underlay.get_or_insert(outer);
        (ip, packet) = (inner_ip, inner_packet);
    }
    Ok(None)
}

fn network(ip: Ip, packet: &[u8]) -> Result<Option<L3<'_>>, FrameError> {
    match ip {
        Ip::V4 => ipv4(packet),
        Ip::V6 => ipv6(packet),
    }
}

/// A network-layer packet, as a link layer or a tunnel carries it.
type Carried<'a> = (Ip, &'a [u8]);
/// What a tunnel's header says: its network id or key, and what it carries.
type Opened<'a> = Result<Option<(Option<u32>, Carried<'a>)>, FrameError>;

/// The packet `l3` carries through a tunnel, and the tunnel; None when it
/// is not one (or is a fragment of one: outer fragments are not put back
/// together).
fn tunnel<'a>(l3: &L3<'a>) -> Result<Option<(Underlay, Carried<'a>)>, FrameError> {
    if l3.frag.is_some() {
        return Ok(None);
    }
    let under = |tunnel, vni| Underlay {
        tunnel,
        src: l3.src,
        dst: l3.dst,
        vni,
    };
    let inner = match l3.proto {
        IPPROTO_IPIP => Some((under(Tunnel::Ipip, None), (Ip::V4, l3.l4))),
        IPPROTO_IPV6 => Some((under(Tunnel::Ipip, None), (Ip::V6, l3.l4))),
        IPPROTO_GRE => gre(l3.l4)?.map(|(key, inner)| (under(Tunnel::Gre, key), inner)),
        IPPROTO_UDP => match l3.l4.get(2..4) {
            Some(&[a, b]) => match u16::from_be_bytes([a, b]) {
                p if VXLAN_PORTS.contains(&p) => vxlan(&l3.l4[8.min(l3.l4.len())..])?
                    .map(|(vni, inner)| (under(Tunnel::Vxlan, vni), inner)),
                GENEVE_PORT => geneve(&l3.l4[8.min(l3.l4.len())..])?
                    .map(|(vni, inner)| (under(Tunnel::Geneve, vni), inner)),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    };
    Ok(inner)
}

/// VXLAN (RFC 7348): 8 bytes, the I flag and a 24-bit VNI, then Ethernet.
fn vxlan(p: &[u8]) -> Opened<'_> {
    let Some(&[flags, _, _, _, a, b, c, _]) = p.get(..8) else {
        return bad(format!("VXLAN header cut at {} bytes", p.len()));
    };
    if flags & 0x08 == 0 {
        return bad("VXLAN header without a VNI (I flag clear)");
    }
    let vni = u32::from_be_bytes([0, a, b, c]);
    Ok(ethernet(&p[8..])?.map(|inner| (Some(vni), inner)))
}

/// Geneve (RFC 8926): 8 bytes and options, then what its protocol type
/// says (Ethernet, or IP directly).
fn geneve(p: &[u8]) -> Opened<'_> {
    let Some(&[first, _, t0, t1, a, b, c, _]) = p.get(..8) else {
        return bad(format!("Geneve header cut at {} bytes", p.len()));
    };
    if first >> 6 != 0 {
        return bad(format!("Geneve version {} is not known", first >> 6));
    }
    let len = 8 + usize::from(first & 0x3f) * 4;
    let Some(rest) = p.get(len..) else {
        return bad(format!("Geneve options of {} bytes cut", len - 8));
    };
    let vni = u32::from_be_bytes([0, a, b, c]);
    Ok(inner_of(u16::from_be_bytes([t0, t1]), rest)?.map(|inner| (Some(vni), inner)))
}

/// GRE (RFC 2784, with RFC 2890's key and sequence number), version 0.
fn gre(p: &[u8]) -> Opened<'_> {
    let Some(&[f0, f1, t0, t1]) = p.get(..4) else {
        return bad(format!("GRE header cut at {} bytes", p.len()));
    };
    // Version 1 is PPTP's, which carries PPP.
    if f1 & 0x07 != 0 {
        return Ok(None);
    }
    let (checksum, keyed, seq) = (f0 & 0x80 != 0, f0 & 0x20 != 0, f0 & 0x10 != 0);
    let key_at = 4 + 4 * usize::from(checksum);
    let len = key_at + 4 * usize::from(keyed) + 4 * usize::from(seq);
    let Some(rest) = p.get(len..) else {
        return bad(format!("GRE header of {len} bytes cut"));
    };
    let key = match p[key_at..].first_chunk::<4>() {
        Some(k) if keyed => Some(u32::from_be_bytes(*k)),
        _ => None,
    };
    Ok(inner_of(u16::from_be_bytes([t0, t1]), rest)?.map(|inner| (key, inner)))
}

/// What a tunnel's protocol type carries: IP, or Ethernet bridged.
fn inner_of(ethertype: u16, rest: &[u8]) -> Result<Option<(Ip, &[u8])>, FrameError> {
    match ethertype {
        ETH_P_TEB => ethernet(rest),
        ETH_P_IP => Ok(Some((Ip::V4, rest))),
        ETH_P_IPV6 => Ok(Some((Ip::V6, rest))),
        _ => Ok(None),
    }
}

fn ethernet(frame: &[u8]) -> Result<Option<(Ip, &[u8])>, FrameError> {
    match frame.get(12..14) {
        Some(&[a, b]) => vlan(u16::from_be_bytes([a, b]), &frame[14..]),
        _ => bad(format!(
            "inner Ethernet header cut at {} bytes",
            frame.len()
        )),
    }
}

/// The network layer a link-layer frame carries.
fn link(linktype: u16, data: &[u8]) -> Result<Option<(Ip, &[u8])>, FrameError> {
    let ethertype = |at: usize, what: &str| match data.get(at..at + 2) {
        Some(&[a, b]) => Ok(u16::from_be_bytes([a, b])),
        _ => bad(format!("{what} header cut at {} bytes", data.len())),
    };
    match linktype {
        LINKTYPE_RAW => Ok(raw(data)),
        t if DLT_RAW_BSD.contains(&t) => Ok(raw(data)),
        LINKTYPE_IPV4 => Ok(Some((Ip::V4, data))),
        LINKTYPE_IPV6 => Ok(Some((Ip::V6, data))),
        LINKTYPE_ETHERNET => vlan(ethertype(12, "Ethernet")?, &data[14..]),
        LINKTYPE_LINUX_SLL => vlan(ethertype(14, "Linux cooked")?, &data[16..]),
        LINKTYPE_LINUX_SLL2 => {
            if data.len() < 20 {
                return bad(format!(
                    "Linux cooked v2 header cut at {} bytes",
                    data.len()
                ));
            }
            vlan(ethertype(0, "Linux cooked v2")?, &data[20..])
        }
        LINKTYPE_NULL | LINKTYPE_LOOP => {
            let Some(&[a, b, c, d]) = data.get(..4) else {
                return bad(format!("loopback header cut at {} bytes", data.len()));
            };
            let family = match linktype {
                // NULL: the capturing host's byte order; families are small.
                LINKTYPE_NULL if a == 0 && b == 0 => u32::from_be_bytes([a, b, c, d]),
                LINKTYPE_NULL => u32::from_le_bytes([a, b, c, d]),
                _ => u32::from_be_bytes([a, b, c, d]),
            };
            Ok(match family {
                2 => Some((Ip::V4, &data[4..])),
                // Linux, then the BSDs and macOS.
                10 | 24 | 28 | 30 => Some((Ip::V6, &data[4..])),
                _ => None,
            })
        }
        t => bad(format!("link type {t} is not supported")),
    }
}

fn raw(data: &[u8]) -> Option<(Ip, &[u8])> {
    match data.first()? >> 4 {
        4 => Some((Ip::V4, data)),
        6 => Some((Ip::V6, data)),
        _ => None,
    }
}

/// Skips up to two 802.1Q/802.1ad tags.
fn vlan(mut ethertype: u16, mut rest: &[u8]) -> Result<Option<(Ip, &[u8])>, FrameError> {
    for _ in 0..2 {
        if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
            break;
        }
        let Some(&[_, _, a, b]) = rest.get(..4) else {
            return bad("VLAN tag cut");
        };
        ethertype = u16::from_be_bytes([a, b]);
        rest = &rest[4..];
    }
    Ok(match ethertype {
        ETH_P_IP => Some((Ip::V4, rest)),
        ETH_P_IPV6 => Some((Ip::V6, rest)),
        _ => None,
    })
}

/// The transport layer an IP packet carries.
struct L3<'a> {
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    /// Transport bytes captured, up to the end the IP header announces.
    l4: &'a [u8],
    /// Transport length the IP header announces (a later fragment's data).
    l4_len: u32,
    frag: Option<Fragment>,
}

fn ipv4(p: &[u8]) -> Result<Option<L3<'_>>, FrameError> {
    let Some(h) = p.get(..20) else {
        return bad(format!("IPv4 header cut at {} bytes", p.len()));
    };
    let ihl = usize::from(h[0] & 0x0f) * 4;
    if h[0] >> 4 != 4 || ihl < 20 {
        return bad(format!("not an IPv4 header (first byte 0x{:02x})", h[0]));
    }
    let total = match usize::from(u16::from_be_bytes([h[2], h[3]])) {
        // Segmentation offload leaves 0 in packets captured before it.
        0 => p.len(),
        t => t,
    };
    if total < ihl || p.len() < ihl {
        return bad(format!("IPv4 header of {ihl} bytes in a packet of {total}"));
    }
    let flags = u16::from_be_bytes([h[6], h[7]]);
    let frag = Fragment {
        id: u16::from_be_bytes([h[4], h[5]]).into(),
        offset: (flags & 0x1fff) * 8,
        more: flags & IPV4_MF != 0,
    };
    let src: [u8; 4] = [h[12], h[13], h[14], h[15]];
    let dst: [u8; 4] = [h[16], h[17], h[18], h[19]];
    Ok(Some(L3 {
        src: Ipv4Addr::from(src).into(),
        dst: Ipv4Addr::from(dst).into(),
        proto: h[9],
        l4: &p[ihl..total.min(p.len())],
        l4_len: (total - ihl) as u32,
        frag: (frag.offset != 0 || frag.more).then_some(frag),
    }))
}

fn ipv6(p: &[u8]) -> Result<Option<L3<'_>>, FrameError> {
    let Some(h) = p.get(..40) else {
        return bad(format!("IPv6 header cut at {} bytes", p.len()));
    };
    if h[0] >> 4 != 6 {
        return bad(format!("not an IPv6 header (first byte 0x{:02x})", h[0]));
    }
    let octets = |at: usize| {
        let mut a = [0; 16];
        a.copy_from_slice(&h[at..at + 16]);
        Ipv6Addr::from(a)
    };
    let mut l3 = L3 {
        src: octets(8).into(),
        dst: octets(24).into(),
        proto: h[6],
        l4: &p[40..],
        l4_len: u16::from_be_bytes([h[4], h[5]]).into(),
        frag: None,
    };
    l3.l4 = &l3.l4[..l3.l4.len().min(l3.l4_len as usize)];
    for _ in 0..MAX_EXT_HEADERS {
        let ext_len = |unit: usize, extra: usize| match l3.l4.get(1) {
            Some(&n) => Ok((usize::from(n) + extra) * unit),
            None => bad("IPv6 extension header cut"),
        };
        let len = match l3.proto {
            // Transports, and what tunnels carry.
            IPPROTO_UDP | IPPROTO_TCP | IPPROTO_IPIP | IPPROTO_IPV6 | IPPROTO_GRE => {
                return Ok(Some(l3))
            }
            // hop-by-hop, routing, destination options
            0 | 43 | 60 => ext_len(8, 1)?,
            // authentication header
            51 => ext_len(4, 2)?,
            IPPROTO_FRAGMENT => {
                let Some(&[_, _, a, b, i, d, e, n]) = l3.l4.get(..8) else {
                    return bad("IPv6 fragment header cut");
                };
                let word = u16::from_be_bytes([a, b]);
                let frag = Fragment {
                    id: u32::from_be_bytes([i, d, e, n]),
                    offset: word & 0xfff8,
                    more: word & 1 != 0,
                };
                // Offset 0 without M: an atomic fragment, a whole packet.
                l3.frag = (frag.offset != 0 || frag.more).then_some(frag);
                8
            }
            _ => return Ok(None),
        };
        if l3.l4.len() < len {
            return bad(format!("IPv6 extension header of {len} bytes cut"));
        }
        l3.proto = l3.l4[0];
        l3.l4 = &l3.l4[len..];
        l3.l4_len = l3.l4_len.saturating_sub(len as u32);
        if l3.frag.is_some_and(|f| !f.is_first()) {
            // What follows is fragment data, not headers.
            return Ok(Some(l3));
        }
    }
    Ok(None)
}

fn transport(l3: L3<'_>) -> Result<Option<Decoded<'_>>, FrameError> {
    if let Some(f) = l3.frag.filter(|f| !f.is_first()) {
        return Ok(later_fragment_of(l3, f));
    }
    let (transport, header, payload_len) = match l3.proto {
        IPPROTO_UDP => {
            let Some(h) = l3.l4.get(..8) else {
                return bad(format!("UDP header cut at {} bytes", l3.l4.len()));
            };
            let len = u16::from_be_bytes([h[4], h[5]]);
            if len < 8 {
                return bad(format!("UDP length {len} is below its header's"));
            }
            (Transport::Udp, 8, u32::from(len) - 8)
        }
        IPPROTO_TCP => {
            let Some(h) = l3.l4.get(..20) else {
                return bad(format!("TCP header cut at {} bytes", l3.l4.len()));
            };
            let doff = usize::from(h[12] >> 4) * 4;
            if doff < 20 || l3.l4.len() < doff || (l3.l4_len as usize) < doff {
                return bad(format!("TCP header of {doff} bytes does not fit"));
            }
            let seq = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
            let tcp = Transport::Tcp { seq, flags: h[13] };
            (tcp, doff, l3.l4_len - doff as u32)
        }
        _ => return Ok(None),
    };
    let ports = |at: usize| u16::from_be_bytes([l3.l4[at], l3.l4[at + 1]]);
    let payload = &l3.l4[header..];
    let payload = &payload[..payload.len().min(payload_len as usize)];
    Ok(Some(Decoded {
        src: SocketAddr::new(l3.src, ports(0)),
        dst: SocketAddr::new(l3.dst, ports(2)),
        transport,
        payload,
        payload_len,
        truncated: (payload.len() as u32) < payload_len,
        frag: l3.frag,
        underlay: None,
    }))
}

/// A later fragment of a UDP datagram: its data, without ports. (Only UDP
/// is put back together.)
fn later_fragment_of(l3: L3<'_>, f: Fragment) -> Option<Decoded<'_>> {
    (l3.proto == IPPROTO_UDP).then(|| Decoded {
        src: SocketAddr::new(l3.src, 0),
        dst: SocketAddr::new(l3.dst, 0),
        transport: Transport::Udp,
        payload: l3.l4,
        payload_len: l3.l4_len,
        truncated: (l3.l4.len() as u32) < l3.l4_len,
        frag: Some(f),
        underlay: None,
    })
}

#[cfg(test)]
mod tests;
