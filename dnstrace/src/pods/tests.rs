use serde_json::Value;

use super::{testdir::TestDir, *};

const CONTAINERD_SANDBOX: &str = include_str!("fixtures/containerd-sandbox.json");
const CONTAINERD_CONTAINER: &str = include_str!("fixtures/containerd-container.json");
const CRIO_SANDBOX: &str = include_str!("fixtures/crio-sandbox.json");
const TASKS: &str = "containerd/io.containerd.runtime.v2.task/k8s.io";
const CONTAINERS: &str = "storage/overlay-containers";
/// Above pid_max's highest possible value: no process has it.
const DEAD_PID: u32 = 999_999_999;

fn dirs(root: &TestDir) -> RuntimeDirs {
    RuntimeDirs {
        containerd: root.path().join("containerd"),
        crio: root.path().join("storage"),
    }
}

fn our_pid() -> String {
    std::process::id().to_string()
}

/// A containerd task bundle `id` with `config` and, if given, `init.pid`.
fn bundle(root: &TestDir, id: &str, config: &str, pid: Option<&str>) {
    root.write(&format!("{TASKS}/{id}/config.json"), config);
    if let Some(pid) = pid {
        root.write(&format!("{TASKS}/{id}/init.pid"), pid);
    }
}

/// A CRI-O container `id` with `config` and, if given, its `pidfile`.
fn userdata(root: &TestDir, id: &str, config: &str, pid: Option<&str>) {
    root.write(&format!("{CONTAINERS}/{id}/userdata/config.json"), config);
    if let Some(pid) = pid {
        root.write(&format!("{CONTAINERS}/{id}/userdata/pidfile"), pid);
    }
}

/// A fixture with its annotations changed: a null value removes one.
fn edited(fixture: &str, annotations: Value) -> String {
    let mut spec: Value = serde_json::from_str(fixture).unwrap();
    for (key, value) in annotations.as_object().unwrap() {
        let map = spec["annotations"].as_object_mut().unwrap();
        match value {
            Value::Null => map.remove(key),
            v => map.insert(key.clone(), v.clone()),
        };
    }
    spec.to_string()
}

fn names(inv: &Inventory) -> Vec<String> {
    inv.pods.iter().map(Pod::full_name).collect()
}

#[test]
fn a_containerd_sandbox_is_a_pod_and_its_containers_are_not() {
    let root = TestDir::new();
    bundle(&root, "3f1d6c0b", CONTAINERD_SANDBOX, Some(&our_pid()));
    bundle(&root, "77aa", CONTAINERD_CONTAINER, Some(&our_pid()));
    let inv = discover(&dirs(&root));
    assert_eq!(inv.errors, Vec::<String>::new());
    assert_eq!(
        inv.pods,
        [Pod {
            runtime: Runtime::Containerd,
            sandbox_id: "3f1d6c0b".into(),
            namespace: "default".into(),
            name: "web-7d9f8c6b5-x2x4k".into(),
            uid: "0b7e3f52-6a1d-4c8e-9f2b-5d4a3c2b1e0f".into(),
            netns: Some("/var/run/netns/cni-6f1c2a9e-4b7d-8e3f-1a2b-3c4d5e6f7a8b".into()),
            pid: Some(std::process::id()),
            resolv_conf: Some("/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/3f1d6c0b8e2a4f5d9c7b6a5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c/resolv.conf".into()),
        }]
    );
}

#[test]
fn a_crio_sandbox_with_its_infra_process_is_a_pod() {
    let root = TestDir::new();
    userdata(&root, "9a8b7c6d", CRIO_SANDBOX, Some(&our_pid()));
    let inv = discover(&dirs(&root));
    assert_eq!(inv.errors, Vec::<String>::new());
    assert_eq!(
        inv.pods,
        [Pod {
            runtime: Runtime::Crio,
            sandbox_id: "9a8b7c6d".into(),
            namespace: "shop".into(),
            name: "checkout-5f6d7c9b8-q7w2e".into(),
            uid: "7c2d9e41-3b5a-4f6c-8d7e-1a2b3c4d5e6f".into(),
            netns: Some("/var/run/netns/2d9c4e1a-7b3f-4a8e-9c6d-5e4f3a2b1c0d".into()),
            pid: Some(std::process::id()),
            resolv_conf: Some("/run/containers/storage/overlay-containers/9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b/userdata/resolv.conf".into()),
        }]
    );
}

#[test]
fn a_crio_sandbox_without_infra_process_is_held_by_its_pinned_namespace() {
    let root = TestDir::new();
    let pinned = root.write("netns/2d9c4e1a", "");
    let mut spec: Value = serde_json::from_str(&edited(
        CRIO_SANDBOX,
        serde_json::json!({"io.kubernetes.cri-o.Spoofed": "true"}),
    ))
    .unwrap();
    spec["linux"]["namespaces"][1]["path"] = pinned.to_string_lossy().into();
    userdata(&root, "spoofed", &spec.to_string(), None);
    let inv = discover(&dirs(&root));
    assert_eq!(inv.errors, Vec::<String>::new());
    assert_eq!(inv.pods.len(), 1);
    assert_eq!(inv.pods[0].pid, None);
    assert_eq!(inv.pods[0].netns.as_deref(), Some(pinned.as_path()));
    assert_eq!(inv.pods[0].netns_path(), Some(pinned));

    // Stopped: the pin is gone, and so is the pod.
    std::fs::remove_file(root.path().join("netns/2d9c4e1a")).unwrap();
    assert!(discover(&dirs(&root)).pods.is_empty());
}

#[test]
fn crio_names_fall_back_to_its_own_annotations() {
    let root = TestDir::new();
    let spec = edited(
        CRIO_SANDBOX,
        serde_json::json!({"io.kubernetes.pod.name": null, "io.kubernetes.pod.namespace": null}),
    );
    userdata(&root, "9a8b", &spec, Some(&our_pid()));
    assert_eq!(
        names(&discover(&dirs(&root))),
        ["shop/checkout-5f6d7c9b8-q7w2e"]
    );
}

#[test]
fn crio_skips_what_is_not_its_pod_sandbox() {
    let root = TestDir::new();
    let container = edited(
        CRIO_SANDBOX,
        serde_json::json!({"io.kubernetes.cri-o.ContainerType": "container"}),
    );
    let podman = edited(
        CRIO_SANDBOX,
        serde_json::json!({"io.container.manager": "libpod"}),
    );
    userdata(&root, "container", &container, Some(&our_pid()));
    userdata(&root, "podman", &podman, Some(&our_pid()));
    // An image build's container: storage keeps a run directory, no spec.
    root.write(&format!("{CONTAINERS}/build/userdata/.keep"), "");
    root.write("storage/overlay-layers/layers.json", "[]");
    root.write("storage/overlay/ab/diff/etc/config.json", "junk");
    let inv = discover(&dirs(&root));
    assert_eq!(inv.errors, Vec::<String>::new());
    assert!(inv.pods.is_empty());
}

#[test]
fn a_damaged_spec_is_one_error_and_the_others_are_still_listed() {
    let root = TestDir::new();
    bundle(&root, "good", CONTAINERD_SANDBOX, Some(&our_pid()));
    bundle(&root, "cut", &CONTAINERD_SANDBOX[..300], Some(&our_pid()));
    bundle(&root, "empty", "", Some(&our_pid()));
    let inv = discover(&dirs(&root));
    assert_eq!(names(&inv), ["default/web-7d9f8c6b5-x2x4k"]);
    assert_eq!(inv.errors.len(), 2, "{:?}", inv.errors);
    for (e, id) in inv.errors.iter().zip(["cut", "empty"]) {
        assert!(e.starts_with(&format!("{}/{TASKS}/{id}: ", root.path().display())));
        assert!(e.contains("is not an OCI runtime spec"), "{e}");
    }
}

#[test]
fn missing_annotations_are_named() {
    let root = TestDir::new();
    let spec = edited(
        CONTAINERD_SANDBOX,
        serde_json::json!({"io.kubernetes.cri.sandbox-name": null, "io.kubernetes.cri.sandbox-uid": ""}),
    );
    bundle(&root, "nameless", &spec, Some(&our_pid()));
    let crio = edited(
        CRIO_SANDBOX,
        serde_json::json!({"io.kubernetes.pod.uid": null}),
    );
    userdata(&root, "uidless", &crio, Some(&our_pid()));
    let inv = discover(&dirs(&root));
    assert!(inv.pods.is_empty());
    assert_eq!(inv.errors.len(), 2);
    assert!(inv.errors[0].ends_with(
        "nameless: missing annotations io.kubernetes.cri.sandbox-name, io.kubernetes.cri.sandbox-uid"
    ));
    assert!(inv.errors[1].ends_with("uidless: missing annotation io.kubernetes.pod.uid"));
}

#[test]
fn a_missing_or_bad_pid_file_is_an_error() {
    let root = TestDir::new();
    bundle(&root, "nopid", CONTAINERD_SANDBOX, None);
    bundle(&root, "badpid", CONTAINERD_SANDBOX, Some("twelve"));
    bundle(&root, "zeropid", CONTAINERD_SANDBOX, Some("0\n"));
    userdata(&root, "crionopid", CRIO_SANDBOX, None);
    let inv = discover(&dirs(&root));
    assert!(inv.pods.is_empty());
    let errors = inv.errors.join("\n");
    assert_eq!(inv.errors.len(), 4, "{errors}");
    assert!(errors.contains("nopid: opening ") && errors.contains("nopid/init.pid"));
    assert!(errors.contains("badpid/init.pid holds no pid: \"twelve\""));
    assert!(errors.contains("zeropid/init.pid holds no pid: \"0\""));
    assert!(errors.contains("crionopid/userdata/pidfile"));
}

#[test]
fn a_stopped_sandbox_is_not_listed() {
    let root = TestDir::new();
    bundle(
        &root,
        "gone",
        CONTAINERD_SANDBOX,
        Some(&DEAD_PID.to_string()),
    );
    userdata(&root, "gone", CRIO_SANDBOX, Some(&DEAD_PID.to_string()));
    let inv = discover(&dirs(&root));
    assert!(inv.pods.is_empty());
    assert!(inv.errors.is_empty());
}

#[test]
fn a_too_large_spec_is_skipped_with_an_error() {
    let root = TestDir::new();
    let huge = " ".repeat(spec::MAX_SPEC_BYTES as usize + 1);
    bundle(&root, "huge", &huge, Some(&our_pid()));
    bundle(&root, "fits", CONTAINERD_SANDBOX, Some(&our_pid()));
    let inv = discover(&dirs(&root));
    assert_eq!(inv.pods.len(), 1);
    assert_eq!(inv.errors.len(), 1);
    assert!(
        inv.errors[0].contains("is larger than 4194304 bytes: skipped"),
        "{}",
        inv.errors[0]
    );
}

#[test]
fn a_missing_runtime_is_no_error_but_an_unreadable_one_is() {
    let root = TestDir::new();
    let inv = discover(&dirs(&root));
    assert!(inv.pods.is_empty() && inv.errors.is_empty());

    root.write("containerd", "a file, not a directory");
    root.write("storage", "");
    let inv = discover(&dirs(&root));
    assert_eq!(inv.errors.len(), 2, "{:?}", inv.errors);
    assert!(inv.errors[0].starts_with("containerd: reading "));
    assert!(inv.errors[1].starts_with("cri-o: reading "));
}

#[test]
fn pods_of_both_runtimes_are_sorted_by_namespace_and_name() {
    let root = TestDir::new();
    userdata(&root, "c1", CRIO_SANDBOX, Some(&our_pid()));
    bundle(&root, "d1", CONTAINERD_SANDBOX, Some(&our_pid()));
    let coredns = edited(
        CONTAINERD_SANDBOX,
        serde_json::json!({
            "io.kubernetes.cri.sandbox-name": "coredns-7db6d8ff4d-4xk9m",
            "io.kubernetes.cri.sandbox-namespace": "kube-system",
        }),
    );
    bundle(&root, "d2", &coredns, Some(&our_pid()));
    assert_eq!(
        names(&discover(&dirs(&root))),
        [
            "default/web-7d9f8c6b5-x2x4k",
            "kube-system/coredns-7db6d8ff4d-4xk9m",
            "shop/checkout-5f6d7c9b8-q7w2e"
        ]
    );
}

fn pod(full_name: &str) -> Pod {
    let (namespace, name) = full_name.split_once('/').unwrap();
    Pod {
        runtime: Runtime::Containerd,
        sandbox_id: format!("id-{name}"),
        namespace: namespace.into(),
        name: name.into(),
        uid: String::new(),
        netns: None,
        pid: None,
        resolv_conf: None,
    }
}

fn pod_list(names: &[&str]) -> Vec<Pod> {
    names.iter().map(|n| pod(n)).collect()
}

fn selected(pods: &[Pod], query: &str) -> Result<String> {
    select(pods, query).map(Pod::full_name)
}

#[test]
fn select_by_name_namespace_and_prefix() {
    let pods = pod_list(&[
        "default/web-1",
        "kube-system/coredns-a",
        "kube-system/coredns-b",
        "shop/checkout-x",
        "shop/web",
    ]);
    assert_eq!(selected(&pods, "web-1").unwrap(), "default/web-1");
    assert_eq!(
        selected(&pods, "shop/checkout-x").unwrap(),
        "shop/checkout-x"
    );
    assert_eq!(selected(&pods, "check").unwrap(), "shop/checkout-x");
    assert_eq!(selected(&pods, "shop/ch").unwrap(), "shop/checkout-x");
    assert_eq!(
        selected(&pods, "kube-system/coredns-b").unwrap(),
        "kube-system/coredns-b"
    );
    // "web" is exactly shop/web, and a prefix of default/web-1: exact wins.
    assert_eq!(selected(&pods, "web").unwrap(), "shop/web");
}

#[test]
fn select_names_the_candidates_when_ambiguous() {
    let pods = pod_list(&["default/web-1", "shop/web-2", "shop/checkout"]);
    assert_eq!(
        selected(&pods, "web").unwrap_err().to_string(),
        "\"web\" matches 2 pods: default/web-1, shop/web-2; give namespace/name or a longer prefix"
    );
    let twins = pod_list(&["default/web", "shop/web"]);
    assert!(selected(&twins, "web")
        .unwrap_err()
        .to_string()
        .starts_with("\"web\" matches 2 pods"));
    assert_eq!(selected(&twins, "shop/web").unwrap(), "shop/web");
}

#[test]
fn select_lists_the_pods_when_nothing_matches() {
    let pods = pod_list(&["default/web-1", "shop/checkout"]);
    assert_eq!(
        selected(&pods, "x").unwrap_err().to_string(),
        "no pod matches \"x\" on this node; pods: default/web-1, shop/checkout"
    );
    assert_eq!(
        selected(&[], "x").unwrap_err().to_string(),
        "no pod matches \"x\" on this node; pods: none found"
    );
    let many: Vec<Pod> = (0..20).map(|i| pod(&format!("ns/pod-{i:02}"))).collect();
    let message = selected(&many, "x").unwrap_err().to_string();
    assert!(message.ends_with("ns/pod-07, and 12 more"), "{message}");
}
