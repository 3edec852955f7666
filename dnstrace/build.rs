//! Builds the eBPF programs (crate `dnstrace-ebpf`) for the bpf target and
//! leaves the objects in OUT_DIR, where `probes.rs` embeds them: the
//! programs, and the same built to log why they skip packets (`--debug-bpf`).
//!
//! Two toolchains work: Debian's rustc with its precompiled core for
//! `bpfel-unknown-none` (`cargo xtask setup` installs it), or a rustup
//! nightly with `rust-src` (`-Z build-std=core`). `DNSTRACE_EBPF_TOOLCHAIN`
//! (`debian` or `nightly`) picks one; otherwise the first that is present.
use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

const TARGET: &str = "bpfel-unknown-none";
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_BPF_STD: &str = "/usr/lib/rustlib/bpfel-unknown-none/lib";

fn main() {
    if let Err(e) = build() {
        eprintln!("error: building the eBPF programs failed: {e}");
        std::process::exit(1);
    }
}

fn build() -> Result<(), String> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let root = manifest.parent().ok_or("no workspace root")?;
    for p in [
        "dnstrace-ebpf/src",
        "dnstrace-ebpf/Cargo.toml",
        "dnstrace-common/src",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=DNSTRACE_EBPF_TOOLCHAIN");
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let target_dir = out.join("ebpf-target");
    // The same programs twice: as they run, and logging why they skip
    // packets (`--debug-bpf`), so that the first carry no logging code.
    for (features, name) in [("", "dnstrace-ebpf.o"), ("log", "dnstrace-ebpf-log.o")] {
        let obj = build_object(root, &target_dir, features)?;
        std::fs::copy(&obj, out.join(name)).map_err(|e| format!("copy {}: {e}", obj.display()))?;
    }
    Ok(())
}

/// Builds the eBPF crate with `features`; returns where the object is.
fn build_object(root: &Path, target_dir: &Path, features: &str) -> Result<PathBuf, String> {
    let mut cmd = toolchain_command()?;
    cmd.current_dir(root)
        .args([
            "build",
            "--release",
            "--package",
            "dnstrace-ebpf",
            "--bins",
            "--target",
            TARGET,
            "--features",
            features,
        ])
        .arg("--target-dir")
        .arg(target_dir)
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "-Cdebuginfo=2\x1f-Clink-arg=--btf",
        )
        .env("PATH", path_with_cargo_bin());
    // The outer build's settings are for the host, not for the bpf target.
    for key in [
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
    ] {
        cmd.env_remove(key);
    }
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!(
            "{cmd:?} exited with {status}; run `cargo xtask setup` to install the eBPF toolchain"
        ));
    }
    Ok(target_dir.join(TARGET).join("release").join("dnstrace"))
}

fn toolchain_command() -> Result<Command, String> {
    let choice = env::var("DNSTRACE_EBPF_TOOLCHAIN").unwrap_or_default();
    let debian = Path::new(DEBIAN_RUSTC).exists() && Path::new(DEBIAN_BPF_STD).exists();
    match choice.as_str() {
        "debian" | "" if debian => {
            let mut cmd = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            // aya-ebpf enables `asm_experimental_arch` for the bpf target.
            cmd.env("RUSTC", DEBIAN_RUSTC).env("RUSTC_BOOTSTRAP", "1");
            Ok(cmd)
        }
        "nightly" | "" => {
            let mut cmd = Command::new("rustup");
            cmd.args(["run", "nightly", "cargo", "-Z", "build-std=core"])
                .env_remove("RUSTC")
                .env_remove("CARGO");
            Ok(cmd)
        }
        other => Err(format!(
            "DNSTRACE_EBPF_TOOLCHAIN={other}: expected `debian` (needs {DEBIAN_RUSTC} and {DEBIAN_BPF_STD}) or `nightly`"
        )),
    }
}

/// bpf-linker is installed by `cargo install`, which a build script's PATH may lack.
fn path_with_cargo_bin() -> String {
    let path = env::var("PATH").unwrap_or_default();
    let home = env::var("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env::var("HOME").unwrap_or_default()).join(".cargo"));
    format!("{}:{path}", home.join("bin").display())
}
