//! The workload a pod belongs to. The CRI API carries no owner references
//! (those are the API server's), so it is read the way the controllers
//! name what they create: from the labels they stamp on their pods and
//! from the pod's name.
//! - Deployment: its ReplicaSet `<deployment>-<hash>` stamps
//!   `pod-template-hash=<hash>` and names pods `<deployment>-<hash>-<xxxxx>`.
//! - DaemonSet: stamps `controller-revision-hash` and
//!   `pod-template-generation`, and names pods `<daemonset>-<xxxxx>`.
//! - StatefulSet: stamps `statefulset.kubernetes.io/pod-name` (the pod's
//!   own name) and names pods `<statefulset>-<ordinal>`.
//! - Job: stamps `batch.kubernetes.io/job-name` (before 1.27: `job-name`).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

const POD_TEMPLATE_HASH: &str = "pod-template-hash";
const CONTROLLER_REVISION_HASH: &str = "controller-revision-hash";
const POD_TEMPLATE_GENERATION: &str = "pod-template-generation";
const STATEFULSET_POD_NAME: &str = "statefulset.kubernetes.io/pod-name";
const JOB_NAMES: [&str; 2] = ["batch.kubernetes.io/job-name", "job-name"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkloadKind {
    Deployment,
    DaemonSet,
    StatefulSet,
    Job,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deployment => "Deployment",
            Self::DaemonSet => "DaemonSet",
            Self::StatefulSet => "StatefulSet",
            Self::Job => "Job",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    pub kind: WorkloadKind,
    pub name: String,
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}/{}", self.kind, self.name)
    }
}

impl Workload {
    /// The workload of the pod `pod` with `labels`; None for a bare pod, a
    /// static one, or a name that does not follow its controller's pattern.
    pub fn of(pod: &str, labels: &BTreeMap<String, String>) -> Option<Self> {
        let label = |key: &str| labels.get(key).map(String::as_str);
        let (kind, name) = if label(STATEFULSET_POD_NAME) == Some(pod) {
            (WorkloadKind::StatefulSet, statefulset_name(pod)?)
        } else if label(CONTROLLER_REVISION_HASH).is_some()
            && label(POD_TEMPLATE_GENERATION).is_some()
        {
            (WorkloadKind::DaemonSet, without_last_part(pod)?)
        } else if let Some(hash) = label(POD_TEMPLATE_HASH) {
            (WorkloadKind::Deployment, deployment_name(pod, hash)?)
        } else {
            let job = JOB_NAMES.iter().find_map(|key| label(key))?;
            (WorkloadKind::Job, job)
        };
        Some(Self {
            kind,
            name: name.to_owned(),
        })
    }
}

/// `<deployment>-<hash>-<xxxxx>` → `<deployment>`.
fn deployment_name<'a>(pod: &'a str, hash: &str) -> Option<&'a str> {
    let replica_set = without_last_part(pod)?;
    replica_set
        .strip_suffix(hash)?
        .strip_suffix('-')
        .filter(|name| !name.is_empty())
}

/// `<statefulset>-<ordinal>` → `<statefulset>`.
fn statefulset_name(pod: &str) -> Option<&str> {
    let (name, ordinal) = pod.rsplit_once('-')?;
    let numeric = !ordinal.is_empty() && ordinal.bytes().all(|b| b.is_ascii_digit());
    (numeric && !name.is_empty()).then_some(name)
}

/// `a-b-c` → `a-b`.
fn without_last_part(pod: &str) -> Option<&str> {
    let (rest, _) = pod.rsplit_once('-')?;
    (!rest.is_empty()).then_some(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn of(pod: &str, pairs: &[(&str, &str)]) -> Option<String> {
        Workload::of(pod, &labels(pairs)).map(|w| w.to_string())
    }

    #[test]
    fn a_deployment_is_its_replica_set_name_without_the_hash() {
        let hash = [("pod-template-hash", "7d9f8c6b5"), ("app", "web")];
        assert_eq!(
            of("web-7d9f8c6b5-x2x4k", &hash).as_deref(),
            Some("Deployment/web")
        );
        let hash = [("pod-template-hash", "5f6d7c9b8")];
        assert_eq!(
            of("shop-checkout-5f6d7c9b8-q7w2e", &hash).as_deref(),
            Some("Deployment/shop-checkout")
        );
        // A name not made by a ReplicaSet of that hash says nothing.
        assert_eq!(of("web-x2x4k", &hash), None);
        assert_eq!(of("5f6d7c9b8-q7w2e", &hash), None);
    }

    #[test]
    fn a_daemon_set_has_a_revision_and_a_generation() {
        let ds = [
            ("controller-revision-hash", "6b8d4f7c9"),
            ("pod-template-generation", "1"),
            ("k8s-app", "fluent-bit"),
        ];
        assert_eq!(
            of("fluent-bit-5lq8z", &ds).as_deref(),
            Some("DaemonSet/fluent-bit")
        );
    }

    #[test]
    fn a_stateful_set_names_its_pods_by_ordinal() {
        let sts = [
            ("controller-revision-hash", "redis-6d5f8b7c4"),
            ("statefulset.kubernetes.io/pod-name", "redis-0"),
        ];
        assert_eq!(of("redis-0", &sts).as_deref(), Some("StatefulSet/redis"));
        // The label names another pod: not this pod's set.
        assert_eq!(of("redis-1", &sts), None);
        let sts = [("statefulset.kubernetes.io/pod-name", "redis-x")];
        assert_eq!(of("redis-x", &sts), None);
    }

    #[test]
    fn a_job_is_named_by_its_label_and_a_bare_pod_has_none() {
        assert_eq!(
            of("backup-28391-abcde", &[("job-name", "backup-28391")]).as_deref(),
            Some("Job/backup-28391")
        );
        assert_eq!(
            of(
                "backup-28391-abcde",
                &[("batch.kubernetes.io/job-name", "backup-28391")]
            )
            .as_deref(),
            Some("Job/backup-28391")
        );
        assert_eq!(of("debug", &[("run", "debug")]), None);
    }
}
