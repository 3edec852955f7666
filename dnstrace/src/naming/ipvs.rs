//! Services from kube-proxy's IPVS mode: `ipvsadm -S -n`, whose lines are
//! `-A -u VIP:PORT …` for a virtual service and `-a -u VIP:PORT -r RIP:PORT
//! …` for each of its real servers (`-t` TCP, `-u` UDP; `-f` fwmark
//! services are skipped). The kernel this was written on has no IPVS: the
//! tests read a fixture written from ipvsadm(8)'s documented format.
use std::net::{IpAddr, SocketAddr};

use super::{Proto, ServicePort};

/// The services in `ipvsadm -S -n` output, with their real servers.
pub fn parse(text: &str) -> Vec<ServicePort> {
    let mut ports: Vec<ServicePort> = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some((proto, vip)) = virtual_service(&words) else {
            continue;
        };
        match (words[0], real_server(&words)) {
            ("-A", _) => ports.push(ServicePort {
                ip: vip.ip(),
                port: vip.port(),
                proto,
                name: None,
                endpoints: Vec::new(),
            }),
            ("-a", Some(rip)) => {
                let owner = ports
                    .iter_mut()
                    .find(|p| (p.ip, p.port, p.proto) == (vip.ip(), vip.port(), proto));
                owner.into_iter().for_each(|p| p.endpoints.push(rip));
            }
            _ => {}
        }
    }
    ports
}

/// The protocol and address after `-A`/`-a`: `-u 10.96.0.10:53`.
fn virtual_service(words: &[&str]) -> Option<(Proto, SocketAddr)> {
    let proto = match *words.get(1)? {
        "-t" => Proto::Tcp,
        "-u" => Proto::Udp,
        _ => return None,
    };
    Some((proto, words.get(2)?.parse().ok()?))
}

/// The address after `-r`.
fn real_server(words: &[&str]) -> Option<IpAddr> {
    let at = words.iter().position(|w| *w == "-r")?;
    let addr: SocketAddr = words.get(at + 1)?.parse().ok()?;
    Some(addr.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn virtual_services_and_real_servers() {
        let ports = parse(include_str!("fixtures/ipvsadm-S-n.txt"));
        assert_eq!(ports.len(), 4, "fwmark services are skipped");
        let udp = &ports[2];
        assert_eq!(
            (udp.ip, udp.port, udp.proto),
            (ip("10.96.0.10"), 53, Proto::Udp)
        );
        assert_eq!(udp.endpoints, [ip("10.244.0.53"), ip("10.244.0.54")]);
        assert_eq!(ports[3].ip, ip("fd00:10:96::a"));
        assert_eq!(ports[3].endpoints, [ip("fd00:10:244::35")]);
        assert_eq!(ports[0].name, None, "IPVS knows no service names");
    }

    #[test]
    fn garbage_and_orphan_real_servers_are_skipped() {
        let ports = parse("-a -u 10.96.0.10:53 -r 10.244.0.53:53 -m -w 1\n-A\n-A -u nope -s rr\n");
        assert!(ports.is_empty());
    }
}
