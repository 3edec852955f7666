//! Test harness: network namespaces the tests make themselves, real resolvers
//! in them, and dnstrace run as a real process. Addresses exist only inside
//! those namespaces; nothing is sent anywhere else.
use std::{
    io::{BufRead, BufReader, Read, Write as _},
    net::UdpSocket,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering},
        mpsc, OnceLock,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

pub mod cri;
mod lab;
pub mod otlp;
pub mod prometheus;

pub use lab::*;

/// Fails loudly instead of skipping: these tests load eBPF programs.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the integration tests load eBPF programs and create network namespaces: run them as root (cargo xtask test)");
}

/// The exit codes of a test that needs the machine alone, or the release
/// build, and was not given it (xtask/src/suite/schedule.rs).
const ALONE_EXIT: i32 = 75;
const RELEASE_EXIT: i32 = 76;

/// Leaves the test at once with `code`, saying why past libtest's capture
/// (which `exit` leaves unprinted), for the runner to run it again later.
fn back_to_the_runner(code: i32, needs: &str) -> ! {
    let _ = writeln!(std::io::stderr(), "dnstrace-tests: this test needs {needs}");
    std::process::exit(code);
}

/// For a test that watches the whole machine: a dnstrace with no
/// `--node`, which sees every lab's lookups, or the kernel's programs by
/// name. `cargo xtask test` runs several tests at once, each with a lab of
/// its own; such a test exits at once, and the runner runs it again once
/// nothing else runs (`DNSTRACE_TEST_ALONE`). Run by `cargo test`, whose
/// lab tests wait for one another, it goes on.
pub fn require_alone() {
    require_root();
    let runner = std::env::var_os("DNSTRACE_TEST_RUNNER").is_some();
    if runner && std::env::var_os("DNSTRACE_TEST_ALONE").is_none() {
        back_to_the_runner(ALONE_EXIT, "the machine alone");
    }
}

/// Runs a command, failing with its stderr when it does not succeed.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command line split at whitespace (no shell); its stdout.
pub fn sh(line: &str) -> Result<String> {
    let args: Vec<&str> = line.split_whitespace().collect();
    run(Command::new(args[0]).args(&args[1..]))
}

/// A network namespace, deleted (with its processes' sockets and links) on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Result<Self> {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "dtt{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        sh(&format!("ip netns add {name}"))?;
        let ns = Self { name };
        ns.ip("link set lo up")?;
        Ok(ns)
    }

    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    pub fn ip(&self, args: &str) -> Result<String> {
        sh(&format!("ip -n {} {args}", self.name))
    }

    /// Runs `f` on a thread that has entered this namespace, so sockets made
    /// there belong to it.
    pub fn enter<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        let path = PathBuf::from("/run/netns").join(&self.name);
        let file =
            std::fs::File::open(&path).with_context(|| format!("open {}", path.display()))?;
        let handle = std::thread::spawn(move || {
            // SAFETY: setns on this thread only, with a valid namespace fd.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        });
        handle
            .join()
            .map_err(|_| anyhow::anyhow!("thread in {} panicked", self.name))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = sh(&format!("ip netns pids {}", self.name)).map(|pids| {
            for pid in pids.split_whitespace() {
                let _ = sh(&format!("kill -9 {pid}"));
            }
        });
        let _ = sh(&format!("ip netns del {}", self.name));
    }
}

/// A client and a server namespace joined by a veth pair, IPv4 and IPv6.
pub struct Pair {
    pub client: Netns,
    pub server: Netns,
}

impl Pair {
    pub const CLIENT4: &'static str = "10.77.0.1";
    pub const SERVER4: &'static str = "10.77.0.2";
    pub const CLIENT6: &'static str = "fd77::1";
    pub const SERVER6: &'static str = "fd77::2";
    /// The server side of the veth pair, where dnstrace attaches.
    pub const SERVER_IF: &'static str = "vs";

    pub fn new() -> Result<Self> {
        let client = Netns::new("c")?;
        let server = Netns::new("s")?;
        sh(&format!(
            "ip link add vc netns {} type veth peer name vs netns {}",
            client.name, server.name
        ))?;
        for (ns, dev, v4, v6) in [
            (&client, "vc", Self::CLIENT4, Self::CLIENT6),
            (&server, "vs", Self::SERVER4, Self::SERVER6),
        ] {
            ns.ip(&format!("addr add {v4}/24 dev {dev}"))?;
            ns.ip(&format!("-6 addr add {v6}/64 dev {dev} nodad"))?;
            ns.ip(&format!("link set {dev} up"))?;
        }
        Ok(Self { client, server })
    }
}

/// A child process killed on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// dnsmasq serving `args` (e.g. `--host-record=...`) on the server side.
pub fn dnsmasq(ns: &Netns, args: &[&str]) -> Result<Proc> {
    dnsmasq_in(&ns.name, &[Pair::SERVER4, Pair::SERVER6], args)
}

/// dnsmasq in the namespace `netns` (a name under /run/netns) on the
/// addresses `listen`, serving `args`; returns once it listens on the first.
pub fn dnsmasq_in(netns: &str, listen: &[&str], args: &[&str]) -> Result<Proc> {
    let child = Command::new("ip")
        .args(["netns", "exec", netns, "dnsmasq"])
        .args([
            "--keep-in-foreground",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--user=root",
            "--pid-file",
        ])
        .args(listen.iter().flat_map(|a| ["--listen-address", a]))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting dnsmasq (apt-get install dnsmasq-base)")?;
    let proc = Proc(child);
    let first = format!("{}:53", listen.first().context("no address to listen on")?);
    wait_for(|| {
        let ok = Command::new("ip")
            .args(["netns", "exec", netns, "ss", "-lun", "sport", "=", ":53"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains(&first))
            .unwrap_or(false);
        ok.then_some(())
    })
    .with_context(|| format!("dnsmasq did not start listening on {first} in {netns}"))?;
    Ok(proc)
}

/// Polls `f` for up to 10 seconds.
pub fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The dnstrace binary of this workspace (debug): `DNSTRACE_BIN`, as
/// `cargo xtask test` built it, or built once per test binary.
pub fn dnstrace_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| built("DNSTRACE_BIN", "debug", "dnstrace"))
}

/// An optimised dnstrace, for tests that measure what it keeps up with.
/// `cargo xtask test` builds it beside the first tests it runs
/// (`DNSTRACE_RELEASE_PENDING`): a test that asks for it before then
/// leaves at once, and runs again once it is built.
pub fn dnstrace_release_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if std::env::var_os("DNSTRACE_RELEASE_PENDING").is_some() {
            back_to_the_runner(RELEASE_EXIT, "the release build");
        }
        built("DNSTRACE_RELEASE_BIN", "release", "dnstrace")
    })
}

/// dnstrace with the layers' switches the tests set, which the user's
/// command line has not (`dnstrace/src/harness.rs`).
pub fn harness_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| built("DNSTRACE_HARNESS_BIN", "debug", "dnstrace-harness"))
}

/// The binary `var` names, or `bin` built in `profile`.
fn built(var: &str, profile: &str, bin: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(|| build(profile, bin), PathBuf::from)
}

fn build(profile: &str, bin: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args(["build", "--quiet", "--package", "dnstrace", "--bin", bin]);
    if bin == "dnstrace-harness" {
        cmd.args(["--features", "harness"]);
    }
    if profile == "release" {
        cmd.arg("--release");
    }
    assert!(
        cmd.status().expect("running cargo build").success(),
        "building dnstrace failed"
    );
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    target.join(profile).join(bin)
}

/// Which lookups a test needs dnstrace to keep. Under its defaults it
/// keeps fewer, each whole, when it is about to lose events, and which it
/// keeps depends on a random seed: a test that looks for a particular
/// lookup must not depend on whether the debug build kept up.
#[derive(Clone, Copy, Debug)]
pub enum Keep {
    /// Every lookup (`--sample 1`): the test looks for particular ones.
    Every,
    /// What dnstrace chooses (its defaults, or the `--sample` the test
    /// passes): the test asserts through the sampling mechanism.
    Sampled,
}

/// The flags that keep every lookup.
pub const EVERY_LOOKUP: [&str; 2] = ["--sample", "1"];

impl Keep {
    fn args<'a>(self, args: &[&'a str]) -> Vec<&'a str> {
        let mut all = args.to_vec();
        if let Keep::Every = self {
            all.extend(EVERY_LOOKUP);
        }
        all
    }
}

/// A running `dnstrace`, its stderr followed line by line and its stdout
/// drained as it comes (a full pipe would stall it).
pub struct Dnstrace {
    child: Child,
    stderr: mpsc::Receiver<String>,
    stdout: mpsc::Receiver<String>,
    /// Its stdout's lines read so far (`wait_stdout_for`).
    stdout_lines: Vec<String>,
    /// Dropped to let stdout be read, when it is held.
    hold: Option<mpsc::Sender<()>>,
    /// What it said on stderr: from the start until it was ready, then
    /// as read (`wait_stderr_for`, `stop`).
    pub stderr_lines: Vec<String>,
    /// Its `--ready-file`, and what it said there.
    ready_file: PathBuf,
    pub ready: serde_json::Value,
}

impl Dnstrace {
    /// Starts dnstrace in `ns` with `args`, keeping `keep`, and waits
    /// until it is capturing.
    pub fn start(ns: &Netns, keep: Keep, args: &[&str]) -> Result<Self> {
        let mut cmd = ns.cmd(dnstrace_bin().to_str().expect("utf-8 path"));
        cmd.args(keep.args(args));
        Self::spawn(cmd)
    }

    /// Starts `dnstrace-harness` in `ns` with the layers' `switches` (see
    /// `harness_bin`) before dnstrace's `args`.
    pub fn start_harness(ns: &Netns, keep: Keep, switches: &[&str], args: &[&str]) -> Result<Self> {
        let mut cmd = ns.cmd(harness_bin().to_str().expect("utf-8 path"));
        cmd.args(switches).args(keep.args(args));
        Self::spawn(cmd)
    }

    /// Starts dnstrace in the test's own network namespace.
    pub fn start_here(keep: Keep, args: &[&str]) -> Result<Self> {
        Self::start_binary(dnstrace_bin(), keep, args)
    }

    /// Starts the given dnstrace binary in the test's own network namespace.
    pub fn start_binary(bin: &Path, keep: Keep, args: &[&str]) -> Result<Self> {
        let mut cmd = Command::new(bin);
        cmd.args(keep.args(args));
        Self::spawn(cmd)
    }

    /// Starts dnstrace here in a mount namespace of its own whose
    /// /etc/hosts is `hosts`, and which looks names up there alone (its
    /// nsswitch.conf says `hosts: files`): names the test gives, and no
    /// query ever leaves for the machine's resolvers.
    pub fn start_with_hosts(hosts: &Path, keep: Keep, args: &[&str]) -> Result<Self> {
        let nsswitch = hosts.with_extension("nsswitch.conf");
        std::fs::write(&nsswitch, "hosts: files\n")?;
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/nsswitch.conf && shift 2 && exec "$@""#)
            .arg("sh")
            .arg(hosts)
            .arg(&nsswitch)
            .arg(dnstrace_bin())
            .args(keep.args(args));
        Self::spawn(cmd)
    }

    /// Starts `cmd`, which runs dnstrace in the end (a wrapper that execs
    /// it with its arguments, as `dnstrace lab exec NODE -- dnstrace …`
    /// does), `--ready-file` given after its arguments.
    pub fn start_command(cmd: Command) -> Result<Self> {
        Self::spawn(cmd)
    }

    /// Starts dnstrace here with its stdout not read until `read_stdout`,
    /// as a terminal that stops reading: once the pipe is full, its
    /// pipeline waits on the write.
    pub fn start_unread(keep: Keep, args: &[&str]) -> Result<Self> {
        let mut cmd = Command::new(dnstrace_bin());
        cmd.args(keep.args(args));
        Self::spawn_holding(cmd, true)
    }

    /// Lets stdout be read from now on.
    pub fn read_stdout(&mut self) {
        self.hold = None;
    }

    /// Whether one of its threads waits to write to a full pipe: with
    /// stdout unread, the pipeline is stalled.
    pub fn waits_on_a_pipe(&self) -> bool {
        let tasks = format!("/proc/{}/task", self.pid());
        std::fs::read_dir(tasks).is_ok_and(|tasks| {
            tasks.flatten().any(|t| {
                std::fs::read_to_string(t.path().join("wchan"))
                    .is_ok_and(|w| w.contains("pipe_write"))
            })
        })
    }

    fn spawn(cmd: Command) -> Result<Self> {
        Self::spawn_holding(cmd, false)
    }

    /// Spawns `cmd` and waits for its ready file; with `held`, its stdout
    /// is read only once `hold` is dropped.
    fn spawn_holding(mut cmd: Command, held: bool) -> Result<Self> {
        let (hold, gate) = mpsc::channel::<()>();
        let ready_file = ready_file();
        let mut child = cmd
            .arg("--ready-file")
            .arg(&ready_file)
            // An agent's flight recordings, unless a test says where: its
            // own, removed with it, not the machine's /var/lib.
            .env("DNSTRACE_FLIGHT_DIR", flights_of(&ready_file))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting dnstrace")?;
        let mut err = child.stderr.take().expect("piped stderr");
        let ready = match wait_ready(&mut child, &ready_file) {
            Ok(ready) => ready,
            Err(e) => {
                let mut said = String::new();
                let _ = err.read_to_string(&mut said);
                return Err(e.context(said)).context("dnstrace did not start capturing");
            }
        };
        // What it said before renaming the file into place is in the pipe.
        let stderr_lines = read_waiting(&mut err)?.lines().map(String::from).collect();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let out = child.stdout.take().expect("piped stdout");
        let (out_tx, stdout) = mpsc::channel();
        std::thread::spawn(move || {
            // Returns once `hold` is dropped.
            let _ = gate.recv();
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = out_tx.send(line);
            }
        });
        Ok(Self {
            child,
            stderr: rx,
            stdout,
            stdout_lines: Vec::new(),
            hold: held.then_some(hold),
            stderr_lines,
            ready_file,
            ready,
        })
    }

    /// Waits up to `wait` for a stderr line containing `needle`.
    pub fn wait_stderr_for(&mut self, needle: &str, wait: Duration) -> Result<()> {
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            match self.stderr.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    let found = line.contains(needle);
                    self.stderr_lines.push(line);
                    if found {
                        return Ok(());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        bail!("no {needle:?} on stderr; got {:?}", self.stderr_lines)
    }

    /// Waits up to `wait` for a JSON line on stdout that `wanted` picks,
    /// as it comes; what it read stays for `stop`.
    pub fn wait_stdout_for(
        &mut self,
        wait: Duration,
        mut wanted: impl FnMut(&serde_json::Value) -> bool,
    ) -> Result<serde_json::Value> {
        let deadline = Instant::now() + wait;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self
                .stdout
                .recv_timeout(left.min(Duration::from_millis(100)))
            {
                Ok(line) => {
                    let json = serde_json::from_str(&line).ok();
                    self.stdout_lines.push(line);
                    if let Some(j) = json.filter(|j| wanted(j)) {
                        return Ok(j);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        bail!(
            "no such line on stdout in {wait:?}; got {} lines, stderr {:?}",
            self.stdout_lines.len(),
            self.stderr_lines
        )
    }

    /// The process id (`ip netns exec` runs dnstrace in its own place).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (SIGSTOP, SIGCONT…) to dnstrace.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child.
        let rc = unsafe { libc::kill(self.pid() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }

    /// Kernel ids of the programs dnstrace reported attaching.
    pub fn prog_ids(&self) -> Vec<u32> {
        self.ready["prog_ids"]
            .as_array()
            .expect("prog_ids in the ready file")
            .iter()
            .filter_map(|id| id.as_u64()?.try_into().ok())
            .collect()
    }

    /// Sends `signal`, waits for exit; returns the status, stdout and stderr.
    pub fn stop(mut self, signal: i32) -> Result<(ExitStatus, String, Vec<String>)> {
        self.read_stdout();
        // Let the last packets reach the ring buffer.
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let status = self.child.wait()?;
        // The reader ends with the pipe.
        self.stdout_lines.extend(self.stdout.iter());
        let mut out = self.stdout_lines.join("\n");
        if !out.is_empty() {
            out.push('\n');
        }
        self.stderr_lines.extend(self.stderr.iter());
        Ok((status, out, std::mem::take(&mut self.stderr_lines)))
    }
}

impl Drop for Dnstrace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // dnstrace removes it, unless killed.
        let _ = std::fs::remove_file(&self.ready_file);
        let _ = std::fs::remove_dir_all(flights_of(&self.ready_file));
    }
}

/// Where the dnstrace of `ready_file` keeps its flight recordings.
fn flights_of(ready_file: &Path) -> PathBuf {
    ready_file.with_extension("flights")
}

/// A path of its own for each dnstrace a test starts.
fn ready_file() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("dnstrace-ready-{}-{n}.json", std::process::id()))
}

/// Waits for dnstrace's ready file and returns what it says there.
fn wait_ready(child: &mut Child, path: &Path) -> Result<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(text) = std::fs::read_to_string(path) {
            return serde_json::from_str(&text).with_context(|| format!("ready file {text:?}"));
        }
        if let Some(status) = child.try_wait()? {
            bail!("exited with {status} before it was ready");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("no ready file {} in 20 s", path.display())
}

/// What is in `pipe` now, without waiting for more.
fn read_waiting(pipe: &mut std::process::ChildStderr) -> Result<String> {
    let fd = pipe.as_raw_fd();
    // SAFETY: fcntl on a descriptor `pipe` owns; the flags are restored.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
    let mut bytes = Vec::new();
    let read = pipe.read_to_end(&mut bytes);
    unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
    match read {
        Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => Err(e.into()),
        _ => Ok(String::from_utf8_lossy(&bytes).into_owned()),
    }
}

/// The JSON object dnstrace writes last on stderr at exit with `-o json`
/// (`{"event":"exit",…}`): its counts.
pub fn exit_summary(stderr: &[String]) -> serde_json::Value {
    stderr
        .iter()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["event"] == "exit")
        .unwrap_or_else(|| panic!("no exit summary: {stderr:?}"))
}

/// A query built by hand: id, one question of `qtype` for `name`, RD set.
pub fn query_bytes(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    q
}

/// Sends `payloads` from a UDP socket in `ns` to `server`, waiting up to
/// `wait` for each reply; returns the replies that came.
pub fn udp_exchange(
    ns: &Netns,
    server: &str,
    payloads: Vec<Vec<u8>>,
    wait: Duration,
) -> Result<Vec<Vec<u8>>> {
    let server = server.to_owned();
    ns.enter(move || -> Result<Vec<Vec<u8>>> {
        let bind = if server.starts_with('[') {
            "[::]:0"
        } else {
            "0.0.0.0:0"
        };
        let sock = UdpSocket::bind(bind)?;
        sock.set_read_timeout(Some(wait))?;
        let mut replies = Vec::new();
        for p in payloads {
            sock.send_to(&p, &server)?;
            let mut buf = [0u8; 4096];
            if let Ok((n, _)) = sock.recv_from(&mut buf) {
                replies.push(buf[..n].to_vec());
            }
        }
        Ok(replies)
    })?
}

/// Output lines of `dnstrace --output json`, parsed.
pub fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

/// Runs the dnstrace binary with `args`, returning its output whatever the exit.
pub fn dnstrace(args: &[&str]) -> std::process::Output {
    Command::new(dnstrace_bin())
        .args(args)
        .output()
        .expect("running dnstrace")
}

/// The query id in dig's output.
pub fn dig_id(out: &str) -> Option<u16> {
    out.lines()
        .find_map(|l| l.split("id: ").nth(1))
        .and_then(|s| s.trim().parse().ok())
}

/// dig's status word (NOERROR, NXDOMAIN...), or "timeout".
pub fn dig_status(out: &str) -> String {
    out.lines()
        .find_map(|l| l.split("status: ").nth(1))
        .and_then(|s| s.split(',').next())
        .map_or_else(|| "timeout".to_owned(), str::to_owned)
}

/// A name no cache has seen.
pub fn fresh(label: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{label}-{}-{}.example.com",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A process held to a share of one CPU, as a busy node's tracer may be:
/// a cgroup of its own (cgroup v2's `cpu.max`, or v1's cpu controller),
/// removed on drop.
pub struct CpuLimit {
    dir: PathBuf,
}

impl CpuLimit {
    /// Holds `pid` (all its threads) to `percent` of a CPU.
    pub fn new(pid: u32, percent: u32) -> Self {
        let (parent, v2) = if std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"))
        {
            (PathBuf::from("/sys/fs/cgroup"), true)
        } else if Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists() {
            (PathBuf::from("/sys/fs/cgroup/cpu"), false)
        } else {
            panic!("no cgroup cpu controller (v2 cpu.max or v1 cpu) to limit dnstrace with");
        };
        let dir = parent.join(format!("dnstrace-test-{}-{pid}", std::process::id()));
        let write = |file: &str, value: &str| {
            std::fs::write(dir.join(file), value)
                .unwrap_or_else(|e| panic!("writing {value} to {}/{file}: {e}", dir.display()))
        };
        if v2 {
            // Best effort: the controller may be on already.
            let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+cpu");
        }
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let period = 100_000;
        let quota = (period * percent / 100).to_string();
        if v2 {
            write("cpu.max", &format!("{quota} {period}"));
        } else {
            write("cpu.cfs_period_us", &period.to_string());
            write("cpu.cfs_quota_us", &quota);
        }
        write("cgroup.procs", &pid.to_string());
        Self { dir }
    }
}

impl Drop for CpuLimit {
    fn drop(&mut self) {
        let parent = self.dir.parent().expect("a cgroup's parent").to_owned();
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = std::fs::write(parent.join("cgroup.procs"), pid);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The kinds of anomaly in the summary line of `dnstrace trace -o json`.
pub fn anomaly_kinds(lines: &[serde_json::Value]) -> Vec<String> {
    let summary = lines.iter().find(|l| l["type"] == "summary").unwrap();
    summary["anomalies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// A fresh directory for one test's files, removed at the end.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("dnstrace-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Two CAs, `ca` and `other`, and a certificate for each of `leaves`,
    /// `(name, the CA that signs it, its extensions as openssl's extfile
    /// lines)`, made here with Debian's openssl: `NAME.pem` and `NAME.key`.
    pub fn certificates(&self, leaves: &[(&str, &str, &str)]) {
        let key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        let mut script = format!(
            "set -e\nfor ca in ca other; do\n  openssl req -x509 {key} -days 1 -subj \"/CN=dnstrace $ca\" -keyout $ca.key -out $ca.pem 2>/dev/null\ndone\n"
        );
        for (name, ca, ext) in leaves {
            std::fs::write(self.file(&format!("{name}.ext")), ext).unwrap();
            script += &format!(
                "openssl req {key} -subj /CN={name} -keyout {name}.key -out {name}.csr 2>/dev/null\nopenssl x509 -req -in {name}.csr -CA {ca}.pem -CAkey {ca}.key -CAcreateserial -days 1 -extfile {name}.ext -out {name}.pem 2>/dev/null\n"
            );
        }
        run(Command::new("sh")
            .args(["-c", &script])
            .current_dir(&self.0))
        .expect("openssl makes the certificates");
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).output();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// UDP datagrams each named network namespace dropped for a full socket
/// receive buffer (`Udp` and `Udp6` `RcvbufErrors`), by the namespace's
/// inode, as dnstrace names a device's namespace (`eth0@4026532177`).
pub fn socket_overflows() -> std::collections::BTreeMap<u64, u64> {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return Default::default();
    };
    dir.flatten()
        .filter_map(|e| {
            let inode = std::os::unix::fs::MetadataExt::ino(&e.metadata().ok()?);
            let path = e.path();
            let snmp = run(Command::new("nsenter")
                .arg(format!("--net={}", path.display()))
                .args(["cat", "/proc/net/snmp", "/proc/net/snmp6"]))
            .ok()?;
            Some((inode, rcvbuf_errors(&snmp)))
        })
        .collect()
}

/// `RcvbufErrors` of `Udp:` in /proc/net/snmp plus `Udp6RcvbufErrors` of
/// /proc/net/snmp6.
fn rcvbuf_errors(snmp: &str) -> u64 {
    let lines: Vec<&str> = snmp.lines().collect();
    let v4 = lines.windows(2).find_map(|w| {
        let (head, values) = (w[0].strip_prefix("Udp: ")?, w[1].strip_prefix("Udp: ")?);
        let at = head.split(' ').position(|h| h == "RcvbufErrors")?;
        values.split(' ').nth(at)?.parse::<u64>().ok()
    });
    let v6 = lines.iter().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == "Udp6RcvbufErrors").then(|| f.next()?.parse::<u64>().ok())?
    });
    v4.unwrap_or(0) + v6.unwrap_or(0)
}

/// The anomalies that nothing vouches for: all but the `dropped` ones for
/// full socket buffers whose namespaces counted at least as many overflows
/// since `before`, and the `slow_answers` whose journeys among `lines` took
/// as long as the rule says. Two cores running three labs do overflow a
/// server's socket and stall a resolver at times, and saying so is no
/// false alarm; the kernel's counters and timestamps say it happened.
pub fn false_alarms<'a>(
    anomalies: impl IntoIterator<Item = &'a serde_json::Value>,
    lines: &[serde_json::Value],
    before: &std::collections::BTreeMap<u64, u64>,
) -> Vec<&'a serde_json::Value> {
    let after = socket_overflows();
    let grown = |inode: u64| {
        let was = before.get(&inode).unwrap_or(&0);
        after.get(&inode).unwrap_or(&0).saturating_sub(*was)
    };
    anomalies
        .into_iter()
        .filter(|a| match a["kind"].as_str() {
            Some("dropped") => !overflows_counted(a, grown),
            Some("slow_answers") => !slow_journeys_shown(a, lines),
            _ => true,
        })
        .collect()
}

/// Whether `a` is drops for full socket buffers, no more of them than
/// their namespaces counted (`grown`).
fn overflows_counted(a: &serde_json::Value, grown: impl Fn(u64) -> u64) -> bool {
    let evidence: Vec<&str> = a["evidence"]
        .as_array()
        .map(|e| e.iter().filter_map(|e| e.as_str()).collect())
        .unwrap_or_default();
    let inodes: Option<std::collections::BTreeSet<u64>> =
        evidence.iter().map(|e| overflow_inode(e)).collect();
    !evidence.is_empty()
        && inodes.is_some_and(|i| {
            i.into_iter().map(grown).sum::<u64>() >= a["count"].as_u64().unwrap_or(u64::MAX)
        })
}

/// Whether the journeys `a` names are among `lines`, each taking at least
/// the 200 ms the rule calls slow.
fn slow_journeys_shown(a: &serde_json::Value, lines: &[serde_json::Value]) -> bool {
    let ids: Vec<u64> = a["journeys"]
        .as_array()
        .map(|j| j.iter().filter_map(|id| id.as_u64()).collect())
        .unwrap_or_default();
    let shown: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["type"] == "journey" && l["id"].as_u64().is_some_and(|id| ids.contains(&id)))
        .collect();
    !shown.is_empty()
        && shown
            .iter()
            .all(|j| j["total_ms"].as_f64().is_some_and(|ms| ms >= 200.0))
}

/// The namespace inode of a drop for a full socket buffer, beside the
/// pod's name or alone (`... dropped on eth0 in pod kube-system/coredns-a
/// (netns 4026532177): SOCKET_RCVBUFF at ...`, `... dropped on eth0 in
/// netns 4026532177: ...`).
fn overflow_inode(evidence: &str) -> Option<u64> {
    let (place, why) = evidence.rsplit_once(" dropped on ")?.1.split_once(": ")?;
    let inode = place.rsplit_once("netns ")?.1;
    let digits = inode.split(|c: char| !c.is_ascii_digit()).next()?;
    why.starts_with("SOCKET_RCVBUFF")
        .then(|| digits.parse().ok())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflows_are_read_from_both_tables_and_named_by_inode() {
        let snmp = "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
                    Udp: 10 0 3 9 3 0\n\
                    UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
                    UdpLite: 0 0 0 0 7 0\n\
                    Udp6InErrors                    \t2\n\
                    Udp6RcvbufErrors                \t2\n";
        assert_eq!(rcvbuf_errors(snmp), 5);
        let drop = "the query for a.example.com. A from 10.244.0.11:38624 (default/web) \
                    to 10.244.0.53:53 (kube-system/coredns-a) was dropped on eth0 in pod \
                    kube-system/coredns-a (netns 4026533356): SOCKET_RCVBUFF at udp_queue_rcv_one_skb+0x437";
        assert_eq!(overflow_inode(drop), Some(4026533356));
        let unnamed = "the query for a.example.com. A from 10.244.0.11:38624 to 10.244.0.53:53 \
                    was dropped on eth0 in netns 4026533357 on node node3: SOCKET_RCVBUFF at x";
        assert_eq!(overflow_inode(unnamed), Some(4026533357));
        let other = drop.replace("SOCKET_RCVBUFF", "NETFILTER_DROP");
        assert_eq!(overflow_inode(&other), None);
    }

    #[test]
    fn a_slow_answer_is_vouched_for_only_by_slow_journeys_shown() {
        let slow = serde_json::json!({"kind": "slow_answers", "journeys": [7, 9]});
        let journey =
            |id: u64, ms: f64| serde_json::json!({"type": "journey", "id": id, "total_ms": ms});
        let none = std::collections::BTreeMap::new();
        let shown = [journey(7, 245.0), journey(9, 201.0), journey(8, 1.0)];
        assert!(false_alarms([&slow], &shown, &none).is_empty());
        let fast = [journey(7, 245.0), journey(9, 20.0)];
        assert_eq!(false_alarms([&slow], &fast, &none).len(), 1);
        assert_eq!(false_alarms([&slow], &[journey(8, 300.0)], &none).len(), 1);
    }
}
