//! node-cache's own iptables rules in NodeLocalDNS's NOTRACK mode
//! (kubernetes/dns cmd/node-cache/app/cache_app.go, `initIptables`): for
//! each `-localip`, its DNS port and health port skip conntrack (raw
//! table), and the filter table accepts what conntrack no longer vouches
//! for. node-cache prepends each rule, so a chain lists them in reverse.
use std::net::Ipv4Addr;

const SKIP: &str = "NodeLocal DNS Cache: skip conntrack";
const ALLOW: &str = "NodeLocal DNS Cache: allow DNS traffic";
/// node-cache's `-health-port` default.
const HEALTH_PORT: u16 = 8080;

/// One rule as node-cache adds it: table, chain, match and target.
struct Rule {
    table: &'static str,
    chain: &'static str,
    spec: String,
}

/// `-d IP` or `-s IP` with the port of that side, as iptables-save prints it.
fn spec(proto: &str, to: bool, ip: Ipv4Addr, port: u16, comment: &str, target: &str) -> String {
    let (addr, port_opt) = if to {
        ("-d", "--dport")
    } else {
        ("-s", "--sport")
    };
    format!("{addr} {ip}/32 -p {proto} -m comment --comment \"{comment}\" -m {proto} {port_opt} {port} -j {target}")
}

/// node-cache's DNS rules for each local IP, in its order: table, chain,
/// whether they match the IP as destination, comment and target. The
/// third raw OUTPUT pair is for queries made on the node (hostNetwork pods).
const DNS_RULES: [(&str, &str, bool, &str, &str); 5] = [
    ("raw", "PREROUTING", true, SKIP, "NOTRACK"),
    ("filter", "INPUT", true, ALLOW, "ACCEPT"),
    ("raw", "OUTPUT", false, SKIP, "NOTRACK"),
    ("filter", "OUTPUT", false, ALLOW, "ACCEPT"),
    ("raw", "OUTPUT", true, SKIP, "NOTRACK"),
];

/// The rules for one local IP, in node-cache's order.
fn rules_for(ip: Ipv4Addr) -> Vec<Rule> {
    let mut rules = Vec::new();
    for (table, chain, to, comment, target) in DNS_RULES {
        for proto in ["tcp", "udp"] {
            let spec = spec(proto, to, ip, 53, comment, target);
            rules.push(Rule { table, chain, spec });
        }
    }
    // The liveness probe to its health plugin.
    for to in [true, false] {
        let spec = spec("tcp", to, ip, HEALTH_PORT, SKIP, "NOTRACK");
        rules.push(Rule {
            table: "raw",
            chain: "OUTPUT",
            spec,
        });
    }
    rules
}

/// `-A` lines of `table` for NodeLocalDNS on `local_ips`, as the chains
/// read after node-cache prepended each rule in turn.
pub fn rules(table: &str, local_ips: &[Ipv4Addr]) -> Vec<String> {
    let mut lines: Vec<String> = local_ips
        .iter()
        .flat_map(|&ip| rules_for(ip))
        .filter(|r| r.table == table)
        .map(|r| format!("-A {} {}", r.chain, r.spec))
        .collect();
    lines.reverse();
    lines
}

/// The raw table, for iptables-restore (which replaces it).
pub fn raw_table(local_ips: &[Ipv4Addr]) -> String {
    let mut t = String::from("*raw\n");
    for line in rules("raw", local_ips) {
        t += &line;
        t.push('\n');
    }
    t + "COMMIT\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: [Ipv4Addr; 2] = [
        Ipv4Addr::new(169, 254, 20, 10),
        Ipv4Addr::new(10, 96, 0, 10),
    ];

    #[test]
    fn queries_to_the_kube_dns_ip_skip_conntrack_both_ways() {
        let raw = raw_table(&LOCAL);
        assert!(raw.starts_with("*raw\n-A OUTPUT -s 10.96.0.10/32 -p tcp -m comment --comment \"NodeLocal DNS Cache: skip conntrack\" -m tcp --sport 8080 -j NOTRACK\n"), "{raw}");
        for rule in [
            "-A PREROUTING -d 10.96.0.10/32 -p udp -m comment --comment \"NodeLocal DNS Cache: skip conntrack\" -m udp --dport 53 -j NOTRACK",
            "-A OUTPUT -s 10.96.0.10/32 -p udp -m comment --comment \"NodeLocal DNS Cache: skip conntrack\" -m udp --sport 53 -j NOTRACK",
            "-A OUTPUT -d 10.96.0.10/32 -p udp -m comment --comment \"NodeLocal DNS Cache: skip conntrack\" -m udp --dport 53 -j NOTRACK",
            "-A PREROUTING -d 169.254.20.10/32 -p tcp -m comment --comment \"NodeLocal DNS Cache: skip conntrack\" -m tcp --dport 53 -j NOTRACK",
        ] {
            assert!(raw.contains(&format!("{rule}\n")), "{rule}");
        }
        assert_eq!(raw.lines().count(), 2 + 2 * 8);
    }

    #[test]
    fn the_filter_table_accepts_what_conntrack_skips() {
        let filter = rules("filter", &LOCAL);
        assert_eq!(filter.len(), 8);
        assert_eq!(
            filter[0],
            "-A OUTPUT -s 10.96.0.10/32 -p udp -m comment --comment \"NodeLocal DNS Cache: allow DNS traffic\" -m udp --sport 53 -j ACCEPT"
        );
        assert!(filter.contains(&"-A INPUT -d 169.254.20.10/32 -p tcp -m comment --comment \"NodeLocal DNS Cache: allow DNS traffic\" -m tcp --dport 53 -j ACCEPT".to_owned()));
    }
}
