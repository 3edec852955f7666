//! A pod's resolver configuration, read the way glibc's res_init reads
//! /etc/resolv.conf: a keyword counts only at the start of a line and
//! before a blank, so `#` and `;` comment lines (and indented ones) are
//! skipped; `domain` and `search` replace each other, the last one wins.
use std::{net::IpAddr, path::Path};

use anyhow::{bail, Result};
use serde::Serialize;

use super::Pod;

/// glibc's RES_MAXNDOTS: larger ndots values are cut to it.
const MAX_NDOTS: u32 = 15;
const MAX_BYTES: u64 = 64 << 10;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ResolvConf {
    /// Every nameserver, in order; glibc queries only the first three.
    pub nameservers: Vec<IpAddr>,
    pub search: Vec<String>,
    pub ndots: u32,
    /// The other options, as written (`timeout:2`, `edns0`, ...).
    pub options: Vec<String>,
}

impl Default for ResolvConf {
    fn default() -> Self {
        Self {
            nameservers: Vec::new(),
            search: Vec::new(),
            ndots: 1,
            options: Vec::new(),
        }
    }
}

pub fn parse(text: &str) -> ResolvConf {
    let mut conf = ResolvConf::default();
    for line in text.lines() {
        let Some((keyword, rest)) = line.split_once([' ', '\t']) else {
            continue;
        };
        let mut words = rest.split_whitespace().peekable();
        if words.peek().is_none() {
            continue;
        }
        match keyword {
            "nameserver" => conf.nameservers.extend(words.next().and_then(parse_ip)),
            "domain" => conf.search = words.take(1).map(str::to_owned).collect(),
            "search" => conf.search = words.map(str::to_owned).collect(),
            "options" => words.for_each(|w| conf.set_option(w)),
            _ => {}
        }
    }
    conf
}

impl ResolvConf {
    fn set_option(&mut self, word: &str) {
        match word.strip_prefix("ndots:") {
            Some(n) => self.ndots = atoi(n).min(MAX_NDOTS),
            None => self.options.push(word.to_owned()),
        }
    }
}

/// An address as inet_pton takes it, with an IPv6 zone (`%eth0`) dropped.
fn parse_ip(word: &str) -> Option<IpAddr> {
    word.split('%').next()?.parse().ok()
}

/// C's atoi on what glibc reads: leading digits, 0 without any.
fn atoi(s: &str) -> u32 {
    s.bytes().take_while(u8::is_ascii_digit).fold(0u32, |n, d| {
        n.saturating_mul(10).saturating_add(u32::from(d - b'0'))
    })
}

pub fn read(path: &Path) -> Result<ResolvConf> {
    super::read_capped(path, MAX_BYTES).map(|text| parse(&text))
}

/// The resolv.conf that process `pid` sees.
pub fn read_for_pid(pid: u32) -> Result<ResolvConf> {
    read(Path::new(&format!("/proc/{pid}/root/etc/resolv.conf")))
}

/// The node's own resolv.conf, which the kubelet's `--resolv-conf` usually
/// names and whose search domains it appends to ClusterFirst pods' lists:
/// for a node namespace `/run/netns/NAME`, `ip netns`'s
/// `/etc/netns/NAME/resolv.conf` where there is one, else /etc/resolv.conf.
pub fn read_for_node(node_netns: Option<&Path>) -> Result<ResolvConf> {
    let named = node_netns
        .filter(|p| p.parent() == Some(Path::new("/run/netns")))
        .and_then(Path::file_name)
        .map(|name| Path::new("/etc/netns").join(name).join("resolv.conf"))
        .filter(|p| p.exists());
    read(named.as_deref().unwrap_or(Path::new("/etc/resolv.conf")))
}

/// A pod's resolv.conf: through its sandbox process, else the node's file
/// the runtime mounts (CRI-O runs no process by default).
pub fn read_for_pod(pod: &Pod) -> Result<ResolvConf> {
    match (pod.pid, &pod.resolv_conf) {
        (Some(pid), _) => read_for_pid(pid),
        (None, Some(path)) => read(path),
        (None, None) => bail!("the runtime records neither a process nor a resolv.conf"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(conf: &ResolvConf) -> Vec<String> {
        conf.nameservers.iter().map(IpAddr::to_string).collect()
    }

    #[test]
    fn reads_a_kubelet_resolv_conf() {
        let conf = parse(
            "search shop.svc.cluster.local svc.cluster.local cluster.local\n\
             nameserver 10.96.0.10\n\
             options ndots:5\n",
        );
        assert_eq!(ips(&conf), ["10.96.0.10"]);
        assert_eq!(
            conf.search,
            [
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local"
            ]
        );
        assert_eq!(conf.ndots, 5);
        assert!(conf.options.is_empty());
    }

    #[test]
    fn defaults_when_empty() {
        assert_eq!(parse(""), ResolvConf::default());
        assert_eq!(parse("").ndots, 1);
    }

    #[test]
    fn the_last_of_domain_and_search_wins() {
        assert_eq!(parse("search a b\ndomain c\n").search, ["c"]);
        assert_eq!(parse("domain c\nsearch a b\n").search, ["a", "b"]);
        // An empty line of either changes nothing, as in glibc.
        assert_eq!(parse("search a b\nsearch\ndomain \n").search, ["a", "b"]);
    }

    #[test]
    fn comments_and_indented_lines_are_skipped() {
        let conf = parse(
            "# nameserver 1.1.1.1\n; nameserver 2.2.2.2\n#nameserver 3.3.3.3\n  nameserver 4.4.4.4\n\
             nameserver 10.0.0.53 # the cluster's\r\nnameserverx 5.5.5.5\n",
        );
        assert_eq!(ips(&conf), ["10.0.0.53"]);
    }

    #[test]
    fn lists_every_nameserver_and_skips_bad_ones() {
        let conf = parse(
            "nameserver 10.0.0.1\nnameserver\tfe80::1%eth0\nnameserver not-an-ip\n\
             nameserver 10.0.0.3\nnameserver 10.0.0.4\n",
        );
        assert_eq!(ips(&conf), ["10.0.0.1", "fe80::1", "10.0.0.3", "10.0.0.4"]);
    }

    #[test]
    fn ndots_is_capped_and_options_accumulate() {
        let conf = parse("options ndots:20 timeout:2\noptions edns0 attempts:3\n");
        assert_eq!(conf.ndots, 15);
        assert_eq!(conf.options, ["timeout:2", "edns0", "attempts:3"]);
        assert_eq!(parse("options ndots:2 ndots:3").ndots, 3);
        assert_eq!(parse("options ndots:x").ndots, 0, "atoi: no digits is 0");
        assert_eq!(parse("options ndots:0").ndots, 0);
        assert_eq!(parse("options ndots:99999999999999").ndots, 15);
    }

    #[test]
    fn reads_our_own_resolv_conf_through_proc() {
        // The machine may have no resolv.conf at all; then both fail alike.
        let direct = read(Path::new("/etc/resolv.conf"));
        let through_proc = read_for_pid(std::process::id());
        match (direct, through_proc) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(_), Err(_)) => {}
            (a, b) => panic!("/etc/resolv.conf {a:?} but through /proc {b:?}"),
        }
    }
}
