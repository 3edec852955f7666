//! TCP, truncation and IP fragments.
use std::{
    collections::VecDeque,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use super::{
    anomaly::{Finding, Words},
    legs::the_message,
    memory::Asked,
    places::place,
    AnomalyKind, Context,
};
use crate::{
    correlate::{Connection, Journey, Outcome, Reset},
    decode::{KernelNames, Qtype},
};

/// An answer came in IP fragments and one of them did not come through:
/// dropped by the kernel on the way, or missing where the rest arrived.
pub(super) fn fragment_lost<'a>(
    j: &'a Journey,
    names: &KernelNames,
    ctx: &'a Context,
) -> Option<Finding<'a>> {
    if matches!(j.outcome, Outcome::Answered { .. }) {
        return None;
    }
    let with_note = |dropped: bool| {
        j.legs.iter().rev().find_map(|l| {
            let f = l.fragment.as_deref()?;
            (l.drop.is_some() == dropped).then_some((l, f))
        })
    };
    // A fragment missing is evidence only where no event was lost.
    let missing = || with_note(false).filter(|_| j.incomplete.is_none());
    let (leg, f) = with_note(true).or_else(missing)?;
    let what = match leg.drop.as_deref() {
        Some(&(reason, at)) => format!(
            "{} was dropped on {}: {} at {}",
            f.describe(),
            place(ctx, leg),
            names.drop_reason(reason),
            names.location(at)
        ),
        None => format!("it reached {} {}", place(ctx, leg), f.describe()),
    };
    Some(Finding::new(
        AnomalyKind::FragmentLost,
        format!("{} → {}", leg.src.ip(), leg.dst.ip()),
        move || {
            let summary = format!(
                "answers from {} to {} in IP fragments do not arrive whole",
                leg.src.ip(),
                leg.dst.ip()
            );
            let evidence = vec![format!(
                "{} came in IP fragments; {what}",
                the_message(ctx, j, leg)
            )];
            Words::new(summary, evidence)
        },
    ))
}

/// How long a client has to retry over TCP after a truncated answer.
const TCP_RETRY_NS: u64 = 1_000_000_000;

/// Truncated answers waiting for their TCP retry, at most.
const MAX_PENDING: usize = 4096;

/// A truncated UDP answer whose TCP retry has not been seen yet.
pub(super) struct Truncated {
    pub(super) client: IpAddr,
    pub(super) server: SocketAddr,
    pub(super) name: Arc<str>,
    pub(super) qtype: Qtype,
    pub(super) journey: u64,
    pub(super) answered_ns: u64,
}

/// Truncated UDP answers waiting for their TCP retry, oldest first.
#[derive(Default)]
pub(super) struct Pending(VecDeque<Truncated>);

impl Pending {
    /// Truncated UDP answers wait for a TCP retry; a TCP lookup settles them.
    pub(super) fn await_tcp_retry(&mut self, j: &Journey) {
        if j.tcp {
            let client = j.client.ip();
            self.0
                .retain(|t| !(t.client == client && t.name == j.name && t.qtype == j.qtype));
            return;
        }
        let truncated = matches!(
            j.outcome,
            Outcome::Answered {
                truncated: true,
                ..
            }
        );
        let Some(o) = j.origin().filter(|_| truncated) else {
            return;
        };
        if self.0.len() == MAX_PENDING {
            self.0.pop_front();
        }
        self.0.push_back(Truncated {
            client: j.client.ip(),
            server: o.dst,
            name: j.name.clone(),
            qtype: j.qtype,
            journey: j.id,
            answered_ns: j.ended_ns,
        });
    }

    /// The answers whose TCP retry did not come within `TCP_RETRY_NS`
    /// (dropped from the wait, whether retried or not).
    pub(super) fn expired(&mut self, now_ns: u64) -> Vec<Truncated> {
        let mut out = Vec::new();
        while let Some(t) = self.0.front() {
            if now_ns.saturating_sub(t.answered_ns) < TCP_RETRY_NS {
                break;
            }
            out.extend(self.0.pop_front());
        }
        out
    }
}

pub(super) fn no_tcp_retry(t: &Truncated) -> Finding<'_> {
    Finding::new(
        AnomalyKind::TruncatedWithoutTcpRetry,
        t.server.to_string(),
        move || {
            let summary = format!(
                "truncated answers from {} are not retried over TCP",
                t.server
            );
            let evidence = vec![format!(
            "{} got a truncated (TC) answer for {} {} from {}, and no TCP query followed within {} s",
            t.client,
            t.name,
            t.qtype,
            t.server,
            TCP_RETRY_NS / 1_000_000_000
        )];
            Words::new(summary, evidence)
        },
    )
}

pub(super) fn tcp_unreachable<'a>(
    c: &'a Connection,
    led: Option<&Asked>,
    names: &KernelNames,
) -> Finding<'a> {
    let fate = match c.reset {
        Some(Reset {
            ts_ns,
            to_client: true,
        }) => format!(
            "reset towards the client {:.1} ms after its SYN",
            c.ms_after_syn(ts_ns)
        ),
        Some(Reset { .. }) => "reset by the client before any SYN-ACK".into(),
        None => format!(
            "{} SYN{} and no SYN-ACK",
            c.syns,
            if c.syns == 1 { "" } else { "s" }
        ),
    };
    let mut evidence = vec![format!("{} → {}: {fate}", c.client, c.server)];
    evidence.extend(c.dropped.map(|(reason, at)| {
        format!(
            "the kernel dropped its set-up: {} at {}",
            names.drop_reason(reason),
            names.location(at)
        )
    }));
    evidence.extend(led.map(|a| {
        format!(
            "it followed a truncated UDP answer for {} {} (journey {}, {:.1} s before)",
            a.name,
            a.qtype,
            a.journey,
            c.syn_ns.saturating_sub(a.ended_ns) as f64 / 1e9
        )
    }));
    Finding::new(
        AnomalyKind::DnsTcpUnreachable,
        c.server.to_string(),
        move || {
            let summary = format!("DNS over TCP to {} does not get through", c.server);
            Words::new(summary, evidence)
        },
    )
}
