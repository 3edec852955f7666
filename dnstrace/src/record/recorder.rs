//! `--record`: every input of the pipeline written to pcapng as it goes,
//! packets as frames tcpdump and Wireshark read, the rest as dnstrace's
//! notes (where they go: `layout`).
//! Each block is written whole, so a file cut short (kill -9, power loss)
//! reads up to its last complete block; a write error stops the recording,
//! never the tracing.
use std::{
    collections::HashMap,
    fmt::Write as _,
    fs::OpenOptions,
    io::{self, BufWriter},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::PathBuf,
};

use anyhow::{Context as _, Result};

use super::{
    frame::{self, LINKTYPE_LINUX_SLL2},
    layout,
    notes::{CtEventNote, Note, PacketNote},
    pcapng::{Interface, PacketOpt, Writer, FLAG_INBOUND, FLAG_OUTBOUND},
    Meta,
};
use crate::{
    clock::Clock,
    decode::Packet,
    diagnose::Anomaly,
    pipeline::{Input, Tap},
};
use dnstrace_common::Direction;

pub struct RecordOptions {
    pub path: PathBuf,
    /// Start a new file past this many bytes.
    pub max_bytes: Option<u64>,
    /// Reuse the oldest file past this many.
    pub files: Option<u32>,
}

pub struct Recorder {
    /// None for a stream, which has no files to rotate.
    options: Option<RecordOptions>,
    meta: Meta,
    out: Option<Out>,
    /// Files started so far, minus one.
    part: u32,
    status: String,
    status_sent: bool,
}

/// One open file and the interfaces described in it.
struct Out {
    w: Writer<Box<dyn io::Write + Send>>,
    /// The notes' interface.
    notes: u32,
    /// Each interface's comment saying whose it is (`layout::mark`).
    mark: String,
    ifaces: HashMap<(String, u32, u8), u32>,
}

impl Recorder {
    pub fn create(options: RecordOptions, meta: Meta) -> Result<Self> {
        let path = options.path.clone();
        let out = open(&path, &meta, 0)
            .with_context(|| format!("cannot record to {}", path.display()))?;
        Ok(Self {
            status: format!("recording to {}", path.display()),
            options: Some(options),
            meta,
            out: Some(out),
            part: 0,
            status_sent: false,
        })
    }

    /// A recording written to `w` as it goes (a cluster view's stream).
    pub fn to_writer(w: Box<dyn io::Write + Send>, meta: Meta) -> Result<Self> {
        let out = start(w, &meta, 0).context("cannot start the stream")?;
        Ok(Self {
            status: "streaming".into(),
            options: None,
            meta,
            out: Some(out),
            part: 0,
            status_sent: false,
        })
    }

    /// What is buffered, written out.
    pub fn flush(&mut self) {
        self.write(|out| out.w.flush());
    }
}

impl Tap for Recorder {
    fn input(&mut self, input: &Input) {
        match input {
            Input::Packets(batch) => batch.iter().for_each(|p| self.packet(p)),
            Input::Conntrack { now_ns, events } => self.note(&Note::Conntrack {
                now_ns: *now_ns,
                events: events.iter().map(CtEventNote::of).collect(),
            }),
            Input::Counters { now_ns, moved } => self.note(&Note::Counters {
                now_ns: *now_ns,
                moved: moved.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect(),
            }),
            Input::Lost {
                since_ns,
                now_ns,
                total,
            } => self.note(&Note::Lost {
                since_ns: *since_ns,
                now_ns: *now_ns,
                total: *total,
            }),
            Input::Sample(c) => self.note(&Note::Sample {
                since_ns: c.since_ns,
                now_ns: c.now_ns,
                shift: c.level.shift,
                seed: c.level.seed,
                viewed: c.viewed.ips().to_vec(),
                node: c.node.0,
            }),
            Input::Pods { now_ns, refresh } => {
                if let Some(j) = &refresh.joined {
                    self.meta.joined(j);
                }
                self.note(&Note::Pods {
                    now_ns: *now_ns,
                    refresh: refresh.clone(),
                });
            }
            Input::Tick(now_ns) => {
                self.note(&Note::Tick { now_ns: *now_ns });
                // What a kill -9 can lose: one tick's worth.
                self.write(|out| out.w.flush());
            }
        }
    }

    fn anomaly(&mut self, a: &Anomaly) {
        match serde_json::to_value(a) {
            Ok(anomaly) => self.note(&Note::Anomaly { anomaly }),
            Err(e) => self.stop(&io::Error::other(e)),
        }
    }

    fn start(&mut self, now_ns: u64) {
        self.note(&Note::Start { now_ns });
    }

    fn end(&mut self, now_ns: u64) {
        self.note(&Note::End { now_ns });
        self.write(|out| out.w.flush());
    }

    /// The status line, once after each change.
    fn status_changed(&mut self) -> Option<String> {
        (!std::mem::replace(&mut self.status_sent, true)).then(|| self.status.clone())
    }
}

impl Recorder {
    /// A note: packets of the notes' interface at its time, all in one
    /// file.
    fn note(&mut self, note: &Note) {
        let ts_ns = wall_ns(self.meta.clock, note.time_ns());
        match layout::note_packets(note) {
            Ok(packets) => self.write(|out| {
                for p in &packets {
                    let len = p.data.len() as u32;
                    out.w.packet(out.notes, ts_ns, &p.data, len, &p.opts())?;
                }
                Ok(())
            }),
            Err(e) => self.stop(&e),
        }
    }

    fn packet(&mut self, p: &Packet) {
        let place = self.meta.place(p);
        let clock = self.meta.clock;
        let note = PacketNote::of(p, |at| self.meta.kernel.location(at));
        let comment = comment(p, &place, note.drop.as_ref().map(|d| d.at.as_str()));
        // Sized for a note with a conntrack entry: grown from empty, it
        // was copied over several times.
        let mut json = Vec::with_capacity(512);
        note.write_json(&mut json);
        let wall_ns = wall_ns(clock, p.ts_ns);
        let flags = match p.hook.direction() {
            Direction::Ingress => FLAG_INBOUND,
            Direction::Egress => FLAG_OUTBOUND,
            Direction::Drop | Direction::Nat | Direction::Clash => 0,
        };
        let f = frame::cooked(p);
        let opts = [
            PacketOpt::Flags(flags),
            PacketOpt::Comment(comment),
            layout::packet_note_comment(&json),
        ];
        self.write(|out| {
            let id = out.interface(&place, p)?;
            out.w.packet(id, wall_ns, &f.data, f.orig_len, &opts)
        });
    }

    /// Runs `op` on the open file; a failure stops the recording.
    fn write(&mut self, op: impl FnOnce(&mut Out) -> io::Result<()>) {
        let Some(out) = &mut self.out else { return };
        if let Err(e) = op(out) {
            return self.stop(&e);
        }
        let full = self
            .options
            .as_ref()
            .and_then(|o| o.max_bytes)
            .is_some_and(|max| out.w.bytes_written() >= max);
        if full {
            self.rotate();
        }
    }

    fn rotate(&mut self) {
        if let Some(mut out) = self.out.take() {
            if let Err(e) = out.w.flush() {
                return self.stop(&e);
            }
        }
        let Some(options) = &self.options else { return };
        self.part += 1;
        let index = options.files.map_or(self.part, |n| self.part % n);
        let path = path_of(&options.path, index);
        match open(&path, &self.meta, self.part) {
            Ok(out) => {
                self.out = Some(out);
                self.set_status(format!("recording to {}", path.display()));
            }
            Err(e) => self.stop(&e),
        }
    }

    fn stop(&mut self, e: &io::Error) {
        self.out = None;
        let status = format!("recording stopped: {e}; tracing goes on");
        log::warn!("{status}");
        self.set_status(status);
    }

    fn set_status(&mut self, status: String) {
        self.status = status;
        self.status_sent = false;
    }
}

/// FILE for the first file, FILE.1, FILE.2, … after it.
fn path_of(path: &std::path::Path, index: u32) -> PathBuf {
    match index {
        0 => path.to_owned(),
        n => PathBuf::from(format!("{}.{n}", path.display())),
    }
}

/// Creates (or empties) a file only its owner reads, and starts it.
fn open(path: &std::path::Path, meta: &Meta, part: u32) -> io::Result<Out> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // `mode` applies to new files only.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    start(
        Box::new(BufWriter::with_capacity(64 << 10, file)),
        meta,
        part,
    )
}

/// Writes the section header and the notes' interface, with dnstrace's
/// notes about the capture.
fn start(w: Box<dyn io::Write + Send>, meta: &Meta, part: u32) -> io::Result<Out> {
    let mut w = Writer::new(w, &meta.section)?;
    let mut header = meta.header.clone();
    header.part = part;
    let notes = w.interface(&layout::notes_interface(&[
        Note::Header(header),
        Note::Labels(meta.labels.clone()),
        Note::Context(meta.context.clone()),
    ])?)?;
    Ok(Out {
        w,
        notes,
        mark: layout::mark(&meta.header),
        ifaces: HashMap::new(),
    })
}

/// A monotonic time as the wall clock's, in nanoseconds since the epoch:
/// pcapng's timestamps.
fn wall_ns(clock: Clock, mono_ns: u64) -> u64 {
    clock
        .wall(mono_ns)
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl Out {
    /// The interface block of a hook point, described on first use.
    fn interface(&mut self, place: &str, p: &Packet) -> io::Result<u32> {
        let key = (place.to_owned(), p.netns, p.hook as u8);
        if let Some(id) = self.ifaces.get(&key) {
            return Ok(*id);
        }
        let name = match p.netns {
            0 => place.to_owned(),
            ns => format!("{place}@{ns}"),
        };
        let id = self.w.interface(&Interface {
            linktype: LINKTYPE_LINUX_SLL2,
            snaplen: 0,
            description: format!(
                "dnstrace {} ({}) on {name}",
                p.hook.name(),
                p.hook.direction().name()
            ),
            name,
            comment: vec![self.mark.clone()],
        })?;
        self.ifaces.insert(key, id);
        Ok(id)
    }
}

/// What Wireshark shows as the packet's comment.
fn comment(p: &Packet, place: &str, drop_at: Option<&str>) -> String {
    // Written in place: a `format!` a part made and copied a string each.
    let mut c = String::with_capacity(160);
    let _ = write!(c, "dnstrace: {} on {place}", p.hook.name());
    if p.netns != 0 {
        let _ = write!(c, " in netns {}", p.netns);
    }
    if let Some((a, b)) = p.ct.as_deref().and_then(|ct| ct.dnat()) {
        let _ = write!(c, "; DNAT {a} → {b}");
    }
    if let Some((a, b)) = p.ct.as_deref().and_then(|ct| ct.snat()) {
        let _ = write!(c, "; SNAT {a} → {b}");
    }
    if let Some(at) = drop_at {
        let _ = write!(c, "; dropped at {at}");
    }
    c
}
