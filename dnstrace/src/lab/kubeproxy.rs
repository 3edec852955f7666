//! kube-proxy's iptables rules for the kube-dns service, in the form
//! kube-proxy writes them (nat table for iptables-restore).
use std::net::IpAddr;

use sha2::{Digest, Sha256};

/// The service as kube-proxy names it.
const SERVICE: &str = "kube-system/kube-dns";

/// What the nat table of the node should hold.
pub struct NatConfig<'a> {
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

pub fn svc_chain(port: &str, proto: &str) -> String {
    format!(
        "KUBE-SVC-{}",
        chain_hash(&format!("{SERVICE}:{port}{proto}"))
    )
}

fn sep_chain(port: &str, proto: &str, endpoint: &str) -> String {
    format!(
        "KUBE-SEP-{}",
        chain_hash(&format!("{SERVICE}:{port}{proto}{endpoint}"))
    )
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

/// The whole nat table, for `iptables-restore` (which replaces the table).
pub fn nat_table(cfg: &NatConfig) -> String {
    let ports = [("dns", "udp"), ("dns-tcp", "tcp")]
        .into_iter()
        .filter(|&(_, proto)| cfg.tcp_port || proto == "udp");
    let mut chains = vec![
        "KUBE-SERVICES".to_owned(),
        "KUBE-POSTROUTING".into(),
        "KUBE-MARK-MASQ".into(),
        "CNI-MASQ".into(),
    ];
    let mut rules = vec![
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".to_owned(),
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".into(),
        "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING".into(),
        format!("-A POSTROUTING -s {} -m comment --comment \"cni bridge ipMasq\" -j CNI-MASQ", cfg.pod_cidr),
        format!("-A CNI-MASQ -d {} -j ACCEPT", cfg.pod_cidr),
        "-A CNI-MASQ -j MASQUERADE".into(),
        "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000".into(),
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN".into(),
        "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0".into(),
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully".into(),
    ];
    let svc_ip = host(cfg.service);
    for (port, proto) in ports {
        let svc = svc_chain(port, proto);
        let comment = format!("{SERVICE}:{port}");
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
            let sep = sep_chain(port, proto, &ep_str);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_names_match_kube_proxy() {
        // The names every kubeadm cluster shows for kube-dns.
        assert_eq!(svc_chain("dns", "udp"), "KUBE-SVC-TCOU7JCQXEZGVUNU");
        assert_eq!(svc_chain("dns-tcp", "tcp"), "KUBE-SVC-ERIFXISQEP7F7OF4");
    }

    #[test]
    fn rules_spread_over_endpoints_and_dnat() {
        let eps: Vec<IpAddr> = vec![
            "10.244.0.53".parse().unwrap(),
            "10.244.0.54".parse().unwrap(),
        ];
        let cfg = NatConfig {
            service: "10.96.0.10".parse().unwrap(),
            endpoints: &eps,
            pod_cidr: "10.244.0.0/16",
            service_jumps: true,
            tcp_port: true,
        };
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
        let eps: Vec<IpAddr> = vec!["10.244.0.53".parse().unwrap()];
        let t = nat_table(&NatConfig {
            service: "10.96.0.10".parse().unwrap(),
            endpoints: &eps,
            pod_cidr: "10.244.0.0/16",
            service_jumps: true,
            tcp_port: false,
        });
        assert!(t.contains("-j KUBE-SVC-TCOU7JCQXEZGVUNU"));
        assert!(!t.contains("dns-tcp") && !t.contains("-p tcp"));
    }
}
