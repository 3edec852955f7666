use super::*;

fn v4(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const FLANNEL: i32 = 5;
const ETH0: i32 = 2;
const MAC3: [u8; 6] = [0x0a, 0, 0, 0, 0, 3];
const MAC2: [u8; 6] = [0x0a, 0, 0, 0, 0, 2];

fn via(dst: &str, len: u8, gateway: &str, oif: i32) -> Via {
    Via {
        dst: v4(dst),
        len,
        gateway: v4(gateway),
        oif,
    }
}

fn entry(ifindex: i32, ip: &str, mac: [u8; 6]) -> Neigh {
    Neigh {
        ifindex,
        ip: Some(v4(ip)),
        mac: Some(mac.to_vec()),
    }
}

/// Node 1 of the lab: a route per other node's subnet over flannel.1,
/// and its default route on eth0.
fn node1() -> Routes {
    let links = [
        Link {
            index: ETH0,
            name: "eth0".into(),
            vxlan: false,
        },
        Link {
            index: FLANNEL,
            name: "flannel.1".into(),
            vxlan: true,
        },
    ];
    let routes = [
        via("10.244.2.0", 24, "10.244.2.0", FLANNEL),
        via("10.244.3.0", 24, "10.244.3.0", FLANNEL),
        via("10.244.4.0", 24, "10.244.4.0", FLANNEL),
        via("0.0.0.0", 0, "172.18.0.1", ETH0),
    ];
    // The same gateway and MAC on another device must not be taken.
    let neighs = [
        entry(ETH0, "10.244.3.0", MAC2),
        entry(FLANNEL, "10.244.3.0", MAC3),
        entry(FLANNEL, "10.244.2.0", MAC2),
    ];
    let fdb = [
        entry(ETH0, "172.18.0.9", MAC3),
        entry(FLANNEL, "172.18.0.4", MAC3),
        entry(FLANNEL, "172.18.0.3", MAC2),
    ];
    resolve(&routes, &links, &neighs, &fdb)
}

#[test]
fn a_vxlan_route_names_the_node_its_gateway_mac_is_sent_to() {
    let routes = node1();
    let to3 = routes.toward(v4("10.244.3.53")).unwrap();
    assert_eq!(
        (to3.dev.as_str(), to3.gateway, to3.node),
        ("flannel.1", v4("10.244.3.0"), Some(v4("172.18.0.4")))
    );
    let to2 = routes.toward(v4("10.244.2.53")).unwrap();
    assert_eq!(to2.node, Some(v4("172.18.0.3")));
}

#[test]
fn without_its_entries_or_off_vxlan_a_route_names_its_gateway_alone() {
    let routes = node1();
    // No neighbour entry for 10.244.4.0: the gateway, no node.
    let to4 = routes.toward(v4("10.244.4.7")).unwrap();
    assert_eq!((to4.gateway, to4.node), (v4("10.244.4.0"), None));
    // Elsewhere: the default route, the longest prefix holding it.
    let out = routes.toward(v4("8.8.8.8")).unwrap();
    assert_eq!(
        (out.dev.as_str(), out.gateway, out.len, out.node),
        ("eth0", v4("172.18.0.1"), 0, None)
    );
    assert_eq!(routes.toward("fd00::1".parse().unwrap()), None);
    assert_eq!(Routes::default().toward(v4("10.244.3.53")), None);
}

fn with_attrs(head: &[u8], attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut m = vec![0u8; HDR];
    m.extend(head);
    for (kind, v) in attrs {
        m.extend(((4 + v.len()) as u16).to_ne_bytes());
        m.extend(kind.to_ne_bytes());
        m.extend(*v);
        m.resize(m.len().next_multiple_of(4), 0);
    }
    let len = m.len() as u32;
    m[..4].copy_from_slice(&len.to_ne_bytes());
    m
}

#[test]
fn dumped_messages_read_as_routes_links_and_entries() {
    // family, dst_len 24, src_len, tos, table main, proto, scope, unicast.
    let head = [libc::AF_INET as u8, 24, 0, 0, 254, 3, 0, 1, 4, 0, 0, 0];
    let msg = with_attrs(
        &head,
        &[
            (RTA_DST, &[10, 244, 3, 0]),
            (RTA_GATEWAY, &[10, 244, 3, 0]),
            (RTA_OIF, &FLANNEL.to_ne_bytes()),
        ],
    );
    assert_eq!(
        route(&msg),
        Some(via("10.244.3.0", 24, "10.244.3.0", FLANNEL))
    );
    // A local route (type 2) and one without a gateway are not kept.
    let mut local = head;
    local[7] = 2;
    assert_eq!(
        route(&with_attrs(&local, &[(RTA_GATEWAY, &[1, 2, 3, 4])])),
        None
    );
    assert_eq!(route(&with_attrs(&head, &[(RTA_OIF, &[5, 0, 0, 0])])), None);

    let mut ifinfo = [0u8; 16];
    ifinfo[4..8].copy_from_slice(&FLANNEL.to_ne_bytes());
    let kind = with_attrs(&[], &[(IFLA_INFO_KIND, b"vxlan\0")]);
    let msg = with_attrs(
        &ifinfo,
        &[(IFLA_IFNAME, b"flannel.1\0"), (IFLA_LINKINFO, &kind[HDR..])],
    );
    assert_eq!(
        link(&msg),
        Some(Link {
            index: FLANNEL,
            name: "flannel.1".into(),
            vxlan: true
        })
    );

    let mut ndmsg = [0u8; 12];
    ndmsg[4..8].copy_from_slice(&FLANNEL.to_ne_bytes());
    let msg = with_attrs(&ndmsg, &[(NDA_LLADDR, &MAC3), (NDA_DST, &[172, 18, 0, 4])]);
    assert_eq!(neigh(&msg), Some(entry(FLANNEL, "172.18.0.4", MAC3)));
    for cut in 0..msg.len() {
        let _ = (route(&msg[..cut]), link(&msg[..cut]), neigh(&msg[..cut]));
    }
}

#[test]
fn this_namespaces_routes_read_to_their_end() {
    // Dumps need no privilege: a framing error would fail here.
    read(None).unwrap();
}
