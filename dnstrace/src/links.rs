//! What happens to the node's interfaces while tracing: a veth that goes
//! away or appears (a pod deleted, restarted or started) is said, so that a
//! gap in the journeys has its explanation next to it.
use std::{io, path::Path};

use anyhow::{Context as _, Result};

use crate::netlink::{attrs, Subscription};

const RTMGRP_LINK: u32 = 1;
const IFLA_IFNAME: u16 = 3;
/// The header, then `ifinfomsg`: family, pad, type, index, flags, change.
const IFINFO_END: usize = 16 + 16;

pub struct LinkWatch {
    sub: Subscription,
}

impl LinkWatch {
    pub fn open(netns: Option<&Path>) -> Result<Self> {
        let sub = Subscription::open(netns, libc::NETLINK_ROUTE, RTMGRP_LINK, 1 << 20)
            .context("subscribing to link changes")?;
        Ok(Self { sub })
    }

    /// Waits for link changes; returns a line for each link that appeared
    /// or went away.
    pub async fn next(&mut self) -> io::Result<Vec<String>> {
        let mut said = Vec::new();
        self.sub.next(|msg| said.extend(change(msg))).await?;
        Ok(said)
    }
}

/// `interface veth1 (ifindex 7) appeared`, for a new or a removed link.
fn change(msg: &[u8]) -> Option<String> {
    let kind = u16::from_ne_bytes(msg.get(4..6)?.try_into().ok()?);
    let index = i32::from_ne_bytes(msg.get(20..24)?.try_into().ok()?);
    // The kernel sets every change bit when it announces a new device.
    let change = u32::from_ne_bytes(msg.get(28..32)?.try_into().ok()?);
    let what = match kind {
        libc::RTM_NEWLINK if change == u32::MAX => "appeared",
        libc::RTM_DELLINK => "went away",
        _ => return None,
    };
    let name = attrs(msg.get(IFINFO_END..)?)
        .filter_map(Result::ok)
        .find(|(k, _)| *k == IFLA_IFNAME)
        .map(|(_, v)| String::from_utf8_lossy(v).trim_end_matches('\0').to_owned())?;
    Some(format!("interface {name} (ifindex {index}) {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, change: u32, name: &str) -> Vec<u8> {
        let mut m = vec![0u8; IFINFO_END];
        m[4..6].copy_from_slice(&kind.to_ne_bytes());
        m[20..24].copy_from_slice(&7i32.to_ne_bytes());
        m[28..32].copy_from_slice(&change.to_ne_bytes());
        let attr_len = 4 + name.len() + 1;
        m.extend((attr_len as u16).to_ne_bytes());
        m.extend(IFLA_IFNAME.to_ne_bytes());
        m.extend(name.as_bytes());
        m.push(0);
        m.resize(m.len().next_multiple_of(4), 0);
        let len = m.len() as u32;
        m[..4].copy_from_slice(&len.to_ne_bytes());
        m
    }

    #[test]
    fn new_and_removed_links_are_said_state_changes_are_not() {
        let new = message(libc::RTM_NEWLINK, u32::MAX, "veth1");
        assert_eq!(
            change(&new).as_deref(),
            Some("interface veth1 (ifindex 7) appeared")
        );
        let gone = message(libc::RTM_DELLINK, 0, "veth1");
        assert_eq!(
            change(&gone).as_deref(),
            Some("interface veth1 (ifindex 7) went away")
        );
        assert_eq!(change(&message(libc::RTM_NEWLINK, 1, "veth1")), None);
        for cut in 0..new.len() {
            let _ = change(&new[..cut]);
        }
    }
}
