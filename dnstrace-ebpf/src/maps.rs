//! Maps and globals shared by all programs, and sending an event.
use crate::{
    atomic,
    debug::{skip, Why},
};
use aya_ebpf::{
    bindings::{
        bpf_dynptr, BPF_F_CURRENT_CPU, BPF_F_NO_PREALLOC, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP,
        BPF_RB_NO_WAKEUP,
    },
    helpers::{
        bpf_get_smp_processor_id, bpf_ktime_get_ns,
        generated::{
            bpf_dynptr_write, bpf_ringbuf_discard_dynptr, bpf_ringbuf_output,
            bpf_ringbuf_reserve_dynptr, bpf_ringbuf_submit_dynptr, bpf_skb_output,
        },
    },
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerfEventArray, RingBuf},
};
use dnstrace_common::{
    port_slot, sample, wakes_reader, ApartHead, EventHeader, EventKind, IfaceConfig, KernelOffsets,
    PacketMeta, SampleLevel, TargetFilter, APART_HEAD_SIZE, COUNTERS, COUNT_APART_LOST, COUNT_LOST,
    COUNT_SHED, CT_SPAN_MAX, FLAG_CONNTRACK, FLAG_PAYLOAD_APART, L2_LEN_MIXED, MAX_SCOPE,
    MAX_VIEWED, MAX_VIEWED_LABELS, MAX_WATCHED, PACKET_FIXED_AT, PACKET_FIXED_SIZE,
    PACKET_META_SIZE, PAYLOAD_MAX, PORT_WORDS, ROLE_RESOLVER, ROLE_TARGET, SCHEMA_VERSION,
    SECTIONS, SECTION_NAME, VIEWED_LABEL_NS,
};

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(4 << 20, 0);

/// Set by user space before loading: the step of backlog, in bytes (a
/// power of two), past each multiple of which an event wakes the reader
/// (`wakes_reader`). Below it the reader drains on its own clock. 1 wakes
/// it for every event.
#[unsafe(no_mangle)]
static WAKE_BYTES: u64 = 1;

/// Per CPU: ring buffer reservations that failed (`COUNT_LOST`), and
/// packets the sampling level left out (`COUNT_SHED`).
#[map]
static COUNTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTERS, 0);

/// The sampling level, set by user space while tracing (all kept at 0).
#[map]
static SAMPLE: Array<SampleLevel> = Array::with_max_entries(1, 0);

/// A DNS datagram's first fragment's ports, by (source, destination, id),
/// for its later fragments, which carry none.
#[map]
static FRAGMENTS: LruHashMap<FragmentKey, [u16; 2]> = LruHashMap::with_max_entries(4096, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct FragmentKey {
    saddr: [u32; 4],
    daddr: [u32; 4],
    id: u32,
}

#[inline(always)]
pub fn remember_fragment(saddr: &[u32; 4], daddr: &[u32; 4], id: u32, ports: [u16; 2]) {
    let key = FragmentKey {
        saddr: *saddr,
        daddr: *daddr,
        id,
    };
    let _ = FRAGMENTS.insert(key, ports, 0);
}

#[inline(always)]
pub fn fragment_ports(saddr: &[u32; 4], daddr: &[u32; 4], id: u32) -> Option<[u16; 2]> {
    let key = FragmentKey {
        saddr: *saddr,
        daddr: *daddr,
        id,
    };
    // SAFETY: map lookup; the value is copied out.
    unsafe { FRAGMENTS.get(key) }.copied()
}

/// TCP payloads held in an skb's pages, with an `ApartHead` each, for the
/// ring event that names them (`FLAG_PAYLOAD_APART`).
#[map]
static PAYLOADS: PerfEventArray<ApartHead> = PerfEventArray::new(0);

/// Per CPU: the sequence number of the last payload sent apart.
#[map]
static APART_SEQ: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

#[map]
static PORTS: Array<u32> = Array::with_max_entries(PORT_WORDS, 0);

#[map]
static IFACES: HashMap<u32, IfaceConfig> = HashMap::with_max_entries(1024, BPF_F_NO_PREALLOC);

/// Set by user space before loading: the link-layer header length of every
/// --iface interface, or `L2_LEN_MIXED`.
#[unsafe(no_mangle)]
static TC_L2_LEN: u32 = L2_LEN_MIXED;

#[inline(always)]
pub fn tc_l2_len() -> u32 {
    // SAFETY: a global user space patches before load (see `offsets`).
    unsafe { core::ptr::read_volatile(&TC_L2_LEN) }
}

/// What user space told of interface `ifindex`, if it is one of --iface.
#[inline(always)]
pub fn iface(ifindex: u32) -> Option<IfaceConfig> {
    // SAFETY: map lookup; the value is copied out.
    unsafe { IFACES.get(ifindex) }.copied()
}

/// Addresses of the traced target and its resolvers: `ROLE_*` bits. Keyed
/// by the address's bytes, as words so that a key is copied a word at a time.
#[map]
static WATCHED: HashMap<[u32; 4], u8> = HashMap::with_max_entries(MAX_WATCHED, 0);

/// Set by user space before loading when tracing one target.
#[unsafe(no_mangle)]
static FILTER: TargetFilter = TargetFilter::OFF;

/// Inode of the target's network namespace: everything seen there is kept
/// (loopback nameservers included). 0 for none. A map, not a global: a
/// pod re-created while tracing is followed into its new namespace.
#[map]
static TARGET_NETNS: Array<u32> = Array::with_max_entries(1, 0);

#[inline(always)]
fn role(addr: &[u8; 16]) -> u8 {
    // SAFETY: every address in the meta is 4-byte aligned (asserted in
    // dnstrace-common); 16 plain bytes either way.
    let key = unsafe { (&raw const *addr).cast::<[u32; 4]>().read() };
    // SAFETY: map lookup; the value is copied out.
    unsafe { WATCHED.get(key) }.copied().unwrap_or(0)
}

/// Is this packet part of the target's journeys? Everything is when no
/// target is set.
#[inline(always)]
pub fn wanted(m: &PacketMeta) -> bool {
    // SAFETY: a global user space patches before load (see `offsets`).
    if !filtered() {
        return true;
    }
    let netns = TARGET_NETNS.get(0).copied().unwrap_or(0);
    if netns != 0 && m.netns == netns {
        return true;
    }
    let (src, dst) = (role(&m.saddr), role(&m.daddr));
    if (src | dst) & ROLE_TARGET != 0 {
        return true;
    }
    // A resolver's own queries upstream and their answers.
    if (src & ROLE_RESOLVER != 0 && is_dns_port(m.dport))
        || (dst & ROLE_RESOLVER != 0 && is_dns_port(m.sport))
    {
        return true;
    }
    // Past a NAT the addresses are others'; the entry keeps the original.
    if m.flags & FLAG_CONNTRACK == 0 {
        return false;
    }
    let origin = role(&m.ct.original.src);
    origin & ROLE_TARGET != 0 || (origin & ROLE_RESOLVER != 0 && is_dns_port(m.ct.original.dport))
}

/// Set by user space before loading: 1 when this instance is one node of
/// several on this kernel (`--node`).
#[unsafe(no_mangle)]
static SCOPED: u32 = 0;

/// The node's network namespaces (inodes), with `SCOPED`: its own and its
/// pods', changed by user space as pods come and go.
#[map]
static SCOPE: HashMap<u32, u8> = HashMap::with_max_entries(MAX_SCOPE, 0);

/// Whether only one node's namespaces are traced.
#[inline(always)]
pub fn scoped() -> bool {
    // SAFETY: a global user space patches before load (see `offsets`).
    unsafe { core::ptr::read_volatile(&SCOPED) != 0 }
}

/// Whether a packet in network namespace `netns` belongs to the node
/// traced, when `scoped`. So is one on an interface whose namespace is not
/// known (0), as it may be the node's own; the device hooks rule 0 out
/// themselves (`skb::on_this_node`).
#[inline(always)]
pub fn in_scope(netns: u32) -> bool {
    netns == 0 || SCOPE.get_ptr(netns).is_some()
}

/// Set by user space from the running kernel's BTF before loading.
#[unsafe(no_mangle)]
static OFFSETS: KernelOffsets = KernelOffsets::UNSET;

pub fn offsets() -> KernelOffsets {
    // SAFETY: a global that user space patches before load; volatile so the
    // compiler does not fold the zeros it was compiled with.
    unsafe { core::ptr::read_volatile(&OFFSETS) }
}

/// One field of `OFFSETS`, for paths that need only a few.
#[inline(always)]
pub fn offset(field: impl Fn(&KernelOffsets) -> &u32) -> u32 {
    // SAFETY: as in `offsets`.
    unsafe { core::ptr::read_volatile(field(&OFFSETS)) }
}

/// Room to assemble one event: too large for the 512-byte eBPF stack.
#[repr(C)]
pub struct Scratch {
    pub meta: PacketMeta,
    pub payload: [u8; PAYLOAD_MAX],
    /// A UDP payload's first bytes, read before the rest is (`skb::udp_head`).
    pub head: [u8; 32],
    /// A conntrack entry's tuples and status, as the kernel lays them out;
    /// in words, so that its fields are read a word at a time (`skb::at`).
    pub ct_span: [u64; CT_SPAN_MAX / 8],
    /// Lengths passed through memory (`Scratch::opaque`).
    pub lengths: [u32; 4],
}

// `send_whole` sends the fixed part, the name and the payload as one run.
const _: () = assert!(core::mem::offset_of!(Scratch, payload) == PACKET_META_SIZE);

/// The lengths `Scratch::opaque` passes through memory.
#[derive(Clone, Copy)]
pub enum Length {
    /// Where the payload starts, from the IP header.
    PayloadAt,
    /// The payload's length, as the headers say.
    Payload,
    /// Bytes of linear data from the IP header on.
    Linear,
    /// The packet's length on the wire.
    Wire,
}

impl Scratch {
    /// `v`, stored in this CPU's event and loaded back. The verifier keeps a
    /// length read from the packet exact (where a helper's size comes from
    /// it), so every way through the header parse (IPv4 or IPv6, each count
    /// of extension headers, fragments) left a different one: each was a
    /// state of its own, verified again to the end of the program. Loaded
    /// from a map, it is one unknown number on every path, and they merge:
    /// 134,492 instructions verified in `dns_dev_xmit` became 29,356, and
    /// its load 1.3 s of CPU 0.1 s.
    #[inline(always)]
    pub fn opaque(&mut self, which: Length, v: u32) -> u32 {
        let Some(p) = self.lengths.get_mut(which as usize) else {
            return v;
        };
        *p = v;
        // SAFETY: a field of this CPU's scratch event, just written.
        unsafe { core::ptr::read_volatile(p) }
    }
}

#[map]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's scratch event, cleared of the previous event's optional parts.
#[inline(always)]
pub fn scratch() -> Option<&'static mut Scratch> {
    let s = SCRATCH.get_ptr_mut(0)?;
    // SAFETY: per-CPU map value, used by one program run at a time on this CPU.
    let s = unsafe { &mut *s };
    s.meta.flags = 0;
    // Two word stores, volatile: LLVM merges plain ones with the next into
    // a call to a memset that stores a byte at a time.
    let name = (&raw mut s.meta.ifname).cast::<u64>();
    // SAFETY: `ifname` is 16 bytes, 8-byte aligned (asserted in dnstrace-common).
    unsafe {
        name.write_volatile(0);
        name.add(1).write_volatile(0);
    }
    s.meta.drop_reason = 0;
    s.meta.drop_location = 0;
    s.meta.ct.status = 0;
    s.meta.ct.ctinfo = 0;
    Some(s)
}

/// Wakes the reader only when this event takes the backlog past a
/// multiple of `WAKE_BYTES`, so a burst is read before the ring fills.
#[inline(always)]
fn wakeup(size: u64) -> u64 {
    // SAFETY: a global user space patches before load (see `offsets`).
    let at = unsafe { core::ptr::read_volatile(&WAKE_BYTES) };
    let queued = EVENTS.query(BPF_RB_AVAIL_DATA.into());
    if wakes_reader(queued, size, at) {
        BPF_RB_FORCE_WAKEUP.into()
    } else {
        BPF_RB_NO_WAKEUP.into()
    }
}

#[inline(always)]
pub fn is_dns_port(port: u16) -> bool {
    let (word, bit) = port_slot(port);
    PORTS.get(word).is_some_and(|w| w & bit != 0)
}

/// Whether the sampling level keeps the lookup of a UDP packet whose
/// payload starts with `head`, `valid` bytes of it the packet's (see
/// `dnstrace_common::sample`); always at level 0.
#[inline(always)]
pub fn sampled_in(head: &[u8; 32], valid: u32) -> bool {
    let Some(level) = SAMPLE.get(0).copied() else {
        return true;
    };
    if level.shift == 0 {
        return true;
    }
    let Some(name) = head[sample::QNAME_AT..].first_chunk::<{ sample::HEAD }>() else {
        return true;
    };
    level.keeps(sample::label_hash(
        name,
        (valid as usize).saturating_sub(sample::QNAME_AT),
    ))
}

/// Client addresses a cluster view follows whole (`dnstrace cluster`),
/// whatever the level, the budget and the windows; as WATCHED's keys.
#[map]
static VIEWED: HashMap<[u32; 4], u8> = HashMap::with_max_entries(MAX_VIEWED, 0);

/// How many addresses VIEWED holds: with none, no packet pays for a look.
#[map]
static VIEWING: Array<u32> = Array::with_max_entries(1, 0);

/// Label hashes of viewed lookups, and when a packet of theirs was last
/// seen: a resolver's queries upstream for them carry its own address.
#[map]
static VIEWED_LABELS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_VIEWED_LABELS, 0);

/// Whether a cluster view follows some addresses: the device hooks then
/// run between windows too, for their lookups.
#[inline(always)]
pub fn viewing() -> bool {
    VIEWING.get(0).is_some_and(|n| *n > 0)
}

/// Whether a cluster view follows the lookup of a UDP packet whose payload
/// starts with `head` (`valid` bytes of it the packet's): to or from a
/// viewed address, or of the label of one lately seen.
#[inline(always)]
pub fn viewed(m: &PacketMeta, head: &[u8; 32], valid: u32) -> bool {
    if !viewing() {
        return false;
    }
    let Some(name) = head[sample::QNAME_AT..].first_chunk::<{ sample::HEAD }>() else {
        return false;
    };
    let label = sample::label_hash(name, (valid as usize).saturating_sub(sample::QNAME_AT));
    // SAFETY: a helper with no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let by_address = |a: &[u8; 16]| {
        // SAFETY: as in `role`.
        let key = unsafe { (&raw const *a).cast::<[u32; 4]>().read() };
        VIEWED.get_ptr(key).is_some()
    };
    if by_address(&m.saddr) || by_address(&m.daddr) {
        let _ = VIEWED_LABELS.insert(label, now, 0);
        return true;
    }
    // SAFETY: map lookup; the value is copied out.
    unsafe { VIEWED_LABELS.get(label) }
        .is_some_and(|seen| now.saturating_sub(*seen) < VIEWED_LABEL_NS)
}

/// Whether the level follows nothing now (`SampleLevel::PAUSED`): a
/// device's hook returns before it reads the packet.
#[inline(always)]
pub fn paused() -> bool {
    SAMPLE.get(0).is_some_and(|level| level.paused())
}

/// Counts a packet left out by the sampling level; its error.
#[inline(always)]
pub fn shed() -> i64 {
    count(COUNT_SHED);
    skip(Why::Sampled, 0)
}

/// Whether only a target's packets are wanted.
#[inline(always)]
pub fn filtered() -> bool {
    // SAFETY: a global user space patches before load (see `offsets`).
    unsafe { core::ptr::read_volatile(&FILTER.enabled) != 0 }
}

/// Sends the payload of `skb` apart, on this CPU's perf buffer: `start`
/// bytes from `skb->data` on, `len` bytes of it (`bpf_skb_output` copies
/// from the pages, which nothing else can here). Marks the event to say
/// where it went; on failure, counts it and leaves the event as it is.
#[inline(always)]
pub fn send_apart(skb: *const u8, s: &mut Scratch, start: u32, len: u32) {
    let Some(seq) = APART_SEQ.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU slot, no concurrent writer.
    let seq = unsafe {
        *seq = (*seq).wrapping_add(1);
        *seq
    };
    // SAFETY: plain helper call.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let mut head = ApartHead {
        seq,
        cpu,
        start,
        len: start + len,
    };
    let flags = BPF_F_CURRENT_CPU | (u64::from(head.len) << 32);
    // SAFETY: `skb` is the tracepoint's typed skb, `head` a stack value of
    // its size.
    let ret = unsafe {
        bpf_skb_output(
            skb.cast_mut().cast(),
            (&raw const PAYLOADS).cast_mut().cast(),
            flags,
            (&raw mut head).cast(),
            APART_HEAD_SIZE as u64,
        )
    };
    if ret != 0 {
        count(COUNT_APART_LOST);
        return;
    }
    s.meta.flags |= FLAG_PAYLOAD_APART;
    s.meta.cpu = cpu as u16;
    s.meta.apart_seq = seq;
}

#[inline(always)]
pub fn count(counter: u32) {
    if let Some(n) = COUNTS.get_ptr_mut(counter) {
        // SAFETY: per-CPU slot, 8-aligned; atomic, as a socket's egress
        // may be interrupted by a device's run on its CPU.
        unsafe { atomic::add64(n, 1) };
    }
}

/// Stamps the header and time and queues the event with `cap` payload
/// bytes: its fixed part, the sections it has, then the payload. The name
/// is always sent (empty on tc's hooks): with it, a hop that has no other
/// section is one run of bytes in the scratch event, sent in one copy.
#[inline(always)]
pub fn send(s: &mut Scratch, cap: usize) -> Result<(), i64> {
    let cap = if cap > PAYLOAD_MAX { PAYLOAD_MAX } else { cap };
    let sections = s.meta.needed_sections() | SECTION_NAME;
    let size = PacketMeta::head_size(sections) + cap;
    s.meta.sections = sections;
    s.meta.header = EventHeader {
        kind: EventKind::Packet as u16,
        version: SCHEMA_VERSION,
        size: size as u32,
    };
    // SAFETY: plain helper call.
    s.meta.ts_ns = unsafe { bpf_ktime_get_ns() };
    let flags = wakeup(size as u64);
    let sent = if sections == SECTION_NAME {
        send_whole(s, size, flags)
    } else {
        send_in_parts(s, sections, size, cap, flags)
    };
    if sent.is_err() {
        count(COUNT_LOST);
        return Err(skip(Why::RingFull, size as u32));
    }
    Ok(())
}

/// The fixed part, the name and the payload, one run of `size` bytes.
#[inline(always)]
fn send_whole(s: &Scratch, size: usize, flags: u64) -> Result<(), i64> {
    // SAFETY: `size` bytes from the header on lie in the scratch event.
    let ret = unsafe {
        bpf_ringbuf_output(
            (&raw const EVENTS).cast_mut().cast(),
            (&raw const s.meta.header).cast_mut().cast(),
            size as u64,
            flags,
        )
    };
    if ret != 0 {
        return Err(ret);
    }
    Ok(())
}

/// An event with sections apart from the name, written into the ring in
/// place: each part copied where it goes.
#[inline(always)]
fn send_in_parts(
    s: &Scratch,
    sections: u8,
    size: usize,
    cap: usize,
    flags: u64,
) -> Result<(), i64> {
    // A dynptr lives in its stack slot: the verifier refuses a copy.
    let mut event = bpf_dynptr { __opaque: [0; 2] };
    // SAFETY: the helper initialises the stack dynptr, or marks it null on
    // failure (the writes then fail and it is discarded). It is released
    // once below, on either path.
    unsafe {
        bpf_ringbuf_reserve_dynptr(
            (&raw const EVENTS).cast_mut().cast(),
            size as u32,
            0,
            &mut event,
        );
        if let Err(e) = write_event(&event, s, sections, cap) {
            bpf_ringbuf_discard_dynptr(&mut event, 0);
            return Err(e);
        }
        bpf_ringbuf_submit_dynptr(&mut event, flags);
    }
    Ok(())
}

/// Writes `len` bytes at `src` into `event` at `at`; the offset after them.
#[inline(always)]
fn write_at(event: &bpf_dynptr, at: u32, src: *const u8, len: u32) -> Result<u32, i64> {
    // SAFETY: `src` lies in this CPU's scratch event with `len` bytes after
    // it; the helper checks `at + len` against the reservation.
    let ret = unsafe { bpf_dynptr_write(event, at, src.cast_mut().cast(), len, 0) };
    if ret != 0 {
        return Err(ret);
    }
    Ok(at + len)
}

/// Copies into the ring only the parts a hop has: the fixed part and the
/// name, its other sections, its payload.
#[inline(always)]
fn write_event(event: &bpf_dynptr, s: &Scratch, sections: u8, cap: usize) -> Result<(), i64> {
    let meta = (&raw const s.meta).cast::<u8>();
    // SAFETY: the fixed part and the name lie in the `PacketMeta`.
    let fixed = unsafe { meta.add(PACKET_FIXED_AT) };
    let mut at = write_at(event, 0, fixed, (PACKET_FIXED_SIZE + 16) as u32)?;
    for (bit, offset, len) in SECTIONS {
        if bit != SECTION_NAME && sections & bit != 0 {
            // SAFETY: a section's bytes lie inside the `PacketMeta`.
            at = write_at(event, at, unsafe { meta.add(offset) }, len as u32)?;
        }
    }
    write_at(event, at, s.payload.as_ptr(), cap as u32)?;
    Ok(())
}
