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

    /// dnsperf at the lab's highest rate, alone and with the agent in
    /// turn (its defaults, and following 1 lookup in 1,024: the kernel's
    /// counting and little else); after each agent run, its count of web's
    /// lookups against the queries dnsperf sent. Each agent run is judged
    /// against its own round's baseline: the lab's rate drifts by a fifth
    /// over minutes, more than the agent's cost.
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
        let mut base = Vec::new();
        let mut with: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        let mut counts = Vec::new();
        let mut followed: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        for (round, which) in turns(self.plan.agent_rounds, 1 + modes.len()) {
            if which == 0 {
                let b = dnsperf(&self.queries(), secs, None)?;
                eprintln!("bench: agent round {}: baseline {b}", round + 1);
                base.push(b.qps);
                settle()?;
                continue;
            }
            let agent = self.agent_tracer(&listen, &modes[which - 1].1)?;
            let t = dnsperf(&self.queries(), secs, None)?;
            // Every query answered or past the timeout, and read.
            pause(Duration::from_millis(7_000))?;
            // The pod's name; WEB is its network namespace's.
            let pod = WEB.strip_prefix("dtlab-").unwrap_or(WEB);
            let page = scrape(&listen)?;
            let counted = lookups_of(&page, pod);
            let journeys = sample(&page, "dnstrace_journeys_total").unwrap_or(0.0);
            let exit = agent.stop()?;
            eprintln!(
                "bench: agent round {}: {t}; counted {counted} of {} sent; {exit}",
                round + 1,
                t.sent
            );
            with[which - 1].push(t.qps);
            counts.push((t.sent, counted, exit.lost));
            followed[which - 1].push(journeys / f64::from(secs));
            settle()?;
        }
        for ((what, _), with) in modes.iter().zip(&with) {
            let ratios: Vec<f64> = with.iter().zip(&base).map(|(w, b)| w / b).collect();
            let (ratio, met) = judged(median(&ratios), median_interval(&ratios), |r| {
                r >= CAPACITY_GOAL
            });
            self.rows.push(Row {
                figure: format!(
                    "Agent: DNS capacity at the lab's highest rate ({secs} s × {}, paired ratio; {what})",
                    base.len()
                ),
                baseline: format!("{} qps", thousands(median(&base))),
                with: format!("{} qps", thousands(median(with))),
                ratio,
                goal: "≥ 95%".into(),
                met: Some(met),
            });
        }
        self.explain_paired();
        let each: Vec<String> = followed[0].iter().map(|f| format!("{f:.0}/s")).collect();
        self.rows.push(Row {
            figure: format!("Agent: journeys followed whole a second at the lab's highest rate, its defaults (`--follow-max {FOLLOW_MAX}`), each run above"),
            baseline: "—".into(),
            with: each.join("; "),
            ratio: "—".into(),
            goal: format!("about {FOLLOW_MAX}/s, under {}/s", 2 * FOLLOW_MAX),
            met: Some(followed[0].iter().all(|&f| f < f64::from(2 * FOLLOW_MAX)).into()),
        });
        let exact = counts.iter().all(|&(sent, counted, _)| sent == counted);
        let each: Vec<String> = counts
            .iter()
            .map(|(sent, counted, lost)| format!("{counted} of {sent} ({lost} events lost)"))
            .collect();
        self.rows.push(Row {
            figure: "Agent: web's lookups in `dnstrace_lookups_total` against the queries dnsperf sent, each agent run above".into(),
            baseline: "dnsperf's own count".into(),
            with: each.join("; "),
            ratio: "—".into(),
            goal: "equal, events lost or not".into(),
            met: Some(exact.into()),
        });
        Ok(())
    }

    /// CPU per 1,000 lookups a second: the agent and `trace -o json` in
    /// turn at each rate.
    fn agent_cpu(&mut self, cap: f64) -> Result<()> {
        let secs = self.plan.side_secs;
        let listen = free_listen()?;
        // As many names as a node asks, about: the agent follows a share
        // of them by name (--follow-max), a share that a dozen names would
        // make all or nothing. Answered by the lab's resolvers themselves.
        let names = self.dir.join("cpu-names.txt");
        let text: String = (0..CPU_NAMES)
            .map(|i| format!("n{i}.default.svc.cluster.local A\n"))
            .collect();
        std::fs::write(&names, text)?;
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

/// dnstrace's CPU (process `pid`) while dnsperf offers `rate` for `secs`,
/// as percent of a core per 1,000 lookups a second answered.
fn per_thousand(pid: i32, queries: &Path, secs: u32, rate: u32) -> Result<f64> {
    let cpu0 = proc_cpu(pid)?;
    let run = dnsperf(queries, secs, Some(rate))?;
    let cpu = proc_cpu(pid)? - cpu0;
    Ok(cpu / f64::from(secs) * 100.0 / (run.qps / 1000.0).max(1e-9))
}

/// A loopback address with a port free now.
fn free_listen() -> Result<String> {
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
