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
const QNAME_AT: usize = 12;
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
    /// 1 in `one_in()` lookups kept.
    pub const fn one_in(self) -> u32 {
        1 << self.shift
    }

    /// Whether a lookup whose first label hashes to `label` is kept.
    #[inline(always)]
    pub const fn keeps(self, label: u32) -> bool {
        self.shift == 0 || mix(label ^ self.seed) & ((1 << self.shift) - 1) == 0
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
pub const COUNTERS: u32 = 2;

/// The hash of the first label of a DNS message's question (FNV-1a, case
/// folded), from its bytes as captured over UDP: `byte(i)` is None past
/// the capture.
#[inline(always)]
pub fn label_hash(byte: impl Fn(usize) -> Option<u8>) -> u32 {
    let len = match byte(QNAME_AT) {
        Some(l) if (l as usize) <= MAX_LABEL => l as usize,
        _ => 0,
    };
    let mut h: u32 = 0x811c_9dc5;
    let mut i = 0;
    while i < MAX_LABEL && i < len {
        let Some(b) = byte(QNAME_AT + 1 + i) else {
            break;
        };
        h = (h ^ u32::from(b.to_ascii_lowercase())).wrapping_mul(0x0100_0193);
        i += 1;
    }
    h
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
        label_hash(|i| m.get(i).copied())
    }

    #[test]
    fn a_lookups_tries_share_its_hash_whatever_the_case() {
        let h = hash(&query(&["api", "default", "svc", "cluster", "local"]));
        assert_eq!(h, hash(&query(&["api"])));
        assert_eq!(h, hash(&query(&["API", "corp", "example", "com"])));
        assert_ne!(h, hash(&query(&["www", "default"])));
    }

    #[test]
    fn cut_and_odd_names_have_a_hash() {
        let m = query(&["kubernetes", "default"]);
        // Cut inside the label: the bytes captured are hashed.
        assert_eq!(hash(&m[..16]), hash(&query(&["kub"])[..16]));
        let mut pointer = m.clone();
        pointer[QNAME_AT] = 0xc0;
        assert_eq!(hash(&pointer), hash(&query(&[])));
        assert_eq!(hash(&[]), hash(&query(&[])));
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
