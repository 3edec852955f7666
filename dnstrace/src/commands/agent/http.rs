//! The agent's HTTP endpoints: `/metrics` (Prometheus's text format),
//! `/healthz` (the pipeline still ticks) and `/readyz` (every hook
//! attached), over TLS and with basic auth as the web config says.
//!
//! A new connection is always served: nothing is held before `accept`,
//! and past `MAX_CONNECTIONS` the oldest connection that has not sent a
//! request is closed for it (else the oldest idle one, else the oldest).
//! Anyone on the node's network can open connections and send nothing, or
//! half a ClientHello, or half a request head; they cannot make a scrape
//! wait. Deadlines on the handshake and on each request head close them
//! in the end, and the cap bounds the memory they take meanwhile.
use std::{
    collections::{BTreeMap, HashSet},
    convert::Infallible,
    future::Future,
    sync::{
        atomic::{AtomicU64, AtomicU8, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    body::Incoming, header, server::conn::http1, service::service_fn, HeaderMap, Method, Request,
    Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use sha2::{Digest as _, Sha256};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    task::AbortHandle,
};
use tokio_rustls::TlsAcceptor;

use super::{
    lock,
    web::{Rate, Web, WebConfig},
    Shared,
};
use crate::{clock::monotonic_now, record::flight::Flight};

/// Connections at once: a scraper and a kubelet need a few; past this, the
/// least useful is closed for the new one. Each holds at most a head's
/// buffer and TLS's, some 50 KiB.
const MAX_CONNECTIONS: usize = 256;
/// For a ClientHello and the handshake after it.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// For each request head, and between requests on a kept-alive connection.
const HEAD_TIMEOUT: Duration = Duration::from_secs(20);
/// hyper's smallest read buffer: a scrape's GET is a few hundred bytes.
const MAX_BUF: usize = 8192;
/// The pipeline ticks every `TICK`; this long without one, it is stuck.
const STUCK_NS: u64 = 30_000_000_000;
/// Prometheus's text exposition format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>, web: Option<WebConfig>) {
    let server = Arc::new(Server {
        shared,
        web,
        conns: Arc::new(Conns::new(MAX_CONNECTIONS)),
        closed: Closed::default(),
        auth: Auth::default(),
        bucket: Mutex::new(None),
    });
    loop {
        match listener.accept().await {
            Ok((stream, _)) => server.clone().admit(stream),
            Err(e) => {
                log::warn!("metrics endpoint: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

struct Server {
    shared: Arc<Shared>,
    web: Option<WebConfig>,
    conns: Arc<Conns>,
    closed: Closed,
    auth: Auth,
    /// The rate limit's tokens, and the limit they were counted for.
    bucket: Mutex<Option<Bucket>>,
}

/// Connections closed by the server before their client was done.
#[derive(Default)]
struct Closed {
    handshake_timeout: AtomicU64,
    tls_error: AtomicU64,
    head_timeout: AtomicU64,
}

impl Server {
    fn web(&self) -> Arc<Web> {
        self.web
            .as_ref()
            .map_or_else(|| Arc::new(Web::default()), WebConfig::current)
    }

    fn admit(self: Arc<Self>, stream: TcpStream) {
        let tls = self.web().tls.clone().map(TlsAcceptor::from);
        let conns = self.conns.clone();
        conns.open(|phase| self.connection(stream, tls, phase));
    }

    async fn connection(
        self: Arc<Self>,
        stream: TcpStream,
        tls: Option<TlsAcceptor>,
        phase: Phase,
    ) {
        let Some(acceptor) = tls else {
            return self.http(stream, phase).await;
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => self.http(stream, phase).await,
            Ok(Err(e)) => {
                self.closed.tls_error.fetch_add(1, Ordering::Relaxed);
                log::debug!("metrics endpoint: a TLS handshake failed: {e}");
            }
            Err(_) => {
                self.closed
                    .handshake_timeout
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    async fn http<S>(self: Arc<Self>, io: S, phase: Phase)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let server = self.clone();
        let service = service_fn(move |req| {
            let (server, phase) = (server.clone(), phase.clone());
            async move {
                phase.set(BUSY);
                let response = server.answer(req).await;
                phase.set(SERVED);
                Ok::<_, Infallible>(response)
            }
        });
        let served = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT)
            .max_buf_size(MAX_BUF)
            .serve_connection(TokioIo::new(io), service)
            .await;
        if served.is_err_and(|e| e.is_timeout()) {
            self.closed.head_timeout.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The rate limit, basic auth and headers of the web config, around
    /// the endpoint's answer.
    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let web = self.web();
        let mut r = if !self.allow(web.rate) {
            plain(StatusCode::TOO_MANY_REQUESTS, "too many requests\n".into())
        } else if !self.auth.allows(&web.users, req.headers()).await {
            let mut r = plain(StatusCode::UNAUTHORIZED, "unauthorized\n".into());
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Basic"),
            );
            r
        } else {
            respond(&req, &self.shared, |page| self.own_metrics(page))
        };
        for (k, v) in &web.headers {
            r.headers_mut().insert(k.clone(), v.clone());
        }
        r
    }

    fn allow(&self, rate: Option<Rate>) -> bool {
        let Some(rate) = rate else {
            return true;
        };
        let mut bucket = lock(&self.bucket);
        let b = match bucket.as_mut() {
            Some(b) if b.rate == rate => b,
            _ => bucket.insert(Bucket::full(rate)),
        };
        b.take(Instant::now())
    }

    /// The endpoint's own counters, and the web config's loads.
    fn own_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let c = &self.closed;
        let _ = writeln!(out, "# HELP dnstrace_http_connections Connections open to the metrics endpoint.\n# TYPE dnstrace_http_connections gauge\ndnstrace_http_connections {}", self.conns.len());
        let _ = writeln!(out, "# HELP dnstrace_http_connections_closed_total Connections to the metrics endpoint the agent closed before their client was done, by why: evicted (past {MAX_CONNECTIONS} at once, for a newer one), a deadline, or a failed TLS handshake.\n# TYPE dnstrace_http_connections_closed_total counter");
        for (reason, n) in [
            ("evicted", &self.conns.evicted),
            ("handshake_timeout", &c.handshake_timeout),
            ("head_timeout", &c.head_timeout),
            ("tls_error", &c.tls_error),
        ] {
            let _ = writeln!(
                out,
                "dnstrace_http_connections_closed_total{{reason=\"{reason}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        if let Some(web) = &self.web {
            let r = &web.counts;
            let _ = writeln!(out, "# HELP dnstrace_web_config_reloads_total Loads of the web config after a change, by result (a failed one keeps the last good config).\n# TYPE dnstrace_web_config_reloads_total counter\ndnstrace_web_config_reloads_total{{result=\"success\"}} {}\ndnstrace_web_config_reloads_total{{result=\"failure\"}} {}", r.succeeded.load(Ordering::Relaxed), r.failed.load(Ordering::Relaxed));
            let _ = writeln!(out, "# HELP dnstrace_web_config_last_reload_successful Whether the web config as it is now loaded (0: the last good one is in use).\n# TYPE dnstrace_web_config_last_reload_successful gauge\ndnstrace_web_config_last_reload_successful {}", u8::from(r.last_ok.load(Ordering::Relaxed)));
        }
    }
}

/// A token bucket, as Go's rate.Limiter: full at first.
struct Bucket {
    rate: Rate,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: Rate) -> Self {
        Self {
            rate,
            tokens: f64::from(rate.burst),
            at: Instant::now(),
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let earned = now.duration_since(self.at).as_secs_f64() / self.rate.every.as_secs_f64();
        self.tokens = (self.tokens + earned).min(f64::from(self.rate.burst));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// exporter-toolkit's hash of "fakepassword": an unknown user costs what a
/// known one does, so that names cannot be told by timing.
const FAKE_HASH: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";
/// Credentials that passed, remembered so that a scraper's costs one
/// bcrypt; only right ones are, so wrong guesses cannot push them out.
const GOOD_REMEMBERED: usize = 16;

/// Basic auth against bcrypt hashes, one check at a time (each is tens of
/// milliseconds of a core, by design).
struct Auth {
    checks: tokio::sync::Semaphore,
    good: Mutex<HashSet<[u8; 32]>>,
}

impl Default for Auth {
    fn default() -> Self {
        Self {
            checks: tokio::sync::Semaphore::new(1),
            good: Mutex::default(),
        }
    }
}

impl Auth {
    async fn allows(&self, users: &BTreeMap<String, String>, headers: &HeaderMap) -> bool {
        if users.is_empty() {
            return true;
        }
        let Some((user, password)) = basic(headers) else {
            return false;
        };
        let (hash, known) = match users.get(&user) {
            Some(h) => (h.clone(), true),
            None => (FAKE_HASH.to_owned(), false),
        };
        let key: [u8; 32] = Sha256::new()
            .chain_update(&user)
            .chain_update([0])
            .chain_update(&hash)
            .chain_update([0])
            .chain_update(&password)
            .finalize()
            .into();
        if known && lock(&self.good).contains(&key) {
            return true;
        }
        let Ok(_one) = self.checks.acquire().await else {
            return false;
        };
        let right = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash))
            .await
            .is_ok_and(|r| r.unwrap_or(false));
        if right && known {
            let mut good = lock(&self.good);
            if good.len() >= GOOD_REMEMBERED {
                good.clear();
            }
            good.insert(key);
        }
        right && known
    }
}

/// `Authorization: Basic base64(user:password)`.
fn basic(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let (user, password) = String::from_utf8(decoded)
        .ok()?
        .split_once(':')
        .map(|(u, p)| (u.to_owned(), p.to_owned()))?;
    Some((user, password))
}

/// Where a connection is: what it would cost to close it.
#[derive(Clone)]
struct Phase(Arc<AtomicU8>);

/// No request yet: a handshake, or a first head, under way.
const FRESH: u8 = 0;
/// Served, waiting for its next request.
const SERVED: u8 = 1;
/// A request being answered.
const BUSY: u8 = 2;

impl Phase {
    fn set(&self, p: u8) {
        self.0.store(p, Ordering::Relaxed);
    }
}

/// The connections open, oldest first, each with its phase and its task.
struct Conns {
    max: usize,
    open: Mutex<Open>,
    evicted: AtomicU64,
}

#[derive(Default)]
struct Open {
    next: u64,
    by_age: BTreeMap<u64, (Phase, AbortHandle)>,
}

impl Conns {
    fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            open: Mutex::default(),
            evicted: AtomicU64::new(0),
        }
    }

    fn len(&self) -> usize {
        lock(&self.open).by_age.len()
    }

    /// Runs `serve` as a task of its own, first closing a connection if
    /// `max` are open: the oldest of those with no request yet, else of
    /// those between requests, else the oldest.
    fn open<F, Fut>(self: &Arc<Self>, serve: F)
    where
        F: FnOnce(Phase) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut open = lock(&self.open);
        if open.by_age.len() >= self.max {
            self.evict(&mut open);
        }
        let id = open.next;
        open.next += 1;
        let phase = Phase(Arc::new(AtomicU8::new(FRESH)));
        let done = Done {
            conns: self.clone(),
            id,
        };
        let task = serve(phase.clone());
        let task = tokio::spawn(async move {
            task.await;
            drop(done);
        });
        open.by_age.insert(id, (phase, task.abort_handle()));
    }

    fn evict(&self, open: &mut Open) {
        let oldest = open
            .by_age
            .iter()
            .min_by_key(|(id, (phase, _))| (phase.0.load(Ordering::Relaxed), **id))
            .map(|(id, _)| *id);
        if let Some((_, task)) = oldest.and_then(|id| open.by_age.remove(&id)) {
            task.abort();
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A connection's task ended (or was aborted): it is open no more.
struct Done {
    conns: Arc<Conns>,
    id: u64,
}

impl Drop for Done {
    fn drop(&mut self) {
        lock(&self.conns.open).by_age.remove(&self.id);
    }
}

fn respond(
    req: &Request<Incoming>,
    shared: &Shared,
    own: impl FnOnce(&mut String),
) -> Response<Full<Bytes>> {
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
            own(&mut page);
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

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;

    /// A connection that waits forever; its receiver ends when it closes.
    fn open(conns: &Arc<Conns>) -> (Phase, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel::<()>();
        let mut given = None;
        conns.open(|phase| {
            given = Some(phase);
            async move {
                let _open = tx;
                std::future::pending::<()>().await
            }
        });
        (given.unwrap(), rx)
    }

    #[tokio::test]
    async fn a_full_house_closes_the_least_useful_oldest_connection() {
        let conns = Arc::new(Conns::new(3));
        let (a, mut a_rx) = open(&conns);
        let (_b, b_rx) = open(&conns);
        let (c, c_rx) = open(&conns);
        a.set(SERVED);
        // Full: the oldest with no request yet goes, not the older served.
        let (d, mut d_rx) = open(&conns);
        assert!(b_rx.await.is_err(), "b closed");
        assert!(a_rx
            .try_recv()
            .is_err_and(|e| e == oneshot::error::TryRecvError::Empty));
        // None fresh: the oldest served goes, not the busy one.
        c.set(BUSY);
        d.set(SERVED);
        let (e, mut e_rx) = open(&conns);
        assert!(a_rx.await.is_err(), "a closed");
        // All busy: the oldest goes all the same, for the new one.
        d.set(BUSY);
        e.set(BUSY);
        let (_f, mut f_rx) = open(&conns);
        assert!(c_rx.await.is_err(), "c closed");
        for rx in [&mut d_rx, &mut e_rx, &mut f_rx] {
            assert_eq!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty));
        }
        assert_eq!(conns.evicted.load(Ordering::Relaxed), 3);
        assert_eq!(conns.len(), 3);
    }

    #[tokio::test]
    async fn a_connection_that_ends_leaves_the_count() {
        let conns = Arc::new(Conns::new(2));
        let (tx, rx) = oneshot::channel::<()>();
        conns.open(|_| async move {
            let _ = rx.await;
        });
        assert_eq!(conns.len(), 1);
        tx.send(()).unwrap();
        while conns.len() > 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(conns.evicted.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_rate_limit_lets_a_burst_through_then_one_an_interval() {
        let every = Duration::from_secs(1);
        let mut b = Bucket::full(Rate { every, burst: 2 });
        let t0 = b.at;
        assert_eq!([b.take(t0), b.take(t0), b.take(t0)], [true, true, false]);
        assert_eq!([b.take(t0 + every), b.take(t0 + every)], [true, false]);
    }

    #[tokio::test]
    async fn basic_auth_takes_the_right_password_only() {
        let users = BTreeMap::from([("alice".to_owned(), bcrypt::hash("right:x", 4).unwrap())]);
        let auth = Auth::default();
        let with = |value: &str| {
            let mut h = HeaderMap::new();
            let encoded = base64::engine::general_purpose::STANDARD.encode(value);
            h.insert(
                header::AUTHORIZATION,
                format!("Basic {encoded}").parse().unwrap(),
            );
            h
        };
        assert!(auth.allows(&users, &with("alice:right:x")).await);
        assert!(
            auth.allows(&users, &with("alice:right:x")).await,
            "remembered"
        );
        assert!(!auth.allows(&users, &with("alice:wrong")).await);
        assert!(!auth.allows(&users, &with("bob:right:x")).await);
        assert!(!auth.allows(&users, &HeaderMap::new()).await);
        assert!(auth.allows(&BTreeMap::new(), &HeaderMap::new()).await);
    }
}
