//! Runs the jobs, `n` at once, the longest first: each in a process group
//! of its own with a lab instance of its own (its worker's number), its
//! output kept and shown if it fails. The release build goes on beside
//! the first of them: a test that needs it before it is built runs again
//! once it is. A test that asks for the machine alone runs again at the
//! end, by itself.
use std::{
    io::{Read as _, Write as _},
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{
    build::{self, TestBinary},
    queue::{Queue, Release},
    report::Times,
    Binaries,
};

/// The exit code of a test that needs the machine alone and was not given
/// it (`dnstrace_tests::require_alone`), and what it says.
const ALONE_EXIT: i32 = 75;
const ALONE_SAYS: &str = "needs the machine alone";
/// The same for one that needs the release build before it is built
/// (`dnstrace_tests::dnstrace_release_bin`).
const RELEASE_EXIT: i32 = 76;
const RELEASE_SAYS: &str = "needs the release build";

/// One process to run: a binary's one test, or all its tests.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// `binary::test`, or the binary's name.
    pub id: String,
    pub binary: String,
    path: PathBuf,
    test: Option<String>,
    /// It starts dnstrace's release build (known from the last run, or
    /// from asking for it in this one).
    pub needs_release: bool,
}

impl Job {
    #[cfg(test)]
    pub fn test(id: &str, needs_release: bool) -> Self {
        Self {
            id: id.into(),
            binary: "b".into(),
            path: PathBuf::new(),
            test: Some(id.into()),
            needs_release,
        }
    }
}

/// How a job ended.
#[derive(Debug)]
pub struct Outcome {
    pub id: String,
    pub binary: String,
    pub secs: f64,
    pub counts: Counts,
    pub end: End,
    /// It ran with the machine to itself.
    pub alone: bool,
    /// It needed the release build.
    pub needs_release: bool,
    /// The tests it left out (`#[ignore]`), with libtest's reason.
    pub ignored: Vec<String>,
}

#[derive(Debug, PartialEq)]
pub enum End {
    Passed,
    /// Failed, or ran no test: its output.
    Failed(String),
    TimedOut(String),
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.end == End::Passed
    }
}

/// The tests a binary's result line counts.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
}

impl Counts {
    /// From libtest's `test result: ok. 3 passed; 1 failed; 0 ignored; …`.
    pub fn from_output(out: &str) -> Option<Self> {
        let result = out
            .lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix("test result: "))?;
        Some(Self {
            passed: count(result, " passed"),
            failed: count(result, " failed"),
            ignored: count(result, " ignored"),
        })
    }
}

/// The tests libtest says it ignored (`test a::b ... ignored, why`), each
/// as `a::b (why)`.
fn ignored(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("test ")?.split_once(" ... ")?;
            let why = rest.strip_prefix("ignored")?.trim_start_matches(", ");
            Some(match why {
                "" => name.to_owned(),
                why => format!("{name} ({why})"),
            })
        })
        .collect()
}

/// The number before `what` in a result line.
fn count(result: &str, what: &str) -> u64 {
    result
        .split(';')
        .find_map(|part| part.trim().split_once(what))
        .and_then(|(n, _)| n.split_whitespace().last()?.parse().ok())
        .unwrap_or(0)
}

/// Every job: each test of a binary run one a process, and each other
/// binary whole.
pub fn jobs(bins: &[TestBinary]) -> Result<Vec<Job>> {
    let mut jobs = Vec::new();
    for bin in bins {
        if !bin.one_a_process {
            jobs.push(Job {
                id: bin.name.clone(),
                binary: bin.name.clone(),
                path: bin.path.clone(),
                test: None,
                needs_release: false,
            });
            continue;
        }
        for test in list(&bin.path)? {
            jobs.push(Job {
                id: format!("{}::{test}", bin.name),
                binary: bin.name.clone(),
                path: bin.path.clone(),
                test: Some(test),
                needs_release: false,
            });
        }
    }
    Ok(jobs)
}

/// A binary's tests (`--list`: `name: test` lines).
fn list(path: &PathBuf) -> Result<Vec<String>> {
    let out = Command::new(path)
        .args(["--list", "--format", "terse"])
        .output()
        .with_context(|| format!("listing the tests of {}", path.display()))?;
    if !out.status.success() {
        bail!("{} --list failed ({})", path.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect())
}

/// What every worker shares.
struct Shared<'a> {
    queue: Queue,
    outcomes: Mutex<Vec<Outcome>>,
    bins: &'a Binaries,
    env: &'a [(&'static str, String)],
    timeout: Duration,
    total: usize,
}

/// Runs `jobs`, `n` at once, the longest (by `times`) first, each given
/// `env` besides, while `release` builds; then those that asked for the
/// machine alone, one by one.
pub fn run(
    mut jobs: Vec<Job>,
    n: usize,
    timeout: Duration,
    bins: &Binaries,
    release: build::Release,
    env: &[(&'static str, String)],
    times: &Times,
) -> Vec<Outcome> {
    for job in &mut jobs {
        job.needs_release = times.needs_release(&job.id);
    }
    jobs.sort_by(|a, b| times.estimate(&b.id).total_cmp(&times.estimate(&a.id)));
    let shared = Shared {
        total: jobs.len(),
        queue: Queue::new(jobs),
        outcomes: Mutex::new(Vec::new()),
        bins,
        env,
        timeout,
    };
    std::thread::scope(|s| {
        let shared = &shared;
        s.spawn(move || {
            let built = match release.wait() {
                Ok(bin) => Release::Built(bin),
                Err(e) => Release::Failed(format!("{e:#}")),
            };
            shared.queue.release_done(built);
        });
        for slot in 1..=n {
            s.spawn(move || worker(shared, slot, false));
        }
    });
    shared.queue.alone_next();
    worker(&shared, 1, true);
    shared.outcomes.into_inner().unwrap()
}

fn worker(shared: &Shared, slot: usize, alone: bool) {
    while let Some((job, release)) = shared.queue.next() {
        let started = Instant::now();
        let (end, output) = match &release {
            Release::Failed(log) if job.needs_release => (Run::Exited(None), log.clone()),
            _ => run_one(&job, slot, alone, &release, shared),
        };
        let secs = started.elapsed().as_secs_f64();
        match end {
            Run::AskedAlone if !alone => shared.queue.wants_alone(job),
            Run::AskedRelease => shared.queue.wants_release(job),
            end => {
                let outcome = outcome(job, end, &output, secs, alone);
                if !outcome.passed() {
                    clean_up(shared.bins, slot);
                }
                let mut outcomes = shared.outcomes.lock().unwrap();
                show(&outcome, outcomes.len() + 1, shared.total);
                outcomes.push(outcome);
                continue;
            }
        }
        // It left its lab when it exited.
        clean_up(shared.bins, slot);
    }
}

/// How a process ended.
#[derive(Debug, PartialEq)]
enum Run {
    Exited(Option<i32>),
    AskedAlone,
    AskedRelease,
    TimedOut,
}

fn outcome(job: Job, run: Run, output: &str, secs: f64, alone: bool) -> Outcome {
    let counts = Counts::from_output(output).unwrap_or_default();
    let end = match run {
        Run::TimedOut => End::TimedOut(output.to_owned()),
        Run::Exited(Some(0)) if counts.passed > 0 || job.test.is_none() => End::Passed,
        _ => End::Failed(output.to_owned()),
    };
    let counts = match (&end, job.test.is_some()) {
        // A test that timed out or died before its result counts as failed.
        (End::Failed(_) | End::TimedOut(_), true) if counts.failed == 0 => Counts {
            failed: 1,
            ..counts
        },
        _ => counts,
    };
    Outcome {
        id: job.id,
        binary: job.binary,
        secs,
        counts,
        end,
        alone,
        needs_release: job.needs_release,
        ignored: ignored(output),
    }
}

/// Runs `job` in a process group of its own on lab instance `slot`, with
/// the release build as it stands: how it ended, and what it wrote
/// (stdout and stderr, in order).
fn run_one(
    job: &Job,
    slot: usize,
    alone: bool,
    release: &Release,
    shared: &Shared,
) -> (Run, String) {
    let mut cmd = Command::new(&job.path);
    // A whole binary says each test's name, so that the tally can name
    // those it ignored.
    if let Some(test) = &job.test {
        cmd.args(["--exact", test, "--test-threads", "1"]);
    }
    match release {
        Release::Built(bin) => cmd.env("DNSTRACE_RELEASE_BIN", bin),
        _ => cmd.env("DNSTRACE_RELEASE_PENDING", "1"),
    };
    cmd.envs(shared.bins.env())
        .envs(shared.env.iter().map(|(k, v)| (k, v)))
        .env("DNSTRACE_TEST_RUNNER", "1")
        .env("DNSTRACE_LAB_INSTANCE", slot.to_string())
        .process_group(0)
        .stdin(Stdio::null());
    if alone {
        cmd.env("DNSTRACE_TEST_ALONE", "1");
    }
    let (mut reader, writer) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => return (Run::Exited(None), format!("no pipe: {e}")),
    };
    let spawned = writer
        .try_clone()
        .map(|w| cmd.stdout(w).stderr(writer))
        .and_then(|cmd| cmd.spawn());
    // The pipe's write ends now live only in the child.
    drop(cmd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return (Run::Exited(None), format!("starting {job:?}: {e}")),
    };
    let output = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = reader.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    });
    let deadline = Instant::now() + shared.timeout;
    let run = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Run::Exited(status.code()),
            Ok(None) if Instant::now() > deadline => {
                kill_group(child.id());
                let _ = child.wait();
                break Run::TimedOut;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(_) => break Run::Exited(None),
        }
    };
    // Whatever the test left running in its group goes with it.
    kill_group(child.id());
    let output = output.join().unwrap_or_default();
    match run {
        Run::Exited(Some(ALONE_EXIT)) if output.contains(ALONE_SAYS) => (Run::AskedAlone, output),
        Run::Exited(Some(RELEASE_EXIT)) if output.contains(RELEASE_SAYS) => {
            (Run::AskedRelease, output)
        }
        run => (run, output),
    }
}

fn kill_group(pid: u32) {
    // SAFETY: kill(2) on the process group this runner made.
    unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
}

/// After a test that failed or left early: its lab, if it left one, goes.
fn clean_up(bins: &Binaries, slot: usize) {
    let _ = Command::new(&bins.dnstrace)
        .args(["lab", "down"])
        .env("DNSTRACE_LAB_INSTANCE", slot.to_string())
        .output();
}

/// One line as each job ends; a failure's output in full.
fn show(o: &Outcome, n: usize, total: usize) {
    let mut out = std::io::stdout().lock();
    let word = match &o.end {
        End::Passed => "PASS",
        End::Failed(_) => "FAIL",
        End::TimedOut(_) => "TIMEOUT",
    };
    let alone = if o.alone { " (alone)" } else { "" };
    let _ = writeln!(
        out,
        "{word:>7} [{n:>3}/{total}] {:>6.1} s  {}{alone}",
        o.secs, o.id
    );
    if let End::Failed(output) | End::TimedOut(output) = &o.end {
        let _ = writeln!(out, "---- {} ----\n{output}---- end of {} ----", o.id, o.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(test: Option<&str>) -> Job {
        Job {
            id: "record::a".into(),
            binary: "record".into(),
            path: PathBuf::new(),
            test: test.map(str::to_owned),
            needs_release: false,
        }
    }

    const ONE_OK: &str = "running 1 test\ntest a ... ok\n\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 5 filtered out; finished in 4.1s\n";

    #[test]
    fn a_test_passes_only_when_it_ran_and_exited_well() {
        let ok = outcome(job(Some("a")), Run::Exited(Some(0)), ONE_OK, 4.1, false);
        assert!(ok.passed());
        assert_eq!(ok.counts.passed, 1);
        let none = "running 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 6 filtered out; finished in 0.0s\n";
        let ran_nothing = outcome(job(Some("a")), Run::Exited(Some(0)), none, 0.1, false);
        assert!(!ran_nothing.passed());
        assert_eq!(ran_nothing.counts.failed, 1);
        let panicked = outcome(job(Some("a")), Run::Exited(Some(101)), "test a ... FAILED\n\ntest result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 5 filtered out; finished in 2.0s\n", 2.0, false);
        assert_eq!(
            panicked.counts,
            Counts {
                passed: 0,
                failed: 1,
                ignored: 0
            }
        );
        let killed = outcome(
            job(Some("a")),
            Run::TimedOut,
            "running 1 test\n",
            600.0,
            false,
        );
        assert!(matches!(killed.end, End::TimedOut(_)));
        assert_eq!(killed.counts.failed, 1);
    }

    #[test]
    fn a_whole_binary_counts_its_tests() {
        let out = "test fuzz::w ... ignored, rewrites seeds\ntest a ... ok\n\ntest result: ok. 218 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 3.1s\n";
        let whole = outcome(job(None), Run::Exited(Some(0)), out, 3.1, false);
        assert!(whole.passed());
        assert_eq!(whole.ignored, ["fuzz::w (rewrites seeds)"]);
        assert_eq!(
            whole.counts,
            Counts {
                passed: 218,
                failed: 0,
                ignored: 1
            }
        );
    }
}
