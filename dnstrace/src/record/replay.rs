//! `dnstrace replay FILE`: a recording's inputs, in order, as a pipeline
//! source. dnstrace's own recordings give back exactly what the live
//! pipeline was fed; plain captures (tcpdump's pcap or pcapng) give their
//! DNS packets, with ticks made from their timestamps.
use std::{
    collections::{HashMap, VecDeque},
    fs::File,
    io::{BufReader, Read},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use dnstrace_common::{sample::MAX_SHIFT, Hook, SampleLevel};
use tokio::time::Instant;

use super::{
    frame::{self, LINKTYPE_RAW},
    layout,
    notes::{self, ContextNote, DropNote, Header, LabelsNote, Note, PacketNote, FORMAT},
    pcapng::{Block, PacketOpt, ReadError, Reader},
};
use crate::{
    clock::Clock,
    correlate::Limits,
    decode::{KernelNames, NodeId, Packet},
    diagnose::Context,
    ingest::{SampleChange, Viewed},
    naming::Names,
    output::Labels,
    pipeline::{Input, Source},
};

/// Packets handed over at once.
const BATCH: usize = 1024;
/// How often a plain capture's clock ticks, in its own time.
const TICK_NS: u64 = 100_000_000;

/// What a dnstrace recording says about itself; absent from plain captures.
#[derive(Clone, Debug, Default)]
pub struct About {
    pub header: Option<Header>,
    pub labels: LabelsNote,
    pub context: ContextNote,
    /// Drop locations as the recording machine named them.
    pub locations: HashMap<u64, String>,
    /// When the recorded pipeline started.
    pub started_ns: Option<u64>,
    /// The first packet's timestamp: a plain capture's start.
    pub first_ns: Option<u64>,
    /// The highest part of the capture seen (mergecap's merge of its
    /// rotated files holds several), whose labels and context are kept.
    latest_part: u32,
    /// Its recording's mark (`layout::mark`; "" for what is not marked)
    /// where the file holds several: its replay reads only what is so
    /// marked.
    pub recording: Option<String>,
}

impl About {
    /// Reads what the file says about itself, and checks it can be replayed:
    /// a first pass that stops at the first damaged block. A file of
    /// several recordings is refused: [`About::read_each`] reads those.
    #[cfg(any(test, feature = "bench"))]
    pub fn read(path: &Path) -> Result<Self> {
        Self::scan(open(path)?, path)
    }

    /// What the file `reader` reads says about itself, a file of one
    /// recording; `path` names it in errors.
    pub(crate) fn scan<R: Read>(reader: Reader<R>, path: &Path) -> Result<Self> {
        let mut each = Self::scan_each(reader, path)?;
        if each.len() > 1 {
            bail!(
                "{}: {} recordings merged into one file; replay it with dnstrace replay",
                path.display(),
                each.len()
            );
        }
        Ok(each.remove(0))
    }

    /// What each recording in the file says about itself (mergecap's
    /// merge of several holds them, each interface marked with its own:
    /// `layout::mark`), the one that started first first; one alone for a
    /// file of one recording (or of none).
    pub fn read_each(path: &Path) -> Result<Vec<Self>> {
        Self::scan_each(open(path)?, path)
    }

    /// [`About::read_each`] over any reader.
    pub(crate) fn scan_each<R: Read>(mut reader: Reader<R>, path: &Path) -> Result<Vec<Self>> {
        let mut each: Vec<Self> = Vec::new();
        // Each interface of the section: whether it is the notes', and
        // its recording's place in `each`.
        let mut ifaces: Vec<(bool, usize)> = Vec::new();
        let mut pieces = layout::NoteReader::default();
        while let Ok(Some(block)) = reader.next_block() {
            match block {
                Block::Section { .. } => {
                    ifaces.clear();
                    pieces.section();
                }
                Block::Interface { iface, .. } => {
                    let at = Self::of(&mut each, layout::recording(&iface).unwrap_or(""));
                    ifaces.push((layout::is_notes(&iface), at));
                    if layout::is_notes(&iface) {
                        each[at].file_notes(layout::file_notes(&iface), path)?;
                    }
                }
                Block::Custom { data, .. } => {
                    if let Some(note) = layout::block_note(&data) {
                        let at = Self::of(&mut each, "");
                        each[at].file_notes(vec![note], path)?;
                    }
                }
                Block::Packet {
                    iface,
                    ts_ns,
                    data,
                    opts,
                    ..
                } => match ifaces.get(iface as usize) {
                    Some(&(true, at)) => {
                        if let Some(note) = pieces.packet(iface, &data, &opts) {
                            each[at].file_notes(vec![note], path)?;
                        }
                    }
                    Some(&(false, at)) => each[at].packet(ts_ns, &opts),
                    None => {
                        let at = Self::of(&mut each, "");
                        each[at].packet(ts_ns, &opts);
                    }
                },
            }
        }
        Ok(Self::in_order(each))
    }

    /// The place in `each` of the recording marked `mark` ("": of what
    /// is not marked), added if new.
    fn of(each: &mut Vec<Self>, mark: &str) -> usize {
        if let Some(at) = each
            .iter()
            .position(|a| a.recording.as_deref() == Some(mark))
        {
            return at;
        }
        each.push(Self {
            recording: Some(mark.to_owned()),
            ..Self::default()
        });
        each.len() - 1
    }

    /// A packet of a captured interface: the first's time, drops' places.
    fn packet(&mut self, ts_ns: u64, opts: &[PacketOpt]) {
        self.first_ns.get_or_insert(ts_ns);
        if let Some(d) = dropped(opts) {
            self.locations.insert(d.location, d.at);
        }
    }

    /// The recordings by when they started, on their wall clocks (those
    /// without a header last): the first is the merge's reference, as it
    /// would be given first. One alone is the file's: its replay reads
    /// every interface, as one of a file before marks did.
    fn in_order(mut each: Vec<Self>) -> Vec<Self> {
        let start = |a: &Self| {
            let h = a.header.as_ref()?;
            Some((
                i128::from(h.started_ns) + i128::from(h.clock_offset_ns),
                h.node.clone(),
            ))
        };
        each.sort_by_key(|a| (start(a).is_none(), start(a)));
        match &mut each[..] {
            [] => vec![Self::default()],
            [one] => {
                one.recording = None;
                each
            }
            _ => each,
        }
    }

    /// Notes of one file of the capture (a header first, where they have
    /// one): the labels and context are its latest file's.
    fn file_notes(&mut self, notes: Vec<Note>, path: &Path) -> Result<()> {
        let mut latest = true;
        for note in notes {
            match note {
                Note::Header(h) => latest = self.header(h, path)?,
                Note::Labels(l) if latest => self.labels = l,
                Note::Context(c) if latest => self.context = c,
                Note::Start { now_ns } => {
                    self.started_ns.get_or_insert(now_ns);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Keeps the header of the capture's first file; whether `h`'s file is
    /// the latest seen. Two captures under one mark, or none (mergecap's
    /// merge of two recordings written before the marks), are refused:
    /// their packets can no longer be told apart.
    fn header(&mut self, h: Header, path: &Path) -> Result<bool> {
        if h.format > FORMAT {
            bail!(
                "{}: written by dnstrace {} in a newer format ({}); use that version or newer",
                path.display(),
                h.dnstrace,
                h.format
            );
        }
        let Some(first) = &mut self.header else {
            self.latest_part = h.part;
            self.header = Some(h);
            return Ok(true);
        };
        if !first.same_capture(&h) {
            bail!(
                "{}: two recordings (of {} and {}) merged into one file, written before dnstrace marked \
                 whose each interface is: their packets can no longer be told apart; \
                 replay the recordings' own files together instead: dnstrace replay A.pcapng B.pcapng",
                path.display(),
                first.node_name(),
                h.node_name()
            );
        }
        let latest = h.part >= self.latest_part;
        self.latest_part = self.latest_part.max(h.part);
        if h.part < first.part {
            *first = h;
        }
        Ok(latest)
    }

    /// Names as the recording machine knew them.
    pub fn labels(&self) -> Labels {
        let offset = self.header.as_ref().map_or(0, |h| h.clock_offset_ns);
        let kernel = KernelNames::recorded(
            self.labels.drop_reasons.clone().into_iter().collect(),
            self.locations.clone(),
        );
        let names = Names::from_entries(self.labels.names.clone())
            .with_workloads(self.labels.workloads.clone());
        Labels::new(
            self.labels.iface_names.clone().into_iter().collect(),
            Clock::with_offset(offset),
            kernel,
        )
        .with_names(names)
        .with_nodes(self.labels.nodes.clone())
    }

    /// What the rules know, with the recording's names for evidence.
    pub fn context(&self) -> Context {
        Context {
            names: Names::from_entries(self.labels.names.clone()),
            ..self.context.clone().context()
        }
    }

    /// `replay of FILE (node lab-node; pod default/web)`: the file, and
    /// what it traced where the recording says.
    pub fn headline(&self, files: &str) -> String {
        let node = self.header.as_ref().and_then(|h| h.scope.as_ref());
        let what: Vec<String> = node
            .map(|n| format!("node {n}"))
            .into_iter()
            .chain(self.context.target.as_ref().map(|t| t.label.clone()))
            .collect();
        match what.is_empty() {
            true => format!("replay of {files}"),
            false => format!("replay of {files} ({})", what.join("; ")),
        }
    }

    /// The journey limits the recording was made with.
    pub fn limits(&self) -> Limits {
        let mut limits = Limits::default();
        if let Some(h) = &self.header {
            limits.timeout_ns = h.timeout_ns;
            limits.max_open = h.max_open;
        }
        limits
    }
}

fn open(path: &Path) -> Result<Reader<BufReader<File>>> {
    let file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    Reader::new(BufReader::with_capacity(256 << 10, file))
        .map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// A packet's drop note, read only where its note names one.
fn dropped(opts: &[PacketOpt]) -> Option<DropNote> {
    layout::names_drop(opts)
        .then(|| layout::packet_note(opts)?.drop)
        .flatten()
}

/// How fast to replay: as fast as possible, or at a multiple of real time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Speed {
    Fast,
    Times(f64),
}

#[cfg(test)]
#[test]
fn speeds_parse() {
    assert_eq!("fast".parse(), Ok(Speed::Fast));
    assert_eq!("1".parse(), Ok(Speed::Times(1.0)));
    assert_eq!("10x".parse(), Ok(Speed::Times(10.0)));
    assert!("0".parse::<Speed>().is_err());
    assert!("-2".parse::<Speed>().is_err());
    assert!("slow".parse::<Speed>().is_err());
}

impl std::str::FromStr for Speed {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "fast" {
            return Ok(Self::Fast);
        }
        match s.trim_end_matches('x').parse::<f64>() {
            Ok(x) if x > 0.0 && x.is_finite() => Ok(Self::Times(x)),
            _ => Err(format!(
                "{s:?}: `fast`, or how many times real time (1 for real time, 10x, 0.5)"
            )),
        }
    }
}

pub struct Replay<R: Read = BufReader<File>> {
    path: PathBuf,
    reader: Reader<R>,
    /// Each interface of the current section.
    ifaces: Vec<Iface>,
    /// The recording replayed, of several in the file (`About::recording`).
    only: Option<String>,
    notes: layout::NoteReader,
    ports: Vec<u16>,
    queued: VecDeque<Input>,
    batch: Vec<Packet>,
    now_ns: u64,
    /// Plain captures have no recorded ticks; their clock makes them.
    make_ticks: bool,
    last_tick: u64,
    pacer: Pacer,
    done: bool,
    /// Why the replay stopped early, said after what came before it.
    pub error: Option<anyhow::Error>,
    /// Frames that were not DNS, or did not parse.
    pub skipped: u64,
    /// Where the file was cut short (inside a block), said once the
    /// inputs before it are out.
    cut_at: Option<u64>,
}

impl Replay {
    pub fn open(path: &Path, about: &About, ports: Vec<u16>, speed: Speed) -> Result<Self> {
        Ok(Self::with_reader(path, open(path)?, about, ports, speed))
    }
}

impl<R: Read> Replay<R> {
    /// A replay of what `reader` holds; `path` names it in messages.
    pub(crate) fn with_reader(
        path: &Path,
        reader: Reader<R>,
        about: &About,
        ports: Vec<u16>,
        speed: Speed,
    ) -> Self {
        Self {
            path: path.to_owned(),
            reader,
            ifaces: Vec::new(),
            only: about.recording.clone(),
            notes: layout::NoteReader::default(),
            ports,
            queued: VecDeque::new(),
            batch: Vec::new(),
            now_ns: about
                .started_ns
                .or(about.header.as_ref().map(|h| h.started_ns))
                .or(about.first_ns)
                .unwrap_or(0),
            make_ticks: about.header.is_none(),
            last_tick: 0,
            pacer: Pacer::new(speed),
            done: false,
            error: None,
            skipped: 0,
            cut_at: None,
        }
    }

    /// The next input, without pacing; None at the end.
    pub(crate) fn next_input(&mut self) -> Option<Input> {
        self.fill();
        self.queued.pop_front()
    }

    /// Reads blocks until an input is ready (or the file ends).
    fn fill(&mut self) {
        while self.queued.is_empty() && !self.done {
            match self.reader.next_block() {
                Ok(Some(block)) => self.block(block),
                Ok(None) => self.done = true,
                Err(ReadError::Truncated { offset }) => {
                    self.cut_at = Some(offset);
                    self.done = true;
                }
                Err(e) => {
                    self.error = Some(anyhow!("{}: {e}", self.path.display()));
                    self.done = true;
                }
            }
            if self.done || self.batch.len() >= BATCH {
                self.flush_batch();
            }
        }
    }

    fn block(&mut self, block: Block) {
        match block {
            Block::Section { .. } => {
                self.ifaces.clear();
                self.notes.section();
            }
            Block::Interface { iface, .. } => self.ifaces.push(Iface {
                notes: layout::is_notes(&iface),
                mine: self.mine_of(layout::recording(&iface)),
                linktype: iface.linktype,
                name: iface.name,
            }),
            Block::Packet { iface, .. } if !self.mine(iface) => {}
            Block::Packet {
                iface, data, opts, ..
            } if self.is_notes(iface) => {
                if let Some(note) = self.notes.packet(iface, &data, &opts) {
                    self.note(note);
                }
            }
            Block::Packet {
                iface,
                ts_ns,
                data,
                opts,
                ..
            } => self.packet(iface, ts_ns, &data, &opts),
            // Format 1's: not marked.
            Block::Custom { .. } if !self.mine_of(None) => {}
            Block::Custom { data, .. } => {
                if let Some(note) = layout::block_note(&data) {
                    self.note(note);
                }
            }
        }
    }

    /// Whether `iface` is of the recording replayed; an undescribed one
    /// is of none.
    fn mine(&self, iface: u32) -> bool {
        match self.ifaces.get(iface as usize) {
            Some(i) => i.mine,
            None => self.mine_of(None),
        }
    }

    /// Whether what is marked `mark` is of the recording replayed.
    fn mine_of(&self, mark: Option<&str>) -> bool {
        (self.only.as_deref()).is_none_or(|m| m == mark.unwrap_or(""))
    }

    fn is_notes(&self, iface: u32) -> bool {
        self.ifaces.get(iface as usize).is_some_and(|i| i.notes)
    }

    /// A note, queued after the packets before it if it is an input.
    fn note(&mut self, note: Note) {
        if let Some(input) = self.input(note) {
            self.flush_batch();
            self.queued.push_back(input);
        }
    }

    /// The input a note stands for, if it is one.
    fn input(&mut self, note: Note) -> Option<Input> {
        let input = match note {
            Note::Tick { now_ns } => Input::Tick(now_ns),
            Note::Conntrack { now_ns, events } => Input::Conntrack {
                now_ns,
                events: events.iter().map(|e| e.event()).collect(),
            },
            Note::Counters { now_ns, moved } => Input::Counters {
                now_ns,
                moved: notes::counters(&moved),
            },
            Note::Lost {
                since_ns,
                now_ns,
                total,
            } => Input::Lost {
                since_ns,
                now_ns,
                total,
            },
            Note::Sample {
                since_ns,
                now_ns,
                shift,
                seed,
                viewed,
                node,
            } => Input::Sample(SampleChange {
                since_ns,
                now_ns,
                // Past the strictest level: the agent's pause between its
                // windows, which keeps nothing.
                level: match shift {
                    s if s > MAX_SHIFT => SampleLevel::PAUSED,
                    s => SampleLevel { shift: s, seed },
                },
                budget: false,
                node: NodeId(node),
                viewed: Viewed::new(viewed),
            }),
            Note::Pods { now_ns, refresh } => Input::Pods { now_ns, refresh },
            Note::End { now_ns } => {
                self.now_ns = self.now_ns.max(now_ns);
                return None;
            }
            Note::Header(_)
            | Note::Labels(_)
            | Note::Context(_)
            | Note::Start { .. }
            | Note::Anomaly { .. } => return None,
        };
        self.now_ns = self.now_ns.max(time_of(&input).unwrap_or(0));
        Some(input)
    }

    fn packet(&mut self, iface: u32, ts_ns: u64, data: &[u8], opts: &[PacketOpt]) {
        let (linktype, name) = self
            .ifaces
            .get(iface as usize)
            .map_or((LINKTYPE_RAW, String::new()), |i| {
                (i.linktype, i.name.clone())
            });
        let packet = match layout::packet_note(opts) {
            Some(note) => recorded(&note, linktype, data),
            None => self.captured(linktype, iface, name, ts_ns, data),
        };
        let Some(p) = packet else {
            self.skipped += 1;
            return;
        };
        if self.make_ticks && p.ts_ns.saturating_sub(self.last_tick) >= TICK_NS {
            self.flush_batch();
            self.last_tick = p.ts_ns;
            self.queued.push_back(Input::Tick(p.ts_ns));
        }
        self.now_ns = self.now_ns.max(p.ts_ns);
        self.batch.push(p);
    }

    /// A packet of a plain capture: what its frame shows, at one place.
    fn captured(
        &self,
        linktype: u16,
        iface: u32,
        name: String,
        ts_ns: u64,
        data: &[u8],
    ) -> Option<Packet> {
        let d = frame::decode(linktype, data).ok().flatten()?;
        let dns = |p: u16| self.ports.contains(&p);
        // A later fragment has no ports to tell: its first one decides
        // whether it is put back together with anything.
        let later = d.frag.is_some_and(|f| !f.is_first());
        if !later && !dns(d.src.port()) && !dns(d.dst.port()) {
            return None;
        }
        Some(Packet {
            ts_ns,
            node: NodeId::default(),
            netns: 0,
            ifindex: iface + 1,
            hook: Hook::DevReceive,
            src: d.src,
            dst: d.dst,
            transport: d.transport,
            wire_len: data.len() as u32,
            payload_len: d.payload_len,
            truncated: d.truncated,
            frag: d.frag,
            payload: Bytes::copy_from_slice(d.payload),
            ifname: Some(if name.is_empty() {
                format!("if{iface}").into()
            } else {
                name.into()
            }),
            ct: None,
            drop: None,
            underlay: d.underlay.map(Box::new),
        })
    }

    fn flush_batch(&mut self) {
        if !self.batch.is_empty() {
            let batch = std::mem::take(&mut self.batch);
            self.queued.push_back(Input::Packets(batch));
        }
    }

    /// Says where the file was cut short, if it was, once.
    pub(super) fn warn_cut(&mut self) {
        if let Some(offset) = self.cut_at.take() {
            log::warn!(
                "{}: the recording was cut short at byte {offset} (inside a block); replayed what came before",
                self.path.display()
            );
        }
    }
}

/// An interface of the section being replayed.
struct Iface {
    /// The notes' (`layout`): its packets are notes.
    notes: bool,
    /// Of the recording replayed.
    mine: bool,
    linktype: u16,
    name: String,
}

/// Replays inputs at the chosen speed.
pub(super) struct Pacer {
    speed: Speed,
    /// The first time seen, and when it was replayed.
    start: Option<(u64, Instant)>,
}

impl Pacer {
    pub(super) fn new(speed: Speed) -> Self {
        Self { speed, start: None }
    }

    /// Waits until `input` is due.
    pub(super) async fn pace(&mut self, input: &Input) {
        let (Speed::Times(x), Some(t)) = (self.speed, time_of(input)) else {
            return;
        };
        let (t0, start) = *self.start.get_or_insert((t, Instant::now()));
        let due = Duration::from_nanos((t.saturating_sub(t0) as f64 / x) as u64);
        tokio::time::sleep_until(start + due).await;
    }
}

/// A recorded packet: the frame gives addresses and payload, the note the
/// rest (a later fragment's ports included).
fn recorded(note: &PacketNote, linktype: u16, data: &[u8]) -> Option<Packet> {
    let d = frame::decode(linktype, data).ok().flatten()?;
    let (mut src, mut dst) = (d.src, d.dst);
    if let Some(f) = &note.frag {
        src.set_port(f.ports[0]);
        dst.set_port(f.ports[1]);
    }
    Some(Packet {
        ts_ns: note.mono_ns,
        node: NodeId(note.node),
        netns: note.netns,
        ifindex: note.ifindex,
        hook: Hook::from_u8(note.hook)?,
        src,
        dst,
        transport: d.transport,
        wire_len: note.wire_len,
        payload_len: note.payload_len,
        truncated: note.truncated,
        frag: note.frag.map(|f| f.fragment()),
        payload: Bytes::copy_from_slice(d.payload),
        ifname: note.ifname.as_deref().map(std::sync::Arc::from),
        ct: note.conntrack().map(Box::new),
        drop: note.dropped(),
        underlay: None,
    })
}

/// When an input happened.
pub(super) fn time_of(input: &Input) -> Option<u64> {
    match input {
        Input::Packets(b) => b.last().map(|p| p.ts_ns),
        Input::Conntrack { now_ns, .. }
        | Input::Counters { now_ns, .. }
        | Input::Lost { now_ns, .. }
        | Input::Sample(SampleChange { now_ns, .. })
        | Input::Pods { now_ns, .. }
        | Input::Tick(now_ns) => Some(*now_ns),
    }
}

impl<R: Read> Source for Replay<R> {
    fn now(&self) -> u64 {
        self.now_ns
    }

    async fn next(&mut self) -> Result<Option<Input>> {
        let Some(input) = self.next_input() else {
            self.warn_cut();
            return Ok(None);
        };
        self.pacer.pace(&input).await;
        Ok(Some(input))
    }

    fn rest(&mut self) -> Vec<Input> {
        Vec::new()
    }
}
