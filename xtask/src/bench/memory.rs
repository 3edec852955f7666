//! Memory with lookups in flight (never answered), and over a soak.
use super::*;

impl Bench {
    pub(super) fn memory(&mut self) -> Result<()> {
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
        let mib = |key: &str| status_kib(pid, key).map(|k| k as f64 / 1024.0);
        // Idle before any lookup, once the memory start-up freed has gone
        // back to the kernel (dnstrace's allocator returns it after a second).
        pause(Duration::from_secs(3))?;
        let idle = (mib("VmRSS:")?, mib("RssAnon:")?);
        let ramp = timeout + 5;
        let total = ramp + self.plan.soak_secs;
        let sender = sender(rate, Duration::from_secs(u64::from(total)), stop.clone());
        let start = Instant::now();
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
        let losses = tracer.loss_times(start);
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
            met: Some((peak < RSS_GOAL_MIB && exit.evicted == 0).into()),
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
            met: Some(flat.into()),
        });
        self.notes.push(format!(
            "Lookups in flight: the lab's `upstream-timeout` fault drops the upstream's DNS with iptables, a drop dnstrace sees (it closes that leg at once), and the lab's CoreDNS (dnsmasq, `--dns-forward-max=1000`) answers REFUSED past 1,000 forwarded queries, so through kube-dns no more than about 2,000 lookups can be left waiting. The memory figure therefore sends {rate} queries/s of distinct names from default/web to a blackhole resolver in shop/checkout ({CHECKOUT_IP}:53, a socket that reads and never answers): {sent} sent, {received} received, each an open journey for {timeout} s. RSS samples, total/anonymous MiB: {}.{}",
            samples
                .iter()
                .map(|(t, r, a)| format!("{t} s {r:.0}/{a:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
            loss_note(&losses)
        ));
        Ok(())
    }
}

/// When events were lost (the first few warnings), for a loss to be traced
/// to what the machine was doing then.
fn loss_note(losses: &[(f64, u64)]) -> String {
    if losses.is_empty() {
        return String::new();
    }
    let mut said: Vec<String> = losses
        .iter()
        .take(8)
        .map(|(t, n)| format!("{t:.1} s ({} so far)", thousands(*n as f64)))
        .collect();
    if losses.len() > said.len() {
        said.push(format!("and {} more warnings", losses.len() - said.len()));
    }
    format!(" Events were lost at {}.", said.join(", "))
}

#[cfg(test)]
mod tests {
    use super::loss_note;

    #[test]
    fn loss_note_names_the_first_warnings_and_counts_the_rest() {
        assert_eq!(loss_note(&[]), "");
        let many: Vec<(f64, u64)> = (1..=10u32)
            .map(|i| (300.0 + f64::from(i), u64::from(i) * 1000))
            .collect();
        let note = loss_note(&many);
        assert!(
            note.starts_with(" Events were lost at 301.0 s (1,000 so far), 302.0 s"),
            "{note}"
        );
        assert!(
            note.ends_with("308.0 s (8,000 so far), and 2 more warnings."),
            "{note}"
        );
    }
}
