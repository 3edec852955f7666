//! What the tc programs are told of the interfaces named with --iface.

/// `TC_L2_LEN` when those interfaces differ in link-layer header length: the
/// programs then look each packet's interface up before parsing it.
pub const L2_LEN_MIXED: u32 = u32::MAX;

/// Per-interface facts only user space knows, in the `IFACES` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IfaceConfig {
    /// Inode of the network namespace the interface lives in.
    pub netns: u32,
    /// Bytes of link-layer header before the IP header (14, or 0 on L3 devices).
    pub l2_len: u32,
}
