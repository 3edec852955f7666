#![no_main]
//! See `dnstrace::fuzz::dns`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| dnstrace::fuzz::dns(data));
