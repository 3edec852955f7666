//! Errors a user meets: one clear line, non-zero exit, no backtrace.
use std::process::{Command, Output};

use dnstrace_tests::*;

fn assert_one_line_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit status {}", out.status);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line: {stderr}");
    assert!(
        lines[0].starts_with("dnstrace: error: ") && lines[0].contains(needle),
        "{stderr}"
    );
}

#[test]
fn not_root_is_a_clear_error() {
    require_root();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(dnstrace_bin())
        .args(["--iface", "lo"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "needs root");
}

#[test]
fn unknown_interface_is_a_clear_error() {
    require_root();
    let out = Command::new(dnstrace_bin())
        .args(["--iface", "nosuchif0"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "no interface named \"nosuchif0\"");
}

#[test]
fn bad_arguments_are_refused() {
    let out = Command::new(dnstrace_bin())
        .args(["--iface", "lo", "--ring-buffer-mib", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("power of two"));
}
