//! What `trace` says at exit: its counts as lines of text on stderr, and
//! with `-o json` also as one JSON object, the last line there. This is
//! the command's own output, written to stderr directly rather than
//! logged: it is there whatever the log level, and after a live view,
//! on the terminal rather than in the log file.
use serde::Serialize;

use crate::pipeline::{Counts, Tally};

/// The figures, named as in the JSON object.
#[derive(Serialize)]
pub struct ExitReport {
    #[serde(flatten)]
    pub counts: Counts,
    /// With journeys only.
    #[serde(flatten)]
    pub journeys: Option<Tally>,
    /// Kernel events lost: the ring buffer was full.
    pub lost: u64,
    /// Packets the sampling level left out in the kernel.
    pub sampled_out: u64,
    /// 1 lookup in this many kept at the end.
    pub one_in: u32,
    /// Laps of a query going round one place (a forwarding loop) that the
    /// kernel counted and did not send.
    pub laps_left_out: u64,
    /// TCP payloads left cut: no room on their perf buffer.
    pub apart_lost: u64,
    /// Runs of the programs the kernel skipped: one was already running on
    /// that CPU, and the packet went unseen.
    pub skipped_runs: u64,
    pub evicted_streams: u64,
    /// Fragmented datagrams given up at a hook point: timed out or
    /// inconsistent, and evicted.
    pub incomplete_datagrams: u64,
    pub evicted_datagrams: u64,
    /// Times ctnetlink events were lost (its queue full).
    pub ct_overruns: u64,
    /// Events read and dropped undecoded (`--discard-events`).
    pub discarded: u64,
    pub bad_events: u64,
    pub detached_from: Vec<String>,
}

#[derive(Serialize)]
struct Tagged<'a> {
    event: &'static str,
    #[serde(flatten)]
    report: &'a ExitReport,
}

impl ExitReport {
    pub fn print(&self, json: bool) {
        let mut said = self.lines();
        if json {
            let tagged = Tagged {
                event: "exit",
                report: self,
            };
            said.push(serde_json::to_string(&tagged).expect("plain numbers and strings"));
        }
        eprintln!("{}", said.join("\n"));
    }

    /// As log records: the agent's stderr is its log, JSON or not.
    pub fn log(&self) {
        for line in self.lines() {
            log::info!("{}", line.strip_prefix("dnstrace: ").unwrap_or(&line));
        }
    }

    /// The text: a line of counts, and one for each kind of loss seen.
    fn lines(&self) -> Vec<String> {
        let c = &self.counts;
        let journeys = self.journeys.map(|t| format!(", {t}")).unwrap_or_default();
        let mut said = vec![format!(
            "dnstrace: {}{journeys}; {} events lost; detached from {}",
            c.brief(),
            self.lost,
            self.detached_from.join(", ")
        )];
        let mut say = |n: u64, line: String| {
            if n > 0 {
                said.push(format!("dnstrace: {line}"));
            }
        };
        say(
            self.sampled_out,
            format!(
                "sampling left out {} packets (1 lookup in {} kept at the end)",
                self.sampled_out, self.one_in
            ),
        );
        say(
            self.laps_left_out,
            format!(
                "{} laps of queries going round one place (a forwarding loop) counted, not sent (the 1st, 2nd, 4th, 8th... were)",
                self.laps_left_out
            ),
        );
        say(
            self.apart_lost,
            format!(
                "{} TCP segments kept cut: no room for their payload on the perf buffers",
                self.apart_lost
            ),
        );
        say(
            self.skipped_runs,
            format!(
                "the kernel skipped {} runs of the programs (one already running on that CPU): those packets were not seen",
                self.skipped_runs
            ),
        );
        say(
            self.evicted_streams,
            format!(
                "{} TCP streams dropped from reassembly (too many open at once)",
                self.evicted_streams
            ),
        );
        let given_up = self.incomplete_datagrams + self.evicted_datagrams;
        say(
            given_up,
            format!(
                "{given_up} fragmented datagrams never whole at a hook point ({} timed out or inconsistent, {} evicted: too many held at once)",
                self.incomplete_datagrams, self.evicted_datagrams
            ),
        );
        say(
            self.ct_overruns,
            format!(
                "conntrack events were lost {} times (netlink queue full)",
                self.ct_overruns
            ),
        );
        say(
            self.discarded,
            format!(
                "{} kernel events read and discarded undecoded (--discard-events)",
                self.discarded
            ),
        );
        say(
            self.bad_events,
            format!("{} kernel events could not be decoded", self.bad_events),
        );
        said
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> ExitReport {
        ExitReport {
            counts: Counts {
                packets: 8,
                messages: 8,
                malformed: 1,
                cut: 0,
            },
            journeys: Some(Tally {
                journeys: 2,
                evicted: 0,
                left_out_whole: 0,
                anomalies: 1,
            }),
            lost: 3,
            sampled_out: 40,
            laps_left_out: 0,
            one_in: 4,
            apart_lost: 0,
            skipped_runs: 2,
            evicted_streams: 0,
            incomplete_datagrams: 0,
            evicted_datagrams: 0,
            ct_overruns: 0,
            discarded: 0,
            bad_events: 0,
            detached_from: vec!["vs".into()],
        }
    }

    #[test]
    fn the_text_says_the_counts_and_each_loss_seen() {
        assert_eq!(
            report().lines(),
            [
                "dnstrace: 8 DNS packets, 8 messages, 1 malformed, 2 journeys, 0 evicted (too many open at once), 1 anomalies; 3 events lost; detached from vs",
                "dnstrace: sampling left out 40 packets (1 lookup in 4 kept at the end)",
                "dnstrace: the kernel skipped 2 runs of the programs (one already running on that CPU): those packets were not seen",
            ]
        );
    }

    #[test]
    fn the_json_has_the_same_figures() {
        let report = report();
        let json = serde_json::to_value(Tagged {
            event: "exit",
            report: &report,
        })
        .unwrap();
        assert_eq!(json["event"], "exit");
        assert_eq!(json["packets"], 8);
        assert_eq!(json["journeys"], 2);
        assert_eq!(json["anomalies"], 1);
        assert_eq!(json["lost"], 3);
        assert_eq!(json["sampled_out"], 40);
        assert_eq!(json["one_in"], 4);
        assert_eq!(json["skipped_runs"], 2);
        assert_eq!(json["detached_from"][0], "vs");
    }

    #[test]
    fn packet_lines_have_no_journey_figures() {
        let report = ExitReport {
            journeys: None,
            ..report()
        };
        let json = serde_json::to_value(&report).unwrap();
        assert!(json.get("journeys").is_none() && json.get("evicted").is_none());
    }
}
