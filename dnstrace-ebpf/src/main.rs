//! Kernel-side programs of dnstrace. Each is a thin entry point over a
//! `try_*` function; they only watch, never change a packet's fate.
#![no_std]
#![no_main]

mod maps;
mod parse;
mod skb;
mod tc;

use aya_ebpf::{
    macros::{btf_tracepoint, classifier},
    programs::{BtfTracePointContext, TcContext},
};
use dnstrace_common::Hook;

/// Let every packet continue.
const TC_ACT_UNSPEC: i32 = -1;

#[classifier]
pub fn dns_tc_ingress(ctx: TcContext) -> i32 {
    let _ = tc::try_capture(&ctx, Hook::TcIngress);
    TC_ACT_UNSPEC
}

#[classifier]
pub fn dns_tc_egress(ctx: TcContext) -> i32 {
    let _ = tc::try_capture(&ctx, Hook::TcEgress);
    TC_ACT_UNSPEC
}

/// `net_dev_start_xmit(skb, dev)`: every device, every network namespace.
#[btf_tracepoint(function = "net_dev_start_xmit")]
pub fn dns_dev_xmit(ctx: BtfTracePointContext) -> i32 {
    let _ = skb::try_capture(ctx.arg(0), ctx.arg(1), Hook::DevXmit, skb::Drop::NONE);
    0
}

/// `netif_receive_skb(skb)`.
#[btf_tracepoint(function = "netif_receive_skb")]
pub fn dns_dev_receive(ctx: BtfTracePointContext) -> i32 {
    let _ = skb::try_capture(
        ctx.arg(0),
        core::ptr::null(),
        Hook::DevReceive,
        skb::Drop::NONE,
    );
    0
}

/// `kfree_skb(skb, location, reason, ...)`: a dropped packet.
#[btf_tracepoint(function = "kfree_skb")]
pub fn dns_kfree_skb(ctx: BtfTracePointContext) -> i32 {
    let drop = skb::Drop {
        location: ctx.arg(1),
        reason: ctx.arg(2),
    };
    let _ = skb::try_capture(ctx.arg(0), core::ptr::null(), Hook::Drop, drop);
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
