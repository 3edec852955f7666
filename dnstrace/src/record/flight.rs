//! The agent's flight recorder: the pipeline's recent inputs kept in
//! memory, bounded by bytes and age, and written out (the `--record`
//! pcapng) when an anomaly is first raised, with what follows for a while.
//! So a postmortem nobody started still has the minutes around the fault.
use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use super::{
    live::{Live, MemoryOptions},
    Meta, RecordOptions, Recorder,
};
use crate::{
    clock::Clock,
    diagnose::Anomaly,
    pipeline::{Input, Tap},
};

/// What the flight recorder is asked for.
#[derive(Clone, Debug)]
pub struct FlightOptions {
    /// Where recordings go (made if missing, mode 0700).
    pub dir: PathBuf,
    /// Bytes of recent inputs kept in memory, at most.
    pub bytes: usize,
    /// Inputs older than this are not kept.
    pub before_ns: u64,
    /// How long a recording goes on after the anomaly that started it.
    pub after_ns: u64,
    /// Recordings kept in `dir`; the oldest go.
    pub files: usize,
    /// In the file names.
    pub node: String,
    /// The latest recording, for whoever reports it.
    pub latest: Arc<Mutex<Option<Flight>>>,
}

impl FlightOptions {
    /// The memory it writes out.
    pub fn memory(&self) -> MemoryOptions {
        MemoryOptions {
            bytes: self.bytes,
            age_ns: self.before_ns,
        }
    }
}

/// The latest recording started for an anomaly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flight {
    /// None when it could not be written.
    pub path: Option<PathBuf>,
    /// The kind of the anomaly that started it.
    pub kind: &'static str,
    /// Recordings started so far.
    pub count: u64,
}

pub struct FlightRecorder {
    options: FlightOptions,
    meta: Meta,
    clock: Clock,
    /// The recent past, kept by the `Live` tap ahead of this one.
    live: Live,
    /// The recording being written and when it ends.
    writing: Option<(Recorder, u64)>,
    now_ns: u64,
    count: u64,
}

impl FlightRecorder {
    pub fn new(options: FlightOptions, meta: Meta, clock: Clock, live: Live) -> Self {
        Self {
            options,
            meta,
            clock,
            live,
            writing: None,
            now_ns: 0,
            count: 0,
        }
    }

    /// A new recording of what is kept, then `a`.
    fn take_off(&mut self, a: &Anomaly) {
        let path = self.path_for(a);
        let options = RecordOptions {
            path: path.clone(),
            max_bytes: None,
            files: None,
        };
        let mut rec = match prepare(&self.options.dir, self.options.files)
            .and_then(|()| Recorder::create(options, self.meta.clone()))
        {
            Ok(rec) => rec,
            Err(e) => {
                log::warn!("flight recorder: {e:#}");
                self.latest(None, a);
                return;
            }
        };
        self.live.with_memory(|m| {
            rec.start(m.oldest_ns().unwrap_or(self.now_ns));
            m.since(0).for_each(|i| rec.input(i));
        });
        rec.anomaly(a);
        log::info!(
            "flight recording of the minutes around {} (replay it with dnstrace replay): {}",
            a.kind,
            path.display()
        );
        self.latest(Some(path), a);
        self.writing = Some((rec, self.now_ns + self.options.after_ns));
    }

    fn latest(&mut self, path: Option<PathBuf>, a: &Anomaly) {
        self.count += 1;
        *self
            .options
            .latest
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Flight {
            path,
            kind: a.kind.as_str(),
            count: self.count,
        });
    }

    /// `dnstrace-flight-NODE-20261127T084500Z-KIND.pcapng`: sorted by time.
    fn path_for(&self, a: &Anomaly) -> PathBuf {
        let time = humantime::format_rfc3339_seconds(self.clock.wall(a.first_ns)).to_string();
        let stamp: String = time.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
        let node: String = self
            .options
            .node
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.options.dir.join(format!(
            "dnstrace-flight-{node}-{stamp}-{}.pcapng",
            a.kind.as_str()
        ))
    }
}

/// Makes `dir`, and removes its oldest recordings to leave room for one
/// more within `files`.
fn prepare(dir: &Path, files: usize) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| anyhow::anyhow!("cannot make {}: {e}", dir.display()))?;
    let mut old: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("dnstrace-flight-") && n.ends_with(".pcapng"))
        })
        .collect();
    old.sort();
    let extra = (old.len() + 1).saturating_sub(files.max(1));
    for p in old.into_iter().take(extra) {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

impl Tap for FlightRecorder {
    fn start(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
    }

    fn input(&mut self, input: &Input) {
        if let Input::Tick(now) = input {
            self.now_ns = self.now_ns.max(*now);
        }
        let ended = match &mut self.writing {
            Some((rec, until)) => {
                rec.input(input);
                self.now_ns >= *until
            }
            None => false,
        };
        if ended {
            if let Some((mut rec, _)) = self.writing.take() {
                rec.end(self.now_ns);
            }
        }
    }

    /// Starts a recording, or notes the anomaly in the one being written.
    fn anomaly(&mut self, a: &Anomaly) {
        match &mut self.writing {
            Some((rec, _)) => rec.anomaly(a),
            None => self.take_off(a),
        }
    }

    fn status_changed(&mut self) -> Option<String> {
        None
    }

    fn end(&mut self, now_ns: u64) {
        if let Some((mut rec, _)) = self.writing.take() {
            rec.end(now_ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        correlate::Limits,
        decode::{KernelNames, Transport},
        diagnose::{AnomalyKind, Context, Severity},
        output::Labels,
        pipeline::Taps,
        pods::testdir::TestDir,
        record::{
            live::size_of,
            tests::{packet, replayed},
        },
    };

    const S: u64 = 1_000_000_000;

    type Latest = Arc<Mutex<Option<Flight>>>;

    /// The flight recorder behind the memory it writes out.
    fn flight_recorder(dir: &Path, bytes: usize) -> (Taps, Latest) {
        let labels = Labels::new(Default::default(), Clock::EPOCH, KernelNames::default());
        let meta = crate::record::meta(&labels, &Context::default(), Limits::default());
        let options = FlightOptions {
            dir: dir.to_owned(),
            bytes,
            before_ns: 60 * S,
            after_ns: S,
            files: 2,
            node: "node-1".into(),
            latest: Arc::default(),
        };
        let latest = options.latest.clone();
        let live = Live::new(MemoryOptions {
            bytes,
            age_ns: 60 * S,
        });
        let f = FlightRecorder::new(options, meta, Clock::EPOCH, live.clone());
        (Taps(vec![Box::new(live), Box::new(f)]), latest)
    }

    /// A packet at `ts` and a tick just after it.
    fn feed(f: &mut Taps, ts: u64) {
        let mut p = packet(
            "10.244.0.10:4000",
            "10.96.0.10:53",
            Transport::Udp,
            &[0u8; 40],
        );
        p.ts_ns = ts;
        f.input(&Input::Packets(vec![p]));
        f.input(&Input::Tick(ts + 1));
    }

    fn anomaly(at: u64) -> Anomaly {
        Anomaly {
            kind: AnomalyKind::Dropped,
            severity: Severity::Critical,
            summary: "dropped".into(),
            evidence: Vec::new(),
            cause: String::new(),
            fix: "",
            about: Vec::new(),
            journeys: Vec::new(),
            count: 1,
            first_ns: at,
            last_ns: at,
        }
    }

    fn packet_times(path: &Path) -> Vec<u64> {
        replayed(path)
            .into_iter()
            .filter_map(|i| match i {
                Input::Packets(b) => Some(b.into_iter().map(|p| p.ts_ns)),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// What memory held before the anomaly (the newest packets), and what
    /// came for `after_ns` past it; nothing later.
    #[test]
    fn an_anomaly_writes_the_recent_past_and_what_follows_for_a_while() {
        let dir = TestDir::new();
        // Room for 4 packets and their ticks.
        let one = Input::Packets(vec![packet(
            "10.244.0.10:4000",
            "10.96.0.10:53",
            Transport::Udp,
            &[0u8; 40],
        )]);
        let (mut f, latest) =
            flight_recorder(dir.path(), 4 * (size_of(&one) + size_of(&Input::Tick(0))));
        f.start(0);
        (1..=10).for_each(|s| feed(&mut f, s * S));
        f.anomaly(&anomaly(10 * S));
        feed(&mut f, 10 * S + S / 2);
        feed(&mut f, 11 * S + S / 2);
        feed(&mut f, 12 * S);
        let latest = latest.lock().unwrap().clone().unwrap();
        let path = latest.path.unwrap();
        assert_eq!(
            path.file_name().unwrap(),
            "dnstrace-flight-node-1-19700101T000010Z-dropped.pcapng"
        );
        assert_eq!(
            packet_times(&path),
            [7 * S, 8 * S, 9 * S, 10 * S, 10 * S + S / 2, 11 * S + S / 2]
        );
    }

    #[test]
    fn the_oldest_recordings_go_past_the_cap() {
        let dir = TestDir::new();
        let (mut f, latest) = flight_recorder(dir.path(), 1 << 20);
        f.start(0);
        for at in [10, 20, 30] {
            feed(&mut f, at * S);
            f.anomaly(&anomaly(at * S));
            feed(&mut f, at * S + 2 * S);
        }
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "dnstrace-flight-node-1-19700101T000020Z-dropped.pcapng",
                "dnstrace-flight-node-1-19700101T000030Z-dropped.pcapng"
            ]
        );
        assert_eq!(latest.lock().unwrap().as_ref().unwrap().count, 3);
    }
}
