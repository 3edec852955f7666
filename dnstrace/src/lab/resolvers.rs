//! The lab's real resolvers: dnsmasq standing in for CoreDNS, unbound for
//! NodeLocalDNS and as the "internet" resolver behind the node.
use std::{
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
};

use super::plan::{self, lab_dir, Domain, NodeLocal, Pod, BIG_NAME, HUGE_NAME};

pub fn log_path(name: &str) -> PathBuf {
    lab_dir()
        .to_path_buf()
        .join("logs")
        .join(format!("{name}.log"))
}

pub fn pid_path(name: &str) -> PathBuf {
    lab_dir().to_path_buf().join(format!("{name}.pid"))
}

/// The records CoreDNS's kubernetes plugin would serve in `domain`, with
/// the pod records of `pods`, and the agents' headless Service at `agents`.
fn cluster_records(ipv6: bool, domain: &Domain, pods: &[Pod], agents: &[Ipv4Addr]) -> Vec<String> {
    let mut kube_dns = format!("kube-dns.kube-system.svc.{domain},{}", plan::SERVICE4);
    if ipv6 {
        kube_dns += &format!(",{}", plan::SERVICE6);
    }
    let mut records = vec![
        format!("kubernetes.default.svc.{domain},{}", plan::API_SERVICE4),
        kube_dns,
    ];
    // A headless service: one A record per ready endpoint.
    for last in 20..23 {
        records.push(format!("db.default.svc.{domain},10.244.0.{last}"));
    }
    // dnsmasq gives one name every address of its host-records.
    for ip in agents {
        records.push(format!("{},{ip}", agents_name(domain)));
    }
    for pod in pods {
        let dashed = pod.ip4.to_string().replace('.', "-");
        records.push(format!(
            "{dashed}.{}.pod.{domain},{}",
            pod.namespace, pod.ip4
        ));
    }
    records
}

/// The agents' headless Service (deploy/dnstrace.yaml), whose A records
/// are every agent's address: what `dnstrace cluster` finds them by.
pub fn agents_name(domain: &Domain) -> String {
    format!("dnstrace-agents.dnstrace.svc.{domain}")
}

/// dnsmasq's own retries of a query upstream: first after 2 s, none after 5 s.
pub const FORWARD_TRIES: &str = "--fast-dns-retry=2000,5000";

/// dnsmasq as CoreDNS: authoritative for the cluster domain and the pod PTRs,
/// everything else forwarded to the servers of its own /etc/resolv.conf
/// (CoreDNS's `forward . /etc/resolv.conf`), re-read on SIGHUP (a reload).
pub fn coredns_args(
    pod: &Pod,
    ipv6: bool,
    domain: &Domain,
    pods: &[Pod],
    agents: &[Ipv4Addr],
) -> Vec<String> {
    let mut args = vec![
        "--no-hosts".to_owned(),
        "--no-poll".into(),
        "--user=root".into(),
        "--resolv-file=/etc/resolv.conf".into(),
        format!("--pid-file={}", pid_path(pod.name).display()),
        "--log-queries".into(),
        format!("--log-facility={}", log_path(pod.name).display()),
        format!("--local=/{domain}/"),
        "--local=/10.in-addr.arpa/".into(),
        "--max-cache-ttl=30".into(),
        "--dns-forward-max=1000".into(),
        // CoreDNS's forward gives each try 2 s (readTimeout) within 5 s
        // (defaultTimeout). dnsmasq, which leaves retries to its clients,
        // comes closest with its own: a resend of the same query after 2 s,
        // then backing off (4 s more, past the 5 s): two tries where
        // CoreDNS makes three, and silence at the end where CoreDNS answers
        // SERVFAIL.
        FORWARD_TRIES.into(),
        // Answers up to 4,096 bytes over UDP, as CoreDNS relays them.
        "--edns-packet-max=4096".into(),
        // CoreDNS caches every type, dnsmasq only addresses unless told:
        // the big TXT answers then come from the CoreDNS pod itself.
        "--cache-rr=TXT".into(),
    ];
    args.extend(
        cluster_records(ipv6, domain, pods, agents)
            .into_iter()
            .map(|r| format!("--host-record={r}")),
    );
    args
}

/// unbound as NodeLocalDNS on the node, as its Corefile has it: cluster
/// names and reverse zones to the kube-dns service (kube-dns-upstream in
/// the NOTRACK mode) over TCP (`force_tcp`), the rest to the node's
/// nameserver or, with the loop fault, to that service too; answers cached
/// 30 s at most.
pub fn nodelocal_conf(mode: NodeLocal, domain: &Domain, looped: bool) -> String {
    let mut c = String::from("server:\n");
    for ip in mode.listen() {
        c += &format!("  interface: {ip}\n");
    }
    c += "  do-ip6: no\n";
    c += &unbound_daemon("nodelocaldns");
    c += "  cache-max-ttl: 30\n  cache-max-negative-ttl: 5\n";
    // Else unbound answers the private reverse zones (10.in-addr.arpa...) itself.
    c += "  unblock-lan-zones: yes\n  insecure-lan-zones: yes\n";
    if looped {
        // One round of the loop per lookup: unbound would send the query
        // again after 376 ms, and each time it would go round once more.
        c += "  unknown-server-time-limit: 20000\n";
    }
    let cluster = format!("{domain}.");
    for zone in [cluster.as_str(), "in-addr.arpa.", "ip6.arpa."] {
        c += &forward_zone(zone, mode.cluster_dns().into(), true);
    }
    let rest = if looped {
        mode.cluster_dns()
    } else {
        plan::UPSTREAM4
    };
    c + &forward_zone(".", rest.into(), false)
}

fn forward_zone(zone: &str, to: IpAddr, tcp: bool) -> String {
    let tcp = if tcp { "yes" } else { "no" };
    format!(
        "forward-zone:\n  name: \"{zone}\"\n  forward-addr: {to}\n  forward-tcp-upstream: {tcp}\n"
    )
}

/// What both unbounds share: a daemon running as root without chroot, its
/// files under the lab's directory, every query logged, no DNSSEC validation.
fn unbound_daemon(name: &str) -> String {
    let mut c =
        String::from("  do-daemonize: yes\n  username: \"\"\n  chroot: \"\"\n  use-syslog: no\n");
    c += &format!("  directory: \"{}\"\n", lab_dir().display());
    c += &format!("  pidfile: \"{}\"\n", pid_path(name).display());
    c += &format!("  logfile: \"{}\"\n", log_path(name).display());
    c += "  log-queries: yes\n  log-replies: yes\n  verbosity: 1\n";
    c + "  access-control: 0.0.0.0/0 allow\n  access-control: ::/0 allow\n  module-config: \"iterator\"\n  num-threads: 1\n"
}

/// unbound as the upstream resolver: authoritative for example.com from a
/// zone file, NXDOMAIN for every other name (it never recurses anywhere),
/// UDP answers up to 4,096 bytes (larger than the path MTU: fragmented).
/// With `servfail`, every query is forwarded to a server that does not
/// exist, so unbound answers SERVFAIL.
pub fn unbound_conf(ipv6: bool, servfail: bool) -> String {
    let mut c = String::from("server:\n");
    c += &format!("  interface: {}\n  interface: 127.0.0.1\n", plan::UPSTREAM4);
    if ipv6 {
        c += &format!("  interface: {}\n", plan::UPSTREAM6);
    }
    c += &format!("  do-ip6: {}\n", if ipv6 { "yes" } else { "no" });
    c += &unbound_daemon("unbound");
    c += "  max-udp-size: 4096\n";
    if servfail {
        c += "forward-zone:\n  name: \".\"\n  forward-addr: 127.0.0.9\n";
        return c;
    }
    c += "  local-zone: \".\" static\n  local-zone: \"example.com.\" transparent\n";
    c += &format!(
        "auth-zone:\n  name: \"example.com.\"\n  zonefile: \"{}\"\n  for-downstream: yes\n  for-upstream: yes\n",
        zone_path().display()
    );
    c
}

pub fn zone_path() -> PathBuf {
    lab_dir().to_path_buf().join("example.com.zone")
}

/// The "internet" names: plain, dual-stack, a long CNAME chain, forty
/// addresses (over 512 bytes), and the big and huge TXT answers.
pub fn example_zone() -> String {
    let mut z = String::from("$ORIGIN example.com.\n$TTL 300\n");
    z += "@ IN SOA ns.example.com. hostmaster.example.com. 1 3600 600 86400 300\n@ IN NS ns.example.com.\n";
    z += &format!("ns IN A {}\n", plan::UPSTREAM4);
    z += "www IN A 198.51.100.80\nwww IN AAAA 2001:db8:5100::80\napi IN A 198.51.100.81\n";
    z += "chain IN CNAME hop1\nhop1 IN CNAME hop2\nhop2 IN CNAME hop3\nhop3 IN CNAME hop4\nhop4 IN CNAME hop5\nhop5 IN A 198.51.100.90\n";
    // About 1,300 and 3,000 bytes of answer.
    z += &txt_record(BIG_NAME, 5);
    z += &txt_record(HUGE_NAME, 12);
    // Forty addresses: too many for a 512-byte UDP answer.
    for i in 100..140 {
        z += &format!("many IN A 198.51.100.{i}\n");
    }
    z
}

/// A TXT record of `strings` strings of 250 letters each.
fn txt_record(name: &str, strings: u8) -> String {
    let data: Vec<String> = (b'a'..b'a' + strings)
        .map(|c| format!("\"{}\"", char::from(c).to_string().repeat(250)))
        .collect();
    format!("{name}. IN TXT {}\n", data.join(" "))
}

/// A pod's resolv.conf, as the kubelet writes it (ClusterFirst).
pub fn pod_resolv_conf(nameserver: IpAddr, search: &[String]) -> String {
    format!(
        "nameserver {nameserver}\nsearch {}\noptions ndots:5\n",
        search.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unbound_never_recurses_outside_the_lab() {
        let healthy = unbound_conf(false, false);
        assert!(healthy.contains("local-zone: \".\" static"));
        assert!(!healthy.contains("forward-addr"));
        let broken = unbound_conf(false, true);
        assert!(
            broken.contains("forward-addr: 127.0.0.9"),
            "SERVFAIL comes from an unreachable loopback server"
        );
    }

    #[test]
    fn coredns_serves_cluster_names_and_forwards_per_resolv_conf() {
        let args = coredns_args(
            &plan::PODS[2],
            false,
            &Domain::cluster_default(),
            &plan::PODS,
            &[],
        )
        .join(" ");
        assert!(args.contains("--host-record=kubernetes.default.svc.cluster.local,10.96.0.1"));
        assert!(args.contains("--local=/cluster.local/"));
        assert!(args.contains("--resolv-file=/etc/resolv.conf"));
        assert_eq!(args.matches("db.default.svc.cluster.local").count(), 3);
        assert!(
            args.contains("--fast-dns-retry=2000,5000"),
            "a deadline per try"
        );
    }

    #[test]
    fn coredns_serves_the_agents_headless_service_with_every_agents_address() {
        let pods = &plan::PODS;
        let agents: Vec<Ipv4Addr> = (2..5).map(|n| Ipv4Addr::new(172, 18, 0, n)).collect();
        let domain: Domain = "corp.internal".parse().unwrap();
        let args = coredns_args(&pods[2], false, &domain, pods, &agents);
        let records: Vec<&str> = args
            .iter()
            .filter_map(|a| {
                a.strip_prefix("--host-record=dnstrace-agents.dnstrace.svc.corp.internal,")
            })
            .collect();
        assert_eq!(records, ["172.18.0.2", "172.18.0.3", "172.18.0.4"]);
        let without = coredns_args(&pods[2], false, &domain, pods, &[]).join(" ");
        assert!(!without.contains("dnstrace-agents"), "{without}");
    }

    #[test]
    fn nodelocaldns_forces_tcp_to_kube_dns_for_cluster_zones_only() {
        let zone = |name: &str, to: &str, tcp: &str| {
            format!("forward-zone:\n  name: \"{name}\"\n  forward-addr: {to}\n  forward-tcp-upstream: {tcp}\n")
        };
        for looped in [false, true] {
            let conf = nodelocal_conf(NodeLocal::LinkLocal, &Domain::cluster_default(), looped);
            assert!(conf.contains("interface: 169.254.20.10\n"));
            for name in ["cluster.local.", "in-addr.arpa.", "ip6.arpa."] {
                assert!(conf.contains(&zone(name, "10.96.0.10", "yes")), "{conf}");
            }
            // The loop fault sends the rest to kube-dns too, once.
            assert_eq!(conf.contains("unknown-server-time-limit: 20000"), looped);
            let rest = if looped {
                "10.96.0.10"
            } else {
                "198.51.100.53"
            };
            assert!(conf.ends_with(&zone(".", rest, "no")), "{conf}");
            assert_eq!(conf.matches("forward-zone:").count(), 4);
        }
    }

    #[test]
    fn the_cluster_domain_is_served_and_forwarded_under_its_own_name() {
        let domain: Domain = "corp.internal".parse().unwrap();
        let args = coredns_args(&plan::PODS[2], false, &domain, &plan::PODS, &[]).join(" ");
        assert!(args.contains("--local=/corp.internal/"));
        assert!(args.contains("--host-record=kube-dns.kube-system.svc.corp.internal,10.96.0.10"));
        assert!(!args.contains("cluster.local"));
        let conf = nodelocal_conf(NodeLocal::LinkLocal, &domain, false);
        assert!(conf.contains("name: \"corp.internal.\""));
    }

    #[test]
    fn notrack_nodelocaldns_holds_kube_dns_and_asks_kube_dns_upstream() {
        let conf = nodelocal_conf(NodeLocal::Notrack, &Domain::cluster_default(), false);
        assert!(conf.contains("interface: 169.254.20.10\n  interface: 10.96.0.10\n"));
        assert!(conf.contains("forward-addr: 10.96.0.11\n  forward-tcp-upstream: yes"));
        assert!(!conf.contains("forward-addr: 10.96.0.10"), "{conf}");
    }

    /// The wire size of the answer to `name` TXT, from the zone, with EDNS.
    fn answer_size(name: &str) -> usize {
        use hickory_proto::{
            op::{Edns, Message, Query},
            rr::{rdata::TXT, Name, RData, Record, RecordType},
        };
        let zone = example_zone();
        let line = zone
            .lines()
            .find(|l| l.starts_with(&format!("{name}. IN TXT")))
            .unwrap();
        let strings: Vec<String> = line
            .split('"')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        let owner = Name::from_ascii(name).unwrap();
        let mut m = Message::new();
        m.add_query(Query::query(owner.clone(), RecordType::TXT));
        m.add_answer(Record::from_rdata(
            owner,
            300,
            RData::TXT(TXT::new(strings)),
        ));
        m.set_edns(Edns::new());
        m.to_vec().unwrap().len()
    }

    #[test]
    fn big_and_huge_answers_straddle_the_edns_buffer_and_the_mtu() {
        // An IPv4 packet of 1,500 bytes carries 1,472 bytes of UDP payload;
        // the big answer leaves room for an authority section as well.
        let big = answer_size(BIG_NAME);
        assert!(big > 1232 && big < 1472 - 100, "{big}");
        let huge = answer_size(HUGE_NAME);
        assert!(huge > 1472 * 2 && huge < 4096, "{huge}");
    }

    #[test]
    fn kubelet_resolv_conf() {
        let search = plan::PODS[0].search_list(&Domain::cluster_default(), &[]);
        let rc = pod_resolv_conf("10.96.0.10".parse().unwrap(), &search);
        assert_eq!(rc, "nameserver 10.96.0.10\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n");
    }
}
