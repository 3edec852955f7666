//! The agent's HTTP endpoints: `/metrics` (Prometheus's text format),
//! `/healthz` (the pipeline still ticks) and `/readyz` (every hook
//! attached). Connections are few (a scraper, a kubelet's probes): at most
//! `MAX_CONNECTIONS` at once, each with a deadline for its request.
use std::{
    convert::Infallible,
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    body::Incoming, server::conn::http1, service::service_fn, Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::Semaphore};

use super::Shared;
use crate::{clock::monotonic_now, record::flight::Flight};

const MAX_CONNECTIONS: usize = 16;
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The pipeline ticks every `TICK`; this long without one, it is stuck.
const STUCK_NS: u64 = 30_000_000_000;
/// Prometheus's text exposition format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                log::warn!("metrics endpoint: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(|req| {
                let response = respond(&req, &shared);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            drop(permit);
        });
    }
}

fn respond(req: &Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match req.uri().path() {
        "/metrics" => {
            let mut page = String::with_capacity(64 * 1024);
            shared.metrics().render(&mut page);
            if let Some(otlp) = shared.otlp.get() {
                otlp.render(&mut page);
            }
            if shared.flight.is_some() {
                flights(&mut page, shared.flight());
            }
            let mut r = Response::new(Full::new(Bytes::from(page)));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                TEXT_FORMAT.parse().expect("a valid header"),
            );
            r
        }
        "/healthz" => {
            let quiet_ns = monotonic_now().saturating_sub(shared.ticked_ns.load(Ordering::Relaxed));
            if quiet_ns > STUCK_NS {
                let s = quiet_ns / 1_000_000_000;
                plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the pipeline has not ticked for {s} s\n"),
                )
            } else {
                plain(StatusCode::OK, "ok\n".into())
            }
        }
        "/readyz" if shared.ready.load(Ordering::Relaxed) => {
            plain(StatusCode::OK, "ready\n".into())
        }
        "/readyz" => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the hooks are not all attached yet\n".into(),
        ),
        _ => plain(
            StatusCode::NOT_FOUND,
            "/metrics, /healthz or /readyz\n".into(),
        ),
    }
}

/// How many flight recordings were started, and the latest written.
fn flights(out: &mut String, latest: Option<Flight>) {
    use std::fmt::Write as _;
    let count = latest.as_ref().map_or(0, |f| f.count);
    let _ = writeln!(out, "# HELP dnstrace_flight_recordings_total Flight recordings started, each for an anomaly first raised (a recording already being written takes later ones).\n# TYPE dnstrace_flight_recordings_total counter\ndnstrace_flight_recordings_total {count}");
    if let Some((f, path)) = latest.as_ref().and_then(|f| Some((f, f.path.as_ref()?))) {
        let file = path.display().to_string().replace(['\\', '"', '\n'], "_");
        let _ = writeln!(out, "# HELP dnstrace_flight_recording_info The latest flight recording and the anomaly that started it.\n# TYPE dnstrace_flight_recording_info gauge\ndnstrace_flight_recording_info{{file=\"{file}\",kind=\"{}\"}} 1", f.kind);
    }
}

fn plain(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}
