//! Lookups counted where they happen, for `dnstrace agent` (see
//! `dnstrace_common::lookups`): each UDP query from where a socket sends
//! it to its answer's arrival in the socket's network namespace, or at the
//! socket itself, counted before the ring and its sampling. A pending
//! query waits in its slot, or in a hash map where another holds the slot.
//! Off unless user space sets `COUNT_LOOKUPS`.
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
    Hook, COUNT_STARTED,
};

use crate::{
    atomic,
    maps::{self, is_dns_port},
    parse::{Datagram, Reader},
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
    /// The network namespace a device received it in; none where a socket
    /// takes it, which is where its query left from.
    netns: Option<u32>,
}

impl Answer {
    /// Whether it ends `pending`: it arrived where the query left from,
    /// from where the query went.
    #[inline(always)]
    fn ends(&self, pending: &Pending) -> bool {
        self.netns.is_none_or(|netns| netns == pending.netns)
            && pending.server == self.server
            && pending.server_port == self.server_port
    }

    /// The answer from `server` to `client` whose DNS header starts with
    /// `head` (id, flags, rcode).
    #[inline(always)]
    fn of(
        server: ([u32; 4], u16),
        client: ([u32; 4], u16),
        head: [u8; 4],
        netns: Option<u32>,
    ) -> Self {
        Self {
            key: PendingKey {
                client: client.0,
                port: client.1,
                id: u16::from_be_bytes([head[0], head[1]]),
            },
            server: server.0,
            server_port: server.1,
            rcode: head[3] & 0x0f,
            netns,
        }
    }
}

/// A UDP packet to or from a DNS port, as the counting needs it.
pub struct Udp<'a> {
    pub saddr: [u32; 4],
    pub daddr: [u32; 4],
    pub sport: u16,
    pub dport: u16,
    pub ip_version: u8,
    /// The DNS header and what follows, of which `valid` bytes are the
    /// message's.
    pub head: &'a [u8; 32],
    pub valid: u32,
}

impl Udp<'_> {
    /// The pending query this packet is, if it is a query with DNS id `id`.
    #[inline(always)]
    fn query_key(&self, id: u16) -> PendingKey {
        PendingKey {
            client: self.saddr,
            port: self.sport,
            id,
        }
    }

    /// This packet as an answer to a pending query, arrived in `netns`.
    #[inline(always)]
    fn answer(&self, netns: u32) -> Answer {
        let head = [self.head[0], self.head[1], self.head[2], self.head[3]];
        Answer::of(
            (self.saddr, self.sport),
            (self.daddr, self.dport),
            head,
            Some(netns),
        )
    }
}

/// The device a packet is on: its namespace's inode and its index.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Device {
    pub netns: u32,
    pub ifindex: u32,
}

impl Device {
    /// No device, or one that could not be read.
    pub const NONE: Self = Self {
        netns: 0,
        ifindex: 0,
    };
}

#[inline(always)]
pub fn enabled() -> bool {
    // SAFETY: a global user space patches before load (see `maps::offsets`).
    unsafe { core::ptr::read_volatile(&COUNT_LOOKUPS) != 0 }
}

/// How a device came to send a packet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// A socket here made it (`skb->skb_iif` 0: no device received it).
    Made,
    /// A device received it first: a later hop, or another node's.
    Forwarded,
}

/// Follows a lookup through this sighting of one of its packets: a query
/// a socket sent (first, or again), a query dropped, or the answer
/// arriving where its query left from. A query's question is read from
/// `r` at `question_at` into `buf`; `sent` and `device` are asked only
/// where they matter. True where this packet started a lookup.
#[inline(always)]
pub fn follow<R: Reader>(
    p: &Udp,
    hook: Hook,
    r: &R,
    question_at: u32,
    buf: &mut [u8; QUESTION_READ],
    sent: impl FnOnce() -> Sent,
    device: impl FnOnce() -> Device,
) -> bool {
    if p.valid < 12 {
        return false;
    }
    let id = u16::from_be_bytes([p.head[0], p.head[1]]);
    let answer = p.head[2] & 0x80 != 0;
    match (answer, hook) {
        // Only where a socket sent it: a query forwarded (DNATed to a
        // resolver here, or arriving from another node, whose agent counts
        // it) needs no look in the map.
        (false, Hook::DevXmit) if is_dns_port(p.dport) && sent() == Sent::Made => {
            return query_sent(p, id, device(), r, question_at, buf);
        }
        (false, Hook::Drop) if is_dns_port(p.dport) => query_dropped(p, id),
        (true, Hook::DevReceive) if is_dns_port(p.sport) => answered(&p.answer(device().netns)),
        _ => {}
    }
    false
}

/// A query a socket sends is pending; the same query sent again from the
/// same device is a retry, and the one before it ended unanswered. True
/// where it started one. In its slot if it can, else in the hash map,
/// inserted first: a retry is rare, and a look before every insert would
/// double the map's work.
#[inline(always)]
fn query_sent<R: Reader>(
    p: &Udp,
    id: u16,
    dev: Device,
    r: &R,
    question_at: u32,
    buf: &mut [u8; QUESTION_READ],
) -> bool {
    let key = p.query_key(id);
    let pending = pending(p, dev, r, question_at, buf);
    let Some(slot) = Slot::of(&key) else {
        return false;
    };
    match slot.claim(&key, &pending, dev) {
        Claim::Started => true,
        Claim::NotStarted => false,
        Claim::Taken => spilled(&slot, &key, &pending, dev),
    }
}

/// `query_sent` for a query whose slot another holds: in the hash map,
/// counted in the slot's `spilled`.
#[inline(always)]
fn spilled(slot: &Slot, key: &PendingKey, pending: &Pending, dev: Device) -> bool {
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
    if before.netns != dev.netns || before.ifindex != dev.ifindex {
        return false;
    }
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
    /// The same query, pending from another device: no lookup started.
    NotStarted,
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
    /// same query from the same device (a retry: the one before is
    /// counted unanswered).
    #[inline(always)]
    fn claim(&self, key: &PendingKey, pending: &Pending, dev: Device) -> Claim {
        if let Some(before) = self.holding(key) {
            if before.netns != dev.netns || before.ifindex != dev.ifindex {
                return Claim::NotStarted;
            }
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

/// A query as pending from now, its question's type read from `r`.
#[inline(always)]
fn pending<R: Reader>(
    p: &Udp,
    dev: Device,
    r: &R,
    question_at: u32,
    buf: &mut [u8; QUESTION_READ],
) -> Pending {
    let qtype = match r.copy(question_at, buf.as_mut_ptr(), QUESTION_READ as u32) {
        Ok(()) => question_type(buf, p.valid as usize),
        Err(_) => 0,
    };
    Pending {
        // SAFETY: plain helper call.
        start_ns: unsafe { bpf_ktime_get_ns() },
        server: p.daddr,
        netns: dev.netns,
        ifindex: dev.ifindex,
        server_port: p.dport,
        qtype,
        ip_version: p.ip_version,
        dropped: 0,
        _pad: [0; 2],
    }
}

#[inline(always)]
fn query_dropped(p: &Udp, id: u16) {
    let key = p.query_key(id);
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
/// pending query (one a receive tracepoint saw arrive is counted already).
#[inline(always)]
pub fn answer_taken(d: &Datagram) {
    if d.head[2] & 0x80 == 0 || !is_dns_port(d.sport) {
        return;
    }
    answered(&Answer::of(
        (d.saddr, d.sport),
        (d.daddr, d.dport),
        d.head,
        None,
    ));
}

/// An answer counts where it enters the network namespace its query left
/// from (on a forwarding hop before, it may yet be lost), or where the
/// client's socket takes it; from where the query went (what the socket
/// accepts), once. Not on the query's device: through a VLAN device, a bond
/// or a macvlan, the kernel fires the receive tracepoint on the lower
/// device only, before handing the answer up, and a macvlan's or ipvlan's
/// lower device is in another namespace: those count at the socket.
#[inline(always)]
fn answered(a: &Answer) {
    let Some(slot) = Slot::of(&a.key) else {
        return;
    };
    if let Some(pending) = slot.holding(&a.key) {
        if a.ends(&pending) && slot.swap(slot_taken(slot.state)) {
            counted(a, &pending);
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
        counted(a, &pending);
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
    // SAFETY: this CPU's value. Counting runs only on a device's send and
    // receive and a socket's ingress, all with bottom halves off: none
    // interrupts another on a CPU, and the kernel skips a nested run.
    unsafe { add(&mut *c, took) };
}

#[inline(always)]
fn add(c: &mut LookupCount, took: Option<u64>) {
    c.count += 1;
    let Some(ns) = took else { return };
    c.answered += 1;
    c.sum_ns += ns;
    if let Some(b) = bucket(ns).and_then(|i| c.buckets.get_mut(i)) {
        *b += 1;
    }
}

#[inline(always)]
fn stat(index: u32) {
    if let Some(n) = LOOKUP_STATS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer.
        unsafe { *n += 1 };
    }
}
