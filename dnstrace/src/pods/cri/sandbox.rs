//! Running and removing pod sandboxes through the CRI, as the kubelet
//! does: what the lab's private containerd is driven with.
use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    path::PathBuf,
    time::Duration,
};

use anyhow::{Context as _, Result};
use k8s_cri::v1::{
    DnsConfig, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, RemovePodSandboxRequest, RunPodSandboxRequest,
    StatusRequest, StopPodSandboxRequest,
};

use super::{deadline, Cri};

/// Starting or stopping a sandbox runs the CNI plugins and runc.
const LIFECYCLE_TIMEOUT: Duration = Duration::from_secs(60);

/// What the lab (or anyone acting as the kubelet) asks a sandbox to be.
#[derive(Clone, Debug, Default)]
pub struct SandboxRequest {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub hostname: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub dns: Dns,
    /// `hostNetwork: true`: the node's network namespace, no CNI.
    pub host_network: bool,
    /// Where the runtime writes the pod's logs (created by the caller).
    pub log_directory: PathBuf,
}

/// The resolver a pod is given, as the kubelet derives it from dnsPolicy.
#[derive(Clone, Debug, Default)]
pub struct Dns {
    pub servers: Vec<IpAddr>,
    pub searches: Vec<String>,
    /// resolv.conf options, e.g. `ndots:5`.
    pub options: Vec<String>,
}

impl Cri {
    /// Every sandbox's id, ready or not.
    pub async fn sandbox_ids(&mut self) -> Result<Vec<String>> {
        self.list(None).await
    }

    /// Runs a pod sandbox as the kubelet would; its id.
    pub async fn run_pod(&mut self, request: &SandboxRequest) -> Result<String> {
        let client = &mut self.client;
        let request = RunPodSandboxRequest {
            config: Some(sandbox_config(request)),
            runtime_handler: String::new(),
        };
        deadline(LIFECYCLE_TIMEOUT, async {
            Ok(client.run_pod_sandbox(request).await?.into_inner())
        })
        .await
        .context("RunPodSandbox")
        .map(|answer| answer.pod_sandbox_id)
    }

    /// The runtime's verbose status entry `key` (containerd's `cniconfig`:
    /// the CNI networks its CRI plugin has loaded).
    pub async fn status_info(&mut self, key: &str) -> Result<Option<String>> {
        let client = &mut self.client;
        let answer = super::deadline(super::QUERY_TIMEOUT, async {
            Ok(client
                .status(StatusRequest { verbose: true })
                .await?
                .into_inner())
        })
        .await
        .context("Status")?;
        Ok(answer.info.get(key).cloned())
    }

    /// Stops a sandbox (its process, its network) and removes it.
    pub async fn remove_pod(&mut self, id: &str) -> Result<()> {
        let client = &mut self.client;
        let pod_sandbox_id = id.to_owned();
        deadline(LIFECYCLE_TIMEOUT, async {
            let stop = StopPodSandboxRequest {
                pod_sandbox_id: pod_sandbox_id.clone(),
            };
            client.stop_pod_sandbox(stop).await?;
            let remove = RemovePodSandboxRequest { pod_sandbox_id };
            client.remove_pod_sandbox(remove).await?;
            Ok(())
        })
        .await
        .with_context(|| format!("stopping and removing sandbox {id}"))
    }
}

fn sandbox_config(request: &SandboxRequest) -> PodSandboxConfig {
    let map = |m: &BTreeMap<String, String>| -> HashMap<String, String> {
        m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: request.name.clone(),
            uid: request.uid.clone(),
            namespace: request.namespace.clone(),
            attempt: 0,
        }),
        hostname: request.hostname.clone(),
        log_directory: request.log_directory.display().to_string(),
        dns_config: Some(DnsConfig {
            servers: request.dns.servers.iter().map(IpAddr::to_string).collect(),
            searches: request.dns.searches.clone(),
            options: request.dns.options.clone(),
        }),
        labels: map(&request.labels),
        annotations: map(&request.annotations),
        linux: Some(linux_config(request.host_network)),
        ..PodSandboxConfig::default()
    }
}

/// The kubelet's namespace options: a hostNetwork pod shares the node's.
fn linux_config(host_network: bool) -> LinuxPodSandboxConfig {
    let network = if host_network {
        NamespaceMode::Node
    } else {
        NamespaceMode::Pod
    };
    LinuxPodSandboxConfig {
        security_context: Some(LinuxSandboxSecurityContext {
            namespace_options: Some(NamespaceOption {
                network: network as i32,
                pid: NamespaceMode::Container as i32,
                ..NamespaceOption::default()
            }),
            ..LinuxSandboxSecurityContext::default()
        }),
        ..LinuxPodSandboxConfig::default()
    }
}
