//! Lookups counted where they happen, for `dnstrace agent` (see
//! `dnstrace_common::lookups`): each UDP query from where its socket sends
//! it (cgroup egress) to where its socket takes the answer (cgroup
//! ingress), counted before the ring and its sampling, and whether the
//! device hooks run or not. A pending query waits in its slot, or in a
//! hash map where another holds the slot. Off unless user space sets
//! `COUNT_LOOKUPS`.
use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap},
};
use dnstrace_common::{
    lookups::{
        bucket, question_type, slot_of, slot_status, slot_taken, LookupCount, LookupKey, Pending,
        PendingKey, PendingSlot, BOUNDS_NS, QUESTION_READ, SLOTS, SLOT_BUSY, SLOT_FREE,
        SLOT_WRITING, STATS, STAT_COUNTS_FULL, STAT_PENDING_FULL,
    },
    COUNT_STARTED,
};

use crate::{
    atomic,
    maps::{self, is_dns_port},
    parse::Datagram,
};

/// Set by user space before loading: 1 to count lookups.
#[unsafe(no_mangle)]
static COUNT_LOOKUPS: u32 = 0;

/// Pending queries by slot (`dnstrace_common::lookups::SLOTS`): a claim
/// or a take is one compare-and-swap on a line the other CPU just wrote,
/// where the hash map's insert and delete each take a bucket lock and
/// move an element between CPUs' free lists. User space maps it to sweep
/// for timeouts.
#[map]
static PENDING_SLOTS: Array<PendingSlot> = Array::with_max_entries(SLOTS, BPF_F_MMAPABLE);

/// Pending queries whose slot another query holds.
#[map]
static PENDING: HashMap<PendingKey, Pending> = HashMap::with_max_entries(32768, 0);

#[map]
static LOOKUPS: PerCpuHashMap<LookupKey, LookupCount> =
    PerCpuHashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// A new key's first value, from global data: too large for the stack.
static ZERO: LookupCount = LookupCount {
    count: 0,
    answered: 0,
    sum_ns: 0,
    buckets: [0; BOUNDS_NS.len()],
};

#[map]
static LOOKUP_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STATS, 0);

/// An answer as the pending query it may end must match it.
struct Answer {
    key: PendingKey,
    server: [u32; 4],
    server_port: u16,
    rcode: u8,
}

impl Answer {
    /// Whether it ends `pending`: it came from where the query went.
    #[inline(always)]
    fn ends(&self, pending: &Pending) -> bool {
        pending.server == self.server && pending.server_port == self.server_port
    }
}

/// Whether a datagram a socket sends is a query (to a DNS port).
#[inline(always)]
pub fn is_query(d: &Datagram) -> bool {
    d.head[2] & 0x80 == 0 && is_dns_port(d.dport)
}

/// A query's socket and where it sent it.
pub struct Ends {
    pub client: [u32; 4],
    pub port: u16,
    pub server: [u32; 4],
    pub server_port: u16,
}

/// A query (`is_query`) as its socket sends it.
pub struct Query<'a> {
    pub datagram: &'a Datagram,
    /// Its ends as the socket sent it (see `sock::sent_as`): where its
    /// answer will come to and from.
    pub ends: Ends,
    /// The message's first bytes, of which `valid` are the message's.
    pub message: &'a [u8; QUESTION_READ],
    pub valid: u32,
}

#[inline(always)]
pub fn enabled() -> bool {
    // SAFETY: a global user space patches before load (see `maps::offsets`).
    unsafe { core::ptr::read_volatile(&COUNT_LOOKUPS) != 0 }
}

/// A query a socket sends is pending; the same query sent again (the
/// same socket and DNS id) is a retry, and the one before it ended
/// unanswered. True where it started a lookup. In its slot if it can,
/// else in the hash map, inserted first: a retry is rare, and a look
/// before every insert would double the map's work.
#[inline(always)]
pub fn query_made(q: &Query) -> bool {
    let d = q.datagram;
    let key = PendingKey {
        client: q.ends.client,
        port: q.ends.port,
        id: u16::from_be_bytes([d.head[0], d.head[1]]),
    };
    let pending = Pending {
        // SAFETY: plain helper call.
        start_ns: unsafe { bpf_ktime_get_ns() },
        server: q.ends.server,
        server_port: q.ends.server_port,
        qtype: question_type(q.message, q.valid as usize),
        ip_version: d.ip_version,
        dropped: 0,
        _pad: [0; 2],
    };
    let Some(slot) = Slot::of(&key) else {
        return false;
    };
    match slot.claim(&key, &pending) {
        Claim::Started => true,
        Claim::Taken => spilled(&slot, &key, &pending),
    }
}

/// `query_made` for a query whose slot another holds: in the hash map,
/// counted in the slot's `spilled`.
#[inline(always)]
fn spilled(slot: &Slot, key: &PendingKey, pending: &Pending) -> bool {
    match insert(key, pending) {
        Inserted::New => {
            slot.spill(1);
            return true;
        }
        Inserted::Full => return false,
        Inserted::Exists => {}
    }
    // SAFETY: map lookup; the value is copied out.
    let Some(before) = unsafe { PENDING.get(key) }.copied() else {
        return false;
    };
    if PENDING.remove(key).is_ok() {
        slot.spill(u32::MAX);
        count(&LookupKey::of(key, &before, before.unanswered()), None);
    }
    let started = insert(key, pending) == Inserted::New;
    if started {
        slot.spill(1);
    }
    started
}

/// What a query did with its slot.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// It holds it: a lookup started.
    Started,
    /// Another query holds it: the hash map's turn.
    Taken,
}

/// A pending query's slot; its state read once, with `atomic::load`.
struct Slot {
    at: *mut PendingSlot,
    state: u64,
}

impl Slot {
    #[inline(always)]
    fn of(key: &PendingKey) -> Option<Self> {
        let at = PENDING_SLOTS.get_ptr_mut(slot_of(key))?;
        // SAFETY: a map value, 8-aligned; its state is only used atomically.
        let state = unsafe { atomic::load(&raw mut (*at).state) };
        Some(Self { at, state })
    }

    /// The query pending here, if it is `key`'s.
    #[inline(always)]
    fn holding(&self, key: &PendingKey) -> Option<Pending> {
        if slot_status(self.state) != SLOT_BUSY {
            return None;
        }
        // SAFETY: a map value, read after the state (`atomic::load` orders
        // it, for the compiler too). A query that takes the slot meanwhile
        // fails the swap that uses what was read.
        let slot = unsafe { &*self.at };
        (slot.key == *key).then_some(slot.pending)
    }

    /// Whether any query of this slot waits in the hash map.
    #[inline(always)]
    fn has_spilled(&self) -> bool {
        // SAFETY: a map value. The count went up before its query left,
        // so before its answer came or its drop.
        unsafe { (*self.at).spilled != 0 }
    }

    /// Adds `n` to the queries of this slot in the hash map.
    #[inline(always)]
    fn spill(&self, n: u32) {
        // SAFETY: a map value, 4-aligned; only ever added to, atomically.
        unsafe { atomic::add(&raw mut (*self.at).spilled, n) };
    }

    /// Moves the state from what was read to `new`; whether it did.
    #[inline(always)]
    fn swap(&self, new: u64) -> bool {
        // SAFETY: as in `of`.
        unsafe { atomic::swap_if(&raw mut (*self.at).state, self.state, new) }
    }

    /// Claims the slot for `key`'s query: if it is free, or holds the
    /// same query (a retry: the one before is counted unanswered).
    #[inline(always)]
    fn claim(&self, key: &PendingKey, pending: &Pending) -> Claim {
        if let Some(before) = self.holding(key) {
            let free = slot_taken(self.state);
            if !self.swap(free + SLOT_WRITING) {
                return Claim::Taken;
            }
            count(&LookupKey::of(key, &before, before.unanswered()), None);
            return self.fill(free, key, pending);
        }
        if slot_status(self.state) != SLOT_FREE || !self.swap(self.state + SLOT_WRITING) {
            return Claim::Taken;
        }
        self.fill(self.state, key, pending)
    }

    /// Writes the query into the slot this CPU claimed, free at `free`,
    /// then makes it busy.
    #[inline(always)]
    fn fill(&self, free: u64, key: &PendingKey, pending: &Pending) -> Claim {
        // SAFETY: this CPU's claim: no one else writes the slot until it
        // is busy, and readers skip it until then; `publish` orders the
        // stores before it.
        unsafe {
            (*self.at).key = *key;
            (*self.at).pending = *pending;
            atomic::publish(&raw mut (*self.at).state, free + SLOT_BUSY);
        }
        maps::count(COUNT_STARTED);
        Claim::Started
    }
}

/// What inserting a pending query did.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Inserted {
    New,
    /// The same query is pending: a retry, or another CPU sent it first.
    Exists,
    Full,
}

#[inline(always)]
fn insert(key: &PendingKey, pending: &Pending) -> Inserted {
    match PENDING.insert(key, pending, u64::from(BPF_NOEXIST)) {
        Ok(()) => {
            maps::count(COUNT_STARTED);
            Inserted::New
        }
        Err(-17) => Inserted::Exists,
        Err(_) => {
            stat(STAT_PENDING_FULL);
            Inserted::Full
        }
    }
}

/// A query the kernel dropped (`kfree_skb`), from `client` to `dport`,
/// whose DNS header starts with `head`: its lookup, if pending, ends
/// dropped unless an answer comes.
#[inline(always)]
pub fn dropped(client: ([u32; 4], u16), dport: u16, head: &[u8; 32]) {
    if head[2] & 0x80 != 0 || !is_dns_port(dport) {
        return;
    }
    let key = PendingKey {
        client: client.0,
        port: client.1,
        id: u16::from_be_bytes([head[0], head[1]]),
    };
    let Some(slot) = Slot::of(&key) else {
        return;
    };
    if slot.holding(&key).is_some() {
        // SAFETY: a map value; a byte store races with nothing that
        // matters (at worst it marks the next use of the slot).
        unsafe { core::ptr::write_volatile(&raw mut (*slot.at).pending.dropped, 1) };
        return;
    }
    if !slot.has_spilled() {
        return;
    }
    if let Some(pending) = PENDING.get_ptr_mut(key) {
        // SAFETY: a map value; a byte store races with nothing that matters.
        unsafe { (*pending).dropped = 1 };
    }
}

/// A UDP datagram a socket is about to take: counted if it answers a
/// pending query, from where the query went (what the socket accepts),
/// once. At the socket, whatever devices it came through (a VLAN's, a
/// bond's, a macvlan's lower device in another namespace) and whatever
/// hooks follow: the lookup as its client saw it end.
#[inline(always)]
pub fn answer_taken(d: &Datagram) {
    if d.head[2] & 0x80 == 0 || !is_dns_port(d.sport) {
        return;
    }
    let a = Answer {
        key: PendingKey {
            client: d.daddr,
            port: d.dport,
            id: u16::from_be_bytes([d.head[0], d.head[1]]),
        },
        server: d.saddr,
        server_port: d.sport,
        rcode: d.head[3] & 0x0f,
    };
    let Some(slot) = Slot::of(&a.key) else {
        return;
    };
    if let Some(pending) = slot.holding(&a.key) {
        if a.ends(&pending) && slot.swap(slot_taken(slot.state)) {
            counted(&a, &pending);
        }
        return;
    }
    if !slot.has_spilled() {
        return;
    }
    // SAFETY: map lookup; the value is copied out.
    let Some(pending) = (unsafe { PENDING.get(a.key) }).copied() else {
        return;
    };
    if a.ends(&pending) && PENDING.remove(a.key).is_ok() {
        slot.spill(u32::MAX);
        counted(&a, &pending);
    }
}

/// Counts the answer `a` to `pending`, taken out of where it waited.
#[inline(always)]
fn counted(a: &Answer, pending: &Pending) {
    // SAFETY: plain helper call.
    let took = unsafe { bpf_ktime_get_ns() }.saturating_sub(pending.start_ns);
    count(&LookupKey::of(&a.key, pending, a.rcode), Some(took));
}

#[inline(always)]
fn count(key: &LookupKey, took: Option<u64>) {
    let c = match LOOKUPS.get_ptr_mut(key) {
        Some(c) => c,
        None => {
            // EEXIST if another CPU's program just made it: taken below.
            // By reference: by value would copy it to the stack.
            #[allow(clippy::needless_borrows_for_generic_args)]
            let _ = LOOKUPS.insert(key, &ZERO, u64::from(BPF_NOEXIST));
            let Some(c) = LOOKUPS.get_ptr_mut(key) else {
                stat(STAT_COUNTS_FULL);
                return;
            };
            c
        }
    };
    // SAFETY: this CPU's value, 8-aligned, added to atomically: a socket's
    // egress runs in process context, where an interrupt's run on this
    // CPU, or another task's, can come between a load and its store.
    unsafe { add(c, took) };
}

/// # Safety
/// `c` is a map value, 8-aligned.
#[inline(always)]
unsafe fn add(c: *mut LookupCount, took: Option<u64>) {
    atomic::add64(&raw mut (*c).count, 1);
    let Some(ns) = took else { return };
    atomic::add64(&raw mut (*c).answered, 1);
    atomic::add64(&raw mut (*c).sum_ns, ns);
    if let Some(i) = bucket(ns).filter(|i| *i < BOUNDS_NS.len()) {
        atomic::add64(&raw mut (*c).buckets[i], 1);
    }
}

#[inline(always)]
fn stat(index: u32) {
    if let Some(n) = LOOKUP_STATS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, 8-aligned; atomic as in `count`.
        unsafe { atomic::add64(n, 1) };
    }
}
