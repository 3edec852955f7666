//! The agent's API for cluster views (`dnstrace cluster`): gRPC on one
//! port, `dnstrace.v1.Observer` (proto/dnstrace/v1/observer.proto). Every
//! pod's DNS goes through it, so it is mutual TLS, a viewer's certificate
//! signed by the CA given, or loopback only.
use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    pin::Pin,
    sync::{atomic::Ordering, Arc, Mutex},
};

use anyhow::{bail, Context as _, Result};
use tokio::sync::mpsc;
use tokio_stream::{wrappers::ReceiverStream, Stream};
use tonic::{
    transport::{server::TcpIncoming, Certificate, Identity, Server, ServerTlsConfig},
    Request, Response, Status,
};

use crate::{
    clock::{monotonic_now, Clock},
    commands::observer::{
        observer_server::{Observer, ObserverServer},
        Evidence, NodeReply, NodeRequest, Pod, WatchRequest,
    },
    pipeline::{Input, Tap as _},
    record::{
        live::{After, Live, Subscription},
        watch::Watch,
        Recorder,
    },
};

/// The API's port: beside the metrics' 9355, taken by nothing common on a
/// node.
pub const PORT: u16 = 9356;

/// Viewers at once: each holds a queue, bounded, of its own.
const MAX_VIEWERS: usize = 16;

/// Evidence messages a viewer's connection holds before its encoder waits
/// (and its queue fills, and drops).
const IN_FLIGHT: usize = 16;

/// What the API is asked for.
#[derive(Clone, Debug)]
pub struct ApiOptions {
    pub listen: SocketAddr,
    pub tls: Option<TlsFiles>,
}

/// PEM files: the agent's certificate and key, and the CA that signs the
/// viewers'.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl ApiOptions {
    /// Refuses to serve every pod's DNS in the clear past loopback.
    pub fn check(&self) -> Result<()> {
        if self.tls.is_none() && !self.listen.ip().is_loopback() {
            bail!(
                "the API serves every pod's DNS: give --api-cert, --api-key and --api-ca \
                 (mutual TLS), or listen on loopback (--api-addr 127.0.0.1:{PORT})"
            );
        }
        Ok(())
    }

    fn tls_config(&self) -> Result<Option<ServerTlsConfig>> {
        let Some(files) = &self.tls else {
            return Ok(None);
        };
        let read = |p: &PathBuf, what: &str| {
            std::fs::read(p)
                .with_context(|| format!("cannot read the API's {what} {}", p.display()))
        };
        let identity =
            Identity::from_pem(read(&files.cert, "certificate")?, read(&files.key, "key")?);
        let ca = Certificate::from_pem(read(&files.ca, "CA")?);
        Ok(Some(
            ServerTlsConfig::new().identity(identity).client_ca_root(ca),
        ))
    }
}

/// The bound port and its TLS, before anything is attached: a port in use
/// or a certificate missing is said at once.
pub struct Bound {
    listener: tokio::net::TcpListener,
    server: Server,
}

impl Bound {
    /// Where it listens (the port chosen, for port 0).
    pub fn addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }
}

pub async fn bind(o: &ApiOptions) -> Result<Bound> {
    o.check()?;
    let mut server = Server::builder();
    if let Some(tls) = o.tls_config()? {
        server = server
            .tls_config(tls)
            .context("the API's certificate, key or CA (--api-cert, --api-key, --api-ca)")?;
    }
    let listener = tokio::net::TcpListener::bind(o.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--api-addr)", o.listen))?;
    Ok(Bound { listener, server })
}

/// Serves until the agent stops.
pub async fn serve(bound: Bound, live: Live, node: String) -> Result<()> {
    let Bound {
        listener,
        mut server,
    } = bound;
    let api = Api { live, node };
    server
        .add_service(ObserverServer::new(api))
        .serve_with_incoming(TcpIncoming::from(listener))
        .await
        .context("serving the API")
}

struct Api {
    live: Live,
    node: String,
}

type EvidenceStream = Pin<Box<dyn Stream<Item = Result<Evidence, Status>> + Send>>;

#[tonic::async_trait]
impl Observer for Api {
    async fn node(&self, _: Request<NodeRequest>) -> Result<Response<NodeReply>, Status> {
        let state = self.live.state();
        let pods = state
            .pods
            .into_iter()
            .map(|(name, ips)| {
                let (namespace, name) = name.split_once('/').unwrap_or(("", &name));
                Pod {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    ips: ips.iter().map(IpAddr::to_string).collect(),
                }
            })
            .collect();
        Ok(Response::new(NodeReply {
            node: self.node.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            monotonic_ns: monotonic_now(),
            clock_offset_ns: Clock::now().offset_ns(),
            pods,
            memory_ms: state.memory_ns / 1_000_000,
            resolvers: state.resolvers.iter().map(IpAddr::to_string).collect(),
        }))
    }

    type WatchStream = EvidenceStream;

    async fn watch(&self, req: Request<WatchRequest>) -> Result<Response<EvidenceStream>, Status> {
        let who = req.remote_addr();
        let req = req.into_inner();
        let ips = req
            .ips
            .iter()
            .map(|s| s.parse::<IpAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Status::invalid_argument(format!("an address to watch: {e}")))?;
        if ips.is_empty() {
            return Err(Status::invalid_argument("no address to watch"));
        }
        if self.live.viewers() >= MAX_VIEWERS {
            return Err(Status::resource_exhausted(format!(
                "{MAX_VIEWERS} cluster views watch this node already"
            )));
        }
        let after = After {
            ns: req.after_ns,
            seq: (req.after_seq > 0).then_some((req.epoch, req.after_seq)),
        };
        let sub = self
            .live
            .subscribe(
                Watch::of(ips.iter().copied()),
                req.since_ms.saturating_mul(1_000_000),
                after,
            )
            .ok_or_else(|| Status::unavailable("the agent is starting: try again"))?;
        log::info!(
            "a cluster view from {} watches {} ({} viewers)",
            who.map_or("?".into(), |a| a.to_string()),
            req.ips.join(", "),
            self.live.viewers()
        );
        let (tx, rx) = mpsc::channel(IN_FLIGHT);
        tokio::spawn(stream(sub, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Encodes a viewer's share as pcapng, the past first, until the viewer
/// goes or the agent stops.
async fn stream(mut sub: Subscription, tx: mpsc::Sender<Result<Evidence, Status>>) {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let mut rec = match Recorder::to_writer(Box::new(Shared(buf.clone())), sub.meta.clone()) {
        Ok(rec) => rec,
        Err(e) => {
            let _ = tx.send(Err(Status::internal(format!("{e:#}")))).await;
            return;
        }
    };
    rec.start(monotonic_now());
    let mut at = Place::default();
    for input in std::mem::take(&mut sub.past) {
        at.take(input, &mut rec);
    }
    loop {
        rec.flush();
        let pcapng = std::mem::take(&mut *buf.lock().unwrap_or_else(|e| e.into_inner()));
        let evidence = Evidence {
            pcapng,
            dropped: sub.dropped.load(Ordering::Relaxed),
            now_ns: at.now_ns,
            seq: at.seq,
            epoch: sub.epoch,
        };
        if tx.send(Ok(evidence)).await.is_err() {
            return;
        }
        let Some(first) = sub.queue.recv().await else {
            return;
        };
        at.take(first, &mut rec);
        while let Ok(more) = sub.queue.try_recv() {
            at.take(more, &mut rec);
        }
    }
}

/// How far a stream has got: its last tick, and its last input's place.
#[derive(Default)]
struct Place {
    now_ns: u64,
    seq: u64,
}

impl Place {
    fn take(&mut self, (seq, input): (u64, Input), rec: &mut Recorder) {
        self.now_ns = self.now_ns.max(tick_of(&input));
        self.seq = self.seq.max(seq);
        rec.input(&input);
    }
}

fn tick_of(input: &Input) -> u64 {
    match input {
        Input::Tick(now) => *now,
        _ => 0,
    }
}

/// A writer into a buffer the stream takes from.
struct Shared(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
