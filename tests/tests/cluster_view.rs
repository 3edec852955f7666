//! `dnstrace cluster` on the 3-node lab: one agent per node, each serving
//! its node's evidence over its API, and one view of web's lookups whole
//! across the nodes, live.
use std::{process::Command, time::Duration};

use serde_json::Value;

use dnstrace_tests::{prometheus::free_port, *};

/// node1's client.
const WEB_IP: &str = "10.244.1.10";
/// node2's client.
const CHECKOUT_IP: &str = "10.244.2.10";
/// The CoreDNS pod on node3.
const COREDNS_ON_NODE3: &str = "10.244.3.53";
const NAME: &str = "kube-dns.kube-system.svc.cluster.local";

/// One agent per node, each scoped to its node, serving cluster views.
struct Agents {
    running: Vec<Option<Dnstrace>>,
    /// Each one's API and metrics addresses.
    apis: Vec<String>,
    metrics: Vec<String>,
    extra: Vec<String>,
    keep: Keep,
}

impl Agents {
    /// Agents that keep every lookup.
    fn start(extra: &[&str]) -> Self {
        Self::start_keeping(Keep::Every, extra)
    }

    fn start_keeping(keep: Keep, extra: &[&str]) -> Self {
        let apis = (0..3).map(|_| format!("127.0.0.1:{}", free_port()));
        Self::start_at(keep, apis.collect(), extra)
    }

    /// Agents whose APIs listen at `apis`.
    fn start_at(keep: Keep, apis: Vec<String>, extra: &[&str]) -> Self {
        let addr = || format!("127.0.0.1:{}", free_port());
        let mut agents = Self {
            running: Vec::new(),
            apis,
            metrics: (0..3).map(|_| addr()).collect(),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            keep,
        };
        agents.running = (1..=3).map(|n| Some(agents.spawn(n))).collect();
        agents
    }

    fn spawn(&self, n: u8) -> Dnstrace {
        let i = usize::from(n) - 1;
        let mut args: Vec<String> = ["agent", "--metrics-addr", &self.metrics[i]]
            .map(String::from)
            .to_vec();
        args.extend(["--api-addr".into(), self.apis[i].clone()]);
        args.extend(node_flags(n));
        args.extend(self.extra.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Dnstrace::start_here(self.keep, &args).unwrap()
    }

    fn list(&self) -> String {
        self.apis.join(",")
    }

    fn stop(self) {
        for agent in self.running.into_iter().flatten() {
            let (status, _, stderr) = agent.stop(libc::SIGTERM).unwrap();
            assert!(status.success(), "{status}: {stderr:?}");
        }
    }
}

/// `dnstrace cluster` of web's lookups over `agents`, as JSON lines.
fn view(agents: &Agents, extra: &[&str]) -> Dnstrace {
    let pod = format!("default/{}", WEB.pod());
    let mut args = vec!["--pod", &pod];
    args.extend_from_slice(extra);
    view_of(agents, &args)
}

/// `dnstrace cluster` over `agents` as JSON lines, following `args`.
fn view_of(agents: &Agents, args: &[&str]) -> Dnstrace {
    let list = agents.list();
    // A reorder window long enough for an agent held up on a busy
    // machine: what is shown is then in order whatever the load.
    let mut all = vec!["cluster", "--agents", &list, "-o", "json", "--window", "5s"];
    all.extend_from_slice(args);
    Dnstrace::start_here(Keep::Sampled, &all).unwrap()
}

/// A journey of web's lookup `id`.
fn is_lookup(j: &Value, id: u16) -> bool {
    is_lookup_from(j, id, WEB_IP)
}

/// A journey of the lookup `id` of the client at `ip`.
fn is_lookup_from(j: &Value, id: u16, ip: &str) -> bool {
    j["type"] == "journey"
        && j["dns_id"] == id
        && j["name"] == format!("{NAME}.")
        && j["client"]
            .as_str()
            .is_some_and(|c| c.starts_with(&format!("{ip}:")))
}

fn nodes_of(j: &Value) -> Vec<String> {
    j["legs"]
        .as_array()
        .map(|legs| {
            legs.iter()
                .map(|l| l["node"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A journey whole across nodes: from node 1, through the CoreDNS pod's
/// node, back to node 1, in time order, answered.
fn assert_whole_across_nodes(j: &Value) {
    let nodes = nodes_of(j);
    assert_eq!(nodes.first().map(String::as_str), Some("node1"), "{j}");
    assert_eq!(nodes.last().map(String::as_str), Some("node1"), "{j}");
    assert!(nodes.iter().any(|n| n == "node2" || n == "node3"), "{j}");
    let legs = j["legs"].as_array().unwrap();
    let times: Vec<u64> = legs.iter().filter_map(|l| l["ts_ns"].as_u64()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{j}");
    assert_eq!(j["outcome"]["rcode"], "NOERROR", "{j}");
    assert_eq!(j["incomplete"], false, "{j}");
}

/// web looks a name up: dig's query id.
fn lookup(lab: &Lab) -> u16 {
    let out = lab.dig(&WEB, NAME);
    assert_eq!(dig_status(&out), "NOERROR", "{out}");
    dig_id(&out).expect("dig's query id")
}

/// The view shows web's lookup `id` whole across nodes within seconds.
fn shown_whole(view: &mut Dnstrace, id: u16) {
    let j = view
        .wait_stdout_for(Duration::from_secs(10), |j| is_lookup(j, id))
        .unwrap();
    assert_whole_across_nodes(&j);
}

/// Each of web's lookups is on the view within seconds of its answer,
/// whole across the nodes it crossed; the view names every node. Its
/// recording replays to the same journeys, and tshark reads it.
#[test]
fn the_cluster_view_shows_each_lookup_whole_across_nodes_as_it_happens() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let agents = Agents::start(&[]);
    let dir = Dir::new("cluster-record");
    let file = dir.file("view.pcapng").display().to_string();
    let mut view = view(&agents, &["--record", &file]);
    assert_eq!(
        view.ready["nodes"],
        serde_json::json!(["node1", "node2", "node3"])
    );
    for _ in 0..5 {
        shown_whole(&mut view, lookup(&lab));
    }
    let (status, out, stderr) = view.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    agents.stop();
    assert_clocks_found_true(&stderr);

    let live = journeys(&out);
    assert!(live.len() >= 5, "{out}");
    let replay = dnstrace(&["replay", &file, "-o", "json"]);
    assert!(replay.status.success(), "{replay:?}");
    assert_eq!(
        journeys(&String::from_utf8_lossy(&replay.stdout)),
        live,
        "the recording replays to the live view's journeys"
    );
    let legs: usize = live.iter().map(|j| nodes_of(j).len()).sum();
    let frames = run(Command::new("tshark").args(["-r", &file, "-Y", "dns"]))
        .expect("tshark reads the recording");
    assert!(frames.lines().count() >= legs, "{frames}");
}

/// The journeys of JSON lines, in the order they started.
fn journeys(out: &str) -> Vec<Value> {
    let mut js: Vec<Value> = json_lines(out)
        .into_iter()
        .filter(|j| j["type"] == "journey")
        .collect();
    js.sort_by_key(|j| (j["started_ns"].as_u64(), j["dns_id"].as_u64()));
    js
}

/// The view's last estimate of each node's clock, from the messages that
/// crossed between nodes: the lab's nodes share one kernel's clock, so
/// the truth is 0. Each lookup crossed to node 2 or 3, so one of them at
/// least was estimated. The bench finds a microsecond or so; a
/// millisecond leaves room for a machine under load.
fn assert_clocks_found_true(stderr: &[String]) {
    let clocks = stderr
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["event"] == "clocks")
        .unwrap_or_else(|| panic!("a clocks line: {stderr:?}"));
    let nodes = clocks["nodes"].as_array().unwrap();
    let estimated: Vec<&Value> = nodes
        .iter()
        .filter(|n| n["pairs"].as_u64() > Some(0))
        .collect();
    assert!(!estimated.is_empty(), "{clocks}");
    for n in estimated {
        let us = n["offset_us"].as_f64().unwrap();
        assert!(us.abs() < 1_000.0, "{clocks}");
        assert_eq!(n["against"], "node1", "{clocks}");
    }
}

/// `--since`: the view opens with lookups made before it started, from
/// the agents' memory, each as whole as if it had been watching.
#[test]
fn since_shows_the_lookups_made_before_the_view_started() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let agents = Agents::start(&[]);
    let before: Vec<u16> = (0..3).map(|_| lookup(&lab)).collect();
    let mut view = view(&agents, &["--since", "2m"]);
    for id in before {
        shown_whole(&mut view, id);
    }
    let (status, _, stderr) = view.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    agents.stop();
}

/// `--node node2`: the lookups of node 2's client, checkout (CoreDNS's pod
/// there aside), which reach node 2 and CoreDNS's other node, 3, never
/// node 1. The view asks those two agents alone, and shows each of
/// checkout's lookups whole on them.
#[test]
fn a_nodes_lookups_are_asked_of_the_nodes_they_reach_alone() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let agents = Agents::start(&[]);
    let mut view = view_of(&agents, &["--node", "node2"]);
    assert_eq!(view.ready["nodes"], serde_json::json!(["node2", "node3"]));
    for _ in 0..4 {
        let out = lab.dig(&CHECKOUT, NAME);
        assert_eq!(dig_status(&out), "NOERROR", "{out}");
        let id = dig_id(&out).expect("dig's query id");
        let j = view
            .wait_stdout_for(Duration::from_secs(10), |j| {
                is_lookup_from(j, id, CHECKOUT_IP)
            })
            .unwrap();
        let nodes = nodes_of(&j);
        assert_eq!(nodes.first().map(String::as_str), Some("node2"), "{j}");
        assert!(nodes.iter().all(|n| n == "node2" || n == "node3"), "{j}");
        assert_eq!(j["outcome"]["rcode"], "NOERROR", "{j}");
        assert_eq!(j["incomplete"], false, "{j}");
    }
    let (status, _, stderr) = view.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    agents.stop();
}

/// Every agent on a budget of a lookup a second, past it on every node
/// and so following in windows, the device tracepoints detached most of
/// the time: while the view watches web, each of web's lookups is still
/// followed whole on every node it crosses; once the view goes, the
/// agents are back on their budget alone.
#[test]
fn a_watched_pods_lookups_are_followed_whole_whatever_the_budget() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let mut agents = Agents::start_keeping(Keep::Sampled, &["--follow-max", "1"]);
    let mut traffic = Command::new(dnstrace_bin())
        .args(["lab", "traffic", "--rate", "5", "--duration", "90s"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("lab traffic");
    for agent in agents.running.iter_mut().flatten() {
        agent
            .wait_stderr_for("following in windows", Duration::from_secs(30))
            .unwrap();
    }
    let mut view = view(&agents, &[]);
    for agent in agents.running.iter_mut().flatten() {
        agent
            .wait_stderr_for(
                &format!("a cluster view watches {WEB_IP}"),
                Duration::from_secs(10),
            )
            .unwrap();
    }
    // Over several seconds: most of them while the windows are shut.
    let ids: Vec<u16> = (0..20)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(250));
            lookup(&lab)
        })
        .collect();
    for id in ids {
        shown_whole(&mut view, id);
    }
    let (status, _, stderr) = view.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    let node1 = agents.running[0].as_mut().unwrap();
    node1
        .wait_stderr_for("no cluster view now", Duration::from_secs(10))
        .unwrap();
    let _ = traffic.kill();
    let _ = traffic.wait();
    agents.stop();
}

/// A CA, and certificates it signs for the agents and a viewer (each
/// good for both ends, as the DaemonSet's one Secret is), and another CA's
/// viewer, made with openssl.
struct Certs {
    dir: Dir,
}

impl Certs {
    fn make() -> Self {
        let dir = Dir::new("certs");
        let ext = "subjectAltName=DNS:dnstrace-agent\nextendedKeyUsage=serverAuth,clientAuth\n";
        dir.certificates(&[("agent", "ca", ext), ("stranger", "other", ext)]);
        Self { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.file(name).display().to_string()
    }

    /// `--cert`/`--api-cert` style flags: certificate, key, CA.
    fn flags(&self, prefix: &str, who: &str, ca: &str) -> Vec<String> {
        vec![
            format!("--{prefix}cert"),
            self.path(&format!("{who}.pem")),
            format!("--{prefix}key"),
            self.path(&format!("{who}.key")),
            format!("--{prefix}ca"),
            self.path(&format!("{ca}.pem")),
        ]
    }
}

/// With mutual TLS, a viewer with the agents' CA's certificate sees the
/// cluster; one with none, or another CA's, is refused with a line that
/// says so; and the agents' metrics go on.
#[test]
fn mutual_tls_lets_the_cas_viewers_in_and_no_one_else() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let certs = Certs::make();
    let tls = certs.flags("api-", "agent", "ca");
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    let agents = Agents::start(&tls);
    let pod = format!("default/{}", WEB.pod());
    let refused = |flags: &[String]| {
        let mut args = vec![
            "cluster",
            "--agents",
            &agents.apis[0],
            "--pod",
            &pod,
            "-o",
            "json",
        ];
        args.extend(flags.iter().map(String::as_str));
        let out = dnstrace(&args);
        assert!(!out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let none = refused(&[]);
    assert!(none.contains("no agent answered"), "{none}");
    let stranger = refused(&certs.flags("", "stranger", "ca"));
    assert!(stranger.contains("no agent answered"), "{stranger}");
    let good = certs.flags("", "agent", "ca");
    let good: Vec<&str> = good.iter().map(String::as_str).collect();
    let mut view = view(&agents, &good);
    shown_whole(&mut view, lookup(&lab));
    for m in &agents.metrics {
        let page = run(Command::new("curl").args(["-sf", &format!("http://{m}/metrics")]))
            .expect("the agent's metrics");
        assert!(page.contains("dnstrace_lookups_total"), "{page}");
    }
    let (status, _, stderr) = view.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    agents.stop();
}

/// The agents found by name, as the headless Service gives them (here
/// from a hosts file the view alone reads): node 2's agent is killed and
/// comes back at another address, which the name gives from then on. The
/// view finds it there by the name, resumes, and shows lookups whole.
#[test]
fn an_agent_back_at_another_address_is_found_again_by_the_agents_name() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let port = free_port();
    let at = |host: u8| format!("127.0.0.{host}:{port}");
    let mut agents = Agents::start_at(Keep::Every, vec![at(11), at(12), at(13)], &[]);
    let dir = Dir::new("cluster-hosts");
    let hosts = dir.file("hosts");
    const NAME_OF_AGENTS: &str = "dnstrace-agents.dnstrace.svc.cluster.local";
    // The same length each time, written over in place: the view never
    // reads a file without the name.
    let give = |last: [u8; 3]| {
        let lines: String = last
            .iter()
            .map(|h| format!("127.0.0.{h} {NAME_OF_AGENTS}\n"))
            .collect();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&hosts)
            .unwrap();
        std::io::Write::write_all(&mut f, lines.as_bytes()).unwrap();
    };
    give([11, 12, 13]);
    let pod = format!("default/{}", WEB.pod());
    let agents_arg = format!("{NAME_OF_AGENTS}:{port}");
    let mut view = Dnstrace::start_with_hosts(
        &hosts,
        Keep::Sampled,
        &[
            "cluster",
            "--agents",
            &agents_arg,
            "-o",
            "json",
            "--window",
            "5s",
            "--pod",
            &pod,
        ],
    )
    .unwrap();
    shown_whole(&mut view, lookup(&lab));
    let gone = agents.running[1].take().unwrap();
    let _ = gone.stop(libc::SIGKILL);
    view.wait_stderr_for("node node2 is down", Duration::from_secs(10))
        .unwrap();
    agents.apis[1] = at(22);
    give([11, 22, 13]);
    agents.running[1] = Some(agents.spawn(2));
    view.wait_stderr_for(
        &format!("node node2's agent answers at {} now", at(22)),
        Duration::from_secs(20),
    )
    .unwrap();
    view.wait_stderr_for("node node2 is back", Duration::from_secs(15))
        .unwrap();
    for _ in 0..4 {
        shown_whole(&mut view, lookup(&lab));
    }
    let (status, out, stderr) = view.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    assert_eq!(summary_kinds(&out), Vec::<String>::new(), "{stderr:?}");
    agents.stop();
}

/// The anomalies of the view's summary, at exit.
fn summary_kinds(out: &str) -> Vec<String> {
    let lines = json_lines(out);
    anomaly_kinds(&lines)
}

/// Node 2's agent killed while the view runs: the view says the node is
/// down, and its absence raises nothing (lookups that crossed to it are
/// incomplete, never lost between nodes); the agent started again, the
/// view says it is back, and lookups are whole again.
#[test]
fn a_node_whose_agent_goes_is_down_raises_nothing_and_comes_back() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let mut agents = Agents::start(&[]);
    let mut view = view(&agents, &[]);
    shown_whole(&mut view, lookup(&lab));
    let gone = agents.running[1].take().unwrap();
    let _ = gone.stop(libc::SIGKILL);
    view.wait_stderr_for("node node2 is down", Duration::from_secs(10))
        .unwrap();
    // CoreDNS on node 2 answers some of these, seen from node 1 alone.
    for _ in 0..8 {
        lookup(&lab);
    }
    agents.running[1] = Some(agents.spawn(2));
    view.wait_stderr_for("node node2 is back", Duration::from_secs(15))
        .unwrap();
    for _ in 0..4 {
        shown_whole(&mut view, lookup(&lab));
    }
    let (status, out, stderr) = view.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    assert_eq!(summary_kinds(&out), Vec::<String>::new(), "{stderr:?}");
    agents.stop();
}

/// Node 3's agent is not running when the view starts: the view follows
/// the nodes that answered. Started, it is found when the view asks the
/// agents again (every 10 s), and node 3 joins the view: a lookup of
/// web's sent to node 3's CoreDNS pod is then whole, its legs there named
/// node3 and the pod named by node 3's word; the view's recording replays
/// to the same journeys, node 3's legs named.
#[test]
fn a_node_whose_agent_starts_after_the_view_joins_it() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let mut agents = Agents::start(&[]);
    let late = agents.running[2].take().unwrap();
    let (status, _, stderr) = late.stop(libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    let dir = Dir::new("cluster-join");
    let file = dir.file("view.pcapng").display().to_string();
    let mut view = view(&agents, &["--record", &file]);
    assert_eq!(view.ready["nodes"], serde_json::json!(["node1", "node2"]));
    agents.running[2] = Some(agents.spawn(3));
    view.wait_stderr_for("node node3 joins the view", Duration::from_secs(30))
        .unwrap();
    // Straight to the CoreDNS pod on node 3, not through kube-dns's pick.
    let out = lab.dig(&WEB, &format!("@{COREDNS_ON_NODE3} {NAME}"));
    assert_eq!(dig_status(&out), "NOERROR", "{out}");
    let id = dig_id(&out).expect("dig's query id");
    let j = view
        .wait_stdout_for(Duration::from_secs(10), |j| is_lookup(j, id))
        .unwrap();
    assert_whole_across_nodes(&j);
    assert!(nodes_of(&j).iter().any(|n| n == "node3"), "{j}");
    assert_eq!(
        j["names"][COREDNS_ON_NODE3],
        format!("kube-system/{COREDNS_B}"),
        "{j}"
    );
    let (status, out, stderr) = view.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    assert_eq!(summary_kinds(&out), Vec::<String>::new(), "{stderr:?}");
    assert!(
        stderr.iter().any(|l| l.contains("cluster view of 3 nodes")),
        "{stderr:?}"
    );
    agents.stop();
    let replay = dnstrace(&["replay", &file, "-o", "json"]);
    assert!(replay.status.success(), "{replay:?}");
    assert_eq!(
        journeys(&String::from_utf8_lossy(&replay.stdout)),
        journeys(&out),
        "the recording replays to the live view's journeys"
    );
}

/// web looks the name up with query id `id`: whether it was answered
/// (dig gives up after 2 s).
fn answered(lab: &Lab, id: u16) -> bool {
    let out = lab.dig(&WEB, &format!("+qid={id} {NAME}"));
    match dig_status(&out).as_str() {
        "NOERROR" => true,
        "timeout" => false,
        other => panic!("{other}: {out}"),
    }
}

/// web's lookups (query ids from 40,000), at most `tries`, until `each`
/// were answered and `each` were not: their ids, answered and not.
fn answered_and_not(lab: &Lab, tries: u16, each: usize) -> (Vec<u16>, Vec<u16>) {
    let (mut whole, mut lost) = (Vec::new(), Vec::new());
    for id in 40_000..40_000 + tries {
        if answered(lab, id) {
            whole.push(id);
        } else {
            lost.push(id);
        }
        if whole.len() >= each && lost.len() >= each {
            break;
        }
    }
    (whole, lost)
}

/// The view's lines, each kept, until `done` holds for those seen.
fn shown_until(view: &mut Dnstrace, wait: Duration, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut seen = Vec::new();
    let found = view.wait_stdout_for(wait, |line| {
        seen.push(line.clone());
        done(&seen)
    });
    if let Err(e) = found {
        panic!("{e}: {seen:?}");
    }
    seen
}

/// The live anomaly of `kind` among `lines`, if raised.
fn raised<'a>(lines: &'a [Value], kind: &str) -> Option<&'a Value> {
    lines
        .iter()
        .find(|l| l["type"] == "anomaly" && l["kind"] == kind)
}

/// The journey of web's lookup `id` among `lines`.
fn journey(lines: &[Value], id: u16) -> Option<&Value> {
    lines.iter().find(|j| is_lookup(j, id))
}

/// The CoreDNS endpoint a journey was DNATed to.
fn endpoint(j: &Value) -> &str {
    j["dnat"][1].as_str().unwrap_or("")
}

/// Node 1's VXLAN to node 3 dropped on the underlay: a lookup of web's
/// DNATed to node 3's CoreDNS is said lost between node1 and node3 as it
/// times out, while the view runs; those node 2 answers stay whole.
#[test]
fn a_lookup_lost_on_the_overlay_is_said_lost_between_its_two_nodes_live() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let agents = Agents::start(&[]);
    let mut view = view(&agents, &[]);
    shown_whole(&mut view, lookup(&lab));
    lab.fault_on("overlay-drop", true, "3");
    // kube-proxy picks an endpoint at random: until one lookup went to
    // each (twenty all to one is a one-in-500,000 chance).
    let (whole, lost) = answered_and_not(&lab, 20, 1);
    assert!(
        !whole.is_empty() && !lost.is_empty(),
        "{whole:?} answered, {lost:?} lost"
    );
    // The lost lookup's journey ends 5.5 s after its query.
    let lines = shown_until(&mut view, Duration::from_secs(30), |seen| {
        raised(seen, "lost_between_nodes").is_some()
            && whole
                .iter()
                .chain(&lost)
                .all(|&id| journey(seen, id).is_some())
    });
    lab.fault_on("overlay-drop", false, "3");
    let a = raised(&lines, "lost_between_nodes").unwrap();
    assert_eq!(
        a["summary"], "DNS queries lost between node1 and node3",
        "{a}"
    );
    // Named as the agents know them: web on node1, the CoreDNS pod on
    // node3, and node1's own namespace the query left, by its inode.
    let evidence = a["evidence"][0].as_str().unwrap_or("");
    assert!(
        evidence.contains(" (default/web-7d9f8c6b5-x2x4k on node node1) asked ")
            && evidence.contains(" left flannel.1 on node node1 (netns ")
            && evidence.contains(&format!(
                "where {COREDNS_ON_NODE3} (kube-system/{COREDNS_B} on node node3) is"
            )),
        "{a}"
    );
    for &id in &lost {
        let j = journey(&lines, id).unwrap();
        assert_eq!(endpoint(j), format!("{COREDNS_ON_NODE3}:53"), "{j}");
        assert_eq!(j["outcome"]["status"], "timeout", "{j}");
        assert!(nodes_of(j).iter().all(|n| n == "node1"), "{j}");
    }
    // Raised as the first lost lookup timed out: it is that one's.
    let first = journey(&lines, lost[0]).unwrap();
    assert_eq!(a["journeys"], serde_json::json!([first["id"]]), "{a}");
    for &id in &whole {
        let j = journey(&lines, id).unwrap();
        assert_whole_across_nodes(j);
        assert_eq!(endpoint(j), "10.244.2.53:53", "{j}");
        assert!(!nodes_of(j).iter().any(|n| n == "node3"), "{j}");
    }
    let (status, out, stderr) = view.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    // Every lost lookup counted, each as it timed out.
    let lines = json_lines(&out);
    let summary = lines.iter().find(|l| l["type"] == "summary").unwrap();
    let counted: Vec<&Value> = summary["anomalies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"] == "lost_between_nodes")
        .collect();
    assert_eq!(counted.len(), 1, "{summary}");
    assert_eq!(counted[0]["count"], lost.len(), "{summary}");
    agents.stop();
}

/// Lookups a down endpoint left unanswered, and the other answered, that
/// the rule needs (3) and one more: the last may be cut off by the end.
const ENDPOINT_LOOKUPS: usize = 4;

/// Node 3's CoreDNS hung while kube-dns still sends it its share: the view
/// names the endpoint that does not answer, its pod and its node, while it
/// runs; its lookups reached node 3, so none is lost between nodes.
#[test]
fn a_coredns_pod_that_hangs_is_named_live_with_its_node() {
    require_root();
    let lab = Lab::up(&["--nodes", "3"]);
    let agents = Agents::start(&[]);
    let mut view = view(&agents, &[]);
    shown_whole(&mut view, lookup(&lab));
    lab.fault_on("coredns-down", true, "3");
    // kube-proxy picks an endpoint at random: until each has its share.
    let (whole, lost) = answered_and_not(&lab, 40, ENDPOINT_LOOKUPS);
    assert!(
        whole.len() >= ENDPOINT_LOOKUPS && lost.len() >= ENDPOINT_LOOKUPS,
        "40 lookups: {whole:?} answered, {lost:?} timed out"
    );
    let lines = shown_until(&mut view, Duration::from_secs(30), |seen| {
        raised(seen, "resolver_endpoint_down").is_some()
            && lost.iter().all(|&id| journey(seen, id).is_some())
    });
    lab.fault_on("coredns-down", false, "3");
    let down = raised(&lines, "resolver_endpoint_down").unwrap();
    assert_eq!(
        down["summary"],
        "the resolver endpoint 10.244.3.53 on node3 of 10.96.0.10 does not answer; 10.244.2.53 does",
        "{down}"
    );
    assert!(
        down["evidence"]
            .as_array()
            .unwrap()
            .contains(&"10.244.3.53 is a pod on node3".into()),
        "{down}"
    );
    assert!(
        down["evidence"][0].as_str().is_some_and(|e| e.contains(&format!(
            " went to 10.244.3.53 (kube-system/{COREDNS_B} on node node3) and got no answer; 10.244.2.53 (kube-system/{COREDNS_A} on node node2) answered "
        ))),
        "{down}"
    );
    assert_eq!(
        down["names"]["10.244.3.53"],
        format!("kube-system/{COREDNS_B}"),
        "{down}"
    );
    // Each went to node 3's CoreDNS and got there.
    for &id in &lost {
        let j = journey(&lines, id).unwrap();
        assert_eq!(endpoint(j), format!("{COREDNS_ON_NODE3}:53"), "{j}");
        assert_eq!(j["outcome"]["status"], "timeout", "{j}");
        assert!(nodes_of(j).iter().any(|n| n == "node3"), "{j}");
    }
    let (status, out, stderr) = view.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");
    let kinds = summary_kinds(&out);
    assert!(
        kinds.contains(&"resolver_endpoint_down".to_owned()),
        "{kinds:?}"
    );
    assert!(
        !kinds.contains(&"lost_between_nodes".to_owned()),
        "{kinds:?}"
    );
    agents.stop();
}

/// `lab up --agents`: the DaemonSet on the lab, an agent per node in the
/// node's namespace serving mutual TLS on its address. A view run as
/// `kubectl exec -n dnstrace ds/dnstrace -- dnstrace cluster --pod …` runs,
/// by `lab exec node1`, with no other flag: it finds every agent by the
/// Service's name, which the lab's CoreDNS answered, is let in with the
/// pod's certificate, and shows web's lookups whole across nodes. A viewer
/// on node1 without the certificate is refused by every agent: a warning
/// each, and one line of error.
#[test]
fn a_view_in_an_agents_pod_finds_the_agents_by_name_and_is_let_in_by_its_certificate() {
    require_root();
    let lab = Lab::up(&["--nodes", "3", "--agents"]);
    let bin = dnstrace_bin().to_str().expect("a UTF-8 path");
    let pod = format!("default/{}", WEB.pod());
    let mut exec = Command::new(bin);
    exec.args(["lab", "exec", "node1", "--", bin, "cluster", "--pod", &pod])
        .args(["-o", "json", "--window", "5s"]);
    let mut view = Dnstrace::start_command(exec).unwrap();
    assert_eq!(
        view.ready["nodes"],
        serde_json::json!(["node1", "node2", "node3"])
    );
    let coredns = format!("{}{}", lab.log(COREDNS_A), lab.log(COREDNS_B));
    assert!(
        coredns.contains("query[A] dnstrace-agents.dnstrace.svc.cluster.local from"),
        "the agents' name was asked of the lab's CoreDNS: {coredns}"
    );
    for _ in 0..3 {
        shown_whole(&mut view, lookup(&lab));
    }
    let (status, _, stderr) = view.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{status}: {stderr:?}");

    let agents = (2..5)
        .map(|n| format!("172.18.0.{n}"))
        .collect::<Vec<_>>()
        .join(",");
    let out = Command::new("ip")
        .args(["netns", "exec", &lab_ns("node1"), bin, "cluster"])
        .args(["--agents", &agents, "--pod", &pod, "-o", "json"])
        .env_remove("DNSTRACE_API_CERT")
        .env_remove("DNSTRACE_API_KEY")
        .env_remove("DNSTRACE_API_CA")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    // A warning for each agent, then the one error.
    let said = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = said.trim().lines().collect();
    let (last, before) = lines.split_last().expect("what it said");
    assert!(
        last.starts_with("dnstrace: error: no agent answered"),
        "{said}"
    );
    assert!(
        before
            .iter()
            .all(|l| l.contains("warning: agent 172.18.0.")),
        "{said}"
    );
}
