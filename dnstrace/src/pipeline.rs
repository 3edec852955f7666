//! The one pipeline of every view, live or replayed: inputs (kernel packet
//! events, ctnetlink events, conntrack counters, losses, clock ticks) →
//! decode → a sink (packet lines, or journeys as lines or in the live
//! view). A recording, when asked for, takes each input on the way in, so
//! a replay feeds the same inputs through the same code.
use std::{
    collections::HashSet,
    fmt, io,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use anyhow::{Context as _, Result};
use tokio::{
    signal::unix::{signal, Signal, SignalKind},
    sync::Notify,
};

use crate::{
    conntrack::CtEvent,
    correlate::{Engine, Journey, Limits, CLOSE_BATCH},
    decode::{Body, Decoder, KernelNames, Packet, Qtype, Record, Transport},
    diagnose::{Anomaly, AnomalyKind, Checked, Context, Diagnoser, Retarget},
    ingest::SampleChange,
    target::{self, follow::Refresh},
};

/// Where decoded records go.
pub trait Sink {
    fn record(&mut self, rec: &Record) -> io::Result<()>;
    /// A TCP segment to or from a DNS port, before it is decoded.
    fn segment(&mut self, _p: &Packet) {}
    /// Kernel monotonic time has reached `now_ns`.
    fn tick(&mut self, now_ns: u64) -> io::Result<()>;
    /// Before the first event: what is known already.
    fn start(&mut self, _now_ns: u64) -> io::Result<()> {
        Ok(())
    }
    /// A ctnetlink event of a DNS flow.
    fn conntrack(&mut self, ev: &CtEvent, now_ns: u64) -> io::Result<()>;
    /// The node's conntrack race counters rose: (name, increase).
    fn counters(&mut self, _moved: &[(&'static str, u64)], _now_ns: u64) -> io::Result<()> {
        Ok(())
    }
    /// Anomalies raised since the last call, for the recording.
    fn raised(&mut self) -> Vec<Anomaly> {
        Vec::new()
    }
    /// How the recording goes, when that changes.
    fn recording(&mut self, _status: String) {}
    /// The kernel has lost `total` events so far, some between `since_ns`
    /// (the last look) and `now_ns`.
    fn lost(&mut self, total: u64, since_ns: u64, now_ns: u64);
    /// The kernel's sampling level changed.
    fn sampling(&mut self, _change: SampleChange) {}
    /// How a cluster view's nodes go, before each tick.
    fn nodes(&mut self, _nodes: Vec<NodeStatus>) {}
    /// The node's pods changed: new names, the target's new sandbox; or
    /// a cluster view joined a node.
    fn pods(&mut self, _refresh: &Refresh, _now_ns: u64) -> io::Result<()> {
        Ok(())
    }
    /// The capture ends: write what is left.
    fn finish(&mut self, now_ns: u64) -> io::Result<()>;
    /// What it counted, for the exit line.
    fn summary(&self) -> Option<Tally>;
}

/// Where finished journeys and anomalies go: lines, or the live view.
pub trait JourneyOut {
    /// Names of the kernel's drop reasons and locations, for the rules.
    fn kernel(&self) -> &KernelNames;
    /// A finished journey and the anomalies (kind, summary) it fed.
    fn journey(&mut self, j: Journey, badges: &[(AnomalyKind, String)]) -> io::Result<()>;
    /// An anomaly raised for the first time.
    fn anomaly(&mut self, a: &Anomaly) -> io::Result<()>;
    /// Anomalies (kind, summary) fed by journeys already out, each time:
    /// the badges they would have carried (a TCP set-up failed after the
    /// truncated answer that led there).
    fn late(&mut self, _hits: &[(AnomalyKind, String)]) {}
    /// The node's pods changed: addresses named since the start (or named
    /// anew), with their workloads; or a cluster view joined a node.
    fn pods(&mut self, _refresh: &Refresh) {}
    /// Every tick: every anomaly so far and the capture's health.
    fn state(&mut self, _all: &[&Anomaly], _health: &Health) -> io::Result<()> {
        Ok(())
    }
    /// At the end: every anomaly of the run.
    fn summary(&mut self, all: &[&Anomaly]) -> io::Result<()>;
    fn flush(&mut self) -> io::Result<()>;
}

/// Journeys: records into the correlation engine, finished journeys out,
/// and through the diagnosis rules.
pub struct JourneySink<O: JourneyOut> {
    engine: Engine,
    diagnoser: Diagnoser,
    pub out: O,
    printed: u64,
    lost: u64,
    /// New anomalies not yet taken by `raised`.
    raised: Vec<Anomaly>,
    recording: Option<String>,
    /// A cluster view's nodes, as their streams go.
    nodes: Vec<NodeStatus>,
    /// With a target: its network namespace, and its addresses with
    /// those of every sandbox it had before (their last journeys may close
    /// after the new one is found; a namespace's inode number, unlike an
    /// address, is soon given to another). The kernel also passes its
    /// resolvers' upstream queries, which belong to others' lookups unless
    /// linked under one of the target's journeys.
    only: Option<(u32, Vec<IpAddr>)>,
    /// Journeys whose diagnosis waits for a sibling still open (see
    /// `Diagnoser::awaits`), oldest first.
    held: Vec<Journey>,
}

/// Journeys held for a sibling at most; past this they are judged at once.
const MAX_HELD: usize = 1024;

/// The questions (socket, type, name) of a batch of closed journeys.
struct Questions(HashSet<(SocketAddr, Qtype, Arc<str>)>);

impl Questions {
    fn of(batch: &[Journey]) -> Self {
        Self(
            batch
                .iter()
                .map(|j| (j.client, j.qtype, j.name.clone()))
                .collect(),
        )
    }

    /// Whether the batch has `j`'s question with the type `qtype`.
    fn has(&self, j: &Journey, qtype: Qtype) -> bool {
        self.0.contains(&(j.client, qtype, j.name.clone()))
    }
}

impl<O: JourneyOut> JourneySink<O> {
    pub fn new(limits: Limits, context: Context, out: O) -> Self {
        Self {
            engine: Engine::new(limits),
            diagnoser: Diagnoser::new(context),
            out,
            printed: 0,
            lost: 0,
            raised: Vec::new(),
            recording: None,
            nodes: Vec::new(),
            only: None,
            held: Vec::new(),
        }
    }

    /// Keeps only journeys that start from `target`.
    pub fn only_from(mut self, target: Option<&target::Target>) -> Self {
        self.only = target.map(|t| (t.netns_inode, t.addrs.clone()));
        self
    }

    fn wanted(&self, j: &Journey) -> bool {
        let Some((netns, addrs)) = &self.only else {
            return true;
        };
        let origin = j.legs.iter().find(|l| !l.response);
        addrs.contains(&j.client.ip()) || origin.is_some_and(|o| *netns != 0 && o.netns == *netns)
    }

    fn print(&mut self, journeys: Vec<Journey>) -> io::Result<()> {
        let journeys: Vec<_> = journeys.into_iter().filter(|j| self.wanted(j)).collect();
        // Built only when needed: most batches have no lost half.
        let waits = journeys.iter().any(|j| self.awaited(j).is_some());
        let batch = waits.then(|| Questions::of(&journeys));
        for j in journeys {
            // Its sibling closes later in this batch, or after it.
            let later = self.awaited(&j).is_some_and(|q| {
                batch.as_ref().is_some_and(|b| b.has(&j, q))
                    || self.engine.asking(j.client, &j.name, q)
            });
            if later && self.held.len() < MAX_HELD {
                self.held.push(j);
                continue;
            }
            self.judge(j)?;
        }
        // Those whose sibling has closed since (or was evicted).
        let (ready, still): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|j| !self.sibling_open(j));
        self.held = still;
        for j in ready {
            self.judge(j)?;
        }
        self.out.flush()
    }

    /// Runs `j` through the rules and prints it with what it fed.
    fn judge(&mut self, j: Journey) -> io::Result<()> {
        let checked = self.diagnoser.journey(&j, self.out.kernel());
        self.out.journey(j, &checked.hits)?;
        self.printed += 1;
        self.raise(checked.raised)
    }

    /// The question whose journey `j`'s diagnosis waits for, if it does.
    fn awaited(&self, j: &Journey) -> Option<Qtype> {
        self.diagnoser.awaits(j)
    }

    /// Whether the journey `j`'s diagnosis waits for is still open.
    fn sibling_open(&self, j: &Journey) -> bool {
        self.awaited(j)
            .is_some_and(|q| self.engine.asking(j.client, &j.name, q))
    }

    /// Prints what `close` closes, batch by batch, until a batch is short.
    fn close_all(&mut self, close: impl Fn(&mut Engine) -> Vec<Journey>) -> io::Result<()> {
        loop {
            let done = close(&mut self.engine);
            let more = done.len() >= CLOSE_BATCH;
            self.print(done)?;
            if !more {
                return Ok(());
            }
        }
    }

    fn raise(&mut self, new: Vec<Anomaly>) -> io::Result<()> {
        for a in &new {
            self.out.anomaly(a)?;
        }
        self.raised.extend(new);
        Ok(())
    }

    /// Findings about journeys already out: their hits go as the badges
    /// those journeys would have carried.
    fn raise_late(&mut self, found: Checked) -> io::Result<()> {
        self.raise(found.raised)?;
        self.out.late(&found.hits);
        Ok(())
    }

    fn health(&self, now_ns: u64) -> Health {
        Health {
            now_ns,
            lost: self.lost,
            evicted: self.engine.evicted(),
            open: self.engine.open_count(),
            one_in: self.engine.sampling_level().one_in(),
            recording: self.recording.clone(),
            nodes: self.nodes.clone(),
        }
    }
}

impl<O: JourneyOut> Sink for JourneySink<O> {
    fn start(&mut self, now_ns: u64) -> io::Result<()> {
        let found = self.diagnoser.static_checks(now_ns);
        self.raise(found)?;
        self.out
            .state(&self.diagnoser.summary(), &self.health(now_ns))?;
        self.out.flush()
    }
    fn record(&mut self, rec: &Record) -> io::Result<()> {
        self.engine.push(rec);
        Ok(())
    }
    fn segment(&mut self, p: &Packet) {
        self.engine.segment(p);
    }
    fn conntrack(&mut self, ev: &CtEvent, _: u64) -> io::Result<()> {
        self.engine.conntrack(ev);
        Ok(())
    }
    fn counters(&mut self, moved: &[(&'static str, u64)], now_ns: u64) -> io::Result<()> {
        let found = self.diagnoser.counters_moved(moved, now_ns);
        self.raise(found)
    }
    fn raised(&mut self) -> Vec<Anomaly> {
        std::mem::take(&mut self.raised)
    }
    fn recording(&mut self, status: String) {
        self.recording = Some(status);
    }
    fn tick(&mut self, now_ns: u64) -> io::Result<()> {
        self.close_all(|engine| engine.tick(now_ns))?;
        let failed = self.engine.failed_connections();
        let names = self.out.kernel();
        let found = self.diagnoser.connections_failed(&failed, names, now_ns);
        self.raise_late(found)?;
        let engine = &self.engine;
        let late = self.diagnoser.tick(now_ns, |client, name, qtype, since| {
            engine.asked_over_tcp(client, name, qtype, since)
        });
        self.raise_late(late)?;
        self.out
            .state(&self.diagnoser.summary(), &self.health(now_ns))?;
        self.out.flush()
    }
    fn lost(&mut self, total: u64, since_ns: u64, now_ns: u64) {
        self.lost = total;
        self.engine.lost(since_ns, now_ns);
        self.diagnoser.lost(now_ns);
    }
    fn sampling(&mut self, change: SampleChange) {
        self.engine.sampling(change);
    }
    fn nodes(&mut self, nodes: Vec<NodeStatus>) {
        self.nodes = nodes;
    }
    fn pods(&mut self, refresh: &Refresh, now_ns: u64) -> io::Result<()> {
        self.out.pods(refresh);
        self.diagnoser.pods(refresh);
        let Some(moved) = &refresh.target else {
            return Ok(());
        };
        if let Some((netns, addrs)) = &mut self.only {
            *netns = moved.netns_inode;
            addrs.extend(&moved.addrs);
        }
        let retarget = Retarget {
            netns_inode: moved.netns_inode,
            addrs: moved.addrs.clone(),
            resolv: moved.resolv.clone(),
        };
        for a in self.diagnoser.retarget(retarget, now_ns) {
            self.out.anomaly(&a)?;
        }
        Ok(())
    }
    fn finish(&mut self, now_ns: u64) -> io::Result<()> {
        self.close_all(|engine| engine.finish(now_ns))?;
        self.out.summary(&self.diagnoser.summary())?;
        self.out.flush()
    }
    fn summary(&self) -> Option<Tally> {
        Some(Tally {
            journeys: self.printed,
            evicted: self.engine.evicted(),
            left_out_whole: self.engine.shed(),
            anomalies: self.diagnoser.summary().len(),
        })
    }
}

/// What to show.
pub enum View {
    Packets,
    Journeys(Limits),
    /// The live terminal view of journeys.
    Live(Limits),
}

/// One thing the pipeline is fed, in the order it happened.
#[derive(Clone, Debug)]
pub enum Input {
    /// Kernel packet events, as read from the ring buffer.
    Packets(Vec<Packet>),
    /// ctnetlink events of DNS flows, seen at `now_ns`.
    Conntrack { now_ns: u64, events: Vec<CtEvent> },
    /// The node's conntrack race counters rose: (name, increase).
    Counters {
        now_ns: u64,
        moved: Vec<(&'static str, u64)>,
    },
    /// The kernel has lost `total` events so far (the ring full), or
    /// skipped runs of the programs; some of either since `since_ns` (the
    /// last look).
    Lost {
        since_ns: u64,
        now_ns: u64,
        total: u64,
    },
    /// The kernel's sampling level changed.
    Sample(SampleChange),
    /// The node's pods changed (`target::follow`).
    Pods { now_ns: u64, refresh: Refresh },
    /// Kernel monotonic time has reached `now_ns`.
    Tick(u64),
}

/// Where inputs come from: the kernel, or a recording.
pub trait Source {
    /// Kernel monotonic time now, or the recording's.
    fn now(&self) -> u64;
    /// The next input; None when there are no more.
    #[allow(async_fn_in_trait)]
    async fn next(&mut self) -> Result<Option<Input>>;
    /// What is queued at the end, without waiting.
    fn rest(&mut self) -> Vec<Input>;
    /// The nodes it merges, as their streams go (a cluster view's).
    fn nodes(&self) -> Vec<NodeStatus> {
        Vec::new()
    }
}

#[derive(Default, Debug, serde::Serialize)]
pub struct Counts {
    pub packets: u64,
    pub messages: u64,
    /// Not DNS, though the whole payload was there.
    pub malformed: u64,
    /// Not decoded whole because the capture cut the payload short (past
    /// 4,096 bytes of UDP, a TCP payload the perf buffers had no room
    /// for), or a fragment of its datagram never came there.
    pub cut: u64,
}

impl Counts {
    /// "N DNS packets, N messages, N malformed[, N not whole (…)]".
    pub fn brief(&self) -> String {
        let cut = if self.cut > 0 {
            format!(
                ", {} not whole (cut by the capture, or a fragment missing)",
                self.cut
            )
        } else {
            String::new()
        };
        format!(
            "{} DNS packets, {} messages, {} malformed{cut}",
            self.packets, self.messages, self.malformed
        )
    }
}

/// What a journeys sink counted, for the exit line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Tally {
    pub journeys: u64,
    /// Evicted because too many were open at once.
    pub evicted: u64,
    /// Left out whole: open when the sampling level changed.
    pub left_out_whole: u64,
    pub anomalies: usize,
}

/// "N journeys, N evicted (…)[, N left out whole (…)], N anomalies".
impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} journeys, {} evicted (too many open at once)",
            self.journeys, self.evicted
        )?;
        if self.left_out_whole > 0 {
            write!(
                f,
                ", {} left out whole (open when the sampling level changed)",
                self.left_out_whole
            )?;
        }
        write!(f, ", {} anomalies", self.anomalies)
    }
}

/// The capture's own state, sent every tick.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// Kernel monotonic time of the tick.
    pub now_ns: u64,
    /// Kernel events lost so far (ring buffer full).
    pub lost: u64,
    /// Journeys evicted because too many were open at once.
    pub evicted: u64,
    /// Journeys open now.
    pub open: usize,
    /// 1 lookup in this many kept by the sampling level now (0: none, the
    /// agent between its windows).
    pub one_in: u32,
    /// How the recording goes, when there is one.
    pub recording: Option<String>,
    /// A cluster view's nodes; none for one node.
    pub nodes: Vec<NodeStatus>,
}

/// A node of a cluster view, as its stream goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    pub name: String,
    pub up: bool,
    /// How far its stream is behind the furthest node's.
    pub lag_ns: u64,
    /// What its times are moved by onto the first node's clock, which
    /// the view's are on (the headers' clocks tell).
    pub offset_ns: i64,
    /// Events its agent dropped for this view.
    pub dropped: u64,
}

/// What sees every input before the sink does, and each anomaly raised:
/// the recorder, known here only by this.
pub trait Tap {
    fn start(&mut self, now_ns: u64);
    fn input(&mut self, input: &Input);
    fn anomaly(&mut self, a: &Anomaly);
    /// A line on how it goes, when that changed since the last call.
    fn status_changed(&mut self) -> Option<String>;
    fn end(&mut self, now_ns: u64);
}

/// Several taps, each handed everything in turn.
pub struct Taps(pub Vec<Box<dyn Tap>>);

impl Tap for Taps {
    fn start(&mut self, now_ns: u64) {
        self.0.iter_mut().for_each(|t| t.start(now_ns));
    }

    fn input(&mut self, input: &Input) {
        self.0.iter_mut().for_each(|t| t.input(input));
    }

    fn anomaly(&mut self, a: &Anomaly) {
        self.0.iter_mut().for_each(|t| t.anomaly(a));
    }

    /// The first tap's news: only a recorder has any.
    fn status_changed(&mut self) -> Option<String> {
        self.0.iter_mut().find_map(|t| t.status_changed())
    }

    fn end(&mut self, now_ns: u64) {
        self.0.iter_mut().for_each(|t| t.end(now_ns));
    }
}

/// Decoding and recording, between a source and a sink.
#[derive(Default)]
pub struct Pipeline {
    pub decoder: Decoder,
    pub counts: Counts,
    recorder: Option<Box<dyn Tap>>,
    /// Reused from batch to batch: a batch's records are hundreds of KiB,
    /// not to be allocated and freed again for each.
    records: Vec<Record>,
}

impl Pipeline {
    pub fn recording(recorder: Option<Box<dyn Tap>>) -> Self {
        Self {
            recorder,
            ..Self::default()
        }
    }

    /// Moves inputs from `src` into `sink` until the source ends, a signal
    /// arrives or stdout closes; returns the sink's summary.
    pub async fn drive<S: Sink>(
        &mut self,
        src: &mut impl Source,
        sink: &mut S,
        stop: &mut Stop,
    ) -> Result<Option<Tally>> {
        let start = src.now();
        if let Some(r) = &mut self.recorder {
            r.start(start);
        }
        sink.start(start).context("writing to stdout")?;
        self.after(sink);
        let result = loop {
            let input = tokio::select! {
                () = stop.wait() => break Ok(()),
                input = src.next() => input?,
            };
            let Some(input) = input else { break Ok(()) };
            if matches!(input, Input::Tick(_)) {
                sink.nodes(src.nodes());
            }
            if let Err(e) = self.step(input, sink) {
                break Err(e);
            }
        };
        let result =
            result.and_then(|()| src.rest().into_iter().try_for_each(|i| self.step(i, sink)));
        let end = src.now();
        let result = result
            .and_then(|()| sink.finish(end))
            .map(|()| self.after(sink));
        if let Some(r) = &mut self.recorder {
            r.end(end);
        }
        result
            .map(|()| sink.summary())
            .or_else(|e| ignore_closed_stdout(e).map(|()| sink.summary()))
    }

    /// Records `input`, then hands it to `sink`.
    pub(crate) fn step(&mut self, input: Input, sink: &mut impl Sink) -> io::Result<()> {
        if let Some(r) = &mut self.recorder {
            r.input(&input);
        }
        match input {
            Input::Packets(batch) => self.feed(batch, sink)?,
            Input::Conntrack { now_ns, events } => {
                for ev in &events {
                    sink.conntrack(ev, now_ns)?;
                }
            }
            Input::Counters { now_ns, moved } => sink.counters(&moved, now_ns)?,
            Input::Lost {
                total,
                since_ns,
                now_ns,
            } => sink.lost(total, since_ns, now_ns),
            Input::Sample(change) => sink.sampling(change),
            Input::Pods { now_ns, refresh } => sink.pods(&refresh, now_ns)?,
            Input::Tick(now_ns) => {
                self.expire(now_ns, sink)?;
                sink.tick(now_ns)?;
            }
        }
        self.after(sink);
        Ok(())
    }

    /// Records what the sink raised, and tells it how recording goes.
    fn after(&mut self, sink: &mut impl Sink) {
        let raised = sink.raised();
        if let Some(r) = &mut self.recorder {
            for a in &raised {
                r.anomaly(a);
            }
            if let Some(status) = r.status_changed() {
                sink.recording(status);
            }
        }
    }

    fn feed(&mut self, batch: Vec<Packet>, sink: &mut impl Sink) -> io::Result<()> {
        let mut records = std::mem::take(&mut self.records);
        for packet in batch {
            self.counts.packets += 1;
            if matches!(packet.transport, Transport::Tcp { .. }) {
                sink.segment(&packet);
            }
            self.decoder.decode(packet, &mut records);
        }
        self.hand(records, sink)
    }

    /// Fragmented datagrams past their time, said before the tick.
    fn expire(&mut self, now_ns: u64, sink: &mut impl Sink) -> io::Result<()> {
        let mut records = std::mem::take(&mut self.records);
        self.decoder.tick(now_ns, &mut records);
        self.hand(records, sink)
    }

    #[inline]
    fn hand(&mut self, mut records: Vec<Record>, sink: &mut impl Sink) -> io::Result<()> {
        // By reference, not drained: a record is a few hundred bytes to move.
        let fed = records.iter().try_for_each(|rec| {
            match rec.body {
                Body::Dns(ref m) => {
                    self.counts.messages += 1;
                    self.counts.malformed += u64::from(m.malformed.is_some());
                }
                Body::Cut(_) => self.counts.cut += 1,
                Body::Gap { .. } => self.counts.cut += 1,
                Body::Malformed { .. } if rec.packet.truncated => self.counts.cut += 1,
                Body::Malformed { .. } => self.counts.malformed += 1,
            }
            sink.record(rec)
        });
        records.clear();
        self.records = records;
        fed
    }
}

/// Ctrl-C and SIGTERM, caught from the start so that a stop during
/// start-up still detaches everything.
pub struct Stop {
    int: Signal,
    term: Signal,
    /// The live view's quit key.
    pub quit: Option<Arc<Notify>>,
}

impl Stop {
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            quit: None,
        })
    }

    pub async fn wait(&mut self) {
        let quit = &self.quit;
        let quit = async {
            match quit {
                Some(n) => n.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
            () = quit => {}
        }
    }
}

/// A reader that went away (`| head`) ends the capture quietly.
fn ignore_closed_stdout(e: io::Error) -> Result<()> {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Ok(())
    } else {
        Err(anyhow::Error::new(e).context("writing to stdout"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use dnstrace_common::Hook;

    use super::*;
    use crate::{
        clock::Clock,
        decode::{
            dns::{DnsMessage, Question},
            kernel::KernelNames,
            packet::Dropped,
            Body, Qtype, Rcode, Transport,
        },
        output::{Format, Labels, LineSink},
        record::tests::packet,
    };

    /// Keeps what the sink hands on: journeys in order, and anomalies.
    struct Kept {
        kernel: KernelNames,
        journeys: Vec<(u64, Qtype)>,
        anomalies: Vec<AnomalyKind>,
    }

    impl JourneyOut for Kept {
        fn kernel(&self) -> &KernelNames {
            &self.kernel
        }
        fn journey(&mut self, j: Journey, _: &[(AnomalyKind, String)]) -> io::Result<()> {
            self.journeys.push((j.id, j.qtype));
            Ok(())
        }
        fn anomaly(&mut self, a: &Anomaly) -> io::Result<()> {
            self.anomalies.push(a.kind);
            Ok(())
        }
        fn summary(&mut self, _: &[&Anomaly]) -> io::Result<()> {
            Ok(())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A DNS record of `qtype` for web's name, seen at `hook` at `ms`.
    fn dns_at(ms: u64, hook: Hook, qtype: Qtype, response: bool, drop: Option<u32>) -> Record {
        let (client, server) = ("10.244.0.10:4000", "10.244.0.53:53");
        let (src, dst) = if response {
            (server, client)
        } else {
            (client, server)
        };
        let mut p = packet(src, dst, Transport::Udp, &[]);
        (p.ts_ns, p.hook, p.netns) = (ms * 1_000_000 + 1, hook, 100);
        p.drop = drop.map(|reason| Dropped {
            reason,
            location: 0x8,
        });
        let m = DnsMessage {
            id: 7,
            response,
            opcode: "QUERY".into(),
            flags: Default::default(),
            rcode: Rcode::NOERROR,
            questions: vec![Question::new("web.example.com.".into(), qtype, "IN")],
            answers: vec![],
            authority_count: 0,
            additional_count: 0,
            malformed: None,
        };
        Record {
            packet: p,
            body: Body::Dns(m.into()),
            missing: None,
        }
    }

    /// The race's loser (the A, sent first) is dropped at once; its
    /// sibling's answer comes in the same tick, or long after the loser's
    /// journey closes: either way the loser is judged after it.
    #[test]
    fn a_lost_half_is_judged_once_its_sibling_is_answered() {
        for answer_ms in [2, 190] {
            let kernel = KernelNames::new(
                [(3, "SKB_DROP_REASON_NETFILTER_DROP".to_owned())].into(),
                std::io::empty(),
            );
            let out = Kept {
                kernel,
                journeys: vec![],
                anomalies: vec![],
            };
            let mut sink = JourneySink::new(Limits::default(), Context::default(), out);
            let records = [
                dns_at(0, Hook::DevXmit, Qtype::A, false, None),
                dns_at(0, Hook::DevXmit, Qtype::AAAA, false, None),
                dns_at(1, Hook::Drop, Qtype::A, false, Some(3)),
                dns_at(answer_ms, Hook::DevReceive, Qtype::AAAA, true, None),
            ];
            let mut next = records.iter().peekable();
            for ms in (0..3000).step_by(100) {
                while let Some(r) = next.next_if(|r| r.packet.ts_ns <= ms * 1_000_000 + 1) {
                    sink.record(r).unwrap();
                }
                sink.tick(ms * 1_000_000 + 2).unwrap();
            }
            sink.finish(3_000_000_000).unwrap();
            let kept = &sink.out;
            assert_eq!(
                kept.journeys.iter().map(|(_, q)| *q).collect::<Vec<_>>(),
                [Qtype::AAAA, Qtype::A],
                "answer at {answer_ms} ms: the dropped A after its answered AAAA"
            );
            assert_eq!(kept.anomalies, [AnomalyKind::ParallelQueryLost]);
        }
    }

    /// `--pod web` deleted and re-created: the new sandbox's lookups are
    /// the target's from the refresh that found it.
    #[test]
    fn a_target_moved_to_a_new_sandbox_is_shown_from_then_on() {
        let target = target::Target {
            label: "pod default/web".into(),
            netns_inode: 555,
            addrs: vec!["10.244.0.99".parse().unwrap()],
            host_veth: None,
            resolv: None,
            namespace: None,
        };
        let out = Kept {
            kernel: KernelNames::default(),
            journeys: vec![],
            anomalies: vec![],
        };
        let mut sink =
            JourneySink::new(Limits::default(), Context::default(), out).only_from(Some(&target));
        // web's new sandbox: 10.244.0.10, netns 100 (see `dns_at`).
        let lookup = |sink: &mut JourneySink<Kept>, ms: u64| {
            let query = dns_at(ms, Hook::DevXmit, Qtype::A, false, None);
            sink.record(&query).unwrap();
            let answer = dns_at(ms + 1, Hook::DevReceive, Qtype::A, true, None);
            sink.record(&answer).unwrap();
            sink.tick((ms + 1000) * 1_000_000).unwrap();
        };
        lookup(&mut sink, 0);
        assert!(sink.out.journeys.is_empty(), "not the target's yet");
        sink.pods(
            &Refresh {
                target: Some(target::follow::Moved {
                    netns_inode: 100,
                    addrs: vec!["10.244.0.10".parse().unwrap()],
                    resolv: None,
                }),
                ..Refresh::default()
            },
            1_500_000_000,
        )
        .unwrap();
        lookup(&mut sink, 2000);
        assert_eq!(sink.out.journeys.len(), 1);
    }

    /// A TCP payload the capture did not hold is no malformed message: an
    /// exit line that called it one would send an SRE after a broken client.
    #[test]
    fn payloads_cut_by_the_capture_are_not_counted_malformed() {
        let garbage = packet("10.0.0.1:5000", "10.0.0.2:53", Transport::Udp, &[1, 2, 3]);
        let mut cut = packet(
            "10.0.0.1:5001",
            "10.0.0.2:53",
            Transport::Tcp {
                seq: 1,
                flags: 0x18,
            },
            &[],
        );
        (cut.truncated, cut.payload_len) = (true, 36);
        let labels = Labels::new(
            HashMap::new(),
            Clock::with_offset(0),
            KernelNames::default(),
        );
        let mut sink = LineSink::new(Format::Json, labels, Vec::new());
        let mut pipe = Pipeline::default();
        pipe.feed(vec![garbage, cut], &mut sink).unwrap();
        assert_eq!((pipe.counts.malformed, pipe.counts.cut), (1, 1));
        assert_eq!(
            pipe.counts.brief(),
            "2 DNS packets, 0 messages, 1 malformed, 1 not whole (cut by the capture, or a fragment missing)"
        );
    }
}
