//! Following the node's pods while tracing: the runtime's CRI socket is
//! asked again, on a timer and when a link comes or goes, which sandboxes
//! are ready. A pod re-created (a new sandbox, a new address), a resolver
//! restarted or a pod started since are named, the `--pod` target is
//! followed into its new sandbox, and the kernel's watched addresses (and,
//! with `--node`, its scope) are changed to match.
//!
//! It runs on a thread of its own, so a slow socket never stalls the
//! pipeline. Each read is one `ListPodSandbox`, plus one
//! `PodSandboxStatus` per sandbox not seen before.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, Result};
use tokio::sync::{mpsc, Notify};

use super::{resolvers, watched, NodePods, Scope, Target};
use crate::{
    naming::Services,
    pods::{
        cri::Cri, net::Attachment, resolv::ResolvConf, select, workload::Workload, Inventory,
        Metadata, Pod,
    },
    probes::{KernelScope, ScopeMap, Watched},
    routes::Routes,
};

/// How often the pods are read again when nothing pokes sooner.
const EVERY: Duration = Duration::from_secs(1);
/// After a poke, the next reads come this much sooner, a few times: a
/// sandbox is ready a little after its veth appears.
const SOON: Duration = Duration::from_millis(200);
const SOON_READS: u32 = 5;
/// Refreshes waiting for the pipeline at most; past this the follower
/// waits for it rather than queue more.
const QUEUE: usize = 16;

/// What a read of the pods changed, for the pipeline.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Refresh {
    /// Addresses named for the first time, or named anew: (address,
    /// `namespace/pod`).
    pub names: Vec<(IpAddr, String)>,
    /// The workloads of the pods newly named that have one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workloads: Vec<(IpAddr, Workload)>,
    /// The pods' UIDs, for the pods newly named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uids: Vec<(IpAddr, String)>,
    /// The target's new sandbox, when it moved to one.
    pub target: Option<Moved>,
    /// A node a cluster view follows from now on (its pods' names above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined: Option<Box<Joined>>,
}

/// A node a cluster view began to follow while it ran: its legs carry
/// `NodeId(id)`; what the rules know of it, as of a node the view began
/// with.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Joined {
    pub id: u16,
    pub name: String,
    /// Its pods' addresses and how they are attached: their home.
    pub attachments: BTreeMap<IpAddr, Attachment>,
    #[serde(default, skip_serializing_if = "Routes::is_empty")]
    pub routes: Routes,
    pub resolvers: Vec<IpAddr>,
    pub service_ips: Vec<IpAddr>,
    /// Its own network namespace's inode; absent from recordings made
    /// before it was noted (0: not known).
    #[serde(default)]
    pub node_netns: u32,
}

impl Joined {
    /// Names it in a list of nodes by `NodeId` less one.
    pub fn name_in(&self, nodes: &mut Vec<String>) {
        let at = usize::from(self.id).saturating_sub(1);
        if nodes.len() <= at {
            nodes.resize(at + 1, String::new());
        }
        nodes[at].clone_from(&self.name);
    }
}

/// Where the target went: its new sandbox's network namespace, addresses
/// and resolv.conf (when it could be read).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Moved {
    pub netns_inode: u32,
    pub addrs: Vec<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolv: Option<ResolvConf>,
}

/// The pods as they were when tracing started, and what follows them.
pub struct Following {
    /// The CRI socket that answered at the start.
    pub socket: PathBuf,
    pub pods: Pods,
    /// The kernel's watched addresses, with a target.
    pub watched: Option<Watched>,
    /// The kernel's scope, with `--node`.
    pub scope: Option<ScopeMap>,
}

/// The follower as the trace sees it: refreshes to take, and a poke.
pub struct Follower {
    refreshes: mpsc::Receiver<Refresh>,
    poke: Arc<Notify>,
}

impl Follower {
    /// Starts following on a thread of its own. A thread has the
    /// capabilities of the one that starts it: start it once they are
    /// dropped (the socket and the maps need none).
    pub fn start(following: Following) -> Result<Self> {
        let (tx, refreshes) = mpsc::channel(QUEUE);
        let poke = Arc::new(Notify::new());
        let poked = poke.clone();
        std::thread::Builder::new()
            .name("dnstrace-pods".into())
            .spawn(move || follow(following, &tx, &poked))
            .context("starting the pods' follower")?;
        Ok(Self { refreshes, poke })
    }

    /// The next refresh; never, once the follower has stopped.
    pub async fn next(&mut self) -> Refresh {
        match self.refreshes.recv().await {
            Some(r) => r,
            None => std::future::pending().await,
        }
    }

    /// Reads the pods now rather than at the next beat (a link came or
    /// went: a sandbox may have too).
    pub fn poke(&self) {
        self.poke.notify_one();
    }
}

/// The follower's thread: reads on each beat or poke until the trace
/// stops taking refreshes.
fn follow(mut following: Following, tx: &mpsc::Sender<Refresh>, poke: &Notify) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return log::warn!("off: following pods while tracing: {e}"),
    };
    runtime.block_on(async {
        let mut asker = Asker::new(following.socket.clone());
        let mut soon: u32 = 0;
        loop {
            let wait = if soon > 0 { SOON } else { EVERY };
            soon = tokio::select! {
                () = tokio::time::sleep(wait) => soon.saturating_sub(1),
                () = poke.notified() => SOON_READS,
            };
            let Some(now) = asker.read(&following.pods.sandboxes).await else {
                continue;
            };
            let update = following.pods.update(now);
            if let Some(map) = &mut following.watched {
                tell_kernel(map, &update);
            }
            if let (Some(map), Some(scope)) = (&mut following.scope, &update.scope) {
                tell_scope(map, scope);
            }
            let changed = update.refresh != Refresh::default();
            if changed && tx.send(update.refresh).await.is_err() {
                return;
            }
            // Said once the kernel and the pipeline have been told: what
            // follows the line is traced as it says.
            update.said.iter().for_each(|line| log::info!("{line}"));
        }
    });
}

/// Asks the CRI socket, connecting again after a failure; a streak of
/// failures is said once.
struct Asker {
    socket: PathBuf,
    cri: Option<Cri>,
    failing: bool,
}

impl Asker {
    fn new(socket: PathBuf) -> Self {
        Self {
            socket,
            cri: None,
            failing: false,
        }
    }

    /// The ready sandboxes now: those of `known` still ready, as they
    /// were, and the new ones asked for their status.
    async fn read(
        &mut self,
        known: &BTreeMap<String, (Pod, Metadata)>,
    ) -> Option<BTreeMap<String, (Pod, Metadata)>> {
        match self.ask(known).await {
            Ok(now) => {
                if std::mem::take(&mut self.failing) {
                    log::info!("following pods: {} answers again", self.socket.display());
                }
                Some(now)
            }
            Err(e) => {
                self.cri = None;
                if !std::mem::replace(&mut self.failing, true) {
                    log::warn!("following pods: {e:#}; names and the target stay as they are until it answers");
                }
                None
            }
        }
    }

    async fn ask(
        &mut self,
        known: &BTreeMap<String, (Pod, Metadata)>,
    ) -> Result<BTreeMap<String, (Pod, Metadata)>> {
        let cri = match &mut self.cri {
            Some(cri) => cri,
            None => self.cri.insert(Cri::connect(&self.socket).await?),
        };
        let mut now = BTreeMap::new();
        for id in cri.ready_sandboxes().await? {
            let pod = match known.get(&id) {
                Some(seen) => seen.clone(),
                None => cri.pod(&id).await?,
            };
            now.insert(id, pod);
        }
        Ok(now)
    }
}

/// The pods as last read, and what was made of them: pure, so that it is
/// tested without a runtime.
pub struct Pods {
    /// The ready sandboxes, by id.
    sandboxes: BTreeMap<String, (Pod, Metadata)>,
    names: BTreeMap<IpAddr, String>,
    services: Services,
    /// The pods seen serving DNS at the start (sockets are read from inside
    /// namespaces, which the follower can no longer enter).
    dns_servers: BTreeSet<IpAddr>,
    target: Option<Followed>,
    /// What the kernel watches now.
    watched: Vec<([u8; 16], u8)>,
    /// The node's namespaces now, with `--node`.
    scope: Option<Scope>,
}

/// The target, when it is a pod.
struct Followed {
    /// `--pod`'s query; None for a target that does not move (a network
    /// namespace, a process, an address), whose resolvers still may.
    query: Option<String>,
    label: String,
    sandbox_id: Option<String>,
    addrs: Vec<IpAddr>,
}

/// What one read changed.
#[derive(Debug, Default)]
pub struct Update {
    pub refresh: Refresh,
    /// The kernel's new watched addresses, when they changed.
    pub watched: Option<Vec<([u8; 16], u8)>>,
    /// The kernel's new scope, when it changed.
    pub scope: Option<KernelScope>,
    /// Lines for the log: pods started and stopped, the target followed.
    pub said: Vec<String>,
}

impl Pods {
    /// The pods `inventory` holds (those the CRI answered for), the target
    /// `--pod query` resolved to, and the names and resolvers known at the
    /// start.
    pub fn new(
        inventory: &Inventory,
        query: Option<&str>,
        target: Option<&Target>,
        services: Services,
        start: &NodePods,
    ) -> Self {
        let sandboxes: BTreeMap<String, (Pod, Metadata)> = inventory
            .pods
            .iter()
            .filter_map(|p| {
                Some((
                    p.sandbox_id.clone(),
                    (p.clone(), inventory.metadata(p)?.clone()),
                ))
            })
            .collect();
        let target = target.map(|t| Followed {
            query: query.map(str::to_owned),
            label: t.label.clone(),
            sandbox_id: query
                .and_then(|q| select(&inventory.pods, q).ok())
                .map(|p| p.sandbox_id.clone()),
            addrs: t.addrs.clone(),
        });
        let names = start
            .addresses
            .iter()
            .flat_map(|(name, ips)| ips.iter().map(move |ip| (*ip, name.clone())))
            .collect();
        let mut pods = Self {
            sandboxes,
            names,
            services,
            dns_servers: start.dns_servers.clone(),
            target,
            watched: Vec::new(),
            scope: None,
        };
        pods.watched = pods.watch_now().unwrap_or_default();
        pods
    }

    /// Keeps `scope` current as pods come and go.
    pub fn with_scope(mut self, scope: Option<Scope>) -> Self {
        self.scope = scope;
        self
    }

    /// What changed since the last read, said as it is found.
    pub fn update(&mut self, now: BTreeMap<String, (Pod, Metadata)>) -> Update {
        let before = std::mem::replace(&mut self.sandboxes, now);
        let mut said = self.comings_and_goings(&before);
        let mut refresh = Refresh::default();
        self.rename(&mut refresh);
        refresh.target = self.follow_target(&mut said);
        let watched = self.watch_now().filter(|w| *w != self.watched);
        if let Some(w) = &watched {
            self.watched.clone_from(w);
        }
        let scope = self.rescope(&mut said);
        Update {
            refresh,
            watched,
            scope,
            said,
        }
    }

    /// The node's namespaces now, when they changed; said in one line.
    fn rescope(&mut self, said: &mut Vec<String>) -> Option<KernelScope> {
        let scope = self.scope.as_mut()?;
        let now = Scope::of(scope.node_netns, self.sandboxes.values().map(|(p, _)| p));
        if now == scope.netns {
            return None;
        }
        scope.netns = now;
        said.push(format!(
            "node {}: {} network namespaces in scope",
            scope.node,
            scope.netns.len()
        ));
        Some(scope.kernel())
    }

    fn comings_and_goings(&self, before: &BTreeMap<String, (Pod, Metadata)>) -> Vec<String> {
        let started = self
            .sandboxes
            .iter()
            .filter(|(id, _)| !before.contains_key(*id))
            .map(|(_, (pod, meta))| {
                format!("pod {} started: {}", pod.full_name(), addresses(&meta.ips))
            });
        let stopped = before
            .iter()
            .filter(|(id, _)| !self.sandboxes.contains_key(*id))
            .map(|(_, (pod, _))| format!("pod {} stopped", pod.full_name()));
        started.chain(stopped).collect()
    }

    /// The addresses whose pod is new, its workload and UID, into `refresh`.
    fn rename(&mut self, refresh: &mut Refresh) {
        for (pod, meta) in self.sandboxes.values() {
            let name = pod.full_name();
            for ip in &meta.ips {
                if self.names.get(ip) != Some(&name) {
                    self.names.insert(*ip, name.clone());
                    refresh.names.push((*ip, name.clone()));
                    let workload = meta.workload.clone().map(|w| (*ip, w));
                    refresh.workloads.extend(workload);
                    if !pod.uid.is_empty() {
                        refresh.uids.push((*ip, pod.uid.clone()));
                    }
                }
            }
        }
    }

    /// The target's new sandbox, when its own is gone and the query
    /// names another; said in one line.
    fn follow_target(&mut self, said: &mut Vec<String>) -> Option<Moved> {
        let target = self.target.as_mut()?;
        let query = target.query.as_deref()?;
        let current = target.sandbox_id.as_ref();
        if current.is_some_and(|id| self.sandboxes.contains_key(id)) {
            return None;
        }
        let pods: Vec<Pod> = self.sandboxes.values().map(|(p, _)| p.clone()).collect();
        let Ok(pod) = select(&pods, query) else {
            if target.sandbox_id.take().is_some() {
                said.push(format!(
                    "{}: its sandbox is gone; waiting for the next one",
                    target.label
                ));
            }
            return None;
        };
        let meta = &self.sandboxes[&pod.sandbox_id].1;
        let netns_inode = pod
            .netns_path()
            .and_then(|n| crate::netns::inode(Some(&n)).ok())
            .unwrap_or(0);
        said.push(format!(
            "following pod {} into its new sandbox {}: {} (was {})",
            pod.full_name(),
            short(&pod.sandbox_id),
            addresses(&meta.ips),
            addresses(&target.addrs)
        ));
        target.sandbox_id = Some(pod.sandbox_id.clone());
        target.addrs.clone_from(&meta.ips);
        Some(Moved {
            netns_inode,
            addrs: meta.ips.clone(),
            resolv: crate::pods::resolv::read_for_pod(pod).ok(),
        })
    }

    /// The target's addresses and its resolvers' now, as the kernel
    /// keeps them; None where there is no target or they are too many.
    fn watch_now(&self) -> Option<Vec<([u8; 16], u8)>> {
        let target = self.target.as_ref()?;
        let pods = NodePods {
            addresses: self
                .sandboxes
                .values()
                .map(|(p, m)| (p.full_name(), m.ips.clone()))
                .collect(),
            dns_servers: self.dns_servers.clone(),
            ..NodePods::default()
        };
        let resolvers: BTreeSet<IpAddr> = resolvers(&self.services, &pods);
        watched(&target.addrs, &resolvers)
            .map_err(|e| log::warn!("following pods: {e:#}"))
            .ok()
    }
}

/// The target's new addresses and namespace, into the kernel's filter.
fn tell_kernel(map: &mut Watched, update: &Update) {
    if let Some(w) = &update.watched {
        if let Err(e) = map.set(w) {
            log::warn!("following pods: the kernel's watched addresses: {e:#}");
        }
    }
    if let Some(moved) = &update.refresh.target {
        if let Err(e) = map.follow_netns(moved.netns_inode) {
            log::warn!("following pods: the kernel's target namespace: {e:#}");
        }
    }
}

/// The node's namespaces now, into the kernel's scope.
fn tell_scope(map: &mut ScopeMap, scope: &KernelScope) {
    if let Err(e) = map.set(scope) {
        log::warn!("following pods: the kernel's scope: {e:#}");
    }
}

/// `10.244.0.7, fd00::7`, or `no address`.
fn addresses(ips: &[IpAddr]) -> String {
    if ips.is_empty() {
        return "no address".to_owned();
    }
    let ips: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
    ips.join(", ")
}

/// A sandbox id's first twelve characters, as runtimes show it.
fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

#[cfg(test)]
mod tests;
