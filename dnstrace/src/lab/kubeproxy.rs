//! kube-proxy's rules for the kube-dns service, in the form kube-proxy
//! writes them: its iptables proxier's nat table (for iptables-restore) or
//! its nftables proxier's `kube-proxy` table (for `nft -f`).
use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The service as kube-proxy names it.
const SERVICE: &str = "kube-system/kube-dns";
/// NodeLocalDNS's way to CoreDNS when it holds kube-dns's address itself
/// (its manifest's `-upstreamsvc`): the same endpoints under another IP.
pub const UPSTREAM_SERVICE: &str = "kube-system/kube-dns-upstream";

/// A service of the CoreDNS endpoints, as kube-proxy names it.
#[derive(Clone, Copy)]
pub struct Service {
    pub name: &'static str,
    pub ip: IpAddr,
}

/// Which of kube-proxy's proxiers writes the service rules, or none: a
/// kube-proxy replacement balancing at the socket (`lab::socketlb`).
#[derive(clap::ValueEnum, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ProxyMode {
    #[default]
    Iptables,
    Nftables,
    SocketLb,
}

impl ProxyMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
            Self::SocketLb => "socket-lb",
        }
    }
}

/// What the nat table of the node should hold.
pub struct NatConfig<'a> {
    /// In nftables mode the nat table keeps only the CNI's masquerade.
    pub proxy: ProxyMode,
    pub service: IpAddr,
    pub endpoints: &'a [IpAddr],
    pub pod_cidr: &'a str,
    /// The `no-dnat` fault drops KUBE-SERVICES' jumps for kube-dns.
    pub service_jumps: bool,
    /// The `no-dns-tcp` fault: the Service lists only UDP 53, so its
    /// `dns-tcp` port has no chains at all.
    pub tcp_port: bool,
}

/// kube-proxy's chain name hash: base32(sha256(parts))[..16].
fn chain_hash(parts: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let digest = Sha256::digest(parts.as_bytes());
    let mut bits: u64 = 0;
    let mut nbits = 0;
    let mut out = String::new();
    for &b in digest.iter() {
        bits = (bits << 8) | u64::from(b);
        nbits += 8;
        while nbits >= 5 && out.len() < 16 {
            nbits -= 5;
            out.push(char::from(ALPHABET[((bits >> nbits) & 31) as usize]));
        }
    }
    out
}

/// kube-proxy's nftables chain name base: base32(sha256(name))[..8]-name.
fn nft_chain_base(name: &str) -> String {
    format!("{}-{name}", &chain_hash(name)[..8])
}

fn svc_chain_of(service: &str, port: &str, proto: &str) -> String {
    format!(
        "KUBE-SVC-{}",
        chain_hash(&format!("{service}:{port}{proto}"))
    )
}

fn sep_chain(service: &str, port: &str, proto: &str, endpoint: &str) -> String {
    format!(
        "KUBE-SEP-{}",
        chain_hash(&format!("{service}:{port}{proto}{endpoint}"))
    )
}

/// kube-dns, then `more` services of the same endpoints.
fn services(cfg: &NatConfig, more: &[Service]) -> Vec<Service> {
    let kube_dns = Service {
        name: SERVICE,
        ip: cfg.service,
    };
    std::iter::once(kube_dns)
        .chain(more.iter().copied())
        .collect()
}

fn host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("{a}/128"),
    }
}

fn endpoint(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// The whole nat table, for `iptables-restore` (which replaces the table),
/// with `more` services of the CoreDNS endpoints beside kube-dns.
pub fn nat_table_with(cfg: &NatConfig, more: &[Service]) -> String {
    let mut chains = vec!["CNI-MASQ".to_owned()];
    let mut rules = vec![
        format!(
            "-A POSTROUTING -s {} -m comment --comment \"cni bridge ipMasq\" -j CNI-MASQ",
            cfg.pod_cidr
        ),
        format!("-A CNI-MASQ -d {} -j ACCEPT", cfg.pod_cidr),
        "-A CNI-MASQ -j MASQUERADE".into(),
    ];
    if cfg.proxy == ProxyMode::Iptables {
        kube_proxy_nat(cfg, &services(cfg, more), &mut chains, &mut rules);
    }
    let mut out = String::from("*nat\n");
    for c in chains {
        out += &format!(":{c} - [0:0]\n");
    }
    for r in rules {
        out += &r;
        out.push('\n');
    }
    out += "COMMIT\n";
    out
}

/// kube-proxy's iptables proxier's chains and rules in the nat table.
fn kube_proxy_nat(
    cfg: &NatConfig,
    services: &[Service],
    chains: &mut Vec<String>,
    rules: &mut Vec<String>,
) {
    chains.splice(
        0..0,
        ["KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"].map(String::from),
    );
    rules.splice(0..0, [
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".to_owned(),
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".into(),
        "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING".into(),
    ]);
    rules.extend([
        "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000".into(),
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN".into(),
        "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0".into(),
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully".into(),
    ]);
    for service in services {
        for (port, proto) in dns_ports(cfg) {
            service_port_nat(cfg, service, port, proto, chains, rules);
        }
    }
}

/// One port of one service: its KUBE-SVC chain, jump and endpoint chains.
fn service_port_nat(
    cfg: &NatConfig,
    service: &Service,
    port: &str,
    proto: &str,
    chains: &mut Vec<String>,
    rules: &mut Vec<String>,
) {
    let svc_ip = host(service.ip);
    let svc = svc_chain_of(service.name, port, proto);
    let comment = format!("{}:{port}", service.name);
    chains.push(svc.clone());
    if cfg.service_jumps {
        rules.push(format!(
                "-A KUBE-SERVICES -d {svc_ip} -p {proto} -m comment --comment \"{comment} cluster IP\" -m {proto} --dport 53 -j {svc}"
            ));
    }
    rules.push(format!(
            "-A {svc} ! -s {} -d {svc_ip} -p {proto} -m comment --comment \"{comment} cluster IP\" -m {proto} --dport 53 -j KUBE-MARK-MASQ",
            cfg.pod_cidr
        ));
    let n = cfg.endpoints.len();
    for (i, &ep) in cfg.endpoints.iter().enumerate() {
        let ep_str = endpoint(ep, 53);
        let sep = sep_chain(service.name, port, proto, &ep_str);
        chains.push(sep.clone());
        // Endpoint i of n takes 1/(n-i) of what the earlier ones left.
        let pick = if i + 1 < n {
            format!(
                " -m statistic --mode random --probability {:.11}",
                1.0 / (n - i) as f64
            )
        } else {
            String::new()
        };
        rules.push(format!(
            "-A {svc} -m comment --comment \"{comment} -> {ep_str}\"{pick} -j {sep}"
        ));
        rules.push(format!(
            "-A {sep} -s {} -m comment --comment \"{comment}\" -j KUBE-MARK-MASQ",
            host(ep)
        ));
        rules.push(format!(
                "-A {sep} -p {proto} -m comment --comment \"{comment}\" -m {proto} -j DNAT --to-destination {ep_str}"
            ));
    }
}

/// The `ip kube-proxy` (or `ip6`) table as kube-proxy's nftables proxier
/// writes it for kube-dns, for `nft -f` (which it replaces whole). Without
/// `service_jumps` (the `no-dnat` fault) the service chains lose the rule
/// that picks an endpoint: packets pass the service-ips map untranslated.
/// `more` services of the CoreDNS endpoints come beside kube-dns.
pub fn nft_table_with(cfg: &NatConfig, more: &[Service]) -> String {
    let (family, ip, addr_type) = match cfg.service {
        IpAddr::V4(_) => ("ip", "ip", "ipv4_addr"),
        IpAddr::V6(_) => ("ip6", "ip6", "ipv6_addr"),
    };
    let t = format!("{family} kube-proxy");
    let mut out =
        format!("add table {t} {{ comment \"rules for kube-proxy\" ; }}\ndelete table {t}\n");
    out += &format!("add table {t} {{ comment \"rules for kube-proxy\" ; }}\n");
    out += &format!(
        "add set {t} cluster-ips {{ type {addr_type} ; comment \"Active ClusterIPs\" ; }}\n"
    );
    out += &format!("add map {t} service-ips {{ type {addr_type} . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}\n");
    for chain in [
        "mark-for-masquerade",
        "masquerading",
        "services",
        "nat-output { type nat hook output priority -100 ; }",
        "nat-postrouting { type nat hook postrouting priority 100 ; }",
        "nat-prerouting { type nat hook prerouting priority -100 ; }",
    ] {
        out += &format!("add chain {t} {chain}\n");
    }
    for rule in [
        "mark-for-masquerade mark set mark or 0x4000".to_owned(),
        "masquerading mark and 0x4000 == 0 return".into(),
        "masquerading mark set mark xor 0x4000".into(),
        "masquerading masquerade fully-random".into(),
        "nat-output jump services".into(),
        "nat-postrouting jump masquerading".into(),
        "nat-prerouting jump services".into(),
        format!("services {ip} daddr . meta l4proto . th dport vmap @service-ips"),
    ] {
        out += &format!("add rule {t} {rule}\n");
    }
    let services = services(cfg, more);
    for service in &services {
        for (port, proto) in dns_ports(cfg) {
            out += &nft_service_port(cfg, service, &t, ip, port, proto);
        }
    }
    let ips: Vec<String> = services.iter().map(|s| s.ip.to_string()).collect();
    out += &format!("add element {t} cluster-ips {{ {} }}\n", ips.join(", "));
    out
}

/// The service's ports: UDP `dns`, and TCP `dns-tcp` unless it is cut.
fn dns_ports<'a>(cfg: &'a NatConfig) -> impl Iterator<Item = (&'static str, &'static str)> + 'a {
    [("dns", "udp"), ("dns-tcp", "tcp")]
        .into_iter()
        .filter(|&(_, proto)| cfg.tcp_port || proto == "udp")
}

/// One port's service chain, endpoint chains and service-ips element.
fn nft_service_port(
    cfg: &NatConfig,
    service: &Service,
    t: &str,
    ip: &str,
    port: &str,
    proto: &str,
) -> String {
    let base = format!("{}/{proto}/{port}", service.name);
    let svc = format!("service-{}", nft_chain_base(&base));
    let mut out = format!("add chain {t} {svc}\n");
    out += &format!(
        "add rule {t} {svc} {ip} daddr {} {ip} saddr != {} jump mark-for-masquerade\n",
        service.ip, cfg.pod_cidr
    );
    let mut picks = Vec::new();
    for (i, &ep) in cfg.endpoints.iter().enumerate() {
        // kube-proxy writes a v6 endpoint's colons as dots in chain names.
        let in_name = ep.to_string().replace(':', ".");
        let chain = format!(
            "endpoint-{}",
            nft_chain_base(&format!("{base}__{in_name}/53"))
        );
        out += &format!("add chain {t} {chain}\n");
        out += &format!("add rule {t} {chain} {ip} saddr {ep} jump mark-for-masquerade\n");
        out += &format!(
            "add rule {t} {chain} meta l4proto {proto} dnat to {}\n",
            endpoint(ep, 53)
        );
        picks.push(format!("{i} : goto {chain}"));
    }
    if cfg.service_jumps {
        out += &format!(
            "add rule {t} {svc} numgen random mod {} vmap {{ {} }}\n",
            picks.len(),
            picks.join(" , ")
        );
    }
    out += &format!(
        "add element {t} service-ips {{ {} . {proto} . 53 : goto {svc} }}\n",
        service.ip
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc_chain(port: &str, proto: &str) -> String {
        svc_chain_of(SERVICE, port, proto)
    }

    /// The tables with kube-dns alone.
    fn nat_table(cfg: &NatConfig) -> String {
        nat_table_with(cfg, &[])
    }

    fn nft_table(cfg: &NatConfig) -> String {
        nft_table_with(cfg, &[])
    }

    const ONE: [IpAddr; 1] = [IpAddr::V4(std::net::Ipv4Addr::new(10, 244, 0, 53))];
    const TWO: [IpAddr; 2] = [
        IpAddr::V4(std::net::Ipv4Addr::new(10, 244, 0, 53)),
        IpAddr::V4(std::net::Ipv4Addr::new(10, 244, 0, 54)),
    ];

    /// kube-dns at 10.96.0.10 in `proxy` mode, to `endpoints`, healthy.
    fn kube_dns(proxy: ProxyMode, endpoints: &[IpAddr]) -> NatConfig<'_> {
        NatConfig {
            proxy,
            service: "10.96.0.10".parse().unwrap(),
            endpoints,
            pod_cidr: "10.244.0.0/16",
            service_jumps: true,
            tcp_port: true,
        }
    }

    #[test]
    fn kube_dns_upstream_has_chains_of_its_own_to_the_same_endpoints() {
        let cfg = kube_dns(ProxyMode::Iptables, &ONE);
        let upstream = Service {
            name: UPSTREAM_SERVICE,
            ip: "10.96.0.11".parse().unwrap(),
        };
        let t = nat_table_with(&cfg, &[upstream]);
        assert!(t.contains("-A KUBE-SERVICES -d 10.96.0.11/32 -p udp -m comment --comment \"kube-system/kube-dns-upstream:dns cluster IP\""));
        assert_eq!(
            t.matches("-j DNAT --to-destination 10.244.0.53:53").count(),
            4
        );
        let nft = nft_table_with(
            &NatConfig {
                proxy: ProxyMode::Nftables,
                ..cfg
            },
            &[upstream],
        );
        assert!(nft.contains("add element ip kube-proxy cluster-ips { 10.96.0.10, 10.96.0.11 }"));
        assert!(nft.contains("service-ips { 10.96.0.11 . udp . 53 : goto service-"));
    }

    #[test]
    fn chain_names_match_kube_proxy() {
        // The names every kubeadm cluster shows for kube-dns.
        assert_eq!(svc_chain("dns", "udp"), "KUBE-SVC-TCOU7JCQXEZGVUNU");
        assert_eq!(svc_chain("dns-tcp", "tcp"), "KUBE-SVC-ERIFXISQEP7F7OF4");
    }

    #[test]
    fn rules_spread_over_endpoints_and_dnat() {
        let cfg = kube_dns(ProxyMode::Iptables, &TWO);
        let t = nat_table(&cfg);
        assert!(t.contains("-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment \"kube-system/kube-dns:dns cluster IP\" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU"));
        assert!(t.contains("--probability 0.50000000000 -j KUBE-SEP-"));
        assert_eq!(
            t.matches("-j DNAT --to-destination 10.244.0.54:53").count(),
            2
        );
        assert!(t.starts_with("*nat\n") && t.ends_with("COMMIT\n"));
        let broken = nat_table(&NatConfig {
            service_jumps: false,
            ..cfg
        });
        assert!(!broken.contains("-A KUBE-SERVICES -d"));
    }

    #[test]
    fn a_udp_only_service_has_no_tcp_rules() {
        let t = nat_table(&NatConfig {
            tcp_port: false,
            ..kube_dns(ProxyMode::Iptables, &ONE)
        });
        assert!(t.contains("-j KUBE-SVC-TCOU7JCQXEZGVUNU"));
        assert!(!t.contains("dns-tcp") && !t.contains("-p tcp"));
    }

    #[test]
    fn nft_chain_names_match_kube_proxy() {
        // From kube-proxy's nftables proxier tests.
        assert_eq!(
            nft_chain_base("ns1/svc1/tcp/p80"),
            "ULMVA6XW-ns1/svc1/tcp/p80"
        );
        assert_eq!(
            nft_chain_base("ns1/svc1/tcp/p80__10.180.0.1/80"),
            "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
    }

    #[test]
    fn nft_table_sends_service_ips_to_endpoint_chains_that_dnat() {
        let cfg = kube_dns(ProxyMode::Nftables, &TWO);
        let t = nft_table(&cfg);
        assert!(t.contains("add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\n"));
        assert!(t.contains(
            "add element ip kube-proxy service-ips { 10.96.0.10 . udp . 53 : goto service-"
        ));
        assert!(t.contains("meta l4proto udp dnat to 10.244.0.54:53\n"));
        assert!(t.contains("numgen random mod 2 vmap { 0 : goto endpoint-"));
        assert!(
            !nat_table(&cfg).contains("KUBE-"),
            "the nat table keeps only the CNI's rules"
        );
        let broken = nft_table(&NatConfig {
            service_jumps: false,
            ..cfg
        });
        assert!(!broken.contains("numgen") && broken.contains("service-ips { 10.96.0.10"));
    }
}
