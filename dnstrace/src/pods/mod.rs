//! The Kubernetes pods on this node, found without the API server: from the
//! container runtime's own state (each pod is one sandbox), plus what a
//! pod's sandbox tells about its network and its resolver. Where the
//! runtime's CRI socket answers, the pods' labels, annotations and workload
//! too.
mod containerd;
pub mod cri;
mod crio;
pub mod net;
pub mod resolv;
mod spec;
#[cfg(test)]
pub mod testdir;
pub mod workload;

use std::{
    collections::BTreeMap,
    io::Read as _,
    net::IpAddr,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Containerd,
    #[serde(rename = "cri-o")]
    Crio,
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Runtime::Containerd => "containerd",
            Runtime::Crio => "cri-o",
        })
    }
}

/// Where each runtime keeps the state of what it runs; a missing directory
/// means that runtime is not on this node.
#[derive(Clone, Debug)]
pub struct RuntimeDirs {
    /// containerd's state directory (`state` in its config).
    pub containerd: PathBuf,
    /// CRI-O's containers/storage run root (`runroot` in storage.conf).
    pub crio: PathBuf,
}

pub const CONTAINERD_ROOT: &str = "/run/containerd";
pub const CRIO_ROOT: &str = "/run/containers/storage";
/// The runtimes' default CRI sockets, asked in this order.
pub const CRI_SOCKETS: [&str; 2] = ["/run/containerd/containerd.sock", "/var/run/crio/crio.sock"];

impl Default for RuntimeDirs {
    fn default() -> Self {
        Self {
            containerd: CONTAINERD_ROOT.into(),
            crio: CRIO_ROOT.into(),
        }
    }
}

/// A running pod sandbox, as its runtime recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pod {
    pub runtime: Runtime,
    pub sandbox_id: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The pinned network namespace; None where the spec names none (then
    /// it is the sandbox process's, or the node's for host-network pods).
    pub netns: Option<PathBuf>,
    /// The sandbox's pause process; None where CRI-O runs none (its
    /// default `drop_infra_ctr`).
    pub pid: Option<u32>,
    /// The node's file the runtime bind-mounts as the pod's resolv.conf.
    pub resolv_conf: Option<PathBuf>,
}

impl Pod {
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The pod's network namespace: the pinned one, else its process's.
    pub fn netns_path(&self) -> Option<PathBuf> {
        self.netns
            .clone()
            .or_else(|| self.pid.map(|pid| format!("/proc/{pid}/ns/net").into()))
    }

    /// A stopped sandbox keeps its state until the kubelet removes it (it
    /// keeps the latest dead one of each pod): its process or its pinned
    /// namespace is gone.
    fn is_running(&self) -> bool {
        match (&self.pid, &self.netns) {
            (Some(pid), _) => Path::new(&format!("/proc/{pid}")).exists(),
            (None, Some(netns)) => netns.exists(),
            (None, None) => true,
        }
    }
}

/// What only the CRI API tells about a pod: the state directories keep
/// no labels.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Metadata {
    pub workload: Option<workload::Workload>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The addresses the runtime reports (its CNI result).
    #[serde(rename = "pod_ips")]
    pub ips: Vec<IpAddr>,
}

#[derive(Debug, Default)]
pub struct Inventory {
    /// Running pods, sorted by namespace and name.
    pub pods: Vec<Pod>,
    /// One line per sandbox (or runtime directory) that could not be read.
    pub errors: Vec<String>,
    /// The CRI's metadata of the pods it answered for, by sandbox id.
    pub metadata: BTreeMap<String, Metadata>,
}

impl Inventory {
    pub fn metadata(&self, pod: &Pod) -> Option<&Metadata> {
        self.metadata.get(&pod.sandbox_id)
    }

    /// Drops stopped sandboxes and sorts by namespace and name.
    fn finish(mut self) -> Self {
        self.pods.retain(Pod::is_running);
        self.pods.sort_by(|a, b| {
            (&a.namespace, &a.name, &a.sandbox_id).cmp(&(&b.namespace, &b.name, &b.sandbox_id))
        });
        self
    }

    /// The CRI's pods replace the state directories' of the same sandbox,
    /// keeping from those what the CRI did not say; the state directories'
    /// other pods (another runtime's) stay.
    fn merge(&mut self, from_cri: Vec<(Pod, Metadata)>) {
        for (mut pod, metadata) in from_cri {
            let same = self
                .pods
                .iter()
                .position(|p| p.sandbox_id == pod.sandbox_id);
            if let Some(state) = same.map(|i| self.pods.swap_remove(i)) {
                pod.netns = pod.netns.or(state.netns);
                pod.pid = pod.pid.or(state.pid);
                pod.resolv_conf = pod.resolv_conf.or(state.resolv_conf);
            }
            self.metadata.insert(pod.sandbox_id.clone(), metadata);
            self.pods.push(pod);
        }
    }
}

/// Every running pod sandbox of both runtimes, from their state
/// directories alone (the commands also ask the CRI: `discover_with_cri`).
#[cfg(test)]
pub fn discover(dirs: &RuntimeDirs) -> Inventory {
    read_dirs(dirs).finish()
}

fn read_dirs(dirs: &RuntimeDirs) -> Inventory {
    let mut inv = Inventory::default();
    containerd::read(&dirs.containerd, &mut inv);
    crio::read(&dirs.crio, &mut inv);
    inv
}

/// What the CRI sockets said.
#[derive(Debug)]
pub enum CriAnswer {
    /// No socket to ask: none given, and no runtime's default is there.
    NoSocket,
    Answered {
        socket: PathBuf,
        runtime: cri::RuntimeVersion,
        pods: usize,
    },
    /// Every socket asked failed: one line each.
    Unanswered(Vec<String>),
}

/// The CRI sockets to ask: the one given, or each runtime's default that
/// exists (the socket is never required).
pub fn cri_sockets(given: Option<&Path>) -> Vec<PathBuf> {
    match given {
        Some(socket) => vec![socket.to_owned()],
        None => CRI_SOCKETS
            .iter()
            .map(PathBuf::from)
            .filter(|s| s.exists())
            .collect(),
    }
}

/// The pods of the state directories and, from the first of `sockets` that
/// answers, the CRI's: its pods and their metadata.
pub async fn discover_with_cri(dirs: &RuntimeDirs, sockets: &[PathBuf]) -> (Inventory, CriAnswer) {
    let mut inv = read_dirs(dirs);
    let (pods, answer) = first_answer(sockets).await;
    inv.merge(pods);
    (inv.finish(), answer)
}

/// The pods of the first of `sockets` that answers, and what each said.
pub async fn first_answer(sockets: &[PathBuf]) -> (Vec<(Pod, Metadata)>, CriAnswer) {
    let mut failures = Vec::new();
    for socket in sockets {
        match ask_cri(socket).await {
            Ok((runtime, pods)) => {
                let answer = CriAnswer::Answered {
                    socket: socket.clone(),
                    runtime,
                    pods: pods.len(),
                };
                return (pods, answer);
            }
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    let answer = if failures.is_empty() {
        CriAnswer::NoSocket
    } else {
        CriAnswer::Unanswered(failures)
    };
    (Vec::new(), answer)
}

impl CriAnswer {
    /// Says, once, that the pods come without labels or workload because
    /// no CRI socket answered; nothing when none was there to ask.
    pub fn warn_if_unanswered(&self) {
        if let CriAnswer::Unanswered(errors) = self {
            log::warn!(
                "no CRI socket answered ({}): pods from the runtimes' state directories, without labels or workload",
                errors.join("; ")
            );
        }
    }
}

async fn ask_cri(socket: &Path) -> Result<(cri::RuntimeVersion, Vec<(Pod, Metadata)>)> {
    let mut cri = cri::Cri::connect(socket).await?;
    let pods = cri.pods().await?;
    Ok((cri.version.clone(), pods))
}

/// Where pods were looked for and what was there, for an empty answer.
pub fn searched(dirs: &RuntimeDirs, answer: &CriAnswer) -> String {
    [
        containerd::describe(&dirs.containerd),
        crio::describe(&dirs.crio),
        answer.to_string(),
    ]
    .join("; ")
}

/// `CRI socket PATH (containerd 1.6.20): 3 ready sandboxes`.
impl std::fmt::Display for CriAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CriAnswer::NoSocket => write!(f, "CRI sockets {}: not there", CRI_SOCKETS.join(", ")),
            CriAnswer::Answered {
                socket,
                runtime,
                pods,
            } => write!(
                f,
                "CRI socket {} ({runtime}): {pods} ready sandboxes",
                socket.display()
            ),
            CriAnswer::Unanswered(errors) => write!(f, "CRI: {}", errors.join("; ")),
        }
    }
}

/// What a directory holds, for a runtime's that yielded no pod: `holds
/// a, b`, `is empty`, `is not there`.
fn held(dir: &Path) -> String {
    const SHOWN: usize = 6;
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            let total = names.len();
            names.truncate(SHOWN);
            if total > SHOWN {
                names.push(format!("and {} more", total - SHOWN));
            }
            if total == 0 {
                "is empty".to_owned()
            } else {
                format!("holds {}", names.join(", "))
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "is not there".to_owned(),
        Err(e) => format!("cannot be read: {e}"),
    }
}

/// The sandbox directories under `dir`; a missing `dir` has none.
fn sandbox_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            dirs.push(entry.path());
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// The last component of `dir`: the runtimes name a sandbox's directory
/// by its id.
fn dir_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// One sandbox directory's result: a pod, nothing (not a pod sandbox), or
/// an error line naming the directory.
fn record(inv: &mut Inventory, dir: &Path, result: Result<Option<Pod>>) {
    match result {
        Ok(Some(pod)) => inv.pods.push(pod),
        Ok(None) => {}
        Err(e) => inv.errors.push(format!("{}: {e:#}", dir.display())),
    }
}

/// Reads a file of at most `max` bytes as text; larger is an error, not a
/// truncation, so a runaway file is never parsed in part.
fn read_capped(path: &Path, max: u64) -> Result<String> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut text = String::new();
    file.take(max + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("reading {}", path.display()))?;
    if text.len() as u64 > max {
        bail!("{} is larger than {max} bytes: skipped", path.display());
    }
    Ok(text)
}

/// Reads a pid file: one positive decimal number.
fn read_pid(path: &Path) -> Result<u32> {
    let text = read_capped(path, 64)?;
    match text.trim().parse::<u32>() {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => bail!("{} holds no pid: {:?}", path.display(), text.trim()),
    }
}

/// The pod `query` names: `name`, `namespace/name`, or a unique prefix of
/// either; an exact match wins over prefixes.
pub fn select<'a>(pods: &'a [Pod], query: &str) -> Result<&'a Pod> {
    let matches = |exact: bool| -> Vec<&'a Pod> {
        pods.iter()
            .filter(|p| {
                let full = p.full_name();
                let candidates = [p.name.as_str(), full.as_str()];
                candidates.iter().any(|c| {
                    if exact {
                        *c == query
                    } else {
                        c.starts_with(query)
                    }
                })
            })
            .collect()
    };
    let exact = matches(true);
    let found = if exact.is_empty() {
        matches(false)
    } else {
        exact
    };
    match found.as_slice() {
        [pod] => Ok(pod),
        [] => bail!(
            "no pod matches {query:?} on this node; pods: {}",
            name_list(pods.iter())
        ),
        many => bail!(
            "{query:?} matches {} pods: {}; give namespace/name or a longer prefix",
            many.len(),
            name_list(many.iter().copied())
        ),
    }
}

/// `a/b, c/d`, cut after a few with a count of the rest.
fn name_list<'a>(pods: impl ExactSizeIterator<Item = &'a Pod>) -> String {
    const SHOWN: usize = 8;
    let total = pods.len();
    if total == 0 {
        return "none found".to_owned();
    }
    let mut names: Vec<String> = pods.take(SHOWN).map(Pod::full_name).collect();
    if total > SHOWN {
        names.push(format!("and {} more", total - SHOWN));
    }
    names.join(", ")
}

#[cfg(test)]
mod tests;
