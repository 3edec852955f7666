//! Correlation: decoded DNS packets, seen at many hooks, become journeys.
//!
//! A journey is one query from one client socket (client address, DNS id,
//! question) followed across every place it was seen, through DNAT, to the
//! server and back, until the answer reaches the client, the kernel drops it,
//! or it times out. Queries a server sends while a journey waits there, for
//! the same question, are its upstream journeys. The engine is pure: records
//! in, journeys out, time only from the records and `tick`.
use std::{
    borrow::Cow,
    collections::{hash_map::Entry, HashMap, HashSet, VecDeque},
    hash::{BuildHasher, Hash},
    net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6},
    sync::Arc,
};

use dnstrace_common::{sample, Hook, SampleLevel};
use foldhash::fast::RandomState;
use serde::Serialize;

use crate::{
    conntrack::CtEvent,
    decode::{dns::qtype_name, Body, Conntrack, DnsMessage, Packet, Record, Seen, Transport},
};

mod connections;
mod sampling;

use connections::Connections;
pub use connections::{Connection, Reset};
use sampling::Sampling;

/// Loss windows remembered; past this, the two oldest become one.
const MAX_LOSSES: usize = 256;
/// Devices kept before the table is first compacted.
const DEVICES_LIMIT: usize = 4096;
/// Journeys closed by one `tick` at most: closing 100,000 at once (the end
/// of a capture, a burst of timeouts) would hold them all, as full
/// journeys, at the same time.
pub const CLOSE_BATCH: usize = 4096;

/// The engine's maps are keyed by what packets carry, once per packet:
/// foldhash is several times faster than SipHash there, and its per-process
/// random seed keeps crafted names from colliding on purpose.
type Map<K, V> = HashMap<K, V, RandomState>;
type Set<T> = HashSet<T, RandomState>;

/// A map of what comes and goes all the time (open journeys and their
/// entries), never grown by std on its own. Under a steady load, deleted
/// slots use up a map's free room; std then clears them in place if the
/// map is at most half full and otherwise doubles it, minutes into a load
/// that no longer grows. Here a full map is rebuilt at its size instead,
/// and doubles only if that would leave less than a sixteenth of it free.
/// `insert` and `entry` are the ways in.
struct Table<K, V> {
    map: Map<K, V>,
    /// The map's room (deleted slots counted as free) when last sized here.
    room: usize,
}

impl<K: Hash + Eq, V> Table<K, V> {
    fn new() -> Self {
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
    fn make_room_pruning(&mut self, prune: impl FnOnce(&mut Map<K, V>)) {
        if self.full() {
            prune(&mut self.map);
            self.make_room();
        }
    }

    #[cfg(test)]
    fn insert(&mut self, k: K, v: V) -> Option<V> {
        self.make_room();
        self.map.insert(k, v)
    }

    fn entry(&mut self, k: K) -> Entry<'_, K, V> {
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

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A journey without an answer ends after this long.
    pub timeout_ns: u64,
    /// Journeys followed at once; the oldest beyond this are evicted.
    pub max_open: usize,
    /// Quiet time after the last leg before a journey is closed, so that
    /// events arriving slightly out of order still join it.
    pub settle_ns: u64,
}

impl Default for Limits {
    fn default() -> Self {
        // A little over the resolvers' 5 s retry.
        Self {
            timeout_ns: 5_500_000_000,
            max_open: 65_536,
            settle_ns: 200_000_000,
        }
    }
}

/// One sighting of a journey's packet.
#[derive(Clone, Debug)]
pub struct Leg {
    pub ts_ns: u64,
    /// Time since the previous leg of the journey.
    pub since_prev_ns: u64,
    /// Its name and direction (ingress, egress, drop, nat or clash) are
    /// `Hook`'s: a byte here, not two strings.
    pub hook: Hook,
    /// Shared among legs: thousands of open journeys name the same devices.
    pub iface: Option<Arc<str>>,
    pub ifindex: u32,
    pub netns: u32,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub response: bool,
    /// (asked for, rewritten to), where conntrack shows a DNAT. Boxed, as
    /// most legs have none and open journeys should stay small.
    pub dnat: Option<Box<(SocketAddr, SocketAddr)>>,
    pub snat: Option<Box<(SocketAddr, SocketAddr)>>,
    /// The kernel's drop reason and location, numbers as captured. Boxed,
    /// as few legs are drops.
    pub drop: Option<Box<(u32, u64)>>,
    /// Where it saw part of a fragmented message only. Boxed: rare.
    pub fragment: Option<Box<FragmentNote>>,
}

/// A leg that saw part of a fragmented message: the fragment at `offset`
/// (the kernel dropped it there), or, `missing`, the datagram without the
/// fragment at `offset`, which was seen last at `last_seen`, if anywhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FragmentNote {
    pub offset: u16,
    pub missing: bool,
    pub last_seen: Option<Seen>,
}

impl FragmentNote {
    /// `the fragment at offset 1480`, or `without its fragment at offset
    /// 1480, last seen on veth1@4026532177 (dev_receive)`.
    pub fn describe(&self) -> String {
        if !self.missing {
            return format!("the fragment at offset {}", self.offset);
        }
        let last = match &self.last_seen {
            Some(s) => {
                // Without --iface names: the device's own, or its index.
                let dev = s.device_name(&std::collections::HashMap::new());
                format!("last seen on {dev}@{} ({})", s.netns, s.hook.name())
            }
            None => "never seen".to_owned(),
        };
        format!("without its fragment at offset {}, {last}", self.offset)
    }

    /// What `rec` shows of a fragmented message, if it shows part of one.
    /// Boxed: every packet asks, few have one.
    fn of(rec: &Record) -> Option<Box<Self>> {
        if let Some(m) = &rec.missing {
            return Some(Box::new(Self {
                offset: m.offset,
                missing: true,
                last_seen: m.last_seen.clone(),
            }));
        }
        let f = rec.packet.frag.filter(|f| f.offset > 0)?;
        Some(Box::new(Self {
            offset: f.offset,
            missing: false,
            last_seen: None,
        }))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum Outcome {
    Answered {
        rcode: Cow<'static, str>,
        answers: Vec<String>,
        truncated: bool,
    },
    Dropped {
        reason: u32,
        location: u64,
    },
    Timeout,
}

#[derive(Clone, Debug)]
pub struct Journey {
    pub id: u64,
    /// Journeys of one lookup (A and AAAA siblings, retries) share this.
    pub lookup: u64,
    pub client: SocketAddr,
    pub dns_id: u16,
    pub name: Arc<str>,
    pub qtype: &'static str,
    pub tcp: bool,
    pub started_ns: u64,
    pub ended_ns: u64,
    pub outcome: Outcome,
    /// Where the service address was translated, if it was. Boxed: it is
    /// known only once the journey is closed.
    pub dnat: Option<Box<(SocketAddr, SocketAddr)>>,
    pub legs: Vec<Leg>,
    pub upstream: Vec<Journey>,
    /// Why legs may be missing, if they may.
    pub incomplete: Option<Gap>,
    /// The strictest sampling level it was kept under (shift 0: none).
    pub sampled: SampleLevel,
    /// Over TCP: how its connection was set up and ended. Boxed: few have one.
    pub connection: Option<Box<Connection>>,
}

/// Why a journey may not show everything that happened to it: absence of a
/// leg or an answer is then no evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gap {
    /// Kernel events were lost while it was open.
    Lost,
    /// The capture or recording ended before it could finish.
    Ended,
}

impl Gap {
    pub fn why(self) -> &'static str {
        match self {
            Gap::Lost => "kernel events were lost while it was open",
            Gap::Ended => "the capture ended before it could finish",
        }
    }
}

impl Leg {
    pub fn direction(&self) -> &'static str {
        self.hook.direction()
    }
}

impl Journey {
    pub fn total_ns(&self) -> u64 {
        self.ended_ns.saturating_sub(self.started_ns)
    }
}

/// A journey's question as first asked; the name lowercase.
struct Key {
    client: SocketAddr,
    dns_id: u16,
    /// Not shared while open: a `Box` is 16 bytes smaller than an `Arc`.
    name: Box<str>,
    /// The type's number (`qtype_name` names it).
    qtype: u16,
}

/// Where an open journey is kept: its place in `Slab`. Indexes hold slots
/// (4 bytes, where ids are 8) and drop them when the journey closes.
type Slot = u32;

/// A journey named where it may have closed since (the order of starts,
/// the settling list, upstream links): its slot and the low half of its
/// id, checked against the journey in the slot. A slot reused 2^32 starts
/// later would pass; nothing holds a `Ref` that long (its holder closes
/// within a timeout, or the list is compacted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ref {
    slot: Slot,
    id: u32,
}

impl Ref {
    fn new(slot: Slot, id: u64) -> Self {
        Self {
            slot,
            id: id as u32,
        }
    }
}

/// A journey being followed: only what following it needs, compact (its
/// legs as `OpenLeg`s, its outcome as the leg that decided it, its `Key`
/// flattened), as under load open journeys are most of the memory. It
/// becomes a `Journey` when it closes.
struct Open {
    id: u64,
    lookup: u64,
    started_ns: u64,
    name: Box<str>,
    legs: Vec<OpenLeg>,
    /// The latest answer seen, the outcome if an answer `decided` it.
    answer: Option<Arc<DnsMessage>>,
    /// A boxed slice, 8 bytes smaller than a `Vec`: most have none, few
    /// more than one.
    children: Box<[Ref]>,
    /// Boxed, as most journeys have none.
    extra: Option<Box<Extra>>,
    parent: Option<Ref>,
    /// 1 + the index of the leg that decided the outcome (the latest
    /// answer or drop, in kernel time); 0 while there is none.
    decided: u32,
    /// The key's client, packed as legs pack addresses.
    client: Addr,
    dns_id: u16,
    qtype: u16,
    incomplete: Option<Gap>,
    /// `CLIENT_V6`, `TCP`, `DELIVERED`, `ANSWER_SEEN`: bits, not bools,
    /// so that `label` fits in the slot.
    bits: u8,
    /// The hash of its question's first label, by which the kernel's
    /// sampling level keeps or leaves out its lookup.
    label: u32,
}

/// `Open::bits`: the client's address is IPv6.
const CLIENT_V6: u8 = 1;
const TCP: u8 = 2;
/// The answer reached the netns the query started in.
const DELIVERED: u8 = 4;
/// A leg is a response.
const ANSWER_SEEN: u8 = 8;

const _: () = assert!(std::mem::size_of::<Option<Open>>() <= 128);

/// Open journeys in chunks of slots, so that growing never moves them all
/// (a reallocation would hold them twice for a moment); a closed journey's
/// slot goes to the next. It keeps the chunks it grew to, bounded by
/// `Limits::max_open`, so that a steady load never allocates here.
#[derive(Default)]
struct Slab {
    chunks: Vec<Box<[Option<Open>]>>,
    free: Vec<Slot>,
    /// Slots handed out at least once; the rest of the last chunk is new.
    used: usize,
    len: usize,
}

/// Slots a chunk: 128 KiB.
const CHUNK: usize = 1024;

/// What few journeys have: what conntrack showed of the client socket
/// besides the legs, and IPv6 addresses.
#[derive(Default)]
struct Extra {
    /// Client sockets the query is also known by, past a SNAT.
    aliases: Vec<SocketAddr>,
    /// The DNAT ctnetlink reported for the client socket.
    dnat: Option<(SocketAddr, SocketAddr)>,
    /// The IPv6 socket addresses its legs name, each once.
    v6: Vec<SocketAddrV6>,
}

/// A leg while its journey is open: 32 bytes, not a `Leg`'s 136 (its
/// device an id in `Devices`, its marks shared, its addresses in 6 bytes
/// each, no time since the previous leg, which is known only once the legs
/// are sorted).
struct OpenLeg {
    ts_ns: u64,
    marks: Option<Arc<Marks>>,
    src: Addr,
    dst: Addr,
    dev: u16,
    hook: Hook,
    /// `RESPONSE`, and which addresses are IPv6: `V6_SRC`, `V6_DST`.
    bits: u8,
}

const _: () = assert!(std::mem::size_of::<OpenLeg>() <= 32);

/// Legs an open journey has room for from its start: a lookup through a
/// service's DNAT on one node passes 8 hooks (pod, veth, bridge, CoreDNS
/// and back), and a vector grown to 8 one leg at a time moves twice.
const LEGS: usize = 8;

const RESPONSE: u8 = 1;
const V6_SRC: u8 = 2;
const V6_DST: u8 = 4;

/// What some legs carry: the NAT conntrack showed, the kernel's drop
/// (reason, location). One copy for a journey's legs that carry the same:
/// past a DNAT, each leg shows it.
#[derive(PartialEq)]
struct Marks {
    dnat: Option<(SocketAddr, SocketAddr)>,
    snat: Option<(SocketAddr, SocketAddr)>,
    drop: Option<(u32, u64)>,
    fragment: Option<Box<FragmentNote>>,
}

/// A record's message as a leg takes it.
struct Sighting<'a> {
    msg: &'a Arc<DnsMessage>,
    /// Not all there: never the journey's answer.
    cut: bool,
    fragment: Option<Box<FragmentNote>>,
}

/// Where legs are seen: shared, as thousands of open journeys pass the
/// same few devices.
struct Device {
    netns: u32,
    ifindex: u32,
    name: Option<Arc<str>>,
}

/// The devices legs were seen at, each kept once and known to legs by a
/// 2-byte id. Devices are few (a node's, in every namespace) but pods come
/// and go: when the table fills, it keeps only what open legs use.
struct Devices {
    list: Vec<Device>,
    /// The latest id of each (netns, ifindex).
    ids: Map<(u32, u32), u16>,
    /// Compacted when `list` reaches this; doubled, up to 65,536, when
    /// compacting frees less than half.
    limit: usize,
}

/// A leg's socket address in 6 bytes, not 32: an IPv4 one inline, an
/// IPv6 one (rare) as its place in the journey's `Extra::v6`.
#[derive(Clone, Copy)]
struct Addr([u8; 6]);

/// Where a query was delivered, as a server's own queries show it: sent
/// from that network namespace, or (without namespaces) that address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Place {
    Netns(u32),
    Addr(IpAddr),
}

pub struct Engine {
    limits: Limits,
    open: Slab,
    by_key: ByKey,
    /// Unanswered journeys by question and place, TCP journeys by question,
    /// and journeys by client socket, so that finding a parent, a TCP
    /// retry or a conntrack entry's journeys never scans them all. The
    /// first is keyed by a hash of (name hash, place): a parent found there
    /// is confirmed by its name and `Open::server_is`.
    waiting: Index<u32>,
    tcp_by_name: Index<Box<str>>,
    /// Keyed by the client socket hashed (4 bytes, not 32), each journey
    /// found there confirmed by its own key.
    by_client: Index<u32>,
    hasher: RandomState,
    /// Journeys, oldest first, for eviction and for the timed-out ones;
    /// closed ones are skipped lazily and compacted away now and then.
    order: VecDeque<Ref>,
    /// Journeys that were answered or dropped, some closed since (pruned
    /// lazily, as `order` is). With the open ones old enough to have timed
    /// out (at the front of `order`), they are all a tick can find finished.
    settling: Vec<Ref>,
    /// How far a journey's first packet has come before an earlier
    /// journey's (events from several CPUs arrive slightly out of order):
    /// how far past the timeout a tick looks along `order`.
    reorder_ns: u64,
    latest_start_ns: u64,
    /// (lookup, last start) by the hash of (client socket, name): lookups
    /// outlive their journeys, so they keep no name. Two lookups whose hashes
    /// collide (odds 2^-64 a pair) would share an id; nothing else. Pruned
    /// of expired lookups before it grows.
    lookups: Table<u64, (u64, u64)>,
    /// (lookup, answer time) of truncated UDP answers, by the hash of
    /// (client address, name, type): the client's TCP retry, from a socket
    /// of its own, is the same lookup. Pruned as `lookups` is.
    truncated: Table<u64, (u64, u64)>,
    /// The TCP connections DNS went over, or tried to.
    connections: Connections,
    /// When each address last sent or got DNS over TCP, even where the
    /// message could not be read (a payload outside the captured bytes).
    tcp_seen: Map<IpAddr, u64>,
    next_id: u64,
    evicted: u64,
    /// Windows (since, until) in which the kernel lost events, kept while
    /// a journey that may still close could overlap one: it may miss legs,
    /// even if its first event was read only after the loss was noticed.
    losses: VecDeque<(u64, u64)>,
    sampling: Sampling,
    /// Journeys left out because a sampling level in effect while they
    /// were open would have left their later legs out.
    shed: u64,
    devices: Devices,
}

/// Open journeys by the hash of client socket, DNS id, type and name (in
/// any case, hashed lowercase without a copy): a busy socket reuses its
/// ids within a timeout, for other names, and each would otherwise share a
/// slot. Each found is confirmed against its own keys. An entry is 8
/// bytes, not a key.
struct ByKey {
    slots: Index<u32>,
    hasher: RandomState,
}

impl ByKey {
    fn new() -> Self {
        Self {
            slots: Index::new(),
            hasher: RandomState::default(),
        }
    }

    fn key(&self, q: &Question<'_>) -> u32 {
        short(
            self.hasher
                .hash_one((q.client, q.dns_id, q.qtype, AnyCase(q.name))),
        )
    }

    /// The open journey known by this question from `client`, if any.
    fn find(&self, open: &Slab, q: &Question<'_>) -> Option<Slot> {
        self.slots
            .get(&self.key(q))
            .find(|&slot| open.get(slot).is_some_and(|o| o.known_as(q)))
    }

    /// Files `slot` under `q`, in place of any other journey known by it.
    fn file(&mut self, open: &Slab, q: &Question<'_>, slot: Slot) {
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

    fn unfile(&mut self, q: &Question<'_>, slot: Slot) {
        self.slots.remove(&self.key(q), slot);
    }
}

/// An index key: half a hash. Keys that share it share an index entry,
/// and each journey found is confirmed against its own, as with a whole
/// hash; half a hash keeps an entry at 8 bytes.
fn short(hash: u64) -> u32 {
    (hash >> 32) as u32
}

/// A name hashed as its lowercase, as names compare ignoring case.
struct AnyCase<'a>(&'a str);

impl Hash for AnyCase<'_> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let mut buf = [0u8; 64];
        for chunk in self.0.as_bytes().chunks(buf.len()) {
            let lower = &mut buf[..chunk.len()];
            lower.copy_from_slice(chunk);
            lower.make_ascii_lowercase();
            h.write(lower);
        }
    }
}

/// A question as a packet asks it: the name in any case.
#[derive(Clone, Copy)]
struct Question<'a> {
    client: SocketAddr,
    dns_id: u16,
    qtype: u16,
    name: &'a str,
}

/// Open journeys' slots grouped by something they share. Most groups hold
/// one; some hold thousands (one resolver socket's queries), so removal is
/// never a scan. The two kinds are kept apart, so that an entry of the
/// common kind is its key and a slot, not an enum.
struct Index<K> {
    one: Table<K, Slot>,
    many: Map<K, Set<Slot>>,
}

impl<K: Hash + Eq> Index<K> {
    fn new() -> Self {
        Self {
            one: Table::new(),
            many: Map::default(),
        }
    }

    fn add(&mut self, k: K, slot: Slot) {
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

    fn remove(&mut self, k: &K, slot: Slot) {
        if self.one.get(k) == Some(&slot) {
            self.one.remove(k);
        } else if let Some(slots) = self.many.get_mut(k) {
            slots.remove(&slot);
            if slots.is_empty() {
                self.many.remove(k);
            }
        }
    }

    fn get<Q: Hash + Eq + ?Sized>(&self, k: &Q) -> impl Iterator<Item = Slot> + '_
    where
        K: std::borrow::Borrow<Q>,
    {
        let many = self.many.get(k).into_iter().flatten().copied();
        self.one.get(k).copied().into_iter().chain(many)
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.one.is_empty() && self.many.is_empty()
    }
}

impl Slab {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, slot: Slot) -> Option<&Open> {
        let s = slot as usize;
        self.chunks.get(s / CHUNK)?[s % CHUNK].as_ref()
    }

    fn get_mut(&mut self, slot: Slot) -> Option<&mut Open> {
        let s = slot as usize;
        self.chunks.get_mut(s / CHUNK)?[s % CHUNK].as_mut()
    }

    /// The journey `r` names, if it is still open.
    fn at(&self, r: Ref) -> Option<&Open> {
        self.get(r.slot).filter(|o| Ref::new(r.slot, o.id) == r)
    }

    fn insert(&mut self, o: Open) -> Slot {
        let slot = self.free.pop().unwrap_or_else(|| {
            if self.used == self.chunks.len() * CHUNK {
                self.chunks.push((0..CHUNK).map(|_| None).collect());
            }
            self.used += 1;
            Slot::try_from(self.used - 1).expect("at most Limits::max_open open")
        });
        let s = slot as usize;
        self.chunks[s / CHUNK][s % CHUNK] = Some(o);
        self.len += 1;
        slot
    }

    /// Takes the journey `r` names out, if it is still open.
    fn remove(&mut self, r: Ref) -> Option<Open> {
        self.at(r)?;
        let s = r.slot as usize;
        let o = self.chunks[s / CHUNK][s % CHUNK].take()?;
        self.free.push(r.slot);
        self.len -= 1;
        Some(o)
    }

    fn iter(&self) -> impl Iterator<Item = (Slot, &Open)> {
        self.chunks
            .iter()
            .flat_map(|c| c.iter())
            .enumerate()
            .filter_map(|(s, o)| Some((s as Slot, o.as_ref()?)))
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut Open> {
        self.chunks
            .iter_mut()
            .flat_map(|c| c.iter_mut())
            .filter_map(Option::as_mut)
    }
}

impl Engine {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            open: Slab::default(),
            by_key: ByKey::new(),
            waiting: Index::new(),
            tcp_by_name: Index::new(),
            by_client: Index::new(),
            hasher: RandomState::default(),
            order: VecDeque::new(),
            settling: Vec::new(),
            reorder_ns: 0,
            latest_start_ns: 0,
            lookups: Table::new(),
            truncated: Table::new(),
            connections: Connections::new(limits.max_open, limits.timeout_ns),
            tcp_seen: Map::default(),
            next_id: 1,
            evicted: 0,
            losses: VecDeque::new(),
            sampling: Sampling::default(),
            shed: 0,
            devices: Devices {
                list: Vec::new(),
                ids: Map::default(),
                limit: DEVICES_LIMIT,
            },
        }
    }

    /// Journeys dropped because too many were open at once.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// The kernel's sampling level changed.
    pub fn sampling(&mut self, c: crate::ingest::SampleChange) {
        self.sampling.change(c);
    }

    /// The sampling level in effect now.
    pub fn sampling_level(&self) -> SampleLevel {
        self.sampling.now()
    }

    /// Journeys left out whole at sampling changes, rather than shown with
    /// legs the new level left out.
    pub fn shed(&self) -> u64 {
        self.shed
    }

    /// Did `client` turn to TCP since `since_ns`: a TCP journey for the
    /// question still open, or DNS over TCP seen from it at all?
    pub fn asked_over_tcp(&self, client: IpAddr, name: &str, qtype: &str, since_ns: u64) -> bool {
        let open = self.tcp_by_name.get(name).any(|slot| {
            self.open
                .get(slot)
                .is_some_and(|o| o.client().ip() == client && qtype_name(o.qtype) == qtype)
        });
        open || self.tcp_seen.get(&client).is_some_and(|&ts| ts >= since_ns)
            || self.connections.tried_since(client, since_ns)
    }

    /// A TCP segment to or from a DNS port, with or without a message.
    pub fn segment(&mut self, p: &Packet) {
        self.connections.push(p);
    }

    /// TCP connections to DNS servers that were never set up, since the
    /// last call.
    pub fn failed_connections(&mut self) -> Vec<Connection> {
        self.connections.take_failed()
    }

    fn note_tcp(&mut self, p: &Packet) {
        if !matches!(p.transport, crate::decode::Transport::Tcp { .. }) {
            return;
        }
        if self.tcp_seen.len() > self.limits.max_open {
            let window = self.limits.timeout_ns;
            self.tcp_seen
                .retain(|_, ts| p.ts_ns.saturating_sub(*ts) <= window);
        }
        for ip in [p.src.ip(), p.dst.ip()] {
            let ts = self.tcp_seen.entry(ip).or_default();
            *ts = (*ts).max(p.ts_ns);
        }
    }

    /// Journeys followed now.
    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// Adds one decoded record; malformed payloads join nothing. A cut
    /// message joins its journey, but never as its answer.
    pub fn push(&mut self, rec: &Record) {
        self.note_tcp(&rec.packet);
        let (msg, cut) = match &rec.body {
            Body::Dns(msg) => (msg, false),
            Body::Cut(msg) => (msg, true),
            Body::Malformed { .. } => return,
        };
        let Some(q) = msg.questions.first() else {
            return;
        };
        let p = &rec.packet;
        // Conntrack knows the client's own address even after SNAT.
        let client = match (&p.ct, msg.response) {
            (Some(ct), _) => ct.original.src,
            (None, true) => p.dst,
            (None, false) => p.src,
        };
        let asked = Question {
            client,
            dns_id: msg.id,
            qtype: q.qtype_code,
            name: &q.name,
        };
        let slot = match self.by_key.find(&self.open, &asked) {
            Some(slot) => slot,
            // A reply whose query was never seen starts nothing.
            None if msg.response => return,
            None => {
                let key = Key {
                    client,
                    dns_id: msg.id,
                    name: q.name.to_ascii_lowercase().into(),
                    qtype: q.qtype_code,
                };
                self.start(key, p)
            }
        };
        let dev = self.device(p);
        let Some(o) = self.open.get_mut(slot) else {
            return;
        };
        let was_settling = o.delivered_or_dropped();
        let filed = o.places(&self.devices);
        let seen = Sighting {
            msg,
            cut,
            fragment: FragmentNote::of(rec),
        };
        o.add_leg(p, &seen, dev, &self.devices);
        // Filed once the journey is done with: its TCP retry's lookup.
        let truncated = (msg.response && msg.flags.tc && !o.has(TCP)).then(|| {
            (
                retry_key(&self.hasher, o.client().ip(), &o.name, o.qtype),
                o.lookup,
            )
        });
        if !was_settling && o.delivered_or_dropped() {
            self.settling.push(Ref::new(slot, o.id));
        }
        let places = o.places(&self.devices);
        if filed != places {
            let name = self.hasher.hash_one(&o.name);
            for pl in filed.into_iter().flatten() {
                self.waiting
                    .remove(&place_key(&self.hasher, name, pl), slot);
            }
            for pl in places.into_iter().flatten() {
                self.waiting.add(place_key(&self.hasher, name, pl), slot);
            }
        }
        // Past a SNAT the same query goes on under another source address.
        let alias =
            p.ct.as_ref()
                .and_then(Conntrack::snat)
                .map(|(_, seen)| seen);
        if let Some(alias) = alias.filter(|a| !o.aliases().any(|k| k == a)) {
            o.extra.get_or_insert_default().aliases.push(alias);
            let name = o.name.clone();
            let q = Question {
                client: alias,
                dns_id: o.dns_id,
                qtype: o.qtype,
                name: &name,
            };
            self.by_key.file(&self.open, &q, slot);
        }
        if let Some((key, lookup)) = truncated {
            self.note_truncated(key, lookup, p.ts_ns);
        }
    }

    /// A ctnetlink event: where no leg carried the conntrack entry, it still
    /// tells which endpoint the service address was translated to.
    pub fn conntrack(&mut self, ev: &CtEvent) {
        let Some(dnat) = (Conntrack {
            original: ev.original,
            reply: ev.reply,
            status: ev.status,
            is_reply: false,
        })
        .dnat() else {
            return;
        };
        let client = ev.original.src;
        for slot in self.by_client.get(&short(self.hasher.hash_one(client))) {
            if let Some(o) = self.open.get_mut(slot).filter(|o| o.client() == client) {
                o.extra.get_or_insert_default().dnat.get_or_insert(dnat);
            }
        }
    }

    /// Events were lost between `since_ns` and `until_ns`: every open
    /// journey may miss legs, and so may any journey overlapping that time.
    pub fn lost(&mut self, since_ns: u64, until_ns: u64) {
        for o in self.open.values_mut() {
            o.incomplete = Some(Gap::Lost);
        }
        // Merged, never dropped: a wider window only marks more journeys.
        if self.losses.len() == MAX_LOSSES {
            if let Some((since, _)) = self.losses.pop_front() {
                if let Some(next) = self.losses.front_mut() {
                    next.0 = next.0.min(since);
                }
            }
        }
        self.losses.push_back((since_ns, until_ns));
    }

    /// Whether a journey started at `start` and closed at `now` overlaps a
    /// loss.
    fn overlaps_loss(&self, start: u64, now: u64) -> bool {
        self.losses
            .iter()
            .any(|(since, until)| start <= *until && now >= *since)
    }

    /// The earliest a journey that may still close can have started: the
    /// oldest open one's start, or the next one's, less how far starts
    /// arrive out of order. Not the close time less a timeout: a pipeline
    /// seconds behind closes journeys at times far past their starts.
    fn earliest_start(&mut self) -> u64 {
        while self
            .order
            .front()
            .is_some_and(|&r| self.open.at(r).is_none())
        {
            self.order.pop_front();
        }
        let oldest = self.order.front().and_then(|&r| self.open.at(r));
        oldest
            .map_or(self.latest_start_ns, |o| o.started_ns)
            .saturating_sub(self.reorder_ns)
    }

    /// Forgets the loss windows and sampling changes no journey that may
    /// still close reaches.
    fn forget_past(&mut self) {
        let earliest = self.earliest_start();
        while self
            .losses
            .front()
            .is_some_and(|(_, until)| *until < earliest)
        {
            self.losses.pop_front();
        }
        self.sampling.forget_before(earliest);
    }

    /// Closes what is finished at `now_ns`, earliest first, and returns
    /// top-level journeys: `CLOSE_BATCH` at most, so call it again while it
    /// returns that many.
    pub fn tick(&mut self, now_ns: u64) -> Vec<Journey> {
        self.forget_past();
        self.connections.tick(now_ns);
        let mut ready = if self.few_settling() {
            // Many lookups unanswered: only those settling, and those old
            // enough to have timed out, can be finished. Journeys start in
            // `order` within `reorder_ns` of one another, so past the first
            // one this recent, none has timed out.
            let timed_out_by = now_ns
                .saturating_sub(self.limits.timeout_ns)
                .saturating_add(self.reorder_ns);
            let open = &self.open;
            let old = self
                .order
                .iter()
                .filter_map(|&r| Some((r.slot, open.at(r)?)))
                .take_while(|(_, o)| o.started_ns <= timed_out_by);
            let settling = self
                .settling
                .iter()
                .filter_map(|&r| Some((r.slot, open.at(r)?)));
            self.ready(old.chain(settling), now_ns)
        } else {
            self.ready(self.open.iter(), now_ns)
        };
        // By first leg, then id: one order however the batches fall.
        ready.sort_unstable();
        ready.dedup();
        ready
            .into_iter()
            .take(CLOSE_BATCH)
            .filter_map(|(_, id, slot)| self.close(Ref::new(slot, id), now_ns))
            .collect()
    }

    /// Which of `these` are finished at `now` and not left to close with a
    /// journey they serve: (first leg, id, slot).
    fn ready<'a>(
        &self,
        these: impl Iterator<Item = (Slot, &'a Open)>,
        now: u64,
    ) -> Vec<(u64, u64, Slot)> {
        these
            .filter(|(_, o)| {
                self.finished(o, now) && o.parent.is_none_or(|p| self.open.at(p).is_none())
            })
            .map(|(slot, o)| (o.first_ns(), o.id, slot))
            .collect()
    }

    /// Whether few journeys are settling, so that a tick need not ask every
    /// open one; prunes `settling`, and then the front of `order`, of closed
    /// journeys.
    fn few_settling(&mut self) -> bool {
        let open = &self.open;
        if self.settling.len() > 2 * open.len() + 1024 {
            self.settling.retain(|&r| open.at(r).is_some());
        }
        if self.settling.len() * 4 >= open.len() {
            return false;
        }
        self.settling.retain(|&r| open.at(r).is_some());
        while self.order.front().is_some_and(|&r| open.at(r).is_none()) {
            self.order.pop_front();
        }
        true
    }

    /// Closes everything still open (end of capture or of a recording),
    /// in batches as `tick` does: call it until it returns fewer than
    /// `CLOSE_BATCH`. What had no known fate by `now_ns` was cut off, not
    /// timed out.
    pub fn finish(&mut self, now_ns: u64) -> Vec<Journey> {
        let timeout_ns = self.limits.timeout_ns;
        for o in self.open.values_mut() {
            if !o.settled(now_ns, timeout_ns) {
                o.incomplete.get_or_insert(Gap::Ended);
            }
        }
        self.tick(now_ns.saturating_add(self.limits.timeout_ns + self.limits.settle_ns))
    }

    fn start(&mut self, key: Key, p: &Packet) -> Slot {
        if self.open.len() >= self.limits.max_open {
            self.evict_oldest();
        }
        let id = self.next_id;
        self.next_id += 1;
        self.reorder_ns = self
            .reorder_ns
            .max(self.latest_start_ns.saturating_sub(p.ts_ns));
        self.latest_start_ns = self.latest_start_ns.max(p.ts_ns);
        let tcp = matches!(p.transport, Transport::Tcp { .. });
        let retried = tcp.then(|| self.truncated_lookup(&key, p.ts_ns)).flatten();
        let lookup = retried.unwrap_or_else(|| self.lookup_for(&key, p.ts_ns, id));
        let name_hash = self.hasher.hash_one(&key.name);
        let parent = self.waiting_parent(&key, name_hash, p);
        let mut o = Open {
            id,
            lookup,
            started_ns: p.ts_ns,
            name: key.name,
            legs: Vec::with_capacity(LEGS),
            answer: None,
            children: Box::default(),
            extra: None,
            parent,
            decided: 0,
            client: Addr([0; 6]),
            dns_id: key.dns_id,
            qtype: key.qtype,
            incomplete: None,
            bits: if tcp { TCP } else { 0 },
            label: sample::message_label_hash(&p.payload),
        };
        let (client, v6) = o.pack(key.client);
        o.client = client;
        o.set(CLIENT_V6, v6);
        let slot = self.open.insert(o);
        let me = Ref::new(slot, id);
        if let Some(po) = parent.and_then(|p| self.open.get_mut(p.slot)) {
            let mut children = std::mem::take(&mut po.children).into_vec();
            children.push(me);
            po.children = children.into();
        }
        let o = self.open.get(slot).expect("just filed");
        self.by_key.file(&self.open, &o.question(), slot);
        if tcp {
            self.tcp_by_name.add(o.name.clone(), slot);
        }
        self.by_client
            .add(short(self.hasher.hash_one(key.client)), slot);
        if self.order.len() > 2 * self.open.len() + 1024 {
            let open = &self.open;
            self.order.retain(|&r| open.at(r).is_some());
        }
        self.order.push_back(me);
        slot
    }

    /// A/AAAA from one socket for one name, and its retries, are one lookup.
    /// A retry comes within a timeout of the query before it (the timeout is
    /// set just past the resolvers' retry), so a lookup is remembered that
    /// long past its latest query, and no longer: with thousands of lookups a
    /// second, what is remembered is about what is open.
    fn lookup_for(&mut self, key: &Key, ts: u64, id: u64) -> u64 {
        let window = self.limits.timeout_ns;
        self.lookups.make_room_pruning(|map| {
            map.retain(|_, (_, last)| ts.saturating_sub(*last) <= window);
        });
        let hash = self.hasher.hash_one((key.client, &*key.name));
        let slot = self.lookups.entry(hash).or_insert((id, ts));
        if ts.saturating_sub(slot.1) > window {
            *slot = (id, ts);
        }
        slot.1 = slot.1.max(ts);
        slot.0
    }

    fn note_truncated(&mut self, key: u64, lookup: u64, ts: u64) {
        let window = self.limits.timeout_ns;
        self.truncated.make_room_pruning(|map| {
            map.retain(|_, (_, last)| ts.saturating_sub(*last) <= window);
        });
        self.truncated.entry(key).insert_entry((lookup, ts));
    }

    /// The lookup a TCP query retries, if its client got a truncated answer
    /// to the same question within a timeout.
    fn truncated_lookup(&mut self, key: &Key, ts: u64) -> Option<u64> {
        let hash = retry_key(&self.hasher, key.client.ip(), &key.name, key.qtype);
        let &(lookup, at) = self.truncated.get(&hash)?;
        (ts.saturating_sub(at) <= self.limits.timeout_ns).then_some(lookup)
    }

    /// The open journey this query serves, if it was sent by a server that
    /// a journey for the same question is waiting at.
    fn waiting_parent(&self, key: &Key, name: u64, p: &Packet) -> Option<Ref> {
        let places = [
            Some(Place::Addr(p.src.ip())),
            (p.netns != 0).then_some(Place::Netns(p.netns)),
        ];
        places
            .into_iter()
            .flatten()
            .flat_map(|pl| self.waiting.get(&place_key(&self.hasher, name, pl)))
            .filter_map(|slot| Some((slot, self.open.get(slot)?)))
            .filter(|(_, o)| {
                o.name == key.name
                    && o.client() != key.client
                    && !o.has(ANSWER_SEEN)
                    && o.server_is(p, &self.devices)
            })
            .min_by_key(|(_, o)| o.started_ns)
            .map(|(slot, o)| Ref::new(slot, o.id))
    }

    /// Answered or dropped and quiet since (upstream journeys too), timed
    /// out and quiet, or past the timeout and settling time whatever comes.
    /// A tick may ask every open journey, most of them too recent: the
    /// cheap tests go first.
    fn finished(&self, o: &Open, now: u64) -> bool {
        let age = now.saturating_sub(o.started_ns);
        if age >= self.limits.timeout_ns + self.limits.settle_ns {
            return true;
        }
        if now.saturating_sub(o.last_ns()) < self.limits.settle_ns {
            return false;
        }
        age >= self.limits.timeout_ns
            || (o.delivered_or_dropped()
                && o.children
                    .iter()
                    .all(|&c| self.open.at(c).is_none_or(|c| self.finished(c, now))))
    }

    fn close(&mut self, r: Ref, now_ns: u64) -> Option<Journey> {
        let mut o = self.open.remove(r)?;
        self.forget(r.slot, &o);
        let upstream = std::mem::take(&mut o.children)
            .into_vec()
            .into_iter()
            .filter_map(|c| self.close(c, now_ns))
            .collect();
        if self.overlaps_loss(o.started_ns, now_ns) {
            o.incomplete = Some(Gap::Lost);
        }
        let label = (!o.has(TCP)).then_some(o.label);
        let Some(sampled) = self.sampling.kept(label, o.first_ns(), now_ns) else {
            self.shed += 1;
            return None;
        };
        let mut j = o.finish(upstream, &self.devices);
        j.sampled = sampled;
        if j.tcp {
            j.connection = self.connections.get(j.client).cloned().map(Box::new);
        }
        Some(j)
    }

    fn forget(&mut self, slot: Slot, o: &Open) {
        let q = o.question();
        self.by_key.unfile(&q, slot);
        for &client in o.aliases() {
            self.by_key.unfile(&Question { client, ..q }, slot);
        }
        if o.has(TCP) {
            self.tcp_by_name.remove(&o.name, slot);
        }
        self.by_client
            .remove(&short(self.hasher.hash_one(o.client())), slot);
        let name = self.hasher.hash_one(&o.name);
        for pl in o.places(&self.devices).into_iter().flatten() {
            self.waiting
                .remove(&place_key(&self.hasher, name, pl), slot);
        }
    }

    /// The id of the device `p` was seen at, filed if new. A full table
    /// keeps only what open legs use; should they use all 65,536 ids, every
    /// open journey is evicted (counted) rather than a leg misnamed.
    fn device(&mut self, p: &Packet) -> u16 {
        if let Some(id) = self.devices.find(p) {
            return id;
        }
        if self.devices.full() {
            self.compact_devices();
        }
        if self.devices.list.len() > usize::from(u16::MAX) {
            while !self.order.is_empty() {
                self.evict_oldest();
            }
            self.compact_devices();
        }
        self.devices.add(p)
    }

    fn compact_devices(&mut self) {
        let mut used = vec![false; self.devices.list.len()];
        for (_, o) in self.open.iter() {
            for l in &o.legs {
                used[usize::from(l.dev)] = true;
            }
        }
        let new_id = self.devices.compact(&used);
        for l in self.open.values_mut().flat_map(|o| &mut o.legs) {
            l.dev = new_id[usize::from(l.dev)];
        }
    }

    fn evict_oldest(&mut self) {
        while let Some(r) = self.order.pop_front() {
            if let Some(o) = self.open.remove(r) {
                self.forget(r.slot, &o);
                self.evicted += 1;
                return;
            }
        }
    }
}

/// Where a truncated answer's lookup is filed for the client's TCP retry.
fn retry_key(hasher: &RandomState, client: IpAddr, name: &str, qtype: u16) -> u64 {
    hasher.hash_one((client, name, qtype))
}

/// Where a journey waits for `name` (hashed) at `place`, in
/// `Engine::waiting`.
fn place_key(hasher: &RandomState, name: u64, place: Place) -> u32 {
    short(hasher.hash_one((name, place)))
}

impl Devices {
    fn get(&self, id: u16) -> &Device {
        &self.list[usize::from(id)]
    }

    /// The id of the device `p` was seen at, if it is known.
    fn find(&self, p: &Packet) -> Option<u16> {
        let id = *self.ids.get(&(p.netns, p.ifindex))?;
        (self.get(id).name.as_deref() == p.ifname.as_deref()).then_some(id)
    }

    fn full(&self) -> bool {
        self.list.len() >= self.limit
    }

    /// Files the device `p` was seen at; there must be room.
    fn add(&mut self, p: &Packet) -> u16 {
        let id = u16::try_from(self.list.len()).expect("compacted before 65,536");
        self.list.push(Device {
            netns: p.netns,
            ifindex: p.ifindex,
            name: p.ifname.as_deref().map(Arc::from),
        });
        self.ids.insert((p.netns, p.ifindex), id);
        id
    }

    /// Keeps the devices `used` marks, in order; returns each old id's new
    /// one.
    fn compact(&mut self, used: &[bool]) -> Vec<u16> {
        let mut new_id = vec![0; self.list.len()];
        let mut kept = 0;
        let list = std::mem::take(&mut self.list);
        self.ids.clear();
        for (old, d) in list.into_iter().enumerate() {
            if used[old] {
                new_id[old] = kept;
                self.ids.insert((d.netns, d.ifindex), kept);
                self.list.push(d);
                kept += 1;
            }
        }
        if self.list.len() * 2 > self.limit {
            self.limit = (self.limit * 2).min(1 << 16);
        }
        new_id
    }
}

impl Open {
    /// Its latest leg's time.
    fn last_ns(&self) -> u64 {
        self.legs
            .iter()
            .map(|l| l.ts_ns)
            .fold(self.started_ns, u64::max)
    }

    fn decided_by(&self) -> Option<&OpenLeg> {
        self.legs.get(self.decided.checked_sub(1)? as usize)
    }

    /// Kernel time of the leg that decided the outcome, or 0.
    fn outcome_ns(&self) -> u64 {
        self.decided_by().map_or(0, |l| l.ts_ns)
    }

    /// The drop that decided the outcome, if a drop did.
    fn deciding_drop(&self) -> Option<(u32, u64)> {
        self.decided_by()?.marks.as_ref()?.drop
    }

    /// When it starts once closed: its earliest leg.
    fn first_ns(&self) -> u64 {
        self.legs
            .iter()
            .map(|l| l.ts_ns)
            .min()
            .unwrap_or(self.started_ns)
    }

    /// Whether `q` is this journey's question, as asked or past a SNAT.
    fn known_as(&self, q: &Question<'_>) -> bool {
        self.dns_id == q.dns_id
            && self.qtype == q.qtype
            && (self.client() == q.client || self.aliases().any(|a| *a == q.client))
            && self.name.eq_ignore_ascii_case(q.name)
    }

    fn has(&self, bit: u8) -> bool {
        self.bits & bit != 0
    }

    /// Sets `bit` if `on`; bits are never cleared.
    fn set(&mut self, bit: u8, on: bool) {
        if on {
            self.bits |= bit;
        }
    }

    fn client(&self) -> SocketAddr {
        self.client.unpack(self.has(CLIENT_V6), self.v6())
    }

    /// Its question as first asked.
    fn question(&self) -> Question<'_> {
        Question {
            client: self.client(),
            dns_id: self.dns_id,
            qtype: self.qtype,
            name: &self.name,
        }
    }

    /// Client sockets the query is also known by, past a SNAT.
    fn aliases(&self) -> impl Iterator<Item = &SocketAddr> {
        self.extra.iter().flat_map(|n| &n.aliases)
    }

    /// `a` as a leg holds it: IPv4 inline, IPv6 filed in `Extra::v6` once.
    #[inline]
    fn pack(&mut self, a: SocketAddr) -> (Addr, bool) {
        match a {
            SocketAddr::V4(a) => (Addr::v4(a), false),
            SocketAddr::V6(a) => (self.pack_v6(a), true),
        }
    }

    #[cold]
    fn pack_v6(&mut self, a: SocketAddrV6) -> Addr {
        let v6 = &mut self.extra.get_or_insert_default().v6;
        let at = v6.iter().position(|b| *b == a).unwrap_or_else(|| {
            v6.push(a);
            v6.len() - 1
        });
        Addr::v6_at(at)
    }

    fn v6(&self) -> &[SocketAddrV6] {
        self.extra.as_deref().map_or(&[], |e| &e.v6)
    }

    fn dst_ip(&self, l: &OpenLeg) -> IpAddr {
        l.dst.unpack(l.bits & V6_DST != 0, self.v6()).ip()
    }

    fn delivered_or_dropped(&self) -> bool {
        self.has(DELIVERED) || self.deciding_drop().is_some()
    }

    /// Its fate is known by `now`: answered, dropped or timed out.
    fn settled(&self, now: u64, timeout_ns: u64) -> bool {
        self.delivered_or_dropped() || now.saturating_sub(self.started_ns) >= timeout_ns
    }

    /// Where a server's query on this journey's behalf would come from
    /// (what `server_is` accepts); none once an answer was seen.
    fn places(&self, devs: &Devices) -> [Option<Place>; 2] {
        // Without an answer, every leg is the query's: the last arrived.
        let Some(arrival) = self.legs.last().filter(|_| !self.has(ANSWER_SEEN)) else {
            return [None, None];
        };
        let netns = devs.get(arrival.dev).netns;
        let other_netns = netns != 0 && netns != devs.get(self.legs[0].dev).netns;
        [
            Some(Place::Addr(self.dst_ip(arrival))),
            other_netns.then_some(Place::Netns(netns)),
        ]
    }

    /// Was `p` sent from where this journey's query was delivered: the
    /// server's namespace, or (without namespaces) the server's address?
    fn server_is(&self, p: &Packet, devs: &Devices) -> bool {
        let Some(arrival) = self.legs.iter().rev().find(|l| !l.response()) else {
            return false;
        };
        let netns = devs.get(arrival.dev).netns;
        if netns != 0 && p.netns != 0 {
            netns == p.netns && netns != devs.get(self.legs[0].dev).netns
        } else {
            self.dst_ip(arrival) == p.src.ip()
        }
    }

    /// Adds `p`, seen at device `dev`.
    fn add_leg(&mut self, p: &Packet, seen: &Sighting, dev: u16, devs: &Devices) {
        let msg = seen.msg;
        let duplicate = self.legs.iter().any(|l| {
            let d = devs.get(l.dev);
            l.ts_ns == p.ts_ns && d.ifindex == p.ifindex && d.netns == p.netns && l.hook == p.hook
        });
        if duplicate {
            return;
        }
        let marks = self.marks(p, seen.fragment.clone());
        // The latest answer or drop, in kernel time, decides: an answer the
        // kernel then dropped at the client never reached the application,
        // nor did one that came without a fragment.
        let decides =
            (p.drop.is_some() || (msg.response && !seen.cut)) && p.ts_ns >= self.outcome_ns();
        let (src, src_v6) = self.pack(p.src);
        let (dst, dst_v6) = self.pack(p.dst);
        let bit = |on: bool, b: u8| if on { b } else { 0 };
        let bits = bit(msg.response, RESPONSE) | bit(src_v6, V6_SRC) | bit(dst_v6, V6_DST);
        self.legs.push(OpenLeg {
            ts_ns: p.ts_ns,
            dev,
            marks,
            src,
            dst,
            hook: p.hook,
            bits,
        });
        if decides {
            self.decided = u32::try_from(self.legs.len()).unwrap_or(u32::MAX);
            if p.drop.is_none() {
                self.answer = Some(msg.clone());
            }
        }
        self.set(ANSWER_SEEN, msg.response);
        if msg.response && p.drop.is_none() && !seen.cut {
            self.set(DELIVERED, self.reached_client(p, devs));
        }
    }

    /// `p`'s marks, if it has any: the copy an earlier leg holds, if the same.
    fn marks(&self, p: &Packet, fragment: Option<Box<FragmentNote>>) -> Option<Arc<Marks>> {
        let ct = p.ct.as_ref();
        let marks = Marks {
            dnat: ct.and_then(Conntrack::dnat),
            snat: ct.and_then(Conntrack::snat),
            drop: p.drop.map(|d| (d.reason, d.location)),
            fragment,
        };
        if marks.dnat.is_none()
            && marks.snat.is_none()
            && marks.drop.is_none()
            && marks.fragment.is_none()
        {
            return None;
        }
        let held = self.legs.iter().rev().find_map(|l| l.marks.as_ref());
        match held {
            Some(m) if **m == marks => Some(m.clone()),
            _ => Some(Arc::new(marks)),
        }
    }

    /// The reply passed back, the other way, through the first place the
    /// query was seen: it is with the client.
    fn reached_client(&self, p: &Packet, devs: &Devices) -> bool {
        let origin = self
            .legs
            .iter()
            .filter(|l| !l.response())
            .min_by_key(|l| l.ts_ns);
        // Only device hooks have a way through; NAT and conntrack probes do not.
        let through_device = matches!(p.hook.direction(), "ingress" | "egress");
        origin.is_some_and(|o| {
            through_device
                && devs.get(o.dev).netns == p.netns
                && devs.get(o.dev).ifindex == p.ifindex
                && o.hook.direction() != p.hook.direction()
        })
    }

    fn finish(self, mut upstream: Vec<Journey>, devs: &Devices) -> Journey {
        let v6 = self.v6();
        let mut legs: Vec<Leg> = self.legs.iter().map(|l| l.closed(v6, devs)).collect();
        legs.sort_by_key(|l| l.ts_ns);
        let mut prev = legs.first().map_or(0, |l| l.ts_ns);
        for leg in &mut legs {
            leg.since_prev_ns = leg.ts_ns - prev;
            prev = leg.ts_ns;
        }
        let started_ns = legs.first().map_or(self.started_ns, |l| l.ts_ns);
        // Without conntrack: a query that went in for one address and arrived
        // at another was translated on the way.
        let dnat = legs
            .iter()
            .find_map(|l| l.dnat.clone())
            .or_else(|| self.extra.as_ref().and_then(|e| e.dnat).map(Box::new))
            .or_else(|| {
                let mut queries = legs.iter().filter(|l| !l.response).map(|l| l.dst);
                let asked = queries.next()?;
                queries
                    .find(|d| *d != asked)
                    .map(|served| Box::new((asked, served)))
            });
        upstream.sort_by_key(|u| u.started_ns);
        let outcome = self.outcome();
        let tcp = self.has(TCP);
        Journey {
            id: self.id,
            lookup: self.lookup,
            client: self.client(),
            dns_id: self.dns_id,
            name: self.name.into(),
            qtype: qtype_name(self.qtype),
            tcp,
            started_ns,
            ended_ns: legs.last().map_or(started_ns, |l| l.ts_ns),
            outcome,
            dnat,
            legs,
            upstream,
            incomplete: self.incomplete,
            sampled: SampleLevel::default(),
            connection: None,
        }
    }
}

impl Open {
    /// Dropped, answered or timed out, by the leg that decided it. An
    /// answer's text is made here, once.
    fn outcome(&self) -> Outcome {
        if let Some((reason, location)) = self.deciding_drop() {
            return Outcome::Dropped { reason, location };
        }
        match self.answer.as_ref().filter(|_| self.decided > 0) {
            Some(msg) => Outcome::Answered {
                rcode: msg.rcode.clone(),
                answers: msg
                    .answers
                    .iter()
                    .map(|a| [a.rtype, " ", &a.data].concat())
                    .collect(),
                truncated: msg.flags.tc,
            },
            None => Outcome::Timeout,
        }
    }
}

impl OpenLeg {
    fn response(&self) -> bool {
        self.bits & RESPONSE != 0
    }

    /// The leg as a journey shows it; `v6` is its journey's `Extra::v6`.
    fn closed(&self, v6: &[SocketAddrV6], devs: &Devices) -> Leg {
        let dev = devs.get(self.dev);
        Leg {
            ts_ns: self.ts_ns,
            since_prev_ns: 0,
            hook: self.hook,
            iface: dev.name.clone(),
            ifindex: dev.ifindex,
            netns: dev.netns,
            src: self.src.unpack(self.bits & V6_SRC != 0, v6),
            dst: self.dst.unpack(self.bits & V6_DST != 0, v6),
            response: self.response(),
            dnat: self.marks.as_ref().and_then(|m| m.dnat).map(Box::new),
            snat: self.marks.as_ref().and_then(|m| m.snat).map(Box::new),
            drop: self.marks.as_ref().and_then(|m| m.drop).map(Box::new),
            fragment: self.marks.as_ref().and_then(|m| m.fragment.clone()),
        }
    }
}

impl Addr {
    fn v4(s: SocketAddrV4) -> Self {
        let [a, b, c, d] = s.ip().octets();
        let [e, f] = s.port().to_be_bytes();
        Self([a, b, c, d, e, f])
    }

    fn v6_at(at: usize) -> Self {
        let [a, b, c, d] = u32::try_from(at).unwrap_or(u32::MAX).to_be_bytes();
        Self([a, b, c, d, 0, 0])
    }

    /// The address; `v6` says which kind it is, `table` is the journey's
    /// `Extra::v6`.
    fn unpack(self, v6: bool, table: &[SocketAddrV6]) -> SocketAddr {
        let [a, b, c, d, e, f] = self.0;
        if v6 {
            SocketAddr::V6(table[u32::from_be_bytes([a, b, c, d]) as usize])
        } else {
            SocketAddr::from(([a, b, c, d], u16::from_be_bytes([e, f])))
        }
    }
}

#[cfg(test)]
mod tests;
