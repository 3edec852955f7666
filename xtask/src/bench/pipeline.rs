//! User space alone: a recording of lab load replayed on one core.
use super::*;

impl Bench {
    pub(super) fn pipeline(&mut self) -> Result<()> {
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
}
