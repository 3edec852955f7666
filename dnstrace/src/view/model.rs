//! What the live view shows, as plain owned data: built on the capture
//! side from journeys and anomalies (names already applied). A journey's
//! own screen is built from the journey when it is shown, with the same
//! labels: built for every journey, it was a third of the live view's CPU.
use std::{net::SocketAddr, sync::Arc};

use crate::decode::Rcode;
use crate::{
    correlate::{Gap, Journey, Outcome},
    diagnose::{Anomaly, AnomalyKind, Severity},
    output::Labels,
};
use dnstrace_common::Direction;

/// An anomaly's identity across updates.
pub type AnomalyKey = (AnomalyKind, String);

/// How a lookup ended, in the words of the lookup list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// `malformed`: the answer could not be read whole.
    Answered {
        rcode: Rcode,
        truncated: bool,
        malformed: bool,
    },
    Dropped,
    Timeout,
}

impl Status {
    pub fn word(&self) -> &str {
        match self {
            Self::Answered {
                malformed: true, ..
            } => "malformed",
            Self::Answered { rcode, .. } if *rcode == Rcode::NOERROR => "answered",
            Self::Answered { rcode, .. } => rcode.name(),
            Self::Dropped => "dropped",
            Self::Timeout => "timeout",
        }
    }

    /// SERVFAIL, REFUSED and the like: an answer that is a failure.
    pub fn failed(&self) -> bool {
        match self {
            Self::Answered {
                rcode, malformed, ..
            } => *malformed || ![Rcode::NOERROR, Rcode::NXDOMAIN].contains(rcode),
            Self::Dropped => true,
            Self::Timeout => false,
        }
    }
}

/// One row of the lookup list: what it shows beyond the journey's own
/// fields, and the journey, which opening the row shows.
#[derive(Clone, Debug)]
pub struct Lookup {
    /// Time of day, UTC, milliseconds.
    pub time: String,
    /// The client's pod, or its address.
    pub pod: String,
    pub status: Status,
    /// None when no answer came.
    pub latency_ns: Option<u64>,
    /// The CoreDNS endpoint (or server) that answered.
    pub server: Option<String>,
    pub badges: Vec<AnomalyKey>,
    pub journey: Arc<Journey>,
}

/// A journey opened: its legs as a timeline and its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detail {
    pub title: String,
    pub outcome: String,
    pub answers: Vec<String>,
    pub legs: Vec<LegRow>,
    /// Why legs may be missing, if they may.
    pub incomplete: Option<&'static str>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LegRow {
    /// 0 for the client's query, 1 for CoreDNS's upstream queries.
    pub depth: u8,
    /// A heading row (an upstream query) rather than a leg.
    pub heading: Option<String>,
    pub since_prev_ns: u64,
    pub place: String,
    /// None on a heading row.
    pub direction: Option<Direction>,
    pub answer: bool,
    pub from: String,
    pub to: String,
    /// NAT and drop notes.
    pub notes: Vec<String>,
}

/// A row of the anomalies panel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnomalyRow {
    pub key: AnomalyKey,
    pub severity: Severity,
    pub count: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    pub evidence: Vec<String>,
    /// What it is about, named where the node knows it: `name (address)`.
    pub about: Vec<String>,
    pub cause: String,
    pub fix: &'static str,
    /// The latest journeys behind it.
    pub journeys: Vec<u64>,
}

impl AnomalyRow {
    pub fn of(a: &Anomaly, labels: &Labels) -> Self {
        Self {
            key: (a.kind, a.summary.clone()),
            severity: a.severity,
            count: a.count,
            first_ns: a.first_ns,
            last_ns: a.last_ns,
            evidence: a.evidence.clone(),
            about: a
                .about
                .iter()
                .filter_map(|ip| Some(format!("{} ({ip})", labels.name(ip)?)))
                .collect(),
            cause: a.cause.clone(),
            fix: a.fix,
            journeys: a.journeys.clone(),
        }
    }
}

/// A pod or service without its namespace, or the address.
fn who(labels: &Labels, a: SocketAddr) -> String {
    match labels.name(&a.ip()) {
        Some(name) => name.rsplit('/').next().unwrap_or(name).to_owned(),
        None => a.ip().to_string(),
    }
}

/// `coredns-7db6d8ff4d-4xk9m:53`: short enough for a leg's line; the
/// journey's title and NAT notes carry the addresses.
fn at(labels: &Labels, a: SocketAddr) -> String {
    match labels.name(&a.ip()) {
        Some(_) => format!("{}:{}", who(labels, a), a.port()),
        None => a.to_string(),
    }
}

/// `0.812 ms`, `1.20 s`.
pub fn latency(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else {
        format!("{:.3} ms", ns as f64 / 1e6)
    }
}

/// Builds a lookup row from a finished journey.
pub fn lookup(j: Journey, badges: &[AnomalyKey], labels: &Labels) -> Lookup {
    let pod = labels
        .name(&j.client.ip())
        .map_or(j.client.ip().to_string(), str::to_owned);
    let time = labels.time_of_day(j.started_ns);
    let status = match &j.outcome {
        Outcome::Answered {
            rcode,
            truncated,
            malformed,
            ..
        } => Status::Answered {
            rcode: *rcode,
            truncated: *truncated,
            malformed: malformed.is_some(),
        },
        Outcome::Dropped { .. } => Status::Dropped,
        Outcome::Timeout => Status::Timeout,
    };
    let server = j
        .dnat
        .as_deref()
        .map(|&(_, to)| to)
        .or_else(|| j.legs.first().map(|l| l.dst));
    Lookup {
        time: time.get(..12).unwrap_or(&time).to_owned(),
        pod,
        latency_ns: matches!(status, Status::Answered { .. }).then(|| j.total_ns()),
        status,
        server: server
            .filter(|_| j.outcome != Outcome::Timeout)
            .map(|s| who(labels, s)),
        badges: badges.to_vec(),
        journey: Arc::new(j),
    }
}

/// What a journey's own screen shows.
pub fn detail(j: &Journey, labels: &Labels) -> Detail {
    let answers = match &j.outcome {
        Outcome::Answered { answers, .. } => answers.clone(),
        _ => Vec::new(),
    };
    Detail {
        title: format!(
            "#{} {} → {} {} {}",
            j.id,
            labels.named(j.client),
            j.shown_name(),
            j.qtype,
            if j.tcp { "tcp" } else { "udp" }
        ),
        outcome: format!(
            "{} in {}{}",
            labels.outcome(&j.outcome),
            latency(j.total_ns()),
            j.connection
                .as_ref()
                .map(|c| format!(" · tcp: {}", c.describe()))
                .unwrap_or_default()
        ),
        answers,
        legs: legs(j, 0, labels),
        incomplete: j.incomplete.map(Gap::why),
    }
}

/// The journey's legs in time order, each upstream query's legs under a
/// heading, placed where they happened between the client's legs.
fn legs(j: &Journey, depth: u8, labels: &Labels) -> Vec<LegRow> {
    let mut rows: Vec<(u64, Vec<LegRow>)> = j
        .legs
        .iter()
        .map(|l| {
            let mut notes = Vec::new();
            if let Some(&(a, b)) = l.dnat.as_deref() {
                notes.push(format!("DNAT {} → {}", labels.named(a), labels.named(b)));
            }
            if let Some(&(a, b)) = l.snat.as_deref() {
                notes.push(format!("SNAT {} → {}", labels.named(a), labels.named(b)));
            }
            if let Some(f) = l.fragment.as_deref() {
                notes.push(f.describe());
            }
            if let Some(&(reason, at)) = l.drop.as_deref() {
                notes.push(format!("dropped: {}", labels.drop_text(reason, at)));
            }
            if let Some(u) = l.underlay.as_deref() {
                notes.push(format!("in {u}"));
            }
            let row = LegRow {
                depth,
                heading: None,
                since_prev_ns: l.since_prev_ns,
                place: labels.place(l),
                direction: Some(l.direction()),
                answer: l.response,
                from: at(labels, l.src),
                to: at(labels, l.dst),
                notes,
            };
            (l.ts_ns, vec![row])
        })
        .collect();
    for up in &j.upstream {
        let mut block = vec![LegRow {
            depth: depth + 1,
            heading: Some(format!(
                "upstream {} {}: {} in {}",
                up.shown_name(),
                up.qtype,
                labels.outcome(&up.outcome),
                latency(up.total_ns())
            )),
            since_prev_ns: 0,
            place: String::new(),
            direction: None,
            answer: false,
            from: String::new(),
            to: String::new(),
            notes: Vec::new(),
        }];
        block.extend(legs(up, depth + 1, labels));
        rows.push((up.started_ns, block));
    }
    rows.sort_by_key(|(ts, _)| *ts);
    rows.into_iter().flat_map(|(_, r)| r).collect()
}
