//! The lab's socket-level service balancer, as a kube-proxy replacement's
//! (Cilium's bpf_sock.c): a socket addressed to a service is given a
//! backend's address before anything reaches the wire, and its replies and
//! peer name the service's back. It acts only on sockets of the lab's
//! network namespaces: attached at the root cgroup, it sees the machine's.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{
        bpf_get_prandom_u32,
        generated::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    },
    macros::{cgroup_sock_addr, map},
    maps::{HashMap, LruHashMap},
    programs::SockAddrContext,
    EbpfContext,
};
use dnstrace_common::socketlb::{Backends, RevKey, SockAddr4};

/// What a `cgroup/*4` program returns to let the call go on.
const PROCEED: i32 = 1;

/// Cookies of the lab's network namespaces: the only ones acted on.
#[map]
static LAB_NETNS: HashMap<u64, u8> = HashMap::with_max_entries(64, 0);

/// Service address → its backends, filled by the lab.
#[map]
static SERVICES: HashMap<SockAddr4, Backends> = HashMap::with_max_entries(16, 0);

/// (socket, backend) → the service it was picked for.
#[map]
static REV_NAT: LruHashMap<RevKey, SockAddr4> = LruHashMap::with_max_entries(65_536, 0);

/// Why a socket was left as it is.
enum Skip {
    OtherNetns,
    NotService,
    NoBackend,
    Full,
}

/// connect(): connected UDP and TCP sockets.
#[cgroup_sock_addr(connect4)]
pub fn lb_connect4(ctx: SockAddrContext) -> i32 {
    let _ = try_forward(&ctx);
    PROCEED
}

/// sendmsg() with an address: unconnected UDP, a pick per message.
#[cgroup_sock_addr(sendmsg4)]
pub fn lb_sendmsg4(ctx: SockAddrContext) -> i32 {
    let _ = try_forward(&ctx);
    PROCEED
}

/// recvmsg(): the reply's source, as the client addressed it.
#[cgroup_sock_addr(recvmsg4)]
pub fn lb_recvmsg4(ctx: SockAddrContext) -> i32 {
    let _ = try_reverse(&ctx);
    PROCEED
}

/// getpeername(): the service, not the backend.
#[cgroup_sock_addr(getpeername4)]
pub fn lb_getpeername4(ctx: SockAddrContext) -> i32 {
    let _ = try_reverse(&ctx);
    PROCEED
}

fn in_lab(ctx: &SockAddrContext) -> Result<(), Skip> {
    // SAFETY: the helper takes the program's own context.
    let cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    // SAFETY: a plain value is read.
    match unsafe { LAB_NETNS.get(cookie) } {
        Some(_) => Ok(()),
        None => Err(Skip::OtherNetns),
    }
}

/// Gives a socket addressed to a service one of its backends.
fn try_forward(ctx: &SockAddrContext) -> Result<(), Skip> {
    in_lab(ctx)?;
    // SAFETY: the kernel's context, valid for the program's run.
    let sa = unsafe { &mut *ctx.sock_addr };
    let service = SockAddr4 {
        ip: sa.user_ip4,
        port: sa.user_port,
    };
    // SAFETY: a plain value is read.
    let backends = unsafe { SERVICES.get(service) }.ok_or(Skip::NotService)?;
    let count = backends.count as usize;
    if count == 0 {
        return Err(Skip::NoBackend);
    }
    // SAFETY: no arguments.
    let pick = unsafe { bpf_get_prandom_u32() } as usize % count;
    // Bounded by the array, not by `count`: the verifier does not follow a
    // remainder, so the check must stay in the code.
    let ip = *backends.ips.get(pick).ok_or(Skip::NoBackend)?;
    let key = RevKey {
        // SAFETY: the helper takes the program's own context.
        cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        backend: SockAddr4 {
            ip,
            port: service.port,
        },
    };
    REV_NAT.insert(key, service, 0).map_err(|_| Skip::Full)?;
    sa.user_ip4 = ip;
    Ok(())
}

/// Gives back the service's address where a backend's would show.
fn try_reverse(ctx: &SockAddrContext) -> Result<(), Skip> {
    in_lab(ctx)?;
    // SAFETY: the kernel's context, valid for the program's run.
    let sa = unsafe { &mut *ctx.sock_addr };
    let key = RevKey {
        // SAFETY: the helper takes the program's own context.
        cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        backend: SockAddr4 {
            ip: sa.user_ip4,
            port: sa.user_port,
        },
    };
    // SAFETY: a plain value is read.
    let service = unsafe { REV_NAT.get(key) }.ok_or(Skip::NotService)?;
    sa.user_ip4 = service.ip;
    sa.user_port = service.port;
    Ok(())
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
