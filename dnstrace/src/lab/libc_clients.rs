//! The retry habits of the two C libraries applications resolve with, for
//! `lab traffic --client glibc|musl`: what each sends for one name, and
//! when it sends it again.
//!
//! glibc (resolv/res_send.c, `__res_context_send` and `send_dg`): for each
//! of `attempts` tries, each nameserver in turn, with `timeout << i` (the
//! i-th server; divided by the number of servers past the first) for the
//! whole exchange. A and AAAA go out back to back on one connected socket,
//! with their own ids; a try again resends the same two queries (same ids)
//! on the same socket. A timeout with one answer in switches to
//! single-request (A, its answer, then AAAA) and tries again; once more, to
//! single-request-reopen (a new socket for AAAA); then it keeps the one
//! answer. `options single-request-reopen` starts in that mode. A truncated
//! answer sends both over TCP.
//!
//! musl (src/network/res_msend.c, lookup_name.c): both queries go to every
//! nameserver at once from one unconnected socket, and every
//! `timeout / attempts` (2.5 s) again to every server for the queries not
//! yet answered, until `timeout` (5 s) in all. The first answer from any
//! server wins; a SERVFAIL is asked again at once of the server that sent
//! it, twice per query at most. Truncated answers are asked again over TCP
//! (musl 1.2.4). It searches the list only for names with fewer than ndots
//! dots.
use std::{
    io::ErrorKind,
    net::{IpAddr, SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use hickory_proto::{
    op::{Message, ResponseCode},
    rr::{Name, RecordType},
};

use super::dnswire::{classify, io_reason, query, random_id, tcp_ask, Pair, ResolvConf};

/// `options single-request-reopen` or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glibc {
    Default,
    SingleRequestReopen,
}

/// How `send_dg` sends the pair: together, one after the other, or one
/// after the other from a new socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Parallel,
    Single,
    SingleReopen,
}

/// The two queries of a lookup: A then AAAA, distinct ids.
struct Queries {
    ids: [u16; 2],
    wire: [Vec<u8>; 2],
}

impl Queries {
    fn new(name: &str) -> Result<Self, String> {
        let qname = Name::from_ascii(name).map_err(|e| format!("bad name {name}: {e}"))?;
        let a = random_id();
        let aaaa = a.wrapping_add(1 + random_id() % u16::MAX);
        Ok(Self {
            ids: [a, aaaa],
            wire: [
                query(a, &qname, RecordType::A),
                query(aaaa, &qname, RecordType::AAAA),
            ],
        })
    }

    /// Which of the two `reply` answers, if any.
    fn slot(&self, reply: &Message) -> Option<usize> {
        self.ids.iter().position(|&id| id == reply.id())
    }
}

/// glibc's time for the whole exchange with the `i`-th nameserver.
pub fn glibc_server_timeout(rc: &ResolvConf, i: usize) -> Duration {
    let mut seconds = rc.timeout.as_secs() << i;
    if i > 0 {
        seconds /= rc.nameservers.len() as u64;
    }
    Duration::from_secs(seconds.max(1))
}

/// glibc's res_send for one name.
pub fn glibc_exchange(rc: &ResolvConf, name: &str, habit: Glibc, queries: &mut u32) -> Pair {
    let q = match Queries::new(name) {
        Ok(q) => q,
        Err(e) => return Pair::Failed(e),
    };
    let start = match habit {
        Glibc::Default => Mode::Parallel,
        Glibc::SingleRequestReopen => Mode::SingleReopen,
    };
    // One socket per nameserver, kept across tries (EXT(statp).nssocks).
    let mut sockets: Vec<Option<UdpSocket>> = rc.nameservers.iter().map(|_| None).collect();
    let mut last = String::from("no nameserver");
    for _ in 0..rc.attempts {
        for (i, &ns) in rc.nameservers.iter().enumerate() {
            let server = SocketAddr::new(ns, 53);
            let wait = glibc_server_timeout(rc, i);
            match send_dg(&mut sockets[i], server, &q, wait, start, queries) {
                Ok(Some(pair)) => return pair,
                Ok(None) => last = "SERVFAIL".into(),
                Err(e) => last = e,
            }
        }
    }
    Pair::Failed(last)
}

/// What one round of `send_dg` got before its time ran out.
enum Round {
    Both([Message; 2]),
    One(Message),
    None,
}

/// One `send_dg` call: rounds until both answers are in, stepping down to
/// single-request modes after a timeout with one answer.
fn send_dg(
    sock: &mut Option<UdpSocket>,
    server: SocketAddr,
    q: &Queries,
    wait: Duration,
    mut mode: Mode,
    queries: &mut u32,
) -> Result<Option<Pair>, String> {
    loop {
        let replies = match round(sock, server, q, wait, mode, queries)? {
            Round::Both(replies) => replies,
            Round::One(reply) => match mode {
                Mode::Parallel => {
                    mode = Mode::Single;
                    continue;
                }
                Mode::Single => {
                    mode = Mode::SingleReopen;
                    *sock = None;
                    continue;
                }
                Mode::SingleReopen => return Ok(classify(std::slice::from_ref(&reply))),
            },
            Round::None => return Err("timeout".into()),
        };
        if replies.iter().any(Message::truncated) {
            *sock = None;
            let over_tcp = [
                tcp_ask(server, &q.wire[0], wait, queries)?,
                tcp_ask(server, &q.wire[1], wait, queries)?,
            ];
            return Ok(classify(&over_tcp));
        }
        return Ok(classify(&replies));
    }
}

/// Sends the pair in `mode` and collects answers until `wait` has passed.
fn round(
    sock: &mut Option<UdpSocket>,
    server: SocketAddr,
    q: &Queries,
    wait: Duration,
    mode: Mode,
    queries: &mut u32,
) -> Result<Round, String> {
    let deadline = Instant::now() + wait;
    let mut replies: [Option<Message>; 2] = [None, None];
    let sequential = mode != Mode::Parallel;
    send(sock, server, &q.wire[0], queries)?;
    if !sequential {
        send(sock, server, &q.wire[1], queries)?;
    }
    let mut sent_second = !sequential;
    while replies.iter().any(Option::is_none) {
        let Some(reply) = receive(sock_ref(sock)?, q, deadline)? else {
            break;
        };
        let Some(slot) = q.slot(&reply) else {
            continue;
        };
        replies[slot] = Some(reply);
        if !sent_second {
            if mode == Mode::SingleReopen {
                *sock = None;
            }
            send(sock, server, &q.wire[1], queries)?;
            sent_second = true;
        }
    }
    Ok(match replies {
        [Some(a), Some(b)] => Round::Both([a, b]),
        [Some(one), None] | [None, Some(one)] => Round::One(one),
        [None, None] => Round::None,
    })
}

fn sock_ref(sock: &Option<UdpSocket>) -> Result<&UdpSocket, String> {
    sock.as_ref().ok_or_else(|| "no socket".to_owned())
}

/// Sends on the nameserver's socket, opening (and connecting) it first.
fn send(
    sock: &mut Option<UdpSocket>,
    server: SocketAddr,
    wire: &[u8],
    queries: &mut u32,
) -> Result<(), String> {
    if sock.is_none() {
        let s = UdpSocket::bind(unspecified(server.ip())).map_err(|e| e.to_string())?;
        s.connect(server).map_err(|e| e.to_string())?;
        *sock = Some(s);
    }
    *queries += 1;
    sock_ref(sock)?.send(wire).map_err(io_reason).map(drop)
}

/// The next reply that parses, or None when `deadline` passes.
fn receive(sock: &UdpSocket, q: &Queries, deadline: Instant) -> Result<Option<Message>, String> {
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        sock.set_read_timeout(Some(left))
            .map_err(|e| e.to_string())?;
        match sock.recv(&mut buf) {
            Ok(n) => {
                if let Ok(m) = Message::from_vec(&buf[..n]) {
                    if q.slot(&m).is_some() {
                        return Ok(Some(m));
                    }
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Ok(None)
            }
            Err(e) => return Err(io_reason(e)),
        }
    }
}

fn unspecified(ip: IpAddr) -> SocketAddr {
    match ip {
        IpAddr::V4(_) => "0.0.0.0:0".parse().expect("a socket address"),
        IpAddr::V6(_) => "[::]:0".parse().expect("a socket address"),
    }
}

/// The names musl tries for `name`: the search list only below ndots dots.
pub fn musl_candidates(name: &str, rc: &ResolvConf) -> Vec<String> {
    if let Some(absolute) = name.strip_suffix('.') {
        return vec![format!("{absolute}.")];
    }
    let absolute = format!("{name}.");
    if name.matches('.').count() >= rc.ndots {
        return vec![absolute];
    }
    rc.search
        .iter()
        .map(|s| format!("{name}.{s}."))
        .chain(std::iter::once(absolute))
        .collect()
}

/// musl's `__res_msend` for one name, then its reading of the answers.
pub fn musl_exchange(rc: &ResolvConf, name: &str, queries: &mut u32) -> Pair {
    let q = match Queries::new(name) {
        Ok(q) => q,
        Err(e) => return Pair::Failed(e),
    };
    let servers: Vec<SocketAddr> = rc
        .nameservers
        .iter()
        .map(|&ip| SocketAddr::new(ip, 53))
        .collect();
    let Some(first) = servers.first() else {
        return Pair::Failed("no nameserver".into());
    };
    let answers = match msend(first.ip(), &servers, &q, rc, queries) {
        Ok(answers) => answers,
        Err(e) => return Pair::Failed(e),
    };
    // A query left unanswered fails the lookup (EAI_AGAIN): the search stops.
    let [Some(a), Some(aaaa)] = answers else {
        return Pair::Failed("timeout".into());
    };
    let mut replies = [a, aaaa];
    for (slot, reply) in replies.iter_mut().enumerate() {
        if reply.truncated() {
            let server = servers[0];
            match tcp_ask(server, &q.wire[slot], rc.timeout, queries) {
                Ok(m) => *reply = m,
                Err(e) => return Pair::Failed(e),
            }
        }
    }
    classify(&replies).unwrap_or_else(|| Pair::Failed("SERVFAIL".into()))
}

/// The sending and waiting of `__res_msend`; the answers in query order.
fn msend(
    family: IpAddr,
    servers: &[SocketAddr],
    q: &Queries,
    rc: &ResolvConf,
    queries: &mut u32,
) -> Result<[Option<Message>; 2], String> {
    let sock = UdpSocket::bind(unspecified(family)).map_err(|e| e.to_string())?;
    let timeout = rc.timeout;
    let retry_interval = timeout / rc.attempts;
    let t0 = Instant::now();
    let mut answers: [Option<Message>; 2] = [None, None];
    let mut next_round = t0;
    let mut servfail_retry = 0;
    let mut buf = [0u8; 4096];
    while answers.iter().any(Option::is_none) && t0.elapsed() < timeout {
        if Instant::now() >= next_round {
            for (slot, answer) in answers.iter().enumerate() {
                if answer.is_none() {
                    for &server in servers {
                        *queries += 1;
                        let _ = sock.send_to(&q.wire[slot], server);
                    }
                }
            }
            next_round += retry_interval;
            servfail_retry = 2 * q.wire.len();
        }
        let until = next_round.min(t0 + timeout);
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            continue;
        }
        sock.set_read_timeout(Some(left))
            .map_err(|e| e.to_string())?;
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        // Replies from addresses it did not ask are ignored.
        if !servers.contains(&from) {
            continue;
        }
        let Ok(reply) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let Some(slot) = q.slot(&reply).filter(|&s| answers[s].is_none()) else {
            continue;
        };
        match reply.response_code() {
            ResponseCode::NoError | ResponseCode::NXDomain => answers[slot] = Some(reply),
            // Never kept: the query waits on, for another server or the end.
            ResponseCode::ServFail if servfail_retry > 0 => {
                servfail_retry -= 1;
                *queries += 1;
                let _ = sock.send_to(&q.wire[slot], from);
            }
            _ => {}
        }
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::dnswire::parse_resolv_conf;

    #[test]
    fn glibc_gives_later_nameservers_shifted_shares_of_the_timeout() {
        let rc = |n: usize| {
            let servers: String = (1..=n)
                .map(|i| format!("nameserver 10.0.0.{i}\n"))
                .collect();
            parse_resolv_conf(&servers)
        };
        let secs = |rc: &ResolvConf, i| glibc_server_timeout(rc, i).as_secs();
        assert_eq!(secs(&rc(1), 0), 5);
        assert_eq!((secs(&rc(2), 0), secs(&rc(2), 1)), (5, 5));
        assert_eq!(
            (secs(&rc(3), 0), secs(&rc(3), 1), secs(&rc(3), 2)),
            (5, 3, 6)
        );
    }

    #[test]
    fn musl_searches_only_names_with_fewer_dots_than_ndots() {
        let rc = parse_resolv_conf("nameserver 10.96.0.10\nsearch default.svc.cluster.local svc.cluster.local\noptions ndots:2\n");
        assert_eq!(
            musl_candidates("www.example.com", &rc),
            vec!["www.example.com."]
        );
        assert_eq!(
            musl_candidates("db.default", &rc),
            vec![
                "db.default.default.svc.cluster.local.",
                "db.default.svc.cluster.local.",
                "db.default."
            ]
        );
        assert_eq!(musl_candidates("fqdn.", &rc), vec!["fqdn."]);
    }

    #[test]
    fn the_pair_has_two_ids() {
        for _ in 0..1000 {
            let q = Queries::new("www.example.com.").unwrap();
            assert_ne!(q.ids[0], q.ids[1]);
        }
    }
}
