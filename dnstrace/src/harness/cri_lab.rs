//! `dnstrace-harness cri-lab ...`: the lab's private containerd
//! (`lab::containerd`) driven step by step from the tests, until `lab up`
//! runs its pods on it.
use std::{collections::BTreeMap, net::IpAddr, path::PathBuf};

use anyhow::{Context as _, Result};

use crate::{
    lab::containerd::{self, CniPlugin, Setup, Subnet},
    pods::cri::sandbox::{Dns, SandboxRequest},
};

/// The harness's own first argument for these commands.
pub const NAME: &str = "cri-lab";

#[derive(clap::Parser, Debug)]
#[command(name = "dnstrace-harness cri-lab")]
pub enum CriLab {
    /// Starts containerd in DIR and imports the pause image.
    Up(SetupArgs),
    /// Runs a pod sandbox through CRI; prints its id.
    RunPod {
        #[command(flatten)]
        setup: SetupArgs,
        #[command(flatten)]
        pod: PodArgs,
    },
    /// Stops and removes a pod sandbox.
    RemovePod {
        #[command(flatten)]
        setup: SetupArgs,
        id: String,
    },
    /// Removes every pod, stops containerd and removes DIR.
    Down(SetupArgs),
}

#[derive(clap::Args, Debug)]
pub struct SetupArgs {
    #[arg(long)]
    dir: PathBuf,
    /// The node's network namespace, by its name under /run/netns.
    #[arg(long)]
    netns: Option<String>,
    #[arg(long)]
    bridge: String,
    /// The pods' IPv4 subnet, e.g. 10.245.0.0/24.
    #[arg(long)]
    subnet: Subnet,
}

#[derive(clap::Args, Debug)]
pub struct PodArgs {
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    name: String,
    #[arg(long)]
    uid: String,
    /// KEY=VALUE, repeated.
    #[arg(long = "label", value_parser = pair)]
    labels: Vec<(String, String)>,
    /// KEY=VALUE, repeated.
    #[arg(long = "annotation", value_parser = pair)]
    annotations: Vec<(String, String)>,
    #[arg(long = "dns-server")]
    dns_servers: Vec<IpAddr>,
    #[arg(long = "dns-search")]
    dns_searches: Vec<String>,
    /// A resolv.conf option, e.g. ndots:5.
    #[arg(long = "dns-option")]
    dns_options: Vec<String>,
}

fn pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?}: expected KEY=VALUE"))
}

impl SetupArgs {
    fn setup(&self) -> Setup {
        Setup {
            dir: self.dir.clone(),
            netns: self.netns.clone(),
            state: self.dir.join("state"),
            plugin: CniPlugin::Bridge,
            bridge: self.bridge.clone(),
            subnet: self.subnet,
            subnet6: None,
            mtu: None,
        }
    }
}

impl PodArgs {
    fn request(&self, setup: &Setup) -> SandboxRequest {
        let map = |pairs: &[(String, String)]| pairs.iter().cloned().collect::<BTreeMap<_, _>>();
        SandboxRequest {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            hostname: self.name.clone(),
            labels: map(&self.labels),
            annotations: map(&self.annotations),
            dns: Dns {
                servers: self.dns_servers.clone(),
                searches: self.dns_searches.clone(),
                options: self.dns_options.clone(),
            },
            host_network: false,
            log_directory: setup
                .dir
                .join("logs")
                .join(format!("{}_{}_{}", self.namespace, self.name, self.uid)),
        }
    }
}

impl CriLab {
    pub async fn run(self) -> Result<()> {
        match self {
            CriLab::Up(args) => containerd::start(&args.setup()).await.map(drop),
            CriLab::RunPod { setup, pod } => {
                let setup = setup.setup();
                let mut runtime = containerd::attach(&setup).await?;
                let id = runtime.run_pod(&pod.request(&setup)).await?;
                println!("{id}");
                Ok(())
            }
            CriLab::RemovePod { setup, id } => {
                let mut runtime = containerd::attach(&setup.setup()).await?;
                runtime.remove_pod(&id).await
            }
            CriLab::Down(args) => {
                let runtime = containerd::attach(&args.setup())
                    .await
                    .context("no containerd answers there")?;
                runtime.stop().await
            }
        }
    }
}
