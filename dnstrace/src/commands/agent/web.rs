//! The web config of `/metrics`: the file Prometheus's exporter-toolkit
//! reads (`--web.config.file`), field for field and as strictly, so that
//! one file secures Prometheus and the agent alike. TLS with client
//! certificates, basic auth, response headers and a rate limit. A setting
//! that cannot be honoured (TLS 1.0, a CBC suite, P-521) is refused in one
//! line, never ignored.
//!
//! Read again whenever it or a file it names changes (each connection and
//! each request look), so a renewed certificate takes effect without a
//! restart. A change that does not load keeps the last good config,
//! logged and counted: a half-written certificate must not drop the
//! scrapes, nor open the endpoint.
use std::{
    collections::BTreeMap,
    net::IpAddr,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use anyhow::{anyhow, bail, Context as _, Result};
use hyper::header::{HeaderName, HeaderValue};
use rustls::{
    client::danger::HandshakeSignatureValid,
    crypto::{ring, CryptoProvider, WebPkiSupportedAlgorithms},
    pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer, UnixTime},
    server::{
        danger::{ClientCertVerified, ClientCertVerifier},
        WebPkiClientVerifier,
    },
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
    SupportedCipherSuite, SupportedProtocolVersion,
};
use serde::Deserialize;

use super::lock;

/// What the file says, as exporter-toolkit's `Config` (unknown keys are
/// errors there too: yaml.UnmarshalStrict).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    http_server_config: Option<HttpFile>,
    basic_auth_users: Option<BTreeMap<String, String>>,
    rate_limit: Option<RateFile>,
}

/// exporter-toolkit's `TLSConfig`; an empty string is unset, as in Go.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct TlsFile {
    cert: String,
    key: String,
    client_ca: String,
    cert_file: String,
    key_file: String,
    client_auth_type: String,
    client_ca_file: String,
    cipher_suites: Vec<String>,
    curve_preferences: Vec<String>,
    min_version: Option<String>,
    max_version: Option<String>,
    prefer_server_cipher_suites: Option<bool>,
    client_allowed_sans: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct HttpFile {
    /// Allowed, not required: the agent answers in HTTP/1.1 either way.
    #[serde(rename = "http2")]
    _http2: Option<bool>,
    headers: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct RateFile {
    burst: u32,
    interval: Option<GoDuration>,
}

/// A Go `time.Duration` in YAML: `"1s"`, `"250ms"`, or nanoseconds.
#[derive(Deserialize)]
#[serde(untagged)]
enum GoDuration {
    Nanos(u64),
    Text(String),
}

/// A loaded web config, what each connection and request go by.
#[derive(Default)]
pub struct Web {
    /// None: plain HTTP, as exporter-toolkit without `tls_server_config`.
    pub tls: Option<Arc<ServerConfig>>,
    /// User name to bcrypt hash; none: no basic auth.
    pub users: BTreeMap<String, String>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub rate: Option<Rate>,
}

/// Requests let through: `burst` at once, then one every `every`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub every: Duration,
    pub burst: u32,
}

/// Loads the file at `path`: the config, or one line saying what is wrong.
pub fn load(path: &Path) -> Result<Web> {
    let (file, files) = parse(path)?;
    build(file, &files).map_err(|e| anyhow!("web config {}: {e:#}", path.display()))
}

/// The paths a file names, resolved as exporter-toolkit does (relative to
/// the file's directory): the ones to watch for changes.
#[derive(Default, Clone, PartialEq, Debug)]
struct Files {
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
}

impl Files {
    fn all(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.cert, &self.key, &self.client_ca]
            .into_iter()
            .flatten()
    }
}

fn parse(path: &Path) -> Result<(File, Files)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the web config {}", path.display()))?;
    let file: File = if text.trim().is_empty() {
        File::default()
    } else {
        serde_yaml_ng::from_str(&text).map_err(|e| {
            anyhow!(
                "web config {}: {} (fields as Prometheus's web.config.file)",
                path.display(),
                one_line(&e.to_string())
            )
        })?
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let join = |p: &str| (!p.is_empty()).then(|| dir.join(p));
    let files = file
        .tls_server_config
        .as_ref()
        .map(|t| Files {
            cert: join(&t.cert_file),
            key: join(&t.key_file),
            client_ca: join(&t.client_ca_file),
        })
        .unwrap_or_default();
    Ok((file, files))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn build(file: File, files: &Files) -> Result<Web> {
    let users = file.basic_auth_users.unwrap_or_default();
    for (user, hash) in &users {
        hash.parse::<bcrypt::HashParts>().map_err(|_| {
            anyhow!("basic_auth_users: {user}'s password is not a bcrypt hash (htpasswd -nBC 10 {user})")
        })?;
    }
    let http = file.http_server_config.unwrap_or_default();
    Ok(Web {
        tls: match file.tls_server_config {
            Some(t) if t.enabled() => Some(Arc::new(server_config(&t, files)?)),
            _ => None,
        },
        users,
        headers: headers(&http.headers)?,
        rate: file.rate_limit.map(rate).transpose()?.flatten(),
    })
}

/// The headers exporter-toolkit lets a file set, with the values it
/// allows (any, where it lists none).
const HEADERS: [(&str, &[&str]); 5] = [
    ("Strict-Transport-Security", &[]),
    ("X-Content-Type-Options", &["nosniff"]),
    ("X-Frame-Options", &["deny", "sameorigin"]),
    ("X-XSS-Protection", &[]),
    ("Content-Security-Policy", &[]),
];

fn headers(given: &BTreeMap<String, String>) -> Result<Vec<(HeaderName, HeaderValue)>> {
    given
        .iter()
        .map(|(k, v)| {
            let Some((_, allowed)) = HEADERS.iter().find(|(h, _)| h == k) else {
                bail!(
                    "http_server_config.headers: {k} cannot be set (only {})",
                    HEADERS.map(|h| h.0).join(", ")
                );
            };
            if !allowed.is_empty() && !allowed.contains(&v.as_str()) {
                bail!("http_server_config.headers: {k} must be one of {allowed:?}, not {v:?}");
            }
            let value = HeaderValue::from_str(v).map_err(|_| {
                anyhow!("http_server_config.headers: {k}'s value is no header value")
            })?;
            Ok((HeaderName::from_bytes(k.as_bytes())?, value))
        })
        .collect()
}

fn rate(r: RateFile) -> Result<Option<Rate>> {
    let every = match r.interval {
        None => return Ok(None),
        Some(GoDuration::Nanos(ns)) => Duration::from_nanos(ns),
        Some(GoDuration::Text(s)) => humantime::parse_duration(&s)
            .map_err(|e| anyhow!("rate_limit.interval {s:?}: {e} (as 1s or 250ms)"))?,
    };
    if every.is_zero() {
        return Ok(None);
    }
    if r.burst == 0 {
        bail!("rate_limit: a burst of 0 lets no request through; give burst: 1 or more");
    }
    Ok(Some(Rate {
        every,
        burst: r.burst,
    }))
}

/// exporter-toolkit's client_auth_type values (and its old spelling
/// RequireClientCert).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ClientAuth {
    NoClientCert,
    RequestClientCert,
    RequireAnyClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

impl ClientAuth {
    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "" | "NoClientCert" => Self::NoClientCert,
            "RequestClientCert" => Self::RequestClientCert,
            "RequireAnyClientCert" | "RequireClientCert" => Self::RequireAnyClientCert,
            "VerifyClientCertIfGiven" => Self::VerifyClientCertIfGiven,
            "RequireAndVerifyClientCert" => Self::RequireAndVerifyClientCert,
            _ => bail!(
                "tls_server_config.client_auth_type {s:?} is none of NoClientCert, RequestClientCert, \
                 RequireAnyClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"
            ),
        })
    }
}

impl TlsFile {
    /// exporter-toolkit's `IsEnabled`: any of these set means TLS.
    fn enabled(&self) -> bool {
        [
            &self.cert,
            &self.key,
            &self.cert_file,
            &self.key_file,
            &self.client_ca,
            &self.client_ca_file,
            &self.client_auth_type,
        ]
        .iter()
        .any(|s| !s.is_empty())
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| anyhow!("cannot read {what} {}: {e}", path.display()))
}

/// A file's bytes if named, else the inline text (a file wins, as in Go).
fn pem(file: &Option<PathBuf>, inline: &str, what: &str) -> Result<Option<Vec<u8>>> {
    match file {
        Some(p) => read(p, what).map(Some),
        None if inline.is_empty() => Ok(None),
        None => Ok(Some(inline.as_bytes().to_vec())),
    }
}

fn server_config(t: &TlsFile, files: &Files) -> Result<ServerConfig> {
    let cert = pem(&files.cert, &t.cert, "cert_file")?
        .ok_or_else(|| anyhow!("tls_server_config: missing one of cert or cert_file"))?;
    let key = pem(&files.key, &t.key, "key_file")?
        .ok_or_else(|| anyhow!("tls_server_config: missing one of key or key_file"))?;
    let certs = CertificateDer::pem_slice_iter(&cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("tls_server_config: the certificate is not PEM: {e}"))?;
    if certs.is_empty() {
        bail!("tls_server_config: no PEM certificate in cert_file (or cert)");
    }
    let key = PrivateKeyDer::from_pem_slice(&key)
        .map_err(|e| anyhow!("tls_server_config: no PEM private key in key_file (or key): {e}"))?;
    let provider = Arc::new(provider(t)?);
    let versions = versions(t)?;
    let verifier = client_verifier(t, files, &provider)?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|e| anyhow!("tls_server_config: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| anyhow!("tls_server_config: the certificate and key: {e}"))?;
    config.ignore_client_order = t.prefer_server_cipher_suites.unwrap_or(true);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// TLS 1.2 suites by Go's names; TLS 1.3's are always on, as in Go.
const SUITES: [(&str, SupportedCipherSuite); 6] = {
    use ring::cipher_suite::*;
    [
        (
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
            TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
    ]
};

/// Suites Go knows that rustls does not offer: CBC, or RSA key exchange.
const GO_ONLY_SUITES: [&str; 8] = [
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
];

const TLS13_SUITES: [&str; 3] = [
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// ring's suites and key exchanges, as narrowed by the file.
fn provider(t: &TlsFile) -> Result<CryptoProvider> {
    let mut p = ring::default_provider();
    if !t.cipher_suites.is_empty() {
        let mut chosen: Vec<SupportedCipherSuite> = p
            .cipher_suites
            .iter()
            .copied()
            .filter(|s| s.version() == &rustls::version::TLS13)
            .collect();
        for name in &t.cipher_suites {
            chosen.push(suite(name)?);
        }
        p.cipher_suites = chosen;
    }
    if !t.curve_preferences.is_empty() {
        p.kx_groups = t
            .curve_preferences
            .iter()
            .map(|c| curve(c))
            .collect::<Result<_>>()?;
    }
    Ok(p)
}

fn suite(name: &str) -> Result<SupportedCipherSuite> {
    if let Some((_, s)) = SUITES.iter().find(|(n, _)| *n == name) {
        return Ok(*s);
    }
    if GO_ONLY_SUITES.contains(&name) {
        bail!("tls_server_config.cipher_suites: {name} is not offered by the agent (no CBC or RSA key exchange in rustls); use the ECDHE GCM or CHACHA20 suites");
    }
    if TLS13_SUITES.contains(&name) {
        bail!("tls_server_config.cipher_suites: {name} is a TLS 1.3 suite, which cannot be chosen (Go ignores it); list TLS 1.2 suites only");
    }
    bail!("tls_server_config.cipher_suites: unknown cipher {name}")
}

fn curve(name: &str) -> Result<&'static dyn rustls::crypto::SupportedKxGroup> {
    Ok(match name {
        "X25519" => ring::kx_group::X25519,
        "CurveP256" => ring::kx_group::SECP256R1,
        "CurveP384" => ring::kx_group::SECP384R1,
        "CurveP521" => bail!("tls_server_config.curve_preferences: CurveP521 is not offered by the agent (rustls with ring); use X25519, CurveP256 or CurveP384"),
        _ => bail!("tls_server_config.curve_preferences: unknown curve {name}"),
    })
}

fn version(v: Option<&str>, default: u8, field: &str) -> Result<u8> {
    match v {
        None => Ok(default),
        Some("TLS12") => Ok(2),
        Some("TLS13") => Ok(3),
        Some(s @ ("TLS10" | "TLS11")) => bail!(
            "tls_server_config.{field}: {s} is not offered by the agent (TLS 1.2 and 1.3 only); use TLS12"
        ),
        Some(s) => bail!("tls_server_config.{field}: unknown TLS version {s:?} (TLS12 or TLS13)"),
    }
}

fn versions(t: &TlsFile) -> Result<Vec<&'static SupportedProtocolVersion>> {
    let min = version(t.min_version.as_deref(), 2, "min_version")?;
    let max = version(t.max_version.as_deref(), 3, "max_version")?;
    if min > max {
        bail!("tls_server_config: min_version is above max_version");
    }
    let all = [(2, &rustls::version::TLS12), (3, &rustls::version::TLS13)];
    Ok(all
        .into_iter()
        .filter(|(v, _)| (min..=max).contains(v))
        .map(|(_, p)| p)
        .collect())
}

fn client_verifier(
    t: &TlsFile,
    files: &Files,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>> {
    let auth = ClientAuth::parse(&t.client_auth_type)?;
    let ca = pem(&files.client_ca, &t.client_ca, "client_ca_file")?;
    if ca.is_some() && auth == ClientAuth::NoClientCert {
        bail!("tls_server_config: client CA's have been configured without a client_auth_type (RequireAndVerifyClientCert?)");
    }
    let sans = t.client_allowed_sans.clone();
    if sans.is_some() && auth == ClientAuth::NoClientCert {
        bail!("tls_server_config: client_allowed_sans needs a client_auth_type that asks for a certificate");
    }
    let algs = provider.signature_verification_algorithms;
    let inner: Arc<dyn ClientCertVerifier> = match auth {
        ClientAuth::NoClientCert => WebPkiClientVerifier::no_client_auth(),
        ClientAuth::RequestClientCert | ClientAuth::RequireAnyClientCert => Arc::new(AnyCert {
            mandatory: auth == ClientAuth::RequireAnyClientCert,
            algs,
        }),
        _ => {
            let ca = ca.ok_or_else(|| {
                anyhow!("tls_server_config: client_auth_type {auth:?} needs client_ca_file (or client_ca)")
            })?;
            let builder = WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(&ca)?),
                provider.clone(),
            );
            let builder = match auth {
                ClientAuth::VerifyClientCertIfGiven => builder.allow_unauthenticated(),
                _ => builder,
            };
            builder
                .build()
                .map_err(|e| anyhow!("tls_server_config: client_ca_file: {e}"))?
        }
    };
    Ok(match sans {
        Some(allowed) => Arc::new(SansAllowed { inner, allowed }),
        None => inner,
    })
}

fn roots(pem: &[u8]) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| anyhow!("tls_server_config: client CA is not PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| anyhow!("tls_server_config: client CA: {e}"))?;
    }
    if roots.is_empty() {
        bail!("tls_server_config: no PEM certificate in client_ca_file (or client_ca)");
    }
    Ok(roots)
}

/// RequestClientCert and RequireAnyClientCert: a certificate asked for,
/// its key proven, its chain not verified (Go's tls.RequireAnyClientCert).
#[derive(Debug)]
struct AnyCert {
    mandatory: bool,
    algs: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for AnyCert {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// client_allowed_sans: the certificate, once `inner` takes it, must name
/// one of these among its DNS, email, IP or URI SANs (exact strings, as
/// exporter-toolkit compares them).
#[derive(Debug)]
struct SansAllowed {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: Vec<String>,
}

impl ClientCertVerifier for SansAllowed {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let sans = sans(end_entity).map_err(rustls::Error::General)?;
        if sans.iter().any(|s| self.allowed.contains(s)) {
            Ok(verified)
        } else {
            Err(rustls::Error::General(format!(
                "the client certificate's SANs {sans:?} are none of client_allowed_sans"
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A certificate's DNS, email, IP and URI SANs, written as Go writes them.
fn sans(der: &CertificateDer<'_>) -> Result<Vec<String>, String> {
    use x509_parser::{extensions::GeneralName, prelude::*};
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| format!("the client certificate: {e}"))?;
    let Ok(Some(ext)) = cert.subject_alternative_name() else {
        return Ok(Vec::new());
    };
    Ok(ext
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(s) | GeneralName::RFC822Name(s) | GeneralName::URI(s) => {
                Some(s.to_string())
            }
            GeneralName::IPAddress(b) => ip(b).map(|ip| ip.to_string()),
            _ => None,
        })
        .collect())
}

/// Go prints an IPv4-mapped IPv6 address as IPv4.
fn ip(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => {
            let v6 = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?);
            Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
        }
        _ => None,
    }
}

/// The file and the files it names, as they are now: a change in any is a
/// reason to load again.
#[derive(PartialEq, Default)]
struct Seen(Vec<Option<Stat>>);

/// Device, inode, modification time (s, ns) and length.
type Stat = (u64, u64, i64, i64, u64);

impl Seen {
    fn now(config: &Path, files: &Files) -> Self {
        let stat = |p: &Path| {
            std::fs::metadata(p)
                .ok()
                .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
        };
        Self(
            std::iter::once(config)
                .chain(files.all().map(PathBuf::as_path))
                .map(stat)
                .collect(),
        )
    }
}

/// The web config file, loaded again when it or a file it names changes.
pub struct WebConfig {
    path: PathBuf,
    state: Mutex<State>,
    pub counts: ReloadCounts,
}

struct State {
    seen: Seen,
    files: Files,
    good: Arc<Web>,
}

/// Loads tried since the start, for `/metrics`.
#[derive(Default)]
pub struct ReloadCounts {
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    pub last_ok: AtomicBool,
}

impl WebConfig {
    /// The first load, which must succeed.
    pub fn open(path: PathBuf) -> Result<Self> {
        let seen_files = parse(&path).map(|(_, f)| f).unwrap_or_default();
        let seen = Seen::now(&path, &seen_files);
        let good = load(&path)?;
        let counts = ReloadCounts::default();
        counts.last_ok.store(true, Ordering::Relaxed);
        Ok(Self {
            path,
            state: Mutex::new(State {
                seen,
                files: seen_files,
                good: Arc::new(good),
            }),
            counts,
        })
    }

    /// The config now: loaded again if anything changed, else the last
    /// good one.
    pub fn current(&self) -> Arc<Web> {
        let mut s = lock(&self.state);
        let seen = Seen::now(&self.path, &s.files);
        if seen != s.seen {
            s.seen = seen;
            self.reload(&mut s);
        }
        s.good.clone()
    }

    fn reload(&self, s: &mut State) {
        if let Ok((_, files)) = parse(&self.path) {
            if files != s.files {
                s.files = files;
                s.seen = Seen::now(&self.path, &s.files);
            }
        }
        match load(&self.path) {
            Ok(web) => {
                s.good = Arc::new(web);
                self.counts.succeeded.fetch_add(1, Ordering::Relaxed);
                self.counts.last_ok.store(true, Ordering::Relaxed);
                log::info!("web config {}: loaded again", self.path.display());
            }
            Err(e) => {
                self.counts.failed.fetch_add(1, Ordering::Relaxed);
                self.counts.last_ok.store(false, Ordering::Relaxed);
                log::warn!("{e:#}; /metrics goes on with the last good web config");
            }
        }
    }
}

#[cfg(test)]
mod tests;
