//! DNS over TCP: segments to length-prefixed messages, per stream and hook
//! point. Memory is bounded: streams, out-of-order data and idle time are capped.
use std::{collections::HashMap, net::SocketAddr};

use bytes::{Buf as _, Bytes, BytesMut};

use super::{NodeId, Packet, Transport};

/// TCP header flags, as `Transport::Tcp` carries them.
pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_streams: usize,
    /// Out-of-order segments held per stream before giving up on it.
    pub max_pending: usize,
    /// A stream idle this long is forgotten.
    pub idle_ns: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_streams: 4096,
            max_pending: 32,
            idle_ns: 120_000_000_000,
        }
    }
}

/// What a segment completed.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    Message(Bytes),
    /// Bytes of the stream the capture missed or cut: the messages in them
    /// are lost, and those after them until a segment starts with one.
    Gap(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    node: NodeId,
    netns: u32,
    ifindex: u32,
    hook: u8,
    src: SocketAddr,
    dst: SocketAddr,
}

#[derive(Default)]
struct Stream {
    next: Option<u32>,
    buf: BytesMut,
    pending: Vec<(u32, Bytes)>,
    broken: bool,
    last_ns: u64,
}

pub struct Reassembler {
    limits: Limits,
    streams: HashMap<Key, Stream>,
    evicted: u64,
    last_sweep_ns: u64,
}

impl Reassembler {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            streams: HashMap::new(),
            evicted: 0,
            last_sweep_ns: 0,
        }
    }

    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    pub fn push(&mut self, p: &Packet) -> Vec<Piece> {
        let Transport::Tcp { seq, flags } = p.transport else {
            return Vec::new();
        };
        self.sweep(p.ts_ns);
        let key = Key {
            node: p.node,
            netns: p.netns,
            ifindex: p.ifindex,
            hook: p.hook as u8,
            src: p.src,
            dst: p.dst,
        };
        if flags & RST != 0 {
            self.streams.remove(&key);
            return Vec::new();
        }
        if flags & SYN != 0 {
            let stream = Stream {
                next: Some(seq.wrapping_add(1)),
                last_ns: p.ts_ns,
                ..Stream::default()
            };
            self.insert(key, stream);
            return Vec::new();
        }
        let mut out = Vec::new();
        if !p.payload.is_empty() || p.payload_len > 0 {
            if !self.streams.contains_key(&key) {
                self.insert(key, Stream::default());
            }
            let limits = self.limits;
            if let Some(stream) = self.streams.get_mut(&key) {
                stream.last_ns = p.ts_ns;
                stream.segment(p, seq, limits, &mut out);
            }
        }
        if flags & FIN != 0 {
            self.streams.remove(&key);
        }
        out
    }

    fn insert(&mut self, key: Key, stream: Stream) {
        if self.streams.len() >= self.limits.max_streams && !self.streams.contains_key(&key) {
            let oldest = self
                .streams
                .iter()
                .min_by_key(|(_, s)| s.last_ns)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                self.streams.remove(&k);
                self.evicted += 1;
            }
        }
        self.streams.insert(key, stream);
    }

    fn sweep(&mut self, now: u64) {
        if now.saturating_sub(self.last_sweep_ns) < self.limits.idle_ns / 4 {
            return;
        }
        self.last_sweep_ns = now;
        let idle = self.limits.idle_ns;
        self.streams
            .retain(|_, s| now.saturating_sub(s.last_ns) < idle);
    }
}

impl Stream {
    fn segment(&mut self, p: &Packet, seq: u32, limits: Limits, out: &mut Vec<Piece>) {
        if p.truncated {
            let reason = format!(
                "TCP segment cut at {} of {} bytes by the capture",
                p.payload.len(),
                p.payload_len
            );
            return self.give_up(reason, out);
        }
        if self.broken {
            if !whole_messages(&p.payload) {
                // Unread, so what waits on it is unseen, not unanswered.
                return out.push(Piece::Gap(
                    "TCP segment not read: the stream lost its message boundaries before it".into(),
                ));
            }
            self.broken = false;
            self.next = Some(seq);
        }
        let next = *self.next.get_or_insert(seq);
        let rel = seq.wrapping_sub(next) as i32;
        if rel > 0 && whole_messages(&p.payload) {
            return self.resync(seq, rel, &p.payload, out);
        }
        if rel > 0 {
            if self.pending.len() >= limits.max_pending {
                return self.give_up("too much out-of-order TCP data".into(), out);
            }
            self.pending.push((seq, p.payload.clone()));
            return;
        }
        self.append(next, rel, &p.payload);
        self.drain_pending();
        self.messages(out);
    }

    /// Appends the held segments that now follow on.
    fn drain_pending(&mut self) {
        while let Some(i) = self
            .pending
            .iter()
            .position(|(s, _)| s.wrapping_sub(self.next.unwrap_or(*s)) as i32 <= 0)
        {
            let (s, data) = self.pending.swap_remove(i);
            let next = self.next.unwrap_or(s);
            self.append(next, s.wrapping_sub(next) as i32, &data);
        }
    }

    /// Picks the stream up again at `seq`, `missed` bytes past what was
    /// expected, whose segment holds whole messages. One segment each way
    /// is one message for most servers and clients, so a segment the
    /// capture missed costs its own messages, not the connection's.
    fn resync(&mut self, seq: u32, missed: i32, data: &Bytes, out: &mut Vec<Piece>) {
        out.push(Piece::Gap(format!(
            "{missed} bytes of the stream before this segment were not captured; \
             picked up again at its whole messages"
        )));
        self.buf.clear();
        self.pending.retain(|(s, _)| s.wrapping_sub(seq) as i32 > 0);
        self.next = Some(seq);
        self.append(seq, 0, data);
        self.drain_pending();
        self.messages(out);
    }

    /// Appends the part of `data` (starting `rel` <= 0 bytes before `next`) not yet seen.
    fn append(&mut self, next: u32, rel: i32, data: &[u8]) {
        let skip = rel.unsigned_abs() as usize;
        if skip >= data.len() {
            return; // a retransmission of what we have
        }
        self.buf.extend_from_slice(&data[skip..]);
        self.next = Some(next.wrapping_add((data.len() - skip) as u32));
    }

    fn messages(&mut self, out: &mut Vec<Piece>) {
        while self.buf.len() >= 2 {
            let len = usize::from(u16::from_be_bytes([self.buf[0], self.buf[1]]));
            if self.buf.len() < 2 + len {
                break;
            }
            self.buf.advance(2);
            out.push(Piece::Message(self.buf.split_to(len).freeze()));
        }
    }

    fn give_up(&mut self, reason: String, out: &mut Vec<Piece>) {
        self.broken = true;
        self.buf.clear();
        self.pending.clear();
        out.push(Piece::Gap(format!(
            "{reason}; this stream's messages are lost until a segment starts with one"
        )));
    }
}

/// `data` is one or more whole length-prefixed messages, each at least a
/// DNS header long, and nothing else: it can be read on its own.
fn whole_messages(data: &[u8]) -> bool {
    const HEADER: usize = 12;
    let mut rest = data;
    while let Some((len, after)) = rest.split_first_chunk::<2>() {
        let len = usize::from(u16::from_be_bytes(*len));
        if len < HEADER || after.len() < len {
            return false;
        }
        rest = &after[len..];
    }
    rest.is_empty() && !data.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dnstrace_common::Hook;

    fn seg(seq: u32, flags: u8, data: &[u8]) -> Packet {
        Packet {
            ts_ns: 1,
            node: Default::default(),
            netns: 1,
            ifindex: 2,
            hook: Hook::TcIngress,
            src: "10.0.0.1:40000".parse().unwrap(),
            dst: "10.0.0.2:53".parse().unwrap(),
            transport: Transport::Tcp { seq, flags },
            wire_len: 0,
            payload_len: data.len() as u32,
            truncated: false,
            frag: None,
            payload: Bytes::copy_from_slice(data),
            ifname: None,
            ct: None,
            drop: None,
            underlay: None,
        }
    }

    fn framed(msg: &[u8]) -> Vec<u8> {
        let mut v = (msg.len() as u16).to_be_bytes().to_vec();
        v.extend_from_slice(msg);
        v
    }

    fn messages(pieces: Vec<Piece>) -> Vec<Vec<u8>> {
        pieces
            .into_iter()
            .map(|p| match p {
                Piece::Message(m) => m.to_vec(),
                Piece::Gap(r) => panic!("gap: {r}"),
            })
            .collect()
    }

    #[test]
    fn several_messages_in_one_segment() {
        let mut r = Reassembler::new(Limits::default());
        r.push(&seg(99, SYN, b""));
        let mut data = framed(b"first");
        data.extend(framed(b"second"));
        assert_eq!(
            messages(r.push(&seg(100, 0, &data))),
            vec![b"first".to_vec(), b"second".to_vec()]
        );
    }

    #[test]
    fn message_split_across_segments_and_length_prefix_split() {
        let mut r = Reassembler::new(Limits::default());
        r.push(&seg(0, SYN, b""));
        let data = framed(b"hello dns");
        assert!(r.push(&seg(1, 0, &data[..1])).is_empty());
        assert!(r.push(&seg(2, 0, &data[1..5])).is_empty());
        assert_eq!(
            messages(r.push(&seg(6, 0, &data[5..]))),
            vec![b"hello dns".to_vec()]
        );
    }

    #[test]
    fn out_of_order_and_retransmitted_segments() {
        let mut r = Reassembler::new(Limits::default());
        r.push(&seg(u32::MAX, SYN, b"")); // sequence numbers wrap
        let data = framed(b"abcdefgh");
        assert!(r.push(&seg(4, 0, &data[4..])).is_empty());
        assert!(r.push(&seg(0, 0, &data[..2])).is_empty());
        assert!(r.push(&seg(0, 0, &data[..2])).is_empty()); // duplicate
        assert_eq!(
            messages(r.push(&seg(1, 0, &data[1..4]))),
            vec![b"abcdefgh".to_vec()]
        );
    }

    /// A DNS message's worth of bytes: at least a header.
    fn msg(tag: u8) -> Vec<u8> {
        vec![tag; 12]
    }

    #[test]
    fn cut_segment_is_a_gap_then_silence_until_a_segment_starts_a_message() {
        let mut r = Reassembler::new(Limits::default());
        r.push(&seg(0, SYN, b""));
        let first = framed(&msg(1));
        let mut cut = seg(1, 0, &first[..2]);
        cut.truncated = true;
        cut.payload_len = first.len() as u32;
        assert!(matches!(r.push(&cut)[..], [Piece::Gap(_)]));
        assert!(matches!(
            r.push(&seg(3, 0, &first[2..]))[..],
            [Piece::Gap(_)]
        ));
        assert_eq!(messages(r.push(&seg(15, 0, &framed(&msg(2))))), [msg(2)]);
        r.push(&seg(50, SYN, b""));
        assert_eq!(messages(r.push(&seg(51, 0, &framed(&msg(3))))), [msg(3)]);
    }

    /// A segment the capture missed costs its own message: the next one
    /// that holds whole messages is read, and so is what follows it.
    #[test]
    fn a_missed_segment_is_a_gap_and_the_stream_goes_on() {
        let mut r = Reassembler::new(Limits::default());
        r.push(&seg(0, SYN, b""));
        let [a, c] = [1, 3].map(|t| framed(&msg(t)));
        assert_eq!(messages(r.push(&seg(1, 0, &a))), [msg(1)]);
        // The second message (14 bytes at 15) is missed; c follows it.
        let after = r.push(&seg(29, 0, &c));
        assert!(matches!(&after[..], [Piece::Gap(why), Piece::Message(m)]
            if why.starts_with("14 bytes") && m[..] == msg(3)[..]));
        let d = framed(&msg(4));
        assert_eq!(
            messages(r.push(&seg(43, 0, &d[..5]))),
            Vec::<Vec<u8>>::new()
        );
        assert_eq!(messages(r.push(&seg(48, 0, &d[5..]))), [msg(4)]);
    }

    /// Only whole messages pick a stream up: a segment ahead that starts
    /// or ends inside one waits for what is missing, as before.
    #[test]
    fn whole_messages_and_nothing_else() {
        let two = [framed(&msg(1)), framed(&msg(2))].concat();
        assert!(whole_messages(&two));
        assert!(!whole_messages(&two[..two.len() - 1]));
        assert!(!whole_messages(&two[1..]));
        assert!(!whole_messages(&framed(b"short")));
        assert!(!whole_messages(b""));
    }

    #[test]
    fn stream_count_is_bounded_and_evictions_counted() {
        let mut r = Reassembler::new(Limits {
            max_streams: 2,
            ..Limits::default()
        });
        for port in 1..=5u16 {
            let mut p = seg(0, SYN, b"");
            p.src.set_port(port);
            r.push(&p);
        }
        assert_eq!(r.streams.len(), 2);
        assert_eq!(r.evicted(), 3);
    }
}
