//! The web config as exporter-toolkit reads it: each client_auth_type
//! tried by real handshakes (rustls in memory) with certificates openssl
//! made, and bad files refused in one line.
use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
};

use rustls::{
    crypto::ring,
    pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer, ServerName},
    ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection,
};

use super::*;

/// A directory of certificates: `ca` signs `server` (localhost) and
/// `client` (SAN DNS:prometheus, email scraper@example.com); `other`
/// signs `stranger` (SAN DNS:prometheus too).
struct Certs(PathBuf);

impl Certs {
    fn make(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("dnstrace-web-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let script = r#"set -e
for ca in ca other; do
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj "/CN=web $ca" -keyout $ca.key -out $ca.pem 2>/dev/null
done
mk() {
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$1" \
    -keyout $1.key -out $1.csr 2>/dev/null
  printf "subjectAltName=$3\nextendedKeyUsage=serverAuth,clientAuth\n" > $1.ext
  openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial -days 1 \
    -extfile $1.ext -out $1.pem 2>/dev/null
}
mk server ca DNS:localhost,IP:127.0.0.1
mk client ca DNS:prometheus,email:scraper@example.com
mk stranger other DNS:prometheus
"#;
        let ok = Command::new("sh")
            .args(["-c", script])
            .current_dir(&dir)
            .status()
            .expect("openssl (Debian's) makes the certificates");
        assert!(ok.success());
        Self(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// A web config `body` written beside the certificates.
    fn config(&self, body: &str) -> PathBuf {
        let path = self.0.join("web.yml");
        std::fs::write(&path, body).unwrap();
        path
    }

    fn client(&self, who: Option<&str>) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        let ca = std::fs::read(self.path("ca.pem")).unwrap();
        roots
            .add(CertificateDer::from_pem_slice(&ca).unwrap())
            .unwrap();
        let b = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        Arc::new(match who {
            None => b.with_no_client_auth(),
            Some(who) => {
                let cert = std::fs::read(self.path(&format!("{who}.pem"))).unwrap();
                let key = std::fs::read(self.path(&format!("{who}.key"))).unwrap();
                let certs = vec![CertificateDer::from_pem_slice(&cert).unwrap()];
                let key = PrivateKeyDer::from_pem_slice(&key).unwrap();
                b.with_client_auth_cert(certs, key).unwrap()
            }
        })
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A whole handshake between `server` and a client presenting `who`'s
/// certificate (or none), in memory.
fn handshake(server: &Arc<ServerConfig>, client: Arc<ClientConfig>) -> Result<(), rustls::Error> {
    let name = ServerName::try_from("localhost").unwrap();
    let mut c = ClientConnection::new(client, name)?;
    let mut s = ServerConnection::new(server.clone())?;
    for _ in 0..10 {
        let mut wire = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut wire).unwrap();
        }
        let mut rd = &wire[..];
        while !rd.is_empty() {
            s.read_tls(&mut rd).unwrap();
            s.process_new_packets()?;
        }
        let mut wire = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut wire).unwrap();
        }
        let mut rd = &wire[..];
        while !rd.is_empty() {
            c.read_tls(&mut rd).unwrap();
            c.process_new_packets()?;
        }
        if !c.is_handshaking() && !s.is_handshaking() && !c.wants_write() {
            return Ok(());
        }
    }
    panic!("the handshake did not end")
}

fn tls(certs: &Certs, extra: &str) -> Arc<ServerConfig> {
    let path = certs.config(&format!(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n{extra}"
    ));
    load(&path).unwrap().tls.expect("TLS")
}

/// Which clients finish a handshake: none, ca's client, other's stranger.
fn who_gets_in(certs: &Certs, server: &Arc<ServerConfig>) -> [bool; 3] {
    [None, Some("client"), Some("stranger")].map(|who| handshake(server, certs.client(who)).is_ok())
}

#[test]
fn each_client_auth_type_lets_in_whom_go_does() {
    let certs = Certs::make("auth");
    let with_ca = "  client_ca_file: ca.pem\n";
    for (auth, expected) in [
        ("NoClientCert", [true, true, true]),
        ("RequestClientCert", [true, true, true]),
        ("RequireAnyClientCert", [false, true, true]),
        ("RequireClientCert", [false, true, true]),
        ("VerifyClientCertIfGiven", [true, true, false]),
        ("RequireAndVerifyClientCert", [false, true, false]),
    ] {
        let ca = if auth.contains("Verify") { with_ca } else { "" };
        let server = tls(&certs, &format!("  client_auth_type: {auth}\n{ca}"));
        assert_eq!(
            who_gets_in(&certs, &server),
            expected,
            "{auth}: none, client, stranger"
        );
    }
    // Plain TLS when no client_auth_type is given.
    assert_eq!(who_gets_in(&certs, &tls(&certs, "")), [true; 3]);
}

#[test]
fn client_allowed_sans_admits_only_a_listed_san() {
    let certs = Certs::make("sans");
    let base = "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n";
    for (sans, client_in) in [
        ("[prometheus]", true),
        ("[scraper@example.com]", true),
        ("[other, '*.prometheus']", false),
    ] {
        let server = tls(&certs, &format!("{base}  client_allowed_sans: {sans}\n"));
        assert_eq!(
            who_gets_in(&certs, &server),
            [false, client_in, false],
            "{sans}"
        );
    }
    // Any certificate, but it must name an allowed SAN: the stranger's does.
    let any = "  client_auth_type: RequireAnyClientCert\n  client_allowed_sans: [prometheus]\n";
    assert_eq!(who_gets_in(&certs, &tls(&certs, any)), [false, true, true]);
}

#[test]
fn versions_suites_and_curves_narrow_the_handshake() {
    let certs = Certs::make("narrow");
    let only13 = tls(&certs, "  min_version: TLS13\n");
    let c = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap();
    let mut roots = RootCertStore::empty();
    let ca = std::fs::read(certs.path("ca.pem")).unwrap();
    roots
        .add(CertificateDer::from_pem_slice(&ca).unwrap())
        .unwrap();
    let tls12_client = Arc::new(c.with_root_certificates(roots).with_no_client_auth());
    assert!(handshake(&only13, tls12_client.clone()).is_err());
    let suites = "  max_version: TLS12\n  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]\n  curve_preferences: [CurveP384]\n";
    let narrowed = tls(&certs, suites);
    assert!(handshake(&narrowed, tls12_client).is_ok());
    assert!(handshake(&narrowed, certs.client(None)).is_ok());
}

/// The one line a file gives, or a panic if it loads.
fn refused(certs: &Certs, body: &str) -> String {
    let path = certs.config(body);
    let e = match load(&path) {
        Ok(_) => panic!("loaded: {body}"),
        Err(e) => format!("{e:#}"),
    };
    assert!(!e.contains('\n'), "more than one line: {e}");
    e
}

#[test]
fn bad_files_are_refused_in_one_line() {
    let certs = Certs::make("bad");
    let tls = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n";
    for (body, says) in [
        ("tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth: x\n", "unknown field `client_auth`"),
        ("basic_auth: {}\n", "unknown field `basic_auth`"),
        ("tls_server_config:\n  cert_file: server.pem\n", "missing one of key or key_file"),
        ("tls_server_config:\n  key_file: server.key\n", "missing one of cert or cert_file"),
        ("tls_server_config:\n  cert_file: nothere.pem\n  key_file: server.key\n", "cannot read cert_file"),
        ("tls_server_config:\n  cert_file: server.pem\n  key_file: server.csr\n", "no PEM private key"),
        ("tls_server_config:\n  cert_file: server.ext\n  key_file: server.key\n", "no PEM certificate"),
        ("tls_server_config:\n  cert_file: client.pem\n  key_file: server.key\n", "the certificate and key"),
        (&format!("{tls}  min_version: TLS10\n"), "TLS10 is not offered"),
        (&format!("{tls}  min_version: TLS99\n"), "unknown TLS version"),
        (&format!("{tls}  min_version: TLS13\n  max_version: TLS12\n"), "above max_version"),
        (&format!("{tls}  client_auth_type: Sometimes\n"), "client_auth_type \"Sometimes\" is none of"),
        (&format!("{tls}  client_ca_file: ca.pem\n"), "without a client_auth_type"),
        (&format!("{tls}  client_auth_type: RequireAndVerifyClientCert\n"), "needs client_ca_file"),
        (&format!("{tls}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: server.key\n"), "no PEM certificate in client_ca_file"),
        (&format!("{tls}  client_allowed_sans: [a]\n"), "client_allowed_sans needs"),
        (&format!("{tls}  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA]\n"), "no CBC"),
        (&format!("{tls}  cipher_suites: [TLS_AES_128_GCM_SHA256]\n"), "TLS 1.3 suite"),
        (&format!("{tls}  cipher_suites: [TLS_MADE_UP]\n"), "unknown cipher"),
        (&format!("{tls}  curve_preferences: [CurveP521]\n"), "CurveP521 is not offered"),
        ("basic_auth_users:\n  alice: secret\n", "alice's password is not a bcrypt hash"),
        ("http_server_config:\n  headers:\n    X-Powered-By: me\n", "X-Powered-By cannot be set"),
        ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n", "must be one of"),
        ("rate_limit:\n  interval: 1s\n  burst: 0\n", "a burst of 0"),
        ("rate_limit:\n  interval: soon\n  burst: 1\n", "rate_limit.interval"),
        ("tls_server_config: [\n", "web config"),
    ] {
        let e = refused(&certs, body);
        assert!(e.contains(says), "{body:?}: {e}");
        assert!(e.contains("web.yml"), "names the file: {e}");
    }
    let e = format!("{:#}", load(&certs.path("none.yml")).err().unwrap());
    assert!(
        e.contains("cannot read the web config") && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn a_file_without_tls_is_plain_http_with_its_users_headers_and_rate() {
    let certs = Certs::make("plain");
    assert!(load(&certs.config("")).unwrap().tls.is_none());
    let hash = bcrypt::hash("right", 4).unwrap();
    let web = load(&certs.config(&format!(
        "basic_auth_users:\n  alice: '{hash}'\nhttp_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\nrate_limit:\n  interval: 250ms\n  burst: 3\n"
    )))
    .unwrap();
    assert!(web.tls.is_none());
    assert_eq!(web.users.get("alice"), Some(&hash));
    assert_eq!(web.headers[0].0.as_str(), "x-frame-options");
    let every = Duration::from_millis(250);
    assert_eq!(web.rate, Some(Rate { every, burst: 3 }));
}

#[test]
fn a_renewed_certificate_is_taken_and_a_broken_change_keeps_the_last_good() {
    let certs = Certs::make("reload");
    let path = certs.config("tls_server_config:\n  cert_file: live.pem\n  key_file: live.key\n");
    // Each write a second later than the last, as renewals are: the
    // kernel's file times may not tell writes a millisecond apart.
    let stamp = std::cell::Cell::new(std::time::SystemTime::now());
    let write = |to: PathBuf, bytes: Vec<u8>| {
        std::fs::write(&to, bytes).unwrap();
        stamp.set(stamp.get() + Duration::from_secs(1));
        let f = std::fs::File::options().write(true).open(&to).unwrap();
        f.set_modified(stamp.get()).unwrap();
    };
    let copy = |from: &str| {
        for ext in ["pem", "key"] {
            let bytes = std::fs::read(certs.path(&format!("{from}.{ext}"))).unwrap();
            write(certs.path(&format!("live.{ext}")), bytes);
        }
    };
    copy("server");
    let web = WebConfig::open(path.clone()).unwrap();
    let first = web.current();
    assert!(
        Arc::ptr_eq(&first, &web.current()),
        "nothing changed, nothing loaded"
    );
    // The "renewal": another certificate and key under the same names.
    copy("client");
    let renewed = web.current();
    assert!(!Arc::ptr_eq(&first, &renewed));
    assert_eq!(web.counts.succeeded.load(Ordering::Relaxed), 1);
    // Broken: the key no longer matches; the renewed config stays.
    write(
        certs.path("live.key"),
        std::fs::read(certs.path("server.key")).unwrap(),
    );
    assert!(Arc::ptr_eq(&renewed, &web.current()));
    assert_eq!(web.counts.failed.load(Ordering::Relaxed), 1);
    assert!(!web.counts.last_ok.load(Ordering::Relaxed));
    // Mended, through the config file naming other files.
    let mended = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n";
    write(path.clone(), mended.into());
    assert!(!Arc::ptr_eq(&renewed, &web.current()));
    assert!(web.counts.last_ok.load(Ordering::Relaxed));
    assert!(WebConfig::open(certs.path("none.yml")).is_err());
}

#[test]
fn paths_are_relative_to_the_file() {
    let certs = Certs::make("relative");
    let (_, files) = parse(
        &certs.config("tls_server_config:\n  cert_file: server.pem\n  key_file: /abs/server.key\n"),
    )
    .unwrap();
    assert_eq!(files.cert, Some(certs.path("server.pem")));
    assert_eq!(files.key, Some(Path::new("/abs/server.key").to_path_buf()));
}
