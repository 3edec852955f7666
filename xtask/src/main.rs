//! Developer tasks: `cargo xtask setup | test | soak | layers | demo | bench | fuzz | image`.
mod bench;
mod demo;
mod fuzz;
mod layers;
mod setup;
mod suite;

use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};

const USAGE: &str =
    "usage: cargo xtask <setup | test | soak | layers | demo | bench | fuzz | image>
  setup   install what building and testing need (idempotent)
  test    the layer check, setup, then formatting, lints and the whole test suite
          (as root): each test in a process of its own, several at once, every one
          even when one fails; a tally, and the slowest binaries and tests
          [--jobs N: tests at once, default 3] [FILTER...: only tests whose
          binary::name holds one]
  layers  check that dnstrace's modules import only from their layer and those below,
          with no cycles [--graph: print the modules by layer and what each imports]
  soak    setup, then the healthy matrix in full: 1,000 lookups a combination of the
          lab's shapes and clients, where the suite makes 300
  demo    setup, build, then trace the lab: a failure on one node, then one between nodes
  bench   setup, build, then measure dnstrace's cost on the lab (--quick, --markdown PATH)
  fuzz    setup, then each fuzz target for 10 million runs (cargo-fuzz, nightly)
          [--runs N] [--target dns|tcp_stream|fragments|event|recording] [--max-time SECONDS]
          [--sanitizer none|address]
  image   setup, build, then the agent's container image with podman, no registry and no
          network (deploy/image.sh), and its archive target/dnstrace-image.tar for
          `ctr -n k8s.io images import`";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().cloned().unwrap_or_default();
    let result = match task.as_str() {
        "setup" => setup::run(),
        // The layer check first: it needs nothing built and fails in a second.
        "test" => suite::Options::parse(&args[1..]).and_then(|o| {
            layers::check()?;
            setup::run()?;
            test(&o)
        }),
        "soak" => setup::run().and_then(|()| soak()),
        "layers" => layers::run(&args[1..]),
        "demo" => setup::run().and_then(|()| demo::run()),
        "bench" => setup::run().and_then(|()| bench::run(&args[1..])),
        "fuzz" => setup::run().and_then(|()| fuzz::run(&args[1..])),
        "image" => setup::run().and_then(|()| image()),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The agent's image, tagged with the version, and its OCI archive.
fn image() -> Result<()> {
    cargo(&["build", "--release", "--quiet", "--package", "dnstrace"])?;
    let root = workspace_root();
    let tag = format!("localhost/dnstrace:{}", env!("CARGO_PKG_VERSION"));
    check(
        Command::new(root.join("deploy/image.sh"))
            .arg(root.join("target/release/dnstrace"))
            .arg(&tag)
            .arg(root.join("target/dnstrace-image.tar")),
    )?;
    eprintln!("xtask: built {tag} and target/dnstrace-image.tar; deploy/dnstrace.yaml runs it on every node");
    Ok(())
}

/// cargo, in the workspace root.
pub fn cargo_cmd() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    if let Some(lib) = system_jemalloc() {
        cmd.env("JEMALLOC_OVERRIDE", lib);
    }
    cmd
}

/// The system's jemalloc (Debian's libjemalloc-dev, which setup installs),
/// built with position-independent code: linked in, rather than built from
/// its C sources once per profile, which took four minutes of a fresh
/// build's CPU each time. A JEMALLOC_OVERRIDE of the caller's stands.
fn system_jemalloc() -> Option<std::path::PathBuf> {
    if std::env::var_os("JEMALLOC_OVERRIDE").is_some() {
        return None;
    }
    let lib = std::path::PathBuf::from(format!(
        "/usr/lib/{}-linux-gnu/libjemalloc_pic.a",
        std::env::consts::ARCH
    ));
    lib.exists().then_some(lib)
}

pub fn cargo(args: &[&str]) -> Result<()> {
    check(cargo_cmd().args(args))
}

/// Runs `cmd`, failing if it fails.
pub fn check(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

pub fn workspace_root() -> std::path::PathBuf {
    // `cargo xtask` says which checkout it runs in: another worktree
    // sharing the target directory may have built this binary.
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || env!("CARGO_MANIFEST_DIR").into(),
        std::path::PathBuf::from,
    );
    manifest.parent().expect("workspace root").to_path_buf()
}

fn test(o: &suite::Options) -> Result<()> {
    if !setup::is_root() {
        bail!(
            "the tests load eBPF programs and make network namespaces: run `sudo cargo xtask test`"
        );
    }
    let mut phases = Phases::default();
    phases.time("formatting", || cargo(&["fmt", "--all", "--", "--check"]))?;
    let release = suite::Release::start()?;
    phases.time("the eBPF crate's lints", clippy_ebpf)?;
    // The rest is linted as it is built for the tests (suite::build).
    phases.time("building, linting and running the tests", || {
        suite::run(o, release)
    })?;
    phases.print();
    Ok(())
}

/// How long each step of `cargo xtask test` took, said at the end.
#[derive(Default)]
struct Phases(Vec<(&'static str, std::time::Duration)>);

impl Phases {
    fn time(&mut self, what: &'static str, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let started = std::time::Instant::now();
        let result = f();
        self.0.push((what, started.elapsed()));
        if result.is_err() {
            self.print();
        }
        result
    }

    fn print(&self) {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(what, d)| format!("{what} {}", suite::minutes(*d)))
            .collect();
        let total = self.0.iter().map(|(_, d)| *d).sum();
        eprintln!(
            "xtask: test took {} ({})",
            suite::minutes(total),
            parts.join(", ")
        );
    }
}

/// The workspace's target directory, wherever CARGO_TARGET_DIR points.
pub fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace_root().join("target"), Into::into)
}

/// An exclusive flock on `path`, held until the file closes; says so
/// when it has to wait.
pub fn lock_exclusive(path: &str) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd as _;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {path}"))?;
    let fd = file.as_raw_fd();
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        eprintln!("xtask: waiting for {path} (a test run or a bench is using the lab)");
        // SAFETY: as above.
        if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
            bail!("locking {path}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(file)
}

/// The healthy matrix (tests/tests/healthy.rs) at 1,000 lookups a
/// combination: docs/PERFORMANCE.md gives its figure.
fn soak() -> Result<()> {
    if !setup::is_root() {
        bail!("the soak makes network namespaces: run `sudo cargo xtask soak`");
    }
    let options = suite::Options {
        jobs: suite::JOBS,
        filters: vec!["healthy::".into()],
        env: vec![("DNSTRACE_HEALTHY_LOOKUPS", "1000".into())],
    };
    suite::run(&options, suite::Release::start()?)
}

/// The eBPF crate is linted for the host, where it needs abort-on-panic, in a
/// target dir of its own so the flag does not rebuild everything else.
fn clippy_ebpf() -> Result<()> {
    check(
        cargo_cmd()
            .args([
                "clippy",
                "--package",
                "dnstrace-ebpf",
                "--",
                "-D",
                "warnings",
            ])
            .env("RUSTFLAGS", "-C panic=abort")
            .env("CARGO_TARGET_DIR", target_dir().join("ebpf-clippy")),
    )
}
