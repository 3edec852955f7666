//! A service's resolver endpoints: one that answers none of the lookups
//! kube-proxy gives it while another endpoint of the service answers its
//! own.
use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use super::{
    anomaly::{Finding, Words},
    nodes::lost_on_the_way,
    places::{ip, name},
    AnomalyKind, Context,
};
use crate::correlate::{Journey, Outcome};

/// A lookup DNATed to an endpoint, its name, and whether it got an answer.
#[derive(Clone)]
struct Sent {
    endpoint: SocketAddr,
    name: Arc<str>,
    answered: bool,
    ended_ns: u64,
}

/// One service's recent lookups, and its endpoints raised as down (until
/// they answer again).
#[derive(Default)]
struct Service {
    recent: VecDeque<Sent>,
    down: BTreeSet<SocketAddr>,
}

/// Lookups kept per service, services kept, and how far back a lookup
/// counts: a resolver hung now, against one that answered lately.
const SENT_KEPT: usize = 64;
const SERVICES_KEPT: usize = 256;
const WINDOW_NS: u64 = 60_000_000_000;

/// Lookups an endpoint left unanswered in a row, and another answered,
/// before one is called down.
const AT_LEAST: usize = 3;

/// Recent lookups per service address, by the endpoint they were DNATed to.
#[derive(Default)]
pub(super) struct Endpoints(BTreeMap<SocketAddr, Service>);

/// Whose a finding is: the journey counted's (it went unanswered), or
/// earlier ones' (this one's answer gave them another endpoint answering).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Whose {
    This,
    Earlier,
}

impl Endpoints {
    /// Counts `j`'s lookup against the endpoint it was sent to; returns
    /// the finding when an endpoint of its service is now down (once,
    /// until it answers again): `j`'s, or another that fell silent before
    /// `j`'s answer gave it one answering to compare with.
    pub(super) fn count(
        &mut self,
        j: &Journey,
        ctx: &Context,
    ) -> Option<(Finding<'static>, Whose)> {
        let &(service, endpoint) = j.dnat.as_deref()?;
        let answered = match j.outcome {
            Outcome::Answered { .. } => true,
            // No evidence of silence with legs missing; a query lost on its
            // way to the endpoint's node is the path's (`lost_between_nodes`);
            // one it forwarded upstream is its upstream's (`upstream_*`).
            Outcome::Timeout => {
                let lost = ctx.nodes.len() >= 2 && lost_on_the_way(j, ctx, false).is_some();
                if j.incomplete.is_some() || lost || !j.upstream.is_empty() {
                    return None;
                }
                false
            }
            // A drop names its own cause.
            Outcome::Dropped { .. } => return None,
        };
        if !self.0.contains_key(&service) && self.0.len() >= SERVICES_KEPT {
            return None;
        }
        let s = self.0.entry(service).or_default();
        s.remember(Sent {
            endpoint,
            name: j.name.clone(),
            answered,
            ended_ns: j.ended_ns,
        });
        let (down, whose) = if answered {
            s.down.remove(&endpoint);
            (s.newly_silent()?, Whose::Earlier)
        } else {
            (s.silent(endpoint)?, Whose::This)
        };
        s.down
            .insert(down.endpoint)
            .then(|| (finding(ctx, service, down), whose))
    }
}

impl Service {
    fn remember(&mut self, sent: Sent) {
        if self.recent.len() == SENT_KEPT {
            self.recent.pop_front();
        }
        let since = sent.ended_ns.saturating_sub(WINDOW_NS);
        while self.recent.front().is_some_and(|s| s.ended_ns < since) {
            self.recent.pop_front();
        }
        self.recent.push_back(sent);
    }

    /// An endpoint not raised yet that is silent now.
    /// Asked after every answered lookup: most find every lookup answered,
    /// and a service has a few endpoints, kept in a list, not a tree.
    fn newly_silent(&self) -> Option<Down> {
        if self.recent.iter().all(|s| s.answered) {
            return None;
        }
        let mut seen: Vec<SocketAddr> = Vec::new();
        self.recent
            .iter()
            .map(|s| s.endpoint)
            .filter(|e| {
                let new = !seen.contains(e);
                if new {
                    seen.push(*e);
                }
                new && !self.down.contains(e)
            })
            .find_map(|e| self.silent(e))
    }

    /// `endpoint`'s share, if it left its last `AT_LEAST` or more lookups
    /// unanswered while another endpoint answered `AT_LEAST` or more, one
    /// of them a name it left unanswered: names that fail everywhere (an
    /// upstream down, out of this node's sight) are no endpoint's fault.
    fn silent(&self, endpoint: SocketAddr) -> Option<Down> {
        let streak: Vec<&Sent> = self
            .recent
            .iter()
            .rev()
            .filter(|s| s.endpoint == endpoint)
            .take_while(|s| !s.answered)
            .collect();
        // Every answered lookup asks: most endpoints answer, so stop here.
        if streak.len() < AT_LEAST {
            return None;
        }
        let mut others: BTreeMap<SocketAddr, (usize, usize)> = BTreeMap::new();
        let mut same_name = false;
        for s in self.recent.iter().filter(|s| s.endpoint != endpoint) {
            let (answered, all) = others.entry(s.endpoint).or_default();
            *answered += usize::from(s.answered);
            *all += 1;
            same_name |= s.answered && streak.iter().any(|u| u.name == s.name);
        }
        let answering = others.values().any(|(answered, _)| *answered >= AT_LEAST);
        (answering && same_name).then(|| Down {
            endpoint,
            unanswered: streak.len(),
            lookups: self.recent.len(),
            others: others.into_iter().collect(),
        })
    }
}

/// An endpoint that answers none of its share: its lookups unanswered in
/// a row, the service's lookups in the window, and each other endpoint's
/// (answered, all).
struct Down {
    endpoint: SocketAddr,
    unanswered: usize,
    lookups: usize,
    others: Vec<(SocketAddr, (usize, usize))>,
}

fn finding(ctx: &Context, service: SocketAddr, d: Down) -> Finding<'static> {
    let (svc, ep) = (service.ip(), d.endpoint.ip());
    // In a merged replay: the node the endpoint's pod lives on.
    let node = ctx
        .homes
        .get(&ep)
        .filter(|_| ctx.nodes.len() >= 2)
        .map(|n| name(ctx, *n));
    // Named now: the finding outlives the context it is raised in.
    let others = d.others.iter().map(|(e, _)| e.ip());
    let named: BTreeMap<IpAddr, String> = [svc, ep]
        .into_iter()
        .chain(others)
        .map(|a| (a, ip(ctx, a)))
        .collect();
    Finding::new(
        AnomalyKind::ResolverEndpointDown,
        format!("{service}→{}", d.endpoint),
        move || {
            let on = node.as_ref().map_or(String::new(), |n| format!(" on {n}"));
            let answering: Vec<String> = d
                .others
                .iter()
                .filter(|(_, (answered, _))| *answered > 0)
                .map(|(e, _)| e.ip().to_string())
                .collect();
            let does = if answering.len() == 1 { "does" } else { "do" };
            let summary = format!(
                "the resolver endpoint {ep}{on} of {svc} does not answer; {} {does}",
                answering.join(" and ")
            );
            let others: Vec<String> = d
                .others
                .iter()
                .map(|(e, (answered, all))| {
                    let e = &named[&e.ip()];
                    if answered == all {
                        format!("{e} answered its {all}")
                    } else {
                        format!("{e} answered {answered} of its {all}")
                    }
                })
                .collect();
            let mut evidence = vec![format!(
                "{} of {} lookups to {} went to {} and got no answer; {}",
                d.unanswered,
                d.lookups,
                named[&svc],
                named[&ep],
                others.join(", ")
            )];
            if let Some(n) = &node {
                evidence.push(format!("{ep} is a pod on {n}"));
            }
            Words::new(summary, evidence).about(vec![ep])
        },
    )
}
