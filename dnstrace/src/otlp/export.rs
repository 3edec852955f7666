//! The exporter: a thread of its own with a bounded queue, so that a slow
//! or absent collector never stalls tracing. The pipeline only ever
//! `try_send`s; what finds the queue full is dropped and counted. The
//! thread sends batches and retries a failed one with backoff until the
//! collector takes it, while the queue holds what comes meanwhile.
use std::{
    fmt::Write as _,
    io::Write as _,
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError},
        Arc, OnceLock,
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

use hyper::{HeaderMap, Uri};
use tokio_rustls::rustls::pki_types::ServerName;
use tonic::{
    codec::CompressionEncoding,
    metadata::MetadataMap,
    transport::{Certificate, ClientTlsConfig, Identity},
};

use super::{
    config::{self, Compression, Export, Signal},
    convert, OtlpOptions, Protocol,
};

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
    /// Export attempts the collector refused or did not answer, by signal.
    pub traces_failures: AtomicU64,
    pub logs_failures: AtomicU64,
    /// Items waiting in the queues now.
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
            "# HELP dnstrace_otlp_failures_total Export requests the collector refused or did not answer, or whose TLS handshake failed (each retried).\n# TYPE dnstrace_otlp_failures_total counter\ndnstrace_otlp_failures_total{{signal=\"traces\"}} {}\ndnstrace_otlp_failures_total{{signal=\"logs\"}} {}\n# HELP dnstrace_otlp_queued Traces and log records waiting to be sent.\n# TYPE dnstrace_otlp_queued gauge\ndnstrace_otlp_queued {}\n",
            n(&self.traces_failures),
            n(&self.logs_failures),
            n(&self.queued),
        );
    }

    fn failures(&self, signal: Signal) -> &AtomicU64 {
        match signal {
            Signal::Traces => &self.traces_failures,
            Signal::Logs => &self.logs_failures,
        }
    }
}

/// The pipeline's end of the queues. Dropped, it lets the exporters send
/// what is queued (for `FLUSH_WAIT` at most) and waits for them.
pub(super) struct Queue {
    traces: Option<Lane>,
    logs: Option<Lane>,
    pub(super) counts: Arc<Counts>,
}

/// One signal's queue and the thread that sends it: a collector that
/// refuses one signal does not hold up the other.
struct Lane {
    tx: Option<SyncSender<Item>>,
    thread: Option<std::thread::JoinHandle<()>>,
    ending: Arc<Ending>,
}

/// Told when the pipeline's end of the queue is dropped. An exporter
/// retrying a batch gives up `FLUSH_WAIT` later, even a batch taken
/// before the end: otherwise the end is seen only at the next batch, and
/// a collector away would hold the agent's exit for ever.
#[derive(Default)]
struct Ending {
    at: OnceLock<Instant>,
    told: tokio::sync::Notify,
}

impl Ending {
    fn now(&self) {
        let _ = self.at.set(Instant::now());
        self.told.notify_one();
    }

    /// Resolves `FLUSH_WAIT` after the end; never before it.
    async fn flush_over(&self) {
        loop {
            if let Some(at) = self.at.get() {
                tokio::time::sleep_until((*at + FLUSH_WAIT).into()).await;
                return;
            }
            self.told.notified().await;
        }
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        let lanes = [&mut self.traces, &mut self.logs];
        // Both told first, so that they flush side by side.
        let mut lanes: Vec<_> = lanes.into_iter().flatten().collect();
        for lane in &mut lanes {
            lane.ending.now();
            drop(lane.tx.take());
        }
        for lane in lanes {
            if let Some(t) = lane.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Queue {
    /// Never waits: a full queue drops `item` and counts it; a signal not
    /// exported drops it uncounted.
    pub(super) fn offer(&self, item: Item) {
        let (lane, dropped) = match item {
            Item::Trace(_) => (&self.traces, &self.counts.traces_dropped),
            Item::Log(_) => (&self.logs, &self.counts.logs_dropped),
        };
        let Some(tx) = lane.as_ref().and_then(|l| l.tx.as_ref()) else {
            return;
        };
        // Counted before it is sent: the exporter may take it at once.
        self.counts.queued.fetch_add(1, Ordering::Relaxed);
        match tx.try_send(item) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counts.queued.fetch_sub(1, Ordering::Relaxed);
                dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Starts an exporter thread for each signal exported; each ends when
/// the queue's sender is dropped and what is queued is sent (or given up
/// after `FLUSH_WAIT`). A client that cannot be made is an error here.
pub(super) fn start(o: OtlpOptions) -> Result<Queue> {
    let counts = Arc::new(Counts::default());
    let lane = |signal: Signal, export: &Option<Export>| {
        export
            .as_ref()
            .map(|e| lane(signal, e, &o, counts.clone()))
            .transpose()
    };
    Ok(Queue {
        traces: lane(Signal::Traces, &o.traces)?,
        logs: lane(Signal::Logs, &o.logs)?,
        counts,
    })
}

fn lane(signal: Signal, export: &Export, o: &OtlpOptions, counts: Arc<Counts>) -> Result<Lane> {
    let (tx, rx) = mpsc::sync_channel(o.queue);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the OTLP exporter's runtime")?;
    let client = {
        // tonic's lazy channel starts its worker on this runtime.
        let _in = runtime.enter();
        Client::new(export).with_context(|| format!("OTLP {} export", signal.name()))?
    };
    let ending = Arc::new(Ending::default());
    let sender = Sender {
        signal,
        client,
        resource: resource(&o.node),
        counts,
        ending: ending.clone(),
    };
    let batch = o.batch;
    let thread = std::thread::Builder::new()
        .name(format!("otlp-{}", signal.name()))
        .spawn(move || runtime.block_on(run(sender, rx, batch)))
        .context("starting the OTLP exporter's thread")?;
    Ok(Lane {
        tx: Some(tx),
        thread: Some(thread),
        ending,
    })
}

/// How long a batch waits to fill.
const LINGER: Duration = Duration::from_secs(1);
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
/// Short enough that a collector back is seen within seconds.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// At the end, how long the queue's rest may take to send.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

async fn run(mut sender: Sender, rx: Receiver<Item>, max: usize) {
    loop {
        let (batch, ended) = take_batch(&rx, max, &sender.counts);
        if !batch.is_empty() {
            sender.send_until_taken(batch).await;
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

/// One signal's exporter: its client, and what it counts.
struct Sender {
    signal: Signal,
    client: Client,
    resource: Resource,
    counts: Arc<Counts>,
    ending: Arc<Ending>,
}

impl Sender {
    /// Sends `batch`, again and again with backoff until the collector
    /// takes it; once the agent is ending, until `FLUSH_WAIT` after it,
    /// the request under way cut short. A streak of failures is one line, with its first reason.
    async fn send_until_taken(&mut self, batch: Vec<Item>) {
        let (mut spans, mut logs) = (Vec::new(), Vec::new());
        for item in batch {
            match item {
                Item::Trace(s) => spans.extend(s),
                Item::Log(l) => logs.push(l),
            }
        }
        let what = self.signal.name();
        let mut backoff = BACKOFF_FIRST;
        let mut failing = false;
        loop {
            let sent = tokio::select! {
                sent = self.client.send(&spans, &logs, &self.resource) => sent,
                () = self.ending.flush_over() => return self.not_sent(&spans, &logs),
            };
            match sent {
                Ok(()) => {
                    self.counts
                        .spans_exported
                        .fetch_add(spans.len() as u64, Ordering::Relaxed);
                    self.counts
                        .logs_exported
                        .fetch_add(logs.len() as u64, Ordering::Relaxed);
                    if failing {
                        log::info!("OTLP {what} export: the collector takes batches again");
                    }
                    return;
                }
                Err(e) => {
                    self.counts
                        .failures(self.signal)
                        .fetch_add(1, Ordering::Relaxed);
                    if !failing {
                        log::warn!("OTLP {what} export to {} failed, retrying with backoff (queued items wait, new ones past the queue are dropped and counted): {e:#}", self.client.endpoint());
                        failing = true;
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = self.ending.flush_over() => return self.not_sent(&spans, &logs),
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    fn not_sent(&self, spans: &[Span], logs: &[LogRecord]) {
        log::warn!(
            "OTLP {} export: {} spans and {} log records not sent at exit",
            self.signal.name(),
            spans.len(),
            logs.len()
        );
    }
}

enum Client {
    /// Boxed: hundreds of bytes beside the HTTP variant.
    Grpc {
        traces: Box<TraceServiceClient<tonic::transport::Channel>>,
        logs: Box<LogsServiceClient<tonic::transport::Channel>>,
        headers: HeaderMap,
        endpoint: Uri,
    },
    Http(Http),
}

/// OTLP/HTTP's client: a connection per request (a batch a second at
/// most), over TLS for `https`.
struct Http {
    url: Uri,
    tls: Option<tokio_rustls::TlsConnector>,
    headers: HeaderMap,
    gzip: bool,
    timeout: Duration,
}

impl Client {
    fn new(e: &Export) -> Result<Self> {
        match e.protocol {
            Protocol::Grpc => Self::grpc(e),
            Protocol::HttpProtobuf => Ok(Self::Http(Http {
                url: e.endpoint.clone(),
                tls: e
                    .tls
                    .as_ref()
                    .map(|t| config::client_config(t).map(tokio_rustls::TlsConnector::from))
                    .transpose()?,
                headers: e.headers.clone(),
                gzip: e.compression == Compression::Gzip,
                timeout: e.timeout,
            })),
        }
    }

    fn grpc(e: &Export) -> Result<Self> {
        let mut endpoint = tonic::transport::Endpoint::from_shared(e.endpoint.to_string())
            .with_context(|| format!("{}", e.endpoint))?
            .timeout(e.timeout)
            .connect_timeout(e.timeout);
        if let Some(tls) = &e.tls {
            let mut config = ClientTlsConfig::new();
            config = match &tls.ca {
                Some(pem) => config.ca_certificate(Certificate::from_pem(pem)),
                None => config.with_native_roots(),
            };
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            endpoint = endpoint.tls_config(config).context("TLS")?;
        }
        let channel = endpoint.connect_lazy();
        let (mut traces, mut logs) = (
            TraceServiceClient::new(channel.clone()),
            LogsServiceClient::new(channel),
        );
        if e.compression == Compression::Gzip {
            traces = traces.send_compressed(CompressionEncoding::Gzip);
            logs = logs.send_compressed(CompressionEncoding::Gzip);
        }
        Ok(Self::Grpc {
            traces: Box::new(traces),
            logs: Box::new(logs),
            headers: e.headers.clone(),
            endpoint: e.endpoint.clone(),
        })
    }

    fn endpoint(&self) -> &Uri {
        match self {
            Self::Grpc { endpoint, .. } => endpoint,
            Self::Http(h) => &h.url,
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
            Self::Grpc {
                traces: t,
                logs: l,
                headers,
                ..
            } => {
                if let Some(req) = traces {
                    t.export(with_headers(req, headers))
                        .await
                        .map_err(|s| anyhow!("{}", grpc_reason(&s)))?;
                }
                if let Some(req) = records {
                    l.export(with_headers(req, headers))
                        .await
                        .map_err(|s| anyhow!("{}", grpc_reason(&s)))?;
                }
            }
            Self::Http(h) => {
                if let Some(req) = traces {
                    h.post(req.encode_to_vec()).await?;
                }
                if let Some(req) = records {
                    h.post(req.encode_to_vec()).await?;
                }
            }
        }
        Ok(())
    }
}

fn with_headers<T>(message: T, headers: &HeaderMap) -> tonic::Request<T> {
    tonic::Request::from_parts(
        MetadataMap::from_headers(headers.clone()),
        tonic::Extensions::default(),
        message,
    )
}

/// The status's code and message, and what lies under it (a refused
/// handshake says why only there).
fn grpc_reason(s: &tonic::Status) -> String {
    let mut reason = format!("{:?}: {}", s.code(), s.message());
    let mut source = std::error::Error::source(s);
    while let Some(e) = source {
        let _ = write!(reason, ": {e}");
        source = e.source();
    }
    reason
}

impl Http {
    /// One POST of OTLP/HTTP's binary protobuf encoding, within the
    /// timeout, connecting included.
    async fn post(&self, body: Vec<u8>) -> Result<()> {
        tokio::time::timeout(self.timeout, self.exchange(body))
            .await
            .map_err(|_| anyhow!("no answer within {:?}", self.timeout))?
    }

    async fn exchange(&self, body: Vec<u8>) -> Result<()> {
        let authority = self
            .url
            .authority()
            .context("the endpoint has no host")?
            .clone();
        let host = authority.host();
        let tls = self.tls.as_ref();
        let port = authority
            .port_u16()
            .unwrap_or(if tls.is_some() { 443 } else { 80 });
        let tcp = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port))
            .await
            .context("connecting")?;
        let req = self.request(&authority, body)?;
        let status = match tls {
            None => exchange(tcp, req).await?,
            Some(tls) => {
                let name = ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
                    .context("the endpoint's host is no TLS server name")?;
                let stream = tls.connect(name, tcp).await.context("TLS handshake")?;
                exchange(stream, req).await?
            }
        };
        if !status.is_success() {
            bail!("POST {}: {status}", self.url.path());
        }
        Ok(())
    }

    fn request(
        &self,
        authority: &hyper::http::uri::Authority,
        body: Vec<u8>,
    ) -> Result<hyper::Request<Full<Bytes>>> {
        let mut req = hyper::Request::post(self.url.path_and_query().map_or("/", |p| p.as_str()))
            .header(hyper::header::HOST, authority.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/x-protobuf");
        let body = if self.gzip {
            req = req.header(hyper::header::CONTENT_ENCODING, "gzip");
            gzip(&body)?
        } else {
            body
        };
        let mut req = req.body(Full::new(Bytes::from(body)))?;
        for (k, v) in &self.headers {
            req.headers_mut().append(k, v.clone());
        }
        Ok(req)
    }
}

/// Sends `req` on `stream` and reads the answer whole, so that the
/// connection ends cleanly.
async fn exchange<S>(stream: S, req: hyper::Request<Full<Bytes>>) -> Result<hyper::StatusCode>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let res = sender.send_request(req).await?;
    let status = res.status();
    let _ = res.into_body().collect().await;
    Ok(status)
}

fn gzip(body: &[u8]) -> Result<Vec<u8>> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(body)?;
    Ok(z.finish()?)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use hyper::{body::Incoming, server::conn::http1, service::service_fn, Request, Response};
    use hyper_util::rt::TokioIo;

    use super::*;

    /// What a collector on loopback was POSTed: (path, headers, body).
    type Posted = Arc<Mutex<Vec<(String, HeaderMap, Vec<u8>)>>>;

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
                            let headers = req.headers().clone();
                            let body = req.into_body().collect().await.unwrap().to_bytes().to_vec();
                            kept.lock().unwrap().push((path, headers, body));
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

    fn http(url: &str, compression: Compression, headers: HeaderMap) -> Client {
        let e = Export {
            endpoint: url.parse().unwrap(),
            protocol: Protocol::HttpProtobuf,
            tls: None,
            headers,
            compression,
            timeout: Duration::from_secs(10),
        };
        Client::new(&e).unwrap()
    }

    /// OTLP/HTTP: each signal POSTed to its URL as binary protobuf, which
    /// decodes to what was sent, with the headers given.
    #[tokio::test]
    async fn http_protobuf_posts_each_signal_to_its_url() {
        let (url, posted) = collector().await;
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer x".parse().unwrap());
        let mut traces = http(&format!("{url}/v1/traces"), Compression::None, headers);
        let mut logs = http(
            &format!("{url}/otlp/logs"),
            Compression::None,
            HeaderMap::new(),
        );
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
        let resource = resource("node-1");
        let sent = traces.send(std::slice::from_ref(&span), &[], &resource);
        sent.await.unwrap();
        let sent = logs.send(&[], std::slice::from_ref(&record), &resource);
        sent.await.unwrap();
        let posted = posted.lock().unwrap();
        assert_eq!(posted.len(), 2);
        let (path, headers, body) = &posted[0];
        assert_eq!(path, "/v1/traces");
        assert_eq!(headers["content-type"], "application/x-protobuf");
        assert_eq!(headers["authorization"], "Bearer x");
        let traces = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        let rs = &traces.resource_spans[0];
        assert_eq!(rs.scope_spans[0].spans, [span]);
        let node = &rs.resource.as_ref().unwrap().attributes[2];
        assert_eq!(node.key, "k8s.node.name");
        let (path, headers, body) = &posted[1];
        assert_eq!(path, "/otlp/logs");
        assert!(!headers.contains_key("authorization"));
        let logs = ExportLogsServiceRequest::decode(body.as_slice()).unwrap();
        assert_eq!(logs.resource_logs[0].scope_logs[0].log_records, [record]);
    }

    /// With gzip, the body is the request gzipped, and says so.
    #[tokio::test]
    async fn gzip_bodies_say_so_and_inflate_to_the_request() {
        use std::io::Read as _;
        let (url, posted) = collector().await;
        let mut client = http(
            &format!("{url}/v1/traces"),
            Compression::Gzip,
            HeaderMap::new(),
        );
        let span = Span {
            name: "lookup AAAA".into(),
            ..Span::default()
        };
        let resource = resource("n");
        let sent = client.send(std::slice::from_ref(&span), &[], &resource);
        sent.await.unwrap();
        let posted = posted.lock().unwrap();
        let (_, headers, body) = &posted[0];
        assert_eq!(headers["content-encoding"], "gzip");
        let mut inflated = Vec::new();
        flate2::read::GzDecoder::new(body.as_slice())
            .read_to_end(&mut inflated)
            .unwrap();
        let traces = ExportTraceServiceRequest::decode(inflated.as_slice()).unwrap();
        assert_eq!(traces.resource_spans[0].scope_spans[0].spans, [span]);
    }

    /// A collector that refuses: an error, for the caller to retry.
    #[tokio::test]
    async fn an_absent_collector_is_an_error_not_a_hang() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}/v1/traces");
        let mut client = http(&url, Compression::None, HeaderMap::new());
        assert!(client
            .send(&[Span::default()], &[], &resource("n"))
            .await
            .is_err());
    }

    /// Exports of traces to `url` over HTTP, given an hour a request.
    fn patient(url: &str) -> OtlpOptions {
        OtlpOptions {
            traces: Some(Export {
                endpoint: url.parse().unwrap(),
                protocol: Protocol::HttpProtobuf,
                tls: None,
                headers: HeaderMap::new(),
                compression: Compression::None,
                timeout: Duration::from_secs(3600),
            }),
            logs: None,
            node: "n".into(),
            queue: 8,
            batch: 8,
        }
    }

    /// Drops `queue` on a thread of its own: whether that ended within a
    /// minute (`FLUSH_WAIT` is 5 s; a batch retried for ever never ends).
    fn ends(queue: Queue) -> bool {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            drop(queue);
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(60)).is_ok()
    }

    fn a_trace() -> Item {
        Item::Trace(vec![Span {
            name: "lookup A".into(),
            ..Span::default()
        }])
    }

    /// A collector that takes the connection and never answers: the
    /// batch under way when the agent ends is given up, the request cut.
    #[test]
    fn the_end_cuts_short_a_request_a_silent_collector_holds() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        let queue = start(patient(&url)).unwrap();
        queue.offer(a_trace());
        // The exporter has taken the batch once it connects.
        let (held, _) = listener.accept().unwrap();
        assert!(ends(queue), "the exporter waited on past its flush");
        drop(held);
    }

    /// A collector away: the batch taken before the end, retried with
    /// backoff, is given up after the end.
    #[test]
    fn the_end_stops_the_retries_of_a_batch_taken_before_it() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let queue = start(patient(&format!("http://127.0.0.1:{port}/v1/traces"))).unwrap();
        queue.offer(a_trace());
        while queue
            .counts
            .failures(Signal::Traces)
            .load(Ordering::Relaxed)
            == 0
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(ends(queue), "the exporter retried on past its flush");
    }
}
