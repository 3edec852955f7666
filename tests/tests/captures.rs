//! Captures as other tools write them (`tests/golden/captures`, made with
//! scapy by its `make.py`): each holds one way real captures bend what
//! dnstrace expects, and each test says what dnstrace must read in it.
//! Replay needs no root.
use std::{collections::BTreeSet, path::PathBuf};

use serde_json::Value;

use dnstrace_tests::*;

fn capture(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/captures");
    dir.join(format!("{name}.pcap"))
}

/// What `dnstrace replay NAME.pcap -o json` wrote: its JSON lines, and
/// its stderr (the exit line).
struct Replayed {
    lines: Vec<Value>,
    stderr: String,
}

fn replay(name: &str) -> Replayed {
    let file = capture(name);
    let out = dnstrace(&["replay", file.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "{out:?}");
    Replayed {
        lines: json_lines(&String::from_utf8_lossy(&out.stdout)),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

impl Replayed {
    fn journeys(&self) -> impl Iterator<Item = &Value> {
        self.lines.iter().filter(|l| l["type"] == "journey")
    }

    /// The anomalies of the summary at its end.
    fn anomalies(&self) -> &[Value] {
        let summary = self.lines.iter().find(|l| l["type"] == "summary");
        summary.expect("a summary")["anomalies"].as_array().unwrap()
    }
}

/// The journeys `dnstrace replay` reads in the capture `name`.
fn journeys(name: &str) -> Vec<Value> {
    replay(name).journeys().cloned().collect()
}

/// Each lookup's name and how it ended.
fn outcomes(js: &[Value]) -> Vec<(String, String)> {
    js.iter()
        .map(|j| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (s(&j["name"]), s(&j["outcome"]["status"]))
        })
        .collect()
}

/// A coarse clock gives two lookups' answers their queries' timestamps:
/// each is answered, as the third, a few milliseconds apart, is.
#[test]
fn an_answer_with_its_querys_timestamp_is_an_answer() {
    let js = journeys("same-timestamp");
    let answered = |name: &str| (name.to_owned(), "answered".to_owned());
    assert_eq!(
        outcomes(&js),
        [
            answered("a.example.com."),
            answered("b.example.com."),
            answered("c.example.com."),
        ]
    );
    assert_eq!(js[0]["total_ms"], 0.0, "{}", js[0]);
}

/// An empty file, and one cut inside its header (a capture stopped as it
/// began): one plain line each, no talk of blocks.
#[test]
fn an_empty_or_cut_file_is_one_plain_line() {
    let dir = Dir::new("captures-empty");
    let file = dir.file("x.pcap");
    let cases: [(&[u8], &str); 2] = [
        (
            b"",
            "x.pcap: the file is empty: nothing was captured into it",
        ),
        (
            b"\x0a\x0d",
            "x.pcap: the file ends inside its header: no packets in it",
        ),
    ];
    for (bytes, says) in cases {
        std::fs::write(&file, bytes).unwrap();
        let out = dnstrace(&["replay", file.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("dnstrace: error: "), "{stderr}");
        assert!(stderr.trim_end().ends_with(says), "{stderr}");
    }
}

/// `-p 53,5353` counts both ports as DNS, as `-p 53 -p 5353` does: the
/// lookups of the capture, on port 53, are read either way.
#[test]
fn ports_are_given_as_a_list_or_one_by_one() {
    let file = capture("same-timestamp");
    let file = file.to_str().unwrap();
    for ports in [&["-p", "53,5353"][..], &["-p", "5353", "-p", "53"]] {
        let mut args = vec!["replay", file, "-o", "json"];
        args.extend_from_slice(ports);
        let out = dnstrace(&args);
        assert!(out.status.success(), "{ports:?}: {out:?}");
        let lines = json_lines(&String::from_utf8_lossy(&out.stdout));
        let js = lines.iter().filter(|j| j["type"] == "journey").count();
        assert_eq!(js, 3, "{ports:?}");
    }
}

/// One cold lookup of 372 ms among quick ones is no finding; three slow
/// answers from one server within a minute are, counted from the first of
/// them, with their typical and worst time in the headline.
#[test]
fn slow_answers_are_a_pattern_not_one_cold_lookup() {
    let replayed = replay("slow-answers");
    let id_of = |name: &str| {
        replayed
            .journeys()
            .find(|j| j["name"] == name)
            .and_then(|j| j["id"].as_u64())
            .unwrap_or_else(|| panic!("no journey for {name}"))
    };
    let anomalies = replayed.anomalies();
    assert_eq!(anomalies.len(), 1, "{anomalies:#?}");
    let slow = &anomalies[0];
    assert_eq!(slow["kind"], "slow_answers");
    assert_eq!(slow["count"], 3);
    let pattern: Vec<u64> = ["s0", "s1", "s2"]
        .map(|s| id_of(&format!("{s}.example.com.")))
        .to_vec();
    assert_eq!(slow["journeys"], serde_json::json!(pattern));
    let headline = slow["summary"].as_str().unwrap();
    assert!(
        headline.starts_with("slow answers: typically 450 ms, worst 1312 ms"),
        "{headline}"
    );
    assert_eq!(
        slow["evidence"][1],
        "3 answers from the server 10.96.0.10 took over 200 ms within 60 s"
    );
}

/// A plain capture sees both ways at one tap: an answer back there is
/// whole however soon the capture stops after it; a query still waiting
/// when it stops is what the capture cut off.
#[test]
fn an_answer_just_before_the_capture_ends_is_whole() {
    for name in ["same-timestamp", "capture-end"] {
        for j in journeys(name) {
            let answered = j["outcome"]["status"] == "answered";
            assert_eq!(j["incomplete"], !answered, "{name}: {j}");
        }
    }
    let js = journeys("capture-end");
    assert_eq!(js.len(), 2);
    assert_eq!(
        js[1]["incomplete_why"],
        "the capture ended before it could finish"
    );
}

/// Two answers arrive that do not read whole (an SVCB parameter longer
/// than its record, an A record running past the message): each ends its
/// lookup as an answer marked malformed, with what was read before the
/// break and where it is, and one finding names the server sending them.
#[test]
fn a_malformed_answer_is_an_answer_and_a_finding() {
    let replayed = replay("malformed-answers");
    let js: Vec<&Value> = replayed.journeys().collect();
    assert_eq!(js.len(), 3);
    for (j, breaks) in js.iter().zip([
        Some("answer record 2 of 2, at byte 66: incorrect rdata length"),
        Some("answer record 2 of 2, at byte 66: rdata length too large"),
        None,
    ]) {
        let o = &j["outcome"];
        assert_eq!(
            (&o["status"], &o["answers"][0]),
            (&"answered".into(), &"A 10.0.0.1".into()),
            "{j}"
        );
        assert_eq!(j["incomplete"], false, "{j}");
        match breaks {
            Some(b) => assert!(
                o["malformed"].as_str().is_some_and(|m| m.starts_with(b)),
                "{j}"
            ),
            None => assert!(o.get("malformed").is_none(), "{j}"),
        }
    }
    let anomalies = replayed.anomalies();
    assert_eq!(anomalies.len(), 1, "{anomalies:#?}");
    let a = &anomalies[0];
    assert_eq!(
        (&a["kind"], &a["count"], &a["summary"]),
        (
            &"malformed_answer".into(),
            &2.into(),
            &"answers from 10.96.0.10:53 cannot be read whole".into()
        )
    );
    let exit = &replayed.stderr;
    assert!(exit.contains("6 messages, 2 malformed"), "{exit}");
}

/// A capture merged from two points whose clocks differ stamps each
/// answer 1 to 3 ms before its query: each still answers its query, at
/// the query's time, and an answer whose query is nowhere answers nothing.
#[test]
fn an_answer_stamped_a_little_before_its_query_answers_it() {
    let js = journeys("answers-before-queries");
    let answered = |name: &str| (name.to_owned(), "answered".to_owned());
    assert_eq!(
        outcomes(&js),
        [answered("e0.example.com."), answered("e1.example.com.")]
    );
    for j in &js {
        assert_eq!(
            (&j["total_ms"], &j["incomplete"]),
            (&0.0.into(), &false.into()),
            "{j}"
        );
    }
}

/// Names with bytes outside hostname rules are traced, and shown as dig
/// shows them: `=`, `/` and `+` as they are, a space and a byte above 127
/// as `\DDD`.
#[test]
fn names_with_any_bytes_are_traced_and_shown_as_dig_shows_them() {
    let js = journeys("odd-names");
    let answered = |name: &str| (name.to_owned(), "answered".to_owned());
    assert_eq!(
        outcomes(&js),
        [
            answered("a=b/c+d.example.com."),
            answered("sp\\032ace.example.com."),
            answered("\\255.example.com."),
        ]
    );
}

/// Zone operations are no lookups: a NOTIFY and a refused UPDATE are
/// matched to their answers by ports and id and named for what they are;
/// the UPDATE's echoed prerequisite is no answer, and its refusal raises
/// no failing lookup.
#[test]
fn zone_operations_are_named_for_what_they_are_and_are_no_failed_lookups() {
    let replayed = replay("zone-operations");
    let js: Vec<(&Value, &Value, &Value)> = replayed
        .journeys()
        .map(|j| {
            (
                &j["opcode"],
                &j["outcome"]["rcode"],
                &j["outcome"]["answers"],
            )
        })
        .collect();
    let none = serde_json::json!([]);
    assert_eq!(
        js,
        [
            (&"NOTIFY".into(), &"NOERROR".into(), &none),
            (&"UPDATE".into(), &"REFUSED".into(), &none),
        ]
    );
    let anomalies = replayed.anomalies();
    assert!(anomalies.is_empty(), "{anomalies:#?}");
}

/// tshark as the oracle: in every capture here, each query tshark sees a
/// response to (same id, client address and port; malformed or early
/// ones too) is an answered journey in dnstrace's replay.
#[test]
fn every_query_tshark_sees_answered_is_answered() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/captures");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    files.sort();
    assert!(files.len() >= 9, "{files:?}");
    for file in files {
        let name = file.file_stem().unwrap().to_str().unwrap().to_owned();
        let seen = |response: u8, addr: &str, port: &str| -> BTreeSet<String> {
            let filter = format!("dns.flags.response == {response}");
            // Inside a tunnel, the innermost addresses: the lookup's.
            let out = run(std::process::Command::new("tshark").args([
                "-r",
                file.to_str().unwrap(),
                "-d",
                "udp.port==8472,vxlan",
                "-E",
                "occurrence=l",
                "-Y",
                &filter,
                "-T",
                "fields",
                "-e",
                "dns.id",
                "-e",
                addr,
                "-e",
                port,
            ]))
            .expect("tshark reads the capture");
            out.lines().map(str::to_owned).collect()
        };
        let asked = seen(0, "ip.src", "udp.srcport");
        let answered: BTreeSet<String> = seen(1, "ip.dst", "udp.dstport")
            .intersection(&asked)
            .cloned()
            .collect();
        let ours: BTreeSet<String> = journeys(&name)
            .iter()
            .filter(|j| j["outcome"]["status"] == "answered")
            .map(|j| {
                let (ip, port) = j["client"].as_str().unwrap().rsplit_once(':').unwrap();
                format!("0x{:04x}\t{ip}\t{port}", j["dns_id"].as_u64().unwrap())
            })
            .collect();
        let missed: Vec<&String> = answered.difference(&ours).collect();
        assert!(!answered.is_empty(), "{name}: tshark saw no answers");
        assert!(
            missed.is_empty(),
            "{name}: answered for tshark, not here: {missed:?}"
        );
    }
}

/// A query whose EDNS option claims more bytes than it has is still a
/// query: its lookup is a journey, answered, and the packet line says
/// where the query breaks.
#[test]
fn a_query_with_a_broken_edns_option_is_a_lookup() {
    let js = journeys("odd-edns");
    assert_eq!(
        outcomes(&js),
        [("cookie.example.com.".to_owned(), "answered".to_owned())]
    );
    let file = capture("odd-edns");
    let out = dnstrace(&["replay", file.to_str().unwrap(), "--packets"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let query = text.lines().next().unwrap_or_default();
    assert!(
        query.contains(
            " Q rd cookie.example.com. A MALFORMED at the additional record 1 of 1, at byte 36: "
        ),
        "{text}"
    );
}

/// A node's underlay: each cross-node lookup inside VXLAN (IANA's port and
/// flannel's), Geneve, IP-in-IP or GRE is a journey, answered, each leg
/// saying which tunnel and which two nodes it crossed between; the node's
/// own lookup upstream crossed no tunnel.
#[test]
fn dns_inside_tunnels_is_traced_with_the_nodes_it_crossed() {
    let js = journeys("tunnels");
    let names: Vec<(String, String)> = outcomes(&js);
    let answered = |name: &str| (name.to_owned(), "answered".to_owned());
    assert_eq!(
        names,
        [
            answered("vxlan.example.com."),
            answered("flannel.example.com."),
            answered("geneve.example.com."),
            answered("ipip.example.com."),
            answered("gre.example.com."),
            answered("example.org."),
        ]
    );
    let underlays = |j: &Value| -> Vec<String> {
        let legs = j["legs"].as_array().unwrap();
        legs.iter()
            .map(|l| match &l["underlay"] {
                Value::Null => "none".to_owned(),
                u => format!("{} {} {} {}", u["tunnel"], u["src"], u["dst"], u["vni"]),
            })
            .collect()
    };
    let (a, b, c) = ("\"192.168.0.1\"", "\"192.168.0.2\"", "\"192.168.0.3\"");
    let both = |tunnel: &str, other: &str, vni: &str| {
        vec![
            format!("\"{tunnel}\" {a} {other} {vni}"),
            format!("\"{tunnel}\" {other} {a} {vni}"),
        ]
    };
    let want = [
        both("vxlan", b, "1"),
        both("vxlan", c, "1"),
        both("geneve", b, "5"),
        both("ipip", c, "null"),
        both("gre", b, "77"),
        vec!["none".to_owned(), "none".to_owned()],
    ];
    for (j, want) in js.iter().zip(want) {
        assert_eq!(underlays(j), want, "{j}");
    }
    let file = capture("tunnels");
    let out = dnstrace(&["replay", file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("  in vxlan node 192.168.0.3 → node 192.168.0.1 (vni 1)\n"),
        "{text}"
    );
    let packets = dnstrace(&["replay", file.to_str().unwrap(), "--packets"]);
    let text = String::from_utf8_lossy(&packets.stdout);
    assert!(
        text.contains(" [in gre node 192.168.0.1 → node 192.168.0.2 (key 77)]"),
        "{text}"
    );
}

/// Names keep the case their clients sent (a resolver's DNS 0x20), and
/// match their answers without case: one echoed, one lowercased by the
/// server.
#[test]
fn names_keep_the_case_they_were_sent_in_and_match_without_it() {
    let answered = |name: &str| (name.to_owned(), "answered".to_owned());
    assert_eq!(
        outcomes(&journeys("mixed-case")),
        [answered("wWw.ExAmPlE.cOm."), answered("API.Example.COM.")]
    );
}

/// A query with no question (asking for a server cookie) is matched to
/// its answer by ports and id, named for what it is, and is no failed
/// lookup.
#[test]
fn a_query_with_no_question_is_matched_by_ports_and_id() {
    let replayed = replay("no-question");
    let js: Vec<&Value> = replayed.journeys().collect();
    assert_eq!(
        outcomes(&js.iter().map(|j| (*j).clone()).collect::<Vec<_>>()),
        [("(no question)".to_owned(), "answered".to_owned())]
    );
    assert_eq!(js[0]["dns_id"], 0xc00, "{}", js[0]);
    assert!(
        replayed.anomalies().is_empty(),
        "{:?}",
        replayed.anomalies()
    );
}
