//! Upstream servers: how each has answered so far, and those that do not.
use std::{
    collections::{BTreeMap, VecDeque},
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use super::{
    anomaly::{Finding, Words},
    places::ip,
    AnomalyKind, Context,
};
use crate::{
    correlate::{Journey, Outcome},
    decode::{KernelNames, Qtype},
};

#[derive(Clone, Copy, Debug, Default)]
struct UpstreamStats {
    queries: u64,
    answers: u64,
    timeouts: u64,
    total_ns: u64,
}

/// What each upstream server did so far, by its address; and the TCP
/// queries answered lately.
#[derive(Default)]
pub(super) struct Upstreams {
    servers: BTreeMap<SocketAddr, UpstreamStats>,
    tcp_answers: VecDeque<TcpAnswer>,
}

/// A TCP query to an upstream that was answered: the resolver's socket,
/// the question, when it was sent.
struct TcpAnswer {
    from: SocketAddr,
    name: Arc<str>,
    qtype: Qtype,
    started_ns: u64,
}

/// Answered TCP queries kept: a retry comes within a millisecond or so of
/// the failed query, judged a timeout (3 s) later.
const TCP_ANSWERS_KEPT: usize = 4096;

impl Upstreams {
    /// Counts the upstream queries of `j` and of theirs.
    pub(super) fn count(&mut self, j: &Journey) {
        for u in &j.upstream {
            let Some(server) = u.legs.first().map(|l| l.dst) else {
                continue;
            };
            let s = self.servers.entry(server).or_default();
            s.queries += 1;
            match u.outcome {
                Outcome::Answered { .. } => {
                    s.answers += 1;
                    s.total_ns += u.total_ns();
                    if u.tcp {
                        self.remember_tcp(u);
                    }
                }
                // Cut off or missing legs: no evidence of a timeout.
                Outcome::Timeout if u.incomplete.is_none() => s.timeouts += 1,
                Outcome::Timeout | Outcome::Dropped { .. } => {}
            }
            self.count(u);
        }
    }

    fn remember_tcp(&mut self, u: &Journey) {
        if self.tcp_answers.len() == TCP_ANSWERS_KEPT {
            self.tcp_answers.pop_front();
        }
        self.tcp_answers.push_back(TcpAnswer {
            from: u.client,
            name: u.name.clone(),
            qtype: u.qtype,
            started_ns: u.started_ns,
        });
    }

    /// `u`, a TCP query, was asked again by its resolver on a new
    /// connection and answered there (for the same client or another
    /// asking the same): the upstream answers, and what failed was the
    /// first connection (closed under it, as when a CoreDNS pod restarts
    /// or drops an idle connection). TCP itself resends what is lost on a
    /// live one.
    fn answered_on_a_new_connection(&self, u: &Journey) -> bool {
        u.tcp
            && self.tcp_answers.iter().any(|a| {
                a.from.ip() == u.client.ip()
                    && a.from != u.client
                    && a.started_ns > u.started_ns
                    && a.name == u.name
                    && a.qtype == u.qtype
            })
    }
}

/// An upstream query that got no answer.
struct UpstreamFailure {
    server: SocketAddr,
    resolver: IpAddr,
    /// Dropped on the way (reason, location), or timed out.
    drop: Option<(u32, u64)>,
    /// Its answer came this long after the query and found the resolver's
    /// socket closed: the resolver had given up.
    late_ns: Option<u64>,
}

/// How long after `u` was sent its answer reached a closed socket at the
/// resolver (NO_SOCKET), if it did.
fn answered_too_late(u: &Journey, names: &KernelNames) -> Option<u64> {
    let leg = u.legs.iter().rfind(|l| l.response && l.drop.is_some())?;
    let &(reason, _) = leg.drop.as_deref()?;
    let at_resolver = leg.dst.ip() == u.client.ip();
    (at_resolver && names.drop_reason(reason) == "NO_SOCKET")
        .then(|| leg.ts_ns.saturating_sub(u.started_ns))
}

/// A TCP query the server's kernel threw away because the connection was
/// closing or gone there (the server had closed it: an idle timeout, a
/// restart, whose new listener refuses the old connection's data with
/// TCP_FLAGS): the resolver asks again on a new one, which may be judged
/// later than this.
fn connection_gone(u: &Journey, names: &KernelNames) -> bool {
    let Outcome::Dropped { reason, .. } = u.outcome else {
        return false;
    };
    u.tcp
        && matches!(
            names.drop_reason(reason).as_str(),
            "TCP_ABORT_ON_DATA" | "TCP_FLAGS" | "TCP_CLOSE" | "NO_SOCKET"
        )
}

fn failed_upstream(
    j: &Journey,
    stats: &Upstreams,
    names: &KernelNames,
    out: &mut Vec<UpstreamFailure>,
) {
    for u in &j.upstream {
        if stats.answered_on_a_new_connection(u) || connection_gone(u, names) {
            continue;
        }
        let drop = match u.outcome {
            Outcome::Answered { .. } => None,
            Outcome::Timeout => Some(None),
            Outcome::Dropped { reason, location } => Some(Some((reason, location))),
        };
        if let (Some(drop), Some(first)) = (drop, u.legs.first()) {
            // A timeout is no evidence when events were lost; a drop is.
            if u.incomplete.is_none() || drop.is_some() {
                out.push(UpstreamFailure {
                    server: first.dst,
                    resolver: u.client.ip(),
                    drop,
                    late_ns: answered_too_late(u, names),
                });
            }
        }
        failed_upstream(u, stats, names, out);
    }
}

/// Upstream queries that got no answer: timed out, or dropped on the way.
pub(super) fn upstream_failures<'a>(
    j: &'a Journey,
    stats: &Upstreams,
    names: &KernelNames,
    ctx: &'a Context,
) -> Vec<Finding<'a>> {
    let mut found = Vec::new();
    failed_upstream(j, stats, names, &mut found);
    found
        .into_iter()
        .map(|f| match f.late_ns {
            Some(late_ns) => late_answer(j, f.server, f.resolver, late_ns, ctx),
            None => no_answer(j, f, stats, names, ctx),
        })
        .collect()
}

/// An upstream that answered, but after the resolver stopped waiting.
fn late_answer<'a>(
    j: &'a Journey,
    server: SocketAddr,
    resolver: IpAddr,
    late_ns: u64,
    ctx: &'a Context,
) -> Finding<'a> {
    let key = format!("{server} late");
    Finding::new(AnomalyKind::UpstreamTimeout, key, move || {
        let ms = late_ns as f64 / 1e6;
        let summary = format!("the upstream resolver {server} answers after {resolver} gave up");
        let evidence = vec![format!(
            "{} asked {server} for {}; the answer came {ms:.1} ms later and found no socket at {resolver} (NO_SOCKET): the resolver had stopped waiting",
            ip(ctx, resolver),
            j.name
        )];
        let cause = format!("{server} is slower than {resolver}'s per-try timeout: it answered after {ms:.0} ms, too late to be used");
        Words::new(summary, evidence)
            .cause(cause)
            .fix("see why the upstream is slow (`dig @server` from the node, its own upstreams), or forward to a faster one; a resolver's timeout below the upstream's usual latency turns slow answers into failures")
    })
}

/// An upstream query that timed out or was dropped on the way.
fn no_answer<'a>(
    j: &'a Journey,
    f: UpstreamFailure,
    stats: &Upstreams,
    names: &KernelNames,
    ctx: &'a Context,
) -> Finding<'a> {
    let UpstreamFailure {
        server,
        resolver,
        drop,
        ..
    } = f;
    let s = stats.servers.get(&server).copied().unwrap_or_default();
    let mean = if s.answers > 0 {
        format!(
            ", mean answer {:.1} ms",
            s.total_ns as f64 / s.answers as f64 / 1e6
        )
    } else {
        String::new()
    };
    let how = match drop {
        Some((reason, at)) => format!(
            "the query was dropped on the way: {} at {}",
            names.drop_reason(reason),
            names.location(at)
        ),
        None => "no answer came".to_owned(),
    };
    Finding::new(
        AnomalyKind::UpstreamTimeout,
        server.to_string(),
        move || {
            let summary = format!("the upstream resolver {server} does not answer");
            let evidence = vec![
                format!("{} asked {server} for {}: {how}", ip(ctx, resolver), j.name),
                format!(
                    "{server} so far: {} queries, {} answers, {} timeouts{mean}",
                    s.queries, s.answers, s.timeouts
                ),
            ];
            Words::new(summary, evidence)
        },
    )
}
