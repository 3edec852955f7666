//! The lookups the kernel counted (`dnstrace_common::lookups`), read as
//! what changed since the last read: the kernel's counts only grow, so a
//! change is a difference, named by whoever holds the address now. Queries
//! pending past the timeout are taken out here, each once (the kernel's
//! answer and this sweep race on taking it), and counted unanswered;
//! other nodes' queries are only taken out.
use std::{
    collections::HashMap as StdHashMap,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::AsFd,
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
};

use dnstrace_common::lookups::{
    slot_of, slot_status, slot_taken, LookupCount, LookupKey, Pending, PendingKey, PendingSlot,
    BOUNDS_NS, OUTCOME_DROPPED, OUTCOME_TIMEOUT, SLOTS, SLOT_BUSY, STAT_COUNTS_FULL,
    STAT_PENDING_FULL,
};

use super::mapping::Mapping;
use crate::{
    decode::{Qtype, Rcode},
    probes::LookupMaps,
};

/// How a counted lookup ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ended {
    Answered(Rcode),
    /// No answer reached the client's device before the timeout or a retry.
    Timeout,
    /// As `Timeout`, and the kernel dropped the query on its way.
    Dropped,
}

/// Lookups of one client, server, type and ending since the last read.
#[derive(Clone, Debug, PartialEq)]
pub struct Counted {
    pub client: IpAddr,
    /// Where the query was sent: what the client asked.
    pub server: SocketAddr,
    pub qtype: Qtype,
    pub ended: Ended,
    pub count: u64,
    /// The answered ones' latency: per bucket of `BOUNDS_NS` (past the
    /// last in none), their number and their sum.
    pub buckets: [u64; BOUNDS_NS.len()],
    pub answered: u64,
    pub sum_ns: u64,
}

/// The counting's own losses, since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountStats {
    /// Queries not followed: the table of pending queries was full.
    pub pending_full: u64,
    /// Lookups not counted: the table of counts was full.
    pub counts_full: u64,
}

/// A key whose counts stay the same this long is removed from the
/// kernel's table, to make room for new clients: an increment in the
/// moment between its last read and its removal would go uncounted.
const IDLE_NS: u64 = 10 * 60 * 1_000_000_000;

pub struct LookupCounter {
    maps: LookupMaps,
    slots: Slots,
    /// Each key's counts summed over CPUs at the last read, and when they
    /// last changed.
    last: StdHashMap<LookupKey, (LookupCount, u64)>,
    timeout_ns: u64,
}

impl LookupCounter {
    pub fn new(maps: LookupMaps, timeout_ns: u64) -> io::Result<Self> {
        Ok(Self {
            slots: Slots::map(&maps)?,
            maps,
            last: StdHashMap::new(),
            timeout_ns,
        })
    }

    /// What was counted since the last read, and the queries unanswered
    /// at `now_ns` (kernel monotonic time).
    pub fn read(&mut self, now_ns: u64) -> Vec<Counted> {
        let mut out = self.unanswered(now_ns);
        let mut idle = Vec::new();
        // A key that fails to read is read at the next call: the sweep's
        // counts above are already out of the kernel's table.
        for (key, per_cpu) in self.maps.counts.iter().filter_map(Result::ok) {
            let total = per_cpu.iter().fold(LookupCount::default(), sum);
            let (before, changed_ns) = self.last.get(&key).copied().unwrap_or_default();
            if total.count > before.count {
                out.push(counted(&key, &difference(&total, &before)));
                self.last.insert(key, (total, now_ns));
            } else if now_ns.saturating_sub(changed_ns) > IDLE_NS {
                idle.push(key);
            }
        }
        for key in idle {
            self.last.remove(&key);
            let _ = self.maps.counts.remove(&key);
        }
        out
    }

    pub fn stats(&self) -> CountStats {
        let stat = |i: u32| {
            self.maps
                .stats
                .get(&i, 0)
                .map_or(0, |v| v.iter().sum::<u64>())
        };
        CountStats {
            pending_full: stat(STAT_PENDING_FULL),
            counts_full: stat(STAT_COUNTS_FULL),
        }
    }

    /// Takes the queries pending past the timeout, from their slots and
    /// from the hash map; those this sweep took (not an answer just before
    /// it) count as unanswered.
    fn unanswered(&mut self, now_ns: u64) -> Vec<Counted> {
        let before = now_ns.saturating_sub(self.timeout_ns);
        let mut taken = self.slots.take_older(before);
        taken.extend(self.unanswered_in_map(before));
        taken
            .iter()
            .map(|(key, p)| {
                let one = LookupCount {
                    count: 1,
                    ..LookupCount::default()
                };
                counted(&LookupKey::of(key, p, p.unanswered()), &one)
            })
            .collect()
    }

    fn unanswered_in_map(&mut self, before: u64) -> Vec<(PendingKey, Pending)> {
        let Self { maps, slots, .. } = self;
        let stale: Vec<(PendingKey, Pending)> = maps
            .pending
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, p)| p.start_ns < before)
            .collect();
        stale
            .into_iter()
            .filter(|(key, p)| {
                // A retry may have replaced it since it was listed: that
                // one is not taken.
                let still = maps.pending.get(key, 0).ok();
                let took = still.map(|q| q.start_ns) == Some(p.start_ns)
                    && maps.pending.remove(key).is_ok();
                if took {
                    slots.unspill(key);
                }
                took
            })
            .collect()
    }
}

/// The kernel's slots of pending queries (`PENDING_SLOTS`), mapped.
struct Slots(Mapping);

impl Slots {
    fn map(maps: &LookupMaps) -> io::Result<Self> {
        let len = SLOTS as usize * size_of::<PendingSlot>();
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        Ok(Self(Mapping::new(maps.slots.fd().as_fd(), len, prot, 0)?))
    }

    fn slots(&self) -> *mut PendingSlot {
        self.0.start().cast()
    }

    /// One query of `key`'s slot fewer in the hash map, once it is out of
    /// it (never before: the kernel skips the map while the count is 0).
    fn unspill(&self, key: &PendingKey) {
        // SAFETY: the slot of `key`, inside the mapping; its count is only
        // ever changed atomically, here as in the kernel.
        let spilled = unsafe {
            let at = self.slots().add(slot_of(key) as usize);
            AtomicU32::from_ptr(&raw mut (*at).spilled)
        };
        spilled.fetch_sub(1, Ordering::AcqRel);
    }

    /// Takes each query pending since before `before_ns`, as the kernel
    /// takes one it answers: by swapping the state it read for the next.
    fn take_older(&self, before_ns: u64) -> Vec<(PendingKey, Pending)> {
        let slots = self.slots();
        (0..SLOTS as usize)
            .filter_map(|i| {
                // SAFETY: slot `i` of the mapping, 8-aligned (the mapping
                // is page-aligned, a slot 72 bytes); its state is only used
                // atomically, here as in the kernel.
                let (state, slot) = unsafe {
                    let at = slots.add(i);
                    (AtomicU64::from_ptr(&raw mut (*at).state), at)
                };
                let seen = state.load(Ordering::Acquire);
                if slot_status(seen) != SLOT_BUSY {
                    return None;
                }
                // SAFETY: as above; read after the state, and used only if
                // the state is still what was read (below).
                let (key, p) = unsafe {
                    (
                        std::ptr::read_volatile(&raw const (*slot).key),
                        std::ptr::read_volatile(&raw const (*slot).pending),
                    )
                };
                let old = p.start_ns < before_ns;
                let took = old
                    && state
                        .compare_exchange(
                            seen,
                            slot_taken(seen),
                            Ordering::AcqRel,
                            Ordering::Relaxed,
                        )
                        .is_ok();
                took.then_some((key, p))
            })
            .collect()
    }
}

fn sum(mut a: LookupCount, b: &LookupCount) -> LookupCount {
    a.count += b.count;
    a.answered += b.answered;
    a.sum_ns += b.sum_ns;
    for (x, y) in a.buckets.iter_mut().zip(b.buckets) {
        *x += y;
    }
    a
}

fn difference(now: &LookupCount, before: &LookupCount) -> LookupCount {
    let mut d = LookupCount {
        count: now.count.saturating_sub(before.count),
        answered: now.answered.saturating_sub(before.answered),
        sum_ns: now.sum_ns.saturating_sub(before.sum_ns),
        buckets: now.buckets,
    };
    for (x, y) in d.buckets.iter_mut().zip(before.buckets) {
        *x = x.saturating_sub(y);
    }
    d
}

fn counted(key: &LookupKey, c: &LookupCount) -> Counted {
    let ended = match key.outcome {
        OUTCOME_TIMEOUT => Ended::Timeout,
        OUTCOME_DROPPED => Ended::Dropped,
        rcode => Ended::Answered(Rcode(rcode.into())),
    };
    Counted {
        client: address(key.client, key.ip_version),
        server: SocketAddr::new(address(key.server, key.ip_version), key.server_port),
        qtype: Qtype(key.qtype),
        ended,
        count: c.count,
        buckets: c.buckets,
        answered: c.answered,
        sum_ns: c.sum_ns,
    }
}

/// An address as the kernel stores it: in words, IPv4 in the first.
fn address(words: [u32; 4], ip_version: u8) -> IpAddr {
    // SAFETY: 16 plain bytes either way.
    let bytes = unsafe { std::mem::transmute::<[u32; 4], [u8; 16]>(words) };
    if ip_version == 6 {
        IpAddr::V6(Ipv6Addr::from(bytes))
    } else {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(ip: IpAddr) -> [u32; 4] {
        let mut b = [0u8; 16];
        match ip {
            IpAddr::V4(v4) => b[..4].copy_from_slice(&v4.octets()),
            IpAddr::V6(v6) => b = v6.octets(),
        }
        // SAFETY: 16 plain bytes either way.
        unsafe { std::mem::transmute::<[u8; 16], [u32; 4]>(b) }
    }

    #[test]
    fn addresses_read_as_the_kernel_stores_them() {
        for ip in ["10.244.0.11", "fd00:10:244::b"] {
            let ip: IpAddr = ip.parse().unwrap();
            let v = if ip.is_ipv4() { 4 } else { 6 };
            assert_eq!(address(words(ip), v), ip);
        }
    }

    #[test]
    fn a_read_gives_what_changed_since_the_last() {
        let mut now = LookupCount {
            count: 10,
            answered: 9,
            sum_ns: 900,
            ..LookupCount::default()
        };
        now.buckets[0] = 9;
        let mut before = now;
        before.count = 4;
        before.answered = 3;
        before.sum_ns = 300;
        before.buckets[0] = 3;
        let d = difference(&now, &before);
        assert_eq!(
            (d.count, d.answered, d.sum_ns, d.buckets[0]),
            (6, 6, 600, 6)
        );
        let cpus = [now, before];
        let total = cpus.iter().fold(LookupCount::default(), sum);
        assert_eq!((total.count, total.buckets[0]), (14, 12));
    }

    #[test]
    fn an_outcome_names_how_it_ended() {
        let key = |outcome| LookupKey {
            client: words("10.244.0.11".parse().unwrap()),
            server: words("10.96.0.10".parse().unwrap()),
            server_port: 53,
            qtype: 28,
            outcome,
            ip_version: 4,
            _pad: [0; 2],
        };
        let one = LookupCount::default();
        assert_eq!(
            counted(&key(3), &one).ended,
            Ended::Answered(Rcode::NXDOMAIN)
        );
        assert_eq!(counted(&key(OUTCOME_TIMEOUT), &one).ended, Ended::Timeout);
        assert_eq!(counted(&key(OUTCOME_DROPPED), &one).ended, Ended::Dropped);
        assert_eq!(counted(&key(0), &one).qtype, Qtype::AAAA);
        assert_eq!(counted(&key(0), &one).server.to_string(), "10.96.0.10:53");
    }
}
