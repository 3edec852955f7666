//! What the rules read from a journey's legs.
use std::net::IpAddr;

use crate::correlate::{Journey, Leg};

/// `the answer 10.244.0.53:53 → 10.244.0.10:4000 (name A)`: the message a
/// leg saw.
pub(super) fn the_message(j: &Journey, leg: &Leg) -> String {
    format!(
        "the {} {} → {} ({} {})",
        if leg.response { "answer" } else { "query" },
        leg.src,
        leg.dst,
        j.name,
        j.qtype
    )
}

pub(super) fn place(l: &Leg) -> String {
    format!("{}@{}", l.iface.as_deref().unwrap_or("?"), l.netns)
}

pub(super) fn is_loopback(ip: IpAddr) -> bool {
    ip.is_loopback()
}
