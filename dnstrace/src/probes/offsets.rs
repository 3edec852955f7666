//! The kernel struct offsets the tracepoint programs need, from BTF.
use anyhow::{Context as _, Result};
use dnstrace_common::{KernelOffsets, CT_SPAN_MAX};

use super::btf::Btf;

/// Offsets for reading skbs and devices (required), and conntrack entries
/// (optional: when missing, events carry no entry and the reason is returned).
pub fn kernel_offsets(btf: &Btf) -> Result<(KernelOffsets, Option<String>)> {
    let skb = |path: &[&str]| {
        btf.offset_of("sk_buff", path)
            .with_context(|| format!("sk_buff.{}", path.join(".")))
    };
    let dev = |path: &[&str]| {
        btf.offset_of("net_device", path)
            .with_context(|| format!("net_device.{}", path.join(".")))
    };
    let mut o = KernelOffsets {
        skb_head: skb(&["head"])?,
        skb_data: skb(&["data"])?,
        skb_len: skb(&["len"])?,
        skb_data_len: skb(&["data_len"])?,
        skb_protocol: skb(&["protocol"])?,
        skb_network_header: skb(&["network_header"])?,
        skb_dev: skb(&["dev"])?,
        dev_ifindex: dev(&["ifindex"])?,
        dev_name: dev(&["name"])?,
        dev_nd_net: dev(&["nd_net"])?,
        net_ns_inum: btf
            .offset_of("net", &["ns", "inum"])
            .context("net.ns.inum")?,
        skb_sk: skb(&["sk"])?,
        sk_net: btf
            .offset_of("sock", &["__sk_common", "skc_net"])
            .context("sock.__sk_common.skc_net")?,
        ..KernelOffsets::UNSET
    };
    let conntrack = (|| -> Result<()> {
        let tuple = |field: &[&str]| btf.offset_of("nf_conntrack_tuple", field);
        o.skb_nfct = skb(&["_nfct"])?;
        o.ct_status = btf.offset_of("nf_conn", &["status"])?;
        o.ct_tuple_original = btf.offset_of("nf_conn", &["tuplehash", "tuple"])?;
        o.ct_tuple_reply = o.ct_tuple_original + btf.size_of("nf_conntrack_tuple_hash")?;
        o.tuple_src_u3 = tuple(&["src", "u3"])?;
        o.tuple_src_port = tuple(&["src", "u", "all"])?;
        o.tuple_l3num = tuple(&["src", "l3num"])?;
        o.tuple_dst_u3 = tuple(&["dst", "u3"])?;
        o.tuple_dst_port = tuple(&["dst", "u", "all"])?;
        o.tuple_protonum = tuple(&["dst", "protonum"])?;
        o.ct_span = ct_span(&o)?;
        Ok(())
    })();
    let note = conntrack.err().map(|e| {
        o.skb_nfct = 0;
        format!("conntrack entries are not read: {e:#}")
    });
    Ok((o, note))
}

/// The programs read both tuples and the status at once, so the status
/// must follow the tuples closely (as in `nf_conn` here); where it does
/// not, entries are not read and start-up says why.
fn ct_span(o: &KernelOffsets) -> Result<u32> {
    let end = o.ct_status + 4;
    match end.checked_sub(o.ct_tuple_original) {
        Some(span)
            if o.ct_tuple_reply > o.ct_tuple_original
                && o.ct_status >= o.ct_tuple_original
                && span as usize <= CT_SPAN_MAX =>
        {
            aligned(o)?;
            Ok(span)
        }
        _ => anyhow::bail!(
            "nf_conn's status (at {}) does not follow its tuples (at {}) within {CT_SPAN_MAX} bytes",
            o.ct_status,
            o.ct_tuple_original
        ),
    }
}

/// The programs read each field of the copied span with one aligned load,
/// as the kernel's own layout allows.
fn aligned(o: &KernelOffsets) -> Result<()> {
    let (base, reply) = (o.ct_tuple_original, o.ct_tuple_reply - o.ct_tuple_original);
    let fields = [
        ("nf_conn.status", o.ct_status - base, 4),
        ("the reply tuple", reply, 4),
        ("nf_conntrack_tuple.src.u3", o.tuple_src_u3, 4),
        ("nf_conntrack_tuple.dst.u3", o.tuple_dst_u3, 4),
        ("nf_conntrack_tuple.src.u", o.tuple_src_port, 2),
        ("nf_conntrack_tuple.dst.u", o.tuple_dst_port, 2),
        ("nf_conntrack_tuple.src.l3num", o.tuple_l3num, 2),
    ];
    match fields
        .iter()
        .find(|(_, at, align)| !at.is_multiple_of(*align))
    {
        Some((name, at, align)) => anyhow::bail!(
            "{name} is at {at} bytes from the first tuple, not on a {align}-byte boundary"
        ),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernel_has_every_offset() {
        let (o, note) = kernel_offsets(&Btf::from_sys_fs().unwrap()).unwrap();
        assert_eq!(note, None);
        assert!(o.skb_head > 0 && o.skb_nfct > 0 && o.ct_tuple_reply > o.ct_tuple_original);
        assert_eq!(o.tuple_dst_u3, 20);
        assert_eq!(o.ct_span, o.ct_status + 4 - o.ct_tuple_original);
    }

    #[test]
    fn a_conntrack_field_off_its_alignment_is_refused_by_name() {
        let o = KernelOffsets {
            ct_status: 128,
            ct_tuple_original: 16,
            ct_tuple_reply: 72,
            tuple_src_u3: 0,
            tuple_src_port: 16,
            tuple_l3num: 18,
            tuple_dst_u3: 20,
            tuple_dst_port: 36,
            tuple_protonum: 38,
            ..KernelOffsets::UNSET
        };
        assert_eq!(ct_span(&o).unwrap(), 116);
        let odd = KernelOffsets {
            tuple_dst_u3: 22,
            ..o
        };
        let e = ct_span(&odd).unwrap_err().to_string();
        assert!(
            e.contains("nf_conntrack_tuple.dst.u3 is at 22 bytes"),
            "{e}"
        );
    }
}
