//! Keys to actions, for the screen the view is on.
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::state::{Action, App, Focus, Screen};

/// The action a key means now, if any.
pub fn action(app: &App, key: KeyEvent) -> Option<Action> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
        return Some(Action::Quit);
    }
    if app.editing_filter {
        return match key.code {
            KeyCode::Enter => Some(Action::FilterDone),
            KeyCode::Esc => Some(Action::Back),
            KeyCode::Backspace => Some(Action::FilterBackspace),
            KeyCode::Char(c) => Some(Action::FilterChar(c)),
            _ => None,
        };
    }
    Some(match key.code {
        KeyCode::Char('q') => Action::Quit,
        KeyCode::Char('?') => Action::Help,
        KeyCode::Up | KeyCode::Char('k') => Action::Up,
        KeyCode::Down | KeyCode::Char('j') => Action::Down,
        KeyCode::PageUp => Action::PageUp,
        KeyCode::PageDown => Action::PageDown,
        KeyCode::Home | KeyCode::Char('g') => Action::Top,
        KeyCode::End | KeyCode::Char('G') => Action::Bottom,
        KeyCode::Enter => Action::Open,
        KeyCode::Esc | KeyCode::Backspace => Action::Back,
        KeyCode::Tab | KeyCode::BackTab => Action::SwitchFocus,
        KeyCode::Char('/') => Action::StartFilter,
        KeyCode::Char('a') => Action::AnomaliesOnly,
        KeyCode::Char('p') => Action::Pause,
        // Any other key closes the help.
        _ if app.help => Action::Back,
        _ => return None,
    })
}

/// The keys that work on the current screen, for the help bar.
pub fn hints(app: &App) -> Vec<(&'static str, &'static str)> {
    if app.help {
        return vec![("any key", "close help"), ("q", "quit")];
    }
    if app.editing_filter {
        return vec![("Enter", "apply"), ("Esc", "clear"), ("⌫", "delete")];
    }
    let pause = if app.held.is_some() {
        "resume"
    } else {
        "pause"
    };
    match (app.screen, app.focus) {
        (Screen::Journey(_), _) => vec![
            ("Esc", "back"),
            ("↑↓", "previous/next lookup"),
            ("p", pause),
            ("?", "help"),
            ("q", "quit"),
        ],
        (Screen::List, Focus::Anomalies) => vec![
            ("↑↓", "move"),
            ("Enter", "its lookups"),
            ("Tab", "lookups"),
            ("Esc", "clear"),
            ("p", pause),
            ("?", "help"),
            ("q", "quit"),
        ],
        (Screen::List, Focus::Lookups) => vec![
            ("↑↓", "move"),
            ("Enter", "open"),
            ("Tab", "anomalies"),
            ("/", "filter"),
            ("a", "flagged only"),
            ("p", pause),
            ("?", "help"),
            ("q", "quit"),
        ],
    }
}
