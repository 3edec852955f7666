//! cgroup skb ingress: a packet as a socket is about to take it, where the
//! agent counts answers (`lookups::answer_taken`).
use aya_ebpf::programs::SkBuffContext;

use crate::{lookups, packet::Packet, parse::datagram};

pub fn try_answer(ctx: &SkBuffContext) -> Result<(), i64> {
    if !lookups::enabled() {
        return Ok(());
    }
    let ethertype = u16::from_be(ctx.skb.protocol() as u16);
    lookups::answer_taken(&datagram(&Packet(&ctx.skb), ethertype)?);
    Ok(())
}
