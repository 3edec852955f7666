//! Several nodes' recordings replayed as one (issue 36): the merge's
//! throughput against each file replayed alone, and the clock offsets it
//! estimated, on the lab's cluster, whose nodes share one kernel's clock.
//!
//! It rebuilds the lab as three nodes, so it runs last.
use super::*;

/// The cluster's nodes.
const NODES: &str = "3";

/// A replay's end: its packets (its exit line), and its CPU seconds
/// (user + system), which the machine's other work touches less than
/// its wall time.
struct Replayed {
    packets: u64,
    cpu: f64,
    /// Its stderr: the clocks line of a merged one.
    output: String,
}

impl Bench {
    pub(super) fn merge(&mut self) -> Result<()> {
        step("rebuilding the lab as three nodes (dnstrace lab up --nodes 3)");
        let _lab = Lab::up(&self.bin, &["--nodes", NODES])?;
        let files = self.record_nodes()?;
        let (mut single, mut merged, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let mut last = None;
        for (round, side) in turns(self.plan.merge_rounds, 2) {
            let r = if side == 0 {
                let alone = files
                    .iter()
                    .map(|f| self.replay(std::slice::from_ref(f)))
                    .collect::<Result<Vec<_>>>()?;
                Replayed {
                    packets: alone.iter().map(|r| r.packets).sum(),
                    cpu: alone.iter().map(|r| r.cpu).sum(),
                    output: String::new(),
                }
            } else {
                self.replay(&files)?
            };
            eprintln!(
                "bench: merge round {}: {} replayed {} packets in {:.2} s CPU",
                round + 1,
                ["each file alone,", "the three merged"][side],
                r.packets,
                r.cpu
            );
            [&mut single, &mut merged][side].push((r.packets, r.cpu));
            if side == 1 {
                last = Some(r);
            }
            if single.len() == merged.len() {
                let rate = |(p, s): (u64, f64)| p as f64 / s;
                ratios.push(rate(merged[round]) / rate(single[round]));
            }
        }
        let merged_last = last.ok_or_else(|| anyhow!("no merged replay ran"))?;
        self.merge_rows(&single, &merged, &ratios)?;
        self.clock_row(&merged_last.output)
    }

    /// One dnstrace per node (the flags `lab status` gives it), each
    /// recording its node, while `lab traffic` drives every node's client.
    fn record_nodes(&mut self) -> Result<Vec<PathBuf>> {
        let (rate, secs) = (self.plan.merge_rate, self.plan.merge_secs);
        let mut tracers = Vec::new();
        let mut files = Vec::new();
        for (node, flags) in node_flags(&self.bin)? {
            let file = self.dir.join(format!("{node}.pcapng"));
            let mut cmd = Command::new(&self.bin);
            cmd.args(["trace", "-o", "json", "--sample", "1"])
                .args(DNS_LOAD)
                .args(&flags)
                .arg("--record")
                .arg(&file);
            let proc = Proc::spawn("dnstrace trace", &mut cmd, Capture::Lines)?;
            proc.wait_line("capturing DNS on port", Duration::from_secs(30))?;
            tracers.push((
                node,
                Tracer {
                    proc,
                    startup: Duration::ZERO,
                },
            ));
            files.push(file);
        }
        let traffic = output(Command::new(&self.bin).args([
            "lab",
            "traffic",
            "--rate",
            &rate.to_string(),
            "--duration",
            &format!("{secs}s"),
            "-o",
            "json",
        ]))?;
        let (mut answered, mut failed) = (0, 0);
        for l in traffic.lines() {
            let ok = serde_json::from_str::<serde_json::Value>(l).map(|v| v["ok"] == true);
            match ok {
                Ok(true) => answered += 1,
                Ok(false) => failed += 1,
                Err(_) => {}
            }
        }
        // Every lookup answered or given up, and its packets read.
        pause(Duration::from_secs(4))?;
        let mut said = Vec::new();
        for (node, tracer) in tracers {
            let exit = tracer.stop()?;
            eprintln!("bench: {node}: {exit}");
            let mb = std::fs::metadata(self.dir.join(format!("{node}.pcapng")))
                .map_or(0.0, |m| m.len() as f64 / 1e6);
            said.push(format!(
                "{node} {} packets ({mb:.0} MB, {} events lost)",
                thousands(exit.packets as f64),
                exit.lost
            ));
        }
        self.notes.push(format!(
            "The merge figures use one recording per node of the lab's cluster (`lab up --nodes 3`), made at once by three `dnstrace trace --node nodeN … --sample 1 --record`, the flags `lab status` gives, while `lab traffic --rate {rate} --duration {secs}s` drove each node's client pod ({} lookups answered, {} failed, as `lab traffic` counts them): {}. Each round replays each file alone in turn and the three merged (`taskset -c 0 dnstrace replay -o json`, JSON to /dev/null); one round's ratio is its merged rate over its single files' (their packets over their summed CPU seconds, user + system: on a shared machine the wall time counts the waits for a core too).",
            thousands(f64::from(answered)),
            thousands(f64::from(failed)),
            said.join(", ")
        ));
        Ok(files)
    }

    /// `dnstrace replay -o json` of `files`, on one core, JSON to /dev/null.
    fn replay(&self, files: &[PathBuf]) -> Result<Replayed> {
        let replay = Proc::spawn(
            "dnstrace replay",
            Command::new("taskset")
                .args(["-c", "0"])
                .arg(&self.bin)
                .arg("replay")
                .args(files)
                .args(["-o", "json"]),
            Capture::Lines,
        )?;
        let ended = replay.wait(Duration::from_secs(600))?;
        if ended.code != Some(0) {
            bail!("dnstrace replay failed: {}", ended.output.trim());
        }
        let packets = ended
            .output
            .lines()
            .find_map(|l| number_before(l.strip_prefix("dnstrace: replayed ")?, " DNS packets"))
            .ok_or_else(|| anyhow!("no `replayed N DNS packets` line in {:?}", ended.output))?;
        Ok(Replayed {
            packets,
            cpu: ended.cpu,
            output: ended.output,
        })
    }

    /// The rates of both sides, and the paired ratio merged/single.
    fn merge_rows(
        &mut self,
        single: &[(u64, f64)],
        merged: &[(u64, f64)],
        ratios: &[f64],
    ) -> Result<()> {
        let rates =
            |v: &[(u64, f64)]| -> Vec<f64> { v.iter().map(|&(p, s)| p as f64 / s).collect() };
        let (s, m) = (rates(single), rates(merged));
        let packets = |v: &[(u64, f64)]| v.first().map_or(0, |r| r.0);
        if packets(single) != packets(merged) {
            bail!(
                "the merge replayed {} packets, the files alone {}",
                packets(merged),
                packets(single)
            );
        }
        let cpu = |v: &[(u64, f64)]| median(&v.iter().map(|r| r.1).collect::<Vec<_>>());
        let (ratio, _) = judged(median(ratios), median_interval(ratios), |_| true);
        self.rows.push(Row {
            figure: format!(
                "Merged replay: three nodes' recordings as one (clock estimate, k-way merge), against each file replayed alone, one core, per CPU-second ({} packets; {} rounds, alternating, medians; the ratio the median of the rounds' own)",
                thousands(packets(merged) as f64),
                ratios.len()
            ),
            baseline: format!(
                "each alone: {} packet events/s ({:.2} s CPU for the three)",
                thousands(median(&s)),
                cpu(single)
            ),
            with: format!(
                "merged: {} packet events/s ({:.2} s CPU)",
                thousands(median(&m)),
                cpu(merged)
            ),
            ratio,
            goal: "—".into(),
            met: None,
        });
        Ok(())
    }

    /// The offsets the merge estimated (its `{"event":"clocks"}` line),
    /// where the truth is 0: the nodes share one kernel.
    fn clock_row(&mut self, replay_stderr: &str) -> Result<()> {
        let nodes = clocks_line(replay_stderr)?;
        let each = offsets(&nodes);
        let worst = nodes
            .iter()
            .filter_map(|n| n["offset_us"].as_f64())
            .map(f64::abs)
            .fold(0.0, f64::max);
        self.rows.push(Row {
            figure: "Merged replay: the clock offsets it estimated, NTP-style from messages that crossed both ways (the truth is 0: the lab's nodes share one kernel's clock)".into(),
            baseline: "0 µs".into(),
            with: if each.is_empty() {
                "no offset estimated: no message crossed both ways".into()
            } else {
                format!("{}; largest error {worst:.1} µs", each.join(", "))
            },
            ratio: "—".into(),
            goal: "—".into(),
            met: None,
        });
        Ok(())
    }
}

/// Each node's name and the dnstrace flags `lab status` gives for it
/// ("node node2: …; trace it with --node node2 --node-netns …").
pub(super) fn node_flags(bin: &Path) -> Result<Vec<(String, Vec<String>)>> {
    let status = output(Command::new(bin).args(["lab", "status"]))?;
    let nodes = parse_node_flags(&status);
    if nodes.is_empty() {
        bail!("`lab status` names no node of a cluster: {}", status.trim());
    }
    Ok(nodes)
}

fn parse_node_flags(status: &str) -> Vec<(String, Vec<String>)> {
    status
        .lines()
        .filter_map(|l| {
            let (head, flags) = l.strip_prefix("node ")?.split_once("; trace it with ")?;
            let name = head.split(':').next()?.to_owned();
            Some((name, flags.split_whitespace().map(str::to_owned).collect()))
        })
        .collect()
}

/// Each node estimated against another, from a clocks line's nodes:
/// `node2 -0.2 µs off node1 (572 messages)`.
pub(super) fn offsets(nodes: &[serde_json::Value]) -> Vec<String> {
    nodes
        .iter()
        .filter_map(|n| {
            let against = n["against"].as_str()?;
            Some(format!(
                "{} {:+.1} µs off {against} ({} messages)",
                n["node"].as_str().unwrap_or("?"),
                n["offset_us"].as_f64().unwrap_or(f64::NAN),
                n["pairs"]
            ))
        })
        .collect()
}

/// The nodes of a merged replay's `{"event":"clocks"}` line.
pub(super) fn clocks_line(stderr: &str) -> Result<Vec<serde_json::Value>> {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["event"] == "clocks")
        .and_then(|v| v["nodes"].as_array().cloned())
        .ok_or_else(|| anyhow!("the merged replay printed no clocks line: {stderr:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_flags_come_from_lab_status() {
        let status = "namespaces: dtlab-node1 dtlab-node2\n\
            node node1: netns dtlab-node1, containerd socket /run/x/node1/cri/containerd.sock; trace it with --node node1 --node-netns /run/netns/dtlab-node1 --containerd-root /run/x/node1/containerd --cri-socket /run/x/node1/cri/containerd.sock\n\
            node node2: netns dtlab-node2, containerd socket /s2; trace it with --node node2 --node-netns /run/netns/dtlab-node2\n\
            pod default/web: sandbox abc ips 10.244.1.10 netns /x\n";
        let nodes = parse_node_flags(status);
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].0, "node1");
        assert_eq!(
            nodes[0].1[..4],
            ["--node", "node1", "--node-netns", "/run/netns/dtlab-node1"]
        );
        assert_eq!(nodes[0].1.len(), 8);
        assert_eq!(nodes[1].0, "node2");
    }

    #[test]
    fn the_clocks_line_is_found_among_the_replays_lines() {
        let stderr = "dnstrace: node1: the reference clock\n\
            {\"event\":\"clocks\",\"nodes\":[{\"node\":\"node1\",\"offset_us\":0.0,\"pairs\":0,\"against\":null},{\"node\":\"node2\",\"offset_us\":-1.5,\"pairs\":8,\"against\":\"node1\"}]}\n\
            {\"event\":\"exit\"}\n";
        let nodes = clocks_line(stderr).unwrap();
        assert_eq!(nodes[1]["offset_us"].as_f64(), Some(-1.5));
        assert!(clocks_line("{\"event\":\"exit\"}\n").is_err());
    }
}
