//! Kernel-side programs of dnstrace.
#![no_std]
#![no_main]

mod packet;

use aya_ebpf::{macros::classifier, programs::TcContext};
use dnstrace_common::Hook;

/// Let every packet continue: dnstrace only watches.
const TC_ACT_UNSPEC: i32 = -1;

#[classifier]
pub fn dns_tc_ingress(ctx: TcContext) -> i32 {
    let _ = packet::try_capture(&ctx, Hook::TcIngress);
    TC_ACT_UNSPEC
}

#[classifier]
pub fn dns_tc_egress(ctx: TcContext) -> i32 {
    let _ = packet::try_capture(&ctx, Hook::TcEgress);
    TC_ACT_UNSPEC
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
