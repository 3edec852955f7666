//! cgroup skb egress and ingress, attached at cgroup v2's root: a packet
//! as a socket sends it, or is about to take it. Where the agent counts
//! lookups (`lookups`): a query as its client sends it, an answer as its
//! client takes it.
use aya_ebpf::{helpers::bpf_probe_read_kernel, programs::SkBuffContext};
use dnstrace_common::{lookups::QUESTION_READ, COUNT_FOLLOWED, COUNT_LAPS};

use crate::{
    laps,
    lookups::{self, Ends, Query},
    maps::{count, offset, sampled_in},
    packet::Packet,
    parse::{datagram, Datagram, Reader, ETH_P_IP, ETH_P_IPV6, IPPROTO_TCP},
    skb::{original_ends, socket_on_this_node},
};

pub fn try_query(ctx: &SkBuffContext) -> Result<(), i64> {
    if !lookups::enabled() || !socket_on_this_node(ctx.skb.skb.cast()) {
        return Ok(());
    }
    let r = Packet(&ctx.skb);
    let Some(d) = udp(ctx, &r)?.filter(lookups::is_query) else {
        return Ok(());
    };
    // Its name, for the sampling level, and its question's type.
    let mut message = [0u8; QUESTION_READ];
    let len = r
        .available()
        .saturating_sub(d.message_at)
        .min(QUESTION_READ as u32);
    if len < 12 {
        return Ok(());
    }
    r.copy(d.message_at, message.as_mut_ptr(), len)?;
    let valid = d.message_len.min(len);
    let q = Query {
        datagram: &d,
        ends: sent_as(ctx).unwrap_or(Ends {
            client: d.saddr,
            port: d.sport,
            server: d.daddr,
            server_port: d.dport,
        }),
        message: &message,
        valid,
    };
    let head = message.first_chunk::<32>().ok_or(0i64)?;
    // A lap of a query going round (a forwarding loop) is the lookup it
    // was, not one more to count and follow.
    if laps::lapped(&laps::Seen::at_socket(&d, head, valid)) {
        count(COUNT_LAPS);
        return Ok(());
    }
    if lookups::query_made(&q) && sampled_in(head, valid) {
        count(COUNT_FOLLOWED);
    }
    Ok(())
}

pub fn try_answer(ctx: &SkBuffContext) -> Result<(), i64> {
    if !lookups::enabled() || !socket_on_this_node(ctx.skb.skb.cast()) {
        return Ok(());
    }
    let r = Packet(&ctx.skb);
    if let Some(d) = udp(ctx, &r)? {
        lookups::answer_taken(&d);
    }
    Ok(())
}

/// The packet, if it is a UDP datagram to or from a DNS port.
#[inline(always)]
fn udp(ctx: &SkBuffContext, r: &Packet) -> Result<Option<Datagram>, i64> {
    let ethertype = u16::from_be(ctx.skb.protocol() as u16);
    // Most of what sockets send and take is TCP: out before the port
    // tests. The IPv4 protocol (after the TTL) or the IPv6 next header
    // (before the hop limit): a load is at least two bytes.
    let proto = match ethertype {
        ETH_P_IP => r.load::<[u8; 2]>(8)?[1],
        ETH_P_IPV6 => r.load::<[u8; 2]>(6)?[0],
        _ => return Ok(None),
    };
    if proto == IPPROTO_TCP {
        return Ok(None);
    }
    datagram(r, ethertype).map(Some)
}

/// A packet's ends as its socket sent it, before any NAT on its way out:
/// the original direction of its conntrack entry. A host network client's
/// query to a service IP is DNATed in OUTPUT and perhaps masqueraded in
/// POSTROUTING, both before this hook; its answer is un-NATed before the
/// socket takes it, from the service IP to the client's own address. None
/// without conntrack, or in the reply direction.
#[inline(always)]
fn sent_as(ctx: &SkBuffContext) -> Option<Ends> {
    let nfct_at = offset(|o| &o.skb_nfct);
    if nfct_at == 0 {
        return None;
    }
    // The context is the skb itself; root may read through it.
    let skb = ctx.skb.skb as *const u8;
    // SAFETY: a checked read of kernel memory; a bad address fails cleanly.
    let nfct = unsafe { bpf_probe_read_kernel(skb.add(nfct_at as usize).cast::<u64>()) }.ok()?;
    original_ends(nfct)
}
