//! Reading kernel events from the ring buffer: a thread of its own copies
//! them out (`reader`) and sets the sampling level when it cannot keep up
//! (`sampler`); the pipeline decodes them a batch at a time.
use std::{io, sync::mpsc as std_mpsc, time::Duration};

use tokio::sync::mpsc;

use crate::decode::{packet::Interned, Packet};

mod apart;
pub mod lookups;
mod mapping;
mod reader;
mod ring;
mod sampler;

use reader::{Batch, Chunk};
pub use ring::Ring;
pub use sampler::{SampleChange, SampleMode, Sampler, Viewed};

pub struct Ingest {
    batches: mpsc::Receiver<Batch>,
    /// Decoded chunks' buffers, back to the reader.
    spare: std_mpsc::SyncSender<Vec<u8>>,
    reader: Option<reader::Thread>,
    events: Events,
}

/// What reading gives the pipeline, in order.
pub enum Read {
    Packets(Vec<Packet>),
    /// Monotonic time; everything the ring held then came before it.
    Tick(u64),
    /// The kernel's sampling level changed.
    Sample(SampleChange),
}

/// What decoding keeps between batches.
#[derive(Default)]
struct Events {
    /// Events that did not decode (a kernel/user version mismatch).
    bad: u64,
    seen: Interned,
    /// Events dropped undecoded (`--discard-events`).
    discarded: u64,
}

impl Ingest {
    /// Starts the reader, with a tick every `tick`, and `sampler` setting
    /// the sampling level. With `discard`, events are read and dropped
    /// undecoded.
    pub fn new(
        ring: Ring,
        tick: Duration,
        discard: bool,
        sampler: Option<Sampler>,
    ) -> io::Result<Self> {
        let (reader, batches, spare) = reader::start(ring, tick, !discard, sampler)?;
        Ok(Self {
            batches,
            spare,
            reader: Some(reader),
            events: Events::default(),
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

    /// The next batch or tick, waiting for it. Cancel-safe.
    pub async fn next(&mut self) -> io::Result<Read> {
        match self.batches.recv().await {
            Some(batch) => Ok(self.read(batch)),
            None => Err(self.reader_ended()),
        }
    }

    /// Stops the reader and returns what it read up to now.
    pub fn rest(&mut self) -> io::Result<Vec<Read>> {
        let Some(reader) = self.reader.take() else {
            return Ok(Vec::new());
        };
        reader.stop();
        let mut rest = Vec::new();
        loop {
            // Whatever it queued before it finished is then there to take.
            let finished = reader.is_finished();
            while let Ok(batch) = self.batches.try_recv() {
                rest.push(self.read(batch));
            }
            if finished {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        reader.join()?;
        Ok(rest)
    }

    fn read(&mut self, batch: Batch) -> Read {
        match batch {
            Batch::Tick(now_ns) => Read::Tick(now_ns),
            Batch::Sample(change) => Read::Sample(change),
            Batch::Records(chunk) => {
                let packets = self.events.decode(&chunk);
                // Freed when the reader has enough spares, or is gone.
                let _ = self.spare.try_send(chunk.into_buffer());
                Read::Packets(packets)
            }
        }
    }

    /// Why the reader's queue closed.
    fn reader_ended(&mut self) -> io::Error {
        match self.reader.take().map(reader::Thread::join) {
            Some(Err(e)) => e,
            _ => io::Error::other("the ring reader stopped"),
        }
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.stop();
            // A reader waiting for room gives up once the queue is gone.
            self.batches.close();
            while self.batches.try_recv().is_ok() {}
            let _ = reader.join();
        }
    }
}

impl Events {
    fn decode(&mut self, chunk: &Chunk) -> Vec<Packet> {
        if !chunk.kept() {
            self.discarded += chunk.len() as u64;
            return Vec::new();
        }
        let (seen, bad) = (&mut self.seen, &mut self.bad);
        // Collected, not pushed one by one: each packet is then built in
        // its place in the batch, not built and copied there.
        chunk
            .records()
            .filter_map(|item| Packet::from_event(item, seen).map_err(|_| *bad += 1).ok())
            .collect()
    }
}
