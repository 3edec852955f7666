//! Builds the eBPF programs (crate `dnstrace-ebpf`) for the bpf target and
//! leaves the objects in OUT_DIR, where `probes.rs` embeds them: the
//! programs, and the same built to log why they skip packets (`--debug-bpf`);
//! and the lab's socket-level balancer, which `lab::socketlb` embeds.
//!
//! Two toolchains work: Debian's rustc with its precompiled core for
//! `bpfel-unknown-none` (`cargo xtask setup` installs it), or a rustup
//! nightly with `rust-src` (`-Z build-std=core`); both need bpf-linker.
//! `DNSTRACE_EBPF_TOOLCHAIN` (`debian`, `nightly`, or `none` for a build
//! without the programs) picks one; otherwise the first that is present.
//!
//! Without one, as aya-template does, a debug build (`cargo build`, `cargo
//! check`, an editor's checks) leaves empty objects and warns; the binary
//! then says it has no programs when asked to trace. A release build fails.
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
    if let Err(e) = observer() {
        eprintln!("error: generating the agent's API (proto/dnstrace/v1/observer.proto) failed: {e}; it needs protoc: run `cargo xtask setup`");
        std::process::exit(1);
    }
}

/// The agent's API for cluster views, from its proto (protoc, as k8s-cri's
/// build needs too). Said to cargo by hand: once `build` names what it
/// watches, cargo reruns this script for those alone.
fn observer() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure().compile_protos(&["proto/dnstrace/v1/observer.proto"], &["proto"])
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
    println!("cargo:rerun-if-env-changed=DNSTRACE_EBPF_TARGET_DIR");
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let target_dir = ebpf_target_dir(&out);
    let Some(toolchain) = toolchain()? else {
        return stub(&out);
    };
    // The same programs twice: as they run, and logging why they skip
    // packets (`--debug-bpf`), so that the first carry no logging code.
    for (features, bin, name) in OBJECTS {
        let obj = build_object(toolchain, root, &target_dir, features)?.join(bin);
        std::fs::copy(&obj, out.join(name)).map_err(|e| format!("copy {}: {e}", obj.display()))?;
    }
    Ok(())
}

/// Where the eBPF crate is built: `DNSTRACE_EBPF_TARGET_DIR`, or `ebpf`
/// in the target directory. The objects are the same whatever the host's
/// profile and features (always optimised, for the bpf target), so every
/// build of dnstrace (check, test, debug, release) shares one build of
/// them, which cargo keeps up to date.
fn ebpf_target_dir(out: &Path) -> PathBuf {
    if let Some(dir) = env::var_os("DNSTRACE_EBPF_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    // OUT_DIR is <target>/<profile>/build/<package>/out.
    out.ancestors()
        .nth(4)
        .map_or_else(|| out.join("ebpf-target"), |target| target.join("ebpf"))
}

/// The objects embedded, by the eBPF crate's features and bin. Cargo
/// builds each feature set once, so the balancer costs no build of its own.
const OBJECTS: [(&str, &str, &str); 3] = [
    ("", "dnstrace", "dnstrace-ebpf.o"),
    ("log", "dnstrace", "dnstrace-ebpf-log.o"),
    ("", "socketlb", "socketlb.o"),
];

const NO_TOOLCHAIN: &str = "no eBPF toolchain: run `cargo xtask setup` to install it";

/// Empty objects, for a debug build without the toolchain: everything
/// builds and checks, and the binary refuses to trace (`probes::OBJECT`).
fn stub(out: &Path) -> Result<(), String> {
    if env::var("PROFILE").as_deref() == Ok("release") {
        return Err(NO_TOOLCHAIN.into());
    }
    for (_, _, name) in OBJECTS {
        let path = out.join(name);
        // Written once: a new file each run would rebuild the crate each run.
        if std::fs::metadata(&path).map_or(true, |m| m.len() != 0) {
            std::fs::write(&path, []).map_err(|e| format!("write {name}: {e}"))?;
        }
    }
    // Build for real once the toolchain is installed.
    for path in [
        DEBIAN_RUSTC.into(),
        DEBIAN_BPF_STD.into(),
        cargo_bin().join("bpf-linker"),
    ] {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-env-changed=PATH");
    println!("cargo:warning={NO_TOOLCHAIN}; this build has no eBPF programs and cannot trace");
    Ok(())
}

#[derive(Clone, Copy)]
enum Toolchain {
    Debian,
    Nightly,
}

/// The toolchain asked for or found; `None` where there is none.
fn toolchain() -> Result<Option<Toolchain>, String> {
    let debian = || Path::new(DEBIAN_RUSTC).exists() && Path::new(DEBIAN_BPF_STD).exists();
    let found = match env::var("DNSTRACE_EBPF_TOOLCHAIN").unwrap_or_default().as_str() {
        "none" => None,
        "debian" => debian().then_some(Toolchain::Debian),
        "nightly" => nightly_has_rust_src().then_some(Toolchain::Nightly),
        "" if debian() => Some(Toolchain::Debian),
        "" => nightly_has_rust_src().then_some(Toolchain::Nightly),
        other => {
            return Err(format!(
                "DNSTRACE_EBPF_TOOLCHAIN={other}: expected `debian` (needs {DEBIAN_RUSTC} and {DEBIAN_BPF_STD}), `nightly` or `none`"
            ))
        }
    };
    Ok(found.filter(|_| has_bpf_linker()))
}

/// A rustup nightly that can build `core` for the bpf target.
fn nightly_has_rust_src() -> bool {
    let sysroot = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .env_remove("RUSTC")
        .output();
    sysroot.is_ok_and(|o| {
        let root = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
        o.status.success() && root.join("lib/rustlib/src/rust/library/core").exists()
    })
}

fn has_bpf_linker() -> bool {
    env::split_paths(&path_with_cargo_bin()).any(|dir| dir.join("bpf-linker").is_file())
}

/// Builds the eBPF crate's bins with `features`; returns where they are.
fn build_object(
    toolchain: Toolchain,
    root: &Path,
    target_dir: &Path,
    features: &str,
) -> Result<PathBuf, String> {
    let mut cmd = toolchain_command(toolchain);
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
    Ok(target_dir.join(TARGET).join("release"))
}

fn toolchain_command(toolchain: Toolchain) -> Command {
    match toolchain {
        Toolchain::Debian => {
            let mut cmd = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            // aya-ebpf enables `asm_experimental_arch` for the bpf target.
            cmd.env("RUSTC", DEBIAN_RUSTC).env("RUSTC_BOOTSTRAP", "1");
            cmd
        }
        Toolchain::Nightly => {
            let mut cmd = Command::new("rustup");
            cmd.args(["run", "nightly", "cargo", "-Z", "build-std=core"])
                .env_remove("RUSTC")
                .env_remove("CARGO");
            cmd
        }
    }
}

/// bpf-linker is installed by `cargo install`, which a build script's PATH may lack.
fn path_with_cargo_bin() -> String {
    let path = env::var("PATH").unwrap_or_default();
    format!("{}:{path}", cargo_bin().display())
}

fn cargo_bin() -> PathBuf {
    let home = env::var("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env::var("HOME").unwrap_or_default()).join(".cargo"));
    home.join("bin")
}
