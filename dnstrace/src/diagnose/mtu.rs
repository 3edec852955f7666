//! Answers lost between two nodes for their size: on one path (from one
//! node to another), every answer lost is larger than the largest that
//! arrived, as where the underlay carries less than the overlay's MTU.
use std::collections::BTreeMap;

use dnstrace_common::Direction;

use super::{
    anomaly::{Finding, Words},
    nodes::lost_on_the_way,
    places::{name, place},
    AnomalyKind, Context,
};
use crate::{
    correlate::{Journey, Leg},
    decode::NodeId,
};

/// What answers did on one path: constant room per path, and a replay
/// has few nodes, so a path's lost answers wait for a delivered one
/// without bound in time.
#[derive(Clone, Default)]
struct Sizes {
    /// The largest answer that arrived, if one did (IP packet bytes).
    delivered: Option<u16>,
    lost: u64,
    smallest_lost: u16,
    largest_lost: u16,
    /// Where the smallest lost answer left its node.
    left_by: String,
    /// Raised already: a delivered answer raises it at most once.
    raised: bool,
}

impl Sizes {
    /// Every answer lost is larger than every one that arrived.
    fn explained(&self) -> bool {
        self.lost > 0 && self.delivered.is_some_and(|d| self.smallest_lost > d)
    }

    fn lose(&mut self, leg: &Leg, ctx: &Context) {
        if self.lost == 0 || leg.ip_len < self.smallest_lost {
            self.smallest_lost = leg.ip_len;
            self.left_by = format!("{} at {}", place(ctx, leg), leg.hook.name());
        }
        self.largest_lost = self.largest_lost.max(leg.ip_len);
        self.lost += 1;
    }
}

/// Answer sizes per path between nodes (from, to), in a merged replay.
#[derive(Default)]
pub(super) struct PathSizes(BTreeMap<(NodeId, NodeId), Sizes>);

impl PathSizes {
    /// Counts `j`'s answer on its path between nodes, lost or delivered;
    /// returns the finding a delivered answer raises where it explains
    /// answers lost before it (they raised `lost_between_nodes` then: no
    /// answer had yet shown what passes).
    pub(super) fn count(&mut self, j: &Journey, ctx: &Context) -> Option<Finding<'static>> {
        if ctx.nodes.len() < 2 || j.incomplete.is_some() {
            return None;
        }
        if let Some(lost) = lost_on_the_way(j, ctx, true).filter(|l| l.leg.ip_len > 0) {
            let s = self.0.entry((lost.leg.node, lost.to)).or_default();
            s.lose(lost.leg, ctx);
            // This journey's rule raises it.
            s.raised |= s.explained();
            return None;
        }
        let (leg, to) = delivered(j, ctx)?;
        let s = self.0.entry((leg.node, to)).or_default();
        s.delivered = s.delivered.max(Some(leg.ip_len));
        if s.raised || !s.explained() {
            return None;
        }
        s.raised = true;
        Some(finding(ctx, (leg.node, to), s.clone()))
    }
}

/// The answer that left one node for a client on another and arrived
/// there: where it left, and the client's node.
fn delivered<'a>(j: &'a Journey, ctx: &Context) -> Option<(&'a Leg, NodeId)> {
    let (left, to) = j.legs.iter().rev().find_map(|l| {
        let to = *ctx.homes.get(&l.dst.ip())?;
        let leaves = l.response && l.ip_len > 0 && l.direction() == Direction::Egress;
        (leaves && to != l.node).then_some((l, to))
    })?;
    let arrived = j
        .legs
        .iter()
        .any(|l| l.response && l.node == to && l.ts_ns >= left.ts_ns);
    arrived.then_some((left, to))
}

/// `j`'s answer lost between nodes, where its path's answers show that
/// only the large are lost: the overlay's MTU, not the generic loss.
pub(super) fn overlay_mtu<'a>(
    j: &Journey,
    ctx: &'a Context,
    paths: &PathSizes,
) -> Option<Finding<'a>> {
    if ctx.nodes.len() < 2 {
        return None;
    }
    let lost = lost_on_the_way(j, ctx, true)?;
    let path = (lost.leg.node, lost.to);
    let s = paths.0.get(&path).filter(|s| s.explained())?;
    Some(finding(ctx, path, s.clone()))
}

fn finding(ctx: &Context, (from, to): (NodeId, NodeId), s: Sizes) -> Finding<'static> {
    let (from, to) = (name(ctx, from), name(ctx, to));
    Finding::new(
        AnomalyKind::OverlayMtu,
        format!("{from}→{to}"),
        move || {
            let delivered = s.delivered.unwrap_or_default();
            let (more, up_to) = if s.largest_lost > s.smallest_lost {
                (" and more", format!(" to {}", s.largest_lost))
            } else {
                ("", String::new())
            };
            let summary = format!(
                "DNS answers of {} bytes{more} lost between {from} and {to}; smaller ones arrive",
                s.smallest_lost
            );
            let evidence = vec![
            format!(
                "{} answers from {from} to {to} lost on the way, of {}{up_to} bytes (IP packets); the smallest left by {}",
                s.lost, s.smallest_lost, s.left_by
            ),
            format!("the largest answer from {from} that reached {to}: {delivered} bytes"),
        ];
            let cause = format!(
            "the path from {from} to {to} carries packets of {delivered} bytes but not of {}: the underlay's MTU is below the overlay's plus its encapsulation (VXLAN's 50 bytes), or something on the way drops large packets, and the too large are dropped, not fragmented",
            s.smallest_lost
        );
            Words::new(summary, evidence).cause(cause)
        },
    )
}
