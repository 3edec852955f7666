//! The lab's socket-level balancer (`lab up --proxy-mode socket-lb`): its
//! maps' keys and values, as the cgroup programs and the lab share them.
//! Addresses and ports are in network order, as `bpf_sock_addr` holds them.

/// Backends one service can have.
pub const MAX_BACKENDS: usize = 4;

/// An IPv4 socket address: `user_ip4` and `user_port` of `bpf_sock_addr`
/// (the port's two bytes first, the rest zero).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockAddr4 {
    pub ip: u32,
    pub port: u32,
}

impl SockAddr4 {
    /// From host-order octets and port.
    pub const fn new(octets: [u8; 4], port: u16) -> Self {
        Self {
            ip: u32::from_ne_bytes(octets),
            port: port.to_be() as u32,
        }
    }
}

/// A service's backends, on the service's port; `count` 0 leaves sockets
/// addressed to the service as they are.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backends {
    pub count: u32,
    pub ips: [u32; MAX_BACKENDS],
}

/// Which service a socket's backend stands for: replies and the peer's
/// name are given the service's address back.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RevKey {
    pub cookie: u64,
    pub backend: SockAddr4,
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain `#[repr(C)]` u32 fields.
    unsafe impl aya::Pod for super::SockAddr4 {}
    // SAFETY: plain `#[repr(C)]` u32 fields.
    unsafe impl aya::Pod for super::Backends {}
    // SAFETY: `#[repr(C)]`: a u64 then two u32, no padding.
    unsafe impl aya::Pod for super::RevKey {}
}
