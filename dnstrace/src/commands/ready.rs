//! Saying, for scripts and tests, that the capture has started: every hook
//! is attached and the ring buffer is being read. One JSON object, in the
//! `--ready-file` and, with `-o json`, as a line on stderr.
use std::{
    fs::OpenOptions,
    io::Write as _,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use serde::Serialize;

use crate::{probes::Attachment, target::Scope};

/// `{"event":"ready","pid":…,"hooks":…,"prog_ids":[…],"ports":[…]}`, and
/// with `--node`, `"node":…,"scope_netns":…`.
#[derive(Serialize)]
pub struct Ready {
    event: &'static str,
    pid: u32,
    /// Programs attached.
    hooks: usize,
    /// Their kernel ids, as `bpftool prog show` lists them.
    prog_ids: Vec<u32>,
    ports: Vec<u16>,
    /// The node traced alone (`--node`).
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    /// Network namespaces in its scope at the start.
    #[serde(skip_serializing_if = "Option::is_none")]
    scope_netns: Option<usize>,
    /// A cluster view's nodes, each stream open.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    nodes: Vec<String>,
}

impl Ready {
    pub fn new(attachments: &[Attachment], ports: &[u16]) -> Self {
        Self {
            event: "ready",
            pid: std::process::id(),
            hooks: attachments.len(),
            prog_ids: attachments.iter().map(|a| a.prog_id).collect(),
            ports: ports.to_vec(),
            node: None,
            scope_netns: None,
            nodes: Vec::new(),
        }
    }

    /// A cluster view's, once the nodes' streams are open.
    pub fn view(nodes: Vec<String>, ports: &[u16]) -> Self {
        Self {
            nodes,
            ..Self::new(&[], ports)
        }
    }

    /// Says which node is traced alone, and how many namespaces are its.
    pub fn with_scope(mut self, scope: Option<&Scope>) -> Self {
        self.node = scope.map(|s| s.node.clone());
        self.scope_netns = scope.map(|s| s.netns.len());
        self
    }

    pub fn json(&self) -> String {
        serde_json::to_string(self).expect("plain numbers and strings")
    }

    /// Writes the file whole or not at all: a temporary file renamed into
    /// place, so a reader never sees half of it. Removed again on drop.
    pub fn write(&self, path: &Path) -> Result<ReadyFile> {
        let temp = PathBuf::from(format!("{}.{}.tmp", path.display(), self.pid));
        // A new file only: as root, never follow a link someone left.
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&temp)
            .with_context(|| format!("creating {}", temp.display()))?;
        let written = writeln!(f, "{}", self.json()).and_then(|()| f.sync_all());
        let moved = written.and_then(|()| std::fs::rename(&temp, path));
        if let Err(e) = moved {
            let _ = std::fs::remove_file(&temp);
            return Err(e).with_context(|| format!("writing the ready file {}", path.display()));
        }
        Ok(ReadyFile(path.to_owned()))
    }
}

/// The ready file, removed when the capture ends: one left behind would
/// say a stopped dnstrace is still capturing.
pub struct ReadyFile(PathBuf);

impl Drop for ReadyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_appears_whole_replaces_a_stale_one_and_goes_at_the_end() {
        let dir = std::env::temp_dir().join(format!("dnstrace-ready-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ready.json");
        std::fs::write(&path, "stale").unwrap();
        let hook = Attachment {
            program: "dns_tc_ingress",
            prog_id: 7,
            target: "vs".into(),
            how: "tcx",
        };
        let written = Ready::new(&[hook], &[53]).write(&path).unwrap();
        let said: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(said["event"], "ready");
        assert_eq!(said["pid"], std::process::id());
        assert_eq!(said["hooks"], 1);
        assert_eq!(said["prog_ids"], serde_json::json!([7]));
        assert_eq!(said["ports"], serde_json::json!([53]));
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left");
        drop(written);
        assert!(!path.exists());
        std::fs::remove_dir(&dir).unwrap();
    }
}
