//! Live tracing: find the target, attach the probes, and feed what the
//! kernel hands over (ring buffer, ctnetlink, conntrack counters, a clock)
//! through the pipeline into the chosen view, until Ctrl-C, SIGTERM or `q`.
use std::{collections::VecDeque, io};

use anyhow::{Context as _, Result};
use dnstrace_common::{Hook, SampleLevel};
use tokio::time::{interval, Duration, Interval};

use super::{check::announce, exit::ExitReport, ready::Ready, Show};
use crate::{
    clock::{monotonic_now, Clock},
    conntrack::{CtEvent, CtStats, CtWatcher, RACE_COUNTERS},
    correlate::Limits,
    decode::{kernel::Preload, KernelNames, NodeId, Packet},
    diagnose::{ConntrackAtStart, Context, Translation},
    ingest::{
        lookups::{Counted, LookupCounter},
        Ingest, Read, Ring, SampleMode, Sampler,
    },
    ingest::{SampleChange, Viewed},
    links::LinkWatch,
    metrics::Stats,
    naming::{Names, Services},
    output::{Format, Labels},
    pipeline::{Input, Pipeline, Source, Stop, Tally, Tap, Taps, View},
    pods::{CriAnswer, Inventory},
    probes::{Load, ProbeOptions, Probes},
    record::{
        self,
        flight::{FlightOptions, FlightRecorder},
        live::Live,
        RecordOptions, Recorder,
    },
    routes::Routes,
    target::{
        self,
        follow::{Follower, Following, Pods, Refresh},
    },
    view::state::About,
};

/// How often `trace`'s pipeline is told the time, after the ring has been
/// read up to it, to close the journeys that have finished: often enough
/// for a live view.
pub const TICK: Duration = Duration::from_millis(50);

/// What `dnstrace trace` was asked for.
pub struct TraceOptions {
    pub probes: ProbeOptions,
    pub target: target::Query,
    pub sample: SampleMode,
    /// The sampling hash's first seed; random when `None`.
    pub sample_seed: Option<u32>,
    /// Lookups a second followed whole at most, with `SampleMode::Auto`
    /// (0: no limit); the agent's, whose counts are the kernel's.
    pub follow_max: u32,
    /// Past level 0, follows in windows, the device tracepoints detached
    /// between (`Governor::with_windows`); the agent's, whose counts are
    /// the kernel's, at the sockets.
    pub follow_windows: bool,
    /// How often the pipeline is told the time (`TICK` for a live view).
    pub tick: Duration,
    pub record: Option<RecordOptions>,
    /// The agent's flight recorder, when there is no `record`.
    pub flight: Option<FlightOptions>,
    /// The agent's memory and viewers (`dnstrace cluster`).
    pub live: Option<Live>,
    /// Events read off the ring and dropped undecoded: what the kernel
    /// side costs on its own (set by the bench, through the harness).
    pub discard_events: bool,
    pub format: Format,
    pub log_file: Option<std::path::PathBuf>,
    /// Written once the capture has started (`ready`).
    pub ready_file: Option<std::path::PathBuf>,
}

pub async fn run(args: TraceOptions, view: View) -> Result<()> {
    let limits = match view {
        View::Journeys(l) | View::Live(l) => l,
        View::Packets => Limits::default(),
    };
    capture(args, limits, Views(view)).await
}

/// What runs a live capture's pipeline once every hook is attached: the
/// views of `trace`, or the agent.
pub(super) trait Consume {
    #[allow(async_fn_in_trait)]
    async fn run(
        self,
        pipe: &mut Pipeline,
        src: &mut LiveSource<'_>,
        stop: &mut Stop,
        started: Started,
    ) -> Result<Option<Tally>>;

    /// What the capture saw and lost, said at its end.
    fn exit(report: &ExitReport, json: bool) {
        report.print(json);
    }
}

/// What a capture knows once it has started.
pub(super) struct Started {
    pub format: Format,
    pub labels: Labels,
    pub context: Context,
    pub target: Option<target::Target>,
    pub about: About,
    pub log_file: Option<std::path::PathBuf>,
}

/// Whose lookups cluster views follow now, said on stderr.
fn say_viewed(viewed: &Viewed) {
    match viewed.ips() {
        [] => log::info!("no cluster view now: following by the budget alone again"),
        ips => {
            let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
            log::info!(
                "a cluster view watches {}: their lookups followed whole, whatever the budget",
                ips.join(", ")
            );
        }
    }
}

/// `trace`'s views: lines of packets or journeys, or the live view.
struct Views(View);

impl Consume for Views {
    async fn run(
        self,
        pipe: &mut Pipeline,
        src: &mut LiveSource<'_>,
        stop: &mut Stop,
        s: Started,
    ) -> Result<Option<Tally>> {
        let show = Show {
            view: self.0,
            format: s.format,
            labels: s.labels,
            context: s.context,
            target: s.target,
            about: s.about,
            log: s.log_file,
            hold: false,
        };
        show.run(pipe, src, stop).await
    }
}

/// Finds the target, attaches the probes, and runs `consumer` on what the
/// kernel hands over, until it ends or is stopped; detaches and reports.
pub(super) async fn capture<C: Consume>(
    args: TraceOptions,
    limits: Limits,
    consumer: C,
) -> Result<()> {
    let mut stop = Stop::new()?;
    crate::probes::check_privileges()?;
    let node = args.target.node_netns.as_deref();
    let scope = target::scope(&args.target)?;
    let (inventory, cri) = target::inventory(&args.target).await;
    let scope = scope.map(|s| s.with_pods(&inventory.pods));
    let target = target::resolve(&args.target, &inventory)?;
    let pods = target::node_pods(&args.target, &inventory);
    let services = services_for(node, target.as_ref(), &pods);
    let resolvers = target::resolvers(&services, &pods);
    let filter = target
        .as_ref()
        .map(|t| t.kernel_filter(&resolvers))
        .transpose()?;
    let kernel_scope = scope.as_ref().map(target::Scope::kernel);
    let mut probes = Probes::attach(
        &args.probes,
        filter.as_ref(),
        kernel_scope.as_ref(),
        Load::Attachable,
    )?;
    announce(&probes);
    if let Some(s) = &scope {
        log::info!("{}", s.describe());
    }
    if let Some(t) = &target {
        log::info!("{}", t.describe());
    }
    log::info!("{}", services.describe());
    let ring = Ring::open(probes.take_events()?)?;
    let lookups = match args.probes.count_lookups {
        true => Some(
            LookupCounter::new(probes.take_lookup_maps()?, limits.timeout_ns)
                .context("mapping the kernel's pending queries")?,
        ),
        false => None,
    };
    // The agent's cluster views follow their lookups whole.
    let views = match &args.live {
        Some(live) => Some((probes.view_map()?, live.views())),
        None => None,
    };
    let sampler = Sampler::new(probes.take_sample_level()?, probes.counts()?, args.sample)
        .with_seed(args.sample_seed)
        .with_budget(args.follow_max)
        .with_windows(
            (args.follow_windows && args.probes.count_lookups).then(|| probes.take_device_hooks()),
        )
        .with_views(views);
    // Root reads real addresses from kallsyms; drop locations need them.
    // Opened now, while privileged; read once a drop is seen, or now when
    // recording.
    let kallsyms: Box<dyn std::io::Read + Send> = match std::fs::File::open("/proc/kallsyms") {
        Ok(f) => Box::new(f),
        Err(_) => Box::new(std::io::empty()),
    };
    let kernel = KernelNames::new(std::mem::take(&mut probes.drop_reasons), kallsyms);
    let mut preload = kernel.preload();
    // A recording names a drop's location as it writes the packet, in the
    // pipeline: kallsyms is read now rather than waited for then.
    if args.record.is_some() || args.flight.is_some() {
        preload.start();
    }
    let labels = Labels::new(probes.iface_names(), Clock::now(), kernel).with_names(
        Names::new(&services, &pods.addresses)
            .with_workloads(target::workloads(&inventory, &pods.addresses))
            .with_uids(target::uids(&inventory, &pods.addresses)),
    );
    let drops_visible = probes
        .attachments
        .iter()
        .any(|a| a.program == "dns_kfree_skb");
    let context = Context {
        names: labels.names().clone(),
        ..context_of(
            node,
            &services,
            target.clone(),
            drops_visible,
            &pods,
            resolvers,
        )
    };
    let scoped_to = scope.as_ref().map(|s| s.node.as_str());
    let meta = || record::meta(&labels, &context, limits).of_node(scoped_to);
    // The memory a flight recorder writes out and cluster views reach back
    // into: the agent's, or the flight recorder's own.
    let live = args
        .live
        .or_else(|| args.flight.as_ref().map(|f| Live::new(f.memory())));
    let mut taps: Vec<Box<dyn Tap>> = Vec::new();
    if let Some(live) = &live {
        live.started(meta(), &pods.addresses);
        taps.push(Box::new(live.clone()));
    }
    match (args.record, args.flight, live) {
        (Some(options), _, _) => taps.push(Box::new(Recorder::create(options, meta())?)),
        (None, Some(flight), Some(live)) => taps.push(Box::new(FlightRecorder::new(
            flight,
            meta(),
            labels.clock(),
            live,
        ))),
        _ => {}
    }
    let recorder: Option<Box<dyn Tap>> = match taps.len() {
        0 => None,
        1 => taps.pop(),
        _ => Some(Box::new(Taps(taps))),
    };
    let at_start = AtStart {
        inventory: &inventory,
        target: target.as_ref(),
        services: &services,
        pods: &pods,
        scope: scope.as_ref(),
    };
    let following = following(&cri, &args.target, &at_start, &probes)?;
    let (ct, stats) = watch_conntrack(node);
    // The namespace of the --iface devices, or the node's.
    let links = LinkWatch::open(if args.probes.ifaces.is_empty() {
        node
    } else {
        None
    })
    .map_err(|e| log::info!("off: link changes: {e:#}"))
    .ok();
    // Everything privileged is open now.
    probes.drop_privileges()?;
    let follower = following.map(Follower::start).transpose()?;
    if let Some(log) = probes.take_kernel_log() {
        log.forward().context("forwarding the programs' log")?;
    }
    // Capabilities are per thread: the reader starts without them.
    let ingest = Ingest::new(ring, args.tick, args.discard_events, Some(sampler))
        .context("reading the ring buffer")?;
    // Loading parsed the kernel's BTF and ELF (tens of MiB, freed): those
    // pages go back within a second, so a long incident starts small.
    return_freed_memory_in_background();
    let watches = Watches {
        ct,
        stats,
        links,
        follower,
    };
    let ports = args.probes.ports.clone();
    let mut src = LiveSource::new(
        ingest,
        &probes,
        watches,
        ports,
        preload,
        args.sample,
        lookups,
    );
    let mut pipe = Pipeline::recording(recorder);
    let ports: Vec<String> = args.probes.ports.iter().map(u16::to_string).collect();
    log::info!("capturing DNS on port {}; Ctrl-C to stop", ports.join(","));
    let ready = Ready::new(&probes.attachments, &args.probes.ports).with_scope(scope.as_ref());
    if args.format == Format::Json {
        eprintln!("{}", ready.json());
    }
    let _ready_file = args.ready_file.map(|p| ready.write(&p)).transpose()?;
    let about = About {
        target: headline(target.as_ref(), scope.as_ref()),
        hooks: probes.attachments.len(),
        log: None,
    };
    let started = Started {
        format: args.format,
        labels,
        context,
        target,
        about,
        log_file: args.log_file,
    };
    let json = args.format == Format::Json;
    let result = consumer.run(&mut pipe, &mut src, &mut stop, started).await;
    let exit = ExitReport {
        counts: std::mem::take(&mut pipe.counts),
        evicted_streams: pipe.decoder.evicted_streams(),
        incomplete_datagrams: pipe.decoder.incomplete_datagrams(),
        evicted_datagrams: pipe.decoder.evicted_datagrams(),
        journeys: result.as_ref().ok().copied().flatten(),
        lost: probes.lost_events().unwrap_or(0),
        sampled_out: probes.shed_events().unwrap_or(0),
        laps_left_out: probes.laps_left_out().unwrap_or(0),
        apart_lost: probes.apart_lost().unwrap_or(0),
        skipped_runs: probes.skipped_runs(),
        one_in: src.level.one_in(),
        detached_from: probes.targets(),
        bad_events: src.ingest.bad_events(),
        discarded: src.ingest.discarded(),
        ct_overruns: src.watches.ct.as_ref().map_or(0, CtWatcher::overruns),
    };
    drop(src);
    // Detach before saying so.
    drop(probes);
    C::exit(&exit, json);
    result.map(drop)
}

/// Starts jemalloc's background thread, which returns freed memory to the
/// kernel also while tracing is idle (without it, only an allocation does).
/// A thread has the capabilities of the one that starts it: call this once
/// they are dropped.
fn return_freed_memory_in_background() {
    #[cfg(not(fuzzing))]
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        log::info!("off: returning freed memory to the kernel while idle: {e}");
    }
}

/// `pod default/web-… (10.244.0.10)`, or `the whole node`, and which
/// node with `--node`: what is traced in a few words.
fn headline(target: Option<&target::Target>, scope: Option<&target::Scope>) -> String {
    let what = match target {
        Some(t) => {
            let addrs: Vec<String> = t.addrs.iter().map(ToString::to_string).collect();
            format!("{} ({})", t.label, addrs.join(", "))
        }
        None => "the whole node".into(),
    };
    match scope {
        Some(s) => format!("{what}, node {}", s.node),
        None => what,
    }
}

/// The node's pods and names as tracing starts.
struct AtStart<'a> {
    inventory: &'a Inventory,
    target: Option<&'a target::Target>,
    services: &'a Services,
    pods: &'a target::NodePods,
    scope: Option<&'a target::Scope>,
}

/// What follows the node's pods while tracing, where a CRI socket
/// answered; where none did and a pod is the target, that is said once.
fn following(
    cri: &CriAnswer,
    query: &target::Query,
    start: &AtStart,
    probes: &Probes,
) -> Result<Option<Following>> {
    let CriAnswer::Answered { socket, .. } = cri else {
        if query.pod.is_some() {
            log::info!("off: following the pod into a new sandbox (needs a CRI socket)");
        }
        if start.scope.is_some() {
            log::info!("off: keeping the node's scope as pods come and go (needs a CRI socket)");
        }
        return Ok(None);
    };
    let watched = start.target.map(|_| probes.watched()).transpose()?;
    let scope = start.scope.map(|_| probes.scope()).transpose()?;
    let pods = Pods::new(
        start.inventory,
        query.pod.as_deref(),
        start.target,
        start.services.clone(),
        start.pods,
    )
    .with_scope(start.scope.cloned());
    Ok(Some(Following {
        socket: socket.clone(),
        pods,
        watched,
        scope,
    }))
}

/// The node's services; with no proxy rules, the target's nameservers
/// stand for the DNS service, or with no target the ClusterFirst pods'.
fn services_for(
    node: Option<&std::path::Path>,
    target: Option<&target::Target>,
    pods: &target::NodePods,
) -> Services {
    let mut services = Services::read(node);
    let nameservers = match target {
        Some(t) => t.resolv.as_ref().map_or(&[][..], |r| &r.nameservers),
        None => &pods.cluster_nameservers,
    };
    services.fall_back_to_nameservers(nameservers);
    services
}

/// What the diagnosis rules need to know about the node.
fn context_of(
    node: Option<&std::path::Path>,
    services: &Services,
    target: Option<target::Target>,
    drops_visible: bool,
    pods: &target::NodePods,
    resolvers: std::collections::BTreeSet<std::net::IpAddr>,
) -> Context {
    Context {
        attachments: pods.attachments.clone(),
        resolvers,
        service_ips: services.dns_ips.clone(),
        translation: if services.from_resolv_conf {
            Translation::Socket
        } else {
            Translation::Dnat
        },
        target,
        drops_visible,
        bridge_nf_call_iptables: crate::netns::sysctl(node, "net/bridge/bridge-nf-call-iptables"),
        node_netns: crate::netns::inode(node).unwrap_or(0),
        conntrack: conntrack_at_start(node),
        node_search: crate::pods::resolv::read_for_node(node)
            .map(|r| r.search)
            .unwrap_or_default(),
        routes: [(NodeId::default(), routes_of(node))].into(),
        ..Context::default()
    }
}

/// The node's routes through a gateway, or none, said, if they cannot be
/// read: the rules then name no next hop.
fn routes_of(node: Option<&std::path::Path>) -> Routes {
    crate::routes::read(node)
        .map_err(|e| log::info!("off: the node's routes: {e:#}"))
        .unwrap_or_default()
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

/// ctnetlink events and statistics of the node's namespace; either may be
/// unavailable, which is said and does not stop the capture.
fn watch_conntrack(node: Option<&std::path::Path>) -> (Option<CtWatcher>, Option<RaceWatch>) {
    let ct = CtWatcher::open(node)
        .map_err(|e| log::info!("off: conntrack events: {e:#}"))
        .ok();
    let stats = CtStats::open(node)
        .map_err(|e| log::info!("off: conntrack statistics: {e:#}"))
        .ok();
    (ct, stats.map(RaceWatch::new))
}

/// What else the kernel (and the runtime) tells while tracing, each
/// optional.
struct Watches {
    ct: Option<CtWatcher>,
    stats: Option<RaceWatch>,
    links: Option<LinkWatch>,
    follower: Option<Follower>,
}

/// The kernel's side: ring buffer batches and ticks (with any new losses),
/// ctnetlink events, conntrack counters each second.
pub(super) struct LiveSource<'a> {
    ingest: Ingest,
    probes: &'a Probes,
    watches: Watches,
    ports: Vec<u16>,
    stats_tick: Interval,
    lost_seen: u64,
    /// Runs of the programs the kernel skipped, so far.
    skipped_seen: u64,
    /// When the loss counters were last read.
    looked_ns: u64,
    queued: VecDeque<Input>,
    preload: Preload,
    /// The sampling level now, and how it is chosen.
    level: SampleLevel,
    /// Whose lookups cluster views follow whole now.
    viewed: Viewed,
    mode: SampleMode,
    /// The lookups the kernel counts, when it does (the agent).
    lookups: Option<LookupCounter>,
}

impl<'a> LiveSource<'a> {
    fn new(
        ingest: Ingest,
        probes: &'a Probes,
        watches: Watches,
        ports: Vec<u16>,
        preload: Preload,
        mode: SampleMode,
        lookups: Option<LookupCounter>,
    ) -> Self {
        Self {
            ingest,
            probes,
            watches,
            ports,
            preload,
            stats_tick: interval(Duration::from_secs(1)),
            lost_seen: 0,
            skipped_seen: 0,
            looked_ns: monotonic_now(),
            queued: VecDeque::new(),
            level: SampleLevel::default(),
            viewed: Viewed::default(),
            mode,
            lookups,
        }
    }

    /// What the kernel counted since the last call; nothing unless it counts.
    pub(super) fn counted(&mut self, now_ns: u64) -> Vec<Counted> {
        self.lookups
            .as_mut()
            .map(|l| l.read(now_ns))
            .unwrap_or_default()
    }

    /// A change of the sampling level, said on stderr (a new seed alone
    /// is not).
    fn sampling(&mut self, change: SampleChange) -> Input {
        if change.viewed != self.viewed {
            say_viewed(&change.viewed);
            self.viewed = change.viewed.clone();
        }
        // The agent's windows pause every few seconds: said once, by the
        // governor.
        if change.level.paused() {
            return Input::Sample(change);
        }
        let was = std::mem::replace(&mut self.level, change.level);
        if change.level.shift == was.shift {
            return Input::Sample(change);
        }
        let keeping = match change.level.one_in() {
            1 => "every lookup".to_owned(),
            n => format!("1 lookup in {n}, each whole"),
        };
        if self.mode != SampleMode::Auto {
            log::info!("sampling: keeping {keeping} (--sample)");
        } else if change.budget {
            log::info!("sampling: following {keeping}, about --follow-max a second at most");
        } else if change.level.shift > was.shift {
            log::warn!("falling behind the kernel: keeping {keeping} from now on (--sample 1 keeps every one, losing events instead)");
        } else {
            log::info!("keeping up again: keeping {keeping}");
        }
        Input::Sample(change)
    }

    /// A batch read off the ring; its first drop starts reading kallsyms.
    fn packets(&mut self, batch: Vec<Packet>) -> Input {
        if !self.preload.started() && batch.iter().any(|p| p.hook == Hook::Drop) {
            self.preload.start();
        }
        Input::Packets(batch)
    }

    /// The capture's own counters now, for the agent's metrics.
    pub(super) fn stats(&self) -> Stats {
        Stats {
            lost: self.probes.lost_events().unwrap_or(0),
            sampled_out: self.probes.shed_events().unwrap_or(0),
            laps_left_out: self.probes.laps_left_out().unwrap_or(0),
            skipped_runs: self.probes.skipped_runs(),
            bad_events: self.ingest.bad_events(),
            conntrack: self
                .watches
                .stats
                .as_ref()
                .map(RaceWatch::totals)
                .unwrap_or_default(),
            counting: self
                .lookups
                .as_ref()
                .map(LookupCounter::stats)
                .unwrap_or_default(),
        }
    }

    /// New kernel losses since the last look, said once on stderr: events
    /// the ring had no room for, and runs of the programs the kernel
    /// skipped. Either makes what was open then incomplete.
    fn lost(&mut self) -> Option<Input> {
        let total = self.probes.lost_events().unwrap_or(0);
        let skipped = self.probes.skipped_runs();
        let since_ns = std::mem::replace(&mut self.looked_ns, monotonic_now());
        if total <= self.lost_seen && skipped <= self.skipped_seen {
            return None;
        }
        if total > self.lost_seen {
            log::warn!("{total} events lost so far (ring buffer full; raise --ring-buffer-mib)");
        }
        if skipped > self.skipped_seen {
            log::warn!("the kernel skipped {skipped} runs of the programs so far (one already running on that CPU): those packets were not seen");
        }
        (self.lost_seen, self.skipped_seen) = (total, skipped);
        Some(Input::Lost {
            since_ns,
            now_ns: self.looked_ns,
            total,
        })
    }
}

impl Source for LiveSource<'_> {
    fn now(&self) -> u64 {
        monotonic_now()
    }

    async fn next(&mut self) -> Result<Option<Input>> {
        loop {
            if let Some(i) = self.queued.pop_front() {
                return Ok(Some(i));
            }
            tokio::select! {
                read = self.ingest.next() => match read.context("reading the ring buffer")? {
                    Read::Packets(batch) => return Ok(Some(self.packets(batch))),
                    Read::Sample(change) => return Ok(Some(self.sampling(change))),
                    Read::Tick(now_ns) => {
                        let lost = self.lost();
                        self.queued.extend(lost);
                        self.queued.push_back(Input::Tick(now_ns));
                    }
                },
                events = ct_events(&mut self.watches.ct, &self.ports) => match events {
                    Ok(events) => {
                        let now_ns = monotonic_now();
                        return Ok(Some(Input::Conntrack { now_ns, events }));
                    }
                    Err(e) => {
                        log::warn!("conntrack events stopped: {e}");
                        self.watches.ct = None;
                    }
                },
                refresh = pod_changes(&mut self.watches.follower) => {
                    return Ok(Some(Input::Pods { now_ns: monotonic_now(), refresh }));
                }
                said = link_changes(&mut self.watches.links) => match said {
                    Ok(said) => {
                        said.iter().for_each(|s| log::info!("{s}"));
                        // A sandbox comes or goes with its veth.
                        self.watches.follower.iter().for_each(Follower::poke);
                    }
                    Err(e) => {
                        log::warn!("link changes stopped: {e}");
                        self.watches.links = None;
                    }
                },
                _ = self.stats_tick.tick() => {
                    let moved = self.watches.stats.as_mut().map(RaceWatch::check).unwrap_or_default();
                    if !moved.is_empty() {
                        return Ok(Some(Input::Counters { now_ns: monotonic_now(), moved }));
                    }
                }
            }
        }
    }

    fn rest(&mut self) -> Vec<Input> {
        let mut rest: Vec<Input> = self.queued.drain(..).collect();
        // Journeys closed now must know about losses since the last tick.
        rest.extend(self.lost());
        let read = self.ingest.rest().unwrap_or_else(|e| {
            log::warn!("reading the ring buffer: {e}");
            Vec::new()
        });
        rest.extend(read.into_iter().map(|r| match r {
            Read::Packets(batch) => Input::Packets(batch),
            Read::Sample(change) => self.sampling(change),
            Read::Tick(now_ns) => Input::Tick(now_ns),
        }));
        rest
    }
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
        log::info!("conntrack statistics: {}", now.join(" "));
        Self { stats, last }
    }

    fn values(stats: &mut CtStats) -> Vec<u64> {
        let all = stats.read().unwrap_or_default();
        RACE_COUNTERS
            .iter()
            .map(|n| all.get(*n).copied().unwrap_or(0))
            .collect()
    }

    /// The counters as last read.
    fn totals(&self) -> Vec<(&'static str, u64)> {
        RACE_COUNTERS
            .iter()
            .copied()
            .zip(self.last.iter().copied())
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
            log::info!("conntrack statistics moved: {}", moved.join(", "));
        }
        self.last = now;
        rose
    }
}

/// Waits for the pods to change, or forever without a follower.
async fn pod_changes(follower: &mut Option<Follower>) -> Refresh {
    match follower {
        Some(f) => f.next().await,
        None => std::future::pending().await,
    }
}

/// Waits for link changes, or forever without a watcher.
async fn link_changes(links: &mut Option<LinkWatch>) -> io::Result<Vec<String>> {
    match links {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}

/// Waits for ctnetlink events, or forever without a watcher.
async fn ct_events(ct: &mut Option<CtWatcher>, ports: &[u16]) -> io::Result<Vec<CtEvent>> {
    match ct {
        Some(w) => w.next(|p| ports.contains(&p)).await,
        None => std::future::pending().await,
    }
}
