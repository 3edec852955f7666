//! dnstrace: follow DNS on a Linux or Kubernetes node with eBPF.
//!
//! A library only so that the fuzz targets (`fuzz/`, feature `fuzzing`)
//! can reach the decoders, the pipeline bench (`benches/`, feature
//! `bench`) the pipeline, and the tests' and the bench's
//! `dnstrace-harness` (feature `harness`) the layers' switches; the binary
//! is `main` and nothing else is public.
#[cfg(feature = "bench")]
pub mod bench;
mod cli;
mod clock;
mod commands;
mod conntrack;
mod correlate;
mod decode;
mod diagnose;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
#[cfg(feature = "harness")]
mod harness;
mod ingest;
mod lab;
mod links;
mod logging;
mod metrics;
mod mounts;
mod naming;
mod netlink;
mod netns;
mod otlp;
mod output;
mod pipeline;
mod pods;
mod probes;
mod record;
mod routes;
mod target;
mod view;

use std::process::ExitCode;

use clap::Parser as _;

/// Journeys, legs and messages are many small allocations made and freed
/// per packet: jemalloc does that for less CPU than glibc's malloc (about 14%
/// more events a second in `benches/pipeline.rs`). Not under the
/// fuzzers (cargo-fuzz builds with `--cfg fuzzing`), whose sanitizers
/// watch malloc; the `fuzzing` feature, which the suite builds, keeps it.
#[cfg(not(fuzzing))]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its first allocation: memory freed a second
/// ago goes back to the kernel (the default waits ten), from one background
/// thread (the default is one a CPU).
#[cfg(not(fuzzing))]
#[export_name = "malloc_conf"]
static MALLOC_CONF: &[u8; 45] = b"dirty_decay_ms:1000,max_background_threads:1\0";

/// The command line, run to the end.
pub fn main() -> ExitCode {
    run(std::env::args_os(), |_| ())
}

/// dnstrace-harness: dnstrace with the layers' switches at the front of
/// its command line set (`harness`).
#[cfg(feature = "harness")]
pub fn harness_main() -> ExitCode {
    // The program's name as dnstrace's, for clap's messages (even when
    // started with none).
    let mut args: Vec<std::ffi::OsString> = vec!["dnstrace".into()];
    args.extend(std::env::args_os().skip(1));
    if args.get(1).is_some_and(|a| a == harness::cri_lab::NAME) {
        return cri_lab(args.split_off(1));
    }
    let switches = harness::Switches::take(&mut args);
    run(args, |o| switches.apply(o))
}

/// `dnstrace-harness cri-lab ...` (see `harness::cri_lab`).
#[cfg(feature = "harness")]
fn cri_lab(args: Vec<std::ffi::OsString>) -> ExitCode {
    logging::init();
    let command = harness::cri_lab::CriLab::parse_from(args);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(anyhow::anyhow!("cannot start the runtime: {e}")),
    };
    match runtime.block_on(command.run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

/// The command line `args`, with `tune` applied to what `trace` is asked for.
fn run(
    args: impl IntoIterator<Item = std::ffi::OsString>,
    tune: impl FnOnce(&mut commands::trace::TraceOptions),
) -> ExitCode {
    if setuid() {
        return fail(anyhow::anyhow!(
            "dnstrace refuses to run as a setuid or setgid program: remove the bit and run it as root (sudo)"
        ));
    }
    let cli = cli::Cli::parse_from(args);
    logging::init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(anyhow::anyhow!("cannot start the runtime: {e}")),
    };
    let work = async {
        match cli.command {
            Some(cli::Command::Agent(args)) => {
                if args.log_format == cli::LogFormat::Json {
                    logging::json_lines();
                }
                commands::agent::run(args.agent_options()?).await
            }
            Some(cli::Command::Cluster(args)) => {
                commands::cluster::run(args.cluster_options()).await
            }
            Some(cli::Command::Lab { command, instance }) => lab::run(command, instance).await,
            Some(cli::Command::Check {
                ifaces,
                debug_bpf,
                cri_socket,
            }) => commands::check::check(ifaces, debug_bpf, cri_socket.as_deref()).await,
            Some(cli::Command::Pods {
                query,
                runtime,
                node_netns,
                output,
            }) => {
                let dirs = runtime.dirs();
                let socket = runtime.cri_socket.as_deref();
                commands::pods::run(&dirs, socket, query.as_deref(), node_netns, output).await
            }
            Some(cli::Command::Replay {
                files,
                speed,
                packets,
                ports,
                output,
                no_tui,
                log_file,
            }) => {
                let args = commands::replay::ReplayArgs {
                    files,
                    speed,
                    packets,
                    ports: ports.ports,
                    output,
                    live: cli::live(output, no_tui),
                    log_file,
                };
                commands::replay::run(args).await
            }
            Some(cli::Command::Report {
                files,
                format,
                write,
                ports,
            }) => commands::report::run(&files, format, write.as_deref(), ports.ports).await,
            Some(cli::Command::Trace {
                capture,
                timeout,
                max_open,
            }) => {
                let limits = correlate::Limits {
                    timeout_ns: timeout.as_nanos() as u64,
                    max_open,
                    ..Default::default()
                };
                let view = if capture.live() {
                    pipeline::View::Live(limits)
                } else {
                    pipeline::View::Journeys(limits)
                };
                commands::trace::run(tuned(*capture, tune), view).await
            }
            None if cli.capture.live() => {
                let view = pipeline::View::Live(correlate::Limits::default());
                commands::trace::run(tuned(cli.capture, tune), view).await
            }
            None => commands::trace::run(tuned(cli.capture, tune), pipeline::View::Packets).await,
        }
    };
    match runtime.block_on(work) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

fn tuned(
    capture: cli::CaptureArgs,
    tune: impl FnOnce(&mut commands::trace::TraceOptions),
) -> commands::trace::TraceOptions {
    let mut options = capture.trace_options();
    tune(&mut options);
    options
}

/// Started through a setuid or setgid bit: the caller is not who runs it.
fn setuid() -> bool {
    // SAFETY: these calls only read the process's ids.
    unsafe { libc::getuid() != libc::geteuid() || libc::getgid() != libc::getegid() }
}

fn fail(e: anyhow::Error) -> ExitCode {
    eprintln!("dnstrace: error: {e:#}");
    ExitCode::FAILURE
}

#[cfg(all(test, not(fuzzing)))]
mod tests {
    /// jemalloc read our options: `MALLOC_CONF`'s symbol is the one it
    /// looks for, in the library built from source and the system's alike.
    #[test]
    fn jemalloc_takes_our_options() {
        // SAFETY: both are read-only options of these types.
        let (decay, threads) = unsafe {
            (
                tikv_jemalloc_ctl::raw::read::<isize>(b"opt.dirty_decay_ms\0").unwrap(),
                tikv_jemalloc_ctl::raw::read::<usize>(b"opt.max_background_threads\0").unwrap(),
            )
        };
        assert_eq!((decay, threads), (1000, 1));
    }
}
