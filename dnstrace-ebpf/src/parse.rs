//! From an IP header to the DNS payload, over any way of reading packet bytes.
use dnstrace_common::{
    PacketMeta, FLAG_FRAGMENT, FLAG_MORE_FRAGMENTS, FLAG_TRUNCATED, PAYLOAD_MAX,
};

use crate::{
    debug::{skip, Why},
    maps::{fragment_ports, is_dns_port, remember_fragment, Length, Scratch},
};

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
/// IPv6 extension headers walked before giving up on finding L4.
const MAX_EXT_HEADERS: usize = 6;

/// Reads packet bytes at offsets from some start.
pub trait Reader {
    fn load<T: Copy>(&self, off: u32) -> Result<T, i64>;
    /// Copies `len` bytes (at most PAYLOAD_MAX) at `off` to `dst`.
    fn copy(&self, off: u32, dst: *mut u8, len: u32) -> Result<(), i64>;
    /// Bytes that can be read, counted from offset 0.
    fn available(&self) -> u32;
}

/// A helper's return code as a result.
#[inline(always)]
pub fn helper_result(ret: i64) -> Result<(), i64> {
    if ret == 0 {
        Ok(())
    } else {
        Err(ret)
    }
}

/// Where the payload is and how long the headers say it is.
pub struct L4 {
    offset: u32,
    payload_len: u32,
    flags: u8,
    /// For a fragment: the datagram's id and this fragment's byte offset.
    frag_id: u32,
    frag_offset: u16,
}

impl L4 {
    /// Where the payload starts, from the IP header.
    #[inline(always)]
    pub fn offset(&self) -> u32 {
        self.offset
    }

    #[inline(always)]
    pub fn payload_len(&self) -> u32 {
        self.payload_len
    }

    /// The same, its lengths passed through memory (`Scratch::opaque`):
    /// every way through the header parse goes on from here as one.
    #[inline(always)]
    pub fn forgotten(mut self, s: &mut Scratch) -> Self {
        self.offset = s.opaque(Length::PayloadAt, self.offset);
        self.payload_len = s.opaque(Length::Payload, self.payload_len);
        self
    }

    /// A fragment after the first: its payload is data, with no L4 header.
    #[inline(always)]
    fn later_fragment(&self) -> bool {
        self.frag_offset != 0
    }
}

/// The IPv4 header without options, and the first 8 bytes after it (all of
/// a UDP header) if no options come between. Word-aligned, so that its
/// addresses are a load each rather than a load and a shift a byte.
#[repr(C, align(4))]
#[derive(Clone, Copy)]
struct Ipv4Head {
    vihl: u8,
    _tos: u8,
    total: [u8; 2],
    id: [u8; 2],
    frag: [u8; 2],
    _ttl: u8,
    proto: u8,
    _csum: [u8; 2],
    saddr: [u8; 4],
    daddr: [u8; 4],
    l4: [u8; 8],
}

/// The fixed IPv6 header, and the first 8 bytes after it if no extension
/// header comes between; word-aligned as `Ipv4Head`.
#[repr(C, align(4))]
#[derive(Clone, Copy)]
struct Ipv6Head {
    _vtcfl: [u8; 4],
    plen: [u8; 2],
    next: u8,
    _hops: u8,
    saddr: [u8; 16],
    daddr: [u8; 16],
    l4: [u8; 8],
}

/// The headers of a DNS packet, kept in locals until it is known to be one.
pub struct Dns {
    /// Addresses in words (IPv4 in the first), stored a word at a time.
    saddr: [u32; 4],
    daddr: [u32; 4],
    sport: u16,
    dport: u16,
    /// The first 8 bytes of the UDP or TCP header.
    l4_head: [u8; 8],
    ip_version: u8,
    l4_proto: u8,
    l4: L4,
}

/// Parses IPv4/IPv6 up to the ports at `l3`; fails (skipping the packet)
/// unless it is UDP or TCP to or from a DNS port. Each IP header is one
/// read, with the UDP header in it when no options or extensions come
/// between.
#[inline(always)]
pub fn dns_headers<R: Reader>(r: &R, ethertype: u16, l3: u32) -> Result<Dns, i64> {
    match ethertype {
        ETH_P_IP => ipv4(r, l3),
        ETH_P_IPV6 => ipv6(r, l3),
        _ => Err(skip(Why::NotIp, ethertype.into())),
    }
}

#[inline(always)]
fn ipv4<R: Reader>(r: &R, off: u32) -> Result<Dns, i64> {
    let h: Ipv4Head = r.load(off)?;
    let ihl = u32::from(h.vihl & 0x0f) * 4;
    if h.vihl >> 4 != 4 || ihl < 20 {
        return Err(skip(Why::BadIpv4, h.vihl.into()));
    }
    if h.proto != IPPROTO_UDP && h.proto != IPPROTO_TCP {
        return Err(skip(Why::NotUdpTcp, h.proto.into()));
    }
    let frag = u16::from_be_bytes(h.frag);
    let total = u32::from(u16::from_be_bytes(h.total));
    let mut l4 = L4 {
        offset: off + ihl,
        payload_len: total.saturating_sub(ihl),
        flags: 0,
        frag_id: u32::from(u16::from_be_bytes(h.id)),
        frag_offset: (frag & 0x1fff) << 3,
    };
    if frag & 0x3fff != 0 {
        l4.flags = FLAG_FRAGMENT
            | if frag & 0x2000 != 0 {
                FLAG_MORE_FRAGMENTS
            } else {
                0
            };
    }
    let saddr = [u32::from_ne_bytes(h.saddr), 0, 0, 0];
    let daddr = [u32::from_ne_bytes(h.daddr), 0, 0, 0];
    let (sport, dport, l4_head) = if l4.later_fragment() {
        later_fragment(h.proto, &saddr, &daddr, l4.frag_id)?
    } else {
        let l4_head = if ihl == 20 { h.l4 } else { r.load(off + ihl)? };
        let (sport, dport) = dns_ports(l4_head)?;
        (sport, dport, l4_head)
    };
    Ok(Dns {
        saddr,
        daddr,
        sport,
        dport,
        l4_head,
        ip_version: 4,
        l4_proto: h.proto,
        l4,
    })
}

/// The ports of a later fragment of a UDP datagram whose first fragment
/// was DNS (it carries none itself).
#[inline(always)]
fn later_fragment(
    proto: u8,
    saddr: &[u32; 4],
    daddr: &[u32; 4],
    id: u32,
) -> Result<(u16, u16, [u8; 8]), i64> {
    if proto != IPPROTO_UDP {
        return Err(skip(Why::NotUdpTcp, proto.into()));
    }
    let [sport, dport] =
        fragment_ports(saddr, daddr, id).ok_or_else(|| skip(Why::UnknownFragment, id))?;
    Ok((sport, dport, [0; 8]))
}

#[inline(always)]
fn ipv6<R: Reader>(r: &R, off: u32) -> Result<Dns, i64> {
    let h: Ipv6Head = r.load(off)?;
    let mut l4 = L4 {
        offset: off + 40,
        payload_len: u32::from(u16::from_be_bytes(h.plen)),
        flags: 0,
        frag_id: 0,
        frag_offset: 0,
    };
    let (saddr, daddr) = (words(h.saddr), words(h.daddr));
    let (proto, l4_head) = if h.next == IPPROTO_UDP || h.next == IPPROTO_TCP {
        (h.next, h.l4)
    } else {
        let proto = extension_headers(r, h.next, &mut l4)?;
        if l4.later_fragment() {
            let (sport, dport, head) = later_fragment(proto, &saddr, &daddr, l4.frag_id)?;
            return Ok(Dns {
                saddr,
                daddr,
                sport,
                dport,
                l4_head: head,
                ip_version: 6,
                l4_proto: proto,
                l4,
            });
        }
        (proto, r.load(l4.offset)?)
    };
    let (sport, dport) = dns_ports(l4_head)?;
    Ok(Dns {
        saddr,
        daddr,
        sport,
        dport,
        l4_head,
        ip_version: 6,
        l4_proto: proto,
        l4,
    })
}

/// Walks IPv6 extension headers to UDP or TCP; returns which one.
#[inline(always)]
fn extension_headers<R: Reader>(r: &R, mut next: u8, l4: &mut L4) -> Result<u8, i64> {
    for _ in 0..MAX_EXT_HEADERS {
        // next header, length, and a fragment header's offset and flags
        let h: [u8; 4] = match next {
            IPPROTO_UDP | IPPROTO_TCP => return Ok(next),
            0 | 43 | 44 | 51 | 60 => r.load(l4.offset)?,
            _ => return Err(skip(Why::NotUdpTcp, next.into())),
        };
        let hdr_len = match next {
            // authentication header: (len + 2) * 4
            51 => (u32::from(h[1]) + 2) * 4,
            44 => {
                let frag = u16::from_be_bytes([h[2], h[3]]);
                let id: [u8; 4] = r.load(l4.offset + 4)?;
                l4.frag_id = u32::from_be_bytes(id);
                l4.frag_offset = frag & 0xfff8;
                l4.flags |= FLAG_FRAGMENT;
                if frag & 1 != 0 {
                    l4.flags |= FLAG_MORE_FRAGMENTS;
                }
                8
            }
            // hop-by-hop, routing, destination options: (len + 1) * 8
            _ => (u32::from(h[1]) + 1) * 8,
        };
        next = h[0];
        l4.offset += hdr_len;
        l4.payload_len = l4.payload_len.saturating_sub(hdr_len);
    }
    Err(skip(Why::TooManyExtensions, 0))
}

/// An address as words, to be moved a word at a time, and back.
#[inline(always)]
fn words(addr: [u8; 16]) -> [u32; 4] {
    // SAFETY: 16 plain bytes either way.
    unsafe { core::mem::transmute::<[u8; 16], [u32; 4]>(addr) }
}

#[inline(always)]
fn bytes(addr: [u32; 4]) -> [u8; 16] {
    // SAFETY: 16 plain bytes either way.
    unsafe { core::mem::transmute::<[u32; 4], [u8; 16]>(addr) }
}

/// Source and destination ports, if either is a DNS port.
#[inline(always)]
fn dns_ports(p: [u8; 8]) -> Result<(u16, u16), i64> {
    let sport = u16::from_be_bytes([p[0], p[1]]);
    let dport = u16::from_be_bytes([p[2], p[3]]);
    if is_dns_port(sport) || is_dns_port(dport) {
        Ok((sport, dport))
    } else {
        Err(skip(
            Why::NotDnsPort,
            u32::from(sport) << 16 | u32::from(dport),
        ))
    }
}

/// A UDP DNS message as it reaches a socket: its addresses, ports and the
/// first word of its DNS header (id, flags and rcode).
pub struct Datagram {
    pub saddr: [u32; 4],
    pub daddr: [u32; 4],
    pub sport: u16,
    pub dport: u16,
    pub ip_version: u8,
    /// The DNS header's first bytes: id, flags, rcode.
    pub head: [u8; 4],
    /// Where the DNS message starts, and its length as the UDP header says.
    pub message_at: u32,
    pub message_len: u32,
}

/// The datagram at `r` (from its IP header on), if it is UDP to or from a
/// DNS port and holds at least a DNS header.
#[inline(always)]
pub fn datagram<R: Reader>(r: &R, ethertype: u16) -> Result<Datagram, i64> {
    let dns = dns_headers(r, ethertype, 0)?;
    if dns.l4_proto != IPPROTO_UDP || dns.l4.later_fragment() {
        return Err(skip(Why::NotUdpTcp, dns.l4_proto.into()));
    }
    let udp_len = u16::from_be_bytes([dns.l4_head[4], dns.l4_head[5]]);
    if udp_len < 8 + 12 {
        return Err(skip(Why::NotDnsHeader, udp_len.into()));
    }
    let message_at = dns.l4.offset + 8;
    Ok(Datagram {
        saddr: dns.saddr,
        daddr: dns.daddr,
        sport: dns.sport,
        dport: dns.dport,
        ip_version: dns.ip_version,
        head: r.load(message_at)?,
        message_at,
        message_len: u32::from(udp_len) - 8,
    })
}

/// Fills `meta` with the packet's addresses and ports and reads the rest of
/// a TCP header; returns where the payload is. A first fragment of DNS is
/// remembered, for its later fragments.
#[inline(always)]
pub fn transport<R: Reader>(r: &R, dns: Dns, meta: &mut PacketMeta) -> Result<L4, i64> {
    let mut l4 = dns.l4;
    meta.saddr = bytes(dns.saddr);
    meta.daddr = bytes(dns.daddr);
    meta.sport = dns.sport;
    meta.dport = dns.dport;
    meta.ip_version = dns.ip_version;
    meta.l4_proto = dns.l4_proto;
    meta.frag_id = l4.frag_id;
    meta.frag_offset = l4.frag_offset;
    meta.tcp_seq = 0;
    meta.tcp_flags = 0;
    if l4.later_fragment() {
        return Ok(l4);
    }
    if dns.l4_proto == IPPROTO_UDP {
        let udp = dns.l4_head;
        l4.payload_len = u32::from(u16::from_be_bytes([udp[4], udp[5]])).saturating_sub(8);
        l4.offset += 8;
        if l4.flags & FLAG_MORE_FRAGMENTS != 0 {
            remember_fragment(&dns.saddr, &dns.daddr, l4.frag_id, [dns.sport, dns.dport]);
        }
    } else {
        let tcp: [u8; 14] = r.load(l4.offset)?;
        meta.tcp_seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
        meta.tcp_flags = tcp[13];
        let doff = u32::from(tcp[12] >> 4) * 4;
        l4.payload_len = l4.payload_len.saturating_sub(doff);
        l4.offset += doff;
    }
    Ok(l4)
}

/// Copies as much payload as there is (up to PAYLOAD_MAX) and sets the
/// length fields; returns the number of bytes copied.
#[inline(always)]
pub fn copy_payload<R: Reader>(r: &R, l4: &L4, s: &mut Scratch) -> Result<usize, i64> {
    let in_packet = r.available().saturating_sub(l4.offset);
    s.meta.payload_len = l4.payload_len;
    // Read back from the map value: the verifier's search for where the
    // copy's length came from ends at a load from a map, where through the
    // registers it went back over every branch of the header parse (a
    // third more time to verify, at start-up).
    // SAFETY: a field of this CPU's scratch event, just written.
    let announced = unsafe { core::ptr::read_volatile(&s.meta.payload_len) };
    let want = if announced < in_packet {
        announced
    } else {
        in_packet
    };
    let mut cap = want as usize;
    if cap > PAYLOAD_MAX {
        cap = PAYLOAD_MAX;
    }
    if cap > 0 {
        r.copy(l4.offset, s.payload.as_mut_ptr(), cap as u32)?;
    }
    s.meta.flags |= l4.flags;
    if (cap as u32) < l4.payload_len {
        s.meta.flags |= FLAG_TRUNCATED;
    }
    s.meta.cap_len = cap as u16;
    Ok(cap)
}
