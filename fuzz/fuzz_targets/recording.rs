#![no_main]
//! See `dnstrace::fuzz::recording`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| dnstrace::fuzz::recording(data));
