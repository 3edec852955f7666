//! Atomics on map memory. The bpf target's spec has no compare-and-swap,
//! so `core::sync::atomic` offers none there; LLVM still emits the
//! kernel's atomic instructions for the intrinsics. Those that return the
//! old value (64-bit only, Linux 5.12) are fully ordered; `add`, which
//! returns nothing, is not.
#[cfg(target_arch = "bpf")]
use core::intrinsics::{atomic_cxchg, atomic_xadd, atomic_xchg, AtomicOrdering::SeqCst};

/// `*p`, read with the ordering of an atomic add of 0: nothing read after
/// it is older.
///
/// # Safety
/// `p` is a valid, 8-aligned u64 in map memory.
#[inline(always)]
pub unsafe fn load(p: *mut u64) -> u64 {
    #[cfg(target_arch = "bpf")]
    return atomic_xadd::<u64, u64, { SeqCst }>(p, 0);
    #[cfg(not(target_arch = "bpf"))]
    return core::sync::atomic::AtomicU64::from_ptr(p).fetch_add(0, SEQ_CST);
}

/// Sets `*p` to `new` if it is `old`; whether it did.
///
/// # Safety
/// As `load`.
#[inline(always)]
pub unsafe fn swap_if(p: *mut u64, old: u64, new: u64) -> bool {
    #[cfg(target_arch = "bpf")]
    return atomic_cxchg::<u64, { SeqCst }, { SeqCst }>(p, old, new).1;
    #[cfg(not(target_arch = "bpf"))]
    return core::sync::atomic::AtomicU64::from_ptr(p)
        .compare_exchange(old, new, SEQ_CST, SEQ_CST)
        .is_ok();
}

/// Sets `*p` to `new` after every store before it.
///
/// # Safety
/// As `load`.
#[inline(always)]
pub unsafe fn publish(p: *mut u64, new: u64) {
    #[cfg(target_arch = "bpf")]
    atomic_xchg::<u64, { SeqCst }>(p, new);
    #[cfg(not(target_arch = "bpf"))]
    core::sync::atomic::AtomicU64::from_ptr(p).swap(new, SEQ_CST);
}

/// Adds `n` to `*p` (wrapping: `u32::MAX` takes one away).
///
/// # Safety
/// `p` is a valid, 4-aligned u32 in map memory.
#[inline(always)]
pub unsafe fn add(p: *mut u32, n: u32) {
    #[cfg(target_arch = "bpf")]
    atomic_xadd::<u32, u32, { SeqCst }>(p, n);
    #[cfg(not(target_arch = "bpf"))]
    core::sync::atomic::AtomicU32::from_ptr(p).fetch_add(n, SEQ_CST);
}

/// Adds `n` to `*p`, as one instruction: a program in process context
/// (a socket's egress) can be interrupted, or preempted by another run on
/// its CPU, between the load and the store of a plain `+=`.
///
/// # Safety
/// `p` is a valid, 8-aligned u64 in map memory.
#[inline(always)]
pub unsafe fn add64(p: *mut u64, n: u64) {
    #[cfg(target_arch = "bpf")]
    atomic_xadd::<u64, u64, { SeqCst }>(p, n);
    #[cfg(not(target_arch = "bpf"))]
    core::sync::atomic::AtomicU64::from_ptr(p).fetch_add(n, SEQ_CST);
}

#[cfg(not(target_arch = "bpf"))]
const SEQ_CST: core::sync::atomic::Ordering = core::sync::atomic::Ordering::SeqCst;
