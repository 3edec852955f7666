//! Running a pipeline into the view asked for: lines of packets or
//! journeys, or the live view. Live tracing and replay share it.
use std::{io, path::Path, sync::Arc};

use anyhow::Result;
use tokio::{sync::Notify, time::Duration};

use crate::{
    diagnose::Context,
    logging::Redirect,
    output::{Format, Labels, LineSink},
    pipeline::{JourneySink, Pipeline, Source, Stop, Tally, View},
    target,
    view::{self, state::About, LiveOut},
};

/// A view and what it needs, for a live capture or a replay.
pub struct Show {
    pub view: View,
    pub format: Format,
    pub labels: Labels,
    pub context: Context,
    /// Journeys that do not start from it are not shown.
    pub target: Option<target::Target>,
    pub about: About,
    pub log: Option<std::path::PathBuf>,
    /// The live view stays up after the source ends, until `q` (replay).
    pub hold: bool,
}

impl Show {
    /// Drives `src` through `pipe` into the view; returns its summary.
    pub async fn run(
        self,
        pipe: &mut Pipeline,
        src: &mut impl Source,
        stop: &mut Stop,
    ) -> Result<Option<Tally>> {
        let Show {
            view,
            format,
            labels,
            context,
            target,
            about,
            log,
            hold,
        } = self;
        // Lines are flushed every tick and after each batch of journeys, not
        // one write(2) each: under load that is most of the output's cost.
        let stdout = || io::BufWriter::with_capacity(1 << 16, io::stdout().lock());
        // The live view sends the log to a file of its own.
        let _log = match (&view, &log) {
            (View::Packets | View::Journeys(_), Some(path)) => Some(Redirect::to(path)?),
            _ => None,
        };
        match view {
            View::Packets => {
                let mut lines = LineSink::new(format, labels, stdout());
                pipe.drive(src, &mut lines, stop).await
            }
            View::Journeys(limits) => {
                let lines = LineSink::new(format, labels, stdout());
                let mut sink = JourneySink::new(limits, context, lines).only_from(target.as_ref());
                pipe.drive(src, &mut sink, stop).await
            }
            View::Live(limits) => {
                let log = log.unwrap_or_else(view::default_log);
                let sink = |out| JourneySink::new(limits, context, out).only_from(target.as_ref());
                let live = Live {
                    about,
                    log: &log,
                    labels,
                    hold,
                };
                live.run(pipe, src, stop, sink).await
            }
        }
    }
}

struct Live<'a> {
    about: About,
    log: &'a Path,
    labels: Labels,
    hold: bool,
}

impl Live<'_> {
    /// The view takes the terminal and stderr until the capture ends, then
    /// the anomalies are printed on the terminal.
    async fn run(
        mut self,
        pipe: &mut Pipeline,
        src: &mut impl Source,
        stop: &mut Stop,
        sink: impl FnOnce(LiveOut) -> JourneySink<LiveOut>,
    ) -> Result<Option<Tally>> {
        let quit = Arc::new(Notify::new());
        stop.quit = Some(quit.clone());
        self.about.log = Some(self.log.display().to_string());
        let (view, out) = view::start(self.about, self.log, self.labels, quit)?;
        let mut sink = sink(out);
        let result = pipe.drive(src, &mut sink, stop).await;
        // A replay's view stays up until the user quits (maybe already).
        while self.hold && result.is_ok() && !view.ended() {
            tokio::select! {
                () = stop.wait() => break,
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        let anomalies = sink.out.summary.take();
        drop(sink);
        let closed = view.close();
        report_log(self.log);
        print!("{}", anomalies.unwrap_or_default());
        closed.and(result)
    }
}

/// Points at the log of the live session, or removes it when empty.
fn report_log(log: &Path) {
    match std::fs::metadata(log) {
        Ok(m) if m.len() == 0 => drop(std::fs::remove_file(log)),
        Ok(_) => log::info!("the session's log lines are in {}", log.display()),
        Err(_) => {}
    }
}
