//! The device tracepoints' links, held apart from aya so that the agent can
//! close them between its windows of following and open them again: a
//! tracepoint with no program attached costs its packets nothing, where
//! one whose program returns at once still costs each a run. Opening one
//! needs no capability, only the program's descriptor: the agent has
//! dropped its capabilities by then.
use std::{
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
};

use aya::programs::ProgramFd;

/// `BPF_RAW_TRACEPOINT_OPEN`: a BTF tracepoint program's attach point is in
/// the program, so no name is given.
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;

/// `union bpf_attr`'s `raw_tracepoint`.
#[repr(C)]
struct RawTracepointAttr {
    name: u64,
    prog_fd: u32,
    _pad: u32,
    cookie: u64,
}

/// A program and its link, while open.
struct Hook {
    program: ProgramFd,
    link: Option<OwnedFd>,
}

/// The device tracepoints, open (attached) or closed.
pub struct DeviceHooks {
    hooks: Vec<Hook>,
}

impl DeviceHooks {
    pub(super) fn new() -> Self {
        Self { hooks: Vec::new() }
    }

    /// Attaches `program`, and keeps it to attach again after a close.
    pub(super) fn attach(&mut self, program: ProgramFd) -> io::Result<()> {
        let link = open(program.as_fd())?;
        self.hooks.push(Hook {
            program,
            link: Some(link),
        });
        Ok(())
    }

    /// Detaches every program: the kernel stops running them on its next
    /// packet.
    pub fn close(&mut self) {
        for h in &mut self.hooks {
            h.link = None;
        }
    }

    /// Attaches every program closed.
    pub fn open(&mut self) -> io::Result<()> {
        for h in self.hooks.iter_mut().filter(|h| h.link.is_none()) {
            h.link = Some(open(h.program.as_fd())?);
        }
        Ok(())
    }
}

fn open(program: BorrowedFd) -> io::Result<OwnedFd> {
    let attr = RawTracepointAttr {
        name: 0,
        prog_fd: program.as_raw_fd() as u32,
        _pad: 0,
        cookie: 0,
    };
    // SAFETY: the bpf syscall reads `size_of_val(&attr)` bytes of `attr`,
    // which lives across the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_RAW_TRACEPOINT_OPEN,
            &attr as *const RawTracepointAttr,
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new file descriptor the kernel gave this process alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
