//! DNS under load: the lab's capacity with and without dnstrace, the highest
//! rate without loss, and tcpdump side by side.
use super::*;

/// One run of tcpdump under dnsperf.
pub(super) struct Dumped {
    /// Its CPU seconds while dnsperf ran.
    pub(super) cpu: f64,
    pub(super) captured: u64,
    pub(super) dropped: u64,
    pub(super) perf: PerfResult,
}

impl Bench {
    pub(super) fn query_file(&self) -> Result<()> {
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

    pub(super) fn queries(&self) -> PathBuf {
        self.dir.join("queries.txt")
    }

    /// The lab's highest rate without dnstrace, with its tracepoints (the
    /// goal's "tracing everything"), with tc on the node's devices (every
    /// DNS packet through the node, seen twice where the tracepoints see it
    /// about four times), and with the tracepoints' events read but left undecoded
    /// (the kernel side alone: the most any work in user space could keep),
    /// in an order that turns each round.
    pub(super) fn capacity(&mut self) -> Result<()> {
        let secs = self.plan.perf_secs;
        let modes = [
            Capacity {
                hooks: Hooks::Tracepoints,
                switches: &[],
                what: "`dnstrace trace -o json`",
                goal: true,
            },
            Capacity {
                hooks: Hooks::Tc(node_veths()?),
                switches: &[],
                what: "tc on the node's devices, `dnstrace trace --iface … -o json`",
                goal: false,
            },
            Capacity {
                hooks: Hooks::Tracepoints,
                switches: &["--discard-events"],
                what: "the kernel side alone: the tracepoints, their events read off the ring and dropped undecoded (`dnstrace-harness --discard-events`)",
                goal: false,
            },
        ];
        let mut base = Vec::new();
        let mut with: Vec<Traced> = modes.iter().map(|_| Traced::default()).collect();
        for (round, which) in turns(self.plan.perf_rounds, modes.len() + 1) {
            let Some(mode) = modes.get(which) else {
                let b = dnsperf(&self.queries(), secs, None)?;
                eprintln!("bench: round {}: baseline {b}", round + 1);
                base.push(b.qps);
                settle()?;
                continue;
            };
            let tracer = self.tracer_with(&mode.hooks, mode.switches, DNS_LOAD)?;
            let t = dnsperf(&self.queries(), secs, None)?;
            let exit = tracer.stop()?;
            let label = mode.label();
            eprintln!("bench: round {}: traced ({label}) {t}; {exit}", round + 1);
            with[which].add(t.qps, &exit);
            settle()?;
        }
        let b = median(&base);
        self.capacity = Some(b);
        let baseline = format!(
            "{} qps ({}–{})",
            thousands(b),
            thousands(min(&base)),
            thousands(max(&base))
        );
        for (mode, traced) in modes.iter().zip(&with) {
            let w = median(&traced.qps);
            let (ratio, met) = goal_ratio(&base, &traced.qps, 0.95);
            let met = mode.goal.then_some(met);
            self.rows.push(Row {
                figure: format!(
                    "DNS capacity: dnsperf at the lab's highest rate via kube-dns {SERVICE} ({secs} s × {}, medians; {})",
                    base.len(),
                    mode.what
                ),
                baseline: baseline.clone(),
                with: format!(
                    "{} qps ({}–{}; {} events lost, {} evicted)",
                    thousands(w),
                    thousands(min(&traced.qps)),
                    thousands(max(&traced.qps)),
                    traced.lost,
                    traced.evicted
                ),
                ratio,
                goal: if met.is_some() { "≥ 95%" } else { "—" }.into(),
                met,
            });
        }
        self.explain_intervals();
        Ok(())
    }

    pub(super) fn zero_loss(&mut self) -> Result<()> {
        let cap = self
            .capacity
            .ok_or_else(|| anyhow!("needs the lab's capacity, which was not measured"))?;
        let secs = self.plan.zero_secs;
        // dnstrace as a user starts it, with its default ring buffer,
        // limits and sampling. 20,000 first, whatever the lab's capacity (what dnstrace
        // loses there is worth knowing). Clean, then up in steps of 5,000 to the
        // lab's own rate until a run is not; else down through rates the
        // lab sustains without dnstrace until one is. A run stops at
        // dnstrace's first lost event; one the lab cannot keep up is not
        // clean either.
        let mut tried = Vec::new();
        let mut found = None;
        let mut climbing = None;
        let mut rates = vec![ZERO_LOSS_QPS];
        while let Some(rate) = rates.pop() {
            let run = self.offer(rate, secs, (Output::Json, DEFAULTS), true)?;
            eprintln!("bench: {rate} qps: {run}");
            tried.push(format!(
                "{} qps: {}",
                thousands(f64::from(rate)),
                run.brief()
            ));
            let clean = run.clean();
            if clean {
                found = Some(run);
            }
            settle()?;
            match climbing {
                None => {
                    climbing = Some(clean);
                    rates = if clean {
                        steps_up(cap)
                    } else {
                        steps_down(cap)
                    };
                }
                Some(up) if clean != up => break,
                Some(_) => {}
            }
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
            "Zero-loss runs ({secs} s each, stopped at dnstrace's first lost event; `dnstrace trace -o json` with its defaults: a 4 MiB ring buffer, `--sample auto`; a run is clean when it lost, evicted and left out nothing): {}. {lab_note}.",
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
                "Zero lost events and evicted journeys, sustained, with dnstrace's defaults: the highest rate without loss ({secs} s)"
            ),
            baseline: format!("lab's highest: {} qps", thousands(cap)),
            with,
            ratio: "—".into(),
            goal: "20,000 qps for 60 s, 0 lost, 0 evicted".into(),
            met: Some(met.into()),
        });
        self.rate = found;
        Ok(())
    }

    /// dnstrace tracing with `flags` while dnsperf offers `rate` for `secs`;
    /// with `stop_at_loss`, the run ends at the first event dnstrace loses.
    pub(super) fn offer(
        &self,
        rate: u32,
        secs: u32,
        (output, flags): (Output, &[&str]),
        stop_at_loss: bool,
    ) -> Result<Offered> {
        let tracer = self.tracer_showing(&Hooks::Tracepoints, output, flags)?;
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

    pub(super) fn tcpdump(&mut self) -> Result<()> {
        let found = self.rate.as_ref().map(|r| r.rate);
        let mut rates: Vec<u32> = found.into_iter().collect();
        if found != Some(ZERO_LOSS_QPS) {
            rates.push(ZERO_LOSS_QPS);
        }
        let secs = self.plan.side_secs;
        for rate in rates {
            let Dumped {
                cpu,
                captured,
                dropped,
                perf,
            } = self.dump(rate, secs)?;
            eprintln!("bench: tcpdump at {rate} qps: {captured} captured, {dropped} dropped, {cpu:.2} s CPU; {perf}");
            settle()?;
            let run = self.offer(rate, secs, (Output::Json, DNS_LOAD), false)?;
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

    /// `tcpdump -i any -w FILE port 53` in the node's namespace while
    /// dnsperf offers `rate` for `secs`: its CPU then, and its counts.
    pub(super) fn dump(&self, rate: u32, secs: u32) -> Result<Dumped> {
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
        Ok(Dumped {
            cpu,
            captured: count("packets captured"),
            dropped: count("packets dropped by kernel"),
            perf,
        })
    }

    /// dnstrace's CPU at the zero-loss rate by how it shows what it traces,
    /// with its defaults: the other figures trace with JSON lines, where an
    /// SRE on a node more often reads text or the live view.
    pub(super) fn outputs(&mut self) -> Result<()> {
        let outputs = [Output::Json, Output::Text, Output::View];
        let secs = self.plan.side_secs;
        let mut runs: Vec<Vec<Offered>> = outputs.iter().map(|_| Vec::new()).collect();
        for (_, which) in turns(self.plan.output_rounds, outputs.len()) {
            let output = outputs[which];
            let run = self.offer(ZERO_LOSS_QPS, secs, (output, &[]), false)?;
            eprintln!("bench: {} at {ZERO_LOSS_QPS} qps: {run}", output.describe());
            runs[which].push(run);
            settle()?;
        }
        let (json_cpu, json_lost) = cpu_and_lost(&runs[0]);
        for (output, runs) in outputs.iter().zip(&runs).skip(1) {
            let (cpu, lost) = cpu_and_lost(runs);
            self.rows.push(Row {
                figure: format!(
                    "dnstrace's CPU by output, {} qps offered for {secs} s (× {}, medians; its defaults): JSON lines vs {}",
                    thousands(f64::from(ZERO_LOSS_QPS)),
                    runs.len(),
                    output.describe()
                ),
                baseline: format!("JSON lines: {json_cpu:.1} s CPU, {json_lost} events lost"),
                with: format!("{cpu:.1} s CPU, {lost} events lost"),
                ratio: format!("{:.2}× CPU", cpu / json_cpu.max(1e-9)),
                goal: "—".into(),
                met: None,
            });
        }
        self.notes.push(
            "By output: the same dnsperf load traced three ways in turn: JSON lines and text lines to /dev/null, and the live view on a terminal the bench opens (200 × 50; what it draws is read and thrown away). CPU is the process's user+system time while dnsperf ran.".into(),
        );
        Ok(())
    }
}

impl Bench {
    /// At the lab's highest rate dnstrace falls behind: with `--sample 1`
    /// it goes on trying to follow every lookup and the kernel loses
    /// events from all of them; with its defaults it keeps fewer lookups,
    /// each whole. Rounds alternate.
    pub(super) fn overload(&mut self) -> Result<()> {
        let cap = self
            .capacity
            .ok_or_else(|| anyhow!("needs the lab's capacity, which was not measured"))?;
        let rate = (cap / 1000.0).round() as u32 * 1000;
        let secs = self.plan.side_secs;
        let sides: [&[&str]; 2] = [&["--sample", "1"], &["--sample", "auto"]];
        let mut runs: [Vec<Offered>; 2] = Default::default();
        for (_, which) in turns(self.plan.output_rounds, sides.len()) {
            let run = self.offer(rate, secs, (Output::Json, sides[which]), false)?;
            eprintln!("bench: overload, {}: {run}", sides[which].join(" "));
            runs[which].push(run);
            settle()?;
        }
        let [all, auto] = runs.map(|r| Overload::of(&r));
        self.rows.push(Row {
            figure: format!(
                "Overload: dnsperf at the lab's highest rate, {} qps for {secs} s (× {}, medians): every lookup kept (`--sample 1`) vs dnstrace's defaults (`--sample auto`)",
                thousands(f64::from(rate)),
                self.plan.output_rounds
            ),
            baseline: all.describe(),
            with: auto.describe(),
            ratio: format!("{:.2}× events lost", auto.lost / all.lost.max(1.0)),
            goal: "—".into(),
            met: None,
        });
        self.notes.push(
            "Overload: the same dnsperf load at the lab's highest rate, traced in turn with `--sample 1` (every lookup, the kernel losing events from all of them when dnstrace falls behind) and with dnstrace's defaults (fewer lookups kept, each whole, decided in the kernel before the ring). Journeys open while events were lost are marked incomplete; those open when the level changed and left out by it are left out whole.".into(),
        );
        Ok(())
    }
}

/// Medians of a side of the overload runs.
struct Overload {
    lost: f64,
    shed: f64,
    /// Each run's level at its end: a median of levels is none of them.
    one_in: Vec<u64>,
    journeys: f64,
    cpu: f64,
}

impl Overload {
    fn of(runs: &[Offered]) -> Self {
        let exits: Vec<&TraceExit> = runs.iter().filter_map(|r| r.exit.as_ref().ok()).collect();
        let med = |f: fn(&TraceExit) -> u64| {
            median(&exits.iter().map(|e| f(e) as f64).collect::<Vec<_>>())
        };
        Self {
            lost: med(|e| e.lost),
            shed: med(|e| e.shed),
            one_in: exits.iter().map(|e| e.one_in).collect(),
            journeys: med(|e| e.journeys),
            cpu: median(&runs.iter().map(|r| r.cpu).collect::<Vec<_>>()),
        }
    }

    fn describe(&self) -> String {
        let kept = if self.one_in.iter().any(|&n| n > 1) {
            let levels: Vec<String> = self.one_in.iter().map(u64::to_string).collect();
            format!(
                ", 1 lookup in {} kept at the end of each run ({:.0} packets left out in the kernel)",
                levels.join(" and "),
                self.shed
            )
        } else {
            String::new()
        };
        format!(
            "{:.0} events lost, {:.0} journeys{kept}, {:.1} s CPU",
            self.lost, self.journeys, self.cpu
        )
    }
}

/// The median CPU seconds of `runs`, and the events they lost in all.
fn cpu_and_lost(runs: &[Offered]) -> (f64, u64) {
    let cpu: Vec<f64> = runs.iter().map(|r| r.cpu).collect();
    let lost = runs
        .iter()
        .map(|r| match &r.exit {
            Ok(e) => e.lost,
            Err(lost) => *lost,
        })
        .sum();
    (median(&cpu), lost)
}

/// Rates above ZERO_LOSS_QPS up to the lab's `cap`, the next last.
fn steps_up(cap: f64) -> Vec<u32> {
    let mut up: Vec<u32> = (1..)
        .map(|k| ZERO_LOSS_QPS + 5_000 * k)
        .take_while(|&r| f64::from(r) <= cap)
        .collect();
    up.reverse();
    up
}

/// Rates below ZERO_LOSS_QPS the lab sustains, the next last.
fn steps_down(cap: f64) -> Vec<u32> {
    let mut down: Vec<u32> = [
        15_000, 12_000, 10_000, 8_000, 6_000, 5_000, 4_000, 3_000, 2_500, 2_000, 1_500, 1_000, 500,
    ]
    .into_iter()
    .filter(|&r| f64::from(r) <= cap * 0.9)
    .collect();
    down.reverse();
    down
}

/// One way of running dnstrace in the capacity rounds.
struct Capacity {
    hooks: Hooks,
    /// The layers' switches, set through dnstrace-harness.
    switches: &'static [&'static str],
    /// How the table names it.
    what: &'static str,
    /// Whether the 95% goal is this mode's.
    goal: bool,
}

impl Capacity {
    fn label(&self) -> String {
        match self.switches {
            [] => self.hooks.short().into(),
            switches => format!("{} {}", self.hooks.short(), switches.join(" ")),
        }
    }
}

/// One mode's traced rounds.
#[derive(Default)]
struct Traced {
    qps: Vec<f64>,
    lost: u64,
    evicted: u64,
}

impl Traced {
    fn add(&mut self, qps: f64, exit: &TraceExit) {
        self.qps.push(qps);
        self.lost += exit.lost;
        self.evicted += exit.evicted;
    }
}

/// dnstrace's own sampling, which the bench otherwise turns off.
const DEFAULTS: &[&str] = &["--sample", "auto"];

/// Rates of the defaults figure: about 40% and 60% of the lab's highest.
const DEFAULTS_QPS: [u32; 2] = [20_000, 30_000];

impl Bench {
    /// Below the lab's highest rate, dnstrace's defaults should keep every
    /// lookup wherever nothing would be lost: rounds alternate them with
    /// `--sample 1` at each rate, and count the runs that sampled, how far,
    /// and the events lost.
    pub(super) fn defaults(&mut self) -> Result<()> {
        let secs = self.plan.defaults_secs;
        let rounds = self.plan.defaults_rounds;
        let sides: [&[&str]; 2] = [&["--sample", "1"], DEFAULTS];
        for rate in DEFAULTS_QPS {
            let mut runs: [Vec<Offered>; 2] = Default::default();
            for (_, which) in turns(rounds, sides.len()) {
                let run = self.offer(rate, secs, (Output::Json, sides[which]), false)?;
                eprintln!("bench: {rate} qps, {}: {run}", sides[which].join(" "));
                runs[which].push(run);
                settle()?;
            }
            let [every, auto] = runs.map(|r| Defaults::of(&r));
            let goal = rate == ZERO_LOSS_QPS;
            self.rows.push(Row {
                figure: format!(
                    "Defaults below overload: {} qps for {secs} s (× {rounds} each, alternating): `--sample 1` vs dnstrace's defaults",
                    thousands(f64::from(rate))
                ),
                baseline: format!("`--sample 1`: {}", every.describe()),
                with: format!("defaults: {}", auto.describe()),
                ratio: "—".into(),
                goal: if goal {
                    "every lookup kept in as many runs as `--sample 1` loses nothing".into()
                } else {
                    "—".into()
                },
                met: goal.then(|| (auto.whole >= every.whole).into()),
            });
        }
        self.notes.push(
            "Defaults below overload: the same dnsperf load traced in turn with `--sample 1` and with dnstrace's defaults (`--sample auto`). A run is whole when it lost no event and sampling left nothing out; 'sampled' counts the runs where the defaults kept fewer lookups at any time, with the fewest kept.".into(),
        );
        Ok(())
    }
}

/// One side of the defaults figure, over its runs.
struct Defaults {
    runs: usize,
    /// Runs that lost no event and left nothing out.
    whole: usize,
    /// Runs that kept fewer lookups at some time, and the fewest kept.
    sampled: usize,
    deepest: u64,
    lost: u64,
    shed: u64,
    cpu: f64,
}

impl Defaults {
    fn of(runs: &[Offered]) -> Self {
        let exits: Vec<&TraceExit> = runs.iter().filter_map(|r| r.exit.as_ref().ok()).collect();
        Self {
            runs: runs.len(),
            whole: exits.iter().filter(|e| e.lost == 0 && e.shed == 0).count(),
            sampled: exits.iter().filter(|e| e.deepest > 1).count(),
            deepest: exits.iter().map(|e| e.deepest).max().unwrap_or(1),
            lost: cpu_and_lost(runs).1,
            shed: exits.iter().map(|e| e.shed).sum(),
            cpu: median(&runs.iter().map(|r| r.cpu).collect::<Vec<_>>()),
        }
    }

    fn describe(&self) -> String {
        let sampled = match self.sampled {
            0 => "never sampled".to_owned(),
            n => format!(
                "sampled in {n} (down to 1 lookup in {}, {} packets left out)",
                self.deepest, self.shed
            ),
        };
        format!(
            "{}/{} runs whole, {sampled}, {} events lost in all, {:.1} s CPU (median)",
            self.whole, self.runs, self.lost, self.cpu
        )
    }
}
