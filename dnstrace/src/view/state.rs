//! The live view's state and the actions that change it; drawing reads it
//! and never changes it.
use std::{collections::VecDeque, sync::Arc};

use super::model::{AnomalyKey, AnomalyRow, Lookup};
use crate::decode::Rcode;
use crate::output::Labels;
use crate::pipeline::Health;

/// Lookups kept for the list; older ones leave the window (the counts and
/// percentiles still include them).
pub const MAX_ROWS: usize = 2000;
/// Latencies kept for the percentiles: the most recent ones.
const MAX_LATENCIES: usize = 20_000;
/// Seconds of history in the charts.
pub const CHART_SECONDS: usize = 120;
/// Latency samples kept per second for its p95.
const SAMPLES_PER_SECOND: usize = 4096;

/// What the capture sends the view.
#[derive(Debug)]
pub enum Update {
    Lookup(Box<Lookup>),
    Anomalies(Vec<AnomalyRow>),
    Health(Health),
    /// Names learnt while tracing (pods started or re-created).
    Labels(Arc<Labels>),
}

/// Fixed facts shown in the header.
#[derive(Clone, Debug, Default)]
pub struct About {
    /// `pod default/web-… (10.244.0.10)`, or `node`.
    pub target: String,
    pub hooks: usize,
    /// Where the log lines go while the view is up.
    pub log: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Screen {
    List,
    Journey(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Focus {
    Lookups,
    Anomalies,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Up,
    Down,
    Top,
    Bottom,
    PageUp,
    PageDown,
    Open,
    Back,
    SwitchFocus,
    StartFilter,
    FilterChar(char),
    FilterBackspace,
    FilterDone,
    AnomaliesOnly,
    Pause,
    Help,
    Quit,
}

/// Counters over every lookup seen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub lookups: u64,
    pub answered: u64,
    pub nxdomain: u64,
    pub failed: u64,
    pub unanswered: u64,
}

/// One second of history for the charts.
#[derive(Clone, Debug, Default)]
struct Second {
    at: u64,
    lookups: u64,
    samples: Vec<u64>,
}

#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub totals: Totals,
    latencies: VecDeque<u64>,
    seconds: VecDeque<Second>,
    /// Cached when updates arrive, so drawing only reads.
    pub percentiles: Option<[u64; 3]>,
    pub per_second: Vec<u64>,
    pub p95_per_second: Vec<u64>,
    pub rate: f64,
}

impl Stats {
    fn add(&mut self, l: &Lookup) {
        let t = &mut self.totals;
        t.lookups += 1;
        match &l.status {
            s if s.failed() => t.failed += 1,
            super::model::Status::Timeout => t.unanswered += 1,
            super::model::Status::Answered { rcode, .. } if *rcode == Rcode::NXDOMAIN => {
                t.nxdomain += 1
            }
            _ => t.answered += 1,
        }
        let second = l.journey.started_ns / 1_000_000_000;
        if self.seconds.back().is_none_or(|s| s.at < second) {
            if self.seconds.len() == CHART_SECONDS {
                self.seconds.pop_front();
            }
            self.seconds.push_back(Second {
                at: second,
                ..Default::default()
            });
        }
        // Journeys close out of start order; a late one counts in the
        // second it started if that second is still kept.
        let slot = self.seconds.iter_mut().rev().find(|s| s.at <= second);
        if let Some(s) = slot {
            s.lookups += 1;
            if let Some(ns) = l
                .latency_ns
                .filter(|_| s.samples.len() < SAMPLES_PER_SECOND)
            {
                s.samples.push(ns);
            }
        }
        if let Some(ns) = l.latency_ns {
            if self.latencies.len() == MAX_LATENCIES {
                self.latencies.pop_front();
            }
            self.latencies.push_back(ns);
        }
    }

    /// Recomputes what drawing shows; `now_s` is the current second.
    fn refresh(&mut self, now_s: u64) {
        let mut sorted: Vec<u64> = self.latencies.iter().copied().collect();
        sorted.sort_unstable();
        self.percentiles =
            (!sorted.is_empty()).then(|| [50, 95, 99].map(|p| sorted[rank(sorted.len(), p)]));
        let start = now_s.saturating_sub(CHART_SECONDS as u64 - 1);
        self.per_second = (start..=now_s)
            .map(|s| self.second(s).map_or(0, |x| x.lookups))
            .collect();
        self.p95_per_second = (start..=now_s)
            .map(|s| self.second(s).map_or(0, p95))
            .collect();
        // The last full second.
        self.rate = self
            .second(now_s.saturating_sub(1))
            .map_or(0, |s| s.lookups) as f64;
    }

    fn second(&self, at: u64) -> Option<&Second> {
        self.seconds.iter().find(|s| s.at == at)
    }
}

/// The nearest-rank index of percentile `p` among `n` sorted values.
fn rank(n: usize, p: usize) -> usize {
    (n * p).div_ceil(100).saturating_sub(1)
}

fn p95(s: &Second) -> u64 {
    let mut v = s.samples.clone();
    v.sort_unstable();
    v.get(rank(v.len(), 95)).copied().unwrap_or(0)
}

/// Lookups and anomalies that arrived while the view was paused.
#[derive(Debug, Default)]
pub struct Held {
    pub rows: VecDeque<Lookup>,
    anomalies: Option<Vec<AnomalyRow>>,
}

pub struct App {
    pub about: About,
    /// What names things on a journey's own screen.
    pub labels: Arc<Labels>,
    /// Newest first.
    pub rows: VecDeque<Lookup>,
    pub anomalies: Vec<AnomalyRow>,
    pub health: Health,
    pub stats: Stats,
    pub screen: Screen,
    pub focus: Focus,
    /// The selected lookup; None follows the newest.
    pub selected: Option<u64>,
    pub selected_anomaly: usize,
    /// The anomaly whose journeys the list shows, and whose details.
    pub anomaly_filter: Option<AnomalyKey>,
    pub filter: String,
    pub editing_filter: bool,
    pub anomalies_only: bool,
    pub help: bool,
    /// While paused, what arrives waits here (bounded like the list).
    pub held: Option<Held>,
    pub quit: bool,
    /// Updates the capture could not hand over (the view fell behind).
    pub dropped_updates: u64,
}

impl App {
    pub fn new(about: About, labels: Arc<Labels>) -> Self {
        Self {
            about,
            labels,
            rows: VecDeque::new(),
            anomalies: Vec::new(),
            health: Health::default(),
            stats: Stats::default(),
            screen: Screen::List,
            focus: Focus::Lookups,
            selected: None,
            selected_anomaly: 0,
            anomaly_filter: None,
            filter: String::new(),
            editing_filter: false,
            anomalies_only: false,
            help: false,
            held: None,
            quit: false,
            dropped_updates: 0,
        }
    }

    pub fn update(&mut self, u: Update) {
        match u {
            Update::Lookup(l) => {
                self.stats.add(&l);
                match &mut self.held {
                    Some(held) => push_bounded(&mut held.rows, *l),
                    None => push_bounded(&mut self.rows, *l),
                }
            }
            Update::Anomalies(a) => match &mut self.held {
                Some(held) => held.anomalies = Some(a),
                None => self.anomalies = a,
            },
            Update::Health(h) => {
                self.health = h;
                self.stats.refresh(self.health.now_ns / 1_000_000_000);
            }
            Update::Labels(labels) => self.labels = labels,
        }
    }

    /// The lookups the list shows now, newest first.
    pub fn visible(&self) -> impl Iterator<Item = &Lookup> {
        self.rows.iter().filter(|l| self.shows(l))
    }

    fn shows(&self, l: &Lookup) -> bool {
        if self.anomalies_only && l.badges.is_empty() {
            return false;
        }
        if let Some(key) = &self.anomaly_filter {
            let listed = self
                .anomalies
                .iter()
                .any(|a| &a.key == key && a.journeys.contains(&l.journey.id));
            if !listed && !l.badges.contains(key) {
                return false;
            }
        }
        let f = self.filter.to_lowercase();
        f.is_empty()
            || l.journey.name.to_lowercase().contains(&f)
            || l.pod.to_lowercase().contains(&f)
    }

    /// Index of the selected lookup in `visible()`.
    pub fn selected_index(&self) -> usize {
        self.selected
            .and_then(|id| self.visible().position(|l| l.journey.id == id))
            .unwrap_or(0)
    }

    pub fn lookup(&self, id: u64) -> Option<&Lookup> {
        self.rows.iter().find(|l| l.journey.id == id)
    }

    pub fn apply(&mut self, a: Action) {
        if self.help {
            // Any key closes the help; q still quits.
            self.help = false;
            self.quit = a == Action::Quit;
            return;
        }
        match a {
            Action::Quit => self.quit = true,
            Action::Help => self.help = true,
            Action::Pause => self.toggle_pause(),
            Action::StartFilter => self.editing_filter = true,
            Action::FilterChar(c) => self.filter.push(c),
            Action::FilterBackspace => drop(self.filter.pop()),
            Action::FilterDone => self.editing_filter = false,
            Action::AnomaliesOnly => self.anomalies_only = !self.anomalies_only,
            Action::SwitchFocus => self.switch_focus(),
            Action::Open => self.open(),
            Action::Back => self.back(),
            Action::Up => self.step(-1),
            Action::Down => self.step(1),
            Action::PageUp => self.step(-10),
            Action::PageDown => self.step(10),
            Action::Top => self.step(isize::MIN / 2),
            Action::Bottom => self.step(isize::MAX / 2),
        }
    }

    fn toggle_pause(&mut self) {
        match self.held.take() {
            Some(held) => {
                for l in held.rows.into_iter().rev() {
                    push_bounded(&mut self.rows, l);
                }
                if let Some(a) = held.anomalies {
                    self.anomalies = a;
                }
            }
            None => self.held = Some(Held::default()),
        }
    }

    fn switch_focus(&mut self) {
        self.focus = match self.focus {
            Focus::Lookups if !self.anomalies.is_empty() => Focus::Anomalies,
            _ => Focus::Lookups,
        };
    }

    fn open(&mut self) {
        match (self.screen, self.focus) {
            (Screen::List, Focus::Anomalies) => {
                let key = self
                    .anomalies
                    .get(self.selected_anomaly)
                    .map(|a| a.key.clone());
                self.anomaly_filter = if self.anomaly_filter == key {
                    None
                } else {
                    key
                };
                self.selected = None;
            }
            (Screen::List, Focus::Lookups) => {
                let id = self
                    .visible()
                    .nth(self.selected_index())
                    .map(|l| l.journey.id);
                if let Some(id) = id {
                    self.selected = Some(id);
                    self.screen = Screen::Journey(id);
                }
            }
            (Screen::Journey(_), _) => {}
        }
    }

    fn back(&mut self) {
        if self.editing_filter {
            self.editing_filter = false;
            self.filter.clear();
        } else if let Screen::Journey(_) = self.screen {
            self.screen = Screen::List;
        } else if self.anomaly_filter.is_some() {
            self.anomaly_filter = None;
        } else {
            self.filter.clear();
            self.anomalies_only = false;
        }
    }

    /// Moves the selection `by` rows (positive: older); in a journey, opens
    /// the next one.
    fn step(&mut self, by: isize) {
        if self.screen == Screen::List && self.focus == Focus::Anomalies {
            let last = self.anomalies.len().saturating_sub(1);
            self.selected_anomaly = self.selected_anomaly.saturating_add_signed(by).min(last);
            return;
        }
        let ids: Vec<u64> = self.visible().map(|l| l.journey.id).collect();
        let Some(last) = ids.len().checked_sub(1) else {
            return;
        };
        let at = self.selected_index().saturating_add_signed(by).min(last);
        self.selected = Some(ids[at]);
        if let Screen::Journey(_) = self.screen {
            self.screen = Screen::Journey(ids[at]);
        }
    }
}

fn push_bounded(rows: &mut VecDeque<Lookup>, l: Lookup) {
    if rows.len() == MAX_ROWS {
        rows.pop_back();
    }
    rows.push_front(l);
}
