//! The programs' own log (aya-log): why they skipped packets, only when
//! asked (`--debug-bpf`), as records of dnstrace's own log.
use std::os::fd::{AsRawFd as _, RawFd};

use anyhow::{anyhow, Result};
use aya::Ebpf;
use aya_log::EbpfLogger;

/// How much the programs log (`--debug-bpf[=LEVEL]`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BpfLog {
    /// DNS packets left out, and packets that could not be parsed.
    Debug,
    /// Also every packet that is not DNS (most of them).
    Trace,
}

/// The most detailed level the logging programs log at (their `LOG_LEVEL`).
pub fn level(log: BpfLog) -> u8 {
    let level = match log {
        BpfLog::Debug => aya_log::Level::Debug,
        BpfLog::Trace => aya_log::Level::Trace,
    };
    level.into()
}

/// The reading end of the programs' log ring. It must outlive the programs'
/// loads: they refer to the ring by this value's file descriptor.
pub struct KernelLog(EbpfLogger<Forward>);

/// Hands the programs' records to dnstrace's logger as its own (`dnstrace:
/// bpf: DEBUG …`), whatever `DNSTRACE_LOG` says: `--debug-bpf` asked for
/// them, at its own level, already applied in the kernel.
pub struct Forward;

impl log::Log for Forward {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }

    fn log(&self, record: &log::Record) {
        log::logger().log(
            &log::Record::builder()
                .level(record.level())
                .target(module_path!())
                .args(format_args!("bpf: {} {}", record.level(), record.args()))
                .build(),
        );
    }

    fn flush(&self) {}
}

impl KernelLog {
    pub fn open(ebpf: &mut Ebpf) -> Result<Self> {
        EbpfLogger::init_with_logger(ebpf, Forward)
            .map(Self)
            .map_err(|e| anyhow!("opening the programs' log (aya-log): {e}"))
    }

    /// Forwards the records as they come, on a thread of its own that lasts
    /// as long as the process. A thread has the capabilities of the one that
    /// starts it: call this once they are dropped.
    pub fn forward(self) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("bpf-log".into())
            .spawn(move || self.run())
            .map(drop)
    }

    fn run(mut self) {
        let fd = self.0.as_raw_fd();
        loop {
            wait_readable(fd);
            self.0.flush();
        }
    }
}

/// Blocks until the ring has records (or a signal interrupts the wait).
fn wait_readable(fd: RawFd) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the ring's open descriptor.
    unsafe { libc::poll(&mut pfd, 1, -1) };
}
