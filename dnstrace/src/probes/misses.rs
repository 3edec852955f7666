//! What the kernel says of each loaded program (`bpf_prog_info`). Runs it
//! skipped: a tracing program that fires on a CPU where it is already
//! running (a softirq interrupting it, say) is not run again, and the
//! packet it would have seen is not seen; the kernel counts them per
//! program (`recursion_misses`, 5.12+), whatever the statistics sysctl
//! says. And the instructions its verifier walked (`verified_insns`,
//! 5.16+): what a program costs every start-up.
use std::{
    io,
    mem::{size_of, zeroed},
    os::fd::{AsFd, AsRawFd, BorrowedFd},
};

use aya::Ebpf;
use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_prog_info};

/// Skipped runs of every program of `ebpf`, summed; programs whose count
/// cannot be read add nothing.
pub fn skipped_runs(ebpf: &Ebpf) -> u64 {
    ebpf.programs()
        .filter_map(|(_, p)| p.fd().ok())
        .filter_map(|fd| info(fd.as_fd()).ok())
        .map(|i| i.recursion_misses)
        .sum()
}

/// The instructions the verifier walked to load the program `name` of
/// `ebpf`, if it is loaded and the kernel says.
pub fn verified(ebpf: &Ebpf, name: &str) -> Option<u32> {
    let fd = ebpf.program(name)?.fd().ok()?;
    Some(info(fd.as_fd()).ok()?.verified_insns).filter(|&n| n > 0)
}

fn info(fd: BorrowedFd<'_>) -> io::Result<bpf_prog_info> {
    // SAFETY: plain integers and pointers, for which zero is valid.
    let mut info: bpf_prog_info = unsafe { zeroed() };
    // SAFETY: as above.
    let mut attr: bpf_attr = unsafe { zeroed() };
    attr.info.bpf_fd = fd.as_raw_fd() as u32;
    attr.info.info = (&raw mut info) as u64;
    attr.info.info_len = size_of::<bpf_prog_info>() as u32;
    // SAFETY: `attr` names a buffer of `info_len` bytes that outlives the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long,
            &raw mut attr,
            size_of::<bpf_attr>(),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info)
}
