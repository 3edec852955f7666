//! The kernel's clock and the wall clock: events are stamped with
//! CLOCK_MONOTONIC, people read CLOCK_REALTIME.
use std::time::{Duration, SystemTime};

/// Converts kernel CLOCK_MONOTONIC timestamps to wall-clock time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC, in nanoseconds.
    offset_ns: i128,
}

fn clock_ns(id: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the provided timespec.
    unsafe { libc::clock_gettime(id, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

/// Now, on the clock the kernel stamps events with.
pub fn monotonic_now() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC) as u64
}

impl Clock {
    /// Monotonic zero at the epoch: fixed times for tests.
    #[cfg(test)]
    pub const EPOCH: Self = Self { offset_ns: 0 };

    /// A clock as recorded: realtime minus monotonic, in nanoseconds.
    pub fn with_offset(offset_ns: i64) -> Self {
        Self {
            offset_ns: offset_ns.into(),
        }
    }

    pub fn offset_ns(&self) -> i64 {
        self.offset_ns as i64
    }

    pub fn now() -> Self {
        Self {
            offset_ns: clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_MONOTONIC),
        }
    }

    pub fn wall(&self, mono_ns: u64) -> SystemTime {
        let ns = (i128::from(mono_ns) + self.offset_ns).max(0) as u64;
        SystemTime::UNIX_EPOCH + Duration::from_nanos(ns)
    }
}
