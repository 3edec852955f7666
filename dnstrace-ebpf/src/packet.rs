//! Parse a packet down to its L4 header, keep DNS, copy it to the ring buffer.

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::{bpf_ktime_get_ns, bpf_ringbuf_output, bpf_skb_load_bytes},
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::TcContext,
};
use dnstrace_common::{
    port_slot, EventHeader, EventKind, Hook, PacketMeta, FLAG_FRAGMENT, FLAG_TRUNCATED,
    PACKET_META_SIZE, PAYLOAD_MAX, PORT_WORDS, SCHEMA_VERSION,
};

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
/// IPv6 extension headers walked before giving up on finding L4.
const MAX_EXT_HEADERS: usize = 6;

/// Per-interface facts only user space knows.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IfaceConfig {
    /// Inode of the network namespace the interface lives in.
    pub netns: u32,
    /// Bytes of link-layer header before the IP header (14, or 0 on L3 devices).
    pub l2_len: u32,
}

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(4 << 20, 0);

/// Ring buffer reservations that failed, per CPU: lost events are counted.
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[map]
static PORTS: Array<u32> = Array::with_max_entries(PORT_WORDS, 0);

#[map]
static IFACES: HashMap<u32, IfaceConfig> = HashMap::with_max_entries(1024, BPF_F_NO_PREALLOC);

/// Room to assemble one event: too large for the 512-byte eBPF stack.
#[repr(C)]
pub struct Scratch {
    meta: PacketMeta,
    payload: [u8; PAYLOAD_MAX],
}

#[map]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// What parsing found about L3/L4.
struct L4 {
    offset: u32,
    payload_len: u32,
    flags: u8,
}

#[inline(always)]
fn is_dns_port(port: u16) -> bool {
    let (word, bit) = port_slot(port);
    PORTS.get(word).is_some_and(|w| w & bit != 0)
}

pub fn try_capture(ctx: &TcContext, hook: Hook) -> Result<(), i64> {
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    let iface = unsafe { IFACES.get(ifindex) }.copied();
    let l2_len = iface.map_or(14, |c| c.l2_len);
    let scratch = SCRATCH.get_ptr_mut(0).ok_or(0)?;
    // SAFETY: per-CPU map value, not shared with another program run on this CPU.
    let meta = unsafe { &mut (*scratch).meta };
    let (ethertype, l3) = link_layer(ctx, l2_len)?;
    let l4 = match ethertype {
        ETH_P_IP => ipv4(ctx, l3, meta)?,
        ETH_P_IPV6 => ipv6(ctx, l3, meta)?,
        _ => return Ok(()),
    };
    let l4 = transport(ctx, l4, meta)?;
    meta.ts_ns = unsafe { bpf_ktime_get_ns() };
    meta.ifindex = ifindex;
    meta.netns = iface.map_or(0, |c| c.netns);
    meta.wire_len = ctx.len();
    meta.hook = hook as u8;
    copy_and_send(ctx, scratch, l4)
}

/// The ethertype and offset of the IP header, one or two VLAN tags skipped.
#[inline(always)]
fn link_layer(ctx: &TcContext, l2_len: u32) -> Result<(u16, u32), i64> {
    if l2_len == 0 {
        return Ok((u16::from_be(ctx.skb.protocol() as u16), 0));
    }
    let mut off = 12u32;
    let mut ethertype = u16::from_be(ctx.load::<u16>(off as usize)?);
    for _ in 0..2 {
        if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
            break;
        }
        off += 4;
        ethertype = u16::from_be(ctx.load::<u16>(off as usize)?);
    }
    Ok((ethertype, off + 2))
}

#[inline(always)]
fn ipv4(ctx: &TcContext, off: u32, meta: &mut PacketMeta) -> Result<L4, i64> {
    let vihl: u8 = ctx.load(off as usize)?;
    let ihl = u32::from(vihl & 0x0f) * 4;
    if vihl >> 4 != 4 || ihl < 20 {
        return Err(0);
    }
    let total = u32::from(u16::from_be(ctx.load::<u16>(off as usize + 2)?));
    let frag = u16::from_be(ctx.load::<u16>(off as usize + 6)?);
    if frag & 0x1fff != 0 {
        return Err(0); // a later fragment carries no ports
    }
    meta.l4_proto = ctx.load(off as usize + 9)?;
    meta.saddr = [0; 16];
    meta.daddr = [0; 16];
    meta.saddr[..4].copy_from_slice(&ctx.load::<[u8; 4]>(off as usize + 12)?);
    meta.daddr[..4].copy_from_slice(&ctx.load::<[u8; 4]>(off as usize + 16)?);
    meta.ip_version = 4;
    Ok(L4 {
        offset: off + ihl,
        payload_len: total.saturating_sub(ihl),
        flags: if frag & 0x2000 != 0 { FLAG_FRAGMENT } else { 0 },
    })
}

#[inline(always)]
fn ipv6(ctx: &TcContext, off: u32, meta: &mut PacketMeta) -> Result<L4, i64> {
    let plen = u32::from(u16::from_be(ctx.load::<u16>(off as usize + 4)?));
    let mut next: u8 = ctx.load(off as usize + 6)?;
    meta.saddr = ctx.load(off as usize + 8)?;
    meta.daddr = ctx.load(off as usize + 24)?;
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
            0 | 43 | 60 => (u32::from(ctx.load::<u8>(l4.offset as usize + 1)?) + 1) * 8,
            // authentication header: (len + 2) * 4
            51 => (u32::from(ctx.load::<u8>(l4.offset as usize + 1)?) + 2) * 4,
            44 => {
                let frag = u16::from_be(ctx.load::<u16>(l4.offset as usize + 2)?);
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
        next = ctx.load(l4.offset as usize)?;
        l4.offset += hdr_len;
        l4.payload_len = l4.payload_len.saturating_sub(hdr_len);
    }
    Err(0)
}

/// Reads UDP/TCP ports; fails (skipping the packet) unless one is a DNS port.
#[inline(always)]
fn transport(ctx: &TcContext, mut l4: L4, meta: &mut PacketMeta) -> Result<L4, i64> {
    let ports: [u8; 4] = ctx.load(l4.offset as usize)?;
    meta.sport = u16::from_be_bytes([ports[0], ports[1]]);
    meta.dport = u16::from_be_bytes([ports[2], ports[3]]);
    if !is_dns_port(meta.sport) && !is_dns_port(meta.dport) {
        return Err(0);
    }
    match meta.l4_proto {
        IPPROTO_UDP => {
            let len = u32::from(u16::from_be(ctx.load::<u16>(l4.offset as usize + 4)?));
            meta.tcp_seq = 0;
            meta.tcp_flags = 0;
            l4.payload_len = len.saturating_sub(8);
            l4.offset += 8;
        }
        _ => {
            meta.tcp_seq = u32::from_be(ctx.load::<u32>(l4.offset as usize + 4)?);
            let doff = u32::from(ctx.load::<u8>(l4.offset as usize + 12)? >> 4) * 4;
            meta.tcp_flags = ctx.load(l4.offset as usize + 13)?;
            l4.payload_len = l4.payload_len.saturating_sub(doff);
            l4.offset += doff;
        }
    }
    Ok(l4)
}

#[inline(always)]
fn copy_and_send(ctx: &TcContext, scratch: *mut Scratch, l4: L4) -> Result<(), i64> {
    let in_skb = ctx.len().saturating_sub(l4.offset);
    let want = if l4.payload_len < in_skb {
        l4.payload_len
    } else {
        in_skb
    };
    let mut cap = want as usize;
    if cap > PAYLOAD_MAX {
        cap = PAYLOAD_MAX;
    }
    // SAFETY: per-CPU scratch owned by this run; `cap` is bounded by the buffer.
    unsafe {
        let meta = &mut (*scratch).meta;
        if cap > 0 {
            let dst = (*scratch).payload.as_mut_ptr();
            let ret = bpf_skb_load_bytes(ctx.skb.skb.cast(), l4.offset, dst.cast(), cap as u32);
            if ret != 0 {
                return Err(ret);
            }
        }
        meta.flags = l4.flags;
        if (cap as u32) < l4.payload_len {
            meta.flags |= FLAG_TRUNCATED;
        }
        meta.payload_len = l4.payload_len;
        meta.cap_len = cap as u16;
        let size = PACKET_META_SIZE + cap;
        meta.header = EventHeader {
            kind: EventKind::Packet as u16,
            version: SCHEMA_VERSION,
            size: size as u32,
        };
        let ret = bpf_ringbuf_output(
            (&raw const EVENTS).cast_mut().cast(),
            scratch.cast(),
            size as u64,
            0,
        );
        if ret != 0 {
            count_lost();
        }
    }
    Ok(())
}

#[inline(always)]
fn count_lost() {
    if let Some(n) = LOST.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, no concurrent writer.
        unsafe { *n += 1 };
    }
}
