//! The lab's real resolvers: dnsmasq standing in for CoreDNS and NodeLocalDNS,
//! unbound as the "internet" resolver behind the node.
use std::{net::IpAddr, path::PathBuf};

use super::plan::{self, Pod, CLUSTER_DOMAIN, LAB_DIR};

pub fn log_path(name: &str) -> PathBuf {
    PathBuf::from(LAB_DIR)
        .join("logs")
        .join(format!("{name}.log"))
}

pub fn pid_path(name: &str) -> PathBuf {
    PathBuf::from(LAB_DIR).join(format!("{name}.pid"))
}

/// The cluster.local records CoreDNS's kubernetes plugin would serve.
fn cluster_records(ipv6: bool) -> Vec<String> {
    let mut kube_dns = format!(
        "kube-dns.kube-system.svc.{CLUSTER_DOMAIN},{}",
        plan::SERVICE4
    );
    if ipv6 {
        kube_dns += &format!(",{}", plan::SERVICE6);
    }
    let mut records = vec![
        format!(
            "kubernetes.default.svc.{CLUSTER_DOMAIN},{}",
            plan::API_SERVICE4
        ),
        kube_dns,
    ];
    // A headless service: one A record per ready endpoint.
    for last in 20..23 {
        records.push(format!("db.default.svc.{CLUSTER_DOMAIN},10.244.0.{last}"));
    }
    for pod in &plan::PODS {
        let dashed = pod.ip4.to_string().replace('.', "-");
        records.push(format!(
            "{dashed}.{}.pod.{CLUSTER_DOMAIN},{}",
            pod.namespace, pod.ip4
        ));
    }
    records
}

/// dnsmasq as CoreDNS: authoritative for cluster.local and the pod PTRs,
/// everything else forwarded to the servers of its own /etc/resolv.conf
/// (CoreDNS's `forward . /etc/resolv.conf`), re-read on SIGHUP (a reload).
pub fn coredns_args(pod: &Pod, ipv6: bool) -> Vec<String> {
    let mut args = vec![
        "--no-hosts".to_owned(),
        "--no-poll".into(),
        "--user=root".into(),
        "--resolv-file=/etc/resolv.conf".into(),
        format!("--pid-file={}", pid_path(pod.name).display()),
        "--log-queries".into(),
        format!("--log-facility={}", log_path(pod.name).display()),
        format!("--local=/{CLUSTER_DOMAIN}/"),
        "--local=/10.in-addr.arpa/".into(),
        "--max-cache-ttl=30".into(),
        "--dns-forward-max=1000".into(),
    ];
    args.extend(
        cluster_records(ipv6)
            .into_iter()
            .map(|r| format!("--host-record={r}")),
    );
    args
}

/// dnsmasq as NodeLocalDNS on the node: cluster names to the kube-dns
/// service, the rest to the node's resolv.conf, or, with the loop fault,
/// everything to kube-dns.
pub fn nodelocal_args(looped: bool) -> Vec<String> {
    let mut args = vec![
        "--no-hosts".to_owned(),
        "--no-poll".into(),
        "--user=root".into(),
        "--bind-interfaces".into(),
        format!("--listen-address={}", plan::NODELOCAL4),
        format!("--pid-file={}", pid_path("nodelocaldns").display()),
        "--log-queries".into(),
        format!("--log-facility={}", log_path("nodelocaldns").display()),
        format!("--server=/{CLUSTER_DOMAIN}/{}", plan::SERVICE4),
        format!("--server=/in-addr.arpa/{}", plan::SERVICE4),
    ];
    if looped {
        args.push("--no-resolv".into());
        args.push(format!("--server={}", plan::SERVICE4));
    } else {
        args.push("--resolv-file=/etc/resolv.conf".into());
    }
    args
}

/// unbound as the upstream resolver: authoritative for example.com from a
/// zone file, NXDOMAIN for every other name (it never recurses anywhere), UDP
/// answers over 512 bytes truncated. With `servfail`, every query is forwarded
/// to a server that does not exist, so unbound answers SERVFAIL.
pub fn unbound_conf(ipv6: bool, servfail: bool) -> String {
    let mut c = String::from("server:\n");
    c += &format!("  interface: {}\n  interface: 127.0.0.1\n", plan::UPSTREAM4);
    if ipv6 {
        c += &format!("  interface: {}\n", plan::UPSTREAM6);
    }
    c += &format!("  do-ip6: {}\n", if ipv6 { "yes" } else { "no" });
    c += "  do-daemonize: yes\n  username: \"\"\n  chroot: \"\"\n  use-syslog: no\n";
    c += &format!("  directory: \"{LAB_DIR}\"\n");
    c += &format!("  pidfile: \"{}\"\n", pid_path("unbound").display());
    c += &format!("  logfile: \"{}\"\n", log_path("unbound").display());
    c += "  log-queries: yes\n  log-replies: yes\n  verbosity: 1\n";
    c += "  access-control: 0.0.0.0/0 allow\n  access-control: ::/0 allow\n";
    c += "  max-udp-size: 512\n  module-config: \"iterator\"\n  num-threads: 1\n";
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
    PathBuf::from(LAB_DIR).join("example.com.zone")
}

/// The "internet" names: plain, dual-stack, a long CNAME chain, and one whose
/// answer only fits over TCP.
pub fn example_zone() -> String {
    let chunk = |c: char| format!("\"{}\"", c.to_string().repeat(200));
    let mut z = String::from("$ORIGIN example.com.\n$TTL 300\n");
    z += "@ IN SOA ns.example.com. hostmaster.example.com. 1 3600 600 86400 300\n@ IN NS ns.example.com.\n";
    z += &format!("ns IN A {}\n", plan::UPSTREAM4);
    z += "www IN A 198.51.100.80\nwww IN AAAA 2001:db8:5100::80\napi IN A 198.51.100.81\n";
    z += "chain IN CNAME hop1\nhop1 IN CNAME hop2\nhop2 IN CNAME hop3\nhop3 IN CNAME hop4\nhop4 IN CNAME hop5\nhop5 IN A 198.51.100.90\n";
    z += &format!("big IN TXT {} {} {}\n", chunk('a'), chunk('b'), chunk('c'));
    // Forty addresses: too many for a 512-byte UDP answer.
    for i in 100..140 {
        z += &format!("many IN A 198.51.100.{i}\n");
    }
    z
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
        let args = coredns_args(&plan::PODS[2], false).join(" ");
        assert!(args.contains("--host-record=kubernetes.default.svc.cluster.local,10.96.0.1"));
        assert!(args.contains("--local=/cluster.local/"));
        assert!(args.contains("--resolv-file=/etc/resolv.conf"));
        assert_eq!(args.matches("db.default.svc.cluster.local").count(), 3);
    }

    #[test]
    fn kubelet_resolv_conf() {
        let rc = pod_resolv_conf("10.96.0.10".parse().unwrap(), &plan::PODS[0].search_list());
        assert_eq!(rc, "nameserver 10.96.0.10\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n");
    }
}
