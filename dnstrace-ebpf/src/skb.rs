//! BTF tracepoints: DNS packets on every device of every network namespace,
//! and DNS packets the kernel drops, with their conntrack entries. Kernel
//! structs are read at offsets user space found in the running kernel's BTF.
use aya_ebpf::helpers::{
    bpf_probe_read_kernel, generated::bpf_probe_read_kernel as probe_read_raw,
};
use dnstrace_common::{
    CtTuple, Hook, KernelOffsets, APART_MAX, COUNT_LAPS, CT_SPAN_MAX, FLAG_CONNTRACK,
};

use crate::{
    debug::{skip, unreadable, Why},
    laps,
    lookups::{self, Ends},
    maps::{
        count, filtered, in_scope, offset, offsets, paused, sampled_in, scoped, scratch, send,
        send_apart, shed, viewed, viewing, wanted, Length, Scratch,
    },
    parse::{
        copy_payload, dns_headers, helper_result, transport, Reader, ETH_P_IP, ETH_P_IPV6,
        IPPROTO_TCP, IPPROTO_UDP, L4,
    },
};

/// `skb->network_header` when it was never set.
const NO_HEADER: u16 = 0xffff;
/// A conntrack `ctinfo` from here on is the reply direction's.
const IP_CT_IS_REPLY: u64 = 3;

/// Why and where a packet was dropped (`kfree_skb` only).
#[derive(Clone, Copy)]
pub struct Drop {
    pub location: u64,
    pub reason: u32,
}

impl Drop {
    pub const NONE: Self = Self {
        location: 0,
        reason: 0,
    };
}

/// The linear data of an skb, from its IP header on.
struct Linear {
    l3: *const u8,
    len: u32,
}

impl Reader for Linear {
    #[inline(always)]
    fn load<T: Copy>(&self, off: u32) -> Result<T, i64> {
        // SAFETY: a checked read of kernel memory; a bad address fails cleanly.
        unsafe { bpf_probe_read_kernel(self.l3.add(off as usize).cast::<T>()) }
            .map_err(|e| unreadable(Why::Unreadable, off, e.into()))
    }

    #[inline(always)]
    fn copy(&self, off: u32, dst: *mut u8, len: u32) -> Result<(), i64> {
        // SAFETY: `dst` has room for PAYLOAD_MAX bytes and len is bounded by it.
        helper_result(unsafe { probe_read_raw(dst.cast(), len, self.l3.add(off as usize).cast()) })
            .map_err(|e| unreadable(Why::Unreadable, off, e))
    }

    #[inline(always)]
    fn available(&self) -> u32 {
        self.len
    }
}

/// How a program reads the kernel's structs.
pub trait Kernel {
    fn read<T: Copy>(base: *const u8, off: u32) -> Result<T, i64>;
}

/// BTF tracepoints: their skb, and the device and namespace reached from
/// it, are typed pointers. The verifier lets a program load their fields
/// directly, one instruction each (the JIT makes it fault-tolerant), where
/// a probe read is a helper call: it checks each load against BTF, at
/// offsets it knows because `OFFSETS` is frozen before the programs load.
pub enum Typed {}

/// kprobes: their arguments are bare addresses, read with a helper.
pub enum Untyped {}

impl Kernel for Typed {
    #[inline(always)]
    fn read<T: Copy>(base: *const u8, off: u32) -> Result<T, i64> {
        // SAFETY: `base` is a typed kernel pointer and `off` a field of its
        // type from BTF: the verifier checks both, a bad address reads 0.
        Ok(unsafe { core::ptr::read_volatile(base.add(off as usize).cast::<T>()) })
    }
}

impl Kernel for Untyped {
    #[inline(always)]
    fn read<T: Copy>(base: *const u8, off: u32) -> Result<T, i64> {
        // SAFETY: a checked read of kernel memory; a bad address fails cleanly.
        unsafe { bpf_probe_read_kernel(base.add(off as usize).cast::<T>()) }
            .map_err(|e| unreadable(Why::FieldUnreadable, off, e.into()))
    }
}

/// `APART`: the program may send a TCP payload in the skb's pages apart
/// (`bpf_skb_output`, for BTF tracepoints only; kprobes cannot call it).
#[inline(always)]
pub fn try_capture<K: Kernel, const APART: bool>(
    skb: *const u8,
    dev: *const u8,
    hook: Hook,
    drop: Drop,
) -> Result<(), i64> {
    // Between the agent's windows of following, only a drop is read: it
    // marks its lookup's count.
    if hook != Hook::Drop && paused() && !viewing() {
        return Ok(());
    }
    // Everything up to the ports is on the path of every packet: as few
    // reads as can rule a packet out, and nothing stored before it is DNS.
    if offset(|o| &o.skb_head) == 0 || skb.is_null() {
        return Err(skip(Why::NoSkb, 0));
    }
    let ethertype = u16::from_be(K::read::<u16>(skb, offset(|o| &o.skb_protocol))?);
    if ethertype != ETH_P_IP && ethertype != ETH_P_IPV6 {
        return Err(skip(Why::NotIp, ethertype.into()));
    }
    let mut r = Linear {
        l3: network_header::<K>(skb, hook)?,
        len: 0,
    };
    let dns = dns_headers(&r, ethertype, 0)?;
    let o = offsets();
    let (wire_len, data);
    (r.len, wire_len, data) = linear_len::<K>(skb, r.l3, &o)?;
    let s = scratch().ok_or_else(|| skip(Why::NoScratch, 0))?;
    let l4 = transport(&r, dns, &mut s.meta)?.forgotten(s);
    r.len = s.opaque(Length::Linear, r.len);
    let wire_len = s.opaque(Length::Wire, wire_len);
    let dev = if dev.is_null() {
        K::read::<*const u8>(skb, o.skb_dev)?
    } else {
        dev
    };
    // Before a drop marks a count: another node's lookups are its own.
    on_this_node::<K>(skb, dev, &o)?;
    // Perhaps left out by sampling, before the reads only an event needs:
    // at a high sampling level most packets stop here.
    let head = udp_head(&r, &l4, s);
    if let Some(valid) = head {
        if hook == Hook::Drop && valid >= 12 && s.meta.frag_offset == 0 && lookups::enabled() {
            mark_dropped::<K>(skb, &o, s);
        }
        if !filtered() && !sampled_in(&s.head, valid) && !viewed(&s.meta, &s.head, valid) {
            return Err(shed());
        }
    }
    device::<K>(dev, &o, s)?;
    s.meta.wire_len = wire_len;
    s.meta.hook = hook as u8;
    s.meta.drop_reason = drop.reason;
    s.meta.drop_location = drop.location;
    conntrack::<K>(skb, &o, s);
    if !wanted(&s.meta) {
        return Err(skip(Why::NotTarget, s.meta.netns));
    }
    if let Some(valid) = head {
        // A loop's laps, sent, would fill the ring and push the level up.
        if hook != Hook::Drop
            && is_query(s, valid)
            && laps::lapped(&laps::Seen::at_device(&s.meta, &s.head, valid))
        {
            count(COUNT_LAPS);
            return Err(skip(Why::Lapped, 0));
        }
        if filtered() && !sampled_in(&s.head, valid) && !viewed(&s.meta, &s.head, valid) {
            return Err(shed());
        }
    }
    let cap = copy_payload(&r, &l4, s)?;
    if APART && s.meta.l4_proto == IPPROTO_TCP && (cap as u32) < l4.payload_len() {
        apart(skb, &r, &l4, data, wire_len, s);
    }
    send(s, cap)
}

/// Marks a dropped query's lookup, known by its socket as it sent it: the
/// conntrack entry's original source where it has one (a query
/// masqueraded on its way out, as `sock::sent_as` reads it).
#[inline(always)]
fn mark_dropped<K: Kernel>(skb: *const u8, o: &KernelOffsets, s: &Scratch) {
    let m = &s.meta;
    let nfct = match o.skb_nfct {
        0 => None,
        at => K::read::<u64>(skb, at).ok(),
    };
    let client = match nfct.and_then(original_ends) {
        Some(ends) => (ends.client, ends.port),
        None => (words(&m.saddr), m.sport),
    };
    lookups::dropped(client, m.dport, &s.head);
}

/// The ends of the original direction of the conntrack entry `nfct` (an
/// skb's `_nfct`), if the packet is in that direction.
#[inline(always)]
pub fn original_ends(nfct: u64) -> Option<Ends> {
    if nfct & 7 >= IP_CT_IS_REPLY || nfct & !7 == 0 {
        return None;
    }
    let tuple = ((nfct & !7) as *const u8).wrapping_add(offset(|o| &o.ct_tuple_original) as usize);
    let read = |off| Untyped::read::<u16>(tuple, off).ok().map(u16::from_be);
    Some(Ends {
        client: Untyped::read(tuple, offset(|o| &o.tuple_src_u3)).ok()?,
        port: read(offset(|o| &o.tuple_src_port))?,
        server: Untyped::read(tuple, offset(|o| &o.tuple_dst_u3)).ok()?,
        server_port: read(offset(|o| &o.tuple_dst_port))?,
    })
}

/// A UDP datagram's whole DNS header, of a query (QR clear), in its
/// first fragment.
#[inline(always)]
fn is_query(s: &Scratch, valid: u32) -> bool {
    valid >= 12 && s.meta.frag_offset == 0 && s.head[2] & 0x80 == 0
}

/// Reads a UDP payload's first bytes (a DNS header and the start of its
/// question, or a later fragment's data) into `s.head`; how many are the
/// packet's.
#[inline(always)]
fn udp_head(r: &Linear, l4: &L4, s: &mut Scratch) -> Option<u32> {
    if s.meta.l4_proto != IPPROTO_UDP {
        return None;
    }
    let in_packet = r.len.saturating_sub(l4.offset());
    r.copy(l4.offset(), s.head.as_mut_ptr(), s.head.len() as u32)
        .ok()?;
    Some(in_packet.min(l4.payload_len()))
}

/// An address of the meta as words.
#[inline(always)]
fn words(addr: &[u8; 16]) -> [u32; 4] {
    // SAFETY: every address in the meta is 4-byte aligned (asserted in
    // dnstrace-common); 16 plain bytes either way.
    unsafe { (&raw const *addr).cast::<[u32; 4]>().read() }
}

/// Whether a packet a socket sends or takes is this node's, with
/// `--node`: its device (by then the socket's namespace's) is in scope.
/// `skb` is a socket program's context, read through.
#[inline(always)]
pub fn socket_on_this_node(skb: *const u8) -> bool {
    if !scoped() {
        return true;
    }
    let o = offsets();
    Untyped::read::<*const u8>(skb, o.skb_dev)
        .and_then(|dev| on_this_node::<Untyped>(skb, dev, &o))
        .is_ok()
}

/// Rules out, with `--node`, a packet of another node's namespace: its
/// device's, or where it has none yet (a query refused in OUTPUT), its
/// socket's. One with neither (a UDP packet queued at a socket keeps
/// scratch in its device field, and no socket: purged unread as the
/// socket closes) may be any node's, so it is none's.
#[inline(always)]
fn on_this_node<K: Kernel>(skb: *const u8, dev: *const u8, o: &KernelOffsets) -> Result<(), i64> {
    if !scoped() {
        return Ok(());
    }
    let mut netns = device_of::<K>(dev, o)?.netns;
    if netns == 0 {
        netns = socket_netns::<K>(skb, o)?;
    }
    if netns == 0 || !in_scope(netns) {
        return Err(skip(Why::OtherNode, netns));
    }
    Ok(())
}

/// The namespace of a packet's socket; 0 for none.
#[inline(always)]
fn socket_netns<K: Kernel>(skb: *const u8, o: &KernelOffsets) -> Result<u32, i64> {
    let sk: *const u8 = K::read(skb, o.skb_sk)?;
    if sk.is_null() {
        return Ok(0);
    }
    let net: *const u8 = K::read(sk, o.sk_net)?;
    if net.is_null() {
        return Ok(0);
    }
    K::read(net, o.net_ns_inum)
}

/// The device a packet is on: its namespace's inode and its index.
#[derive(Clone, Copy)]
struct Device {
    netns: u32,
    ifindex: u32,
}

impl Device {
    /// No device.
    const NONE: Self = Self {
        netns: 0,
        ifindex: 0,
    };
}

/// The device's namespace and index (zeros for none).
#[inline(always)]
fn device_of<K: Kernel>(dev: *const u8, o: &KernelOffsets) -> Result<Device, i64> {
    if dev.is_null() {
        return Ok(Device::NONE);
    }
    let net: *const u8 = K::read(dev, o.dev_nd_net)?;
    Ok(Device {
        ifindex: K::read(dev, o.dev_ifindex)?,
        netns: if net.is_null() {
            0
        } else {
            K::read(net, o.net_ns_inum)?
        },
    })
}

/// A TCP payload beyond the linear data (in the skb's pages, where a
/// socket's sends put it) goes apart, as much as `APART_MAX`, when it
/// starts at or after `skb->data`, where `bpf_skb_output` copies from.
#[inline(always)]
fn apart(skb: *const u8, r: &Linear, l4: &L4, data: *const u8, wire_len: u32, s: &mut Scratch) {
    let at = r.l3 as u64 + u64::from(l4.offset());
    if at < data as u64 {
        return;
    }
    let start = at - data as u64;
    let len = l4.payload_len().min(APART_MAX as u32);
    if start + u64::from(len) > u64::from(wire_len) {
        return;
    }
    send_apart(skb, s, start as u32, len);
}

/// The IP header: at `data` on receive, else where the stack put it.
#[inline(always)]
fn network_header<K: Kernel>(skb: *const u8, hook: Hook) -> Result<*const u8, i64> {
    if hook != Hook::DevReceive {
        let network: u16 = K::read(skb, offset(|o| &o.skb_network_header))?;
        if network != NO_HEADER {
            let head: *const u8 = K::read(skb, offset(|o| &o.skb_head))?;
            return Ok(head.wrapping_add(usize::from(network)));
        }
    }
    K::read(skb, offset(|o| &o.skb_data))
}

/// Bytes of linear data from `l3` on, `skb->len` and `skb->data`.
#[inline(always)]
fn linear_len<K: Kernel>(
    skb: *const u8,
    l3: *const u8,
    o: &KernelOffsets,
) -> Result<(u32, u32, *const u8), i64> {
    let data: *const u8 = K::read(skb, o.skb_data)?;
    let len: u32 = K::read(skb, o.skb_len)?;
    let data_len: u32 = K::read(skb, o.skb_data_len)?;
    let end = data as u64 + u64::from(len.saturating_sub(data_len));
    let avail = end.saturating_sub(l3 as u64);
    if avail > 0xffff {
        return Err(skip(Why::TooLong, avail as u32));
    }
    Ok((avail as u32, len, data))
}

#[inline(always)]
fn device<K: Kernel>(dev: *const u8, o: &KernelOffsets, s: &mut Scratch) -> Result<(), i64> {
    let d = device_of::<K>(dev, o)?;
    s.meta.ifindex = d.ifindex;
    s.meta.netns = d.netns;
    if dev.is_null() {
        return Ok(());
    }
    // Two words: a load is at most 8 bytes.
    let name: [u64; 2] = [K::read(dev, o.dev_name)?, K::read(dev, o.dev_name + 8)?];
    // SAFETY: 16 plain bytes either way.
    s.meta.ifname = unsafe { core::mem::transmute::<[u64; 2], [u8; 16]>(name) };
    Ok(())
}

/// The skb's conntrack entry (`_nfct & ~7`), if it has one: its tuples
/// and status in one probe read (it is no typed pointer), then picked out
/// of the copy.
#[inline(always)]
fn conntrack<K: Kernel>(skb: *const u8, o: &KernelOffsets, s: &mut Scratch) {
    if o.skb_nfct == 0 {
        return;
    }
    let Ok(nfct) = K::read::<u64>(skb, o.skb_nfct) else {
        return;
    };
    let ct = (nfct & !7) as *const u8;
    if ct.is_null() || o.ct_span as usize > CT_SPAN_MAX {
        return;
    }
    let span = s.ct_span.as_mut_ptr().cast::<u8>();
    // SAFETY: `span` has room for CT_SPAN_MAX bytes; a bad address fails cleanly.
    let read = unsafe {
        probe_read_raw(
            span.cast(),
            o.ct_span,
            ct.add(o.ct_tuple_original as usize).cast(),
        )
    };
    if read != 0 {
        return;
    }
    let reply = o.ct_tuple_reply - o.ct_tuple_original;
    let Scratch { meta, ct_span, .. } = s;
    let Some(status) = at::<u32>(ct_span, o.ct_status - o.ct_tuple_original) else {
        return;
    };
    if tuple(ct_span, 0, o, &mut meta.ct.original) && tuple(ct_span, reply, o, &mut meta.ct.reply) {
        meta.ct.status = status;
        meta.ct.ctinfo = (nfct & 7) as u8;
        meta.flags |= FLAG_CONNTRACK;
    }
}

type Span = [u64; CT_SPAN_MAX / 8];

/// Fills `t`, one of the meta's tuples, from the tuple at `at_` in the
/// span, field by field: a whole `CtTuple` built and then stored is copied
/// twice, two bytes at a time. False if a field lies outside the span.
#[inline(always)]
fn tuple(span: &Span, at_: u32, o: &KernelOffsets, t: &mut CtTuple) -> bool {
    let (Some(src), Some(dst), Some(sport), Some(dport), Some(l3num), Some(proto)) = (
        at::<[u32; 4]>(span, at_ + o.tuple_src_u3),
        at::<[u32; 4]>(span, at_ + o.tuple_dst_u3),
        at::<u16>(span, at_ + o.tuple_src_port),
        at::<u16>(span, at_ + o.tuple_dst_port),
        at::<u16>(span, at_ + o.tuple_l3num),
        at::<u8>(span, at_ + o.tuple_protonum),
    ) else {
        return false;
    };
    // SAFETY: `t` is a tuple of the meta, where both addresses are 4-byte
    // aligned (asserted in dnstrace-common).
    unsafe {
        (&raw mut t.src).cast::<[u32; 4]>().write(src);
        (&raw mut t.dst).cast::<[u32; 4]>().write(dst);
    }
    t.sport = u16::from_be(sport);
    t.dport = u16::from_be(dport);
    t.l3num = l3num;
    t.proto = proto;
    true
}

/// A `T` at `off` in the copied span, if it lies inside it, aligned as the
/// kernel aligns it (user space checks the offsets): one load a field, where
/// an unaligned read is a load and a shift a byte.
#[inline(always)]
fn at<T: Copy>(span: &Span, off: u32) -> Option<T> {
    let off = off as usize;
    if off + core::mem::size_of::<T>() > CT_SPAN_MAX
        || !off.is_multiple_of(core::mem::align_of::<T>())
    {
        return None;
    }
    // SAFETY: in bounds and aligned (checked above; the span is 8-aligned);
    // T is plain integers.
    Some(unsafe { span.as_ptr().cast::<u8>().add(off).cast::<T>().read() })
}
