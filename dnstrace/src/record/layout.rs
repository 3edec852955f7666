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
//!   at the note's time: in pieces where it is over what tcpdump and
//!   editcap take of a packet, each piece but the last with the comment
//!   [`NOTE_CONTINUES`];
//! - a packet's own note (`PacketNote`) is its second comment, after
//!   [`PACKET_NOTE`]; the first is the text Wireshark shows;
//! - every interface, the notes' too, has a comment [`RECORDING`] naming
//!   its recording (node, start and clock offset: what `same_capture`
//!   compares, so a rotated file's parts share it). mergecap keeps each
//!   input's interfaces apart, but does not say whose they are: the mark
//!   tells two recordings merged into one file apart. Files written
//!   before it have none.
//!
//! Format 1 had the file's and the running notes in custom blocks, and a
//! packet's note in a custom option, under IANA's enterprise number for
//! documentation; any custom block or option whose data reads as a note is
//! taken as one.
use std::{collections::HashMap, io};

use super::{
    frame::{self, PacketType, LINKTYPE_LINUX_SLL2},
    notes::{Header, Note, PacketNote},
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
/// The comment of a note's piece that the next piece continues.
pub const NOTE_CONTINUES: &str = "dnstrace note continues";
/// What the comment naming an interface's recording starts with.
pub const RECORDING: &str = "dnstrace recording: ";
/// An option's largest value.
const MAX_OPTION: usize = u16::MAX as usize;
/// The largest packet libpcap and Wireshark read (their snapshot length's
/// cap for Linux cooked v2): a note's piece is no larger.
const MAX_PACKET: usize = 262_144;
/// The most of a note held while its pieces come: a block's cap.
const MAX_NOTE: usize = super::pcapng::MAX_BLOCK as usize;

/// The notes' interface, the file's notes in its comments, and its
/// recording's mark where they have a header.
pub fn notes_interface(notes: &[Note]) -> io::Result<Interface> {
    let mut lines = String::new();
    for note in notes {
        lines.push_str(&serde_json::to_string(note).map_err(io::Error::other)?);
        lines.push('\n');
    }
    let mark = notes.iter().find_map(|n| match n {
        Note::Header(h) => Some(mark(h)),
        _ => None,
    });
    Ok(Interface {
        linktype: LINKTYPE_LINUX_SLL2,
        snaplen: 0,
        name: NOTES_IFACE.into(),
        description: "dnstrace's notes: the file's in comments, the rest as packets".into(),
        comment: mark
            .into_iter()
            .chain(
                pieces(&lines, MAX_OPTION - FILE_NOTES.len()).map(|p| format!("{FILE_NOTES}{p}")),
            )
            .collect(),
    })
}

/// The comment that marks an interface as the recording's of `h`.
pub fn mark(h: &Header) -> String {
    // The node last: a name may hold spaces.
    format!(
        "{RECORDING}{} {} {}",
        h.started_ns, h.clock_offset_ns, h.node
    )
}

/// The recording `iface` is marked as of, if it is marked.
pub fn recording(iface: &Interface) -> Option<&str> {
    iface.comment.iter().find_map(|c| c.strip_prefix(RECORDING))
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

/// A packet of a note: its frame, and whether the next one continues it.
#[derive(Debug, PartialEq, Eq)]
pub struct NotePacket {
    pub data: Vec<u8>,
    pub continues: bool,
}

impl NotePacket {
    /// Its comment, if it has one.
    pub fn opts(&self) -> Vec<PacketOpt> {
        match self.continues {
            true => vec![PacketOpt::Comment(NOTE_CONTINUES.into())],
            false => Vec::new(),
        }
    }
}

/// A note's packets: each a cooked header of [`ETH_P_NOTE`], then its JSON
/// or the next piece of it.
pub fn note_packets(note: &Note) -> io::Result<Vec<NotePacket>> {
    let json = serde_json::to_vec(note).map_err(io::Error::other)?;
    let header = frame::cooked_header(ETH_P_NOTE, PacketType::Host);
    let pieces: Vec<&[u8]> = json.chunks(MAX_PACKET - header.len()).collect();
    let last = pieces.len() - 1;
    Ok(pieces
        .into_iter()
        .enumerate()
        .map(|(i, piece)| NotePacket {
            data: [&header[..], piece].concat(),
            continues: i < last,
        })
        .collect())
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

/// Notes read from their packets, put back together from their pieces,
/// each notes' interface's apart (mergecap keeps one per file).
#[derive(Default)]
pub struct NoteReader {
    pieces: HashMap<u32, Vec<u8>>,
}

impl NoteReader {
    /// A new section: its interfaces are others.
    pub fn section(&mut self) {
        self.pieces.clear();
    }

    /// The note that a packet of the notes' interface `iface` ends, if it
    /// ends one; a note that does not read (a piece missing) is left out.
    pub fn packet(&mut self, iface: u32, data: &[u8], opts: &[PacketOpt]) -> Option<Note> {
        let (ETH_P_NOTE, piece) = frame::cooked_protocol(data)? else {
            return None;
        };
        let continues = opts
            .iter()
            .any(|o| matches!(o, PacketOpt::Comment(c) if c == NOTE_CONTINUES));
        if continues {
            let held = self.pieces.entry(iface).or_default();
            if held.len() + piece.len() > MAX_NOTE {
                self.pieces.remove(&iface);
            } else {
                held.extend_from_slice(piece);
            }
            return None;
        }
        match self.pieces.remove(&iface) {
            Some(mut held) => {
                held.extend_from_slice(piece);
                serde_json::from_slice(&held).ok()
            }
            None => serde_json::from_slice(piece).ok(),
        }
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
