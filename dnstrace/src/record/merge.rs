//! `dnstrace replay node1.pcapng node2.pcapng …`: recordings made on
//! several nodes replayed as one, so that a lookup that crossed nodes (a
//! client on one, the CoreDNS pod that answered on another) is one journey.
//! A file mergecap made of several nodes' recordings is those recordings
//! (`About::read_each`), each a replay of its own interfaces.
//!
//! One time line: each file's kernel times are put on the first file's by
//! the clocks its header gives (`clock_offset_ns`, wall less monotonic),
//! then corrected by how far its wall clock was found off. That is
//! estimated as NTP does, from messages seen leaving one node and arriving
//! on another, both ways, with the least delay each way (the one least
//! held up in queues). A file no message crossed to or from keeps its
//! wall clock as it was.
//!
//! One order: a k-way merge hands inputs on by time, packet by packet,
//! holding one batch of each file at a time. Each packet is tagged with its
//! node (`NodeId`): two nodes' namespace inodes and device indexes are
//! their own numbers, and may be the same.
//!
//! What stays each node's own: a sampling change carries its node, as each
//! kernel had its own level (`correlate::sampling`: a journey must pass
//! every node's). Conntrack events and counters are a node's, but name
//! addresses the cluster gives once (pod addresses), so they reach the
//! journeys they are about as they are; an anomaly from a node's counters
//! does not say which node. Events lost on any node mark every journey
//! open then incomplete: one that crossed nodes may miss legs there. The
//! target is the first file's, and so are its moves.
use std::{
    collections::{HashMap, VecDeque},
    fs::File,
    io::{BufReader, Read},
    net::SocketAddr,
    path::{Path, PathBuf},
};

use anyhow::{bail, Result};
use dnstrace_common::Direction;
use serde::Serialize;

use super::replay::{time_of, About, Pacer, Replay, Speed};
use crate::{
    decode::{NodeId, Packet, Transport},
    diagnose::Context,
    output::Labels,
    pipeline::{Input, Source},
};

/// Packets handed over at once, as a single file's replay does.
const BATCH: usize = 1024;
/// Messages sampled from each file to estimate its clock, at most: many
/// times what a least delay needs, and reading the whole of a large file
/// for it costs as much again as its replay's own reading.
const MAX_SAMPLE: usize = 10_000;
/// A message seen over a longer span in one file is not one crossing (a
/// retry under the same id and ports).
const MAX_SPAN_NS: i64 = 1_000_000_000;

/// One recording of a merged replay, and the node it was made on.
pub struct Recording {
    pub path: PathBuf,
    pub about: About,
    /// Its header's name for the node, or the file's.
    pub node: String,
}

impl Recording {
    /// Reads what each file says about itself, one recording each, or
    /// several where mergecap merged them into one (each a replay of its
    /// own interfaces), and names its node: the header's name, or the
    /// file's where the header has none or another recording claims the
    /// same (nodes that share a host name, as the lab's).
    pub fn read_all(paths: &[PathBuf]) -> Result<Vec<Self>> {
        let mut recs = Vec::new();
        for path in paths {
            recs.extend(About::read_each(path)?.into_iter().map(|about| Self {
                path: path.clone(),
                about,
                node: String::new(),
            }));
        }
        refuse_twice(&recs)?;
        let claimed = |name: &str| {
            let headers = recs.iter().filter_map(|r| r.about.header.as_ref());
            headers.filter(|h| h.node_name() == name).count()
        };
        let names: Vec<String> = recs
            .iter()
            .map(|r| match &r.about.header {
                Some(h) if !h.node_name().is_empty() && claimed(h.node_name()) == 1 => {
                    h.node_name().to_owned()
                }
                _ => stem(&r.path),
            })
            .collect();
        for (r, name) in recs.iter_mut().zip(names) {
            r.node = name;
        }
        for i in 0..recs.len() {
            if recs[..i].iter().any(|r| r.node == recs[i].node) {
                // A file's second recording is its stem's #2.
                let before = recs[..i].iter().filter(|r| r.path == recs[i].path).count();
                recs[i].node = match before {
                    0 => recs[i].path.display().to_string(),
                    n => format!("{} #{}", stem(&recs[i].path), n + 1),
                };
            }
        }
        Ok(recs)
    }

    fn clock_offset_ns(&self) -> i64 {
        self.about.header.as_ref().map_or(0, |h| h.clock_offset_ns)
    }
}

fn stem(path: &Path) -> String {
    path.file_stem().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    )
}

/// The same recording given twice (the same file, or parts of one
/// capture) would be replayed as two nodes: every lookup twice.
fn refuse_twice(recs: &[Recording]) -> Result<()> {
    // One file's several recordings are each their own.
    let same_file = |a: &Recording, b: &Recording| {
        let (x, y) = (a.path.canonicalize(), b.path.canonicalize());
        matches!((x, y), (Ok(x), Ok(y)) if x == y) && a.about.recording == b.about.recording
    };
    let same_capture = |a: &Recording, b: &Recording| match (&a.about.header, &b.about.header) {
        (Some(x), Some(y)) => x.same_capture(y),
        _ => false,
    };
    for (i, a) in recs.iter().enumerate() {
        for b in &recs[..i] {
            if same_file(a, b) || same_capture(a, b) {
                bail!(
                    "{} and {} are the same node's capture: give each node's recording once",
                    b.path.display(),
                    a.path.display()
                );
            }
        }
    }
    Ok(())
}

/// What the recordings say together: the first's header, context and
/// limits, with the names and resolvers every node knew (the first's
/// where two differ, but a pod's own node's for its address: another node
/// knows it as a service's endpoint at best). Drop locations are kernel addresses, the same only
/// on the same kernel build: a node's may be named after another's.
pub fn about(recs: &[Recording]) -> About {
    let mut about = recs[0].about.clone();
    for r in &recs[1..] {
        let (l, c) = (&r.about.labels, &r.about.context);
        for (ip, name) in &l.names {
            about
                .labels
                .names
                .entry(*ip)
                .or_insert_with(|| name.clone());
        }
        for (ip, w) in &l.workloads {
            about
                .labels
                .workloads
                .entry(*ip)
                .or_insert_with(|| w.clone());
        }
        for (ip, a) in &c.attachments {
            about
                .context
                .attachments
                .entry(*ip)
                .or_insert_with(|| a.clone());
        }
        for (at, name) in &r.about.locations {
            about.locations.entry(*at).or_insert_with(|| name.clone());
        }
        extend_new(&mut about.labels.drop_reasons, &l.drop_reasons);
        extend_new(&mut about.context.service_ips, &c.service_ips);
        extend_new(&mut about.context.resolvers, &c.resolvers);
    }
    for r in recs {
        let (l, c) = (&r.about.labels, &r.about.context);
        let own = c
            .attachments
            .keys()
            .filter_map(|ip| Some((*ip, l.names.get(ip)?)));
        for (ip, name) in own {
            about.labels.names.insert(ip, name.clone());
        }
    }
    about
}

/// What the rules know, as [`about`] gives it; with several nodes, their
/// names, the node each pod address lives on (its own recording's pods),
/// and each node's own routes.
pub fn context(recs: &[Recording]) -> Context {
    match recs {
        [_] => about(recs).context(),
        _ => numbered_context(recs),
    }
}

/// [`context`] with each node numbered from 1, one alone too (a cluster
/// view's, which more may join).
pub fn numbered_context(recs: &[Recording]) -> Context {
    let mut cx = about(recs).context();
    cx.nodes = recs.iter().map(|r| r.node.clone()).collect();
    for (i, r) in recs.iter().enumerate() {
        let node = NodeId(i as u16 + 1);
        for ip in r.about.context.attachments.keys() {
            cx.homes.entry(*ip).or_insert(node);
        }
    }
    let numbered = || (recs.iter().enumerate()).map(|(i, r)| (NodeId(i as u16 + 1), r));
    cx.routes = numbered()
        .map(|(id, r)| (id, r.about.context.routes.clone()))
        .collect();
    cx.node_namespaces = numbered()
        .map(|(id, r)| (id, r.about.context.node_netns))
        .collect();
    cx
}

fn extend_new<T: Clone + PartialEq>(to: &mut Vec<T>, from: &[T]) {
    for x in from {
        if !to.contains(x) {
            to.push(x.clone());
        }
    }
}

/// Names as [`about`] gives them, and each leg's node where there are
/// several.
pub fn labels(recs: &[Recording]) -> Labels {
    match recs {
        [_] => about(recs).labels(),
        _ => numbered_labels(recs),
    }
}

/// [`labels`] naming each node, one alone too.
pub fn numbered_labels(recs: &[Recording]) -> Labels {
    let nodes = recs.iter().map(|r| r.node.clone()).collect();
    about(recs).labels().with_nodes(nodes)
}

/// How one file's times were put on the first file's.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Alignment {
    pub node: String,
    /// Added to its kernel times: its clock offset less the first file's,
    /// less `error_ns`.
    #[serde(skip)]
    pub shift_ns: i64,
    /// How far its wall clock was found ahead of the first file's.
    #[serde(rename = "offset_us", serialize_with = "micros")]
    pub error_ns: i64,
    /// Messages it was estimated on, both ways.
    pub pairs: usize,
    /// The node it was estimated against; none for the first file, and
    /// for one no message crossed to or from.
    pub against: Option<String>,
}

fn micros<S: serde::Serializer>(ns: &i64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(*ns as f64 / 1e3)
}

impl Alignment {
    /// A line for stderr; `reference` for the first file's.
    pub(super) fn describe(&self, reference: bool) -> String {
        let us = self.error_ns as f64 / 1e3;
        match &self.against {
            Some(to) => format!(
                "{}: clock {us:+.1} µs off {to}'s, from {} messages that crossed between them",
                self.node, self.pairs
            ),
            None if reference => format!("{}: the reference clock", self.node),
            None => format!(
                "{}: clock taken as it was (offset 0 µs): no message seen crossing both ways to or from another node",
                self.node
            ),
        }
    }
}

/// The clocks of all files, the first file's the reference.
pub struct Clocks(pub Vec<Alignment>);

impl Clocks {
    /// Estimates each file's clock against the first's (through any file
    /// already estimated): a first pass over each file.
    pub fn estimate(recs: &[Recording], ports: &[u16]) -> Result<Self> {
        let samples = match recs {
            [_] => Vec::new(),
            _ => {
                let from = common_start(recs, ports)?;
                recs.iter()
                    .map(|r| Sample::read(r, ports, from))
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let errors = errors(&samples, recs.len());
        let base = recs[0].clock_offset_ns();
        let aligned = recs.iter().zip(errors).map(|(r, e)| {
            let e = e.unwrap_or_default();
            Alignment {
                node: r.node.clone(),
                shift_ns: r.clock_offset_ns() - base - e.error_ns,
                error_ns: e.error_ns,
                pairs: e.pairs,
                against: e.against.map(|i| recs[i].node.clone()),
            }
        });
        Ok(Self(aligned.collect()))
    }

    /// Says how the clocks were aligned, where there is more than one:
    /// a line each on stderr, and with `json` all of them in one line.
    pub fn print(&self, json: bool) {
        if self.0.len() < 2 {
            return;
        }
        for (i, a) in self.0.iter().enumerate() {
            eprintln!("dnstrace: {}", a.describe(i == 0));
        }
        if json {
            let line = serde_json::json!({"event": "clocks", "nodes": self.0});
            eprintln!("{line}");
        }
    }
}

/// A file's clock error against the first file's.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(super) struct Estimate {
    pub error_ns: i64,
    /// Messages it was estimated on.
    pub pairs: usize,
    /// The file it was estimated against.
    pub against: Option<usize>,
}

/// Each of `n` files' clock error against the first's, estimated against
/// any file already estimated; none where no messages crossed both ways.
pub(super) fn errors(samples: &[Sample], n: usize) -> Vec<Option<Estimate>> {
    let mut found = vec![None; n];
    found[0] = Some(Estimate::default());
    let m = samples.len();
    loop {
        let next = (0..m).filter(|&j| found[j].is_none()).find_map(|j| {
            (0..m).find_map(|i| {
                let base = found[i]?.error_ns;
                let (skew, pairs) = skew(&samples[i], &samples[j])?;
                let e = Estimate {
                    error_ns: base + skew,
                    pairs,
                    against: Some(i),
                };
                Some((j, e))
            })
        });
        let Some((j, e)) = next else {
            return found;
        };
        found[j] = Some(e);
    }
}

/// A DNS message as the wire shows it between two nodes: the same
/// addresses, ports and id at either end.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Message {
    src: SocketAddr,
    dst: SocketAddr,
    id: u16,
    response: bool,
}

impl Message {
    /// UDP's only: a TCP segment's bytes need not start a message.
    fn of(p: &Packet) -> Option<Self> {
        let later = p.frag.is_some_and(|f| !f.is_first());
        if p.transport != Transport::Udp || later || p.payload.len() < 3 {
            return None;
        }
        Some(Self {
            src: p.src,
            dst: p.dst,
            id: u16::from_be_bytes([p.payload[0], p.payload[1]]),
            response: p.payload[2] & 0x80 != 0,
        })
    }
}

/// Where one file saw a message first and last: (wall time, direction).
#[derive(Clone, Copy)]
struct Seen {
    first: (i64, Direction),
    last: (i64, Direction),
}

impl Seen {
    fn span(&self) -> i64 {
        self.last.0 - self.first.0
    }
}

/// When every file has begun, by their headers' wall clocks, less a
/// crossing's span: a file begun earlier than the others has nothing to
/// match before it, and its sample starts there.
fn common_start(recs: &[Recording], ports: &[u16]) -> Result<i64> {
    let mut from = i64::MIN;
    for rec in recs {
        let mut replay = Replay::open(&rec.path, &rec.about, ports.to_vec(), Speed::Fast)?;
        let first = std::iter::from_fn(|| replay.next_input()).find_map(|i| match i {
            Input::Packets(batch) => batch.first().map(|p| p.ts_ns),
            _ => None,
        });
        let wall = first.and_then(|t| i64::try_from(t).ok()?.checked_add(rec.clock_offset_ns()));
        from = from.max(wall.unwrap_or(i64::MIN));
    }
    Ok(from.saturating_sub(MAX_SPAN_NS))
}

/// Messages one file saw through devices, by wall time as its header
/// gives it, from `from` on; the first `MAX_SAMPLE` of them, and the
/// file read no further than a crossing's span after they are in.
#[derive(Default)]
pub(super) struct Sample(HashMap<Message, Seen>);

impl Sample {
    fn read(rec: &Recording, ports: &[u16], from: i64) -> Result<Self> {
        let mut replay = Replay::open(&rec.path, &rec.about, ports.to_vec(), Speed::Fast)?;
        let mut sample = Self(HashMap::new());
        let offset = rec.clock_offset_ns();
        // Once full, read on for the longest span of one crossing, so
        // that the last messages in are seen at every hook they passed;
        // the rest of the file has no room.
        let mut full_at = None;
        while let Some(input) = replay.next_input() {
            let Input::Packets(batch) = input else {
                continue;
            };
            if let (Some(full), Some(p)) = (full_at, batch.first()) {
                if p.ts_ns.saturating_sub(full) > MAX_SPAN_NS as u64 {
                    break;
                }
            }
            batch.iter().for_each(|p| sample.add(p, offset, from));
            if full_at.is_none() && sample.0.len() >= MAX_SAMPLE {
                full_at = batch.last().map(|p| p.ts_ns);
            }
        }
        Ok(sample)
    }

    pub(super) fn add(&mut self, p: &Packet, offset_ns: i64, from: i64) {
        let dir = p.hook.direction();
        let wall = i64::try_from(p.ts_ns)
            .ok()
            .and_then(|t| t.checked_add(offset_ns));
        let (Some(m), Some(t), true) = (Message::of(p), wall, dir.through_device()) else {
            return;
        };
        if t < from {
            return;
        }
        let room = self.0.len() < MAX_SAMPLE;
        match self.0.get_mut(&m) {
            Some(s) if t < s.first.0 => s.first = (t, dir),
            Some(s) if t >= s.last.0 => s.last = (t, dir),
            Some(_) => {}
            None if room => {
                self.0.insert(
                    m,
                    Seen {
                        first: (t, dir),
                        last: (t, dir),
                    },
                );
            }
            None => {}
        }
    }
}

impl Sample {
    /// Leaves out the messages last seen before `t`: a sliding sample.
    pub(super) fn forget_before(&mut self, t: i64) {
        self.0.retain(|_, s| s.last.0 >= t);
    }
}

/// Delays of the messages that left `a` (last seen going out) and arrived
/// at `b` (first seen coming in), on their wall clocks.
fn delays<'a>(a: &'a Sample, b: &'a Sample) -> impl Iterator<Item = i64> + 'a {
    a.0.iter()
        .filter_map(|(m, at_a)| crossing(at_a, b.0.get(m)?))
}

/// The delay of a message that left one file (seen `at_a`) and arrived at
/// another (`at_b`); none if it did not cross that way.
fn crossing(at_a: &Seen, at_b: &Seen) -> Option<i64> {
    let crossed = at_a.last.1 == Direction::Egress && at_b.first.1 == Direction::Ingress;
    let brief = at_a.span() <= MAX_SPAN_NS && at_b.span() <= MAX_SPAN_NS;
    (crossed && brief).then(|| at_b.first.0 - at_a.last.0)
}

/// Whether `p`'s message, in `samples[lane]`, crossed to or from another
/// file in less than no time once each file's clock error (`errors_ns`)
/// is taken off: estimates its own crossing disproves.
pub(super) fn crossed_backwards(
    samples: &[Sample],
    errors_ns: &[i64],
    lane: usize,
    p: &Packet,
) -> bool {
    let Some(m) = Message::of(p) else {
        return false;
    };
    let Some(here) = samples[lane].0.get(&m) else {
        return false;
    };
    let mut others = samples.iter().enumerate().filter(|(i, _)| *i != lane);
    others.any(|(i, s)| {
        let Some(there) = s.0.get(&m) else {
            return false;
        };
        // On the corrected clocks, a delay less the later file's lead.
        let ahead = errors_ns[i] - errors_ns[lane];
        crossing(here, there).is_some_and(|d| d < ahead)
            || crossing(there, here).is_some_and(|d| d < -ahead)
    })
}

/// How far `b`'s clock is ahead of `a`'s, and on how many messages; none
/// without messages both ways. Each way's least delay is the true delay
/// plus or minus the offset: half their difference is the offset, if the
/// two ways are as fast.
fn skew(a: &Sample, b: &Sample) -> Option<(i64, usize)> {
    let (ab, n_ab) = least(delays(a, b))?;
    let (ba, n_ba) = least(delays(b, a))?;
    Some(((ab - ba) / 2, n_ab + n_ba))
}

/// The least of `delays`, and how many there were; none if none.
fn least(delays: impl Iterator<Item = i64>) -> Option<(i64, usize)> {
    delays.fold(None, |acc, d| match acc {
        None => Some((d, 1)),
        Some((m, n)) => Some((d.min(m), n + 1)),
    })
}

/// Recordings of several nodes as one source, in one time order.
pub struct Merge<R: Read = BufReader<File>> {
    lanes: Vec<Lane<R>>,
    pacer: Pacer,
    now_ns: u64,
}

/// One file's replay, its inputs moved onto the common time line.
struct Lane<R: Read> {
    replay: Replay<R>,
    node: NodeId,
    shift_ns: i64,
    /// Its target's moves are the replay's: the first file's only.
    first: bool,
    /// The rest of its current batch of packets, or its next other input.
    packets: VecDeque<Packet>,
    other: Option<Input>,
}

impl Merge {
    pub fn open(recs: &[Recording], clocks: &Clocks, ports: &[u16], speed: Speed) -> Result<Self> {
        let replays = recs
            .iter()
            .map(|r| Replay::open(&r.path, &r.about, ports.to_vec(), speed))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::of(replays, clocks, speed))
    }
}

impl<R: Read> Merge<R> {
    /// `replays` in the order of `clocks`; one alone is handed on as it is.
    pub(crate) fn of(replays: Vec<Replay<R>>, clocks: &Clocks, speed: Speed) -> Self {
        let several = replays.len() > 1;
        let lanes: Vec<_> = replays
            .into_iter()
            .zip(&clocks.0)
            .enumerate()
            .map(|(i, (replay, a))| Lane {
                replay,
                // Numbered from 1 where there are several: 0 is no node's.
                node: NodeId(if several { i as u16 + 1 } else { 0 }),
                shift_ns: a.shift_ns,
                first: i == 0,
                packets: VecDeque::new(),
                other: None,
            })
            .collect();
        let now_ns = lanes.iter().map(Lane::now).min().unwrap_or(0);
        Self {
            lanes,
            pacer: Pacer::new(speed),
            now_ns,
        }
    }

    /// Frames that were not DNS, or did not parse, in all files.
    pub fn skipped(&self) -> u64 {
        self.lanes.iter().map(|l| l.replay.skipped).sum()
    }

    /// Why a file stopped early, if one did (the first such).
    pub fn take_error(&mut self) -> Option<anyhow::Error> {
        self.lanes.iter_mut().find_map(|l| l.replay.error.take())
    }

    /// The next input of all files, without pacing; None at the end.
    pub(crate) fn next_input(&mut self) -> Option<Input> {
        if let [lane] = &mut self.lanes[..] {
            return lane.replay.next_input();
        }
        let mut batch = Vec::new();
        while batch.len() < BATCH {
            let Some(lane) = self.earliest() else { break };
            match lane.packets.pop_front() {
                Some(p) => batch.push(p),
                None if batch.is_empty() => {
                    let other = lane.other.take();
                    return self.handed(other);
                }
                None => break,
            }
        }
        let input = (!batch.is_empty()).then_some(Input::Packets(batch));
        self.handed(input)
    }

    /// Notes how far `input` brought the time line; at the end, to where
    /// the last file ended.
    fn handed(&mut self, input: Option<Input>) -> Option<Input> {
        let end = self.lanes.iter().map(Lane::now).max().unwrap_or(0);
        self.now_ns = match &input {
            Some(i) => self.now_ns.max(time_of(i).unwrap_or(0)),
            None => self.now_ns.max(end),
        };
        input
    }

    /// The file whose next input came first (the first file's, on a tie).
    fn earliest(&mut self) -> Option<&mut Lane<R>> {
        let at = self
            .lanes
            .iter_mut()
            .enumerate()
            .filter_map(|(i, l)| Some((l.next_ns()?, i)))
            .min()?
            .1;
        Some(&mut self.lanes[at])
    }
}

impl<R: Read> Lane<R> {
    /// When its next input happened, on the common time line; None at its end.
    fn next_ns(&mut self) -> Option<u64> {
        if self.packets.is_empty() && self.other.is_none() {
            self.refill();
        }
        match self.packets.front() {
            Some(p) => Some(p.ts_ns),
            None => self.other.as_ref().and_then(time_of),
        }
    }

    fn refill(&mut self) {
        while let Some(input) = self.replay.next_input() {
            match self.moved(input) {
                Input::Packets(batch) if batch.is_empty() => continue,
                Input::Packets(batch) => self.packets = batch.into(),
                other => self.other = Some(other),
            }
            return;
        }
    }

    /// Its replay's time, on the common time line.
    fn now(&self) -> u64 {
        self.replay.now().saturating_add_signed(self.shift_ns)
    }

    fn moved(&self, input: Input) -> Input {
        moved(input, self.shift_ns, self.node, self.first)
    }
}

/// `input` on the common time line (`shift_ns` later), its packets and
/// sampling `node`'s; a target's moves only from the `first` node.
pub(super) fn moved(input: Input, by: i64, node: NodeId, first: bool) -> Input {
    let mut input = shifted(input, by);
    match &mut input {
        Input::Packets(batch) => batch.iter_mut().for_each(|p| p.node = node),
        Input::Sample(c) => c.node = node,
        Input::Pods { refresh, .. } => {
            // A file's own node numbers are not the merge's.
            refresh.joined = None;
            if !first {
                refresh.target = None;
            }
        }
        _ => {}
    }
    input
}

/// `input` with its times `by` later.
pub(super) fn shifted(mut input: Input, by: i64) -> Input {
    if by == 0 {
        return input;
    }
    let at = |t: &mut u64| *t = t.saturating_add_signed(by);
    match &mut input {
        Input::Packets(batch) => batch.iter_mut().for_each(|p| at(&mut p.ts_ns)),
        Input::Sample(c) => {
            at(&mut c.since_ns);
            at(&mut c.now_ns);
        }
        Input::Lost {
            since_ns, now_ns, ..
        } => {
            at(since_ns);
            at(now_ns);
        }
        Input::Pods { now_ns, .. }
        | Input::Conntrack { now_ns, .. }
        | Input::Counters { now_ns, .. }
        | Input::Tick(now_ns) => at(now_ns),
    }
    input
}

impl<R: Read> Source for Merge<R> {
    fn now(&self) -> u64 {
        match &self.lanes[..] {
            [lane] => lane.replay.now(),
            _ => self.now_ns,
        }
    }

    async fn next(&mut self) -> Result<Option<Input>> {
        let Some(input) = self.next_input() else {
            self.lanes.iter_mut().for_each(|l| l.replay.warn_cut());
            return Ok(None);
        };
        self.pacer.pace(&input).await;
        Ok(Some(input))
    }

    fn rest(&mut self) -> Vec<Input> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests;
