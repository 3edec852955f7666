//! Names for addresses. For now: which addresses are Kubernetes services,
//! from kube-proxy's own rules in the node's iptables.
use std::{collections::BTreeSet, net::IpAddr, path::Path, process::Command};

use crate::netns::in_netns;

/// Cluster IPs of services with a port-53 rule, from `iptables-save -t nat`
/// (and ip6tables) in the node's namespace; empty where there are none.
pub fn dns_service_ips(node: Option<&Path>) -> BTreeSet<IpAddr> {
    let dump = in_netns(node, || {
        let mut text = String::new();
        for program in ["iptables-save", "ip6tables-save"] {
            if let Ok(out) = Command::new(program).args(["-t", "nat"]).output() {
                text += &String::from_utf8_lossy(&out.stdout);
            }
        }
        Ok(text)
    });
    dump.map(|text| parse_service_ips(&text))
        .unwrap_or_default()
}

/// kube-proxy's rules match a service as `-d IP/32 ... --dport 53` in its
/// KUBE-SERVICES or KUBE-SVC-* chains.
fn parse_service_ips(rules: &str) -> BTreeSet<IpAddr> {
    rules
        .lines()
        .filter(|l| {
            (l.starts_with("-A KUBE-SERVICES ") || l.starts_with("-A KUBE-SVC-"))
                && l.contains("--dport 53 ")
        })
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "-d")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_service_ips_in_kube_proxy_rules_even_without_their_jump() {
        let rules = "\
-A KUBE-SVC-TCOU7JCQXEZGVUNU ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p udp -m comment --comment \"kube-system/kube-dns:dns cluster IP\" -m udp --dport 53 -j KUBE-MARK-MASQ
-A KUBE-SERVICES -d fd00:10:96::a/128 -p tcp -m comment --comment \"kube-system/kube-dns:dns-tcp cluster IP\" -m tcp --dport 53 -j KUBE-SVC-ERIFXISQEP7F7OF4
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j KUBE-SVC-NPX46M4PTMTKRN6Y
-A POSTROUTING -d 10.0.0.53/32 -p udp --dport 53 -j MASQUERADE
";
        let ips: Vec<String> = parse_service_ips(rules)
            .iter()
            .map(IpAddr::to_string)
            .collect();
        assert_eq!(ips, vec!["10.96.0.10", "fd00:10:96::a"]);
    }
}
