//! What following every lookup costs (issue 57): `dnstrace trace --sample 1`
//! against `tcpdump -w` on the same lookups, in rounds that alternate which
//! goes first, and the events trace loses at twice that rate.
use super::*;

/// trace at most this many times tcpdump's CPU.
const TIMES_TCPDUMP: f64 = 5.0;
/// Twice the zero-loss rate: where trace should still lose nothing.
const DOUBLE_QPS: u32 = 2 * ZERO_LOSS_QPS;
/// Runs at twice the rate: one that lost nothing proved little (three
/// more of the same, by hand, lost 105,169, 5,030 and 102,649 events).
const DOUBLE_RUNS: usize = 3;
/// Every lookup followed, none sampled out.
const EVERY: &[&str] = &["--sample", "1"];
/// The issue's `trace --sample 1`: text lines, as trace writes them to a
/// file or a pipe (JSON costs more: the `outputs` figure has each).
const OUTPUT: Output = Output::Text;

impl Bench {
    pub(super) fn cost(&mut self) -> Result<()> {
        let secs = self.plan.cost_secs;
        let (mut dumped, mut traced) = (Vec::new(), Vec::new());
        let mut lost = Vec::new();
        for (round, which) in turns(self.plan.cost_rounds, 2) {
            if which == 0 {
                let d = self.dump(ZERO_LOSS_QPS, secs)?;
                eprintln!(
                    "bench: round {}: tcpdump {:.2} s CPU, {} dropped; {}",
                    round + 1,
                    d.cpu,
                    d.dropped,
                    d.perf
                );
                dumped.push(d.cpu);
            } else {
                let run = self.offer(ZERO_LOSS_QPS, secs, (OUTPUT, EVERY), false)?;
                eprintln!("bench: round {}: trace --sample 1 {run}", round + 1);
                lost.push(events_lost(&run));
                traced.push(run.cpu);
            }
            settle()?;
        }
        self.rows.push(times_row(secs, &dumped, &traced, &lost));
        let mut runs = Vec::new();
        for _ in 0..DOUBLE_RUNS {
            let run = self.offer(DOUBLE_QPS, secs, (OUTPUT, EVERY), false)?;
            eprintln!("bench: trace --sample 1 at {DOUBLE_QPS} qps: {run}");
            settle()?;
            runs.push(run);
        }
        self.rows.push(double_row(secs, &runs));
        self.notes.push(format!(
            "Issue 57's goals: rounds of {secs} s at {} qps, each tool alone in turn, the order turned each round; CPU is the process's user+system time while dnsperf ran (/proc/PID/stat): tcpdump in the node's namespace, dnstrace (`trace --sample 1 -o text`, the lines it writes to a file or a pipe, to /dev/null) in every namespace. The interval is the bootstrap's of the ratio of medians.",
            thousands(f64::from(ZERO_LOSS_QPS))
        ));
        Ok(())
    }
}

/// Events a run lost, at least.
fn events_lost(run: &Offered) -> u64 {
    match &run.exit {
        Ok(e) => e.lost,
        Err(lost) => *lost,
    }
}

fn times_row(secs: u32, dumped: &[f64], traced: &[f64], lost: &[u64]) -> Row {
    let ratio = median(traced) / median(dumped);
    let interval = ratio_interval(dumped, traced);
    let (_, met) = judged(ratio, interval, |r| r <= TIMES_TCPDUMP);
    let times = match interval {
        Some((lo, hi)) => format!("{ratio:.1}× (95% interval {lo:.1}–{hi:.1}×)"),
        None => format!("{ratio:.1}×"),
    };
    let spread = |v: &[f64]| format!("{:.2} s ({:.2}–{:.2})", median(v), min(v), max(v));
    Row {
        figure: format!(
            "`dnstrace trace --sample 1` against `tcpdump -i any -w` at {} qps: CPU while dnsperf ran ({secs} s × {}, alternating; medians)",
            thousands(f64::from(ZERO_LOSS_QPS)),
            dumped.len()
        ),
        baseline: format!("tcpdump: {}", spread(dumped)),
        with: format!(
            "trace: {}; events lost {}",
            spread(traced),
            lost.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
        ),
        ratio: times,
        goal: format!("≤ {TIMES_TCPDUMP}×"),
        met: Some(met),
    }
}

/// Met only if no run lost an event.
fn double_row(secs: u32, runs: &[Offered]) -> Row {
    let with = runs
        .iter()
        .map(|run| format!("{}; {:.1} s CPU", run.brief(), run.cpu))
        .collect::<Vec<_>>()
        .join(" / ");
    Row {
        figure: format!(
            "`dnstrace trace --sample 1` at {} qps offered ({secs} s × {}): events lost",
            thousands(f64::from(DOUBLE_QPS)),
            runs.len()
        ),
        baseline: "—".into(),
        with,
        ratio: "—".into(),
        goal: "0 events lost in every run".into(),
        met: Some(runs.iter().all(|run| events_lost(run) == 0).into()),
    }
}
