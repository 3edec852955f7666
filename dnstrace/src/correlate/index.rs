//! How open journeys are found: their slots by what they share, and by
//! their question.
use std::{
    collections::hash_map::Entry,
    hash::{BuildHasher, Hash, Hasher as _},
    net::IpAddr,
};

use foldhash::fast::RandomState;

use super::{
    open::{Question, Slab, Slot},
    table::{Map, Set, Table},
};

/// An index key: half a hash. Keys that share it share an index entry,
/// and each journey found is confirmed against its own, as with a whole
/// hash; half a hash keeps an entry at 8 bytes.
pub(super) fn short(hash: u64) -> u32 {
    (hash >> 32) as u32
}

/// Open journeys' slots grouped by something they share. Most groups hold
/// one; some hold thousands (one resolver socket's queries), so removal is
/// never a scan. The two kinds are kept apart, so that an entry of the
/// common kind is its key and a slot, not an enum.
pub(super) struct Index<K> {
    one: Table<K, Slot>,
    many: Map<K, Set<Slot>>,
}

impl<K: Hash + Eq> Index<K> {
    pub(super) fn new() -> Self {
        Self {
            one: Table::new(),
            many: Map::default(),
        }
    }

    pub(super) fn add(&mut self, k: K, slot: Slot) {
        if let Some(slots) = self.many.get_mut(&k) {
            slots.insert(slot);
            return;
        }
        match self.one.entry(k) {
            Entry::Vacant(v) => {
                v.insert(slot);
            }
            Entry::Occupied(o) if *o.get() == slot => {}
            Entry::Occupied(o) => {
                let (k, first) = o.remove_entry();
                self.many.insert(k, Set::from_iter([first, slot]));
            }
        }
    }

    pub(super) fn remove(&mut self, k: &K, slot: Slot) {
        if self.one.get(k) == Some(&slot) {
            self.one.remove(k);
        } else if let Some(slots) = self.many.get_mut(k) {
            slots.remove(&slot);
            if slots.is_empty() {
                self.many.remove(k);
            }
        }
    }

    pub(super) fn get<Q: Hash + Eq + ?Sized>(&self, k: &Q) -> impl Iterator<Item = Slot> + '_
    where
        K: std::borrow::Borrow<Q>,
    {
        let many = self.many.get(k).into_iter().flatten().copied();
        self.one.get(k).copied().into_iter().chain(many)
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.one.is_empty() && self.many.is_empty()
    }
}

/// An address as one word to hash: IPv4's in the low 32 bits.
pub(super) fn ip_word(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(ip) => u128::from(ip.to_bits()),
        IpAddr::V6(ip) => ip.to_bits(),
    }
}

/// Open journeys by the hash of client socket, transport, DNS id, type and
/// name (its hash in any case, `name_hash`): a busy socket reuses its
/// ids within a timeout, for other names, and each would otherwise share a
/// slot. Each found is confirmed against its own keys. An entry is 8
/// bytes, not a key.
pub(super) struct ByKey {
    pub(super) slots: Index<u32>,
    hasher: RandomState,
}

impl ByKey {
    pub(super) fn new() -> Self {
        Self {
            slots: Index::new(),
            hasher: RandomState::default(),
        }
    }

    /// Written as three words: hashing the parts as a tuple wrote each
    /// (an address's variant, length and bytes) with a call of its own,
    /// once per packet.
    fn key(&self, q: &Question<'_>) -> u32 {
        let ip = q.client.ip();
        let rest = u64::from(q.client.port())
            | u64::from(q.dns_id) << 16
            | u64::from(q.qtype.0) << 32
            | u64::from(q.tcp) << 48
            | u64::from(ip.is_ipv6()) << 49;
        let mut h = self.hasher.build_hasher();
        h.write_u128(ip_word(ip));
        h.write_u64(rest);
        h.write_u64(q.name_hash);
        short(h.finish())
    }

    /// The open journey known by this question from `client`, if any.
    pub(super) fn find(&self, open: &Slab, q: &Question<'_>) -> Option<Slot> {
        self.slots
            .get(&self.key(q))
            .find(|&slot| open.get(slot).is_some_and(|o| o.known_as(q)))
    }

    /// Files `slot` under `q`, in place of any other journey known by it.
    pub(super) fn file(&mut self, open: &Slab, q: &Question<'_>, slot: Slot) {
        let key = self.key(q);
        let stale = self
            .slots
            .get(&key)
            .find(|&other| other != slot && open.get(other).is_some_and(|o| o.known_as(q)));
        if let Some(other) = stale {
            self.slots.remove(&key, other);
        }
        self.slots.add(key, slot);
    }

    pub(super) fn unfile(&mut self, q: &Question<'_>, slot: Slot) {
        self.slots.remove(&self.key(q), slot);
    }
}
