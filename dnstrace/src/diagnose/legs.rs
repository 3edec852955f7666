//! What the rules read from a journey's legs.
use std::net::IpAddr;

use crate::correlate::{Journey, Leg};
use dnstrace_common::Direction;

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

/// The first query leg: where the client sent it.
pub(super) fn origin(j: &Journey) -> Option<&Leg> {
    j.legs.iter().find(|l| !l.response)
}

/// Answers that came back through the place the query left.
pub(super) fn answers_at_client(j: &Journey) -> impl Iterator<Item = &Leg> {
    let o = origin(j);
    j.legs.iter().filter(move |l| {
        l.response
            && o.is_some_and(|o| {
                l.netns == o.netns
                    && l.ifindex == o.ifindex
                    && l.direction() != o.direction()
                    && l.direction() != Direction::Drop
            })
    })
}

pub(super) fn is_loopback(ip: IpAddr) -> bool {
    ip.is_loopback()
}
