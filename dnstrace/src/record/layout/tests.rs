use std::collections::BTreeMap;

use super::*;
use crate::record::{
    notes::{Header, LabelsNote, FORMAT},
    pcapng::{Block, Reader, SectionInfo, Writer},
};

fn header() -> Header {
    Header {
        format: FORMAT,
        dnstrace: "0.1.0".into(),
        kernel: "6.1".into(),
        node: "node1".into(),
        target: None,
        command: vec!["dnstrace".into()],
        started_ns: 7,
        clock_offset_ns: -3,
        timeout_ns: 5,
        max_open: 9,
        part: 2,
        scope: None,
    }
}

/// Labels of a large cluster: 4,000 names, some of two-byte characters,
/// over 200 KB of JSON.
fn big_labels() -> LabelsNote {
    let names: BTreeMap<_, _> = (0..4_000u32)
        .map(|i| {
            let ip = std::net::Ipv4Addr::from(0x0af4_0000 + i).into();
            (ip, format!("namespace-é{i}/pod-ü-{i:0>30}"))
        })
        .collect();
    LabelsNote {
        names,
        ..Default::default()
    }
}

fn json(notes: &[Note]) -> Vec<String> {
    notes
        .iter()
        .map(|n| serde_json::to_string(n).unwrap())
        .collect()
}

/// Written to a file and read back.
fn through_a_file(iface: &Interface) -> Interface {
    let mut out = Vec::new();
    let mut w = Writer::new(&mut out, &SectionInfo::default()).unwrap();
    w.interface(iface).unwrap();
    drop(w);
    let blocks: Vec<Block> = Reader::new(&out[..]).unwrap().map(Result::unwrap).collect();
    match &blocks[..] {
        [Block::Section { .. }, Block::Interface { iface, .. }] => iface.clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn file_notes_over_an_options_size_are_cut_into_comments_and_put_back() {
    let notes = [
        Note::Header(header()),
        Note::Labels(big_labels()),
        Note::Context(Default::default()),
    ];
    let iface = notes_interface(&notes).unwrap();
    assert!(is_notes(&iface));
    assert!(iface.comment.len() >= 5, "{}", iface.comment.len());
    // The recording's mark first, then the notes.
    assert_eq!(iface.comment[0], mark(&header()));
    for c in &iface.comment[1..] {
        assert!(
            c.starts_with(FILE_NOTES) && c.len() <= MAX_OPTION,
            "{}",
            c.len()
        );
    }
    let back = through_a_file(&iface);
    assert_eq!(back, iface);
    assert_eq!(json(&file_notes(&back)), json(&notes));
}

#[test]
fn pieces_are_cut_between_characters() {
    let s = "aé€😀b".repeat(7);
    for max in 4..12 {
        let ps: Vec<&str> = pieces(&s, max).collect();
        assert!(ps.iter().all(|p| !p.is_empty() && p.len() <= max), "{ps:?}");
        assert_eq!(ps.concat(), s);
    }
    assert_eq!(pieces("", 4).count(), 0);
}

/// Comments of other tools (an editor's) on the notes' interface, and
/// lines that are not notes, are left out.
#[test]
fn other_comments_are_not_file_notes() {
    let mut iface = notes_interface(&[Note::Header(header())]).unwrap();
    iface.comment.insert(0, "edited by hand".into());
    iface
        .comment
        .push(format!("{FILE_NOTES}{{\"type\":\"nonsense\"}}\n"));
    assert_eq!(json(&file_notes(&iface)), json(&[Note::Header(header())]));
    let plain = Interface {
        linktype: LINKTYPE_LINUX_SLL2,
        name: "eth0".into(),
        ..iface
    };
    assert!(!is_notes(&plain));
}

#[test]
fn a_notes_packet_reads_back_and_no_other_frame_does() {
    let tick = Note::Tick { now_ns: 42 };
    let [packet] = &note_packets(&tick).unwrap()[..] else {
        panic!("one packet")
    };
    let data = &packet.data;
    assert!(!packet.continues && packet.opts().is_empty());
    assert_eq!(&data[..2], &ETH_P_NOTE.to_be_bytes());
    let mut notes = NoteReader::default();
    assert_eq!(json(&[notes.packet(0, data, &[]).unwrap()]), json(&[tick]));
    let mut ip = data.clone();
    ip[..2].copy_from_slice(&0x0800u16.to_be_bytes());
    assert!(notes.packet(0, &ip, &[]).is_none());
    assert!(notes.packet(0, &data[..19], &[]).is_none());
    assert!(notes.packet(0, &data[..30], &[]).is_none(), "cut JSON");
}

/// A burst of 20,000 conntrack events: over a megabyte of JSON, in pieces
/// tcpdump and editcap read, put back together, each notes' interface's
/// apart; one with a piece missing (a window's cut) is left out.
#[test]
fn a_note_over_a_packets_size_goes_in_pieces() {
    use crate::record::notes::CtEventNote;
    let a = |s: &str| s.parse().unwrap();
    let event = CtEventNote {
        kind: crate::conntrack::CtEventKind::New,
        proto: 17,
        status: 8,
        original: [a("10.244.0.10:40000"), a("10.96.0.10:53")],
        reply: [a("10.244.0.53:53"), a("10.244.0.10:40000")],
    };
    let big = Note::Conntrack {
        now_ns: 1,
        events: vec![event; 20_000],
    };
    let packets = note_packets(&big).unwrap();
    assert!(packets.len() >= 5, "{}", packets.len());
    assert!(packets.iter().all(|p| p.data.len() <= MAX_PACKET));
    let last = packets.len() - 1;
    assert!(packets
        .iter()
        .enumerate()
        .all(|(i, p)| p.continues == (i < last)));
    let mut notes = NoteReader::default();
    let mut back = Vec::new();
    for p in &packets {
        // Another file's note between the pieces, on its own interface.
        back.extend(notes.packet(
            1,
            &note_packets(&Note::Tick { now_ns: 2 }).unwrap()[0].data,
            &[],
        ));
        back.extend(notes.packet(0, &p.data, &p.opts()));
    }
    assert_eq!(back.len(), packets.len() + 1);
    assert_eq!(json(&back[last + 1..last + 2]), json(&[big]));
    for p in packets.iter().skip(1) {
        assert!(notes.packet(0, &p.data, &p.opts()).is_none());
    }
}

fn packet_note_json(drop: bool) -> Vec<u8> {
    let p = crate::record::tests::packet(
        "10.0.0.1:4000",
        "10.0.0.2:53",
        crate::decode::Transport::Udp,
        b"x",
    );
    let mut note = PacketNote::of(&p, |_| "nf_hook_slow".into());
    if drop {
        note.drop = Some(crate::record::notes::DropNote {
            reason: 2,
            location: 1,
            at: "nf_hook_slow".into(),
        });
    }
    let mut out = Vec::new();
    note.write_json(&mut out);
    out
}

/// Format 2's comment and format 1's custom option (under any number)
/// read as the same note; the human comment is not one.
#[test]
fn a_packet_note_reads_from_either_format() {
    for drop in [false, true] {
        let json = packet_note_json(drop);
        let note: PacketNote = serde_json::from_slice(&json).unwrap();
        let human = PacketOpt::Comment("dnstrace: tc_egress on eth0".into());
        let new = [
            PacketOpt::Flags(2),
            human.clone(),
            packet_note_comment(&json),
        ];
        let old = [
            human,
            PacketOpt::Custom {
                pen: 1,
                data: json.clone(),
            },
        ];
        for opts in [&new[..], &old[..]] {
            assert_eq!(packet_note(opts).as_ref(), Some(&note));
            assert_eq!(names_drop(opts), drop);
        }
    }
    let none = [
        PacketOpt::Comment(format!("{PACKET_NOTE}{{")),
        PacketOpt::Flags(1),
    ];
    assert_eq!(packet_note(&none), None);
}

#[test]
fn a_format_1_block_note_reads_through_its_padding() {
    let mut data = serde_json::to_vec(&Note::End { now_ns: 3 }).unwrap();
    data.resize(data.len().next_multiple_of(4) + 4, 0);
    assert!(matches!(block_note(&data), Some(Note::End { now_ns: 3 })));
    assert!(block_note(b"{\"kind\":\"anomaly\"}\0\0").is_none());
}
