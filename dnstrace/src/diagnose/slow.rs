//! Slow answers, raised on a pattern: several from one client, or from
//! one server, within a minute. One cold lookup is no finding.
use std::{collections::VecDeque, net::IpAddr};

use super::{
    anomaly::{Finding, Words},
    outcome::resolver_here,
    places::{addr, ip, place},
    AnomalyKind, Context,
};
use crate::correlate::{Journey, Leg, Outcome};

/// An answer slower than this is slow.
const SLOW_NS: u64 = 200_000_000;

/// Slow answers from one client, or from one server, that make a pattern.
const PATTERN: usize = 3;

/// How close together they must be.
const WINDOW_NS: u64 = 60_000_000_000;

/// Slow answers remembered at most: a storm of them is a pattern long
/// before this.
const KEPT: usize = 256;

/// A slow answer seen lately.
struct Seen {
    ended_ns: u64,
    client: IpAddr,
    server: IpAddr,
    journey: u64,
    total_ns: u64,
    /// Already counted in the anomaly, as part of a pattern.
    counted: bool,
}

/// Which side the slow answers of a pattern share.
#[derive(Clone, Copy)]
enum Shared {
    Client(IpAddr),
    Server(IpAddr),
}

/// The pattern a slow answer is part of, as its finding states it.
struct Pattern {
    shared: Shared,
    count: usize,
    typical_ns: u64,
    worst_ns: u64,
}

/// The slow answers of the last minute.
#[derive(Default)]
pub(super) struct SlowAnswers(VecDeque<Seen>);

impl SlowAnswers {
    /// The finding for `j` if it is a slow answer in a pattern; the first
    /// time a pattern holds, the finding stands for its earlier answers
    /// too.
    pub(super) fn judge<'a>(&mut self, j: &'a Journey, ctx: &'a Context) -> Option<Finding<'a>> {
        if !matches!(j.outcome, Outcome::Answered { .. }) || j.total_ns() < SLOW_NS {
            return None;
        }
        let split = split(j)?;
        self.remember(j);
        let (pattern, earlier) = self.pattern()?;
        Some(finding(j, split, pattern, ctx).standing_for(earlier))
    }

    fn remember(&mut self, j: &Journey) {
        let now = j.ended_ns;
        while self
            .0
            .front()
            .is_some_and(|s| s.ended_ns.saturating_add(WINDOW_NS) < now || self.0.len() >= KEPT)
        {
            self.0.pop_front();
        }
        let server = j
            .dnat
            .as_ref()
            .map(|d| d.1)
            .or_else(|| j.origin().map(|o| o.dst))
            .map_or(j.client.ip(), |s| s.ip());
        self.0.push_back(Seen {
            ended_ns: now,
            client: j.client.ip(),
            server,
            journey: j.id,
            total_ns: j.total_ns(),
            counted: false,
        });
    }

    /// The pattern the newest slow answer is part of, if it is, and the
    /// journeys of it not counted yet (the newest's own aside); marks them
    /// counted.
    fn pattern(&mut self) -> Option<(Pattern, Vec<u64>)> {
        let newest = self.0.back()?;
        let by_client = Shared::Client(newest.client);
        let by_server = Shared::Server(newest.server);
        // The server on a tie (max_by_key keeps the last).
        let shared = [by_client, by_server]
            .into_iter()
            .max_by_key(|s| self.0.iter().filter(|o| s.holds(o)).count())?;
        let members: Vec<&mut Seen> = self.0.iter_mut().filter(|o| shared.holds(o)).collect();
        if members.len() < PATTERN {
            return None;
        }
        let mut times: Vec<u64> = members.iter().map(|m| m.total_ns).collect();
        times.sort_unstable();
        let pattern = Pattern {
            shared,
            count: members.len(),
            typical_ns: times[times.len() / 2],
            worst_ns: times[times.len() - 1],
        };
        let last = members.len() - 1;
        let mut earlier = Vec::new();
        for (i, m) in members.into_iter().enumerate() {
            if i < last && !m.counted {
                earlier.push(m.journey);
            }
            m.counted = true;
        }
        Some((pattern, earlier))
    }
}

impl Shared {
    fn holds(self, s: &Seen) -> bool {
        match self {
            Shared::Client(ip) => s.client == ip,
            Shared::Server(ip) => s.server == ip,
        }
    }

    fn words(self, ctx: &Context) -> String {
        match self {
            Shared::Client(at) => format!("to the client {}", ip(ctx, at)),
            Shared::Server(at) => format!("from the server {}", ip(ctx, at)),
        }
    }
}

/// Where the time of a slow answer went: the server's own work, its
/// upstream queries, or the network in between; or, with the server on
/// another node, past this node, where those cannot be told apart.
fn split(j: &Journey) -> Option<Split<'_>> {
    let arrival = j.legs.iter().rfind(|l| !l.response)?;
    let reply = j.legs.iter().find(|l| l.response)?;
    let away = reply.ts_ns.saturating_sub(arrival.ts_ns);
    let network = j.total_ns().saturating_sub(away);
    Some(if resolver_here(j) {
        let upstream = upstream_time(j, reply.ts_ns);
        Split::Here {
            upstream,
            resolver: away.saturating_sub(upstream),
            network,
        }
    } else {
        Split::Elsewhere {
            away,
            network,
            left: arrival,
        }
    })
}

/// The finding for slow answers like `j`'s, keyed by where most of the
/// time went.
fn finding<'a>(j: &'a Journey, split: Split<'a>, p: Pattern, ctx: &'a Context) -> Finding<'a> {
    let most = split.most();
    Finding::new(
        AnomalyKind::SlowAnswers,
        most.name().to_owned(),
        move || {
            let summary = format!(
                "slow answers: typically {:.0} ms, worst {:.0} ms, most of it in {}",
                ms(p.typical_ns),
                ms(p.worst_ns),
                most.name()
            );
            let evidence = vec![
                format!(
                    "{} {}: {:.1} ms in all; {}",
                    j.name,
                    j.qtype,
                    ms(j.total_ns()),
                    split.parts(ctx)
                ),
                format!(
                    "{} answers {} took over {} ms within {} s",
                    p.count,
                    p.shared.words(ctx),
                    SLOW_NS / 1_000_000,
                    WINDOW_NS / 1_000_000_000
                ),
            ];
            let words = Words::new(summary, evidence).cause(most.cause().into());
            match most {
            Part::PastThisNode => words.fix("trace on the resolver's node, where its own time and its upstream queries are visible; `dig @<resolver>` from this node and from that one compares the path with the resolver"),
            _ => words,
        }
        },
    )
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Where a slow answer's time can go, as this node sees it.
#[derive(Clone, Copy)]
enum Part {
    Upstream,
    Resolver,
    Network,
    /// Past this node, where the resolver and its upstream queries run.
    PastThisNode,
}

impl Part {
    fn name(self) -> &'static str {
        match self {
            Part::Upstream => "upstream",
            Part::Resolver => "the resolver itself",
            Part::Network => "the network",
            Part::PastThisNode => "the resolver's node, out of sight from here",
        }
    }

    fn cause(self) -> &'static str {
        match self {
            Part::Upstream => "the upstream resolver is slow to answer",
            Part::Resolver => "the resolver is slow (overloaded, throttled CPU, or waiting on something other than its upstream)",
            Part::Network => "the network between the client and the resolver is slow or lossy",
            Part::PastThisNode => "the time went past this node: the path to the resolver's node, the resolver, or its upstream; this node sees none of them apart",
        }
    }
}

/// How a slow answer's time divides, as far as this node can see.
enum Split<'a> {
    /// The query ended its way on this node: the resolver runs here.
    Here {
        upstream: u64,
        resolver: u64,
        network: u64,
    },
    /// The query left this node at `left`: the resolver, its upstream
    /// queries and the path to it are one time seen from here.
    Elsewhere {
        away: u64,
        network: u64,
        left: &'a Leg,
    },
}

impl Split<'_> {
    /// The part that took the most time (the later one of equals).
    fn most(&self) -> Part {
        let parts = match *self {
            Split::Here {
                upstream,
                resolver,
                network,
            } => vec![
                (Part::Upstream, upstream),
                (Part::Resolver, resolver),
                (Part::Network, network),
            ],
            Split::Elsewhere { away, network, .. } => {
                vec![(Part::PastThisNode, away), (Part::Network, network)]
            }
        };
        parts
            .into_iter()
            .max_by_key(|(_, ns)| *ns)
            .map_or(Part::Network, |(p, _)| p)
    }

    fn parts(&self, ctx: &Context) -> String {
        match *self {
            Split::Here {
                upstream,
                resolver,
                network,
            } => format!(
                "{:.1} ms upstream, {:.1} ms in the resolver, {:.1} ms on the network",
                ms(upstream),
                ms(resolver),
                ms(network)
            ),
            Split::Elsewhere { away, network, left } => format!(
                "{:.1} ms from when the query left this node at {} for {} until its answer came back, {:.1} ms on this node; the resolver is on another node: its own time and its upstream queries are not visible from here",
                ms(away),
                place(ctx, left),
                addr(ctx, left.dst),
                ms(network)
            ),
        }
    }
}

/// The time the resolver waited on its upstream queries (at once or one
/// after another): an answered one until its answer, an unanswered try
/// until the resolver moved on (its next try, or its own answer at
/// `answered_ns`), none past that answer.
fn upstream_time(j: &Journey, answered_ns: u64) -> u64 {
    let mut tries: Vec<&Journey> = j.upstream.iter().collect();
    tries.sort_by_key(|u| u.started_ns);
    let (mut total, mut until) = (0, 0);
    for (i, u) in tries.iter().enumerate() {
        let end = match u.outcome {
            Outcome::Answered { .. } => u.ended_ns,
            _ => tries.get(i + 1).map_or(answered_ns, |next| next.started_ns),
        };
        // An answer after the resolver's own was not waited for.
        let end = end.min(answered_ns);
        let start = u.started_ns.max(until);
        total += end.saturating_sub(start);
        until = until.max(end);
    }
    total
}
