//! The exporter: a thread of its own with a bounded queue, so that a slow
//! or absent collector never stalls tracing. The pipeline only ever
//! `try_send`s; what finds the queue full is dropped and counted. The
//! thread sends batches and retries a failed one with backoff until the
//! collector takes it, while the queue holds what comes meanwhile.
use std::{
    fmt::Write as _,
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use opentelemetry_proto::tonic::{
    collector::{
        logs::v1::{logs_service_client::LogsServiceClient, ExportLogsServiceRequest},
        trace::v1::{trace_service_client::TraceServiceClient, ExportTraceServiceRequest},
    },
    common::v1::InstrumentationScope,
    logs::v1::{LogRecord, ResourceLogs, ScopeLogs},
    resource::v1::Resource,
    trace::v1::{ResourceSpans, ScopeSpans, Span},
};
use prost::Message as _;

use super::{convert, OtlpOptions, Protocol};

/// What the pipeline hands the exporter.
pub(super) enum Item {
    /// A journey's spans.
    Trace(Vec<Span>),
    Log(LogRecord),
}

/// What the exporter did, for the agent's metrics.
#[derive(Default, Debug)]
pub struct Counts {
    pub spans_exported: AtomicU64,
    pub logs_exported: AtomicU64,
    /// Traces and log records the queue had no room for.
    pub traces_dropped: AtomicU64,
    pub logs_dropped: AtomicU64,
    /// Export attempts the collector refused or did not answer.
    pub failures: AtomicU64,
    /// Items waiting in the queue now.
    pub queued: AtomicU64,
}

impl Counts {
    /// The exporter's counters in Prometheus's text format.
    pub fn render(&self, out: &mut String) {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = write!(
            out,
            "# HELP dnstrace_otlp_exported_total Spans and log records the OTLP collector took.\n# TYPE dnstrace_otlp_exported_total counter\ndnstrace_otlp_exported_total{{signal=\"traces\"}} {}\ndnstrace_otlp_exported_total{{signal=\"logs\"}} {}\n",
            n(&self.spans_exported),
            n(&self.logs_exported),
        );
        let _ = write!(
            out,
            "# HELP dnstrace_otlp_dropped_total Traces and log records dropped because the export queue was full (the collector slow or away).\n# TYPE dnstrace_otlp_dropped_total counter\ndnstrace_otlp_dropped_total{{signal=\"traces\"}} {}\ndnstrace_otlp_dropped_total{{signal=\"logs\"}} {}\n",
            n(&self.traces_dropped),
            n(&self.logs_dropped),
        );
        let _ = write!(
            out,
            "# HELP dnstrace_otlp_failures_total Export requests the collector refused or did not answer (each retried).\n# TYPE dnstrace_otlp_failures_total counter\ndnstrace_otlp_failures_total {}\n# HELP dnstrace_otlp_queued Traces and log records waiting to be sent.\n# TYPE dnstrace_otlp_queued gauge\ndnstrace_otlp_queued {}\n",
            n(&self.failures),
            n(&self.queued),
        );
    }
}

/// The pipeline's end of the queue. Dropped, it lets the exporter send
/// what is queued (for `FLUSH_WAIT` at most) and waits for it.
pub(super) struct Queue {
    tx: Option<SyncSender<Item>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub(super) counts: Arc<Counts>,
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Queue {
    /// Never waits: a full queue drops `item` and counts it.
    pub(super) fn offer(&self, item: Item) {
        let is_trace = matches!(item, Item::Trace(_));
        let Some(tx) = &self.tx else { return };
        // Counted before it is sent: the exporter may take it at once.
        self.counts.queued.fetch_add(1, Ordering::Relaxed);
        match tx.try_send(item) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counts.queued.fetch_sub(1, Ordering::Relaxed);
                let dropped = if is_trace {
                    &self.counts.traces_dropped
                } else {
                    &self.counts.logs_dropped
                };
                dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Starts the exporter thread; it ends when the queue's sender is dropped
/// and what is queued is sent (or given up after `FLUSH_WAIT`).
pub(super) fn start(o: OtlpOptions) -> Result<Queue> {
    let (tx, rx) = mpsc::sync_channel(o.queue);
    let counts = Arc::new(Counts::default());
    let thread_counts = counts.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the OTLP exporter's runtime")?;
    let thread = std::thread::Builder::new()
        .name("otlp-export".into())
        .spawn(move || runtime.block_on(run(o, rx, thread_counts)))
        .context("starting the OTLP exporter's thread")?;
    Ok(Queue {
        tx: Some(tx),
        thread: Some(thread),
        counts,
    })
}

/// How long a batch waits to fill.
const LINGER: Duration = Duration::from_secs(1);
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
/// Short enough that a collector back is seen within seconds.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
const TIMEOUT: Duration = Duration::from_secs(10);
/// At the end, how long the queue's rest may take to send.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

async fn run(o: OtlpOptions, rx: Receiver<Item>, counts: Arc<Counts>) {
    let mut client = match Client::new(&o) {
        Ok(c) => c,
        Err(e) => {
            log::warn!("OTLP export off: {e:#}");
            return;
        }
    };
    let resource = resource(&o.node);
    let mut ended_at = None;
    loop {
        let (batch, ended) = take_batch(&rx, o.batch, &counts);
        if ended && ended_at.is_none() {
            ended_at = Some(Instant::now());
        }
        if !batch.is_empty() {
            client
                .send_until_taken(batch, &resource, &counts, ended_at)
                .await;
        }
        // The sender is gone and the queue empty.
        if ended {
            return;
        }
    }
}

/// Up to `max` items, waiting at most `LINGER` for more; and whether the
/// sender is gone.
fn take_batch(rx: &Receiver<Item>, max: usize, counts: &Counts) -> (Vec<Item>, bool) {
    let mut batch = Vec::new();
    let deadline = Instant::now() + LINGER;
    while batch.len() < max {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(item) => {
                counts.queued.fetch_sub(1, Ordering::Relaxed);
                batch.push(item);
            }
            Err(RecvTimeoutError::Timeout) => break,
            Err(RecvTimeoutError::Disconnected) => return (batch, true),
        }
    }
    (batch, false)
}

fn resource(node: &str) -> Resource {
    Resource {
        attributes: vec![
            convert::kv("service.name", convert::s("dnstrace")),
            convert::kv("service.version", convert::s(env!("CARGO_PKG_VERSION"))),
            convert::kv("k8s.node.name", convert::s(node)),
        ],
        ..Resource::default()
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "dnstrace".to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        ..InstrumentationScope::default()
    }
}

enum Client {
    /// Boxed: hundreds of bytes beside the HTTP variant's URI.
    Grpc {
        traces: Box<TraceServiceClient<tonic::transport::Channel>>,
        logs: Box<LogsServiceClient<tonic::transport::Channel>>,
    },
    Http {
        base: hyper::Uri,
    },
}

impl Client {
    fn new(o: &OtlpOptions) -> Result<Self> {
        match o.protocol {
            Protocol::Grpc => {
                let channel = tonic::transport::Endpoint::from_shared(o.endpoint.clone())
                    .with_context(|| format!("--otlp-endpoint {}", o.endpoint))?
                    .timeout(TIMEOUT)
                    .connect_timeout(TIMEOUT)
                    .connect_lazy();
                Ok(Self::Grpc {
                    traces: Box::new(TraceServiceClient::new(channel.clone())),
                    logs: Box::new(LogsServiceClient::new(channel)),
                })
            }
            Protocol::HttpProtobuf => {
                let base: hyper::Uri = o
                    .endpoint
                    .parse()
                    .with_context(|| format!("--otlp-endpoint {}", o.endpoint))?;
                if base.scheme_str() != Some("http") {
                    bail!(
                        "--otlp-endpoint {}: http://HOST:PORT (https is not supported)",
                        o.endpoint
                    );
                }
                Ok(Self::Http { base })
            }
        }
    }

    /// Sends `batch`, again and again with backoff until the collector
    /// takes it; once the agent is ending (`ended_at`), for `FLUSH_WAIT`
    /// at most.
    async fn send_until_taken(
        &mut self,
        batch: Vec<Item>,
        resource: &Resource,
        counts: &Counts,
        ended_at: Option<Instant>,
    ) {
        let (mut spans, mut logs) = (Vec::new(), Vec::new());
        for item in batch {
            match item {
                Item::Trace(s) => spans.extend(s),
                Item::Log(l) => logs.push(l),
            }
        }
        let mut backoff = BACKOFF_FIRST;
        let mut said = false;
        loop {
            match self.send(&spans, &logs, resource).await {
                Ok(()) => {
                    counts
                        .spans_exported
                        .fetch_add(spans.len() as u64, Ordering::Relaxed);
                    counts
                        .logs_exported
                        .fetch_add(logs.len() as u64, Ordering::Relaxed);
                    if said {
                        log::info!("OTLP export: the collector takes batches again");
                    }
                    return;
                }
                Err(e) => {
                    counts.failures.fetch_add(1, Ordering::Relaxed);
                    if !said {
                        log::warn!("OTLP export failed, retrying with backoff (queued items wait, new ones past the queue are dropped and counted): {e:#}");
                        said = true;
                    }
                }
            }
            if ended_at.is_some_and(|t| t.elapsed() >= FLUSH_WAIT) {
                log::warn!(
                    "OTLP export: {} spans and {} log records not sent at exit",
                    spans.len(),
                    logs.len()
                );
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    async fn send(
        &mut self,
        spans: &[Span],
        logs: &[LogRecord],
        resource: &Resource,
    ) -> Result<()> {
        let traces = (!spans.is_empty()).then(|| ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(scope()),
                    spans: spans.to_vec(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        });
        let records = (!logs.is_empty()).then(|| ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: Some(resource.clone()),
                scope_logs: vec![ScopeLogs {
                    scope: Some(scope()),
                    log_records: logs.to_vec(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        });
        match self {
            Self::Grpc { traces: t, logs: l } => {
                if let Some(req) = traces {
                    t.export(req)
                        .await
                        .map_err(|s| anyhow!("traces: {}", s.message()))?;
                }
                if let Some(req) = records {
                    l.export(req)
                        .await
                        .map_err(|s| anyhow!("logs: {}", s.message()))?;
                }
            }
            Self::Http { base } => {
                if let Some(req) = traces {
                    post(base, "/v1/traces", req.encode_to_vec()).await?;
                }
                if let Some(req) = records {
                    post(base, "/v1/logs", req.encode_to_vec()).await?;
                }
            }
        }
        Ok(())
    }
}

/// One POST of OTLP/HTTP's binary protobuf encoding, on a connection of
/// its own (a batch a second at most).
async fn post(base: &hyper::Uri, path: &str, body: Vec<u8>) -> Result<()> {
    let authority = base
        .authority()
        .context("the endpoint has no host")?
        .clone();
    let host = authority.host();
    let port = authority.port_u16().unwrap_or(4318);
    let prefix = base.path().trim_end_matches('/');
    let stream = tokio::time::timeout(TIMEOUT, tokio::net::TcpStream::connect((host, port)))
        .await
        .context("connecting")??;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::post(format!("{prefix}{path}"))
        .header(hyper::header::HOST, authority.as_str())
        .header(hyper::header::CONTENT_TYPE, "application/x-protobuf")
        .body(Full::new(Bytes::from(body)))?;
    let res = tokio::time::timeout(TIMEOUT, sender.send_request(req))
        .await
        .context("waiting for the answer")??;
    let status = res.status();
    // Read the body whole, so that the connection ends cleanly.
    let _ = res.into_body().collect().await;
    if !status.is_success() {
        bail!("POST {path}: {status}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use hyper::{body::Incoming, server::conn::http1, service::service_fn, Request, Response};
    use hyper_util::rt::TokioIo;

    use super::*;

    /// What a collector on loopback was POSTed: (path, content type, body).
    type Posted = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;

    async fn collector() -> (String, Posted) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let posted = Posted::default();
        let kept = posted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let kept = kept.clone();
                        async move {
                            let path = req.uri().path().to_owned();
                            let kind = req.headers()[hyper::header::CONTENT_TYPE]
                                .to_str()
                                .unwrap()
                                .to_owned();
                            let body = req.into_body().collect().await.unwrap().to_bytes().to_vec();
                            kept.lock().unwrap().push((path, kind, body));
                            Ok::<_, std::convert::Infallible>(Response::new(
                                Full::new(Bytes::new()),
                            ))
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (url, posted)
    }

    /// OTLP/HTTP: each signal POSTed to its path as binary protobuf, which
    /// decodes to what was sent.
    #[tokio::test]
    async fn http_protobuf_posts_each_signal_to_its_path() {
        let (url, posted) = collector().await;
        let o = OtlpOptions {
            endpoint: url,
            protocol: Protocol::HttpProtobuf,
            node: "node-1".into(),
            queue: 4,
            batch: 4,
        };
        let mut client = Client::new(&o).unwrap();
        let span = Span {
            name: "lookup A".into(),
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            ..Span::default()
        };
        let record = LogRecord {
            severity_text: "ERROR".into(),
            ..LogRecord::default()
        };
        client
            .send(
                std::slice::from_ref(&span),
                std::slice::from_ref(&record),
                &resource("node-1"),
            )
            .await
            .unwrap();
        let posted = posted.lock().unwrap();
        assert_eq!(posted.len(), 2);
        let (path, kind, body) = &posted[0];
        assert_eq!(
            (path.as_str(), kind.as_str()),
            ("/v1/traces", "application/x-protobuf")
        );
        let traces = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        let rs = &traces.resource_spans[0];
        assert_eq!(rs.scope_spans[0].spans, [span]);
        let node = &rs.resource.as_ref().unwrap().attributes[2];
        assert_eq!(node.key, "k8s.node.name");
        let (path, _, body) = &posted[1];
        assert_eq!(path, "/v1/logs");
        let logs = ExportLogsServiceRequest::decode(body.as_slice()).unwrap();
        assert_eq!(logs.resource_logs[0].scope_logs[0].log_records, [record]);
    }

    /// A collector that refuses: an error, for the caller to retry.
    #[tokio::test]
    async fn an_absent_collector_is_an_error_not_a_hang() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let o = OtlpOptions {
            endpoint: format!("http://127.0.0.1:{port}"),
            protocol: Protocol::HttpProtobuf,
            node: "n".into(),
            queue: 1,
            batch: 1,
        };
        let mut client = Client::new(&o).unwrap();
        assert!(client
            .send(&[Span::default()], &[], &resource("n"))
            .await
            .is_err());
    }
}
