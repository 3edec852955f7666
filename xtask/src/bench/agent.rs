//! The agent's figures (issue 35): the lab's capacity kept with the agent
//! tracing, its lookup counts against dnsperf's own, its CPU per 1,000
//! lookups a second against `trace -o json`, its memory with 10,000
//! series, and how long a scrape of `/metrics` takes.
use std::io::Write as _;

use super::*;

/// Series the memory figure makes: one per name asked, with
/// `--metrics-query-names`.
const SERIES: usize = 10_000;
/// Rates of the CPU figure; the higher is lowered to what the lab holds.
const CPU_RATES: [u32; 2] = [5_000, 20_000];
/// Names the CPU figure asks, in turn.
const CPU_NAMES: usize = 1_000;
/// The goals.
const CAPACITY_GOAL: f64 = 0.95;
const CPU_GOAL_PCT: f64 = 0.5;
const RSS_GOAL_MIB: f64 = 64.0;

impl Bench {
    pub(super) fn agent(&mut self) -> Result<()> {
        let cap = self
            .capacity
            .ok_or_else(|| anyhow!("needs the lab's capacity, which was not measured"))?;
        self.agent_capacity()?;
        self.agent_cpu(cap)?;
        self.agent_memory()
    }

    /// The agent as the DaemonSet runs it (flight recorder on), with
    /// `extra` (the capacity figures': `DNS_LOAD`).
    fn agent_tracer(&self, listen: &str, extra: &[&str]) -> Result<Tracer> {
        let mut cmd = Command::new(&self.bin);
        cmd.args(["agent", "--node-netns", &format!("/run/netns/{NODE}")])
            .args(["--api-addr", "127.0.0.1:0"])
            .args(["--containerd-root", CONTAINERD, "--metrics-addr", listen])
            .arg("--flight-dir")
            .arg(self.dir.join("flights"))
            .args(extra);
        let start = Instant::now();
        let proc = Proc::spawn("dnstrace agent", &mut cmd, Capture::Lines)?;
        let at = proc.wait_line("capturing DNS on port", Duration::from_secs(30))?;
        Ok(Tracer {
            proc,
            startup: at - start,
        })
    }

    /// The lab's capacity with the agent (its defaults, and following 1
    /// lookup in 1,024: the kernel's counting and little else), by
    /// windows; then whole dnsperf runs under each, its count of web's
    /// lookups against the queries dnsperf sent.
    fn agent_capacity(&mut self) -> Result<()> {
        let secs = self.plan.agent_secs;
        let listen = free_listen()?;
        let modes: [(&str, Vec<&str>); 2] = [
            (
                "`dnstrace agent`, its defaults (`--sample auto`), flight recorder on",
                DNS_LOAD.to_vec(),
            ),
            (
                "`dnstrace agent --sample 1024`: the kernel's counting, 1 lookup in 1,024 followed",
                [DNS_LOAD, &["--sample", "1024"]].concat(),
            ),
        ];
        let mut untraced = Vec::new();
        for (what, extra) in &modes {
            let w = self.windows(&listen, extra)?;
            untraced.extend_from_slice(&w.without);
            let (ratio, met) = judged(median(&w.ratios), median_interval(&w.ratios), |r| {
                r >= CAPACITY_GOAL
            });
            self.rows.push(Row {
                figure: format!(
                    "Agent: DNS capacity at the lab's highest rate (one dnsperf; {} windows of {secs} s with the agent, each against the windows without it on either side; {what})",
                    w.ratios.len()
                ),
                baseline: format!("{} qps", thousands(median(&w.without))),
                with: format!("{} qps", thousands(median(&w.with))),
                ratio,
                goal: "≥ 95%".into(),
                met: Some(met),
            });
        }
        self.note("A windowed ratio: one dnsperf runs at the lab's highest rate, reporting each second, while the agent is started and stopped in turn; each window with the agent (from 1 s after it is ready) is divided by the mean of the windows without it on either side, seconds apart, where rounds a minute apart drift by a fifth. The median of those ratios, with the percentile bootstrap of that median for its 95% interval.");
        self.explain_met();
        self.agent_counts(&listen, &modes, median(&untraced))
    }

    /// One dnsperf at the lab's highest rate (`-S 1`: a rate each second),
    /// the agent with `extra` started and stopped in turn while it runs:
    /// windows of `agent_secs` without it and with it, alternating, the
    /// first and the last without.
    fn windows(&self, listen: &str, extra: &[&str]) -> Result<Windows> {
        let secs = self.plan.agent_secs;
        let n = self.plan.agent_rounds;
        // Room for every window and each agent's start; stopped after the last.
        let limit = (n as u32 + 1) * (2 * secs + 30);
        let perf = stamped_dnsperf(&self.queries(), limit)?;
        settle()?;
        let window = |with: bool| -> Result<Window> {
            let start = unix_now();
            pause(Duration::from_secs(u64::from(secs)))?;
            Ok(Window {
                with,
                start,
                end: unix_now(),
            })
        };
        let mut marks = Vec::new();
        for i in 0..n {
            marks.push(window(false)?);
            let agent = self.agent_tracer(listen, extra)?;
            // Its start-up's work done: the window is its steady cost.
            pause(Duration::from_secs(1))?;
            marks.push(window(true)?);
            let exit = agent.stop()?;
            eprintln!("bench: agent window {}: {exit}", i + 1);
            pause(Duration::from_secs(1))?;
        }
        marks.push(window(false)?);
        let out = perf.stop(libc::SIGINT, Duration::from_secs(10))?.output;
        Windows::of(&marks, &per_second(&out))
    }

    /// Whole dnsperf runs at the lab's highest rate under the agent in each
    /// mode, a thousand names asked (so that the follow budget meets names
    /// to choose from): web's lookups counted against the queries sent,
    /// the journeys followed a second with the defaults, and the agent's
    /// CPU a lookup against what one costs the machine untraced (the
    /// capacity windows' rate without it, `untraced_qps`).
    fn agent_counts(
        &mut self,
        listen: &str,
        modes: &[(&str, Vec<&str>)],
        untraced_qps: f64,
    ) -> Result<()> {
        let secs = self.plan.agent_secs;
        let names = self.many_names()?;
        let mut counts = Vec::new();
        let mut followed = Vec::new();
        let mut costs = vec![Vec::new(); modes.len()];
        for (run, which) in turns(self.plan.agent_counts, modes.len()) {
            let agent = self.agent_tracer(listen, &modes[which].1)?;
            let (t, cost) = run_with_cost(&agent, &names, secs)?;
            costs[which].push(cost);
            // Every query answered or past the timeout, and read.
            pause(Duration::from_millis(7_000))?;
            // The pod's name; WEB is its network namespace's.
            let pod = WEB.strip_prefix("dtlab-").unwrap_or(WEB);
            let page = scrape(listen)?;
            let counted = lookups_of(&page, pod);
            let journeys = sample(&page, "dnstrace_journeys_total").unwrap_or(0.0);
            let exit = agent.stop()?;
            eprintln!(
                "bench: agent count {}: {t}; counted {counted} of {} sent; {exit}",
                run + 1,
                t.sent
            );
            counts.push((t.sent, counted, exit.lost));
            if which == 0 {
                followed.push(journeys / f64::from(secs));
            }
            settle()?;
        }
        let each: Vec<String> = followed.iter().map(|f| format!("{f:.0}/s")).collect();
        self.rows.push(Row {
            figure: format!("Agent: journeys followed whole a second at the lab's highest rate, 1,000 names, its defaults (`--follow-max {FOLLOW_MAX}`), each run below"),
            baseline: "—".into(),
            with: each.join("; "),
            ratio: "—".into(),
            goal: format!("about {FOLLOW_MAX}/s, under {}/s", 2 * FOLLOW_MAX),
            met: Some(followed.iter().all(|&f| f > 0.0 && f < f64::from(2 * FOLLOW_MAX)).into()),
        });
        let exact = counts.iter().all(|&(sent, counted, _)| sent == counted);
        let each: Vec<String> = counts
            .iter()
            .map(|(sent, counted, lost)| format!("{counted} of {sent} ({lost} events lost)"))
            .collect();
        self.rows.push(Row {
            figure: format!("Agent: web's lookups in `dnstrace_lookups_total` against the queries dnsperf sent, whole runs of {secs} s at the lab's highest rate, each mode in turn"),
            baseline: "dnsperf's own count".into(),
            with: each.join("; "),
            ratio: "—".into(),
            goal: "equal, events lost or not".into(),
            met: Some(exact.into()),
        });
        self.agent_cost_rows(modes, &costs, untraced_qps);
        Ok(())
    }

    /// The capacity the agent's CPU a lookup leaves, mode by mode: a
    /// figure of the same goal as the windows', from counted time rather
    /// than from rates whose noise is larger than the agent's cost.
    fn agent_cost_rows(&mut self, modes: &[(&str, Vec<&str>)], costs: &[Vec<Cost>], qps: f64) {
        let cores = thread::available_parallelism().map_or(1, |n| n.get());
        let lookup_us = cores as f64 / qps.max(1.0) * 1e6;
        for ((what, _), runs) in modes.iter().zip(costs) {
            let kept: Vec<f64> = runs.iter().map(|c| c.kept(lookup_us)).collect();
            let (ratio, met) = judged(median(&kept), median_interval(&kept), |r| {
                r >= CAPACITY_GOAL
            });
            let us = |f: fn(&Cost) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
            self.rows.push(Row {
                figure: format!("Agent: the capacity its CPU a lookup leaves at the lab's highest rate, estimated (the {} runs above, each from {} s after its start to 1 s before its end; its BPF programs' run time by bpf_stats, and its process's; against what a lookup costs the machine untraced: {cores} cores at the capacity windows' rate without it); {what}", runs.len(), COST_SETTLE.as_secs()),
                baseline: format!("{lookup_us:.1} µs a lookup"),
                with: format!(
                    "BPF {:.2} µs + process {:.2} µs a lookup",
                    us(Cost::bpf_us),
                    us(Cost::process_us)
                ),
                ratio,
                goal: "≥ 95%".into(),
                met: Some(met),
            });
        }
        self.note("The estimated capacity: each run's CPU a lookup under the agent, once the sampler has found its level (its BPF programs' run time, their own clock reads included and the kernel's dispatch to them not; its process's user and system time) added to what a lookup costs the machine untraced (from the median rate of the windows without the agent, its own spread left out of the interval), as a share of the machine; median of the runs, with the percentile bootstrap of that median. The windows above measure the same thing directly, through a rate that moves by tenths from one second to the next.");
    }

    /// `CPU_NAMES` names in the lab's cluster domain, answered by its
    /// resolvers themselves: as many as a node asks, about.
    fn many_names(&self) -> Result<PathBuf> {
        let names = self.dir.join("cpu-names.txt");
        let text: String = (0..CPU_NAMES)
            .map(|i| format!("n{i}.default.svc.cluster.local A\n"))
            .collect();
        std::fs::write(&names, text)?;
        Ok(names)
    }

    /// CPU per 1,000 lookups a second: the agent and `trace -o json` in
    /// turn at each rate.
    fn agent_cpu(&mut self, cap: f64) -> Result<()> {
        let secs = self.plan.side_secs;
        let listen = free_listen()?;
        // The agent follows a share of the names (--follow-max), a share
        // that a dozen names would make all or nothing.
        let names = self.many_names()?;
        for rate in CPU_RATES.map(|r| r.min((cap * 0.9 / 1000.0).floor() as u32 * 1000)) {
            let (mut agent_pct, mut trace_pct) = (Vec::new(), Vec::new());
            for (_, which) in turns(self.plan.output_rounds, 2) {
                let pct = if which == 0 {
                    let agent = self.agent_tracer(&listen, DNS_LOAD)?;
                    let pct = per_thousand(agent.pid(), &names, secs, rate)?;
                    agent.stop()?;
                    pct
                } else {
                    let tracer = self.tracer(&Hooks::Tracepoints, DNS_LOAD)?;
                    let pct = per_thousand(tracer.pid(), &names, secs, rate)?;
                    tracer.stop()?;
                    pct
                };
                eprintln!(
                    "bench: {rate} qps, {}: {pct:.2}% of a core per 1,000 lookups/s",
                    ["agent", "trace -o json"][which]
                );
                [&mut agent_pct, &mut trace_pct][which].push(pct);
                settle()?;
            }
            let (a, t) = (median(&agent_pct), median(&trace_pct));
            self.rows.push(Row {
                figure: format!(
                    "Agent: CPU per 1,000 lookups/s at {} qps offered (1,000 names; {secs} s × {}, medians), against `dnstrace trace -o json`",
                    thousands(f64::from(rate)),
                    agent_pct.len()
                ),
                baseline: format!("trace -o json: {t:.2}% of a core"),
                with: format!("agent: {a:.2}% of a core"),
                ratio: format!("{:.2}×", a / t.max(1e-9)),
                goal: format!("≤ {CPU_GOAL_PCT}% of a core"),
                met: Some((a <= CPU_GOAL_PCT).into()),
            });
        }
        Ok(())
    }

    /// RSS with `SERIES` series (a name each, `--metrics-query-names`),
    /// and the time a scrape of them takes.
    fn agent_memory(&mut self) -> Result<()> {
        let names = self.dir.join("names.txt");
        let mut f = File::create(&names)?;
        for i in 0..SERIES {
            writeln!(f, "n{i}.bench.example.com A")?;
        }
        drop(f);
        let listen = free_listen()?;
        // Every lookup followed, so that each name makes its series.
        let extra = [
            "--metrics-query-names",
            "--max-series",
            "20000",
            "--follow-max",
            "0",
        ];
        let agent = self.agent_tracer(&listen, &extra)?;
        let idle = status_kib(agent.pid(), "VmRSS:")? as f64 / 1024.0;
        let idle_anon = status_kib(agent.pid(), "RssAnon:")? as f64 / 1024.0;
        // Each name at least once: 2,000 a second for twice the names' time.
        let run = dnsperf(&names, (2 * SERIES / 2_000) as u32, Some(2_000))?;
        pause(Duration::from_millis(7_000))?;
        let page = scrape(&listen)?;
        let series = sample(&page, "dnstrace_metric_series").unwrap_or(0.0);
        let mut times = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            scrape(&listen)?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let rss = status_kib(agent.pid(), "VmRSS:")? as f64 / 1024.0;
        let anon = status_kib(agent.pid(), "RssAnon:")? as f64 / 1024.0;
        let exit = agent.stop()?;
        eprintln!("bench: agent with {series} series: {rss:.1} MiB; {run}; {exit}");
        self.rows.push(Row {
            figure: format!("Agent: RSS with {series} series (one per name asked in `dnstrace_lookup_names_total`, `--metrics-query-names --follow-max 0`; its defaults: 4 MiB ring, 16 MiB flight recorder)"),
            baseline: format!("idle: {idle:.1} MiB ({idle_anon:.1} anonymous)"),
            with: format!("{rss:.1} MiB ({anon:.1} anonymous)"),
            ratio: format!("{:.1}×", rss / idle.max(1e-9)),
            goal: format!("< {RSS_GOAL_MIB} MiB"),
            met: Some((rss < RSS_GOAL_MIB && series >= SERIES as f64).into()),
        });
        self.rows.push(Row {
            figure: format!(
                "Agent: a scrape of `/metrics` with {series} series ({} KiB; 20 scrapes, median)",
                page.len() / 1024
            ),
            baseline: "—".into(),
            with: format!(
                "{:.1} ms ({:.1}–{:.1})",
                median(&times),
                min(&times),
                max(&times)
            ),
            ratio: "—".into(),
            goal: "—".into(),
            met: None,
        });
        Ok(())
    }
}

/// From a run's start to where its cost is measured: the sampler's level
/// found (it starts keeping everything, and the load comes at once).
const COST_SETTLE: Duration = Duration::from_secs(2);

/// One whole dnsperf run at the lab's highest rate under `agent`, and the
/// agent's CPU a lookup in its steady part: from `COST_SETTLE` on to a
/// second before the end, the lookups from dnsperf's rate each second.
fn run_with_cost(agent: &Tracer, queries: &Path, secs: u32) -> Result<(PerfResult, Cost)> {
    let perf = stamped_dnsperf(queries, secs)?;
    let pid = agent.pid();
    pause(COST_SETTLE)?;
    let stats = BpfStats::enable()?;
    let (bpf0, cpu0, start) = (stats.programs(pid)?, proc_cpu(pid)?, unix_now());
    let steady = Duration::from_secs(u64::from(secs)).saturating_sub(COST_SETTLE);
    pause(steady.saturating_sub(Duration::from_secs(1)))?;
    let (bpf1, cpu1, end) = (stats.programs(pid)?, proc_cpu(pid)?, unix_now());
    drop(stats);
    let out = perf.wait(Duration::from_secs(u64::from(secs) + 30))?.output;
    let lookups = rate_between(&per_second(&out), start, end)? * (end - start);
    let cost = Cost {
        bpf_ns: run_ns(&bpf0, &bpf1) as f64,
        process_s: cpu1 - cpu0,
        lookups: lookups as u64,
    };
    Ok((parse_dnsperf(&out)?, cost))
}

/// dnsperf at the lab's highest rate for `secs`, stamping its rate each
/// second (`-S 1`, read by `per_second`).
fn stamped_dnsperf(queries: &Path, secs: u32) -> Result<Proc> {
    let mut cmd = dnsperf_cmd(queries, secs, None);
    cmd.args(["-S", "1"]);
    Proc::spawn("dnsperf", &mut cmd, Capture::Stdout)
}

/// The mean of dnsperf's rates stamped from a second after `start` to
/// `end` (a rate is stamped at its second's end).
fn rate_between(rates: &[(f64, f64)], start: f64, end: f64) -> Result<f64> {
    let inside: Vec<f64> = rates
        .iter()
        .filter(|(t, _)| *t >= start + 1.0 && *t <= end)
        .map(|&(_, r)| r)
        .collect();
    if inside.is_empty() {
        bail!("dnsperf stamped no whole second in {:.1} s", end - start);
    }
    Ok(mean(&inside))
}

/// The agent's CPU over part of a dnsperf run.
#[derive(Clone, Copy)]
struct Cost {
    bpf_ns: f64,
    process_s: f64,
    lookups: u64,
}

impl Cost {
    fn bpf_us(&self) -> f64 {
        self.bpf_ns / 1e3 / self.lookups.max(1) as f64
    }

    fn process_us(&self) -> f64 {
        self.process_s * 1e6 / self.lookups.max(1) as f64
    }

    /// The share of the machine's lookups kept, where one costs it
    /// `lookup_us` untraced.
    fn kept(&self, lookup_us: f64) -> f64 {
        lookup_us / (lookup_us + self.bpf_us() + self.process_us())
    }
}

/// dnstrace's CPU (process `pid`) while dnsperf offers `rate` for `secs`,
/// as percent of a core per 1,000 lookups a second answered.
fn per_thousand(pid: i32, queries: &Path, secs: u32, rate: u32) -> Result<f64> {
    let cpu0 = proc_cpu(pid)?;
    let run = dnsperf(queries, secs, Some(rate))?;
    let cpu = proc_cpu(pid)? - cpu0;
    Ok(cpu / f64::from(secs) * 100.0 / (run.qps / 1000.0).max(1e-9))
}

/// A loopback address with a port free now.
pub(super) fn free_listen() -> Result<String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.to_string())
}

/// The agent's `/metrics` page (HTTP/1.0, read to the end).
fn scrape(listen: &str) -> Result<String> {
    let mut s =
        std::net::TcpStream::connect(listen).with_context(|| format!("connecting to {listen}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("no HTTP answer"))?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        bail!("GET /metrics: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_owned())
}

/// A stretch of one dnsperf run, with the agent or without it, in seconds
/// since the epoch (dnsperf stamps its rates so).
struct Window {
    with: bool,
    start: f64,
    end: f64,
}

/// The rates of windows and each with-window's ratio to its neighbours.
#[derive(Debug, PartialEq)]
struct Windows {
    with: Vec<f64>,
    without: Vec<f64>,
    ratios: Vec<f64>,
}

impl Windows {
    /// Each window's mean rate over the seconds wholly inside it (a rate
    /// is stamped at its second's end), and each with-window's against
    /// the mean of the windows without it on either side.
    fn of(marks: &[Window], rates: &[(f64, f64)]) -> Result<Self> {
        let means = marks
            .iter()
            .map(|w| rate_between(rates, w.start, w.end))
            .collect::<Result<Vec<f64>>>()?;
        let mut w = Self {
            with: Vec::new(),
            without: Vec::new(),
            ratios: Vec::new(),
        };
        for (i, m) in marks.iter().enumerate() {
            if !m.with {
                w.without.push(means[i]);
                continue;
            }
            let around: Vec<f64> = [i.checked_sub(1), Some(i + 1)]
                .into_iter()
                .flatten()
                .filter(|&j| marks.get(j).is_some_and(|n| !n.with))
                .map(|j| means[j])
                .collect();
            if around.is_empty() {
                bail!("a window with the agent has none without it beside it");
            }
            w.with.push(means[i]);
            w.ratios.push(means[i] / mean(&around));
        }
        Ok(w)
    }
}

/// The mean of values, of which there is at least one.
fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// dnsperf's `-S` lines: (seconds since the epoch, queries a second).
fn per_second(out: &str) -> Vec<(f64, f64)> {
    out.lines()
        .filter_map(|l| {
            let (t, r) = l.split_once(": ")?;
            Some((t.trim().parse().ok()?, r.trim().parse().ok()?))
        })
        .collect()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The agent's default `--follow-max`.
const FOLLOW_MAX: u32 = 1_000;

/// The value of the sample `name` (no labels).
fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The sum of `dnstrace_lookups_total` over the series of pod `pod`.
fn lookups_of(page: &str, pod: &str) -> u64 {
    let label = format!("pod=\"{pod}\"");
    page.lines()
        .filter(|l| l.starts_with("dnstrace_lookups_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_cost_a_lookup_is_a_share_of_the_machine() {
        // 2 µs of BPF and 0.5 µs of process a lookup, over 1,000 lookups.
        let c = Cost {
            bpf_ns: 2_000_000.0,
            process_s: 0.000_5,
            lookups: 1_000,
        };
        assert!((c.bpf_us() - 2.0).abs() < 1e-9);
        assert!((c.process_us() - 0.5).abs() < 1e-9);
        // A lookup that costs the machine 47.5 µs untraced: 95% kept.
        assert!((c.kept(47.5) - 0.95).abs() < 1e-9);
    }

    fn w(with: bool, start: f64, end: f64) -> Window {
        Window { with, start, end }
    }

    #[test]
    fn dnsperfs_rate_lines_are_read_and_the_rest_left() {
        let out = "[Status] Sending queries (to 10.96.0.10:53)\n1795842723.435675: 28088.142305\n[Timeout] Query timed out: msg id 5177\n1795842724.437636: 30223.731263\n";
        assert_eq!(
            per_second(out),
            [
                (1795842723.435675, 28088.142305),
                (1795842724.437636, 30223.731263)
            ]
        );
    }

    #[test]
    fn each_window_with_the_agent_is_against_its_neighbours_without() {
        // Seconds 1-4 without, 6-9 with, 11-14 without; the second
        // stamped at a window's start is partly outside it.
        let rates: Vec<(f64, f64)> = (0..=14)
            .map(|t| {
                let r = match t {
                    0..=5 => 100.0,
                    6..=10 => 90.0,
                    _ => 80.0,
                };
                (f64::from(t), r)
            })
            .collect();
        let marks = [w(false, 0.0, 4.5), w(true, 5.0, 9.5), w(false, 10.0, 14.5)];
        let got = Windows::of(&marks, &rates).unwrap();
        assert_eq!(got.with, [90.0]);
        assert_eq!(got.without, [100.0, 80.0]);
        assert_eq!(got.ratios, [1.0]);
    }

    #[test]
    fn a_window_dnsperf_left_unstamped_is_an_error() {
        let marks = [w(false, 0.0, 0.5), w(true, 1.0, 3.0)];
        assert!(Windows::of(&marks, &[(2.0, 5.0)]).is_err());
    }
}
