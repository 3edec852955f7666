#![no_main]
//! See `dnstrace::fuzz::tcp_stream`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| dnstrace::fuzz::tcp_stream(data));
