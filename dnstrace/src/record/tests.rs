//! Helpers shared by the recording tests.
use bytes::Bytes;
use dnstrace_common::Hook;

use crate::decode::{Packet, Transport};

/// xorshift64: reproducible noise without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

pub fn packet(src: &str, dst: &str, transport: Transport, payload: &[u8]) -> Packet {
    Packet {
        ts_ns: 1,
        netns: 4026531840,
        ifindex: 2,
        hook: Hook::TcEgress,
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        transport,
        wire_len: 0,
        payload_len: payload.len() as u32,
        truncated: false,
        fragment: false,
        payload: Bytes::copy_from_slice(payload),
        ifname: None,
        ct: None,
        drop: None,
    }
}
