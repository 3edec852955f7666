//! User space alone, on one core: decode + correlate + rules over a
//! recording of lab load held in memory (`dnstrace/benches/pipeline.rs`),
//! and the whole replay of it (reading pcapng, writing JSON) beside it.
use super::*;

impl Bench {
    pub(super) fn pipeline(&mut self) -> Result<()> {
        let rate = self
            .rate
            .as_ref()
            .map(|r| r.rate)
            .or_else(|| self.capacity.map(|c| ((c * 0.5) as u32).max(1000)))
            // Alone (`--only pipeline`): the rate the goals name.
            .unwrap_or(ZERO_LOSS_QPS);
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
        let stages = self.stages(&file);
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
        let (with, met) = match stages {
            Ok(rate) => (
                format!("{} packet events/s", thousands(rate)),
                Met::from(rate >= PIPELINE_GOAL),
            ),
            Err(e) => (format!("not measured: {e:#}"), Met::No),
        };
        self.rows.push(Row {
            figure: format!("User-space pipeline: decode + correlate + rules over the recording in memory, one core (`benches/pipeline.rs`, median of {STAGE_PASSES} passes, per CPU-second)"),
            baseline: "—".into(),
            with,
            ratio: "—".into(),
            goal: "≥ 1,000,000/s".into(),
            met: Some(met),
        });
        self.rows.push(Row {
            figure: "The same file replayed end to end, one core: reading pcapng, JSON out (`taskset -c 0 dnstrace replay -o json`, median)".into(),
            baseline: "—".into(),
            with: format!(
                "{} packet events/s ({packets} packets in {:.2} s)",
                thousands(r),
                median(&wall)
            ),
            ratio: "—".into(),
            goal: "—".into(),
            met: None,
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
            "The pipeline figures use a {secs} s recording made during dnsperf at {} qps ({:.0} MB of pcapng). The first feeds its inputs, read into memory beforehand, through the decoder, the correlation engine and the rules, each journey counted instead of written. The end-to-end replay also reads and parses the file (twice: a first pass for its header and notes) and writes the journeys as JSON to /dev/null.",
            thousands(f64::from(rate)),
            size as f64 / 1e6
        ));
        Ok(())
    }

    /// The pipeline bench over `file`, pinned to core 0: its median rate.
    fn stages(&self, file: &Path) -> Result<f64> {
        self.stages_of(&self.stages, file)
    }

    /// The pipeline bench `exe` (this tree's, or REV's) over `file`, pinned
    /// to core 0: its median rate.
    pub(super) fn stages_of(&self, exe: &Path, file: &Path) -> Result<f64> {
        let run = Proc::spawn(
            "pipeline bench",
            Command::new("taskset")
                .args(["-c", "0"])
                .arg(exe)
                .arg(file)
                .arg(STAGE_PASSES.to_string()),
            // Its figures are on stdout.
            Capture::Stdout,
        )?;
        let ended = run.wait(Duration::from_secs(600))?;
        if ended.code != Some(0) {
            bail!("the pipeline bench failed ({:?})", ended.code);
        }
        for l in ended.output.lines().filter(|l| l.starts_with("pass: ")) {
            eprintln!("bench: {l}");
        }
        ended
            .output
            .lines()
            .find_map(|l| number_before(l.strip_prefix("median: ")?, " events/s"))
            .map(|r| r as f64)
            .ok_or_else(|| anyhow!("no `median: N events/s` line in {:?}", ended.output))
    }
}

/// Passes of the pipeline bench over the recording.
pub(super) const STAGE_PASSES: usize = 5;
