//! `dnstrace pods [POD]`: one row per pod on this node, with what its
//! sandbox says about its network and its resolver.
use std::{
    collections::BTreeSet,
    io::Write as _,
    net::IpAddr,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, bail, Result};
use serde::Serialize;

use crate::pods::{
    discover,
    net::{inspect, PodNet},
    resolv::{read_for_pod, ResolvConf},
    select, Pod, RuntimeDirs,
};
use crate::{naming::Services, output::Format, target::is_coredns};

/// A pod and what could be learnt about it.
struct Row<'a> {
    pod: &'a Pod,
    net: Result<PodNet>,
    resolv: Result<ResolvConf>,
    /// A cluster resolver: CoreDNS by name, or a DNS service's endpoint.
    resolver: bool,
}

impl<'a> Row<'a> {
    fn of(pod: &'a Pod, node_netns: Option<&Path>, dns_endpoints: &BTreeSet<IpAddr>) -> Self {
        let net = pod
            .netns_path()
            .ok_or_else(|| anyhow!("the runtime records neither a process nor a network namespace"))
            .and_then(|netns| inspect(&netns, node_netns));
        let resolver = is_coredns(&pod.full_name())
            || net
                .as_ref()
                .is_ok_and(|n| n.ips.iter().any(|ip| dns_endpoints.contains(ip)));
        Self {
            pod,
            net,
            resolv: read_for_pod(pod),
            resolver,
        }
    }

    fn errors(&self) -> impl Iterator<Item = String> + '_ {
        let net = self.net.as_ref().err().map(|e| format!("network: {e:#}"));
        let resolv = self
            .resolv
            .as_ref()
            .err()
            .map(|e| format!("resolv.conf: {e:#}"));
        net.into_iter().chain(resolv)
    }

    fn cells(&self) -> [String; 7] {
        let (ips, veth) = match &self.net {
            Ok(net) => (
                dash_if_empty(join(&net.ips)),
                net.host_veth
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |(name, _)| name.clone()),
            ),
            Err(_) => ("?".to_owned(), "?".to_owned()),
        };
        let nameserver = match &self.resolv {
            Ok(conf) => conf
                .nameservers
                .first()
                .map_or_else(|| "-".to_owned(), IpAddr::to_string),
            Err(_) => "?".to_owned(),
        };
        [
            self.pod.namespace.clone(),
            self.pod.name.clone(),
            self.pod.runtime.to_string(),
            if self.resolver { "coredns" } else { "-" }.to_owned(),
            ips,
            veth,
            nameserver,
        ]
    }
}

#[derive(Serialize)]
struct JsonRow<'a> {
    #[serde(flatten)]
    pod: &'a Pod,
    resolver: bool,
    net: Option<&'a PodNet>,
    resolv: Option<&'a ResolvConf>,
}

/// Lists the pods (or the one `query` names) on stdout, and what could not
/// be read on stderr.
pub fn run(
    dirs: &RuntimeDirs,
    query: Option<&str>,
    node_netns: Option<PathBuf>,
    format: Format,
) -> Result<()> {
    let inventory = discover(dirs);
    for e in &inventory.errors {
        log::warn!("{e}");
    }
    if inventory.pods.is_empty() {
        check_found_anything(dirs, inventory.errors.len())?;
    }
    let pods = match query {
        Some(query) => std::slice::from_ref(select(&inventory.pods, query)?),
        None => &inventory.pods[..],
    };
    let dns_endpoints = Services::read(node_netns.as_deref()).dns_endpoints();
    let rows: Vec<Row> = pods
        .iter()
        .map(|pod| Row::of(pod, node_netns.as_deref(), &dns_endpoints))
        .collect();
    for row in &rows {
        for e in row.errors() {
            log::warn!("{}: {e}", row.pod.full_name());
        }
    }
    let mut out = std::io::stdout().lock();
    match format {
        Format::Text => {
            let header = [
                "NAMESPACE",
                "NAME",
                "RUNTIME",
                "ROLE",
                "IPS",
                "HOST VETH",
                "NAMESERVER",
            ];
            let cells: Vec<[String; 7]> = rows.iter().map(Row::cells).collect();
            write!(out, "{}", table(header, &cells))?;
        }
        Format::Json => {
            for row in &rows {
                let json = JsonRow {
                    pod: row.pod,
                    resolver: row.resolver,
                    net: row.net.as_ref().ok(),
                    resolv: row.resolv.as_ref().ok(),
                };
                writeln!(out, "{}", serde_json::to_string(&json)?)?;
            }
        }
    }
    Ok(())
}

/// No pods: fine on a node without any, an error where nothing could be
/// read or no runtime is there at all.
fn check_found_anything(dirs: &RuntimeDirs, errors: usize) -> Result<()> {
    if errors > 0 {
        // SAFETY: no preconditions.
        let hint = if unsafe { libc::geteuid() } != 0 {
            ": the runtimes' state is root's, run as root"
        } else {
            ""
        };
        bail!("no pod could be read ({errors} errors above){hint}");
    }
    if !dirs.containerd.exists() && !dirs.crio.exists() {
        bail!(
            "no container runtime state at {} or {}: not a Kubernetes node? (see --containerd-root, --crio-root)",
            dirs.containerd.display(),
            dirs.crio.display()
        );
    }
    Ok(())
}

fn join(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn dash_if_empty(s: String) -> String {
    if s.is_empty() {
        "-".to_owned()
    } else {
        s
    }
}

/// Left-aligned columns two spaces apart, the last one unpadded.
fn table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; N]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == N {
                text += cell;
            } else {
                text += &format!("{cell:<width$}  ", width = widths[i]);
            }
        }
        text + "\n"
    };
    let mut out = line(header);
    for row in rows {
        out += &line(row.each_ref().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::net::Attachment;
    use crate::pods::Runtime;

    fn pod(name: &str) -> Pod {
        Pod {
            runtime: Runtime::Crio,
            sandbox_id: "abc".into(),
            namespace: "shop".into(),
            name: name.into(),
            uid: "u".into(),
            netns: None,
            pid: None,
            resolv_conf: None,
        }
    }

    #[test]
    fn cells_show_question_marks_for_what_could_not_be_read() {
        let pod = pod("checkout");
        let row = Row {
            pod: &pod,
            net: Err(anyhow!("no netns")),
            resolv: Ok(crate::pods::resolv::parse("nameserver 10.96.0.10\n")),
            resolver: false,
        };
        assert_eq!(
            row.cells(),
            ["shop", "checkout", "cri-o", "-", "?", "?", "10.96.0.10"]
        );
        assert_eq!(row.errors().collect::<Vec<_>>(), ["network: no netns"]);
        let row = Row {
            pod: &pod,
            net: Ok(PodNet {
                netns_inode: 1,
                ips: vec!["10.244.0.11".parse().unwrap(), "fd00::11".parse().unwrap()],
                host_veth: Some(("veth1234abcd".into(), 7)),
                attachment: Some(Attachment::Bridge("cni0".into())),
            }),
            resolv: Err(anyhow!("gone")),
            resolver: true,
        };
        assert_eq!(
            row.cells(),
            [
                "shop",
                "checkout",
                "cri-o",
                "coredns",
                "10.244.0.11,fd00::11",
                "veth1234abcd",
                "?"
            ]
        );
    }

    #[test]
    fn a_row_without_process_or_netns_is_an_error_not_a_panic() {
        let pod = pod("x");
        let row = Row::of(&pod, None, &BTreeSet::new());
        assert!(row.net.is_err());
        assert!(row.resolv.is_err());
        assert_eq!(row.errors().count(), 2);
    }

    #[test]
    fn table_aligns_columns() {
        let rows = [
            ["default".to_owned(), "web".to_owned(), "1".to_owned()],
            [
                "kube-system".to_owned(),
                "coredns".to_owned(),
                "22".to_owned(),
            ],
        ];
        assert_eq!(
            table(["NS", "NAME", "N"], &rows),
            "NS           NAME     N\n\
             default      web      1\n\
             kube-system  coredns  22\n"
        );
    }

    #[test]
    fn json_rows_are_flat_with_nulls_for_failures() {
        let pod = pod("checkout");
        let json = serde_json::to_value(JsonRow {
            pod: &pod,
            resolver: false,
            net: None,
            resolv: None,
        })
        .unwrap();
        assert_eq!(json["name"], "checkout");
        assert_eq!(json["runtime"], "cri-o");
        assert!(json["net"].is_null() && json["resolv"].is_null());
    }
}
