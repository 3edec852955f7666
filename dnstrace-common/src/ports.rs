//! The set of ports the programs treat as DNS: a bitmap over all 65536 ports,
//! so the per-packet test is one array lookup whatever the number of ports.

/// Number of `u32` words in the port bitmap.
pub const PORT_WORDS: u32 = 65536 / 32;

/// The bitmap word index and bit mask of `port`.
#[inline(always)]
pub const fn port_slot(port: u16) -> (u32, u32) {
    ((port as u32) >> 5, 1u32 << (port as u32 & 31))
}
