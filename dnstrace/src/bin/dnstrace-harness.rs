//! dnstrace with the layers' test and bench switches (see `harness`).
fn main() -> std::process::ExitCode {
    dnstrace::harness_main()
}
