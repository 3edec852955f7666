//! Entry point of `benches/pipeline.rs` (feature `bench`): decode,
//! correlation and the rules over a recording held in memory, so the
//! measure leaves out reading the file and formatting the output.
use std::{io, path::Path};

use anyhow::Result;

use crate::{
    correlate::Journey,
    decode::KernelNames,
    diagnose::{Anomaly, AnomalyKind},
    output::Labels,
    pipeline::{Input, JourneyOut, JourneySink, Pipeline, Sink as _},
    record::replay::{About, Replay, Speed},
};

/// A recording's inputs, read once.
pub struct Stream {
    about: About,
    inputs: Vec<Input>,
    end_ns: u64,
}

/// What one pass made.
#[derive(Debug, PartialEq, Eq)]
pub struct Made {
    pub packets: u64,
    pub journeys: u64,
    pub anomalies: usize,
}

impl Stream {
    pub fn load(path: &Path) -> Result<Self> {
        let about = About::read(path)?;
        // Port 53, as `dnstrace replay` takes by default.
        let mut replay = Replay::open(path, &about, vec![53], Speed::Fast)?;
        let inputs: Vec<Input> = std::iter::from_fn(|| replay.next_input()).collect();
        if let Some(e) = replay.error.take() {
            return Err(e);
        }
        let end_ns = crate::pipeline::Source::now(&replay);
        Ok(Self {
            about,
            inputs,
            end_ns,
        })
    }

    /// A copy of the inputs for one pass, made outside the measure.
    pub fn inputs(&self) -> Vec<Input> {
        self.inputs.clone()
    }

    /// Feeds `inputs` through decoding, correlation and the rules.
    pub fn run(&self, inputs: Vec<Input>) -> io::Result<Made> {
        let mut pipe = Pipeline::default();
        let out = Count {
            labels: self.about.labels(),
            journeys: 0,
            anomalies: 0,
        };
        let mut sink = JourneySink::new(self.about.limits(), self.about.context(), out);
        for input in inputs {
            pipe.step(input, &mut sink)?;
        }
        sink.finish(self.end_ns)?;
        Ok(Made {
            packets: pipe.counts.packets,
            journeys: sink.out.journeys,
            anomalies: sink.out.anomalies,
        })
    }
}

/// Counts journeys and anomalies instead of writing them.
struct Count {
    labels: Labels,
    journeys: u64,
    anomalies: usize,
}

impl JourneyOut for Count {
    fn kernel(&self) -> &KernelNames {
        self.labels.kernel()
    }
    fn journey(&mut self, _: Journey, _: &[(AnomalyKind, String)]) -> io::Result<()> {
        self.journeys += 1;
        Ok(())
    }
    fn anomaly(&mut self, _: &Anomaly) -> io::Result<()> {
        Ok(())
    }
    fn summary(&mut self, all: &[&Anomaly]) -> io::Result<()> {
        self.anomalies = all.len();
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
