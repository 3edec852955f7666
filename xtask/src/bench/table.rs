//! The table, as text and as Markdown.
use super::*;

impl Bench {
    pub(super) fn text_table(&self) -> String {
        let header = [
            "figure",
            "baseline",
            "with dnstrace",
            "ratio",
            "goal",
            "met?",
        ];
        let cells: Vec<[String; 6]> = self.rows.iter().map(Row::cells).collect();
        let mut out = String::new();
        for (i, h) in header.iter().enumerate() {
            let _ = write!(out, "{h}{}", if i < 5 { " | " } else { "\n" });
        }
        for c in &cells {
            let _ = writeln!(out, "{}", c.join(" | "));
        }
        out
    }

    pub(super) fn markdown(&self, machine: &str, elapsed: Duration) -> String {
        let mut out = format!(
            "{machine}; `cargo xtask bench{}{}{}`, {:.0} minutes.\n\n",
            if self.quick { " --quick" } else { "" },
            self.only
                .iter()
                .map(|o| format!(" --only {o}"))
                .collect::<String>(),
            self.against
                .as_ref()
                .map_or(String::new(), |a| format!(" --against {}", a.rev)),
            elapsed.as_secs_f64() / 60.0
        );
        out += "| figure | baseline | with dnstrace | ratio | goal | met? |\n";
        out += "| --- | --- | --- | --- | --- | --- |\n";
        for r in &self.rows {
            let c = r.cells().map(|s| s.replace('|', "\\|"));
            let _ = writeln!(out, "| {} |", c.join(" | "));
        }
        out += "\n";
        for n in &self.notes {
            let _ = writeln!(out, "- {n}");
        }
        out
    }
}
