//! The built-in lab, as the tests use it. `cargo xtask test` runs each
//! test in a process of its own and gives it a lab of its own
//! (`DNSTRACE_LAB_INSTANCE`, which `dnstrace lab` reads too), so that
//! several labs are up side by side. Every name and path here is this
//! process's lab's (dnstrace/src/lab/plan.rs names them alike), and a
//! dnstrace on the lab sees that lab's node alone (`lab_scope`): another
//! lab up beside it is another node of the kernel, as kind's are.
use std::{
    fmt,
    ops::Deref,
    path::Path,
    process::Command,
    sync::{Mutex, MutexGuard, OnceLock},
    time::Duration,
};

use crate::{dnstrace, dnstrace_bin, json_lines, Dnstrace, Keep};

/// The built-in lab, brought down on drop. One test at a time may hold a
/// lab of an instance: `LAB_LOCK` in this process, and an exclusive flock
/// on its lock file across processes (another test run, `cargo xtask
/// bench`, which holds the first lab's).
pub struct Lab {
    _lock: LabLock,
}

/// This process's lab to itself, for a test that brings it up and down
/// itself; released on drop.
pub struct LabLock {
    _guard: MutexGuard<'static, ()>,
    _file: std::fs::File,
}

/// This process's lab: its instance's number, none for the first.
pub fn lab_instance() -> Option<u8> {
    static INSTANCE: OnceLock<Option<u8>> = OnceLock::new();
    *INSTANCE.get_or_init(|| {
        let n = std::env::var("DNSTRACE_LAB_INSTANCE").ok()?;
        Some(n.parse().expect("DNSTRACE_LAB_INSTANCE is a number"))
    })
}

/// The instance's number as the lab's names carry it.
fn instance_tag() -> String {
    lab_instance().map_or_else(String::new, |n| n.to_string())
}

/// The prefix of the lab's namespace names.
pub fn lab_prefix() -> &'static str {
    static PREFIX: OnceLock<String> = OnceLock::new();
    PREFIX.get_or_init(|| format!("dtlab{}-", instance_tag()))
}

/// The lab's network namespace `name` (a pod's, `node`, `upstream`).
pub fn lab_ns(name: &str) -> String {
    format!("{}{name}", lab_prefix())
}

/// `lab fault NAME on|off` with `extra` flags.
fn switch_fault(name: &str, on: bool, extra: &[&str]) {
    let mut args = vec!["lab", "fault", name, if on { "on" } else { "off" }];
    args.extend_from_slice(extra);
    lab_command(&args);
}

/// `dnstrace lab …` (`args` from `lab`), which must succeed: its output.
fn lab_command(args: &[&str]) -> std::process::Output {
    let out = dnstrace(args);
    assert!(
        out.status.success(),
        "{}: {}",
        args[..2].join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Where the lab keeps its state, configs and logs.
pub fn lab_dir() -> &'static str {
    static DIR: OnceLock<String> = OnceLock::new();
    DIR.get_or_init(|| format!("/run/dnstrace-lab{}", instance_tag()))
}

/// A file of the lab's directory.
pub fn lab_path(rel: &str) -> String {
    format!("{}/{rel}", lab_dir())
}

/// A namespace of the lab by its name's tail, named in full when first
/// used: `&WEB` is a `&str`.
pub struct LabNs {
    tail: &'static str,
    full: OnceLock<String>,
}

impl LabNs {
    const fn new(tail: &'static str) -> Self {
        Self {
            tail,
            full: OnceLock::new(),
        }
    }

    /// The pod's (or the node's) name without the lab's prefix.
    pub fn pod(&self) -> &'static str {
        self.tail
    }
}

impl Deref for LabNs {
    type Target = str;

    fn deref(&self) -> &str {
        self.full.get_or_init(|| lab_ns(self.tail))
    }
}

impl fmt::Display for LabNs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

/// Waits for the lock of this process's lab; it is released when the
/// file closes.
fn lock_lab_file() -> std::fs::File {
    let path = format!("{}.lock", lab_dir());
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .expect("opening the lab lock");
    // SAFETY: flock on a descriptor this function owns.
    let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX) };
    assert_eq!(rc, 0, "locking {path}");
    file
}

pub static LAB_LOCK: Mutex<()> = Mutex::new(());

pub static WEB: LabNs = LabNs::new("web-7d9f8c6b5-x2x4k");
pub static CHECKOUT: LabNs = LabNs::new("checkout-5f6d7c9b8-q7w2e");
pub static NODE: LabNs = LabNs::new("node");
pub static UPSTREAM_NS: LabNs = LabNs::new("upstream");
pub const COREDNS_A: &str = "coredns-7db6d8ff4d-4xk9m";
pub const COREDNS_B: &str = "coredns-7db6d8ff4d-vz8lp";
pub const SERVICE: &str = "10.96.0.10";
/// NodeLocalDNS's address in the lab (`lab up --nodelocaldns`).
pub const NODELOCAL: &str = "169.254.20.10";
/// Lab names whose TXT answer is over EDNS's default 1,232 bytes, and over
/// the veths' 1,500-byte MTU (sent in fragments with a 4,096-byte buffer):
/// dnstrace/src/lab/plan.rs.
pub const BIG_NAME: &str = "big.example.com";
pub const HUGE_NAME: &str = "huge.example.com";
/// The node's name given to `--node`.
pub const LAB_NODE: &str = "lab-node";

/// The lab node's network namespace, as `--node-netns` takes it.
pub fn node_netns() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| format!("/run/netns/{}", &*NODE))
}

/// The lab's containerd's root, as `--containerd-root` takes it.
pub fn lab_containerd() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| lab_path("containerd"))
}

/// The flags that point dnstrace at the lab's containerd: its state and
/// its CRI socket (labels, workloads).
pub fn lab_runtime() -> [&'static str; 4] {
    static SOCKET: OnceLock<String> = OnceLock::new();
    let socket = SOCKET.get_or_init(|| lab_path("cri/containerd.sock"));
    [
        "--containerd-root",
        lab_containerd(),
        "--cri-socket",
        socket,
    ]
}

/// The flags that make a dnstrace the lab's node's: its conntrack and
/// rules (`--node-netns`), and only its namespaces and its pods' traced
/// (`--node`), so that another lab up beside it is not seen.
pub fn lab_scope() -> Vec<&'static str> {
    [
        &["--node-netns", node_netns(), "--node", LAB_NODE][..],
        &lab_runtime(),
    ]
    .concat()
}

/// The flags that make a dnstrace node `n`'s of a lab of several
/// (`lab up --nodes N`): its name, namespace and containerd.
pub fn node_flags(n: u8) -> Vec<String> {
    [
        "--node".to_owned(),
        format!("node{n}"),
        "--node-netns".to_owned(),
        format!("/run/netns/{}", lab_ns(&format!("node{n}"))),
        "--containerd-root".to_owned(),
        lab_path(&format!("node{n}/containerd")),
        "--cri-socket".to_owned(),
        lab_path(&format!("node{n}/cri/containerd.sock")),
    ]
    .to_vec()
}

/// The agent's API on a port of its own: several agents run at once.
const API_ANY_PORT: [&str; 2] = ["--api-addr", "127.0.0.1:0"];

/// `dnstrace agent` on the lab's node as `lab-node`, its namespaces and
/// its pods' alone (`lab_scope`), serving on `listen`, with `extra`.
pub fn agent_args<'a>(listen: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    [
        &["agent", "--metrics-addr", listen][..],
        &API_ANY_PORT,
        &lab_scope(),
        extra,
    ]
    .concat()
}

/// `agent_args` counting every socket of the machine, named `lab-node`:
/// for namespaces that are no pod of the lab's runtime (a test with the
/// machine alone, `require_alone`).
pub fn agent_args_everywhere<'a>(listen: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let node = ["--node-netns", node_netns(), "--node-name", LAB_NODE];
    [
        &["agent", "--metrics-addr", listen][..],
        &API_ANY_PORT,
        &node,
        extra,
        &lab_runtime(),
    ]
    .concat()
}

impl Lab {
    /// `dnstrace trace -o json --timeout 3s` over the lab node, every
    /// lookup kept, with `extra`, while `work` runs and 1.5 s after: its
    /// JSON lines and what it said on stderr.
    pub fn trace_during(
        &self,
        extra: &[&str],
        work: impl FnOnce(),
    ) -> (Vec<serde_json::Value>, Vec<String>) {
        self.trace_during_with(dnstrace_bin(), extra, work)
    }

    /// `trace_during` with the dnstrace binary `bin` (the release build
    /// keeps up with more lookups).
    pub fn trace_during_with(
        &self,
        bin: &Path,
        extra: &[&str],
        work: impl FnOnce(),
    ) -> (Vec<serde_json::Value>, Vec<String>) {
        let args = [&lab_scope()[..], extra].concat();
        self.trace_everywhere_during(bin, &args, work)
    }

    /// `trace_during_with` over every namespace of the machine, for a
    /// lab of several nodes (a test with the machine alone,
    /// `require_alone`).
    pub fn trace_everywhere_during(
        &self,
        bin: &Path,
        extra: &[&str],
        work: impl FnOnce(),
    ) -> (Vec<serde_json::Value>, Vec<String>) {
        let mut args = vec!["trace", "-o", "json", "--timeout", "3s"];
        args.extend_from_slice(extra);
        let trace = Dnstrace::start_binary(bin, Keep::Every, &args).unwrap();
        work();
        std::thread::sleep(Duration::from_millis(1500));
        let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
        assert!(status.success(), "{status}: {stderr:?}");
        (json_lines(&out), stderr)
    }

    /// `dnstrace trace -o json` over the whole lab node, keeping every
    /// lookup, with `extra`.
    pub fn trace_every_lookup(&self, extra: &[&str]) -> Dnstrace {
        self.trace(Keep::Every, extra)
    }

    /// `dnstrace trace -o json` over the whole lab node, keeping `keep`,
    /// with `extra`.
    pub fn trace(&self, keep: Keep, extra: &[&str]) -> Dnstrace {
        let mut args = [&["trace", "-o", "json"][..], &lab_scope()].concat();
        args.extend_from_slice(extra);
        Dnstrace::start_here(keep, &args).unwrap()
    }

    /// `trace` over every namespace of the machine, the lab's node's
    /// conntrack with it: namespaces that are no pod of the lab's runtime
    /// (a test with the machine alone, `require_alone`).
    pub fn trace_everywhere(&self, keep: Keep, extra: &[&str]) -> Dnstrace {
        let mut args = vec!["trace", "-o", "json", "--node-netns", node_netns()];
        args.extend_from_slice(extra);
        Dnstrace::start_here(keep, &args).unwrap()
    }

    /// The lab's locks, with no lab brought up.
    pub fn lock() -> LabLock {
        LabLock {
            _guard: LAB_LOCK.lock().unwrap_or_else(|e| e.into_inner()),
            _file: lock_lab_file(),
        }
    }

    pub fn up(args: &[&str]) -> Self {
        let lock = Self::lock();
        let _ = dnstrace(&["lab", "down"]);
        let mut all = vec!["lab", "up"];
        all.extend_from_slice(args);
        lab_command(&all);
        Self { _lock: lock }
    }

    pub fn fault(&self, name: &str, on: bool) {
        switch_fault(name, on, &[]);
    }

    /// A cluster fault on node `node` (`--node`).
    pub fn fault_on(&self, name: &str, on: bool, node: &str) {
        switch_fault(name, on, &["--node", node]);
    }

    /// `lab restart coredns`: each CoreDNS pod's resolver stopped and
    /// started again, as a rollout does.
    pub fn restart_coredns(&self) {
        lab_command(&["lab", "restart", "coredns"]);
    }

    /// dig in a lab namespace, one try, short timeout; returns dig's output.
    pub fn dig(&self, ns: &str, args: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "dig", "+tries=1", "+time=2"])
            .args(args.split_whitespace())
            .output()
            .expect("running dig");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `lab traffic ... -o json`, parsed.
    pub fn traffic(&self, args: &[&str]) -> Vec<serde_json::Value> {
        let mut all = vec!["lab", "traffic", "-o", "json"];
        all.extend_from_slice(args);
        let out = lab_command(&all);
        json_lines(&String::from_utf8_lossy(&out.stdout))
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(lab_path(&format!("logs/{name}.log"))).unwrap_or_default()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let out = dnstrace(&["lab", "down"]);
        if !out.status.success() {
            eprintln!("lab down failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}
