//! The kernel side's own figures: BPF run-time statistics, and the events
//! dnstrace's COUNTS map counted (its first slot: events lost).
use super::*;

/// Run-time statistics of BPF programs, on while this lives (BPF_ENABLE_STATS:
/// the kernel turns them off again when the descriptor closes, whatever happens
/// to the bench; kernel.bpf_stats_enabled itself is left alone).
pub(super) struct BpfStats {
    pub(super) _fd: File,
}

#[derive(Clone, Copy, Default)]
pub(super) struct ProgStat {
    pub(super) run_ns: u64,
    pub(super) runs: u64,
}

impl BpfStats {
    pub(super) fn enable() -> Result<Self> {
        const BPF_ENABLE_STATS: libc::c_long = 32;
        let mut attr = [0u64; 16];
        attr[0] = 0; // BPF_STATS_RUN_TIME
                     // SAFETY: bpf(2) with a zeroed attr of the size given.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_ENABLE_STATS,
                attr.as_mut_ptr(),
                std::mem::size_of_val(&attr),
            )
        };
        if fd < 0 {
            bail!("BPF_ENABLE_STATS: {}", std::io::Error::last_os_error());
        }
        // SAFETY: the kernel just gave us this descriptor.
        Ok(Self {
            _fd: unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as i32) },
        })
    }

    /// The programs (named dns_*) that `pid` holds, summed by name.
    pub(super) fn programs(&self, pid: i32) -> Result<BTreeMap<String, ProgStat>> {
        let ours = bpf_ids(pid, "prog_id:");
        let out = output(Command::new("bpftool").args(["-j", "prog", "show"]))?;
        let progs: Vec<serde_json::Value> = serde_json::from_str(&out).context("bpftool's JSON")?;
        let mut by_name: BTreeMap<String, ProgStat> = BTreeMap::new();
        for p in progs {
            let Some(name) = p["name"].as_str().filter(|n| n.starts_with("dns_")) else {
                continue;
            };
            if !p["id"].as_u64().is_some_and(|id| ours.contains(&id)) {
                continue;
            }
            let s = by_name.entry(name.to_owned()).or_default();
            s.run_ns += p["run_time_ns"].as_u64().unwrap_or(0);
            s.runs += p["run_cnt"].as_u64().unwrap_or(0);
        }
        Ok(by_name)
    }
}

/// The ids of the BPF maps or programs (`key` "map_id:" or "prog_id:") a
/// process holds descriptors of, from /proc/PID/fdinfo.
pub(super) fn bpf_ids(pid: i32, key: &str) -> Vec<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
        })
        .collect()
}

/// The sum over CPUs of the lost events in the COUNTS map of the dnstrace
/// with this pid.
pub(super) fn lost_in_map(pid: i32) -> Result<u64> {
    let ours = bpf_ids(pid, "map_id:");
    let out = output(Command::new("bpftool").args(["-j", "map", "show"]))?;
    let maps: Vec<serde_json::Value> = serde_json::from_str(&out).context("bpftool's JSON")?;
    let id = maps
        .iter()
        .filter(|m| m["name"].as_str() == Some("COUNTS"))
        .filter_map(|m| m["id"].as_u64())
        .find(|id| ours.contains(id))
        .ok_or_else(|| anyhow!("no COUNTS map of pid {pid}"))?;
    let out = output(Command::new("bpftool").args([
        "-j",
        "map",
        "lookup",
        "id",
        &id.to_string(),
        "key",
        "0",
        "0",
        "0",
        "0",
    ]))?;
    let v: serde_json::Value = serde_json::from_str(&out).context("bpftool's JSON")?;
    let values = v["formatted"]["values"]
        .as_array()
        .or_else(|| v["values"].as_array())
        .ok_or_else(|| anyhow!("no per-CPU values for the COUNTS map"))?;
    Ok(values
        .iter()
        .map(|c| match &c["value"] {
            serde_json::Value::Number(n) => n.as_u64().unwrap_or(0),
            // Raw bytes, little-endian, as "0x2a" strings.
            serde_json::Value::Array(bytes) => bytes.iter().rev().fold(0u64, |acc, b| {
                let byte = b
                    .as_str()
                    .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
                    .unwrap_or(0);
                (acc << 8) | byte
            }),
            _ => 0,
        })
        .sum())
}

/// "dns_dev_xmit 41 ns × 1.2M runs, …" between two readings.
pub(super) fn per_run(
    before: &BTreeMap<String, ProgStat>,
    after: &BTreeMap<String, ProgStat>,
) -> String {
    let mut parts = Vec::new();
    for (name, a) in after {
        let b = before.get(name).copied().unwrap_or_default();
        let runs = a.runs.saturating_sub(b.runs);
        if runs == 0 {
            continue;
        }
        let ns = a.run_ns.saturating_sub(b.run_ns) as f64 / runs as f64;
        parts.push(format!("`{name}` {ns:.0} ns × {}", short_count(runs)));
    }
    if parts.is_empty() {
        "no runs counted".into()
    } else {
        parts.join(", ")
    }
}

/// The run time of all the programs between two readings, in ns.
pub(super) fn run_ns(
    before: &BTreeMap<String, ProgStat>,
    after: &BTreeMap<String, ProgStat>,
) -> u64 {
    after
        .iter()
        .map(|(name, a)| {
            let b = before.get(name).map_or(0, |b| b.run_ns);
            a.run_ns.saturating_sub(b)
        })
        .sum()
}

// ---------------------------------------------------------------- little things
