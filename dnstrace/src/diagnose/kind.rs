//! The kinds of anomaly: one list, each with its stable name.
use std::fmt;

use serde::{Serialize, Serializer};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Critical,
}

/// Every kind of anomaly the rules raise: the one list of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AnomalyKind {
    BrNetfilterNotLoaded,
    BridgeNfCallIptablesOff,
    ConntrackDropsBeforeStart,
    ConntrackInsertFailed,
    ConntrackTableNearlyFull,
    DnsTcpUnreachable,
    Dropped,
    FailingAnswers,
    ForeignSearchDomain,
    ForwardingLoop,
    FragmentLost,
    LoopbackNameserver,
    NdotsAmplification,
    ParallelQueryLost,
    ReplyFromUnexpectedSource,
    SearchDomainLeak,
    ServiceNotTranslated,
    SlowAnswers,
    TruncatedWithoutTcpRetry,
    Unanswered,
    UpstreamTimeout,
}

impl AnomalyKind {
    /// The stable name the outputs print, e.g. `reply_from_unexpected_source`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BrNetfilterNotLoaded => "br_netfilter_not_loaded",
            Self::BridgeNfCallIptablesOff => "bridge_nf_call_iptables_off",
            Self::ConntrackDropsBeforeStart => "conntrack_drops_before_start",
            Self::ConntrackInsertFailed => "conntrack_insert_failed",
            Self::ConntrackTableNearlyFull => "conntrack_table_nearly_full",
            Self::DnsTcpUnreachable => "dns_tcp_unreachable",
            Self::Dropped => "dropped",
            Self::FailingAnswers => "failing_answers",
            Self::ForeignSearchDomain => "foreign_search_domain",
            Self::ForwardingLoop => "forwarding_loop",
            Self::FragmentLost => "fragment_lost",
            Self::LoopbackNameserver => "loopback_nameserver",
            Self::NdotsAmplification => "ndots_amplification",
            Self::ParallelQueryLost => "parallel_query_lost",
            Self::ReplyFromUnexpectedSource => "reply_from_unexpected_source",
            Self::SearchDomainLeak => "search_domain_leak",
            Self::ServiceNotTranslated => "service_not_translated",
            Self::SlowAnswers => "slow_answers",
            Self::TruncatedWithoutTcpRetry => "truncated_without_tcp_retry",
            Self::Unanswered => "unanswered",
            Self::UpstreamTimeout => "upstream_timeout",
        }
    }
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for AnomalyKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Ordered by name, as the kinds' strings were: anomalies of equal
/// severity and count keep their order in the summary.
impl Ord for AnomalyKind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for AnomalyKind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
