//! Decode + correlate + rules, one core, over a recording held in memory:
//! `cargo bench -p dnstrace --features bench --bench pipeline -- FILE [PASSES]`.
//! `cargo xtask bench` records the file during lab load and runs this
//! pinned to one core. Prints one line per pass and the median rate, per
//! second of the thread's CPU time: on a shared machine, wall time also
//! counts the time others held the core.
use std::{path::PathBuf, process::ExitCode, time::Instant};

use dnstrace::bench::Stream;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let Some(file) = args.first().map(PathBuf::from) else {
        eprintln!("usage: pipeline FILE [PASSES] (a dnstrace recording)");
        return ExitCode::FAILURE;
    };
    let passes = match args.get(1).map(|p| p.parse::<usize>()) {
        None => 5,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("pipeline: PASSES must be a whole number above 0");
            return ExitCode::FAILURE;
        }
    };
    let stream = match Stream::load(&file) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pipeline: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let mut rates = Vec::new();
    for _ in 0..passes {
        let inputs = stream.inputs();
        let start = Instant::now();
        let cpu = cpu_secs();
        let made = match stream.run(inputs) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("pipeline: {e}");
                return ExitCode::FAILURE;
            }
        };
        let cpu = cpu_secs() - cpu;
        let secs = start.elapsed().as_secs_f64();
        let rate = made.packets as f64 / cpu;
        println!(
            "pass: {} packet events in {cpu:.3} s of CPU ({secs:.3} s wall): {rate:.0} events/s ({} journeys, {} anomalies)",
            made.packets, made.journeys, made.anomalies
        );
        rates.push(rate);
    }
    rates.sort_by(f64::total_cmp);
    println!("median: {:.0} events/s", rates[rates.len() / 2]);
    ExitCode::SUCCESS
}

/// This thread's CPU time so far.
fn cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}
