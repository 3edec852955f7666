//! Which journeys the kernel's sampling level kept whole. Within one level,
//! a lookup's packets are all kept or all left out. A journey open across a
//! change may have lost legs to the stricter level: it is whole only if
//! its label passed every level in effect while it was open, and is left
//! out otherwise, never shown with legs missing. In a replay of several
//! nodes' recordings each node's kernel had a level of its own: a journey
//! must pass every node's, as which nodes it would have crossed is not
//! known where a level left its legs out. A lookup whose client a cluster
//! view followed (`SampleChange::viewed`) was kept whatever the level.
use std::{collections::VecDeque, net::IpAddr};

use dnstrace_common::SampleLevel;

use crate::{
    decode::NodeId,
    ingest::{SampleChange, Viewed},
};

/// How far from a change a packet may have been decided by the level on
/// its other side: a program reads the level before it takes the time,
/// and a query first seen just after a change may have been left out on
/// its hops just before.
const SLACK_NS: u64 = 100_000_000;
/// Changes remembered at most; older ones are folded into `first`. A
/// live capture makes a dozen at most while a journey may be open (a rise
/// per 250 ms up to 1 in 1024, a fall after 10 s of calm, a seed per 30 s):
/// this only bounds what a damaged or crafted recording can make it hold.
const MAX_CHANGES: usize = 256;

/// Each node's levels, in the order their first change came.
#[derive(Default)]
pub(super) struct Sampling {
    nodes: Vec<(NodeId, Levels)>,
}

impl Sampling {
    pub(super) fn change(&mut self, c: SampleChange) {
        match self.nodes.iter_mut().find(|(n, _)| *n == c.node) {
            Some((_, levels)) => levels.change(c),
            None => {
                let mut levels = Levels::default();
                let node = c.node;
                levels.change(c);
                self.nodes.push((node, levels));
            }
        }
    }

    pub(super) fn forget_before(&mut self, earliest: u64) {
        for (_, levels) in &mut self.nodes {
            levels.forget_before(earliest);
        }
    }

    /// The strictest level in effect now, of any node.
    pub(super) fn now(&self) -> SampleLevel {
        let levels = self.nodes.iter().map(|(_, l)| l.now());
        levels.max_by_key(|l| l.shift).unwrap_or_default()
    }

    /// The strictest level of any node a journey of `client` was kept
    /// under (see `Levels::kept`); None if one of them would have left it out.
    pub(super) fn kept(
        &self,
        label: Option<u32>,
        client: IpAddr,
        start: u64,
        end: u64,
    ) -> Option<SampleLevel> {
        let mut strictest = SampleLevel::default();
        for (_, levels) in &self.nodes {
            let level = levels.kept(label, client, start, end)?;
            if level.shift > strictest.shift {
                strictest = level;
            }
        }
        Some(strictest)
    }
}

/// One node's levels: the changes a journey that may still close spans.
#[derive(Default)]
struct Levels {
    /// The level, and whom views followed, before the first change
    /// remembered.
    first: (SampleLevel, Viewed),
    changes: VecDeque<SampleChange>,
}

impl Levels {
    fn change(&mut self, c: SampleChange) {
        if self.changes.len() == MAX_CHANGES {
            self.fold_oldest();
        }
        self.changes.push_back(c);
    }

    /// Forgets the changes no journey started from `earliest` on spans.
    fn forget_before(&mut self, earliest: u64) {
        while self
            .changes
            .front()
            .is_some_and(|c| c.now_ns.saturating_add(SLACK_NS) < earliest)
        {
            self.fold_oldest();
        }
    }

    fn fold_oldest(&mut self) {
        if let Some(c) = self.changes.pop_front() {
            self.first = (c.level, c.viewed);
        }
    }

    /// The level in effect now.
    fn now(&self) -> SampleLevel {
        self.changes.back().map_or(self.first.0, |c| c.level)
    }

    /// The strictest level a journey of `client` whose first label hashes
    /// to `label` (None over TCP, which is never left out) was kept under
    /// while open from `start` to `end`, the level of none while a view
    /// followed its client; None if one of them would have left it out.
    fn kept(
        &self,
        label: Option<u32>,
        client: IpAddr,
        start: u64,
        end: u64,
    ) -> Option<SampleLevel> {
        let Some(label) = label else {
            return Some(SampleLevel::default());
        };
        let mut strictest = SampleLevel::default();
        for (level, viewed) in self.in_effect(start, end) {
            if viewed.contains(client) {
                continue;
            }
            if !level.keeps(label) {
                return None;
            }
            if level.shift > strictest.shift {
                strictest = level;
            }
        }
        Some(strictest)
    }

    /// The levels in effect at some moment from `start` to `end`, with
    /// whom views followed: each from the change that set it to the one
    /// that ended it, with each change's window and slack counted on both
    /// sides of it.
    fn in_effect(&self, start: u64, end: u64) -> impl Iterator<Item = (SampleLevel, &Viewed)> {
        let changes = self.changes.iter();
        let levels = std::iter::once((self.first.0, &self.first.1))
            .chain(changes.clone().map(|c| (c.level, &c.viewed)));
        let from =
            std::iter::once(0).chain(changes.clone().map(|c| c.since_ns.saturating_sub(SLACK_NS)));
        let to = changes
            .map(|c| c.now_ns.saturating_add(SLACK_NS))
            .chain(std::iter::once(u64::MAX));
        levels
            .zip(from.zip(to))
            .filter(move |(_, (from, to))| start <= *to && end >= *from)
            .map(|(level, _)| level)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 244, 1, 5));

    fn level(shift: u32) -> SampleLevel {
        SampleLevel { shift, seed: 42 }
    }

    /// A label hash that `level(shift)` keeps, and `level(shift + 1)` not.
    fn label_kept_up_to(shift: u32) -> u32 {
        (0..)
            .find(|&h| level(shift).keeps(h) && !level(shift + 1).keeps(h))
            .unwrap()
    }

    /// Shifts only: a level that keeps everything has no seed worth comparing.
    fn shift(kept: Option<SampleLevel>) -> Option<u32> {
        kept.map(|l| l.shift)
    }

    fn at(sampling: &mut Sampling, ms: u64, shift: u32) {
        at_node(sampling, NodeId(0), ms, shift);
    }

    fn at_node(sampling: &mut Sampling, node: NodeId, ms: u64, shift: u32) {
        sampling.change(change(node, ms, level(shift), &Viewed::default()));
    }

    /// Node `node`'s kernel set `level`, following `viewed` besides, over
    /// a millisecond from `ms`.
    fn change(node: NodeId, ms: u64, level: SampleLevel, viewed: &Viewed) -> SampleChange {
        SampleChange {
            since_ns: ms * MS,
            now_ns: ms * MS + MS,
            level,
            budget: false,
            node,
            viewed: viewed.clone(),
        }
    }

    /// The agent's pause between windows keeps nothing: a journey open
    /// across either edge goes, one within the window stays.
    #[test]
    fn a_journey_open_across_a_pause_goes() {
        let mut s = Sampling::default();
        s.change(SampleChange {
            since_ns: 2000 * MS,
            now_ns: 2001 * MS,
            level: SampleLevel::PAUSED,
            budget: false,
            node: NodeId(0),
            viewed: Default::default(),
        });
        at(&mut s, 16_000, 0);
        assert_eq!(shift(s.kept(Some(7), CLIENT, 500 * MS, 600 * MS)), Some(0));
        assert_eq!(shift(s.kept(Some(7), CLIENT, 1950 * MS, 2050 * MS)), None);
        assert_eq!(
            shift(s.kept(Some(7), CLIENT, 15_950 * MS, 16_050 * MS)),
            None
        );
        assert_eq!(
            shift(s.kept(Some(7), CLIENT, 16_500 * MS, 16_600 * MS)),
            Some(0)
        );
        assert_eq!(s.now(), level(0));
    }

    #[test]
    fn nothing_is_left_out_before_any_change() {
        let s = Sampling::default();
        assert_eq!(shift(s.kept(Some(7), CLIENT, 0, 10 * MS)), Some(0));
        assert_eq!(s.now(), SampleLevel::default());
    }

    /// Raised to 1 in 4 at 1 s: a journey open then must pass 1 in 4 too,
    /// one that ends well before only what kept everything.
    #[test]
    fn a_journey_open_across_a_change_passes_both_levels_or_goes() {
        let mut s = Sampling::default();
        at(&mut s, 1000, 2);
        let half = label_kept_up_to(1);
        let quarter = label_kept_up_to(2);
        assert_eq!(
            shift(s.kept(Some(half), CLIENT, 100 * MS, 200 * MS)),
            Some(0)
        );
        assert_eq!(shift(s.kept(Some(half), CLIENT, 900 * MS, 1200 * MS)), None);
        assert_eq!(
            shift(s.kept(Some(quarter), CLIENT, 900 * MS, 1200 * MS)),
            Some(2)
        );
        assert_eq!(
            shift(s.kept(Some(half), CLIENT, 1500 * MS, 1600 * MS)),
            None
        );
        // Within the slack of the change: either level may have decided.
        assert_eq!(
            shift(s.kept(Some(half), CLIENT, 1050 * MS, 1060 * MS)),
            None
        );
        assert_eq!(shift(s.kept(Some(half), CLIENT, 850 * MS, 920 * MS)), None);
        assert_eq!(s.now(), level(2));
    }

    /// Lowered from 1 in 4 to 1 in 2 at 2 s: a query first seen just after
    /// may have had its first hops left out just before.
    #[test]
    fn a_journey_first_seen_just_after_a_lowering_must_pass_the_level_before() {
        let mut s = Sampling::default();
        at(&mut s, 1000, 2);
        at(&mut s, 2000, 1);
        let half = label_kept_up_to(1);
        assert_eq!(
            shift(s.kept(Some(half), CLIENT, 2050 * MS, 2060 * MS)),
            None
        );
        assert_eq!(
            shift(s.kept(Some(half), CLIENT, 2200 * MS, 2300 * MS)),
            Some(1)
        );
        assert_eq!(
            shift(s.kept(None, CLIENT, 1500 * MS, 2500 * MS)),
            Some(0),
            "TCP"
        );
    }

    #[test]
    fn changes_no_journey_spans_are_folded_into_the_first_level() {
        let mut s = Sampling::default();
        at(&mut s, 1000, 3);
        at(&mut s, 60_000, 2);
        s.forget_before(1000 * MS);
        fn levels(s: &Sampling) -> &Levels {
            &s.nodes[0].1
        }
        assert_eq!(levels(&s).changes.len(), 2, "a journey from 1 s spans both");
        s.forget_before(2000 * MS);
        assert_eq!(levels(&s).changes.len(), 1);
        assert_eq!(levels(&s).first.0, level(3));
        let quarter = label_kept_up_to(2);
        assert_eq!(
            shift(s.kept(Some(quarter), CLIENT, 59_000 * MS, 59_010 * MS)),
            None
        );
        assert_eq!(
            shift(s.kept(Some(quarter), CLIENT, 61_000 * MS, 61_010 * MS)),
            Some(2)
        );
        for n in 0..300 {
            at(&mut s, 61_000 + n, 1);
        }
        assert_eq!(levels(&s).changes.len(), MAX_CHANGES);
    }

    /// Merged nodes: node 2 lowering its level does not end node 1's, and
    /// a journey must pass both.
    #[test]
    fn each_node_keeps_its_own_level() {
        let mut s = Sampling::default();
        at_node(&mut s, NodeId(1), 1000, 2);
        at_node(&mut s, NodeId(2), 1000, 1);
        at_node(&mut s, NodeId(2), 2000, 0);
        let half = label_kept_up_to(1);
        let quarter = label_kept_up_to(2);
        assert_eq!(
            shift(s.kept(Some(half), CLIENT, 3000 * MS, 3100 * MS)),
            None
        );
        assert_eq!(
            shift(s.kept(Some(quarter), CLIENT, 3000 * MS, 3100 * MS)),
            Some(2)
        );
        assert_eq!(s.now(), level(2));
    }

    /// A view follows web's lookups whole from when it began: under any
    /// level and across a pause; not one open as it began, nor another
    /// client's.
    #[test]
    fn a_viewed_clients_lookups_are_kept_whatever_the_level() {
        let mut s = Sampling::default();
        let web = Viewed::new([CLIENT]);
        s.change(change(NodeId(0), 1000, level(10), &Viewed::default()));
        s.change(change(NodeId(0), 2000, level(10), &web));
        s.change(change(NodeId(0), 3000, SampleLevel::PAUSED, &web));
        let out = Some(label_kept_up_to(0));
        assert_eq!(shift(s.kept(out, CLIENT, 2500 * MS, 2600 * MS)), Some(0));
        assert_eq!(shift(s.kept(out, CLIENT, 2900 * MS, 3200 * MS)), Some(0));
        assert_eq!(shift(s.kept(out, CLIENT, 1900 * MS, 2050 * MS)), None);
        let other = IpAddr::V4(std::net::Ipv4Addr::new(10, 244, 2, 7));
        assert_eq!(shift(s.kept(out, other, 2500 * MS, 2600 * MS)), None);
    }
}
