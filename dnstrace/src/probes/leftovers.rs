//! tc filters attached over netlink outlive their process: a dnstrace
//! killed with SIGKILL leaves them (and a clsact qdisc it added) on the
//! interface, still running. Each instance keeps a ledger of what it
//! attached; the next start removes what dead instances left.
use std::{
    fs, io,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use aya::programs::{
    tc::{SchedClassifierLink, TcHandle},
    TcAttachType,
};
use serde::{Deserialize, Serialize};

const DIR: &str = "/run/dnstrace";

/// What one instance attached to one interface.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub netns: u32,
    pub iface: String,
    pub ifindex: u32,
    pub qdisc_added: bool,
    /// (ingress, priority, handle) of each filter.
    pub filters: Vec<(bool, u16, u32)>,
}

/// This instance's ledger, removed when it ends cleanly.
pub struct Ledger {
    path: PathBuf,
    entries: Vec<Entry>,
}

impl Ledger {
    pub fn new() -> Self {
        Self {
            path: Path::new(DIR).join(format!("tc-{}.json", std::process::id())),
            entries: Vec::new(),
        }
    }

    /// Notes an interface's filters, on disk before anything else happens.
    pub fn add(&mut self, entry: Entry) -> io::Result<()> {
        self.entries.push(entry);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(DIR)?;
        let json = serde_json::to_vec(&self.entries).map_err(io::Error::other)?;
        let tmp = self.path.with_extension("tmp");
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| io::Write::write_all(&mut f, &json))?;
        fs::rename(&tmp, &self.path)
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        if !self.entries.is_empty() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Whether `pid` is a running dnstrace (not a reused pid).
fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "dnstrace")
}

/// Removes what dead instances left in network namespace `netns`; returns
/// one line per interface cleaned, or why it could not be.
pub fn reap(netns: u32) -> Vec<String> {
    let Ok(dir) = fs::read_dir(DIR) else {
        return Vec::new();
    };
    let mut said = Vec::new();
    for path in dir.flatten().map(|e| e.path()) {
        let Some(pid) = ledger_pid(&path) else {
            continue;
        };
        if pid == std::process::id() || alive(pid) {
            continue;
        }
        let entries: Vec<Entry> = fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let (here, elsewhere): (Vec<Entry>, Vec<Entry>) =
            entries.into_iter().partition(|e| e.netns == netns);
        said.extend(here.iter().map(|e| remove(e, pid)));
        let kept = match elsewhere.is_empty() {
            true => fs::remove_file(&path),
            false => serde_json::to_vec(&elsewhere)
                .map_err(io::Error::other)
                .and_then(|json| fs::write(&path, json)),
        };
        if let Err(e) = kept {
            said.push(format!("could not update {}: {e}", path.display()));
        }
    }
    said
}

fn ledger_pid(path: &Path) -> Option<u32> {
    path.file_name()?
        .to_str()?
        .strip_prefix("tc-")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// Removes one interface's leftovers: the whole qdisc if the dead instance
/// added it, else its filters one by one.
fn remove(e: &Entry, pid: u32) -> String {
    let now = crate::probes::Iface::lookup(&e.iface, e.netns).map(|i| i.index);
    if now.ok() != Some(e.ifindex) {
        return format!(
            "{} (ifindex {}), left by dnstrace pid {pid}, is gone: nothing to remove",
            e.iface, e.ifindex
        );
    }
    let done = if e.qdisc_added {
        super::netlink::delete_clsact(e.ifindex)
    } else {
        e.filters
            .iter()
            .try_for_each(|(ingress, priority, handle)| detach(e, *ingress, *priority, *handle))
    };
    match done {
        Ok(()) => format!(
            "removed the tc filters a dead dnstrace (pid {pid}) left on {}",
            e.iface
        ),
        Err(err) => format!(
            "could not remove what a dead dnstrace (pid {pid}) left on {}: {err}",
            e.iface
        ),
    }
}

fn detach(e: &Entry, ingress: bool, priority: u16, handle: u32) -> io::Result<()> {
    let kind = match ingress {
        true => TcAttachType::Ingress,
        false => TcAttachType::Egress,
    };
    let link =
        SchedClassifierLink::attached(&e.iface, kind, priority, TcHandle::from(handle), None)?;
    aya::programs::links::Link::detach(link).map_err(io::Error::other)
}
