//! From an IP header to the DNS payload, over any way of reading packet bytes.
use dnstrace_common::{PacketMeta, FLAG_FRAGMENT, FLAG_TRUNCATED, PAYLOAD_MAX};

use crate::maps::{is_dns_port, Scratch};

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
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
}

/// Parses IPv4/IPv6 and UDP/TCP at `l3`; fails (skipping the packet) unless
/// it is DNS. Fills the address and port fields of `meta`.
#[inline(always)]
pub fn dns_packet<R: Reader>(
    r: &R,
    ethertype: u16,
    l3: u32,
    meta: &mut PacketMeta,
) -> Result<L4, i64> {
    let l4 = match ethertype {
        ETH_P_IP => ipv4(r, l3, meta)?,
        ETH_P_IPV6 => ipv6(r, l3, meta)?,
        _ => return Err(0),
    };
    transport(r, l4, meta)
}

#[inline(always)]
fn ipv4<R: Reader>(r: &R, off: u32, meta: &mut PacketMeta) -> Result<L4, i64> {
    let vihl: u8 = r.load(off)?;
    let ihl = u32::from(vihl & 0x0f) * 4;
    if vihl >> 4 != 4 || ihl < 20 {
        return Err(0);
    }
    let total = u32::from(u16::from_be(r.load::<u16>(off + 2)?));
    let frag = u16::from_be(r.load::<u16>(off + 6)?);
    if frag & 0x1fff != 0 {
        return Err(0); // a later fragment carries no ports
    }
    meta.l4_proto = r.load(off + 9)?;
    meta.saddr = [0; 16];
    meta.daddr = [0; 16];
    meta.saddr[..4].copy_from_slice(&r.load::<[u8; 4]>(off + 12)?);
    meta.daddr[..4].copy_from_slice(&r.load::<[u8; 4]>(off + 16)?);
    meta.ip_version = 4;
    Ok(L4 {
        offset: off + ihl,
        payload_len: total.saturating_sub(ihl),
        flags: if frag & 0x2000 != 0 { FLAG_FRAGMENT } else { 0 },
    })
}

#[inline(always)]
fn ipv6<R: Reader>(r: &R, off: u32, meta: &mut PacketMeta) -> Result<L4, i64> {
    let plen = u32::from(u16::from_be(r.load::<u16>(off + 4)?));
    let mut next: u8 = r.load(off + 6)?;
    meta.saddr = r.load(off + 8)?;
    meta.daddr = r.load(off + 24)?;
    meta.ip_version = 6;
    let mut l4 = L4 {
        offset: off + 40,
        payload_len: plen,
        flags: 0,
    };
    for _ in 0..MAX_EXT_HEADERS {
        let hdr_len = match next {
            IPPROTO_UDP | IPPROTO_TCP => {
                meta.l4_proto = next;
                return Ok(l4);
            }
            // hop-by-hop, routing, destination options: (len + 1) * 8
            0 | 43 | 60 => (u32::from(r.load::<u8>(l4.offset + 1)?) + 1) * 8,
            // authentication header: (len + 2) * 4
            51 => (u32::from(r.load::<u8>(l4.offset + 1)?) + 2) * 4,
            44 => {
                let frag = u16::from_be(r.load::<u16>(l4.offset + 2)?);
                if frag & 0xfff8 != 0 {
                    return Err(0);
                }
                if frag & 1 != 0 {
                    l4.flags |= FLAG_FRAGMENT;
                }
                8
            }
            _ => return Err(0),
        };
        next = r.load(l4.offset)?;
        l4.offset += hdr_len;
        l4.payload_len = l4.payload_len.saturating_sub(hdr_len);
    }
    Err(0)
}

#[inline(always)]
fn transport<R: Reader>(r: &R, mut l4: L4, meta: &mut PacketMeta) -> Result<L4, i64> {
    let ports: [u8; 4] = r.load(l4.offset)?;
    meta.sport = u16::from_be_bytes([ports[0], ports[1]]);
    meta.dport = u16::from_be_bytes([ports[2], ports[3]]);
    if !is_dns_port(meta.sport) && !is_dns_port(meta.dport) {
        return Err(0);
    }
    if meta.l4_proto == IPPROTO_UDP {
        let len = u32::from(u16::from_be(r.load::<u16>(l4.offset + 4)?));
        meta.tcp_seq = 0;
        meta.tcp_flags = 0;
        l4.payload_len = len.saturating_sub(8);
        l4.offset += 8;
    } else {
        meta.tcp_seq = u32::from_be(r.load::<u32>(l4.offset + 4)?);
        let doff = u32::from(r.load::<u8>(l4.offset + 12)? >> 4) * 4;
        meta.tcp_flags = r.load(l4.offset + 13)?;
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
    let want = if l4.payload_len < in_packet {
        l4.payload_len
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
    s.meta.payload_len = l4.payload_len;
    s.meta.cap_len = cap as u16;
    Ok(cap)
}
