//! Recordings: pcapng files that Wireshark and tcpdump open as they are
//! (and editcap and mergecap cut and merge), with dnstrace's own notes in
//! comments and packets of their own (`layout`); replay of them (and of
//! plain tcpdump captures) through the same pipeline; a report.
pub mod flight;
pub mod frame;
pub mod lanes;
pub mod layout;
pub mod live;
pub mod merge;
pub mod notes;
pub mod pcapng;
mod recorder;
pub mod replay;
pub mod watch;

#[cfg(test)]
pub(crate) mod tests;

use std::collections::HashMap;

pub use self::recorder::{RecordOptions, Recorder};
use self::{
    notes::{ContextNote, Header, LabelsNote, FORMAT},
    pcapng::SectionInfo,
};
use crate::{
    clock::{monotonic_now, Clock},
    correlate::Limits,
    decode::{KernelNames, Packet},
    diagnose::Context,
    output::Labels,
    target::follow::Joined,
};

/// What every file of a recording starts with, and what its packets need.
#[derive(Clone)]
pub struct Meta {
    section: SectionInfo,
    header: Header,
    labels: LabelsNote,
    context: ContextNote,
    clock: Clock,
    kernel: KernelNames,
    iface_names: HashMap<u32, String>,
}

impl Meta {
    /// The device a packet was seen on, by name where known, after its
    /// node's in a cluster view's recording.
    fn place(&self, p: &Packet) -> String {
        let device = p.device_name(&self.iface_names);
        let nodes = &self.labels.nodes;
        match usize::from(p.node.0)
            .checked_sub(1)
            .and_then(|i| nodes.get(i))
        {
            Some(node) => format!("{node}/{device}"),
            None => device,
        }
    }

    /// A cluster view's recording (`dnstrace cluster --record`): every
    /// node's evidence on the view's one time line, each packet's node in
    /// its note; the comment names the host the view ran on.
    #[must_use]
    pub fn of_cluster(mut self, started_ns: u64) -> Self {
        let nodes = self.labels.nodes.join(", ");
        self.section.comment = vec![format!(
            "dnstrace cluster view of nodes {nodes} (from {})",
            self.header.node
        )];
        // The time line's, on the first node's clock: not the host's.
        self.header.started_ns = started_ns;
        self
    }

    /// A node a cluster view joined: its packets are named after it, and
    /// the files that follow list it.
    pub fn joined(&mut self, j: &Joined) {
        j.name_in(&mut self.labels.nodes);
    }

    /// The cluster's resolvers as the node knows them.
    pub fn resolvers(&self) -> &[std::net::IpAddr] {
        &self.context.resolvers
    }

    /// Names the node recorded alone (`--node`), in the notes and in the
    /// comment Wireshark shows.
    #[must_use]
    pub fn of_node(mut self, node: Option<&str>) -> Self {
        let Some(node) = node else { return self };
        if let Some(first) = self.section.comment.first_mut() {
            *first = format!(
                "dnstrace recording of node {node} (on {})",
                self.header.node
            );
        }
        self.header.scope = Some(node.to_owned());
        self
    }
}

/// A one-line file of /proc/sys, trimmed.
fn sys(name: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

pub fn meta(labels: &Labels, context: &Context, limits: Limits) -> Meta {
    let version = env!("CARGO_PKG_VERSION");
    let kernel = sys("osrelease");
    let node = sys("hostname");
    let target = context.target.as_ref().map(|t| t.label.clone());
    let mut comment = vec![format!("dnstrace recording on node {node}")];
    comment.extend(target.as_ref().map(|t| format!("tracing {t}")));
    Meta {
        section: SectionInfo {
            hardware: String::new(),
            os: format!("Linux {kernel}"),
            user_appl: format!("dnstrace {version}"),
            comment,
        },
        header: Header {
            format: FORMAT,
            dnstrace: version.into(),
            kernel,
            node,
            target,
            command: std::env::args().collect(),
            started_ns: monotonic_now(),
            clock_offset_ns: labels.clock().offset_ns(),
            timeout_ns: limits.timeout_ns,
            max_open: limits.max_open,
            part: 0,
            scope: None,
        },
        labels: LabelsNote {
            iface_names: labels.iface_names().clone().into_iter().collect(),
            names: labels.names().entries().clone(),
            drop_reasons: labels.kernel().drop_reasons().clone().into_iter().collect(),
            workloads: labels.names().workloads().clone(),
            nodes: labels.nodes().to_vec(),
        },
        context: ContextNote::of(context),
        clock: labels.clock(),
        kernel: labels.kernel().clone(),
        iface_names: labels.iface_names().clone(),
    }
}
