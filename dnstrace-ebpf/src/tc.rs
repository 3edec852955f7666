//! tc classifiers: packets on the interfaces named with --iface.
use aya_ebpf::programs::TcContext;
use dnstrace_common::{Hook, L2_LEN_MIXED};

use crate::{
    debug::{skip, Why},
    maps::{iface, in_scope, sampled_in, scoped, scratch, send, shed, tc_l2_len, viewed, wanted},
    packet::Packet,
    parse::{copy_payload, dns_headers, transport, Reader, IPPROTO_UDP},
};

const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;

pub fn try_capture(ctx: &TcContext, hook: Hook) -> Result<(), i64> {
    // SAFETY: reading a field of the program's own context.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    let r = Packet(&ctx.skb);
    // The interface's config costs a hash lookup: taken before parsing only
    // when the link-layer length differs between interfaces.
    let (early, l2_len) = match tc_l2_len() {
        L2_LEN_MIXED => {
            let found = iface(ifindex);
            (Some(found), found.map_or(14, |c| c.l2_len))
        }
        len => (None, len),
    };
    let (ethertype, l3) = link_layer(&r, l2_len)?;
    let dns = dns_headers(&r, ethertype, l3)?;
    let found = early.unwrap_or_else(|| iface(ifindex));
    let s = scratch().ok_or_else(|| skip(Why::NoScratch, 0))?;
    let l4 = transport(&r, dns, &mut s.meta)?.forgotten(s);
    s.meta.ifindex = ifindex;
    s.meta.netns = found.map_or(0, |c| c.netns);
    if scoped() && !in_scope(s.meta.netns) {
        return Err(skip(Why::OtherNode, s.meta.netns));
    }
    s.meta.wire_len = ctx.len();
    s.meta.hook = hook as u8;
    if !wanted(&s.meta) {
        return Err(skip(Why::NotTarget, s.meta.netns));
    }
    let cap = copy_payload(&r, &l4, s)?;
    if s.meta.l4_proto == IPPROTO_UDP {
        let head = s.payload.first_chunk::<32>().copied().unwrap_or([0; 32]);
        if !sampled_in(&head, cap as u32) && !viewed(&s.meta, &head, cap as u32) {
            return Err(shed());
        }
    }
    send(s, cap)
}

/// The ethertype and offset of the IP header, one or two VLAN tags skipped.
#[inline(always)]
fn link_layer(r: &Packet, l2_len: u32) -> Result<(u16, u32), i64> {
    if l2_len == 0 {
        return Ok((u16::from_be(r.0.protocol() as u16), 0));
    }
    let mut off = 12u32;
    let mut ethertype = u16::from_be(r.load::<u16>(off)?);
    for _ in 0..2 {
        if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
            break;
        }
        off += 4;
        ethertype = u16::from_be(r.load::<u16>(off)?);
    }
    Ok((ethertype, off + 2))
}
