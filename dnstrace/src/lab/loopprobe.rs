//! CoreDNS's `loop` plugin, as the lab's CoreDNS pods run it (coredns/coredns
//! plugin/loop, setup.go and loop.go): at every start and reload, a HINFO
//! query for `<random>.<random>.<zone>` to the server's own `:53`, which
//! Linux connects over lo. A failed exchange (2 s, miekg/dns's default) is
//! retried a second later, until one is answered or 30 s have passed. The
//! zone is the server block's first, `.` in the kubeadm Corefile: the probe
//! is forwarded upstream, which answers NXDOMAIN.
use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use hickory_proto::{
    op::{Message, MessageType, Query},
    rr::{Name, RecordType},
};

/// Where Go's `dns.Exchange(m, ":53")` lands: the local system, over lo.
const OWN_PORT: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 53);
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);
const RETRY_AFTER: Duration = Duration::from_secs(1);
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// `<random-int>.<random-int>.` (the root zone), each a 62-bit integer.
pub fn probe_name() -> Name {
    let label = || (random_u64() & ((1 << 62) - 1)).to_string();
    Name::from_ascii(format!("{}.{}.", label(), label())).expect("digits make a valid name")
}

/// Sends the probe from the current network namespace until it is answered.
pub fn run() -> Result<()> {
    let name = probe_name();
    let deadline = Instant::now() + GIVE_UP_AFTER;
    while Instant::now() < deadline {
        if exchange(&name).is_ok() {
            return Ok(());
        }
        std::thread::sleep(RETRY_AFTER);
    }
    anyhow::bail!("the loop probe {name} HINFO got no answer in 30 s")
}

fn exchange(name: &Name) -> Result<Message> {
    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    sock.connect(OWN_PORT)?;
    sock.set_read_timeout(Some(EXCHANGE_TIMEOUT))?;
    let id = random_u64() as u16;
    sock.send(&probe_query(id, name))?;
    let mut buf = [0u8; 4096];
    loop {
        let n = sock.recv(&mut buf).context("no answer to the loop probe")?;
        if let Ok(reply) = Message::from_vec(&buf[..n]) {
            if reply.id() == id {
                return Ok(reply);
            }
        }
    }
}

/// miekg/dns's `SetQuestion(name, TypeHINFO)`: recursion desired, no EDNS.
fn probe_query(id: u16, name: &Name) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(id)
        .set_message_type(MessageType::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(name.clone(), RecordType::HINFO));
    m.to_vec().unwrap_or_default()
}

fn random_u64() -> u64 {
    let mut n = [0u8; 8];
    // SAFETY: getrandom writes at most the buffer's length.
    unsafe { libc::getrandom(n.as_mut_ptr().cast(), n.len(), 0) };
    u64::from_ne_bytes(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_name_is_two_random_integers_under_the_root() {
        let name = probe_name();
        assert_eq!(name.num_labels(), 2);
        assert!(name.is_fqdn());
        for label in name.iter() {
            let n: u64 = std::str::from_utf8(label).unwrap().parse().unwrap();
            assert!(n < 1 << 62);
        }
        assert_ne!(probe_name(), name, "a new name at every start");
    }

    #[test]
    fn the_probe_is_a_recursive_hinfo_query() {
        let wire = probe_query(7, &Name::from_ascii("1.2.").unwrap());
        let m = Message::from_vec(&wire).unwrap();
        assert_eq!((m.id(), m.recursion_desired()), (7, true));
        assert_eq!(m.queries()[0].query_type(), RecordType::HINFO);
        assert!(m.extensions().is_none());
    }
}
