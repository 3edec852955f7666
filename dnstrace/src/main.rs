//! dnstrace: follow DNS on a Linux or Kubernetes node with eBPF.
fn main() -> std::process::ExitCode {
    dnstrace::main()
}
