//! Doing things inside another network namespace (the node's, seen from a
//! dnstrace that runs elsewhere): sockets and /proc/net files keep the
//! namespace they were opened in, and programs inherit the thread's.
use std::{fs::File, os::fd::AsRawFd, path::Path};

use anyhow::{anyhow, Context as _, Result};

/// Runs `f` on a thread inside the network namespace at `netns` (or here).
pub fn in_netns<T: Send + 'static>(
    netns: Option<&Path>,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let ns = netns
        .map(|p| {
            File::open(p).with_context(|| format!("opening network namespace {}", p.display()))
        })
        .transpose()?;
    std::thread::spawn(move || {
        if let Some(ns) = ns {
            enter(&ns).context("entering the network namespace")?;
        }
        f()
    })
    .join()
    .map_err(|_| anyhow!("netns thread panicked"))?
}

/// Moves the calling thread into the network namespace `ns`; threads it
/// spawns then start there too.
pub fn enter(ns: &File) -> std::io::Result<()> {
    // SAFETY: setns on the calling thread only, with a namespace fd.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The inode of the network namespace at `netns` (or dnstrace's own).
pub fn inode(netns: Option<&Path>) -> Result<u32> {
    use std::os::unix::fs::MetadataExt as _;
    let path = netns.unwrap_or(Path::new("/proc/self/ns/net"));
    Ok(std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .ino() as u32)
}

/// A sysctl of the namespace at `netns`, e.g. `net/bridge/bridge-nf-call-iptables`.
pub fn sysctl(netns: Option<&Path>, key: &str) -> Option<String> {
    let path = format!("/proc/sys/{key}");
    in_netns(netns, move || {
        Ok(std::fs::read_to_string(&path)?.trim().to_owned())
    })
    .ok()
}
