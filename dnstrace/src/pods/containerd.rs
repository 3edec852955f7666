//! containerd: the CRI plugin runs each pod's sandbox (pause) container as a
//! task in the `k8s.io` namespace, whose runc shim keeps the bundle at
//! `<state>/io.containerd.runtime.v2.task/k8s.io/<id>/` with the OCI spec
//! (`config.json`) and the pause process's pid (`init.pid`). The CRI
//! annotations (containerd `pkg/cri/annotations`) say which pod it is.
use std::path::Path;

use anyhow::Result;

use super::{spec::Spec, Inventory, Pod, Runtime};

const TASKS: &str = "io.containerd.runtime.v2.task/k8s.io";
const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
const SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
const SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
const SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";

/// The pod sandboxes under containerd's state directory `root`.
pub fn read(root: &Path, inv: &mut Inventory) {
    let tasks = root.join(TASKS);
    match super::sandbox_dirs(&tasks) {
        Ok(dirs) => {
            for dir in dirs {
                let pod = read_bundle(&dir);
                super::record(inv, &dir, pod);
            }
        }
        Err(e) => inv.errors.push(format!("containerd: {e:#}")),
    }
}

/// What is under `root` where no pod was found: the k8s.io tasks (each a
/// sandbox or a container), or the top of `root` when there are none
/// (containerd 1.6 makes `<root>/s/` for its shims whatever its state).
pub fn describe(root: &Path) -> String {
    let tasks = root.join(TASKS);
    match super::sandbox_dirs(&tasks) {
        Ok(dirs) if !dirs.is_empty() => format!(
            "containerd state {}: {} k8s.io tasks, none a running pod sandbox",
            root.display(),
            dirs.len()
        ),
        _ => format!(
            "containerd state {}: no k8s.io tasks (it {})",
            root.display(),
            super::held(root)
        ),
    }
}

/// A task bundle: a pod if it is a sandbox, None for the pod's containers
/// (and for tasks that are not the CRI plugin's).
fn read_bundle(dir: &Path) -> Result<Option<Pod>> {
    let spec = Spec::read(&dir.join("config.json"))?;
    if spec.annotation(CONTAINER_TYPE) != Some("sandbox") {
        return Ok(None);
    }
    let [name, namespace, uid] =
        spec.fields([&[SANDBOX_NAME], &[SANDBOX_NAMESPACE], &[SANDBOX_UID]])?;
    let pid = super::read_pid(&dir.join("init.pid"))?;
    Ok(Some(Pod {
        runtime: Runtime::Containerd,
        sandbox_id: super::dir_name(dir),
        namespace,
        name,
        uid,
        netns: spec.netns_path().map(Path::to_path_buf),
        pid: Some(pid),
        resolv_conf: spec.resolv_conf_source().map(Path::to_path_buf),
    }))
}
