use super::*;
use crate::record::tests::{packet, Rng};

const PSH_ACK: u8 = 0x18;

fn tcp(seq: u32) -> Transport {
    Transport::Tcp {
        seq,
        flags: PSH_ACK,
    }
}

fn decoded(p: &Packet) -> Decoded<'_> {
    Decoded {
        src: p.src,
        dst: p.dst,
        transport: p.transport,
        payload: &p.payload[..],
        payload_len: p.payload_len,
        truncated: p.truncated,
        frag: p.frag,
        underlay: None,
    }
}

/// Ones' complement sum of `bytes` folds to 0 when a checksum in them is right.
fn checksum_ok(bytes: &[u8]) -> bool {
    fold(sum16(0, bytes)) == 0
}

fn cases() -> Vec<Packet> {
    let query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x01a\x00\x00\x01\x00\x01";
    let mut cut = packet("10.0.0.1:53", "10.0.0.2:40000", Transport::Udp, &query[..7]);
    cut.payload_len = 512;
    cut.truncated = true;
    let first = |id| {
        Some(Fragment {
            id,
            offset: 0,
            more: true,
        })
    };
    let mut frag4 = packet("10.0.0.1:53", "10.0.0.2:40000", Transport::Udp, &[1; 1472]);
    (frag4.payload_len, frag4.truncated, frag4.frag) = (3000, true, first(0xbeef));
    let mut frag6 = packet(
        "[fd00::1]:53",
        "[fd00::2]:40000",
        Transport::Udp,
        &[2; 1448],
    );
    (frag6.payload_len, frag6.truncated, frag6.frag) = (3000, true, first(0xdead_beef));
    // Later fragments: no ports; the last one cut by the capture.
    let mut later4 = packet("10.0.0.1:0", "10.0.0.2:0", Transport::Udp, &[3; 1480]);
    later4.frag = Some(Fragment {
        id: 0xbeef,
        offset: 1480,
        more: true,
    });
    let mut last6 = packet("[fd00::1]:0", "[fd00::2]:0", Transport::Udp, &[4; 100]);
    (last6.payload_len, last6.truncated) = (1560, true);
    last6.frag = Some(Fragment {
        id: 0xdead_beef,
        offset: 1448,
        more: false,
    });
    vec![
        packet("10.244.0.10:40000", "10.96.0.10:53", Transport::Udp, query),
        packet(
            "[fd00::10]:40000",
            "[fd00::53]:53",
            Transport::Udp,
            &query[..13],
        ),
        packet("10.0.0.1:40000", "10.0.0.2:53", tcp(7), &[0, 19]),
        packet("[fd00::1]:53", "[fd00::2]:40000", tcp(u32::MAX), b""),
        cut,
        frag4,
        frag6,
        later4,
        last6,
    ]
}

#[test]
fn encoded_packets_decode_to_themselves() {
    for p in cases() {
        let frame = encode(&p);
        let d = decode(LINKTYPE_RAW, &frame.data).unwrap().unwrap();
        assert_eq!(d, decoded(&p), "{p:?}");
        assert!(frame.orig_len as usize >= frame.data.len());
    }
}

#[test]
fn lengths_and_checksums_are_right() {
    let cases = cases();
    let [udp4, udp6, tcp4, tcp6, cut, ..] = &cases[..] else {
        unreachable!()
    };
    let f = encode(udp4);
    assert_eq!((f.data.len(), f.orig_len), (20 + 8 + 19, 47));
    assert_eq!(&f.data[2..4], &47u16.to_be_bytes());
    assert!(checksum_ok(&f.data[..20]));
    assert!(checksum_ok(
        &[&f.data[12..20], &[0, 17, 0, 27], &f.data[20..]].concat()
    ));
    let f = encode(udp6);
    assert_eq!((f.data.len(), f.orig_len), (40 + 8 + 13, 61));
    let pseudo = [&f.data[8..40], &[0, 0, 0, 21, 0, 0, 0, 17]].concat();
    assert!(checksum_ok(&[&pseudo[..], &f.data[40..]].concat()));
    let f = encode(tcp4);
    assert_eq!(f.data[20 + 13], PSH_ACK);
    assert!(checksum_ok(
        &[&f.data[12..20], &[0, 6, 0, 22], &f.data[20..]].concat()
    ));
    let f = encode(tcp6);
    let pseudo = [&f.data[8..40], &[0, 0, 0, 20, 0, 0, 0, 6]].concat();
    assert!(checksum_ok(&[&pseudo[..], &f.data[40..]].concat()));
    // A cut payload: the headers announce all of it.
    let f = encode(cut);
    assert_eq!((f.data.len(), f.orig_len), (20 + 8 + 7, 20 + 8 + 512));
    assert_eq!(&f.data[24..26], &520u16.to_be_bytes());
    // Lengths beyond what the headers hold saturate.
    let mut huge = cut.clone();
    huge.payload_len = u32::MAX;
    let f = encode(&huge);
    assert_eq!(f.orig_len, u32::MAX);
    assert_eq!(&f.data[2..4], &[0xff, 0xff]);
    let d = decode(LINKTYPE_RAW, &f.data).unwrap().unwrap();
    assert_eq!((d.payload_len, d.truncated), (65535 - 8, true));
}

/// Fragments as IP has them: id, offset in 8-byte units and MF in the
/// IPv4 header or the IPv6 fragment header; a later one without a UDP
/// header; the IPv4 first fragment without a checksum (it would cover
/// data it lacks).
#[test]
fn fragments_are_written_as_ip_fragments() {
    let cases = cases();
    let [.., frag4, frag6, later4, last6] = &cases[..] else {
        unreachable!()
    };
    let f = encode(frag4);
    assert_eq!(&f.data[4..8], &[0xbe, 0xef, 0x20, 0]);
    assert_eq!(&f.data[24..28], &[0x0b, 0xc0, 0, 0]); // UDP length 3008, no checksum
    assert!(checksum_ok(&f.data[..20]));
    let f = encode(later4);
    assert_eq!(&f.data[4..8], &[0xbe, 0xef, 0x20, 0xb9]); // 1480 / 8
    assert_eq!((f.data.len(), f.orig_len), (20 + 1480, 20 + 1480));
    assert_eq!(&f.data[20..], &later4.payload[..]);
    let f = encode(frag6);
    assert_eq!(
        (f.data[6], &f.data[40..48]),
        (44, &[17, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef][..])
    );
    let pseudo = [&f.data[8..40], &[0, 0, 0x05, 0xb0, 0, 0, 0, 17]].concat();
    assert!(checksum_ok(&[&pseudo[..], &f.data[48..]].concat()));
    let f = encode(last6);
    assert_eq!(
        &f.data[40..48],
        &[17, 0, 0x05, 0xa8, 0xde, 0xad, 0xbe, 0xef]
    );
    assert_eq!(&f.data[4..6], &(8 + 1560u16).to_be_bytes());
    assert_eq!((f.data.len(), f.orig_len), (48 + 100, 48 + 1560));
}

fn eth(ethertype: u16, tags: &[u16], ip: &[u8]) -> Vec<u8> {
    let mut f = vec![0xaa; 12];
    for &tpid in tags {
        f.extend_from_slice(&tpid.to_be_bytes());
        f.extend_from_slice(&[0, 42]);
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(ip);
    f
}

#[test]
fn every_link_type_gives_the_same_packet() {
    let p = &cases()[0];
    let ip = encode(p).data;
    let mut sll = vec![0, 4, 3, 4, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0];
    sll.extend_from_slice(&ETH_P_IP.to_be_bytes());
    let mut sll2 = ETH_P_IP.to_be_bytes().to_vec();
    sll2.extend_from_slice(&[0, 0, 0, 0, 0, 1, 0, 1, 4, 6, 1, 2, 3, 4, 5, 6, 0, 0]);
    let mut padded = eth(ETH_P_IP, &[], &ip);
    padded.extend_from_slice(&[0; 13]); // Ethernet padding is not payload
    let frames = [
        (LINKTYPE_RAW, ip.clone()),
        (12, ip.clone()),
        (14, ip.clone()),
        (LINKTYPE_IPV4, ip.clone()),
        (LINKTYPE_ETHERNET, eth(ETH_P_IP, &[], &ip)),
        (LINKTYPE_ETHERNET, padded),
        (
            LINKTYPE_ETHERNET,
            eth(ETH_P_IP, &[ETH_P_8021AD, ETH_P_8021Q], &ip),
        ),
        (LINKTYPE_LINUX_SLL, [&sll[..], &ip].concat()),
        (LINKTYPE_LINUX_SLL2, [&sll2[..], &ip].concat()),
        (LINKTYPE_NULL, [&2u32.to_le_bytes()[..], &ip].concat()),
        (LINKTYPE_NULL, [&2u32.to_be_bytes()[..], &ip].concat()),
        (LINKTYPE_LOOP, [&2u32.to_be_bytes()[..], &ip].concat()),
    ];
    for (linktype, frame) in frames {
        let d = decode(linktype, &frame).unwrap();
        assert_eq!(d, Some(decoded(p)), "link type {linktype}");
    }
    let p6 = &cases()[1];
    let ip6 = encode(p6).data;
    for (linktype, frame) in [
        (LINKTYPE_IPV6, ip6.clone()),
        (LINKTYPE_ETHERNET, eth(ETH_P_IPV6, &[ETH_P_8021Q], &ip6)),
        (LINKTYPE_NULL, [&30u32.to_le_bytes()[..], &ip6].concat()),
    ] {
        assert_eq!(decode(linktype, &frame).unwrap(), Some(decoded(p6)));
    }
}

#[test]
fn ipv6_extension_headers_are_walked() {
    let p = &cases()[1];
    let ip = encode(p).data;
    let (fixed, l4) = ip.split_at(40);
    // Hop-by-hop (8 bytes), then destination options (16 bytes).
    let mut with_ext = fixed.to_vec();
    with_ext[6] = 0;
    with_ext[5] += 24;
    with_ext.extend_from_slice(&[60, 0, 1, 4, 0, 0, 0, 0]);
    with_ext.extend_from_slice(&[17, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    with_ext.extend_from_slice(l4);
    assert_eq!(decode(LINKTYPE_RAW, &with_ext).unwrap(), Some(decoded(p)));
    // A later fragment carries no ports: what follows its fragment
    // header is data, not headers.
    let mut later = fixed.to_vec();
    later[6] = IPPROTO_FRAGMENT;
    later[5] += 8;
    later.extend_from_slice(&[17, 0, 0x05, 0x01, 0, 0, 0, 1]);
    later.extend_from_slice(l4);
    let d = decode(LINKTYPE_RAW, &later).unwrap().unwrap();
    assert_eq!((d.src.port(), d.dst.port(), d.payload), (0, 0, l4));
    assert_eq!(
        d.frag,
        Some(Fragment {
            id: 1,
            offset: 0x0500,
            more: true
        })
    );
    // A later fragment of anything but UDP is not ours.
    later[40] = IPPROTO_TCP;
    assert_eq!(decode(LINKTYPE_RAW, &later).unwrap(), None);
}

#[test]
fn what_is_not_udp_or_tcp_over_ip_is_skipped() {
    let ip = encode(&cases()[0]).data;
    let mut icmp = ip.clone();
    icmp[9] = 1;
    let mut later_fragment = ip.clone();
    (later_fragment[7], later_fragment[9]) = (1, IPPROTO_TCP);
    let frames = [
        (LINKTYPE_ETHERNET, eth(0x0806, &[], &[0; 28])),
        (LINKTYPE_ETHERNET, eth(0x8100, &[0x8100, 0x8100], &ip)),
        (LINKTYPE_RAW, icmp),
        (LINKTYPE_RAW, later_fragment),
        (LINKTYPE_RAW, vec![0x20]),
        (LINKTYPE_RAW, vec![]),
        (LINKTYPE_NULL, [&7u32.to_le_bytes()[..], &ip].concat()),
    ];
    for (linktype, frame) in frames {
        assert_eq!(decode(linktype, &frame), Ok(None), "{frame:?}");
    }
}

#[test]
fn malformed_frames_are_errors() {
    let ip = encode(&cases()[0]).data;
    let tcp = encode(&cases()[2]).data;
    let patched = |mut f: Vec<u8>, at: usize, v: u8| {
        f[at] = v;
        f
    };
    let frames = [
        (
            LINKTYPE_ETHERNET,
            vec![0; 13],
            "Ethernet header cut at 13 bytes",
        ),
        (
            LINKTYPE_LINUX_SLL2,
            vec![0; 19],
            "Linux cooked v2 header cut",
        ),
        (LINKTYPE_LOOP, vec![0; 3], "loopback header cut"),
        (LINKTYPE_ETHERNET, eth(0x8100, &[], &[0; 2]), "VLAN tag cut"),
        (LINKTYPE_IPV4, vec![0x45; 19], "IPv4 header cut at 19 bytes"),
        (
            LINKTYPE_IPV4,
            patched(ip.clone(), 0, 0x44),
            "first byte 0x44",
        ),
        (LINKTYPE_IPV6, ip.clone(), "not an IPv6 header"),
        (
            LINKTYPE_RAW,
            patched(ip.clone(), 3, 12),
            "IPv4 header of 20 bytes in a packet of 12",
        ),
        (LINKTYPE_RAW, ip[..24].to_vec(), "UDP header cut at 4 bytes"),
        (LINKTYPE_RAW, patched(ip.clone(), 25, 7), "UDP length 7"),
        (
            LINKTYPE_RAW,
            patched(tcp.clone(), 32, 0x40),
            "TCP header of 16 bytes",
        ),
        (
            LINKTYPE_RAW,
            patched(tcp.clone(), 32, 0xf0),
            "TCP header of 60 bytes",
        ),
        (147, ip.clone(), "link type 147 is not supported"),
    ];
    for (linktype, frame, what) in frames {
        let e = decode(linktype, &frame).unwrap_err();
        assert!(e.to_string().contains(what), "{e} (expected {what})");
    }
    let ip6 = encode(&cases()[1]).data;
    let mut cut_ext = ip6[..40].to_vec();
    cut_ext[6] = 0;
    assert!(decode(LINKTYPE_RAW, &cut_ext).is_err());
}

#[test]
fn mutated_frames_never_panic() {
    let linktypes = [0, 1, 12, 101, 108, 113, 228, 229, 276];
    let mut frames: Vec<Vec<u8>> = cases().iter().map(|p| encode(p).data).collect();
    // And inside tunnels, for the decapsulation's bounds.
    let vxlan = [vxlan_header(7), eth(ETH_P_IP, &[], &frames[0])].concat();
    let gre = [&[0x20, 0, 0x86, 0xdd, 0, 0, 0, 1][..], &frames[1]].concat();
    let geneve = [
        &[0x01, 0, 0x65, 0x58, 0, 0, 9, 0, 1, 2, 3, 0][..],
        &vxlan[8..],
    ]
    .concat();
    frames.extend([
        over_udp(4789, &vxlan),
        over_udp(6081, &geneve),
        over_ip(IPPROTO_GRE, &gre),
        over_ip(IPPROTO_IPIP, &frames[2]),
    ]);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for _ in 0..5_000 {
        let mut f = frames[rng.below(frames.len())].clone();
        let linktype = linktypes[rng.below(linktypes.len())];
        // Give link layers something to skip before the IP header.
        let mut prefix: Vec<u8> = (0..rng.below(24)).map(|_| rng.next() as u8).collect();
        prefix.append(&mut f);
        let mut f = prefix;
        for _ in 0..rng.below(4) {
            let at = rng.below(f.len());
            f[at] = rng.next() as u8;
        }
        f.truncate(f.len() - rng.below(f.len().min(16)));
        if let Ok(Some(d)) = decode(linktype, &f) {
            assert!(d.payload.len() <= d.payload_len as usize);
        }
    }
}

const NODE_A: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 1);
const NODE_B: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 2);

/// `inner` in an IPv4 packet of protocol `proto` between the two nodes.
fn over_ip(proto: u8, inner: &[u8]) -> Vec<u8> {
    let (mut h, _) = ipv4_header(NODE_A, NODE_B, proto, inner.len() as u32, None);
    h.extend_from_slice(inner);
    h
}

/// `inner` in UDP between the two nodes, to `port`.
fn over_udp(port: u16, inner: &[u8]) -> Vec<u8> {
    let outer = packet(
        "192.168.0.1:40001",
        &format!("192.168.0.2:{port}"),
        Transport::Udp,
        inner,
    );
    encode(&outer).data
}

fn vxlan_header(vni: u32) -> Vec<u8> {
    let mut h = vec![0x08, 0, 0, 0];
    h.extend_from_slice(&(vni << 8).to_be_bytes());
    h
}

fn underlay(tunnel: Tunnel, vni: Option<u32>) -> Option<Underlay> {
    Some(Underlay {
        tunnel,
        src: NODE_A.into(),
        dst: NODE_B.into(),
        vni,
    })
}

#[test]
fn dns_inside_every_tunnel_is_found_with_its_nodes() {
    let all = cases();
    let (p, p6) = (&all[0], &all[1]);
    let ip = encode(p).data;
    let ip6 = encode(p6).data;
    let in_eth = eth(ETH_P_IP, &[], &ip);
    let vxlan = [vxlan_header(7), in_eth.clone()].concat();
    // Geneve with one 8-byte option, carrying Ethernet, then IP directly.
    let geneve = |ethertype: u16, inner: &[u8]| {
        let mut h = vec![0x02, 0];
        h.extend_from_slice(&ethertype.to_be_bytes());
        h.extend_from_slice(&[0, 0, 9, 0]);
        h.extend_from_slice(&[1, 2, 3, 1, 0xab, 0xcd, 0xef, 0x01]);
        [h, inner.to_vec()].concat()
    };
    // GRE with a checksum, a key and a sequence number.
    let gre = |ethertype: u16, inner: &[u8]| {
        let mut h = vec![0xb0, 0];
        h.extend_from_slice(&ethertype.to_be_bytes());
        h.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 42, 0, 0, 0, 1]);
        [h, inner.to_vec()].concat()
    };
    let tunnels = [
        (over_udp(4789, &vxlan), underlay(Tunnel::Vxlan, Some(7))),
        (over_udp(8472, &vxlan), underlay(Tunnel::Vxlan, Some(7))),
        (
            over_udp(6081, &geneve(ETH_P_TEB, &in_eth)),
            underlay(Tunnel::Geneve, Some(9)),
        ),
        (
            over_udp(6081, &geneve(ETH_P_IP, &ip)),
            underlay(Tunnel::Geneve, Some(9)),
        ),
        (over_ip(IPPROTO_IPIP, &ip), underlay(Tunnel::Ipip, None)),
        (
            over_ip(IPPROTO_GRE, &gre(ETH_P_IP, &ip)),
            underlay(Tunnel::Gre, Some(42)),
        ),
        (
            over_ip(IPPROTO_GRE, &gre(ETH_P_TEB, &in_eth)),
            underlay(Tunnel::Gre, Some(42)),
        ),
        // A node's overlay over a cloud's own: the outer one is the nodes.
        (
            over_ip(IPPROTO_GRE, &gre(ETH_P_IP, &over_udp(4789, &vxlan))),
            underlay(Tunnel::Gre, Some(42)),
        ),
    ];
    for (i, (frame, under)) in tunnels.into_iter().enumerate() {
        let mut want = decoded(p);
        want.underlay = under;
        let framed = eth(ETH_P_IP, &[], &frame);
        assert_eq!(
            decode(LINKTYPE_ETHERNET, &framed),
            Ok(Some(want)),
            "case {i}"
        );
    }
    let six_in_four = over_ip(IPPROTO_IPV6, &ip6);
    let d = decode(LINKTYPE_RAW, &six_in_four).unwrap().unwrap();
    assert_eq!((d.src, d.underlay), (p6.src, underlay(Tunnel::Ipip, None)));
}

#[test]
fn tunnels_are_opened_only_where_they_are_whole() {
    let ip = encode(&cases()[0]).data;
    let vxlan = [vxlan_header(7), eth(ETH_P_IP, &[], &ip)].concat();
    // Three deep: past the limit, the innermost is not looked for.
    let deep = over_ip(
        IPPROTO_IPIP,
        &over_ip(IPPROTO_IPIP, &over_ip(IPPROTO_IPIP, &ip)),
    );
    assert_eq!(decode(LINKTYPE_RAW, &deep), Ok(None));
    // An outer fragment is not put back together: it stays the tunnel's.
    let mut fragment = over_udp(4789, &vxlan);
    fragment[6] = 0x20;
    let d = decode(LINKTYPE_RAW, &fragment).unwrap().unwrap();
    assert_eq!((d.dst.port(), d.underlay), (4789, None));
    // PPTP's GRE (version 1), and what a tunnel carries that is not IP.
    let pptp = over_ip(IPPROTO_GRE, &[0x30, 0x81, 0x88, 0x0b, 0, 0, 0, 0]);
    assert_eq!(decode(LINKTYPE_RAW, &pptp), Ok(None));
    let arp = over_udp(
        4789,
        &[vxlan_header(1), eth(0x0806, &[], &[0; 28])].concat(),
    );
    let d = decode(LINKTYPE_RAW, &arp).unwrap().unwrap();
    assert_eq!((d.dst.port(), d.underlay), (4789, None));
    let errors = [
        (over_udp(4789, &vxlan[..5]), "VXLAN header cut at 5 bytes"),
        (
            over_udp(4789, &[&[0, 0, 0, 0, 0, 0, 7, 0][..], &vxlan[8..]].concat()),
            "VXLAN header without a VNI (I flag clear)",
        ),
        (
            over_udp(4789, &vxlan[..18]),
            "inner Ethernet header cut at 10 bytes",
        ),
        (
            over_udp(6081, &[0x02, 0, 0x08, 0, 0, 0, 1, 0]),
            "Geneve options of 8 bytes cut",
        ),
        (
            over_udp(6081, &[0x40, 0, 0x08, 0, 0, 0, 1, 0]),
            "Geneve version 1 is not known",
        ),
        (
            over_ip(IPPROTO_GRE, &[0x20, 0, 0x08, 0, 0]),
            "GRE header of 8 bytes cut",
        ),
        (
            over_ip(IPPROTO_IPIP, &ip[..12]),
            "IPv4 header cut at 12 bytes",
        ),
    ];
    for (frame, error) in errors {
        assert_eq!(decode(LINKTYPE_RAW, &frame), Err(FrameError(error.into())));
    }
}

#[test]
fn a_tunnel_is_written_with_its_nodes() {
    let u = underlay(Tunnel::Vxlan, Some(7)).unwrap();
    assert_eq!(
        u.to_string(),
        "vxlan node 192.168.0.1 → node 192.168.0.2 (vni 7)"
    );
    let gre = Underlay {
        tunnel: Tunnel::Gre,
        ..u
    };
    assert_eq!(
        gre.to_string(),
        "gre node 192.168.0.1 → node 192.168.0.2 (key 7)"
    );
    assert_eq!(
        serde_json::to_string(&Underlay { vni: None, ..gre }).unwrap(),
        r#"{"tunnel":"gre","src":"192.168.0.1","dst":"192.168.0.2"}"#
    );
}
