//! `cargo test` over the whole workspace, every test binary run even when
//! one fails, and one line at the end that adds them all up: a red run
//! says how red it is.
use std::io::{BufRead, BufReader, Write};

use anyhow::{bail, Context, Result};

use crate::cargo_cmd;

/// What the test binaries said, added up.
#[derive(Debug, Default, PartialEq)]
pub struct Tally {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    /// Binaries that ran to a result line.
    pub binaries: u64,
    /// The tests that failed, as `binary: test`.
    pub failures: Vec<String>,
    /// The binary running now (cargo's `Running` line).
    current: String,
}

impl Tally {
    /// Reads one line of cargo's and the test binaries' merged output.
    pub fn line(&mut self, line: &str) {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("Running ") {
            self.current = rest.split(" (").next().unwrap_or(rest).to_owned();
        } else if let Some(rest) = line.strip_prefix("Doc-tests ") {
            self.current = format!("doc-tests {rest}");
        } else if let Some(test) = line.strip_suffix(" ... FAILED") {
            let test = test.strip_prefix("test ").unwrap_or(test);
            self.failures.push(format!("{}: {test}", self.current));
        } else if let Some(result) = line.strip_prefix("test result: ") {
            self.binaries += 1;
            self.passed += count(result, " passed");
            self.failed += count(result, " failed");
            self.ignored += count(result, " ignored");
        }
    }

    /// The closing line: `test: N passed, N failed[, N skipped]`.
    pub fn summary(&self) -> String {
        let skipped = match self.ignored {
            0 => String::new(),
            n => format!(", {n} skipped"),
        };
        format!(
            "test: {} passed, {} failed{skipped}",
            self.passed, self.failed
        )
    }
}

/// The number before `what` in a result line (`3 passed; 1 failed; ...`).
fn count(result: &str, what: &str) -> u64 {
    result
        .split(';')
        .find_map(|part| part.trim().split_once(what))
        .and_then(|(n, _)| n.split_whitespace().last()?.parse().ok())
        .unwrap_or(0)
}

/// Runs every test binary, echoing their output as it comes, then the
/// tally; fails if any test or binary failed.
pub fn run() -> Result<()> {
    let (reader, writer) = std::io::pipe().context("a pipe for cargo test's output")?;
    let mut cmd = cargo_cmd();
    cmd.args(["test", "--no-fail-fast"])
        .stdout(writer.try_clone()?)
        .stderr(writer);
    let mut child = cmd.spawn().context("running cargo test")?;
    // The pipe's write ends now live only in the child.
    drop(cmd);
    let mut tally = Tally::default();
    let mut out = std::io::stdout().lock();
    for line in BufReader::new(reader).lines() {
        let line = line.context("reading cargo test's output")?;
        writeln!(out, "{line}")?;
        tally.line(&line);
    }
    let status = child.wait()?;
    if !tally.failures.is_empty() {
        writeln!(out, "\nfailed tests:")?;
        for f in &tally.failures {
            writeln!(out, "    {f}")?;
        }
    }
    writeln!(out, "{} binaries ran to a result", tally.binaries)?;
    writeln!(out, "{}", tally.summary())?;
    if !status.success() {
        bail!("cargo test failed ({status}): {}", tally.summary());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_up_every_binary_and_names_the_failures() {
        let mut t = Tally::default();
        for line in [
            "     Running unittests src/lib.rs (target/debug/deps/dnstrace-1f)",
            "test a ... ok",
            "test result: ok. 218 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 3.1s",
            "     Running tests/record.rs (target/debug/deps/record-2e)",
            "test a_full_disk_stops_the_recording ... FAILED",
            "test result: FAILED. 6 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 40s",
            "   Doc-tests dnstrace_common",
            "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.0s",
        ] {
            t.line(line);
        }
        assert_eq!((t.passed, t.failed, t.ignored, t.binaries), (224, 1, 1, 3));
        assert_eq!(
            t.failures,
            ["tests/record.rs: a_full_disk_stops_the_recording"]
        );
        assert_eq!(t.summary(), "test: 224 passed, 1 failed, 1 skipped");
    }
}
