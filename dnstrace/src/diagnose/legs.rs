//! What the rules read from a journey's legs.
use std::net::IpAddr;

use super::{places::addr, Context};
use crate::correlate::{Journey, Leg};

/// `the answer for name A from 10.244.0.53:53 (kube-system/coredns-abc)
/// to 10.244.0.10:4000 (default/web)`: the message a leg saw.
pub(super) fn the_message(ctx: &Context, j: &Journey, leg: &Leg) -> String {
    format!(
        "the {} for {} {} from {} to {}",
        if leg.response { "answer" } else { "query" },
        j.name,
        j.qtype,
        addr(ctx, leg.src),
        addr(ctx, leg.dst)
    )
}

pub(super) fn is_loopback(ip: IpAddr) -> bool {
    ip.is_loopback()
}
