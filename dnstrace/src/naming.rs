//! Names for addresses, without the API server: services and their
//! endpoints from the service proxy's own rules on the node (kube-proxy's
//! iptables, nftables or IPVS mode), pods from the container runtime's
//! state.
mod ipvs;
mod nftables;
mod proxy;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
    path::Path,
};

pub use proxy::ProxyMode;

use crate::{netns::in_netns, pods::workload::Workload};

/// The port DNS services listen on.
const DNS_PORT: u16 = 53;

/// What the service proxy's rules say: service cluster IPs and endpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Services {
    /// Cluster IP → `namespace/name`.
    pub cluster_ips: BTreeMap<IpAddr, String>,
    /// Cluster IPs with a port-53 rule.
    pub dns_ips: BTreeSet<IpAddr>,
    /// Endpoint IP → `namespace/name` of its service.
    pub endpoints: BTreeMap<IpAddr, String>,
    /// Endpoints of port-53 services from sources that need not name them
    /// (nftables, IPVS).
    pub dns_backends: BTreeSet<IpAddr>,
    /// Where the rules came from; empty before `read`.
    pub modes: Vec<ProxyMode>,
    /// `dns_ips` are the pods' nameservers, not rules: no proxy rules were
    /// found (a kube-proxy replacement balancing at the socket).
    pub from_resolv_conf: bool,
}

/// A service port in a proxy's rules, and where it sends packets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub ip: IpAddr,
    pub port: u16,
    pub proto: Proto,
    /// `namespace/name`, where the rules say it (IPVS does not).
    pub name: Option<String>,
    pub endpoints: Vec<IpAddr>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Udp,
    Tcp,
}

impl Proto {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "udp" => Some(Self::Udp),
            "tcp" => Some(Self::Tcp),
            _ => None,
        }
    }
}

impl Services {
    /// From every proxy's rules in the node's namespace (see `proxy`);
    /// empty, with mode `None`, where there are none or the tools are
    /// missing.
    pub fn read(node: Option<&Path>) -> Self {
        in_netns(node, || Ok(proxy::read())).unwrap_or_else(|_| Self::unproxied())
    }

    /// No rules found.
    fn unproxied() -> Self {
        Self {
            modes: vec![ProxyMode::None],
            ..Self::default()
        }
    }

    /// Adds a source's service ports.
    fn add(&mut self, ports: &[ServicePort]) {
        for p in ports {
            if let Some(name) = &p.name {
                self.cluster_ips.insert(p.ip, name.clone());
                for ep in &p.endpoints {
                    self.endpoints.insert(*ep, name.clone());
                }
            }
            if p.port == DNS_PORT {
                self.dns_ips.insert(p.ip);
                self.dns_backends.extend(&p.endpoints);
            }
        }
    }

    /// Adds what another parse of iptables rules found (later wins, as in
    /// one parse of both texts).
    fn merge(&mut self, other: Self) {
        self.cluster_ips.extend(other.cluster_ips);
        self.dns_ips.extend(other.dns_ips);
        self.endpoints.extend(other.endpoints);
    }

    /// With no proxy rules, the traced pods' nameservers stand for the DNS
    /// service: a socket-level balancer rewrites them before the wire, so
    /// they are what the pods ask. Loopback resolvers are no service.
    pub fn fall_back_to_nameservers(&mut self, nameservers: &[IpAddr]) {
        if self.modes != [ProxyMode::None] {
            return;
        }
        let remote = nameservers.iter().filter(|ip| !ip.is_loopback());
        self.dns_ips.extend(remote);
        self.from_resolv_conf = !self.dns_ips.is_empty();
    }

    /// Says where the DNS service addresses came from, in one line.
    pub fn describe(&self) -> Described<'_> {
        Described(self)
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
            .chain(self.dns_backends.iter().copied())
            .collect()
    }
}

/// `services from kube-proxy's nftables rules: DNS at 10.96.0.10`.
pub struct Described<'a>(&'a Services);

impl fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        let ips: Vec<String> = s.dns_ips.iter().map(ToString::to_string).collect();
        let dns = if ips.is_empty() {
            "no DNS service found".to_owned()
        } else {
            format!("DNS at {}", ips.join(", "))
        };
        if s.from_resolv_conf {
            return write!(
                f,
                "services: no proxy rules on the node (socket-level balancing?); {dns}, from the pods' resolv.conf"
            );
        }
        if s.modes == [ProxyMode::None] {
            return write!(f, "services: no proxy rules on the node; {dns}");
        }
        let modes: Vec<String> = s.modes.iter().map(ToString::to_string).collect();
        write!(f, "services from {}: {dns}", modes.join(" and "))
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

/// Every address dnstrace can name, and the workload of those that are
/// pods where the CRI said it.
#[derive(Clone, Debug, Default)]
pub struct Names {
    names: BTreeMap<IpAddr, String>,
    workloads: BTreeMap<IpAddr, Workload>,
    /// Pods' UIDs, by address.
    uids: BTreeMap<IpAddr, String>,
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
        Self {
            names,
            workloads: BTreeMap::new(),
            uids: BTreeMap::new(),
        }
    }

    /// The pods' UIDs, by address.
    pub fn with_uids(mut self, uids: BTreeMap<IpAddr, String>) -> Self {
        self.uids = uids;
        self
    }

    pub fn uid(&self, ip: &IpAddr) -> Option<&str> {
        self.uids.get(ip).map(String::as_str)
    }

    /// The pods' workloads, by address.
    pub fn with_workloads(mut self, workloads: BTreeMap<IpAddr, Workload>) -> Self {
        self.workloads = workloads;
        self
    }

    /// Names given later win over the same addresses' earlier ones.
    pub fn extend(
        &mut self,
        names: &[(IpAddr, String)],
        workloads: &[(IpAddr, Workload)],
        uids: &[(IpAddr, String)],
    ) {
        self.names.extend(names.iter().cloned());
        // A new pod at an address replaces the old one's workload and UID too.
        for (ip, _) in names {
            self.workloads.remove(ip);
            self.uids.remove(ip);
        }
        self.workloads.extend(workloads.iter().cloned());
        self.uids.extend(uids.iter().cloned());
    }

    pub fn workload(&self, ip: &IpAddr) -> Option<&Workload> {
        self.workloads.get(ip)
    }

    pub fn workloads(&self) -> &BTreeMap<IpAddr, Workload> {
        &self.workloads
    }

    pub fn get(&self, ip: &IpAddr) -> Option<&str> {
        self.names.get(ip).map(String::as_str)
    }

    pub fn entries(&self) -> &BTreeMap<IpAddr, String> {
        &self.names
    }

    /// Names as a recording kept them.
    pub fn from_entries(names: BTreeMap<IpAddr, String>) -> Self {
        Self {
            names,
            workloads: BTreeMap::new(),
            uids: BTreeMap::new(),
        }
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

    fn port(ip_: &str, port: u16, name: Option<&str>, endpoints: &[&str]) -> ServicePort {
        ServicePort {
            ip: ip(ip_),
            port,
            proto: Proto::Udp,
            name: name.map(str::to_owned),
            endpoints: endpoints.iter().map(|e| ip(e)).collect(),
        }
    }

    #[test]
    fn service_ports_name_addresses_and_dns_ports_give_resolvers() {
        let mut s = Services::default();
        s.add(&[
            port(
                "10.96.0.10",
                53,
                Some("kube-system/kube-dns"),
                &["10.244.0.53"],
            ),
            port(
                "10.96.0.1",
                443,
                Some("default/kubernetes"),
                &["192.168.1.10"],
            ),
            port("10.96.0.20", 53, None, &["10.244.0.60"]),
        ]);
        assert_eq!(s.dns_ips, [ip("10.96.0.10"), ip("10.96.0.20")].into());
        assert_eq!(s.cluster_ips[&ip("10.96.0.1")], "default/kubernetes");
        assert!(!s.cluster_ips.contains_key(&ip("10.96.0.20")), "unnamed");
        assert_eq!(
            s.dns_endpoints(),
            [ip("10.244.0.53"), ip("10.244.0.60")].into()
        );
    }

    #[test]
    fn two_iptables_dumps_merge_as_one() {
        let (a, b) = RULES.split_at(RULES.find("-A KUBE-SEP-IT2").unwrap());
        let mut s = Services::parse(a);
        s.merge(Services::parse(b));
        assert_eq!(s, Services::parse(RULES));
    }

    #[test]
    fn nameservers_stand_for_the_service_only_without_proxy_rules() {
        let ns = [ip("10.96.0.10"), ip("127.0.0.53")];
        let mut none = Services::unproxied();
        none.fall_back_to_nameservers(&ns);
        assert_eq!(none.dns_ips, [ip("10.96.0.10")].into());
        assert!(none.from_resolv_conf);
        assert_eq!(
            none.describe().to_string(),
            "services: no proxy rules on the node (socket-level balancing?); DNS at 10.96.0.10, from the pods' resolv.conf"
        );
        let mut nft = Services {
            modes: vec![ProxyMode::Nftables],
            ..Services::default()
        };
        nft.add(&[port("10.96.0.10", 53, None, &[])]);
        nft.fall_back_to_nameservers(&[ip("10.96.0.99")]);
        assert_eq!(nft.dns_ips, [ip("10.96.0.10")].into());
        assert_eq!(
            nft.describe().to_string(),
            "services from kube-proxy's nftables table: DNS at 10.96.0.10"
        );
        assert_eq!(
            Services::unproxied().describe().to_string(),
            "services: no proxy rules on the node; no DNS service found"
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
