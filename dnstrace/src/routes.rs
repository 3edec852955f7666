//! Where the node sends what leaves it for elsewhere: its routes through a
//! gateway and, over a VXLAN device (flannel's `flannel.1`), the node whose
//! VTEP that gateway is, as its neighbour and FDB entries say. Read once,
//! when tracing starts: destinations are not known ahead, so every such
//! route is kept, a handful on a node.
use std::{net::IpAddr, os::fd::AsFd, path::Path};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use crate::{
    netlink::{attrs, dump, socket},
    netns::in_netns,
};

/// The node's routes through a gateway.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Routes(Vec<Route>);

/// `dst/len via gateway dev dev`, and over VXLAN the remote node behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: IpAddr,
    pub len: u8,
    pub gateway: IpAddr,
    pub dev: String,
    /// Over a VXLAN device: the underlay address its FDB sends the
    /// gateway's MAC to, the node that gateway stands for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<IpAddr>,
}

impl Routes {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The route `ip` takes: the longest prefix holding it.
    pub fn toward(&self, ip: IpAddr) -> Option<&Route> {
        self.0
            .iter()
            .filter(|r| holds(r.dst, r.len, ip))
            .max_by_key(|r| r.len)
    }
}

impl FromIterator<Route> for Routes {
    fn from_iter<I: IntoIterator<Item = Route>>(routes: I) -> Self {
        Self(routes.into_iter().collect())
    }
}

fn holds(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    let bits = |a: IpAddr| match a {
        IpAddr::V4(a) => (u128::from(u32::from(a)) << 96, 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    };
    let ((n, width), (i, other)) = (bits(net), bits(ip));
    if width != other || len > width {
        return false;
    }
    let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
    n & mask == i & mask
}

/// The routes of the namespace `netns` (this one for none).
pub fn read(netns: Option<&Path>) -> Result<Routes> {
    in_netns(netns, || {
        let sock = socket(libc::NETLINK_ROUTE, 0).context("netlink socket")?;
        let each = |kind, family: &[u8]| dump(sock.as_fd(), kind, family);
        let ifinfo = [0u8; 16];
        let bridge = [libc::AF_BRIDGE as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let links = each(libc::RTM_GETLINK, &ifinfo).context("dumping links")?;
        let routes = each(libc::RTM_GETROUTE, &[0; 12]).context("dumping routes")?;
        let neighs = each(libc::RTM_GETNEIGH, &[0; 12]).context("dumping neighbours")?;
        let fdb = each(libc::RTM_GETNEIGH, &bridge).context("dumping the FDB")?;
        Ok(resolve(
            &routes.iter().filter_map(|m| route(m)).collect::<Vec<_>>(),
            &links.iter().filter_map(|m| link(m)).collect::<Vec<_>>(),
            &neighs.iter().filter_map(|m| neigh(m)).collect::<Vec<_>>(),
            &fdb.iter().filter_map(|m| neigh(m)).collect::<Vec<_>>(),
        ))
    })
}

/// A route of the main table through a gateway, as dumped.
#[derive(Debug, PartialEq)]
struct Via {
    dst: IpAddr,
    len: u8,
    gateway: IpAddr,
    oif: i32,
}

#[derive(Debug, PartialEq)]
struct Link {
    index: i32,
    name: String,
    vxlan: bool,
}

/// A neighbour entry (an address's MAC), or an FDB entry (a MAC's
/// underlay address), on device `ifindex`.
#[derive(Debug, PartialEq)]
struct Neigh {
    ifindex: i32,
    ip: Option<IpAddr>,
    mac: Option<Vec<u8>>,
}

/// Each gateway route with its device's name, and over VXLAN the node its
/// gateway's MAC is sent to; a VXLAN gateway without both entries is kept
/// as a plain gateway.
fn resolve(routes: &[Via], links: &[Link], neighs: &[Neigh], fdb: &[Neigh]) -> Routes {
    let remote = |r: &Via| {
        let mac = neighs
            .iter()
            .find(|n| n.ifindex == r.oif && n.ip == Some(r.gateway))?
            .mac
            .as_ref()?;
        fdb.iter()
            .find(|f| f.ifindex == r.oif && f.mac.as_ref() == Some(mac))?
            .ip
    };
    let routes = routes.iter().filter_map(|r| {
        let dev = links.iter().find(|l| l.index == r.oif)?;
        Some(Route {
            dst: r.dst,
            len: r.len,
            gateway: r.gateway,
            dev: dev.name.clone(),
            node: dev.vxlan.then(|| remote(r)).flatten(),
        })
    });
    routes.collect()
}

const HDR: usize = 16;
const RT_TABLE_MAIN: u32 = 254;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_TABLE: u16 = 15;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;

fn ip(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(b).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(b).ok()?)),
        _ => None,
    }
}

fn i32_at(msg: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_ne_bytes(msg.get(at..at + 4)?.try_into().ok()?))
}

/// `rtmsg`: family, dst_len, src_len, tos, table, protocol, scope, type,
/// flags; then attributes. A unicast route of the main table with a
/// gateway and a device.
fn route(msg: &[u8]) -> Option<Via> {
    let head = msg.get(HDR..HDR + 12)?;
    if head[7] != libc::RTN_UNICAST {
        return None;
    }
    let (mut table, mut dst, mut gateway, mut oif) = (u32::from(head[4]), None, None, None);
    for (kind, v) in attrs(&msg[HDR + 12..]).map_while(Result::ok) {
        match kind {
            RTA_DST => dst = ip(v),
            RTA_GATEWAY => gateway = ip(v),
            RTA_OIF => oif = i32_at(v, 0),
            RTA_TABLE => table = u32::from_ne_bytes(v.try_into().ok()?),
            _ => {}
        }
    }
    let gateway = gateway?;
    let unspecified = match gateway {
        IpAddr::V4(_) => IpAddr::from([0u8; 4]),
        IpAddr::V6(_) => IpAddr::from([0u8; 16]),
    };
    (table == RT_TABLE_MAIN).then_some(Via {
        dst: dst.unwrap_or(unspecified),
        len: head[1],
        gateway,
        oif: oif?,
    })
}

/// `ifinfomsg`, then attributes: the name, and whether it is VXLAN.
fn link(msg: &[u8]) -> Option<Link> {
    let index = i32_at(msg, HDR + 4)?;
    let (mut name, mut vxlan) = (None, false);
    for (kind, v) in attrs(msg.get(HDR + 16..)?).map_while(Result::ok) {
        match kind {
            IFLA_IFNAME => name = Some(text(v)),
            IFLA_LINKINFO => {
                vxlan = attrs(v)
                    .map_while(Result::ok)
                    .any(|(k, v)| k == IFLA_INFO_KIND && text(v) == "vxlan");
            }
            _ => {}
        }
    }
    Some(Link {
        index,
        name: name?,
        vxlan,
    })
}

fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v).trim_end_matches('\0').to_owned()
}

/// `ndmsg`: family, pads, ifindex, state, flags, type; then attributes.
fn neigh(msg: &[u8]) -> Option<Neigh> {
    let ifindex = i32_at(msg, HDR + 4)?;
    let (mut ip_, mut mac) = (None, None);
    for (kind, v) in attrs(msg.get(HDR + 12..)?).map_while(Result::ok) {
        match kind {
            NDA_DST => ip_ = ip(v),
            NDA_LLADDR => mac = Some(v.to_vec()),
            _ => {}
        }
    }
    Some(Neigh {
        ifindex,
        ip: ip_,
        mac,
    })
}

#[cfg(test)]
mod tests;
