//! Metric families in Prometheus's text format (version 0.0.4), with one
//! budget of series for all of them: past it, an observation still
//! counts, in its family's overflow series, so that a family's sum stays
//! exact whatever the cardinality.
use std::{collections::HashMap, fmt::Write as _};

/// Between label values in a series' key. A value holding it is cut there
/// (label values are names, addresses and codes).
const SEP: char = '\u{1f}';

/// The label value of every label of an overflow series.
pub const OVERFLOW: &str = "_overflow";

/// How many series all families may hold together, and what went over.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: usize,
    /// Observations counted in an overflow series, for want of room.
    pub overflowed: u64,
}

impl Budget {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            used: 0,
            overflowed: 0,
        }
    }

    pub fn used(&self) -> usize {
        self.used
    }

    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// What a family's series hold.
pub trait Value: Default {
    const TYPE: &'static str;
    /// Writes the series' samples: `name{labels} value` lines.
    fn write(&self, out: &mut String, name: &str, labels: &str);
}

impl Value for u64 {
    const TYPE: &'static str = "counter";
    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let _ = writeln!(out, "{name}{{{labels}}} {self}");
    }
}

/// The OpenTelemetry `dns.lookup.duration` bucket boundaries, in seconds.
pub const BOUNDS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// A histogram over `BOUNDS`: counts per bucket (not yet cumulative).
#[derive(Default, Debug, Clone, PartialEq)]
pub struct Histogram {
    buckets: [u64; BOUNDS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    /// Counted elsewhere: `count` observations summing to `sum`, per
    /// bucket (past the last bound in none).
    pub fn from_buckets(buckets: &[u64; BOUNDS.len()], count: u64, sum: f64) -> Self {
        Self {
            buckets: *buckets,
            count,
            sum,
        }
    }

    /// One observation.
    pub fn of(seconds: f64) -> Self {
        let mut h = Self::default();
        h.observe(seconds);
        h
    }

    pub fn merge(&mut self, other: &Self) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets) {
            *a += b;
        }
        self.count += other.count;
        self.sum += other.sum;
    }

    pub fn observe(&mut self, seconds: f64) {
        if let Some(i) = BOUNDS.iter().position(|&b| seconds <= b) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum += seconds;
    }
}

impl Value for Histogram {
    const TYPE: &'static str = "histogram";
    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let comma = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, n) in BOUNDS.iter().zip(self.buckets) {
            cumulative += n;
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{comma}le=\"{bound}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{comma}le=\"+Inf\"}} {}",
            self.count
        );
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

struct Series<T> {
    value: T,
    /// When it was last observed: a series quiet past the time to live
    /// goes (a pod gone), and its room with it.
    touched_ns: u64,
}

/// One metric: its series by label values.
pub struct Family<T> {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    series: HashMap<Box<str>, Series<T>>,
    overflow: Option<T>,
    /// Reused for each observation's key.
    key: String,
}

impl<T: Value> Family<T> {
    pub fn new(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Self {
        Self {
            name,
            help,
            labels,
            series: HashMap::new(),
            overflow: None,
            key: String::new(),
        }
    }

    /// The series of `values` (one per label, in order), made if the
    /// budget has room, else the overflow series.
    pub fn at(&mut self, values: &[&str], budget: &mut Budget, now_ns: u64) -> &mut T {
        debug_assert_eq!(values.len(), self.labels.len());
        self.key.clear();
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                self.key.push(SEP);
            }
            self.key.push_str(v.split(SEP).next().unwrap_or_default());
        }
        if !self.series.contains_key(self.key.as_str()) {
            if budget.used >= budget.limit {
                budget.overflowed += 1;
                return self.overflow.get_or_insert_with(T::default);
            }
            budget.used += 1;
            self.series.insert(
                self.key.as_str().into(),
                Series {
                    value: T::default(),
                    touched_ns: now_ns,
                },
            );
        }
        let s = self.series.get_mut(self.key.as_str()).expect("just made");
        s.touched_ns = now_ns;
        &mut s.value
    }

    /// Drops series not observed since `before_ns`, giving their room back.
    pub fn expire(&mut self, before_ns: u64, budget: &mut Budget) {
        let was = self.series.len();
        self.series.retain(|_, s| s.touched_ns >= before_ns);
        budget.used -= was - self.series.len();
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// `# HELP`, `# TYPE` and every series, sorted by labels (a stable
    /// page, easy to compare).
    pub fn write(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, T::TYPE);
        let mut keys: Vec<&str> = self.series.keys().map(|k| &**k).collect();
        keys.sort_unstable();
        let mut labels = String::new();
        for key in keys {
            labels.clear();
            for (i, (name, value)) in self.labels.iter().zip(key.split(SEP)).enumerate() {
                if i > 0 {
                    labels.push(',');
                }
                label(&mut labels, name, value);
            }
            self.series[key].value.write(out, self.name, &labels);
        }
        if let Some(v) = &self.overflow {
            labels.clear();
            for (i, name) in self.labels.iter().enumerate() {
                if i > 0 {
                    labels.push(',');
                }
                label(&mut labels, name, OVERFLOW);
            }
            v.write(out, self.name, &labels);
        }
    }
}

/// `name="value"`, the value escaped as the text format asks.
fn label(out: &mut String, name: &str, value: &str) {
    out.push_str(name);
    out.push_str("=\"");
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A metric with one sample and no labels: `name value`.
pub fn single(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_family_writes_sorted_escaped_series() {
        let mut budget = Budget::new(10);
        let mut f: Family<u64> = Family::new("x_total", "X.", &["a", "b"]);
        *f.at(&["2", "q\"\\\n"], &mut budget, 0) += 1;
        *f.at(&["1", "y"], &mut budget, 0) += 2;
        *f.at(&["1", "y"], &mut budget, 0) += 1;
        let mut out = String::new();
        f.write(&mut out);
        assert_eq!(
            out,
            "# HELP x_total X.\n# TYPE x_total counter\nx_total{a=\"1\",b=\"y\"} 3\nx_total{a=\"2\",b=\"q\\\"\\\\\\n\"} 1\n"
        );
        assert_eq!(budget.used(), 2);
    }

    #[test]
    fn past_the_budget_observations_go_to_the_overflow_series_and_are_counted() {
        let mut budget = Budget::new(1);
        let mut f: Family<u64> = Family::new("x_total", "X.", &["pod"]);
        for pod in ["a", "b", "c", "a"] {
            *f.at(&[pod], &mut budget, 0) += 1;
        }
        let mut out = String::new();
        f.write(&mut out);
        assert!(out.contains("x_total{pod=\"a\"} 2\n"), "{out}");
        assert!(out.contains("x_total{pod=\"_overflow\"} 2\n"), "{out}");
        assert_eq!(budget.overflowed, 2);
    }

    #[test]
    fn quiet_series_expire_and_give_their_room_back() {
        let mut budget = Budget::new(2);
        let mut f: Family<u64> = Family::new("x_total", "X.", &["pod"]);
        *f.at(&["old"], &mut budget, 10) += 1;
        *f.at(&["new"], &mut budget, 50) += 1;
        f.expire(20, &mut budget);
        assert_eq!((f.len(), budget.used()), (1, 1));
        *f.at(&["next"], &mut budget, 60) += 1;
        assert_eq!(budget.overflowed, 0);
    }

    #[test]
    fn a_histogram_is_cumulative_with_its_sum_and_count() {
        let mut h = Histogram::default();
        for s in [0.001, 0.02, 0.02, 30.0] {
            h.observe(s);
        }
        let mut out = String::new();
        h.write(&mut out, "d_seconds", "pod=\"a\"");
        assert!(
            out.contains("d_seconds_bucket{pod=\"a\",le=\"0.005\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("d_seconds_bucket{pod=\"a\",le=\"0.025\"} 3\n"),
            "{out}"
        );
        assert!(
            out.contains("d_seconds_bucket{pod=\"a\",le=\"10\"} 3\n"),
            "{out}"
        );
        assert!(
            out.contains("d_seconds_bucket{pod=\"a\",le=\"+Inf\"} 4\n"),
            "{out}"
        );
        assert!(out.contains("d_seconds_count{pod=\"a\"} 4\n"), "{out}");
        assert!(out.contains("d_seconds_sum{pod=\"a\"} 30.041"), "{out}");
    }
}
