//! Reading kernel events from the ring buffer, as they arrive.
use std::io;

use aya::maps::{MapData, RingBuf};
use tokio::io::{unix::AsyncFd, Interest};

use crate::decode::Packet;

pub struct Ingest {
    ring: AsyncFd<RingBuf<MapData>>,
    /// Events that did not decode (a kernel/user version mismatch).
    pub bad_events: u64,
}

impl Ingest {
    pub fn new(ring: RingBuf<MapData>) -> io::Result<Self> {
        // SAFETY: the ring buffer owns its map fd, which stays open and the
        // same for as long as the AsyncFd holds it.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Self {
            ring,
            bad_events: 0,
        })
    }

    /// Waits for events, then moves every queued one into `out`.
    pub async fn next_batch(&mut self, out: &mut Vec<Packet>) -> io::Result<()> {
        let mut guard = self.ring.readable_mut().await?;
        self.bad_events += drain(guard.get_inner_mut(), out);
        guard.clear_ready();
        Ok(())
    }

    /// Moves what is queued now into `out`, without waiting.
    pub fn drain_now(&mut self, out: &mut Vec<Packet>) {
        self.bad_events += drain(self.ring.get_mut(), out);
    }
}

fn drain(ring: &mut RingBuf<MapData>, out: &mut Vec<Packet>) -> u64 {
    let mut bad = 0;
    while let Some(item) = ring.next() {
        match Packet::from_event(&item) {
            Ok(p) => out.push(p),
            Err(_) => bad += 1,
        }
    }
    bad
}
