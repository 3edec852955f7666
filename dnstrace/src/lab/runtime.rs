//! The lab's pods as a container runtime leaves them on a node: containerd's
//! task bundles for the k8s.io namespace, whose OCI config carries the CRI
//! annotations and the network namespace path. Written under the lab's own
//! directory, never the node's real runtime state.
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde_json::json;

use super::plan::{Pod, LAB_DIR};

/// The lab's stand-in for /run/containerd.
pub fn containerd_root() -> PathBuf {
    PathBuf::from(LAB_DIR).join("containerd")
}

pub fn write_sandbox(pod: &Pod, pid: u32) -> Result<()> {
    let dir = containerd_root()
        .join("io.containerd.runtime.v2.task/k8s.io")
        .join(pod.sandbox_id());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let config = json!({
        "ociVersion": "1.1.0",
        "process": { "args": ["/pause"], "cwd": "/" },
        "root": { "path": "rootfs", "readonly": true },
        "hostname": pod.name,
        "annotations": {
            "io.kubernetes.cri.container-type": "sandbox",
            "io.kubernetes.cri.sandbox-id": pod.sandbox_id(),
            "io.kubernetes.cri.sandbox-name": pod.name,
            "io.kubernetes.cri.sandbox-namespace": pod.namespace,
            "io.kubernetes.cri.sandbox-uid": pod.uid(),
            "io.kubernetes.cri.sandbox-log-directory": format!("/var/log/pods/{}_{}_{}", pod.namespace, pod.name, pod.uid()),
        },
        "linux": {
            "namespaces": [
                { "type": "pid" },
                { "type": "ipc" },
                { "type": "uts" },
                { "type": "mount" },
                { "type": "network", "path": netns_path(&pod.netns()) },
            ]
        }
    });
    write(
        &dir.join("config.json"),
        &serde_json::to_string_pretty(&config)?,
    )?;
    write(&dir.join("init.pid"), &pid.to_string())
}

pub fn netns_path(name: &str) -> String {
    format!("/var/run/netns/{name}")
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
