//! Names for addresses, without the API server: services and their
//! endpoints from kube-proxy's own rules in the node's iptables, pods from
//! the container runtime's state.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::Path,
    process::Command,
};

use crate::netns::in_netns;

/// What kube-proxy's nat rules say: service cluster IPs and endpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Services {
    /// Cluster IP → `namespace/name`.
    pub cluster_ips: BTreeMap<IpAddr, String>,
    /// Cluster IPs with a port-53 rule.
    pub dns_ips: BTreeSet<IpAddr>,
    /// Endpoint IP → `namespace/name` of its service.
    pub endpoints: BTreeMap<IpAddr, String>,
}

impl Services {
    /// From `iptables-save -t nat` (and ip6tables) in the node's namespace;
    /// empty where there are none or the tools are missing.
    pub fn read(node: Option<&Path>) -> Self {
        let dump = in_netns(node, || {
            let mut text = String::new();
            for program in ["iptables-save", "ip6tables-save"] {
                if let Ok(out) = Command::new(program).args(["-t", "nat"]).output() {
                    text += &String::from_utf8_lossy(&out.stdout);
                }
            }
            Ok(text)
        });
        dump.map(|text| Self::parse(&text)).unwrap_or_default()
    }

    /// kube-proxy matches a service as `-d IP/32 ... --comment "ns/name:port
    /// cluster IP"` in KUBE-SERVICES (or its KUBE-SVC-* chain), and an
    /// endpoint as `--comment "ns/name:port" ... -j DNAT --to-destination IP:PORT`
    /// in a KUBE-SEP-* chain.
    pub fn parse(rules: &str) -> Self {
        let mut s = Self::default();
        for line in rules.lines() {
            let service = comment(line).map(|c| c.split(':').next().unwrap_or(c).to_owned());
            let is_service =
                line.starts_with("-A KUBE-SERVICES ") || line.starts_with("-A KUBE-SVC-");
            if let (true, Some(ip), Some(name)) = (is_service, arg(line, "-d"), &service) {
                let Some(ip) = ip.split('/').next().and_then(|a| a.parse().ok()) else {
                    continue;
                };
                if line.contains("--dport 53 ") {
                    s.dns_ips.insert(ip);
                }
                s.cluster_ips.insert(ip, name.clone());
            }
            if let (true, Some(to), Some(name)) = (
                line.starts_with("-A KUBE-SEP-"),
                arg(line, "--to-destination"),
                service,
            ) {
                if let Some(ip) = endpoint_ip(to) {
                    s.endpoints.insert(ip, name);
                }
            }
        }
        s
    }

    /// Endpoints of the services with a DNS cluster IP: the resolvers.
    pub fn dns_endpoints(&self) -> BTreeSet<IpAddr> {
        let dns: BTreeSet<&String> = self
            .dns_ips
            .iter()
            .filter_map(|ip| self.cluster_ips.get(ip))
            .collect();
        self.endpoints
            .iter()
            .filter(|(_, svc)| dns.contains(svc))
            .map(|(ip, _)| *ip)
            .collect()
    }
}

/// The word after `flag` on an iptables-save line.
fn arg<'a>(line: &'a str, flag: &str) -> Option<&'a str> {
    let mut words = line.split_whitespace();
    words.find(|w| *w == flag)?;
    words.next()
}

/// The text of `--comment "..."`.
fn comment(line: &str) -> Option<&str> {
    let rest = line.split_once("--comment \"")?.1;
    Some(rest.split_once('"')?.0)
}

/// `10.244.0.53:53` or `[fd00::53]:53`.
fn endpoint_ip(to: &str) -> Option<IpAddr> {
    if let Some(v6) = to.strip_prefix('[') {
        return v6.split_once(']')?.0.parse().ok();
    }
    to.rsplit_once(':').map_or(to, |(ip, _)| ip).parse().ok()
}

/// Every address dnstrace can name.
#[derive(Clone, Debug, Default)]
pub struct Names {
    names: BTreeMap<IpAddr, String>,
}

impl Names {
    /// Pod addresses (`namespace/pod`) win over endpoint entries for the
    /// same address; service IPs are named after their service.
    pub fn new(services: &Services, pods: &[(String, Vec<IpAddr>)]) -> Self {
        let mut names: BTreeMap<IpAddr, String> = services.endpoints.clone();
        names.extend(services.cluster_ips.clone());
        for (pod, ips) in pods {
            for ip in ips {
                names.insert(*ip, pod.clone());
            }
        }
        Self { names }
    }

    pub fn get(&self, ip: &IpAddr) -> Option<&str> {
        self.names.get(ip).map(String::as_str)
    }

    pub fn entries(&self) -> &BTreeMap<IpAddr, String> {
        &self.names
    }

    /// Names as a recording kept them.
    pub fn from_entries(names: BTreeMap<IpAddr, String>) -> Self {
        Self { names }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = "\
-A KUBE-SVC-TCOU7JCQXEZGVUNU ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p udp -m comment --comment \"kube-system/kube-dns:dns cluster IP\" -m udp --dport 53 -j KUBE-MARK-MASQ
-A KUBE-SERVICES -d fd00:10:96::a/128 -p tcp -m comment --comment \"kube-system/kube-dns:dns-tcp cluster IP\" -m tcp --dport 53 -j KUBE-SVC-ERIFXISQEP7F7OF4
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"default/kubernetes:https cluster IP\" -m tcp --dport 443 -j KUBE-SVC-NPX46M4PTMTKRN6Y
-A KUBE-SEP-IT2ZTR26TO4XFPTO -p udp -m comment --comment \"kube-system/kube-dns:dns\" -m udp -j DNAT --to-destination 10.244.0.53:53
-A KUBE-SEP-ZXMNUKOKXUTL2MK2 -p tcp -m comment --comment \"kube-system/kube-dns:dns-tcp\" -m tcp -j DNAT --to-destination [fd00:10:244::54]:53
-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -m comment --comment \"default/kubernetes:https\" -m tcp -j DNAT --to-destination 192.168.1.10:6443
-A POSTROUTING -d 10.0.0.53/32 -p udp --dport 53 -j MASQUERADE
";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn services_and_endpoints_come_from_kube_proxy_rules_even_without_their_jump() {
        let s = Services::parse(RULES);
        assert_eq!(s.dns_ips, [ip("10.96.0.10"), ip("fd00:10:96::a")].into());
        assert_eq!(s.cluster_ips[&ip("10.96.0.1")], "default/kubernetes");
        assert_eq!(s.cluster_ips[&ip("10.96.0.10")], "kube-system/kube-dns");
        assert_eq!(s.endpoints[&ip("fd00:10:244::54")], "kube-system/kube-dns");
        assert_eq!(
            s.dns_endpoints(),
            [ip("10.244.0.53"), ip("fd00:10:244::54")].into(),
            "the API server's endpoint is no resolver"
        );
    }

    #[test]
    fn pods_name_their_addresses_over_endpoint_entries() {
        let s = Services::parse(RULES);
        let names = Names::new(
            &s,
            &[("kube-system/coredns-abc".into(), vec![ip("10.244.0.53")])],
        );
        assert_eq!(
            names.get(&ip("10.244.0.53")),
            Some("kube-system/coredns-abc")
        );
        assert_eq!(names.get(&ip("10.96.0.10")), Some("kube-system/kube-dns"));
        assert_eq!(names.get(&ip("192.168.1.10")), Some("default/kubernetes"));
        assert_eq!(names.get(&ip("10.1.1.1")), None);
        assert!(
            Services::parse("garbage\n-A KUBE-SEP-X -j DNAT --to-destination nope")
                .cluster_ips
                .is_empty()
        );
    }
}
