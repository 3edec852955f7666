//! `cargo xtask bench`: issue 9's figures, each a ratio of runs made here
//! and now on the built-in lab, with dnstrace and without, printed as a
//! table (and as Markdown with `--markdown PATH`).
//!
//! The whole run holds an exclusive flock on /run/dnstrace-lab.lock, as the
//! test suite does around the lab, so it never shares the lab (whose
//! namespace names are machine-wide) or the machine's cores with a test.
//! All traffic stays inside the lab's network namespaces.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs::File,
    io::{BufRead as _, BufReader, Read as _},
    net::UdpSocket,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicI32, Ordering},
        mpsc, Arc, Mutex,
    },
    thread::{self, sleep, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::{cargo_cmd, setup, workspace_root};

mod against;
mod agent;
mod bpf;
mod cluster;
mod cost;
mod dns;
mod kernel_cost;
mod lab;
mod load;
mod memory;
mod merge;
mod pipeline;
mod process;
mod table;
mod tracer;

use against::*;
use bpf::*;
use lab::*;
use load::*;
use process::*;
use tracer::*;

const LOCK: &str = "/run/dnstrace-lab.lock";
/// What the bench runs beyond setup's list.
const PACKAGES: &[&str] = &["iperf3", "dnsperf"];

/// The lab's names and addresses (dnstrace/src/lab/plan.rs).
const NODE: &str = "dtlab-node";
const WEB: &str = "dtlab-web-7d9f8c6b5-x2x4k";
const CHECKOUT: &str = "dtlab-checkout-5f6d7c9b8-q7w2e";
const CHECKOUT_IP: &str = "10.244.0.11";
const SERVICE: &str = "10.96.0.10";
const CONTAINERD: &str = "/run/dnstrace-lab/containerd";

/// The goals.
const ZERO_LOSS_QPS: u32 = 20_000;
const IN_FLIGHT: u32 = 100_000;
const PIPELINE_GOAL: f64 = 1_000_000.0;
const RSS_GOAL_MIB: f64 = 64.0;

/// Lookups a second from each client pod while the merge figure records.
const MERGE_RATE: u32 = 300;

/// dnsperf's sockets (many, so kube-proxy's random DNAT spreads them over
/// both CoreDNS pods) and its queries outstanding at once.
const DNSPERF_CLIENTS: &str = "32";
const DNSPERF_OUTSTANDING: &str = "500";

/// dnstrace under DNS load: the largest usual ring buffer, and room for
/// every journey (the "tracing everything").
const DNS_LOAD: &[&str] = &["--ring-buffer-mib", "64", "--max-open", "262144"];

const USAGE: &str =
    "usage: cargo xtask bench [--quick] [--only FIGURE]... [--against REV] [--markdown PATH]
  --quick          short runs (seconds instead of minutes) for trying things
  --only FIGURE    measure only this figure (repeatable): startup, iperf,
                   capacity, against, zero-loss, tcpdump, cost, outputs,
                   overload, defaults, pipeline, memory, agent, merge, cluster
  --against REV    also measure the figure `against`: tracing's cost under UDP
                   DNS load, the dnstrace of git revision REV and this tree's
                   in alternating rounds (`--only against` for it alone)
  --markdown PATH  also write the table as Markdown (for the README)";

type Stage = fn(&mut Bench) -> Result<()>;

/// The figures in the order they run: `--only`'s name, the heading, the
/// stage.
const FIGURES: &[(&str, &str, Stage)] = &[
    (
        "startup",
        "start-up: launch to all hooks attached",
        Bench::startup,
    ),
    (
        "iperf",
        "TCP throughput through the node (iperf3)",
        Bench::iperf,
    ),
    (
        "capacity",
        "DNS capacity (dnsperf against kube-dns)",
        Bench::capacity,
    ),
    (
        "against",
        "UDP cost against another revision (--against)",
        Bench::against,
    ),
    (
        "zero-loss",
        "zero loss at a sustained rate",
        Bench::zero_loss,
    ),
    (
        "tcpdump",
        "tcpdump -i any -w at the same rate",
        Bench::tcpdump,
    ),
    (
        "cost",
        "trace --sample 1 against tcpdump -w, and at twice the rate",
        Bench::cost,
    ),
    (
        "outputs",
        "dnstrace's CPU by output: JSON, text, the live view",
        Bench::outputs,
    ),
    (
        "overload",
        "overload: sampling whole lookups against losing events",
        Bench::overload,
    ),
    (
        "defaults",
        "dnstrace's defaults below overload: sampling only when it would lose",
        Bench::defaults,
    ),
    (
        "pipeline",
        "user-space pipeline (replay on one core)",
        Bench::pipeline,
    ),
    ("memory", "memory with lookups in flight", Bench::memory),
    (
        "agent",
        "dnstrace agent: capacity, exact counts, CPU, memory, scrapes",
        Bench::agent,
    ),
    // Last: they rebuild the lab as a cluster.
    (
        "merge",
        "several nodes' recordings replayed as one, against each alone",
        Bench::merge,
    ),
    (
        "cluster",
        "the cluster view: the agents' cost of streaming, keeping up, lag, clocks",
        Bench::cluster,
    ),
];

/// The figures `--only` names, in run order, with what they need: the
/// zero-loss ladder and the overload runs start from the lab's measured
/// capacity. `against` runs when, and only when, `--against` names a
/// revision, whatever else `--only` picks.
fn selected(only: &[String], against: bool) -> Result<Vec<&'static str>> {
    let names: Vec<&str> = FIGURES.iter().map(|f| f.0).collect();
    if let Some(bad) = only.iter().find(|o| !names.contains(&o.as_str())) {
        bail!(
            "no figure {bad:?}: --only takes one of {}",
            names.join(", ")
        );
    }
    if !against && only.iter().any(|o| o == "against") {
        bail!("--only against needs --against REV\n{USAGE}");
    }
    let wanted = |n: &str| {
        if n == "against" {
            return against;
        }
        only.is_empty()
            || only.iter().any(|o| o == n)
            || (n == "capacity"
                && only
                    .iter()
                    .any(|o| o == "zero-loss" || o == "overload" || o == "agent"))
    };
    Ok(names.into_iter().filter(|n| wanted(n)).collect())
}

/// How long each figure is measured.
struct Plan {
    iperf_secs: u32,
    iperf_rounds: usize,
    perf_secs: u32,
    /// The lab's rate swings by a fifth from one round to the next on a
    /// shared machine: enough rounds for a median that holds.
    perf_rounds: usize,
    zero_secs: u32,
    /// Each side of the tcpdump comparison, at each rate; each run of
    /// the outputs figure.
    side_secs: u32,
    /// Rounds of the outputs figure, each output once a round.
    output_rounds: usize,
    /// Each run of the defaults figure, and its rounds at each rate.
    defaults_secs: u32,
    defaults_rounds: usize,
    /// Each run of the against figure, and its rounds (each side once a
    /// round): a side's runs spread by 6–8%, hence so many.
    against_secs: u32,
    against_rounds: usize,
    record_secs: u32,
    replays: usize,
    /// dnstrace's --timeout while lookups pile up; the sender's rate is
    /// IN_FLIGHT over it.
    inflight_timeout_secs: u32,
    soak_secs: u32,
    sample_secs: u32,
    startups: usize,
    /// The merge figure's recording: `lab traffic --rate` (per client
    /// pod) for so long, then its rounds of replays.
    merge_rate: u32,
    merge_secs: u32,
    merge_rounds: usize,
    /// The agent's capacity figure: each window, and how many with the
    /// agent; then whole runs of `agent_secs` that check its counts.
    agent_secs: u32,
    agent_rounds: usize,
    agent_counts: usize,
    /// The cluster view's figures: each run, and the CPU figure's rounds
    /// (each side once a round).
    cluster_secs: u32,
    cluster_rounds: usize,
    /// The cost figure: each run, and its rounds (each tool once a round).
    cost_secs: u32,
    cost_rounds: usize,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                iperf_secs: 4,
                iperf_rounds: 2,
                perf_secs: 8,
                perf_rounds: 2,
                zero_secs: 10,
                side_secs: 10,
                output_rounds: 1,
                defaults_secs: 10,
                defaults_rounds: 2,
                against_secs: 8,
                against_rounds: 8,
                record_secs: 5,
                replays: 2,
                inflight_timeout_secs: 30,
                soak_secs: 60,
                sample_secs: 10,
                startups: 5,
                merge_rate: MERGE_RATE,
                merge_secs: 10,
                merge_rounds: 5,
                agent_secs: 6,
                agent_rounds: 4,
                agent_counts: 4,
                cluster_secs: 8,
                cluster_rounds: 3,
                cost_secs: 8,
                cost_rounds: 2,
            }
        } else {
            Self {
                iperf_secs: 10,
                iperf_rounds: 7,
                perf_secs: 15,
                perf_rounds: 7,
                zero_secs: 60,
                side_secs: 30,
                output_rounds: 2,
                defaults_secs: 15,
                defaults_rounds: 10,
                against_secs: 15,
                against_rounds: 15,
                record_secs: 15,
                replays: 3,
                inflight_timeout_secs: 30,
                soak_secs: 600,
                sample_secs: 30,
                startups: 5,
                merge_rate: MERGE_RATE,
                merge_secs: 20,
                merge_rounds: 9,
                agent_secs: 10,
                agent_rounds: 10,
                agent_counts: 6,
                cluster_secs: 15,
                cluster_rounds: 7,
                cost_secs: 15,
                cost_rounds: 7,
            }
        }
    }
}

/// The command line.
#[derive(Debug, Default, PartialEq)]
struct Options {
    quick: bool,
    markdown: Option<PathBuf>,
    only: Vec<String>,
    /// The git revision whose dnstrace the `against` figure measures.
    against: Option<String>,
}

impl Options {
    fn parse(args: &[String]) -> Result<Self> {
        let mut o = Self::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |what: &str| {
                it.next()
                    .cloned()
                    .ok_or_else(|| anyhow!("{a} needs {what}\n{USAGE}"))
            };
            match a.as_str() {
                "--quick" => o.quick = true,
                "--only" => o.only.push(value("a figure")?),
                "--against" => o.against = Some(value("a git revision")?),
                "--markdown" => o.markdown = Some(value("a path")?.into()),
                _ => bail!("unknown argument {a:?}\n{USAGE}"),
            }
        }
        Ok(o)
    }
}

pub fn run(args: &[String]) -> Result<()> {
    let Options {
        quick,
        markdown,
        only,
        against,
    } = Options::parse(args)?;
    let figures = selected(&only, against.is_some())?;
    if !setup::is_root() {
        bail!("the bench loads eBPF programs and builds the lab: run `sudo cargo xtask bench`");
    }
    setup::ensure_packages(PACKAGES)?;
    // REV first: a revision that does not exist fails at once.
    let against = against.as_deref().map(Against::build).transpose()?;
    let bin = build_dnstrace(&mut cargo_cmd())?;
    let harness = build_harness()?;
    let stages = pipeline_bench(&mut cargo_cmd())?;
    let _lock = LabLock::acquire()?;
    catch_signals();
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("dnstrace-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _dir = RemoveDir(dir.clone());
    let mut bench = Bench {
        bin,
        harness,
        stages,
        dir,
        plan: Plan::new(quick),
        quick,
        only,
        against,
        rows: Vec::new(),
        notes: Vec::new(),
        capacity: None,
        rate: None,
    };
    // The merge and cluster figures build their own lab, a cluster.
    let lab = if figures.iter().any(|f| *f != "merge" && *f != "cluster") {
        step("building the lab (dnstrace lab up)");
        Some(Lab::up(&bench.bin, &[])?)
    } else {
        None
    };
    let result = bench.all(&figures);
    drop(lab);
    result?;
    let elapsed = started.elapsed();
    let machine = machine();
    let table = bench.text_table();
    println!("\n{machine}\n");
    println!("{table}");
    for n in &bench.notes {
        println!("- {n}");
    }
    println!(
        "\nbench: {} mode, {:.1} minutes",
        if quick { "quick" } else { "full" },
        elapsed.as_secs_f64() / 60.0
    );
    if let Some(path) = markdown {
        std::fs::write(&path, bench.markdown(&machine, elapsed))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench: wrote {}", path.display());
    }
    Ok(())
}

/// Builds dnstrace's release binary with `cargo` (`cargo_cmd`, in the
/// workspace to build) and returns where cargo put it, wherever
/// CARGO_TARGET_DIR points.
fn build_dnstrace(cargo: &mut Command) -> Result<PathBuf> {
    cargo.args(["build", "--release", "--quiet", "--package", "dnstrace"]);
    executable(cargo, "dnstrace")
}

/// Builds `dnstrace-harness` (dnstrace with the layers' switches, which the
/// user's command line has not) in release and returns where it is.
fn build_harness() -> Result<PathBuf> {
    let mut cmd = cargo_cmd();
    cmd.args(["build", "--release", "--quiet", "--package", "dnstrace"])
        .args(["--features", "harness", "--bin", "dnstrace-harness"]);
    executable(&mut cmd, "dnstrace-harness").context("building dnstrace-harness")
}

/// Builds the pipeline bench with `cmd` (`cargo_cmd`, in the workspace to
/// build) and returns where its executable is.
fn pipeline_bench(cmd: &mut Command) -> Result<PathBuf> {
    cmd.args([
        "bench",
        "--no-run",
        "--quiet",
        "--package",
        "dnstrace",
        "--features",
        "bench",
        "--bench",
        "pipeline",
    ]);
    executable(cmd, "pipeline").context("building the pipeline bench")
}

/// Runs the cargo build `cmd` and returns the executable it made of the
/// target `name`.
fn executable(cmd: &mut Command, name: &str) -> Result<PathBuf> {
    let out = cmd
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({})", out.status);
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| anyhow!("cargo named no executable for {name}"))
}

/// One line of the table.
struct Row {
    figure: String,
    baseline: String,
    with: String,
    ratio: String,
    goal: String,
    /// None: nothing to meet (a figure shown side by side).
    met: Option<Met>,
}

/// Whether a figure met its goal.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Met {
    Yes,
    No,
    /// A ratio whose 95% interval holds the goal: its rounds spread too
    /// wide for this run to tell either way.
    WithinNoise,
}

impl From<bool> for Met {
    fn from(met: bool) -> Self {
        if met {
            Self::Yes
        } else {
            Self::No
        }
    }
}

struct Bench {
    bin: PathBuf,
    /// `dnstrace-harness`, built: for the figures that set a layer's switch.
    harness: PathBuf,
    /// `dnstrace/benches/pipeline.rs`, built.
    stages: PathBuf,
    dir: PathBuf,
    plan: Plan,
    quick: bool,
    /// The figures `--only` named, as given.
    only: Vec<String>,
    against: Option<Against>,
    rows: Vec<Row>,
    notes: Vec<String>,
    /// The lab's highest qps without dnstrace (median of the baseline runs).
    capacity: Option<f64>,
    /// The rate of the zero-loss run, used again for tcpdump and the recording.
    rate: Option<Offered>,
}

impl Bench {
    fn all(&mut self, figures: &[&str]) -> Result<()> {
        self.query_file()?;
        for (_, name, stage) in FIGURES.iter().filter(|f| figures.contains(&f.0)) {
            self.phase(name, *stage)?;
        }
        Ok(())
    }

    /// A failed figure is a row saying why; the others are still measured.
    fn phase(&mut self, name: &str, f: Stage) -> Result<()> {
        step(name);
        if let Err(e) = f(self) {
            if stopping() {
                // The signal is the cause; what it cut short says no more.
                return interrupted().and(Err(e));
            }
            eprintln!("bench: {name}: {e:#}");
            self.rows.push(Row {
                figure: name.to_owned(),
                baseline: "—".into(),
                with: format!("not measured: {e:#}"),
                ratio: "—".into(),
                goal: "—".into(),
                met: Some(Met::No),
            });
        }
        Ok(())
    }

    /// Says once how the ratios' intervals are made (`goal_ratio`).
    fn explain_intervals(&mut self) {
        self.note("A ratio of rounds has a 95% interval: the percentile bootstrap of the ratio of medians, each side's rounds drawn again with replacement 10,000 times.");
        self.explain_met();
    }

    /// For a figure whose rounds pair a baseline with its runs.
    fn explain_paired(&mut self) {
        self.note("A paired ratio is the median of each round's ratio to its own baseline (run next to it, so that the machine's drift from round to round cancels), with the percentile bootstrap of that median for its 95% interval.");
        self.explain_met();
    }

    /// How an interval decides a goal, whichever way it was made.
    fn explain_met(&mut self) {
        self.note("A goal is met (yes) or not (**no**) only when the whole interval lies on one side of it; else the rounds spread too wide for the run to tell (**within noise**).");
    }

    fn note(&mut self, note: &str) {
        if !self.notes.iter().any(|n| n == note) {
            self.notes.push(note.into());
        }
    }

    fn tracer(&self, hooks: &Hooks, extra: &[&str]) -> Result<Tracer> {
        self.tracer_showing(hooks, Output::Json, extra)
    }

    /// The harness, tracing with the layers' `switches`.
    fn tracer_with(&self, hooks: &Hooks, switches: &[&str], extra: &[&str]) -> Result<Tracer> {
        self.tracer_of(&self.harness, switches, hooks, Output::Json, extra)
    }

    fn tracer_showing(&self, hooks: &Hooks, output: Output, extra: &[&str]) -> Result<Tracer> {
        self.tracer_of(&self.bin, &[], hooks, output, extra)
    }

    /// The dnstrace binary `bin` tracing: this tree's, its harness with the
    /// layers' `switches` (`dnstrace/src/harness.rs`), or (the against
    /// figure) another revision's.
    fn tracer_of(
        &self,
        bin: &Path,
        switches: &[&str],
        hooks: &Hooks,
        output: Output,
        extra: &[&str],
    ) -> Result<Tracer> {
        let mut cmd = match hooks {
            Hooks::Tracepoints => {
                let mut c = Command::new(bin);
                c.args(switches)
                    .args(["trace", "--node-netns", &format!("/run/netns/{NODE}")]);
                c
            }
            // tc attaches by name in dnstrace's own network namespace.
            Hooks::Tc(ifaces) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", NODE])
                    .arg(bin)
                    .args(switches)
                    .arg("trace");
                for i in ifaces {
                    c.args(["--iface", i]);
                }
                c
            }
        };
        cmd.args(output.flags())
            .args(["--containerd-root", CONTAINERD])
            .args(extra);
        // Every lookup, as the figures ask: by default dnstrace keeps fewer
        // (each whole) when it falls behind.
        if !extra.contains(&"--sample") {
            cmd.args(["--sample", "1"]);
        }
        let capture = match output {
            Output::View => Capture::Terminal(terminal(200, 50)?),
            Output::Json | Output::Text => Capture::Lines,
        };
        let start = Instant::now();
        let proc = Proc::spawn("dnstrace trace", &mut cmd, capture)?;
        let at = proc.wait_line("capturing DNS on port", Duration::from_secs(30))?;
        Ok(Tracer {
            proc,
            startup: at - start,
        })
    }
}

impl Row {
    fn cells(&self) -> [String; 6] {
        [
            self.figure.clone(),
            self.baseline.clone(),
            self.with.clone(),
            self.ratio.clone(),
            self.goal.clone(),
            match self.met {
                Some(Met::Yes) => "yes".into(),
                Some(Met::No) => "**no**".into(),
                Some(Met::WithinNoise) => "**within noise**".into(),
                None => "—".into(),
            },
        ]
    }
}

static STOP: AtomicBool = AtomicBool::new(false);
/// The signal that stopped the bench, and who sent it.
static SIGNAL: AtomicI32 = AtomicI32::new(0);
static SENDER: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    SIGNAL.store(sig, Ordering::SeqCst);
    if !info.is_null() {
        // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO.
        SENDER.store(unsafe { (*info).si_pid() }, Ordering::SeqCst);
    }
    STOP.store(true, Ordering::SeqCst);
}

/// Ctrl-C and SIGTERM end the bench between steps, through the guards.
fn catch_signals() {
    // SAFETY: a zeroed sigaction is valid; the handler only stores to atomics.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal
            as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as libc::sighandler_t;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
}

fn stopping() -> bool {
    STOP.load(Ordering::SeqCst)
}

fn interrupted() -> Result<()> {
    if stopping() {
        bail!(
            "interrupted by signal {} from pid {}",
            SIGNAL.load(Ordering::SeqCst),
            SENDER.load(Ordering::SeqCst)
        );
    }
    Ok(())
}

fn pause(d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        interrupted()?;
        sleep((end - Instant::now()).min(Duration::from_millis(50)));
    }
    Ok(())
}

/// (round, side) for `rounds` rounds over `sides` sides, alternated in an
/// order that turns each round, so that a drift of the machine hits every
/// side alike.
fn turns(rounds: usize, sides: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..rounds).flat_map(move |round| (0..sides).map(move |k| (round, (k + round) % sides)))
}

/// Lets dnsperf's stragglers and the resolvers' queues drain between runs.
fn settle() -> Result<()> {
    pause(Duration::from_secs(2))
}

struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn step(what: &str) {
    eprintln!("\n### {what}");
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let mut kernel = String::new();
    if let Ok(mut f) = File::open("/proc/sys/kernel/osrelease") {
        let _ = f.read_to_string(&mut kernel);
    }
    format!(
        "Machine: {} cores ({cpu}), {mem_gib:.0} GiB, Linux {}",
        thread::available_parallelism().map_or(0, |n| n.get()),
        kernel.trim()
    )
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// The ratio cell of `median(with) / median(base)` against a goal it
/// must reach, and whether it is met: yes or no only when the ratio's 95%
/// interval lies wholly on one side of the goal.
fn goal_ratio(base: &[f64], with: &[f64], goal: f64) -> (String, Met) {
    judged_ratio(base, with, |r| r >= goal)
}

/// The ratio cell and whether `meets` holds of it (a goal on one side):
/// yes or no only when it holds, or fails, at both ends of its interval.
fn judged_ratio(base: &[f64], with: &[f64], meets: impl Fn(f64) -> bool) -> (String, Met) {
    judged(
        median(with) / median(base),
        ratio_interval(base, with),
        meets,
    )
}

/// The cell of `ratio` with its 95% `interval`, and whether `meets` holds
/// of it: yes or no only when it holds, or fails, at both ends of the
/// interval; without one (no rounds), the ratio alone decides.
fn judged(ratio: f64, interval: Option<(f64, f64)>, meets: impl Fn(f64) -> bool) -> (String, Met) {
    let Some((lo, hi)) = interval else {
        return (pct(ratio), meets(ratio).into());
    };
    let met = match (meets(lo), meets(hi)) {
        (true, true) => Met::Yes,
        (false, false) => Met::No,
        _ => Met::WithinNoise,
    };
    (
        format!("{} (95% interval {}–{})", pct(ratio), pct(lo), pct(hi)),
        met,
    )
}

/// A 95% interval of `median(with) / median(base)`, by the percentile
/// bootstrap: both sides' rounds drawn again with replacement, 10,000
/// times. The seed is fixed, so the same rounds give the same interval.
fn ratio_interval(base: &[f64], with: &[f64]) -> Option<(f64, f64)> {
    if base.is_empty() || with.is_empty() {
        return None;
    }
    let mut seed = SEED;
    let mut draw = |v: &[f64]| redrawn_median(v, &mut seed);
    Some(middle_95(
        (0..DRAWS).map(|_| draw(with) / draw(base)).collect(),
    ))
}

/// A 95% interval of `median(v)`, by the percentile bootstrap as above:
/// `v` drawn again with replacement, 10,000 times, from the same seed.
/// Sorted first, so that the interval is the values' alone, whatever
/// their order: with so few, the same seed draws ends one value apart
/// from values in another order.
fn median_interval(v: &[f64]) -> Option<(f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut seed = SEED;
    Some(middle_95(
        (0..DRAWS)
            .map(|_| redrawn_median(&sorted, &mut seed))
            .collect(),
    ))
}

/// How many times the bootstrap draws the rounds again, and from where.
const DRAWS: usize = 10_000;
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// The median of as many values drawn from `v` with replacement.
fn redrawn_median(v: &[f64], seed: &mut u64) -> f64 {
    let again: Vec<f64> = (0..v.len())
        .map(|_| v[(splitmix64(seed) % v.len() as u64) as usize])
        .collect();
    median(&again)
}

/// The 2.5th and 97.5th percentiles of DRAWS bootstrap draws.
fn middle_95(mut draws: Vec<f64>) -> (f64, f64) {
    draws.sort_by(f64::total_cmp);
    (draws[DRAWS / 40], draws[DRAWS - 1 - DRAWS / 40])
}

/// The next number of SplitMix64, a small generator that is plenty for
/// resampling.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

fn pct(ratio: f64) -> String {
    format!("{:.1}%", ratio * 100.0)
}

fn gbits(bps: f64) -> String {
    format!("{:.2} Gbit/s", bps / 1e9)
}

/// 1234567.8 → "1,234,568".
fn thousands(x: f64) -> String {
    let n = x.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn short_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.0}k", n as f64 / 1e3),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_line_numbers() {
        let line = "dnstrace: 812 DNS packets, 406 messages, 0 malformed, 101 journeys, 3 evicted (too many open at once), 2 anomalies; 7 events lost; detached from a, b";
        assert_eq!(number_before(line, " DNS packets"), Some(812));
        assert_eq!(number_before(line, " journeys"), Some(101));
        assert_eq!(number_before(line, " evicted"), Some(3));
        assert_eq!(number_before(line, " events lost"), Some(7));
        assert_eq!(number_before(line, " nothing"), None);
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(1_234_567.8), "1,234,568");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let order: Vec<usize> = turns(3, 3).map(|(_, side)| side).collect();
        assert_eq!(order, [0, 1, 2, 1, 2, 0, 2, 0, 1]);
    }

    #[test]
    fn a_goal_is_met_or_missed_only_beyond_the_noise() {
        let base = [18.4, 16.7, 18.7, 17.9, 18.2, 17.1, 18.5];
        // Rounds as spread as the lab's, 3% apart: this run cannot tell.
        let close: Vec<f64> = base.iter().map(|b| b * 0.97).collect();
        let (cell, met) = goal_ratio(&base, &close, 0.98);
        assert_eq!(met, Met::WithinNoise, "{cell}");
        assert!(cell.starts_with("97.0% (95% interval "), "{cell}");
        // Tight rounds on either side of the goal.
        let tight = [100.0, 100.4, 99.6, 100.2, 99.8];
        let below: Vec<f64> = tight.iter().map(|b| b * 0.90).collect();
        assert_eq!(goal_ratio(&tight, &below, 0.95).1, Met::No);
        let level: Vec<f64> = tight.iter().rev().copied().collect();
        assert_eq!(goal_ratio(&tight, &level, 0.98).1, Met::Yes);
        // The interval holds the ratio and is the same every time.
        let (lo, hi) = ratio_interval(&base, &close).unwrap();
        assert!(lo < 0.97 && 0.97 < hi, "{lo} {hi}");
        assert_eq!(ratio_interval(&base, &close), Some((lo, hi)));
        // No rounds: no interval, the ratio alone decides.
        assert_eq!(ratio_interval(&[], &close), None);
        assert_eq!(goal_ratio(&[1.0], &[], 0.98).1, Met::No);
    }

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn only_picks_figures_in_run_order_with_what_they_need() {
        let only = |names: &[&str]| selected(&strings(names), false);
        assert_eq!(only(&[]).unwrap().len(), FIGURES.len() - 1);
        assert!(!only(&[]).unwrap().contains(&"against"));
        assert_eq!(only(&["memory", "startup"]).unwrap(), ["startup", "memory"]);
        assert_eq!(only(&["zero-loss"]).unwrap(), ["capacity", "zero-loss"]);
        assert_eq!(only(&["overload"]).unwrap(), ["capacity", "overload"]);
        // The clusters they build replace the lab the others use.
        let last: Vec<&str> = FIGURES.iter().rev().take(2).map(|f| f.0).collect();
        assert_eq!(last, ["cluster", "merge"]);
        let err = only(&["memroy"]).unwrap_err().to_string();
        assert!(
            err.contains("\"memroy\"") && err.contains("memory"),
            "{err}"
        );
    }

    #[test]
    fn against_adds_its_figure_to_what_only_picks() {
        let only = |names: &[&str]| selected(&strings(names), true);
        assert_eq!(only(&[]).unwrap().len(), FIGURES.len());
        assert_eq!(only(&["against"]).unwrap(), ["against"]);
        assert_eq!(only(&["capacity"]).unwrap(), ["capacity", "against"]);
        assert_eq!(
            only(&["memory", "against", "overload"]).unwrap(),
            ["capacity", "against", "overload", "memory"]
        );
        let err = selected(&strings(&["against"]), false).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--only against needs --against REV"),
            "{err}"
        );
    }

    #[test]
    fn options_parse() {
        let parse = |args: &[&str]| Options::parse(&strings(args));
        assert_eq!(parse(&[]).unwrap(), Options::default());
        assert_eq!(
            parse(&["--quick", "--against", "d4a2369", "--only", "against"]).unwrap(),
            Options {
                quick: true,
                markdown: None,
                only: strings(&["against"]),
                against: Some("d4a2369".into()),
            }
        );
        assert_eq!(
            parse(&[
                "--markdown",
                "out.md",
                "--only",
                "memory",
                "--only",
                "iperf"
            ])
            .unwrap(),
            Options {
                markdown: Some("out.md".into()),
                only: strings(&["memory", "iperf"]),
                ..Options::default()
            }
        );
        let err = parse(&["--against"]).unwrap_err().to_string();
        assert!(err.starts_with("--against needs a git revision\n"), "{err}");
        let err = parse(&["--only"]).unwrap_err().to_string();
        assert!(err.starts_with("--only needs a figure\n"), "{err}");
        let err = parse(&["--against=d4a2369"]).unwrap_err().to_string();
        assert!(
            err.starts_with("unknown argument \"--against=d4a2369\""),
            "{err}"
        );
    }

    #[test]
    fn queries_are_wire_format() {
        let q = query(17);
        assert_eq!(&q[..2], &1u16.to_be_bytes());
        assert_eq!(q[12] as usize, "n17".len());
        assert!(q.ends_with(&[0, 0, 1, 0, 1]));
    }
}
