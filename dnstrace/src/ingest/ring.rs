//! The kernel's BPF ring buffer, read with its data pages mapped once.
//! aya maps them twice in a row, as the kernel allows, so that a record
//! that wraps past the end reads as one slice; every page then counts twice
//! in RSS (8 MiB for the default 4 MiB ring). Here the rare record that
//! wraps is copied instead.
use std::{
    io,
    os::fd::{AsFd, AsRawFd, RawFd},
    sync::atomic::{fence, AtomicU32, Ordering},
};

use aya::maps::MapData;

use super::{
    apart::Apart,
    mapping::{page_size, Mapping},
};
use crate::probes::EventMaps;

/// A record's header: its length, and the bits below, then 4 bytes.
const HEADER: usize = 8;
const BUSY: u32 = 1 << 31;
const DISCARD: u32 = 1 << 30;

pub struct Ring {
    map: MapData,
    /// One page, writable: the consumer position.
    consumer: Mapping,
    /// The producer position's page, then the data.
    producer: Mapping,
    page: usize,
    mask: usize,
    /// Where the next record starts (kept here, published on each read);
    /// like the kernel's positions it only grows, wrapping at 2^64.
    pos: usize,
    /// The producer position as last read.
    seen: usize,
    /// A record was consumed since the producer position was last read.
    consumed: bool,
    /// The last record that wrapped, whole.
    wrapped: Vec<u8>,
    /// Payloads sent apart, and the last record put back together with one.
    apart: Option<Apart>,
    spliced: Vec<u8>,
}

impl Ring {
    pub fn new(map: MapData) -> io::Result<Self> {
        let size = map.info().map_err(io::Error::other)?.max_entries() as usize;
        let page = page_size()?;
        if !size.is_power_of_two() || !size.is_multiple_of(page) {
            return Err(io::Error::other(format!(
                "a ring buffer of {size} bytes is not a power of two pages"
            )));
        }
        let fd = map.fd().as_fd();
        let consumer = Mapping::new(fd, page, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let producer = Mapping::new(fd, page + size, libc::PROT_READ, page)?;
        let mut ring = Self {
            map,
            consumer,
            producer,
            page,
            mask: size - 1,
            pos: 0,
            seen: 0,
            consumed: false,
            wrapped: Vec::new(),
            apart: None,
            spliced: Vec::new(),
        };
        ring.pos = ring.consumer.word(0).load(Ordering::Acquire);
        ring.seen = ring.producer_pos();
        Ok(ring)
    }

    /// The ring of `maps`, its events with the TCP payloads the kernel
    /// sent apart put back.
    pub fn open(maps: EventMaps) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let ring = Self::new(maps.ring).context("mapping the ring buffer")?;
        let apart = Apart::open(maps.payloads).context("opening the TCP payloads' perf buffers")?;
        Ok(ring.with_apart(apart))
    }

    /// Events that sent their payload apart get it back from `apart`.
    fn with_apart(mut self, apart: Apart) -> Self {
        self.apart = Some(apart);
        self
    }

    /// Bytes of data the ring holds.
    pub fn size(&self) -> usize {
        self.mask + 1
    }

    /// Moves past a record of `len` bytes and publishes that its room may
    /// be written again.
    fn consume(&mut self, len: usize) {
        self.pos = self.pos.wrapping_add((HEADER + len).next_multiple_of(8));
        self.consumer.word(0).store(self.pos, Ordering::Release);
        self.consumed = true;
    }

    fn data(&self) -> *const u8 {
        // SAFETY: the mapping is a page and the data pages long.
        unsafe { self.producer.start().add(self.page) }
    }

    fn producer_pos(&self) -> usize {
        // Pairs with the kernel's release store after a reservation.
        self.producer.word(0).load(Ordering::Acquire)
    }
}

impl super::reader::Records for Ring {
    fn next<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        loop {
            if self.pos == self.seen {
                if self.consumed {
                    // Either the next read sees a record committed since,
                    // or its producer sees our position.
                    fence(Ordering::SeqCst);
                    self.consumed = false;
                }
                self.seen = self.producer_pos();
                if self.pos == self.seen {
                    return None;
                }
            }
            let at = self.pos & self.mask;
            // SAFETY: `at` is 8-aligned and at least a header short of the
            // end (the size is a power of two pages, records 8-aligned).
            let header = unsafe { &*self.data().add(at).cast::<AtomicU32>() };
            // Pairs with the kernel's commit (an xchg): the record's bytes
            // are visible once its busy bit is clear.
            let header = header.load(Ordering::Acquire);
            if header & BUSY != 0 {
                return None;
            }
            // The kernel never writes more than the ring holds.
            let len = ((header & !(BUSY | DISCARD)) as usize).min(self.mask + 1 - HEADER);
            if header & DISCARD != 0 {
                self.consume(len);
                continue;
            }
            // SAFETY: the data pages, mapped for as long as `self` is.
            let data = unsafe { std::slice::from_raw_parts(self.data(), self.mask + 1) };
            let mut rec = record(data, at + HEADER, len, &mut self.wrapped);
            if let Some(apart) = &mut self.apart {
                if apart.splice(rec, &mut self.spliced) {
                    rec = &self.spliced;
                }
            }
            let out = f(rec);
            self.consume(len);
            return Some(out);
        }
    }

    fn produced(&self) -> usize {
        self.producer_pos()
    }

    fn position(&self) -> usize {
        self.pos
    }
}

impl AsRawFd for Ring {
    fn as_raw_fd(&self) -> RawFd {
        self.map.fd().as_fd().as_raw_fd()
    }
}

/// The `len` bytes from `start` on, in the ring `data`: a slice of it, or
/// where they wrap past its end, a copy in `scratch`.
fn record<'a>(data: &'a [u8], start: usize, len: usize, scratch: &'a mut Vec<u8>) -> &'a [u8] {
    let start = start % data.len();
    if let Some(whole) = data.get(start..start + len) {
        return whole;
    }
    let (tail, head) = data.split_at(start);
    scratch.clear();
    scratch.extend_from_slice(head);
    scratch.extend_from_slice(&tail[..len - head.len()]);
    scratch
}

#[cfg(test)]
mod tests {
    use super::record;

    #[test]
    fn a_record_is_a_slice_unless_it_wraps_then_a_copy() {
        let data: Vec<u8> = (0..64).collect();
        let mut scratch = Vec::new();
        assert_eq!(record(&data, 8, 4, &mut scratch), &[8, 9, 10, 11]);
        assert!(scratch.is_empty());
        assert_eq!(record(&data, 60, 4, &mut scratch), &[60, 61, 62, 63]);
        assert_eq!(record(&data, 62, 5, &mut scratch), &[62, 63, 0, 1, 2]);
        // A header in the last 8 bytes: the record starts at the beginning.
        assert_eq!(record(&data, 64, 3, &mut scratch), &[0, 1, 2]);
        let all = record(&data, 40, 63, &mut scratch);
        assert_eq!(all.len(), 63);
        assert_eq!((all[0], all[23], all[24], all[62]), (40, 63, 0, 38));
    }
}
