//! An OTLP receiver for the tests, on the OpenTelemetry project's proto
//! definitions, over gRPC or HTTP/protobuf: it keeps every span and log
//! record it is sent, and can go away and come back on the same port. A
//! secure one, as a managed backend or an in-cluster collector is, takes
//! only mutual TLS with a certificate its CA signed and a header.
use std::{
    io::Read as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use prost::Message as _;
use tokio_rustls::rustls::{
    self,
    pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer},
    server::WebPkiClientVerifier,
    RootCertStore, ServerConfig,
};

use opentelemetry_proto::tonic::{
    collector::{
        logs::v1::{
            logs_service_server::{LogsService, LogsServiceServer},
            ExportLogsServiceRequest, ExportLogsServiceResponse,
        },
        trace::v1::{
            trace_service_server::{TraceService, TraceServiceServer},
            ExportTraceServiceRequest, ExportTraceServiceResponse,
        },
    },
    common::v1::{any_value::Value, KeyValue},
    logs::v1::LogRecord,
    resource::v1::Resource,
    trace::v1::Span,
};
use tonic::{
    codec::CompressionEncoding, service::interceptor::InterceptedService, Request, Response, Status,
};

/// What the receiver was sent: each span or record with its resource,
/// and how each request came (its `grpc-encoding` or `content-encoding`).
#[derive(Default)]
pub struct Received {
    pub spans: Vec<(Resource, Span)>,
    pub logs: Vec<(Resource, LogRecord)>,
    pub encodings: Vec<String>,
}

#[derive(Clone, Default)]
struct Store(Arc<Mutex<Received>>);

impl Store {
    fn keep_traces(&self, req: ExportTraceServiceRequest) {
        let mut r = self.0.lock().unwrap();
        for rs in req.resource_spans {
            let resource = rs.resource.unwrap_or_default();
            for ss in rs.scope_spans {
                r.spans
                    .extend(ss.spans.into_iter().map(|s| (resource.clone(), s)));
            }
        }
    }

    fn keep_logs(&self, req: ExportLogsServiceRequest) {
        let mut r = self.0.lock().unwrap();
        for rl in req.resource_logs {
            let resource = rl.resource.unwrap_or_default();
            for sl in rl.scope_logs {
                r.logs
                    .extend(sl.log_records.into_iter().map(|l| (resource.clone(), l)));
            }
        }
    }

    fn encoding(&self, e: Option<&str>) {
        let e = e.unwrap_or("identity").to_owned();
        self.0.lock().unwrap().encodings.push(e);
    }
}

#[tonic::async_trait]
impl TraceService for Store {
    async fn export(
        &self,
        req: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.keep_traces(req.into_inner());
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl LogsService for Store {
    async fn export(
        &self,
        req: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        self.keep_logs(req.into_inner());
        Ok(Response::new(ExportLogsServiceResponse::default()))
    }
}

/// OTLP's two transports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Grpc,
    Http,
}

/// What a secure receiver demands: TLS with `cert` and `key`, a client
/// certificate `client_ca` signed, and `header` on every request.
#[derive(Clone, Debug)]
pub struct Demands {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
    pub header: (String, String),
}

/// How a receiver serves.
#[derive(Clone)]
struct Serving {
    transport: Transport,
    demands: Option<Demands>,
}

/// A receiver listening on loopback, serving until stopped.
pub struct Receiver {
    store: Store,
    serving: Serving,
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Plain OTLP/gRPC on `port` of 127.0.0.1 (0: any free one).
    pub fn start(port: u16) -> Self {
        let serving = Serving {
            transport: Transport::Grpc,
            demands: None,
        };
        Self::serve(Store::default(), serving, port)
    }

    /// Over `transport`, taking only what meets `demands` (gzip or not),
    /// on a free port of 127.0.0.1.
    pub fn secure(transport: Transport, demands: Demands) -> Self {
        let serving = Serving {
            transport,
            demands: Some(demands),
        };
        Self::serve(Store::default(), serving, 0)
    }

    fn serve(store: Store, serving: Serving, port: u16) -> Self {
        let listener =
            std::net::TcpListener::bind(("127.0.0.1", port)).expect("binding the receiver's port");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (served, how) = (store.clone(), serving.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                // Not a graceful shutdown, which would wait for the agent
                // to close its connection: dropping the runtime cuts them.
                tokio::select! {
                    () = serve_on(listener, served, how) => {}
                    _ = stopped => {}
                }
            });
        });
        Self {
            store,
            serving,
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stops listening (the collector goes away); what it kept stays.
    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Listens again on the same port, keeping what it had.
    pub fn restart(&mut self) {
        self.stop();
        let port = self.addr.port();
        // The old socket may linger a moment.
        for _ in 0..50 {
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        *self = Self::serve(self.store.clone(), self.serving.clone(), port);
    }

    pub fn received<T>(&self, read: impl FnOnce(&Received) -> T) -> T {
        read(&self.store.0.lock().unwrap())
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The string value of attribute `key`, if it has one.
pub fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.as_str()),
            _ => None,
        }
    })
}

/// Whether attribute `key` is there, whatever its value.
pub fn has(attrs: &[KeyValue], key: &str) -> bool {
    attrs.iter().any(|kv| kv.key == key)
}

async fn serve_on(listener: tokio::net::TcpListener, store: Store, how: Serving) {
    match how.transport {
        Transport::Grpc => serve_grpc(listener, store, how.demands).await,
        Transport::Http => serve_http(listener, store, how.demands).await,
    }
}

async fn serve_grpc(listener: tokio::net::TcpListener, store: Store, demands: Option<Demands>) {
    let mut server = tonic::transport::Server::builder();
    if let Some(d) = &demands {
        let identity = tonic::transport::Identity::from_pem(read(&d.cert), read(&d.key));
        let ca = tonic::transport::Certificate::from_pem(read(&d.client_ca));
        let tls = tonic::transport::ServerTlsConfig::new()
            .identity(identity)
            .client_ca_root(ca);
        server = server.tls_config(tls).unwrap();
    }
    let header = demands.map(|d| d.header);
    let kept = store.clone();
    let check = move |req: Request<()>| {
        let encoding = req.metadata().get("grpc-encoding");
        kept.encoding(encoding.and_then(|e| e.to_str().ok()));
        match &header {
            Some((k, v))
                if req
                    .metadata()
                    .get(k.as_str())
                    .is_none_or(|got| got != v.as_str()) =>
            {
                Err(Status::unauthenticated(format!(
                    "no {k} header, or not the one expected"
                )))
            }
            _ => Ok(req),
        }
    };
    let traces =
        TraceServiceServer::new(store.clone()).accept_compressed(CompressionEncoding::Gzip);
    let logs = LogsServiceServer::new(store).accept_compressed(CompressionEncoding::Gzip);
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    server
        .add_service(InterceptedService::new(traces, check.clone()))
        .add_service(InterceptedService::new(logs, check))
        .serve_with_incoming(incoming)
        .await
        .unwrap();
}

/// OTLP/HTTP: POSTs of binary protobuf to /v1/traces and /v1/logs,
/// gzipped or not, over TLS with a client certificate when demanded.
async fn serve_http(listener: tokio::net::TcpListener, store: Store, demands: Option<Demands>) {
    let tls = demands
        .as_ref()
        .map(|d| tokio_rustls::TlsAcceptor::from(server_config(d)));
    let header = demands.map(|d| d.header);
    while let Ok((tcp, _)) = listener.accept().await {
        let (store, header, tls) = (store.clone(), header.clone(), tls.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let (store, header) = (store.clone(), header.clone());
                async move { Ok::<_, std::convert::Infallible>(answer(req, &store, header).await) }
            });
            let http = hyper::server::conn::http1::Builder::new();
            match tls {
                None => {
                    let _ = http
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                        .await;
                }
                // A refused handshake is the client's failure to see.
                Some(tls) => {
                    if let Ok(stream) = tls.accept(tcp).await {
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let _ = http.serve_connection(io, service).await;
                    }
                }
            }
        });
    }
}

async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
    store: &Store,
    header: Option<(String, String)>,
) -> hyper::Response<Full<Bytes>> {
    let status = |code: u16| {
        let mut res = hyper::Response::new(Full::new(Bytes::new()));
        *res.status_mut() = hyper::StatusCode::from_u16(code).unwrap();
        res
    };
    let encoding = req
        .headers()
        .get("content-encoding")
        .and_then(|e| e.to_str().ok())
        .map(str::to_owned);
    store.encoding(encoding.as_deref());
    if let Some((k, v)) = &header {
        if req
            .headers()
            .get(k.as_str())
            .is_none_or(|got| got != v.as_str())
        {
            return status(401);
        }
    }
    let path = req.uri().path().to_owned();
    let Ok(body) = req.into_body().collect().await else {
        return status(400);
    };
    let mut body = body.to_bytes().to_vec();
    if encoding.as_deref() == Some("gzip") {
        let mut inflated = Vec::new();
        if flate2::read::GzDecoder::new(body.as_slice())
            .read_to_end(&mut inflated)
            .is_err()
        {
            return status(400);
        }
        body = inflated;
    }
    let kept = match path.as_str() {
        "/v1/traces" => {
            ExportTraceServiceRequest::decode(body.as_slice()).map(|r| store.keep_traces(r))
        }
        "/v1/logs" => ExportLogsServiceRequest::decode(body.as_slice()).map(|r| store.keep_logs(r)),
        _ => return status(404),
    };
    status(if kept.is_ok() { 200 } else { 400 })
}

/// rustls's server side: `cert` and `key`, and a client certificate
/// `client_ca` signed, required.
fn server_config(d: &Demands) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(&d.client_ca).unwrap() {
        roots.add(ca.unwrap()).unwrap();
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .unwrap();
    let certs = CertificateDer::pem_file_iter(&d.cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&d.key).unwrap();
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .unwrap();
    Arc::new(config)
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A CA, a collector's certificate for 127.0.0.1 and an agent's client
/// certificate it signs, and another CA, made with openssl.
pub struct Certs {
    dir: crate::Dir,
}

impl Certs {
    pub fn make() -> Self {
        let dir = crate::Dir::new("otlp-certs");
        dir.certificates(&[
            (
                "collector",
                "ca",
                "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
            ),
            ("agent", "ca", "extendedKeyUsage=clientAuth\n"),
        ]);
        Self { dir }
    }

    /// `name.pem` or `name.key`'s path.
    pub fn path(&self, file: &str) -> String {
        self.dir.file(file).display().to_string()
    }

    /// What a collector of this CA demands: its certificate, the agent's,
    /// and `authorization: Bearer x`.
    pub fn demands(&self) -> Demands {
        Demands {
            cert: self.dir.file("collector.pem"),
            key: self.dir.file("collector.key"),
            client_ca: self.dir.file("ca.pem"),
            header: ("authorization".into(), "Bearer x".into()),
        }
    }
}
