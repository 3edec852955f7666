//! tc classifiers: packets on the interfaces named with --iface.
use aya_ebpf::{helpers::generated::bpf_skb_load_bytes, programs::TcContext};
use dnstrace_common::Hook;

use crate::{
    maps::{scratch, send, wanted, IFACES},
    parse::{copy_payload, dns_packet, helper_result, Reader},
};

const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;

struct Tc<'a>(&'a TcContext);

impl Reader for Tc<'_> {
    #[inline(always)]
    fn load<T: Copy>(&self, off: u32) -> Result<T, i64> {
        self.0.load(off as usize)
    }

    #[inline(always)]
    fn copy(&self, off: u32, dst: *mut u8, len: u32) -> Result<(), i64> {
        // SAFETY: `dst` has room for PAYLOAD_MAX bytes and len is bounded by it.
        helper_result(unsafe { bpf_skb_load_bytes(self.0.skb.skb.cast(), off, dst.cast(), len) })
    }

    #[inline(always)]
    fn available(&self) -> u32 {
        self.0.len()
    }
}

pub fn try_capture(ctx: &TcContext, hook: Hook) -> Result<(), i64> {
    // SAFETY: reading a field of the program's own context.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: map lookup; the value is copied out.
    let iface = unsafe { IFACES.get(ifindex) }.copied();
    let s = scratch().ok_or(0)?;
    let r = Tc(ctx);
    let (ethertype, l3) = link_layer(ctx, iface.map_or(14, |c| c.l2_len))?;
    let l4 = dns_packet(&r, ethertype, l3, &mut s.meta)?;
    s.meta.ifindex = ifindex;
    s.meta.netns = iface.map_or(0, |c| c.netns);
    s.meta.wire_len = ctx.len();
    s.meta.hook = hook as u8;
    if !wanted(&s.meta) {
        return Err(0);
    }
    let cap = copy_payload(&r, &l4, s)?;
    send(s, cap);
    Ok(())
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
