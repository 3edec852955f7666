//! One node of several that share a kernel (kind, the lab): the programs
//! keep only packets in that node's network namespaces, as they would on
//! the node's own kernel.

/// Network namespaces in a node's scope at most: its own and its pods'.
pub const MAX_SCOPE: u32 = 4096;
