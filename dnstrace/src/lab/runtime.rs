//! Which runtime's state the lab's pods leave. They always run in the lab's
//! real containerd (`sandboxes`); there is no real CRI-O here, so with
//! `--runtime crio` the lab also writes CRI-O's containers/storage run
//! directories for the same sandboxes (see `crate::pods` for the layout),
//! under the lab's own directory, never the node's real runtime state.
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::plan::{lab_dir, Pod};

/// Which runtime's state layout the lab leaves for `dnstrace pods`.
#[derive(clap::ValueEnum, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Runtime {
    #[default]
    Containerd,
    Crio,
}

/// The lab's stand-in for CRI-O's run root, /run/containers/storage.
pub fn crio_root() -> PathBuf {
    lab_dir().to_path_buf().join("crio")
}

/// Writes `pod`'s sandbox under `root` as CRI-O with an infra container
/// does: `overlay-containers/<id>/userdata/` with the OCI spec, whose
/// annotations are CRI-O's own plus the kubelet's pod labels, and the
/// infra process's `pidfile`.
pub fn write_crio_sandbox(root: &Path, pod: &Pod, pid: u32) -> Result<()> {
    let dir = root
        .join("overlay-containers")
        .join(pod.sandbox_id())
        .join("userdata");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let resolv = pod.resolv_conf();
    let config = json!({
        "ociVersion": "1.0.2-dev",
        "process": { "args": ["/pause"], "cwd": "/" },
        "root": { "path": "/var/lib/containers/storage/overlay/lab/merged", "readonly": true },
        "hostname": pod.name,
        "mounts": [{
            "destination": "/etc/resolv.conf",
            "type": "bind",
            "source": resolv,
            "options": ["ro", "bind", "nodev", "nosuid", "noexec"],
        }],
        "annotations": crio_annotations(pod, &resolv),
        "linux": { "namespaces": namespaces(pod) }
    });
    write(
        &dir.join("config.json"),
        &serde_json::to_string_pretty(&config)?,
    )?;
    write(&dir.join("pidfile"), &pid.to_string())
}

/// CRI-O's own annotations of a sandbox, plus the kubelet's pod labels,
/// which it copies in.
fn crio_annotations(pod: &Pod, resolv: &Path) -> Value {
    let (id, uid) = (pod.sandbox_id(), pod.uid());
    let sandbox_name = format!("k8s_{}_{}_{uid}_0", pod.name, pod.namespace);
    let labels = json!({
        "io.kubernetes.container.name": "POD",
        "io.kubernetes.pod.name": pod.name,
        "io.kubernetes.pod.namespace": pod.namespace,
        "io.kubernetes.pod.uid": uid,
    });
    let metadata = json!({ "name": pod.name, "uid": uid, "namespace": pod.namespace });
    let mut annotations = json!({
        "io.container.manager": "cri-o",
        "io.kubernetes.cri-o.ContainerType": "sandbox",
        "io.kubernetes.cri-o.SandboxID": id,
        "io.kubernetes.cri-o.ContainerID": id,
        "io.kubernetes.cri-o.Name": sandbox_name,
        "io.kubernetes.cri-o.SandboxName": sandbox_name,
        "io.kubernetes.cri-o.ContainerName": format!("k8s_POD_{}_{}_{uid}_0", pod.name, pod.namespace),
        "io.kubernetes.cri-o.KubeName": pod.name,
        "io.kubernetes.cri-o.Namespace": pod.namespace,
        "io.kubernetes.cri-o.HostNetwork": pod.role.host_network().to_string(),
        "io.kubernetes.cri-o.ResolvPath": resolv,
        "io.kubernetes.cri-o.LogPath": format!("/var/log/pods/{}_{}_{uid}/{id}.log", pod.namespace, pod.name),
        "io.kubernetes.cri-o.Metadata": metadata.to_string(),
        "io.kubernetes.cri-o.Labels": labels.to_string(),
    });
    if let (Some(all), Value::Object(labels)) = (annotations.as_object_mut(), labels) {
        all.extend(labels);
    }
    annotations
}

/// The spec's namespaces; a hostNetwork pod has no network namespace
/// entry (it keeps the node's).
fn namespaces(pod: &Pod) -> Vec<Value> {
    let network = (!pod.role.host_network())
        .then(|| json!({ "type": "network", "path": netns_path(&pod.netns()) }));
    ["pid", "ipc", "uts", "mount"]
        .map(|kind| json!({ "type": kind }))
        .into_iter()
        .chain(network)
        .collect()
}

pub fn netns_path(name: &str) -> String {
    format!("/var/run/netns/{name}")
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::{discover, testdir::TestDir, Runtime, RuntimeDirs};

    #[test]
    fn crio_sandboxes_read_back_as_the_lab_pods() {
        let root = TestDir::new();
        let pid = std::process::id();
        for pod in &crate::lab::plan::PODS {
            write_crio_sandbox(root.path(), pod, pid).unwrap();
        }
        let inv = discover(&RuntimeDirs {
            containerd: root.path().join("no-containerd"),
            crio: root.path().to_owned(),
        });
        assert_eq!(inv.errors, Vec::<String>::new());
        let mut expected: Vec<_> = crate::lab::plan::PODS.iter().collect();
        expected.sort_by_key(|p| p.full_name());
        assert_eq!(inv.pods.len(), expected.len());
        for (found, pod) in inv.pods.iter().zip(expected) {
            assert_eq!(found.runtime, Runtime::Crio);
            assert_eq!(found.full_name(), pod.full_name());
            assert_eq!(found.uid, pod.uid());
            assert_eq!(found.sandbox_id, pod.sandbox_id());
            assert_eq!(found.pid, Some(pid));
            assert_eq!(found.netns, Some(netns_path(&pod.netns()).into()));
            assert_eq!(
                found.resolv_conf,
                Some(crate::lab::netns_etc(&pod.netns()).join("resolv.conf"))
            );
        }
        assert!(crio_root().starts_with(lab_dir()));
    }

    #[test]
    fn a_host_network_sandbox_has_no_network_namespace_and_its_own_resolv_conf() {
        let root = TestDir::new();
        let pod = &crate::lab::plan::HOST_CLIENT;
        write_crio_sandbox(root.path(), pod, std::process::id()).unwrap();
        let inv = discover(&RuntimeDirs {
            containerd: root.path().join("no-containerd"),
            crio: root.path().to_owned(),
        });
        assert_eq!(inv.errors, Vec::<String>::new());
        assert_eq!(inv.pods.len(), 1);
        let found = &inv.pods[0];
        assert_eq!(found.full_name(), "logging/fluent-bit-5lq8z");
        assert_eq!(found.netns, None, "the node's, through its process");
        assert_eq!(found.resolv_conf, Some(pod.resolv_conf()));
        let spec = std::fs::read_to_string(
            root.path()
                .join("overlay-containers")
                .join(pod.sandbox_id())
                .join("userdata/config.json"),
        )
        .unwrap();
        assert!(
            spec.contains("\"io.kubernetes.cri-o.HostNetwork\": \"true\""),
            "{spec}"
        );
    }
}
