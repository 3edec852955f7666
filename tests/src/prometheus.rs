//! A real Prometheus (Debian's `prometheus`), run for a test: its own
//! configuration, storage and port on loopback, scraping one target every
//! second (and evaluating rule files as often, when given); asked through
//! its HTTP API with curl. Secured, it scrapes over TLS with a client
//! certificate and basic auth, and serves its own API behind a web config
//! file.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

pub struct Prometheus {
    child: Child,
    dir: PathBuf,
    pub port: u16,
    secured: Option<Secured>,
}

/// TLS both ways: Prometheus scrapes with `scheme: https`, trusting `ca`,
/// presenting `cert` and `key` and the user and password given; a second
/// job, `no-client-cert`, scrapes the same target trusting `ca` alone. Its
/// own API is served as `web_config` (its `--web.config.file`) says, and
/// asked with the same certificate and user.
#[derive(Clone)]
pub struct Secured {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub basic_auth: (String, String),
    pub web_config: PathBuf,
}

impl Secured {
    fn scrape_config(&self, target: &str) -> String {
        let (ca, cert, key) = (self.ca.display(), self.cert.display(), self.key.display());
        let (user, password) = &self.basic_auth;
        format!(
            "    scheme: https\n    tls_config:\n      ca_file: {ca}\n      cert_file: {cert}\n      key_file: {key}\n    basic_auth:\n      username: {user}\n      password: {password}\n  - job_name: no-client-cert\n    scheme: https\n    tls_config:\n      ca_file: {ca}\n    static_configs:\n      - targets: ['{target}']\n"
        )
    }

    /// curl's flags for the same.
    pub fn curl_args(&self) -> Vec<String> {
        let (user, password) = &self.basic_auth;
        vec![
            "--cacert".into(),
            self.ca.display().to_string(),
            "--cert".into(),
            self.cert.display().to_string(),
            "--key".into(),
            self.key.display().to_string(),
            "-u".into(),
            format!("{user}:{password}"),
        ]
    }
}

/// A free port on loopback, as the kernel gives one.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a port on loopback");
    l.local_addr().expect("a bound address").port()
}

impl Prometheus {
    /// Starts Prometheus scraping `target` (`host:port`) every second and
    /// waits until it is ready.
    pub fn scraping(target: &str) -> Result<Self> {
        Self::start(target, &[], None)
    }

    /// `scraping`, evaluating the rules of `rule_files` every second too.
    pub fn evaluating(target: &str, rule_files: &[&Path]) -> Result<Self> {
        Self::start(target, rule_files, None)
    }

    /// `scraping`, secured as `secured` says.
    pub fn scraping_securely(target: &str, secured: Secured) -> Result<Self> {
        Self::start(target, &[], Some(secured))
    }

    fn start(target: &str, rule_files: &[&Path], secured: Option<Secured>) -> Result<Self> {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("dnstrace-prometheus-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("prometheus.yml");
        let rules: Vec<String> = rule_files
            .iter()
            .map(|f| format!("'{}'", f.display()))
            .collect();
        let rules = rules.join(", ");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files: [{rules}]\nscrape_configs:\n  - job_name: dnstrace\n    static_configs:\n      - targets: ['{target}']\n{}",
                secured.as_ref().map_or(String::new(), |s| s.scrape_config(target))
            ),
        )?;
        let mut command = Command::new("prometheus");
        if let Some(s) = &secured {
            command.arg(format!("--web.config.file={}", s.web_config.display()));
        }
        let child = command
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting prometheus (Debian's `prometheus` package)")?;
        let p = Self {
            child,
            dir,
            port,
            secured,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if p.get("/-/ready").is_ok_and(|body| body.contains("Ready")) {
                return Ok(p);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!("prometheus did not become ready on port {port}")
    }

    /// curl, with the certificate and user when secured, and the URL of
    /// `path` on Prometheus.
    fn curl(&self, path: &str) -> (Command, String) {
        let mut curl = Command::new("curl");
        // A request that hangs fails, rather than the test waiting on it.
        curl.args(["-sf", "--max-time", "10"]);
        let scheme = match &self.secured {
            Some(s) => {
                curl.args(s.curl_args());
                "https"
            }
            None => "http",
        };
        (curl, format!("{scheme}://127.0.0.1:{}{path}", self.port))
    }

    fn get(&self, path: &str) -> Result<String> {
        let (mut curl, url) = self.curl(path);
        let out = curl.arg(url).output()?;
        if !out.status.success() {
            bail!("GET {path}: curl {}", out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `/api/v1/{what}`'s data, e.g. `alerts` or `rules`.
    pub fn api(&self, what: &str) -> Result<Value> {
        let body = self.get(&format!("/api/v1/{what}"))?;
        let v: Value = serde_json::from_str(&body).with_context(|| format!("/api/v1/{what}"))?;
        Ok(v["data"].clone())
    }

    /// An instant query: its result vector, `[{metric, value: [t, "v"]}]`.
    pub fn query(&self, promql: &str) -> Result<Vec<Value>> {
        let (mut curl, url) = self.curl("/api/v1/query");
        let out = curl
            .args(["--get", "--data-urlencode"])
            .arg(format!("query={promql}"))
            .arg(url)
            .output()?;
        let v: Value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("query {promql}: {}", String::from_utf8_lossy(&out.stderr)))?;
        if v["status"] != "success" {
            bail!("query {promql}: {v}");
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// The health and last error of the targets of `job`.
    pub fn targets(&self, job: &str) -> Result<Vec<(String, String)>> {
        let v: Value = serde_json::from_str(&self.get("/api/v1/targets")?)?;
        let active = v["data"]["activeTargets"].as_array().cloned();
        Ok(active
            .unwrap_or_default()
            .iter()
            .filter(|t| t["labels"]["job"] == job)
            .map(|t| {
                let s = |k: &str| t[k].as_str().unwrap_or_default().to_owned();
                (s("health"), s("lastError"))
            })
            .collect())
    }

    /// The one number an instant query gives, if it gives one.
    pub fn scalar(&self, promql: &str) -> Option<f64> {
        let result = self.query(promql).ok()?;
        result.first()?["value"][1].as_str()?.parse().ok()
    }

    /// Polls `promql` until `done` holds for its value, or `wait` passes;
    /// returns the last value.
    pub fn wait_for(
        &self,
        promql: &str,
        wait: Duration,
        done: impl Fn(f64) -> bool,
    ) -> Option<f64> {
        let deadline = Instant::now() + wait;
        loop {
            let v = self.scalar(promql);
            if v.is_some_and(&done) || Instant::now() >= deadline {
                return v;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
