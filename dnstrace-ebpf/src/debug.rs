//! Why a program gave up on a packet, logged through aya-log when user
//! space asks (`dnstrace trace --debug-bpf`).
//!
//! A program that gives up returns an error that says why (`skip`); its
//! entry point hands that to `skipped`, its one log call. The logging is
//! built only into a second object (feature `log`), which user space loads
//! only when asked: in the usual one, the error is dropped as before and
//! the programs are what they were. A load-time global alone left the
//! error codes computed with the flag off: 5 to 8% more instructions.

/// Why a packet was left out: the low byte of the error a program returns,
/// with a detail above it. 0 is not used: helpers' errors are negative.
#[derive(Clone, Copy)]
#[repr(u8)]
pub enum Why {
    /// Not IP (detail: the ethertype).
    NotIp = 1,
    /// Neither UDP nor TCP (the IP protocol or IPv6 next header).
    NotUdpTcp,
    /// Neither port is DNS (source port << 16 | destination port).
    NotDnsPort,
    /// A later IP fragment of a datagram whose first was not DNS (its id).
    UnknownFragment,
    /// An IPv4 header that is not one (its version and length byte).
    BadIpv4,
    /// More IPv6 extension headers than are walked.
    TooManyExtensions,
    /// Packet bytes that could not be read (their offset from the IP header).
    Unreadable,
    /// A kernel struct's field that could not be read (its offset).
    FieldUnreadable,
    /// No skb, or the kernel's offsets were not set.
    NoSkb,
    /// The IP header lies too far before the end of the linear data (bytes).
    TooLong,
    /// No scratch event on this CPU.
    NoScratch,
    /// Not the traced target (the device's network namespace).
    NotTarget,
    /// In another node's network namespace, with `--node` (its inode).
    OtherNode,
    /// Left out by the sampling level.
    Sampled,
    /// The ring buffer had no room (the event's size).
    RingFull,
    /// A UDP datagram too short for a DNS header (its UDP length).
    NotDnsHeader,
    /// A lap of a query going round one place (`laps`).
    Lapped,
}

/// The error a program returns when it gives up on a packet: why, in the
/// object built to log; 0, as before, in the other.
#[inline(always)]
pub fn skip(why: Why, detail: u32) -> i64 {
    if cfg!(feature = "log") {
        why as i64 | i64::from(detail) << 8
    } else {
        0
    }
}

/// A helper's failure `e` to read at `off`: where, in the object built to
/// log; the helper's error, as before, in the other.
#[inline(always)]
pub fn unreadable(why: Why, off: u32, e: i64) -> i64 {
    if cfg!(feature = "log") {
        skip(why, off)
    } else {
        e
    }
}

/// Logs why the program gave up, in the object built to log.
#[inline(always)]
pub fn skipped(result: Result<(), i64>) {
    #[cfg(feature = "log")]
    log::skipped(result);
    #[cfg(not(feature = "log"))]
    let _ = result;
}

#[cfg(feature = "log")]
mod log {
    use super::Why;
    use aya_log_ebpf::macro_support::Level;

    /// Set by user space before loading: the most detailed `Level` logged, 0
    /// for none.
    #[unsafe(no_mangle)]
    static LOG_LEVEL: u8 = 0;

    /// Logs why the program gave up, if it did and logging was asked for.
    #[inline(always)]
    pub fn skipped(result: Result<(), i64>) {
        // SAFETY: a global user space patches before load (see `maps::offsets`).
        let level = unsafe { core::ptr::read_volatile(&LOG_LEVEL) };
        if let Err(e) = result {
            if level != 0 {
                log_skip(e, level);
            }
        }
    }

    /// A function of its own, so that its stack and registers are not the
    /// program's.
    #[inline(never)]
    fn log_skip(e: i64, level: u8) {
        let trace = Level::Trace as u8 <= level;
        let detail = (e >> 8) as u32;
        if e <= 0 {
            aya_log_ebpf::debug!(&(), "skipped: a helper failed ({})", e);
            return;
        }
        match e as u8 {
            w if w == Why::NotIp as u8 && trace => {
                aya_log_ebpf::trace!(&(), "not DNS: ethertype {:x}", detail)
            }
            w if w == Why::NotUdpTcp as u8 && trace => {
                aya_log_ebpf::trace!(&(), "not DNS: IP protocol {}", detail)
            }
            w if w == Why::NotDnsPort as u8 && trace => aya_log_ebpf::trace!(
                &(),
                "not DNS: ports {} -> {}",
                detail >> 16,
                detail & 0xffff
            ),
            w if w == Why::UnknownFragment as u8 && trace => aya_log_ebpf::trace!(
                &(),
                "not DNS: later IP fragment, id {}, of no DNS datagram seen",
                detail
            ),
            w if w == Why::BadIpv4 as u8 => {
                aya_log_ebpf::debug!(&(), "skipped: bad IPv4 version/length {:x}", detail)
            }
            w if w == Why::TooManyExtensions as u8 => {
                aya_log_ebpf::debug!(&(), "skipped: too many IPv6 extension headers")
            }
            w if w == Why::Unreadable as u8 => aya_log_ebpf::debug!(
                &(),
                "skipped: packet bytes at {} past the IP header unreadable",
                detail
            ),
            w if w == Why::FieldUnreadable as u8 => aya_log_ebpf::debug!(
                &(),
                "skipped: kernel struct field at +{} unreadable",
                detail
            ),
            w if w == Why::NoSkb as u8 => {
                aya_log_ebpf::debug!(&(), "skipped: no skb, or kernel offsets unset")
            }
            w if w == Why::TooLong as u8 => aya_log_ebpf::debug!(
                &(),
                "skipped: IP header {} bytes before the end of the linear data",
                detail
            ),
            w if w == Why::NoScratch as u8 => {
                aya_log_ebpf::debug!(&(), "skipped: no scratch event")
            }
            w if w == Why::NotTarget as u8 => {
                aya_log_ebpf::debug!(&(), "skipped: not the traced target (netns {})", detail)
            }
            w if w == Why::OtherNode as u8 => {
                aya_log_ebpf::debug!(&(), "skipped: another node's (netns {})", detail)
            }
            w if w == Why::Sampled as u8 => aya_log_ebpf::debug!(&(), "skipped: sampled out"),
            w if w == Why::NotDnsHeader as u8 && trace => {
                aya_log_ebpf::trace!(&(), "not DNS: a UDP length of {}", detail)
            }
            w if w == Why::Lapped as u8 && trace => {
                aya_log_ebpf::trace!(&(), "skipped: a lap of a query going round")
            }
            w if w == Why::RingFull as u8 => {
                aya_log_ebpf::warn!(&(), "lost: ring buffer full, an event of {} bytes", detail)
            }
            _ => {}
        }
    }
}
