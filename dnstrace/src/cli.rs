//! Command-line interface.
use std::{path::PathBuf, sync::Arc};

use clap::Parser;

use crate::{
    commands::{
        agent::{
            self,
            api::{self, ApiOptions, TlsFiles},
            AgentOptions,
        },
        cluster::{ClientTls, ClusterOptions},
        trace::{self, TraceOptions},
    },
    correlate::Limits,
    ingest::SampleMode,
    metrics::MetricsOptions,
    otlp::{self, OtlpOptions},
    output::Format,
    pods,
    probes::{AttachMode, BpfLog, ProbeOptions},
    record::{flight::FlightOptions, RecordOptions},
    target,
};

#[derive(Parser, Debug)]
#[command(
    name = "dnstrace",
    version,
    about = "Follow DNS on a Linux or Kubernetes node with eBPF, packet by packet",
    after_help = "Needs root (CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON). Stop with Ctrl-C."
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub capture: CaptureArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Follow each DNS query end to end, through DNAT to the server, its
    /// upstream queries and back, and print it as one journey.
    Trace {
        /// Boxed: the other commands are small beside it.
        #[command(flatten)]
        capture: Box<CaptureArgs>,
        /// A query without an answer is given up after this long.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "5500ms")]
        timeout: std::time::Duration,
        /// Queries followed at once before the oldest are evicted.
        #[arg(long, default_value_t = 65_536)]
        max_open: usize,
    },
    /// The pods on this node, found in the container runtime's own state
    /// (no API server), with their addresses, host veths and nameservers.
    Pods {
        /// Only this pod: its name, namespace/name, or a unique prefix.
        #[arg(value_name = "POD")]
        query: Option<String>,
        #[command(flatten)]
        runtime: RuntimeArgs,
        /// Network namespace holding the pods' host veths: the node's
        /// (default: the one dnstrace runs in), e.g. /run/netns/NAME.
        #[arg(long, value_name = "PATH")]
        node_netns: Option<PathBuf>,
        /// Output format: a table, or one JSON object per pod.
        #[arg(short, long, value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// Replay a recording (dnstrace's, or a tcpdump capture) through the
    /// same decoding, journeys and rules as live tracing; needs no root.
    /// Several nodes' recordings replay as one: a lookup that crossed
    /// nodes is one journey, its legs named by node.
    Replay {
        #[arg(value_name = "FILE", required = true)]
        files: Vec<PathBuf>,
        /// `fast`, or how many times real time (1 replays in real time).
        #[arg(long, default_value = "fast")]
        speed: crate::record::replay::Speed,
        /// One line per DNS packet instead of journeys.
        #[arg(long)]
        packets: bool,
        #[command(flatten)]
        ports: DnsPorts,
        /// Output format; without it, on a terminal, the live view.
        #[arg(short, long, value_enum)]
        output: Option<Format>,
        /// Lines even on a terminal: no live view.
        #[arg(long)]
        no_tui: bool,
        /// Where log lines go while the replay runs (default: stderr;
        /// with the live view, a new dnstrace-PID.log in the temporary
        /// directory).
        #[arg(long, value_name = "PATH")]
        log_file: Option<PathBuf>,
    },
    /// A postmortem summary of a recording (time range, lookups, failure
    /// rates, latency, anomalies with evidence, the slowest and the failed
    /// journeys) in Markdown, or HTML with charts.
    Report {
        /// One recording, or several nodes' to merge.
        #[arg(value_name = "FILE", required = true)]
        files: Vec<PathBuf>,
        #[arg(long, value_enum, default_value_t = crate::commands::report::Format::Markdown)]
        format: crate::commands::report::Format,
        /// Write the report here instead of to stdout.
        #[arg(short, long, value_name = "PATH")]
        write: Option<PathBuf>,
        #[command(flatten)]
        ports: DnsPorts,
    },
    /// Whether dnstrace can trace on this node: loads every program (the
    /// kernel's verifier checks each, kprobes too where they cannot attach),
    /// attaches what the kernel allows, says what is on and what is off and
    /// why, and detaches.
    Check {
        /// Check tc on these interfaces instead of the node-wide hooks.
        #[arg(short, long = "iface", value_name = "IF")]
        ifaces: Vec<String>,
        /// Check the programs built to log why they skip packets, which
        /// `trace --debug-bpf` loads, instead of the usual ones.
        #[arg(long)]
        debug_bpf: bool,
        /// The runtime's CRI socket to check, as `pods` and `trace` ask
        /// it (default: each runtime's, where it exists).
        #[arg(long, value_name = "PATH")]
        cri_socket: Option<std::path::PathBuf>,
    },
    /// Trace the whole node until stopped, with no terminal, as a
    /// DaemonSet runs it: Prometheus metrics of every lookup and health
    /// endpoints over HTTP. Every flag can be set by its environment
    /// variable.
    Agent(Box<AgentArgs>),
    /// One live view of a pod's lookups, whole across nodes, from the
    /// agents on them (`agent`'s API): each leg named by its node, the
    /// same journeys and rules as `trace`. Run it wherever the agents are
    /// reachable; from inside the cluster, `kubectl exec -it -n dnstrace
    /// ds/dnstrace -- dnstrace cluster --pod default/web` needs no new
    /// credentials.
    Cluster(Box<ClusterArgs>),
    /// A simulated Kubernetes node in network namespaces, with switchable DNS faults.
    Lab {
        #[command(subcommand)]
        command: crate::lab::LabCommand,
        /// Which lab, of several up side by side (their namespaces are
        /// dtlabN-*, their state /run/dnstrace-labN): none is the lab of
        /// dtlab-*.
        #[arg(long, global = true, env = "DNSTRACE_LAB_INSTANCE", value_name = "N", value_parser = clap::value_parser!(u8).range(1..=99))]
        instance: Option<u8>,
    },
}

#[derive(clap::Args, Debug, Clone)]
pub struct CaptureArgs {
    /// Interface to watch with tc, ingress and egress (repeatable). Without
    /// one, every device of every network namespace and the kernel's drops.
    #[arg(short, long = "iface", value_name = "IF")]
    pub ifaces: Vec<String>,

    /// Port treated as DNS (repeatable, or `53,5353`; replaces the default
    /// 53).
    #[arg(
        short,
        long = "port",
        value_delimiter = ',',
        value_name = "PORT",
        default_value = "53"
    )]
    pub ports: Vec<u16>,

    /// Output format: one line (text or JSON) per DNS message, or per
    /// journey with `trace`. Without it, on a terminal, the live view.
    #[arg(short, long, value_enum)]
    pub output: Option<Format>,

    /// Lines even on a terminal: no live view.
    #[arg(long)]
    pub no_tui: bool,

    /// Where log lines go while the capture runs (default: stderr; with
    /// the live view, a new dnstrace-PID.log in the temporary directory).
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,

    /// Once every hook is attached and the ring buffer is being read,
    /// write a JSON object here (`{"event":"ready","pid":…}`), replaced
    /// whole; removed at exit.
    #[arg(long, value_name = "PATH")]
    pub ready_file: Option<PathBuf>,

    /// Trace only this pod's lookups: `name`, `namespace/name` or a unique
    /// prefix, found in the container runtime's state on this node.
    #[arg(long, value_name = "[NAMESPACE/]NAME", group = "target")]
    pub pod: Option<String>,

    /// Trace only lookups made in this network namespace, e.g. /run/netns/NAME.
    #[arg(long, value_name = "PATH", group = "target")]
    pub netns: Option<PathBuf>,

    /// Trace only lookups made in this process's network namespace.
    #[arg(long, value_name = "PID", group = "target")]
    pub pid: Option<u32>,

    /// Trace only lookups from or to this address.
    #[arg(long, value_name = "ADDR", group = "target")]
    pub ip: Option<std::net::IpAddr>,

    #[command(flatten)]
    pub runtime: RuntimeArgs,

    /// This is node NAME, of several sharing this kernel (kind, the lab):
    /// trace only its network namespace (--node-netns) and those of the
    /// pods its runtime lists, as on the node's own kernel.
    #[arg(long, value_name = "NAME", value_parser = parse_node)]
    pub node: Option<String>,

    /// Record what is seen to this pcapng file, readable by the owner only:
    /// Wireshark opens it, `dnstrace replay` and `dnstrace report` read it.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,

    /// Start a new recording file past this size, like tcpdump -C: a number
    /// of megabytes, or bytes with a k, M or G suffix. Files are FILE,
    /// FILE.1, FILE.2, …
    #[arg(long, value_name = "SIZE", requires = "record", value_parser = parse_size)]
    pub record_size: Option<u64>,

    /// Keep at most this many recording files, reusing the oldest, like
    /// tcpdump -W.
    #[arg(long, value_name = "N", requires = "record_size", value_parser = clap::value_parser!(u32).range(1..))]
    pub record_files: Option<u32>,

    /// Network namespace whose conntrack events and statistics to watch: the
    /// node's (default: the one dnstrace runs in), e.g. /run/netns/NAME.
    #[arg(long, value_name = "PATH")]
    pub node_netns: Option<std::path::PathBuf>,

    /// Kernel ring buffer size in MiB (a power of two); larger rides out bursts.
    #[arg(long, value_name = "MIB", default_value_t = 4, value_parser = parse_ring_mib)]
    pub ring_buffer_mib: u32,

    /// Keep 1 lookup in N (a power of two up to 1024), each whole, chosen
    /// by its name's first label. `auto`: all of them, and fewer while
    /// dnstrace cannot keep up, rather than events lost from all; 1: all,
    /// always, losing events when it cannot keep up.
    #[arg(long, value_name = "auto|N", default_value = "auto", value_parser = parse_sample)]
    pub sample: SampleMode,

    /// The sampling hash's first seed (default: drawn at random). Pinned,
    /// a level keeps the same names run after run.
    #[arg(long, value_name = "N")]
    pub sample_seed: Option<u32>,

    /// Log why the kernel programs skip packets, on stderr (the log file
    /// under the live view): `debug`, DNS packets left out and packets that
    /// could not be parsed; `trace`, also every packet that is not DNS.
    /// Without it the programs are loaded without their logging code.
    #[arg(long, value_name = "LEVEL", value_enum, num_args = 0..=1, require_equals = true, default_missing_value = "debug")]
    pub debug_bpf: Option<BpfLog>,

    /// How programs attach to the --iface devices: TCX links where the
    /// kernel has them (6.6+), else a clsact qdisc; `netlink` always takes
    /// the qdisc (filters `tc filter show` lists, as older tools expect).
    #[arg(long, value_enum, value_name = "MODE", default_value_t = TcAttach::Auto)]
    pub tc_attach: TcAttach,
}

#[derive(clap::Args, Debug, Clone)]
pub struct AgentArgs {
    /// This node's name, in the metrics (default: the host name).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,

    /// Where `/metrics`, `/healthz` and `/readyz` are served. 9355 is taken
    /// by no common DNS, CNI or node component.
    #[arg(
        long,
        env = "DNSTRACE_METRICS_ADDR",
        value_name = "ADDR:PORT",
        default_value = "0.0.0.0:9355"
    )]
    pub metrics_addr: std::net::SocketAddr,

    /// TLS, client certificates, basic auth and a rate limit for
    /// --metrics-addr: a web config file as Prometheus's own
    /// --web.config.file (exporter-toolkit), read again when it or its
    /// certificates change.
    #[arg(
        long,
        alias = "web.config.file",
        env = "DNSTRACE_WEB_CONFIG_FILE",
        value_name = "FILE"
    )]
    pub web_config_file: Option<PathBuf>,

    /// Log lines on stderr as text, or one JSON object each.
    #[arg(long, env = "DNSTRACE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Series of all metrics together; past it, observations are counted
    /// in `_overflow` series (`dnstrace_metric_series_overflow_total`).
    #[arg(long, env = "DNSTRACE_MAX_SERIES", value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(16..=1_000_000))]
    pub max_series: u64,

    /// A series not observed for this long is dropped (a pod gone).
    #[arg(long, env = "DNSTRACE_SERIES_TTL", value_parser = humantime::parse_duration, default_value = "15m")]
    pub series_ttl: std::time::Duration,

    /// Add the query name as a label of `dnstrace_lookups_total`: one
    /// series per name asked, within --max-series; it shows what pods
    /// look up.
    #[arg(long, env = "DNSTRACE_METRICS_QUERY_NAMES")]
    pub metrics_query_names: bool,

    /// Port treated as DNS (repeatable, or `53,5353`; replaces the default
    /// 53).
    #[arg(
        short,
        long = "port",
        env = "DNSTRACE_PORTS",
        value_delimiter = ',',
        value_name = "PORT",
        default_value = "53"
    )]
    pub ports: Vec<u16>,

    /// Network namespace of the node (conntrack, service rules, host
    /// veths): default the one dnstrace runs in.
    #[arg(long, env = "DNSTRACE_NODE_NETNS", value_name = "PATH")]
    pub node_netns: Option<PathBuf>,

    #[command(flatten)]
    pub runtime: RuntimeArgs,

    /// This is node NAME, of several sharing this kernel (kind, the lab):
    /// trace and count only its network namespace (--node-netns) and those
    /// of the pods its runtime lists. Also the node's name in the metrics
    /// when --node-name is not given.
    #[arg(long, env = "DNSTRACE_NODE", value_name = "NAME", value_parser = parse_node)]
    pub node: Option<String>,

    /// Kernel ring buffer size in MiB (a power of two). The lookups
    /// followed are bounded (--follow-max), and so is what the ring holds.
    #[arg(long, env = "DNSTRACE_RING_BUFFER_MIB", value_name = "MIB", default_value_t = 4, value_parser = parse_ring_mib)]
    pub ring_buffer_mib: u32,

    /// cgroup v2 of the host (or a directory holding it as unified/),
    /// where answers are counted as sockets take them: default where it
    /// is mounted here. In a container, whose own mount shows only its
    /// cgroup, mount the host's /sys/fs/cgroup and name it.
    #[arg(long, env = "DNSTRACE_CGROUP_ROOT", value_name = "PATH")]
    pub cgroup_root: Option<PathBuf>,

    /// Follow 1 lookup in N whole (traces, anomalies). The default, auto,
    /// follows every one, fewer while the pipeline falls behind. Lookup
    /// counts are the kernel's and exact whatever this is.
    #[arg(long, env = "DNSTRACE_SAMPLE", value_name = "auto|N", default_value = "auto", value_parser = parse_sample)]
    pub sample: SampleMode,

    /// The sampling hash's first seed (default: drawn at random). Pinned,
    /// a level keeps the same names run after run.
    #[arg(long, env = "DNSTRACE_SAMPLE_SEED", value_name = "N")]
    pub sample_seed: Option<u32>,

    /// With `--sample auto`, follow at most this many lookups a second
    /// whole; past it, about this many, each whole (0: no limit). What the
    /// agent costs stays bounded whatever the node's rate.
    #[arg(
        long,
        env = "DNSTRACE_FOLLOW_MAX",
        value_name = "N",
        default_value_t = 1000
    )]
    pub follow_max: u32,

    /// Follow at every moment, a share of the names, rather than in
    /// windows of 1 s with the device tracepoints detached between (where the
    /// budget calls for 1 lookup in 2 or fewer). Costs the kernel several
    /// times as much at high rates; the counts are exact either way.
    #[arg(long, env = "DNSTRACE_NO_FOLLOW_WINDOWS")]
    pub no_follow_windows: bool,

    /// A query without an answer is given up after this long.
    #[arg(long, env = "DNSTRACE_TIMEOUT", value_parser = humantime::parse_duration, default_value = "5500ms")]
    pub timeout: std::time::Duration,

    /// Queries followed at once before the oldest are evicted.
    #[arg(long, env = "DNSTRACE_MAX_OPEN", default_value_t = 65_536)]
    pub max_open: usize,

    /// Once every hook is attached, write a JSON object here; removed at exit.
    #[arg(long, value_name = "PATH")]
    pub ready_file: Option<PathBuf>,

    #[command(flatten)]
    pub otlp: OtlpArgs,

    /// Traces, and log records, waiting for the collector, at most (each);
    /// past it they are dropped and counted (`dnstrace_otlp_dropped_total`).
    #[arg(long, env = "DNSTRACE_OTLP_QUEUE", value_name = "N", default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub otlp_queue: u64,

    /// Memory for the flight recorder: the most recent DNS packets and
    /// pipeline inputs, written to --flight-dir when an anomaly is first
    /// raised (a number of megabytes, or bytes with k, M or G). 16M holds
    /// about 5,000 lookups (8 packets each): a minute of a node doing 100
    /// lookups a second.
    #[arg(long, env = "DNSTRACE_FLIGHT_RECORDER", value_name = "SIZE", default_value = "16M", value_parser = parse_size)]
    pub flight_recorder: u64,

    /// No flight recorder.
    #[arg(long, env = "DNSTRACE_NO_FLIGHT_RECORDER")]
    pub no_flight_recorder: bool,

    /// Where cluster views (`dnstrace cluster`) reach this node's
    /// evidence, over gRPC: mutual TLS with --api-cert, --api-key and
    /// --api-ca (default 0.0.0.0:9356), or loopback only without them
    /// (default 127.0.0.1:9356).
    #[arg(long, env = "DNSTRACE_API_ADDR", value_name = "ADDR:PORT")]
    pub api_addr: Option<std::net::SocketAddr>,

    /// The agent's certificate for the API (PEM).
    #[arg(long, env = "DNSTRACE_API_CERT", value_name = "FILE", requires_all = ["api_key", "api_ca"])]
    pub api_cert: Option<PathBuf>,

    /// The key of --api-cert (PEM).
    #[arg(
        long,
        env = "DNSTRACE_API_KEY",
        value_name = "FILE",
        requires = "api_cert"
    )]
    pub api_key: Option<PathBuf>,

    /// The CA whose certificates the API's viewers must present (PEM).
    #[arg(
        long,
        env = "DNSTRACE_API_CA",
        value_name = "FILE",
        requires = "api_cert"
    )]
    pub api_ca: Option<PathBuf>,

    /// No API for cluster views.
    #[arg(long, env = "DNSTRACE_NO_API", conflicts_with_all = ["api_addr", "api_cert"])]
    pub no_api: bool,

    /// Where flight recordings go (pcapng, mode 0600, read by `dnstrace
    /// replay` and `report`).
    #[arg(
        long,
        env = "DNSTRACE_FLIGHT_DIR",
        value_name = "DIR",
        default_value = "/var/lib/dnstrace/flights"
    )]
    pub flight_dir: PathBuf,

    /// At most this much before the anomaly is kept (within the memory).
    #[arg(long, env = "DNSTRACE_FLIGHT_BEFORE", value_parser = humantime::parse_duration, default_value = "5m")]
    pub flight_before: std::time::Duration,

    /// How long a flight recording goes on after its anomaly.
    #[arg(long, env = "DNSTRACE_FLIGHT_AFTER", value_parser = humantime::parse_duration, default_value = "2m")]
    pub flight_after: std::time::Duration,

    /// How often the service proxy's rules are read again, for the names
    /// of services made since (pods' come from the CRI as they change).
    #[arg(long, env = "DNSTRACE_REREAD_SERVICES", value_parser = humantime::parse_duration, default_value = "60s")]
    pub reread_services: std::time::Duration,

    /// Flight recordings kept in --flight-dir; the oldest go.
    #[arg(long, env = "DNSTRACE_FLIGHT_FILES", value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub flight_files: u64,
}

/// OTLP export, with the OpenTelemetry specification's variables. Each
/// also per signal (`OTEL_EXPORTER_OTLP_TRACES_*`, `…_LOGS_*`), which
/// wins over the general setting, flag or variable (docs/AGENT.md).
#[derive(clap::Args, Debug, Clone)]
pub struct OtlpArgs {
    /// Send each journey as a trace and each anomaly as a log record to
    /// this OTLP collector: https://HOST:4317 (gRPC; HOST:4317 is TLS
    /// too, unless --otlp-insecure) or https://HOST:4318 (HTTP/protobuf,
    /// with --otlp-protocol: /v1/traces and /v1/logs are added). http://
    /// for no TLS.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// OTLP's transport: `grpc` (default) or `http/protobuf`.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_PROTOCOL", value_name = "PROTOCOL")]
    pub otlp_protocol: Option<String>,

    /// A header of every export request, `key=value`, the value
    /// percent-encoded (repeatable, or `k1=v1,k2=v2`), e.g.
    /// `authorization=Bearer%20TOKEN`.
    #[arg(
        long = "otlp-header",
        env = "OTEL_EXPORTER_OTLP_HEADERS",
        value_delimiter = ',',
        value_name = "KEY=VALUE"
    )]
    pub otlp_headers: Vec<String>,

    /// The CA to trust for an https collector (PEM); default the system's
    /// roots.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_CERTIFICATE", value_name = "FILE")]
    pub otlp_certificate: Option<String>,

    /// The client certificate shown to the collector, for mutual TLS (PEM).
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        value_name = "FILE"
    )]
    pub otlp_client_certificate: Option<String>,

    /// The key of --otlp-client-certificate (PEM).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_CLIENT_KEY", value_name = "FILE")]
    pub otlp_client_key: Option<String>,

    /// `gzip` the export requests, or `none` (default).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_COMPRESSION", value_name = "gzip|none")]
    pub otlp_compression: Option<String>,

    /// Each export request's time, connecting included, at most, in
    /// milliseconds (default 10000).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TIMEOUT", value_name = "MS")]
    pub otlp_timeout: Option<String>,

    /// A gRPC endpoint without a scheme is plain HTTP/2, not TLS.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_INSECURE", value_name = "true|false", num_args = 0..=1, default_missing_value = "true")]
    pub otlp_insecure: Option<String>,
}

impl OtlpArgs {
    /// The general settings, for the otlp layer to resolve with each
    /// signal's variables.
    fn general(self) -> otlp::config::General {
        // An empty variable is an unset one, as the SDKs have it.
        let set = |v: Option<String>| v.filter(|v| !v.is_empty());
        otlp::config::General {
            endpoint: set(self.otlp_endpoint),
            protocol: set(self.otlp_protocol),
            headers: self.otlp_headers,
            certificate: set(self.otlp_certificate),
            client_certificate: set(self.otlp_client_certificate),
            client_key: set(self.otlp_client_key),
            compression: set(self.otlp_compression),
            timeout: set(self.otlp_timeout),
            insecure: set(self.otlp_insecure),
        }
    }
}

/// The kernel's host name: a node's name unless the kubelet was told
/// another (then NODE_NAME, from the downward API, says it).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

/// `--log-format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl AgentArgs {
    /// What the agent is asked for, in the options of the layers; a bad
    /// OTLP setting is an error naming it.
    pub fn agent_options(self) -> anyhow::Result<AgentOptions> {
        let node = self
            .node_name
            .or_else(|| self.node.clone())
            .unwrap_or_else(hostname);
        let (traces, logs) =
            otlp::config::resolve(&self.otlp.general(), |name| std::env::var(name).ok())?;
        let otlp = (traces.is_some() || logs.is_some()).then(|| OtlpOptions {
            traces,
            logs,
            node: node.clone(),
            queue: self.otlp_queue as usize,
            batch: 512,
        });
        Ok(AgentOptions {
            trace: TraceOptions {
                probes: ProbeOptions {
                    ports: self.ports,
                    ring_buffer_mib: self.ring_buffer_mib,
                    count_lookups: true,
                    cgroup_root: self.cgroup_root,
                    ..ProbeOptions::default()
                },
                target: target::Query {
                    pod: None,
                    netns: None,
                    pid: None,
                    ip: None,
                    node_netns: self.node_netns,
                    runtime: self.runtime.dirs(),
                    cri_socket: self.runtime.cri_socket,
                    node: self.node,
                },
                sample: self.sample,
                sample_seed: self.sample_seed,
                follow_max: self.follow_max,
                follow_windows: !self.no_follow_windows,
                tick: agent::TICK,
                record: None,
                flight: (!self.no_flight_recorder).then(|| FlightOptions {
                    dir: self.flight_dir,
                    bytes: self.flight_recorder as usize,
                    before_ns: self.flight_before.as_nanos() as u64,
                    after_ns: self.flight_after.as_nanos() as u64,
                    files: self.flight_files as usize,
                    node: node.clone(),
                    latest: Arc::default(),
                }),
                live: None,
                discard_events: false,
                format: match self.log_format {
                    LogFormat::Text => Format::Text,
                    LogFormat::Json => Format::Json,
                },
                log_file: None,
                ready_file: self.ready_file,
            },
            limits: Limits {
                timeout_ns: self.timeout.as_nanos() as u64,
                max_open: self.max_open,
                ..Limits::default()
            },
            listen: self.metrics_addr,
            web_config: self.web_config_file,
            api: (!self.no_api)
                .then(|| api_options(self.api_addr, self.api_cert, self.api_key, self.api_ca)),
            services_every: self.reread_services,
            otlp,
            metrics: MetricsOptions {
                max_series: self.max_series as usize,
                series_ttl_ns: self.series_ttl.as_nanos() as u64,
                query_names: self.metrics_query_names,
                node,
            },
        })
    }
}

/// The ports that count as DNS where a stream or capture does not say
/// (replay, report, cluster).
#[derive(clap::Args, Debug)]
pub struct DnsPorts {
    /// Ports that count as DNS in captures without dnstrace's notes
    /// (repeatable, or `53,5353`).
    #[arg(
        short,
        long = "port",
        value_delimiter = ',',
        value_name = "PORT",
        default_value = "53"
    )]
    pub ports: Vec<u16>,
}

#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    /// The agents: `ADDR[:PORT]`s, or a name whose addresses are theirs
    /// (the DaemonSet's headless Service), port 9356 unless given.
    #[arg(
        long,
        env = "DNSTRACE_AGENTS",
        value_delimiter = ',',
        value_name = "ADDR|NAME",
        default_value = "127.0.0.1"
    )]
    pub agents: Vec<String>,

    /// The pod whose lookups are followed: `[namespace/]name`.
    #[arg(long, value_name = "POD")]
    pub pod: Option<String>,

    /// A client address whose lookups are followed (repeatable).
    #[arg(long, value_name = "IP")]
    pub ip: Vec<std::net::IpAddr>,

    /// A node: the lookups of every pod on it (its resolvers' aside); with
    /// --pod, the node the pod is looked for on.
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,

    /// Start this far in the past, as far as the agents' memory (their
    /// flight recorders') reaches, e.g. 5m.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub since: std::time::Duration,

    /// The viewer's certificate (PEM), signed by the CA the agents trust;
    /// in an agent's pod, the agent's own.
    #[arg(long, env = "DNSTRACE_API_CERT", value_name = "FILE", requires_all = ["key", "ca"])]
    pub cert: Option<PathBuf>,

    /// The key of --cert (PEM).
    #[arg(long, env = "DNSTRACE_API_KEY", value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,

    /// The CA that signs the agents' certificates (PEM).
    #[arg(long, env = "DNSTRACE_API_CA", value_name = "FILE", requires = "cert")]
    pub ca: Option<PathBuf>,

    /// The name the agents' certificates are made out to: they are
    /// reached by address.
    #[arg(
        long,
        env = "DNSTRACE_API_SERVER_NAME",
        default_value = "dnstrace-agent"
    )]
    pub server_name: String,

    /// How long the view waits for a node that lags before it goes on.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub window: std::time::Duration,

    #[command(flatten)]
    pub ports: DnsPorts,

    /// Output format; without it, on a terminal, the live view.
    #[arg(short, long, value_enum)]
    pub output: Option<Format>,

    /// Lines even on a terminal: no live view.
    #[arg(long)]
    pub no_tui: bool,

    /// Where log lines go (default: stderr; with the live view, a new
    /// dnstrace-PID.log in the temporary directory).
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,

    /// Once every node's stream is open, write a JSON object here
    /// (`{"event":"ready","nodes":[…]}`); removed at exit.
    #[arg(long, value_name = "PATH")]
    pub ready_file: Option<PathBuf>,

    /// Record the merged view to this pcapng file, every node's evidence
    /// on one time line; `dnstrace replay FILE` shows the same journeys.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
}

impl ClusterArgs {
    pub fn cluster_options(self) -> ClusterOptions {
        let tls = match (self.cert, self.key, self.ca) {
            (Some(cert), Some(key), Some(ca)) => Some(ClientTls {
                cert,
                key,
                ca,
                server_name: self.server_name,
            }),
            _ => None,
        };
        ClusterOptions {
            agents: self.agents,
            pod: self.pod,
            ips: self.ip,
            node: self.node,
            since: self.since,
            tls,
            window: self.window,
            ports: self.ports.ports,
            live: live(self.output, self.no_tui),
            output: self.output,
            log_file: self.log_file,
            ready_file: self.ready_file,
            record: self.record,
        }
    }
}

/// The API's options: mutual TLS on every address, or loopback only.
fn api_options(
    addr: Option<std::net::SocketAddr>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
) -> ApiOptions {
    let tls = match (cert, key, ca) {
        (Some(cert), Some(key), Some(ca)) => Some(TlsFiles { cert, key, ca }),
        _ => None,
    };
    let any: std::net::IpAddr = if tls.is_some() {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv4Addr::LOCALHOST.into()
    };
    ApiOptions {
        listen: addr.unwrap_or((any, api::PORT).into()),
        tls,
    }
}

/// `--tc-attach`, the probes' AttachMode.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum TcAttach {
    Auto,
    Tcx,
    Netlink,
}

impl From<TcAttach> for AttachMode {
    fn from(t: TcAttach) -> Self {
        match t {
            TcAttach::Auto => Self::Auto,
            TcAttach::Tcx => Self::Tcx,
            TcAttach::Netlink => Self::Netlink,
        }
    }
}

/// Where the container runtimes keep their state; a missing one is skipped.
#[derive(clap::Args, Debug, Clone)]
pub struct RuntimeArgs {
    /// containerd's state directory (`state` in config.toml).
    #[arg(long, value_name = "PATH", default_value = pods::CONTAINERD_ROOT)]
    pub containerd_root: PathBuf,
    /// CRI-O's containers/storage run root (`runroot` in storage.conf).
    #[arg(long, value_name = "PATH", default_value = pods::CRIO_ROOT)]
    pub crio_root: PathBuf,
    /// The runtime's CRI socket, asked for the pods' labels and
    /// workload (default: containerd's /run/containerd/containerd.sock,
    /// then CRI-O's /var/run/crio/crio.sock, where they exist).
    #[arg(long, value_name = "PATH")]
    pub cri_socket: Option<PathBuf>,
}

/// `20` (megabytes, as tcpdump -C), `64k`, `10M`, `1G`.
fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, "M"),
    };
    let unit = match unit {
        "k" | "K" => 1 << 10,
        "M" | "m" => 1 << 20,
        "G" | "g" => 1 << 30,
        _ => {
            return Err(format!(
                "{s:?}: a size is a number with an optional k, M or G"
            ))
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?}: a size is a number with an optional k, M or G"))?;
    match n.checked_mul(unit) {
        Some(bytes) if bytes >= 4096 => Ok(bytes),
        _ => Err(format!("{s:?}: at least 4k, at most a few G")),
    }
}

impl CaptureArgs {
    /// The live view: on a terminal, unless lines were asked for.
    pub fn live(&self) -> bool {
        live(self.output, self.no_tui)
    }

    /// What `trace` is asked for, in the options of the layers that do it.
    pub fn trace_options(self) -> TraceOptions {
        TraceOptions {
            probes: ProbeOptions {
                ifaces: self.ifaces,
                ports: self.ports,
                ring_buffer_mib: self.ring_buffer_mib,
                attach: self.tc_attach.into(),
                debug_bpf: self.debug_bpf,
                ..ProbeOptions::default()
            },
            target: target::Query {
                pod: self.pod,
                netns: self.netns,
                pid: self.pid,
                ip: self.ip,
                node_netns: self.node_netns,
                runtime: self.runtime.dirs(),
                cri_socket: self.runtime.cri_socket,
                node: self.node,
            },
            sample: self.sample,
            sample_seed: self.sample_seed,
            follow_max: 0,
            follow_windows: false,
            tick: trace::TICK,
            record: self.record.map(|path| RecordOptions {
                path,
                max_bytes: self.record_size,
                files: self.record_files,
            }),
            flight: None,
            live: None,
            discard_events: false,
            format: self.output.unwrap_or(Format::Text),
            log_file: self.log_file,
            ready_file: self.ready_file,
        }
    }
}

/// The live view: on a terminal, unless lines were asked for.
pub fn live(output: Option<Format>, no_tui: bool) -> bool {
    use std::io::IsTerminal as _;
    output.is_none() && !no_tui && std::io::stdout().is_terminal()
}

impl RuntimeArgs {
    pub fn dirs(&self) -> pods::RuntimeDirs {
        pods::RuntimeDirs {
            containerd: self.containerd_root.clone(),
            crio: self.crio_root.clone(),
        }
    }
}

/// A node's name: not empty, no space.
fn parse_node(s: &str) -> Result<String, String> {
    if s.is_empty() || s.contains(char::is_whitespace) {
        return Err(format!(
            "{s:?}: a node's name, as `kubectl get nodes` shows it"
        ));
    }
    Ok(s.to_owned())
}

fn parse_ring_mib(s: &str) -> Result<u32, String> {
    let n: u32 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of MiB"))?;
    if n == 0 || !n.is_power_of_two() || n > 1024 {
        return Err(format!("{n} MiB: use a power of two between 1 and 1024"));
    }
    Ok(n)
}

fn parse_sample(s: &str) -> Result<SampleMode, String> {
    if s == "auto" {
        return Ok(SampleMode::Auto);
    }
    match s.parse::<u32>() {
        Ok(n) if n.is_power_of_two() && n <= 1 << dnstrace_common::sample::MAX_SHIFT => {
            Ok(SampleMode::Fixed(n.trailing_zeros()))
        }
        _ => Err(format!(
            "`{s}`: use auto, or a power of two from 1 (every lookup) to 1024"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_is_auto_or_a_power_of_two() {
        assert_eq!(parse_sample("auto"), Ok(SampleMode::Auto));
        assert_eq!(parse_sample("1"), Ok(SampleMode::Fixed(0)));
        assert_eq!(parse_sample("8"), Ok(SampleMode::Fixed(3)));
        assert_eq!(parse_sample("1024"), Ok(SampleMode::Fixed(10)));
        for bad in ["0", "3", "2048", "half", "-2"] {
            assert!(parse_sample(bad).is_err(), "{bad}");
        }
        let defaults = Cli::parse_from(["dnstrace"]).capture;
        assert_eq!(defaults.sample, SampleMode::Auto);
    }

    /// `dnstrace check` attaches with the probes' defaults: they must be
    /// what a plain `dnstrace` attaches with.
    #[test]
    fn the_command_line_defaults_are_the_probes_defaults() {
        let options = Cli::parse_from(["dnstrace"]).capture.trace_options();
        assert_eq!(options.probes, ProbeOptions::default());
    }

    #[test]
    fn node_scopes_trace_and_names_the_agent() {
        let trace = Cli::try_parse_from(["dnstrace", "trace", "--node", "n-2"]).unwrap();
        let Some(Command::Trace { capture, .. }) = trace.command else {
            panic!("not the trace command");
        };
        assert_eq!(capture.trace_options().target.node.as_deref(), Some("n-2"));
        assert!(Cli::try_parse_from(["dnstrace", "--node", ""]).is_err());
        let agent = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["dnstrace", "agent"], args].concat()).unwrap();
            let Some(Command::Agent(a)) = cli.command else {
                panic!("not the agent command");
            };
            a.agent_options().unwrap()
        };
        let o = agent(&["--node", "n-2"]);
        assert_eq!(o.metrics.node, "n-2");
        assert_eq!(o.trace.target.node.as_deref(), Some("n-2"));
        let named = agent(&["--node", "n-2", "--node-name", "other"]);
        assert_eq!(named.metrics.node, "other");
    }

    #[test]
    fn ring_buffer_size_must_be_a_power_of_two() {
        assert_eq!(parse_ring_mib("8"), Ok(8));
        assert!(parse_ring_mib("3").is_err());
        assert!(parse_ring_mib("0").is_err());
        assert!(parse_ring_mib("x").is_err());
    }

    #[test]
    fn ports_repeat_and_lab_is_a_subcommand() {
        assert!(Cli::try_parse_from(["dnstrace", "lab", "up", "--fault", "bridge-nf-off"]).is_ok());
        assert!(Cli::try_parse_from(["dnstrace", "lab", "up", "--fault", "nope"]).is_err());
        let cli = Cli::try_parse_from(["dnstrace", "-i", "eth0", "--port", "53", "--port", "5353"])
            .unwrap();
        assert_eq!(cli.capture.ports, vec![53, 5353]);
        let cli = Cli::try_parse_from(["dnstrace", "-p", "53,5353"]).unwrap();
        assert_eq!(cli.capture.ports, vec![53, 5353]);
        let replay = Cli::try_parse_from(["dnstrace", "replay", "f", "-p", "53,5353", "-p", "54"]);
        let Some(Command::Replay { ports, .. }) = replay.unwrap().command else {
            panic!("not the replay command");
        };
        assert_eq!(ports.ports, vec![53, 5353, 54]);
    }

    #[test]
    fn pods_takes_runtime_roots_with_defaults() {
        let cli =
            Cli::try_parse_from(["dnstrace", "pods", "--crio-root", "/x", "-o", "json", "web"])
                .unwrap();
        let Some(Command::Pods {
            query,
            runtime,
            output,
            ..
        }) = cli.command
        else {
            panic!("not the pods command");
        };
        assert_eq!(query.as_deref(), Some("web"));
        assert_eq!(output, Format::Json);
        let dirs = runtime.dirs();
        assert_eq!(dirs.containerd, PathBuf::from("/run/containerd"));
        assert_eq!(dirs.crio, PathBuf::from("/x"));
    }
}
