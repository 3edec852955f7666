//! Developer tasks: `cargo xtask setup | test | layers | demo | bench | fuzz | image`.
mod bench;
mod demo;
mod fuzz;
mod layers;
mod setup;
mod suite;

use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};

const USAGE: &str = "usage: cargo xtask <setup | test | layers | demo | bench | fuzz | image>
  setup   install what building and testing need (idempotent)
  test    the layer check, setup, then formatting, lints and the whole test suite
          (as root), every test binary even when one fails, and a tally of them all
  layers  check that dnstrace's modules import only from their layer and those below,
          with no cycles [--graph: print the modules by layer and what each imports]
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
        "test" => layers::check()
            .and_then(|()| setup::run())
            .and_then(|()| test()),
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
    cmd
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
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn test() -> Result<()> {
    if !setup::is_root() {
        bail!(
            "the tests load eBPF programs and make network namespaces: run `sudo cargo xtask test`"
        );
    }
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&["clippy", "--all-targets", "--", "-D", "warnings"])?;
    // The fuzz targets' entry points (`cargo xtask fuzz` runs them) and the
    // pipeline bench (`cargo xtask bench` runs it).
    cargo(&[
        "clippy",
        "--package",
        "dnstrace",
        "--features",
        "fuzzing,bench",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    clippy_ebpf()?;
    suite::run()
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
            .env(
                "CARGO_TARGET_DIR",
                workspace_root().join("target/ebpf-clippy"),
            ),
    )
}
