//! dnstrace: follow DNS on a Linux or Kubernetes node with eBPF.
mod capture;
mod cli;
mod decode;
mod ingest;
mod output;
mod probes;

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(anyhow::anyhow!("cannot start the runtime: {e}")),
    };
    match runtime.block_on(capture::run(cli.capture)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

fn fail(e: anyhow::Error) -> ExitCode {
    eprintln!("dnstrace: error: {e:#}");
    ExitCode::FAILURE
}
