//! The capture pipeline, the same for every view: probes → ring buffer →
//! decode → a sink (packet lines, or journeys), until Ctrl-C or SIGTERM.
use std::{io, sync::Arc};

use anyhow::{Context as _, Result};
use tokio::{
    signal::unix::{signal, Signal, SignalKind},
    sync::Notify,
    time::{interval, Duration},
};

use crate::{
    cli::{CaptureArgs, OutputFormat},
    conntrack::{CtEvent, CtStats, CtWatcher, RACE_COUNTERS},
    correlate::{Engine, Journey, Limits},
    decode::{Body, Decoder, KernelNames, Packet, Record},
    diagnose::{Anomaly, ConntrackAtStart, Context, Diagnoser},
    ingest::Ingest,
    naming::{Names, Services},
    output::{monotonic_now, Clock, Labels, LineSink},
    probes::Probes,
    target,
    view::{self, model::Health, state::About, LiveOut},
};

/// Where decoded records go.
pub trait Sink {
    fn record(&mut self, rec: &Record) -> io::Result<()>;
    /// Kernel monotonic time has reached `now_ns`.
    fn tick(&mut self, now_ns: u64) -> io::Result<()>;
    /// Before the first event: what is known already.
    fn start(&mut self) -> io::Result<()> {
        Ok(())
    }
    /// A ctnetlink event of a DNS flow.
    fn conntrack(&mut self, ev: &CtEvent) -> io::Result<()>;
    /// The node's conntrack race counters rose: (name, increase).
    fn counters(&mut self, _moved: &[(&'static str, u64)]) -> io::Result<()> {
        Ok(())
    }
    /// The kernel has lost `total` events so far.
    fn lost(&mut self, total: u64);
    /// The capture ends: write what is left.
    fn finish(&mut self, now_ns: u64) -> io::Result<()>;
    /// A few words for the exit line.
    fn summary(&self) -> Option<String>;
}

impl<W: io::Write> Sink for LineSink<W> {
    fn record(&mut self, rec: &Record) -> io::Result<()> {
        self.write(rec)
    }
    fn conntrack(&mut self, ev: &CtEvent) -> io::Result<()> {
        self.write_conntrack(ev, monotonic_now())
    }
    fn tick(&mut self, _: u64) -> io::Result<()> {
        self.flush()
    }
    fn lost(&mut self, _: u64) {}
    fn finish(&mut self, _: u64) -> io::Result<()> {
        self.flush()
    }
    fn summary(&self) -> Option<String> {
        None
    }
}

/// Where finished journeys and anomalies go: lines, or the live view.
pub trait JourneyOut {
    fn labels(&self) -> &Labels;
    /// A finished journey and the anomalies (kind, summary) it fed.
    fn journey(&mut self, j: &Journey, badges: &[(&'static str, String)]) -> io::Result<()>;
    /// An anomaly raised for the first time.
    fn anomaly(&mut self, a: &Anomaly) -> io::Result<()>;
    /// Every tick: every anomaly so far and the capture's health.
    fn state(&mut self, _all: &[&Anomaly], _health: &Health) -> io::Result<()> {
        Ok(())
    }
    /// At the end: every anomaly of the run.
    fn summary(&mut self, all: &[&Anomaly]) -> io::Result<()>;
    fn flush(&mut self) -> io::Result<()>;
}

impl<W: io::Write> JourneyOut for LineSink<W> {
    fn labels(&self) -> &Labels {
        LineSink::labels(self)
    }
    fn journey(&mut self, j: &Journey, _: &[(&'static str, String)]) -> io::Result<()> {
        self.write_journey(j)
    }
    fn anomaly(&mut self, a: &Anomaly) -> io::Result<()> {
        self.write_anomaly(a)
    }
    fn summary(&mut self, all: &[&Anomaly]) -> io::Result<()> {
        self.write_summary(all)
    }
    fn flush(&mut self) -> io::Result<()> {
        LineSink::flush(self)
    }
}

/// Journeys: records into the correlation engine, finished journeys out,
/// and through the diagnosis rules.
pub struct JourneySink<O: JourneyOut> {
    engine: Engine,
    diagnoser: Diagnoser,
    pub out: O,
    printed: u64,
    lost: u64,
    /// With a target: (its netns, its addresses). The kernel also passes
    /// its resolvers' upstream queries, which belong to others' lookups
    /// unless linked under one of the target's journeys.
    only: Option<(u32, Vec<std::net::IpAddr>)>,
}

impl<O: JourneyOut> JourneySink<O> {
    pub fn new(limits: Limits, context: Context, out: O) -> Self {
        Self {
            engine: Engine::new(limits),
            diagnoser: Diagnoser::new(context),
            out,
            printed: 0,
            lost: 0,
            only: None,
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
        for j in &journeys {
            let new = self.diagnoser.journey(j, self.out.labels().kernel());
            self.out.journey(j, self.diagnoser.hits())?;
            self.printed += 1;
            for a in new {
                self.out.anomaly(&a)?;
            }
        }
        self.out.flush()
    }

    fn health(&self, now_ns: u64) -> Health {
        Health {
            now_ns,
            lost: self.lost,
            evicted: self.engine.evicted(),
            open: self.engine.open_count(),
        }
    }
}

impl<O: JourneyOut> Sink for JourneySink<O> {
    fn start(&mut self) -> io::Result<()> {
        let now = monotonic_now();
        for a in self.diagnoser.static_checks(now) {
            self.out.anomaly(&a)?;
        }
        self.out
            .state(&self.diagnoser.summary(), &self.health(now))?;
        self.out.flush()
    }
    fn record(&mut self, rec: &Record) -> io::Result<()> {
        self.engine.push(rec);
        Ok(())
    }
    fn conntrack(&mut self, ev: &CtEvent) -> io::Result<()> {
        self.engine.conntrack(ev);
        Ok(())
    }
    fn counters(&mut self, moved: &[(&'static str, u64)]) -> io::Result<()> {
        for a in self.diagnoser.counters_moved(moved, monotonic_now()) {
            self.out.anomaly(&a)?;
        }
        Ok(())
    }
    fn tick(&mut self, now_ns: u64) -> io::Result<()> {
        let done = self.engine.tick(now_ns);
        self.print(done)?;
        let engine = &self.engine;
        let late = self.diagnoser.tick(now_ns, |client, name, qtype, since| {
            engine.asked_over_tcp(client, name, qtype, since)
        });
        for a in late {
            self.out.anomaly(&a)?;
        }
        self.out
            .state(&self.diagnoser.summary(), &self.health(now_ns))?;
        self.out.flush()
    }
    fn lost(&mut self, total: u64) {
        self.lost = total;
        self.engine.lost();
    }
    fn finish(&mut self, now_ns: u64) -> io::Result<()> {
        let rest = self.engine.finish(now_ns);
        self.print(rest)?;
        self.out.summary(&self.diagnoser.summary())?;
        self.out.flush()
    }
    fn summary(&self) -> Option<String> {
        Some(format!(
            "{} journeys, {} evicted (too many open at once), {} anomalies",
            self.printed,
            self.engine.evicted(),
            self.diagnoser.summary().len()
        ))
    }
}

/// What to show.
pub enum View {
    Packets,
    Journeys(Limits),
    /// The live terminal view of journeys.
    Live(Limits),
}

#[derive(Default, Debug)]
struct Counts {
    packets: u64,
    messages: u64,
    malformed: u64,
}

/// Ctrl-C and SIGTERM, caught from the start so that a stop during
/// start-up still detaches everything.
struct Stop {
    int: Signal,
    term: Signal,
    /// The live view's quit key.
    quit: Option<Arc<Notify>>,
}

impl Stop {
    fn new() -> io::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            quit: None,
        })
    }

    async fn wait(&mut self) {
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

pub async fn run(args: CaptureArgs, view: View) -> Result<()> {
    let mut stop = Stop::new()?;
    crate::probes::check_privileges()?;
    let node = args.node_netns.as_deref();
    let target = target::resolve(&args)?;
    let services = Services::read(node);
    let pods = target::pod_addresses(&args);
    let filter = target
        .as_ref()
        .map(|t| t.kernel_filter(&target::resolvers(&services, &pods)))
        .transpose()?;
    let mut probes = Probes::attach(&args, filter.as_ref())?;
    announce(&probes);
    if let Some(t) = &target {
        eprintln!("dnstrace: {}", t.describe());
    }
    let mut ingest = Ingest::new(probes.take_events()?).context("watching the ring buffer")?;
    // Root reads real addresses from kallsyms; drop locations need them.
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    let kernel = KernelNames::new(std::mem::take(&mut probes.drop_reasons), &kallsyms);
    let labels = Labels::new(probes.iface_names(), Clock::now(), kernel)
        .with_names(Names::new(&services, &pods));
    let format = args.output.unwrap_or(OutputFormat::Text);
    let (ct, stats) = watch_conntrack(args.node_netns.as_deref());
    let mut pipe = Pipeline {
        ingest: &mut ingest,
        decoder: Decoder::default(),
        counts: Counts::default(),
        probes: &probes,
        lost_seen: 0,
        ct,
        stats,
        ports: args.ports.clone(),
    };
    let ports: Vec<String> = args.ports.iter().map(u16::to_string).collect();
    eprintln!(
        "dnstrace: capturing DNS on port {}; Ctrl-C to stop",
        ports.join(",")
    );
    let context = context_of(node, &services, target.clone());
    let result = match view {
        View::Packets => {
            let mut lines = LineSink::new(format, labels, io::stdout().lock());
            pipe.drive(&mut lines, &mut stop).await
        }
        View::Journeys(limits) => {
            let lines = LineSink::new(format, labels, io::stdout().lock());
            let mut sink = JourneySink::new(limits, context, lines).only_from(target.as_ref());
            pipe.drive(&mut sink, &mut stop).await
        }
        View::Live(limits) => {
            let about = About {
                target: target.as_ref().map_or("the whole node".into(), headline),
                hooks: probes.attachments.len(),
                log: None,
            };
            let log = args.log_file.clone().unwrap_or_else(view::default_log);
            let sink = |out| JourneySink::new(limits, context, out).only_from(target.as_ref());
            live(&mut pipe, &mut stop, about, &log, labels, sink).await
        }
    };
    let exit = ExitReport {
        counts: pipe.counts,
        evicted_streams: pipe.decoder.evicted_streams(),
        summary: result.as_ref().ok().cloned().flatten(),
        lost: probes.lost_events().unwrap_or(0),
        targets: probes.targets(),
        bad_events: ingest.bad_events,
    };
    // Detach before saying so.
    drop(probes);
    exit.print();
    result.map(drop)
}

/// The live view's capture: the view takes the terminal and stderr until
/// the capture ends, then the anomalies are printed on the terminal.
async fn live(
    pipe: &mut Pipeline<'_>,
    stop: &mut Stop,
    mut about: About,
    log: &std::path::Path,
    labels: Labels,
    sink: impl FnOnce(LiveOut) -> JourneySink<LiveOut>,
) -> Result<Option<String>> {
    let quit = Arc::new(Notify::new());
    stop.quit = Some(quit.clone());
    about.log = Some(log.display().to_string());
    let (view, out) = view::start(about, log, labels, quit)?;
    let mut sink = sink(out);
    let result = pipe.drive(&mut sink, stop).await;
    let anomalies = sink.out.summary.take();
    drop(sink);
    let closed = view.close();
    report_log(log);
    print!("{}", anomalies.unwrap_or_default());
    closed.and(result)
}

/// Points at the log of the live session, or removes it when empty.
fn report_log(log: &std::path::Path) {
    match std::fs::metadata(log) {
        Ok(m) if m.len() == 0 => drop(std::fs::remove_file(log)),
        Ok(_) => eprintln!("dnstrace: the session's log lines are in {}", log.display()),
        Err(_) => {}
    }
}

/// `pod default/web-… (10.244.0.10)`: the target in a few words.
fn headline(t: &target::Target) -> String {
    let addrs: Vec<String> = t.addrs.iter().map(ToString::to_string).collect();
    format!("{} ({})", t.label, addrs.join(", "))
}

/// What the diagnosis rules need to know about the node.
fn context_of(
    node: Option<&std::path::Path>,
    services: &Services,
    target: Option<target::Target>,
) -> Context {
    Context {
        service_ips: services.dns_ips.clone(),
        target,
        bridge_nf_call_iptables: crate::netns::sysctl(node, "net/bridge/bridge-nf-call-iptables"),
        node_netns: crate::netns::inode(node).unwrap_or(0),
        conntrack: conntrack_at_start(node),
    }
}

/// What conntrack dropped before now, and how full its table is.
fn conntrack_at_start(node: Option<&std::path::Path>) -> Option<ConntrackAtStart> {
    let stats = CtStats::open(node).and_then(|mut s| s.read()).ok()?;
    let dropped = RACE_COUNTERS
        .iter()
        .filter(|n| **n != "clashres")
        .map(|n| (*n, stats.get(*n).copied().unwrap_or(0)))
        .collect();
    Some(ConntrackAtStart {
        dropped,
        entries: stats.get("entries").copied().unwrap_or(0),
        max: crate::netns::sysctl(node, "net/netfilter/nf_conntrack_max")
            .and_then(|v| v.parse().ok()),
    })
}

/// Says what is attached, and what is off and why.
fn announce(probes: &Probes) {
    for a in &probes.attachments {
        eprintln!(
            "dnstrace: {} (prog id {}) attached to {} ({})",
            a.program, a.prog_id, a.target, a.how
        );
    }
    for why in &probes.off {
        eprintln!("dnstrace: off: {why}");
    }
}

/// ctnetlink events and statistics of the node's namespace; either may be
/// unavailable, which is said and does not stop the capture.
fn watch_conntrack(node: Option<&std::path::Path>) -> (Option<CtWatcher>, Option<RaceWatch>) {
    let ct = CtWatcher::open(node)
        .map_err(|e| eprintln!("dnstrace: off: conntrack events: {e:#}"))
        .ok();
    let stats = CtStats::open(node)
        .map_err(|e| eprintln!("dnstrace: off: conntrack statistics: {e:#}"))
        .ok();
    (ct, stats.map(RaceWatch::new))
}

struct ExitReport {
    counts: Counts,
    evicted_streams: u64,
    summary: Option<String>,
    lost: u64,
    targets: Vec<String>,
    bad_events: u64,
}

impl ExitReport {
    fn print(&self) {
        let c = &self.counts;
        eprintln!(
            "dnstrace: {} DNS packets, {} messages, {} malformed{}; {} events lost; detached from {}",
            c.packets,
            c.messages,
            c.malformed,
            self.summary.as_ref().map(|s| format!(", {s}")).unwrap_or_default(),
            self.lost,
            self.targets.join(", ")
        );
        if self.evicted_streams > 0 {
            eprintln!(
                "dnstrace: {} TCP streams dropped from reassembly (too many open at once)",
                self.evicted_streams
            );
        }
        if self.bad_events > 0 {
            eprintln!(
                "dnstrace: {} kernel events could not be decoded",
                self.bad_events
            );
        }
    }
}

struct Pipeline<'a> {
    ingest: &'a mut Ingest,
    decoder: Decoder,
    counts: Counts,
    probes: &'a Probes,
    lost_seen: u64,
    ct: Option<CtWatcher>,
    stats: Option<RaceWatch>,
    ports: Vec<u16>,
}

/// The conntrack counters that move when inserts race or fail, reported
/// when they change.
struct RaceWatch {
    stats: CtStats,
    last: Vec<u64>,
}

impl RaceWatch {
    fn new(mut stats: CtStats) -> Self {
        let last = Self::values(&mut stats);
        let now: Vec<String> = RACE_COUNTERS
            .iter()
            .zip(&last)
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        eprintln!("dnstrace: conntrack statistics: {}", now.join(" "));
        Self { stats, last }
    }

    fn values(stats: &mut CtStats) -> Vec<u64> {
        let all = stats.read().unwrap_or_default();
        RACE_COUNTERS
            .iter()
            .map(|n| all.get(*n).copied().unwrap_or(0))
            .collect()
    }

    /// Reports and returns the counters that rose since the last check.
    fn check(&mut self) -> Vec<(&'static str, u64)> {
        let now = Self::values(&mut self.stats);
        let rose: Vec<(&'static str, u64)> = RACE_COUNTERS
            .iter()
            .zip(now.iter().zip(&self.last))
            .filter(|(_, (n, l))| n > l)
            .map(|(name, (n, l))| (*name, n - l))
            .collect();
        if !rose.is_empty() {
            let moved: Vec<String> = rose
                .iter()
                .map(|(name, d)| format!("{name} +{d}"))
                .collect();
            eprintln!("dnstrace: conntrack statistics moved: {}", moved.join(", "));
        }
        self.last = now;
        rose
    }
}

/// Waits for ctnetlink events, or forever without a watcher.
async fn ct_events(ct: &mut Option<CtWatcher>, ports: &[u16]) -> io::Result<Vec<CtEvent>> {
    match ct {
        Some(w) => w.next(|p| ports.contains(&p)).await,
        None => std::future::pending().await,
    }
}

impl Pipeline<'_> {
    /// Moves events into `sink` until a signal arrives or stdout closes;
    /// returns the sink's summary.
    async fn drive<S: Sink>(&mut self, sink: &mut S, stop: &mut Stop) -> Result<Option<String>> {
        sink.start().context("writing to stdout")?;
        let mut tick = interval(Duration::from_millis(100));
        let mut stats_tick = interval(Duration::from_secs(1));
        let result = loop {
            let mut batch = Vec::new();
            tokio::select! {
                () = stop.wait() => break Ok(()),
                r = self.ingest.next_batch(&mut batch) => r.context("reading the ring buffer")?,
                events = ct_events(&mut self.ct, &self.ports) => {
                    match events {
                        Ok(events) => {
                            if let Err(e) = events.iter().try_for_each(|ev| sink.conntrack(ev)) {
                                break Err(e);
                            }
                        }
                        Err(e) => {
                            eprintln!("dnstrace: conntrack events stopped: {e}");
                            self.ct = None;
                        }
                    }
                }
                _ = stats_tick.tick() => {
                    let rose = self.stats.as_mut().map(RaceWatch::check).unwrap_or_default();
                    if let Err(e) = sink.counters(&rose) {
                        break Err(e);
                    }
                }
                _ = tick.tick() => {
                    self.check_lost(sink);
                    if let Err(e) = sink.tick(monotonic_now()) {
                        break Err(e);
                    }
                }
            }
            if let Err(e) = self.feed(batch, sink) {
                break Err(e);
            }
        };
        let mut rest = Vec::new();
        self.ingest.drain_now(&mut rest);
        // Journeys closed now must know about losses since the last tick.
        self.check_lost(sink);
        let result = result
            .and_then(|()| self.feed(rest, sink))
            .and_then(|()| sink.finish(monotonic_now()));
        result
            .map(|()| sink.summary())
            .or_else(|e| ignore_closed_stdout(e).map(|()| sink.summary()))
    }

    fn check_lost(&mut self, sink: &mut impl Sink) {
        let lost = self.probes.lost_events().unwrap_or(0);
        if lost > self.lost_seen {
            eprintln!("dnstrace: warning: {lost} events lost so far (ring buffer full; raise --ring-buffer-mib)");
            self.lost_seen = lost;
            sink.lost(lost);
        }
    }

    fn feed(&mut self, batch: Vec<Packet>, sink: &mut impl Sink) -> io::Result<()> {
        let mut records = Vec::new();
        for packet in batch {
            self.counts.packets += 1;
            self.decoder.decode(packet, &mut records);
        }
        for rec in &records {
            match rec.body {
                Body::Dns(_) => self.counts.messages += 1,
                Body::Malformed { .. } => self.counts.malformed += 1,
            }
            sink.record(rec)?;
        }
        Ok(())
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
