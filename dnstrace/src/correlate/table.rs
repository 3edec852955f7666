//! The engine's maps: a fast hasher, and a table that never grows under a
//! steady load.
use std::{
    collections::{hash_map::Entry, HashMap, HashSet},
    hash::Hash,
};

use foldhash::fast::RandomState;

/// The engine's maps are keyed by what packets carry, once per packet:
/// foldhash is several times faster than SipHash there, and its per-process
/// random seed keeps crafted names from colliding on purpose.
pub(super) type Map<K, V> = HashMap<K, V, RandomState>;
pub(super) type Set<T> = HashSet<T, RandomState>;

/// A map of what comes and goes all the time (open journeys and their
/// entries), never grown by std on its own. Under a steady load, deleted
/// slots use up a map's free room; std then clears them in place if the
/// map is at most half full and otherwise doubles it, minutes into a load
/// that no longer grows. Here a full map is rebuilt at its size instead,
/// and doubles only if that would leave less than a sixteenth of it free.
/// `insert` and `entry` are the ways in.
pub(super) struct Table<K, V> {
    map: Map<K, V>,
    /// The map's room (deleted slots counted as free) when last sized here.
    room: usize,
}

impl<K: Hash + Eq, V> Table<K, V> {
    pub(super) fn new() -> Self {
        Self {
            map: Map::default(),
            room: 0,
        }
    }

    /// No free room left: deleted slots used it up, or it is full.
    fn full(&self) -> bool {
        self.map.len() >= self.map.capacity()
    }

    fn make_room(&mut self) {
        if !self.full() {
            return;
        }
        let wanted = self.map.len() + 1;
        if 2 * wanted > self.room && wanted + self.room / 16 <= self.room {
            // std would double it: its entries go back in, each into a free
            // slot, as draining leaves none deleted. Through a list, not a
            // second map: that would hold the table twice at the peak.
            let entries: Vec<(K, V)> = self.map.drain().collect();
            self.map.extend(entries);
        } else {
            // Cleared in place (at most half full), or doubled.
            self.map.reserve(1);
        }
        self.room = self.map.capacity();
    }

    /// Makes room for one more by `prune` first, where what it holds can
    /// expire.
    pub(super) fn make_room_pruning(&mut self, prune: impl FnOnce(&mut Map<K, V>)) {
        if self.full() {
            prune(&mut self.map);
            self.make_room();
        }
    }

    #[cfg(test)]
    pub(super) fn insert(&mut self, k: K, v: V) -> Option<V> {
        self.make_room();
        self.map.insert(k, v)
    }

    pub(super) fn entry(&mut self, k: K) -> Entry<'_, K, V> {
        self.make_room();
        self.map.entry(k)
    }
}

impl<K, V> std::ops::Deref for Table<K, V> {
    type Target = Map<K, V>;
    fn deref(&self) -> &Map<K, V> {
        &self.map
    }
}

impl<K, V> std::ops::DerefMut for Table<K, V> {
    fn deref_mut(&mut self) -> &mut Map<K, V> {
        &mut self.map
    }
}
