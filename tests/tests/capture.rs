//! dnstrace on a real veth pair: dnsmasq answers, dig and our own socket ask,
//! and every message must come out decoded.
use std::time::Duration;

use dnstrace_tests::*;
use serde_json::Value;

const ZONE: &[&str] = &[
    "--local=/test/",
    "--host-record=www.test,10.77.0.80,fd77::80",
    "--cname=alias1.test,alias2.test",
    "--cname=alias2.test,www.test",
    "--txt-record=txt.test,v=dnstrace test",
];

fn big_txt() -> String {
    let chunk = "x".repeat(200);
    format!("--txt-record=big.test,{chunk},{chunk},{chunk}")
}

/// Runs dig in the client namespace and returns its header's query id.
fn dig(pair: &Pair, args: &str) -> u16 {
    let out = run(pair
        .client
        .cmd("dig")
        .args(["+tries=1", "+time=3"])
        .args(args.split_whitespace()))
    .unwrap();
    let id = out
        .lines()
        .find_map(|l| l.split("id: ").nth(1))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no id in dig output:\n{out}"));
    id
}

fn find<'a>(lines: &'a [Value], id: u16, response: bool, transport: &str) -> &'a Value {
    find_where(lines, id, response, transport, |_| true)
}

/// [`find`], among the messages `also` accepts: dig picks its ids at
/// random, and two exchanges may share one.
fn find_where<'a>(
    lines: &'a [Value],
    id: u16,
    response: bool,
    transport: &str,
    also: impl Fn(&Value) -> bool,
) -> &'a Value {
    lines
        .iter()
        .find(|l| {
            l["kind"] == "dns"
                && l["id"] == id
                && l["response"] == response
                && l["transport"] == transport
                && also(l)
        })
        .unwrap_or_else(|| {
            panic!(
                "no {transport} {} with id {id} in {lines:#?}",
                if response { "response" } else { "query" }
            )
        })
}

fn answers(msg: &Value) -> Vec<String> {
    msg["answers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            format!(
                "{} {}",
                a["type"].as_str().unwrap(),
                a["data"].as_str().unwrap()
            )
        })
        .collect()
}

struct Case {
    dig: String,
    transport: &'static str,
    name: &'static str,
    qtype: &'static str,
    rcode: &'static str,
    answers: Vec<&'static str>,
}

fn case(
    dig: &str,
    transport: &'static str,
    name: &'static str,
    qtype: &'static str,
    rcode: &'static str,
    answers: Vec<&'static str>,
) -> Case {
    Case {
        dig: dig.to_owned(),
        transport,
        name,
        qtype,
        rcode,
        answers,
    }
}

/// A veth pair, dnsmasq serving `zone`, and dnstrace on the server side.
fn serve(zone: &[&str]) -> (Pair, Proc, Dnstrace) {
    let pair = Pair::new().unwrap();
    let dns = dnsmasq(&pair.server, zone).unwrap();
    let trace = Dnstrace::start(
        &pair.server,
        Keep::Every,
        &["--iface", Pair::SERVER_IF, "--output", "json"],
    )
    .unwrap();
    (pair, dns, trace)
}

#[test]
fn every_query_and_response_is_captured_and_decoded() {
    require_root();
    let (pair, _dns, trace) = serve(ZONE);
    let cname_chain = vec!["CNAME alias2.test.", "CNAME www.test.", "A 10.77.0.80"];
    let mut cases = Vec::new();
    for (server, family) in [(Pair::SERVER4, "v4"), (Pair::SERVER6, "v6")] {
        for (flag, transport) in [("", "udp"), ("+tcp", "tcp")] {
            let at = format!("@{server} {flag}");
            cases.push(case(
                &format!("{at} www.test A"),
                transport,
                "www.test.",
                "A",
                "NOERROR",
                vec!["A 10.77.0.80"],
            ));
            cases.push(case(
                &format!("{at} www.test AAAA"),
                transport,
                "www.test.",
                "AAAA",
                "NOERROR",
                vec!["AAAA fd77::80"],
            ));
            cases.push(case(
                &format!("{at} txt.test TXT"),
                transport,
                "txt.test.",
                "TXT",
                "NOERROR",
                vec!["TXT \"v=dnstrace test\""],
            ));
            cases.push(case(
                &format!("{at} alias1.test A"),
                transport,
                "alias1.test.",
                "A",
                "NOERROR",
                cname_chain.clone(),
            ));
            cases.push(case(
                &format!("{at} missing.test A"),
                transport,
                "missing.test.",
                "A",
                "NXDOMAIN",
                vec![],
            ));
        }
        let _ = family;
    }
    let ids: Vec<u16> = cases.iter().map(|c| dig(&pair, &c.dig)).collect();
    // And from a socket of our own, with an id we chose, none of dig's.
    let own_id = (0x4242..).find(|i| !ids.contains(i)).unwrap();
    let replies = udp_exchange(
        &pair.client,
        &format!("{}:53", Pair::SERVER4),
        vec![query_bytes(own_id, "www.test", 1)],
        Duration::from_secs(3),
    )
    .unwrap();
    assert_eq!(replies.len(), 1, "dnsmasq did not answer our own query");

    let (status, out, _) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "dnstrace exited with {status}");
    let lines = json_lines(&out);
    for (c, id) in cases.iter().zip(ids) {
        // Each case is one family, transport and question: with the id,
        // one exchange.
        let v6 = c.dig.contains(Pair::SERVER6);
        let of_case = |end: &'static str| {
            move |l: &Value| {
                l["questions"][0]["name"] == c.name
                    && l["questions"][0]["type"] == c.qtype
                    && l[end].as_str().is_some_and(|a| a.starts_with('[') == v6)
            }
        };
        let q = find_where(&lines, id, false, c.transport, of_case("dst"));
        assert_eq!(q["direction"], "ingress", "{}", c.dig);
        assert_eq!(q["questions"][0]["name"], c.name, "{}", c.dig);
        assert_eq!(q["questions"][0]["type"], c.qtype, "{}", c.dig);
        let r = find_where(&lines, id, true, c.transport, of_case("src"));
        assert_eq!(r["direction"], "egress", "{}", c.dig);
        assert_eq!(r["iface"], Pair::SERVER_IF);
        assert_eq!(r["rcode"], c.rcode, "{}", c.dig);
        assert_eq!(r["questions"][0]["name"], c.name, "{}", c.dig);
        assert_eq!(answers(r), c.answers, "{}", c.dig);
        assert_eq!(
            r["src"].as_str().unwrap().starts_with('['),
            v6,
            "{}: {}",
            c.dig,
            r["src"]
        );
    }
    let own = find(&lines, own_id, true, "udp");
    assert_eq!(answers(own), vec!["A 10.77.0.80"]);
    assert_eq!(
        own["dst"].as_str().unwrap().split(':').next(),
        Some(Pair::CLIENT4)
    );
}

#[test]
fn truncated_answer_then_tcp_retry_are_two_exchanges() {
    require_root();
    let (pair, _dns, trace) = serve(&["--local=/test/", &big_txt()]);
    // No EDNS: the answer exceeds 512 bytes, comes back truncated, and dig retries over TCP.
    let out = run(pair.client.cmd("dig").args([
        "+noedns",
        "+tries=1",
        &format!("@{}", Pair::SERVER4),
        "big.test",
        "TXT",
    ]))
    .unwrap();
    assert!(
        out.contains("Truncated, retrying in TCP mode"),
        "dig did not retry over TCP:\n{out}"
    );
    let (_, out, _) = trace.stop(libc::SIGTERM).unwrap();
    let lines = json_lines(&out);
    let responses: Vec<&Value> = lines
        .iter()
        .filter(|l| l["response"] == true && l["questions"][0]["name"] == "big.test.")
        .collect();
    let udp: Vec<_> = responses
        .iter()
        .filter(|l| l["transport"] == "udp")
        .collect();
    let tcp: Vec<_> = responses
        .iter()
        .filter(|l| l["transport"] == "tcp")
        .collect();
    assert_eq!((udp.len(), tcp.len()), (1, 1), "{lines:#?}");
    assert_eq!(udp[0]["flags"]["tc"], true);
    assert_eq!(tcp[0]["flags"]["tc"], false);
    let txt = &tcp[0]["answers"][0]["data"];
    assert!(
        txt.as_str().unwrap().len() > 600,
        "TCP answer not complete: {txt}"
    );
    let queries = lines
        .iter()
        .filter(|l| l["response"] == false && l["questions"][0]["name"] == "big.test.")
        .count();
    assert_eq!(queries, 2, "expected the UDP query and its TCP retry");
}

#[test]
fn garbage_is_malformed_and_capture_goes_on() {
    require_root();
    let (pair, _dns, trace) = serve(ZONE);
    let random: Vec<u8> = (0..97u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let mut lying = query_bytes(0x1111, "www.test", 1);
    lying[7] = 9; // ANCOUNT 9, no answers follow
                  // One question whose name is a compression pointer to itself.
    let looping = vec![
        0x22, 0x22, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1,
    ];
    let garbage = vec![random.clone(), lying.clone(), looping.clone()];
    udp_exchange(
        &pair.client,
        &format!("{}:53", Pair::SERVER4),
        garbage,
        Duration::from_millis(200),
    )
    .unwrap();
    let id = dig(&pair, &format!("@{} www.test A", Pair::SERVER4));
    let (status, out, _) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success());
    let lines = json_lines(&out);
    let malformed: Vec<u64> = lines
        .iter()
        .filter(|l| l["kind"] == "malformed" && l["direction"] == "ingress")
        .map(|l| {
            assert!(!l["reason"].as_str().unwrap().is_empty());
            l["len"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(
        malformed,
        vec![random.len() as u64, looping.len() as u64],
        "{lines:#?}"
    );
    // Its header and question read: a query, with where it breaks.
    let lying = lines
        .iter()
        .find(|l| l["kind"] == "dns" && l["id"] == 0x1111 && l["direction"] == "ingress")
        .unwrap_or_else(|| panic!("the lying query as a message: {lines:#?}"));
    assert_eq!(lying["questions"][0]["name"], "www.test.");
    assert!(
        lying["malformed"]
            .as_str()
            .is_some_and(|m| m.starts_with("answer record 1 of 9, at byte 26: ")),
        "{lying}"
    );
    find(&lines, id, true, "udp");
}

#[test]
fn ipv6_extension_headers_are_walked_not_guessed() {
    require_root();
    let (pair, _dns, trace) = serve(ZONE);
    let server = format!("[{}]:53", Pair::SERVER6);
    let query = query_bytes(0x6666, "www.test", 28);
    let reply = pair
        .client
        .enter(move || -> std::io::Result<usize> {
            let sock = std::net::UdpSocket::bind("[::]:0")?;
            // A destination options header (PadN) on every packet of this socket.
            let opts: [u8; 8] = [0, 0, 1, 4, 0, 0, 0, 0];
            // SAFETY: setsockopt with a valid buffer and its length.
            let rc = unsafe {
                use std::os::fd::AsRawFd;
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::IPPROTO_IPV6,
                    libc::IPV6_DSTOPTS,
                    opts.as_ptr().cast(),
                    opts.len() as u32,
                )
            };
            assert_eq!(rc, 0, "IPV6_DSTOPTS: {}", std::io::Error::last_os_error());
            sock.set_read_timeout(Some(Duration::from_secs(3)))?;
            sock.send_to(&query, &server)?;
            sock.recv(&mut [0u8; 512])
        })
        .unwrap();
    assert!(reply.is_ok(), "dnsmasq did not answer: {reply:?}");
    let (_, out, _) = trace.stop(libc::SIGINT).unwrap();
    let lines = json_lines(&out);
    let q = find(&lines, 0x6666, false, "udp");
    assert_eq!(q["questions"][0]["type"], "AAAA");
    // The payload starts after the 8-byte extension header: had it been
    // skipped wrongly, neither ports nor DNS would have decoded.
    assert_eq!(
        q["wire_len"].as_u64().unwrap(),
        14 + 40 + 8 + 8 + query_bytes(0, "www.test", 28).len() as u64
    );
    assert_eq!(
        answers(find(&lines, 0x6666, true, "udp")),
        vec!["AAAA fd77::80"]
    );
}

#[test]
fn conntrack_events_and_statistics_of_the_node_namespace() {
    require_root();
    let pair = Pair::new().unwrap();
    // A rule that needs conntrack turns it on in this namespace.
    run(pair.server.cmd("iptables").args([
        "-A",
        "INPUT",
        "-m",
        "conntrack",
        "--ctstate",
        "NEW",
        "-j",
        "ACCEPT",
    ]))
    .unwrap();
    let _dns = dnsmasq(&pair.server, ZONE).unwrap();
    let netns = format!("/run/netns/{}", pair.server.name);
    let trace = Dnstrace::start(
        &pair.server,
        Keep::Every,
        &[
            "--iface",
            Pair::SERVER_IF,
            "-o",
            "json",
            "--node-netns",
            &netns,
        ],
    )
    .unwrap();
    assert!(
        trace
            .stderr_lines
            .iter()
            .any(|l| l.contains("conntrack statistics: insert_failed=")),
        "{:?}",
        trace.stderr_lines
    );
    let id = dig(&pair, &format!("@{} www.test A", Pair::SERVER4));
    let (_, out, _) = trace.stop(libc::SIGINT).unwrap();
    let lines = json_lines(&out);
    find(&lines, id, true, "udp");
    let new = lines
        .iter()
        .find(|l| {
            l["kind"] == "conntrack" && l["event"] == "new" && l["original"][1] == "10.77.0.2:53"
        })
        .unwrap_or_else(|| panic!("no conntrack event in {lines:#?}"));
    assert_eq!(new["transport"], "udp");
    assert!(new["original"][0]
        .as_str()
        .unwrap()
        .starts_with("10.77.0.1:"));
    assert_eq!(new["dnat"], Value::Null);
}

/// A server whose answers do not read whole (a second A record running
/// past the message's end), seen on the kernel path: the lookup ends
/// answered and marked malformed, with the record read before the break,
/// never as a timeout, and `malformed_answer` names the server.
#[test]
fn a_malformed_answer_seen_live_is_an_answer() {
    require_root();
    let pair = Pair::new().unwrap();
    let server = format!("{}:53", Pair::SERVER4);
    let bound = server.clone();
    let sock = pair
        .server
        .enter(move || std::net::UdpSocket::bind(bound))
        .unwrap()
        .unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let answering = std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        let (n, from) = sock.recv_from(&mut buf).unwrap();
        let mut reply = buf[..n].to_vec();
        reply[2] |= 0x80; // QR
        reply[7] = 2; // ANCOUNT: a good record and a broken one
        let a = [0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4];
        reply.extend_from_slice(&a);
        reply.extend_from_slice(&[10, 77, 0, 80]);
        reply.extend_from_slice(&a);
        reply.extend_from_slice(&[10, 77]);
        sock.send_to(&reply, from).unwrap();
    });
    let args = ["trace", "--iface", Pair::SERVER_IF, "-o", "json"];
    let trace = Dnstrace::start(&pair.server, Keep::Every, &args).unwrap();
    let query = query_bytes(0x4242, "www.test", 1);
    let wait = Duration::from_secs(2);
    let replies = udp_exchange(&pair.client, &server, vec![query], wait).unwrap();
    answering.join().unwrap();
    assert_eq!(replies.len(), 1, "the broken answer reached the client");
    let (status, out, stderr) = trace.stop(libc::SIGINT).unwrap();
    assert!(status.success(), "{stderr:?}");
    let lines = json_lines(&out);
    let j = lines
        .iter()
        .find(|l| l["type"] == "journey" && l["dns_id"] == 0x4242)
        .unwrap_or_else(|| panic!("no journey in {lines:#?}"));
    let o = &j["outcome"];
    assert_eq!(o["status"], "answered", "{j}");
    assert_eq!(o["answers"], serde_json::json!(["A 10.77.0.80"]), "{j}");
    assert!(
        o["malformed"]
            .as_str()
            .is_some_and(|m| m.starts_with("answer record 2 of 2, at byte 42: ")),
        "{j}"
    );
    let summary = lines.iter().find(|l| l["type"] == "summary").unwrap();
    let kinds: Vec<&Value> = summary["anomalies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| &a["kind"])
        .collect();
    assert_eq!(kinds, [&Value::from("malformed_answer")], "{summary:#}");
}
