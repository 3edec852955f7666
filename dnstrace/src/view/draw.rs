//! Drawing the live view from its state; nothing here changes it.
use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style, Stylize},
    text::{Line, Span},
    widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Sparkline, Table, TableState, Wrap},
    Frame,
};

use super::{
    keys::hints,
    model::{detail, latency, AnomalyRow, Detail, Lookup, Status},
    state::{App, Focus, Screen},
};
use crate::decode::Rcode;
use crate::diagnose::Severity;
use crate::pipeline::NodeStatus;
use dnstrace_common::Direction;

const WARN: Style = Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD);
const BAD: Style = Style::new().fg(Color::Red).add_modifier(Modifier::BOLD);
const DIM: Style = Style::new().fg(Color::DarkGray);
const SELECTED: Style = Style::new().add_modifier(Modifier::REVERSED);
/// A node's stream this far behind the furthest is said to lag.
const LAGGING_NS: u64 = 250_000_000;

pub fn draw(app: &App, f: &mut Frame) {
    let lines = header_lines(app);
    let [header, body, bar] = Layout::vertical([
        Constraint::Length(lines.len() as u16),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(f.area());
    f.render_widget(Paragraph::new(lines), header);
    match app.screen {
        Screen::List => list_screen(app, f, body),
        Screen::Journey(id) => journey_screen(app, f, body, id),
    }
    f.render_widget(Paragraph::new(help_bar(app)), bar);
    if app.help {
        help_popup(f, body);
    }
}

fn header_lines(app: &App) -> Vec<Line<'_>> {
    let mut first = vec![Span::styled(" dnstrace ", Style::new().bold().reversed())];
    // First, so that no terminal is too narrow for it.
    if let Some(held) = &app.held {
        first.push(Span::styled(
            format!(" PAUSED ({} new) │", held.rows.len()),
            WARN,
        ));
    }
    first.push(Span::raw(format!(" {}", app.about.target)));
    // A replay has no hooks of its own.
    if app.about.hooks > 0 {
        first.push(Span::raw(format!(" │ {} hooks", app.about.hooks)));
    }
    if let Some(r) = &app.health.recording {
        let style = if r.starts_with("recording stopped") {
            BAD
        } else {
            DIM
        };
        first.push(Span::styled(format!(" │ {r}"), style));
    }
    if let Some(log) = &app.about.log {
        first.push(Span::styled(format!(" │ log {log}"), DIM));
    }
    let s = &app.stats;
    let t = &s.totals;
    let pct = s
        .percentiles
        .map_or("p50 -  p95 -  p99 -".to_owned(), |[a, b, c]| {
            format!("p50 {}  p95 {}  p99 {}", latency(a), latency(b), latency(c))
        });
    let counter = |label: &str, n: u64| {
        let style = if n > 0 { BAD } else { Style::new() };
        Span::styled(format!("  {label} {n}"), style)
    };
    let mut counts = vec![Span::raw(format!(" {:.0} lookups/s", s.rate))];
    // What follows counts the lookups kept: say how few they are.
    if app.health.one_in > 1 {
        let kept = format!(" (1 in {} kept)", app.health.one_in);
        counts.push(Span::styled(kept, BAD));
    }
    counts.extend([
        Span::raw(format!(
            " │ answered {}  nxdomain {}",
            t.answered, t.nxdomain
        )),
        counter("failed", t.failed),
        counter("unanswered", t.unanswered),
    ]);
    let mut health = vec![
        Span::raw(format!(" {pct} │ open {}", app.health.open)),
        counter("lost", app.health.lost),
        counter("evicted", app.health.evicted),
    ];
    if app.dropped_updates > 0 {
        health.push(counter("view behind", app.dropped_updates));
    }
    let mut lines = vec![Line::from(first), Line::from(counts), Line::from(health)];
    if !app.health.nodes.is_empty() {
        lines.push(nodes_line(&app.health.nodes));
    }
    lines
}

/// A cluster view's nodes: each up or down, with how far it lags, how
/// its clock was moved and what its agent dropped, where any.
fn nodes_line(nodes: &[NodeStatus]) -> Line<'_> {
    let mut spans = vec![Span::raw(" nodes")];
    for n in nodes {
        spans.push(Span::raw(format!(" │ {} ", n.name)));
        if !n.up {
            spans.push(Span::styled("DOWN", BAD));
            continue;
        }
        spans.push(Span::raw("up"));
        if n.lag_ns >= LAGGING_NS {
            spans.push(Span::styled(format!(" lag {}", latency(n.lag_ns)), WARN));
        }
        if n.offset_ns != 0 {
            let sign = if n.offset_ns < 0 { '-' } else { '+' };
            let by = latency(n.offset_ns.unsigned_abs());
            spans.push(Span::styled(format!(" clock {sign}{by}"), DIM));
        }
        if n.dropped > 0 {
            spans.push(Span::styled(format!(" dropped {}", n.dropped), BAD));
        }
    }
    Line::from(spans)
}

fn list_screen(app: &App, f: &mut Frame, area: Rect) {
    let shown = app.anomalies.len().clamp(1, 5) as u16;
    let detail = if app.anomaly_filter.is_some() { 9 } else { 0 };
    let [charts, anomalies, details, lookups] = Layout::vertical([
        Constraint::Length(4),
        Constraint::Length(shown + 1),
        Constraint::Length(detail),
        Constraint::Min(3),
    ])
    .areas(area);
    draw_charts(app, f, charts);
    draw_anomalies(app, f, anomalies);
    if let Some(a) = app
        .anomaly_filter
        .as_ref()
        .and_then(|k| app.anomalies.iter().find(|a| &a.key == k))
    {
        draw_anomaly_detail(a, f, details);
    }
    draw_lookups(app, f, lookups);
}

fn titled(title: String, focused: bool) -> Block<'static> {
    let style = if focused {
        Style::new().bold()
    } else {
        Style::new()
    };
    Block::new()
        .borders(Borders::TOP)
        .title(Span::styled(title, style))
}

fn draw_charts(app: &App, f: &mut Frame, area: Rect) {
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let fit = |v: &[u64], w: u16| v[v.len().saturating_sub(w as usize)..].to_vec();
    let s = &app.stats;
    let peak = s.per_second.iter().max().copied().unwrap_or(0);
    let rate = fit(&s.per_second, left.width);
    f.render_widget(
        Sparkline::default()
            .block(titled(format!("lookups/s (peak {peak})"), false))
            .data(&rate)
            .style(Style::new().fg(Color::Cyan)),
        left,
    );
    let slowest = s.p95_per_second.iter().max().copied().unwrap_or(0);
    let p95 = fit(&s.p95_per_second, right.width);
    f.render_widget(
        Sparkline::default()
            .block(titled(
                format!("p95 latency per second (max {})", latency(slowest)),
                false,
            ))
            .data(&p95)
            .style(Style::new().fg(Color::Magenta)),
        right,
    );
}

fn severity(s: Severity) -> Span<'static> {
    match s {
        Severity::Critical => Span::styled("CRIT", BAD),
        Severity::Warning => Span::styled("WARN", WARN),
    }
}

/// `3s ago`, `2m ago`.
fn age(now_ns: u64, then_ns: u64) -> String {
    let s = now_ns.saturating_sub(then_ns) / 1_000_000_000;
    match s {
        0..60 => format!("{s}s ago"),
        60..3600 => format!("{}m ago", s / 60),
        _ => format!("{}h ago", s / 3600),
    }
}

fn draw_anomalies(app: &App, f: &mut Frame, area: Rect) {
    let focused = app.focus == Focus::Anomalies && app.screen == Screen::List;
    let block = titled(format!("anomalies ({})", app.anomalies.len()), focused);
    if app.anomalies.is_empty() {
        f.render_widget(
            Paragraph::new(Span::styled(" none so far", DIM)).block(block),
            area,
        );
        return;
    }
    let rows = app.anomalies.iter().map(|a| {
        let mark = if app.anomaly_filter.as_ref() == Some(&a.key) {
            "▶"
        } else {
            " "
        };
        Row::new(vec![
            Cell::from(mark),
            Cell::from(severity(a.severity)),
            Cell::from(format!("x{}", a.count)),
            Cell::from(age(app.health.now_ns, a.last_ns)),
            Cell::from(a.key.0.as_str()),
            Cell::from(a.key.1.clone()),
        ])
    });
    let widths = [
        Constraint::Length(1),
        Constraint::Length(4),
        Constraint::Length(6),
        Constraint::Length(7),
        Constraint::Length(30),
        Constraint::Fill(1),
    ];
    let mut state = TableState::default().with_selected(focused.then_some(app.selected_anomaly));
    f.render_stateful_widget(
        Table::new(rows, widths)
            .block(block)
            .row_highlight_style(SELECTED),
        area,
        &mut state,
    );
}

/// What to do first, then why, then what was seen.
fn draw_anomaly_detail(a: &AnomalyRow, f: &mut Frame, area: Rect) {
    let mut lines = vec![
        Line::from(vec![
            Span::styled("fix      ", DIM),
            Span::styled(a.fix, Style::new().fg(Color::Green)),
        ]),
        Line::from(vec![
            Span::styled("cause    ", DIM),
            Span::raw(a.cause.clone()),
        ]),
    ];
    lines.extend(
        a.evidence
            .iter()
            .map(|e| Line::from(vec![Span::styled("evidence ", DIM), Span::raw(e.clone())])),
    );
    lines.extend(
        a.about
            .iter()
            .map(|e| Line::from(vec![Span::styled("about    ", DIM), Span::raw(e.clone())])),
    );
    f.render_widget(
        Paragraph::new(lines)
            .block(titled(format!("{}: {}", a.key.0, a.key.1), false))
            .wrap(Wrap { trim: true }),
        area,
    );
}

fn status_style(s: &Status) -> Style {
    match s {
        Status::Answered { rcode, .. } if *rcode == Rcode::NOERROR => Style::new().fg(Color::Green),
        Status::Answered { rcode, .. } if *rcode == Rcode::NXDOMAIN => {
            Style::new().fg(Color::Yellow)
        }
        _ => BAD,
    }
}

fn draw_lookups(app: &App, f: &mut Frame, area: Rect) {
    let visible: Vec<&Lookup> = app.visible().collect();
    let mut title = format!("lookups ({} of {} kept)", visible.len(), app.rows.len());
    if !app.filter.is_empty() || app.editing_filter {
        title += &format!(" filter: {}", app.filter);
        if app.editing_filter {
            title.push('▏');
        }
    }
    if app.anomalies_only {
        title += " [anomalies only]";
    }
    let block = titled(title, app.focus == Focus::Lookups);
    if visible.is_empty() {
        let text = if app.rows.is_empty() {
            " waiting for DNS lookups…"
        } else {
            " no lookup matches"
        };
        f.render_widget(Paragraph::new(Span::styled(text, DIM)).block(block), area);
        return;
    }
    let wide = area.width >= 110;
    // Only the rows that fit, the selected one among them, as the table
    // would scroll to it: the list keeps thousands, and drawing every one
    // each frame was most of the view thread's time.
    let fit = usize::from(block.inner(area).height.saturating_sub(1)).max(1);
    let selected = (app.focus == Focus::Lookups).then(|| app.selected_index());
    let first = selected.map_or(0, |s| (s + 1).saturating_sub(fit));
    let rows = visible
        .iter()
        .skip(first)
        .take(fit)
        .map(|l| lookup_row(l, wide));
    let mut widths = vec![
        Constraint::Length(12),
        Constraint::Length(if wide { 26 } else { 14 }),
        Constraint::Fill(1),
        Constraint::Length(5),
        Constraint::Length(9),
        Constraint::Length(9),
    ];
    if wide {
        widths.push(Constraint::Length(24));
    }
    widths.push(Constraint::Length(3));
    let mut header = vec!["time", "pod", "name", "type", "status", "latency"];
    if wide {
        header.push("server");
    }
    header.push("!");
    let mut state = TableState::default().with_selected(selected.map(|s| s - first));
    f.render_stateful_widget(
        Table::new(rows, widths)
            .header(Row::new(header).style(DIM))
            .block(block)
            .row_highlight_style(SELECTED),
        area,
        &mut state,
    );
}

fn lookup_row(l: &Lookup, wide: bool) -> Row<'_> {
    // Narrow: the pod's name without its namespace.
    let pod = match wide {
        true => l.pod.as_str(),
        false => l.pod.rsplit('/').next().unwrap_or(&l.pod),
    };
    let mut cells = vec![
        Cell::from(l.time.as_str()),
        Cell::from(pod),
        Cell::from(l.journey.shown_name()),
        Cell::from(l.journey.qtype.name()),
        Cell::from(Span::styled(l.status.word(), status_style(&l.status))),
        Cell::from(l.latency_ns.map(latency).unwrap_or_else(|| "-".into())),
    ];
    if wide {
        cells.push(Cell::from(l.server.clone().unwrap_or_default()));
    }
    let badge = match l.badges.len() {
        0 => Span::raw(""),
        n => Span::styled(format!("⚠{n}"), BAD),
    };
    cells.push(Cell::from(badge));
    Row::new(cells)
}

fn journey_screen(app: &App, f: &mut Frame, area: Rect, id: u64) {
    let Some(l) = app.lookup(id) else {
        f.render_widget(
            Paragraph::new(" this lookup has left the window (Esc to go back)")
                .block(titled(format!("journey #{id}"), true)),
            area,
        );
        return;
    };
    let d = &detail(&l.journey, &app.labels);
    let answers = d.answers.len().clamp(1, 6) as u16;
    let [top, legs, bottom] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Min(3),
        Constraint::Length(answers + 1),
    ])
    .areas(area);
    let mut lines = vec![Line::from(Span::styled(
        d.outcome.clone(),
        status_style(&l.status),
    ))];
    if let Some(why) = d.incomplete {
        lines.push(Line::from(Span::styled(format!("incomplete: {why}"), WARN)));
    }
    if !l.badges.is_empty() {
        let kinds: Vec<&str> = l.badges.iter().map(|(k, _)| k.as_str()).collect();
        lines.push(Line::from(Span::styled(
            format!("⚠ {}", kinds.join(", ")),
            BAD,
        )));
    }
    f.render_widget(
        Paragraph::new(lines).block(titled(d.title.clone(), true)),
        top,
    );
    draw_legs(d, f, legs);
    let answer_lines: Vec<Line> = if d.answers.is_empty() {
        vec![Line::from(Span::styled(" no answer records", DIM))]
    } else {
        d.answers.iter().map(|a| Line::from(a.as_str())).collect()
    };
    f.render_widget(
        Paragraph::new(answer_lines).block(titled("answer".into(), false)),
        bottom,
    );
}

fn draw_legs(d: &Detail, f: &mut Frame, area: Rect) {
    let bar = if area.width >= 110 { 10 } else { 5 };
    let longest = d.legs.iter().map(|l| l.since_prev_ns).max().unwrap_or(0);
    let rows = d.legs.iter().map(|leg| {
        let indent = "  ".repeat(leg.depth as usize);
        if let Some(h) = &leg.heading {
            return Row::new(vec![
                Cell::from(""),
                Cell::from(""),
                Cell::from(Span::styled(format!("{indent}↳ {h}"), DIM)),
            ]);
        }
        let width = if longest == 0 {
            0
        } else {
            (leg.since_prev_ns as u128 * bar as u128).div_ceil(longest as u128) as usize
        };
        let mut path = format!(
            "{indent}{} {} {} → {}",
            leg.place,
            arrow(leg.direction),
            leg.from,
            leg.to
        );
        for n in &leg.notes {
            path += &format!("  {n}");
        }
        let style = if leg.notes.iter().any(|n| n.starts_with("dropped")) {
            BAD
        } else if leg.answer {
            Style::new().fg(Color::Green)
        } else {
            Style::new()
        };
        Row::new(vec![
            Cell::from(format!("+{}", latency(leg.since_prev_ns))),
            Cell::from(Span::styled(
                "█".repeat(width),
                Style::new().fg(Color::Cyan),
            )),
            Cell::from(Span::styled(path, style)),
        ])
    });
    f.render_widget(
        Table::new(
            rows,
            [
                Constraint::Length(11),
                Constraint::Length(bar as u16),
                Constraint::Fill(1),
            ],
        )
        .header(Row::new(vec!["since prev", "", "where, which way, from → to"]).style(DIM))
        .block(titled(format!("legs ({})", d.legs.len()), false)),
        area,
    );
}

fn arrow(direction: Option<Direction>) -> &'static str {
    match direction {
        Some(Direction::Ingress) => "in ",
        Some(Direction::Egress) => "out",
        Some(Direction::Drop) => "DROP",
        Some(Direction::Nat) => "NAT",
        Some(Direction::Clash) | None => "   ",
    }
}

fn help_bar(app: &App) -> Line<'static> {
    let mut spans = Vec::new();
    for (key, what) in hints(app) {
        spans.push(Span::styled(key, Style::new().reversed()));
        spans.push(Span::raw(format!(" {what} ")));
    }
    Line::from(spans)
}

fn help_popup(f: &mut Frame, area: Rect) {
    let text = [
        (
            "↑ ↓  j k",
            "move; in a journey, the previous or next lookup",
        ),
        ("PgUp PgDn g G", "move faster, to the newest, to the oldest"),
        (
            "Enter",
            "open the lookup's journey, or show an anomaly's lookups",
        ),
        ("Esc", "back; clear the anomaly, the filter"),
        ("Tab", "switch between lookups and anomalies"),
        ("/", "filter by name or pod"),
        ("a", "only lookups with anomalies"),
        ("p", "pause the view (capture goes on)"),
        ("q  Ctrl-C", "quit (programs are detached)"),
    ];
    let lines: Vec<Line> = text
        .iter()
        .map(|(k, w)| {
            Line::from(vec![
                Span::styled(format!("{k:>14}  "), WARN),
                Span::raw(*w),
            ])
        })
        .collect();
    let w = area.width.min(76);
    let h = (lines.len() as u16 + 2).min(area.height);
    let popup = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    f.render_widget(Clear, popup);
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" keys ")),
        popup,
    );
}
