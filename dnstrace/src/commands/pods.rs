//! `dnstrace pods [POD]`: one row per pod on this node, with what its
//! sandbox says about its network and its resolver, and its workload where
//! the runtime's CRI socket answers.
use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write as _,
    net::IpAddr,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, bail, Result};
use serde::Serialize;

use crate::pods::{
    cri_sockets, discover_with_cri,
    net::{inspect, PodNet},
    resolv::{read_for_pod, ResolvConf},
    searched, select, CriAnswer, Inventory, Metadata, Pod, RuntimeDirs,
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

/// A row with what the CRI said of its pod (empty where it was not asked).
#[derive(Serialize)]
struct JsonPod<'a> {
    #[serde(flatten)]
    row: JsonRow<'a>,
    #[serde(flatten)]
    metadata: &'a Metadata,
}

static NO_METADATA: Metadata = Metadata {
    workload: None,
    labels: BTreeMap::new(),
    annotations: BTreeMap::new(),
    ips: Vec::new(),
};

/// Lists the pods (or the one `query` names) on stdout, and what could not
/// be read on stderr.
pub async fn run(
    dirs: &RuntimeDirs,
    cri_socket: Option<&Path>,
    query: Option<&str>,
    node_netns: Option<PathBuf>,
    format: Format,
) -> Result<()> {
    let (inventory, answer) = discover_with_cri(dirs, &cri_sockets(cri_socket)).await;
    answer.warn_if_unanswered();
    for e in &inventory.errors {
        log::warn!("{e}");
    }
    if inventory.pods.is_empty() {
        let answered = matches!(answer, CriAnswer::Answered { .. });
        check_found_anything(dirs, inventory.errors.len(), answered)?;
        log::warn!(
            "no running pod found: {}; point dnstrace elsewhere with --containerd-root, --crio-root or --cri-socket",
            searched(dirs, &answer)
        );
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
                "WORKLOAD",
            ];
            let cells: Vec<[String; 8]> = rows
                .iter()
                .map(|row| with_workload(row.cells(), inventory.metadata(row.pod)))
                .collect();
            write!(out, "{}", table(header, &cells))?;
        }
        Format::Json => {
            for row in &rows {
                let json = JsonPod {
                    row: JsonRow {
                        pod: row.pod,
                        resolver: row.resolver,
                        net: row.net.as_ref().ok(),
                        resolv: row.resolv.as_ref().ok(),
                    },
                    metadata: metadata_of(&inventory, row.pod),
                };
                writeln!(out, "{}", serde_json::to_string(&json)?)?;
            }
        }
    }
    Ok(())
}

/// No pods: fine on a node without any, an error where nothing could be
/// read or no runtime is there at all (no state, and no CRI answered).
fn check_found_anything(dirs: &RuntimeDirs, errors: usize, cri_answered: bool) -> Result<()> {
    if errors > 0 {
        // SAFETY: no preconditions.
        let hint = if unsafe { libc::geteuid() } != 0 {
            ": the runtimes' state is root's, run as root"
        } else {
            ""
        };
        bail!("no pod could be read ({errors} errors above){hint}");
    }
    if !cri_answered && !dirs.containerd.exists() && !dirs.crio.exists() {
        bail!(
            "no container runtime state at {} or {}: not a Kubernetes node? (see --containerd-root, --crio-root, --cri-socket)",
            dirs.containerd.display(),
            dirs.crio.display()
        );
    }
    Ok(())
}

fn metadata_of<'a>(inventory: &'a Inventory, pod: &Pod) -> &'a Metadata {
    inventory.metadata(pod).unwrap_or(&NO_METADATA)
}

/// A row's cells and its workload: `Kind/name`, or `-` where the CRI did
/// not say (or was not asked).
fn with_workload(cells: [String; 7], metadata: Option<&Metadata>) -> [String; 8] {
    let workload = metadata
        .and_then(|m| m.workload.as_ref())
        .map_or_else(|| "-".to_owned(), ToString::to_string);
    let [a, b, c, d, e, f, g] = cells;
    [a, b, c, d, e, f, g, workload]
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
                serves_dns: true,
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
    fn the_workload_is_the_last_cell_and_a_dash_without_the_cri() {
        let cells = ["a", "b", "c", "d", "e", "f", "g"].map(str::to_owned);
        let metadata = Metadata {
            workload: crate::pods::workload::Workload::of(
                "web-7d9f8c6b5-x2x4k",
                &BTreeMap::from([("pod-template-hash".to_owned(), "7d9f8c6b5".to_owned())]),
            ),
            ..Metadata::default()
        };
        assert_eq!(
            with_workload(cells.clone(), Some(&metadata))[7],
            "Deployment/web"
        );
        assert_eq!(with_workload(cells, None)[7], "-");
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
