//! `dnstrace lab traffic`: lookups from the client pods the way applications
//! make them, and what each application saw (answer, error, time taken).
use std::{
    fs::File,
    io::Write as _,
    net::{SocketAddr, UdpSocket},
    sync::{mpsc, Arc, Barrier, Condvar, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use hickory_proto::{
    op::Message,
    rr::{Name, RecordType},
};
use serde::Serialize;

use super::{
    dnswire::{
        candidates, classify, io_reason, parse_resolv_conf, query, random_id, tcp_ask, Pair,
        ResolvConf,
    },
    libc_clients::{glibc_exchange, musl_candidates, musl_exchange, Glibc},
    plan::{Domain, Pod, Role},
    Fault, LabState,
};
use crate::output::Format;

#[derive(clap::Args, Debug)]
pub struct TrafficArgs {
    /// Client pod to send from, `namespace/name` or a prefix (repeatable; default: every client pod).
    #[arg(long = "pod")]
    pods: Vec<String>,
    /// Name to look up (repeatable; default: a mix of cluster and external names).
    #[arg(long = "name")]
    names: Vec<String>,
    /// Lookups started per second, per pod.
    #[arg(long, default_value_t = 2.0)]
    rate: f64,
    /// Keep going this long (e.g. 30s, 2m); default: each name once per pod.
    /// A lookup due while 256 of the pod's are in flight is skipped.
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "count")]
    duration: Option<Duration>,
    /// Make this many lookups per pod, at most --rate a second: while 256
    /// are in flight, the next waits for one to end, so that none is
    /// skipped however slow the answers.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Who makes the lookups: a glibc-like stub resolver, dig, or the retry
    /// habits of glibc or musl (see lab/libc_clients.rs).
    #[arg(long, value_enum, default_value_t = Client::Stub)]
    client: Client,
    /// With `--client glibc`: resolv.conf's `options single-request-reopen`.
    #[arg(long)]
    single_request_reopen: bool,
    /// Every query over TCP, as with resolv.conf's `options use-vc` (dig: +tcp).
    #[arg(long)]
    tcp: bool,
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    output: Format,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Client {
    Stub,
    Dig,
    Glibc,
    Musl,
}

/// How each lookup is made.
#[derive(Clone, Copy, Debug)]
struct How {
    client: Client,
    /// The `conntrack-race` fault: A and AAAA sent from two CPUs at once.
    race: bool,
    tcp: bool,
    glibc: Glibc,
}

/// A mix of cluster and external names, one fully qualified in `domain`.
fn default_names(domain: &Domain) -> Vec<String> {
    let fqdn = format!("kube-dns.kube-system.svc.{domain}");
    [
        "kubernetes.default",
        &fqdn,
        "db.default",
        "www.example.com",
        "chain.example.com",
        "many.example.com",
        "nosuchname.example.com",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// At most this many lookups in flight per pod (each may wait 10 s).
const MAX_IN_FLIGHT: usize = 256;

/// What the application saw.
#[derive(Serialize, Debug, Clone)]
pub struct Outcome {
    pub pod: String,
    pub name: String,
    pub ok: bool,
    pub addresses: Vec<String>,
    pub error: Option<String>,
    /// The search-list candidate that produced the answer or the last error.
    pub last_name: String,
    pub queries: u32,
    pub elapsed_ms: f64,
}

pub fn run(args: TrafficArgs) -> Result<()> {
    let state = LabState::load()?;
    let pods: Vec<Pod> = if args.pods.is_empty() {
        super::client_pods(&state)
    } else {
        args.pods
            .iter()
            .map(|p| super::find_pod(&state, p).with_context(|| format!("no lab pod named {p:?}")))
            .collect::<Result<_>>()?
    };
    if !state.host_client && pods.iter().any(|p| p.role == Role::HostClient) {
        bail!("the lab has no hostNetwork client: bring it up with `dnstrace lab up --host-network-client`");
    }
    if !(args.rate > 0.0 && args.rate <= 10_000.0) {
        bail!(
            "--rate {}: use a number of lookups per second between 0 and 10000",
            args.rate
        );
    }
    let names: Vec<String> = if args.names.is_empty() {
        default_names(&state.cluster_domain)
    } else {
        args.names.clone()
    };
    let how = How {
        client: args.client,
        race: state.faults.contains(&Fault::ConntrackRace),
        tcp: args.tcp,
        glibc: if args.single_request_reopen {
            Glibc::SingleRequestReopen
        } else {
            Glibc::Default
        },
    };
    let (tx, rx) = mpsc::channel();
    let mut drivers = Vec::new();
    let until = match (args.duration, args.count) {
        (Some(d), _) => Until::Elapsed(d),
        (_, Some(n)) => Until::Made(n as usize),
        (None, None) => Until::Made(names.len()),
    };
    for pod in pods {
        let (tx, names) = (tx.clone(), names.clone());
        let rate = args.rate;
        let ns = pod.netns();
        drivers.push(std::thread::spawn(move || -> Result<()> {
            enter_netns(&ns)?;
            drive(&pod, &names, rate, until, how, tx);
            Ok(())
        }));
    }
    drop(tx);
    let summary = report(rx, args.output)?;
    for d in drivers {
        d.join()
            .map_err(|_| anyhow::anyhow!("a traffic thread panicked"))??;
    }
    log::info!(target: "traffic", "{summary}");
    Ok(())
}

fn report(rx: mpsc::Receiver<Outcome>, format: Format) -> Result<String> {
    let (mut ok, mut failed) = (0, 0);
    let mut out = std::io::stdout().lock();
    for o in rx {
        if o.ok {
            ok += 1;
        } else {
            failed += 1;
        }
        let line = match format {
            Format::Json => serde_json::to_string(&o)?,
            Format::Text => text_line(&o),
        };
        writeln!(out, "{line}")?;
    }
    Ok(format!(
        "{} lookups, {ok} answered, {failed} failed",
        ok + failed
    ))
}

fn text_line(o: &Outcome) -> String {
    let result = if o.ok {
        // The JSON output keeps them all.
        let shown = o
            .addresses
            .iter()
            .take(4)
            .cloned()
            .collect::<Vec<_>>()
            .join(" ");
        match o.addresses.len() {
            n if n > 4 => format!("→ {shown} (+{} more)", n - 4),
            _ => format!("→ {shown}"),
        }
    } else {
        format!("FAILED {}", o.error.as_deref().unwrap_or("?"))
    };
    format!(
        "{:<38} {:<40} {result}  ({:.1} ms, {} queries, last {})",
        o.pod, o.name, o.elapsed_ms, o.queries, o.last_name
    )
}

/// Moves this thread into a lab namespace; threads it spawns stay there too.
fn enter_netns(ns: &str) -> Result<()> {
    let f = File::open(format!("/run/netns/{ns}"))
        .with_context(|| format!("opening namespace {ns}"))?;
    crate::netns::enter(&f).with_context(|| format!("entering namespace {ns}"))
}

/// When a pod's lookups end.
#[derive(Clone, Copy, Debug)]
enum Until {
    /// Past this time: one due at the cap of lookups in flight is skipped,
    /// as an open-loop load drops what it cannot send.
    Elapsed(Duration),
    /// This many made: one due at the cap waits for room.
    Made(usize),
}

/// The lookups of a pod in flight, up to `MAX_IN_FLIGHT`.
#[derive(Default)]
struct InFlight {
    count: Mutex<usize>,
    ended: Condvar,
}

impl InFlight {
    /// Takes room for one more; with `wait`, waits for it, else fails at
    /// the cap.
    fn take(&self, wait: bool) -> bool {
        let mut n = self.count.lock().unwrap_or_else(|e| e.into_inner());
        while *n >= MAX_IN_FLIGHT {
            if !wait {
                return false;
            }
            n = self.ended.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        *n += 1;
        true
    }

    fn end(&self) {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        self.ended.notify_one();
    }
}

fn drive(
    pod: &Pod,
    names: &[String],
    rate: f64,
    until: Until,
    how: How,
    tx: mpsc::Sender<Outcome>,
) {
    let start = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let in_flight = Arc::new(InFlight::default());
    let mut workers = Vec::new();
    for (i, name) in names.iter().cycle().enumerate() {
        let due = start + interval.mul_f64(i as f64);
        match until {
            Until::Elapsed(d) if due > start + d => break,
            Until::Made(n) if i >= n => break,
            _ => {}
        }
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        if !in_flight.take(matches!(until, Until::Made(_))) {
            continue;
        }
        let (tx, name, in_flight, pod) = (tx.clone(), name.clone(), in_flight.clone(), *pod);
        workers.push(std::thread::spawn(move || {
            let outcome = match how.client {
                Client::Stub | Client::Glibc | Client::Musl => stub_lookup(&pod, &name, how),
                Client::Dig => dig_lookup(&pod, &name, how.tcp),
            };
            let _ = tx.send(outcome);
            in_flight.end();
        }));
        workers.retain(|w| !w.is_finished());
    }
    for w in workers {
        let _ = w.join();
    }
}

fn stub_lookup(pod: &Pod, name: &str, how: How) -> Outcome {
    let start = Instant::now();
    let rc_text = std::fs::read_to_string(pod.resolv_conf()).unwrap_or_default();
    let rc = parse_resolv_conf(&rc_text);
    let mut outcome = Outcome {
        pod: pod.full_name(),
        name: name.to_owned(),
        ok: false,
        addresses: Vec::new(),
        error: None,
        last_name: String::new(),
        queries: 0,
        elapsed_ms: 0.0,
    };
    let mut last_miss = "NXDOMAIN";
    let names = match how.client {
        Client::Musl => musl_candidates(name, &rc),
        _ => candidates(name, &rc),
    };
    for cand in names {
        outcome.last_name = cand.clone();
        let queries = &mut outcome.queries;
        let pair = match how.client {
            Client::Glibc => glibc_exchange(&rc, &cand, how.glibc, queries),
            Client::Musl => musl_exchange(&rc, &cand, queries),
            _ => exchange(&rc, &cand, how, queries),
        };
        match pair {
            Pair::Addresses(a) => {
                outcome.ok = true;
                outcome.addresses = a;
                break;
            }
            Pair::NotHere(why) => last_miss = why,
            Pair::Failed(e) => {
                outcome.error = Some(e);
                break;
            }
        }
    }
    if !outcome.ok && outcome.error.is_none() {
        outcome.error = Some(last_miss.to_owned());
    }
    outcome.elapsed_ms = start.elapsed().as_secs_f64() * 1000.0;
    outcome
}

/// A and AAAA for `name`, through the nameservers and attempts of `rc`.
fn exchange(rc: &ResolvConf, name: &str, how: How, queries: &mut u32) -> Pair {
    let mut last = String::from("no nameserver");
    for _ in 0..rc.attempts {
        for &ns in &rc.nameservers {
            match ask_pair(SocketAddr::new(ns, 53), name, rc.timeout, how, queries) {
                Ok(Some(pair)) => return pair,
                Ok(None) => last = "SERVFAIL".into(),
                Err(e) => last = e,
            }
        }
    }
    Pair::Failed(last)
}

/// One A+AAAA exchange with one server. `Ok(None)`: it answered SERVFAIL or
/// REFUSED (try the next server); `Err`: it did not answer.
fn ask_pair(
    server: SocketAddr,
    name: &str,
    wait: Duration,
    how: How,
    queries: &mut u32,
) -> Result<Option<Pair>, String> {
    let qname = Name::from_ascii(name).map_err(|e| format!("bad name {name}: {e}"))?;
    let ids = [random_id(), random_id()];
    let wire: Vec<Vec<u8>> = [RecordType::A, RecordType::AAAA]
        .iter()
        .zip(ids)
        .map(|(&t, id)| query(id, &qname, t))
        .collect();
    let replies = if how.tcp {
        // use-vc: both over TCP from the start (here one connection each).
        [
            tcp_ask(server, &wire[0], wait, queries)?,
            tcp_ask(server, &wire[1], wait, queries)?,
        ]
    } else {
        udp_pair(server, ids, &wire, wait, how.race, queries)?
    };
    Ok(classify(&replies))
}

/// Both queries over one connected UDP socket, each retried over TCP if its
/// answer comes truncated.
fn udp_pair(
    server: SocketAddr,
    ids: [u16; 2],
    wire: &[Vec<u8>],
    wait: Duration,
    race: bool,
    queries: &mut u32,
) -> Result<[Message; 2], String> {
    let bind: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let sock = UdpSocket::bind(bind).map_err(|e| e.to_string())?;
    // Connected, like glibc: replies from another source never reach us.
    sock.connect(server).map_err(|e| e.to_string())?;
    *queries += 2;
    send_both(&sock, wire, race).map_err(io_reason)?;
    let mut replies: [Option<Message>; 2] = [None, None];
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 4096];
    while replies.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("timeout".into());
        }
        sock.set_read_timeout(Some(left))
            .map_err(|e| e.to_string())?;
        let n = sock.recv(&mut buf).map_err(io_reason)?;
        let Ok(msg) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let Some(slot) = ids.iter().position(|&id| id == msg.id()) else {
            continue;
        };
        let msg = if msg.truncated() {
            tcp_ask(server, &wire[slot], wait, queries)?
        } else {
            msg
        };
        replies[slot] = Some(msg);
    }
    Ok(replies.map(|r| r.expect("both replies present")))
}

/// Sends both queries back to back; with the race fault, from two threads
/// pinned to different CPUs at the same instant.
fn send_both(sock: &UdpSocket, wire: &[Vec<u8>], race: bool) -> std::io::Result<()> {
    if !race {
        for q in wire {
            sock.send(q)?;
        }
        return Ok(());
    }
    let barrier = Arc::new(Barrier::new(2));
    let threads: Vec<_> = wire
        .iter()
        .enumerate()
        .map(|(cpu, q)| {
            let (sock, q, barrier) = (sock.try_clone(), q.clone(), barrier.clone());
            std::thread::spawn(move || -> std::io::Result<()> {
                pin_to_cpu(cpu);
                let sock = sock?;
                barrier.wait();
                sock.send(&q).map(drop)
            })
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| std::io::Error::other("sender thread panicked"))??;
    }
    Ok(())
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, applied to this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu % num_cpus(), &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// dig in the pod, with the pod's resolv.conf (search list included).
fn dig_lookup(pod: &Pod, name: &str, tcp: bool) -> Outcome {
    let start = Instant::now();
    let mut dig = if pod.role == Role::HostClient {
        super::sys::with_resolv_conf(&pod.netns(), &pod.resolv_conf(), "dig")
    } else {
        let mut cmd = std::process::Command::new("ip");
        cmd.args(["netns", "exec", &pod.netns(), "dig"]);
        cmd
    };
    let out = dig
        .args(tcp.then_some("+tcp"))
        .args(["+search", "+tries=2", "+time=5", name, "A"])
        .output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let status = text
        .lines()
        .find_map(|l| l.split("status: ").nth(1))
        .and_then(|s| s.split(',').next())
        .map(str::to_owned);
    let addresses: Vec<String> = text
        .split(";; ANSWER SECTION:")
        .nth(1)
        .map(|sec| {
            // The marker's own line ends first; the records follow it.
            sec.lines()
                .skip(1)
                .take_while(|l| !l.is_empty())
                .filter_map(|l| l.split_whitespace().nth(4))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let ok = status.as_deref() == Some("NOERROR") && !addresses.is_empty();
    Outcome {
        pod: pod.full_name(),
        name: name.to_owned(),
        ok,
        addresses,
        error: (!ok).then(|| status.unwrap_or_else(|| "timeout".into())),
        last_name: name.to_owned(),
        queries: 0,
        elapsed_ms: start.elapsed().as_secs_f64() * 1000.0,
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    fn rc() -> ResolvConf {
        parse_resolv_conf("nameserver 10.96.0.10\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5 timeout:2\n")
    }

    #[test]
    fn parses_kubelet_resolv_conf() {
        let rc = rc();
        assert_eq!(
            rc.nameservers,
            vec!["10.96.0.10".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(rc.search.len(), 3);
        assert_eq!(
            (rc.ndots, rc.timeout, rc.attempts),
            (5, Duration::from_secs(2), 2)
        );
    }

    #[test]
    fn ndots_decides_search_order() {
        let rc = rc();
        assert_eq!(
            candidates("www.example.com", &rc),
            vec![
                "www.example.com.default.svc.cluster.local.",
                "www.example.com.svc.cluster.local.",
                "www.example.com.cluster.local.",
                "www.example.com."
            ]
        );
        let few = ResolvConf { ndots: 2, ..rc };
        assert_eq!(candidates("www.example.com", &few)[0], "www.example.com.");
        assert_eq!(candidates("fqdn.example.", &few), vec!["fqdn.example."]);
    }
}
