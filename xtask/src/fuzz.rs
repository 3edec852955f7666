//! `cargo xtask fuzz [--runs N] [--target T] [--max-time S] [--sanitizer S]`:
//! the cargo-fuzz targets of fuzz/, each for N runs (10 million by default)
//! from the seeds committed in fuzz/seeds/<target>, the corpus growing in
//! fuzz/corpus/<target> (not committed). Installs cargo-fuzz and a nightly
//! toolchain if missing.
//!
//! No sanitizer by default: the code fuzzed is safe Rust, whose bounds and
//! overflow checks (debug assertions are on) turn bugs into panics, and
//! AddressSanitizer made the targets about 7 times slower.
use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context as _, Result};

use crate::{check, workspace_root};

pub const TARGETS: &[&str] = &["dns", "tcp_stream", "fragments", "event", "recording"];
const DEFAULT_RUNS: u64 = 10_000_000;

struct Args {
    runs: u64,
    targets: Vec<&'static str>,
    /// libFuzzer's -max_total_time: stop early after this many seconds.
    max_time: Option<u64>,
    /// cargo fuzz's --sanitizer: none, address, memory, thread, leak.
    sanitizer: String,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut parsed = Args {
        runs: DEFAULT_RUNS,
        targets: TARGETS.to_vec(),
        max_time: None,
        sanitizer: "none".into(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .replace('_', "")
                .parse::<u64>()
                .with_context(|| format!("{flag} {value}: not a number"))
        };
        match flag.as_str() {
            "--runs" => parsed.runs = number()?,
            "--max-time" => parsed.max_time = Some(number()?),
            "--sanitizer" => parsed.sanitizer = value.clone(),
            "--target" => {
                let t = TARGETS.iter().find(|t| *t == value).with_context(|| {
                    format!("no fuzz target {value}; there are {}", TARGETS.join(", "))
                })?;
                parsed.targets = vec![t];
            }
            _ => bail!("unknown option {flag}; usage: cargo xtask fuzz [--runs N] [--target T] [--max-time SECONDS] [--sanitizer none|address]"),
        }
    }
    Ok(parsed)
}

/// What one target's run came to.
struct Outcome {
    target: &'static str,
    runs: u64,
    seconds: f64,
    /// None: no crash.
    failure: Option<String>,
}

pub fn run(args: &[String]) -> Result<()> {
    let args = parse(args)?;
    install()?;
    // Built once up front, so the times below are fuzzing only.
    check(fuzz_cmd().args([
        "build",
        "--fuzz-dir",
        "fuzz",
        "--sanitizer",
        &args.sanitizer,
    ]))?;
    let mut outcomes = Vec::new();
    for target in &args.targets {
        let outcome = fuzz(target, &args)?;
        let failed = outcome.failure.is_some();
        outcomes.push(outcome);
        if failed {
            break;
        }
    }
    print_table(&outcomes);
    match outcomes
        .iter()
        .find_map(|o| Some((o.target, o.failure.as_ref()?)))
    {
        Some((target, why)) => bail!("fuzz target {target} failed: {why}"),
        None => Ok(()),
    }
}

/// `cargo +nightly fuzz`, from the workspace root, without the outer
/// cargo's choices of toolchain.
fn fuzz_cmd() -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo", "fuzz"])
        .current_dir(workspace_root())
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTUP_TOOLCHAIN");
    cmd
}

fn install() -> Result<()> {
    let toolchains = Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .context("running rustup: cargo xtask fuzz needs a rustup nightly toolchain")?;
    let has_nightly = String::from_utf8_lossy(&toolchains.stdout)
        .lines()
        .any(|l| l.starts_with("nightly"));
    if !has_nightly {
        eprintln!("xtask: installing the nightly toolchain (cargo-fuzz needs it)");
        check(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
    }
    let has_cargo_fuzz = fuzz_cmd()
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_cargo_fuzz {
        eprintln!("xtask: installing cargo-fuzz");
        check(crate::cargo_cmd().args(["install", "--locked", "cargo-fuzz"]))?;
    }
    Ok(())
}

/// Runs one target, passing libFuzzer's output through and reading the
/// runs done and any crash artifact from it.
fn fuzz(target: &'static str, args: &Args) -> Result<Outcome> {
    let root = workspace_root();
    let corpus = root.join("fuzz/corpus").join(target);
    std::fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let seeds = root.join("fuzz/seeds").join(target);
    let mut cmd = fuzz_cmd();
    cmd.args([
        "run",
        "--fuzz-dir",
        "fuzz",
        "--sanitizer",
        &args.sanitizer,
        target,
    ])
    .arg(&corpus)
    .arg(&seeds)
    .arg("--")
    .arg(format!("-runs={}", args.runs));
    if let Some(s) = args.max_time {
        cmd.arg(format!("-max_total_time={s}"));
    }
    eprintln!("xtask: fuzzing {target} for {} runs", args.runs);
    let start = Instant::now();
    let mut child = cmd
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd:?}"))?;
    let mut runs = 0;
    let mut artifact = None;
    for line in BufReader::new(child.stderr.take().context("no stderr")?).lines() {
        let line = line.context("reading the fuzzer's output")?;
        eprintln!("{line}");
        // `#123456 pulse ...` and the last line, `Done 123456 runs in 7 second(s)`.
        let count = line
            .strip_prefix('#')
            .or_else(|| line.strip_prefix("Done "))
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok());
        runs = count.unwrap_or(runs);
        // Relative to the workspace root, where cargo fuzz runs.
        if let Some((_, path)) = line.split_once("Test unit written to ") {
            artifact = Some(root.join(path.trim()).display().to_string());
        }
    }
    let status = child.wait().context("waiting for cargo fuzz")?;
    let failure = (!status.success()).then(|| match &artifact {
        Some(path) => format!(
            "{status}; the input is {path} (rerun it with `cargo +nightly fuzz run --fuzz-dir fuzz --sanitizer {} {target} {path}`)",
            args.sanitizer
        ),
        None => format!("{status}, without an artifact"),
    });
    Ok(Outcome {
        target,
        runs,
        seconds: start.elapsed().as_secs_f64(),
        failure,
    })
}

fn print_table(outcomes: &[Outcome]) {
    println!(
        "{:<12} {:>12} {:>9} {:>9}  result",
        "target", "runs", "seconds", "exec/s"
    );
    for o in outcomes {
        let result = match &o.failure {
            None => "ok",
            Some(_) => "CRASH",
        };
        println!(
            "{:<12} {:>12} {:>9.0} {:>9.0}  {result}",
            o.target,
            o.runs,
            o.seconds,
            o.runs as f64 / o.seconds.max(1e-9)
        );
    }
}
