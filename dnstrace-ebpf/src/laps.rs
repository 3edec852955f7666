//! A query going round: the same message (its id, addresses, ports and
//! first bytes) seen again at the same place within `LAP_NS` of the time
//! before. A forwarding loop that keeps a query's id (dnsmasq, a cache
//! asking itself) sends it round as fast as a CPU goes, a hundred
//! thousand times a second, for ever: every one sent would fill the ring
//! and push the sampling level up, and the loop would be shed with the
//! rest. The 1st, 2nd, 4th, 8th... lap at a place are sent, the others
//! counted (`COUNT_LAPS`); at the socket that sends it, the others are
//! not counted as lookups (each would be a lookup more a second than the
//! budget of those followed allows). A client's retry of the same query
//! comes a second or more later: a new first lap.
use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::map, maps::PerCpuArray};
use dnstrace_common::PacketMeta;

use crate::parse::Datagram;

/// Longer than a lap through a node's resolvers, far shorter than a
/// client's retry.
const LAP_NS: u64 = 10_000_000;
/// Messages a CPU remembers, by their hash: a loop is one message.
const SLOTS: u32 = 256;

#[derive(Clone, Copy)]
#[repr(C)]
pub struct Lap {
    key: u64,
    last_ns: u64,
    count: u64,
}

#[map]
static LAPS: PerCpuArray<Lap> = PerCpuArray::with_max_entries(SLOTS, 0);

/// A query where it is seen, as much of it as tells laps apart.
pub struct Seen<'a> {
    /// Where: the network namespace and device and the hook, or a socket.
    place: u64,
    ports: u64,
    addrs: [u64; 4],
    head: &'a [u8; 32],
    /// Bytes of `head` the packet's (the rest is an earlier packet's).
    valid: u32,
}

/// `place` of a query as a socket sends it: no device, no hook's number.
const SOCKET: u64 = u64::MAX;

impl<'a> Seen<'a> {
    /// At a device's hook: the event about to be sent.
    #[inline(always)]
    pub fn at_device(m: &PacketMeta, head: &'a [u8; 32], valid: u32) -> Self {
        Self {
            place: u64::from(m.netns) << 32 | u64::from(m.ifindex) ^ u64::from(m.hook) << 24,
            ports: u64::from(m.sport) << 16 | u64::from(m.dport),
            addrs: [
                word(&m.saddr, 0),
                word(&m.saddr, 8),
                word(&m.daddr, 0),
                word(&m.daddr, 8),
            ],
            head,
            valid,
        }
    }

    /// As a socket sends it.
    #[inline(always)]
    pub fn at_socket(d: &Datagram, head: &'a [u8; 32], valid: u32) -> Self {
        let pair = |a: &[u32; 4], i: usize| u64::from(a[i]) << 32 | u64::from(a[i + 1]);
        Self {
            place: SOCKET,
            ports: u64::from(d.sport) << 16 | u64::from(d.dport),
            addrs: [
                pair(&d.saddr, 0),
                pair(&d.saddr, 2),
                pair(&d.daddr, 0),
                pair(&d.daddr, 2),
            ],
            head,
            valid,
        }
    }

    /// FNV-1a over words, then murmur3's 64-bit finalizer (a product
    /// moves no bit down, and the slot is the low bits).
    #[inline(always)]
    fn key(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |w: u64| {
            h ^= w;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        };
        mix(self.place);
        mix(self.ports);
        for a in self.addrs {
            mix(a);
        }
        for i in 0..4 {
            if (i as u32 + 1) * 8 <= self.valid {
                mix(word(self.head, i * 8));
            }
        }
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// Whether this query is a lap not to send (or, at a socket, not to count
/// as a lookup again): the same message was here within `LAP_NS`, and
/// this lap is not a power of two.
#[inline(always)]
pub fn lapped(seen: &Seen) -> bool {
    let key = seen.key();
    let Some(lap) = LAPS.get_ptr_mut((key as u32) % SLOTS) else {
        return false;
    };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: this CPU's slot. A program interrupting another on the same
    // CPU may race it: a lap miscounted, sent or not, no more.
    let lap = unsafe { &mut *lap };
    if lap.key != key || now.wrapping_sub(lap.last_ns) > LAP_NS {
        *lap = Lap {
            key,
            last_ns: now,
            count: 1,
        };
        return false;
    }
    lap.last_ns = now;
    lap.count += 1;
    !lap.count.is_power_of_two()
}

#[inline(always)]
fn word<const N: usize>(bytes: &[u8; N], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(b) = bytes.get(at..at + 8) {
        w.copy_from_slice(b);
    }
    u64::from_ne_bytes(w)
}
