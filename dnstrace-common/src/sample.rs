//! Sampling whole lookups under overload. The kernel keeps a DNS packet
//! over UDP only if its lookup passes the level user space set, and user
//! space decides the same from the same bytes, so that it knows which
//! journeys the kernel kept whole.
//!
//! A lookup is known by a hash of its question's first label, case
//! folded: the tries of a search list (`api.default.svc.cluster.local.`, `api.`), a
//! lookup's A and AAAA, its retries, and the queries a resolver sends
//! upstream for it all start with the same label, so they are kept or
//! left out together. DNS over TCP is never left out: it is rare, and its
//! segments need not start a message.

/// Where the question's name starts in a DNS message.
pub const QNAME_AT: usize = 12;
/// The longest label (RFC 1035); a longer length byte is a pointer or
/// an extension, hashed as an empty label.
const MAX_LABEL: usize = 63;
/// The strictest level: 1 lookup in 2^10 kept.
pub const MAX_SHIFT: u32 = 10;

/// What the kernel keeps: lookups whose label hash, mixed with the seed,
/// has its low `shift` bits 0. The seed, drawn at start, changes which
/// names a level leaves out from one run to the next.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleLevel {
    pub shift: u32,
    pub seed: u32,
}

impl SampleLevel {
    /// Nothing followed: the device hooks return before they read a packet
    /// (`dnstrace agent` between its windows of following, while the
    /// kernel counts lookups at the sockets).
    pub const PAUSED: Self = Self {
        shift: u32::MAX,
        seed: 0,
    };

    #[inline(always)]
    pub const fn paused(self) -> bool {
        self.shift > MAX_SHIFT
    }

    /// 1 in `one_in()` lookups kept (none while paused: 0).
    pub const fn one_in(self) -> u32 {
        if self.paused() {
            return 0;
        }
        1 << self.shift
    }

    /// Whether a lookup whose first label hashes to `label` is kept.
    #[inline(always)]
    pub const fn keeps(self, label: u32) -> bool {
        match self.shift {
            0 => true,
            s if s > MAX_SHIFT => false,
            s => mix(label ^ self.seed) & ((1 << s) - 1) == 0,
        }
    }
}

/// murmur3's finalizer: every bit of the label's hash and the seed moves
/// the low bits a level keeps by.
#[inline(always)]
const fn mix(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// Indexes of the kernel's per-CPU event counters.
pub const COUNT_LOST: u32 = 0;
/// Packets left out by the sampling level.
pub const COUNT_SHED: u32 = 1;
/// TCP payloads in an skb's pages that could not be sent apart (the perf
/// buffer was full): their events go with the bytes the linear data holds.
pub const COUNT_APART_LOST: u32 = 2;
/// Lookups the kernel started to follow (`lookups`, when it counts them).
pub const COUNT_STARTED: u32 = 3;
/// Of those, the ones the sampling level keeps: followed whole.
pub const COUNT_FOLLOWED: u32 = 4;
/// Laps of a query going round one place (a forwarding loop) not sent:
/// the 1st, 2nd, 4th, 8th... are.
pub const COUNT_LAPS: u32 = 5;
pub const COUNTERS: u32 = 6;

/// Bytes of the first label that are hashed, with its length: enough to
/// tell names apart, and read as two words with no loop for the verifier
/// to walk in every program.
const HASHED: usize = 16;
/// What `label_hash` reads: from the name on, its length byte and the
/// first `HASHED` bytes of its first label.
pub const HEAD: usize = 1 + HASHED;

/// The hash of the first label of a DNS message's question (its first
/// 16 bytes, case folded, and its length), from the message's bytes from
/// the name on, of which `valid` were captured (the rest may be anything).
#[inline(always)]
pub fn label_hash(head: &[u8; HEAD], valid: usize) -> u32 {
    let len = match head[0] as usize {
        l if valid > 0 && l <= MAX_LABEL => l,
        _ => 0,
    };
    let n = min(min(len, HASHED), valid.saturating_sub(1));
    let word = |at: usize| {
        u64::from_le_bytes([
            head[at],
            head[at + 1],
            head[at + 2],
            head[at + 3],
            head[at + 4],
            head[at + 5],
            head[at + 6],
            head[at + 7],
        ])
    };
    let w0 = lowercase(word(1) & low_bytes(n));
    let w1 = lowercase(word(9) & low_bytes(n.saturating_sub(8)));
    let mut h = w0 ^ (len as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 32)).wrapping_mul(0xd6e8_feb8_6659_fd93);
    h ^= w1;
    h = (h ^ (h >> 32)).wrapping_mul(0xd6e8_feb8_6659_fd93);
    (h ^ (h >> 32)) as u32
}

/// `label_hash` of a message as captured.
pub fn message_label_hash(message: &[u8]) -> u32 {
    let from_name = message.get(QNAME_AT..).unwrap_or_default();
    let valid = min(from_name.len(), HEAD);
    let mut head = [0; HEAD];
    head[..valid].copy_from_slice(&from_name[..valid]);
    label_hash(&head, valid)
}

const fn min(a: usize, b: usize) -> usize {
    if a < b {
        a
    } else {
        b
    }
}

/// A mask of the low `n` bytes of a word (all of them from 8 on).
#[inline(always)]
const fn low_bytes(n: usize) -> u64 {
    if n >= 8 {
        u64::MAX
    } else {
        (1 << (8 * n)) - 1
    }
}

/// Each ASCII capital in the word's bytes made small, eight at a time: a
/// byte's high bit, added to, says whether it is at least 'A', and at
/// least '[' (one past 'Z'); bytes with their own high bit set stay.
#[inline(always)]
const fn lowercase(w: u64) -> u64 {
    const EACH: u64 = 0x0101_0101_0101_0101;
    let low7 = w & (0x7f * EACH);
    let from_a = low7 + (0x80 - b'A' as u64) * EACH;
    let past_z = low7 + (0x80 - b'[' as u64) * EACH;
    let capital = (from_a ^ past_z) & !w & (0x80 * EACH);
    w | (capital >> 2)
}

#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` u32 fields.
unsafe impl aya::Pod for SampleLevel {}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    /// A query's bytes: a header, then `labels` as a name.
    fn query(labels: &[&str]) -> Vec<u8> {
        let mut m = std::vec![0u8; QNAME_AT];
        for l in labels {
            m.push(l.len() as u8);
            m.extend_from_slice(l.as_bytes());
        }
        m.push(0);
        m.extend_from_slice(&[0, 1, 0, 1]);
        m
    }

    fn hash(m: &[u8]) -> u32 {
        message_label_hash(m)
    }

    #[test]
    fn a_lookups_tries_share_its_hash_whatever_the_case() {
        let h = hash(&query(&["api", "default", "svc", "cluster", "local"]));
        assert_eq!(h, hash(&query(&["api"])));
        assert_eq!(h, hash(&query(&["API", "corp", "example", "com"])));
        assert_ne!(h, hash(&query(&["www", "default"])));
    }

    #[test]
    fn cut_long_and_odd_names_have_a_hash() {
        let m = query(&["kubernetes", "default"]);
        // Cut inside the label: the bytes captured, and its length.
        assert_eq!(hash(&m[..16]), hash(&query(&["kubXXXXXXX"])[..16]));
        assert_ne!(hash(&m[..16]), hash(&query(&["kub"])[..16]));
        // Past 16 bytes, only the length tells labels apart.
        let long = |tail: &str| hash(&query(&[&std::format!("abcdefghijklmnop{tail}")]));
        assert_eq!(long("qr"), long("xy"));
        assert_ne!(long("qr"), long("q"));
        assert_ne!(hash(&query(&["abcdefghijklmnoq"])), long(""));
        let mut pointer = m.clone();
        pointer[QNAME_AT] = 0xc0;
        assert_eq!(hash(&pointer), hash(&query(&[])));
        assert_eq!(hash(&[]), hash(&query(&[])));
        assert_eq!(hash(&m[..QNAME_AT]), hash(&query(&[])));
    }

    /// What the capture did not hold is never hashed: the kernel's buffer
    /// holds the bytes of earlier packets there.
    #[test]
    fn bytes_past_the_capture_do_not_count() {
        let m = query(&["kubernetes"]);
        let mut head = [0xee; HEAD];
        head[..5].copy_from_slice(&m[QNAME_AT..QNAME_AT + 5]);
        assert_eq!(label_hash(&head, 5), hash(&m[..QNAME_AT + 5]));
    }

    #[test]
    fn lowercase_folds_ascii_capitals_only() {
        for b in 0..=255u8 {
            for at in 0..8 {
                let w = u64::from(b) << (8 * at) | 0x4141_4141_4141_4141 & !(0xff << (8 * at));
                let want = u64::from(b.to_ascii_lowercase()) << (8 * at)
                    | 0x6161_6161_6161_6161 & !(0xff << (8 * at));
                assert_eq!(lowercase(w), want, "byte {b:#x} at {at}");
            }
        }
    }

    /// The seed changes which names a level keeps.
    #[test]
    fn seeds_keep_different_names() {
        let hashes: Vec<u32> = (0..64u32)
            .map(|n| hash(&query(&[&std::format!("host{n}")])))
            .collect();
        let kept = |seed| {
            let level = SampleLevel { shift: 1, seed };
            hashes.iter().map(|&h| level.keeps(h)).collect::<Vec<_>>()
        };
        assert_ne!(kept(1), kept(2));
    }

    /// Levels nest: what a stricter level keeps, every laxer one keeps,
    /// and each keeps about its share.
    #[test]
    fn levels_nest_and_keep_their_share() {
        let keys: Vec<u32> = (0..20_000u32)
            .map(|n| hash(&query(&[&std::format!("host{n}")])))
            .collect();
        for shift in 1..=4 {
            let strict = SampleLevel { shift, seed: 99 };
            let lax = SampleLevel {
                shift: shift - 1,
                seed: 99,
            };
            assert!(keys.iter().all(|&k| !strict.keeps(k) || lax.keeps(k)));
            let kept = keys.iter().filter(|&&k| strict.keeps(k)).count();
            let want = keys.len() / strict.one_in() as usize;
            assert!(
                kept.abs_diff(want) < want / 10,
                "{kept} kept at 1 in {}",
                strict.one_in()
            );
        }
        assert!(keys.iter().all(|&k| SampleLevel::default().keeps(k)));
    }
}
