//! A real containerd (Debian's, with its CRI plugin), started privately by
//! `dnstrace-harness cri-lab` in a network namespace of the test's own, on
//! a bridge and pod subnet of the test's choosing: tests that run at once
//! pick different ones.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::{harness_bin, Netns};

/// What the private containerd needs, and the package of each.
const NEEDS: &[(&str, &str)] = &[
    ("/usr/bin/containerd", "containerd"),
    ("/usr/sbin/runc", "runc"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/bin/busybox", "busybox-static"),
];

pub fn require_containerd() {
    for (path, package) in NEEDS {
        assert!(
            Path::new(path).exists(),
            "{path} is missing: apt-get install {package} (cargo xtask setup installs it)"
        );
    }
}

/// The private containerd's directory and network, brought down on drop
/// if the test did not get that far.
pub struct Runtime {
    pub dir: PathBuf,
    pub node: Netns,
    pub bridge: &'static str,
    /// e.g. 10.245.0.0/24.
    pub subnet: &'static str,
}

impl Runtime {
    fn setup_args(&self) -> Vec<String> {
        [
            "--dir",
            self.dir.to_str().unwrap(),
            "--netns",
            &self.node.name,
            "--bridge",
            self.bridge,
            "--subnet",
            self.subnet,
        ]
        .map(str::to_owned)
        .to_vec()
    }

    pub fn socket(&self) -> String {
        self.dir.join("containerd.sock").display().to_string()
    }

    /// `dnstrace-harness cri-lab COMMAND <setup> ARGS`: its stdout.
    pub fn cri_lab(&self, command: &str, args: &[&str]) -> String {
        let out = Command::new(harness_bin())
            .args(["cri-lab", command])
            .args(self.setup_args())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cri-lab {command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if self.dir.join("containerd.pid").exists() {
            let _ = Command::new(harness_bin())
                .args(["cri-lab", "down"])
                .args(self.setup_args())
                .status();
        }
    }
}
