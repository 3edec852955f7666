//! The journeys correlation hands on: what output, diagnose, view and
//! record read once a journey is closed.
use std::{borrow::Cow, net::SocketAddr, sync::Arc};

use dnstrace_common::{Direction, Hook, SampleLevel};
use serde::Serialize;

use super::Connection;
use crate::decode::{NodeId, Qtype, Rcode, Underlay};
use crate::decode::{Record, Seen};

/// One sighting of a journey's packet.
#[derive(Clone, Debug)]
pub struct Leg {
    pub ts_ns: u64,
    /// Time since the previous leg of the journey.
    pub since_prev_ns: u64,
    /// Its name and direction (ingress, egress, drop, nat or clash) are
    /// `Hook`'s: a byte here, not two strings.
    pub hook: Hook,
    /// Shared among legs: thousands of open journeys name the same devices.
    pub iface: Option<Arc<str>>,
    pub ifindex: u32,
    /// The node it was seen on, in a merged replay.
    pub node: NodeId,
    pub netns: u32,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub response: bool,
    /// On an answer's legs, its IP packet length (`Packet::ip_len`; the
    /// journey's largest answer's): what an MTU limits. 0 on a query's,
    /// which an open journey has no room to keep.
    pub ip_len: u16,
    /// (asked for, rewritten to), where conntrack shows a DNAT. Boxed, as
    /// most legs have none and open journeys should stay small.
    pub dnat: Option<Box<(SocketAddr, SocketAddr)>>,
    pub snat: Option<Box<(SocketAddr, SocketAddr)>>,
    /// The kernel's drop reason and location, numbers as captured. Boxed,
    /// as few legs are drops.
    pub drop: Option<Box<(u32, u64)>>,
    /// Where it saw part of a fragmented message only. Boxed: rare.
    pub fragment: Option<Box<FragmentNote>>,
    /// The tunnel between nodes a capture found it in. Boxed: rare.
    pub underlay: Option<Box<Underlay>>,
}

/// A leg that saw part of a fragmented message: the fragment at `offset`
/// (the kernel dropped it there), or, `missing`, the datagram without the
/// fragment at `offset`, which was seen last at `last_seen`, if anywhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FragmentNote {
    pub offset: u16,
    pub missing: bool,
    pub last_seen: Option<Seen>,
}

impl FragmentNote {
    /// `the fragment at offset 1480`, or `without its fragment at offset
    /// 1480, last seen on veth1@4026532177 (dev_receive)`.
    pub fn describe(&self) -> String {
        if !self.missing {
            return format!("the fragment at offset {}", self.offset);
        }
        let last = match &self.last_seen {
            Some(s) => {
                // Without --iface names: the device's own, or its index.
                let dev = s.device_name(&std::collections::HashMap::new());
                format!("last seen on {dev}@{} ({})", s.netns, s.hook.name())
            }
            None => "never seen".to_owned(),
        };
        format!("without its fragment at offset {}, {last}", self.offset)
    }

    /// What `rec` shows of a fragmented message, if it shows part of one.
    /// Boxed: every packet asks, few have one.
    pub(super) fn of(rec: &Record) -> Option<Box<Self>> {
        if let Some(m) = &rec.missing {
            return Some(Box::new(Self {
                offset: m.offset,
                missing: true,
                last_seen: m.last_seen.clone(),
            }));
        }
        let f = rec.packet.frag.filter(|f| f.offset > 0)?;
        Some(Box::new(Self {
            offset: f.offset,
            missing: false,
            last_seen: None,
        }))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum Outcome {
    Answered {
        rcode: Rcode,
        answers: Vec<String>,
        truncated: bool,
        /// The answer could not be read whole: where and why.
        #[serde(skip_serializing_if = "Option::is_none")]
        malformed: Option<Arc<str>>,
    },
    Dropped {
        reason: u32,
        location: u64,
    },
    Timeout,
}

#[derive(Clone, Debug)]
pub struct Journey {
    pub id: u64,
    /// Journeys of one lookup (A and AAAA siblings, retries) share this.
    pub lookup: u64,
    pub client: SocketAddr,
    pub dns_id: u16,
    /// Lowercase: what journeys and rules compare, as DNS compares names.
    pub name: Arc<str>,
    /// The name as the client wrote it, where its case differs from
    /// `name` (DNS 0x20, or a client's own spelling): what is shown.
    pub asked_as: Option<Arc<str>>,
    pub qtype: Qtype,
    pub tcp: bool,
    pub started_ns: u64,
    pub ended_ns: u64,
    pub outcome: Outcome,
    /// Where the service address was translated, if it was. Boxed: it is
    /// known only once the journey is closed.
    pub dnat: Option<Box<(SocketAddr, SocketAddr)>>,
    pub legs: Vec<Leg>,
    pub upstream: Vec<Journey>,
    /// Why legs may be missing, if they may.
    pub incomplete: Option<Gap>,
    /// The strictest sampling level it was kept under (shift 0: none).
    pub sampled: SampleLevel,
    /// Over TCP: how its connection was set up and ended. Boxed: few have one.
    pub connection: Option<Box<Connection>>,
    /// A zone operation or another opcode than a standard QUERY (NOTIFY,
    /// UPDATE, IQUERY, STATUS): no lookup, kept out of the lookup rules.
    pub opcode: Option<Cow<'static, str>>,
}

impl Journey {
    /// The name as asked, case and all.
    pub fn shown_name(&self) -> &str {
        match (&self.asked_as, self.name.is_empty()) {
            (Some(asked), _) => asked,
            (None, true) => "(no question)",
            (None, false) => &self.name,
        }
    }

    /// A lookup of a name: a standard query with a question. Zone
    /// operations and questionless queries are none of the lookup rules'
    /// business.
    pub fn is_lookup(&self) -> bool {
        self.opcode.is_none() && !self.name.is_empty()
    }
}

/// Why a journey may not show everything that happened to it: absence of a
/// leg or an answer is then no evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gap {
    /// Kernel events were lost while it was open.
    Lost,
    /// The capture or recording ended before it could finish.
    Ended,
    /// The capture missed part of its TCP stream, where its answer may be.
    Missed,
}

impl Gap {
    pub fn why(self) -> &'static str {
        match self {
            Gap::Lost => "kernel events were lost while it was open",
            Gap::Ended => "the capture ended before it could finish",
            Gap::Missed => "the capture missed part of its TCP stream, where its answer may be",
        }
    }
}

impl Leg {
    pub fn direction(&self) -> Direction {
        self.hook.direction()
    }
}

impl Journey {
    pub fn total_ns(&self) -> u64 {
        self.ended_ns.saturating_sub(self.started_ns)
    }

    /// The first query leg: where the client sent it.
    pub fn origin(&self) -> Option<&Leg> {
        self.legs.iter().find(|l| !l.response)
    }

    /// Answers that came back through the place the query left.
    pub fn answers_at_client(&self) -> impl Iterator<Item = &Leg> {
        let o = self.origin();
        self.legs.iter().filter(move |l| {
            l.response
                && o.is_some_and(|o| {
                    (l.node, l.netns) == (o.node, o.netns)
                        && l.ifindex == o.ifindex
                        && l.direction() != o.direction()
                        && l.direction() != Direction::Drop
                })
        })
    }

    /// From the client's query to the first answer back where it left.
    pub fn answered_in_ns(&self) -> Option<u64> {
        let (o, a) = (self.origin()?, self.answers_at_client().next()?);
        Some(a.ts_ns.saturating_sub(o.ts_ns))
    }
}

/// Legs and journeys for the tests of what reads them (metrics, OTLP).
#[cfg(test)]
pub mod fixtures {
    use dnstrace_common::Hook;

    use super::{Journey, Leg, Outcome};
    use crate::decode::{Qtype, Rcode};

    pub fn leg(ts_ns: u64, hook: Hook, netns: u32, src: &str, dst: &str, response: bool) -> Leg {
        Leg {
            ts_ns,
            since_prev_ns: 0,
            hook,
            iface: Some("eth0".into()),
            ifindex: 2,
            node: Default::default(),
            netns,
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            response,
            ip_len: 0,
            dnat: None,
            snat: None,
            drop: None,
            fragment: None,
            underlay: None,
        }
    }

    /// An A query for `name` from `client`, from its first leg to its last.
    pub fn journey(client: &str, name: &str, legs: Vec<Leg>, outcome: Outcome) -> Journey {
        Journey {
            id: 1,
            lookup: 1,
            client: client.parse().unwrap(),
            dns_id: 7,
            name: name.into(),
            qtype: Qtype::A,
            tcp: false,
            started_ns: legs.first().map_or(0, |l| l.ts_ns),
            ended_ns: legs.last().map_or(0, |l| l.ts_ns),
            outcome,
            dnat: None,
            legs,
            upstream: Vec::new(),
            incomplete: None,
            sampled: Default::default(),
            connection: None,
            opcode: None,
            asked_as: None,
        }
    }

    pub fn answered(rcode: Rcode, answers: &[&str]) -> Outcome {
        Outcome::Answered {
            rcode,
            answers: answers.iter().map(|a| (*a).to_owned()).collect(),
            truncated: false,
            malformed: None,
        }
    }
}
