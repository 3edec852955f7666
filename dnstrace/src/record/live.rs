//! The agent's evidence for cluster views (`dnstrace cluster`): the
//! pipeline's recent inputs kept in memory, which the flight recorder
//! writes out and a view's `since` reaches back into; and each viewer's
//! share of what comes, the lookups it watches, handed over a bounded queue
//! that drops, and counts, rather than hold the pipeline up.
use std::{
    collections::{BTreeMap, VecDeque},
    net::IpAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard, PoisonError,
    },
};

use tokio::sync::{mpsc, watch};

use super::{replay::time_of, watch::Watch, Meta};
use crate::{
    decode::Packet,
    diagnose::Anomaly,
    ingest::Viewed,
    pipeline::{Input, Tap},
};

/// How much of the recent past is kept.
#[derive(Clone, Copy, Debug)]
pub struct MemoryOptions {
    /// Bytes of inputs, at most.
    pub bytes: usize,
    /// Inputs older than this go.
    pub age_ns: u64,
}

/// Pod refreshes kept apart from the window (names a recording needs
/// however old), at most.
const PODS_KEPT: usize = 1024;

/// Inputs a viewer's queue holds before it drops: a tick's worth of a
/// busy node's watched lookups many times over.
const QUEUE: usize = 4096;

/// The recent past, bounded by bytes and age: each input with when it
/// came (the last tick's time) and its place in the hub's order.
pub struct Memory {
    options: MemoryOptions,
    recent: VecDeque<(u64, u64, Input)>,
    bytes: usize,
    pods: VecDeque<Input>,
}

impl Memory {
    fn new(options: MemoryOptions) -> Self {
        Self {
            options,
            recent: VecDeque::new(),
            bytes: 0,
            pods: VecDeque::new(),
        }
    }

    fn keep(&mut self, now_ns: u64, seq: u64, input: &Input) {
        if let Input::Pods { .. } = input {
            if self.pods.len() >= PODS_KEPT {
                self.pods.pop_front();
            }
            self.pods.push_back(input.clone());
            return;
        }
        // No memory (no flight recorder): nothing to copy.
        if self.options.bytes == 0 {
            return;
        }
        self.recent.push_back((now_ns, seq, input.clone()));
        self.bytes += size_of(input);
        let oldest = now_ns.saturating_sub(self.options.age_ns);
        while let Some((ts, _, front)) = self.recent.front() {
            if self.bytes <= self.options.bytes && *ts >= oldest {
                break;
            }
            self.bytes -= size_of(front);
            self.recent.pop_front();
        }
    }

    /// The pods' refreshes, then what came from `from_ns` on.
    pub fn since(&self, from_ns: u64) -> impl Iterator<Item = &Input> {
        self.since_seq(from_ns).map(|(_, i)| i)
    }

    /// The same, each with its place in the hub's order (0 for the
    /// pods').
    fn since_seq(&self, from_ns: u64) -> impl Iterator<Item = (u64, &Input)> {
        let recent = self
            .recent
            .iter()
            .filter(move |(ts, ..)| *ts >= from_ns)
            .map(|(_, seq, i)| (*seq, i));
        self.pods.iter().map(|i| (0, i)).chain(recent)
    }

    /// The pods' refreshes, then what came after the `seq`th input; None
    /// when some of that is no longer kept.
    fn after_seq(&self, seq: u64) -> Option<impl Iterator<Item = (u64, &Input)>> {
        let first = self.recent.front().map_or(u64::MAX, |(_, s, _)| *s);
        if first > seq.saturating_add(1) && self.recent.back().is_some_and(|b| b.1 > seq) {
            return None;
        }
        let recent = self
            .recent
            .iter()
            .filter(move |(_, s, _)| *s > seq)
            .map(|(_, s, i)| (*s, i));
        Some(self.pods.iter().map(|i| (0, i)).chain(recent))
    }

    /// When the oldest input kept came.
    pub fn oldest_ns(&self) -> Option<u64> {
        self.recent.front().map(|(ts, ..)| *ts)
    }
}

/// Bytes an input holds in memory, allocations included: what the bound
/// is kept in.
pub(super) fn size_of(input: &Input) -> usize {
    use std::mem::size_of;
    /// What an allocator adds to each allocation, about.
    const ALLOC: usize = 16;
    let each = size_of::<(u64, Input)>() + ALLOC;
    match input {
        Input::Packets(batch) => {
            let packets: usize = batch
                .iter()
                .map(|p| size_of::<Packet>() + p.payload.len() + ALLOC)
                .sum();
            each + packets
        }
        Input::Conntrack { events, .. } => each + std::mem::size_of_val(events.as_slice()),
        _ => each,
    }
}

/// One viewer: what it watches, and its queue.
struct Viewer {
    watch: Watch,
    tx: mpsc::Sender<(u64, Input)>,
    dropped: Arc<AtomicU64>,
}

impl Viewer {
    /// Hands over its share of `input`; false once the viewer has gone.
    fn offer(&mut self, seq: u64, input: &Input) -> bool {
        let Some(share) = self.watch.share(input) else {
            return true;
        };
        let lost = events_in(&share);
        match self.tx.try_send((seq, share)) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped.fetch_add(lost, Ordering::Relaxed);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

/// Packets and conntrack events an input holds (1 for the others): what
/// a viewer is told it missed.
fn events_in(input: &Input) -> u64 {
    match input {
        Input::Packets(b) => b.len() as u64,
        Input::Conntrack { events, .. } => events.len() as u64,
        _ => 1,
    }
}

struct Hub {
    memory: Memory,
    viewers: Vec<Viewer>,
    /// Whose lookups the viewers watch, all together: the kernel follows
    /// them whole.
    viewed: watch::Sender<Viewed>,
    /// What a stream starts with, once tracing has started.
    meta: Option<Meta>,
    /// The node's pods: `namespace/name` by address.
    pods: BTreeMap<IpAddr, String>,
    now_ns: u64,
    /// Inputs seen so far: each one's place, which a viewer resumes
    /// after; and this process's, which a place belongs to.
    seq: u64,
    epoch: u64,
}

/// The memory and the viewers, shared by the pipeline (a `Tap`) and the
/// agent's API.
#[derive(Clone)]
pub struct Live(Arc<Mutex<Hub>>);

/// What a new viewer gets: the stream's start, the past it asked for, and
/// its queue of what comes, each input with its place in the hub's order
/// (of this `epoch`).
pub struct Subscription {
    pub meta: Meta,
    pub past: Vec<(u64, Input)>,
    pub queue: mpsc::Receiver<(u64, Input)>,
    pub epoch: u64,
    /// Events its queue dropped so far.
    pub dropped: Arc<AtomicU64>,
}

/// The node as a viewer is told about it.
pub struct NodeState {
    /// How far back the memory reaches now.
    pub memory_ns: u64,
    pub pods: BTreeMap<String, Vec<IpAddr>>,
    /// The cluster's resolvers, as the node knows them.
    pub resolvers: Vec<IpAddr>,
}

impl Live {
    pub fn new(memory: MemoryOptions) -> Self {
        Self(Arc::new(Mutex::new(Hub {
            memory: Memory::new(memory),
            viewers: Vec::new(),
            viewed: watch::Sender::new(Viewed::default()),
            meta: None,
            pods: BTreeMap::new(),
            now_ns: 0,
            seq: 0,
            // Unique to the process: a restarted agent's places are not
            // its predecessor's.
            epoch: crate::clock::monotonic_now(),
        })))
    }

    fn hub(&self) -> MutexGuard<'_, Hub> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tracing has started: what streams begin with, and the node's pods.
    pub fn started(&self, meta: Meta, pods: &[(String, Vec<IpAddr>)]) {
        let mut hub = self.hub();
        hub.meta = Some(meta);
        for (name, ips) in pods {
            ips.iter().for_each(|ip| {
                hub.pods.insert(*ip, name.clone());
            });
        }
    }

    /// Runs `f` over the memory (the flight recorder writing it out).
    pub fn with_memory<T>(&self, f: impl FnOnce(&Memory) -> T) -> T {
        f(&self.hub().memory)
    }

    pub fn state(&self) -> NodeState {
        let hub = self.hub();
        let mut pods: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
        for (ip, name) in &hub.pods {
            pods.entry(name.clone()).or_default().push(*ip);
        }
        NodeState {
            memory_ns: hub
                .memory
                .oldest_ns()
                .map_or(0, |t| hub.now_ns.saturating_sub(t)),
            pods,
            resolvers: hub
                .meta
                .as_ref()
                .map_or_else(Vec::new, |m| m.resolvers().to_vec()),
        }
    }

    /// A new viewer of `watch`, its past from `since_ns` ago and after
    /// `after`; None before tracing has started.
    pub fn subscribe(&self, mut watch: Watch, since_ns: u64, after: After) -> Option<Subscription> {
        let mut hub = self.hub();
        let meta = hub.meta.clone()?;
        let past = hub.past(&mut watch, since_ns, after);
        let (tx, queue) = mpsc::channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        hub.viewers.push(Viewer {
            watch,
            tx,
            dropped: dropped.clone(),
        });
        hub.say_viewed();
        Some(Subscription {
            meta,
            past,
            queue,
            epoch: hub.epoch,
            dropped,
        })
    }

    /// Whose lookups the viewers watch, as it changes.
    pub fn views(&self) -> watch::Receiver<Viewed> {
        self.hub().viewed.subscribe()
    }

    /// How many view the node now.
    pub fn viewers(&self) -> usize {
        self.hub().viewers.len()
    }
}

/// Where a viewer that reconnects has got: the last input it has, by its
/// place in the order of the agent `epoch` it came from; failing that
/// (another agent process, or its memory moved past), by time.
#[derive(Clone, Copy, Debug, Default)]
pub struct After {
    pub ns: u64,
    pub seq: Option<(u64, u64)>,
}

/// What of `input` happened after `after_ns` (a viewer that has the rest).
fn after(input: Input, after_ns: u64) -> Option<Input> {
    match input {
        Input::Packets(mut b) => {
            b.retain(|p| p.ts_ns > after_ns);
            (!b.is_empty()).then_some(Input::Packets(b))
        }
        Input::Pods { .. } => Some(input),
        other => (time_of(&other).unwrap_or(0) > after_ns).then_some(other),
    }
}

impl Hub {
    /// A new viewer's past: by place when it resumes from this process
    /// and all it missed is kept, else by time.
    fn past(&self, watch: &mut Watch, since_ns: u64, after_at: After) -> Vec<(u64, Input)> {
        let resumed = after_at
            .seq
            .filter(|(epoch, _)| *epoch == self.epoch)
            .and_then(|(_, seq)| self.memory.after_seq(seq));
        if let Some(rest) = resumed {
            return rest
                .filter_map(|(s, i)| Some((s, watch.share(i)?)))
                .collect();
        }
        let from = self.now_ns.saturating_sub(since_ns).max(after_at.ns);
        self.memory
            .since_seq(from)
            .filter_map(|(s, i)| Some((s, watch.share(i)?)))
            .filter_map(|(s, i)| Some((s, after(i, after_at.ns)?)))
            .collect()
    }

    /// Tells the kernel's side whose lookups the viewers now watch.
    fn say_viewed(&self) {
        let viewed = Viewed::new(self.viewers.iter().flat_map(|v| v.watch.ips()));
        self.viewed.send_if_modified(|was| {
            let changed = *was != viewed;
            *was = viewed;
            changed
        });
    }
}

impl Tap for Live {
    fn start(&mut self, now_ns: u64) {
        self.hub().now_ns = now_ns;
    }

    fn input(&mut self, input: &Input) {
        let mut hub = self.hub();
        if let Input::Tick(now) = input {
            hub.now_ns = hub.now_ns.max(*now);
        }
        if let Input::Pods { refresh, .. } = input {
            for (ip, name) in &refresh.names {
                if refresh.uids.iter().any(|(u, _)| u == ip) {
                    hub.pods.insert(*ip, name.clone());
                }
            }
        }
        let now = hub.now_ns;
        hub.seq += 1;
        let seq = hub.seq;
        hub.memory.keep(now, seq, input);
        let viewers = hub.viewers.len();
        hub.viewers.retain_mut(|v| v.offer(seq, input));
        if hub.viewers.len() < viewers {
            hub.say_viewed();
        }
    }

    fn anomaly(&mut self, _: &Anomaly) {}

    fn status_changed(&mut self) -> Option<String> {
        None
    }

    fn end(&mut self, _: u64) {
        // The queues close: each viewer's stream ends.
        let mut hub = self.hub();
        hub.viewers.clear();
        hub.say_viewed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        clock::Clock, correlate::Limits, decode::KernelNames, diagnose::Context, output::Labels,
        record::tests::query,
    };

    const S: u64 = 1_000_000_000;

    fn live(bytes: usize) -> Live {
        let labels = Labels::new(Default::default(), Clock::EPOCH, KernelNames::default());
        let meta = crate::record::meta(&labels, &Context::default(), Limits::default());
        let live = Live::new(MemoryOptions {
            bytes,
            age_ns: 60 * S,
        });
        live.started(
            meta,
            &[("default/web".into(), vec!["10.244.1.5".parse().unwrap()])],
        );
        live
    }

    /// A packet of web's (or another pod's) at `ts`, and a tick.
    fn feed(live: &mut Live, client: &str, ts: u64) {
        let p = query(client, "10.96.0.10:53", &format!("n{ts}.example.com"), ts);
        live.input(&Input::Packets(vec![p]));
        live.input(&Input::Tick(ts + 1));
    }

    fn packets(inputs: &[(u64, Input)]) -> Vec<(String, u64)> {
        inputs
            .iter()
            .filter_map(|(_, i)| match i {
                Input::Packets(b) => Some(b.iter().map(|p| (p.src.to_string(), p.ts_ns))),
                _ => None,
            })
            .flatten()
            .collect()
    }

    fn watch_web() -> Watch {
        Watch::of(["10.244.1.5".parse().unwrap()])
    }

    /// A viewer gets the past it asked for, web's packets only, then
    /// what comes; one that reconnects after what it has gets the rest.
    #[test]
    fn a_viewer_gets_its_past_then_what_comes() {
        let mut live = live(1 << 20);
        live.start(0);
        for s in 1..=10 {
            feed(&mut live, "10.244.1.5:4000", s * S);
            feed(&mut live, "10.244.2.9:4000", s * S + 1000);
        }
        let mut sub = live
            .subscribe(watch_web(), 3 * S, After::default())
            .unwrap();
        let web = |ts: u64| ("10.244.1.5:4000".to_owned(), ts);
        assert_eq!(packets(&sub.past), [web(8 * S), web(9 * S), web(10 * S)]);
        feed(&mut live, "10.244.1.5:4000", 11 * S);
        feed(&mut live, "10.244.2.9:4000", 11 * S + 1000);
        let mut came = Vec::new();
        while let Ok(i) = sub.queue.try_recv() {
            came.push(i);
        }
        assert_eq!(packets(&came), [web(11 * S)]);
        let again = live
            .subscribe(
                watch_web(),
                60 * S,
                After {
                    ns: 9 * S,
                    seq: None,
                },
            )
            .unwrap();
        assert_eq!(packets(&again.past), [web(10 * S), web(11 * S)]);
        assert_eq!(
            live.state().pods["default/web"],
            ["10.244.1.5".parse::<IpAddr>().unwrap()]
        );
    }

    /// A viewer cut off after web's packet of 2 s and before the tick
    /// after it, which came with a packet of 2.5 s, reconnects after the
    /// last input it had: it gets the rest exactly, the 2.5 s packet and
    /// nothing twice (by time it would get the 2 s packet again, the tick
    /// it resumed from being 1 s). From another agent process, or once
    /// the memory has moved past, it resumes by time.
    #[test]
    fn a_viewer_that_reconnects_gets_exactly_what_it_missed() {
        let mut live = live(1 << 20);
        live.start(0);
        let web = |ts: u64| query("10.244.1.5:4000", "10.96.0.10:53", "a.example.com", ts);
        let mut sub = live.subscribe(watch_web(), 0, After::default()).unwrap();
        live.input(&Input::Packets(vec![web(S)]));
        live.input(&Input::Tick(S));
        live.input(&Input::Packets(vec![web(2 * S)]));
        let mut had = Vec::new();
        while let Ok(i) = sub.queue.try_recv() {
            had.push(i);
        }
        let last = had.last().unwrap().0;
        drop(sub);
        live.input(&Input::Packets(vec![web(2 * S + S / 2)]));
        live.input(&Input::Tick(3 * S));
        let resumed = |seq| After {
            ns: S,
            seq: Some(seq),
        };
        let epoch = live.hub().epoch;
        // However long it was away, as `dnstrace cluster` asks.
        let again = live
            .subscribe(watch_web(), 60 * S, resumed((epoch, last)))
            .unwrap();
        let web_at = |ts| ("10.244.1.5:4000".to_owned(), ts);
        assert_eq!(packets(&again.past), [web_at(2 * S + S / 2)]);
        let other = live
            .subscribe(watch_web(), 60 * S, resumed((epoch + 1, last)))
            .unwrap();
        assert_eq!(packets(&other.past), [web_at(2 * S), web_at(2 * S + S / 2)]);
    }

    /// A memory that holds two ticks: a viewer that had the third of five
    /// gets the last two, one that had only the first cannot be resumed
    /// by place (the second is gone).
    #[test]
    fn a_place_the_memory_has_moved_past_is_no_place_to_resume_from() {
        let mut memory = Memory::new(MemoryOptions {
            bytes: 2 * size_of(&Input::Tick(0)),
            age_ns: 60 * S,
        });
        for seq in 1..=5 {
            memory.keep(seq * S, seq, &Input::Tick(seq * S));
        }
        let places = |from| {
            memory
                .after_seq(from)
                .map(|i| i.map(|(s, _)| s).collect::<Vec<_>>())
        };
        assert_eq!(places(3), Some(vec![4, 5]));
        assert_eq!(places(5), Some(vec![]));
        assert_eq!(places(1), None);
    }

    /// A viewer that does not read loses what overflows its queue, each
    /// event counted, and the pipeline goes on; one gone is forgotten.
    #[test]
    fn a_stuck_viewer_loses_and_counts_and_a_gone_one_is_dropped() {
        let mut live = live(0);
        live.start(0);
        let stuck = live.subscribe(watch_web(), 0, After::default()).unwrap();
        let gone = live.subscribe(watch_web(), 0, After::default()).unwrap();
        drop(gone);
        let n = QUEUE as u64;
        for s in 1..=n {
            feed(&mut live, "10.244.1.5:4000", s * S);
        }
        assert_eq!(live.viewers(), 1);
        // Each feed is a packet and a tick: half of them fit.
        assert_eq!(stuck.dropped.load(Ordering::Relaxed), n);
        assert!(stuck.past.is_empty() || packets(&stuck.past).is_empty());
    }

    /// While a viewer watches web, the kernel is told to follow web's
    /// lookups whole; once it has gone, no one's.
    #[test]
    fn the_kernel_follows_whom_the_viewers_watch() {
        let mut live = live(1 << 20);
        let mut views = live.views();
        let web: IpAddr = "10.244.1.5".parse().unwrap();
        let viewer = live
            .subscribe(Watch::of([web]), 0, After::default())
            .unwrap();
        assert!(views.has_changed().unwrap());
        assert_eq!(views.borrow_and_update().ips(), [web]);
        drop(viewer);
        feed(&mut live, "10.244.1.5:40000", 5 * S);
        assert!(views.has_changed().unwrap());
        assert!(views.borrow_and_update().is_empty());
    }
}
