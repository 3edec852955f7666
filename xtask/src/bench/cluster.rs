//! The cluster view (issue 54) on the lab's cluster, which the merge
//! figure builds: what streaming the lookups a view watches adds to the
//! agents' CPU, and what their API adds with no viewer (nothing, it
//! should be); the lookups a second the view keeps up with from three
//! nodes; the lag from a lookup's answer to its line in the view; and the
//! clock offsets it estimated, where the truth is 0 (the nodes share one
//! kernel).
use super::{agent::free_listen, merge::node_flags, *};

/// The nodes' client pods (dnstrace/src/lab/cluster.rs), all watched.
const CLIENTS: [&str; 3] = ["10.244.1.10", "10.244.2.10", "10.244.3.10"];
/// A name CoreDNS answers itself, absolute: no search list, so each
/// lookup is an A and an AAAA query.
const NAME: &str = "kube-dns.kube-system.svc.cluster.local.";
/// Lookups a second per client pod while the CPU figure measures.
const CPU_RATE: u32 = 200;
/// Lookups a second per client pod the view is tried at, in turn.
const LADDER: [u32; 4] = [100, 300, 600, 1_000];
/// What keeping up is: as many journeys as queries, within a hundredth
/// (fewer: some not shown; more: lookups shown in halves, released by
/// the window before every node had got past them), none incomplete,
/// nothing dropped, and the lag's 99th percentile under `LAG_KEPT_MS`.
const KEPT: f64 = 0.01;
/// The view's window (1 s) and a tick of each agent's, and room.
const LAG_KEPT_MS: f64 = 2_000.0;

/// How the agents run in a round of the CPU figure.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    NoApi,
    Idle,
    Viewed,
}

impl Side {
    const ALL: [Self; 3] = [Self::NoApi, Self::Idle, Self::Viewed];

    fn describe(self) -> &'static str {
        match self {
            Self::NoApi => "agents with --no-api",
            Self::Idle => "agents serving the API, no viewer",
            Self::Viewed => "agents streaming to a view of every client",
        }
    }
}

/// One agent per node, as the DaemonSet runs each.
struct Agents {
    procs: Vec<Proc>,
    apis: Vec<String>,
}

impl Agents {
    fn cpu(&self) -> Result<f64> {
        self.procs.iter().map(|p| proc_cpu(p.pid)).sum()
    }

    fn stop(self) -> Result<()> {
        for p in self.procs {
            let ended = p.stop(libc::SIGTERM, Duration::from_secs(60))?;
            if ended.code != Some(0) {
                bail!("an agent failed: {}", ended.output.trim());
            }
        }
        Ok(())
    }
}

/// What a round's lookups were: queries sent by the watched clients, and
/// lookups answered.
struct Sent {
    queries: u64,
    answered: u64,
}

/// A view's end: its journeys and each one's lag, its dropped events, and
/// its clocks line.
struct Viewed {
    /// The view's own CPU seconds.
    cpu: f64,
    journeys: u64,
    incomplete: u64,
    lags_ms: Vec<f64>,
    dropped: bool,
    stderr: String,
}

impl Bench {
    pub(super) fn cluster(&mut self) -> Result<()> {
        step("the lab as three nodes (dnstrace lab up --nodes 3)");
        let _lab = Lab::up(&self.bin, &["--nodes", "3"])?;
        let nodes = node_flags(&self.bin)?;
        self.cluster_cpu(&nodes)?;
        self.cluster_ladder(&nodes)
    }

    /// Paired rounds of the three sides, alternating: the agents' CPU
    /// while the clients look up at `CPU_RATE`.
    fn cluster_cpu(&mut self, nodes: &[(String, Vec<String>)]) -> Result<()> {
        let secs = self.plan.cluster_secs;
        let mut cpu: [Vec<f64>; 3] = Default::default();
        let mut streamed = Vec::new();
        for (round, side) in turns(self.plan.cluster_rounds, 3) {
            let side = Side::ALL[side];
            let agents = self.agents(nodes, side != Side::NoApi)?;
            let view = (side == Side::Viewed)
                .then(|| self.view(&agents))
                .transpose()?;
            let before = agents.cpu()?;
            let sent = self.lookups(CPU_RATE, secs)?;
            let used = agents.cpu()? - before;
            if let Some(view) = view {
                let v = self.finish(view)?;
                streamed.push((used, v.journeys));
            }
            agents.stop()?;
            eprintln!(
                "bench: cluster round {}: {}: {used:.2} s CPU, {} lookups answered",
                round + 1,
                side.describe(),
                sent.answered
            );
            cpu[side as usize].push(used);
        }
        let [none, idle, viewed] = &cpu;
        let (ratio, _) = judged_ratio(none, idle, |_| true);
        self.rows.push(Row {
            figure: format!("Cluster view: the three agents' CPU with the API on and no viewer, against `--no-api`, while every node's client looks up {CPU_RATE} names a second for {secs} s ({} rounds each, alternating, medians)", none.len()),
            baseline: format!("`--no-api`: {:.2} s", median(none)),
            with: format!("API, no viewer: {:.2} s", median(idle)),
            ratio,
            goal: "1.00 (nothing added)".into(),
            met: None,
        });
        let per: Vec<f64> = streamed
            .iter()
            .zip(idle)
            .map(|((used, journeys), idle)| (used - idle) * 1e6 / (*journeys).max(1) as f64)
            .collect();
        self.rows.push(Row {
            figure: "Cluster view: the agents' CPU added per query streamed to a view watching every client (the viewed rounds' CPU less the idle rounds', over the journeys the view showed)".into(),
            baseline: format!("no viewer: {:.2} s", median(idle)),
            with: format!("viewed: {:.2} s, {} journeys a round", median(viewed), thousands(median(&streamed.iter().map(|s| s.1 as f64).collect::<Vec<_>>()))),
            ratio: format!("{:.1} µs a query (rounds {:.1} to {:.1})", median(&per), min(&per), max(&per)),
            goal: "—".into(),
            met: None,
        });
        Ok(())
    }

    /// The view of every client at each rate of `LADDER`: what it showed
    /// against the queries sent, its lag, and its clocks.
    fn cluster_ladder(&mut self, nodes: &[(String, Vec<String>)]) -> Result<()> {
        let secs = self.plan.cluster_secs;
        let mut kept = None;
        let mut lag_rows = Vec::new();
        let mut clocks = String::new();
        for rate in LADDER {
            let agents = self.agents(nodes, true)?;
            let view = self.view(&agents)?;
            let sent = self.lookups(rate, secs)?;
            let v = self.finish(view)?;
            agents.stop()?;
            let share = v.journeys as f64 / sent.queries.max(1) as f64;
            let ok = (share - 1.0).abs() <= KEPT
                && !v.dropped
                && v.incomplete == 0
                && percentile(&v.lags_ms, 0.99) < LAG_KEPT_MS;
            eprintln!(
                "bench: cluster view at {rate}/s a pod: {} journeys of {} queries, {} incomplete, dropped {}, lag p50 {:.0} ms p99 {:.0} ms, the view's CPU {:.2} s",
                v.journeys, sent.queries, v.incomplete, v.dropped,
                percentile(&v.lags_ms, 0.5), percentile(&v.lags_ms, 0.99), v.cpu
            );
            lag_rows.push(format!(
                "{} queries/s: p50 {:.0} ms, p99 {:.0} ms (the view's CPU {:.0} µs a journey)",
                thousands(sent.queries as f64 / f64::from(secs)),
                percentile(&v.lags_ms, 0.5),
                percentile(&v.lags_ms, 0.99),
                v.cpu * 1e6 / v.journeys.max(1) as f64
            ));
            clocks = v.stderr;
            if !ok {
                break;
            }
            kept = Some(sent.queries as f64 / f64::from(secs));
        }
        self.rows.push(Row {
            figure: format!("Cluster view: the queries a second it keeps up with from three nodes (one journey a query within 1%, none incomplete, no event dropped, lag p99 under {:.0} s), tried at {} lookups a second a client in turn until one fails, {secs} s each, three clients", LAG_KEPT_MS / 1e3, LADDER.map(|r| r.to_string()).join(", ")),
            baseline: "—".into(),
            with: kept.map_or("not even the first rate".into(), |q| format!("{} queries/s", thousands(q))),
            ratio: "—".into(),
            goal: "—".into(),
            met: None,
        });
        self.rows.push(Row {
            figure: "Cluster view: the lag from a query's answer at its client to its line in the view (the view's time line is node 1's kernel clock, which the bench reads too)".into(),
            baseline: "—".into(),
            with: lag_rows.join("; "),
            ratio: "—".into(),
            goal: "—".into(),
            met: None,
        });
        self.view_clock_row(&clocks)
    }

    /// Agents on every node, each with its API on loopback (or none).
    fn agents(&self, nodes: &[(String, Vec<String>)], api: bool) -> Result<Agents> {
        let mut agents = Agents {
            procs: Vec::new(),
            apis: Vec::new(),
        };
        for (node, flags) in nodes {
            let mut cmd = Command::new(&self.bin);
            cmd.args(["agent", "--metrics-addr", &free_listen()?])
                .args(flags)
                .arg("--flight-dir")
                .arg(self.dir.join(format!("flights-{node}")));
            if api {
                let at = free_listen()?;
                cmd.args(["--api-addr", &at]);
                agents.apis.push(at);
            } else {
                cmd.arg("--no-api");
            }
            let proc = Proc::spawn("dnstrace agent", &mut cmd, Capture::Lines)?;
            proc.wait_line("capturing DNS on port", Duration::from_secs(60))?;
            agents.procs.push(proc);
        }
        Ok(agents)
    }

    /// `dnstrace cluster` of every client over `agents`, JSON lines read
    /// as they come, once every node's stream is open.
    /// Its stderr goes to `view-stderr.txt`.
    fn view(&self, agents: &Agents) -> Result<Proc> {
        let ready = self.dir.join("view-ready.json");
        let _ = std::fs::remove_file(&ready);
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#"exec "$0" "$@" 2>"$VIEW_STDERR""#)
            .env("VIEW_STDERR", self.dir.join("view-stderr.txt"))
            .arg(&self.bin)
            .args(["cluster", "--agents", &agents.apis.join(","), "-o", "json"])
            .arg("--ready-file")
            .arg(&ready);
        for ip in CLIENTS {
            cmd.args(["--ip", ip]);
        }
        let proc = Proc::spawn("dnstrace cluster", &mut cmd, Capture::Stdout)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready.exists() {
            if Instant::now() > deadline || !alive(proc.pid) {
                bail!("the cluster view did not open its streams");
            }
            pause(Duration::from_millis(50))?;
        }
        Ok(proc)
    }

    /// `lab traffic` from every client at `rate` for `secs`, then time for
    /// the last answers to reach the view.
    fn lookups(&self, rate: u32, secs: u32) -> Result<Sent> {
        let out = output(Command::new(&self.bin).args([
            "lab",
            "traffic",
            "--name",
            NAME,
            "--rate",
            &rate.to_string(),
            "--duration",
            &format!("{secs}s"),
            "-o",
            "json",
        ]))?;
        let mut sent = Sent {
            queries: 0,
            answered: 0,
        };
        for l in out.lines() {
            let Ok(o) = serde_json::from_str::<serde_json::Value>(l) else {
                continue;
            };
            sent.queries += o["queries"].as_u64().unwrap_or(0);
            sent.answered += u64::from(o["ok"] == true);
        }
        // The view's window, and the agents' next ticks.
        pause(Duration::from_secs(3))?;
        Ok(sent)
    }

    /// The offsets the view estimated (its `{"event":"clocks"}` line).
    fn view_clock_row(&mut self, stderr: &str) -> Result<()> {
        let each = merge::offsets(&merge::clocks_line(stderr)?);
        self.rows.push(Row {
            figure: "Cluster view: the clock offsets it estimated at the end of the last run, from the messages that crossed between nodes in its last ten seconds (the truth is 0: the lab's nodes share one kernel's clock)".into(),
            baseline: "0 µs".into(),
            with: if each.is_empty() {
                "no offset estimated: no message crossed both ways".into()
            } else {
                each.join(", ")
            },
            ratio: "—".into(),
            goal: "—".into(),
            met: None,
        });
        Ok(())
    }
}

impl Bench {
    /// Stops a view (Ctrl-C) and reads what it showed: each journey's lag
    /// is when its line came, on CLOCK_MONOTONIC, less its end on the
    /// view's time line (node 1's kernel clock, CLOCK_MONOTONIC too).
    fn finish(&self, view: Proc) -> Result<Viewed> {
        let (now_mono, now) = (monotonic_ns(), Instant::now());
        let lines = view.lines.lock().unwrap().clone();
        let ended = view.stop(libc::SIGINT, Duration::from_secs(60))?;
        let stderr = std::fs::read_to_string(self.dir.join("view-stderr.txt"))?;
        if ended.code != Some(0) {
            bail!("the cluster view failed: {}", stderr.trim());
        }
        let mut v = Viewed {
            cpu: ended.cpu,
            journeys: 0,
            incomplete: 0,
            lags_ms: Vec::new(),
            dropped: stderr.contains("events for this view"),
            stderr,
        };
        for (at, line) in lines {
            let Ok(j) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if j["type"] != "journey" {
                continue;
            }
            v.journeys += 1;
            v.incomplete += u64::from(j["incomplete"] == true);
            let Some(end) = j["ended_ns"].as_u64() else {
                continue;
            };
            let came = now_mono as f64 - now.duration_since(at).as_nanos() as f64;
            v.lags_ms.push((came - end as f64) / 1e6);
        }
        Ok(v)
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The `q` quantile of `v` (nearest rank); NaN for none.
fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_ranks() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert!(percentile(&[], 0.5).is_nan());
    }
}
