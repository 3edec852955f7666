//! `dnstrace cluster`: one live view of a pod's lookups, whole across
//! nodes, from the agents already running on them. It asks every agent
//! which runs the pod, then the agents of the nodes its lookups reach
//! (`choose`) for their evidence of them (the client's legs on one, the
//! resolvers' and upstreams' on others), from `--since` ago, and merges
//! the streams into one time line (`record::lanes`) through the same
//! pipeline, rules and views as `trace`. A node whose agent goes away is
//! shown down and reconnected, looked for again by name if it must be;
//! the view resumes after what it already has. Every ten seconds the
//! agents are asked again, and a node the lookups reach now (an agent
//! that answers now, a resolver moved) joins the view (`Roster`).
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use anyhow::{anyhow, bail, Context as _, Result};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

mod choose;

use choose::choose;

use super::{
    agent::api::PORT,
    observer::{observer_client::ObserverClient, NodeReply, NodeRequest, WatchRequest},
    ready::Ready,
    Show,
};
use crate::{
    output::Format,
    pipeline::{Pipeline, Source as _, Stop, Tap, View},
    record::{
        self,
        lanes::{Joiner, LaneHandle, Lanes},
        merge::{self, Recording},
        replay::About,
        RecordOptions, Recorder,
    },
    view,
};

/// What `dnstrace cluster` was asked for.
pub struct ClusterOptions {
    /// Agents' `ADDR:PORT`s, or names whose addresses are the agents'
    /// (the headless Service), port 9356 unless given.
    pub agents: Vec<String>,
    /// `[namespace/]name` of the pod watched.
    pub pod: Option<String>,
    /// Client addresses watched, besides the pod's.
    pub ips: Vec<IpAddr>,
    /// A node whose pods' lookups are watched, or where `pod` is.
    pub node: Option<String>,
    /// How far back the view starts.
    pub since: Duration,
    pub tls: Option<ClientTls>,
    /// How long an input waits for a lagging node.
    pub window: Duration,
    pub ports: Vec<u16>,
    pub output: Option<Format>,
    pub live: bool,
    pub log_file: Option<PathBuf>,
    pub ready_file: Option<PathBuf>,
    /// One recording of the merged view, which `replay` reads back to the
    /// same journeys.
    pub record: Option<PathBuf>,
}

/// The viewer's certificate, key and the agents' CA (PEM), and the name
/// the agents' certificates carry (they are reached by address).
#[derive(Clone, Debug)]
pub struct ClientTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
    pub server_name: String,
}

/// How long an agent has to answer before the view goes on without it.
const CONNECT: Duration = Duration::from_secs(5);
/// Between tries to reach an agent that went away.
const RETRY: Duration = Duration::from_secs(1);
/// Tries after which the names given are resolved again, in case the
/// agent answers elsewhere now.
const RELOCATE_TRIES: u32 = 5;
/// How often the agents are asked again which nodes the watched lookups
/// reach.
const ROSTER: Duration = Duration::from_secs(10);

pub async fn run(o: ClusterOptions) -> Result<()> {
    let endpoints = Endpoints::new(o.tls.as_ref())?;
    let agents = find_agents(&o.agents).await?;
    let nodes = ask_nodes(&endpoints, &agents, log::Level::Warn).await;
    if nodes.is_empty() {
        let tls = match o.tls {
            // Plain HTTP/2 to a TLS port reads as a protocol error.
            None => "agents past loopback serve mutual TLS alone: give --cert, --key and --ca (in an agent's pod, its own are given)",
            Some(_) => "check too that --cert is signed by the CA they trust (--api-ca)",
        };
        bail!(
            "no agent answered at {}: check the addresses and that the agents serve the API (--api-addr); {tls}",
            o.agents.join(", ")
        );
    }
    let replies: Vec<NodeReply> = nodes.iter().map(|(_, r)| r.clone()).collect();
    let chosen = choose(o.pod.as_deref(), o.node.as_deref(), &o.ips, &replies)?;
    let asked: Vec<&str> = chosen
        .nodes
        .iter()
        .map(|&i| replies[i].node.as_str())
        .collect();
    match &chosen.everyone {
        Some(why) => log::info!("asking every node ({why})"),
        None => log::info!(
            "asking {}: the nodes the lookups reach, the clients' and their resolvers'",
            asked.join(", ")
        ),
    }
    let ips = chosen.ips;
    let known = nodes.clone();
    let nodes: Vec<(SocketAddr, NodeReply)> =
        chosen.nodes.iter().map(|&i| nodes[i].clone()).collect();
    let request = WatchRequest {
        ips: ips.iter().map(IpAddr::to_string).collect(),
        since_ms: o.since.as_millis() as u64,
        ..WatchRequest::default()
    };
    let mut streams = Vec::new();
    for (agent, reply) in &nodes {
        match open(&endpoints, *agent, request.clone()).await {
            Ok((first, stream)) => streams.push((*agent, reply.node.clone(), first, stream)),
            Err(e) => log::warn!(
                "node {} ({agent}): {e:#}; the view goes on without it",
                reply.node
            ),
        }
    }
    let recs = streams
        .iter()
        .map(|(agent, node, first, _)| recording(*agent, node, first))
        .collect::<Result<Vec<_>>>()?;
    let (mut lanes, handles, joiner) = Lanes::new(&recs, o.window, &o.ports);
    let roster = Roster {
        endpoints,
        given: o.agents.clone().into(),
        ips: ips.clone(),
        // A node that joins shows what comes from then on: what came
        // before has been handed on.
        request: WatchRequest {
            since_ms: 0,
            ..request.clone()
        },
        known: known
            .into_iter()
            .map(|(a, r)| (r.node.clone(), (a, r)))
            .collect(),
        followed: recs.iter().map(|r| r.node.clone()).collect(),
        joiner,
    };
    for ((agent, node, first, stream), handle) in streams.into_iter().zip(handles) {
        let feed = roster.feed(agent, node, request.clone(), handle);
        tokio::spawn(feed.run(first, stream));
    }
    tokio::spawn(roster.run());
    let nodes: Vec<String> = recs.iter().map(|r| r.node.clone()).collect();
    let ready = Ready::view(nodes, &o.ports);
    if o.output == Some(Format::Json) {
        eprintln!("{}", ready.json());
    }
    let _ready_file = o
        .ready_file
        .as_deref()
        .map(|p| ready.write(p))
        .transpose()?;
    let about = merge::about(&recs);
    let limits = about.limits();
    // Numbered from 1 however many: more may join.
    let show = Show {
        view: if o.live {
            View::Live(limits)
        } else {
            View::Journeys(limits)
        },
        format: o.output.unwrap_or(Format::Text),
        labels: merge::numbered_labels(&recs),
        context: merge::numbered_context(&recs),
        target: None,
        about: view::state::About {
            target: headline(o.pod.as_deref(), &ips, &recs),
            hooks: 0,
            log: None,
        },
        log: o.log_file,
        hold: false,
    };
    let recorder = match &o.record {
        Some(path) => {
            let meta = record::meta(&show.labels, &show.context, limits).of_cluster(lanes.now());
            let options = RecordOptions {
                path: path.clone(),
                max_bytes: None,
                files: None,
            };
            Some(Box::new(Recorder::create(options, meta)?) as Box<dyn Tap>)
        }
        None => None,
    };
    let mut pipe = Pipeline::recording(recorder);
    let tally = show.run(&mut pipe, &mut lanes, &mut Stop::new()?).await?;
    lanes.clocks().print(o.output == Some(Format::Json));
    let tally = tally.map(|t| format!(", {t}")).unwrap_or_default();
    eprintln!(
        "dnstrace: cluster view of {} nodes: {}{tally}",
        lanes.nodes().len(),
        pipe.counts.brief()
    );
    Ok(())
}

/// `web-7d9f8 (10.244.1.5) on 3 nodes`.
fn headline(pod: Option<&str>, ips: &[IpAddr], recs: &[Recording]) -> String {
    let ips: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
    let nodes: Vec<&str> = recs.iter().map(|r| r.node.as_str()).collect();
    match pod {
        Some(p) => format!("{p} ({}) on nodes {}", ips.join(", "), nodes.join(", ")),
        None => format!("{} on nodes {}", ips.join(", "), nodes.join(", ")),
    }
}

/// The nodes the view follows, and what brings in those it should follow
/// and does not: an agent that answers now, a resolver moved to a node
/// not followed, a node come into the cluster.
struct Roster {
    endpoints: Endpoints,
    /// `--agents`: where agents are looked for.
    given: Arc<[String]>,
    /// The clients' addresses watched.
    ips: Vec<IpAddr>,
    request: WatchRequest,
    /// What each node's agent said last, by the node's name.
    known: BTreeMap<String, (SocketAddr, NodeReply)>,
    followed: BTreeSet<String>,
    joiner: Joiner,
}

impl Roster {
    async fn run(mut self) {
        let mut every = tokio::time::interval_at(tokio::time::Instant::now() + ROSTER, ROSTER);
        // A look held up by agents that do not answer is not made up for.
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            self.look().await;
        }
    }

    /// Asks the agents again which nodes they are, and follows those the
    /// watched lookups reach now that it does not. A node followed whose
    /// agent does not answer keeps its last word: its feed reconnects it.
    async fn look(&mut self) {
        let Ok(agents) = find_agents(&self.given).await else {
            return;
        };
        // Those that do not answer were said at the start, or by their feed.
        for (agent, reply) in ask_nodes(&self.endpoints, &agents, log::Level::Debug).await {
            self.known.insert(reply.node.clone(), (agent, reply));
        }
        let replies: Vec<NodeReply> = self.known.values().map(|(_, r)| r.clone()).collect();
        let chosen = match choose(None, None, &self.ips, &replies) {
            Ok(c) => c,
            Err(e) => return log::debug!("no nodes chosen anew: {e:#}"),
        };
        for i in chosen.nodes {
            let node = &replies[i].node;
            if !self.followed.contains(node) {
                let (agent, _) = self.known[node];
                self.join(agent, node.clone()).await;
            }
        }
    }

    async fn join(&mut self, agent: SocketAddr, node: String) {
        let opened = open(&self.endpoints, agent, self.request.clone()).await;
        let (first, stream) = match opened {
            Ok(o) => o,
            Err(e) => return log::debug!("node {node} ({agent}) is not followed yet: {e:#}"),
        };
        let rec = match recording(agent, &node, &first) {
            Ok(r) => r,
            Err(e) => return log::warn!("{e:#}"),
        };
        let handle = self.joiner.join(&rec).await;
        self.followed.insert(node.clone());
        let feed = self.feed(agent, node, self.request.clone(), handle);
        tokio::spawn(feed.run(first, stream));
    }

    /// What keeps `node`'s lane fed from its agent at `agent`.
    fn feed(
        &self,
        agent: SocketAddr,
        node: String,
        request: WatchRequest,
        handle: LaneHandle,
    ) -> Feed {
        Feed {
            endpoints: self.endpoints.clone(),
            agent,
            given: self.given.clone(),
            node,
            request,
            handle,
            dropped: 0,
        }
    }
}

/// A node's stream read as a recording is: what its first message says.
fn recording(agent: SocketAddr, node: &str, first: &[u8]) -> Result<Recording> {
    let path = PathBuf::from(format!("{node} ({agent})"));
    let reader = crate::record::pcapng::Reader::new(std::io::Cursor::new(first))
        .map_err(|e| anyhow!("the stream of {node} ({agent}): {e}"))?;
    let about = About::scan(reader, &path)?;
    Ok(Recording {
        path,
        about,
        node: node.to_owned(),
    })
}

/// How agents are reached: in the clear (loopback) or with mutual TLS.
#[derive(Clone)]
struct Endpoints {
    tls: Option<ClientTlsConfig>,
}

impl Endpoints {
    fn new(tls: Option<&ClientTls>) -> Result<Self> {
        let Some(t) = tls else {
            return Ok(Self { tls: None });
        };
        let read =
            |p: &PathBuf| std::fs::read(p).with_context(|| format!("cannot read {}", p.display()));
        let config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(&t.ca)?))
            .identity(Identity::from_pem(read(&t.cert)?, read(&t.key)?))
            .domain_name(t.server_name.clone());
        Ok(Self { tls: Some(config) })
    }

    async fn connect(&self, agent: SocketAddr) -> Result<ObserverClient<Channel>> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{agent}"))?
            .connect_timeout(CONNECT)
            .tcp_nodelay(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| anyhow!("{}", error_chain(&e)))?;
        Ok(ObserverClient::new(channel).max_decoding_message_size(64 << 20))
    }
}

/// An error and its causes, on one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// The agents' addresses: each given as `ADDR:PORT`, or a name (with a
/// port, or 9356) resolved to all its addresses.
async fn find_agents(given: &[String]) -> Result<Vec<SocketAddr>> {
    let mut found = Vec::new();
    for g in given {
        if let Ok(a) = g.parse::<SocketAddr>() {
            found.push(a);
            continue;
        }
        if let Ok(ip) = g.parse::<IpAddr>() {
            found.push((ip, PORT).into());
            continue;
        }
        let host = if g.contains(':') {
            g.clone()
        } else {
            format!("{g}:{PORT}")
        };
        let addrs = tokio::net::lookup_host(&host)
            .await
            .with_context(|| format!("cannot resolve the agents' name {host}"))?;
        found.extend(addrs);
    }
    // In the order given, each once: the first is the time line's
    // reference.
    let mut seen = std::collections::HashSet::new();
    found.retain(|a| seen.insert(*a));
    if found.is_empty() {
        bail!("no agents: give --agents ADDR,… or the agents' Service name");
    }
    Ok(found)
}

/// Each agent that answers, with what it says of its node, asked all at
/// once: one that does not answer holds the others up `CONNECT` at most,
/// and is said at `level`.
async fn ask_nodes(
    endpoints: &Endpoints,
    agents: &[SocketAddr],
    level: log::Level,
) -> Vec<(SocketAddr, NodeReply)> {
    let mut asks = tokio::task::JoinSet::new();
    for (i, &agent) in agents.iter().enumerate() {
        let endpoints = endpoints.clone();
        asks.spawn(async move {
            let reply = async {
                let mut client = endpoints.connect(agent).await?;
                let reply = tokio::time::timeout(CONNECT, client.node(NodeRequest {}))
                    .await
                    .map_err(|_| anyhow!("no answer in {CONNECT:?}"))??;
                anyhow::Ok(reply.into_inner())
            }
            .await;
            (i, agent, reply)
        });
    }
    let mut nodes = Vec::new();
    while let Some(Ok((i, agent, reply))) = asks.join_next().await {
        match reply {
            Ok(r) => nodes.push((i, agent, r)),
            Err(e) => log::log!(level, "agent {agent}: {}", status_text(&e)),
        }
    }
    // In the order given: the first is the time line's reference.
    nodes.sort_by_key(|(i, ..)| *i);
    nodes.into_iter().map(|(_, a, r)| (a, r)).collect()
}

/// What a failed call says, a refusal of our certificate in plain words.
fn status_text(e: &anyhow::Error) -> String {
    match e.downcast_ref::<tonic::Status>() {
        Some(s) => format!("{}: {}", s.code(), s.message()),
        None => format!("{e:#}"),
    }
}

type EvidenceStream = tonic::Streaming<crate::commands::observer::Evidence>;

/// A watch of `agent`'s, and its first message's bytes.
async fn open(
    endpoints: &Endpoints,
    agent: SocketAddr,
    request: WatchRequest,
) -> Result<(Vec<u8>, EvidenceStream)> {
    let mut client = endpoints.connect(agent).await?;
    let mut stream = client.watch(request).await?.into_inner();
    let first = tokio::time::timeout(CONNECT, stream.message())
        .await
        .map_err(|_| anyhow!("no evidence in {CONNECT:?}"))??
        .ok_or_else(|| anyhow!("the stream ended at once"))?;
    Ok((first.pcapng, stream))
}

/// One node's stream, fed to its lane; reconnected when it breaks.
struct Feed {
    endpoints: Endpoints,
    agent: SocketAddr,
    /// `--agents`: where a node's agent is looked for again.
    given: Arc<[String]>,
    node: String,
    request: WatchRequest,
    handle: LaneHandle,
    dropped: u64,
}

impl Feed {
    async fn run(mut self, first: Vec<u8>, stream: EvidenceStream) {
        let mut next = Some((first, stream));
        let mut tries = 0;
        loop {
            if let Some((first, stream)) = next.take() {
                let why = self.pour(first, stream).await;
                self.handle.down(why).await;
                tries = 0;
            }
            tokio::time::sleep(RETRY).await;
            tries += 1;
            if tries % RELOCATE_TRIES == 0 {
                self.relocate().await;
            }
            match open(&self.endpoints, self.agent, self.request.clone()).await {
                Ok(opened) => next = Some(opened),
                Err(e) => self.handle.down(format!("{e:#}")).await,
            }
        }
    }

    /// Looks for the node's agent among the addresses the names given
    /// have now: an agent restarted in a pod with a new address, or a
    /// node come back at another.
    async fn relocate(&mut self) {
        if self
            .given
            .iter()
            .all(|g| g.parse::<IpAddr>().is_ok() || g.parse::<SocketAddr>().is_ok())
        {
            return;
        }
        let Ok(mut agents) = find_agents(&self.given).await else {
            return;
        };
        agents.retain(|a| *a != self.agent);
        let found = ask_nodes(&self.endpoints, &agents, log::Level::Debug).await;
        if let Some((agent, _)) = found.into_iter().find(|(_, r)| r.node == self.node) {
            log::info!("node {}'s agent answers at {agent} now", self.node);
            self.agent = agent;
        }
    }

    /// Hands a connection's bytes over until it ends; why it did. The
    /// next connection asks for what came after.
    async fn pour(&mut self, first: Vec<u8>, mut stream: EvidenceStream) -> String {
        // Each connection counts its own drops.
        self.dropped = 0;
        let chunks = match self.handle.connected(first) {
            Ok(tx) => tx,
            Err(e) => return format!("its stream does not read: {e}"),
        };
        loop {
            match stream.message().await {
                Ok(Some(ev)) => {
                    if ev.now_ns > 0 {
                        self.request.after_ns = ev.now_ns;
                        // However long it was away, the rest from memory.
                        self.request.since_ms = u64::MAX / 2_000_000;
                    }
                    if ev.seq > 0 {
                        (self.request.after_seq, self.request.epoch) = (ev.seq, ev.epoch);
                    }
                    if ev.dropped > self.dropped {
                        self.handle.dropped(ev.dropped - self.dropped).await;
                        self.dropped = ev.dropped;
                    }
                    if chunks.send(ev.pcapng).await.is_err() {
                        return "its stream stopped reading".into();
                    }
                }
                Ok(None) => return "its agent ended the stream".into(),
                Err(s) => return format!("{}: {}", s.code(), s.message()),
            }
        }
    }
}
