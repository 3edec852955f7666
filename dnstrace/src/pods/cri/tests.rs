use std::collections::HashMap;

use k8s_cri::v1::{PodIp, PodSandboxMetadata, PodSandboxNetworkStatus, PodSandboxStatus};

use super::*;
use crate::pods::{testdir::TestDir, workload::WorkloadKind, CriAnswer, Inventory, RuntimeDirs};

/// containerd 1.6.20's verbose `info` of a sandbox it ran through CRI (the
/// lab's private containerd, `dnstrace-harness cri-lab`).
const CONTAINERD_INFO: &str = include_str!("../fixtures/containerd-status-info.json");
const ID: &str = "7e6afb7896325ade4e13af813ddeeb82b7f86ecbba3a3a381d45d6c5f568e5e4";

fn answer(info: Option<&str>) -> PodSandboxStatusResponse {
    let labels = [("app", "web"), ("pod-template-hash", "7d9f8c6b5")];
    PodSandboxStatusResponse {
        status: Some(PodSandboxStatus {
            id: ID.into(),
            metadata: Some(PodSandboxMetadata {
                name: "web-7d9f8c6b5-x2x4k".into(),
                uid: "0b7e3f52-6a1d-4c8e-9f2b-5d4a3c2b1e0f".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            network: Some(PodSandboxNetworkStatus {
                ip: "10.245.0.2".into(),
                additional_ips: vec![PodIp {
                    ip: "fd00::2".into(),
                }],
            }),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..PodSandboxStatus::default()
        }),
        info: info
            .map(|text| HashMap::from([("info".to_owned(), text.to_owned())]))
            .unwrap_or_default(),
        ..PodSandboxStatusResponse::default()
    }
}

#[test]
fn a_containerd_status_gives_the_pod_its_namespace_process_resolver_and_workload() {
    let (pod, meta) = pod_of(Runtime::Containerd, ID, answer(Some(CONTAINERD_INFO))).unwrap();
    assert_eq!(pod.full_name(), "default/web-7d9f8c6b5-x2x4k");
    assert_eq!(pod.uid, "0b7e3f52-6a1d-4c8e-9f2b-5d4a3c2b1e0f");
    assert_eq!(pod.sandbox_id, ID);
    assert_eq!(
        pod.netns.as_deref(),
        Some(Path::new(
            "/var/run/netns/cni-41cd59f3-e2df-3bf7-23e3-385002cec04b"
        ))
    );
    assert_eq!(pod.pid, Some(10559));
    assert_eq!(
        pod.resolv_conf,
        Some(PathBuf::from(format!(
            "/tmp/cri-cap/root/io.containerd.grpc.v1.cri/sandboxes/{ID}/resolv.conf"
        )))
    );
    let workload = meta.workload.unwrap();
    assert_eq!(
        (workload.kind, workload.name.as_str()),
        (WorkloadKind::Deployment, "web")
    );
    assert_eq!(meta.labels["app"], "web");
    assert_eq!(
        meta.ips,
        [
            "10.245.0.2".parse::<std::net::IpAddr>().unwrap(),
            "fd00::2".parse().unwrap()
        ]
    );
}

#[test]
fn a_status_without_verbose_info_is_a_pod_without_namespace_or_process() {
    let (pod, _) = pod_of(Runtime::Crio, ID, answer(None)).unwrap();
    assert_eq!((pod.netns, pod.pid, pod.resolv_conf), (None, None, None));
    let broken = pod_of(Runtime::Containerd, ID, answer(Some("{")));
    assert!(broken.is_err());
}

#[test]
fn the_cri_s_pods_replace_the_state_s_of_the_same_sandbox_and_keep_the_rest() {
    let state = |id: &str, name: &str| Pod {
        runtime: Runtime::Containerd,
        sandbox_id: id.into(),
        namespace: "default".into(),
        name: name.into(),
        uid: "u".into(),
        netns: Some("/var/run/netns/from-state".into()),
        pid: Some(std::process::id()),
        resolv_conf: Some("/state/resolv.conf".into()),
    };
    let mut inv = Inventory {
        pods: vec![state(ID, "web-7d9f8c6b5-x2x4k"), state("other", "crio-pod")],
        ..Inventory::default()
    };
    let (from_cri, meta) = pod_of(Runtime::Containerd, ID, answer(None)).unwrap();
    inv.merge(vec![(from_cri, meta)]);
    let inv = inv.finish();
    assert_eq!(inv.pods.len(), 2);
    let web = inv.pods.iter().find(|p| p.sandbox_id == ID).unwrap();
    assert_eq!(
        web.netns.as_deref(),
        Some(Path::new("/var/run/netns/from-state"))
    );
    assert_eq!(
        web.resolv_conf.as_deref(),
        Some(Path::new("/state/resolv.conf"))
    );
    assert!(inv.metadata(web).is_some_and(|m| m.workload.is_some()));
    let other = inv.pods.iter().find(|p| p.sandbox_id == "other").unwrap();
    assert!(inv.metadata(other).is_none());
}

#[tokio::test]
async fn a_socket_that_does_not_answer_is_said_and_the_state_remains_the_source() {
    let root = TestDir::new();
    let socket = root.write("dead.sock", "");
    let dirs = RuntimeDirs {
        containerd: root.path().join("containerd"),
        crio: root.path().join("crio"),
    };
    let (inv, answer) = crate::pods::discover_with_cri(&dirs, &[socket]).await;
    assert!(inv.pods.is_empty());
    let CriAnswer::Unanswered(errors) = &answer else {
        panic!("{answer:?}");
    };
    assert_eq!(errors.len(), 1);
    let said = crate::pods::searched(&dirs, &answer);
    let containerd = format!(
        "containerd state {}: no k8s.io tasks (it is not there)",
        dirs.containerd.display()
    );
    assert!(said.contains(&containerd), "{said}");
    assert!(said.contains("dead.sock"), "{said}");
}
