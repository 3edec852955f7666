//! What the rules find, and the anomalies it raises.
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
    /// The most recent journeys behind it (at most `JOURNEYS_KEPT`).
    pub journeys: Vec<u64>,
    pub count: u64,
    pub first_ns: u64,
    pub last_ns: u64,
}

/// The most recent journeys an anomaly keeps.
pub(super) const JOURNEYS_KEPT: usize = 16;

/// Distinct anomalies kept; a flood of new keys stops growing memory here.
pub(super) const MAX_ANOMALIES: usize = 1024;

/// One rule's verdict on one journey, before deduplication.
pub(super) struct Finding {
    pub(super) kind: AnomalyKind,
    pub(super) severity: Severity,
    /// What makes two findings the same problem (with `kind`).
    pub(super) key: String,
    pub(super) summary: String,
    pub(super) evidence: Vec<String>,
    pub(super) cause: String,
    pub(super) fix: &'static str,
}

/// Whether the anomaly of this kind and key is raised already.
pub(super) type Raised<'a> = dyn Fn(AnomalyKind, &str) -> bool + 'a;

impl Finding {
    /// One more of an anomaly already raised: only what makes it the same
    /// problem, as the rules that fire on every journey of a storm (drops,
    /// timeouts, failing or slow answers) would otherwise write evidence
    /// thousands of times a second for nobody.
    pub(super) fn again(kind: AnomalyKind, key: String) -> Self {
        Self {
            kind,
            severity: Severity::Warning,
            key,
            summary: String::new(),
            evidence: Vec::new(),
            cause: String::new(),
            fix: "",
        }
    }
}
