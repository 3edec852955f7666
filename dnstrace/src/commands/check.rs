//! `dnstrace check`: whether dnstrace can trace on this node.
use anyhow::Result;

use crate::{
    naming::Services,
    probes::{Load, ProbeOptions, Probes},
};

/// `dnstrace check`: loads every program, so the kernel's verifier checks
/// each, attaches what this kernel allows, says so and detaches.
pub fn check(ifaces: Vec<String>) -> Result<()> {
    let options = ProbeOptions {
        ifaces,
        ..ProbeOptions::default()
    };
    let probes = Probes::attach(&options, None, Load::All)?;
    announce(&probes);
    let (on, off) = (probes.attachments.len(), probes.off.len());
    drop(probes);
    log::info!("check: {on} attached, {off} off; all detached again");
    log::info!("check: {}", Services::read(None).describe());
    Ok(())
}

/// Says what is attached, and what is off and why.
pub(super) fn announce(probes: &Probes) {
    for a in &probes.attachments {
        log::info!(
            "{} (prog id {}) attached to {} ({})",
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
