//! Log lines through the `log` crate: `dnstrace: what happened` on stderr,
//! `dnstrace: warning: …` for what was lost or refused. `DNSTRACE_LOG`
//! (off, error, warn, info, debug, trace; default info) sets the level; at
//! debug and below, the libraries' own records (aya's) show too.
//!
//! A run's log goes to a file with `Redirect`, which moves stderr itself.
use std::{
    fs::OpenOptions,
    io::{self, Write as _},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::fs::OpenOptionsExt,
    },
    path::Path,
};

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, Result};
use log::{Level, LevelFilter, Log, Metadata, Record};

/// Installs the logger, at the level `DNSTRACE_LOG` asks for.
pub fn init() {
    let level = std::env::var("DNSTRACE_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(LevelFilter::Info);
    // Only fails when a logger is already set: keep that one.
    if log::set_logger(&Stderr).is_ok() {
        log::set_max_level(level);
    }
}

struct Stderr;

/// Log lines as JSON objects (`--log-format json`), for a log collector.
static JSON: AtomicBool = AtomicBool::new(false);

pub fn json_lines() {
    JSON.store(true, Ordering::Relaxed);
}

impl Log for Stderr {
    fn enabled(&self, meta: &Metadata) -> bool {
        ours(meta.target()) || log::max_level() >= Level::Debug
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            // One write a line: lines from threads never interleave.
            let line = format!("{}\n", line(record));
            let _ = io::stderr().lock().write_all(line.as_bytes());
        }
    }

    fn flush(&self) {}
}

/// `dnstrace: …`, `lab: …` (a target of its own), `aya: …`; or a JSON
/// object with the time, level, target and message.
fn line(record: &Record) -> String {
    let name = record.target().split("::").next().unwrap_or_default();
    if JSON.load(Ordering::Relaxed) {
        let time = humantime::format_rfc3339_millis(std::time::SystemTime::now());
        return serde_json::json!({
            "time": time.to_string(),
            "level": record.level().as_str().to_ascii_lowercase(),
            "target": name,
            "message": record.args().to_string(),
        })
        .to_string();
    }
    match record.level() {
        Level::Error => format!("{name}: error: {}", record.args()),
        Level::Warn => format!("{name}: warning: {}", record.args()),
        _ => format!("{name}: {}", record.args()),
    }
}

/// This crate's records, by module path or the names the lab gives its own.
fn ours(target: &str) -> bool {
    ["dnstrace", "lab", "traffic"].contains(&target.split("::").next().unwrap_or_default())
}

/// Sends this process's stderr to a new file until dropped. Log records
/// follow stderr; so does what writes to it outside the logger (a panic's
/// message, jemalloc's complaints), which the live view must not get
/// drawn over.
pub struct Redirect {
    saved: OwnedFd,
}

impl Redirect {
    pub fn to(path: &Path) -> Result<Self> {
        // A new file only, owner-readable: as root, never follow a link
        // someone left in a shared directory.
        let file = OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| {
                format!(
                    "cannot create the log file {} (choose another with --log-file)",
                    path.display()
                )
            })?;
        // SAFETY: dup of a valid descriptor; the result is checked.
        let saved = unsafe { libc::dup(libc::STDERR_FILENO) };
        if saved < 0 {
            return Err(io::Error::last_os_error()).context("saving stderr");
        }
        // SAFETY: `saved` is a fresh descriptor owned by no one else.
        let saved = unsafe { OwnedFd::from_raw_fd(saved) };
        // SAFETY: both descriptors are valid.
        if unsafe { libc::dup2(file.as_raw_fd(), libc::STDERR_FILENO) } < 0 {
            return Err(io::Error::last_os_error()).context("sending stderr to the log file");
        }
        Ok(Self { saved })
    }
}

impl Drop for Redirect {
    fn drop(&mut self) {
        // SAFETY: both descriptors are valid.
        unsafe { libc::dup2(self.saved.as_raw_fd(), libc::STDERR_FILENO) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(level: Level, target: &str, text: &str) -> String {
        line(
            &Record::builder()
                .level(level)
                .target(target)
                .args(format_args!("{text}"))
                .build(),
        )
    }

    #[test]
    fn lines_are_named_after_their_crate_or_target_and_warnings_say_so() {
        let trace = "dnstrace::commands::trace";
        assert_eq!(
            said(Level::Info, trace, "capturing DNS"),
            "dnstrace: capturing DNS"
        );
        assert_eq!(
            said(Level::Warn, trace, "3 events lost so far"),
            "dnstrace: warning: 3 events lost so far"
        );
        assert_eq!(said(Level::Info, "lab", "up"), "lab: up");
    }

    #[test]
    fn only_our_records_show_above_debug() {
        assert!(ours("dnstrace::probes"));
        assert!(ours("lab"));
        assert!(!ours("aya::programs"));
    }
}
