//! `dnstrace --iface`: capture, decode and print until Ctrl-C or SIGTERM.
use std::{collections::HashMap, io};

use anyhow::{Context as _, Result};
use tokio::{
    signal::unix::{signal, Signal, SignalKind},
    time::{interval, Duration},
};

use crate::{
    cli::CaptureArgs,
    decode::{Body, Decoder, KernelNames, Record},
    ingest::Ingest,
    output::{Clock, LineSink},
    probes::Probes,
};

#[derive(Default, Debug)]
struct Counts {
    packets: u64,
    messages: u64,
    malformed: u64,
}

/// Ctrl-C and SIGTERM, caught from the start so that a stop during
/// start-up still detaches everything.
struct Stop {
    int: Signal,
    term: Signal,
}

impl Stop {
    fn new() -> io::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    async fn wait(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

pub async fn run(args: CaptureArgs) -> Result<()> {
    let mut stop = Stop::new()?;
    let mut probes = Probes::attach(&args)?;
    for a in &probes.attachments {
        eprintln!(
            "dnstrace: {} (prog id {}) attached to {} ({})",
            a.program, a.prog_id, a.target, a.how
        );
    }
    let names: HashMap<u32, String> = probes.iface_names();
    let mut ingest = Ingest::new(probes.take_events()?).context("watching the ring buffer")?;
    for why in &probes.off {
        eprintln!("dnstrace: off: {why}");
    }
    // Root reads real addresses from kallsyms; drop locations need them.
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    let kernel = KernelNames::new(std::mem::take(&mut probes.drop_reasons), &kallsyms);
    let mut sink = LineSink::new(
        args.output,
        names,
        Clock::now(),
        kernel,
        io::stdout().lock(),
    );
    let mut decoder = Decoder::default();
    let mut counts = Counts::default();
    let ports: Vec<String> = args.ports.iter().map(u16::to_string).collect();
    eprintln!(
        "dnstrace: capturing DNS on port {}; Ctrl-C to stop",
        ports.join(",")
    );
    let result = pump(
        &mut ingest,
        &mut decoder,
        &mut sink,
        &mut counts,
        &probes,
        &mut stop,
    )
    .await;
    let mut batch = Vec::new();
    ingest.drain_now(&mut batch);
    let flushed = emit(batch, &mut decoder, &mut sink, &mut counts);
    let lost = probes.lost_events().unwrap_or(0);
    let targets: Vec<String> = probes
        .attachments
        .iter()
        .map(|a| a.target.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    drop(probes);
    eprintln!(
        "dnstrace: {} DNS packets, {} messages, {} malformed; {} events lost; detached from {}",
        counts.packets,
        counts.messages,
        counts.malformed,
        lost,
        targets.join(", ")
    );
    if decoder.evicted_streams() > 0 {
        eprintln!(
            "dnstrace: {} TCP streams dropped from reassembly (too many open at once)",
            decoder.evicted_streams()
        );
    }
    if ingest.bad_events > 0 {
        eprintln!(
            "dnstrace: {} kernel events could not be decoded",
            ingest.bad_events
        );
    }
    result.and(flushed.or_else(ignore_closed_stdout))
}

/// Moves events to the output until a signal arrives or stdout closes.
async fn pump<W: io::Write>(
    ingest: &mut Ingest,
    decoder: &mut Decoder,
    sink: &mut LineSink<W>,
    counts: &mut Counts,
    probes: &Probes,
    stop: &mut Stop,
) -> Result<()> {
    let mut tick = interval(Duration::from_secs(1));
    let mut lost_reported = 0;
    loop {
        let mut batch = Vec::new();
        tokio::select! {
            () = stop.wait() => return Ok(()),
            r = ingest.next_batch(&mut batch) => r.context("reading the ring buffer")?,
            _ = tick.tick() => {
                let lost = probes.lost_events().unwrap_or(0);
                if lost > lost_reported {
                    eprintln!("dnstrace: warning: {} events lost so far (ring buffer full; raise --ring-buffer-mib)", lost);
                    lost_reported = lost;
                }
            }
        }
        if let Err(e) = emit(batch, decoder, sink, counts) {
            return ignore_closed_stdout(e);
        }
    }
}

fn emit<W: io::Write>(
    batch: Vec<crate::decode::Packet>,
    decoder: &mut Decoder,
    sink: &mut LineSink<W>,
    counts: &mut Counts,
) -> Result<(), io::Error> {
    let mut records: Vec<Record> = Vec::new();
    for packet in batch {
        counts.packets += 1;
        decoder.decode(packet, &mut records);
    }
    for rec in &records {
        match rec.body {
            Body::Dns(_) => counts.messages += 1,
            Body::Malformed { .. } => counts.malformed += 1,
        }
        sink.write(rec)?;
    }
    sink.flush()
}

/// A reader that went away (`| head`) ends the capture quietly.
fn ignore_closed_stdout(e: io::Error) -> Result<()> {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Ok(())
    } else {
        Err(anyhow::Error::new(e).context("writing to stdout"))
    }
}
