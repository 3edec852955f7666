//! The devices legs were seen at, each kept once.
use std::sync::Arc;

use super::table::Map;
use crate::decode::{NodeId, Packet};

/// Devices kept before the table is first compacted.
pub(super) const DEVICES_LIMIT: usize = 4096;

/// Where legs are seen: shared, as thousands of open journeys pass the
/// same few devices.
pub(super) struct Device {
    pub(super) node: NodeId,
    pub(super) netns: u32,
    pub(super) ifindex: u32,
    pub(super) name: Option<Arc<str>>,
}

/// The devices legs were seen at, each kept once and known to legs by a
/// 2-byte id. Devices are few (a node's, in every namespace) but pods come
/// and go: when the table fills, it keeps only what open legs use.
pub(super) struct Devices {
    pub(super) list: Vec<Device>,
    /// The latest id of each (node, netns, ifindex).
    ids: Map<(NodeId, u32, u32), u16>,
    /// Compacted when `list` reaches this; doubled, up to 65,536, when
    /// compacting frees less than half.
    limit: usize,
}

impl Device {
    /// Its network namespace, on its node: namespaces of two nodes are
    /// never the same, whatever their numbers.
    pub(super) fn ns(&self) -> (NodeId, u32) {
        (self.node, self.netns)
    }
}

impl Devices {
    pub(super) fn new() -> Self {
        Self {
            list: Vec::new(),
            ids: Map::default(),
            limit: DEVICES_LIMIT,
        }
    }

    pub(super) fn get(&self, id: u16) -> &Device {
        &self.list[usize::from(id)]
    }

    /// The id of the device `p` was seen at, if it is known.
    pub(super) fn find(&self, p: &Packet) -> Option<u16> {
        let id = *self.ids.get(&(p.node, p.netns, p.ifindex))?;
        (self.get(id).name.as_deref() == p.ifname.as_deref()).then_some(id)
    }

    pub(super) fn full(&self) -> bool {
        self.list.len() >= self.limit
    }

    /// Files the device `p` was seen at; there must be room.
    pub(super) fn add(&mut self, p: &Packet) -> u16 {
        let id = u16::try_from(self.list.len()).expect("compacted before 65,536");
        self.list.push(Device {
            node: p.node,
            netns: p.netns,
            ifindex: p.ifindex,
            name: p.ifname.as_deref().map(Arc::from),
        });
        self.ids.insert((p.node, p.netns, p.ifindex), id);
        id
    }

    /// Keeps the devices `used` marks, in order; returns each old id's new
    /// one.
    pub(super) fn compact(&mut self, used: &[bool]) -> Vec<u16> {
        let mut new_id = vec![0; self.list.len()];
        let mut kept = 0;
        let list = std::mem::take(&mut self.list);
        self.ids.clear();
        for (old, d) in list.into_iter().enumerate() {
            if used[old] {
                new_id[old] = kept;
                self.ids.insert((d.node, d.netns, d.ifindex), kept);
                self.list.push(d);
                kept += 1;
            }
        }
        if self.list.len() * 2 > self.limit {
            self.limit = (self.limit * 2).min(1 << 16);
        }
        new_id
    }
}
