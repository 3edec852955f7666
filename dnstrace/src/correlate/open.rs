//! Open journeys: what following a journey needs, compact (its legs too),
//! where they are kept, how legs join one and decide its outcome, and how it
//! becomes a `Journey` when it closes.
use std::{
    borrow::Cow,
    net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6},
    sync::Arc,
};

use dnstrace_common::{sample, Direction, Hook, SampleLevel};

use super::{devices::Devices, FragmentNote, Gap, Journey, Leg, Outcome};
use crate::decode::{dns::name_hash, Conntrack, DnsMessage, NodeId, Packet, Qtype, Underlay};

/// Where an open journey is kept: its place in `Slab`. Indexes hold slots
/// (4 bytes, where ids are 8) and drop them when the journey closes.
pub(super) type Slot = u32;

/// A journey named where it may have closed since (the order of starts,
/// the settling list, upstream links): its slot and the low half of its
/// id, checked against the journey in the slot. A slot reused 2^32 starts
/// later would pass; nothing holds a `Ref` that long (its holder closes
/// within a timeout, or the list is compacted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ref {
    pub(super) slot: Slot,
    id: u32,
}

impl Ref {
    pub(super) fn new(slot: Slot, id: u64) -> Self {
        Self {
            slot,
            id: id as u32,
        }
    }
}

/// A journey's question as first asked; the name lowercase.
pub(super) struct Key {
    pub(super) client: SocketAddr,
    pub(super) dns_id: u16,
    /// Not shared while open: a `Box` is 16 bytes smaller than an `Arc`.
    pub(super) name: Box<str>,
    pub(super) qtype: Qtype,
}

/// A journey being followed: only what following it needs, compact (its
/// legs as `OpenLeg`s, its outcome as the leg that decided it, its `Key`
/// flattened), as under load open journeys are most of the memory. It
/// becomes a `Journey` when it closes.
pub(super) struct Open {
    pub(super) id: u64,
    pub(super) lookup: u64,
    pub(super) started_ns: u64,
    pub(super) name: Box<str>,
    pub(super) legs: Vec<OpenLeg>,
    /// The latest answer seen, the outcome if an answer `decided` it.
    answer: Option<Arc<DnsMessage>>,
    /// A boxed slice, 8 bytes smaller than a `Vec`: most have none, few
    /// more than one.
    pub(super) children: Box<[Ref]>,
    /// Boxed, as most journeys have none.
    pub(super) extra: Option<Box<Extra>>,
    pub(super) parent: Option<Ref>,
    /// 1 + the index of the leg that decided the outcome (the latest
    /// answer or drop, in kernel time); 0 while there is none. A journey
    /// keeps `MAX_LEGS` legs at most.
    decided: u16,
    /// The key's client, packed as legs pack addresses.
    pub(super) client: Addr,
    pub(super) dns_id: u16,
    pub(super) qtype: Qtype,
    pub(super) incomplete: Option<Gap>,
    /// Bits, not bools, so that `label` fits in the slot.
    flags: JourneyFlags,
    /// The hash of its question's first label, by which the kernel's
    /// sampling level keeps or leaves out its lookup.
    pub(super) label: u32,
    /// Its largest answer's IP packet length: a message's is the same on
    /// every leg, and an open leg has no room for it (nor this for the
    /// query's).
    answer_len: u16,
}

/// What an open journey is known to be, as bits. A type of its own, so
/// that an `OpenLeg`'s flags, whose values overlap, cannot be asked here.
#[derive(Clone, Copy, Default)]
pub(super) struct JourneyFlags(u8);

impl JourneyFlags {
    /// The client's address is IPv6.
    const CLIENT_V6: Self = Self(1);
    pub(super) const TCP: Self = Self(2);
    /// The answer reached the netns the query started in.
    const DELIVERED: Self = Self(4);
    /// A leg is a response.
    pub(super) const ANSWER_SEEN: Self = Self(8);

    #[inline]
    fn has(self, flag: Self) -> bool {
        self.0 & flag.0 != 0
    }

    /// Sets `flag` if `on`; flags are never cleared.
    #[inline]
    fn set(&mut self, flag: Self, on: bool) {
        if on {
            self.0 |= flag.0;
        }
    }
}

const _: () = assert!(std::mem::size_of::<Option<Open>>() <= 128);

/// Open journeys in chunks of slots, so that growing never moves them all
/// (a reallocation would hold them twice for a moment); a closed journey's
/// slot goes to the next. It keeps the chunks it grew to, bounded by
/// `Limits::max_open`, so that a steady load never allocates here.
#[derive(Default)]
pub(super) struct Slab {
    chunks: Vec<Box<[Option<Open>]>>,
    free: Vec<Slot>,
    /// Slots handed out at least once; the rest of the last chunk is new.
    used: usize,
    len: usize,
}

/// Slots a chunk: 128 KiB.
const CHUNK: usize = 1024;

/// What few journeys have: what conntrack showed of the client socket
/// besides the legs, and IPv6 addresses.
#[derive(Default)]
pub(super) struct Extra {
    /// Client sockets the query is also known by, past a SNAT.
    pub(super) aliases: Vec<SocketAddr>,
    /// The DNAT ctnetlink reported for the client socket.
    pub(super) dnat: Option<(SocketAddr, SocketAddr)>,
    /// The IPv6 socket addresses its legs name, each once.
    v6: Vec<SocketAddrV6>,
    /// Its opcode, if not a standard QUERY.
    pub(super) opcode: Option<Cow<'static, str>>,
    /// Its name as asked, where not all lowercase.
    pub(super) asked_as: Option<Box<str>>,
}

/// A question as a packet asks it: the name in any case. Over TCP or UDP:
/// a TCP and a UDP socket may share a port (a truncated answer's TCP retry
/// may get the UDP socket's), and are two sockets.
#[derive(Clone, Copy)]
pub(super) struct Question<'a> {
    pub(super) client: SocketAddr,
    pub(super) dns_id: u16,
    pub(super) qtype: Qtype,
    pub(super) name: &'a str,
    /// `decode::dns::name_hash(name)`.
    pub(super) name_hash: u64,
    pub(super) tcp: bool,
}

/// Where a query was delivered, as a server's own queries show it: sent
/// from that network namespace, or (without namespaces) that address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Place {
    /// A namespace on its node.
    Netns(NodeId, u32),
    Addr(IpAddr),
}

impl Slab {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn get(&self, slot: Slot) -> Option<&Open> {
        let s = slot as usize;
        self.chunks.get(s / CHUNK)?[s % CHUNK].as_ref()
    }

    pub(super) fn get_mut(&mut self, slot: Slot) -> Option<&mut Open> {
        let s = slot as usize;
        self.chunks.get_mut(s / CHUNK)?[s % CHUNK].as_mut()
    }

    /// The journey `r` names, if it is still open.
    pub(super) fn at(&self, r: Ref) -> Option<&Open> {
        self.get(r.slot).filter(|o| Ref::new(r.slot, o.id) == r)
    }

    pub(super) fn insert(&mut self, o: Open) -> Slot {
        let slot = self.free.pop().unwrap_or_else(|| {
            if self.used == self.chunks.len() * CHUNK {
                self.chunks.push((0..CHUNK).map(|_| None).collect());
            }
            self.used += 1;
            Slot::try_from(self.used - 1).expect("at most Limits::max_open open")
        });
        let s = slot as usize;
        self.chunks[s / CHUNK][s % CHUNK] = Some(o);
        self.len += 1;
        slot
    }

    /// Takes the journey `r` names out, if it is still open.
    pub(super) fn remove(&mut self, r: Ref) -> Option<Open> {
        self.at(r)?;
        let s = r.slot as usize;
        let o = self.chunks[s / CHUNK][s % CHUNK].take()?;
        self.free.push(r.slot);
        self.len -= 1;
        Some(o)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (Slot, &Open)> {
        self.chunks
            .iter()
            .flat_map(|c| c.iter())
            .enumerate()
            .filter_map(|(s, o)| Some((s as Slot, o.as_ref()?)))
    }

    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut Open> {
        self.chunks
            .iter_mut()
            .flat_map(|c| c.iter_mut())
            .filter_map(Option::as_mut)
    }
}

impl Open {
    /// A journey for `key`, first seen in `p`.
    pub(super) fn new(
        id: u64,
        lookup: u64,
        key: Key,
        parent: Option<Ref>,
        tcp: bool,
        p: &Packet,
    ) -> Self {
        let mut o = Open {
            id,
            lookup,
            started_ns: p.ts_ns,
            name: key.name,
            legs: Vec::with_capacity(LEGS),
            answer: None,
            children: Box::default(),
            extra: None,
            parent,
            decided: 0,
            client: Addr([0; 6]),
            dns_id: key.dns_id,
            qtype: key.qtype,
            incomplete: None,
            flags: JourneyFlags::default(),
            label: sample::message_label_hash(&p.payload),
            answer_len: 0,
        };
        let (client, v6) = o.pack(key.client);
        o.client = client;
        o.flags.set(JourneyFlags::TCP, tcp);
        o.flags.set(JourneyFlags::CLIENT_V6, v6);
        o
    }

    /// Its latest leg's time.
    pub(super) fn last_ns(&self) -> u64 {
        self.legs
            .iter()
            .map(|l| l.ts_ns)
            .fold(self.started_ns, u64::max)
    }

    fn decided_by(&self) -> Option<&OpenLeg> {
        self.legs.get(usize::from(self.decided.checked_sub(1)?))
    }

    /// Kernel time of the leg that decided the outcome, or 0.
    fn outcome_ns(&self) -> u64 {
        self.decided_by().map_or(0, |l| l.ts_ns)
    }

    /// The drop that decided the outcome, if a drop did.
    fn deciding_drop(&self) -> Option<(u32, u64)> {
        self.decided_by()?.marks.as_ref()?.drop
    }

    /// When it starts once closed: its earliest leg.
    pub(super) fn first_ns(&self) -> u64 {
        self.legs
            .iter()
            .map(|l| l.ts_ns)
            .min()
            .unwrap_or(self.started_ns)
    }

    /// Whether `q` is this journey's question, as asked or past a SNAT.
    pub(super) fn known_as(&self, q: &Question<'_>) -> bool {
        self.dns_id == q.dns_id
            && self.qtype == q.qtype
            && self.has(JourneyFlags::TCP) == q.tcp
            && (self.client() == q.client || self.aliases().any(|a| *a == q.client))
            && same_name(&self.name, q.name)
    }

    /// Whether a query leg of it went to `server`.
    pub(super) fn asked(&self, server: SocketAddr) -> bool {
        let v6 = self.v6();
        self.legs
            .iter()
            .any(|l| !l.response() && l.dst.unpack(l.flags.has(LegFlags::V6_DST), v6) == server)
    }

    pub(super) fn has(&self, flag: JourneyFlags) -> bool {
        self.flags.has(flag)
    }

    pub(super) fn client(&self) -> SocketAddr {
        self.client
            .unpack(self.has(JourneyFlags::CLIENT_V6), self.v6())
    }

    /// Its question as first asked.
    pub(super) fn question(&self) -> Question<'_> {
        Question {
            client: self.client(),
            dns_id: self.dns_id,
            qtype: self.qtype,
            name: &self.name,
            name_hash: name_hash(&self.name),
            tcp: self.has(JourneyFlags::TCP),
        }
    }

    /// Client sockets the query is also known by, past a SNAT.
    pub(super) fn aliases(&self) -> impl Iterator<Item = &SocketAddr> {
        self.extra.iter().flat_map(|n| &n.aliases)
    }

    /// `a` as a leg holds it: IPv4 inline, IPv6 filed in `Extra::v6` once.
    #[inline]
    pub(super) fn pack(&mut self, a: SocketAddr) -> (Addr, bool) {
        match a {
            SocketAddr::V4(a) => (Addr::v4(a), false),
            SocketAddr::V6(a) => (self.pack_v6(a), true),
        }
    }

    #[cold]
    fn pack_v6(&mut self, a: SocketAddrV6) -> Addr {
        let v6 = &mut self.extra.get_or_insert_default().v6;
        let at = v6.iter().position(|b| *b == a).unwrap_or_else(|| {
            v6.push(a);
            v6.len() - 1
        });
        Addr::v6_at(at)
    }

    pub(super) fn v6(&self) -> &[SocketAddrV6] {
        self.extra.as_deref().map_or(&[], |e| &e.v6)
    }

    fn dst_ip(&self, l: &OpenLeg) -> IpAddr {
        l.dst.unpack(l.flags.has(LegFlags::V6_DST), self.v6()).ip()
    }

    pub(super) fn delivered_or_dropped(&self) -> bool {
        self.has(JourneyFlags::DELIVERED) || self.deciding_drop().is_some()
    }

    /// Its fate is known by `now`: answered, dropped or timed out.
    pub(super) fn settled(&self, now: u64, timeout_ns: u64) -> bool {
        self.delivered_or_dropped() || now.saturating_sub(self.started_ns) >= timeout_ns
    }

    /// Where a server's query on this journey's behalf would come from
    /// (what `server_is` accepts); none once an answer was seen.
    pub(super) fn places(&self, devs: &Devices) -> [Option<Place>; 2] {
        // Without an answer, every leg is the query's: the last arrived.
        let Some(arrival) = self
            .legs
            .last()
            .filter(|_| !self.has(JourneyFlags::ANSWER_SEEN))
        else {
            return [None, None];
        };
        let (node, netns) = devs.get(arrival.dev).ns();
        let at_server = netns != 0 && self.reached_server_netns(arrival, devs);
        [
            Some(Place::Addr(self.dst_ip(arrival))),
            at_server.then_some(Place::Netns(node, netns)),
        ]
    }

    /// Was `p` sent from where this journey's query was delivered: the
    /// server's namespace, or (without namespaces) the server's address?
    /// Not if it asks the very address the client asked and the query
    /// arrived at: that is another client of the same server (a
    /// hostNetwork client beside NodeLocalDNS), where a resolver that
    /// forwards to itself asks the address behind the service.
    pub(super) fn server_is(&self, p: &Packet, devs: &Devices) -> bool {
        let Some(arrival) = self.legs.iter().rev().find(|l| !l.response()) else {
            return false;
        };
        let ns = devs.get(arrival.dev).ns();
        if ns.1 != 0 && p.netns != 0 {
            let same_ask = [arrival, &self.legs[0]]
                .iter()
                .all(|l| self.dst_ip(l) == p.dst.ip());
            ns == (p.node, p.netns) && self.reached_server_netns(arrival, devs) && !same_ask
        } else {
            self.dst_ip(arrival) == p.src.ip()
        }
    }

    /// Whether `arrival` is in a server's namespace, not only the client's:
    /// another namespace, or the client's own when the query came back in
    /// there (over lo, to a resolver beside the client, as a hostNetwork
    /// client's to NodeLocalDNS).
    #[inline]
    fn reached_server_netns(&self, arrival: &OpenLeg, devs: &Devices) -> bool {
        let ns = devs.get(arrival.dev).ns();
        ns != devs.get(self.legs[0].dev).ns()
            || (arrival.hook.direction() == Direction::Ingress && self.left(ns, devs))
    }

    /// Whether a query leg left the namespace `ns`.
    #[cold]
    fn left(&self, ns: (NodeId, u32), devs: &Devices) -> bool {
        self.legs.iter().any(|l| {
            !l.response() && l.hook.direction() == Direction::Egress && devs.get(l.dev).ns() == ns
        })
    }

    /// Adds `p`, seen at device `dev`.
    pub(super) fn add_leg(&mut self, p: &Packet, seen: &Sighting, dev: u16, devs: &Devices) {
        let msg = seen.msg;
        // The same message seen twice at one place; a capture's coarse
        // clock gives an answer its query's time there too.
        let duplicate = self.legs.iter().any(|l| {
            let d = devs.get(l.dev);
            l.ts_ns == p.ts_ns
                && d.ifindex == p.ifindex
                && d.ns() == (p.node, p.netns)
                && l.hook == p.hook
                && l.response() == msg.response
        });
        if duplicate || self.legs.len() >= MAX_LEGS {
            return;
        }
        let marks = self.marks(p, seen.fragment.clone());
        // The latest answer or drop, in kernel time, decides: an answer the
        // kernel then dropped at the client never reached the application,
        // nor did one that came without a fragment.
        let decides =
            (p.drop.is_some() || (msg.response && !seen.cut)) && p.ts_ns >= self.outcome_ns();
        let (src, src_v6) = self.pack(p.src);
        let (dst, dst_v6) = self.pack(p.dst);
        let mut flags = LegFlags::default();
        flags.set(LegFlags::RESPONSE, msg.response);
        flags.set(LegFlags::V6_SRC, src_v6);
        flags.set(LegFlags::V6_DST, dst_v6);
        self.legs.push(OpenLeg {
            ts_ns: p.ts_ns,
            dev,
            marks,
            src,
            dst,
            hook: p.hook,
            flags,
        });
        if decides {
            self.decided = u16::try_from(self.legs.len()).unwrap_or(u16::MAX);
            if p.drop.is_none() {
                self.answer = Some(msg.clone());
            }
        }
        self.flags.set(JourneyFlags::ANSWER_SEEN, msg.response);
        if msg.response {
            self.answer_len = self.answer_len.max(p.ip_len());
        }
        if msg.response && p.drop.is_none() && !seen.cut {
            let delivered = self.reached_client(p, devs);
            self.flags.set(JourneyFlags::DELIVERED, delivered);
        }
    }

    /// `p`'s marks, if it has any: the copy an earlier leg holds, if the same.
    fn marks(&self, p: &Packet, fragment: Option<Box<FragmentNote>>) -> Option<Arc<Marks>> {
        let ct = p.ct.as_deref();
        let marks = Marks {
            dnat: ct.and_then(Conntrack::dnat),
            snat: ct.and_then(Conntrack::snat),
            drop: p.drop.map(|d| (d.reason, d.location)),
            fragment,
            underlay: p.underlay.as_deref().copied(),
        };
        if marks.dnat.is_none()
            && marks.snat.is_none()
            && marks.drop.is_none()
            && marks.fragment.is_none()
            && marks.underlay.is_none()
        {
            return None;
        }
        let held = self.legs.iter().rev().find_map(|l| l.marks.as_ref());
        match held {
            Some(m) if **m == marks => Some(m.clone()),
            _ => Some(Arc::new(marks)),
        }
    }

    /// The reply passed back, the other way, through the first place the
    /// query was seen: it is with the client. Between the tracepoints, its
    /// arrival in the query's network namespace is: behind a macvlan, VLAN
    /// device or bond, the kernel fires `netif_receive_skb` on the lower
    /// device only, as the kernel's lookup counting knows
    /// (`dnstrace_common::lookups`). A plain capture (no namespace) saw
    /// both ways at one tap, with no direction: the reply back at the tap
    /// that saw the query first is as far as it can be followed.
    fn reached_client(&self, p: &Packet, devs: &Devices) -> bool {
        let origin = self
            .legs
            .iter()
            .filter(|l| !l.response())
            .min_by_key(|l| l.ts_ns);
        // Only device hooks have a way through; NAT and conntrack probes do not.
        let through_device = p.hook.direction().through_device();
        origin.is_some_and(|o| {
            let from = devs.get(o.dev);
            let device_or_namespace = from.ifindex == p.ifindex
                || (o.hook == Hook::DevXmit && p.hook == Hook::DevReceive);
            let back = o.hook.direction() != p.hook.direction()
                || (p.netns == 0 && from.ifindex == p.ifindex);
            through_device && from.ns() == (p.node, p.netns) && device_or_namespace && back
        })
    }

    pub(super) fn finish(self, mut upstream: Vec<Journey>, devs: &Devices) -> Journey {
        let v6 = self.v6();
        let mut legs: Vec<Leg> = self
            .legs
            .iter()
            .map(|l| l.closed(v6, devs, if l.response() { self.answer_len } else { 0 }))
            .collect();
        legs.sort_by_key(|l| l.ts_ns);
        let mut prev = legs.first().map_or(0, |l| l.ts_ns);
        for leg in &mut legs {
            leg.since_prev_ns = leg.ts_ns - prev;
            prev = leg.ts_ns;
        }
        let started_ns = legs.first().map_or(self.started_ns, |l| l.ts_ns);
        // Without conntrack: a query that went in for one address and arrived
        // at another was translated on the way.
        let dnat = legs
            .iter()
            .find_map(|l| l.dnat.clone())
            .or_else(|| self.extra.as_ref().and_then(|e| e.dnat).map(Box::new))
            .or_else(|| {
                let mut queries = legs.iter().filter(|l| !l.response).map(|l| l.dst);
                let asked = queries.next()?;
                queries
                    .find(|d| *d != asked)
                    .map(|served| Box::new((asked, served)))
            });
        upstream.sort_by_key(|u| u.started_ns);
        let outcome = self.outcome();
        let tcp = self.has(JourneyFlags::TCP);
        Journey {
            id: self.id,
            lookup: self.lookup,
            client: self.client(),
            dns_id: self.dns_id,
            name: self.name.into(),
            asked_as: self
                .extra
                .as_ref()
                .and_then(|e| e.asked_as.as_deref().map(Arc::from)),
            qtype: self.qtype,
            tcp,
            started_ns,
            ended_ns: legs.last().map_or(started_ns, |l| l.ts_ns),
            outcome,
            dnat,
            legs,
            upstream,
            incomplete: self.incomplete,
            sampled: SampleLevel::default(),
            connection: None,
            opcode: self.extra.as_ref().and_then(|e| e.opcode.clone()),
        }
    }
}

impl Open {
    /// Dropped, answered or timed out, by the leg that decided it. An
    /// answer's text is made here, once.
    fn outcome(&self) -> Outcome {
        if let Some((reason, location)) = self.deciding_drop() {
            return Outcome::Dropped { reason, location };
        }
        match self.answer.as_ref().filter(|_| self.decided > 0) {
            Some(msg) => Outcome::Answered {
                rcode: msg.rcode,
                // An UPDATE's records are its changes, not answers.
                answers: match self.extra.as_ref().and_then(|e| e.opcode.as_ref()) {
                    Some(_) => Vec::new(),
                    None => msg
                        .answers
                        .iter()
                        .map(|a| [a.rtype, " ", &a.data].concat())
                        .collect(),
                },
                truncated: msg.flags.tc,
                malformed: msg.malformed.clone(),
            },
            None => Outcome::Timeout,
        }
    }
}

/// Names equal but for ASCII case, as DNS compares them; the bytes
/// compared first, as most queries' names are already lowercase and each
/// hop confirms its journey's name.
fn same_name(a: &str, b: &str) -> bool {
    a.as_bytes() == b.as_bytes() || a.eq_ignore_ascii_case(b)
}

/// A leg while its journey is open: 32 bytes, not a `Leg`'s 136 (its
/// device an id in `Devices`, its marks shared, its addresses in 6 bytes
/// each, no time since the previous leg, which is known only once the legs
/// are sorted).
pub(super) struct OpenLeg {
    ts_ns: u64,
    pub(super) marks: Option<Arc<Marks>>,
    src: Addr,
    dst: Addr,
    pub(super) dev: u16,
    hook: Hook,
    flags: LegFlags,
}

const _: () = assert!(std::mem::size_of::<OpenLeg>() <= 32);

/// Legs an open journey has room for from its start: a query through a
/// service's DNAT on one node passes 4 hooks on its way to CoreDNS. Those
/// never answered (an upstream down) are the many open at once, and room
/// for the answer's 4 as well cost each 128 bytes more (13 MiB of the
/// memory figure's 74); an answered one grows once.
const LEGS: usize = 4;

/// Legs a journey keeps: more are one socket's packets looping or
/// resent without end (the kernel sends a loop's 1st, 2nd, 4th... lap
/// only, but a recording may hold every one). Each leg added looks for
/// its duplicate among them: this bounds that look.
const MAX_LEGS: usize = 1024;

/// What an open leg is, as bits. A type of its own, so that a journey's
/// flags, whose values overlap, cannot be asked here.
#[derive(Clone, Copy, Default)]
struct LegFlags(u8);

impl LegFlags {
    const RESPONSE: Self = Self(1);
    /// Its source address is IPv6.
    const V6_SRC: Self = Self(2);
    /// Its destination address is IPv6.
    const V6_DST: Self = Self(4);

    #[inline]
    fn has(self, flag: Self) -> bool {
        self.0 & flag.0 != 0
    }

    /// Sets `flag` if `on`.
    #[inline]
    fn set(&mut self, flag: Self, on: bool) {
        if on {
            self.0 |= flag.0;
        }
    }
}

/// What some legs carry: the NAT conntrack showed, the kernel's drop
/// (reason, location), the tunnel a capture found it in. One copy for a
/// journey's legs that carry the same: past a DNAT, each leg shows it.
#[derive(PartialEq)]
pub(super) struct Marks {
    dnat: Option<(SocketAddr, SocketAddr)>,
    snat: Option<(SocketAddr, SocketAddr)>,
    drop: Option<(u32, u64)>,
    fragment: Option<Box<FragmentNote>>,
    underlay: Option<Underlay>,
}

/// A record's message as a leg takes it.
pub(super) struct Sighting<'a> {
    pub(super) msg: &'a Arc<DnsMessage>,
    /// Not all there: never the journey's answer.
    pub(super) cut: bool,
    pub(super) fragment: Option<Box<FragmentNote>>,
}

/// A leg's socket address in 6 bytes, not 32: an IPv4 one inline, an
/// IPv6 one (rare) as its place in the journey's `Extra::v6`.
#[derive(Clone, Copy)]
pub(super) struct Addr([u8; 6]);

impl OpenLeg {
    fn response(&self) -> bool {
        self.flags.has(LegFlags::RESPONSE)
    }

    /// The leg as a journey shows it; `v6` is its journey's `Extra::v6`,
    /// `ip_len` its message's length.
    fn closed(&self, v6: &[SocketAddrV6], devs: &Devices, ip_len: u16) -> Leg {
        let dev = devs.get(self.dev);
        Leg {
            ts_ns: self.ts_ns,
            since_prev_ns: 0,
            hook: self.hook,
            iface: dev.name.clone(),
            ifindex: dev.ifindex,
            node: dev.node,
            netns: dev.netns,
            src: self.src.unpack(self.flags.has(LegFlags::V6_SRC), v6),
            dst: self.dst.unpack(self.flags.has(LegFlags::V6_DST), v6),
            response: self.response(),
            ip_len,
            dnat: self.marks.as_ref().and_then(|m| m.dnat).map(Box::new),
            snat: self.marks.as_ref().and_then(|m| m.snat).map(Box::new),
            drop: self.marks.as_ref().and_then(|m| m.drop).map(Box::new),
            fragment: self.marks.as_ref().and_then(|m| m.fragment.clone()),
            underlay: self.marks.as_ref().and_then(|m| m.underlay).map(Box::new),
        }
    }
}

impl Addr {
    fn v4(s: SocketAddrV4) -> Self {
        let [a, b, c, d] = s.ip().octets();
        let [e, f] = s.port().to_be_bytes();
        Self([a, b, c, d, e, f])
    }

    fn v6_at(at: usize) -> Self {
        let [a, b, c, d] = u32::try_from(at).unwrap_or(u32::MAX).to_be_bytes();
        Self([a, b, c, d, 0, 0])
    }

    /// The address; `v6` says which kind it is, `table` is the journey's
    /// `Extra::v6`.
    fn unpack(self, v6: bool, table: &[SocketAddrV6]) -> SocketAddr {
        let [a, b, c, d, e, f] = self.0;
        if v6 {
            SocketAddr::V6(table[u32::from_be_bytes([a, b, c, d]) as usize])
        } else {
            SocketAddr::from(([a, b, c, d], u16::from_be_bytes([e, f])))
        }
    }
}
