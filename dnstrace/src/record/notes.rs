//! dnstrace's own records inside a pcapng file, as JSON: `Note`s (about
//! the file, what the pipeline was fed besides packets, and what it
//! raised), and a `PacketNote` on each packet with what the frame cannot
//! say (hook, namespace, conntrack entry, drop, monotonic time). Where in
//! the file they go: `record::layout`.
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
};

use serde::{Deserialize, Serialize};

use crate::{
    conntrack::{CtEvent, CtEventKind, RACE_COUNTERS},
    decode::{Conntrack, CtTuple, Dropped, Fragment, NodeId, Packet},
    diagnose::{ConntrackAtStart, Context, Translation},
    output::{
        addr,
        journey_json::{boolean, number},
    },
    pods::{net::Attachment, workload::Workload},
    routes::Routes,
    target::{follow::Refresh, Target},
};

/// Bumped when a note's meaning (or place) changes; older readers refuse
/// newer files. 2: notes in comments and packets of their own interface,
/// where format 1 had custom blocks and options (`record::layout`).
pub const FORMAT: u32 = 2;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Note {
    /// First in every file: who wrote it, where, about what.
    Header(Header),
    /// What turns numbers into names, as the recording machine saw them.
    Labels(LabelsNote),
    /// What the diagnosis rules knew about the node at the start.
    Context(ContextNote),
    /// The pipeline started (static checks ran) at this time.
    Start {
        now_ns: u64,
    },
    Tick {
        now_ns: u64,
    },
    Conntrack {
        now_ns: u64,
        events: Vec<CtEventNote>,
    },
    Counters {
        now_ns: u64,
        moved: Vec<(String, u64)>,
    },
    Lost {
        since_ns: u64,
        now_ns: u64,
        total: u64,
    },
    /// The kernel's sampling level changed (1 lookup in 2^shift kept), or
    /// whose lookups it follows whole besides, for cluster views.
    Sample {
        since_ns: u64,
        now_ns: u64,
        shift: u32,
        seed: u32,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        viewed: Vec<IpAddr>,
        /// The node whose kernel it is, in a cluster view's recording.
        #[serde(default, skip_serializing_if = "is_zero")]
        node: u16,
    },
    /// The node's pods changed while recording: names, the target's new
    /// sandbox.
    Pods {
        now_ns: u64,
        refresh: Refresh,
    },
    /// An anomaly as it was raised (the JSON line output's object).
    Anomaly {
        anomaly: serde_json::Value,
    },
    /// The capture ended here.
    End {
        now_ns: u64,
    },
}

impl Note {
    /// When it was made (kernel monotonic time): an anomaly when last
    /// seen, the file's notes at the start (labels and context, never
    /// packets of their own, say 0).
    pub fn time_ns(&self) -> u64 {
        match self {
            Self::Start { now_ns }
            | Self::Tick { now_ns }
            | Self::Conntrack { now_ns, .. }
            | Self::Counters { now_ns, .. }
            | Self::Lost { now_ns, .. }
            | Self::Sample { now_ns, .. }
            | Self::Pods { now_ns, .. }
            | Self::End { now_ns } => *now_ns,
            Self::Anomaly { anomaly } => anomaly["last_ns"].as_u64().unwrap_or(0),
            Self::Header(h) => h.started_ns,
            Self::Labels(_) | Self::Context(_) => 0,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Header {
    pub format: u32,
    pub dnstrace: String,
    pub kernel: String,
    pub node: String,
    pub target: Option<String>,
    pub command: Vec<String>,
    /// Kernel monotonic time at the start.
    pub started_ns: u64,
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC, to print times as they were.
    pub clock_offset_ns: i64,
    pub timeout_ns: u64,
    pub max_open: usize,
    /// This file's number among rotated files (0 for the first).
    pub part: u32,
    /// The node recorded alone, of several on this kernel (`--node`);
    /// absent from recordings made without it, or before it was noted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

impl Header {
    /// The node it was recorded on: `--node`'s name, else the host's.
    pub fn node_name(&self) -> &str {
        self.scope.as_deref().unwrap_or(&self.node)
    }

    /// Whether both are of one capture (its rotated files, say).
    pub fn same_capture(&self, other: &Self) -> bool {
        (&self.node, self.started_ns, self.clock_offset_ns)
            == (&other.node, other.started_ns, other.clock_offset_ns)
    }
}

/// Pairs, not maps, where keys are numbers: a tagged enum's content cannot
/// read numbers back from JSON's string keys.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LabelsNote {
    pub iface_names: Vec<(u32, String)>,
    pub names: BTreeMap<IpAddr, String>,
    pub drop_reasons: Vec<(u32, String)>,
    /// The pods' workloads, where the CRI said them; absent from
    /// recordings made before they were noted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub workloads: BTreeMap<IpAddr, Workload>,
    /// The nodes of a cluster view's recording, by node id less one;
    /// absent from one node's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ContextNote {
    pub service_ips: Vec<IpAddr>,
    /// Absent from recordings made before it was noted, and left out where
    /// it is kube-proxy's DNAT, as it was then.
    #[serde(default, skip_serializing_if = "is_dnat")]
    pub translation: Translation,
    pub bridge_nf_call_iptables: Option<String>,
    pub node_netns: u32,
    pub conntrack: Option<ConntrackNote>,
    pub target: Option<Target>,
    /// Absent from recordings made before it was noted: not known, so no.
    #[serde(default)]
    pub drops_visible: bool,
    /// Absent from recordings made before it was noted: none known.
    #[serde(default)]
    pub node_search: Vec<String>,
    /// Absent from recordings made before it was noted: not known.
    #[serde(default)]
    pub attachments: BTreeMap<IpAddr, Attachment>,
    #[serde(default)]
    pub resolvers: Vec<IpAddr>,
    /// Absent from recordings made before it was noted: none known.
    #[serde(default, skip_serializing_if = "Routes::is_empty")]
    pub routes: Routes,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConntrackNote {
    pub dropped: Vec<(String, u64)>,
    pub entries: u64,
    pub max: Option<u64>,
}

fn is_dnat(t: &Translation) -> bool {
    *t == Translation::Dnat
}

/// A counter's name as the one the rules know, if it is one.
fn counter(name: &str) -> Option<&'static str> {
    RACE_COUNTERS.iter().copied().find(|n| *n == name)
}

/// Counters as recorded, keeping only the ones the rules know.
pub fn counters(moved: &[(String, u64)]) -> Vec<(&'static str, u64)> {
    moved
        .iter()
        .filter_map(|(n, v)| Some((counter(n)?, *v)))
        .collect()
}

impl ContextNote {
    pub fn of(c: &Context) -> Self {
        Self {
            service_ips: c.service_ips.iter().copied().collect(),
            translation: c.translation,
            bridge_nf_call_iptables: c.bridge_nf_call_iptables.clone(),
            node_netns: c.node_netns,
            conntrack: c.conntrack.as_ref().map(|ct| ConntrackNote {
                dropped: ct
                    .dropped
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), *v))
                    .collect(),
                entries: ct.entries,
                max: ct.max,
            }),
            target: c.target.clone(),
            drops_visible: c.drops_visible,
            node_search: c.node_search.clone(),
            attachments: c.attachments.clone(),
            resolvers: c.resolvers.iter().copied().collect(),
            routes: c
                .routes
                .get(&NodeId::default())
                .cloned()
                .unwrap_or_default(),
        }
    }

    pub fn context(self) -> Context {
        Context {
            service_ips: self.service_ips.into_iter().collect(),
            translation: self.translation,
            bridge_nf_call_iptables: self.bridge_nf_call_iptables,
            node_netns: self.node_netns,
            conntrack: self.conntrack.map(|ct| ConntrackAtStart {
                dropped: counters(&ct.dropped),
                entries: ct.entries,
                max: ct.max,
            }),
            target: self.target,
            drops_visible: self.drops_visible,
            node_search: self.node_search,
            attachments: self.attachments,
            resolvers: self.resolvers.into_iter().collect(),
            routes: [(NodeId::default(), self.routes)].into(),
            ..Context::default()
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CtEventNote {
    pub kind: CtEventKind,
    pub proto: u8,
    pub status: u32,
    pub original: [SocketAddr; 2],
    pub reply: [SocketAddr; 2],
}

impl CtEventNote {
    pub fn of(e: &CtEvent) -> Self {
        Self {
            kind: e.kind,
            proto: e.proto,
            status: e.status,
            original: [e.original.src, e.original.dst],
            reply: [e.reply.src, e.reply.dst],
        }
    }

    pub fn event(&self) -> CtEvent {
        CtEvent {
            kind: self.kind,
            proto: self.proto,
            status: self.status,
            original: tuple(self.original),
            reply: tuple(self.reply),
        }
    }
}

fn tuple([src, dst]: [SocketAddr; 2]) -> CtTuple {
    CtTuple { src, dst }
}

fn addr_pair(out: &mut Vec<u8>, [a, b]: &[SocketAddr; 2]) {
    out.push(b'[');
    addr::json(out, a);
    out.push(b',');
    addr::json(out, b);
    out.push(b']');
}

/// `s` as a JSON string, escaped as serde escapes it (a device's name may
/// hold quotes).
fn string(out: &mut Vec<u8>, s: &str) {
    // Into a Vec, serde_json cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// A packet's facts the frame does not carry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PacketNote {
    pub mono_ns: u64,
    pub netns: u32,
    pub ifindex: u32,
    pub hook: u8,
    pub wire_len: u32,
    pub payload_len: u32,
    pub truncated: bool,
    /// Whether `frag` is set: dnstrace before fragments were put back
    /// together requires it.
    pub fragment: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub frag: Option<FragNote>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ifname: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ct: Option<CtNote>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub drop: Option<DropNote>,
    /// The node it was seen on, in a cluster view's recording (0: the
    /// recording's one node).
    #[serde(skip_serializing_if = "is_zero", default)]
    pub node: u16,
}

fn is_zero(n: &u16) -> bool {
    *n == 0
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtNote {
    pub original: [SocketAddr; 2],
    pub reply: [SocketAddr; 2],
    pub status: u32,
    pub is_reply: bool,
}

/// A fragment's place in its datagram, and its datagram's ports: a later
/// fragment's frame has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FragNote {
    pub id: u32,
    pub offset: u16,
    pub more: bool,
    pub ports: [u16; 2],
}

impl FragNote {
    pub fn fragment(&self) -> Fragment {
        Fragment {
            id: self.id,
            offset: self.offset,
            more: self.more,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropNote {
    pub reason: u32,
    pub location: u64,
    /// The location's symbol on the recording machine.
    pub at: String,
}

impl PacketNote {
    pub fn of(p: &Packet, location: impl Fn(u64) -> String) -> Self {
        Self {
            mono_ns: p.ts_ns,
            node: p.node.0,
            netns: p.netns,
            ifindex: p.ifindex,
            hook: p.hook as u8,
            wire_len: p.wire_len,
            payload_len: p.payload_len,
            truncated: p.truncated,
            fragment: p.frag.is_some(),
            frag: p.frag.map(|f| FragNote {
                id: f.id,
                offset: f.offset,
                more: f.more,
                ports: [p.src.port(), p.dst.port()],
            }),
            ifname: p.ifname.as_deref().map(str::to_owned),
            ct: p.ct.as_deref().map(|c| CtNote {
                original: [c.original.src, c.original.dst],
                reply: [c.reply.src, c.reply.dst],
                status: c.status,
                is_reply: c.is_reply,
            }),
            drop: p.drop.map(|d| DropNote {
                reason: d.reason,
                location: d.location,
                at: location(d.location),
            }),
        }
    }

    /// The note as serde writes it, written by hand: through serde it was
    /// a sixth of a recording's CPU, most of it addresses through `Display`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let numbers: [(&[u8], u64); 6] = [
            (b"{\"mono_ns\":", self.mono_ns),
            (b",\"netns\":", self.netns.into()),
            (b",\"ifindex\":", self.ifindex.into()),
            (b",\"hook\":", self.hook.into()),
            (b",\"wire_len\":", self.wire_len.into()),
            (b",\"payload_len\":", self.payload_len.into()),
        ];
        for (key, n) in numbers {
            out.extend_from_slice(key);
            number(out, n);
        }
        let flags: [(&[u8], bool); 2] = [
            (b",\"truncated\":", self.truncated),
            (b",\"fragment\":", self.fragment),
        ];
        for (key, b) in flags {
            out.extend_from_slice(key);
            boolean(out, b);
        }
        if let Some(f) = &self.frag {
            out.extend_from_slice(b",\"frag\":{\"id\":");
            number(out, f.id);
            out.extend_from_slice(b",\"offset\":");
            number(out, f.offset);
            out.extend_from_slice(b",\"more\":");
            boolean(out, f.more);
            out.extend_from_slice(b",\"ports\":[");
            number(out, f.ports[0]);
            out.push(b',');
            number(out, f.ports[1]);
            out.extend_from_slice(b"]}");
        }
        if let Some(name) = &self.ifname {
            out.extend_from_slice(b",\"ifname\":");
            string(out, name);
        }
        if let Some(ct) = &self.ct {
            out.extend_from_slice(b",\"ct\":{\"original\":");
            addr_pair(out, &ct.original);
            out.extend_from_slice(b",\"reply\":");
            addr_pair(out, &ct.reply);
            out.extend_from_slice(b",\"status\":");
            number(out, ct.status);
            out.extend_from_slice(b",\"is_reply\":");
            boolean(out, ct.is_reply);
            out.push(b'}');
        }
        if let Some(d) = &self.drop {
            out.extend_from_slice(b",\"drop\":{\"reason\":");
            number(out, d.reason);
            out.extend_from_slice(b",\"location\":");
            number(out, d.location);
            out.extend_from_slice(b",\"at\":");
            string(out, &d.at);
            out.push(b'}');
        }
        if self.node != 0 {
            out.extend_from_slice(b",\"node\":");
            number(out, self.node);
        }
        out.push(b'}');
    }

    pub fn conntrack(&self) -> Option<Conntrack> {
        self.ct.as_ref().map(|c| Conntrack {
            original: tuple(c.original),
            reply: tuple(c.reply),
            status: c.status,
            is_reply: c.is_reply,
        })
    }

    pub fn dropped(&self) -> Option<Dropped> {
        self.drop.as_ref().map(|d| Dropped {
            reason: d.reason,
            location: d.location,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(ifname: Option<&str>, ct: Option<CtNote>, drop: Option<DropNote>) -> PacketNote {
        PacketNote {
            mono_ns: u64::MAX,
            netns: 4026531840,
            ifindex: 0,
            hook: 3,
            wire_len: 1500,
            payload_len: 71,
            truncated: true,
            fragment: false,
            frag: None,
            ifname: ifname.map(str::to_owned),
            ct,
            drop,
            node: 0,
        }
    }

    #[test]
    fn a_note_says_when_it_was_made() {
        let anomaly = serde_json::json!({ "first_ns": 3, "last_ns": 9 });
        assert_eq!(Note::Anomaly { anomaly }.time_ns(), 9);
        assert_eq!(Note::Tick { now_ns: 7 }.time_ns(), 7);
        let lost = Note::Lost {
            since_ns: 1,
            now_ns: 5,
            total: 2,
        };
        assert_eq!(lost.time_ns(), 5);
    }

    #[test]
    fn a_packet_note_is_written_as_serde_writes_it() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let ct = |o: [&str; 2], r: [&str; 2]| CtNote {
            original: [a(o[0]), a(o[1])],
            reply: [a(r[0]), a(r[1])],
            status: 0x1b8,
            is_reply: true,
        };
        let later = PacketNote {
            fragment: true,
            frag: Some(FragNote {
                id: u32::MAX,
                offset: 65528,
                more: false,
                ports: [53, 40000],
            }),
            ..note(None, None, None)
        };
        let on_node_3 = PacketNote {
            node: 3,
            ..note(Some("eth0"), None, None)
        };
        let notes = [
            later,
            on_node_3,
            note(None, None, None),
            note(Some("eth0"), None, None),
            note(Some("we\"ird\\\n\u{7f}é"), None, None),
            note(
                Some("veth0cf73899"),
                Some(ct(
                    ["10.244.0.10:41234", "10.96.0.10:53"],
                    ["10.244.0.3:53", "10.244.0.10:41234"],
                )),
                None,
            ),
            note(
                None,
                Some(ct(
                    ["[fd00::a]:5353", "[::1]:53"],
                    ["[fe80::1%2]:53", "0.0.0.0:0"],
                )),
                Some(DropNote {
                    reason: 2,
                    location: 0xffff_ffff_8100_0000,
                    at: "nf_hook_slow+0x9c \"ü\"".into(),
                }),
            ),
        ];
        for n in notes {
            let mut out = Vec::new();
            n.write_json(&mut out);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(&n).unwrap()
            );
        }
    }
}
