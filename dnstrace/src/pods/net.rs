//! What a pod's network namespace says: its addresses and, for the usual
//! veth CNI plugins, the node-side end of its eth0, where its packets enter
//! the node (and where a tc program sees only this pod).
use std::{
    io,
    mem::size_of,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::Path,
};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

use crate::netns::{self, in_netns};

/// The interface CNI plugins give a pod (CNI_IFNAME from the runtimes).
const POD_IFACE: &std::ffi::CStr = c"eth0";
/// Link replies are a few KiB; a larger one is cut, and refused.
const REPLY_BYTES: usize = 64 << 10;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodNet {
    pub netns_inode: u32,
    /// Addresses inside the pod, but loopback and IPv6 link-local.
    pub ips: Vec<IpAddr>,
    /// The node-side veth of the pod's eth0: its name and ifindex in the
    /// node's namespace; None where eth0 is not a veth into it.
    pub host_veth: Option<(String, u32)>,
    /// A UDP socket bound to port 53 on a pod address (or all of them):
    /// the pod is a resolver, whatever it is called.
    #[serde(skip)]
    pub serves_dns: bool,
    /// Where that veth sits; None without one.
    pub attachment: Option<Attachment>,
}

/// Where a pod's host veth sits in the node's namespace: what decides
/// whether packets between two pods are bridged or routed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Attachment {
    /// A port of this Linux bridge (the CNI bridge plugin, flannel):
    /// packets between its pods reach iptables only through br_netfilter.
    Bridge(String),
    /// On no Linux bridge: the node routes to it (Calico, Cilium, the CNI
    /// ptp plugin), so its packets always pass conntrack.
    Routed,
}

/// Looks into the pod's network namespace at `pod_netns`; the host veth is
/// looked up in `node_netns` (None: dnstrace's own).
pub fn inspect(pod_netns: &Path, node_netns: Option<&Path>) -> Result<PodNet> {
    let netns_inode = netns::inode(Some(pod_netns))?;
    let (ips, eth0, serves_dns) = in_netns(Some(pod_netns), || {
        Ok((addresses()?, pod_iface()?, serves_dns()))
    })
    .with_context(|| format!("in network namespace {}", pod_netns.display()))?;
    let host = match eth0
        .as_ref()
        .and_then(|l| l.veth_peer().map(|p| (l.index, p)))
    {
        Some((eth0, peer)) => host_end(node_netns, eth0, peer)?,
        None => None,
    };
    let (host_veth, attachment) = host.unzip();
    Ok(PodNet {
        netns_inode,
        ips,
        host_veth,
        serves_dns,
        attachment,
    })
}

/// Whether the calling thread's namespace has a UDP socket on port 53 that
/// is not loopback-only (a stub of the pod's own serves only the pod).
fn serves_dns() -> bool {
    ["udp", "udp6"].iter().any(|table| {
        std::fs::read_to_string(Path::new("/proc/thread-self/net").join(table))
            .is_ok_and(|text| binds_dns(&text))
    })
}

/// Whether a /proc/net/udp{,6} table has a socket bound to port 53 on an
/// address that is not loopback (`0100007F:0035` is 127.0.0.1:53 on a
/// little-endian host).
fn binds_dns(table: &str) -> bool {
    table.lines().skip(1).any(|line| {
        let local = line
            .split_whitespace()
            .nth(1)
            .and_then(|l| l.split_once(':'));
        local.is_some_and(|(addr, port)| {
            port == "0035" && proc_net_ip(addr).is_some_and(|ip| !ip.is_loopback())
        })
    })
}

/// An address as /proc/net prints it: 32-bit words in hex, each the
/// kernel's bytes read as a number of this host.
fn proc_net_ip(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| {
        let w = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    match hex.len() {
        8 => Some(Ipv4Addr::from(word(0)?).into()),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(&word(i)?);
            }
            Some(Ipv6Addr::from(bytes).into())
        }
        _ => None,
    }
}

/// The node's end of the veth: interface `peer` there, if it is a veth
/// whose own peer is the pod's eth0, and where it sits. Indexes are per
/// namespace, so the check in both directions is what makes it this pod's
/// and not a namesake in another namespace.
fn host_end(
    node_netns: Option<&Path>,
    eth0: u32,
    peer: u32,
) -> Result<Option<((String, u32), Attachment)>> {
    in_netns(node_netns, move || {
        let Some(host) = get_link(peer)?.filter(|h| h.veth_peer() == Some(eth0)) else {
            return Ok(None);
        };
        let attachment = attachment(host.master)?;
        Ok(Some(((host.name, host.index), attachment)))
    })
    .context("in the node's namespace")
}

/// A veth enslaved to `master` (IFLA_MASTER) is bridged if that is a
/// Linux bridge; a bond, VRF or Open vSwitch port is not.
fn attachment(master: Option<u32>) -> Result<Attachment> {
    let master = match master {
        Some(index) => get_link(index)?,
        None => None,
    };
    Ok(match master {
        Some(m) if m.kind.as_deref() == Some("bridge") => Attachment::Bridge(m.name),
        _ => Attachment::Routed,
    })
}

fn pod_iface() -> Result<Option<Link>> {
    // SAFETY: a NUL-terminated name; 0 means no such interface.
    match unsafe { libc::if_nametoindex(POD_IFACE.as_ptr()) } {
        0 => Ok(None),
        index => get_link(index),
    }
}

/// The namespace's addresses, sorted, but loopback and IPv6 link-local.
fn addresses() -> Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        bail!("listing addresses: {}", io::Error::last_os_error());
    }
    let mut ips = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        let loopback = ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0;
        // SAFETY: ifa_addr is null or a sockaddr of the family it names.
        if let Some(ip) = unsafe { sockaddr_ip(ifa.ifa_addr) } {
            if !loopback && !ip.is_loopback() && !is_ipv6_link_local(ip) {
                ips.push(ip);
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(head) };
    ips.sort();
    ips.dedup();
    Ok(ips)
}

/// # Safety
/// `sa` is null or points to a sockaddr of the family in its `sa_family`.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    match i32::from((*sa).sa_family) {
        libc::AF_INET => {
            let sin = &*sa.cast::<libc::sockaddr_in>();
            Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)).into())
        }
        libc::AF_INET6 => {
            let sin6 = &*sa.cast::<libc::sockaddr_in6>();
            Some(Ipv6Addr::from(sin6.sin6_addr.s6_addr).into())
        }
        _ => None,
    }
}

fn is_ipv6_link_local(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local())
}

/// An interface as RTM_GETLINK describes it.
#[derive(Debug, PartialEq, Eq)]
struct Link {
    index: u32,
    name: String,
    /// IFLA_INFO_KIND, e.g. `veth`.
    kind: Option<String>,
    /// IFLA_LINK: for a veth, its peer's index in the peer's namespace.
    link: Option<u32>,
    /// IFLA_MASTER: the device it is enslaved to (a bridge's port).
    master: Option<u32>,
}

impl Link {
    fn veth_peer(&self) -> Option<u32> {
        self.link.filter(|_| self.kind.as_deref() == Some("veth"))
    }
}

#[derive(Clone, Copy)]
#[repr(C)]
struct IfInfoMsg {
    family: u8,
    pad: u8,
    kind: u16,
    index: i32,
    flags: u32,
    change: u32,
}

#[derive(Clone, Copy)]
#[repr(C)]
struct LinkRequest {
    header: libc::nlmsghdr,
    info: IfInfoMsg,
}

/// RTM_GETLINK for interface `index` of the calling thread's namespace;
/// None if there is no such interface.
fn get_link(index: u32) -> Result<Option<Link>> {
    let sock = route_socket().context("opening an rtnetlink socket")?;
    let req = LinkRequest {
        header: libc::nlmsghdr {
            nlmsg_len: size_of::<LinkRequest>() as u32,
            nlmsg_type: libc::RTM_GETLINK,
            nlmsg_flags: libc::NLM_F_REQUEST as u16,
            nlmsg_seq: 1,
            nlmsg_pid: 0,
        },
        info: IfInfoMsg {
            family: libc::AF_UNSPEC as u8,
            pad: 0,
            kind: 0,
            index: index as i32,
            flags: 0,
            change: 0,
        },
    };
    crate::netlink::send(sock.as_fd(), &req).context("sending RTM_GETLINK")?;
    let mut buf = vec![0u8; REPLY_BYTES];
    // SAFETY: receiving into a buffer of the given length; MSG_TRUNC makes
    // the result the full length, so a cut reply shows.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_TRUNC,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error()).context("reading the RTM_GETLINK reply");
    }
    if n as usize > buf.len() {
        bail!("RTM_GETLINK reply of {n} bytes is too large");
    }
    parse_link_reply(&buf[..n as usize]).with_context(|| format!("interface {index}"))
}

/// A NETLINK_ROUTE socket that gives up on a reply after two seconds.
fn route_socket() -> io::Result<OwnedFd> {
    let sock = crate::netlink::socket(libc::NETLINK_ROUTE, 0)?;
    let timeout = libc::timeval {
        tv_sec: 2,
        tv_usec: 0,
    };
    // SAFETY: setting SO_RCVTIMEO from a timeval of the given size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

const NLMSG_HDR: usize = size_of::<libc::nlmsghdr>();

/// One RTM_NEWLINK message, or the NLMSG_ERROR in its place.
fn parse_link_reply(msg: &[u8]) -> Result<Option<Link>> {
    let len = read_u32(msg, 0).context("short netlink reply")? as usize;
    let kind = read_u16(msg, 4).context("short netlink reply")?;
    let Some(body) = msg.get(NLMSG_HDR..len) else {
        bail!("netlink reply of {} bytes says it has {len}", msg.len());
    };
    if kind == libc::NLMSG_ERROR as u16 {
        let code = read_u32(body, 0).context("short netlink error")? as i32;
        if code == -libc::ENODEV {
            return Ok(None);
        }
        return Err(io::Error::from_raw_os_error(-code).into());
    }
    if kind != libc::RTM_NEWLINK {
        bail!("unexpected netlink message type {kind}");
    }
    let index = read_u32(body, 4).context("short link message")?;
    let attrs = body
        .get(size_of::<IfInfoMsg>()..)
        .context("short link message")?;
    let mut link = Link {
        index,
        name: String::new(),
        kind: None,
        link: None,
        master: None,
    };
    for (kind, value) in attributes(attrs) {
        match kind {
            libc::IFLA_IFNAME => link.name = c_string(value),
            libc::IFLA_LINK => link.link = read_u32(value, 0),
            libc::IFLA_MASTER => link.master = read_u32(value, 0),
            libc::IFLA_LINKINFO => {
                link.kind = attributes(value)
                    .find(|(k, _)| *k == libc::IFLA_INFO_KIND)
                    .map(|(_, v)| c_string(v));
            }
            _ => {}
        }
    }
    Ok(Some(link))
}

/// The (type, value) pairs of a run of netlink attributes; stops at the
/// first one whose length does not fit.
fn attributes(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = usize::from(read_u16(buf, 0)?);
        let kind = read_u16(buf, 2)? & libc::NLA_TYPE_MASK as u16;
        let value = buf.get(4..len)?;
        buf = buf.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some((kind, value))
    })
}

fn c_string(value: &[u8]) -> String {
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}

fn read_u16(buf: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(buf.get(at..at + 2)?.try_into().ok()?))
}

fn read_u32(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let len = 4 + value.len();
        let mut out = Vec::new();
        out.extend((len as u16).to_ne_bytes());
        out.extend(kind.to_ne_bytes());
        out.extend(value);
        out.resize(len.next_multiple_of(4), 0);
        out
    }

    fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(((NLMSG_HDR + body.len()) as u32).to_ne_bytes());
        out.extend(kind.to_ne_bytes());
        out.extend([0u8; 10]);
        out.extend(body);
        out
    }

    fn link_message(index: u32, attrs: &[Vec<u8>]) -> Vec<u8> {
        let mut body = vec![0u8; 4];
        body.extend(index.to_ne_bytes());
        body.extend([0u8; 8]);
        body.extend(attrs.concat());
        message(libc::RTM_NEWLINK, &body)
    }

    #[test]
    fn parses_a_veth_link_reply() {
        let info = attr(libc::IFLA_INFO_KIND, b"veth\0");
        let msg = link_message(
            2,
            &[
                attr(libc::IFLA_IFNAME, b"eth0\0"),
                attr(libc::IFLA_MTU, &1500u32.to_ne_bytes()),
                attr(libc::IFLA_LINK, &17u32.to_ne_bytes()),
                attr(libc::IFLA_LINKINFO | 0x8000, &info),
            ],
        );
        let link = parse_link_reply(&msg).unwrap().unwrap();
        assert_eq!(
            link,
            Link {
                index: 2,
                name: "eth0".into(),
                kind: Some("veth".into()),
                link: Some(17),
                master: None,
            }
        );
        assert_eq!(link.veth_peer(), Some(17));
    }

    #[test]
    fn a_bridge_port_names_its_master() {
        let msg = link_message(
            9,
            &[
                attr(libc::IFLA_IFNAME, b"veth1234abcd\0"),
                attr(libc::IFLA_MASTER, &3u32.to_ne_bytes()),
            ],
        );
        assert_eq!(parse_link_reply(&msg).unwrap().unwrap().master, Some(3));
        assert_eq!(attachment(None).unwrap(), Attachment::Routed);
    }

    #[test]
    fn only_a_veth_has_a_peer() {
        let msg = link_message(
            3,
            &[
                attr(libc::IFLA_IFNAME, b"eth0\0"),
                attr(libc::IFLA_LINK, &4u32.to_ne_bytes()),
                attr(
                    libc::IFLA_LINKINFO,
                    &attr(libc::IFLA_INFO_KIND, b"ipvlan\0"),
                ),
            ],
        );
        assert_eq!(parse_link_reply(&msg).unwrap().unwrap().veth_peer(), None);
    }

    #[test]
    fn no_such_device_is_none_and_other_errors_fail() {
        let enodev = message(libc::NLMSG_ERROR as u16, &(-libc::ENODEV).to_ne_bytes());
        assert_eq!(parse_link_reply(&enodev).unwrap(), None);
        let eperm = message(libc::NLMSG_ERROR as u16, &(-libc::EPERM).to_ne_bytes());
        assert!(parse_link_reply(&eperm).is_err());
    }

    #[test]
    fn damaged_replies_fail_or_stop_without_panicking() {
        let good = link_message(2, &[attr(libc::IFLA_IFNAME, b"eth0\0")]);
        for cut in 0..good.len() {
            let _ = parse_link_reply(&good[..cut]);
        }
        assert!(parse_link_reply(&good[..10]).is_err());
        // An attribute claiming more than there is ends the list.
        let mut bad = attr(libc::IFLA_IFNAME, b"eth0\0");
        bad[0] = 200;
        let msg = link_message(2, &[bad]);
        assert_eq!(parse_link_reply(&msg).unwrap().unwrap().name, "");
        assert_eq!(attributes(&[4, 0]).count(), 0);
        assert_eq!(
            attributes(&[2, 0, 1, 0]).count(),
            0,
            "length below the header"
        );
    }

    #[test]
    fn loopback_is_interface_one_of_our_namespace() {
        let lo = get_link(1).unwrap().unwrap();
        assert_eq!(lo.name, "lo");
        assert_eq!(lo.veth_peer(), None);
        assert_eq!(get_link(i32::MAX as u32).unwrap(), None);
    }

    #[test]
    fn inspects_our_own_namespace() {
        let ours = format!("/proc/{}/ns/net", std::process::id());
        let net = inspect(Path::new(&ours), None).unwrap();
        assert_eq!(net.netns_inode, netns::inode(None).unwrap());
        assert!(net
            .ips
            .iter()
            .all(|ip| !ip.is_loopback() && !is_ipv6_link_local(*ip)));
        assert!(
            net.ips.windows(2).all(|w| w[0] < w[1]),
            "sorted, no repeats"
        );
    }

    /// dnsmasq as the lab's CoreDNS binds 0.0.0.0:53 and its pod address;
    /// a stub of the pod's own binds loopback only. Words as a
    /// little-endian host prints them.
    #[cfg(target_endian = "little")]
    #[test]
    fn a_resolver_is_a_udp_socket_on_port_53_off_loopback() {
        let head = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n";
        let row = |local: &str| {
            format!("{head}  1: {local} 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0000000000000000 0\n")
        };
        assert!(binds_dns(&row("00000000:0035")));
        assert!(binds_dns(&row("3500F40A:0035")), "10.244.0.53:53");
        assert!(!binds_dns(&row("0100007F:0035")), "127.0.0.1:53");
        assert!(!binds_dns(&row("3500007F:0035")), "127.0.0.53:53");
        assert!(!binds_dns(&row("3500F40A:14E9")), "port 5353");
        assert!(!binds_dns(head));
        assert!(
            binds_dns(&row("00000000000000000000000000000000:0035")),
            "[::]:53"
        );
        assert!(
            !binds_dns(&row("00000000000000000000000001000000:0035")),
            "[::1]:53"
        );
        assert_eq!(
            proc_net_ip("0000FEFD000000000000000011000000"),
            Some("fdfe::11".parse().unwrap())
        );
    }
}
