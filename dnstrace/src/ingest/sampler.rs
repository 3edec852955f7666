//! The sampling level: when events are lost or about to be (the ring
//! filling behind a full queue or a reader without a core), the kernel
//! keeps fewer lookups, each whole (see `dnstrace_common::sample`), rather
//! than losing events at random from all of them; when it has kept up for
//! a while, it keeps more again. Until then it keeps every lookup.
use std::{net::IpAddr, sync::Arc};

use dnstrace_common::{sample::MAX_SHIFT, SampleLevel};
use tokio::sync::watch;

use crate::{
    clock::monotonic_now,
    decode::NodeId,
    probes::{Counts, DeviceHooks, SampleMap, ViewMap},
};

/// The kernel's level became `level` at some moment from `since_ns` to
/// `now_ns` (before and after user space set it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleChange {
    pub since_ns: u64,
    pub now_ns: u64,
    pub level: SampleLevel,
    /// Set by the budget of lookups followed, not by overload.
    pub budget: bool,
    /// The node whose kernel it is, in a merged replay.
    pub node: NodeId,
    /// Whose lookups the kernel follows whole besides, for cluster views.
    pub viewed: Viewed,
}

/// The client addresses cluster views follow whole, whatever the level:
/// their lookups' packets, and those of the same label on the node (a
/// resolver's queries upstream for them), are all kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Viewed(Arc<[IpAddr]>);

impl Viewed {
    pub fn new(ips: impl IntoIterator<Item = IpAddr>) -> Self {
        let mut ips: Vec<IpAddr> = ips.into_iter().collect();
        ips.sort_unstable();
        ips.dedup();
        Self(ips.into())
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.binary_search(&ip).is_ok()
    }

    pub fn ips(&self) -> &[IpAddr] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// How the level is chosen (`--sample`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleMode {
    /// Everything, fewer while the pipeline falls behind.
    Auto,
    /// 1 lookup in 2^shift, whatever the load.
    Fixed(u32),
}

/// Ticks in a row with the ring filling (past `Fill::RING_HIGH` and fuller
/// than at the tick before) before the level rises: the reader lagging
/// once (a wait for a core) is no overload.
const HIGH_TICKS: u32 = 2;
/// Between two rises, for the first to show in the queue.
const RAISE_GAP_NS: u64 = 250_000_000;
/// How long the queue and the ring must stay nearly empty before the
/// level falls; doubled, up to `MAX_CALM_NS`, each time a fall overloads
/// the pipeline again within twice that.
const CALM_NS: u64 = 10_000_000_000;
const MAX_CALM_NS: u64 = 160_000_000_000;
/// While sampling, a new seed this often: a level keeps some names and
/// not others, and with few names in the traffic a few seconds may keep
/// none; over time every name has its turn. Not much more often: a
/// journey open across the change is left out unless both seeds keep it,
/// and an unanswered one is open 5.5 s.
const RESEED_NS: u64 = 30_000_000_000;
/// Lookups followed past this many times the budget: the level passes a
/// name or two that carry much of the traffic (a level keeps names, not
/// lookups), and a new seed is drawn at once to leave them out.
const OVER_BUDGET: f64 = 2.0;
/// Between such draws: a measure (200 ms at least) wholly under the seed.
const REDRAW_GAP_NS: u64 = 500_000_000;
/// With windows (`Governor::with_windows`), the device hooks follow this
/// long at a time: a journey open across either edge is left out (see
/// `correlate::sampling`), most lookups last milliseconds. Short, so that
/// a burst of 2^spread times the budget stays short, and a cycle (8 s at
/// most) leaves few incidents unseen.
const WINDOW_NS: u64 = 1_000_000_000;
/// At most this many levels of the governor's are spent on time rather
/// than names: a window in 8, each following 8 times the names. Lower
/// costs the kernel more between windows; higher, bursts the pipeline
/// more within them.
const MAX_SPREAD: u32 = 3;

/// How full the reader's queue and the kernel's ring were at a tick, as
/// fractions of what they hold, and whether the kernel lost events since
/// the last.
#[derive(Clone, Copy, Debug)]
pub struct Fill {
    pub queue: f64,
    pub ring: f64,
    pub lost: bool,
    /// What fills them was kept under the present level: the pipeline has
    /// taken everything queued before the level last changed. Until then
    /// a full queue says nothing of the new level.
    pub current: bool,
}

impl Fill {
    /// The kernel wakes the reader past each quarter of the ring: past
    /// half, the reader could not drain it, because the queue is full (the
    /// pipeline is behind by as much as the ring holds) or it had no core.
    const RING_HIGH: f64 = 0.5;

    /// The ring filling, past half and fuller than `before`: events are
    /// about to be lost. A ring that holds its level drains as fast as it
    /// fills; a queue filling while the ring stays drained is a stall of
    /// the pipeline that the queue absorbs. Neither loses anything.
    fn filling(self, before: f64) -> bool {
        self.ring >= Self::RING_HIGH && self.ring > before
    }

    fn calm(self) -> bool {
        !self.lost && self.queue <= 0.125 && self.ring < Self::RING_HIGH
    }
}

/// Chooses the level from how full things get; pure, time given.
#[derive(Debug)]
pub struct Governor {
    mode: SampleMode,
    level: SampleLevel,
    high_ticks: u32,
    /// The ring's fill at the tick before.
    ring: f64,
    changed_ns: u64,
    /// When the seed was drawn (or the level last changed).
    seeded_ns: u64,
    /// The last change was the budget's.
    by_budget: bool,
    calm_since_ns: u64,
    calm_ns: u64,
    /// When the level last fell, while a rise soon after means it fell
    /// too early.
    lowered_ns: Option<u64>,
    /// Lookups a second to follow whole at most, if any (`with_budget`).
    budget: Option<u32>,
    /// Lookups a second starting now, as last measured (`rate`).
    rate: f64,
    /// Of those, the ones the level keeps (`rate`).
    followed: f64,
    /// Following in windows, when the kernel counts lookups itself.
    windows: Option<Windows>,
}

/// The windows of following: each cycle, `WINDOW_NS` at the governor's
/// level less its spread, then paused, so that as many lookups are
/// followed on average, and the device hooks cost nearly nothing between.
#[derive(Debug)]
struct Windows {
    /// When the cycle began.
    start_ns: u64,
    /// The level the kernel has.
    applied: SampleLevel,
    /// The spread last said.
    spread: u32,
}

impl Governor {
    pub fn new(mode: SampleMode, seed: u32, now_ns: u64) -> Self {
        let shift = match mode {
            SampleMode::Auto => 0,
            SampleMode::Fixed(shift) => shift.min(MAX_SHIFT),
        };
        Self {
            mode,
            level: SampleLevel { shift, seed },
            high_ticks: 0,
            ring: 0.0,
            changed_ns: now_ns,
            seeded_ns: now_ns,
            by_budget: false,
            calm_since_ns: now_ns,
            calm_ns: CALM_NS,
            lowered_ns: None,
            budget: None,
            rate: 0.0,
            followed: 0.0,
            windows: None,
        }
    }

    /// Follows in windows past level 0 (see `Windows`): for `dnstrace
    /// agent`, whose lookups the kernel counts at the sockets whether the
    /// device hooks run or not.
    pub fn with_windows(mut self) -> Self {
        self.windows = Some(Windows {
            start_ns: self.changed_ns,
            applied: self.level,
            spread: 0,
        });
        self
    }

    /// Levels spent on time: windows one in 2^spread of it.
    fn spread(&self) -> u32 {
        match self.windows {
            Some(_) => self.level.shift.min(MAX_SPREAD),
            None => 0,
        }
    }

    /// In `Auto`, follows at most `per_s` lookups a second whole: past it
    /// the level keeps about that many, whatever the load (0: no limit).
    pub fn with_budget(mut self, per_s: u32) -> Self {
        self.budget = (per_s > 0).then_some(per_s);
        self
    }

    /// The lookups a second starting now, and of those the ones the level
    /// keeps, as measured by the caller.
    pub fn rate(&mut self, per_s: f64, followed_per_s: f64) {
        self.rate = per_s;
        self.followed = followed_per_s;
    }

    /// Following far more than the budget, though the level is the one the
    /// budget calls for: the names it keeps are the busiest.
    fn over_budget(&self) -> bool {
        // Within a window, 2^spread times the average is followed.
        let within = f64::from(1u32 << self.spread());
        self.budget.is_some_and(|b| {
            self.level.shift > 0 && self.followed > OVER_BUDGET * within * f64::from(b)
        })
    }

    /// The lowest level that keeps the budget at the rate measured.
    fn budget_shift(&self) -> u32 {
        let Some(budget) = self.budget else {
            return 0;
        };
        let mut shift = 0;
        while shift < MAX_SHIFT && self.rate > f64::from(budget) * f64::from(1u32 << shift) {
            shift += 1;
        }
        shift
    }

    /// The level the kernel is to have: the governor's, or with windows,
    /// the window's or paused.
    pub fn level(&self) -> SampleLevel {
        self.windows.as_ref().map_or(self.level, |w| w.applied)
    }

    /// Whether the level is the budget's (its last change was).
    pub fn by_budget(&self) -> bool {
        self.by_budget
    }

    /// At a tick: the new level for the kernel, if it changes (or only
    /// its seed).
    pub fn tick(&mut self, now_ns: u64, fill: Fill) -> Option<SampleLevel> {
        let governed = self.govern_or_reseed(now_ns, fill);
        match self.windows {
            Some(_) => self.window(now_ns),
            None => governed,
        }
    }

    /// With windows: the level the cycle calls for now, if the kernel has
    /// another. Each cycle draws a new seed, so that each window follows
    /// other names.
    fn window(&mut self, now_ns: u64) -> Option<SampleLevel> {
        let spread = self.spread();
        let start_ns = self.windows.as_ref()?.start_ns;
        let mut into = now_ns.saturating_sub(start_ns);
        if into >= WINDOW_NS << spread {
            if spread > 0 {
                self.redraw(now_ns);
            }
            into = 0;
        }
        let level = match into < WINDOW_NS || spread == 0 {
            true => SampleLevel {
                shift: self.level.shift - spread,
                ..self.level
            },
            false => SampleLevel::PAUSED,
        };
        let w = self.windows.as_mut()?;
        if into == 0 {
            w.start_ns = now_ns;
        }
        if std::mem::replace(&mut w.spread, spread) != spread {
            say_windows(spread);
        }
        (std::mem::replace(&mut w.applied, level) != level).then_some(level)
    }

    /// The governor's own level, if it changes (or only its seed).
    fn govern_or_reseed(&mut self, now_ns: u64, fill: Fill) -> Option<SampleLevel> {
        let auto = self.mode == SampleMode::Auto;
        let reseed = self.level.shift > 0 && now_ns.saturating_sub(self.seeded_ns) >= RESEED_NS;
        match auto.then(|| self.govern(now_ns, fill)).flatten() {
            Some(level) => Some(level),
            None if reseed => Some(self.redraw(now_ns)),
            None => None,
        }
    }

    /// The level with a new seed, the next of the seeds before.
    fn redraw(&mut self, now_ns: u64) -> SampleLevel {
        // xorshift32: any seed but 0 gives a long cycle.
        let mut x = self.level.seed | 1;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.level.seed = x;
        self.seeded_ns = now_ns;
        self.followed = 0.0;
        self.level
    }

    /// A new level, if `fill` or the budget calls for one: a rise at once
    /// to what the budget needs, else only when events are lost or the ring
    /// has been filling for `HIGH_TICKS`; a fall, a step at a time, after
    /// a calm, never below what the budget needs.
    fn govern(&mut self, now_ns: u64, fill: Fill) -> Option<SampleLevel> {
        let filling = fill.filling(std::mem::replace(&mut self.ring, fill.ring));
        self.high_ticks = if filling { self.high_ticks + 1 } else { 0 };
        if !fill.calm() {
            self.calm_since_ns = now_ns;
        }
        let floor = self.budget_shift();
        if floor > self.level.shift {
            let level = self.set(floor, now_ns);
            self.by_budget = true;
            return Some(level);
        }
        if self.over_budget() && now_ns.saturating_sub(self.seeded_ns) >= REDRAW_GAP_NS {
            log::info!(
                "sampling: the names followed made {:.0} lookups a second, past twice --follow-max: following others",
                self.followed
            );
            return Some(self.redraw(now_ns));
        }
        let since_change = now_ns.saturating_sub(self.changed_ns);
        if (fill.lost || self.high_ticks >= HIGH_TICKS)
            && fill.current
            && self.level.shift < MAX_SHIFT
            && since_change >= RAISE_GAP_NS
        {
            if let Some(at) = self.lowered_ns.take() {
                if now_ns.saturating_sub(at) < 2 * self.calm_ns {
                    self.calm_ns = (2 * self.calm_ns).min(MAX_CALM_NS);
                }
            }
            return Some(self.set(self.level.shift + 1, now_ns));
        }
        let calm_for = now_ns.saturating_sub(self.calm_since_ns);
        if self.level.shift > floor && calm_for >= self.calm_ns && since_change >= self.calm_ns {
            self.lowered_ns = Some(now_ns);
            if self.level.shift == 1 {
                self.calm_ns = CALM_NS;
            }
            return Some(self.set(self.level.shift - 1, now_ns));
        }
        None
    }

    fn set(&mut self, shift: u32, now_ns: u64) -> SampleLevel {
        self.by_budget = false;
        self.followed = 0.0;
        self.level.shift = shift;
        self.changed_ns = now_ns;
        self.seeded_ns = now_ns;
        self.high_ticks = 0;
        self.calm_since_ns = now_ns;
        self.level
    }
}

fn say_windows(spread: u32) {
    match spread {
        0 => log::info!("sampling: following all the time again"),
        _ => log::info!(
            "sampling: following in windows of {} s, one in {} of the time, the device tracepoints detached between (lookups are still counted, at the sockets)",
            WINDOW_NS / 1_000_000_000,
            1u32 << spread
        ),
    }
}

/// The governor, the kernel's level it sets and the kernel's count of
/// lost events it watches.
pub struct Sampler {
    pub governor: Governor,
    map: SampleMap,
    counts: Counts,
    lost: u64,
    /// Lookups the kernel had started following, how many of them the
    /// level kept, and when it was read.
    started: (u64, u64, u64),
    /// With windows: the device tracepoints, closed while paused.
    hooks: Option<DeviceHooks>,
    /// Attaching them again failed, and was said.
    reattach_failed: bool,
    /// Where cluster views say whose lookups they follow, and the
    /// kernel's map of them.
    views: Option<(ViewMap, watch::Receiver<Viewed>)>,
    viewed: Viewed,
}

impl Sampler {
    pub fn new(map: SampleMap, counts: Counts, mode: SampleMode) -> Self {
        let seed = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), 0) as u32;
        Self {
            governor: Governor::new(mode, seed, monotonic_now()),
            map,
            lost: counts.lost().unwrap_or(0),
            started: (
                counts.started().unwrap_or(0),
                counts.followed().unwrap_or(0),
                monotonic_now(),
            ),
            counts,
            hooks: None,
            reattach_failed: false,
            views: None,
            viewed: Viewed::default(),
        }
    }

    /// Follows the lookups of the addresses `views` name whole, whatever
    /// the level, through `map`: for the agent's cluster views.
    pub fn with_views(mut self, views: Option<(ViewMap, watch::Receiver<Viewed>)>) -> Self {
        self.views = views;
        self
    }

    /// Starts from `seed` rather than a random one, when given.
    pub fn with_seed(mut self, seed: Option<u32>) -> Self {
        if let Some(seed) = seed {
            self.governor.level.seed = seed;
        }
        self
    }

    /// Follows at most `per_s` lookups a second whole (`Governor::with_budget`).
    pub fn with_budget(mut self, per_s: u32) -> Self {
        self.governor = self.governor.with_budget(per_s);
        self
    }

    /// Follows in windows (`Governor::with_windows`), closing `hooks`
    /// between them, when given: for an agent whose kernel counts lookups
    /// at the sockets.
    pub fn with_windows(mut self, hooks: Option<DeviceHooks>) -> Self {
        if hooks.is_some() {
            self.governor = self.governor.with_windows();
        }
        self.hooks = hooks;
        self
    }

    /// Attaches the device tracepoints again, if closed; a failure is said
    /// once, and the level then follows nothing until they are.
    fn open_hooks(&mut self) {
        let Some(hooks) = self.hooks.as_mut() else {
            return;
        };
        match hooks.open() {
            Ok(()) => self.reattach_failed = false,
            Err(e) if !self.reattach_failed => {
                self.reattach_failed = true;
                log::warn!("could not attach the device tracepoints again: {e}; nothing is followed until they are (lookups are still counted)");
            }
            Err(_) => {}
        }
    }

    /// Measures the rate of lookups starting, over 200 ms at least (a
    /// surge is met before it fills the ring), for the governor's budget.
    pub fn measure(&mut self, now_ns: u64) {
        let (started_before, followed_before, at_ns) = self.started;
        let span_ns = now_ns.saturating_sub(at_ns);
        if span_ns < 200_000_000 {
            return;
        }
        let (Ok(started), Ok(followed)) = (self.counts.started(), self.counts.followed()) else {
            return;
        };
        let per_s =
            |now: u64, before: u64| now.saturating_sub(before) as f64 * 1e9 / span_ns as f64;
        self.governor.rate(
            per_s(started, started_before),
            per_s(followed, followed_before),
        );
        self.started = (started, followed, now_ns);
    }

    /// Whether the kernel lost events since the last call.
    pub fn lost_more(&mut self) -> bool {
        let Ok(lost) = self.counts.lost() else {
            return false;
        };
        std::mem::replace(&mut self.lost, lost) < lost
    }

    /// Whether the device tracepoints are to run: following some lookups,
    /// by the level or for a view.
    fn hooks_wanted(&self) -> bool {
        !self.governor.level().paused() || !self.viewed.is_empty()
    }

    /// Attaches or closes the device tracepoints as `hooks_wanted` says:
    /// attached before the kernel is told to follow, closed after it is
    /// told to stop.
    fn fit_hooks(&mut self, before: bool) {
        match (self.hooks_wanted(), before) {
            (true, true) => self.open_hooks(),
            (false, false) => {
                if let Some(hooks) = self.hooks.as_mut() {
                    hooks.close();
                }
            }
            _ => {}
        }
    }

    /// Follows whom the views now name, if that changed: the change, with
    /// the level as it is; None if nothing changed.
    pub fn view(&mut self) -> Option<SampleChange> {
        let (_, views) = self.views.as_mut()?;
        if !views.has_changed().unwrap_or(false) {
            return None;
        }
        let since_ns = monotonic_now();
        self.viewed = views.borrow_and_update().clone();
        self.fit_hooks(true);
        let (map, _) = self.views.as_mut()?;
        if let Err(e) = map.set(self.viewed.ips()) {
            // The map left viewing nothing.
            log::warn!("could not follow the lookups of a cluster view: {e:#}");
            self.viewed = Viewed::default();
        }
        self.fit_hooks(false);
        Some(self.change(since_ns))
    }

    fn change(&self, since_ns: u64) -> SampleChange {
        SampleChange {
            since_ns,
            now_ns: monotonic_now(),
            level: self.governor.level(),
            budget: self.governor.by_budget(),
            node: NodeId::default(),
            viewed: self.viewed.clone(),
        }
    }

    /// Sets the kernel's level to the governor's: the change, or None if
    /// the map refused it (the level then stays as it was).
    pub fn apply(&mut self) -> Option<SampleChange> {
        let level = self.governor.level();
        self.fit_hooks(true);
        let since_ns = monotonic_now();
        if let Err(e) = self.map.set(0, level, 0) {
            log::warn!("could not set the sampling level: {e}");
            return None;
        }
        self.fit_hooks(false);
        // The next measure of lookups followed is wholly under this level.
        if let (Ok(started), Ok(followed)) = (self.counts.started(), self.counts.followed()) {
            self.started = (started, followed, monotonic_now());
        }
        Some(self.change(since_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1000 * MS;
    /// Overload: the queue and the ring full, events lost.
    const FULL: Fill = Fill {
        queue: 1.0,
        ring: 0.95,
        lost: true,
        current: true,
    };
    const EMPTY: Fill = Fill {
        queue: 0.0,
        ring: 0.1,
        lost: false,
        current: true,
    };

    /// Ticks every 50 ms from `from` for `ms`, at `fill`: the shifts set.
    fn run(g: &mut Governor, from: u64, ms: u64, fill: Fill) -> Vec<u32> {
        (0..ms / 50)
            .filter_map(|i| g.tick(from + i * 50 * MS, fill))
            .map(|l| l.shift)
            .collect()
    }

    #[test]
    fn a_stall_of_a_tick_raises_nothing() {
        let mut g = Governor::new(SampleMode::Auto, 1, 0);
        let filling = Fill {
            queue: 1.0,
            ring: 0.6,
            ..EMPTY
        };
        for t in 0..40 {
            let fill = if t % 3 == 1 { filling } else { EMPTY };
            assert_eq!(g.tick(S + t * 50 * MS, fill), None);
        }
        let reader_behind = Fill {
            queue: 0.0,
            ring: 0.9,
            ..EMPTY
        };
        assert_eq!(g.tick(10 * S, reader_behind), None);
        assert_eq!(g.tick(10 * S + 50 * MS, EMPTY), None);
    }

    /// A full queue over a drained ring is the pipeline behind by less
    /// than the ring holds: nothing is lost, so everything is kept, however
    /// long it lasts (the 20,000 qps on a noisy machine).
    #[test]
    fn a_full_queue_over_a_drained_ring_raises_nothing() {
        let mut g = Governor::new(SampleMode::Auto, 1, 0);
        let queued = Fill {
            queue: 1.0,
            ring: 0.45,
            ..EMPTY
        };
        assert!(run(&mut g, S, 60_000, queued).is_empty());
        assert_eq!(g.level().shift, 0);
    }

    /// A ring growing past half, tick after tick, is about to lose: the
    /// level rises before it does.
    #[test]
    fn a_ring_filling_raises_before_any_loss() {
        let mut g = Governor::new(SampleMode::Auto, 1, 0);
        let rises: Vec<Option<u32>> = [0.3, 0.55, 0.7, 0.85]
            .into_iter()
            .enumerate()
            .map(|(i, ring)| {
                let fill = Fill { ring, ..EMPTY };
                g.tick(S + i as u64 * 50 * MS, fill).map(|l| l.shift)
            })
            .collect();
        assert_eq!(rises, [None, None, Some(1), None]);
    }

    /// A ring that holds its level, however full, drains as fast as it
    /// fills: nothing is lost, so nothing rises.
    #[test]
    fn a_ring_that_holds_its_level_raises_nothing() {
        let mut g = Governor::new(SampleMode::Auto, 1, 0);
        for ring in [0.6, 0.8, 0.97] {
            let steady = Fill {
                queue: 1.0,
                ring,
                ..EMPTY
            };
            assert!(run(&mut g, S, 30_000, steady).is_empty(), "{ring}");
        }
    }

    /// Events lost are the one sure sign: a tick that saw them raises at
    /// once, however the queue and the ring looked.
    #[test]
    fn a_loss_raises_at_once() {
        let mut g = Governor::new(SampleMode::Auto, 1, 0);
        let lost = Fill {
            lost: true,
            ..EMPTY
        };
        assert_eq!(g.tick(S, lost).map(|l| l.shift), Some(1));
        let stale = Fill {
            current: false,
            ..lost
        };
        assert_eq!(g.tick(2 * S, stale), None, "lost under the old level");
        assert_eq!(g.tick(3 * S, lost).map(|l| l.shift), Some(2));
    }

    #[test]
    fn overload_raises_a_step_at_a_time_to_the_limit() {
        let mut g = Governor::new(SampleMode::Auto, 1, 0);
        assert_eq!(run(&mut g, S, 1000, FULL), vec![1, 2, 3, 4]);
        run(&mut g, 2 * S, 5000, FULL);
        assert_eq!(g.level().shift, MAX_SHIFT);
        assert_eq!(g.level().seed, 1);
    }

    /// A queue still full of what the previous level kept says nothing of
    /// the new one: no rise until the pipeline has taken it.
    #[test]
    fn a_queue_of_what_the_last_level_kept_raises_nothing() {
        let mut g = Governor::new(SampleMode::Auto, 1, 0);
        assert_eq!(run(&mut g, S, 100, FULL), vec![1]);
        let stale = Fill {
            current: false,
            ..FULL
        };
        assert!(run(&mut g, 2 * S, 5000, stale).is_empty());
        assert_eq!(g.tick(7 * S, FULL).map(|l| l.shift), Some(2));
    }

    #[test]
    fn calm_lowers_after_a_while_and_sooner_never() {
        let mut g = Governor::new(SampleMode::Auto, 1, 0);
        run(&mut g, S, 400, FULL);
        assert_eq!(g.level().shift, 2);
        // Busy until 1.35 s: 10 s calm from then.
        assert_eq!(run(&mut g, 2 * S, 9_000, EMPTY), Vec::<u32>::new());
        assert_eq!(run(&mut g, 11 * S, 20_000, EMPTY), vec![1, 0]);
    }

    /// A level lowered too early overloads again: the next try waits twice
    /// as long.
    #[test]
    fn a_relapse_doubles_the_wait() {
        let mut g = Governor::new(SampleMode::Auto, 1, 0);
        run(&mut g, S, 400, FULL);
        run(&mut g, 2 * S, 10_100, EMPTY);
        assert_eq!(g.level().shift, 1);
        run(&mut g, 13 * S, 200, FULL);
        assert_eq!(g.level().shift, 2);
        // Busy until 13.15 s: 20 s calm from then.
        assert_eq!(run(&mut g, 14 * S, 19_000, EMPTY), Vec::<u32>::new());
        assert_eq!(run(&mut g, 33 * S, 400, EMPTY), vec![1]);
    }

    /// A level asked for holds whatever the load; only its seed changes,
    /// every 30 s, so that each name has its turn.
    #[test]
    fn a_fixed_level_never_moves_but_draws_new_seeds() {
        let mut g = Governor::new(SampleMode::Fixed(3), 1, 0);
        assert_eq!(g.level().shift, 3);
        assert!(run(&mut g, S, 2000, FULL).is_empty());
        let mut seeds = vec![g.level().seed];
        for t in (40..=100).step_by(30) {
            let change = g.tick(t * S, EMPTY).expect("a new seed");
            assert_eq!(change.shift, 3);
            seeds.push(change.seed);
            assert_eq!(g.tick(t * S + 50 * MS, EMPTY), None);
        }
        seeds.dedup();
        assert_eq!(seeds.len(), 4, "{seeds:?}");
        let mut all = Governor::new(SampleMode::Fixed(0), 1, 0);
        assert_eq!(all.level().shift, 0);
        assert_eq!(all.tick(100 * S, EMPTY), None, "nothing to reseed");
    }

    /// With a budget, the level keeps about that many lookups a second
    /// at once, and falls back, a step per calm, as the rate does.
    #[test]
    fn a_budget_holds_the_lookups_followed_near_it() {
        let mut g = Governor::new(SampleMode::Auto, 1, 0).with_budget(1_000);
        g.rate(900.0, 900.0);
        assert!(run(&mut g, S, 2_000, EMPTY).is_empty());
        g.rate(5_000.0, 0.0);
        assert_eq!(run(&mut g, 3 * S, 2_000, EMPTY), vec![3]);
        g.rate(20_000.0, 0.0);
        assert_eq!(run(&mut g, 5 * S, 2_000, EMPTY), vec![5]);
        // Calm, at a rate that still needs 1 in 4: down to 2 and no lower.
        g.rate(3_500.0, 0.0);
        assert_eq!(run(&mut g, 7 * S, 40_000, EMPTY), vec![4, 3, 2]);
        // Overload on top of the budget still raises.
        assert_eq!(run(&mut g, 50 * S, 100, FULL), vec![3]);
        let mut none = Governor::new(SampleMode::Auto, 1, 0).with_budget(0);
        none.rate(1e6, 1e6);
        assert!(run(&mut none, S, 2_000, EMPTY).is_empty());
    }

    /// A level keeps names, not lookups: where the names it keeps carry
    /// far more than the budget, a new seed is drawn at once (the level
    /// is right for the rate), and again while they still do, no more
    /// often than a measure wholly under the new seed allows.
    #[test]
    fn following_far_past_the_budget_draws_a_new_seed_at_once() {
        let mut g = Governor::new(SampleMode::Auto, 1, 0).with_budget(1_000);
        g.rate(20_000.0, 0.0);
        assert_eq!(run(&mut g, S, 100, EMPTY), vec![5]);
        let first = g.level();
        g.rate(20_000.0, 8_000.0);
        let changes: Vec<SampleLevel> = (0..40)
            .filter_map(|i| g.tick(2 * S + i * 50 * MS, EMPTY))
            .collect();
        assert_eq!(
            changes.len(),
            1,
            "one draw until measured again: {changes:?}"
        );
        assert_eq!(changes[0].shift, 5, "the level stays the budget's");
        assert_ne!(changes[0].seed, first.seed);
        let at = 4 * S;
        g.rate(20_000.0, 8_000.0);
        let second = g.tick(at, EMPTY).expect("a second draw");
        g.rate(20_000.0, 8_000.0);
        assert!(g.tick(at + 450 * MS, EMPTY).is_none(), "within 500 ms");
        let third = g.tick(at + 500 * MS, EMPTY).expect("a third draw");
        assert_ne!(second.seed, third.seed);
        g.rate(20_000.0, 1_900.0);
        assert!(
            run(&mut g, 6 * S, 2_000, EMPTY).is_empty(),
            "near the budget"
        );
    }

    /// With windows, levels past 0 are spent on time first, 3 at most:
    /// the budget's 1 in 32 is 1 in 4 for 1 s in every 8, paused between,
    /// each window with a new seed.
    #[test]
    fn windows_follow_more_names_for_a_share_of_the_time() {
        let mut g = Governor::new(SampleMode::Auto, 1, 0)
            .with_budget(1_000)
            .with_windows();
        g.rate(20_000.0, 0.0);
        let changes: Vec<(u64, SampleLevel)> = (0..700)
            .filter_map(|i| g.tick(i * 50 * MS, EMPTY).map(|l| (i * 50, l)))
            .collect();
        let at: Vec<(u64, u32)> = changes.iter().map(|(t, l)| (*t, l.shift)).collect();
        let paused = SampleLevel::PAUSED.shift;
        let windows: Vec<(u64, u32)> = (0..5)
            .flat_map(|i| [(i * 8000, 2), (i * 8000 + 1000, paused)])
            .collect();
        assert_eq!(at, windows);
        let mut seeds: Vec<u32> = changes.iter().step_by(2).map(|(_, l)| l.seed).collect();
        seeds.dedup();
        assert_eq!(seeds.len(), 5, "{seeds:?}");
        let mut fixed = Governor::new(SampleMode::Fixed(10), 1, 0).with_windows();
        assert_eq!(fixed.tick(0, EMPTY).map(|l| l.shift), Some(7));
    }

    /// Every lookup followed: no windows, nothing paused.
    #[test]
    fn windows_never_pause_level_0() {
        let mut g = Governor::new(SampleMode::Auto, 1, 0).with_windows();
        assert!(run(&mut g, 0, 40_000, EMPTY).is_empty());
        assert_eq!(g.level().shift, 0);
    }

    #[test]
    fn a_level_held_a_while_draws_a_new_seed() {
        let mut g = Governor::new(SampleMode::Auto, 1, 0);
        run(&mut g, S, 100, FULL);
        let level = g.level();
        assert_eq!(level.shift, 1);
        let busy = Fill {
            queue: 0.25,
            ..EMPTY
        };
        let changes: Vec<SampleLevel> = (0..800)
            .filter_map(|i| g.tick(2 * S + i * 50 * MS, busy))
            .collect();
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].shift, 1);
        assert_ne!(changes[0].seed, level.seed);
    }
}
