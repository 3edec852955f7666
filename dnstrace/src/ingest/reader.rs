//! The ring buffer's reader: a thread of its own that only copies records
//! out of the ring into a bounded queue. The pipeline stalls now and then
//! (a tick closing journeys, a recording's writes, a wait for a core); the
//! ring is read on meanwhile, and only a full queue stops it, so that the
//! kernel counts what neither could hold.
use std::{
    io,
    os::fd::AsRawFd,
    sync::{mpsc as std_mpsc, Arc},
    thread::JoinHandle,
    time::Duration,
};

use dnstrace_common::{APART_MAX, PACKET_META_SIZE};
use tokio::{
    io::{unix::AsyncFd, Interest},
    sync::{mpsc, Notify},
    time::{interval, Interval, MissedTickBehavior},
};

use super::SampleChange;
use super::{
    sampler::{Fill, Sampler},
    Ring,
};
use crate::clock::monotonic_now;

/// Records in a chunk, at most: the pipeline decodes a chunk as one batch,
/// whose packets and records should stay in cache.
const CHUNK_RECORDS: usize = 1024;
/// A chunk is full past this many bytes; the queue holds as many chunks
/// as the ring holds of these, so user space queues at most about as much
/// as the ring.
const CHUNK_BYTES: usize = 256 << 10;
/// A chunk's buffer: full, and the largest record after.
const CHUNK_CAPACITY: usize = CHUNK_BYTES + 4 + PACKET_META_SIZE + APART_MAX;
/// Decoded chunks' buffers kept for the reader: one to fill while the
/// pipeline decodes another. Those a backlog needed on top are freed, so
/// memory goes back down after it.
const SPARE: usize = 2;

/// A ring of records the kernel commits, read in order.
pub trait Records {
    /// Hands the next committed record to `f` and consumes it; None when
    /// there is none yet.
    fn next<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R>;
    /// Where the producer has reserved up to: a byte count that only
    /// grows, wrapping.
    fn produced(&self) -> usize;
    /// Where the next record starts, on the same count.
    fn position(&self) -> usize;
}

/// What the reader hands on, in the order it read it.
pub enum Batch {
    Records(Chunk),
    /// Monotonic time: every record committed before it came before it.
    Tick(u64),
    /// The kernel's sampling level changed.
    Sample(SampleChange),
}

/// Records copied out of the ring: each its length (u32, native order)
/// then its bytes. Without `keep` (`--discard-events`) only counted.
pub struct Chunk {
    bytes: Vec<u8>,
    records: usize,
    keep: bool,
}

impl Chunk {
    fn new(mut bytes: Vec<u8>, keep: bool) -> Self {
        bytes.clear();
        Self {
            bytes,
            records: 0,
            keep,
        }
    }

    fn push(&mut self, record: &[u8]) {
        self.records += 1;
        if self.keep {
            // A record is shorter than the ring, whose size is a u32.
            self.bytes
                .extend_from_slice(&(record.len() as u32).to_ne_bytes());
            self.bytes.extend_from_slice(record);
        }
    }

    fn full(&self) -> bool {
        self.records >= CHUNK_RECORDS || self.bytes.len() >= CHUNK_BYTES
    }

    /// Records read, kept or not.
    pub fn len(&self) -> usize {
        self.records
    }

    /// Whether the records' bytes were kept, not only counted.
    pub fn kept(&self) -> bool {
        self.keep
    }

    /// The records kept, in order.
    pub fn records(&self) -> impl Iterator<Item = &[u8]> {
        let mut rest = self.bytes.as_slice();
        std::iter::from_fn(move || {
            let (len, after) = rest.split_first_chunk::<4>()?;
            let (record, after) = after.split_at_checked(u32::from_ne_bytes(*len) as usize)?;
            rest = after;
            Some(record)
        })
    }

    pub fn into_buffer(self) -> Vec<u8> {
        self.bytes
    }
}

/// Whether position `a` comes before `b` (both wrap).
fn before(a: usize, b: usize) -> bool {
    (b.wrapping_sub(a) as isize) > 0
}

/// Fills `chunk` from `ring` until the chunk is full, the ring is empty or
/// its position reaches `upto`; true if it stopped with more to read.
fn fill(ring: &mut impl Records, chunk: &mut Chunk, upto: Option<usize>) -> bool {
    while !chunk.full() {
        if upto.is_some_and(|p| !before(ring.position(), p)) {
            return false;
        }
        if ring.next(|r| chunk.push(r)).is_none() {
            return false;
        }
    }
    true
}

/// The reader's thread, and how to stop it.
pub struct Thread {
    stop: Arc<Notify>,
    handle: JoinHandle<io::Result<()>>,
}

impl Thread {
    /// Asks the reader to read what the ring holds now, hand it on and end.
    pub fn stop(&self) {
        self.stop.notify_one();
    }

    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits for the reader to end: its error, if it failed.
    pub fn join(self) -> io::Result<()> {
        self.handle
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the ring reader panicked")))
    }
}

/// Starts reading `ring` on a thread of its own, with a tick every `tick`
/// (at which `sampler`, if any, sets the sampling level); its batches come
/// out of the receiver, and their buffers go back through the sender to be
/// used again (while it has room).
pub fn start(
    ring: Ring,
    tick: Duration,
    keep: bool,
    sampler: Option<Sampler>,
) -> io::Result<(Thread, mpsc::Receiver<Batch>, std_mpsc::SyncSender<Vec<u8>>)> {
    let size = ring.size();
    let depth = (size / CHUNK_BYTES).max(2);
    let governed = sampler.map(|sampler| Governed { sampler, size });
    spawn(ring, depth, tick, keep, governed)
}

/// The queue holds `depth` chunks.
fn spawn<R: Records + AsRawFd + Send + 'static>(
    ring: R,
    depth: usize,
    tick: Duration,
    keep: bool,
    governed: Option<Governed>,
) -> io::Result<(Thread, mpsc::Receiver<Batch>, std_mpsc::SyncSender<Vec<u8>>)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (ring, tick) = {
        let _in = runtime.enter();
        // SAFETY: the ring owns its fd, which stays open and the same for
        // as long as the AsyncFd holds it.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        let mut tick = interval(tick);
        // Ticks missed while the queue was full are not made up in a burst:
        // each would have the pipeline close journeys, behind as it is.
        tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
        (ring, tick)
    };
    let (queue, batches) = mpsc::channel(depth);
    let (spare_tx, spare) = std_mpsc::sync_channel(SPARE);
    let reader = Reader {
        ring,
        queue,
        buffers: Buffers {
            spare,
            unused: None,
            keep,
        },
        governed,
        tick,
        changes: Vec::new(),
        sent: 0,
        stale: None,
    };
    let stop = Arc::new(Notify::new());
    let stopped = stop.clone();
    let handle = std::thread::Builder::new()
        .name("ring reader".into())
        .spawn(move || runtime.block_on(reader.run(&stopped)))?;
    Ok((Thread { stop, handle }, batches, spare_tx))
}

struct Reader<R: Records + AsRawFd> {
    ring: AsyncFd<R>,
    queue: mpsc::Sender<Batch>,
    buffers: Buffers,
    governed: Option<Governed>,
    tick: Interval,
    /// Changes of the sampling level made since the last batch was queued,
    /// to be queued after it.
    changes: Vec<SampleChange>,
    /// Batches queued so far.
    sent: u64,
    /// Since the level last changed, until the pipeline works on what the
    /// new level kept.
    stale: Option<Stale>,
}

/// What is left, since the level changed, before what fills the queue was
/// kept under the new level.
#[derive(Clone, Copy)]
enum Stale {
    /// The reader reading past where the kernel had written at the change.
    Unread(usize),
    /// The pipeline taking this many batches in all.
    Untaken(u64),
}

/// What ended a wait for room in the queue.
enum Woke<P> {
    Room(P),
    Tick,
}

/// The sampler, and the ring's size its fill is measured against.
struct Governed {
    sampler: Sampler,
    size: usize,
}

impl<R: Records + AsRawFd> Reader<R> {
    /// Reads on each wakeup of the kernel's, and up to now on each tick,
    /// until stopped or the pipeline is gone.
    async fn run(mut self, stop: &Notify) -> io::Result<()> {
        // A level asked for (`--sample`) holds from the start.
        let asked = self
            .governed
            .as_mut()
            .filter(|g| g.sampler.governor.level().shift > 0);
        self.changes.extend(asked.and_then(|g| g.sampler.apply()));
        if !self.send_changes().await {
            return Ok(());
        }
        loop {
            let going = tokio::select! {
                () = stop.notified() => {
                    let _ = self.send_up_to_now().await && self.send_changes().await;
                    return Ok(());
                }
                _ = self.tick.tick() => {
                    let now_ns = monotonic_now();
                    self.govern(now_ns);
                    self.send_up_to_now().await && self.send(Batch::Tick(now_ns)).await
                }
                ready = self.ring.readable_mut() => {
                    let mut ready = ready?;
                    let mut chunk = self.buffers.chunk();
                    if !fill(ready.get_inner_mut(), &mut chunk, None) {
                        // The ring is empty: wait for the next wakeup.
                        ready.clear_ready();
                    }
                    drop(ready);
                    self.hand_on(chunk).await
                }
            };
            if !going {
                return Ok(());
            }
        }
    }

    /// Hands on everything committed to the ring by now; false if the
    /// pipeline is gone.
    async fn send_up_to_now(&mut self) -> bool {
        let upto = self.ring.get_ref().produced();
        loop {
            let mut chunk = self.buffers.chunk();
            let more = fill(self.ring.get_mut(), &mut chunk, Some(upto));
            if !self.hand_on(chunk).await {
                return false;
            }
            if !more {
                return true;
            }
        }
    }

    /// Tells the sampler how full the queue and the ring are now; a change
    /// of level it makes is queued after the next batch.
    fn govern(&mut self, now_ns: u64) {
        let Some(g) = self.governed.as_mut() else {
            return;
        };
        let ring = self.ring.get_ref();
        let queued = self.queue.max_capacity() - self.queue.capacity();
        let taken = self.sent - queued as u64;
        if matches!(self.stale, Some(Stale::Untaken(n)) if taken >= n) {
            self.stale = None;
        }
        let fill = Fill {
            queue: queued as f64 / self.queue.max_capacity() as f64,
            ring: ring.produced().wrapping_sub(ring.position()) as f64 / g.size as f64,
            lost: g.sampler.lost_more(),
            current: self.stale.is_none(),
        };
        g.sampler.measure(now_ns);
        if g.sampler.governor.tick(now_ns, fill).is_some() {
            let change = g.sampler.apply();
            if change.is_some() {
                self.stale = Some(Stale::Unread(ring.produced()));
            }
            self.changes.extend(change);
        }
        // The level stays: what fills the ring is kept as before.
        self.changes.extend(g.sampler.view());
    }

    /// A batch was queued: counted, and once the reader has read past where
    /// the kernel was at the last change, the pipeline has that many to take.
    fn queued_one(&mut self) {
        self.sent += 1;
        if let Some(Stale::Unread(at)) = self.stale {
            if !before(self.ring.get_ref().position(), at) {
                self.stale = Some(Stale::Untaken(self.sent));
            }
        }
    }

    /// Queues the changes of level made since the last batch; false if the
    /// pipeline is gone.
    async fn send_changes(&mut self) -> bool {
        for c in std::mem::take(&mut self.changes) {
            if self.queue.send(Batch::Sample(c)).await.is_err() {
                return false;
            }
            self.queued_one();
        }
        true
    }

    /// Queues `chunk` unless it is empty; false if the pipeline is gone.
    async fn hand_on(&mut self, chunk: Chunk) -> bool {
        if chunk.len() == 0 {
            self.buffers.unused = Some(chunk.into_buffer());
            return true;
        }
        self.send(Batch::Records(chunk)).await
    }

    /// Queues `batch`, then the changes of level made meanwhile; false if
    /// the pipeline is gone. While the queue is full the ring fills behind
    /// it: the sampler still looks at each tick, when it matters most.
    async fn send(&mut self, batch: Batch) -> bool {
        loop {
            let governed = self.governed.is_some();
            let woke = tokio::select! {
                permit = self.queue.clone().reserve_owned() => Woke::Room(permit),
                _ = self.tick.tick(), if governed => Woke::Tick,
            };
            match woke {
                Woke::Room(Ok(permit)) => {
                    permit.send(batch);
                    self.queued_one();
                    return self.send_changes().await;
                }
                Woke::Room(Err(_)) => return false,
                Woke::Tick => self.govern(monotonic_now()),
            }
        }
    }
}

/// Chunks' buffers, used again: at most the queue's depth and two more
/// exist at once, and `SPARE` and one more once the pipeline has caught up.
struct Buffers {
    /// Buffers of chunks the pipeline has decoded.
    spare: std_mpsc::Receiver<Vec<u8>>,
    /// A buffer the reader found nothing to fill with.
    unused: Option<Vec<u8>>,
    keep: bool,
}

impl Buffers {
    fn chunk(&mut self) -> Chunk {
        let bytes = self
            .unused
            .take()
            .or_else(|| self.spare.try_recv().ok())
            .unwrap_or_else(|| Vec::with_capacity(CHUNK_CAPACITY));
        Chunk::new(bytes, self.keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records laid end to end as the kernel's ring counts them: each
    /// position is the byte count before it, headers and padding included.
    struct Fake {
        records: std::collections::VecDeque<(usize, Vec<u8>)>,
        pos: usize,
        end: usize,
    }

    impl Fake {
        fn new(start: usize, lens: &[usize]) -> Self {
            let mut end = start;
            let records = lens
                .iter()
                .enumerate()
                .map(|(i, &len)| {
                    let at = end;
                    end = end.wrapping_add((8 + len).next_multiple_of(8));
                    (at, vec![i as u8; len])
                })
                .collect();
            Self {
                records,
                pos: start,
                end,
            }
        }
    }

    impl Records for Fake {
        fn next<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
            let (at, bytes) = self.records.pop_front()?;
            self.pos = at.wrapping_add((8 + bytes.len()).next_multiple_of(8));
            Some(f(&bytes))
        }

        fn produced(&self) -> usize {
            self.end
        }

        fn position(&self) -> usize {
            self.pos
        }
    }

    /// A `Fake` shared with the reader's thread, woken through an eventfd.
    struct Shared {
        ring: Arc<std::sync::Mutex<Fake>>,
        wake: std::os::fd::OwnedFd,
        read: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Records for Shared {
        fn next<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
            let out = self.ring.lock().unwrap().next(f)?;
            self.read.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Some(out)
        }

        fn produced(&self) -> usize {
            self.ring.lock().unwrap().produced()
        }

        fn position(&self) -> usize {
            self.ring.lock().unwrap().position()
        }
    }

    impl AsRawFd for Shared {
        fn as_raw_fd(&self) -> std::os::fd::RawFd {
            self.wake.as_raw_fd()
        }
    }

    impl Fake {
        fn commit(&mut self, lens: &[usize]) {
            for &len in lens {
                let at = self.end;
                self.end = at.wrapping_add((8 + len).next_multiple_of(8));
                self.records.push_back((at, vec![0; len]));
            }
        }
    }

    /// A reader of `lens` on its thread, with a queue of `depth` chunks and
    /// an hour between ticks (the first comes at once).
    struct Running {
        ring: Arc<std::sync::Mutex<Fake>>,
        wake: std::os::fd::OwnedFd,
        read: Arc<std::sync::atomic::AtomicUsize>,
        thread: Thread,
        batches: mpsc::Receiver<Batch>,
    }

    impl Running {
        fn start(lens: &[usize], depth: usize) -> Self {
            use std::os::fd::FromRawFd;
            // SAFETY: plain eventfd(2); the fd is owned from here on.
            let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            assert!(fd >= 0);
            // SAFETY: a new fd, owned once; dup'd for the reader's side.
            let wake = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
            let ring = Arc::new(std::sync::Mutex::new(Fake::new(0, lens)));
            let read = Arc::default();
            let shared = Shared {
                ring: ring.clone(),
                wake: wake.try_clone().unwrap(),
                read: Arc::clone(&read),
            };
            let hour = Duration::from_secs(3600);
            let (thread, batches, _) = spawn(shared, depth, hour, true, None).unwrap();
            Self {
                ring,
                wake,
                read,
                thread,
                batches,
            }
        }

        /// The kernel's wakeup.
        fn wake(&self) {
            let one = 1u64.to_ne_bytes();
            // SAFETY: an 8-byte write to our eventfd.
            let n = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
            assert_eq!(n, 8);
        }

        fn read(&self) -> usize {
            self.read.load(std::sync::atomic::Ordering::SeqCst)
        }

        /// The next batch, within 10 s; None if the queue is closed.
        fn next(&mut self) -> Option<Batch> {
            for _ in 0..10_000 {
                match self.batches.try_recv() {
                    Ok(b) => return Some(b),
                    Err(mpsc::error::TryRecvError::Disconnected) => return None,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                }
            }
            panic!("no batch within 10 s");
        }

        fn records(&mut self) -> usize {
            match self.next() {
                Some(Batch::Records(c)) => c.len(),
                Some(Batch::Tick(_) | Batch::Sample(_)) => panic!("not records"),
                None => panic!("the queue closed"),
            }
        }

        fn tick(&mut self) {
            assert!(matches!(self.next(), Some(Batch::Tick(_))), "a tick");
        }
    }

    /// Memory stays bounded when the pipeline falls behind: the reader
    /// stops at a full queue (and the kernel counts what the ring cannot
    /// hold), then goes on in order, the tick after what came before it.
    #[test]
    fn a_full_queue_holds_the_reader_and_the_tick_comes_after_its_records() {
        let mut r = Running::start(&[1; 5 * CHUNK_RECORDS], 2);
        for _ in 0..10_000 {
            if r.read() >= 3 * CHUNK_RECORDS {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            r.read(),
            3 * CHUNK_RECORDS,
            "two chunks queued and one waiting for room"
        );
        for _ in 0..5 {
            assert_eq!(r.records(), CHUNK_RECORDS);
        }
        r.tick();
        r.thread.stop();
        assert!(r.next().is_none(), "ended");
        r.thread.join().unwrap();
    }

    /// Between ticks the kernel's wakeup has the ring read; stopping reads
    /// what it holds, hands it on and ends.
    #[test]
    fn a_wakeup_reads_between_ticks_and_a_stop_reads_what_is_left() {
        let mut r = Running::start(&[], 4);
        r.tick();
        r.ring.lock().unwrap().commit(&[10; 5]);
        r.wake();
        assert_eq!(
            r.records(),
            5,
            "read on the wakeup, an hour before the tick"
        );
        r.ring.lock().unwrap().commit(&[10; 3]);
        r.thread.stop();
        assert_eq!(r.records(), 3);
        assert!(r.next().is_none(), "ended");
        r.thread.join().unwrap();
    }

    fn chunk(keep: bool) -> Chunk {
        Chunk::new(Vec::new(), keep)
    }

    #[test]
    fn a_chunk_gives_back_its_records_whole_and_in_order() {
        let mut ring = Fake::new(0, &[3, 0, 100, 5]);
        let mut c = chunk(true);
        assert!(!fill(&mut ring, &mut c, None), "the ring is empty");
        let got: Vec<&[u8]> = c.records().collect();
        assert_eq!(
            got,
            [&[0u8; 3][..], &[], &[2; 100][..], &[3; 5][..]],
            "lengths and bytes"
        );
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn a_chunk_stops_at_its_record_limit_and_says_more_is_left() {
        let mut ring = Fake::new(0, &[1; CHUNK_RECORDS + 3]);
        let mut c = chunk(true);
        assert!(fill(&mut ring, &mut c, None));
        assert_eq!(
            (c.len(), c.records().count()),
            (CHUNK_RECORDS, CHUNK_RECORDS)
        );
        let mut rest = chunk(true);
        assert!(!fill(&mut ring, &mut rest, None));
        assert_eq!(rest.len(), 3);
    }

    #[test]
    fn a_chunk_stops_past_its_byte_limit() {
        let big = APART_MAX + PACKET_META_SIZE;
        let mut ring = Fake::new(0, &[big; 100]);
        let mut c = chunk(true);
        assert!(fill(&mut ring, &mut c, None));
        assert!(c.bytes.len() >= CHUNK_BYTES && c.bytes.len() <= CHUNK_CAPACITY);
        assert_eq!(c.len(), CHUNK_BYTES.div_ceil(big + 4));
    }

    /// A tick reads what was committed before it and no further: under
    /// overload the ring is never empty, and a tick that waited for it
    /// would never come.
    #[test]
    fn a_tick_reads_up_to_where_the_producer_was_even_across_the_wrap() {
        for start in [0, usize::MAX - 20] {
            let mut ring = Fake::new(start, &[4, 4, 4]);
            let upto = ring.produced();
            // Committed after the tick's look.
            ring.records.push_back((upto, vec![9; 4]));
            let mut c = chunk(true);
            assert!(!fill(&mut ring, &mut c, Some(upto)));
            assert_eq!(c.len(), 3, "from {start}");
            assert_eq!(ring.records.len(), 1, "left for after the tick");
        }
    }

    #[test]
    fn discarding_counts_records_and_keeps_no_bytes() {
        let mut ring = Fake::new(0, &[50; 10]);
        let mut c = chunk(false);
        fill(&mut ring, &mut c, None);
        assert_eq!((c.len(), c.records().count(), c.bytes.len()), (10, 0, 0));
    }
}
