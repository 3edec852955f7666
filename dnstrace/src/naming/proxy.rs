//! Which service proxy writes the node's rules, and reading each: iptables
//! in either backend, kube-proxy's nftables table, IPVS. Runs inside the
//! node's namespace (see `Services::read`).
use std::{fmt, path::Path, process::Command};

use super::{ipvs, nftables, Services};

/// Where the node's service rules were found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    Iptables(IptablesBackend),
    Nftables,
    Ipvs,
    /// No proxy rules: none on the node, or a kube-proxy replacement that
    /// balances at the socket.
    None,
}

/// Which of iptables' two kernels interfaces holds the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IptablesBackend {
    Legacy,
    Nft,
    /// Only a plain `iptables-save` is installed.
    Unknown,
}

impl fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Iptables(IptablesBackend::Legacy) => f.write_str("iptables (legacy)"),
            Self::Iptables(IptablesBackend::Nft) => f.write_str("iptables (nf_tables)"),
            Self::Iptables(IptablesBackend::Unknown) => f.write_str("iptables"),
            Self::Nftables => f.write_str("kube-proxy's nftables table"),
            Self::Ipvs => f.write_str("IPVS"),
            Self::None => f.write_str("no proxy rules"),
        }
    }
}

/// Every source's services, and which sources had any.
pub fn read() -> Services {
    let mut s = Services::default();
    for (backend, text) in iptables_dumps() {
        let found = Services::parse(&text);
        if !found.cluster_ips.is_empty() {
            s.modes.push(ProxyMode::Iptables(backend));
        }
        s.merge(found);
    }
    for family in ["ip", "ip6"] {
        let ports = nftables::parse(&output(
            "nft",
            &["-j", "list", "table", family, "kube-proxy"],
        ));
        if !ports.is_empty() && !s.modes.contains(&ProxyMode::Nftables) {
            s.modes.push(ProxyMode::Nftables);
        }
        s.add(&ports);
    }
    // ipvsadm would load the module; a kernel without IPVS has no ip_vs.
    if Path::new("/proc/thread-self/net/ip_vs").exists() {
        let ports = ipvs::parse(&output("ipvsadm", &["-S", "-n"]));
        if !ports.is_empty() {
            s.modes.push(ProxyMode::Ipvs);
        }
        s.add(&ports);
    }
    if s.modes.is_empty() {
        s.modes.push(ProxyMode::None);
    }
    s
}

/// The nat tables of each iptables backend installed, v4 and v6; the plain
/// `iptables-save` where neither backend's own is.
fn iptables_dumps() -> Vec<(IptablesBackend, String)> {
    let mut dumps = Vec::new();
    for (backend, suffix) in [
        (IptablesBackend::Legacy, "legacy-save"),
        (IptablesBackend::Nft, "nft-save"),
    ] {
        let mut text = String::new();
        let mut ran = false;
        for (family, loaded) in [
            ("iptables", "ip_tables_names"),
            ("ip6tables", "ip6_tables_names"),
        ] {
            // Asking legacy iptables for a table loads its module.
            let absent = backend == IptablesBackend::Legacy
                && !Path::new("/proc/thread-self/net").join(loaded).exists();
            if absent {
                continue;
            }
            if let Ok(out) = Command::new(format!("{family}-{suffix}"))
                .args(["-t", "nat"])
                .output()
            {
                ran = true;
                text += &String::from_utf8_lossy(&out.stdout);
            }
        }
        if ran {
            dumps.push((backend, text));
        }
    }
    if !dumps.is_empty() || installed("iptables-nft-save") || installed("iptables-legacy-save") {
        return dumps;
    }
    let text = ["iptables-save", "ip6tables-save"]
        .map(|program| output(program, &["-t", "nat"]))
        .concat();
    vec![(IptablesBackend::Unknown, text)]
}

/// What `program args` printed; empty where it could not run.
fn output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default()
}

fn installed(program: &str) -> bool {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .any(|dir| Path::new(dir).join(program).is_file())
}
