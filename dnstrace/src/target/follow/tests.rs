use super::*;
use crate::pods::Runtime;
use dnstrace_common::{ROLE_RESOLVER, ROLE_TARGET};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sandbox(id: &str, namespace: &str, name: &str, addr: &str) -> (String, (Pod, Metadata)) {
    let pod = Pod {
        runtime: Runtime::Containerd,
        sandbox_id: id.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        uid: format!("uid-{id}"),
        netns: None,
        pid: None,
        resolv_conf: None,
    };
    let meta = Metadata {
        ips: vec![ip(addr)],
        ..Metadata::default()
    };
    (id.to_owned(), (pod, meta))
}

fn now(sandboxes: &[(String, (Pod, Metadata))]) -> BTreeMap<String, (Pod, Metadata)> {
    sandboxes.iter().cloned().collect()
}

fn role(watched: &[([u8; 16], u8)], addr: &str) -> Option<u8> {
    let key = crate::probes::address_key(ip(addr));
    watched.iter().find(|(k, _)| *k == key).map(|(_, r)| *r)
}

const WEB: &str = "10.245.1.2";
const DNS: &str = "10.245.1.53";

/// web and coredns at the start, `--pod web`.
fn started() -> Pods {
    let web = sandbox("aaaa", "default", "web", WEB);
    let dns = sandbox("bbbb", "kube-system", "coredns-1", DNS);
    let mut inventory = Inventory::default();
    for (_, (pod, meta)) in [&web, &dns] {
        inventory.pods.push(pod.clone());
        inventory
            .metadata
            .insert(pod.sandbox_id.clone(), meta.clone());
    }
    let target = Target {
        label: "pod default/web".into(),
        netns_inode: 7,
        addrs: vec![ip(WEB)],
        host_veth: None,
        resolv: None,
        namespace: Some("default".into()),
    };
    let start = NodePods {
        addresses: vec![
            ("default/web".to_owned(), vec![ip(WEB)]),
            ("kube-system/coredns-1".to_owned(), vec![ip(DNS)]),
        ],
        ..NodePods::default()
    };
    Pods::new(
        &inventory,
        Some("web"),
        Some(&target),
        Services::default(),
        &start,
    )
}

#[test]
fn nothing_changed_is_no_refresh() {
    let mut pods = started();
    let same = now(&[
        sandbox("aaaa", "default", "web", WEB),
        sandbox("bbbb", "kube-system", "coredns-1", DNS),
    ]);
    let update = pods.update(same);
    assert_eq!(update.refresh, Refresh::default());
    assert!(update.watched.is_none());
}

#[test]
fn the_target_is_followed_into_its_new_sandbox_once_the_old_is_gone() {
    let mut pods = started();
    let dns = sandbox("bbbb", "kube-system", "coredns-1", DNS);
    let gone = pods.update(now(std::slice::from_ref(&dns)));
    assert_eq!(gone.refresh.target, None, "nothing to follow yet");
    let back = pods.update(now(&[dns, sandbox("cccc", "default", "web", "10.245.1.3")]));
    let moved = back.refresh.target.expect("followed");
    assert_eq!(moved.addrs, [ip("10.245.1.3")]);
    assert_eq!(
        back.refresh.names,
        [(ip("10.245.1.3"), "default/web".into())]
    );
    let watched = back.watched.expect("the kernel's addresses change");
    assert_eq!(role(&watched, "10.245.1.3"), Some(ROLE_TARGET));
    assert_eq!(
        role(&watched, WEB),
        None,
        "the old address is no longer watched"
    );
    assert_eq!(role(&watched, DNS), Some(ROLE_RESOLVER));
}

#[test]
fn a_restarted_resolver_and_a_new_pod_are_named_and_the_resolver_watched() {
    let mut pods = started();
    let mut coredns = sandbox(
        "dddd",
        "kube-system",
        "coredns-5d78c9869d-x2x2x",
        "10.245.1.54",
    );
    coredns.1 .1.workload = Some(Workload {
        kind: crate::pods::workload::WorkloadKind::Deployment,
        name: "coredns".into(),
    });
    let update = pods.update(now(&[
        sandbox("aaaa", "default", "web", WEB),
        coredns.clone(),
        sandbox("eeee", "default", "late", "10.245.1.9"),
    ]));
    assert_eq!(update.refresh.target, None, "web did not move");
    let mut names = update.refresh.names;
    names.sort();
    assert_eq!(
        names,
        [
            (ip("10.245.1.9"), "default/late".into()),
            (
                ip("10.245.1.54"),
                "kube-system/coredns-5d78c9869d-x2x2x".into()
            ),
        ]
    );
    assert_eq!(
        update.refresh.workloads,
        [(ip("10.245.1.54"), coredns.1 .1.workload.unwrap())],
        "late is a bare pod: no workload"
    );
    let watched = update.watched.expect("the resolver moved");
    assert_eq!(role(&watched, "10.245.1.54"), Some(ROLE_RESOLVER));
    assert_eq!(role(&watched, DNS), None);
    assert_eq!(role(&watched, WEB), Some(ROLE_TARGET));
}

/// With `--node`, the kernel's scope is the node's namespace and its
/// pods', changed as they come and go.
#[test]
fn the_scope_follows_the_pods() {
    let own = crate::netns::inode(None).unwrap();
    let mut web = sandbox("aaaa", "default", "web", WEB);
    web.1 .0.netns = Some("/proc/self/ns/net".into());
    let dns = sandbox("bbbb", "kube-system", "coredns-1", DNS);
    let scope = Scope {
        node: "n-1".into(),
        node_netns: 1,
        netns: [1].into(),
    };
    let mut pods = started().with_scope(Some(scope));
    let update = pods.update(now(&[web.clone(), dns.clone()]));
    assert_eq!(update.scope.unwrap().netns, [1, own].into());
    assert!(update
        .said
        .contains(&"node n-1: 2 network namespaces in scope".to_owned()));
    assert!(pods.update(now(&[web, dns.clone()])).scope.is_none());
    let gone = pods.update(now(&[dns]));
    assert_eq!(gone.scope.unwrap().netns, [1].into());
}
