//! cgroup skb ingress: a packet as a socket is about to take it, where the
//! agent counts answers (`lookups::answer_taken`).
use aya_ebpf::programs::SkBuffContext;

use crate::{
    lookups,
    packet::Packet,
    parse::{datagram, Reader, ETH_P_IP, ETH_P_IPV6, IPPROTO_TCP},
};

pub fn try_answer(ctx: &SkBuffContext) -> Result<(), i64> {
    if !lookups::enabled() {
        return Ok(());
    }
    let ethertype = u16::from_be(ctx.skb.protocol() as u16);
    let r = Packet(&ctx.skb);
    // Most of what sockets take is TCP: out before the port tests. The
    // IPv4 protocol (after the TTL) or the IPv6 next header (before the
    // hop limit): a load is at least two bytes.
    let proto = match ethertype {
        ETH_P_IP => r.load::<[u8; 2]>(8)?[1],
        ETH_P_IPV6 => r.load::<[u8; 2]>(6)?[0],
        _ => return Ok(()),
    };
    if proto == IPPROTO_TCP {
        return Ok(());
    }
    lookups::answer_taken(&datagram(&r, ethertype)?);
    Ok(())
}
