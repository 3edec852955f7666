//! TCP connections to DNS servers, from their segments: how each was set up
//! and how it ended, for the journeys that went over it, and the ones that
//! never carried a query (a SYN nobody answered, a reset) for the rules.
//! Counted at the first place its SYN was seen, the client's side: every
//! hook after it sees the same segments again.
use std::net::SocketAddr;

use dnstrace_common::Hook;

use super::table::Map;
use crate::decode::{
    tcp::{ACK, FIN, RST, SYN},
    NodeId, Packet, Transport,
};

/// What a connection showed, times in kernel nanoseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    pub client: SocketAddr,
    /// As the client addressed it (the service, before DNAT).
    pub server: SocketAddr,
    pub syn_ns: u64,
    /// SYNs the client sent: more than one, and the first went unanswered.
    pub syns: u32,
    pub syn_ack_ns: Option<u64>,
    pub reset: Option<Reset>,
    pub fin_ns: Option<u64>,
    /// Data segments the client's side sent again.
    pub retransmits: u32,
    /// The kernel dropped a segment of its set-up: (reason, location).
    pub dropped: Option<(u32, u64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reset {
    pub ts_ns: u64,
    /// Sent towards the client (by the server, or by the kernel on its way).
    pub to_client: bool,
}

impl Connection {
    pub fn established(&self) -> bool {
        self.syn_ack_ns.is_some()
    }

    /// Milliseconds from the SYN to `ts_ns`.
    pub fn ms_after_syn(&self, ts_ns: u64) -> f64 {
        ts_ns.saturating_sub(self.syn_ns) as f64 / 1e6
    }

    /// `SYN-ACK 0.051 ms, FIN 0.912 ms, 1 retransmission`: times from the
    /// SYN (a drop is said by who can name its reason).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.syns > 1 {
            parts.push(format!("{} SYNs", self.syns));
        }
        parts.push(match self.syn_ack_ns {
            Some(t) => format!("SYN-ACK {:.3} ms", self.ms_after_syn(t)),
            None => "no SYN-ACK".into(),
        });
        if let Some(r) = self.reset {
            let by = if r.to_client {
                "to the client"
            } else {
                "by the client"
            };
            parts.push(format!("RST {by} {:.3} ms", self.ms_after_syn(r.ts_ns)));
        }
        if let Some(t) = self.fin_ns {
            parts.push(format!("FIN {:.3} ms", self.ms_after_syn(t)));
        }
        if self.retransmits > 0 {
            let s = if self.retransmits == 1 { "" } else { "s" };
            parts.push(format!("{} retransmission{s}", self.retransmits));
        }
        parts.join(", ")
    }

    /// Never set up: reset, or no SYN-ACK for `timeout_ns`.
    fn failed(&self, now_ns: u64, timeout_ns: u64) -> bool {
        !self.established()
            && (self.reset.is_some() || now_ns.saturating_sub(self.syn_ns) >= timeout_ns)
    }
}

/// Where a connection's segments are counted: the first hook its SYN passed.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Place {
    node: NodeId,
    netns: u32,
    ifindex: u32,
    hook: Hook,
}

struct Tracked {
    conn: Connection,
    place: Place,
    /// The end of the client's data sent so far, at `place`.
    sent_up_to: Option<u32>,
    last_ns: u64,
}

/// Connections by client socket.
pub struct Connections {
    open: Map<SocketAddr, Tracked>,
    /// Client sockets past a SNAT, as conntrack showed them: where the
    /// entry is not seen again (another namespace), the source is all.
    aliases: Map<SocketAddr, SocketAddr>,
    /// Failed set-ups not yet taken by the rules.
    failed: Vec<Connection>,
    max: usize,
    timeout_ns: u64,
}

impl Connections {
    pub fn new(max: usize, timeout_ns: u64) -> Self {
        Self {
            open: Map::default(),
            aliases: Map::default(),
            failed: Vec::new(),
            max,
            timeout_ns,
        }
    }

    /// A TCP segment to or from a DNS port, seen somewhere.
    pub fn push(&mut self, p: &Packet) {
        let Transport::Tcp { seq, flags } = p.transport else {
            return;
        };
        self.note_alias(p);
        if flags & SYN != 0 && flags & ACK == 0 {
            return self.syn(p, seq);
        }
        let client = p.ct.as_deref().map(|ct| ct.original.src);
        let key = [client, Some(p.src), Some(p.dst)]
            .into_iter()
            .flatten()
            .map(|k| self.aliases.get(&k).copied().unwrap_or(k))
            .find(|k| self.open.contains_key(k));
        let Some(t) = key.and_then(|k| self.open.get_mut(&k)) else {
            return;
        };
        t.last_ns = p.ts_ns;
        // Without conntrack (where a routed pod's reply enters the node),
        // the client shows under its SNAT alias; only on the client's side,
        // not where the server sends it.
        let aliased = self.aliases.get(&p.dst) == Some(&t.conn.client);
        let on_client_side = aliased && (p.node, p.netns) == (t.place.node, t.place.netns);
        let to_client =
            p.ct.as_deref()
                .map_or(p.dst == t.conn.client || on_client_side, |ct| ct.is_reply);
        // Once set up, a socket's queues are freed at close as drops too:
        // only the set-up's are news.
        if p.hook == Hook::Drop && !t.conn.established() {
            t.conn
                .dropped
                .get_or_insert(p.drop.map_or((0, 0), |d| (d.reason, d.location)));
        }
        if flags & RST != 0 {
            t.conn.reset.get_or_insert(Reset {
                ts_ns: p.ts_ns,
                to_client,
            });
        } else if flags & SYN != 0 && to_client {
            t.conn.syn_ack_ns.get_or_insert(p.ts_ns);
        }
        if flags & FIN != 0 {
            t.conn.fin_ns.get_or_insert(p.ts_ns);
        }
        if here(p) == t.place && !to_client && p.payload_len > 0 {
            t.data(seq, p.payload_len);
        }
    }

    /// Files the client's socket past a SNAT, if the packet shows one.
    fn note_alias(&mut self, p: &Packet) {
        let Some((client, seen)) = p.ct.as_deref().and_then(|ct| ct.snat()) else {
            return;
        };
        if self.aliases.len() >= self.max {
            let open = &self.open;
            self.aliases.retain(|_, c| open.contains_key(c));
        }
        if self.aliases.len() < self.max {
            self.aliases.insert(seen, client);
        }
    }

    fn syn(&mut self, p: &Packet, seq: u32) {
        let src = p.ct.as_deref().map_or(p.src, |ct| ct.original.src);
        let client = self.aliases.get(&src).copied().unwrap_or(src);
        if let Some(t) = self.open.get_mut(&client) {
            if t.conn.syn_ns <= p.ts_ns && here(p) == t.place {
                t.conn.syns += 1;
                t.last_ns = p.ts_ns;
            }
            if t.sent_up_to != Some(seq.wrapping_add(1)) || t.conn.reset.is_some() {
                // A new connection from the same port.
                self.open.remove(&client);
            } else {
                return;
            }
        }
        if self.open.len() >= self.max {
            self.evict_oldest();
        }
        let server = p.ct.as_deref().map_or(p.dst, |ct| ct.original.dst);
        self.open.insert(
            client,
            Tracked {
                conn: Connection {
                    client,
                    server,
                    syn_ns: p.ts_ns,
                    syns: 1,
                    syn_ack_ns: None,
                    reset: None,
                    fin_ns: None,
                    retransmits: 0,
                    dropped: None,
                },
                place: here(p),
                sent_up_to: Some(seq.wrapping_add(1)),
                last_ns: p.ts_ns,
            },
        );
    }

    fn evict_oldest(&mut self) {
        let oldest = self
            .open
            .iter()
            .min_by_key(|(_, t)| t.last_ns)
            .map(|(k, _)| *k);
        if let Some(k) = oldest {
            self.open.remove(&k);
        }
    }

    /// What the connection from `client` showed so far.
    pub fn get(&self, client: SocketAddr) -> Option<&Connection> {
        self.open.get(&client).map(|t| &t.conn)
    }

    /// Did `client` try TCP since `since_ns`, whether it got through or not?
    pub fn tried_since(&self, client: std::net::IpAddr, since_ns: u64) -> bool {
        self.open
            .values()
            .any(|t| t.conn.client.ip() == client && t.conn.syn_ns >= since_ns)
    }

    /// At `now_ns`: set-ups that failed move to `failed`, connections quiet
    /// for a timeout are forgotten.
    pub fn tick(&mut self, now_ns: u64) {
        let timeout = self.timeout_ns;
        let failed = &mut self.failed;
        self.open.retain(|_, t| {
            if t.conn.failed(now_ns, timeout) {
                failed.push(t.conn.clone());
                return false;
            }
            now_ns.saturating_sub(t.last_ns) < timeout
        });
        let open = &self.open;
        self.aliases.retain(|_, c| open.contains_key(c));
    }

    /// Failed set-ups since the last call.
    pub fn take_failed(&mut self) -> Vec<Connection> {
        std::mem::take(&mut self.failed)
    }
}

impl Tracked {
    /// Client data of `len` bytes at `seq`: sent again if it ends where
    /// data was already sent up to.
    fn data(&mut self, seq: u32, len: u32) {
        let end = seq.wrapping_add(len);
        match self.sent_up_to {
            Some(upto) if (end.wrapping_sub(upto) as i32) <= 0 => self.conn.retransmits += 1,
            _ => self.sent_up_to = Some(end),
        }
    }
}

fn here(p: &Packet) -> Place {
    Place {
        node: p.node,
        netns: p.netns,
        ifindex: p.ifindex,
        hook: p.hook,
    }
}
