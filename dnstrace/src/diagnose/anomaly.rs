//! What the rules find, and the one place that raises each problem once
//! and counts its repeats.
use std::{collections::BTreeMap, net::IpAddr};

use serde::Serialize;

use super::{AnomalyKind, Severity};

#[derive(Clone, Debug, Serialize)]
pub struct Anomaly {
    pub kind: AnomalyKind,
    pub severity: Severity,
    pub summary: String,
    pub evidence: Vec<String>,
    pub cause: String,
    pub fix: &'static str,
    /// The addresses it is about (an endpoint, a pod), for the sinks to
    /// name: the rules know addresses, the sinks the names of pods.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub about: Vec<IpAddr>,
    /// The most recent journeys behind it (at most `JOURNEYS_KEPT`).
    pub journeys: Vec<u64>,
    pub count: u64,
    pub first_ns: u64,
    pub last_ns: u64,
}

/// What checking something raised for the first time, and the anomalies
/// (kind, summary) a journey fed, new or already raised: a view's badges.
#[derive(Debug, Default)]
pub struct Checked {
    pub raised: Vec<Anomaly>,
    pub hits: Vec<(AnomalyKind, String)>,
}

impl Checked {
    pub(super) fn merge(&mut self, other: Checked) {
        self.raised.extend(other.raised);
        self.hits.extend(other.hits);
    }
}

/// The most recent journeys an anomaly keeps.
pub(super) const JOURNEYS_KEPT: usize = 16;

/// Distinct anomalies kept; a flood of new keys stops growing memory here.
const MAX_ANOMALIES: usize = 1024;

/// One rule's verdict: which problem it is, and how to word it.
pub(super) struct Finding<'a> {
    pub(super) kind: AnomalyKind,
    /// What makes two findings the same problem (with `kind`).
    pub(super) key: String,
    /// Called only when the problem is raised for the first time: the
    /// rules that fire on every journey of a storm (drops, timeouts,
    /// failing or slow answers) would otherwise write evidence thousands
    /// of times a second for nobody.
    words: Box<dyn FnOnce() -> Words + 'a>,
    /// Earlier journeys it stands for too, not counted before: a rule
    /// that waits for a pattern counts its first members when it holds.
    earlier: Vec<u64>,
}

impl<'a> Finding<'a> {
    pub(super) fn new(kind: AnomalyKind, key: String, words: impl FnOnce() -> Words + 'a) -> Self {
        Self {
            kind,
            key,
            words: Box::new(words),
            earlier: Vec::new(),
        }
    }

    /// The finding stands for the `earlier` journeys too.
    pub(super) fn standing_for(self, earlier: Vec<u64>) -> Self {
        Self { earlier, ..self }
    }
}

/// What an anomaly says; the cause, fix and severity default to its kind's.
pub(super) struct Words {
    summary: String,
    evidence: Vec<String>,
    cause: Option<String>,
    fix: Option<&'static str>,
    severity: Option<Severity>,
    about: Vec<IpAddr>,
}

impl Words {
    pub(super) fn new(summary: String, evidence: Vec<String>) -> Self {
        Self {
            summary,
            evidence,
            cause: None,
            fix: None,
            severity: None,
            about: Vec::new(),
        }
    }

    /// The addresses it is about, for the sinks to name.
    pub(super) fn about(self, about: Vec<IpAddr>) -> Self {
        Self { about, ..self }
    }

    /// The cause as seen, for kinds whose cause depends on it.
    pub(super) fn cause(self, cause: String) -> Self {
        Self {
            cause: Some(cause),
            ..self
        }
    }

    /// The fix as seen, for kinds whose fix depends on it.
    pub(super) fn fix(self, fix: &'static str) -> Self {
        Self {
            fix: Some(fix),
            ..self
        }
    }

    /// A lower severity than the kind's, where the evidence is weaker.
    pub(super) fn severity(self, severity: Severity) -> Self {
        Self {
            severity: Some(severity),
            ..self
        }
    }
}

/// Every anomaly raised so far, by kind and key.
#[derive(Default)]
pub(super) struct Raised(BTreeMap<(AnomalyKind, String), Anomaly>);

impl Raised {
    /// Counts each finding in its anomaly, raising (and wording) it the
    /// first time; `journey` is the journey behind them, if one is.
    pub(super) fn record(
        &mut self,
        found: Vec<Finding>,
        now_ns: u64,
        journey: Option<u64>,
    ) -> Checked {
        let mut checked = Checked::default();
        for f in found {
            let key = (f.kind, f.key);
            if !self.0.contains_key(&key) && self.0.len() >= MAX_ANOMALIES {
                continue;
            }
            let kind = f.kind;
            let a = self
                .0
                .entry(key)
                .or_insert_with(|| raise(kind, (f.words)(), now_ns));
            let new = a.count == 0;
            a.count += 1 + f.earlier.len() as u64;
            a.last_ns = a.last_ns.max(now_ns);
            if let Some(id) = journey {
                checked.hits.push((a.kind, a.summary.clone()));
                for id in f.earlier.into_iter().chain([id]) {
                    if a.journeys.len() == JOURNEYS_KEPT {
                        a.journeys.remove(0);
                    }
                    a.journeys.push(id);
                }
            }
            if new {
                checked.raised.push(a.clone());
            }
        }
        checked
    }

    pub(super) fn all(&self) -> impl Iterator<Item = &Anomaly> {
        self.0.values()
    }
}

/// A new anomaly, not counted yet.
fn raise(kind: AnomalyKind, w: Words, now_ns: u64) -> Anomaly {
    let cause = w.cause.or_else(|| kind.cause().map(str::to_owned));
    let fix = w.fix.or_else(|| kind.fix());
    debug_assert!(cause.is_some() && fix.is_some(), "{kind}: no cause or fix");
    Anomaly {
        kind,
        severity: w.severity.unwrap_or(kind.severity()),
        summary: w.summary,
        evidence: w.evidence,
        cause: cause.unwrap_or_default(),
        fix: fix.unwrap_or_default(),
        about: w.about,
        journeys: Vec::new(),
        count: 0,
        first_ns: now_ns,
        last_ns: now_ns,
    }
}
