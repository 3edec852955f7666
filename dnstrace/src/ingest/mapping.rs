//! A BPF map's memory mapped into this process (`mmap` of its fd): the
//! ring buffer's pages, the pending queries' slots.
use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
    ptr::NonNull,
    sync::atomic::AtomicUsize,
};

/// A shared mapping of a map's fd, unmapped on drop.
pub(super) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: an owned mapping of shared memory, unmapped once, on drop; what
// its users read and write there they order with the kernel by atomics.
unsafe impl Send for Mapping {}

impl Mapping {
    pub(super) fn new(fd: BorrowedFd, len: usize, prot: i32, offset: usize) -> io::Result<Self> {
        let offset = libc::off_t::try_from(offset).map_err(io::Error::other)?;
        // SAFETY: a new shared mapping of the map's fd, owned by `Self`.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap gave address 0"))?;
        Ok(Self { ptr, len })
    }

    /// The word at byte `offset` (8-aligned, inside the mapping), which
    /// the kernel reads or writes atomically.
    pub(super) fn word(&self, offset: usize) -> &AtomicUsize {
        // SAFETY: page-aligned mapping; the caller's offset is inside it.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicUsize>() }
    }

    /// Where the mapping starts.
    pub(super) fn start(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

pub(super) fn page_size() -> io::Result<usize> {
    // SAFETY: plain sysconf(3).
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).map_err(|_| io::Error::last_os_error())
}
