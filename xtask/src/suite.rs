//! `cargo xtask test`'s run of the test binaries: each integration test in
//! a process of its own, several at once, each with a lab of its own
//! (`DNSTRACE_LAB_INSTANCE`), every test run even when one fails; then one
//! line that adds them up, and where the time went.
//!
//! A test that watches the whole machine (a dnstrace with no `--node`,
//! the kernel's programs by name) says so first thing
//! (`dnstrace_tests::require_alone`): given no machine of its own, it
//! exits at once, and runs again once nothing else does.
mod build;
mod queue;
mod report;
mod schedule;

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

pub use build::{Binaries, Release};
use report::Times;
use schedule::Job;

/// What `cargo xtask test` takes after `test`.
#[derive(Debug, PartialEq)]
pub struct Options {
    /// Tests at once (`--jobs N`).
    pub jobs: usize,
    /// Only the tests whose id (`binary::test`) holds one of these; all
    /// when none.
    pub filters: Vec<String>,
    /// Variables every test is given besides (`cargo xtask soak`'s).
    pub env: Vec<(&'static str, String)>,
}

/// Two cores: most of a lab test's time is spent waiting (on resolvers,
/// timeouts, the traffic's rate), so three overlap without starving one
/// another (docs/PERFORMANCE.md, the suite's time).
pub const JOBS: usize = 3;

/// A test still running after this is stopped and failed.
const TIMEOUT: Duration = Duration::from_secs(600);

/// The first lab's lock, which `cargo xtask bench` holds too: a run of the
/// suite never shares the machine with the bench or with another run.
const MACHINE_LOCK: &str = "/run/dnstrace-lab.lock";

impl Options {
    pub fn parse(args: &[String]) -> Result<Self> {
        let mut o = Self {
            jobs: JOBS,
            filters: Vec::new(),
            env: Vec::new(),
        };
        let mut args = args.iter();
        while let Some(a) = args.next() {
            if a == "--jobs" {
                let n = args.next().context("--jobs needs a number")?;
                o.jobs = n
                    .parse()
                    .ok()
                    .filter(|n| (1..=16).contains(n))
                    .with_context(|| format!("--jobs {n}: a number from 1 to 16"))?;
            } else if a.starts_with('-') {
                bail!("unknown option {a}: cargo xtask test [--jobs N] [FILTER...]");
            } else {
                o.filters.push(a.clone());
            }
        }
        Ok(o)
    }

    fn wants(&self, id: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| id.contains(f))
    }
}

/// Builds what the tests run (the release binary in `release`), runs
/// them, prints the tally and where the time went; fails if any test
/// failed.
pub fn run(o: &Options, release: Release) -> Result<()> {
    let started = Instant::now();
    let bins = build::all()?;
    let _lock = crate::lock_exclusive(MACHINE_LOCK)?;
    let built = started.elapsed();
    let jobs: Vec<Job> = schedule::jobs(&bins.tests)?
        .into_iter()
        .filter(|j| o.wants(&j.id))
        .collect();
    let times_file = times_path();
    let mut times = Times::load(&times_file);
    let outcomes = schedule::run(jobs, o.jobs, TIMEOUT, &bins, release, &o.env, &times);
    times.update(&outcomes);
    if let Err(e) = times.save(&times_file) {
        eprintln!("xtask: could not keep the tests' times: {e:#}");
    }
    report::print(&outcomes);
    println!(
        "built in {}, ran in {} ({} at once, the release build beside the first)",
        minutes(built),
        minutes(started.elapsed() - built),
        o.jobs
    );
    if outcomes.iter().any(|o| !o.passed()) {
        bail!("{}", report::summary(&outcomes));
    }
    Ok(())
}

/// `m:ss`.
pub fn minutes(d: Duration) -> String {
    format!("{}:{:02}", d.as_secs() / 60, d.as_secs() % 60)
}

/// Where each test's last time is kept, to start the longest first.
fn times_path() -> PathBuf {
    crate::target_dir().join("xtask/test-times.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_take_jobs_and_filters() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = Options::parse(&args(&["--jobs", "2", "agent::", "golden"])).unwrap();
        assert_eq!(o.jobs, 2);
        assert!(o.wants("agent::counts") && o.wants("golden::x") && !o.wants("lab::y"));
        assert!(Options::parse(&args(&[])).unwrap().wants("lab::y"));
        assert!(Options::parse(&args(&["--jobs", "0"])).is_err());
        assert!(Options::parse(&args(&["--fast"])).is_err());
    }
}
