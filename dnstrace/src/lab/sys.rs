//! Running the real tools the lab is made with, with errors that say what to do.
use std::{
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _, Result};

/// Programs the lab runs and the Debian package each comes from.
pub const PROGRAMS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("bridge", "iproute2"),
    ("iptables-restore", "iptables"),
    ("ip6tables-restore", "iptables"),
    ("iptables", "iptables"),
    ("sysctl", "procps"),
    ("dnsmasq", "dnsmasq-base"),
    ("unbound", "unbound"),
    ("dig", "bind9-dnsutils"),
    ("ss", "iproute2"),
    ("nft", "nftables"),
    ("conntrack", "conntrack"),
    ("unshare", "util-linux"),
];

pub fn require_programs() -> Result<()> {
    PROGRAMS
        .iter()
        .try_for_each(|(program, package)| require(program, package))
}

/// Refuses when `program` (of Debian's `package`) is not installed.
pub fn require(program: &str, package: &str) -> Result<()> {
    if !on_path(program) {
        bail!("the lab needs `{program}`, which is not installed: apt-get install {package}");
    }
    Ok(())
}

fn on_path(program: &str) -> bool {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .any(|dir| Path::new(dir).join(program).is_file());
    found
}

/// Runs `program args`, returning stdout, or an error carrying stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `program args` inside network namespace `ns`.
pub fn in_ns(ns: &str, program: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    run("ip", &all)
}

/// `ip -n ns ...`, arguments split on whitespace.
pub fn ip(ns: &str, args: &str) -> Result<String> {
    let mut all = vec!["-n", ns];
    all.extend(args.split_whitespace());
    run("ip", &all)
}

pub fn sysctl(ns: &str, key: &str, value: &str) -> Result<()> {
    in_ns(ns, "sysctl", &["-qw", &format!("{key}={value}")]).map(drop)
}

/// Feeds `rules` to iptables-restore (v4) or ip6tables-restore in `ns`.
pub fn restore(ns: &str, v6: bool, rules: &str) -> Result<()> {
    let program = if v6 {
        "ip6tables-restore"
    } else {
        "iptables-restore"
    };
    feed(ns, program, &[], rules)
}

/// Runs an nftables script in `ns`, as one transaction.
pub fn nft(ns: &str, script: &str) -> Result<()> {
    feed(ns, "nft", &["-f", "-"], script)
}

/// Runs `program args` in `ns` with `input` on its stdin.
fn feed(ns: &str, program: &str, args: &[&str], input: &str) -> Result<()> {
    use std::io::Write as _;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program}"))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{program} in {ns} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Starts `program args` in `ns` as a detached, long-running process and
/// returns its pid (`ip netns exec` execs the program, so the pid is its own).
pub fn spawn_detached(ns: &str, program: &str, args: &[&str]) -> Result<u32> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, program]);
    spawn_detached_cmd(cmd, args)
}

/// The same for a command made ready to take `args`; every exec keeps the pid.
pub fn spawn_detached_cmd(mut cmd: Command, args: &[&str]) -> Result<u32> {
    use std::os::unix::process::CommandExt as _;
    let what = format!("{cmd:?}");
    let child = cmd
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    Ok(child.id())
}

/// `program args` in `ns` with `resolv` mounted as /etc/resolv.conf, in a
/// mount namespace of its own: a hostNetwork pod's view of the node.
pub fn with_resolv_conf(ns: &str, resolv: &Path, program: &str) -> Command {
    let script = format!("mount --bind \"$0\" /etc/resolv.conf && exec {program} \"$@\"");
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns", "exec", ns, "unshare", "--mount", "sh", "-c", &script,
    ])
    .arg(resolv);
    cmd
}

/// Running, not a zombie: daemons the lab started are reaped by whoever
/// adopted them, maybe late.
pub fn alive(pid: u32) -> bool {
    Liveness::of(pid) != Liveness::Gone
}

/// How a process the lab started is, from its state in /proc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    Running,
    /// Stopped by a signal (a fault's SIGSTOP) or a tracer: it answers
    /// nothing until resumed.
    Stopped,
    Gone,
}

impl Liveness {
    pub fn of(pid: u32) -> Self {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(Self::Gone, |stat| Self::from_stat(&stat))
    }

    fn from_stat(stat: &str) -> Self {
        // The state follows the parenthesised command name.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        match state {
            None | Some("Z" | "X") => Self::Gone,
            Some("T" | "t") => Self::Stopped,
            Some(_) => Self::Running,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Stopped => "stopped",
            Self::Gone => "GONE",
        }
    }
}

pub fn hangup(pid: u32) {
    // SAFETY: plain kill(2) on a pid the lab started.
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
}

/// Stops (`SIGSTOP`) or resumes (`SIGCONT`) a process: a hung one.
pub fn freeze(pid: u32, frozen: bool) {
    let sig = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
    // SAFETY: plain kill(2) on a pid the lab started.
    unsafe { libc::kill(pid as i32, sig) };
}

/// Asks a process to stop (`SIGTERM`), as the kubelet does a pod's.
pub fn terminate(pid: u32) {
    // SAFETY: plain kill(2) on a pid the lab started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
}

pub fn kill(pid: u32) {
    // SAFETY: plain kill(2) on a pid the lab started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// The lab's namespaces that exist now.
pub fn lab_namespaces() -> Vec<String> {
    let Ok(out) = run("ip", &["netns", "list"]) else {
        return Vec::new();
    };
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(super::plan::ns_prefix()))
        .map(str::to_owned)
        .collect()
}

/// Writes `text` into an existing file in place (same inode), so bind mounts
/// of it, like a pod's /etc/resolv.conf, see the change.
pub fn rewrite(path: &Path, text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// Detaches the mount at `path` (lazily: a busy one goes when unused).
pub fn unmount(path: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: a NUL-terminated path; no other preconditions.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        let e = std::io::Error::last_os_error();
        bail!("unmounting {}: {e}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Liveness;

    #[test]
    fn a_stopped_process_is_told_from_a_running_one_and_a_zombie() {
        let stat = |state: &str| format!("4242 (core dns) {state} 1 4242 4242 0 -1");
        assert_eq!(Liveness::from_stat(&stat("S")), Liveness::Running);
        assert_eq!(Liveness::from_stat(&stat("R")), Liveness::Running);
        assert_eq!(Liveness::from_stat(&stat("T")), Liveness::Stopped);
        assert_eq!(Liveness::from_stat(&stat("Z")), Liveness::Gone);
        assert_eq!(Liveness::from_stat("4242 (cut"), Liveness::Gone);
        // This test's own process runs.
        assert_eq!(Liveness::of(std::process::id()), Liveness::Running);
    }
}
