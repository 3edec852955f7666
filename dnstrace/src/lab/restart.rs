//! `lab restart coredns`: what a rollout of CoreDNS's Deployment does (or a
//! crash and the kubelet's restart): each pod's resolver stops and starts
//! again, with an empty cache and a new loop probe. Plain data, so the order
//! is tested without root.
use super::plan::{self, Pod};

/// What can be restarted.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The CoreDNS pods' resolvers, one pod after the other.
    Coredns,
}

/// One step of a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Its container: the resolver and whatever it started.
    Stop(&'static Pod),
    Start(&'static Pod),
    /// Until its port 53 is open: a pod is Ready only then.
    WaitListening(&'static Pod),
    /// The loop plugin's probe, which CoreDNS sends at each start.
    Probe(&'static Pod),
}

/// A rolling update's order (CoreDNS's Deployment: maxUnavailable 1): each
/// pod is back before the next stops, so one always serves.
pub fn plan(target: Target) -> Vec<Step> {
    match target {
        Target::Coredns => plan::coredns_pods()
            .flat_map(|pod| {
                [
                    Step::Stop(pod),
                    Step::Start(pod),
                    Step::WaitListening(pod),
                    Step::Probe(pod),
                ]
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coredns_pods_restart_one_after_the_other_and_probe_once_back() {
        let [a, b] = [&plan::PODS[2], &plan::PODS[3]];
        assert_eq!(
            plan(Target::Coredns),
            [
                Step::Stop(a),
                Step::Start(a),
                Step::WaitListening(a),
                Step::Probe(a),
                Step::Stop(b),
                Step::Start(b),
                Step::WaitListening(b),
                Step::Probe(b),
            ]
        );
    }

    #[test]
    fn one_coredns_pod_serves_at_every_step() {
        let mut down: Vec<&str> = Vec::new();
        for step in plan(Target::Coredns) {
            match step {
                Step::Stop(p) => down.push(p.name),
                Step::Start(p) => down.retain(|n| *n != p.name),
                Step::WaitListening(_) | Step::Probe(_) => {}
            }
            assert!(down.len() < plan::coredns_pods().count(), "{down:?}");
        }
        assert!(down.is_empty());
    }
}
