//! The live view without a terminal: state changes by action, and each
//! screen drawn on ratatui's TestBackend against a stored snapshot.
use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    sync::{mpsc::sync_channel, Arc},
};

use ratatui::{
    backend::TestBackend,
    crossterm::event::{KeyCode, KeyEvent, KeyModifiers},
    Terminal,
};

use dnstrace_common::Hook;

use super::{
    draw::draw,
    keys::action,
    model::{detail, lookup, AnomalyRow},
    state::{About, Action, App, Focus, Screen, Update, MAX_ROWS},
    LiveOut,
};
use crate::decode::{Qtype, Rcode};
use crate::{
    clock::Clock,
    correlate::{Journey, Leg, Limits, Outcome},
    decode::KernelNames,
    diagnose::{AnomalyKind, Context, Severity},
    naming::{Names, Services},
    output::Labels,
    pipeline::{Health, JourneySink, NodeStatus, Sink},
};

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn labels() -> Labels {
    let services = Services {
        cluster_ips: BTreeMap::from([(a("10.96.0.10:0").ip(), "kube-system/kube-dns".into())]),
        endpoints: BTreeMap::from([(
            a("10.244.0.53:0").ip(),
            "kube-system/coredns-7db6d8ff4d-4xk9m".into(),
        )]),
        ..Default::default()
    };
    let pods = [(
        "default/web-7d9f8c6b5-x2x4k".to_owned(),
        vec![a("10.244.0.10:0").ip()],
    )];
    Labels::new(HashMap::new(), Clock::EPOCH, KernelNames::default())
        .with_names(Names::new(&services, &pods))
}

fn leg(ts: u64, prev: u64, place: (&str, u32), dir: &'static str, src: &str, dst: &str) -> Leg {
    Leg {
        ts_ns: ts,
        since_prev_ns: prev,
        hook: if dir == "egress" {
            Hook::DevXmit
        } else {
            Hook::DevReceive
        },
        iface: Some(place.0.into()),
        ifindex: 2,
        node: Default::default(),
        netns: place.1,
        src: a(src),
        dst: a(dst),
        response: src.ends_with(":53"),
        ip_len: 0,
        dnat: None,
        snat: None,
        drop: None,
        fragment: None,
        underlay: None,
    }
}

/// web asks kube-dns; the node DNATs it to CoreDNS, which answers after
/// asking upstream when `upstream` is set.
fn journey(id: u64, name: &str, start: u64, outcome: Outcome, upstream: bool) -> Journey {
    let (c, svc, dns) = ("10.244.0.10:40000", "10.96.0.10:53", "10.244.0.53:53");
    let mut legs = vec![
        leg(start, 0, ("eth0", 100), "egress", c, svc),
        leg(
            start + 20_000,
            20_000,
            ("veth0cf73899", 200),
            "ingress",
            c,
            svc,
        ),
        leg(
            start + 80_000,
            60_000,
            ("vethcdf73e25", 200),
            "egress",
            c,
            dns,
        ),
        leg(start + 90_000, 10_000, ("eth0", 300), "ingress", c, dns),
    ];
    legs[2].dnat = Some(Box::new((a(svc), a(dns))));
    let answered = matches!(outcome, Outcome::Answered { .. });
    let took = if upstream { 2 * MS } else { 300_000 };
    if answered {
        legs.push(leg(
            start + took,
            took - 90_000,
            ("eth0", 300),
            "egress",
            dns,
            c,
        ));
        legs.push(leg(
            start + took + 30_000,
            30_000,
            ("eth0", 100),
            "ingress",
            svc,
            c,
        ));
    }
    let ups = upstream.then(|| Journey {
        id: id + 1000,
        lookup: id + 1000,
        client: a("10.244.0.53:33333"),
        dns_id: 9,
        name: name.into(),
        qtype: Qtype::A,
        tcp: false,
        started_ns: start + 200_000,
        ended_ns: start + 1_800_000,
        outcome: outcome.clone(),
        dnat: None,
        legs: vec![
            leg(
                start + 200_000,
                0,
                ("eth0", 300),
                "egress",
                "10.244.0.53:33333",
                "198.51.100.53:53",
            ),
            leg(
                start + 1_800_000,
                1_600_000,
                ("eth0", 300),
                "ingress",
                "198.51.100.53:53",
                "10.244.0.53:33333",
            ),
        ],
        upstream: vec![],
        incomplete: None,
        sampled: Default::default(),
        connection: None,
        opcode: None,
        asked_as: None,
    });
    Journey {
        id,
        lookup: id,
        client: a(c),
        dns_id: id as u16,
        name: name.into(),
        qtype: Qtype::A,
        tcp: false,
        started_ns: start,
        ended_ns: if answered {
            start + took + 30_000
        } else {
            start + 5 * S
        },
        outcome,
        dnat: Some(Box::new((a(svc), a(dns)))),
        legs,
        upstream: ups.into_iter().collect(),
        incomplete: None,
        sampled: Default::default(),
        connection: None,
        opcode: None,
        asked_as: None,
    }
}

fn noerror(answer: &str) -> Outcome {
    Outcome::Answered {
        rcode: Rcode::NOERROR,
        answers: vec![answer.into()],
        truncated: false,
        malformed: None,
    }
}

fn rcode(r: Rcode) -> Outcome {
    Outcome::Answered {
        rcode: r,
        answers: vec![],
        truncated: false,
        malformed: None,
    }
}

fn anomaly() -> AnomalyRow {
    AnomalyRow {
        key: (
            AnomalyKind::UpstreamTimeout,
            "upstream 198.51.100.53:53 did not answer".into(),
        ),
        severity: Severity::Critical,
        count: 3,
        first_ns: 2 * S,
        last_ns: 8 * S,
        evidence: vec!["3 of 4 queries to 198.51.100.53:53 had no answer within 5.5 s".into()],
        about: vec!["kube-system/coredns-1 (10.244.0.53)".into()],
        cause: "the upstream resolver is down or unreachable from CoreDNS".into(),
        fix: "check the upstream resolver and CoreDNS's forward plugin",
        journeys: vec![4],
    }
}

const TIMEOUT_BADGE: (AnomalyKind, &str) = (
    AnomalyKind::UpstreamTimeout,
    "upstream 198.51.100.53:53 did not answer",
);

/// Five lookups, one timed out behind an anomaly, at 10 s past the epoch.
fn busy() -> App {
    let mut app = App::new(
        About {
            target: "pod default/web-7d9f8c6b5-x2x4k (10.244.0.10)".into(),
            hooks: 3,
            log: Some("/tmp/dnstrace-1.log".into()),
        },
        Arc::new(labels()),
    );
    let l = labels();
    let badge = [(TIMEOUT_BADGE.0, TIMEOUT_BADGE.1.to_owned())];
    let rows = [
        (
            journey(
                1,
                "kubernetes.default.svc.cluster.local.",
                5 * S,
                noerror("A 10.96.0.1"),
                false,
            ),
            &[][..],
        ),
        (
            journey(
                2,
                "www.example.com.default.svc.cluster.local.",
                6 * S,
                rcode(Rcode::NXDOMAIN),
                false,
            ),
            &[],
        ),
        (
            journey(
                3,
                "www.example.com.",
                7 * S,
                noerror("A 198.51.100.80"),
                true,
            ),
            &[],
        ),
        (
            journey(4, "slow.example.com.", 8 * S, Outcome::Timeout, false),
            &badge[..],
        ),
        (
            journey(
                5,
                "broken.example.com.",
                9 * S,
                rcode(Rcode::SERVFAIL),
                false,
            ),
            &[],
        ),
    ];
    for (j, badges) in rows {
        app.update(Update::Lookup(Box::new(lookup(j, badges, &l))));
    }
    app.update(Update::Anomalies(vec![anomaly()]));
    app.update(Update::Health(Health {
        now_ns: 10 * S,
        lost: 0,
        evicted: 0,
        open: 2,
        one_in: 1,
        recording: None,
        nodes: Vec::new(),
    }));
    app
}

fn render(app: &App, w: u16, h: u16) -> TestBackend {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| draw(app, f)).unwrap();
    t.backend().clone()
}

fn key(c: KeyCode) -> KeyEvent {
    KeyEvent::new(c, KeyModifiers::NONE)
}

fn press(app: &mut App, keys: &[KeyCode]) {
    for k in keys {
        if let Some(a) = action(app, key(*k)) {
            app.apply(a);
        }
    }
}

fn ids(app: &App) -> Vec<u64> {
    app.visible().map(|l| l.journey.id).collect()
}

/// The user quits first, then the capture closes what is open: the
/// anomalies printed on the terminal afterwards must still be there.
#[test]
fn the_summary_outlives_the_view() {
    let (tx, rx) = sync_channel(1);
    drop(rx);
    let out = LiveOut::new(tx, Arc::new(labels()), Arc::default());
    let context = Context {
        bridge_nf_call_iptables: Some("0".into()),
        ..Context::default()
    };
    let mut sink = JourneySink::new(Limits::default(), context, out);
    sink.start(0).unwrap();
    sink.tick(S).unwrap();
    sink.finish(2 * S).unwrap();
    let summary = sink.out.summary.expect("a summary");
    assert!(
        summary.starts_with("1 anomalies:\n  Critical bridge_nf_call_iptables_off"),
        "{summary}"
    );
}

#[test]
fn newest_first_and_selection_follows_the_newest_until_moved() {
    let mut app = busy();
    assert_eq!(ids(&app), [5, 4, 3, 2, 1]);
    assert_eq!(app.selected_index(), 0);
    press(&mut app, &[KeyCode::Char('j'), KeyCode::Down]);
    assert_eq!(app.selected, Some(3));
    // A new lookup arrives on top: the selection stays on its lookup.
    let j = journey(
        6,
        "new.example.com.",
        9 * S + 1,
        noerror("A 1.2.3.4"),
        false,
    );
    app.update(Update::Lookup(Box::new(lookup(j, &[], &labels()))));
    assert_eq!(app.selected_index(), 3);
    press(&mut app, &[KeyCode::Char('G')]);
    assert_eq!(app.selected, Some(1));
    press(&mut app, &[KeyCode::Char('k'), KeyCode::Char('g')]);
    assert_eq!(app.selected, Some(6));
}

#[test]
fn enter_opens_the_journey_and_esc_goes_back() {
    let mut app = busy();
    press(&mut app, &[KeyCode::Down, KeyCode::Down, KeyCode::Enter]);
    assert_eq!(app.screen, Screen::Journey(3));
    // In a journey, j and k open the next and previous lookup.
    press(&mut app, &[KeyCode::Char('j')]);
    assert_eq!(app.screen, Screen::Journey(2));
    press(&mut app, &[KeyCode::Esc]);
    assert_eq!(app.screen, Screen::List);
    assert_eq!(app.selected, Some(2));
}

#[test]
fn an_anomaly_filters_the_list_to_its_lookups() {
    let mut app = busy();
    press(&mut app, &[KeyCode::Tab]);
    assert_eq!(app.focus, Focus::Anomalies);
    press(&mut app, &[KeyCode::Enter]);
    assert_eq!(ids(&app), [4]);
    press(&mut app, &[KeyCode::Esc]);
    assert_eq!(ids(&app).len(), 5);
    press(&mut app, &[KeyCode::Tab, KeyCode::Char('a')]);
    assert_eq!(app.focus, Focus::Lookups);
    assert_eq!(ids(&app), [4], "anomalies only");
}

#[test]
fn tab_stays_on_lookups_without_anomalies() {
    let mut app = App::new(About::default(), Arc::new(labels()));
    press(&mut app, &[KeyCode::Tab, KeyCode::Down, KeyCode::Enter]);
    assert_eq!(app.focus, Focus::Lookups);
    assert_eq!(app.screen, Screen::List);
}

#[test]
fn slash_filters_by_name_or_pod() {
    let mut app = busy();
    press(&mut app, &[KeyCode::Char('/')]);
    assert!(app.editing_filter);
    // While typing, q and a are letters, not commands.
    for c in "example.q".chars() {
        press(&mut app, &[KeyCode::Char(c)]);
    }
    assert!(!app.quit);
    press(
        &mut app,
        &[KeyCode::Backspace, KeyCode::Backspace, KeyCode::Enter],
    );
    assert_eq!(app.filter, "example");
    assert_eq!(ids(&app), [5, 4, 3, 2]);
    press(&mut app, &[KeyCode::Char('/')]);
    for c in "WEB-7d9".chars() {
        press(&mut app, &[KeyCode::Char(c)]);
    }
    assert_eq!(ids(&app).len(), 0, "the name and pod must both contain it");
    press(&mut app, &[KeyCode::Esc]);
    assert_eq!(app.filter, "");
    assert_eq!(ids(&app).len(), 5);
}

#[test]
fn pause_freezes_the_list_and_resume_catches_up() {
    let mut app = busy();
    press(&mut app, &[KeyCode::Char('p')]);
    let j = journey(
        6,
        "new.example.com.",
        9 * S + 1,
        noerror("A 1.2.3.4"),
        false,
    );
    app.update(Update::Lookup(Box::new(lookup(j, &[], &labels()))));
    app.update(Update::Anomalies(vec![]));
    assert_eq!(ids(&app), [5, 4, 3, 2, 1], "frozen");
    assert_eq!(app.anomalies.len(), 1, "frozen");
    assert_eq!(app.stats.totals.lookups, 6, "the counts go on");
    press(&mut app, &[KeyCode::Char('p')]);
    assert_eq!(ids(&app), [6, 5, 4, 3, 2, 1]);
    assert!(app.anomalies.is_empty());
}

#[test]
fn help_closes_on_any_key_and_q_or_ctrl_c_quit() {
    let mut app = busy();
    press(&mut app, &[KeyCode::Char('?')]);
    assert!(app.help);
    press(&mut app, &[KeyCode::Char('x')]);
    assert!(!app.help && !app.quit);
    press(&mut app, &[KeyCode::Char('q')]);
    assert!(app.quit);
    let mut app = busy();
    let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
    assert_eq!(action(&app, ctrl_c), Some(Action::Quit));
    app.editing_filter = true;
    assert_eq!(
        action(&app, ctrl_c),
        Some(Action::Quit),
        "even while typing"
    );
}

#[test]
fn the_list_is_bounded_and_the_counts_are_not() {
    let mut app = App::new(About::default(), Arc::new(labels()));
    let l = labels();
    for id in 0..MAX_ROWS as u64 + 10 {
        let j = journey(id, "a.example.", S, noerror("A 1.1.1.1"), false);
        app.update(Update::Lookup(Box::new(lookup(j, &[], &l))));
    }
    assert_eq!(app.rows.len(), MAX_ROWS);
    assert_eq!(
        app.rows.front().map(|r| r.journey.id),
        Some(MAX_ROWS as u64 + 9)
    );
    assert_eq!(app.stats.totals.lookups, MAX_ROWS as u64 + 10);
}

#[test]
fn counts_percentiles_and_rate() {
    let app = busy();
    let t = &app.stats.totals;
    assert_eq!(
        (t.answered, t.nxdomain, t.failed, t.unanswered),
        (2, 1, 1, 1)
    );
    // Answered latencies: 0.33 ms twice (NOERROR, NXDOMAIN), 2.03 ms, SERVFAIL 0.33 ms.
    let [p50, _, p99] = app.stats.percentiles.unwrap();
    assert_eq!(p50, 330_000);
    assert_eq!(p99, 330_000 + 1_700_000);
    // One lookup started in second 9, the last full second.
    assert_eq!(app.stats.rate, 1.0);
}

#[test]
fn journey_legs_nest_the_upstream_query_where_it_happened() {
    let j = journey(
        3,
        "www.example.com.",
        7 * S,
        noerror("A 198.51.100.80"),
        true,
    );
    let d = detail(&j, &labels());
    let shape: Vec<(u8, bool)> = d
        .legs
        .iter()
        .map(|l| (l.depth, l.heading.is_some()))
        .collect();
    assert_eq!(
        shape,
        [
            (0, false),
            (0, false),
            (0, false),
            (0, false),
            (1, true),
            (1, false),
            (1, false),
            (0, false),
            (0, false)
        ]
    );
    assert_eq!(d.legs[2].notes, ["DNAT kube-system/kube-dns (10.96.0.10:53) → kube-system/coredns-7db6d8ff4d-4xk9m (10.244.0.53:53)"]);
    assert_eq!(d.legs[0].from, "web-7d9f8c6b5-x2x4k:40000");
}

#[test]
fn a_leg_in_a_tunnel_says_between_which_nodes() {
    let mut j = journey(
        3,
        "www.example.com.",
        7 * S,
        noerror("A 198.51.100.80"),
        false,
    );
    j.legs[1].underlay = Some(Box::new(crate::decode::Underlay {
        tunnel: crate::decode::Tunnel::Geneve,
        src: "192.168.0.1".parse().unwrap(),
        dst: "192.168.0.2".parse().unwrap(),
        vni: Some(5),
    }));
    let d = detail(&j, &labels());
    assert_eq!(
        d.legs[1].notes,
        ["in geneve node 192.168.0.1 → node 192.168.0.2 (vni 5)"]
    );
    assert!(d.legs[0].notes.is_empty());
}

#[test]
fn snapshot_list_wide() {
    insta::assert_snapshot!(render(&busy(), 120, 32));
}

#[test]
fn snapshot_list_80x24() {
    insta::assert_snapshot!(render(&busy(), 80, 24));
}

/// Only the rows that fit are drawn: the window follows the selection
/// down a long list as the table's own scrolling did.
#[test]
fn snapshot_long_list_scrolled_80x24() {
    let mut app = App::new(About::default(), Arc::new(labels()));
    let l = labels();
    for id in 1..=300 {
        let name = format!("n{id}.example.com.");
        let j = journey(id, &name, S + id, noerror("A 1.1.1.1"), false);
        app.update(Update::Lookup(Box::new(lookup(j, &[], &l))));
    }
    press(&mut app, &[KeyCode::Down; 40]);
    assert_eq!(app.selected, Some(260));
    insta::assert_snapshot!(render(&app, 80, 24));
}

#[test]
fn snapshot_empty_80x24() {
    let app = App::new(
        About {
            target: "the whole node".into(),
            hooks: 3,
            log: None,
        },
        Arc::new(labels()),
    );
    insta::assert_snapshot!(render(&app, 80, 24));
}

#[test]
fn snapshot_anomaly_selected() {
    let mut app = busy();
    press(&mut app, &[KeyCode::Tab, KeyCode::Enter]);
    insta::assert_snapshot!(render(&app, 120, 32));
}

#[test]
fn snapshot_journey() {
    let mut app = busy();
    press(&mut app, &[KeyCode::Down, KeyCode::Down, KeyCode::Enter]);
    insta::assert_snapshot!(render(&app, 120, 24));
}

#[test]
fn snapshot_journey_80x24() {
    let mut app = busy();
    press(&mut app, &[KeyCode::Down, KeyCode::Enter]);
    insta::assert_snapshot!(render(&app, 80, 24));
}

#[test]
fn snapshot_help_paused_and_losing() {
    let mut app = busy();
    press(&mut app, &[KeyCode::Char('p'), KeyCode::Char('?')]);
    app.update(Update::Health(Health {
        now_ns: 11 * S,
        lost: 1234,
        evicted: 7,
        open: 0,
        one_in: 8,
        recording: Some(
            "recording stopped: No space left on device (os error 28); tracing goes on".into(),
        ),
        nodes: Vec::new(),
    }));
    insta::assert_snapshot!(render(&app, 80, 24));
}

/// A cluster view: a line of its nodes under the header, one of them
/// down, one lagging with its clock moved and events dropped.
#[test]
fn snapshot_cluster_nodes() {
    let mut app = busy();
    let node = |name: &str, up, lag_ns, offset_ns, dropped| NodeStatus {
        name: name.into(),
        up,
        lag_ns,
        offset_ns,
        dropped,
    };
    app.update(Update::Health(Health {
        now_ns: 11 * S,
        open: 2,
        one_in: 1,
        nodes: vec![
            node("node1", true, 0, 0, 0),
            node("node2", true, 1_500_000_000, -2_500_000, 17),
            node("node3", false, 0, 0, 0),
        ],
        ..Health::default()
    }));
    insta::assert_snapshot!(render(&app, 120, 32));
}

/// A pod started while tracing is named in the rows built after, and the
/// view's own labels (its journey detail) are replaced too.
#[test]
fn pods_named_while_tracing_name_the_rows_after() {
    use crate::pipeline::JourneyOut as _;
    let (tx, rx) = sync_channel(8);
    let mut out = LiveOut::new(tx, Arc::new(labels()), Arc::default());
    let late = a("10.244.0.99:40000");
    let mut j = journey(1, "a.example.", 0, noerror("A 192.0.2.1"), false);
    j.client = late;
    out.journey(j.clone(), &[]).unwrap();
    out.pods(&crate::target::follow::Refresh {
        names: vec![(late.ip(), "default/late".into())],
        ..Default::default()
    });
    out.journey(j, &[]).unwrap();
    let updates: Vec<Update> = rx.try_iter().collect();
    let pods: Vec<&str> = updates
        .iter()
        .filter_map(|u| match u {
            Update::Lookup(l) => Some(l.pod.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(pods, ["10.244.0.99", "default/late"]);
    let view_labels = updates.iter().find_map(|u| match u {
        Update::Labels(l) => Some(l),
        _ => None,
    });
    assert_eq!(
        view_labels.and_then(|l| l.name(&late.ip())),
        Some("default/late")
    );
}
