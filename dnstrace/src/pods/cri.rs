//! The CRI API (`runtime.v1` RuntimeService) over the runtime's unix
//! socket: the pods as the kubelet sees them, with their labels and
//! annotations, which the runtimes' state directories do not keep. Both
//! containerd (1.6 serves `runtime.v1` beside `v1alpha2`) and CRI-O serve
//! `runtime.v1`, so only that is asked. Every call has a deadline: a
//! runtime that hangs must not hang dnstrace.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{anyhow, bail, Context as _, Result};
use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
    ImageSpec, ImageStatusRequest, ListPodSandboxRequest, PodSandboxFilter, PodSandboxState,
    PodSandboxStateValue, PodSandboxStatusRequest, PodSandboxStatusResponse, VersionRequest,
};
use serde::Deserialize;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

pub mod sandbox;

use super::{spec::Spec, workload::Workload, Metadata, Pod, Runtime};

/// Queries answer at once on a healthy runtime.
const QUERY_TIMEOUT: Duration = Duration::from_secs(3);
/// The API version asked for in `Version`.
const API_VERSION: &str = "v1";

/// A connection to one runtime's CRI socket.
pub struct Cri {
    client: RuntimeServiceClient<Channel>,
    /// For the image service, on the same connection.
    channel: Channel,
    socket: PathBuf,
    /// The runtime's name and version, as it says in `Version`.
    pub version: RuntimeVersion,
}

#[derive(Clone, Debug)]
pub struct RuntimeVersion {
    pub name: String,
    pub version: String,
}

impl std::fmt::Display for RuntimeVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.name, self.version)
    }
}

impl Cri {
    /// Connects and asks the runtime's version: a socket that does not
    /// speak `runtime.v1` is an error here, not at the first real call.
    pub async fn connect(socket: &Path) -> Result<Self> {
        let path = socket.to_owned();
        let connector = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        });
        // The URI is unused: the connector dials the socket.
        let endpoint = Endpoint::from_static("http://cri.invalid").connect_timeout(QUERY_TIMEOUT);
        let channel = deadline(QUERY_TIMEOUT, async {
            // tonic's error repeats its cause at each level: the cause says it.
            endpoint
                .connect_with_connector(connector)
                .await
                .map_err(|e| anyhow!("{}", root_cause(&e)))
        })
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
        let mut client = RuntimeServiceClient::new(channel.clone());
        let answer = deadline(QUERY_TIMEOUT, async {
            let request = VersionRequest {
                version: API_VERSION.to_owned(),
            };
            Ok(client.version(request).await?.into_inner())
        })
        .await
        .with_context(|| format!("asking {} its CRI version", socket.display()))?;
        Ok(Self {
            client,
            channel,
            socket: socket.to_owned(),
            version: RuntimeVersion {
                name: answer.runtime_name,
                version: answer.runtime_version,
            },
        })
    }

    /// Whether the runtime's CRI knows the image `name` (ImageStatus): the
    /// runtime may hold an image its CRI has not caught up with yet.
    pub async fn has_image(&mut self, name: &str) -> Result<bool> {
        let mut images = ImageServiceClient::new(self.channel.clone());
        let request = ImageStatusRequest {
            image: Some(ImageSpec {
                image: name.to_owned(),
                ..ImageSpec::default()
            }),
            verbose: false,
        };
        let answer = deadline(QUERY_TIMEOUT, async {
            Ok(images.image_status(request).await?.into_inner())
        })
        .await
        .with_context(|| format!("asking {} about the image {name}", self.socket.display()))?;
        Ok(answer.image.is_some())
    }

    /// The ready pod sandboxes, each with what its status says.
    pub async fn pods(&mut self) -> Result<Vec<(Pod, Metadata)>> {
        let mut pods = Vec::new();
        for id in self.ready_sandboxes().await? {
            pods.push(self.pod(&id).await?);
        }
        Ok(pods)
    }

    /// One sandbox, as its status says.
    pub async fn pod(&mut self, id: &str) -> Result<(Pod, Metadata)> {
        let runtime = self.runtime()?;
        let status = self.status(id).await?;
        pod_of(runtime, id, status)
    }

    fn runtime(&self) -> Result<Runtime> {
        match self.version.name.as_str() {
            "containerd" => Ok(Runtime::Containerd),
            "cri-o" => Ok(Runtime::Crio),
            other => bail!(
                "{}: a runtime dnstrace does not know: {other:?}",
                self.socket.display()
            ),
        }
    }

    /// The ids of the ready sandboxes: one cheap call, where `pods` makes
    /// one more per sandbox.
    pub async fn ready_sandboxes(&mut self) -> Result<Vec<String>> {
        self.list(Some(PodSandboxState::SandboxReady)).await
    }

    pub(super) async fn list(&mut self, state: Option<PodSandboxState>) -> Result<Vec<String>> {
        let client = &mut self.client;
        let request = ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                state: state.map(|s| PodSandboxStateValue { state: s as i32 }),
                ..PodSandboxFilter::default()
            }),
        };
        let answer = deadline(QUERY_TIMEOUT, async {
            Ok(client.list_pod_sandbox(request).await?.into_inner())
        })
        .await
        .context("ListPodSandbox")?;
        Ok(answer.items.into_iter().map(|s| s.id).collect())
    }

    async fn status(&mut self, id: &str) -> Result<PodSandboxStatusResponse> {
        let client = &mut self.client;
        let request = PodSandboxStatusRequest {
            pod_sandbox_id: id.to_owned(),
            verbose: true,
        };
        deadline(QUERY_TIMEOUT, async {
            Ok(client.pod_sandbox_status(request).await?.into_inner())
        })
        .await
        .with_context(|| format!("PodSandboxStatus of {id}"))
    }
}

/// `work`, or an error once `limit` has passed.
pub(super) async fn deadline<T>(
    limit: Duration,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, work)
        .await
        .map_err(|_| anyhow!("no answer within {limit:?}"))?
}

fn root_cause<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> &'a (dyn std::error::Error + 'static) {
    e.source().map_or(e, root_cause)
}

/// The part of the verbose status's `info` both runtimes fill: the
/// sandbox process and the OCI spec it was started with.
#[derive(Deserialize)]
struct Info {
    pid: Option<u32>,
    #[serde(rename = "runtimeSpec")]
    runtime_spec: Option<Spec>,
}

/// A sandbox's status as a pod and its metadata.
fn pod_of(runtime: Runtime, id: &str, answer: PodSandboxStatusResponse) -> Result<(Pod, Metadata)> {
    let status = answer
        .status
        .ok_or_else(|| anyhow!("PodSandboxStatus of {id}: no status"))?;
    let meta = status.metadata.unwrap_or_default();
    let info: Option<Info> = match answer.info.get("info") {
        Some(text) => Some(
            serde_json::from_str(text)
                .with_context(|| format!("PodSandboxStatus of {id}: verbose info"))?,
        ),
        None => None,
    };
    let spec = info.as_ref().and_then(|i| i.runtime_spec.as_ref());
    let pod = Pod {
        runtime,
        sandbox_id: id.to_owned(),
        namespace: meta.namespace,
        name: meta.name.clone(),
        uid: meta.uid,
        netns: spec.and_then(Spec::netns_path).map(Path::to_path_buf),
        pid: info.as_ref().and_then(|i| i.pid).filter(|pid| *pid > 0),
        resolv_conf: spec
            .and_then(Spec::resolv_conf_source)
            .map(Path::to_path_buf),
    };
    let labels: BTreeMap<String, String> = status.labels.into_iter().collect();
    let network = status.network.unwrap_or_default();
    let ips = std::iter::once(network.ip)
        .chain(network.additional_ips.into_iter().map(|ip| ip.ip))
        .filter_map(|ip| ip.parse().ok())
        .collect();
    let metadata = Metadata {
        workload: Workload::of(&meta.name, &labels),
        labels,
        annotations: status.annotations.into_iter().collect(),
        ips,
    };
    Ok((pod, metadata))
}

#[cfg(test)]
mod tests;
