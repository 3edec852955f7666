//! OTLP export for `dnstrace agent`: each journey as a trace, each anomaly
//! as a log record tied to the trace of a journey behind it. Export never
//! stalls tracing: a bounded queue to a thread of its own for each
//! signal (`export`).
pub mod config;
mod convert;
mod export;

use std::{
    collections::{HashMap, VecDeque},
    path::Path,
    sync::Arc,
};

use anyhow::Result;

pub use config::Export;
use convert::Context;
pub use export::Counts;
use export::{Item, Queue};

use crate::{
    clock::Clock, correlate::Journey, decode::KernelNames, diagnose::Anomaly, naming::Names,
};

/// OTLP's two transports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

#[derive(Clone, Debug)]
pub struct OtlpOptions {
    /// Where journeys go; none: not exported.
    pub traces: Option<Export>,
    /// Where anomalies go; none: not exported.
    pub logs: Option<Export>,
    /// `k8s.node.name` of every span and record.
    pub node: String,
    /// Traces, and log records, waiting to be sent, at most (each).
    pub queue: usize,
    /// Traces and log records a request carries, at most.
    pub batch: usize,
}

/// Journeys whose trace id is remembered for anomalies raised on them.
const TRACES_KEPT: usize = 4096;

/// The pipeline's side of the export.
pub struct Otlp {
    queue: Queue,
    clock: Clock,
    node: String,
    /// Anomalies raised since the last `flush`.
    waiting: Vec<Anomaly>,
    /// Trace ids of recent journeys, by journey id.
    traces: HashMap<u64, [u8; 16]>,
    order: VecDeque<u64>,
}

impl Otlp {
    pub fn start(options: OtlpOptions, clock: Clock) -> Result<Self> {
        let node = options.node.clone();
        Ok(Self {
            queue: export::start(options)?,
            clock,
            node,
            waiting: Vec::new(),
            traces: HashMap::new(),
            order: VecDeque::new(),
        })
    }

    pub fn journey(&mut self, j: &Journey, names: &Names, kernel: &KernelNames) {
        let cx = Context {
            clock: self.clock,
            names,
            kernel,
            node: &self.node,
        };
        let spans = convert::spans(j, &cx);
        if let Some(root) = spans.first() {
            let id: [u8; 16] = root.trace_id.as_slice().try_into().expect("16 bytes");
            self.remember(j.id, id);
        }
        self.queue.offer(Item::Trace(spans));
    }

    /// Held until `flush`: by then the journey that raised it has been
    /// handed on (its trace id known) and any flight recording started.
    pub fn anomaly(&mut self, a: &Anomaly) {
        self.waiting.push(a.clone());
    }

    /// Sends the anomalies held, naming `flight`, the recording that has
    /// them, if there is one.
    pub fn flush(&mut self, flight: Option<&Path>) {
        for a in std::mem::take(&mut self.waiting) {
            let trace = a
                .journeys
                .iter()
                .rev()
                .find_map(|id| self.traces.get(id))
                .copied();
            let record = convert::log_record(&a, trace, flight, self.clock);
            self.queue.offer(Item::Log(record));
        }
    }

    fn remember(&mut self, journey: u64, trace: [u8; 16]) {
        if self.order.len() >= TRACES_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.traces.remove(&old);
            }
        }
        self.order.push_back(journey);
        self.traces.insert(journey, trace);
    }

    /// The exporter's counters, for `/metrics`.
    pub fn counts(&self) -> Arc<Counts> {
        self.queue.counts.clone()
    }
}
