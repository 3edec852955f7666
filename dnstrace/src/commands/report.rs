//! `dnstrace report FILE`: a postmortem summary of a recording, made by
//! replaying it through the pipeline: Markdown, or HTML with inline SVG.
use std::{
    fmt::Write as _,
    io::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use crate::decode::Rcode;
use crate::{
    correlate::Journey,
    decode::KernelNames,
    diagnose::{Anomaly, AnomalyKind},
    output::Labels,
    pipeline::{JourneyOut, JourneySink, Pipeline, Stop},
    record::{
        merge::{self, Clocks, Merge, Recording},
        replay::{About, Speed},
    },
    view::model::{self, latency, Lookup, Status},
};

/// Journeys listed among the slowest and among the failed.
const LISTED: usize = 15;
/// Latency buckets: upper bounds in nanoseconds.
const BUCKETS: [(u64, &str); 7] = [
    (100_000, "< 0.1 ms"),
    (1_000_000, "0.1–1 ms"),
    (10_000_000, "1–10 ms"),
    (100_000_000, "10–100 ms"),
    (1_000_000_000, "0.1–1 s"),
    (5_000_000_000, "1–5 s"),
    (u64::MAX, "≥ 5 s"),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Markdown,
    Html,
}

/// What a report says, gathered from the journeys.
struct Gathered {
    labels: Labels,
    first_ns: Option<u64>,
    last_ns: u64,
    lookups: u64,
    answered: u64,
    nxdomain: u64,
    failed: u64,
    unanswered: u64,
    latencies: Vec<u64>,
    per_second: Vec<(u64, u64)>,
    slowest: Vec<Lookup>,
    failures: Vec<Lookup>,
    anomalies: Vec<Anomaly>,
    /// Lookups kept under a sampling level: the strictest (1 in N), and
    /// the first and last of them.
    sampled: Option<(u32, u64, u64)>,
}

impl Gathered {
    fn new(labels: Labels) -> Self {
        Self {
            labels,
            first_ns: None,
            last_ns: 0,
            lookups: 0,
            answered: 0,
            nxdomain: 0,
            failed: 0,
            unanswered: 0,
            latencies: Vec::new(),
            per_second: Vec::new(),
            slowest: Vec::new(),
            failures: Vec::new(),
            anomalies: Vec::new(),
            sampled: None,
        }
    }

    fn count(&mut self, l: &Lookup, ended_ns: u64) {
        self.lookups += 1;
        self.first_ns = Some(
            self.first_ns
                .map_or(l.journey.started_ns, |f| f.min(l.journey.started_ns)),
        );
        self.last_ns = self.last_ns.max(ended_ns);
        let j = &l.journey;
        if j.sampled.shift > 0 {
            let (one_in, first, last) = self.sampled.get_or_insert((1, j.started_ns, j.started_ns));
            *one_in = (*one_in).max(j.sampled.one_in());
            *first = (*first).min(j.started_ns);
            *last = (*last).max(j.started_ns);
        }
        match &l.status {
            s if s.failed() => self.failed += 1,
            Status::Timeout => self.unanswered += 1,
            Status::Answered { rcode, .. } if *rcode == Rcode::NXDOMAIN => self.nxdomain += 1,
            _ => self.answered += 1,
        }
        self.latencies.extend(l.latency_ns);
        let second = l.journey.started_ns / 1_000_000_000;
        match self.per_second.iter_mut().find(|(s, _)| *s == second) {
            Some((_, n)) => *n += 1,
            None => self.per_second.push((second, 1)),
        }
    }

    fn keep(&mut self, l: Lookup) {
        let failed = l.status.failed() || l.status == Status::Timeout;
        if failed && self.failures.len() < LISTED {
            self.failures.push(l.clone());
        }
        if l.latency_ns.is_some() {
            self.slowest.push(l);
            self.slowest
                .sort_by_key(|l| std::cmp::Reverse(l.latency_ns.unwrap_or(0)));
            self.slowest.truncate(LISTED);
        }
    }
}

impl JourneyOut for Gathered {
    fn kernel(&self) -> &KernelNames {
        self.labels.kernel()
    }

    fn journey(&mut self, j: Journey, badges: &[(AnomalyKind, String)]) -> std::io::Result<()> {
        let ended_ns = j.ended_ns;
        let l = model::lookup(j, badges, &self.labels);
        self.count(&l, ended_ns);
        self.keep(l);
        Ok(())
    }

    fn anomaly(&mut self, _: &Anomaly) -> std::io::Result<()> {
        Ok(())
    }

    fn summary(&mut self, all: &[&Anomaly]) -> std::io::Result<()> {
        self.anomalies = all.iter().map(|a| (*a).clone()).collect();
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub async fn run(
    files: &[PathBuf],
    format: Format,
    write: Option<&Path>,
    ports: Vec<u16>,
) -> Result<()> {
    let recs = Recording::read_all(files)?;
    let clocks = Clocks::estimate(&recs, &ports)?;
    clocks.print(false);
    let mut replay = Merge::open(&recs, &clocks, &ports, Speed::Fast)?;
    let about = merge::about(&recs);
    let context = merge::context(&recs);
    let target = context.target.clone();
    let out = Gathered::new(merge::labels(&recs));
    let mut sink = JourneySink::new(about.limits(), context, out).only_from(target.as_ref());
    let mut pipe = Pipeline::default();
    pipe.drive(&mut replay, &mut sink, &mut Stop::new()?)
        .await?;
    if let Some(e) = replay.take_error() {
        log::warn!("{e:#}; the report covers what came before");
    }
    let g = &sink.out;
    let file = super::replay::names(files);
    let text = match format {
        Format::Markdown => markdown(&file, &about, g),
        Format::Html => html(&file, &about, g),
    };
    match write {
        Some(path) => std::fs::write(path, text)
            .with_context(|| format!("cannot write the report to {}", path.display())),
        None => std::io::stdout()
            .write_all(text.as_bytes())
            .context("writing the report"),
    }
}

fn percent(n: u64, of: u64) -> String {
    match of {
        0 => "-".into(),
        _ => format!("{:.1}%", n as f64 * 100.0 / of as f64),
    }
}

/// p50, p90, p99 and max, nearest rank.
fn percentiles(sorted: &[u64]) -> Vec<(&'static str, String)> {
    let at = |p: usize| {
        let i = (sorted.len() * p).div_ceil(100).saturating_sub(1);
        sorted.get(i).map_or("-".into(), |v| latency(*v))
    };
    vec![
        ("p50", at(50)),
        ("p90", at(90)),
        ("p99", at(99)),
        ("max", sorted.last().map_or("-".into(), |v| latency(*v))),
    ]
}

fn histogram(latencies: &[u64]) -> Vec<(&'static str, u64)> {
    let mut counts = [0u64; BUCKETS.len()];
    for l in latencies {
        let i = BUCKETS.iter().position(|(max, _)| l < max).unwrap_or(0);
        counts[i] += 1;
    }
    BUCKETS
        .iter()
        .zip(counts)
        .map(|((_, name), n)| (*name, n))
        .collect()
}

/// The facts every format states first.
fn facts(file: &str, about: &About, g: &Gathered) -> Vec<(String, String)> {
    let time = |ns: u64| g.labels.time_of_day(ns);
    let mut facts = vec![("recording".to_owned(), file.to_owned())];
    if let Some(h) = &about.header {
        facts.push((
            "recorded by".into(),
            format!(
                "dnstrace {} on node {} (Linux {})",
                h.dnstrace, h.node, h.kernel
            ),
        ));
        if !g.labels.nodes().is_empty() {
            facts.push(("nodes".into(), g.labels.nodes().join(", ")));
        }
        facts.push((
            "target".into(),
            h.target.clone().unwrap_or("the whole node".into()),
        ));
    } else {
        facts.push((
            "recorded by".into(),
            "another tool (no dnstrace notes): journeys from the packets alone".into(),
        ));
    }
    if let Some(first) = g.first_ns {
        facts.push((
            "time (UTC)".into(),
            format!(
                "{} to {} ({})",
                time(first),
                time(g.last_ns),
                latency(g.last_ns - first)
            ),
        ));
    }
    facts.push((
        "lookups".into(),
        format!(
            "{}: answered {}, NXDOMAIN {}, failed {} ({}), unanswered {} ({})",
            g.lookups,
            g.answered,
            g.nxdomain,
            g.failed,
            percent(g.failed, g.lookups),
            g.unanswered,
            percent(g.unanswered, g.lookups)
        ),
    ));
    if let Some((one_in, first, last)) = g.sampled {
        facts.push((
            "sampled".into(),
            format!(
                "from {} to {}, as few as 1 lookup in {one_in} kept, each whole (dnstrace was falling behind, or was asked to with --sample): the counts are of the lookups kept",
                time(first),
                time(last)
            ),
        ));
    }
    let mut sorted = g.latencies.clone();
    sorted.sort_unstable();
    let p: Vec<String> = percentiles(&sorted)
        .into_iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    facts.push(("latency of answers".into(), p.join(", ")));
    facts
}

fn markdown(file: &str, about: &About, g: &Gathered) -> String {
    let mut s = format!("# dnstrace report: {file}\n\n");
    for (k, v) in facts(file, about, g) {
        let _ = writeln!(s, "- **{k}**: {v}");
    }
    s += "\n## Latency distribution\n\n| latency | answers | |\n| --- | ---: | --- |\n";
    let hist = histogram(&g.latencies);
    let top = hist.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1);
    for (name, n) in &hist {
        let bar = "█".repeat((n * 30).div_ceil(top) as usize);
        let _ = writeln!(s, "| {name} | {n} | {bar} |");
    }
    let _ = write!(s, "\n## Anomalies ({})\n\n", g.anomalies.len());
    if g.anomalies.is_empty() {
        s += "None.\n";
    }
    for a in &g.anomalies {
        let _ = writeln!(
            s,
            "### {:?} `{}` ×{}: {}\n",
            a.severity,
            a.kind,
            a.count,
            md(&a.summary)
        );
        for e in &a.evidence {
            let _ = writeln!(s, "- evidence: {}", md(e));
        }
        let _ = writeln!(s, "- cause: {}\n- fix: {}", md(&a.cause), md(a.fix));
        let ids: Vec<String> = a.journeys.iter().map(|i| format!("#{i}")).collect();
        let _ = writeln!(s, "- journeys: {}\n", ids.join(" "));
    }
    let _ = write!(s, "\n## Failed lookups (first {LISTED})\n\n");
    s += &md_table(&g.failures);
    let _ = write!(s, "\n## Slowest lookups ({LISTED})\n\n");
    s += &md_table(&g.slowest);
    s
}

/// Markdown table cells must not break the table.
fn md(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn md_table(rows: &[Lookup]) -> String {
    if rows.is_empty() {
        return "None.\n".into();
    }
    let mut s = "| # | time | pod | name | type | status | latency | server |\n| ---: | --- | --- | --- | --- | --- | ---: | --- |\n".to_owned();
    for l in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            l.journey.id,
            l.time,
            md(&l.pod),
            md(l.journey.shown_name()),
            l.journey.qtype,
            l.status.word(),
            l.latency_ns.map(latency).unwrap_or("-".into()),
            md(l.server.as_deref().unwrap_or("-"))
        );
    }
    s
}

/// Text for HTML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn html(file: &str, about: &About, g: &Gathered) -> String {
    let mut s = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>dnstrace report: {0}</title>\
         <style>body{{font-family:sans-serif;max-width:70em;margin:2em auto}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:2px 6px;text-align:left}}.crit{{color:#b00}}.warn{{color:#a60}}</style>\
         </head><body><h1>dnstrace report: {0}</h1><ul>",
        esc(file)
    );
    for (k, v) in facts(file, about, g) {
        let _ = write!(s, "<li><b>{}</b>: {}</li>", esc(&k), esc(&v));
    }
    s += "</ul><h2>Lookups per second</h2>";
    s += &rate_svg(&g.per_second);
    s += "<h2>Latency distribution</h2>";
    s += &histogram_svg(&histogram(&g.latencies));
    let _ = write!(s, "<h2>Anomalies ({})</h2>", g.anomalies.len());
    if g.anomalies.is_empty() {
        s += "<p>None.</p>";
    }
    for a in &g.anomalies {
        let class = match a.severity {
            crate::diagnose::Severity::Critical => "crit",
            crate::diagnose::Severity::Warning => "warn",
        };
        let _ = write!(
            s,
            "<h3 class=\"{class}\">{:?} <code>{}</code> ×{}: {}</h3><ul>",
            a.severity,
            a.kind,
            a.count,
            esc(&a.summary)
        );
        for e in &a.evidence {
            let _ = write!(s, "<li>evidence: {}</li>", esc(e));
        }
        let _ = write!(
            s,
            "<li>cause: {}</li><li>fix: {}</li></ul>",
            esc(&a.cause),
            esc(a.fix)
        );
    }
    let _ = write!(s, "<h2>Failed lookups (first {LISTED})</h2>");
    s += &html_table(&g.failures);
    let _ = write!(s, "<h2>Slowest lookups ({LISTED})</h2>");
    s += &html_table(&g.slowest);
    s + "</body></html>\n"
}

fn html_table(rows: &[Lookup]) -> String {
    if rows.is_empty() {
        return "<p>None.</p>".into();
    }
    let mut s = "<table><tr><th>#</th><th>time</th><th>pod</th><th>name</th><th>type</th><th>status</th><th>latency</th><th>server</th></tr>".to_owned();
    for l in rows {
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            l.journey.id,
            esc(&l.time),
            esc(&l.pod),
            esc(l.journey.shown_name()),
            esc(l.journey.qtype.name()),
            esc(l.status.word()),
            l.latency_ns.map(latency).unwrap_or("-".into()),
            esc(l.server.as_deref().unwrap_or("-"))
        );
    }
    s + "</table>"
}

const W: f64 = 720.0;
const H: f64 = 160.0;

/// Lookups per second as a polyline, seconds without lookups at zero.
fn rate_svg(per_second: &[(u64, u64)]) -> String {
    let (Some(first), Some(last)) = (
        per_second.iter().map(|(s, _)| *s).min(),
        per_second.iter().map(|(s, _)| *s).max(),
    ) else {
        return "<p>No lookups.</p>".into();
    };
    let top = per_second.iter().map(|(_, n)| *n).max().unwrap_or(1).max(1) as f64;
    let span = (last - first).max(1) as f64;
    let points: Vec<String> = (first..=last)
        .map(|sec| {
            let n = per_second
                .iter()
                .find(|(s, _)| *s == sec)
                .map_or(0, |(_, n)| *n);
            let x = (sec - first) as f64 / span * W;
            let y = H - n as f64 / top * (H - 10.0);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{}\" role=\"img\" aria-label=\"lookups per second\">\
         <polyline fill=\"none\" stroke=\"#07c\" stroke-width=\"1.5\" points=\"{}\"/>\
         <text x=\"4\" y=\"12\" font-size=\"11\">peak {top} lookups/s</text>\
         <line x1=\"0\" y1=\"{H}\" x2=\"{W}\" y2=\"{H}\" stroke=\"#999\"/></svg>",
        H + 2.0,
        points.join(" ")
    )
}

fn histogram_svg(hist: &[(&str, u64)]) -> String {
    let top = hist.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1) as f64;
    let bar = W / hist.len() as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{}\" role=\"img\" aria-label=\"latency distribution\">",
        H + 20.0
    );
    for (i, (name, n)) in hist.iter().enumerate() {
        let h = *n as f64 / top * (H - 14.0);
        let x = i as f64 * bar;
        let _ = write!(
            s,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"#c50\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{n}</text>\
             <text x=\"{:.1}\" y=\"{}\" font-size=\"11\">{}</text>",
            x + 4.0,
            H - h,
            bar - 8.0,
            x + 6.0,
            H - h - 2.0,
            x + 4.0,
            H + 14.0,
            esc(name)
        );
    }
    s + "</svg>"
}
