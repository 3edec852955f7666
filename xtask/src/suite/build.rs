//! What the tests run: the test binaries, and the dnstrace binaries they
//! start (`DNSTRACE_BIN`, `DNSTRACE_HARNESS_BIN`), built before any of them
//! starts, so that no test builds one while others run; and the release
//! binary (`DNSTRACE_RELEASE_BIN`), built beside the first of them.
//!
//! clippy lints the workspace in the same build: `cargo clippy` is `cargo
//! check` with clippy-driver wrapping rustc for the workspace's crates, and
//! the same wrapper over `cargo test --no-run` lints each crate as it
//! compiles it, so the dependencies are not checked apart from their build
//! (from an empty target directory, a clippy pass of 236 s and a test build
//! of 166 s became one build of 300 s; docs/PERFORMANCE.md).
use std::{
    fs::File,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

use crate::{cargo_cmd, target_dir};

/// A test binary: its name in the report, and whether its tests run one
/// a process (the integration tests) or all in one (unit tests).
#[derive(Debug, Clone, PartialEq)]
pub struct TestBinary {
    pub name: String,
    pub path: PathBuf,
    pub one_a_process: bool,
}

#[derive(Debug)]
pub struct Binaries {
    pub tests: Vec<TestBinary>,
    pub dnstrace: PathBuf,
    pub harness: PathBuf,
}

/// The features the tests' debug builds share: the harness's switches
/// (`dnstrace-harness`), the pipeline bench's and the fuzz targets' entry
/// points (linted, and their seeds run). One set of features for the test
/// build and the binaries, so that the library is built once for both.
const FEATURES: &str = "dnstrace/harness,dnstrace/bench,dnstrace/fuzzing";

/// The optimised dnstrace, as shipped, for the tests that measure what it
/// keeps up with. Built in a target directory of its own, beside the rest
/// (lints, the debug build): its largest crate is one codegen unit, which
/// leaves a core to them for minutes.
pub struct Release {
    child: Child,
    log: PathBuf,
    bin: PathBuf,
}

impl Release {
    pub fn start() -> Result<Self> {
        let dir = target_dir().join("tests-release");
        let log = target_dir().join("xtask/release-build.log");
        std::fs::create_dir_all(log.parent().context("the log's directory")?)?;
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = cargo_cmd()
            .args([
                "build",
                "--release",
                "--package",
                "dnstrace",
                "--bin",
                "dnstrace",
            ])
            .env("CARGO_TARGET_DIR", &dir)
            // The eBPF programs' one build, shared with the rest.
            .env("DNSTRACE_EBPF_TARGET_DIR", target_dir().join("ebpf"))
            .stdout(out.try_clone()?)
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .context("starting the release build")?;
        Ok(Self {
            child,
            log,
            bin: dir.join("release/dnstrace"),
        })
    }

    /// Waits for the build; the binary.
    pub fn wait(mut self) -> Result<PathBuf> {
        let status = self.child.wait()?;
        if !status.success() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            bail!("the release build failed ({status}):\n{log}");
        }
        Ok(std::mem::take(&mut self.bin))
    }
}

impl Drop for Release {
    /// Stops a build no one waits for (a lint failed first).
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The tests and the debug binaries.
pub fn all() -> Result<Binaries> {
    let tests = test_binaries()?;
    crate::check(linted().args(["build", "--quiet", "--features", FEATURES, "--bins"]))?;
    let target = target_dir();
    Ok(Binaries {
        tests,
        dnstrace: target.join("debug/dnstrace"),
        harness: target.join("debug/dnstrace-harness"),
    })
}

impl Binaries {
    /// The variables that hand the tests their debug dnstrace binaries.
    pub fn env(&self) -> [(&'static str, &Path); 2] {
        [
            ("DNSTRACE_BIN", &self.dnstrace),
            ("DNSTRACE_HARNESS_BIN", &self.harness),
        ]
    }
}

/// cargo, with clippy-driver wrapping rustc for the workspace's crates and
/// every warning an error, as `cargo clippy -- -D warnings` runs it
/// (`CLIPPY_ARGS` is how cargo-clippy hands clippy-driver its arguments).
fn linted() -> Command {
    let mut cmd = cargo_cmd();
    cmd.env("RUSTC_WORKSPACE_WRAPPER", clippy_driver()).env(
        "CLIPPY_ARGS",
        "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
    );
    cmd
}

/// The toolchain's clippy-driver, beside the cargo that runs xtask.
fn clippy_driver() -> PathBuf {
    std::env::var_os("CARGO")
        .map(|cargo| PathBuf::from(cargo).with_file_name("clippy-driver"))
        .filter(|driver| driver.exists())
        .unwrap_or_else(|| "clippy-driver".into())
}

/// `cargo test --no-run --all-targets`, linted: every test binary of the
/// workspace.
fn test_binaries() -> Result<Vec<TestBinary>> {
    let mut cmd = linted();
    cmd.args([
        "test",
        "--no-run",
        "--all-targets",
        "--features",
        FEATURES,
        "--message-format",
        "json-render-diagnostics",
    ])
    .stdout(Stdio::piped());
    let mut child = cmd.spawn().context("running cargo test --no-run")?;
    let out = child.stdout.take().context("cargo's stdout")?;
    let mut found = Vec::new();
    for line in BufReader::new(out).lines() {
        let line = line.context("reading cargo's messages")?;
        if let Some(bin) = serde_json::from_str(&line)
            .ok()
            .and_then(|v| test_binary(&v))
        {
            found.push(bin);
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("building the tests failed ({status})");
    }
    Ok(found)
}

/// The test binary one of cargo's messages announces, if it does.
fn test_binary(msg: &Value) -> Option<TestBinary> {
    if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
        return None;
    }
    let target = &msg["target"];
    let kind = target["kind"][0].as_str()?;
    // Built to be linted; the pipeline bench runs under `cargo xtask bench`.
    if kind == "bench" {
        return None;
    }
    let path = PathBuf::from(msg["executable"].as_str()?);
    let name = target["name"].as_str()?;
    let one_a_process = kind == "test";
    let name = if one_a_process {
        name.to_owned()
    } else {
        format!("{} ({kind} {name})", package(msg["package_id"].as_str()?))
    };
    Some(TestBinary {
        name,
        path,
        one_a_process,
    })
}

/// The package's name in a package id (`path+file:///…/dnstrace#0.1.0`, or
/// the older `dnstrace 0.1.0 (path+file:///…)`).
fn package(id: &str) -> &str {
    match id.split_once('#') {
        Some((path, _)) => path.rsplit('/').next().unwrap_or(path),
        None => id.split(' ').next().unwrap_or(id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integration_tests_run_one_a_process_and_unit_tests_whole() {
        let msg = |kind: &str, name: &str| {
            serde_json::json!({
                "reason": "compiler-artifact",
                "package_id": "path+file:///w/tests#dnstrace-tests@0.1.0",
                "target": {"kind": [kind], "name": name},
                "profile": {"test": true},
                "executable": format!("/w/target/debug/deps/{name}-1f")
            })
        };
        let agent = test_binary(&msg("test", "agent")).unwrap();
        assert_eq!(agent.name, "agent");
        assert!(agent.one_a_process);
        let lib = test_binary(&msg("lib", "dnstrace_tests")).unwrap();
        assert_eq!(lib.name, "tests (lib dnstrace_tests)");
        assert!(!lib.one_a_process);
        assert_eq!(test_binary(&msg("bench", "pipeline")), None);
        let mut built = msg("lib", "dnstrace");
        built["profile"]["test"] = false.into();
        assert_eq!(test_binary(&built), None);
        assert_eq!(
            package("dnstrace 0.1.0 (path+file:///w/dnstrace)"),
            "dnstrace"
        );
    }
}
