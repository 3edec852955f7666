//! Every journey rule, in order; slow answers, a pattern across
//! journeys, are judged beside them (`slow`).
use super::{
    anomaly::Finding,
    conntrack::{half_pair_lost, CtSeen},
    loops::forwarding_loop,
    memory::Asked,
    mtu::{overlay_mtu, PathSizes},
    nat::{loopback_nameserver, not_translated, unexpected_source, LocalListeners},
    nodes::lost_between_nodes,
    outcome::{dropped, failing_answer, malformed_answer, unanswered},
    search::{ndots_amplification, search_leak, MissCosts},
    transport::fragment_lost,
    upstream::{upstream_failures, Upstreams},
    Context,
};
use crate::{correlate::Journey, decode::KernelNames};

/// What the rules read besides the journey.
pub(super) struct Known<'a> {
    pub(super) ctx: &'a Context,
    pub(super) upstream: &'a Upstreams,
    /// Answer sizes per path between nodes.
    pub(super) paths: &'a PathSizes,
    /// What the journey's client asked lately.
    pub(super) recent: &'a [&'a Asked],
    pub(super) names: &'a KernelNames,
    /// Service IPs answered on without DNAT.
    pub(super) local: &'a LocalListeners,
    pub(super) ct: &'a CtSeen,
    pub(super) miss_costs: &'a MissCosts,
    /// What the journey's search-list misses cost it, if it had any.
    pub(super) miss_cost: Option<u64>,
}

/// Every rule, in order; a rule that explains a journey silences the
/// generic ones (drop, no answer) that would only repeat it. Absence is
/// no evidence when events were lost: incomplete journeys raise nothing
/// for what was not seen.
pub(super) fn findings<'a>(j: &'a Journey, known: &Known<'a>) -> Vec<Finding<'a>> {
    let Known {
        ctx,
        upstream,
        paths,
        recent,
        names,
        local,
        ct,
        miss_costs,
        miss_cost,
    } = *known;
    let mut out = Vec::new();
    // Rules that conclude from what is missing (no DNAT, no answer).
    let seen_all = j.incomplete.is_none();
    let specific = [
        unexpected_source(j, ctx),
        seen_all.then(|| loopback_nameserver(j, ctx)).flatten(),
        seen_all
            .then(|| not_translated(j, ctx, local, ct))
            .flatten(),
        seen_all.then(|| forwarding_loop(j)).flatten(),
        // The answer's size explains its loss: the generic one would repeat it.
        seen_all
            .then(|| overlay_mtu(j, ctx, paths).or_else(|| lost_between_nodes(j, ctx)))
            .flatten(),
        seen_all
            .then(|| half_pair_lost(j, ctx, recent, names))
            .flatten(),
        fragment_lost(j, names, ctx),
    ];
    let explained = specific.iter().any(Option::is_some);
    out.extend(specific.into_iter().flatten());
    // A zone operation is no lookup: what its answer says, and names, are
    // no lookup's business.
    let lookup = j.is_lookup();
    if !explained {
        let upstream = upstream_failures(j, upstream, names, ctx);
        let upstream_failed = !upstream.is_empty();
        out.extend(upstream);
        out.extend(dropped(j, names, ctx));
        if lookup {
            out.extend(failing_answer(j));
        }
        out.extend(malformed_answer(j, ctx));
        if !upstream_failed && seen_all {
            out.extend(unanswered(j, recent, ctx));
        }
    }
    if lookup {
        out.extend(search_leak(j, recent, ctx));
        out.extend(ndots_amplification(j, recent, miss_cost, miss_costs, ctx));
    }
    out
}
