//! The packet of a program whose context is an `__sk_buff` (tc, cgroup).
use core::mem::size_of;

use aya_ebpf::{helpers::generated::bpf_skb_load_bytes, programs::sk_buff::SkBuff};

use crate::{
    debug::{unreadable, Why},
    parse::{helper_result, Reader},
};

/// Offsets read directly from the linear data stay below this, a bound the
/// verifier needs on a packet pointer's variable offset.
const DIRECT_MAX: u32 = 0x1000;

pub struct Packet<'a>(pub &'a SkBuff);

impl Packet<'_> {
    #[inline(always)]
    fn data(&self) -> usize {
        // SAFETY: a field of the program's own context.
        unsafe { (*self.0.skb).data as usize }
    }

    #[inline(always)]
    fn data_end(&self) -> usize {
        // SAFETY: as in `data`.
        unsafe { (*self.0.skb).data_end as usize }
    }
}

impl Reader for Packet<'_> {
    /// Straight from the linear data when it holds the bytes (no helper
    /// call), else copied by `bpf_skb_load_bytes`.
    #[inline(always)]
    fn load<T: Copy>(&self, off: u32) -> Result<T, i64> {
        // LLVM turns the bounds check of one byte into `at < data_end`,
        // which gives the verifier no readable range.
        const { assert!(size_of::<T>() > 1, "load at least two bytes") };
        if off < DIRECT_MAX {
            let at = self.data() + off as usize;
            if at + size_of::<T>() <= self.data_end() {
                // SAFETY: the bytes lie between data and data_end, checked above.
                return Ok(unsafe { (at as *const T).read_unaligned() });
            }
        }
        self.0
            .load(off as usize)
            .map_err(|e| unreadable(Why::Unreadable, off, e))
    }

    #[inline(always)]
    fn copy(&self, off: u32, dst: *mut u8, len: u32) -> Result<(), i64> {
        // SAFETY: `dst` has room for PAYLOAD_MAX bytes and len is bounded by it.
        helper_result(unsafe { bpf_skb_load_bytes(self.0.skb.cast(), off, dst.cast(), len) })
            .map_err(|e| unreadable(Why::Unreadable, off, e))
    }

    #[inline(always)]
    fn available(&self) -> u32 {
        self.0.len()
    }
}
