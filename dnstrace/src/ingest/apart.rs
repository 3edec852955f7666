//! TCP payloads the tracepoints sent apart, on a perf buffer per CPU
//! (`bpf_skb_output`, the one helper they have that reads an skb's pages),
//! put back into the ring events that name them: downstream, an event is
//! whole as if the ring had carried it all.
use std::{collections::HashMap, mem::offset_of, ops::ControlFlow};

use aya::maps::{
    perf::{PerfEvent, PerfEventArray, PerfEventArrayBuffer},
    MapData,
};
use dnstrace_common::{
    wire_offset, ApartHead, PacketMeta, APART_HEAD_SIZE, APART_MAX, FLAG_PAYLOAD_APART,
    FLAG_TRUNCATED,
};

/// Pages of each CPU's perf buffer: room for a few of the largest payloads
/// the reader has not taken yet.
const PAGES: usize = 64;

/// Payloads read from the perf buffers before their ring events.
pub struct Apart {
    /// Each online CPU's buffer, by CPU id.
    buffers: HashMap<u32, PerfEventArrayBuffer<MapData>>,
    /// By (CPU, sequence): the payload's bytes. A payload the kernel could
    /// not write (its buffer full) is missing here: its event stays cut.
    pending: HashMap<(u32, u32), Vec<u8>>,
}

impl Apart {
    pub fn open(mut array: PerfEventArray<MapData>) -> anyhow::Result<Self> {
        let cpus =
            aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("reading {what}: {e}"))?;
        let mut buffers = HashMap::new();
        for cpu in cpus {
            buffers.insert(cpu, array.open(cpu, Some(PAGES))?);
        }
        Ok(Self {
            buffers,
            pending: HashMap::new(),
        })
    }

    /// Writes `record` into `out` with the payload it sent apart in place
    /// of what the ring carried; false (and `out` untouched) if it sent
    /// none, or the payload is not to be found.
    pub fn splice(&mut self, record: &[u8], out: &mut Vec<u8>) -> bool {
        let Some(meta) = apart_meta(record) else {
            return false;
        };
        let Some(payload) = self.take(u32::from(meta.cpu), meta.apart_seq) else {
            return false;
        };
        write_whole(meta, &payload, out);
        true
    }

    /// The payload under (`cpu`, `seq`), draining that CPU's buffer if it
    /// is not read yet. Payloads of the CPU before `seq` are forgotten:
    /// events come from one CPU in its order, so theirs were lost.
    fn take(&mut self, cpu: u32, seq: u32) -> Option<Vec<u8>> {
        if !self.pending.contains_key(&(cpu, seq)) {
            self.drain(cpu);
        }
        let payload = self.pending.remove(&(cpu, seq));
        self.pending
            .retain(|&(c, s), _| c != cpu || (s.wrapping_sub(seq) as i32) > 0);
        payload
    }

    fn drain(&mut self, cpu: u32) {
        let Some(buffer) = self.buffers.get_mut(&cpu) else {
            return;
        };
        let pending = &mut self.pending;
        let _ = buffer.try_fold((), |(), event| {
            if let PerfEvent::Sample { head, tail } = event {
                if let Some((key, payload)) = sample(head, tail) {
                    pending.insert(key, payload);
                }
            }
            ControlFlow::<(), ()>::Continue(())
        });
    }
}

/// The meta of a packet event that sent its payload apart.
fn apart_meta(record: &[u8]) -> Option<PacketMeta> {
    let flags = *record.get(wire_offset(offset_of!(PacketMeta, flags)))?;
    if flags & FLAG_PAYLOAD_APART == 0 {
        return None;
    }
    dnstrace_common::decode_packet(record)
        .ok()
        .map(|(meta, _)| meta)
}

/// A sample's key and payload: the bytes from `start` to `len` after the
/// head (the rest is the skb's headers, and the kernel's padding).
fn sample(head: &[u8], tail: &[u8]) -> Option<((u32, u32), Vec<u8>)> {
    let bytes: Vec<u8> = head.iter().chain(tail).copied().collect();
    let (h, skb) = bytes.split_at_checked(APART_HEAD_SIZE)?;
    // SAFETY: APART_HEAD_SIZE plain bytes, read unaligned into a plain struct.
    let h: ApartHead = unsafe { std::ptr::read_unaligned(h.as_ptr().cast()) };
    let payload = skb.get(h.start as usize..h.len as usize)?;
    Some((
        (h.cpu, h.seq),
        payload[..payload.len().min(APART_MAX)].to_vec(),
    ))
}

/// The event `meta` with `payload` after it, as the ring would carry it.
fn write_whole(mut meta: PacketMeta, payload: &[u8], out: &mut Vec<u8>) {
    meta.flags &= !(FLAG_PAYLOAD_APART | FLAG_TRUNCATED);
    if (payload.len() as u32) < meta.payload_len {
        meta.flags |= FLAG_TRUNCATED;
    }
    out.clear();
    dnstrace_common::encode_packet(meta, payload, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use dnstrace_common::{EventHeader, EventKind, SCHEMA_VERSION};

    fn meta(payload_len: u32, cap: &[u8]) -> Vec<u8> {
        // SAFETY: plain integers, for which zero is valid.
        let mut m: PacketMeta = unsafe { std::mem::zeroed() };
        m.header = EventHeader {
            kind: EventKind::Packet as u16,
            version: SCHEMA_VERSION,
            size: 0,
        };
        m.payload_len = payload_len;
        m.flags = FLAG_PAYLOAD_APART | FLAG_TRUNCATED;
        m.cpu = 1;
        m.apart_seq = 7;
        let mut out = Vec::new();
        dnstrace_common::encode_packet(m, cap, &mut out);
        out
    }

    fn head(seq: u32, start: u32, len: u32) -> Vec<u8> {
        let h = ApartHead {
            seq,
            cpu: 1,
            start,
            len,
        };
        // SAFETY: reading the bytes of a plain-data struct.
        unsafe { std::slice::from_raw_parts((&raw const h).cast::<u8>(), APART_HEAD_SIZE) }.to_vec()
    }

    #[test]
    fn a_sample_gives_the_payload_after_the_headers_and_not_the_padding() {
        let mut s = head(7, 3, 6);
        s.extend_from_slice(b"hdrabc\0\0");
        let (at, tail) = s.split_at(10);
        assert_eq!(sample(at, tail), Some(((1, 7), b"abc".to_vec())));
        let mut bad = head(7, 3, 60);
        bad.extend_from_slice(b"hdrabc");
        assert_eq!(sample(&bad, &[]), None);
    }

    #[test]
    fn the_spliced_event_is_whole_with_the_payload_in_place() {
        let record = meta(3, b"");
        let mut out = Vec::new();
        write_whole(apart_meta(&record).unwrap(), b"abc", &mut out);
        let (m, payload) = dnstrace_common::decode_packet(&out).unwrap();
        assert_eq!(payload, b"abc");
        assert_eq!(m.flags & (FLAG_PAYLOAD_APART | FLAG_TRUNCATED), 0);
        let record = meta(5, b"");
        write_whole(apart_meta(&record).unwrap(), b"abc", &mut out);
        let (m, _) = dnstrace_common::decode_packet(&out).unwrap();
        assert_ne!(m.flags & FLAG_TRUNCATED, 0, "3 of 5 bytes is still cut");
    }

    #[test]
    fn an_event_that_sent_nothing_apart_is_left_alone() {
        let mut record = meta(3, b"abc");
        record[wire_offset(offset_of!(PacketMeta, flags))] = FLAG_TRUNCATED;
        assert!(apart_meta(&record).is_none());
    }
}
