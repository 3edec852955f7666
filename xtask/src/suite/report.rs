//! The end of a run: the tally, the failures, and where the time went;
//! and each test's time kept for the next run's order.
use std::{collections::BTreeMap, io::Write as _, path::Path};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use super::schedule::{End, Outcome};

/// How many of the slowest binaries and tests the report names.
const SLOWEST: usize = 10;
/// What a test never timed is taken to last: new tests start early.
const UNKNOWN_SECS: f64 = 60.0;

/// What the last run learnt of each job, by id: its time, and whether
/// it needed the release build.
#[derive(Debug, Default)]
pub struct Times(BTreeMap<String, Timed>);

#[derive(Debug, Default, Serialize, Deserialize)]
struct Timed {
    secs: f64,
    release: bool,
}

impl Times {
    /// The times kept at `path`; none if it cannot be read.
    pub fn load(path: &Path) -> Self {
        let read = std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        Self(read.unwrap_or_default())
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, serde_json::to_vec_pretty(&self.0)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    pub fn estimate(&self, id: &str) -> f64 {
        self.0.get(id).map_or(UNKNOWN_SECS, |t| t.secs)
    }

    pub fn needs_release(&self, id: &str) -> bool {
        self.0.get(id).is_some_and(|t| t.release)
    }

    pub fn update(&mut self, outcomes: &[Outcome]) {
        for o in outcomes {
            let timed = Timed {
                secs: o.secs,
                release: o.needs_release,
            };
            self.0.insert(o.id.clone(), timed);
        }
    }
}

/// `test: N passed, N failed[, N skipped: which]`.
pub fn summary(outcomes: &[Outcome]) -> String {
    let (passed, failed, ignored) = outcomes.iter().fold((0, 0, 0), |(p, f, i), o| {
        (
            p + o.counts.passed,
            f + o.counts.failed,
            i + o.counts.ignored,
        )
    });
    let which: Vec<&str> = outcomes
        .iter()
        .flat_map(|o| &o.ignored)
        .map(String::as_str)
        .collect();
    let skipped = match ignored {
        0 => String::new(),
        n if which.is_empty() => format!(", {n} skipped"),
        n => format!(", {n} skipped: {}", which.join(", ")),
    };
    format!("test: {passed} passed, {failed} failed{skipped}")
}

/// The binaries by the time their tests took, summed; the slowest first.
pub fn by_binary(outcomes: &[Outcome]) -> Vec<(String, f64, usize)> {
    let mut sums: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for o in outcomes {
        let e = sums.entry(&o.binary).or_default();
        e.0 += o.secs;
        e.1 += 1;
    }
    let mut rows: Vec<_> = sums
        .into_iter()
        .map(|(b, (secs, n))| (b.to_owned(), secs, n))
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    rows
}

pub fn print(outcomes: &[Outcome]) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "\nwhere the time went (each test's own time; several run at once):"
    );
    let _ = writeln!(out, "  slowest binaries:");
    for (binary, secs, n) in by_binary(outcomes).iter().take(SLOWEST) {
        let _ = writeln!(out, "  {secs:>8.1} s  {binary} ({n} tests)");
    }
    let mut tests: Vec<&Outcome> = outcomes.iter().collect();
    tests.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    let _ = writeln!(out, "  slowest tests:");
    for o in tests.iter().take(SLOWEST) {
        let _ = writeln!(out, "  {:>8.1} s  {}", o.secs, o.id);
    }
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.passed()).collect();
    if !failed.is_empty() {
        let _ = writeln!(out, "\nfailed tests:");
        for o in failed {
            let how = if matches!(o.end, End::TimedOut(_)) {
                " (timed out)"
            } else {
                ""
            };
            let _ = writeln!(out, "    {}{how}", o.id);
        }
    }
    let _ = writeln!(out, "{}", summary(outcomes));
}

#[cfg(test)]
mod tests {
    use super::super::schedule::Counts;
    use super::*;

    fn outcome(id: &str, binary: &str, secs: f64, end: End, counts: Counts) -> Outcome {
        Outcome {
            id: id.into(),
            binary: binary.into(),
            secs,
            counts,
            end,
            alone: false,
            needs_release: false,
            ignored: Vec::new(),
        }
    }

    #[test]
    fn adds_up_every_job_and_sums_the_binaries() {
        let one = Counts {
            passed: 1,
            ..Counts::default()
        };
        let failed = Counts {
            failed: 1,
            ..Counts::default()
        };
        let unit = Counts {
            passed: 218,
            ignored: 1,
            ..Counts::default()
        };
        let mut outcomes = [
            outcome("record::a", "record", 40.0, End::Passed, one),
            outcome("record::b", "record", 2.0, End::Failed("x".into()), failed),
            outcome("lab::c", "lab", 30.0, End::Passed, one),
            outcome(
                "dnstrace (lib dnstrace)",
                "dnstrace (lib dnstrace)",
                3.1,
                End::Passed,
                unit,
            ),
        ];
        assert_eq!(summary(&outcomes), "test: 220 passed, 1 failed, 1 skipped");
        outcomes[3].ignored = vec!["fuzz::w (rewrites seeds)".into()];
        assert_eq!(
            summary(&outcomes),
            "test: 220 passed, 1 failed, 1 skipped: fuzz::w (rewrites seeds)"
        );
        let rows = by_binary(&outcomes);
        assert_eq!(
            (rows[0].0.as_str(), rows[0].1, rows[0].2),
            ("record", 42.0, 2)
        );
        assert_eq!(rows[1].0, "lab");
    }
}
