//! Legs' device columns, written once by device: a lookup's legs pass the
//! same few devices, and writing a device's name, index and namespace anew
//! for each leg was a fifth of a leg's text. Their addresses, likewise.
use std::sync::Arc;

use super::addr;
use crate::{correlate::Leg, decode::NodeId};

/// Each device has one spot, by its hash; the last device there keeps it.
/// What is written depends on the labels' node names: cleared when those
/// change. Its spots are made at its first use: a sink takes it out and
/// puts it back around each journey, leaving an empty one meanwhile.
#[derive(Default)]
pub(super) struct Places {
    spots: Vec<Option<Place>>,
    /// Addresses do not depend on the labels: never cleared.
    pub(super) addrs: addr::Texts,
}

struct Place {
    node: NodeId,
    netns: u32,
    ifindex: u32,
    iface: Option<Arc<str>>,
    text: Vec<u8>,
}

/// A power of two: a spot is the top bits of the key's hash.
const SPOTS: usize = 64;
const _: () = assert!(SPOTS.is_power_of_two());

impl Places {
    pub(super) fn clear(&mut self) {
        self.spots.fill_with(|| None);
    }

    /// What `write` writes of `leg`'s device, kept from the last leg there;
    /// nothing kept if it fails.
    pub(super) fn write<E>(
        &mut self,
        out: &mut Vec<u8>,
        leg: &Leg,
        write: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.spots.is_empty() {
            self.spots.resize_with(SPOTS, || None);
        }
        // Fibonacci hashing: pods' namespaces differ in their low bits,
        // and each has its own eth0 of the same index.
        let key = leg.netns ^ leg.ifindex << 16 ^ u32::from(leg.node.0) << 8;
        let at = key.wrapping_mul(0x9e37_79b9) >> (u32::BITS - SPOTS.ilog2());
        let spot = &mut self.spots[at as usize];
        let same = spot.as_ref().is_some_and(|p| {
            p.node == leg.node
                && p.netns == leg.netns
                && p.ifindex == leg.ifindex
                && same_iface(&p.iface, &leg.iface)
        });
        if !same {
            let mut text = Vec::new();
            write(&mut text)?;
            *spot = Some(Place {
                node: leg.node,
                netns: leg.netns,
                ifindex: leg.ifindex,
                iface: leg.iface.clone(),
                text,
            });
        }
        if let Some(p) = spot {
            out.extend_from_slice(&p.text);
        }
        Ok(())
    }
}

/// Legs share their device's name: the pointers compared before the text.
fn same_iface(a: &Option<Arc<str>>, b: &Option<Arc<str>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        (a, b) => a.is_none() && b.is_none(),
    }
}
