//! An OTLP/gRPC receiver for the tests, on the OpenTelemetry project's
//! proto definitions: it keeps every span and log record it is sent, and
//! can go away and come back on the same port.
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
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
use tonic::{Request, Response, Status};

/// What the receiver was sent: each span or record with its resource.
#[derive(Default)]
pub struct Received {
    pub spans: Vec<(Resource, Span)>,
    pub logs: Vec<(Resource, LogRecord)>,
}

#[derive(Clone, Default)]
struct Store(Arc<Mutex<Received>>);

#[tonic::async_trait]
impl TraceService for Store {
    async fn export(
        &self,
        req: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut r = self.0.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            let resource = rs.resource.unwrap_or_default();
            for ss in rs.scope_spans {
                r.spans
                    .extend(ss.spans.into_iter().map(|s| (resource.clone(), s)));
            }
        }
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl LogsService for Store {
    async fn export(
        &self,
        req: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        let mut r = self.0.lock().unwrap();
        for rl in req.into_inner().resource_logs {
            let resource = rl.resource.unwrap_or_default();
            for sl in rl.scope_logs {
                r.logs
                    .extend(sl.log_records.into_iter().map(|l| (resource.clone(), l)));
            }
        }
        Ok(Response::new(ExportLogsServiceResponse::default()))
    }
}

/// A receiver listening on loopback, serving until stopped.
pub struct Receiver {
    store: Store,
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Listens on `port` of 127.0.0.1 (0: any free one).
    pub fn start(port: u16) -> Self {
        Self::serve(Store::default(), port)
    }

    fn serve(store: Store, port: u16) -> Self {
        let listener =
            std::net::TcpListener::bind(("127.0.0.1", port)).expect("binding the receiver's port");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = store.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let incoming = tonic::transport::server::TcpIncoming::from(listener);
                let serving = tonic::transport::Server::builder()
                    .add_service(TraceServiceServer::new(served.clone()))
                    .add_service(LogsServiceServer::new(served))
                    .serve_with_incoming(incoming);
                // Not a graceful shutdown, which would wait for the agent
                // to close its connection: dropping the runtime cuts them.
                tokio::select! {
                    r = serving => r.unwrap(),
                    _ = stopped => {}
                }
            });
        });
        Self {
            store,
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
        *self = Self::serve(self.store.clone(), port);
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
