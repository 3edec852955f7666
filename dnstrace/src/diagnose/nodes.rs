//! Rules across nodes, in a replay of several nodes' recordings: a
//! message that left one node for an address on another, which that
//! node's recording never saw arrive.
use dnstrace_common::Direction;

use super::{
    anomaly::{Finding, Words},
    places::{addr, ip, name, place},
    Context,
};
use crate::{
    correlate::{Journey, Leg, Outcome},
    decode::NodeId,
};

/// The query lost on its way to the resolver's node, or the answer on its
/// way back to the client's.
pub(super) fn lost_between_nodes<'a>(j: &'a Journey, ctx: &'a Context) -> Option<Finding<'a>> {
    if ctx.nodes.len() < 2 {
        return None;
    }
    // An answer seen anywhere makes the journey answered, delivered or not.
    let answered = matches!(j.outcome, Outcome::Answered { .. });
    let query = (!answered)
        .then(|| lost_on_the_way(j, ctx, false))
        .flatten();
    let lost = query.or_else(|| lost_on_the_way(j, ctx, true))?;
    let (from, to) = (name(ctx, lost.leg.node), name(ctx, lost.to));
    let what = if lost.leg.response {
        "answers"
    } else {
        "queries"
    };
    Some(Finding::new(
        super::AnomalyKind::LostBetweenNodes,
        format!("{from}→{to}"),
        move || {
            let evidence = vec![format!(
                "{} asked {} for {} {}; the {} {} → {} left {}, and {to}, where {} is, never saw it",
                addr(ctx, j.client),
                addr(ctx, j.origin().map_or(lost.leg.dst, |o| o.dst)),
                j.name,
                j.qtype,
                if lost.leg.response { "answer" } else { "query" },
                lost.leg.src,
                lost.leg.dst,
                place(ctx, lost.leg),
                ip(ctx, lost.leg.dst.ip())
            )];
            Words::new(format!("DNS {what} lost between {from} and {to}"), evidence)
        },
    ))
}

/// The last sighting of the query (or the answer), where it left a node
/// for an address on another node of the replay that saw no more of it.
pub(super) struct Lost<'a> {
    pub(super) leg: &'a Leg,
    pub(super) to: NodeId,
}

pub(super) fn lost_on_the_way<'a>(j: &'a Journey, ctx: &Context, answer: bool) -> Option<Lost<'a>> {
    let last = j.legs.iter().rfind(|l| l.response == answer)?;
    if last.direction() != Direction::Egress {
        return None;
    }
    let to = *ctx.homes.get(&last.dst.ip())?;
    let after = j.legs.iter().filter(|l| l.ts_ns >= last.ts_ns);
    let reached = after.clone().any(|l| l.node == to && l.response == answer);
    (to != last.node && !reached).then_some(Lost { leg: last, to })
}
