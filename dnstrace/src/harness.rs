//! Switches of the layers that only the tests and the bench set, for
//! `dnstrace-harness` (feature `harness`); the user's command line has
//! none of them. They come first, before dnstrace's own arguments:
//! `dnstrace-harness [--probe-reads] [--discard-events] [DNSTRACE ARGS]`.
pub mod cri_lab;

use std::ffi::OsString;

use crate::commands::trace::TraceOptions;

#[derive(Debug, Default, PartialEq)]
pub struct Switches {
    /// The tracepoints read the kernel's structs with probe reads only
    /// (the probes' `probe_reads`): the tests check both ways read alike.
    probe_reads: bool,
    /// Events read off the ring and dropped undecoded: what the kernel side
    /// costs on its own (the bench's capacity figure).
    discard_events: bool,
}

impl Switches {
    /// Takes the switches off the front of `args` (after the program name).
    pub fn take(args: &mut Vec<OsString>) -> Self {
        let mut s = Self::default();
        let mut used = 1;
        while let Some(a) = args.get(used).and_then(|a| a.to_str()) {
            match a {
                "--probe-reads" => s.probe_reads = true,
                "--discard-events" => s.discard_events = true,
                _ => break,
            }
            used += 1;
        }
        args.drain(1..used);
        s
    }

    pub fn apply(&self, o: &mut TraceOptions) {
        o.probes.probe_reads = self.probe_reads;
        o.discard_events = self.discard_events;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn switches_come_off_the_front_and_the_rest_is_dnstrace_s() {
        let mut a = args(&["h", "--discard-events", "--probe-reads", "--iface", "x"]);
        let s = Switches::take(&mut a);
        assert_eq!(a, args(&["h", "--iface", "x"]));
        assert!(s.probe_reads && s.discard_events);
    }

    #[test]
    fn a_switch_after_dnstrace_s_arguments_is_dnstrace_s() {
        let mut a = args(&["h", "-o", "json", "--discard-events"]);
        assert_eq!(Switches::take(&mut a), Switches::default());
        assert_eq!(a.len(), 4);
    }
}
