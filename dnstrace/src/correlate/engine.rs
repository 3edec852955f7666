//! The engine: records in, journeys out; what it follows and how it finds
//! it live in the sibling modules.
use std::{
    collections::VecDeque,
    hash::{BuildHasher, Hasher as _},
    net::{IpAddr, SocketAddr},
};

use dnstrace_common::SampleLevel;
use foldhash::fast::RandomState;

use super::{
    connections::{Connection, Connections},
    devices::Devices,
    index::{ip_word, short, ByKey, Index},
    journey::{FragmentNote, Gap, Journey},
    lookups::Lookups,
    open::{JourneyFlags, Key, Open, Place, Question, Ref, Sighting, Slab, Slot},
    sampling::Sampling,
    table::Map,
};
use crate::{
    conntrack::CtEvent,
    decode::{dns, Body, Conntrack, DnsMessage, Packet, Qtype, Record, Transport},
};

/// Loss windows remembered; past this, the two oldest become one.
const MAX_LOSSES: usize = 256;

/// Journeys closed by one `tick` at most: closing 100,000 at once (the end
/// of a capture, a burst of timeouts) would hold them all, as full
/// journeys, at the same time.
pub const CLOSE_BATCH: usize = 4096;

/// How long an answer whose query was not seen is kept for it: a capture
/// taken at two points, or with a coarse clock, may stamp an answer a
/// little before its query.
const EARLY_NS: u64 = 10_000_000;

/// Such answers kept at most.
const EARLY_KEPT: usize = 64;

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A journey without an answer ends after this long.
    pub timeout_ns: u64,
    /// Journeys followed at once; the oldest beyond this are evicted.
    pub max_open: usize,
    /// Quiet time after the last leg before a journey is closed, so that
    /// events arriving slightly out of order still join it.
    pub settle_ns: u64,
}

impl Default for Limits {
    fn default() -> Self {
        // A little over the resolvers' 5 s retry.
        Self {
            timeout_ns: 5_500_000_000,
            max_open: 65_536,
            settle_ns: 200_000_000,
        }
    }
}

pub struct Engine {
    limits: Limits,
    open: Slab,
    by_key: ByKey,
    /// Unanswered journeys by question and place, TCP journeys by question,
    /// and journeys by client socket, so that finding a parent, a TCP
    /// retry, a conntrack entry's journeys or the journey of an answer
    /// without a question never scans them all. The
    /// first is keyed by a hash of (name hash, place): a parent found there
    /// is confirmed by its name and `Open::server_is`.
    waiting: Index<u32>,
    tcp_by_name: Index<Box<str>>,
    /// Keyed by the client socket hashed (4 bytes, not 32), and by each
    /// socket it is known by past a SNAT; each journey found there
    /// confirmed by its own key.
    by_client: Index<u32>,
    /// Keyed by the client socket, type and name hashed: whether a
    /// question is still asked, where one socket may have thousands open.
    by_question: Index<u32>,
    hasher: RandomState,
    /// Journeys, oldest first, for eviction and for the timed-out ones;
    /// closed ones are skipped lazily and compacted away now and then.
    order: VecDeque<Ref>,
    /// Journeys that were answered or dropped, some closed since (pruned
    /// lazily, as `order` is). With the open ones old enough to have timed
    /// out (at the front of `order`), they are all a tick can find finished.
    settling: Vec<Ref>,
    /// How far a journey's first packet has come before an earlier
    /// journey's (events from several CPUs arrive slightly out of order):
    /// how far past the timeout a tick looks along `order`.
    reorder_ns: u64,
    latest_start_ns: u64,
    lookups: Lookups,
    /// The TCP connections DNS went over, or tried to.
    connections: Connections,
    /// When each address last sent or got DNS over TCP, even where the
    /// message could not be read (a payload outside the captured bytes).
    tcp_seen: Map<IpAddr, u64>,
    next_id: u64,
    evicted: u64,
    /// Windows (since, until) in which the kernel lost events, kept while
    /// a journey that may still close could overlap one: it may miss legs,
    /// even if its first event was read only after the loss was noticed.
    losses: VecDeque<(u64, u64)>,
    sampling: Sampling,
    /// Journeys left out because a sampling level in effect while they
    /// were open would have left their later legs out.
    shed: u64,
    devices: Devices,
    /// Answers whose query was not seen, for `EARLY_NS`.
    early: VecDeque<Record>,
}

impl Engine {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            open: Slab::default(),
            by_key: ByKey::new(),
            waiting: Index::new(),
            tcp_by_name: Index::new(),
            by_client: Index::new(),
            by_question: Index::new(),
            hasher: RandomState::default(),
            order: VecDeque::new(),
            settling: Vec::new(),
            reorder_ns: 0,
            latest_start_ns: 0,
            lookups: Lookups::new(limits.timeout_ns),
            connections: Connections::new(limits.max_open, limits.timeout_ns),
            tcp_seen: Map::default(),
            next_id: 1,
            evicted: 0,
            losses: VecDeque::new(),
            sampling: Sampling::default(),
            shed: 0,
            devices: Devices::new(),
            early: VecDeque::new(),
        }
    }

    /// Journeys dropped because too many were open at once.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// The kernel's sampling level changed.
    pub fn sampling(&mut self, c: crate::ingest::SampleChange) {
        self.sampling.change(c);
    }

    /// The sampling level in effect now.
    pub fn sampling_level(&self) -> SampleLevel {
        self.sampling.now()
    }

    /// Journeys left out whole at sampling changes, rather than shown with
    /// legs the new level left out.
    pub fn shed(&self) -> u64 {
        self.shed
    }

    /// Did `client` turn to TCP since `since_ns`: a TCP journey for the
    /// question still open, or DNS over TCP seen from it at all?
    pub fn asked_over_tcp(&self, client: IpAddr, name: &str, qtype: Qtype, since_ns: u64) -> bool {
        let open = self.tcp_by_name.get(name).any(|slot| {
            self.open
                .get(slot)
                .is_some_and(|o| o.client().ip() == client && o.qtype == qtype)
        });
        open || self.tcp_seen.get(&client).is_some_and(|&ts| ts >= since_ns)
            || self.connections.tried_since(client, since_ns)
    }

    /// Is a journey for this question from the `client` socket still open?
    pub fn asking(&self, client: SocketAddr, name: &str, qtype: Qtype) -> bool {
        let key = question_key(&self.hasher, client, qtype, dns::name_hash(name));
        self.by_question.get(&key).any(|slot| {
            self.open
                .get(slot)
                .is_some_and(|o| o.client() == client && &*o.name == name && o.qtype == qtype)
        })
    }

    /// A TCP segment to or from a DNS port, with or without a message.
    pub fn segment(&mut self, p: &Packet) {
        self.connections.push(p);
    }

    /// TCP connections to DNS servers that were never set up, since the
    /// last call.
    pub fn failed_connections(&mut self) -> Vec<Connection> {
        self.connections.take_failed()
    }

    fn note_tcp(&mut self, p: &Packet) {
        if !matches!(p.transport, crate::decode::Transport::Tcp { .. }) {
            return;
        }
        if self.tcp_seen.len() > self.limits.max_open {
            let window = self.limits.timeout_ns;
            self.tcp_seen
                .retain(|_, ts| p.ts_ns.saturating_sub(*ts) <= window);
        }
        for ip in [p.src.ip(), p.dst.ip()] {
            let ts = self.tcp_seen.entry(ip).or_default();
            *ts = (*ts).max(p.ts_ns);
        }
    }

    /// Journeys followed now.
    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// Adds one decoded record; malformed payloads join nothing. A cut
    /// message joins its journey, but never as its answer.
    pub fn push(&mut self, rec: &Record) {
        self.note_tcp(&rec.packet);
        let (msg, cut) = match &rec.body {
            Body::Dns(msg) => (msg, false),
            Body::Cut(msg) => (msg, true),
            Body::Malformed { .. } => return,
            Body::Gap { .. } => return self.missed_answers(&rec.packet),
        };
        let p = &rec.packet;
        let Some(slot) = self.journey_of(msg, p) else {
            if msg.response && !cut {
                self.keep_early(rec);
            }
            return;
        };
        let dev = self.device(p);
        let Some(o) = self.open.get_mut(slot) else {
            return;
        };
        let was_settling = o.delivered_or_dropped();
        let filed = o.places(&self.devices);
        let seen = Sighting {
            msg,
            cut,
            fragment: FragmentNote::of(rec),
        };
        o.add_leg(p, &seen, dev, &self.devices);
        // Filed once the journey is done with: its TCP retry's lookup.
        let truncated = (msg.response && msg.flags.tc && !o.has(JourneyFlags::TCP)).then(|| {
            (
                self.lookups.retry_key(o.client().ip(), &o.name, o.qtype),
                o.lookup,
            )
        });
        if !was_settling && o.delivered_or_dropped() {
            self.settling.push(Ref::new(slot, o.id));
        }
        let places = o.places(&self.devices);
        if filed != places {
            // The journey was found by this name, in any case.
            let name = msg
                .questions
                .first()
                .map_or_else(|| dns::name_hash(&o.name), |q| q.name_hash);
            for pl in filed.into_iter().flatten() {
                self.waiting
                    .remove(&place_key(&self.hasher, name, pl), slot);
            }
            for pl in places.into_iter().flatten() {
                self.waiting.add(place_key(&self.hasher, name, pl), slot);
            }
        }
        // Past a SNAT the same query goes on under another source address.
        let alias =
            p.ct.as_deref()
                .and_then(Conntrack::snat)
                .map(|(_, seen)| seen);
        if let Some(alias) = alias.filter(|a| !o.aliases().any(|k| k == a)) {
            o.extra.get_or_insert_default().aliases.push(alias);
            self.by_client.add(short(self.hasher.hash_one(alias)), slot);
            let name = o.name.clone();
            let q = Question {
                client: alias,
                name: &name,
                ..o.question()
            };
            self.by_key.file(&self.open, &q, slot);
        }
        if let Some((key, lookup)) = truncated {
            self.lookups.note_truncated(key, lookup, p.ts_ns);
        }
        if !msg.response && !self.early.is_empty() {
            self.answer_early(msg, p);
        }
    }

    /// Keeps an answer no journey was waiting for, in case its query,
    /// stamped a little later, comes next.
    fn keep_early(&mut self, rec: &Record) {
        let now = rec.packet.ts_ns;
        while self.early.front().is_some_and(|r| {
            r.packet.ts_ns.saturating_add(EARLY_NS) < now || self.early.len() >= EARLY_KEPT
        }) {
            self.early.pop_front();
        }
        self.early.push_back(rec.clone());
    }

    /// The answers kept for the query `msg` just seen at `p`, added to its
    /// journey at the query's time: no earlier, as the clocks that stamped
    /// them cannot tell.
    fn answer_early(&mut self, msg: &DnsMessage, p: &Packet) {
        let asker = p.ct.as_deref().map_or(p.src, |ct| ct.original.src);
        let q = msg.questions.first();
        let answers = |r: &Record| {
            let Body::Dns(a) = &r.body else {
                return false;
            };
            let to = r
                .packet
                .ct
                .as_ref()
                .map_or(r.packet.dst, |ct| ct.original.src);
            let same_question = match (q, a.questions.first()) {
                (Some(q), Some(aq)) => q.qtype == aq.qtype && q.name.eq_ignore_ascii_case(&aq.name),
                (_, None) => true,
                (None, Some(_)) => false,
            };
            a.id == msg.id
                && to == asker
                && std::mem::discriminant(&r.packet.transport)
                    == std::mem::discriminant(&p.transport)
                && same_question
                && r.packet.ts_ns.saturating_add(EARLY_NS) >= p.ts_ns
        };
        // Most queries have none: nothing is moved for them.
        if !self.early.iter().any(answers) {
            return;
        }
        let (mine, rest): (Vec<Record>, Vec<Record>) = self.early.drain(..).partition(answers);
        self.early = rest.into();
        for mut r in mine {
            r.packet.ts_ns = r.packet.ts_ns.max(p.ts_ns);
            self.push(&r);
        }
    }

    /// The capture missed bytes of a TCP stream toward `p.dst`: the
    /// journeys of that socket still waiting may have lost their answers
    /// there, so their silence is no evidence.
    fn missed_answers(&mut self, p: &Packet) {
        let client = p.dst;
        for slot in self.by_client.get(&short(self.hasher.hash_one(client))) {
            if let Some(o) = self.open.get_mut(slot) {
                let own = o.client() == client || o.aliases().any(|a| *a == client);
                if own && o.has(JourneyFlags::TCP) && !o.has(JourneyFlags::ANSWER_SEEN) {
                    o.incomplete.get_or_insert(Gap::Missed);
                }
            }
        }
    }

    /// The journey `msg` belongs to, started if it is a new query; none
    /// for a reply whose query was never seen.
    fn journey_of(&mut self, msg: &DnsMessage, p: &Packet) -> Option<Slot> {
        // Conntrack knows the client's own address even after SNAT.
        let client = match (&p.ct, msg.response) {
            (Some(ct), _) => ct.original.src,
            (None, true) => p.dst,
            (None, false) => p.src,
        };
        let tcp = matches!(p.transport, Transport::Tcp { .. });
        let (name, qtype, name_hash) = match msg.questions.first() {
            Some(q) => (q.name.as_str(), q.qtype, q.name_hash),
            // Some FORMERR and REFUSED answers carry no question.
            None if msg.response => return self.answered(client, msg.id, tcp, p),
            // Nor do some queries (a first exchange of cookies, RFC 7873
            // 5.4): matched by ports and id alone.
            None => ("", Qtype::NONE, dns::name_hash("")),
        };
        let asked = Question {
            client,
            dns_id: msg.id,
            qtype,
            name,
            name_hash,
            tcp,
        };
        match self.by_key.find(&self.open, &asked) {
            Some(slot) => Some(slot),
            None if msg.response => None,
            None => {
                let key = Key {
                    client,
                    dns_id: msg.id,
                    name: name.to_ascii_lowercase().into(),
                    qtype,
                };
                let asked_as = (*key.name != *name).then(|| name.into());
                let slot = self.start(key, name_hash, p);
                let opcode = (msg.opcode != "QUERY").then(|| msg.opcode.clone());
                if asked_as.is_some() || opcode.is_some() {
                    if let Some(o) = self.open.get_mut(slot) {
                        let extra = o.extra.get_or_insert_default();
                        (extra.asked_as, extra.opcode) = (asked_as, opcode);
                    }
                }
                Some(slot)
            }
        }
    }

    /// The journey an answer without a question ends: the latest one from
    /// `client` (as known where the answer is seen) under `dns_id` whose
    /// query went to where the answer comes from.
    fn answered(&self, client: SocketAddr, dns_id: u16, tcp: bool, p: &Packet) -> Option<Slot> {
        self.by_client
            .get(&short(self.hasher.hash_one(client)))
            .filter_map(|slot| Some((slot, self.open.get(slot)?)))
            .filter(|(_, o)| {
                o.dns_id == dns_id
                    && o.has(JourneyFlags::TCP) == tcp
                    && (o.client() == client || o.aliases().any(|a| *a == client))
                    && o.asked(p.src)
            })
            .max_by_key(|(_, o)| o.started_ns)
            .map(|(slot, _)| slot)
    }

    /// A ctnetlink event: where no leg carried the conntrack entry, it still
    /// tells which endpoint the service address was translated to.
    pub fn conntrack(&mut self, ev: &CtEvent) {
        let Some(dnat) = (Conntrack {
            original: ev.original,
            reply: ev.reply,
            status: ev.status,
            is_reply: false,
        })
        .dnat() else {
            return;
        };
        let client = ev.original.src;
        let tcp = ev.proto == libc::IPPROTO_TCP as u8;
        for slot in self.by_client.get(&short(self.hasher.hash_one(client))) {
            let same = |o: &&mut Open| o.client() == client && o.has(JourneyFlags::TCP) == tcp;
            if let Some(o) = self.open.get_mut(slot).filter(same) {
                o.extra.get_or_insert_default().dnat.get_or_insert(dnat);
            }
        }
    }

    /// Events were lost between `since_ns` and `until_ns`: every open
    /// journey may miss legs, and so may any journey overlapping that time.
    pub fn lost(&mut self, since_ns: u64, until_ns: u64) {
        for o in self.open.values_mut() {
            o.incomplete = Some(Gap::Lost);
        }
        // Merged, never dropped: a wider window only marks more journeys.
        if self.losses.len() == MAX_LOSSES {
            if let Some((since, _)) = self.losses.pop_front() {
                if let Some(next) = self.losses.front_mut() {
                    next.0 = next.0.min(since);
                }
            }
        }
        self.losses.push_back((since_ns, until_ns));
    }

    /// Whether a journey started at `start` and closed at `now` overlaps a
    /// loss.
    fn overlaps_loss(&self, start: u64, now: u64) -> bool {
        self.losses
            .iter()
            .any(|(since, until)| start <= *until && now >= *since)
    }

    /// The earliest a journey that may still close can have started: the
    /// oldest open one's start, or the next one's, less how far starts
    /// arrive out of order. Not the close time less a timeout: a pipeline
    /// seconds behind closes journeys at times far past their starts.
    fn earliest_start(&mut self) -> u64 {
        while self
            .order
            .front()
            .is_some_and(|&r| self.open.at(r).is_none())
        {
            self.order.pop_front();
        }
        let oldest = self.order.front().and_then(|&r| self.open.at(r));
        oldest
            .map_or(self.latest_start_ns, |o| o.started_ns)
            .saturating_sub(self.reorder_ns)
    }

    /// Forgets the loss windows and sampling changes no journey that may
    /// still close reaches.
    fn forget_past(&mut self) {
        let earliest = self.earliest_start();
        while self
            .losses
            .front()
            .is_some_and(|(_, until)| *until < earliest)
        {
            self.losses.pop_front();
        }
        self.sampling.forget_before(earliest);
    }

    /// Closes what is finished at `now_ns`, earliest first, and returns
    /// top-level journeys: `CLOSE_BATCH` at most, so call it again while it
    /// returns that many.
    pub fn tick(&mut self, now_ns: u64) -> Vec<Journey> {
        self.forget_past();
        self.connections.tick(now_ns);
        let mut ready = if self.few_settling() {
            // Many lookups unanswered: only those settling, and those old
            // enough to have timed out, can be finished. Journeys start in
            // `order` within `reorder_ns` of one another, so past the first
            // one this recent, none has timed out.
            let timed_out_by = now_ns
                .saturating_sub(self.limits.timeout_ns)
                .saturating_add(self.reorder_ns);
            let open = &self.open;
            let old = self
                .order
                .iter()
                .filter_map(|&r| Some((r.slot, open.at(r)?)))
                .take_while(|(_, o)| o.started_ns <= timed_out_by);
            let settling = self
                .settling
                .iter()
                .filter_map(|&r| Some((r.slot, open.at(r)?)));
            self.ready(old.chain(settling), now_ns)
        } else {
            self.ready(self.open.iter(), now_ns)
        };
        // By first leg, then id: one order however the batches fall.
        ready.sort_unstable();
        ready.dedup();
        ready
            .into_iter()
            .take(CLOSE_BATCH)
            .filter_map(|(_, id, slot)| self.close(Ref::new(slot, id), now_ns, None))
            .collect()
    }

    /// Which of `these` are finished at `now` and not left to close with a
    /// journey they serve: (first leg, id, slot).
    fn ready<'a>(
        &self,
        these: impl Iterator<Item = (Slot, &'a Open)>,
        now: u64,
    ) -> Vec<(u64, u64, Slot)> {
        these
            .filter(|(_, o)| {
                self.finished(o, now) && o.parent.is_none_or(|p| self.open.at(p).is_none())
            })
            .map(|(slot, o)| (o.first_ns(), o.id, slot))
            .collect()
    }

    /// Whether few journeys are settling, so that a tick need not ask every
    /// open one; prunes `settling`, and then the front of `order`, of closed
    /// journeys.
    fn few_settling(&mut self) -> bool {
        let open = &self.open;
        if self.settling.len() > 2 * open.len() + 1024 {
            self.settling.retain(|&r| open.at(r).is_some());
        }
        if self.settling.len() * 4 >= open.len() {
            return false;
        }
        self.settling.retain(|&r| open.at(r).is_some());
        while self.order.front().is_some_and(|&r| open.at(r).is_none()) {
            self.order.pop_front();
        }
        true
    }

    /// Closes everything still open (end of capture or of a recording),
    /// in batches as `tick` does: call it until it returns fewer than
    /// `CLOSE_BATCH`. What had no known fate by `now_ns` was cut off, not
    /// timed out.
    pub fn finish(&mut self, now_ns: u64) -> Vec<Journey> {
        let timeout_ns = self.limits.timeout_ns;
        for o in self.open.values_mut() {
            if !o.settled(now_ns, timeout_ns) {
                o.incomplete.get_or_insert(Gap::Ended);
            }
        }
        self.tick(now_ns.saturating_add(self.limits.timeout_ns + self.limits.settle_ns))
    }

    fn start(&mut self, key: Key, name_hash: u64, p: &Packet) -> Slot {
        if self.open.len() >= self.limits.max_open {
            self.evict_oldest();
        }
        let id = self.next_id;
        self.next_id += 1;
        self.reorder_ns = self
            .reorder_ns
            .max(self.latest_start_ns.saturating_sub(p.ts_ns));
        self.latest_start_ns = self.latest_start_ns.max(p.ts_ns);
        let tcp = matches!(p.transport, Transport::Tcp { .. });
        let retried = tcp.then(|| self.lookups.retried(&key, p.ts_ns)).flatten();
        let lookup = retried.unwrap_or_else(|| self.lookups.of(&key, p.ts_ns, id));
        let parent = self.waiting_parent(&key, name_hash, p);
        let client = key.client;
        let slot = self.open.insert(Open::new(id, lookup, key, parent, tcp, p));
        let me = Ref::new(slot, id);
        if let Some(po) = parent.and_then(|p| self.open.get_mut(p.slot)) {
            let mut children = std::mem::take(&mut po.children).into_vec();
            children.push(me);
            po.children = children.into();
        }
        let o = self.open.get(slot).expect("just filed");
        self.by_key.file(&self.open, &o.question(), slot);
        if tcp {
            self.tcp_by_name.add(o.name.clone(), slot);
        }
        self.by_client
            .add(short(self.hasher.hash_one(client)), slot);
        let asked = question_key(&self.hasher, client, o.qtype, name_hash);
        self.by_question.add(asked, slot);
        if self.order.len() > 2 * self.open.len() + 1024 {
            let open = &self.open;
            self.order.retain(|&r| open.at(r).is_some());
        }
        self.order.push_back(me);
        slot
    }

    /// The open journey this query serves, if it was sent by a server that
    /// a journey for the same name is waiting at. Resolvers that forward do
    /// not coalesce: each client's query sends its own, in arrival order, so
    /// it serves the oldest of its type still without one (a retry, the
    /// oldest of all).
    fn waiting_parent(&self, key: &Key, name: u64, p: &Packet) -> Option<Ref> {
        let places = [
            Some(Place::Addr(p.src.ip())),
            (p.netns != 0).then_some(Place::Netns(p.node, p.netns)),
        ];
        places
            .into_iter()
            .flatten()
            .flat_map(|pl| self.waiting.get(&place_key(&self.hasher, name, pl)))
            .filter_map(|slot| Some((slot, self.open.get(slot)?)))
            .filter(|(_, o)| {
                o.name == key.name
                    && o.client() != key.client
                    && !o.has(JourneyFlags::ANSWER_SEEN)
                    && o.server_is(p, &self.devices)
            })
            .min_by_key(|(_, o)| (o.qtype != key.qtype, !o.children.is_empty(), o.started_ns))
            .map(|(slot, o)| Ref::new(slot, o.id))
    }

    /// Answered or dropped and quiet since (upstream journeys too), timed
    /// out and quiet, or past the timeout and settling time whatever comes.
    /// A tick may ask every open journey, most of them too recent: the
    /// cheap tests go first.
    fn finished(&self, o: &Open, now: u64) -> bool {
        let age = now.saturating_sub(o.started_ns);
        if age >= self.limits.timeout_ns + self.limits.settle_ns {
            return true;
        }
        if now.saturating_sub(o.last_ns()) < self.limits.settle_ns {
            return false;
        }
        age >= self.limits.timeout_ns
            || (o.delivered_or_dropped()
                && o.children
                    .iter()
                    .all(|&c| self.open.at(c).is_none_or(|c| self.finished(c, now))))
    }

    /// Closes a journey, and its upstream queries as the lookup of `root`'s
    /// client (a cluster view follows them whole for it).
    fn close(&mut self, r: Ref, now_ns: u64, root: Option<IpAddr>) -> Option<Journey> {
        let mut o = self.open.remove(r)?;
        self.forget(r.slot, &o);
        let client = root.unwrap_or(o.client().ip());
        let upstream = std::mem::take(&mut o.children)
            .into_vec()
            .into_iter()
            .filter_map(|c| self.close(c, now_ns, Some(client)))
            .collect();
        if self.overlaps_loss(o.started_ns, now_ns) {
            o.incomplete = Some(Gap::Lost);
        }
        let label = (!o.has(JourneyFlags::TCP)).then_some(o.label);
        let Some(sampled) = self.sampling.kept(label, client, o.first_ns(), now_ns) else {
            self.shed += 1;
            return None;
        };
        let mut j = o.finish(upstream, &self.devices);
        j.sampled = sampled;
        if j.tcp {
            j.connection = self.connections.get(j.client).cloned().map(Box::new);
        }
        Some(j)
    }

    fn forget(&mut self, slot: Slot, o: &Open) {
        let q = o.question();
        self.by_key.unfile(&q, slot);
        for &client in o.aliases() {
            self.by_key.unfile(&Question { client, ..q }, slot);
            self.by_client
                .remove(&short(self.hasher.hash_one(client)), slot);
        }
        if o.has(JourneyFlags::TCP) {
            self.tcp_by_name.remove(&o.name, slot);
        }
        self.by_client
            .remove(&short(self.hasher.hash_one(o.client())), slot);
        let name = q.name_hash;
        self.by_question
            .remove(&question_key(&self.hasher, q.client, q.qtype, name), slot);
        for pl in o.places(&self.devices).into_iter().flatten() {
            self.waiting
                .remove(&place_key(&self.hasher, name, pl), slot);
        }
    }

    /// The id of the device `p` was seen at, filed if new. A full table
    /// keeps only what open legs use; should they use all 65,536 ids, every
    /// open journey is evicted (counted) rather than a leg misnamed.
    fn device(&mut self, p: &Packet) -> u16 {
        if let Some(id) = self.devices.find(p) {
            return id;
        }
        if self.devices.full() {
            self.compact_devices();
        }
        if self.devices.list.len() > usize::from(u16::MAX) {
            while !self.order.is_empty() {
                self.evict_oldest();
            }
            self.compact_devices();
        }
        self.devices.add(p)
    }

    fn compact_devices(&mut self) {
        let mut used = vec![false; self.devices.list.len()];
        for (_, o) in self.open.iter() {
            for l in &o.legs {
                used[usize::from(l.dev)] = true;
            }
        }
        let new_id = self.devices.compact(&used);
        for l in self.open.values_mut().flat_map(|o| &mut o.legs) {
            l.dev = new_id[usize::from(l.dev)];
        }
    }

    fn evict_oldest(&mut self) {
        while let Some(r) = self.order.pop_front() {
            if let Some(o) = self.open.remove(r) {
                self.forget(r.slot, &o);
                self.evicted += 1;
                return;
            }
        }
    }
}

/// The key of `Engine::by_question`, hashed as words as `place_key` is.
fn question_key(hasher: &RandomState, client: SocketAddr, qtype: Qtype, name: u64) -> u32 {
    let mut h = hasher.build_hasher();
    h.write_u128(ip_word(client.ip()));
    h.write_u64(u64::from(client.port()) | u64::from(qtype.0) << 16);
    h.write_u64(name);
    short(h.finish())
}

/// Where a journey waits for `name` (hashed) at `place`, in
/// `Engine::waiting`: hashed as two words, as `ByKey`'s keys are, since
/// a query's every hop to another place files it again.
fn place_key(hasher: &RandomState, name: u64, place: Place) -> u32 {
    let word = match place {
        Place::Netns(node, netns) => 1 << 127 | u128::from(node.0) << 32 | u128::from(netns),
        Place::Addr(ip) => ip_word(ip),
    };
    let mut h = hasher.build_hasher();
    h.write_u64(name);
    h.write_u128(word);
    short(h.finish())
}

// The engine's tests, beside the other modules' files.
#[cfg(test)]
#[path = "tests.rs"]
mod tests;
