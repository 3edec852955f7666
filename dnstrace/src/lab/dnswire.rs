//! What the lab's clients share: resolv.conf as glibc reads it, the search
//! candidates, and the DNS messages of an A+AAAA exchange.
use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpStream},
    time::Duration,
};

use hickory_proto::{
    op::{Message, MessageType, Query, ResponseCode},
    rr::{Name, RData, RecordType},
};

/// The resolver settings glibc reads.
#[derive(Debug, PartialEq)]
pub struct ResolvConf {
    pub nameservers: Vec<IpAddr>,
    pub search: Vec<String>,
    pub ndots: usize,
    pub timeout: Duration,
    pub attempts: u32,
}

pub fn parse_resolv_conf(text: &str) -> ResolvConf {
    let mut rc = ResolvConf {
        nameservers: Vec::new(),
        search: Vec::new(),
        ndots: 1,
        timeout: Duration::from_secs(5),
        attempts: 2,
    };
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => rc
                .nameservers
                .extend(words.next().and_then(|a| a.parse::<IpAddr>().ok())),
            Some("search") | Some("domain") => rc.search = words.map(str::to_owned).collect(),
            Some("options") => {
                for opt in words {
                    let (key, value) = opt.split_once(':').unwrap_or((opt, ""));
                    let n: Option<usize> = value.parse().ok();
                    match key {
                        "ndots" => rc.ndots = n.unwrap_or(1).min(15),
                        "timeout" => {
                            rc.timeout = Duration::from_secs(n.unwrap_or(5).clamp(1, 30) as u64)
                        }
                        "attempts" => rc.attempts = n.unwrap_or(2).clamp(1, 5) as u32,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    rc.nameservers.truncate(3);
    rc
}

/// The names glibc tries, in order, for `name`.
pub fn candidates(name: &str, rc: &ResolvConf) -> Vec<String> {
    if let Some(absolute) = name.strip_suffix('.') {
        return vec![format!("{absolute}.")];
    }
    let searched = rc.search.iter().map(|s| format!("{name}.{s}."));
    let absolute = format!("{name}.");
    if name.matches('.').count() >= rc.ndots {
        std::iter::once(absolute).chain(searched).collect()
    } else {
        searched.chain(std::iter::once(absolute)).collect()
    }
}

/// How one A+AAAA exchange for one candidate name ended.
pub enum Pair {
    Addresses(Vec<String>),
    /// NXDOMAIN or no address: glibc moves on to the next candidate.
    NotHere(&'static str),
    Failed(String),
}

/// What the application sees, in resolver terms.
pub fn io_reason(e: std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => "timeout".into(),
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        _ => e.to_string(),
    }
}

pub fn classify(replies: &[Message]) -> Option<Pair> {
    if replies.iter().any(|m| {
        matches!(
            m.response_code(),
            ResponseCode::ServFail | ResponseCode::Refused
        )
    }) {
        return None;
    }
    let addresses: Vec<String> = replies
        .iter()
        .flat_map(|m| m.answers())
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(a.to_string()),
            RData::AAAA(a) => Some(a.to_string()),
            _ => None,
        })
        .collect();
    if !addresses.is_empty() {
        Some(Pair::Addresses(addresses))
    } else if replies
        .iter()
        .all(|m| m.response_code() == ResponseCode::NXDomain)
    {
        Some(Pair::NotHere("NXDOMAIN"))
    } else {
        Some(Pair::NotHere("no address"))
    }
}

/// One query over its own TCP connection: the retry after a truncated
/// answer, or every query with `--tcp`.
pub fn tcp_ask(
    server: SocketAddr,
    query: &[u8],
    wait: Duration,
    queries: &mut u32,
) -> Result<Message, String> {
    *queries += 1;
    let mut s = TcpStream::connect_timeout(&server, wait).map_err(|e| format!("TCP: {e}"))?;
    s.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
    let mut framed = (query.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(query);
    s.write_all(&framed).map_err(|e| format!("TCP: {e}"))?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len).map_err(|e| format!("TCP: {e}"))?;
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut buf).map_err(|e| format!("TCP: {e}"))?;
    Message::from_vec(&buf).map_err(|e| format!("TCP answer: {e}"))
}

pub fn query(id: u16, name: &Name, rtype: RecordType) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(id)
        .set_message_type(MessageType::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(name.clone(), rtype));
    m.to_vec().unwrap_or_default()
}

pub fn random_id() -> u16 {
    let mut id = [0u8; 2];
    // SAFETY: getrandom writes at most the buffer's length.
    unsafe { libc::getrandom(id.as_mut_ptr().cast(), 2, 0) };
    u16::from_ne_bytes(id)
}
