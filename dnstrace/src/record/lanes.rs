//! Several nodes' live streams as one time line (`dnstrace cluster`):
//! each stream is read as a recording is (`Replay`), on a thread of its
//! own, its times put on the first node's by the clocks the headers give,
//! its packets tagged with their node, as a merged replay does. What is
//! left of each node's clock error is estimated again every second from
//! the messages that crossed between nodes in the last ten, as `replay`
//! estimates it from a recording's first messages, and at once when a
//! message crosses backwards on the estimate (what is held is moved with
//! it, so a journey's legs keep the order they happened in). Inputs
//! wait in a reorder window until every node that is up has got past
//! them (a node has got as far as its last tick: its agent's conntrack
//! events come ahead of its ring), or until they have waited `window`:
//! a node that lags or is cut off holds the view back that long at most.
//! While a node is down, what is handed on follows a loss that covers it:
//! every journey of that time is incomplete, and the node's absence is
//! never a lookup lost between nodes. A node may join while the view runs
//! (`Joiner`): its name and pods reach the pipeline ahead of its inputs.
use std::{
    cmp::Reverse,
    collections::{BinaryHeap, VecDeque},
    io::{self, Read},
    net::IpAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Result;
use tokio::sync::mpsc;

use super::{
    merge::{
        crossed_backwards, errors, moved, shifted, Alignment, Clocks, Estimate, Recording, Sample,
    },
    pcapng::Reader,
    replay::{time_of, About, Replay, Speed},
};
use crate::{
    decode::{NodeId, Packet},
    pipeline::{Input, NodeStatus, Source},
    target::follow::{Joined, Refresh},
};

/// Chunks of a stream in flight to its reading thread.
const CHUNKS: usize = 64;
/// Inputs of all nodes in flight to the merge.
const INPUTS: usize = 4096;
/// Packets handed on at once.
const BATCH: usize = 1024;
/// How long the view waits for a node's first inputs.
const FIRST_WINDOW: Duration = Duration::from_secs(5);
/// How far before a tick a packet may still come after it: one whose
/// program took its time just before the tick and committed it to the
/// ring just after the agent read how far the ring had got.
const TICK_SLACK_NS: u64 = 1_000_000;
/// How often the clocks are estimated again, on the time line.
const ESTIMATE_NS: u64 = 1_000_000_000;
/// How far back the messages they are estimated on go.
const CROSSINGS_NS: i64 = 10_000_000_000;
/// A change of a clock's estimate worth a line in the log.
const SAID_NS: i64 = 1_000_000;
/// Estimates made out of turn, at most, in a second of the time line:
/// each is a pass over the last ten seconds' messages.
const RECHECKS: usize = 10;

/// What a node's lane says.
enum Event {
    Input(usize, Input),
    /// Its stream ended or was cut; why.
    Down(usize, String),
    /// Events its agent dropped for this view, more of them.
    Dropped(usize, u64),
    /// A node followed from now on: its lane, and what the view learns of
    /// it (the next lane's).
    Joined(Box<(NodeLane, Refresh)>),
}

/// A node as the view follows it.
struct NodeLane {
    node: String,
    up: bool,
    /// How far its stream has got, on the common time line: its last
    /// tick's time, less the slack.
    at_ns: u64,
    /// Events its agent dropped for this view.
    dropped: u64,
    /// What its times are moved by onto the first node's clock, by the
    /// headers' clocks.
    offset_ns: i64,
    /// What is left of its clock's error, as last estimated.
    error: Estimate,
}

/// One held input, in time order then arrival order.
type Held = Reverse<(u64, u64, usize)>;

/// What a held input's slot keeps.
struct Slot {
    input: Input,
    since: Instant,
    /// The lane it came by; none for the view's own.
    lane: Option<usize>,
}

pub struct Lanes {
    rx: mpsc::Receiver<Event>,
    nodes: Vec<NodeLane>,
    /// When each node went down, on the common time line.
    down_since: Vec<Option<u64>>,
    heap: BinaryHeap<Held>,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    seq: u64,
    window: Duration,
    /// How far what was released has got, and what was handed on.
    now_ns: u64,
    handed_ns: u64,
    ready: VecDeque<Input>,
    lost_total: u64,
    /// The messages each node saw lately, on the headers' clocks.
    crossings: Vec<Sample>,
    estimated_ns: u64,
    /// When the last estimates out of turn were made.
    rechecks: VecDeque<u64>,
}

/// What adds a lane for a node that joins the view while it runs: one,
/// which numbers the lanes it adds.
pub struct Joiner {
    next: usize,
    reference_ns: i64,
    tx: mpsc::Sender<Event>,
    ports: Vec<u16>,
}

/// What the commands side holds of one node: where its connections'
/// bytes go.
#[derive(Clone)]
pub struct LaneHandle {
    lane: usize,
    node: NodeId,
    shift_ns: i64,
    first: bool,
    tx: mpsc::Sender<Event>,
    ports: Vec<u16>,
    name: String,
}

impl Lanes {
    /// A lane for each recording (a node's stream, read as one: its
    /// `About` from the stream's first message), with a reorder window;
    /// and what adds more.
    pub fn new(
        recs: &[Recording],
        window: Duration,
        ports: &[u16],
    ) -> (Self, Vec<LaneHandle>, Joiner) {
        let (tx, rx) = mpsc::channel(INPUTS);
        let reference = recs.first().map_or(0, offset_of);
        let handles = recs
            .iter()
            .enumerate()
            .map(|(i, r)| LaneHandle {
                lane: i,
                // Numbered from 1 however many: more may join.
                node: NodeId(i as u16 + 1),
                shift_ns: offset_of(r) - reference,
                first: i == 0,
                tx: tx.clone(),
                ports: ports.to_vec(),
                name: r.node.clone(),
            })
            .collect::<Vec<_>>();
        let nodes = recs
            .iter()
            // Up from the start, at time 0: each holds the others back
            // until its first inputs come (its past, for `--since`), or
            // for the window at most.
            .map(|r| NodeLane {
                node: r.node.clone(),
                up: true,
                at_ns: 0,
                dropped: 0,
                offset_ns: offset_of(r) - reference,
                error: Estimate::default(),
            })
            .collect();
        let lanes = Self {
            rx,
            down_since: vec![None; recs.len()],
            nodes,
            heap: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            seq: 0,
            window,
            now_ns: 0,
            handed_ns: 0,
            ready: VecDeque::new(),
            lost_total: 0,
            crossings: recs.iter().map(|_| Sample::default()).collect(),
            estimated_ns: 0,
            rechecks: VecDeque::new(),
        };
        let joiner = Joiner {
            next: recs.len(),
            reference_ns: reference,
            tx,
            ports: ports.to_vec(),
        };
        (lanes, handles, joiner)
    }

    fn event(&mut self, ev: Event) {
        match ev {
            Event::Input(lane, input) => self.arrived(lane, input),
            Event::Joined(new) => self.joined(*new),
            Event::Down(lane, why) => {
                let n = &mut self.nodes[lane];
                if n.up {
                    log::warn!("node {} is down: {why}", n.node);
                }
                n.up = false;
                self.down_since[lane].get_or_insert(self.now_ns.max(n.at_ns));
            }
            Event::Dropped(lane, more) => {
                let n = &mut self.nodes[lane];
                let was = n.dropped;
                n.dropped += more;
                // Said as it doubles: a few lines however long it goes on.
                if was.leading_zeros() != n.dropped.leading_zeros() {
                    log::warn!(
                        "node {}'s agent dropped {} events for this view so far: it sends less than it sees (the view or the network is slow)",
                        n.node,
                        n.dropped
                    );
                }
                self.lost_total += more;
                // Since the last time it was sure to have everything.
                let since = self.now_ns.min(n.at_ns);
                self.ready.push_back(Input::Lost {
                    since_ns: since,
                    now_ns: self.now_ns.max(n.at_ns),
                    total: self.lost_total,
                });
            }
        }
    }

    /// A node's lane added: it holds the others back as the first ones
    /// did, until its first tick; what the view learns of it goes first.
    fn joined(&mut self, (node, refresh): (NodeLane, Refresh)) {
        log::info!("node {} joins the view", node.node);
        self.nodes.push(node);
        self.down_since.push(None);
        self.crossings.push(Sample::default());
        let now_ns = self.now_ns;
        self.hold(now_ns, Input::Pods { now_ns, refresh }, None);
    }

    fn arrived(&mut self, lane: usize, input: Input) {
        if !self.nodes[lane].up {
            log::info!("node {} is back", self.nodes[lane].node);
            self.nodes[lane].up = true;
            self.down_since[lane] = None;
        }
        if let Input::Packets(batch) = &input {
            self.sampled(lane, batch);
        }
        let input = shifted(input, -self.nodes[lane].error.error_ns);
        let at = time_of(&input).unwrap_or(0);
        // Only a tick says what came before it is all handed on: the
        // agent drains its ring up to each, while conntrack events,
        // counters and pod changes come as read, ahead of packets of the
        // same moment still in the ring.
        if let Input::Tick(now) = input {
            let n = &mut self.nodes[lane];
            n.at_ns = n.at_ns.max(now.saturating_sub(TICK_SLACK_NS));
            self.estimate(now);
        }
        match input {
            // Packet by packet: two nodes' batches interleave in time.
            Input::Packets(batch) => batch
                .into_iter()
                .for_each(|p| self.hold(p.ts_ns, Input::Packets(vec![p]), Some(lane))),
            other => self.hold(at, other, Some(lane)),
        }
    }

    /// A lane's packets added to its messages; the clocks estimated again
    /// at once if one of them crossed backwards on them. Both ends of
    /// that crossing are still held (a node's tick says all before it,
    /// less the slack, came), so the journey is put in order.
    fn sampled(&mut self, lane: usize, batch: &[Packet]) {
        let sample = &mut self.crossings[lane];
        batch.iter().for_each(|p| sample.add(p, 0, i64::MIN));
        let errors: Vec<i64> = self.nodes.iter().map(|n| n.error.error_ns).collect();
        let backwards = batch
            .iter()
            .filter(|p| crossed_backwards(&self.crossings, &errors, lane, p));
        if let Some(p) = backwards.last() {
            let now = p.ts_ns;
            if self.recheck_at(now) {
                self.estimate_at(now);
            }
        }
    }

    /// Whether an estimate out of turn may be made at `now_ns`: fewer than
    /// `RECHECKS` in the second before it.
    fn recheck_at(&mut self, now_ns: u64) -> bool {
        let full = self.rechecks.len() >= RECHECKS;
        if full && self.rechecks[0].saturating_add(ESTIMATE_NS) > now_ns {
            return false;
        }
        if full {
            self.rechecks.pop_front();
        }
        self.rechecks.push_back(now_ns);
        true
    }

    /// Each node's clock error again, once a second, from the messages
    /// that crossed between nodes lately; a node none crossed to lately
    /// keeps its last.
    fn estimate(&mut self, now_ns: u64) {
        if now_ns >= self.estimated_ns.saturating_add(ESTIMATE_NS) {
            self.estimate_at(now_ns);
        }
    }

    fn estimate_at(&mut self, now_ns: u64) {
        self.estimated_ns = now_ns;
        let from = i64::try_from(now_ns).unwrap_or(i64::MAX) - CROSSINGS_NS;
        self.crossings
            .iter_mut()
            .for_each(|s| s.forget_before(from));
        let found = errors(&self.crossings, self.nodes.len());
        let mut by = vec![0; self.nodes.len()];
        for (i, e) in found.into_iter().enumerate().skip(1) {
            let Some(e) = e else { continue };
            let was = self.nodes[i].error;
            self.nodes[i].error = e;
            by[i] = was.error_ns - e.error_ns;
            if was.pairs == 0 || (e.error_ns - was.error_ns).abs() >= SAID_NS {
                log::info!("{}", self.alignment(i).describe(false));
            }
        }
        if by.iter().any(|&b| b != 0) {
            self.moved_by(&by);
        }
    }

    /// What is held of each lane, and how far it has got, moved by its
    /// estimate's change (`by[lane]` later): one clock for a node's
    /// inputs, whether they came before the estimate or after.
    fn moved_by(&mut self, by: &[i64]) {
        for (n, &b) in self.nodes.iter_mut().zip(by) {
            // 0 is a node yet to tick.
            if n.at_ns > 0 {
                n.at_ns = n.at_ns.saturating_add_signed(b).max(1);
            }
        }
        let held = std::mem::take(&mut self.heap).into_vec();
        let slots = &mut self.slots;
        self.heap = held
            .into_iter()
            .map(|Reverse((at, seq, slot))| {
                let Some(s) = slots[slot].take() else {
                    return Reverse((at, seq, slot));
                };
                let b = s.lane.map_or(0, |l| by[l]);
                let input = shifted(s.input, b);
                let at = time_of(&input).unwrap_or(at);
                slots[slot] = Some(Slot { input, ..s });
                Reverse((at, seq, slot))
            })
            .collect();
    }

    /// How node `i`'s times are put on the first node's.
    fn alignment(&self, i: usize) -> Alignment {
        let n = &self.nodes[i];
        Alignment {
            node: n.node.clone(),
            shift_ns: n.offset_ns - n.error.error_ns,
            error_ns: n.error.error_ns,
            pairs: n.error.pairs,
            against: n.error.against.map(|a| self.nodes[a].node.clone()),
        }
    }

    /// How every node's times are put on the first node's, estimated
    /// once more from the messages of the last seconds.
    pub fn clocks(&mut self) -> Clocks {
        self.estimate_at(self.estimated_ns.max(self.now_ns));
        Clocks((0..self.nodes.len()).map(|i| self.alignment(i)).collect())
    }

    fn hold(&mut self, at: u64, input: Input, lane: Option<usize>) {
        let held = Some(Slot {
            input,
            since: Instant::now(),
            lane,
        });
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s] = held;
                s
            }
            None => {
                self.slots.push(held);
                self.slots.len() - 1
            }
        };
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, slot)));
    }

    /// Where every node that is up has got: what is older is in order.
    fn watermark(&self) -> Option<u64> {
        self.nodes.iter().filter(|n| n.up).map(|n| n.at_ns).min()
    }

    /// Moves what is in order, or has waited its window, to `ready`;
    /// while a node is down, after a loss that covers it.
    fn release(&mut self) {
        let mark = self.watermark();
        let window = self.window();
        let mut out: Vec<Input> = Vec::new();
        let mut packets: Vec<Packet> = Vec::new();
        let start = self.now_ns;
        while let Some(Reverse((at, _, slot))) = self.heap.peek().copied() {
            let waited = self.slots[slot]
                .as_ref()
                .is_some_and(|s| s.since.elapsed() >= window);
            if !(mark.is_none_or(|m| at <= m) || waited) {
                break;
            }
            self.heap.pop();
            let Some(Slot { input, .. }) = self.slots[slot].take() else {
                continue;
            };
            self.free.push(slot);
            self.now_ns = self.now_ns.max(at);
            match input {
                Input::Packets(b) if packets.len() < BATCH => packets.extend(b),
                other => {
                    if !packets.is_empty() {
                        out.push(Input::Packets(std::mem::take(&mut packets)));
                    }
                    out.push(other);
                }
            }
        }
        if !packets.is_empty() {
            out.push(Input::Packets(packets));
        }
        if out.is_empty() {
            return;
        }
        // Every journey of these may have had legs on a node down.
        if let Some(since) = self.down_since.iter().flatten().min() {
            self.ready.push_back(Input::Lost {
                since_ns: (*since).min(start),
                now_ns: self.now_ns,
                total: self.lost_total,
            });
        }
        self.ready.extend(out);
    }

    /// When the oldest input held has waited its window.
    fn deadline(&self) -> Option<Instant> {
        let Reverse((_, _, slot)) = self.heap.peek()?;
        let window = self.window();
        self.slots[*slot].as_ref().map(|s| s.since + window)
    }

    /// How long an input waits for the nodes behind it: longer for a node
    /// yet to say anything (its past coming) than for one that lags.
    fn window(&self) -> Duration {
        if self.nodes.iter().any(|n| n.up && n.at_ns == 0) {
            self.window.max(FIRST_WINDOW)
        } else {
            self.window
        }
    }
}

impl Source for Lanes {
    fn now(&self) -> u64 {
        self.handed_ns
    }

    async fn next(&mut self) -> Result<Option<Input>> {
        loop {
            if let Some(input) = self.ready.pop_front() {
                self.handed_ns = self.handed_ns.max(time_of(&input).unwrap_or(0));
                return Ok(Some(input));
            }
            let wait = self.deadline().map(tokio::time::Instant::from_std);
            let ev = match wait {
                Some(at) => tokio::select! {
                    ev = self.rx.recv() => ev,
                    () = tokio::time::sleep_until(at) => {
                        self.release();
                        continue;
                    }
                },
                None => self.rx.recv().await,
            };
            // Every lane's sender is held by its handle, and the joiner
            // holds one: None never comes while the view runs.
            let Some(ev) = ev else { return Ok(None) };
            self.event(ev);
            while let Ok(more) = self.rx.try_recv() {
                self.event(more);
            }
            self.release();
        }
    }

    fn rest(&mut self) -> Vec<Input> {
        let mut rest: Vec<Input> = self.ready.drain(..).collect();
        while let Some(Reverse((_, _, slot))) = self.heap.pop() {
            rest.extend(self.slots[slot].take().map(|s| s.input));
        }
        rest
    }

    fn nodes(&self) -> Vec<NodeStatus> {
        let ahead = self.nodes.iter().map(|n| n.at_ns).max().unwrap_or(0);
        self.nodes
            .iter()
            .map(|n| NodeStatus {
                name: n.node.clone(),
                up: n.up,
                lag_ns: ahead.saturating_sub(n.at_ns),
                offset_ns: n.offset_ns - n.error.error_ns,
                dropped: n.dropped,
            })
            .collect()
    }
}

fn offset_of(r: &Recording) -> i64 {
    r.about.header.as_ref().map_or(0, |h| h.clock_offset_ns)
}

impl Joiner {
    /// A lane for `r` (a node's stream, read as one), the next after the
    /// last; the node and its pods named to the pipeline before its
    /// inputs.
    pub async fn join(&mut self, r: &Recording) -> LaneHandle {
        let lane = self.next;
        self.next += 1;
        let handle = LaneHandle {
            lane,
            node: NodeId(lane as u16 + 1),
            shift_ns: offset_of(r) - self.reference_ns,
            first: false,
            tx: self.tx.clone(),
            ports: self.ports.clone(),
            name: r.node.clone(),
        };
        let node = NodeLane {
            node: r.node.clone(),
            up: true,
            at_ns: 0,
            dropped: 0,
            offset_ns: handle.shift_ns,
            error: Estimate::default(),
        };
        let refresh = joined(r, handle.node);
        let _ = self.tx.send(Event::Joined(Box::new((node, refresh)))).await;
        handle
    }
}

/// What the view learns of a node that joins: its pods' names (its own
/// word on them), homes and routes, and the resolvers and services it
/// knows.
fn joined(r: &Recording, node: NodeId) -> Refresh {
    let (labels, cx) = (&r.about.labels, &r.about.context);
    let own = |ip: &IpAddr| cx.attachments.contains_key(ip);
    Refresh {
        names: (labels.names.iter())
            .filter(|(ip, _)| own(ip))
            .map(|(ip, n)| (*ip, n.clone()))
            .collect(),
        workloads: (labels.workloads.iter())
            .filter(|(ip, _)| own(ip))
            .map(|(ip, w)| (*ip, w.clone()))
            .collect(),
        joined: Some(Box::new(Joined {
            id: node.0,
            name: r.node.clone(),
            attachments: cx.attachments.clone(),
            routes: cx.routes.clone(),
            resolvers: cx.resolvers.clone(),
            service_ips: cx.service_ips.clone(),
            node_netns: cx.node_netns,
        })),
        ..Refresh::default()
    }
}

impl LaneHandle {
    /// A new connection of the node's: its bytes, the first message's
    /// first, are read on a thread of their own until the connection's
    /// sender is dropped.
    pub fn connected(&self, first: Vec<u8>) -> io::Result<mpsc::Sender<Vec<u8>>> {
        let (tx, rx) = mpsc::channel(CHUNKS);
        let about = About::scan(
            Reader::new(io::Cursor::new(&first)).map_err(io::Error::other)?,
            &PathBuf::from(&self.name),
        )
        .map_err(io::Error::other)?;
        let reader = Reader::new(Chunks {
            rx,
            at: io::Cursor::new(first),
        })
        .map_err(io::Error::other)?;
        let mut replay = Replay::with_reader(
            &PathBuf::from(&self.name),
            reader,
            &about,
            self.ports.clone(),
            Speed::Fast,
        );
        let this = self.clone();
        std::thread::Builder::new()
            .name(format!("lane-{}", self.lane))
            .spawn(move || {
                while let Some(input) = replay.next_input() {
                    let input = moved(input, this.shift_ns, this.node, this.first);
                    if this
                        .tx
                        .blocking_send(Event::Input(this.lane, input))
                        .is_err()
                    {
                        return;
                    }
                }
                let why = replay
                    .error
                    .take()
                    .map_or_else(|| "its stream ended".to_owned(), |e| format!("{e:#}"));
                let _ = this.tx.blocking_send(Event::Down(this.lane, why));
            })?;
        Ok(tx)
    }

    /// The node could not be reached, or its stream failed.
    pub async fn down(&self, why: String) {
        let _ = self.tx.send(Event::Down(self.lane, why)).await;
    }

    /// Its agent dropped `more` events for this view.
    pub async fn dropped(&self, more: u64) {
        let _ = self.tx.send(Event::Dropped(self.lane, more)).await;
    }
}

/// The bytes of a connection's messages, read as one stream.
struct Chunks {
    rx: mpsc::Receiver<Vec<u8>>,
    at: io::Cursor<Vec<u8>>,
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let n = self.at.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            match self.rx.blocking_recv() {
                Some(next) => self.at = io::Cursor::new(next),
                // The connection ended: so does the stream.
                None => return Ok(0),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::{
        clock::Clock,
        correlate::Limits,
        decode::KernelNames,
        diagnose::Context,
        output::Labels,
        pipeline::Tap as _,
        record::{tests::query, Recorder},
    };
    use dnstrace_common::Hook;

    /// A writer whose bytes the test takes.
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Shared {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    const MS: u64 = 1_000_000;

    /// A node's stream: `web`'s queries at the times given (ms), then
    /// ticks at `tick` and just after (what says `tick` is all in).
    fn stream(times: &[u64], tick: u64) -> Vec<u8> {
        stream_on(Clock::EPOCH, times, tick)
    }

    /// The same from a node whose monotonic clock is `clock`'s.
    fn stream_on(clock: Clock, times: &[u64], tick: u64) -> Vec<u8> {
        let labels = Labels::new(Default::default(), clock, KernelNames::default());
        let meta = crate::record::meta(&labels, &Context::default(), Limits::default());
        let buf = Arc::new(Mutex::new(Vec::new()));
        let mut rec = Recorder::to_writer(Box::new(Shared(buf.clone())), meta).unwrap();
        rec.start(0);
        for &t in times {
            rec.input(&Input::Packets(vec![web_query(t)]));
        }
        rec.input(&Input::Tick(tick * MS));
        rec.input(&Input::Tick((tick + 2) * MS));
        rec.flush();
        let bytes = std::mem::take(&mut *buf.lock().unwrap());
        bytes
    }

    fn web_query(ms: u64) -> Packet {
        let name = format!("t{ms}.example.com");
        query("10.244.1.10:4000", "10.96.0.10:53", &name, ms * MS)
    }

    const US: u64 = 1_000;

    /// A leg of lookup `lookup` (its client's port less 4000) between web
    /// and a CoreDNS pod, at `us` on `node`: its query, or its `answer`.
    fn crossing_leg(lookup: u16, node: u16, us: u64, hook: Hook, answer: bool) -> Input {
        let client = format!("10.244.1.10:{}", 4000 + lookup);
        let mut p = query(&client, "10.244.3.53:53", "a.example.com", us * US);
        if answer {
            (p.src, p.dst) = (p.dst, p.src);
            let mut m = p.payload.to_vec();
            m[2] |= 0x80;
            p.payload = m.into();
        }
        p.hook = hook;
        p.node = NodeId(node);
        Input::Packets(vec![p])
    }

    /// Each of `arrivals` (a lane and its input) taken, then what is in
    /// order released, as `next` does with each event.
    fn feed(lanes: &mut Lanes, arrivals: impl IntoIterator<Item = (usize, Input)>) {
        for (lane, input) in arrivals {
            lanes.event(Event::Input(lane, input));
            lanes.release();
        }
    }

    /// The packets released so far, with their nodes, times in `unit`s.
    fn released(lanes: &Lanes, unit: u64) -> Vec<(u64, u16)> {
        let packets = lanes.ready.iter().filter_map(|i| match i {
            Input::Packets(b) => Some(b.iter().map(|p| (p.ts_ns / unit, p.node.0))),
            _ => None,
        });
        packets.flatten().collect()
    }

    fn recording(node: &str, bytes: &[u8]) -> Recording {
        let path = PathBuf::from(node);
        let about = About::scan(Reader::new(io::Cursor::new(bytes)).unwrap(), &path).unwrap();
        Recording {
            path,
            about,
            node: node.into(),
        }
    }

    /// Packets of the merged line (ms), with their nodes, and the losses
    /// (as `(0, 0)`), up to a tick at `until` ms.
    async fn drain(lanes: &mut Lanes, until: u64) -> Vec<(u64, u16)> {
        let mut seen = Vec::new();
        loop {
            let next = tokio::time::timeout(Duration::from_secs(10), lanes.next());
            match next.await.expect("inputs in time").unwrap() {
                Some(Input::Packets(b)) => seen.extend(b.iter().map(|p| (p.ts_ns / MS, p.node.0))),
                Some(Input::Lost { .. }) => seen.push((0, 0)),
                Some(Input::Tick(t)) if t >= until * MS => return seen,
                _ => {}
            }
        }
    }

    /// Node b's packet came before node a's second, though its stream
    /// came after all of a's: the line is in time order, each packet
    /// tagged with its node.
    #[tokio::test]
    async fn two_nodes_streams_make_one_line_in_time_order() {
        let (a, b) = (stream(&[100, 300], 400), stream(&[150], 400));
        let recs = [recording("a", &a), recording("b", &b)];
        let (mut lanes, handles, _) = Lanes::new(&recs, Duration::from_secs(5), &[53]);
        let _a = handles[0].connected(a).unwrap();
        // a is all in before b says anything.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _b = handles[1].connected(b).unwrap();
        let seen = drain(&mut lanes, 400).await;
        assert_eq!(seen, [(100, 1), (150, 2), (300, 1)]);
    }

    /// Node b booted a microsecond before a: its monotonic times are a's
    /// plus one. Its packet is put on a's clock by the headers' clocks,
    /// between a's two; and the view says how its times were moved.
    #[tokio::test]
    async fn a_node_whose_clock_is_ahead_is_put_on_the_first_nodes() {
        let a = stream_on(Clock::with_offset(10_000 * MS as i64), &[100, 300], 400);
        let b = stream_on(Clock::with_offset(9_000 * MS as i64), &[1_150], 1_400);
        let recs = [recording("a", &a), recording("b", &b)];
        let (mut lanes, handles, _) = Lanes::new(&recs, Duration::from_secs(5), &[53]);
        let _a = handles[0].connected(a).unwrap();
        let _b = handles[1].connected(b).unwrap();
        let seen = drain(&mut lanes, 400).await;
        assert_eq!(seen, [(100, 1), (150, 2), (300, 1)]);
        let offsets: Vec<i64> = lanes.nodes().iter().map(|n| n.offset_ns).collect();
        assert_eq!(offsets, [0, -1_000 * MS as i64]);
    }

    /// Node a's agent read a conntrack event of 500 ms before its packet
    /// of 100 ms left its ring (ctnetlink is read at once, the ring on
    /// ticks), and b's packet of 150 ms came between: the event does not
    /// say a has got to 500 ms, its next tick does, and the line is in
    /// time order.
    #[test]
    fn a_conntrack_event_read_ahead_of_the_ring_holds_nothing_back_out_of_order() {
        let recs = [
            recording("a", &stream(&[], 0)),
            recording("b", &stream(&[], 0)),
        ];
        let (mut lanes, _handles, _) = Lanes::new(&recs, Duration::from_secs(5), &[53]);
        let on = |node: u16, ms: u64| {
            let mut p = web_query(ms);
            p.node = NodeId(node);
            Input::Packets(vec![p])
        };
        // What the event says does not matter here, only when it comes.
        let event = Input::Conntrack {
            now_ns: 500 * MS,
            events: Vec::new(),
        };
        let arrivals = [
            (0, event),
            (1, on(2, 150)),
            (1, Input::Tick(600 * MS)),
            (0, on(1, 100)),
            (0, Input::Tick(600 * MS)),
        ];
        feed(&mut lanes, arrivals);
        assert_eq!(released(&lanes, MS), [(100, 1), (150, 2)]);
    }

    /// Node b's kernel clock runs 3 ms ahead of a's, which the headers
    /// do not show (their clocks agree). A query crossed from a to b and
    /// its answer back, 100 µs each way: a second on, the view has found
    /// b 3 ms ahead from them, and puts b's later packets 3 ms back.
    #[test]
    fn a_clock_error_the_headers_miss_is_found_from_messages_that_crossed() {
        let recs = [
            recording("a", &stream(&[], 0)),
            recording("b", &stream(&[], 0)),
        ];
        let (mut lanes, _handles, _) = Lanes::new(&recs, Duration::from_secs(5), &[53]);
        let leg = |node, us, hook, answer| crossing_leg(0, node, us, hook, answer);
        let arrivals = [
            (0, leg(1, 100_000, Hook::TcEgress, false)),
            (1, leg(2, 103_100, Hook::TcIngress, false)),
            (1, leg(2, 103_200, Hook::TcEgress, true)),
            (0, leg(1, 100_300, Hook::TcIngress, true)),
            (1, Input::Tick(1_003_000 * US)),
            (0, Input::Tick(1_000_000 * US)),
            (1, leg(2, 1_203_000, Hook::TcEgress, false)),
        ];
        for (lane, input) in arrivals {
            lanes.event(Event::Input(lane, input));
        }
        let clocks = lanes.clocks();
        let b = &clocks.0[1];
        assert_eq!((b.error_ns, b.pairs), (3_000_000, 2));
        assert_eq!(b.against.as_deref(), Some("a"));
        assert_eq!(lanes.nodes()[1].offset_ns, -3_000_000);
        let last = lanes.rest().into_iter().filter_map(|i| match i {
            Input::Packets(b) => b.last().map(|p| p.ts_ns),
            _ => None,
        });
        assert_eq!(last.max(), Some(1_200_000 * US));
    }

    /// A's and b's clocks agree, but the first lookup's query took 150 µs
    /// to cross and its answer 10: b was estimated 70 µs ahead. The
    /// second lookup crossed in 10 µs each way, which on that estimate is
    /// its query arriving before it left. Its crossings put the estimate
    /// right before its legs go on: they come in the order they happened.
    #[test]
    fn a_crossing_that_disproves_the_estimate_is_in_order_all_the_same() {
        let recs = [
            recording("a", &stream(&[], 0)),
            recording("b", &stream(&[], 0)),
        ];
        let (mut lanes, _handles, _) = Lanes::new(&recs, Duration::from_secs(5), &[53]);
        let leg = crossing_leg;
        let first = [
            (0, leg(0, 1, 100_000, Hook::TcEgress, false)),
            (1, leg(0, 2, 100_150, Hook::TcIngress, false)),
            (1, leg(0, 2, 100_200, Hook::TcEgress, true)),
            (0, leg(0, 1, 100_210, Hook::TcIngress, true)),
            (1, Input::Tick(1_000_000 * US)),
            (0, Input::Tick(1_000_000 * US)),
        ];
        feed(&mut lanes, first);
        assert_eq!(lanes.nodes()[1].offset_ns, -70_000);
        lanes.ready.clear();
        // b's ends come first, as they may: a's agent sends later.
        let second = [
            (1, leg(1, 2, 1_100_010, Hook::TcIngress, false)),
            (1, leg(1, 2, 1_100_050, Hook::TcEgress, true)),
            (0, leg(1, 1, 1_100_000, Hook::TcEgress, false)),
            (0, leg(1, 1, 1_100_060, Hook::TcIngress, true)),
            (1, Input::Tick(1_200_000 * US)),
            (0, Input::Tick(1_200_000 * US)),
        ];
        feed(&mut lanes, second);
        let seen = released(&lanes, US);
        let nodes: Vec<u16> = seen.iter().map(|s| s.1).collect();
        assert_eq!(nodes, [1, 2, 2, 1], "{seen:?}");
        assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
        // Each way's least delay is now 10 µs: b's clock is a's.
        assert_eq!(lanes.nodes()[1].offset_ns, 0);
    }

    /// Estimates out of turn are bounded: ten in a second of the time
    /// line, then none until the first of them is a second old.
    #[test]
    fn estimates_out_of_turn_are_at_most_ten_a_second() {
        let recs = [recording("a", &stream(&[], 0))];
        let (mut lanes, _handles, _) = Lanes::new(&recs, Duration::from_secs(5), &[53]);
        let allowed = (0..20).filter(|i| lanes.recheck_at(i * MS)).count();
        assert_eq!(allowed, RECHECKS);
        assert!(!lanes.recheck_at(999 * MS));
        assert!(lanes.recheck_at(1_000 * MS));
    }

    /// Node c joins after a's and b's first inputs are out: the pipeline
    /// learns its name and number before its packet, which is tagged 3
    /// and comes in time order after a's and b's.
    #[tokio::test]
    async fn a_node_that_joins_is_named_before_its_packets() {
        let (a, b) = (stream(&[100, 300], 400), stream(&[150], 400));
        let recs = [recording("a", &a), recording("b", &b)];
        let (mut lanes, handles, mut joiner) = Lanes::new(&recs, Duration::from_millis(50), &[53]);
        let _a = handles[0].connected(a).unwrap();
        let _b = handles[1].connected(b).unwrap();
        assert_eq!(drain(&mut lanes, 400).await, [(100, 1), (150, 2), (300, 1)]);
        let c = stream(&[450], 600);
        let handle = joiner.join(&recording("c", &c)).await;
        let _c = handle.connected(c).unwrap();
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let next = tokio::time::timeout(Duration::from_secs(10), lanes.next());
            match next.await.expect("inputs in time").unwrap() {
                Some(Input::Pods { refresh, .. }) => {
                    let j = refresh.joined.expect("a node joined");
                    seen.push(format!("{} joined as {}", j.name, j.id));
                }
                Some(Input::Packets(b)) => seen.extend(
                    b.iter()
                        .map(|p| format!("{} ms on {}", p.ts_ns / MS, p.node.0)),
                ),
                _ => {}
            }
        }
        assert_eq!(seen, ["c joined as 3", "450 ms on 3"]);
        assert_eq!(lanes.nodes().len(), 3);
    }

    /// A node down: what is handed on while it is follows a loss (the
    /// journeys then are incomplete, never lost between nodes).
    #[tokio::test]
    async fn what_comes_while_a_node_is_down_follows_a_loss() {
        let a = stream(&[100], 200);
        let recs = [recording("a", &a), recording("b", &stream(&[], 200))];
        let (mut lanes, handles, _) = Lanes::new(&recs, Duration::from_secs(5), &[53]);
        // b's agent is not reached at all.
        handles[1].down("cut".into()).await;
        let _a = handles[0].connected(a).unwrap();
        let seen = drain(&mut lanes, 200).await;
        // A loss first; one before each release, however they fall.
        assert_eq!(seen.first(), Some(&(0, 0)), "{seen:?}");
        let packets: Vec<_> = seen.iter().filter(|s| s.0 > 0).collect();
        assert_eq!(packets, [&(100, 1)]);
    }
}
