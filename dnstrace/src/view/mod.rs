//! The live view: a terminal UI on its own thread, fed by the capture
//! through a bounded channel the capture never waits on.
mod draw;
mod keys;
pub mod model;
pub mod state;
#[cfg(test)]
mod tests;

use std::{
    io,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use ratatui::{
    crossterm::event::{self, Event},
    DefaultTerminal,
};
use tokio::sync::Notify;

use self::{
    model::AnomalyRow,
    state::{About, App, Update},
};
use crate::{
    correlate::Journey,
    decode::KernelNames,
    diagnose::{Anomaly, AnomalyKind},
    logging::Redirect,
    output::{summary_text, Labels},
    pipeline::{Health, JourneyOut},
    target::follow::Refresh,
};

/// Updates waiting for the view; beyond this the capture drops and counts.
const QUEUE: usize = 16_384;
/// At most this often a frame is drawn.
const FRAME: Duration = Duration::from_millis(100);
/// Updates applied between looks at the keyboard and the clock.
const BATCH: usize = 20_000;

/// The running view: its thread, and where stderr goes meanwhile.
pub struct LiveView {
    thread: Option<JoinHandle<io::Result<()>>>,
    log: Option<Redirect>,
}

/// Takes the terminal, sends stderr to `log`, and starts the view thread;
/// `quit` is notified when the user quits (or the view dies).
pub fn start(
    about: About,
    log: &Path,
    labels: Labels,
    quit: Arc<Notify>,
) -> Result<(LiveView, LiveOut)> {
    let redirect = Redirect::to(log)?;
    let terminal = ratatui::try_init().context("taking over the terminal")?;
    let (tx, rx) = sync_channel(QUEUE);
    let dropped = Arc::new(AtomicU64::new(0));
    let seen = dropped.clone();
    let labels = Arc::new(labels);
    let app = App::new(about, labels.clone());
    let thread = std::thread::Builder::new()
        .name("live-view".into())
        .spawn(move || run(terminal, rx, app, &seen, &quit))
        .context("starting the view thread")?;
    let view = LiveView {
        thread: Some(thread),
        log: Some(redirect),
    };
    Ok((view, LiveOut::new(tx, labels, dropped)))
}

impl LiveView {
    /// Waits for the view to end (the capture's sender must be gone
    /// first), then gives the terminal and stderr back.
    pub fn close(mut self) -> Result<()> {
        self.end()
    }

    /// The view thread is gone (the user quit, or it failed).
    pub fn ended(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    fn end(&mut self) -> Result<()> {
        let ended = self.thread.take().map(JoinHandle::join);
        ratatui::restore();
        self.log.take();
        match ended {
            Some(Ok(r)) => r.context("the live view"),
            Some(Err(_)) => anyhow::bail!("the live view failed; see the log file"),
            None => Ok(()),
        }
    }
}

/// Every exit path, errors included, gives the terminal back.
impl Drop for LiveView {
    fn drop(&mut self) {
        let _ = self.end();
    }
}

/// Notifies the capture when the view thread ends, however it ends.
struct QuitOnExit<'a>(&'a Notify);

impl Drop for QuitOnExit<'_> {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

fn run(
    mut terminal: DefaultTerminal,
    rx: Receiver<Update>,
    mut app: App,
    dropped: &AtomicU64,
    quit: &Notify,
) -> io::Result<()> {
    let _quit = QuitOnExit(quit);
    let mut drawn = Instant::now() - FRAME;
    let mut dirty = true;
    loop {
        for _ in 0..BATCH {
            match rx.try_recv() {
                Ok(u) => {
                    app.update(u);
                    dirty = true;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return Ok(()),
            }
        }
        app.dropped_updates = dropped.load(Ordering::Relaxed);
        if dirty && drawn.elapsed() >= FRAME {
            terminal.draw(|f| draw::draw(&app, f))?;
            drawn = Instant::now();
            dirty = false;
        }
        if event::poll(Duration::from_millis(30))? {
            match event::read()? {
                Event::Key(key) => {
                    if let Some(a) = keys::action(&app, key) {
                        app.apply(a);
                        dirty = true;
                    }
                }
                Event::Resize(..) => dirty = true,
                _ => {}
            }
            if app.quit {
                return Ok(());
            }
        }
    }
}

/// The capture's side: finished journeys and the state of things, sent
/// without waiting.
pub struct LiveOut {
    tx: SyncSender<Update>,
    labels: Arc<Labels>,
    dropped: Arc<AtomicU64>,
    /// (anomalies, their total count) when last sent.
    sent: (usize, u64),
    /// The anomalies at the end, for the terminal once the view is gone.
    pub summary: Option<String>,
}

impl LiveOut {
    fn new(tx: SyncSender<Update>, labels: Arc<Labels>, dropped: Arc<AtomicU64>) -> Self {
        Self {
            tx,
            labels,
            dropped,
            sent: (0, 0),
            summary: None,
        }
    }

    /// A full queue only counts. A view that is gone is no error: its
    /// thread's end already stops the capture, and the capture's last
    /// journeys must still reach the summary printed after it.
    fn send(&self, u: Update) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(u) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl JourneyOut for LiveOut {
    fn kernel(&self) -> &KernelNames {
        self.labels.kernel()
    }

    fn journey(&mut self, j: Journey, badges: &[(AnomalyKind, String)]) -> io::Result<()> {
        let row = model::lookup(j, badges, &self.labels);
        self.send(Update::Lookup(Box::new(row)));
        Ok(())
    }

    fn anomaly(&mut self, _: &Anomaly) -> io::Result<()> {
        // Sent whole, with counts, at the next tick.
        Ok(())
    }

    fn pods(&mut self, refresh: &Refresh) {
        // The view's copy is replaced, not written under it: rare.
        Arc::make_mut(&mut self.labels).rename(refresh);
        self.send(Update::Labels(self.labels.clone()));
    }

    fn state(&mut self, all: &[&Anomaly], health: &Health) -> io::Result<()> {
        let now = (all.len(), all.iter().map(|a| a.count).sum());
        if now != self.sent {
            self.send(Update::Anomalies(
                all.iter()
                    .map(|a| AnomalyRow::of(a, &self.labels))
                    .collect(),
            ));
            self.sent = now;
        }
        self.send(Update::Health(health.clone()));
        Ok(())
    }

    fn summary(&mut self, all: &[&Anomaly]) -> io::Result<()> {
        self.summary = Some(summary_text(all));
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The default log file: per process, in the temporary directory.
pub fn default_log() -> PathBuf {
    std::env::temp_dir().join(format!("dnstrace-{}.log", std::process::id()))
}
