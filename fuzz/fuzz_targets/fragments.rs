#![no_main]
//! See `dnstrace::fuzz::fragments`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| dnstrace::fuzz::fragments(data));
