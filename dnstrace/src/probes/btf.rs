//! Just enough of the kernel's BTF (/sys/kernel/btf/vmlinux) to find struct
//! member offsets and enum names at start-up, so the programs read kernel
//! structs correctly on kernels other than the one dnstrace was built on
//! (aya-ebpf emits no CO-RE relocations). Damaged input is an error, not a panic.
use std::collections::HashMap;

use anyhow::{anyhow, bail, Context as _, Result};

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// One type's header, read where it lies.
#[derive(Clone, Copy)]
struct Header {
    name_off: u32,
    kind: u32,
    vlen: usize,
    kflag: bool,
    size_or_type: u32,
    /// Byte offset of what follows the header (members, values, ...).
    body: usize,
}

/// The raw BTF with an index of where each type starts: parsing allocates
/// nothing per type, and a type is decoded only when asked for (the kernel
/// has some 100,000; start-up needs a dozen).
pub struct Btf {
    raw: Vec<u8>,
    types: std::ops::Range<usize>,
    strings: std::ops::Range<usize>,
    /// Index = type id - 1 (id 0 is `void`): offset in the type section.
    starts: Vec<u32>,
}

fn u32_at(b: &[u8], off: usize) -> Result<u32> {
    b.get(off..off + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| anyhow!("BTF truncated at byte {off}"))
}

/// Bytes after a type's header: members, values, parameters.
fn body_len(kind: u32, vlen: usize) -> Result<usize> {
    Ok(match kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => vlen * 12,
        KIND_ENUM | KIND_FUNC_PROTO => vlen * 8,
        k if k <= KIND_ENUM64 => 0,
        k => bail!("unknown BTF kind {k}"),
    })
}

impl Btf {
    pub fn from_sys_fs() -> Result<Self> {
        let path = "/sys/kernel/btf/vmlinux";
        let raw = std::fs::read(path).with_context(|| format!("reading {path}"))?;
        Self::parse(raw).with_context(|| format!("parsing {path}"))
    }

    pub fn parse(raw: Vec<u8>) -> Result<Self> {
        if raw.len() < 24 || u16::from_le_bytes([raw[0], raw[1]]) != MAGIC {
            bail!("not little-endian BTF (bad magic)");
        }
        let hdr_len = u32_at(&raw, 4)? as usize;
        let section = |at: usize| -> Result<std::ops::Range<usize>> {
            let (off, len) = (u32_at(&raw, at)? as usize, u32_at(&raw, at + 4)? as usize);
            hdr_len
                .checked_add(off)
                .and_then(|s| Some(s..s.checked_add(len)?))
                .filter(|r| r.end <= raw.len())
                .ok_or_else(|| anyhow!("BTF section out of range"))
        };
        let (types, strings) = (section(8)?, section(16)?);
        let b = &raw[types.clone()];
        let mut starts = Vec::new();
        let mut off = 0;
        while off < b.len() {
            let info = u32_at(b, off + 4)?;
            let len = body_len((info >> 24) & 0x1f, (info & 0xffff) as usize)
                .with_context(|| format!("at type {}", starts.len() + 1))?;
            starts.push(off as u32);
            off += 12 + len;
        }
        if off != b.len() {
            bail!("BTF truncated in type {}", starts.len());
        }
        Ok(Self {
            raw,
            types,
            strings,
            starts,
        })
    }

    fn type_bytes(&self) -> &[u8] {
        &self.raw[self.types.clone()]
    }

    fn header(&self, id: u32) -> Result<Header> {
        let start = id
            .checked_sub(1)
            .and_then(|i| self.starts.get(i as usize))
            .ok_or_else(|| anyhow!("BTF type id {id} out of range"))?;
        let (b, off) = (self.type_bytes(), *start as usize);
        let info = u32_at(b, off + 4)?;
        Ok(Header {
            name_off: u32_at(b, off)?,
            kind: (info >> 24) & 0x1f,
            vlen: (info & 0xffff) as usize,
            kflag: info >> 31 == 1,
            size_or_type: u32_at(b, off + 8)?,
            body: off + 12,
        })
    }

    /// The NUL-terminated name at `off` in the string section.
    fn name(&self, off: u32) -> Result<&[u8]> {
        let rest = self.raw[self.strings.clone()]
            .get(off as usize..)
            .ok_or_else(|| anyhow!("BTF string offset {off} out of range"))?;
        let end = rest
            .iter()
            .position(|&c| c == 0)
            .ok_or_else(|| anyhow!("BTF string at {off} not terminated"))?;
        Ok(&rest[..end])
    }

    /// Looks through typedefs and qualifiers, with a bound against loops.
    fn resolve(&self, mut id: u32) -> Result<Header> {
        for _ in 0..32 {
            let h = self.header(id)?;
            match h.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = h.size_or_type
                }
                _ => return Ok(h),
            }
        }
        bail!("BTF type {id}: alias chain too long")
    }

    /// The first type named `name` of one of `kinds`.
    fn named(&self, name: &str, kinds: &[u32]) -> Option<Header> {
        (1..=self.starts.len() as u32)
            .filter_map(|id| self.header(id).ok())
            .find(|h| {
                kinds.contains(&h.kind) && self.name(h.name_off).ok() == Some(name.as_bytes())
            })
    }

    fn struct_named(&self, name: &str) -> Result<Header> {
        self.named(name, &[KIND_STRUCT])
            .ok_or_else(|| anyhow!("struct {name} not in the kernel's BTF"))
    }

    /// Byte offset of `path` (e.g. `["tuplehash", "tuple", "dst", "protonum"]`)
    /// inside struct `name`; anonymous structs and unions are searched, arrays
    /// are entered at element 0.
    pub fn offset_of(&self, name: &str, path: &[&str]) -> Result<u32> {
        let mut ty = self.struct_named(name)?;
        let mut bits = 0;
        for field in path {
            let (off, member_type) = self
                .find_member(ty, field.as_bytes(), 0)?
                .ok_or_else(|| anyhow!("{name} has no member {}", path.join(".")))?;
            bits += off;
            ty = self.resolve(member_type)?;
            while ty.kind == KIND_ARRAY {
                ty = self.resolve(u32_at(self.type_bytes(), ty.body)?)?;
            }
        }
        if bits % 8 != 0 {
            bail!("{name}.{} is a bitfield", path.join("."));
        }
        Ok(bits / 8)
    }

    /// (bit offset, type id) of member `field`.
    fn find_member(&self, ty: Header, field: &[u8], depth: u32) -> Result<Option<(u32, u32)>> {
        if !matches!(ty.kind, KIND_STRUCT | KIND_UNION) {
            return Ok(None);
        }
        if depth > 8 {
            bail!("BTF: anonymous members nested too deep");
        }
        let b = self.type_bytes();
        for i in 0..ty.vlen {
            let m = ty.body + i * 12;
            let (name, type_id, raw_off) = (u32_at(b, m)?, u32_at(b, m + 4)?, u32_at(b, m + 8)?);
            let bit_offset = if ty.kflag {
                raw_off & 0x00ff_ffff
            } else {
                raw_off
            };
            let name = self.name(name)?;
            if name == field {
                return Ok(Some((bit_offset, type_id)));
            }
            if name.is_empty() {
                let inner = self.resolve(type_id)?;
                if let Some((off, ty)) = self.find_member(inner, field, depth + 1)? {
                    return Ok(Some((bit_offset + off, ty)));
                }
            }
        }
        Ok(None)
    }

    /// Size in bytes of struct `name`.
    pub fn size_of(&self, name: &str) -> Result<u32> {
        Ok(self.struct_named(name)?.size_or_type)
    }

    /// Names of an enum's values by value, e.g. `skb_drop_reason`.
    pub fn enum_names(&self, name: &str) -> Result<HashMap<i64, String>> {
        let ty = self
            .named(name, &[KIND_ENUM, KIND_ENUM64])
            .ok_or_else(|| anyhow!("enum {name} not in the kernel's BTF"))?;
        let (b, width) = (self.type_bytes(), if ty.kind == KIND_ENUM { 8 } else { 12 });
        (0..ty.vlen)
            .map(|i| {
                let v = ty.body + i * width;
                let lo = u32_at(b, v + 4)?;
                let value = if ty.kind == KIND_ENUM {
                    i64::from(lo as i32)
                } else {
                    (i64::from(u32_at(b, v + 8)?) << 32) | i64::from(lo)
                };
                let name = String::from_utf8_lossy(self.name(u32_at(b, v)?)?).into_owned();
                Ok((value, name))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel() -> Btf {
        Btf::from_sys_fs().expect("this machine's kernel BTF")
    }

    #[test]
    fn finds_sk_buff_fields_inside_anonymous_members() {
        let btf = kernel();
        // network_header sits in an anonymous struct group in sk_buff.
        let net = btf.offset_of("sk_buff", &["network_header"]).unwrap();
        let trans = btf.offset_of("sk_buff", &["transport_header"]).unwrap();
        assert_eq!(trans, net - 2, "transport_header precedes network_header");
        assert!(btf.offset_of("sk_buff", &["head"]).unwrap() > 0);
        assert!(btf.offset_of("sk_buff", &["no_such_field"]).is_err());
    }

    #[test]
    fn walks_nested_structs_and_arrays() {
        let btf = kernel();
        let tuple = btf.offset_of("nf_conn", &["tuplehash", "tuple"]).unwrap();
        let protonum = btf
            .offset_of("nf_conn", &["tuplehash", "tuple", "dst", "protonum"])
            .unwrap();
        // src (u3 16 + port 2 + l3num 2) then dst.u3 16 and dst.u 2.
        assert_eq!(protonum - tuple, 20 + 18);
        assert_eq!(btf.size_of("nf_conntrack_tuple").unwrap(), 40);
    }

    #[test]
    fn resolves_drop_reason_names() {
        let names = kernel().enum_names("skb_drop_reason").unwrap();
        assert!(names
            .values()
            .any(|n| n == "SKB_DROP_REASON_NETFILTER_DROP"));
    }

    #[test]
    fn damaged_btf_is_an_error() {
        assert!(Btf::parse(Vec::new()).is_err());
        assert!(Btf::parse(vec![
            0x9f, 0xeb, 1, 0, 24, 0, 0, 0, 0, 0, 0, 0, 255, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
        ])
        .is_err());
        let mut raw = std::fs::read("/sys/kernel/btf/vmlinux").unwrap();
        raw.truncate(raw.len() / 2);
        assert!(Btf::parse(raw).is_err());
    }
}
