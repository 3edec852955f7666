//! What attaching costs: start-up time, and the throughput of other
//! traffic (iperf3) with and without the hooks, with BPF run times.
use super::*;

impl Bench {
    pub(super) fn startup(&mut self) -> Result<()> {
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
            met: Some((med < 1.0).into()),
        });
        Ok(())
    }

    pub(super) fn iperf(&mut self) -> Result<()> {
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
        for (round, which) in turns(self.plan.iperf_rounds, modes.len() + 1) {
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
        let b = median(&base);
        let spread = |v: &[f64]| format!("{:.2}–{:.2}", min(v) / 1e9, max(v) / 1e9);
        for ((what, _), runs) in modes.iter().zip(&with) {
            let w = median(runs);
            let (ratio, met) = goal_ratio(&base, runs, 0.98);
            self.rows.push(Row {
                figure: format!(
                    "TCP throughput pod → pod through the node (iperf3, {secs} s × {}, medians), {what}",
                    base.len()
                ),
                baseline: format!("{} ({})", gbits(b), spread(&base)),
                with: format!("{} ({})", gbits(w), spread(runs)),
                ratio,
                goal: "≥ 98%".into(),
                met: Some(met),
            });
        }
        self.explain_intervals();
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
}
