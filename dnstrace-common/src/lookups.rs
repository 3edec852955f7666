//! Lookups counted in the kernel, for `dnstrace agent`: every UDP query a
//! client sends and how it ended, before the ring and its sampling, so
//! that the counts stay exact at any load.
//!
//! A query is followed from where a socket on this node sends it (cgroup
//! v2's egress) to where the client's socket takes its answer (cgroup
//! v2's ingress), from the address and port it was sent to (what the
//! socket accepts). The kernel counts the answered ones and the retries
//! that replace an unanswered one; user space counts those that stay
//! unanswered past the timeout. A query that arrived on a device (another
//! node's, whose agent counts it) and the later hops of one sent here go
//! through no socket's egress, and are never counted.

/// A query waiting for its answer: the client's socket and the DNS id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PendingKey {
    /// Addresses in words, IPv4 in the first.
    pub client: [u32; 4],
    pub port: u16,
    pub id: u16,
}

/// What the answer must match, and what the count will say.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    pub start_ns: u64,
    pub server: [u32; 4],
    pub server_port: u16,
    pub qtype: u16,
    pub ip_version: u8,
    /// The kernel dropped the query somewhere on its way.
    pub dropped: u8,
    pub _pad: [u8; 2],
}

impl Pending {
    /// How this query ended if no answer took it: `OUTCOME_DROPPED` if the
    /// kernel dropped it on its way, else `OUTCOME_TIMEOUT`.
    #[inline(always)]
    pub fn unanswered(&self) -> u8 {
        if self.dropped != 0 {
            OUTCOME_DROPPED
        } else {
            OUTCOME_TIMEOUT
        }
    }
}

/// Pending queries, each in the slot its key hashes to (`slot_of`); one
/// whose slot is taken goes to a hash map instead. A slot is claimed and
/// freed by compare-and-swap on its state, without a lock: the query's CPU
/// writes it, and the answer's CPU, or user space's sweep for timeouts,
/// takes it, each once.
pub const SLOTS: u32 = 32768;

/// A slot of the pending queries: `state` counts its uses (`SLOT_*` in its
/// low two bits), so that a slot freed and claimed again between a reader's
/// look and its swap fails that swap.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingSlot {
    pub state: u64,
    pub key: PendingKey,
    /// Queries of this slot waiting in the hash map: where none do, an
    /// answer the slot does not hold needs no look there.
    pub spilled: u32,
    pub pending: Pending,
}

pub const SLOT_FREE: u64 = 0;
/// Claimed by a query's CPU, its fields not yet all written.
pub const SLOT_WRITING: u64 = 1;
pub const SLOT_BUSY: u64 = 2;
const SLOT_STATUS: u64 = 3;

/// What a slot's state says of it.
#[inline(always)]
pub const fn slot_status(state: u64) -> u64 {
    state & SLOT_STATUS
}

/// The state of a busy slot, taken: free, one use on.
#[inline(always)]
pub const fn slot_taken(busy: u64) -> u64 {
    (busy & !SLOT_STATUS) + 4
}

/// The slot of a pending query: its port and DNS id are as good as random,
/// and the address's words are folded in.
#[inline(always)]
pub const fn slot_of(key: &PendingKey) -> u32 {
    let c = key.client;
    let h = c[0] ^ c[1] ^ c[2] ^ c[3] ^ ((key.port as u32) << 16 | key.id as u32);
    h.wrapping_mul(0x9e37_79b1) >> (32 - SLOTS.trailing_zeros())
}

/// How a counted lookup ended: its rcode (0 to 15) when answered.
pub const OUTCOME_TIMEOUT: u8 = 16;
pub const OUTCOME_DROPPED: u8 = 17;

/// What lookups are counted by.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LookupKey {
    pub client: [u32; 4],
    pub server: [u32; 4],
    pub server_port: u16,
    pub qtype: u16,
    /// An rcode, or `OUTCOME_*`.
    pub outcome: u8,
    pub ip_version: u8,
    pub _pad: [u8; 2],
}

impl LookupKey {
    /// What the query `key`, pending as `p`, counts as, ended `outcome`.
    #[inline(always)]
    pub fn of(key: &PendingKey, p: &Pending, outcome: u8) -> Self {
        Self {
            client: key.client,
            server: p.server,
            server_port: p.server_port,
            qtype: p.qtype,
            outcome,
            ip_version: p.ip_version,
            _pad: [0; 2],
        }
    }
}

/// The `dns.lookup.duration` bucket boundaries (OpenTelemetry), in ns.
pub const BOUNDS_NS: [u64; 14] = [
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    75_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    750_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    7_500_000_000,
    10_000_000_000,
];

/// Lookups of one key, on one CPU, since the agent started; the answered
/// ones by latency (`buckets`, not cumulative; past the last bound in none).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LookupCount {
    pub count: u64,
    pub answered: u64,
    pub sum_ns: u64,
    pub buckets: [u64; BOUNDS_NS.len()],
}

/// The bucket of a latency of `ns`: none past the last bound.
#[inline(always)]
pub fn bucket(ns: u64) -> Option<usize> {
    let mut i = 0;
    while i < BOUNDS_NS.len() {
        if ns <= BOUNDS_NS[i] {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// Indexes of the counting's own per-CPU counters (`LOOKUP_STATS`).
/// Queries not followed: the table of pending queries was full.
pub const STAT_PENDING_FULL: u32 = 0;
/// Lookups not counted: the table of counts was full.
pub const STAT_COUNTS_FULL: u32 = 1;
pub const STATS: u32 = 2;

/// Where in a UDP payload the question's type is, after its name.
pub const QNAME_AT: usize = 12;
/// The bytes of a query read to find its type: the header and a name of
/// up to `QUESTION_READ - 16` bytes (longer ones count as type 0).
pub const QUESTION_READ: usize = 128;

/// The question's type, from the first `valid` bytes of a message (the
/// rest of `msg` may be anything); 0 if the name runs past them or is
/// compressed.
#[inline(always)]
pub fn question_type(msg: &[u8; QUESTION_READ], valid: usize) -> u16 {
    let mut at = QNAME_AT;
    // A label is at least 2 bytes: this many steps reach past any name read.
    let mut steps = 0;
    while steps < (QUESTION_READ - QNAME_AT) / 2 {
        let len = msg[at & (QUESTION_READ - 1)] as usize;
        if len == 0 {
            break;
        }
        if len > 63 {
            return 0;
        }
        at += len + 1;
        if at >= QUESTION_READ - 2 {
            return 0;
        }
        steps += 1;
    }
    if at + 3 > valid || at + 3 > QUESTION_READ {
        return 0;
    }
    u16::from_be_bytes([
        msg[(at + 1) & (QUESTION_READ - 1)],
        msg[(at + 2) & (QUESTION_READ - 1)],
    ])
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain integers, no padding left implicit.
    unsafe impl aya::Pod for super::PendingKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Pending {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PendingSlot {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::LookupKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::LookupCount {}
}

const _: () = assert!(core::mem::size_of::<PendingKey>() == 20);
const _: () = assert!(core::mem::size_of::<Pending>() == 32);
// One cache line: the query's CPU and the answer's each touch one, where
// the slots' mapping is page-aligned.
const _: () = assert!(core::mem::size_of::<PendingSlot>() == 64);
const _: () = assert!(SLOTS.is_power_of_two());
const _: () = assert!(core::mem::size_of::<LookupKey>() == 40);

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    fn message(name: &[u8], qtype: u16) -> ([u8; QUESTION_READ], usize) {
        let mut m = [0xaa; QUESTION_READ];
        m[..QNAME_AT].fill(0);
        m[QNAME_AT..QNAME_AT + name.len()].copy_from_slice(name);
        let at = QNAME_AT + name.len();
        m[at..at + 2].copy_from_slice(&qtype.to_be_bytes());
        (m, at + 4)
    }

    #[test]
    fn finds_the_type_after_the_name() {
        let (m, valid) = message(b"\x03www\x07example\x03com\x00", 28);
        assert_eq!(question_type(&m, valid), 28);
        let (m, valid) = message(b"\x00", 1);
        assert_eq!(question_type(&m, valid), 1);
    }

    #[test]
    fn a_name_past_what_was_read_or_cut_short_is_type_0() {
        let label = [&[40u8][..], &[b'a'; 40][..]].concat();
        let long = label.repeat(3);
        let (m, _) = message(&long[..100], 1);
        assert_eq!(question_type(&m, QUESTION_READ), 0);
        let (m, valid) = message(b"\x03www\x00", 1);
        assert_eq!(question_type(&m, valid - 3), 0);
        let (m, valid) = message(b"\xc0\x0c", 1);
        assert_eq!(question_type(&m, valid), 0);
    }

    #[test]
    fn a_slot_taken_is_free_and_a_use_on() {
        let busy = 7 * 4 + SLOT_BUSY;
        assert_eq!(slot_status(busy), SLOT_BUSY);
        assert_eq!(slot_status(slot_taken(busy)), SLOT_FREE);
        assert_eq!(slot_taken(busy), 8 * 4);
        // A slot claimed again is not the one a reader saw busy.
        assert_ne!(slot_taken(busy) + SLOT_BUSY, busy);
    }

    #[test]
    fn queries_of_one_client_spread_over_the_slots() {
        let mut used = std::collections::HashSet::new();
        for port in 40000..40064u16 {
            for id in [1u16, 0x8000, 0xffff] {
                let key = PendingKey {
                    client: [0x0b00_f40a, 0, 0, 0],
                    port,
                    id,
                };
                assert!(slot_of(&key) < SLOTS);
                used.insert(slot_of(&key));
            }
        }
        assert!(
            used.len() > 180,
            "{} of 192 keys in distinct slots",
            used.len()
        );
    }

    #[test]
    fn latency_lands_in_its_bucket() {
        assert_eq!(bucket(0), Some(0));
        assert_eq!(bucket(5_000_000), Some(0));
        assert_eq!(bucket(5_000_001), Some(1));
        assert_eq!(bucket(10_000_000_000), Some(13));
        assert_eq!(bucket(10_000_000_001), None);
    }
}
