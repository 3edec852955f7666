//! Installs the eBPF toolchain and the programs the tests drive, skipping
//! whatever is already there. See shared/KERNEL-AND-TOOLCHAIN.md for why
//! these exact pieces.
use std::{path::Path, process::Command};

use anyhow::{bail, Result};

use crate::check;

/// Debian's rustc with a precompiled `core` for the bpf targets, and LLVM for bpf-linker.
const TOOLCHAIN_PACKAGES: &[&str] = &[
    "rustc-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
];
/// jemalloc, dnstrace's allocator, built (`cargo xtask` links it rather
/// than build it from its C sources, which a plain `cargo build` does
/// with gcc and make), and protoc, which the CRI bindings (k8s-cri) are
/// generated with.
const BUILD_PACKAGES: &[&str] = &["gcc", "make", "libjemalloc-dev", "protobuf-compiler"];
/// Real programs the tests and the demo run.
const TEST_PACKAGES: &[&str] = &[
    "dnsmasq-base",
    "unbound",
    "bind9-dnsutils",
    "iproute2",
    "iptables",
    "nftables",
    "conntrack",
    "tcpdump",
    "tshark",
    // editcap and mergecap: recordings cut and merged (record::tests::tools).
    "wireshark-common",
    "bpftool",
    "util-linux",
    "tmux",
    // A real containerd with its CRI plugin, runc, the CNI plugins, and the
    // static busybox its pause image is built from (tests/tests/cri.rs).
    "containerd",
    "runc",
    "containernetworking-plugins",
    "busybox-static",
    // A real Prometheus scrapes the agent (tests/tests/agent.rs), asked
    // through its HTTP API with curl; promtool checks the page.
    "prometheus",
    "curl",
    // The cluster view's certificates, made as docs/CLUSTER.md makes them
    // (tests/tests/cluster_view.rs).
    "openssl",
    // The agent's image is built and run with podman (tests/tests/image.rs),
    // with the system's CA roots (an https OTLP collector).
    "podman",
    "ca-certificates",
    // Load for the agent's exact counts (tests/tests/agent.rs).
    "dnsperf",
    // htpasswd: the bcrypt hash of the agent's web config's basic auth user
    // (tests/tests/agent.rs).
    "apache2-utils",
];

pub fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub fn run() -> Result<()> {
    let mut wanted: Vec<&str> = [BUILD_PACKAGES, TEST_PACKAGES].concat();
    if !nightly_with_rust_src() {
        wanted.extend(TOOLCHAIN_PACKAGES);
    }
    ensure_packages(&wanted)?;
    if !has_bpf_linker() {
        install_bpf_linker()?;
    }
    Ok(())
}

/// Installs the Debian packages of `wanted` that are missing.
pub fn ensure_packages(wanted: &[&str]) -> Result<()> {
    let missing: Vec<&str> = wanted.iter().copied().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        if !is_root() {
            bail!(
                "missing Debian packages {}: run this as root (sudo) to install them",
                missing.join(" ")
            );
        }
        eprintln!("xtask: installing {}", missing.join(" "));
        check(Command::new("apt-get").args(["update", "-q"]))?;
        check(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    Ok(())
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn has_bpf_linker() -> bool {
    Command::new("bpf-linker")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
        || cargo_bin("bpf-linker").exists()
}

fn cargo_bin(name: &str) -> std::path::PathBuf {
    let home = std::env::var("CARGO_HOME").map_or_else(
        |_| Path::new(&std::env::var("HOME").unwrap_or_default()).join(".cargo"),
        Into::into,
    );
    home.join("bin").join(name)
}

/// The usual aya setup elsewhere: a rustup nightly with rust-src and a prebuilt bpf-linker.
fn nightly_with_rust_src() -> bool {
    let Ok(out) = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
    else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    out.status.success()
        && Path::new(&sysroot)
            .join("lib/rustlib/src/rust/library/core")
            .exists()
        && has_bpf_linker()
}

fn install_bpf_linker() -> Result<()> {
    eprintln!("xtask: building bpf-linker against Debian's LLVM 22 (a few minutes)");
    let path = format!(
        "/usr/lib/llvm-22/bin:{}",
        std::env::var("PATH").unwrap_or_default()
    );
    check(
        crate::cargo_cmd()
            .args([
                "install",
                "--locked",
                "bpf-linker",
                "--version",
                "0.13.0",
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("PATH", path)
            .env("LLVM_PREFIX", "/usr/lib/llvm-22"),
    )
}
