//! Recordings: pcapng files that Wireshark opens as they are, with dnstrace's
//! own records in custom blocks, read back along with plain pcap captures.
// Wired into capture and replay in the next step.
#![cfg_attr(not(test), allow(dead_code))]
pub mod frame;
pub mod pcapng;

#[cfg(test)]
mod tests;
