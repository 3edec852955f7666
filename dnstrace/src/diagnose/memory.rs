//! Per-client memory: what each client asked lately.
use std::{
    collections::{BTreeMap, VecDeque},
    net::IpAddr,
    sync::Arc,
};

use crate::correlate::{Connection, Journey, Outcome};
use crate::decode::{Qtype, Rcode};

/// A client's recent question: what, from which port, how it ended, when.
#[derive(Clone, Debug)]
pub(super) struct Asked {
    pub(super) name: Arc<str>,
    pub(super) qtype: Qtype,
    pub(super) port: u16,
    pub(super) answered: bool,
    pub(super) nxdomain: bool,
    /// Answered with TC set over UDP: the client should turn to TCP.
    pub(super) truncated: bool,
    pub(super) journey: u64,
    pub(super) started_ns: u64,
    pub(super) ended_ns: u64,
    /// It may miss legs (see `Gap`): its times may be wrong.
    pub(super) incomplete: bool,
}

/// Questions remembered per client, and clients remembered, for the
/// lookup-level rules.
const RECENT_PER_CLIENT: usize = 32;

const RECENT_CLIENTS: usize = 4096;

/// How far back a lookup's earlier search-list queries are looked for.
const LOOKUP_WINDOW_NS: u64 = 15_000_000_000;

/// Each client's recent questions, for the lookup-level rules.
#[derive(Default)]
pub(super) struct Recent(BTreeMap<IpAddr, VecDeque<Asked>>);

impl Recent {
    /// What this journey's client asked lately, within the lookup window.
    pub(super) fn of(&self, j: &Journey) -> Vec<&Asked> {
        let Some(r) = self.0.get(&j.client.ip()) else {
            return Vec::new();
        };
        // Sized once: a filter's collect would grow it step by step.
        let mut recent = Vec::with_capacity(r.len());
        recent.extend(
            r.iter()
                .filter(|a| j.started_ns.saturating_sub(a.ended_ns) <= LOOKUP_WINDOW_NS),
        );
        recent
    }

    /// Remembers what `j` asked and how it ended.
    pub(super) fn remember(&mut self, j: &Journey) {
        let client = j.client.ip();
        if !self.0.contains_key(&client) && self.0.len() >= RECENT_CLIENTS {
            // Forget the client that has been quiet longest.
            let oldest = self
                .0
                .iter()
                .min_by_key(|(_, r)| r.back().map_or(0, |a| a.ended_ns))
                .map(|(ip, _)| *ip);
            if let Some(ip) = oldest {
                self.0.remove(&ip);
            }
        }
        let r = self.0.entry(client).or_default();
        if r.len() == RECENT_PER_CLIENT {
            r.pop_front();
        }
        let nxdomain =
            matches!(&j.outcome, Outcome::Answered { rcode, .. } if *rcode == Rcode::NXDOMAIN);
        let truncated = !j.tcp
            && matches!(
                j.outcome,
                Outcome::Answered {
                    truncated: true,
                    ..
                }
            );
        r.push_back(Asked {
            name: j.name.clone(),
            qtype: j.qtype,
            port: j.client.port(),
            answered: matches!(j.outcome, Outcome::Answered { .. }),
            nxdomain,
            truncated,
            journey: j.id,
            started_ns: j.started_ns,
            ended_ns: j.ended_ns,
            incomplete: j.incomplete.is_some(),
        });
    }

    /// The client's latest truncated UDP answer before `c`'s SYN.
    pub(super) fn truncated_before(&self, c: &Connection) -> Option<&Asked> {
        self.0
            .get(&c.client.ip())?
            .iter()
            .rev()
            .find(|a| a.truncated && a.ended_ns <= c.syn_ns)
    }
}
