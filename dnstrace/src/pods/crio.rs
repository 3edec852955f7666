//! CRI-O: each sandbox is a container in containers/storage, whose run
//! directory `<runroot>/<driver>-containers/<id>/userdata/` (storage's
//! `ContainerRunDirectory`; the driver is usually overlay) holds the OCI spec
//! CRI-O wrote (`config.json`, server/sandbox_run_linux.go) and, while an
//! infra (pause) process runs, its pid: conmon is given `-p <bundle>/pidfile`
//! (internal/oci/runtime_oci.go). With `drop_infra_ctr` (CRI-O's default)
//! there is no process: the sandbox is "spoofed" and only its namespaces,
//! pinned by pinns under /var/run/netns, hold it up.
//!
//! Annotations: CRI-O's own (pkg/annotations) and the kubelet's pod labels
//! (`io.kubernetes.pod.*`), which CRI-O copies into the spec.
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::{dir_name, sandbox_dirs, spec::Spec, Inventory, Pod, Runtime};

const CONTAINER_TYPE: &str = "io.kubernetes.cri-o.ContainerType";
const SPOOFED: &str = "io.kubernetes.cri-o.Spoofed";
const RESOLV_PATH: &str = "io.kubernetes.cri-o.ResolvPath";
const KUBE_NAME: &str = "io.kubernetes.cri-o.KubeName";
const NAMESPACE: &str = "io.kubernetes.cri-o.Namespace";
const POD_NAME: &str = "io.kubernetes.pod.name";
const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
const POD_UID: &str = "io.kubernetes.pod.uid";
/// Podman shares the run root; its containers say `libpod` here.
const MANAGER: &str = "io.container.manager";

/// The pod sandboxes under CRI-O's containers/storage run root `root`.
pub fn read(root: &Path, inv: &mut Inventory) {
    match container_dirs(root) {
        Ok(dirs) => {
            for dir in dirs {
                let pod = read_userdata(&dir);
                super::record(inv, &dir, pod);
            }
        }
        Err(e) => inv.errors.push(format!("cri-o: {e:#}")),
    }
}

/// What is under `root` where no pod was found.
pub fn describe(root: &Path) -> String {
    match container_dirs(root) {
        Ok(dirs) if !dirs.is_empty() => format!(
            "CRI-O run root {}: {} containers, none a running pod sandbox",
            root.display(),
            dirs.len()
        ),
        _ => format!(
            "CRI-O run root {}: no containers (it {})",
            root.display(),
            super::held(root)
        ),
    }
}

/// `<root>/<driver>-containers/<id>` for every storage driver's containers.
fn container_dirs(root: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    for store in sandbox_dirs(root)? {
        if dir_name(&store).ends_with("-containers") {
            dirs.extend(sandbox_dirs(&store)?);
        }
    }
    Ok(dirs)
}

/// A container's run directory: a pod if CRI-O ran it as a sandbox.
fn read_userdata(dir: &Path) -> Result<Option<Pod>> {
    let userdata = dir.join("userdata");
    let config = userdata.join("config.json");
    // Storage also holds containers nobody ran (image builds): no spec.
    if matches!(config.try_exists(), Ok(false)) {
        return Ok(None);
    }
    let spec = Spec::read(&config)?;
    if spec.annotation(CONTAINER_TYPE) != Some("sandbox")
        || spec.annotation(MANAGER) == Some("libpod")
    {
        return Ok(None);
    }
    let [name, namespace, uid] = spec.fields([
        &[POD_NAME, KUBE_NAME],
        &[POD_NAMESPACE, NAMESPACE],
        &[POD_UID],
    ])?;
    let pid = if spec.annotation(SPOOFED) == Some("true") {
        None
    } else {
        Some(super::read_pid(&userdata.join("pidfile"))?)
    };
    Ok(Some(Pod {
        runtime: Runtime::Crio,
        sandbox_id: dir_name(dir),
        namespace,
        name,
        uid,
        netns: spec.netns_path().map(Path::to_path_buf),
        pid,
        resolv_conf: spec
            .resolv_conf_source()
            .or(spec.annotation(RESOLV_PATH).map(Path::new))
            .map(Path::to_path_buf),
    }))
}
