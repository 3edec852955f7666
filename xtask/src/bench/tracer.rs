//! dnstrace under test: started with the bench's hooks, stopped as a user
//! would, its exit line read back.
use super::*;

pub(super) enum Hooks {
    Tracepoints,
    Tc(Vec<String>),
}

impl Hooks {
    pub(super) fn short(&self) -> &'static str {
        match self {
            Hooks::Tracepoints => "tracepoints",
            Hooks::Tc(_) => "tc",
        }
    }
}

/// How dnstrace under test shows what it traces.
#[derive(Clone, Copy)]
pub(super) enum Output {
    Json,
    Text,
    /// The live view, on a terminal of the bench's own.
    View,
}

impl Output {
    pub(super) fn flags(self) -> &'static [&'static str] {
        match self {
            Output::Json => &["-o", "json"],
            Output::Text => &["-o", "text"],
            Output::View => &[],
        }
    }

    pub(super) fn describe(self) -> &'static str {
        match self {
            Output::Json => "JSON lines (`-o json`)",
            Output::Text => "text lines (`-o text`)",
            Output::View => "the live view (on a terminal)",
        }
    }
}

pub(super) struct Tracer {
    pub(super) proc: Proc,
    pub(super) startup: Duration,
}

/// What dnstrace said when it stopped.
pub(super) struct TraceExit {
    pub(super) cpu: f64,
    pub(super) packets: u64,
    pub(super) lost: u64,
    pub(super) evicted: u64,
    pub(super) journeys: u64,
    pub(super) targets: String,
    /// Packets the sampling level left out, and 1 lookup in how many it
    /// kept at the end (1 when it never sampled).
    pub(super) shed: u64,
    pub(super) one_in: u64,
    /// The fewest it kept at any time while it ran: 1 lookup in how many
    /// (1 when it never sampled).
    pub(super) deepest: u64,
}

impl std::fmt::Display for TraceExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "dnstrace: {} packets, {} journeys, {} events lost, {} evicted, {:.1} s CPU",
            self.packets, self.journeys, self.lost, self.evicted, self.cpu
        )
    }
}

/// One run of dnstrace under dnsperf at a fixed rate.
pub(super) struct Offered {
    pub(super) rate: u32,
    pub(super) perf: Option<PerfResult>,
    /// Its exit line, or (stopped at the first loss) the events lost by then.
    pub(super) exit: std::result::Result<TraceExit, u64>,
    pub(super) lost_after: Option<Duration>,
    /// dnstrace's CPU seconds while dnsperf ran.
    pub(super) cpu: f64,
}

impl Offered {
    /// No event lost, no journey evicted, no lookup left out by sampling,
    /// and the lab answered (nearly) all.
    pub(super) fn clean(&self) -> bool {
        let sustained = self
            .perf
            .as_ref()
            .is_some_and(|p| p.lost as f64 <= p.sent as f64 * 0.005);
        matches!(&self.exit, Ok(e) if e.lost == 0 && e.evicted == 0 && e.shed == 0) && sustained
    }

    pub(super) fn brief(&self) -> String {
        let answered = self.perf.as_ref().map_or("?".into(), |p| {
            format!(
                "{} answered",
                pct(p.completed as f64 / p.sent.max(1) as f64)
            )
        });
        match (&self.exit, self.lost_after) {
            (Ok(e), _) => format!(
                "{answered}, {} events lost, {} evicted, {} packets left out by sampling",
                e.lost, e.evicted, e.shed
            ),
            // dnsperf, stopped, counts what was still outstanding as lost.
            (Err(lost), Some(t)) => format!(
                "events lost from {:.0} s on ({lost} by then)",
                t.as_secs_f64()
            ),
            (Err(lost), None) => format!("{answered}, {lost} events lost"),
        }
    }
}

impl std::fmt::Display for Offered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(p) = &self.perf {
            write!(f, "{p}; ")?;
        }
        match &self.exit {
            Ok(e) => write!(f, "{e}"),
            Err(_) => write!(f, "{}", self.brief()),
        }?;
        write!(f, "; {:.1} s CPU while dnsperf ran", self.cpu)
    }
}

impl Tracer {
    /// Events lost so far: the kernel's count in dnstrace's COUNTS map (read
    /// with bpftool), or its latest "N events lost so far" warning, which
    /// comes late when it is busy.
    pub(super) fn lost_so_far(&self) -> u64 {
        let said = self
            .proc
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(_, l)| number_before(l, " events lost so far"))
            .max()
            .unwrap_or(0);
        said.max(lost_in_map(self.pid()).unwrap_or(0))
    }

    /// When dnstrace warned of lost events, in seconds from `start`, and
    /// its total by then: a loss in a long run says when it came.
    pub(super) fn loss_times(&self, start: Instant) -> Vec<(f64, u64)> {
        let lines = self.proc.lines.lock().unwrap();
        lines
            .iter()
            .filter_map(|(at, l)| {
                let total = number_before(l, " events lost so far")?;
                Some((at.saturating_duration_since(start).as_secs_f64(), total))
            })
            .collect()
    }

    pub(super) fn pid(&self) -> i32 {
        self.proc.pid
    }

    /// Ctrl-C, as a user would, and its exit line.
    pub(super) fn stop(self) -> Result<TraceExit> {
        let ended = self.proc.stop(libc::SIGINT, Duration::from_secs(120))?;
        let sampled = ended
            .output
            .lines()
            .find(|l| l.starts_with("dnstrace: sampling left out "));
        let line = ended
            .output
            .lines()
            .find(|l| {
                l.starts_with("dnstrace: ")
                    && l.contains(" DNS packets")
                    && l.contains(" events lost")
            })
            .ok_or_else(|| {
                anyhow!(
                    "dnstrace ended without its summary: {}",
                    ended.output.trim()
                )
            })?;
        let get = |suffix: &str| {
            number_before(line, suffix)
                .ok_or_else(|| anyhow!("no `N{suffix}` in dnstrace's exit line {line:?}"))
        };
        Ok(TraceExit {
            cpu: ended.cpu,
            packets: get(" DNS packets")?,
            lost: get(" events lost")?,
            evicted: get(" evicted")?,
            journeys: get(" journeys")?,
            targets: line
                .split_once("detached from ")
                .map_or("", |(_, t)| t)
                .to_owned(),
            shed: sampled
                .and_then(|l| number_before(l, " packets"))
                .unwrap_or(0),
            one_in: sampled
                .and_then(|l| number_before(l, " kept at the end"))
                .unwrap_or(1),
            deepest: ended
                .output
                .lines()
                .filter_map(|l| number_before(l, ", each whole"))
                .max()
                .unwrap_or(1),
        })
    }
}

/// The number just before `suffix` in `line`.
pub(super) fn number_before(line: &str, suffix: &str) -> Option<u64> {
    let head = &line[..line.find(suffix)?];
    let digits: String = head
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.chars().rev().collect::<String>().parse().ok()
}

// ---------------------------------------------------------------- processes
