//! Which journeys are one lookup: A and AAAA from one socket for one name,
//! their retries, and the TCP retry of a truncated answer.
use std::{hash::BuildHasher, net::IpAddr};

use foldhash::fast::RandomState;

use super::{open::Key, table::Table};
use crate::decode::Qtype;

/// The lookups of recent queries. A retry comes within a timeout of the
/// query before it (the timeout is set just past the resolvers' retry), so
/// a lookup is remembered that long past its latest query, and no longer:
/// with thousands of lookups a second, what is remembered is about what is
/// open.
pub(super) struct Lookups {
    /// (lookup, last start) by the hash of (client socket, name): lookups
    /// outlive their journeys, so they keep no name. Two lookups whose hashes
    /// collide (odds 2^-64 a pair) would share an id; nothing else. Pruned
    /// of expired lookups before it grows.
    by_name: Table<u64, (u64, u64)>,
    /// (lookup, answer time) of truncated UDP answers, by the hash of
    /// (client address, name, type): the client's TCP retry, from a socket
    /// of its own, is the same lookup. Pruned as `by_name` is.
    truncated: Table<u64, (u64, u64)>,
    hasher: RandomState,
    /// How long past its latest query a lookup is remembered: a timeout.
    window_ns: u64,
}

impl Lookups {
    pub(super) fn new(window_ns: u64) -> Self {
        Self {
            by_name: Table::new(),
            truncated: Table::new(),
            hasher: RandomState::default(),
            window_ns,
        }
    }

    /// The lookup of a query for `key` at `ts`: a recent one from the same
    /// socket for the same name, or a new one, `id`.
    pub(super) fn of(&mut self, key: &Key, ts: u64, id: u64) -> u64 {
        let window = self.window_ns;
        self.by_name.make_room_pruning(|map| {
            map.retain(|_, (_, last)| ts.saturating_sub(*last) <= window);
        });
        let hash = self.hasher.hash_one((key.client, &*key.name));
        let slot = self.by_name.entry(hash).or_insert((id, ts));
        if ts.saturating_sub(slot.1) > window {
            *slot = (id, ts);
        }
        slot.1 = slot.1.max(ts);
        slot.0
    }

    /// Where a truncated answer's lookup is filed for the client's TCP retry.
    pub(super) fn retry_key(&self, client: IpAddr, name: &str, qtype: Qtype) -> u64 {
        self.hasher.hash_one((client, name, qtype))
    }

    /// Files `lookup`, truncated at `ts`, under `retry_key`.
    pub(super) fn note_truncated(&mut self, retry_key: u64, lookup: u64, ts: u64) {
        let window = self.window_ns;
        self.truncated.make_room_pruning(|map| {
            map.retain(|_, (_, last)| ts.saturating_sub(*last) <= window);
        });
        self.truncated.entry(retry_key).insert_entry((lookup, ts));
    }

    /// The lookup a TCP query retries, if its client got a truncated answer
    /// to the same question within a timeout.
    pub(super) fn retried(&self, key: &Key, ts: u64) -> Option<u64> {
        let hash = self.retry_key(key.client.ip(), &key.name, key.qtype);
        let &(lookup, at) = self.truncated.get(&hash)?;
        (ts.saturating_sub(at) <= self.window_ns).then_some(lookup)
    }
}
