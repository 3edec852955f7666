//! What the tc programs are told of the interfaces named with --iface.

/// `TC_L2_LEN` when those interfaces differ in link-layer header length: the
/// programs then look each packet's interface up before parsing it.
pub const L2_LEN_MIXED: u32 = u32::MAX;
