//! Tracing one target (a pod) on a busy node: the kernel keeps only what
//! belongs to its journeys, so user space is not flooded with the rest.

/// Set by user space before loading; `enabled == 0` keeps everything.
/// The target's network namespace is in the TARGET_NETNS map, which
/// changes when the target's pod is re-created.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TargetFilter {
    pub enabled: u32,
}

impl TargetFilter {
    pub const OFF: Self = Self { enabled: 0 };
    pub const ON: Self = Self { enabled: 1 };
}

/// Roles of watched addresses (bits of the WATCHED map's values).
/// The target's own address: its queries and answers, before and after NAT.
pub const ROLE_TARGET: u8 = 1;
/// A resolver the target's queries reach (CoreDNS): its own queries to
/// upstream servers and their answers are kept, its answers to others not.
pub const ROLE_RESOLVER: u8 = 2;

/// Addresses watched at most.
pub const MAX_WATCHED: u32 = 256;

/// Client addresses a cluster view follows whole at most (`VIEWED`):
/// every viewer's pods on this node, together.
pub const MAX_VIEWED: u32 = 64;
/// Labels of viewed lookups remembered at most (`VIEWED_LABELS`).
pub const MAX_VIEWED_LABELS: u32 = 4096;
/// How long after a viewed lookup's packet its label keeps the packets of
/// other addresses: a resolver's queries upstream for it carry the
/// resolver's address, and its retries and upstream's timeout fit in this.
pub const VIEWED_LABEL_NS: u64 = 10_000_000_000;
