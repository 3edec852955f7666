//! Kernel-side programs of dnstrace. Each is a thin entry point over a
//! `try_*` function; they only watch, never change a packet's fate.
#![no_std]
#![no_main]
// The atomics of `atomic`: the target's spec has none in `core::sync`.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

mod atomic;
mod debug;
mod laps;
mod lookups;
mod maps;
mod packet;
mod parse;
mod skb;
mod sock;
mod tc;

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{btf_tracepoint, cgroup_skb, classifier, kprobe, kretprobe, map},
    maps::HashMap,
    programs::{BtfTracePointContext, ProbeContext, RetProbeContext, SkBuffContext, TcContext},
};
use dnstrace_common::Hook;
use skb::{Kernel, Typed, Untyped};

/// Let every packet continue.
const TC_ACT_UNSPEC: i32 = -1;

#[classifier]
pub fn dns_tc_ingress(ctx: TcContext) -> i32 {
    debug::skipped(tc::try_capture(&ctx, Hook::TcIngress));
    TC_ACT_UNSPEC
}

#[classifier]
pub fn dns_tc_egress(ctx: TcContext) -> i32 {
    debug::skipped(tc::try_capture(&ctx, Hook::TcEgress));
    TC_ACT_UNSPEC
}

/// `net_dev_start_xmit(skb, dev)`: every device, every network namespace.
#[btf_tracepoint(function = "net_dev_start_xmit")]
pub fn dns_dev_xmit(ctx: BtfTracePointContext) -> i32 {
    dev_xmit::<Typed>(&ctx)
}

/// `netif_receive_skb(skb)`.
#[btf_tracepoint(function = "netif_receive_skb")]
pub fn dns_dev_receive(ctx: BtfTracePointContext) -> i32 {
    dev_receive::<Typed>(&ctx)
}

/// `kfree_skb(skb, location, reason, ...)`: a dropped packet.
#[btf_tracepoint(function = "kfree_skb")]
pub fn dns_kfree_skb(ctx: BtfTracePointContext) -> i32 {
    kfree_skb::<Typed>(&ctx)
}

// The same three with probe reads, for a kernel whose verifier refuses the
// direct loads (or `--probe-reads`). Named `dns_<what>_read`: the kernel
// keeps 15 characters of a name.

#[btf_tracepoint(function = "net_dev_start_xmit")]
pub fn dns_xmit_read(ctx: BtfTracePointContext) -> i32 {
    dev_xmit::<Untyped>(&ctx)
}

#[btf_tracepoint(function = "netif_receive_skb")]
pub fn dns_recv_read(ctx: BtfTracePointContext) -> i32 {
    dev_receive::<Untyped>(&ctx)
}

#[btf_tracepoint(function = "kfree_skb")]
pub fn dns_kfree_read(ctx: BtfTracePointContext) -> i32 {
    kfree_skb::<Untyped>(&ctx)
}

#[inline(always)]
fn dev_xmit<K: Kernel>(ctx: &BtfTracePointContext) -> i32 {
    debug::skipped(skb::try_capture::<K, true>(
        ctx.arg(0),
        ctx.arg(1),
        Hook::DevXmit,
        skb::Drop::NONE,
    ));
    0
}

#[inline(always)]
fn dev_receive<K: Kernel>(ctx: &BtfTracePointContext) -> i32 {
    debug::skipped(skb::try_capture::<K, true>(
        ctx.arg(0),
        core::ptr::null(),
        Hook::DevReceive,
        skb::Drop::NONE,
    ));
    0
}

#[inline(always)]
fn kfree_skb<K: Kernel>(ctx: &BtfTracePointContext) -> i32 {
    let drop = skb::Drop {
        location: ctx.arg(1),
        reason: ctx.arg(2),
    };
    debug::skipped(skb::try_capture::<K, true>(
        ctx.arg(0),
        core::ptr::null(),
        Hook::Drop,
        drop,
    ));
    0
}

/// A packet a socket sends (cgroup v2's egress, attached at the root):
/// where the agent starts counting a lookup. It lets every packet through.
#[cgroup_skb]
pub fn dns_sock_egress(ctx: SkBuffContext) -> i32 {
    debug::skipped(sock::try_query(&ctx));
    1
}

/// A packet a socket is about to take (cgroup v2's ingress, attached at
/// the root): where the agent counts a lookup answered.
#[cgroup_skb]
pub fn dns_sock_ingress(ctx: SkBuffContext) -> i32 {
    debug::skipped(sock::try_answer(&ctx));
    1
}

// Conntrack and NAT, where the kernel has kprobes. Named <area>_<enter|exit>_<function>.

/// `nf_nat_manip_pkt(skb, ct, mtype, dir)`: the NAT rewrite itself.
#[kprobe]
pub fn nat_enter_nf_nat_manip_pkt(ctx: ProbeContext) -> u32 {
    if let Some(skb) = ctx.arg::<*const u8>(0) {
        debug::skipped(skb::try_capture::<Untyped, false>(
            skb,
            core::ptr::null(),
            Hook::NatRewrite,
            skb::Drop::NONE,
        ));
    }
    0
}

/// skbs in `__nf_conntrack_confirm`, by thread, for its return probe.
#[map]
static CONFIRMING: HashMap<u64, u64> = HashMap::with_max_entries(4096, 0);

#[kprobe]
pub fn ct_enter_nf_conntrack_confirm(ctx: ProbeContext) -> u32 {
    if let Some(skb) = ctx.arg::<u64>(0) {
        let _ = CONFIRMING.insert(bpf_get_current_pid_tgid(), skb, 0);
    }
    0
}

/// NF_DROP (0) from `__nf_conntrack_confirm`: the entry was not inserted.
#[kretprobe]
pub fn ct_exit_nf_conntrack_confirm(ctx: RetProbeContext) -> u32 {
    let key = bpf_get_current_pid_tgid();
    // SAFETY: map lookup; the value is copied out.
    let skb = unsafe { CONFIRMING.get(key) }.copied();
    let _ = CONFIRMING.remove(key);
    if let Some(skb) = skb {
        if ctx.ret::<u32>() == 0 {
            debug::skipped(skb::try_capture::<Untyped, false>(
                skb as *const u8,
                core::ptr::null(),
                Hook::CtInsertFailed,
                skb::Drop::NONE,
            ));
        }
    }
    0
}

/// `nf_ct_resolve_clash(skb, h, reply_hash)`: the parallel A/AAAA race.
#[kprobe]
pub fn ct_enter_nf_ct_resolve_clash(ctx: ProbeContext) -> u32 {
    if let Some(skb) = ctx.arg::<*const u8>(0) {
        debug::skipped(skb::try_capture::<Untyped, false>(
            skb,
            core::ptr::null(),
            Hook::CtClash,
            skb::Drop::NONE,
        ));
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
