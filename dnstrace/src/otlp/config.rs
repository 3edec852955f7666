//! The exporter's settings as the OpenTelemetry specification names them:
//! the general ones (a flag, or `OTEL_EXPORTER_OTLP_*`) and each signal's
//! (`OTEL_EXPORTER_OTLP_TRACES_*`, `…_LOGS_*`), which win. Everything is
//! checked and every file read here, so that a bad value is one line at
//! start rather than failures at run time.
use std::{path::Path, sync::Arc, time::Duration};

use anyhow::{anyhow, bail, Context as _, Result};
use hyper::{
    header::{HeaderName, HeaderValue},
    HeaderMap, Uri,
};
use tokio_rustls::rustls::{
    self,
    pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer},
    ClientConfig, RootCertStore,
};

use super::Protocol;

/// The general settings as the command line has them, unchecked: each
/// from its flag or else its variable.
#[derive(Clone, Debug, Default)]
pub struct General {
    pub endpoint: Option<String>,
    pub protocol: Option<String>,
    /// `key=value`s, values percent-encoded.
    pub headers: Vec<String>,
    pub certificate: Option<String>,
    pub client_certificate: Option<String>,
    pub client_key: Option<String>,
    pub compression: Option<String>,
    /// Milliseconds.
    pub timeout: Option<String>,
    pub insecure: Option<String>,
}

/// The flag each general setting is also given by.
const FLAGS: [(&str, &str); 9] = [
    ("ENDPOINT", "--otlp-endpoint"),
    ("PROTOCOL", "--otlp-protocol"),
    ("HEADERS", "--otlp-header"),
    ("CERTIFICATE", "--otlp-certificate"),
    ("CLIENT_CERTIFICATE", "--otlp-client-certificate"),
    ("CLIENT_KEY", "--otlp-client-key"),
    ("COMPRESSION", "--otlp-compression"),
    ("TIMEOUT", "--otlp-timeout"),
    ("INSECURE", "--otlp-insecure"),
];

/// What OTLP carries: journeys as traces, anomalies as logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Traces,
    Logs,
}

impl Signal {
    pub fn name(self) -> &'static str {
        match self {
            Self::Traces => "traces",
            Self::Logs => "logs",
        }
    }

    fn var(self) -> &'static str {
        match self {
            Self::Traces => "TRACES",
            Self::Logs => "LOGS",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
}

/// Where and how one signal is sent.
#[derive(Clone, Debug)]
pub struct Export {
    /// gRPC: the collector's `scheme://host:port`; HTTP/protobuf: the
    /// whole URL requests are POSTed to.
    pub endpoint: Uri,
    pub protocol: Protocol,
    /// For an `https` endpoint.
    pub tls: Option<Tls>,
    pub headers: HeaderMap,
    pub compression: Compression,
    /// Of each request, connecting included.
    pub timeout: Duration,
}

/// What the exporter trusts and shows, read and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tls {
    /// PEM of the CAs to trust; none: the system's roots.
    pub ca: Option<Vec<u8>>,
    /// PEM of the client's certificate (chain) and key, for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Each signal's export, from `general` and the variables `env` reads;
/// a signal with no endpoint, general or its own, is not exported.
pub fn resolve(
    general: &General,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(Option<Export>, Option<Export>)> {
    // An empty variable is an unset one, as the SDKs have it.
    let env = |name: &str| env(name).filter(|v| !v.is_empty());
    Ok((
        export(Signal::Traces, general, &env)?,
        export(Signal::Logs, general, &env)?,
    ))
}

/// One setting and where it came from, to name in an error.
struct Setting {
    value: String,
    from: String,
}

/// The signal's variable if set, else the general setting.
fn pick(
    signal: Signal,
    key: &str,
    general: Option<&str>,
    env: &impl Fn(&str) -> Option<String>,
) -> Option<Setting> {
    let var = format!("OTEL_EXPORTER_OTLP_{}_{key}", signal.var());
    if let Some(value) = env(&var) {
        return Some(Setting { value, from: var });
    }
    general.map(|v| Setting {
        value: v.to_owned(),
        from: general_name(key),
    })
}

fn general_name(key: &str) -> String {
    let flag = FLAGS.iter().find(|(k, _)| *k == key).map_or("", |(_, f)| f);
    format!("{flag} (OTEL_EXPORTER_OTLP_{key})")
}

fn export(
    signal: Signal,
    g: &General,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Option<Export>> {
    let get =
        |key: &str, general: Option<&String>| pick(signal, key, general.map(|s| s.as_str()), env);
    let own = env(&format!("OTEL_EXPORTER_OTLP_{}_ENDPOINT", signal.var()));
    let Some(endpoint) = get("ENDPOINT", g.endpoint.as_ref()) else {
        return Ok(None);
    };
    let protocol = match get("PROTOCOL", g.protocol.as_ref()) {
        Some(p) => protocol(&p)?,
        None => Protocol::Grpc,
    };
    let insecure = get("INSECURE", g.insecure.as_ref())
        .map(|s| boolean(&s))
        .transpose()?
        .unwrap_or(false);
    // The general endpoint is the collector's; a signal's own, its URL.
    let path = (own.is_none() && protocol == Protocol::HttpProtobuf)
        .then(|| format!("/v1/{}", signal.name()));
    let endpoint = url(&endpoint, protocol, insecure, path.as_deref())?;
    let tls = if endpoint.scheme_str() == Some("https") {
        let ca = get("CERTIFICATE", g.certificate.as_ref());
        let cert = get("CLIENT_CERTIFICATE", g.client_certificate.as_ref());
        let key = get("CLIENT_KEY", g.client_key.as_ref());
        Some(tls(ca, cert, key)?)
    } else {
        None
    };
    let headers = match env(&format!("OTEL_EXPORTER_OTLP_{}_HEADERS", signal.var())) {
        Some(list) => {
            let from = format!("OTEL_EXPORTER_OTLP_{}_HEADERS", signal.var());
            headers(list.split(','), &from)?
        }
        None => headers(
            g.headers.iter().map(String::as_str),
            &general_name("HEADERS"),
        )?,
    };
    let compression = match get("COMPRESSION", g.compression.as_ref()) {
        Some(c) => compression(&c)?,
        None => Compression::None,
    };
    let timeout = match get("TIMEOUT", g.timeout.as_ref()) {
        Some(t) => timeout(&t)?,
        None => DEFAULT_TIMEOUT,
    };
    Ok(Some(Export {
        endpoint,
        protocol,
        tls,
        headers,
        compression,
        timeout,
    }))
}

fn protocol(s: &Setting) -> Result<Protocol> {
    match s.value.as_str() {
        "grpc" => Ok(Protocol::Grpc),
        "http/protobuf" => Ok(Protocol::HttpProtobuf),
        v => bail!("{}: {v:?} is not `grpc` or `http/protobuf`", s.from),
    }
}

fn boolean(s: &Setting) -> Result<bool> {
    match s.value.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        v => bail!("{}: {v:?} is not `true` or `false`", s.from),
    }
}

fn compression(s: &Setting) -> Result<Compression> {
    match s.value.as_str() {
        "gzip" => Ok(Compression::Gzip),
        "none" => Ok(Compression::None),
        v => bail!("{}: {v:?} is not `gzip` or `none`", s.from),
    }
}

fn timeout(s: &Setting) -> Result<Duration> {
    match s.value.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => bail!(
            "{}: {:?} is not a number of milliseconds above 0",
            s.from,
            s.value
        ),
    }
}

/// The URL requests go to. A gRPC endpoint without a scheme is `https`
/// unless insecure; an HTTP one takes `path` after its own when given.
fn url(s: &Setting, protocol: Protocol, insecure: bool, path: Option<&str>) -> Result<Uri> {
    let raw = s.value.trim();
    let whole = match (raw.contains("://"), protocol) {
        (true, _) => raw.to_owned(),
        (false, Protocol::Grpc) if insecure => format!("http://{raw}"),
        (false, Protocol::Grpc) => format!("https://{raw}"),
        (false, Protocol::HttpProtobuf) => {
            bail!("{}: {raw:?} needs its scheme, http:// or https://", s.from)
        }
    };
    let bad = |why: &str| anyhow!("{}: {raw:?} {why}", s.from);
    let uri: Uri = whole.parse().map_err(|_| bad("is not a URL"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(bad("is not an http:// or https:// URL"));
    }
    let Some(authority) = uri.authority().cloned() else {
        return Err(bad("has no host"));
    };
    let Some(path) = path else { return Ok(uri) };
    let base = uri.path().trim_end_matches('/');
    let scheme = uri.scheme_str().unwrap_or("http");
    format!("{scheme}://{authority}{base}{path}")
        .parse()
        .map_err(|_| bad("is not a URL"))
}

/// `key=value` items (empty ones skipped), values percent-decoded.
fn headers<'a>(items: impl Iterator<Item = &'a str>, from: &str) -> Result<HeaderMap> {
    let mut map = HeaderMap::new();
    for item in items.map(str::trim).filter(|i| !i.is_empty()) {
        let bad = |why: &str| anyhow!("{from}: {item:?} {why}");
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| bad("is not key=value"))?;
        let name = HeaderName::from_bytes(k.trim().as_bytes())
            .map_err(|_| bad("does not start with a header name"))?;
        let value = percent_encoding::percent_decode_str(v.trim())
            .decode_utf8()
            .map_err(|_| bad("has a value that is not UTF-8 once percent-decoded"))?;
        let value = HeaderValue::from_str(&value)
            .map_err(|_| bad("has a value no header can carry (control characters)"))?;
        map.append(name, value);
    }
    Ok(map)
}

fn tls(ca: Option<Setting>, cert: Option<Setting>, key: Option<Setting>) -> Result<Tls> {
    let ca = ca
        .map(|s| {
            let pem = read(&s)?;
            roots(Some(&pem)).with_context(|| format!("{}: {}", s.from, s.value))?;
            Ok::<_, anyhow::Error>(pem)
        })
        .transpose()?;
    let identity = match (cert, key) {
        (None, None) => None,
        (Some(c), None) => bail!("{} is given without {}", c.from, general_name("CLIENT_KEY")),
        (None, Some(k)) => bail!(
            "{} is given without {}",
            k.from,
            general_name("CLIENT_CERTIFICATE")
        ),
        (Some(c), Some(k)) => {
            let pair = (read(&c)?, read(&k)?);
            certs(&pair.0).with_context(|| format!("{}: {}", c.from, c.value))?;
            private_key(&pair.1).with_context(|| format!("{}: {}", k.from, k.value))?;
            Some(pair)
        }
    };
    let tls = Tls { ca, identity };
    client_config(&tls)?;
    Ok(tls)
}

fn read(s: &Setting) -> Result<Vec<u8>> {
    std::fs::read(Path::new(&s.value))
        .with_context(|| format!("{}: cannot read {}", s.from, s.value))
}

fn certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("not PEM: {e}"))?;
    if certs.is_empty() {
        bail!("no PEM certificate in it");
    }
    Ok(certs)
}

fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| anyhow!("no PEM private key in it ({e})"))
}

/// The CAs of `pem`, or the system's.
fn roots(pem: Option<&[u8]>) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    match pem {
        Some(pem) => {
            for cert in certs(pem)? {
                store
                    .add(cert)
                    .map_err(|e| anyhow!("not a CA certificate: {e}"))?;
            }
        }
        None => {
            store.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            if store.is_empty() {
                bail!("no CA certificates in the system's store (/etc/ssl/certs, SSL_CERT_FILE): install ca-certificates, or name the CA with --otlp-certificate (OTEL_EXPORTER_OTLP_CERTIFICATE)");
            }
        }
    }
    Ok(store)
}

/// rustls's client configuration for `tls` (ring, as tonic's).
pub(super) fn client_config(tls: &Tls) -> Result<Arc<ClientConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots(tls.ca.as_deref())?);
    let config = match &tls.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(certs(cert)?, private_key(key)?)
            .map_err(|e| anyhow!("the client certificate and key do not go together: {e}"))?,
    };
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn resolved(g: &General, vars: &[(&str, &str)]) -> Result<(Option<Export>, Option<Export>)> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        resolve(g, |k| vars.get(k).cloned())
    }

    fn endpoint(e: &str) -> General {
        General {
            endpoint: Some(e.into()),
            ..General::default()
        }
    }

    fn url_of(e: Option<Export>) -> String {
        e.expect("exported").endpoint.to_string()
    }

    #[test]
    fn no_endpoint_no_export() {
        let (t, l) = resolved(&General::default(), &[]).unwrap();
        assert!(t.is_none() && l.is_none());
        let (t, l) = resolved(
            &General::default(),
            &[("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "http://c:4317")],
        )
        .unwrap();
        assert!(t.is_none());
        assert_eq!(url_of(l), "http://c:4317/");
    }

    /// HTTP/protobuf: the general endpoint takes each signal's path, a
    /// signal's own is its URL as given.
    #[test]
    fn http_paths_go_after_the_general_endpoint_only() {
        let g = General {
            protocol: Some("http/protobuf".into()),
            ..endpoint("https://otel.example.com:4318/otlp/")
        };
        let vars = [(
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
            "https://logs.example.com/ingest",
        )];
        let (t, l) = resolved(&g, &vars).unwrap();
        assert_eq!(url_of(t), "https://otel.example.com:4318/otlp/v1/traces");
        assert_eq!(url_of(l), "https://logs.example.com/ingest");
        let g = General {
            protocol: Some("http/protobuf".into()),
            ..endpoint("http://c:4318")
        };
        assert_eq!(
            url_of(resolved(&g, &[]).unwrap().0),
            "http://c:4318/v1/traces"
        );
    }

    /// A signal's variables win over the general settings, flag or not,
    /// each on its own.
    #[test]
    fn a_signals_variables_win() {
        let g = General {
            protocol: Some("grpc".into()),
            compression: Some("gzip".into()),
            timeout: Some("2500".into()),
            headers: vec!["authorization=Bearer%20general".into()],
            ..endpoint("http://c:4317")
        };
        let vars = [
            ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "none"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-team=dns,x-env=prod"),
            ("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "700"),
            ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ""),
        ];
        let (t, l) = resolved(&g, &vars).unwrap();
        let (t, l) = (t.unwrap(), l.unwrap());
        assert_eq!(t.compression, Compression::None);
        assert_eq!(t.timeout, Duration::from_millis(2500));
        assert_eq!(t.headers.len(), 2);
        assert!(!t.headers.contains_key("authorization"), "replaced whole");
        assert_eq!(
            t.endpoint.to_string(),
            "http://c:4317/",
            "an empty variable is unset"
        );
        assert_eq!(l.compression, Compression::Gzip);
        assert_eq!(l.timeout, Duration::from_millis(700));
        assert_eq!(l.headers["authorization"], "Bearer general");
        assert_eq!(l.protocol, Protocol::HttpProtobuf);
        assert_eq!(l.endpoint.to_string(), "http://c:4317/v1/logs");
    }

    #[test]
    fn header_values_are_percent_decoded() {
        let g = General {
            headers: vec![
                "Authorization=Basic%20dXNlcjpwYXNz%3D%3D".into(),
                " api-key = a%2Cb ".into(),
                "".into(),
            ],
            ..endpoint("http://c:4317")
        };
        let h = resolved(&g, &[]).unwrap().0.unwrap().headers;
        assert_eq!(h["authorization"], "Basic dXNlcjpwYXNz==");
        assert_eq!(h["api-key"], "a,b");
        assert_eq!(h.len(), 2);
    }

    /// Each bad value is an error naming where it was given.
    #[test]
    fn bad_values_name_their_flag_or_variable() {
        let bad = |g: General, vars: &[(&str, &str)], names: &str| {
            let e = format!("{:#}", resolved(&g, vars).unwrap_err());
            assert!(e.contains(names), "{e:?} names {names}");
        };
        let with = |f: fn(&mut General)| {
            let mut g = endpoint("http://c:4317");
            f(&mut g);
            g
        };
        bad(
            with(|g| g.headers = vec!["nokey".into()]),
            &[],
            "--otlp-header (OTEL_EXPORTER_OTLP_HEADERS): \"nokey\" is not key=value",
        );
        bad(
            endpoint("http://c"),
            &[("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "a=b,bad header=x")],
            "OTEL_EXPORTER_OTLP_LOGS_HEADERS: \"bad header=x\"",
        );
        bad(with(|g| g.headers = vec!["k=%FF".into()]), &[], "not UTF-8");
        bad(
            with(|g| g.compression = Some("br".into())),
            &[],
            "--otlp-compression (OTEL_EXPORTER_OTLP_COMPRESSION): \"br\"",
        );
        bad(
            endpoint("http://c"),
            &[("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "10s")],
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT: \"10s\"",
        );
        bad(
            with(|g| g.timeout = Some("0".into())),
            &[],
            "--otlp-timeout",
        );
        bad(
            with(|g| g.protocol = Some("http/json".into())),
            &[],
            "--otlp-protocol (OTEL_EXPORTER_OTLP_PROTOCOL)",
        );
        bad(
            with(|g| g.insecure = Some("yes".into())),
            &[],
            "--otlp-insecure",
        );
        bad(
            General {
                protocol: Some("http/protobuf".into()),
                ..endpoint("collector:4318")
            },
            &[],
            "needs its scheme",
        );
        bad(endpoint("ftp://c:21"), &[], "--otlp-endpoint");
    }

    /// gRPC without a scheme is TLS unless insecure; TLS files are read
    /// only for https.
    #[test]
    fn grpc_without_a_scheme_is_tls_unless_insecure() {
        let g = General {
            insecure: Some("TRUE".into()),
            certificate: Some("/nonexistent/ca.pem".into()),
            ..endpoint("collector:4317")
        };
        let t = resolved(&g, &[]).unwrap().0.unwrap();
        assert_eq!(t.endpoint.to_string(), "http://collector:4317/");
        assert!(t.tls.is_none());
        let e = resolved(
            &General {
                insecure: None,
                ..g
            },
            &[],
        )
        .unwrap_err();
        assert_eq!(format!("{e:#}").lines().count(), 1, "one line: {e:#}");
        assert!(format!("{e:#}").starts_with(
            "--otlp-certificate (OTEL_EXPORTER_OTLP_CERTIFICATE): cannot read /nonexistent/ca.pem"
        ));
    }

    /// A file in the temporary directory, its name the test's own.
    fn file(name: &str, text: &str) -> String {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("dnstrace-otlp-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    #[test]
    fn a_garbage_ca_or_a_key_alone_is_refused() {
        let garbage = file("garbage.pem", "not a certificate\n");
        let g = General {
            certificate: Some(garbage.clone()),
            ..endpoint("https://c:4317")
        };
        let e = format!("{:#}", resolved(&g, &[]).unwrap_err());
        assert!(
            e.starts_with(&format!(
                "--otlp-certificate (OTEL_EXPORTER_OTLP_CERTIFICATE): {garbage}"
            )) && e.contains("no PEM certificate"),
            "{e}"
        );
        let g = General {
            client_key: Some(garbage.clone()),
            ..endpoint("https://c:4317")
        };
        let vars = [("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", garbage.as_str())];
        let e = format!(
            "{:#}",
            resolved(&endpoint("https://c:4317"), &vars).unwrap_err()
        );
        assert_eq!(e, "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY is given without --otlp-client-certificate (OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE)");
        let e = format!("{:#}", resolved(&g, &[]).unwrap_err());
        assert!(
            e.starts_with("--otlp-client-key (OTEL_EXPORTER_OTLP_CLIENT_KEY) is given without"),
            "{e}"
        );
        let _ = std::fs::remove_file(&garbage);
    }
}
