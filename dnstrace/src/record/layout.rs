//! Where dnstrace's notes sit in a recording: in the blocks every pcapng
//! tool keeps (tcpdump reads them, editcap cuts them by time, mergecap
//! merges them), and where recordings of format 1 had them, still read.
//!
//! Format 2 (`notes::FORMAT`):
//! - every interface is Linux cooked v2 (LINKTYPE_LINUX_SLL2);
//! - the first, named `dnstrace`, holds the notes. Its comments hold the
//!   file's notes (header, labels, context), each a JSON line, the lines
//!   one after another in comments that start with [`FILE_NOTES`] (an
//!   option holds at most 65,535 bytes, a large cluster's labels more);
//!   its packets, of ethertype [`ETH_P_NOTE`], the notes made as the
//!   capture went (ticks, conntrack events, counters, …), one JSON each,
//!   at the note's time;
//! - a packet's own note (`PacketNote`) is its second comment, after
//!   [`PACKET_NOTE`]; the first is the text Wireshark shows.
//!
//! Format 1 had the file's and the running notes in custom blocks, and a
//! packet's note in a custom option, under IANA's enterprise number for
//! documentation; any custom block or option whose data reads as a note is
//! taken as one.
use std::io;

use super::{
    frame::{self, PacketType, LINKTYPE_LINUX_SLL2},
    notes::{Note, PacketNote},
    pcapng::{Interface, PacketOpt},
};

/// The notes' interface's name.
pub const NOTES_IFACE: &str = "dnstrace";
/// IEEE 802 Local Experimental Ethertype 1: a note's packet.
pub const ETH_P_NOTE: u16 = 0x88b5;
/// What each of the notes' interface's comments starts with.
pub const FILE_NOTES: &str = "dnstrace file notes: ";
/// What a packet's comment with its note starts with.
pub const PACKET_NOTE: &str = "dnstrace packet note: ";
/// An option's largest value.
const MAX_OPTION: usize = u16::MAX as usize;

/// The notes' interface, the file's notes in its comments.
pub fn notes_interface(notes: &[Note]) -> io::Result<Interface> {
    let mut lines = String::new();
    for note in notes {
        lines.push_str(&serde_json::to_string(note).map_err(io::Error::other)?);
        lines.push('\n');
    }
    Ok(Interface {
        linktype: LINKTYPE_LINUX_SLL2,
        snaplen: 0,
        name: NOTES_IFACE.into(),
        description: "dnstrace's notes: the file's in comments, the rest as packets".into(),
        comment: pieces(&lines, MAX_OPTION - FILE_NOTES.len())
            .map(|p| format!("{FILE_NOTES}{p}"))
            .collect(),
    })
}

/// `s` in pieces of at most `max` bytes, cut between characters.
fn pieces(s: &str, max: usize) -> impl Iterator<Item = &str> {
    let mut rest = s;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut at = rest.len().min(max);
        while !rest.is_char_boundary(at) {
            at -= 1;
        }
        let (piece, after) = rest.split_at(at);
        rest = after;
        Some(piece)
    })
}

/// A note's packet: a cooked header of [`ETH_P_NOTE`], then its JSON.
pub fn note_frame(note: &Note) -> io::Result<Vec<u8>> {
    let mut data = frame::cooked_header(ETH_P_NOTE, PacketType::Host).to_vec();
    serde_json::to_writer(&mut data, note).map_err(io::Error::other)?;
    Ok(data)
}

/// A packet's note as its comment: `json` is the note's JSON.
pub fn packet_note_comment(json: &[u8]) -> PacketOpt {
    let mut c = String::with_capacity(PACKET_NOTE.len() + json.len());
    c.push_str(PACKET_NOTE);
    c.push_str(&String::from_utf8_lossy(json));
    PacketOpt::Comment(c)
}

/// Whether `iface` is a recording's notes' interface.
pub fn is_notes(iface: &Interface) -> bool {
    iface.linktype == LINKTYPE_LINUX_SLL2 && iface.name == NOTES_IFACE
}

/// The file's notes, from the notes' interface's comments; a line that
/// does not read as a note is left out.
pub fn file_notes(iface: &Interface) -> Vec<Note> {
    let lines: String = (iface.comment.iter())
        .filter_map(|c| c.strip_prefix(FILE_NOTES))
        .collect();
    lines
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The note a packet of the notes' interface holds, if it is one.
pub fn frame_note(data: &[u8]) -> Option<Note> {
    match frame::cooked_protocol(data)? {
        (ETH_P_NOTE, json) => serde_json::from_slice(json).ok(),
        _ => None,
    }
}

/// A note in a custom block of format 1: JSON, then the zero padding
/// custom blocks get.
pub fn block_note(data: &[u8]) -> Option<Note> {
    let end = data.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    serde_json::from_slice(&data[..end]).ok()
}

/// A packet's note: its comment's (format 2), or its custom option's.
pub fn packet_note(opts: &[PacketOpt]) -> Option<PacketNote> {
    opts.iter().find_map(|o| match o {
        PacketOpt::Comment(c) => serde_json::from_str(c.strip_prefix(PACKET_NOTE)?).ok(),
        PacketOpt::Custom { data, .. } => serde_json::from_slice(data).ok(),
        PacketOpt::Flags(_) => None,
    })
}

/// Whether a packet's note names a drop: the first pass then parses a
/// handful of notes, not every packet's.
pub fn names_drop(opts: &[PacketOpt]) -> bool {
    let named = |data: &[u8]| data.windows(7).any(|w| w == b"\"drop\":");
    opts.iter().any(|o| match o {
        PacketOpt::Comment(c) => c.starts_with(PACKET_NOTE) && named(c.as_bytes()),
        PacketOpt::Custom { data, .. } => named(data),
        PacketOpt::Flags(_) => false,
    })
}

#[cfg(test)]
mod tests;
