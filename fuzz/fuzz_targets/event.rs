#![no_main]
//! See `dnstrace::fuzz::event`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| dnstrace::fuzz::event(data));
