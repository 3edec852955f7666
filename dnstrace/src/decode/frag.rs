//! UDP over fragmented IP: a datagram's fragments put back together per
//! hook point, so that a large answer reads whole where it was whole, and
//! says which fragment it lacked, and where that was last seen, where it
//! was not. Memory is bounded: datagrams held, their bytes and their time.
use std::{
    collections::{HashMap, VecDeque},
    hash::Hash,
    net::IpAddr,
    sync::Arc,
};

use bytes::BytesMut;
use dnstrace_common::Hook;

use super::{Fragment, NodeId, Packet};

/// The first fragment's data starts with the UDP header.
const UDP_HEADER: u32 = 8;
/// Fragments of one datagram: 64 KiB at the smallest usual MTU (576)
/// take 119.
const MAX_FRAGMENTS: usize = 128;
/// Fragments whose last place is remembered, per datagram: past this, the
/// one seen longest ago is forgotten.
const MAX_SIGHTINGS: usize = 16;

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Datagrams held at once; past this the oldest is evicted.
    pub max_datagrams: usize,
    /// Most IP data bytes of one datagram (fragment offsets reach 65,528).
    pub max_bytes: u32,
    /// A datagram not whole this long after its first fragment to arrive
    /// is given up: far beyond the microseconds its fragments take
    /// between hooks, within the seconds a client waits before retrying.
    pub timeout_ns: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_datagrams: 1024,
            max_bytes: 65_535,
            timeout_ns: 2_000_000_000,
        }
    }
}

/// A hook point that saw a fragment, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub ts_ns: u64,
    pub netns: u32,
    pub ifindex: u32,
    pub ifname: Option<Arc<str>>,
    pub hook: Hook,
}

impl Seen {
    /// The device's name: reported by the hook, or among the `known` (the
    /// --iface ones), or else its index.
    pub fn device_name(&self, known: &HashMap<u32, String>) -> String {
        super::packet::device_name(self.ifname.as_deref(), self.ifindex, known)
    }

    fn of(p: &Packet) -> Self {
        Self {
            ts_ns: p.ts_ns,
            netns: p.netns,
            ifindex: p.ifindex,
            ifname: p.ifname.clone(),
            hook: p.hook,
        }
    }
}

/// What a hook point lacked of a datagram it never got whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    /// IP offset of the first data it did not get (or got inconsistent):
    /// the fragment that starts there is the one missing.
    pub offset: u16,
    /// Where a fragment holding that data was last seen, if anywhere.
    pub last_seen: Option<Seen>,
}

/// A datagram done with at a hook point.
#[derive(Debug)]
pub enum Done {
    /// Whole: the first fragment's packet with the whole UDP payload,
    /// stamped with the time of its last fragment.
    Whole(Packet),
    /// Given up (timed out, evicted, inconsistent) where its first
    /// fragment was seen: that fragment, and what was missing.
    Cut(Packet, Missing),
}

/// A datagram at one hook point. No ports: a later fragment has none of
/// its own, and a capture's later fragments have none at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    node: NodeId,
    netns: u32,
    ifindex: u32,
    hook: u8,
    datagram: DatagramId,
}

/// A datagram wherever it is seen (until NAT rewrites an address).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct DatagramId {
    src: IpAddr,
    dst: IpAddr,
    id: u32,
}

impl DatagramId {
    fn of(p: &Packet, f: Fragment) -> Self {
        Self {
            src: p.src.ip(),
            dst: p.dst.ip(),
            id: f.id,
        }
    }
}

impl Key {
    fn of(p: &Packet, f: Fragment) -> Self {
        Self {
            node: p.node,
            netns: p.netns,
            ifindex: p.ifindex,
            hook: p.hook as u8,
            datagram: DatagramId::of(p, f),
        }
    }
}

/// Why a datagram cannot be put together: the IP offset where its
/// fragments disagree (overlap, pass the announced length, or end twice).
#[derive(Clone, Copy)]
struct Inconsistent(u32);

/// A datagram being put together.
#[derive(Default)]
struct Datagram {
    /// The first fragment, once it came.
    first: Option<Packet>,
    /// The datagram's IP data as far as fragments brought it; the UDP
    /// header's 8 bytes stay zero (the payload is what is wanted).
    data: BytesMut,
    /// Each fragment's [start, end) in `data`.
    pieces: Vec<(u32, u32)>,
    /// Bytes the pieces cover (they never overlap).
    held: u32,
    /// The data's length, once the last fragment (MF clear) came.
    len: Option<u32>,
    /// What all its fragments took on the wire.
    wire_len: u32,
    /// The latest fragment time.
    last_ns: u64,
    /// Given up on before its time: later fragments are ignored until it
    /// times out, rather than starting it again.
    broken: bool,
}

/// One fragment's bytes and where they go.
struct Piece<'a> {
    start: u32,
    end: u32,
    /// Where its bytes start in `data`: past the UDP header for the first.
    at: u32,
    bytes: &'a [u8],
    /// Where its data ends on the wire: past `end` if the capture cut it
    /// (the first fragment's own length is not known).
    extent: u32,
    /// The datagram's data length, if this fragment says it: the last
    /// one does, and so does the first one's UDP header.
    last_end: Option<u32>,
    announced: Option<u32>,
}

impl<'a> Piece<'a> {
    fn of(p: &'a Packet, f: Fragment) -> Self {
        let len = p.payload.len() as u32;
        let announced = UDP_HEADER.saturating_add(p.payload_len);
        let start = u32::from(f.offset);
        if f.is_first() {
            return Self {
                start,
                end: UDP_HEADER.saturating_add(len),
                at: UDP_HEADER,
                bytes: &p.payload,
                extent: UDP_HEADER.saturating_add(len),
                last_end: (!f.more).then_some(announced),
                announced: Some(announced),
            };
        }
        let extent = start.saturating_add(p.payload_len.max(len));
        Self {
            start,
            end: start.saturating_add(len),
            at: start,
            bytes: &p.payload,
            extent,
            last_end: (!f.more).then_some(extent),
            announced: None,
        }
    }
}

impl Datagram {
    /// Adds a fragment; the datagram's packet once it is whole.
    fn add(
        &mut self,
        p: Packet,
        f: Fragment,
        limits: &Limits,
    ) -> Result<Option<Packet>, Inconsistent> {
        if self.broken {
            return Ok(None);
        }
        let piece = Piece::of(&p, f);
        let bad = Inconsistent(piece.start);
        if self.duplicate(&piece)? {
            return Ok(None);
        }
        let too_big = piece.end.max(piece.extent) > limits.max_bytes;
        if too_big || self.pieces.len() >= MAX_FRAGMENTS {
            return Err(bad);
        }
        let first_said = self
            .first
            .as_ref()
            .map(|p| UDP_HEADER.saturating_add(p.payload_len));
        let mut len = None;
        for said in [self.len, piece.last_end, piece.announced, first_said]
            .into_iter()
            .flatten()
        {
            if len.is_some_and(|l| l != said) {
                return Err(bad);
            }
            len = Some(said);
        }
        let past = |end: u32| len.is_some_and(|l| end > l);
        if past(piece.end) || self.pieces.iter().any(|&(_, e)| past(e)) {
            return Err(bad);
        }
        self.place(&piece);
        self.len = self.len.or(piece.last_end);
        self.wire_len = self.wire_len.saturating_add(p.wire_len);
        self.last_ns = self.last_ns.max(p.ts_ns);
        if f.is_first() {
            self.first = Some(p);
        }
        Ok(self.whole())
    }

    /// The same fragment again (another copy of it is no news); a
    /// fragment overlapping another one is an error.
    fn duplicate(&self, piece: &Piece) -> Result<bool, Inconsistent> {
        let overlapping = self
            .pieces
            .iter()
            .find(|&&(s, e)| s < piece.end && piece.start < e);
        let Some(&(s, e)) = overlapping else {
            return Ok(false);
        };
        let same = (s, e) == (piece.start, piece.end)
            && self.data[piece.at as usize..piece.end as usize] == *piece.bytes;
        if same {
            Ok(true)
        } else {
            Err(Inconsistent(piece.start.max(s)))
        }
    }

    fn place(&mut self, piece: &Piece) {
        if self.data.len() < piece.end as usize {
            self.data.resize(piece.end as usize, 0);
        }
        self.data[piece.at as usize..piece.end as usize].copy_from_slice(piece.bytes);
        self.pieces.push((piece.start, piece.end));
        self.held += piece.end - piece.start;
    }

    /// The datagram's packet, if the first fragment and all data up to the
    /// last one are here.
    fn whole(&mut self) -> Option<Packet> {
        if self.first.is_none() || self.len != Some(self.held) {
            return None;
        }
        let mut p = self.first.take()?;
        let data = std::mem::take(&mut self.data).freeze();
        p.payload = data.slice(UDP_HEADER as usize..);
        p.frag = None;
        p.truncated = false;
        p.ts_ns = self.last_ns;
        p.wire_len = self.wire_len;
        Some(p)
    }

    /// The first offset whose data is not here.
    fn first_hole(&self) -> u32 {
        let mut pieces = self.pieces.clone();
        pieces.sort_unstable();
        let mut at = 0;
        for (s, e) in pieces {
            if s > at {
                break;
            }
            at = at.max(e);
        }
        at
    }

    /// Gives up on it: its memory goes, its first fragment (if it came)
    /// comes back.
    fn break_off(&mut self) -> Option<Packet> {
        self.broken = true;
        self.data = BytesMut::new();
        self.pieces = Vec::new();
        self.first.take()
    }
}

/// Where a datagram's fragments were seen, wherever they went, for the
/// hook points that never got one of them.
#[derive(Default)]
struct Trail {
    /// The first fragment, as first seen: a dropped later fragment is
    /// shown with its message.
    first: Option<Packet>,
    /// Per fragment offset: its data's end, and where it was last seen.
    seen: Vec<(u32, u32, Seen)>,
}

impl Trail {
    fn sight(&mut self, p: &Packet, f: Fragment) {
        let piece = Piece::of(p, f);
        let seen = (piece.start, piece.extent, Seen::of(p));
        if f.is_first() && self.first.is_none() {
            self.first = Some(p.clone());
        }
        let same = self.seen.iter().position(|(s, ..)| *s == piece.start);
        let oldest = || {
            self.seen
                .iter()
                .enumerate()
                .min_by_key(|(_, (.., at))| at.ts_ns)
                .map(|(i, _)| i)
        };
        match same.or_else(|| (self.seen.len() >= MAX_SIGHTINGS).then(oldest).flatten()) {
            Some(i) => self.seen[i] = seen,
            None => self.seen.push(seen),
        }
    }

    /// The latest place a fragment holding `offset` was seen.
    fn last_seen(&self, offset: u32) -> Option<Seen> {
        self.seen
            .iter()
            .filter(|(s, e, _)| *s <= offset && offset < *e)
            .map(|(.., at)| at)
            .max_by_key(|at| at.ts_ns)
            .cloned()
    }
}

/// Why a datagram left before it was whole.
#[derive(Clone, Copy)]
enum End {
    TimedOut,
    Evicted,
}

pub struct Reassembler {
    limits: Limits,
    held: Aging<Key, Datagram>,
    trails: Aging<DatagramId, Trail>,
    given_up: u64,
    evicted: u64,
}

impl Reassembler {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            held: Aging::new(limits.max_datagrams),
            // Each datagram is held at a handful of hook points.
            trails: Aging::new(limits.max_datagrams),
            given_up: 0,
            evicted: 0,
        }
    }

    /// Datagrams given up: timed out, or their fragments inconsistent.
    pub fn given_up(&self) -> u64 {
        self.given_up
    }

    /// Datagrams given up because too many were held at once.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// A fragment seen at a hook point that passes it on (not a drop).
    pub fn push(&mut self, p: Packet, out: &mut Vec<Done>) {
        let Some(f) = p.frag else { return };
        self.sight(&p, f);
        let key = Key::of(&p, f);
        if self.held.get_mut(&key).is_none() {
            if let Some((old_key, old)) = self.held.insert(key, Datagram::default(), p.ts_ns) {
                self.end(old_key, old, End::Evicted, out);
            }
        }
        let Some(d) = self.held.get_mut(&key) else {
            return;
        };
        match d.add(p, f, &self.limits) {
            Ok(None) => {}
            Ok(Some(whole)) => {
                self.held.remove(&key);
                out.push(Done::Whole(whole));
            }
            Err(Inconsistent(at)) => {
                let hole = d.first_hole().min(at);
                let first = d.break_off();
                self.given_up += 1;
                self.cut(first, key.datagram, hole, out);
            }
        }
    }

    /// A fragment the kernel dropped: not put together with others (it
    /// went no further), only remembered. Its datagram's first fragment,
    /// as first seen anywhere, if it was.
    pub fn dropped(&mut self, p: &Packet) -> Option<&Packet> {
        let f = p.frag?;
        self.sight(p, f);
        self.trails.get(&DatagramId::of(p, f))?.first.as_ref()
    }

    /// Gives up on the datagrams past their time at `now_ns`.
    /// Whether anything is held that `expire` could give up: most of the
    /// time nothing, and the per-packet check costs one comparison.
    #[inline]
    pub fn holds_any(&self) -> bool {
        !(self.held.is_empty() && self.trails.is_empty())
    }

    pub fn expire(&mut self, now_ns: u64, out: &mut Vec<Done>) {
        let Some(cutoff) = now_ns.checked_sub(self.limits.timeout_ns) else {
            return;
        };
        while let Some((key, d)) = self.held.pop_born_by(cutoff) {
            self.end(key, d, End::TimedOut, out);
        }
        // A trail outlives the datagrams it may be asked about.
        let Some(cutoff) = cutoff.checked_sub(self.limits.timeout_ns) else {
            return;
        };
        while self.trails.pop_born_by(cutoff).is_some() {}
    }

    fn sight(&mut self, p: &Packet, f: Fragment) {
        let id = DatagramId::of(p, f);
        if self.trails.get_mut(&id).is_none() {
            self.trails.insert(id, Trail::default(), p.ts_ns);
        }
        if let Some(trail) = self.trails.get_mut(&id) {
            trail.sight(p, f);
        }
    }

    fn end(&mut self, key: Key, mut d: Datagram, why: End, out: &mut Vec<Done>) {
        if d.broken {
            return; // counted when it broke
        }
        match why {
            End::Evicted => self.evicted += 1,
            End::TimedOut => self.given_up += 1,
        }
        let hole = d.first_hole();
        self.cut(d.break_off(), key.datagram, hole, out);
    }

    /// Says a datagram is cut at `hole`, where its first fragment was seen.
    fn cut(&self, first: Option<Packet>, id: DatagramId, hole: u32, out: &mut Vec<Done>) {
        let Some(first) = first else { return };
        let missing = Missing {
            offset: u16::try_from(hole).unwrap_or(u16::MAX),
            last_seen: self.trails.get(&id).and_then(|t| t.last_seen(hole)),
        };
        out.push(Done::Cut(first, missing));
    }
}

/// A map whose entries leave in the order they came: the oldest when it
/// is full, and those that came by a time.
struct Aging<K, V> {
    /// Each value with its serial number, which tells a live entry of
    /// `order` from one left by a removed value.
    map: HashMap<K, (u64, V)>,
    /// (arrival time, serial, key), oldest first.
    order: VecDeque<(u64, u64, K)>,
    serial: u64,
    max: usize,
}

impl<K: Copy + Eq + Hash, V> Aging<K, V> {
    fn new(max: usize) -> Self {
        Self {
            map: HashMap::new(),
            order: VecDeque::new(),
            serial: 0,
            max: max.max(1),
        }
    }

    fn get(&self, k: &K) -> Option<&V> {
        self.map.get(k).map(|(_, v)| v)
    }

    fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        self.map.get_mut(k).map(|(_, v)| v)
    }

    /// Adds a new entry; the oldest one, if it had to make room.
    fn insert(&mut self, k: K, v: V, now_ns: u64) -> Option<(K, V)> {
        let evicted = if self.map.len() >= self.max {
            self.pop_born_by(u64::MAX)
        } else {
            None
        };
        self.serial += 1;
        self.map.insert(k, (self.serial, v));
        self.order.push_back((now_ns, self.serial, k));
        // Removed entries leave their place in `order` behind.
        if self.order.len() > 2 * self.max {
            let map = &self.map;
            self.order
                .retain(|(_, serial, k)| map.get(k).is_some_and(|(s, _)| s == serial));
        }
        evicted
    }

    fn remove(&mut self, k: &K) -> Option<V> {
        self.map.remove(k).map(|(_, v)| v)
    }

    /// The oldest entry, if it came by `cutoff_ns`.
    /// Nothing held, not even an entry of `order` left by a removed value.
    #[inline]
    fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    fn pop_born_by(&mut self, cutoff_ns: u64) -> Option<(K, V)> {
        while let Some(&(born, serial, k)) = self.order.front() {
            let live = self.map.get(&k).is_some_and(|(s, _)| *s == serial);
            if live && born > cutoff_ns {
                return None;
            }
            self.order.pop_front();
            if live {
                return self.remove(&k).map(|v| (k, v));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests;
