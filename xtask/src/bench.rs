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
    os::fd::AsRawFd as _,
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

use crate::{cargo, setup, workspace_root};

const LOCK: &str = "/run/dnstrace-lab.lock";
/// What the bench runs beyond setup's list (unbound is the lab's upstream).
const PACKAGES: &[&str] = &["iperf3", "dnsperf", "unbound"];

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

/// dnsperf's sockets (many, so kube-proxy's random DNAT spreads them over
/// both CoreDNS pods) and its queries outstanding at once.
const DNSPERF_CLIENTS: &str = "32";
const DNSPERF_OUTSTANDING: &str = "500";

/// dnstrace under DNS load: the largest usual ring buffer, and room for
/// every journey (the "tracing everything").
const DNS_LOAD: &[&str] = &["--ring-buffer-mib", "64", "--max-open", "262144"];

const USAGE: &str = "usage: cargo xtask bench [--quick] [--markdown PATH]
  --quick          short runs (seconds instead of minutes) for trying things
  --markdown PATH  also write the table as Markdown (for the README)";

/// How long each figure is measured.
struct Plan {
    iperf_secs: u32,
    iperf_rounds: usize,
    perf_secs: u32,
    perf_rounds: usize,
    zero_secs: u32,
    /// Each side of the tcpdump comparison, at each rate.
    side_secs: u32,
    record_secs: u32,
    replays: usize,
    /// dnstrace's --timeout while lookups pile up; the sender's rate is
    /// IN_FLIGHT over it.
    inflight_timeout_secs: u32,
    soak_secs: u32,
    sample_secs: u32,
    startups: usize,
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
                record_secs: 5,
                replays: 2,
                inflight_timeout_secs: 30,
                soak_secs: 60,
                sample_secs: 10,
                startups: 5,
            }
        } else {
            Self {
                iperf_secs: 10,
                iperf_rounds: 5,
                perf_secs: 15,
                perf_rounds: 3,
                zero_secs: 60,
                side_secs: 30,
                record_secs: 15,
                replays: 3,
                inflight_timeout_secs: 30,
                soak_secs: 600,
                sample_secs: 30,
                startups: 5,
            }
        }
    }
}

pub fn run(args: &[String]) -> Result<()> {
    let mut quick = false;
    let mut markdown = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--markdown" => {
                markdown =
                    Some(PathBuf::from(it.next().ok_or_else(|| {
                        anyhow!("--markdown needs a path\n{USAGE}")
                    })?))
            }
            _ => bail!("unknown argument {a:?}\n{USAGE}"),
        }
    }
    if !setup::is_root() {
        bail!("the bench loads eBPF programs and builds the lab: run `sudo cargo xtask bench`");
    }
    setup::ensure_packages(PACKAGES)?;
    cargo(&["build", "--release", "--quiet", "--package", "dnstrace"])?;
    let bin = workspace_root().join("target/release/dnstrace");
    let _lock = LabLock::acquire()?;
    catch_signals();
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("dnstrace-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _dir = RemoveDir(dir.clone());
    let mut bench = Bench {
        bin,
        dir,
        plan: Plan::new(quick),
        quick,
        rows: Vec::new(),
        notes: Vec::new(),
        capacity: None,
        rate: None,
    };
    step("building the lab (dnstrace lab up)");
    let lab = Lab::up(&bench.bin)?;
    let result = bench.all();
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

/// One line of the table.
struct Row {
    figure: String,
    baseline: String,
    with: String,
    ratio: String,
    goal: String,
    /// None: nothing to meet (a figure shown side by side).
    met: Option<bool>,
}

struct Bench {
    bin: PathBuf,
    dir: PathBuf,
    plan: Plan,
    quick: bool,
    rows: Vec<Row>,
    notes: Vec<String>,
    /// The lab's highest qps without dnstrace (median of the baseline runs).
    capacity: Option<f64>,
    /// The rate of the zero-loss run, used again for tcpdump and the recording.
    rate: Option<Offered>,
}

impl Bench {
    fn all(&mut self) -> Result<()> {
        self.query_file()?;
        self.phase("start-up: launch to all hooks attached", Self::startup)?;
        self.phase("TCP throughput through the node (iperf3)", Self::iperf)?;
        self.phase("DNS capacity (dnsperf against kube-dns)", Self::capacity)?;
        self.phase("zero loss at a sustained rate", Self::zero_loss)?;
        self.phase("tcpdump -i any -w at the same rate", Self::tcpdump)?;
        self.phase("user-space pipeline (replay on one core)", Self::pipeline)?;
        self.phase("memory with lookups in flight", Self::memory)?;
        Ok(())
    }

    /// A failed figure is a row saying why; the others are still measured.
    fn phase(&mut self, name: &str, f: fn(&mut Self) -> Result<()>) -> Result<()> {
        step(name);
        if let Err(e) = f(self) {
            if stopping() {
                return Err(e.context(interrupted().err().unwrap_or_else(|| anyhow!("stopped"))));
            }
            eprintln!("bench: {name}: {e:#}");
            self.rows.push(Row {
                figure: name.to_owned(),
                baseline: "—".into(),
                with: format!("not measured: {e:#}"),
                ratio: "—".into(),
                goal: "—".into(),
                met: Some(false),
            });
        }
        Ok(())
    }

    // ---------------------------------------------------------------- start-up

    fn startup(&mut self) -> Result<()> {
        let mut times = Vec::new();
        for _ in 0..self.plan.startups {
            let tracer = self.tracer(&Hooks::Tracepoints, &[])?;
            times.push(tracer.startup.as_secs_f64());
            let exit = tracer.stop()?;
            eprintln!(
                "bench: hooks attached in {:.0} ms ({})",
                times.last().unwrap() * 1e3,
                exit.targets
            );
        }
        let med = median(&times);
        self.rows.push(Row {
            figure: format!(
                "Start-up: launch to all hooks attached (`dnstrace trace`, median of {})",
                times.len()
            ),
            baseline: "—".into(),
            with: format!(
                "{:.0} ms ({:.0}–{:.0})",
                med * 1e3,
                min(&times) * 1e3,
                max(&times) * 1e3
            ),
            ratio: "—".into(),
            goal: "< 1 s".into(),
            met: Some(med < 1.0),
        });
        Ok(())
    }

    // ------------------------------------------------------------------ iperf3

    fn iperf(&mut self) -> Result<()> {
        let server = Proc::spawn(
            "iperf3 server",
            Command::new("ip")
                .args(["netns", "exec", CHECKOUT])
                .args(pinned(1))
                .args(["iperf3", "-s", "-B", CHECKOUT_IP]),
            Capture::Discard,
        )?;
        wait_listening(CHECKOUT, "-Hltn", 5201)?;
        let veths = node_veths()?;
        let modes = [
            (
                "tracepoints on every device (`dnstrace trace`)",
                Hooks::Tracepoints,
            ),
            (
                "tc on the node's veths (`dnstrace trace --iface …`)",
                Hooks::Tc(veths.clone()),
            ),
        ];
        let secs = self.plan.iperf_secs;
        let mut base = Vec::new();
        let mut with: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        // Alternated, in an order that turns each round, so a drift of the
        // machine hits every side alike.
        for round in 0..self.plan.iperf_rounds {
            for k in 0..=modes.len() {
                let which = (k + round) % (modes.len() + 1);
                if which == modes.len() {
                    let b = iperf3(secs)?;
                    eprintln!("bench: round {}: baseline {}", round + 1, gbits(b));
                    base.push(b);
                    continue;
                }
                let hooks = &modes[which].1;
                let tracer = self.tracer(hooks, &[])?;
                let t = iperf3(secs)?;
                tracer.stop()?;
                eprintln!(
                    "bench: round {}: traced ({}) {}",
                    round + 1,
                    hooks.short(),
                    gbits(t)
                );
                with[which].push(t);
            }
        }
        let b = median(&base);
        let spread = |v: &[f64]| format!("{:.2}–{:.2}", min(v) / 1e9, max(v) / 1e9);
        for ((what, _), runs) in modes.iter().zip(&with) {
            let w = median(runs);
            let ratio = w / b;
            self.rows.push(Row {
                figure: format!(
                    "TCP throughput pod → pod through the node (iperf3, {secs} s × {}, medians), {what}",
                    base.len()
                ),
                baseline: format!("{} ({})", gbits(b), spread(&base)),
                with: format!("{} ({})", gbits(w), spread(runs)),
                ratio: pct(ratio),
                goal: "≥ 98%".into(),
                met: Some(ratio >= 0.98),
            });
        }
        // BPF run time, in runs of their own: the statistics cost time too.
        let mut cells = Vec::new();
        for (_, hooks) in &modes {
            let tracer = self.tracer(hooks, &[])?;
            let stats = BpfStats::enable()?;
            let before = stats.programs(tracer.pid())?;
            iperf3(secs.min(5))?;
            let after = stats.programs(tracer.pid())?;
            drop(stats);
            tracer.stop()?;
            cells.push(per_run(&before, &after));
        }
        drop(server);
        self.rows.push(Row {
            figure: "Kernel work per non-DNS packet: BPF run time per program run (bpf_stats, during iperf3)".into(),
            baseline: "—".into(),
            with: cells.join("; "),
            ratio: "—".into(),
            goal: "minimal (early exit)".into(),
            met: None,
        });
        self.notes.push(format!(
            "iperf3 runs one TCP stream from default/web to shop/checkout across the node's bridge `cni0` (veth → bridge → veth, br_netfilter on); tc mode attaches to the node's veths ({}). With TSO/GRO on veth a \"packet\" there is usually a 64 KiB super-packet, so BPF runs per wire packet are fewer than the byte count suggests.",
            veths.join(", ")
        ));
        Ok(())
    }

    // ----------------------------------------------------------------- dnsperf

    fn query_file(&self) -> Result<()> {
        // Names CoreDNS (dnsmasq in the lab) answers itself, and names it
        // forwards to the upstream (answers cached up to 30 s, NXDOMAIN too).
        let names = [
            ("kubernetes.default.svc.cluster.local", "A"),
            ("kube-dns.kube-system.svc.cluster.local", "A"),
            ("db.default.svc.cluster.local", "A"),
            ("10-244-0-10.default.pod.cluster.local", "A"),
            ("web.default.svc.cluster.local", "A"),
            ("kubernetes.default.svc.cluster.local", "AAAA"),
            ("www.example.com", "A"),
            ("www.example.com", "AAAA"),
            ("api.example.com", "A"),
            ("chain.example.com", "A"),
            ("nothing.example.com", "A"),
        ];
        let text: String = names.iter().map(|(n, t)| format!("{n} {t}\n")).collect();
        std::fs::write(self.queries(), text)?;
        Ok(())
    }

    fn queries(&self) -> PathBuf {
        self.dir.join("queries.txt")
    }

    fn capacity(&mut self) -> Result<()> {
        let secs = self.plan.perf_secs;
        let mut base = Vec::new();
        let mut with = Vec::new();
        let mut lost = 0;
        let mut evicted = 0;
        for round in 0..self.plan.perf_rounds {
            let b = dnsperf(&self.queries(), secs, None)?;
            eprintln!("bench: round {}: baseline {b}", round + 1);
            base.push(b.qps);
            settle()?;
            let tracer = self.tracer(&Hooks::Tracepoints, DNS_LOAD)?;
            let t = dnsperf(&self.queries(), secs, None)?;
            let exit = tracer.stop()?;
            eprintln!("bench: round {}: traced {t}; {exit}", round + 1);
            lost += exit.lost;
            evicted += exit.evicted;
            with.push(t.qps);
            settle()?;
        }
        let (b, w) = (median(&base), median(&with));
        self.capacity = Some(b);
        self.rows.push(Row {
            figure: format!(
                "DNS capacity: dnsperf at the lab's highest rate via kube-dns {SERVICE} ({secs} s × {}, medians; `dnstrace trace -o json`)",
                base.len()
            ),
            baseline: format!(
                "{} qps ({}–{})",
                thousands(b),
                thousands(min(&base)),
                thousands(max(&base))
            ),
            with: format!(
                "{} qps ({}–{}; {lost} events lost, {evicted} evicted)",
                thousands(w),
                thousands(min(&with)),
                thousands(max(&with))
            ),
            ratio: pct(w / b),
            goal: "≥ 95%".into(),
            met: Some(w / b >= 0.95),
        });
        Ok(())
    }

    fn zero_loss(&mut self) -> Result<()> {
        let cap = self
            .capacity
            .ok_or_else(|| anyhow!("needs the lab's capacity, which was not measured"))?;
        let secs = self.plan.zero_secs;
        // 20,000 first, whatever the lab's capacity (what dnstrace loses
        // there is worth knowing), then down through rates the lab sustains
        // without it. A run stops at dnstrace's first lost event.
        let mut ladder = vec![ZERO_LOSS_QPS];
        ladder.extend(
            [
                15_000, 12_000, 10_000, 8_000, 6_000, 5_000, 4_000, 3_000, 2_500, 2_000, 1_500,
                1_000, 500,
            ]
            .into_iter()
            .filter(|&r| f64::from(r) <= cap * 0.9),
        );
        let mut tried = Vec::new();
        let mut found = None;
        for &rate in &ladder {
            let run = self.offer(rate, secs, true)?;
            eprintln!("bench: {rate} qps: {run}");
            tried.push(format!(
                "{} qps: {}",
                thousands(f64::from(rate)),
                run.brief()
            ));
            if run.clean() {
                found = Some(run);
                break;
            }
            settle()?;
        }
        let lab_note = if cap * 0.9 < f64::from(ZERO_LOSS_QPS) {
            format!(
                "The lab itself tops out at {} qps here (dnsperf, dnsmasq as CoreDNS, dnstrace and the kernel share 2 cores), so it cannot sustain {} qps",
                thousands(cap),
                thousands(f64::from(ZERO_LOSS_QPS)),
            )
        } else {
            format!("The lab sustains {} qps", thousands(cap))
        };
        self.notes.push(format!(
            "Zero-loss runs ({secs} s each, stopped at dnstrace's first lost event; `dnstrace trace -o json --ring-buffer-mib 64 --max-open 262144`): {}. {lab_note}.",
            tried.join("; ")
        ));
        let with = match &found {
            Some(run) => format!(
                "{} qps for {secs} s: {}",
                thousands(f64::from(run.rate)),
                run.brief()
            ),
            None => "no rate without loss".into(),
        };
        let met = found
            .as_ref()
            .is_some_and(|run| run.rate >= ZERO_LOSS_QPS && secs >= 60);
        self.rows.push(Row {
            figure: format!(
                "Zero lost events and evicted journeys, sustained: the highest rate without loss ({secs} s)"
            ),
            baseline: format!("lab's highest: {} qps", thousands(cap)),
            with,
            ratio: "—".into(),
            goal: "20,000 qps for 60 s, 0 lost, 0 evicted".into(),
            met: Some(met),
        });
        self.rate = found;
        Ok(())
    }

    /// dnstrace tracing while dnsperf offers `rate` for `secs`; with
    /// `stop_at_loss`, the run ends at the first event dnstrace loses.
    fn offer(&self, rate: u32, secs: u32, stop_at_loss: bool) -> Result<Offered> {
        let tracer = self.tracer(&Hooks::Tracepoints, DNS_LOAD)?;
        let cpu0 = proc_cpu(tracer.pid())?;
        let start = Instant::now();
        let perf = Proc::spawn(
            "dnsperf",
            &mut dnsperf_cmd(&self.queries(), secs, Some(rate)),
            Capture::Stdout,
        )?;
        let mut lost_after = None;
        let mut looked = Instant::now();
        while alive(perf.pid) {
            pause(Duration::from_millis(50))?;
            if stop_at_loss && looked.elapsed() >= Duration::from_secs(1) {
                looked = Instant::now();
                if tracer.lost_so_far() == 0 {
                    continue;
                }
                lost_after = Some(start.elapsed());
                // SAFETY: signalling our own child; dnsperf then prints its statistics.
                unsafe { libc::kill(perf.pid, libc::SIGINT) };
                break;
            }
        }
        let cpu = proc_cpu(tracer.pid())? - cpu0;
        let ended = perf.wait(Duration::from_secs(30))?;
        let perf = parse_dnsperf(&ended.output).ok();
        let exit = if lost_after.is_some() {
            // Its backlog would take long to drain: what it lost is known.
            let lost = tracer.lost_so_far();
            drop(tracer);
            Err(lost)
        } else {
            Ok(tracer.stop()?)
        };
        Ok(Offered {
            rate,
            perf,
            exit,
            lost_after,
            cpu,
        })
    }

    // ----------------------------------------------------------------- tcpdump

    fn tcpdump(&mut self) -> Result<()> {
        let found = self.rate.as_ref().map(|r| r.rate);
        let mut rates: Vec<u32> = found.into_iter().collect();
        if found != Some(ZERO_LOSS_QPS) {
            rates.push(ZERO_LOSS_QPS);
        }
        let secs = self.plan.side_secs;
        for rate in rates {
            let file = self.dir.join("tcpdump.pcap");
            let dump = Proc::spawn(
                "tcpdump",
                Command::new("ip")
                    .args(["netns", "exec", NODE, "tcpdump", "-i", "any", "-n", "-w"])
                    .arg(&file)
                    .args(["port", "53"]),
                Capture::Lines,
            )?;
            dump.wait_line("listening on", Duration::from_secs(10))?;
            let cpu0 = proc_cpu(dump.pid)?;
            let perf = dnsperf(&self.queries(), secs, Some(rate))?;
            let cpu = proc_cpu(dump.pid)? - cpu0;
            let ended = dump.stop(libc::SIGINT, Duration::from_secs(60))?;
            let _ = std::fs::remove_file(&file);
            let count = |what: &str| {
                ended
                    .output
                    .lines()
                    .find(|l| l.ends_with(what))
                    .and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let (captured, dropped) = (
                count("packets captured"),
                count("packets dropped by kernel"),
            );
            eprintln!("bench: tcpdump at {rate} qps: {captured} captured, {dropped} dropped, {cpu:.2} s CPU; {perf}");
            settle()?;
            let run = self.offer(rate, secs, false)?;
            eprintln!("bench: dnstrace at {rate} qps: {run}");
            settle()?;
            let share = |cpu: f64| format!("{:.0}% of a core", 100.0 * cpu / f64::from(secs));
            let (lost, packets) = match &run.exit {
                Ok(e) => (e.lost.to_string(), e.packets.to_string()),
                Err(lost) => (format!("≥ {lost}"), "?".into()),
            };
            self.rows.push(Row {
                figure: format!(
                    "Side by side at {} qps offered for {secs} s: `tcpdump -i any -w FILE port 53` (node netns) vs `dnstrace trace` (every netns)",
                    thousands(f64::from(rate))
                ),
                baseline: format!(
                    "tcpdump: {cpu:.1} s CPU ({}), {dropped} dropped, {captured} packets",
                    share(cpu)
                ),
                with: format!(
                    "dnstrace: {:.1} s CPU ({}), {lost} events lost, {packets} packets",
                    run.cpu,
                    share(run.cpu)
                ),
                ratio: format!("{:.1}× CPU", run.cpu / cpu.max(1e-9)),
                goal: "—".into(),
                met: None,
            });
        }
        self.notes.push(
            "Side by side: tcpdump sees only the node's devices (the veths, cni0, eth0), dnstrace also each pod's own eth0, and decodes every message and follows each lookup end to end. CPU is the process's user+system time while dnsperf ran (from /proc/PID/stat); the kernel-side cost of each (tcpdump's packet socket, dnstrace's BPF programs) is not in it.".into(),
        );
        Ok(())
    }

    // ---------------------------------------------------------------- pipeline

    fn pipeline(&mut self) -> Result<()> {
        let rate = self
            .rate
            .as_ref()
            .map(|r| r.rate)
            .or_else(|| self.capacity.map(|c| ((c * 0.5) as u32).max(1000)))
            .ok_or_else(|| anyhow!("needs a rate the lab sustains"))?;
        let file = self.dir.join("stream.pcapng");
        let secs = self.plan.record_secs;
        let file_arg = file.to_string_lossy().into_owned();
        let tracer = self.tracer(
            &Hooks::Tracepoints,
            &[DNS_LOAD, &["--record", &file_arg]].concat(),
        )?;
        // The run's kernel side, while DNS flows.
        let stats = BpfStats::enable()?;
        let before = stats.programs(tracer.pid())?;
        let perf = dnsperf(&self.queries(), secs, Some(rate))?;
        let after = stats.programs(tracer.pid())?;
        drop(stats);
        let exit = tracer.stop()?;
        eprintln!("bench: recorded {secs} s at {rate} qps: {perf}; {exit}");
        let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        let mut rates = Vec::new();
        let mut packets = 0;
        let mut wall = Vec::new();
        for _ in 0..self.plan.replays {
            let start = Instant::now();
            let replay = Proc::spawn(
                "dnstrace replay",
                Command::new("taskset")
                    .args(["-c", "0"])
                    .arg(&self.bin)
                    .arg("replay")
                    .arg(&file)
                    .args(["-o", "json"]),
                Capture::Lines,
            )?;
            let ended = replay.wait(Duration::from_secs(600))?;
            let secs = start.elapsed().as_secs_f64();
            if ended.code != Some(0) {
                bail!("dnstrace replay failed: {}", ended.output.trim());
            }
            packets = ended
                .output
                .lines()
                .find_map(|l| number_before(l.strip_prefix("dnstrace: replayed ")?, " DNS packets"))
                .ok_or_else(|| anyhow!("no `replayed N DNS packets` line in {:?}", ended.output))?;
            eprintln!(
                "bench: replayed {packets} packets in {secs:.2} s ({:.2} s CPU)",
                ended.cpu
            );
            rates.push(packets as f64 / secs);
            wall.push(secs);
        }
        let _ = std::fs::remove_file(&file);
        let r = median(&rates);
        self.rows.push(Row {
            figure: "User-space pipeline: decode + correlate + rules from a recorded stream, one core (`taskset -c 0 dnstrace replay -o json`, median)".into(),
            baseline: "—".into(),
            with: format!(
                "{} packet events/s ({packets} packets in {:.2} s)",
                thousands(r),
                median(&wall)
            ),
            ratio: "—".into(),
            goal: "≥ 1,000,000/s".into(),
            met: Some(r >= PIPELINE_GOAL),
        });
        self.rows.push(Row {
            figure: format!(
                "Kernel work per packet under DNS load ({} qps; bpf_stats)",
                thousands(f64::from(rate))
            ),
            baseline: "—".into(),
            with: per_run(&before, &after),
            ratio: "—".into(),
            goal: "—".into(),
            met: None,
        });
        self.notes.push(format!(
            "The pipeline figure replays a {secs} s recording made during dnsperf at {} qps ({:.0} MB of pcapng): it includes reading and parsing the file (replay reads it twice: a first pass for its header and notes) and writing the journeys as JSON to /dev/null, so decode + correlate + rules alone are faster.",
            thousands(f64::from(rate)),
            size as f64 / 1e6
        ));
        Ok(())
    }

    // ------------------------------------------------------------------ memory

    fn memory(&mut self) -> Result<()> {
        let timeout = self.plan.inflight_timeout_secs;
        // Enough that IN_FLIGHT are always unanswered within the timeout.
        let rate = IN_FLIGHT.div_ceil(timeout) + IN_FLIGHT / 50 / timeout;
        let timeout_arg = format!("{timeout}s");
        // The default ring buffer (4 MiB): its pages count in RSS too.
        let tracer = self.tracer(
            &Hooks::Tracepoints,
            &["--timeout", &timeout_arg, "--max-open", "131072"],
        )?;
        let pid = tracer.pid();
        let stop = Arc::new(AtomicBool::new(false));
        let (sink, ready) = blackhole(stop.clone());
        ready
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| anyhow!("the blackhole resolver did not start"))??;
        let ramp = timeout + 5;
        let total = ramp + self.plan.soak_secs;
        let sender = sender(rate, Duration::from_secs(u64::from(total)), stop.clone());
        let start = Instant::now();
        let mib = |key: &str| status_kib(pid, key).map(|k| k as f64 / 1024.0);
        let idle = (mib("VmRSS:")?, mib("RssAnon:")?);
        let mut samples: Vec<(u32, f64, f64)> = Vec::new();
        let run = (|| -> Result<()> {
            let mut next = ramp;
            while start.elapsed() < Duration::from_secs(u64::from(total)) {
                pause(Duration::from_millis(200))?;
                if sender.is_finished() {
                    break;
                }
                if start.elapsed() >= Duration::from_secs(u64::from(next)) {
                    let (rss, anon) = (mib("VmRSS:")?, mib("RssAnon:")?);
                    eprintln!("bench: t={next} s: RSS {rss:.1} MiB ({anon:.1} MiB anonymous)");
                    samples.push((next, rss, anon));
                    next += self.plan.sample_secs;
                }
            }
            Ok(())
        })();
        let peak = mib("VmHWM:");
        stop.store(true, Ordering::SeqCst);
        let sent = sender
            .join()
            .map_err(|_| anyhow!("the sender panicked"))??;
        let received = sink
            .join()
            .map_err(|_| anyhow!("the blackhole panicked"))??;
        let exit = tracer.stop()?;
        run?;
        let peak = peak?;
        eprintln!("bench: {sent} lookups sent, {received} reached the blackhole; peak RSS {peak:.1} MiB; {exit}");
        if samples.len() < 2 {
            bail!("too few RSS samples");
        }
        let rss: Vec<f64> = samples.iter().map(|s| s.1).collect();
        let (lo, hi) = (min(&rss), max(&rss));
        let (first, last) = (rss[0], rss[rss.len() - 1]);
        let in_flight = u64::from(rate) * u64::from(timeout);
        self.rows.push(Row {
            figure: format!(
                "Memory: peak RSS with ~{} lookups in flight (never answered; `--timeout {timeout}s`, default 4 MiB ring buffer)",
                thousands(in_flight as f64)
            ),
            baseline: format!("idle: {:.1} MiB ({:.1} anonymous)", idle.0, idle.1),
            with: format!(
                "{peak:.1} MiB ({} lost, {} evicted)",
                exit.lost, exit.evicted
            ),
            ratio: format!("{:.1}×", peak / idle.0),
            goal: "< 64 MiB".into(),
            met: Some(peak < RSS_GOAL_MIB && exit.evicted == 0),
        });
        let soak_min = f64::from(self.plan.soak_secs) / 60.0;
        // Flat: no growth from the first sample to the last beyond noise.
        let flat = last <= first * 1.05 + 1.0;
        self.rows.push(Row {
            figure: format!(
                "Memory over a {soak_min:.0}-minute soak, ~{} in flight throughout ({rate} new lookups/s; RSS every {} s)",
                thousands(in_flight as f64),
                self.plan.sample_secs
            ),
            baseline: format!("{first:.1} MiB at the start"),
            with: format!("{last:.1} MiB at the end ({lo:.1}–{hi:.1})"),
            ratio: pct(last / first),
            goal: "flat".into(),
            met: Some(flat),
        });
        self.notes.push(format!(
            "Lookups in flight: the lab's `upstream-timeout` fault drops the upstream's DNS with iptables, a drop dnstrace sees (it closes that leg at once), and the lab's CoreDNS (dnsmasq, `--dns-forward-max=1000`) answers REFUSED past 1,000 forwarded queries, so through kube-dns no more than about 2,000 lookups can be left waiting. The memory figure therefore sends {rate} queries/s of distinct names from default/web to a blackhole resolver in shop/checkout ({CHECKOUT_IP}:53, a socket that reads and never answers): {sent} sent, {received} received, each an open journey for {timeout} s. RSS samples, total/anonymous MiB: {}.",
            samples
                .iter()
                .map(|(t, r, a)| format!("{t} s {r:.0}/{a:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        Ok(())
    }

    // ------------------------------------------------------------------ output

    fn text_table(&self) -> String {
        let header = [
            "figure",
            "baseline",
            "with dnstrace",
            "ratio",
            "goal",
            "met?",
        ];
        let cells: Vec<[String; 6]> = self.rows.iter().map(Row::cells).collect();
        let mut out = String::new();
        for (i, h) in header.iter().enumerate() {
            let _ = write!(out, "{h}{}", if i < 5 { " | " } else { "\n" });
        }
        for c in &cells {
            let _ = writeln!(out, "{}", c.join(" | "));
        }
        out
    }

    fn markdown(&self, machine: &str, elapsed: Duration) -> String {
        let mut out = format!(
            "{machine}; `cargo xtask bench{}`, {:.0} minutes.\n\n",
            if self.quick { " --quick" } else { "" },
            elapsed.as_secs_f64() / 60.0
        );
        out += "| figure | baseline | with dnstrace | ratio | goal | met? |\n";
        out += "| --- | --- | --- | --- | --- | --- |\n";
        for r in &self.rows {
            let c = r.cells().map(|s| s.replace('|', "\\|"));
            let _ = writeln!(out, "| {} |", c.join(" | "));
        }
        out += "\n";
        for n in &self.notes {
            let _ = writeln!(out, "- {n}");
        }
        out
    }

    // ---------------------------------------------------------------- dnstrace

    fn tracer(&self, hooks: &Hooks, extra: &[&str]) -> Result<Tracer> {
        let mut cmd = match hooks {
            Hooks::Tracepoints => {
                let mut c = Command::new(&self.bin);
                c.args(["trace", "--node-netns", &format!("/run/netns/{NODE}")]);
                c
            }
            // tc attaches by name in dnstrace's own network namespace.
            Hooks::Tc(ifaces) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", NODE]).arg(&self.bin).arg("trace");
                for i in ifaces {
                    c.args(["--iface", i]);
                }
                c
            }
        };
        cmd.args(["-o", "json", "--containerd-root", CONTAINERD])
            .args(extra);
        let start = Instant::now();
        let proc = Proc::spawn("dnstrace trace", &mut cmd, Capture::Lines)?;
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
                Some(true) => "yes".into(),
                Some(false) => "**no**".into(),
                None => "—".into(),
            },
        ]
    }
}

enum Hooks {
    Tracepoints,
    Tc(Vec<String>),
}

impl Hooks {
    fn short(&self) -> &'static str {
        match self {
            Hooks::Tracepoints => "tracepoints",
            Hooks::Tc(_) => "tc",
        }
    }
}

struct Tracer {
    proc: Proc,
    startup: Duration,
}

/// What dnstrace said when it stopped.
struct TraceExit {
    cpu: f64,
    packets: u64,
    lost: u64,
    evicted: u64,
    journeys: u64,
    targets: String,
}

impl std::fmt::Display for TraceExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "dnstrace: {} packets, {} journeys, {} events lost, {} evicted, {:.1} s CPU",
            self.packets, self.journeys, self.lost, self.evicted, self.cpu
        )
    }
}

/// One run of dnstrace under dnsperf at a fixed rate.
struct Offered {
    rate: u32,
    perf: Option<PerfResult>,
    /// Its exit line, or (stopped at the first loss) the events lost by then.
    exit: std::result::Result<TraceExit, u64>,
    lost_after: Option<Duration>,
    /// dnstrace's CPU seconds while dnsperf ran.
    cpu: f64,
}

impl Offered {
    /// No event lost, no journey evicted, and the lab answered (nearly) all.
    fn clean(&self) -> bool {
        let sustained = self
            .perf
            .as_ref()
            .is_some_and(|p| p.lost as f64 <= p.sent as f64 * 0.005);
        matches!(&self.exit, Ok(e) if e.lost == 0 && e.evicted == 0) && sustained
    }

    fn brief(&self) -> String {
        let answered = self.perf.as_ref().map_or("?".into(), |p| {
            format!(
                "{} answered",
                pct(p.completed as f64 / p.sent.max(1) as f64)
            )
        });
        match (&self.exit, self.lost_after) {
            (Ok(e), _) => format!("{answered}, {} events lost, {} evicted", e.lost, e.evicted),
            // dnsperf, stopped, counts what was still outstanding as lost.
            (Err(lost), Some(t)) => format!(
                "events lost from {:.0} s on ({lost} by then)",
                t.as_secs_f64()
            ),
            (Err(lost), None) => format!("{answered}, {lost} events lost"),
        }
    }
}

impl std::fmt::Display for Offered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(p) = &self.perf {
            write!(f, "{p}; ")?;
        }
        match &self.exit {
            Ok(e) => write!(f, "{e}"),
            Err(_) => write!(f, "{}", self.brief()),
        }?;
        write!(f, "; {:.1} s CPU while dnsperf ran", self.cpu)
    }
}

impl Tracer {
    /// The count in its latest "N events lost so far" warning.
    /// Events lost so far: the kernel's count in dnstrace's LOST map (read
    /// with bpftool), or its latest "N events lost so far" warning, which
    /// comes late when it is busy.
    fn lost_so_far(&self) -> u64 {
        let said = self
            .proc
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(_, l)| number_before(l, " events lost so far"))
            .max()
            .unwrap_or(0);
        said.max(lost_in_map(self.pid()).unwrap_or(0))
    }

    fn pid(&self) -> i32 {
        self.proc.pid
    }

    /// Ctrl-C, as a user would, and its exit line.
    fn stop(self) -> Result<TraceExit> {
        let ended = self.proc.stop(libc::SIGINT, Duration::from_secs(120))?;
        let line = ended
            .output
            .lines()
            .find(|l| {
                l.starts_with("dnstrace: ")
                    && l.contains(" DNS packets")
                    && l.contains(" events lost")
            })
            .ok_or_else(|| {
                anyhow!(
                    "dnstrace ended without its summary: {}",
                    ended.output.trim()
                )
            })?;
        let get = |suffix: &str| {
            number_before(line, suffix)
                .ok_or_else(|| anyhow!("no `N{suffix}` in dnstrace's exit line {line:?}"))
        };
        Ok(TraceExit {
            cpu: ended.cpu,
            packets: get(" DNS packets")?,
            lost: get(" events lost")?,
            evicted: get(" evicted")?,
            journeys: get(" journeys")?,
            targets: line
                .split_once("detached from ")
                .map_or("", |(_, t)| t)
                .to_owned(),
        })
    }
}

/// The number just before `suffix` in `line`.
fn number_before(line: &str, suffix: &str) -> Option<u64> {
    let head = &line[..line.find(suffix)?];
    let digits: String = head
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.chars().rev().collect::<String>().parse().ok()
}

// ---------------------------------------------------------------- processes

enum Capture {
    Discard,
    /// stderr's lines, each with when it came.
    Lines,
    /// stdout's lines instead (stderr discarded).
    Stdout,
}

/// A child process, killed and reaped if still there when dropped.
struct Proc {
    name: &'static str,
    pid: i32,
    _child: Child,
    reaped: bool,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
    reader: Option<JoinHandle<()>>,
}

struct Ended {
    code: Option<i32>,
    /// User + system seconds, from wait4.
    cpu: f64,
    /// The captured stream's lines.
    output: String,
}

impl Proc {
    fn spawn(name: &'static str, cmd: &mut Command, capture: Capture) -> Result<Self> {
        cmd.stdin(Stdio::null());
        let piped = |on: bool| if on { Stdio::piped() } else { Stdio::null() };
        cmd.stdout(piped(matches!(capture, Capture::Stdout)));
        cmd.stderr(piped(matches!(capture, Capture::Lines)));
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stream: Option<Box<dyn std::io::Read + Send>> = match capture {
            Capture::Discard => None,
            Capture::Lines => child.stderr.take().map(|e| Box::new(e) as _),
            Capture::Stdout => child.stdout.take().map(|o| Box::new(o) as _),
        };
        let reader = stream.map(|stream| {
            let lines = lines.clone();
            thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    lines.lock().unwrap().push((Instant::now(), line));
                }
            })
        });
        Ok(Self {
            name,
            pid: child.id() as i32,
            _child: child,
            reaped: false,
            lines,
            reader,
        })
    }

    fn captured(&self) -> String {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|(_, l)| format!("{l}\n"))
            .collect()
    }

    /// When a stderr line containing `pat` came.
    fn wait_line(&self, pat: &str, timeout: Duration) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((at, _)) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|(_, l)| l.contains(pat))
            {
                return Ok(*at);
            }
            if !alive(self.pid) {
                sleep(Duration::from_millis(50));
                bail!(
                    "{} ended before saying {pat:?}: {}",
                    self.name,
                    self.captured().trim()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not say {pat:?} within {timeout:?}: {}",
                    self.name,
                    self.captured().trim()
                );
            }
            pause(Duration::from_millis(5))?;
        }
    }

    fn stop(self, signal: i32, grace: Duration) -> Result<Ended> {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.pid, signal) };
        self.wait(grace)
    }

    /// Waits for the end (killing it after `limit`), with its CPU time.
    fn wait(mut self, limit: Duration) -> Result<Ended> {
        let deadline = Instant::now() + limit;
        let mut killed = false;
        loop {
            let mut status = 0;
            // SAFETY: zeroed rusage is a valid out-parameter.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: wait4 on our own child, with valid pointers.
            let r = unsafe { libc::wait4(self.pid, &mut status, libc::WNOHANG, &mut ru) };
            if r == self.pid {
                self.reaped = true;
                if let Some(reader) = self.reader.take() {
                    let _ = reader.join();
                }
                let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
                let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
                if killed {
                    bail!("{} did not end within {limit:?}; killed", self.name);
                }
                return Ok(Ended {
                    code,
                    cpu: secs(ru.ru_utime) + secs(ru.ru_stime),
                    output: self.captured(),
                });
            }
            if r < 0 {
                bail!(
                    "waiting for {}: {}",
                    self.name,
                    std::io::Error::last_os_error()
                );
            }
            if !killed && Instant::now() > deadline {
                // SAFETY: as above.
                unsafe { libc::kill(self.pid, libc::SIGKILL) };
                killed = true;
            }
            sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.reaped {
            // SAFETY: kill and reap our own child.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

fn status_kib(pid: i32, key: &str) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow!("no {key} in /proc/{pid}/status"))
}

// ---------------------------------------------------------------- the lab

/// The machine-wide lab lock (the test suite takes it too), held until drop.
struct LabLock {
    _file: File,
}

impl LabLock {
    fn acquire() -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK)
            .with_context(|| format!("opening {LOCK}"))?;
        let fd = file.as_raw_fd();
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            eprintln!("bench: waiting for {LOCK} (a test run or another bench is using the lab)");
            // SAFETY: as above.
            if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
                bail!("locking {LOCK}: {}", std::io::Error::last_os_error());
            }
        }
        Ok(Self { _file: file })
    }
}

/// The lab, brought down when dropped (errors and Ctrl-C included).
struct Lab(PathBuf);

impl Lab {
    fn up(bin: &Path) -> Result<Self> {
        let _ = Command::new(bin).args(["lab", "down"]).output();
        let lab = Self(bin.to_owned());
        let out = Command::new(bin)
            .args(["lab", "up"])
            .stdin(Stdio::null())
            .output()
            .context("running dnstrace lab up")?;
        if !out.status.success() {
            bail!(
                "dnstrace lab up failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(lab)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        step("removing the lab (dnstrace lab down)");
        let _ = Command::new(&self.0).args(["lab", "down"]).status();
    }
}

/// The node's veths: the pods' host ends and the uplink.
fn node_veths() -> Result<Vec<String>> {
    let out = output(Command::new("ip").args(["-n", NODE, "-o", "link", "show", "type", "veth"]))?;
    let names: Vec<String> = out
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        .collect();
    if names.is_empty() {
        bail!("no veths in {NODE}");
    }
    Ok(names)
}

fn wait_listening(ns: &str, ss_flags: &str, port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = output(Command::new("ip").args([
            "netns",
            "exec",
            ns,
            "ss",
            ss_flags,
            "sport",
            "=",
            &format!(":{port}"),
        ]))?;
        if !out.trim().is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("nothing listens on port {port} in {ns}");
        }
        pause(Duration::from_millis(50))?;
    }
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        // iperf3 -J, for one, says what went wrong on stdout.
        let said = if out.stderr.is_empty() {
            &out.stdout
        } else {
            &out.stderr
        };
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(said).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

// ---------------------------------------------------------------- load

/// iperf3 from default/web to shop/checkout: bits per second received.
fn iperf3(secs: u32) -> Result<f64> {
    interrupted()?;
    let out = output(
        Command::new("ip")
            .args(["netns", "exec", WEB])
            .args(pinned(0))
            .args([
                "iperf3",
                "-c",
                CHECKOUT_IP,
                "-t",
                &secs.to_string(),
                "-O",
                "1",
                "-J",
            ]),
    )?;
    let v: serde_json::Value = serde_json::from_str(&out).context("iperf3's JSON")?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| anyhow!("no end.sum_received.bits_per_second in iperf3's output"))
}

struct PerfResult {
    sent: u64,
    completed: u64,
    lost: u64,
    qps: f64,
}

impl std::fmt::Display for PerfResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "dnsperf: {} qps, {} sent, {} completed, {} lost",
            thousands(self.qps),
            self.sent,
            self.completed,
            self.lost
        )
    }
}

/// dnsperf from default/web to kube-dns; `rate` None is as fast as answers come.
fn dnsperf_cmd(queries: &Path, secs: u32, rate: Option<u32>) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", WEB, "dnsperf", "-s", SERVICE, "-d"])
        .arg(queries)
        .args(["-l", &secs.to_string(), "-c", DNSPERF_CLIENTS, "-t", "2"]);
    match rate {
        Some(r) => cmd.args(["-Q", &r.to_string(), "-q", "5000"]),
        None => cmd.args(["-q", DNSPERF_OUTSTANDING]),
    };
    cmd
}

fn dnsperf(queries: &Path, secs: u32, rate: Option<u32>) -> Result<PerfResult> {
    interrupted()?;
    parse_dnsperf(&output(&mut dnsperf_cmd(queries, secs, rate))?)
}

fn parse_dnsperf(out: &str) -> Result<PerfResult> {
    let field = |key: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
            .ok_or_else(|| anyhow!("no {key:?} in dnsperf's output:\n{out}"))
    };
    Ok(PerfResult {
        sent: field("Queries sent:")? as u64,
        completed: field("Queries completed:")? as u64,
        lost: field("Queries lost:")? as u64,
        qps: field("Queries per second:")?,
    })
}

/// A process's user + system seconds so far, all threads.
fn proc_cpu(pid: i32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| -> Result<f64> {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| anyhow!("short /proc/{pid}/stat"))
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // utime and stime: fields 14 and 15, counted from the state (field 3).
    Ok((ticks(11)? + ticks(12)?) / hz)
}

/// `taskset -c CPU` where the machine has two CPUs or more: iperf3's client
/// and server on CPUs of their own vary less from run to run.
fn pinned(cpu: usize) -> Vec<String> {
    if thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        vec!["taskset".into(), "-c".into(), cpu.to_string()]
    } else {
        Vec::new()
    }
}

/// Runs `f` on a thread of its own inside the lab namespace `ns`.
fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> JoinHandle<Result<T>> {
    let path = format!("/run/netns/{ns}");
    thread::spawn(move || {
        let file = File::open(&path).with_context(|| format!("opening {path}"))?;
        // SAFETY: setns on this thread only, with a namespace fd we own.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!("entering {path}: {}", std::io::Error::last_os_error());
        }
        f()
    })
}

/// A resolver that reads every query and never answers, in shop/checkout.
fn blackhole(stop: Arc<AtomicBool>) -> (JoinHandle<Result<u64>>, mpsc::Receiver<Result<()>>) {
    let (tx, rx) = mpsc::channel();
    let handle = in_netns(CHECKOUT, move || {
        let sock = match UdpSocket::bind((CHECKOUT_IP, 53)) {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Err(anyhow!("binding {CHECKOUT_IP}:53: {e}")));
                return Err(e.into());
            }
        };
        let size: libc::c_int = 32 << 20;
        // SAFETY: setsockopt with a valid int option value.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        sock.set_read_timeout(Some(Duration::from_millis(100)))?;
        let _ = tx.send(Ok(()));
        let mut buf = [0u8; 2048];
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) {
            match sock.recv(&mut buf) {
                Ok(_) => n += 1,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(n)
    });
    (handle, rx)
}

/// Queries for distinct names from default/web to the blackhole, `rate` a
/// second for `duration`, from 16 sockets.
fn sender(rate: u32, duration: Duration, stop: Arc<AtomicBool>) -> JoinHandle<Result<u64>> {
    in_netns(WEB, move || {
        let socks = (0..16)
            .map(|_| {
                let s = UdpSocket::bind("0.0.0.0:0")?;
                s.connect((CHECKOUT_IP, 53))?;
                Ok(s)
            })
            .collect::<Result<Vec<_>>>()?;
        let start = Instant::now();
        let mut sent = 0u64;
        while !stop.load(Ordering::SeqCst) && start.elapsed() < duration {
            let due = (start.elapsed().as_secs_f64() * f64::from(rate)) as u64;
            while sent < due {
                let sock = &socks[(sent % 16) as usize];
                sock.send(&query(sent))?;
                sent += 1;
            }
            sleep(Duration::from_millis(2));
        }
        Ok(sent)
    })
}

/// A DNS query (RD, one question, A) for a name of its own.
fn query(n: u64) -> Vec<u8> {
    let id = ((n / 16) & 0xffff) as u16;
    let mut q = Vec::with_capacity(64);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in [
        format!("n{n}"),
        "inflight".into(),
        "example".into(),
        "com".into(),
    ] {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

// ---------------------------------------------------------------- BPF stats

/// Run-time statistics of BPF programs, on while this lives (BPF_ENABLE_STATS:
/// the kernel turns them off again when the descriptor closes, whatever happens
/// to the bench; kernel.bpf_stats_enabled itself is left alone).
struct BpfStats {
    _fd: File,
}

#[derive(Clone, Copy, Default)]
struct ProgStat {
    run_ns: u64,
    runs: u64,
}

impl BpfStats {
    fn enable() -> Result<Self> {
        const BPF_ENABLE_STATS: libc::c_long = 32;
        let mut attr = [0u64; 16];
        attr[0] = 0; // BPF_STATS_RUN_TIME
                     // SAFETY: bpf(2) with a zeroed attr of the size given.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_ENABLE_STATS,
                attr.as_mut_ptr(),
                std::mem::size_of_val(&attr),
            )
        };
        if fd < 0 {
            bail!("BPF_ENABLE_STATS: {}", std::io::Error::last_os_error());
        }
        // SAFETY: the kernel just gave us this descriptor.
        Ok(Self {
            _fd: unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as i32) },
        })
    }

    /// The programs (named dns_*) that `pid` holds, summed by name.
    fn programs(&self, pid: i32) -> Result<BTreeMap<String, ProgStat>> {
        let ours = bpf_ids(pid, "prog_id:");
        let out = output(Command::new("bpftool").args(["-j", "prog", "show"]))?;
        let progs: Vec<serde_json::Value> = serde_json::from_str(&out).context("bpftool's JSON")?;
        let mut by_name: BTreeMap<String, ProgStat> = BTreeMap::new();
        for p in progs {
            let Some(name) = p["name"].as_str().filter(|n| n.starts_with("dns_")) else {
                continue;
            };
            if !p["id"].as_u64().is_some_and(|id| ours.contains(&id)) {
                continue;
            }
            let s = by_name.entry(name.to_owned()).or_default();
            s.run_ns += p["run_time_ns"].as_u64().unwrap_or(0);
            s.runs += p["run_cnt"].as_u64().unwrap_or(0);
        }
        Ok(by_name)
    }
}

/// The ids of the BPF maps or programs (`key` "map_id:" or "prog_id:") a
/// process holds descriptors of, from /proc/PID/fdinfo.
fn bpf_ids(pid: i32, key: &str) -> Vec<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
        })
        .collect()
}

/// The sum over CPUs of the LOST map of the dnstrace with this pid.
fn lost_in_map(pid: i32) -> Result<u64> {
    let ours = bpf_ids(pid, "map_id:");
    let out = output(Command::new("bpftool").args(["-j", "map", "show"]))?;
    let maps: Vec<serde_json::Value> = serde_json::from_str(&out).context("bpftool's JSON")?;
    let id = maps
        .iter()
        .filter(|m| m["name"].as_str() == Some("LOST"))
        .filter_map(|m| m["id"].as_u64())
        .find(|id| ours.contains(id))
        .ok_or_else(|| anyhow!("no LOST map of pid {pid}"))?;
    let out = output(Command::new("bpftool").args([
        "-j",
        "map",
        "lookup",
        "id",
        &id.to_string(),
        "key",
        "0",
        "0",
        "0",
        "0",
    ]))?;
    let v: serde_json::Value = serde_json::from_str(&out).context("bpftool's JSON")?;
    let values = v["formatted"]["values"]
        .as_array()
        .or_else(|| v["values"].as_array())
        .ok_or_else(|| anyhow!("no per-CPU values for the LOST map"))?;
    Ok(values
        .iter()
        .map(|c| match &c["value"] {
            serde_json::Value::Number(n) => n.as_u64().unwrap_or(0),
            // Raw bytes, little-endian, as "0x2a" strings.
            serde_json::Value::Array(bytes) => bytes.iter().rev().fold(0u64, |acc, b| {
                let byte = b
                    .as_str()
                    .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
                    .unwrap_or(0);
                (acc << 8) | byte
            }),
            _ => 0,
        })
        .sum())
}

/// "dns_dev_xmit 41 ns × 1.2M runs, …" between two readings.
fn per_run(before: &BTreeMap<String, ProgStat>, after: &BTreeMap<String, ProgStat>) -> String {
    let mut parts = Vec::new();
    for (name, a) in after {
        let b = before.get(name).copied().unwrap_or_default();
        let runs = a.runs.saturating_sub(b.runs);
        if runs == 0 {
            continue;
        }
        let ns = a.run_ns.saturating_sub(b.run_ns) as f64 / runs as f64;
        parts.push(format!("`{name}` {ns:.0} ns × {}", short_count(runs)));
    }
    if parts.is_empty() {
        "no runs counted".into()
    } else {
        parts.join(", ")
    }
}

// ---------------------------------------------------------------- little things

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
    }

    #[test]
    fn queries_are_wire_format() {
        let q = query(17);
        assert_eq!(&q[..2], &1u16.to_be_bytes());
        assert_eq!(q[12] as usize, "n17".len());
        assert!(q.ends_with(&[0, 0, 1, 0, 1]));
    }
}
