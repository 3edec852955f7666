//! `dnstrace replay`: a recording through the same decoding, journeys and
//! rules as live tracing, into the view asked for; several nodes'
//! recordings as one (`record::merge`).
use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use super::Show;
use crate::{
    output::Format,
    pipeline::{Counts, Pipeline, Stop, Tally, View},
    record::{
        merge::{self, Clocks, Merge, Recording},
        replay::Speed,
    },
    view,
};

/// What `dnstrace replay` was asked for.
pub struct ReplayArgs {
    pub files: Vec<PathBuf>,
    pub speed: Speed,
    pub packets: bool,
    pub ports: Vec<u16>,
    pub output: Option<Format>,
    pub live: bool,
    pub log_file: Option<PathBuf>,
}

pub async fn run(args: ReplayArgs) -> Result<()> {
    let recs = Recording::read_all(&args.files)?;
    let json = args.output == Some(Format::Json);
    let clocks = Clocks::estimate(&recs, &args.ports)?;
    clocks.print(json);
    let mut replay = Merge::open(&recs, &clocks, &args.ports, args.speed)?;
    let about = merge::about(&recs);
    let limits = about.limits();
    let view = match (args.packets, args.live) {
        (true, _) => View::Packets,
        (false, true) => View::Live(limits),
        (false, false) => View::Journeys(limits),
    };
    let context = merge::context(&recs);
    let what = about.headline(&names(&args.files));
    let show = Show {
        view,
        format: args.output.unwrap_or(Format::Text),
        labels: merge::labels(&recs),
        target: context.target.clone(),
        context,
        about: view::state::About {
            target: what,
            hooks: 0,
            log: None,
        },
        log: args.log_file,
        hold: true,
    };
    let mut pipe = Pipeline::default();
    let result = show.run(&mut pipe, &mut replay, &mut Stop::new()?).await;
    let exit = ReplayExit {
        event: "exit",
        counts: &pipe.counts,
        journeys: result.as_ref().ok().copied().flatten(),
        skipped: replay.skipped(),
        node: (recs.len() == 1)
            .then(|| about.header.as_ref().and_then(|h| h.scope.as_deref()))
            .flatten(),
    };
    exit.print(json);
    match (result, replay.take_error()) {
        (Err(e), _) | (Ok(_), Some(e)) => Err(e),
        (Ok(_), None) => Ok(()),
    }
}

/// The files, as given, one after another.
pub fn names(files: &[PathBuf]) -> String {
    let names: Vec<_> = files.iter().map(|f| f.display().to_string()).collect();
    names.join(", ")
}

/// What `replay` says at exit, as `trace` does (`super::exit`): a line of
/// text on stderr, and with `-o json` also one JSON object.
#[derive(Serialize)]
struct ReplayExit<'a> {
    event: &'static str,
    #[serde(flatten)]
    counts: &'a Counts,
    #[serde(flatten)]
    journeys: Option<Tally>,
    /// Frames not DNS, or not decodable.
    skipped: u64,
    /// The node recorded alone (`--node`).
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<&'a str>,
}

impl ReplayExit<'_> {
    fn print(&self, json: bool) {
        let journeys = self.journeys.map(|t| format!(", {t}")).unwrap_or_default();
        let node = self
            .node
            .map(|n| format!(" of node {n}"))
            .unwrap_or_default();
        eprintln!(
            "dnstrace: replayed {}{node}{journeys}; {} frames skipped (not DNS, or not decodable)",
            self.counts.brief(),
            self.skipped
        );
        if json {
            eprintln!("{}", serde_json::to_string(self).expect("plain numbers"));
        }
    }
}
