//! dnstrace: follow DNS on a Linux or Kubernetes node with eBPF.

/// Journeys, legs and messages are many small allocations made and freed
/// per packet: jemalloc does that for less CPU than glibc's malloc (about a
/// sixth more events a second in `benches/pipeline.rs`), at the same peak.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    dnstrace::main()
}
