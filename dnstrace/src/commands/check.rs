//! `dnstrace check`: whether dnstrace can trace on this node.
use std::path::Path;

use anyhow::Result;

use crate::{
    naming::Services,
    pods::{cri_sockets, first_answer, CriAnswer},
    probes::{BpfLog, KernelScope, Load, ProbeOptions, Probes},
};

/// `dnstrace check`: loads every program, so the kernel's verifier checks
/// each, attaches what this kernel allows, says so and detaches; then
/// says what the service proxy's rules and the CRI socket (`cri_socket`,
/// or the runtimes' defaults) give. With `debug_bpf`, the programs built
/// to log, at their most detailed.
pub async fn check(ifaces: Vec<String>, debug_bpf: bool, cri_socket: Option<&Path>) -> Result<()> {
    // With the agent's counting and the node's scope on, their code is
    // verified too (off, the verifier prunes it as dead).
    let options = ProbeOptions {
        ifaces,
        debug_bpf: debug_bpf.then_some(BpfLog::Trace),
        count_lookups: true,
        ..ProbeOptions::default()
    };
    let scope = KernelScope::default();
    let probes = Probes::attach(&options, None, Some(&scope), Load::All)?;
    announce(&probes);
    let (on, off) = (probes.attachments.len(), probes.off.len());
    drop(probes);
    log::info!("check: {on} attached, {off} off; all detached again");
    log::info!("check: {}", Services::read(None).describe());
    log::info!(
        "check: pods' labels and workload: {}",
        cri(cri_socket).await
    );
    Ok(())
}

/// What the first CRI socket that answers says, as `pods` and `trace` ask.
async fn cri(given: Option<&Path>) -> CriAnswer {
    first_answer(&cri_sockets(given)).await.1
}

/// Says what is attached (and what verifying it cost: the verifier's work
/// is most of start-up), and what is off and why.
pub(super) fn announce(probes: &Probes) {
    for a in &probes.attachments {
        let verified = probes
            .verified(a.program)
            .map(|n| format!(", {n} instructions verified"))
            .unwrap_or_default();
        log::info!(
            "{} (prog id {}{verified}) attached to {} ({})",
            a.program,
            a.prog_id,
            a.target,
            a.how
        );
    }
    for why in &probes.off {
        log::info!("off: {why}");
    }
}
