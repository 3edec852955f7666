//! Reading kernel events from the ring buffer, a bounded batch at a time.
use std::io;

use tokio::io::{unix::AsyncFd, Interest};

use crate::decode::{packet::IfNames, Packet};

mod ring;

pub use ring::Ring;

/// Events read in one batch: enough to spread a batch's fixed costs, few
/// enough that its packets and records stay in cache and the reader's
/// memory stays flat however far behind it is.
const BATCH: usize = 1024;

pub struct Ingest {
    ring: AsyncFd<Ring>,
    events: Events,
}

/// What reading keeps between batches.
#[derive(Default)]
struct Events {
    /// Events that did not decode (a kernel/user version mismatch).
    bad: u64,
    names: IfNames,
    /// Drop every event undecoded (`--discard-events`), counting them.
    discard: bool,
    discarded: u64,
}

impl Ingest {
    /// With `discard`, events are read and dropped undecoded.
    pub fn new(ring: Ring, discard: bool) -> io::Result<Self> {
        // SAFETY: the ring buffer owns its map fd, which stays open and the
        // same for as long as the AsyncFd holds it.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Self {
            ring,
            events: Events {
                discard,
                ..Events::default()
            },
        })
    }

    /// Events that did not decode (a kernel/user version mismatch).
    pub fn bad_events(&self) -> u64 {
        self.events.bad
    }

    /// Events dropped undecoded (`--discard-events`).
    pub fn discarded(&self) -> u64 {
        self.events.discarded
    }

    /// Waits for the kernel's wakeup, then reads a batch into `out`. The
    /// wakeup is kept while the ring may hold more, so the next call reads
    /// on without waiting.
    pub async fn next_batch(&mut self, out: &mut Vec<Packet>) -> io::Result<()> {
        let mut guard = self.ring.readable_mut().await?;
        if !self.events.read(guard.get_inner_mut(), out) {
            guard.clear_ready();
        }
        Ok(())
    }

    /// Reads a batch into `out` without waiting; true if the ring may hold
    /// more.
    pub fn read_now(&mut self, out: &mut Vec<Packet>) -> bool {
        self.events.read(self.ring.get_mut(), out)
    }
}

impl Events {
    /// Reads at most `BATCH` events; true if it stopped at the limit.
    fn read(&mut self, ring: &mut Ring, out: &mut Vec<Packet>) -> bool {
        for _ in 0..BATCH {
            if ring.next(|item| self.take(item, out)).is_none() {
                return false;
            }
        }
        true
    }

    fn take(&mut self, item: &[u8], out: &mut Vec<Packet>) {
        if self.discard {
            self.discarded += 1;
            return;
        }
        if out.capacity() == 0 {
            out.reserve_exact(BATCH);
        }
        match Packet::from_event(item, &mut self.names) {
            Ok(p) => out.push(p),
            Err(_) => self.bad += 1,
        }
    }
}
