//! `dnstrace agent`: the node traced whole, with no terminal, until
//! stopped, as a DaemonSet runs it. The pipeline is `trace`'s, following
//! up to `--follow-max` lookups a second whole; the kernel counts every
//! lookup. Both feed Prometheus metrics served over HTTP with health
//! endpoints, and the journeys, with an endpoint, traces and logs over OTLP.
pub mod api;
mod http;
pub mod web;

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc, Mutex, MutexGuard, OnceLock, PoisonError,
    },
    time::Duration,
};

use anyhow::{Context as _, Result};

use super::{
    exit::ExitReport,
    trace::{self, Consume, LiveSource, Started, TraceOptions},
};
use crate::{
    clock::monotonic_now,
    correlate::{Journey, Limits},
    decode::KernelNames,
    diagnose::{Anomaly, AnomalyKind},
    ingest::lookups::Counted,
    metrics::{Metrics, MetricsOptions},
    naming::Services,
    otlp::{self, Otlp, OtlpOptions},
    output::Labels,
    pipeline::{Health, Input, JourneyOut, JourneySink, Pipeline, Source, Stop, Tally},
    record::{
        flight::Flight,
        live::{Live, MemoryOptions},
    },
    target::follow::Refresh,
};

/// How often the agent's pipeline is told the time: its journeys end in
/// metrics and exports, not on a screen, and each tick wakes the process
/// (idle on the lab, 0.55% of a core at `trace`'s 50 ms; 0.12% at 250).
pub const TICK: Duration = Duration::from_millis(250);

/// Without a flight recorder, cluster views start from now.
const NO_MEMORY: MemoryOptions = MemoryOptions {
    bytes: 0,
    age_ns: 0,
};

/// What `dnstrace agent` was asked for.
pub struct AgentOptions {
    pub trace: TraceOptions,
    pub limits: Limits,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub listen: SocketAddr,
    /// Their TLS, basic auth and limits: Prometheus's web config file.
    pub web_config: Option<PathBuf>,
    pub metrics: MetricsOptions,
    /// Traces and logs to an OTLP collector, when asked for.
    pub otlp: Option<OtlpOptions>,
    /// The API for cluster views, unless turned off.
    pub api: Option<api::ApiOptions>,
    /// How often the service proxy's rules are read again.
    pub services_every: Duration,
}

/// What the pipeline and the HTTP endpoints share.
struct Shared {
    metrics: Mutex<Metrics>,
    /// Every hook attached and the ring being read.
    ready: AtomicBool,
    /// Kernel monotonic time of the pipeline's last tick.
    ticked_ns: AtomicU64,
    /// The OTLP exporter's counters, once it runs.
    otlp: OnceLock<Arc<otlp::Counts>>,
    /// The flight recorder's latest recording, when it is on.
    flight: Option<Arc<Mutex<Option<Flight>>>>,
    /// What the kernel counted since the pipeline's last tick, for the
    /// metrics to name by who holds each address then.
    counted: Mutex<Vec<Counted>>,
}

/// A panic while counting leaves numbers, never a broken invariant.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn metrics(&self) -> MutexGuard<'_, Metrics> {
        lock(&self.metrics)
    }

    fn flight(&self) -> Option<Flight> {
        let latest = self.flight.as_ref()?;
        lock(latest).clone()
    }
}

pub async fn run(mut o: AgentOptions) -> Result<()> {
    // Before anything is attached: a port in use is said at once.
    let listener = tokio::net::TcpListener::bind(o.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--metrics-addr)", o.listen))?;
    let web = o.web_config.map(web::WebConfig::open).transpose()?;
    let scheme = match &web {
        Some(w) if w.current().tls.is_some() => "https",
        _ => "http",
    };
    let node = o.metrics.node.clone();
    let api = match &o.api {
        Some(a) => Some((api::bind(a).await?, a.clone())),
        None => None,
    };
    let shared = Arc::new(Shared {
        metrics: Mutex::new(Metrics::new(o.metrics)),
        ready: AtomicBool::new(false),
        ticked_ns: AtomicU64::new(monotonic_now()),
        otlp: OnceLock::new(),
        flight: o.trace.flight.as_ref().map(|f| f.latest.clone()),
        counted: Mutex::new(Vec::new()),
    });
    let server = tokio::spawn(http::serve(listener, shared.clone(), web));
    let api = api.map(|(bound, a)| {
        // Its history is the flight recorder's memory, when there is one.
        let memory = o.trace.flight.as_ref().map_or(NO_MEMORY, |f| f.memory());
        let live = Live::new(memory);
        o.trace.live = Some(live.clone());
        log::info!(
            "serving cluster views on {} ({})",
            bound.addr().unwrap_or(a.listen),
            if a.tls.is_some() {
                "mutual TLS"
            } else {
                "loopback, no TLS"
            }
        );
        tokio::spawn(async move {
            if let Err(e) = api::serve(bound, live, node).await {
                log::error!("cluster views: {e:#}");
            }
        })
    });
    // Started while privileged: threads keep what they start with.
    let services = watch_services(o.trace.target.node_netns.clone(), o.services_every)
        .context("starting to watch the node's services")?;
    log::info!(
        "serving metrics on {scheme}://{}/metrics, health on /healthz and /readyz",
        o.listen
    );
    let agent = Agent {
        shared,
        limits: o.limits,
        otlp: o.otlp,
        services,
    };
    let result = trace::capture(o.trace, o.limits, agent).await;
    server.abort();
    api.inspect(tokio::task::JoinHandle::abort);
    result
}

struct Agent {
    shared: Arc<Shared>,
    limits: Limits,
    otlp: Option<OtlpOptions>,
    services: mpsc::Receiver<Vec<(IpAddr, String)>>,
}

impl Consume for Agent {
    async fn run(
        self,
        pipe: &mut Pipeline,
        src: &mut LiveSource<'_>,
        stop: &mut Stop,
        s: Started,
    ) -> Result<Option<Tally>> {
        let otlp = self
            .otlp
            .map(|o| {
                for (what, export) in [("traces", &o.traces), ("logs", &o.logs)] {
                    if let Some(e) = export {
                        log::info!(
                            "exporting {what} over OTLP ({:?}) to {}",
                            e.protocol,
                            e.endpoint
                        );
                    }
                }
                Otlp::start(o, s.labels.clock())
            })
            .transpose()?;
        if let Some(o) = &otlp {
            let _ = self.shared.otlp.set(o.counts());
        }
        let out = MetricsOut {
            shared: self.shared.clone(),
            labels: s.labels,
            resolvers: s.context.resolvers.clone(),
            otlp,
        };
        let mut sink = JourneySink::new(self.limits, s.context, out);
        self.shared.ready.store(true, Ordering::Relaxed);
        let mut src = Watched {
            src,
            shared: &self.shared,
            read_ns: 0,
            services: &self.services,
            pending: None,
        };
        let result = pipe.drive(&mut src, &mut sink, stop).await;
        self.shared.ready.store(false, Ordering::Relaxed);
        result
    }

    fn exit(report: &ExitReport, _json: bool) {
        report.log();
    }
}

/// The live source, with the capture's own counters and the lookups the
/// kernel counted read each second (the counts for the sink to name at
/// its next tick), each tick noted for `/healthz`, and the services' new
/// names handed on as pods' are.
struct Watched<'s, 'a> {
    src: &'s mut LiveSource<'a>,
    shared: &'s Shared,
    read_ns: u64,
    services: &'s mpsc::Receiver<Vec<(IpAddr, String)>>,
    pending: Option<Input>,
}

impl Source for Watched<'_, '_> {
    fn now(&self) -> u64 {
        self.src.now()
    }

    async fn next(&mut self) -> Result<Option<Input>> {
        if let Some(input) = self.pending.take() {
            return Ok(Some(input));
        }
        let input = self.src.next().await?;
        if let Some(Input::Tick(now_ns)) = &input {
            self.shared.ticked_ns.store(*now_ns, Ordering::Relaxed);
            if let Ok(names) = self.services.try_recv() {
                let refresh = Refresh {
                    names,
                    ..Refresh::default()
                };
                self.pending = Some(Input::Pods {
                    now_ns: *now_ns,
                    refresh,
                });
            }
            if now_ns.saturating_sub(self.read_ns) >= 1_000_000_000 {
                self.read_ns = *now_ns;
                let counted = self.src.counted(*now_ns);
                lock(&self.shared.counted).extend(counted);
                let stats = self.src.stats();
                self.shared.metrics().stats(&stats);
            }
        }
        Ok(input)
    }

    fn rest(&mut self) -> Vec<Input> {
        let mut rest: Vec<Input> = self.pending.take().into_iter().collect();
        rest.extend(self.src.rest());
        rest
    }
}

/// Reads the node's services again every `every` on a thread of
/// its own, started while privileged (iptables-save needs CAP_NET_ADMIN,
/// entering the node's namespace CAP_SYS_ADMIN); sends the names of their
/// cluster IPs when they changed. Endpoints keep their pods' names.
fn watch_services(
    node: Option<PathBuf>,
    every: Duration,
) -> std::io::Result<mpsc::Receiver<Vec<(IpAddr, String)>>> {
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("services".into())
        .spawn(move || {
            let mut last = Services::read(node.as_deref());
            loop {
                std::thread::sleep(every);
                let now = Services::read(node.as_deref());
                if now.cluster_ips == last.cluster_ips {
                    continue;
                }
                let new: Vec<&str> = now
                    .cluster_ips
                    .iter()
                    .filter(|(ip, _)| !last.cluster_ips.contains_key(ip))
                    .map(|(_, n)| n.as_str())
                    .collect();
                log::info!(
                    "services changed: {} cluster IPs named, new: {}",
                    now.cluster_ips.len(),
                    new.join(", ")
                );
                let names = now
                    .cluster_ips
                    .iter()
                    .map(|(ip, n)| (*ip, n.clone()))
                    .collect();
                if tx.send(names).is_err() {
                    return;
                }
                last = now;
            }
        })?;
    Ok(rx)
}

/// Journeys and anomalies into the metrics and the OTLP export;
/// anomalies also as log lines.
struct MetricsOut {
    shared: Arc<Shared>,
    labels: Labels,
    /// Clients whose lookups are queries upstream.
    resolvers: BTreeSet<IpAddr>,
    otlp: Option<Otlp>,
}

impl MetricsOut {
    fn flush_anomalies(&mut self) {
        if let Some(o) = &mut self.otlp {
            let flight = self.shared.flight();
            o.flush(flight.as_ref().and_then(|f| f.path.as_deref()));
        }
    }
}

impl JourneyOut for MetricsOut {
    fn kernel(&self) -> &KernelNames {
        self.labels.kernel()
    }

    fn journey(&mut self, j: Journey, badges: &[(AnomalyKind, String)]) -> std::io::Result<()> {
        let (names, kernel) = (self.labels.names(), self.labels.kernel());
        if let Some(o) = &mut self.otlp {
            o.journey(&j, names, kernel);
        }
        self.shared
            .metrics()
            .journey(&j, badges, names, kernel, j.ended_ns);
        Ok(())
    }

    fn anomaly(&mut self, a: &Anomaly) -> std::io::Result<()> {
        self.shared.metrics().anomaly(a, a.last_ns);
        if let Some(o) = &mut self.otlp {
            o.anomaly(a);
        }
        log::warn!(
            "anomaly {} ({}): {}",
            a.kind,
            a.severity.as_str(),
            a.summary
        );
        Ok(())
    }

    fn late(&mut self, hits: &[(AnomalyKind, String)]) {
        self.shared.metrics().late(hits, monotonic_now());
    }

    fn pods(&mut self, refresh: &Refresh) {
        self.labels.rename(refresh);
    }

    fn state(&mut self, _all: &[&Anomaly], health: &Health) -> std::io::Result<()> {
        let counted = std::mem::take(&mut *lock(&self.shared.counted));
        let mut metrics = self.shared.metrics();
        let now_ns = monotonic_now();
        for c in &counted {
            metrics.counted(c, self.labels.names(), &self.resolvers, now_ns);
        }
        metrics.health(health);
        drop(metrics);
        self.flush_anomalies();
        Ok(())
    }

    fn summary(&mut self, all: &[&Anomaly]) -> std::io::Result<()> {
        self.flush_anomalies();
        log::info!("{} anomalies raised while running", all.len());
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
