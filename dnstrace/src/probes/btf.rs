//! Just enough of the kernel's BTF (/sys/kernel/btf/vmlinux) to find struct
//! member offsets and enum names at start-up, so the programs read kernel
//! structs correctly on kernels other than the one dnstrace was built on
//! (aya-ebpf emits no CO-RE relocations). Damaged input is an error, not a panic.
use std::collections::HashMap;

use anyhow::{anyhow, bail, Context as _, Result};

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
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

#[derive(Clone, Debug)]
struct Member {
    name: String,
    type_id: u32,
    /// Offset in bits from the start of the enclosing struct.
    bit_offset: u32,
}

#[derive(Clone, Debug)]
enum Type {
    Struct {
        size: u32,
        members: Vec<Member>,
    },
    Array {
        elem: u32,
    },
    /// typedef, const, volatile, restrict, type tag: look through to `inner`.
    Alias {
        inner: u32,
    },
    Enum {
        values: Vec<(String, i64)>,
    },
    Sized {
        size: u32,
    },
    Other,
}

pub struct Btf {
    /// Index = type id; id 0 is `void`.
    types: Vec<Type>,
    names: HashMap<String, Vec<u32>>,
}

fn u32_at(b: &[u8], off: usize) -> Result<u32> {
    b.get(off..off + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| anyhow!("BTF truncated at byte {off}"))
}

fn str_at(strings: &[u8], off: u32) -> Result<String> {
    let rest = strings
        .get(off as usize..)
        .ok_or_else(|| anyhow!("BTF string offset {off} out of range"))?;
    let end = rest
        .iter()
        .position(|&c| c == 0)
        .ok_or_else(|| anyhow!("BTF string at {off} not terminated"))?;
    Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
}

impl Btf {
    pub fn from_sys_fs() -> Result<Self> {
        let path = "/sys/kernel/btf/vmlinux";
        let raw = std::fs::read(path).with_context(|| format!("reading {path}"))?;
        Self::parse(&raw).with_context(|| format!("parsing {path}"))
    }

    pub fn parse(raw: &[u8]) -> Result<Self> {
        if raw.len() < 24 || u16::from_le_bytes([raw[0], raw[1]]) != MAGIC {
            bail!("not little-endian BTF (bad magic)");
        }
        let hdr_len = u32_at(raw, 4)? as usize;
        let (type_off, type_len) = (u32_at(raw, 8)? as usize, u32_at(raw, 12)? as usize);
        let (str_off, str_len) = (u32_at(raw, 16)? as usize, u32_at(raw, 20)? as usize);
        let section = |off: usize, len: usize| {
            hdr_len
                .checked_add(off)
                .and_then(|s| Some(s..s.checked_add(len)?))
                .and_then(|r| raw.get(r))
                .ok_or_else(|| anyhow!("BTF section out of range"))
        };
        let (types_raw, strings) = (section(type_off, type_len)?, section(str_off, str_len)?);
        let mut btf = Self {
            types: vec![Type::Other],
            names: HashMap::new(),
        };
        let mut off = 0;
        while off < types_raw.len() {
            off = btf.parse_type(types_raw, strings, off)?;
        }
        Ok(btf)
    }

    /// Parses the type at `off`, returning the offset of the next one.
    fn parse_type(&mut self, b: &[u8], strings: &[u8], off: usize) -> Result<usize> {
        let name = str_at(strings, u32_at(b, off)?)?;
        let info = u32_at(b, off + 4)?;
        let size_or_type = u32_at(b, off + 8)?;
        let (vlen, kind, kflag) = (
            (info & 0xffff) as usize,
            (info >> 24) & 0x1f,
            info >> 31 == 1,
        );
        let body = off + 12;
        let (ty, extra) = match kind {
            KIND_INT => (Type::Sized { size: size_or_type }, 4),
            KIND_PTR => (Type::Sized { size: 8 }, 0),
            KIND_ARRAY => (
                Type::Array {
                    elem: u32_at(b, body)?,
                },
                12,
            ),
            KIND_STRUCT | KIND_UNION => {
                let mut members = Vec::with_capacity(vlen);
                for i in 0..vlen {
                    let m = body + i * 12;
                    let raw_off = u32_at(b, m + 8)?;
                    let bit_offset = if kflag {
                        raw_off & 0x00ff_ffff
                    } else {
                        raw_off
                    };
                    members.push(Member {
                        name: str_at(strings, u32_at(b, m)?)?,
                        type_id: u32_at(b, m + 4)?,
                        bit_offset,
                    });
                }
                (
                    Type::Struct {
                        size: size_or_type,
                        members,
                    },
                    vlen * 12,
                )
            }
            KIND_ENUM | KIND_ENUM64 => {
                let width = if kind == KIND_ENUM { 8 } else { 12 };
                let mut values = Vec::with_capacity(vlen);
                for i in 0..vlen {
                    let v = body + i * width;
                    let lo = u32_at(b, v + 4)?;
                    let value = if kind == KIND_ENUM {
                        i64::from(lo as i32)
                    } else {
                        (i64::from(u32_at(b, v + 8)?) << 32) | i64::from(lo)
                    };
                    values.push((str_at(strings, u32_at(b, v)?)?, value));
                }
                (Type::Enum { values }, vlen * width)
            }
            KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => (
                Type::Alias {
                    inner: size_or_type,
                },
                0,
            ),
            KIND_FUNC_PROTO => (Type::Other, vlen * 8),
            KIND_VAR | KIND_DECL_TAG => (Type::Other, 4),
            KIND_DATASEC => (Type::Other, vlen * 12),
            k if k <= KIND_ENUM64 => (Type::Other, 0),
            k => bail!("unknown BTF kind {k} at type {}", self.types.len()),
        };
        if !name.is_empty() {
            self.names
                .entry(name)
                .or_default()
                .push(self.types.len() as u32);
        }
        self.types.push(ty);
        Ok(body + extra)
    }

    fn get(&self, id: u32) -> Result<&Type> {
        self.types
            .get(id as usize)
            .ok_or_else(|| anyhow!("BTF type id {id} out of range"))
    }

    /// Looks through typedefs and qualifiers, with a bound against loops.
    fn resolve(&self, mut id: u32) -> Result<&Type> {
        for _ in 0..32 {
            match self.get(id)? {
                Type::Alias { inner } => id = *inner,
                t => return Ok(t),
            }
        }
        bail!("BTF type {id}: alias chain too long")
    }

    fn struct_named(&self, name: &str) -> Result<u32> {
        self.names
            .get(name)
            .and_then(|ids| {
                ids.iter()
                    .copied()
                    .find(|&id| matches!(self.types[id as usize], Type::Struct { .. }))
            })
            .ok_or_else(|| anyhow!("struct {name} not in the kernel's BTF"))
    }

    /// Byte offset of `path` (e.g. `["tuplehash", "tuple", "dst", "protonum"]`)
    /// inside struct `name`; anonymous structs and unions are searched, arrays
    /// are entered at element 0.
    pub fn offset_of(&self, name: &str, path: &[&str]) -> Result<u32> {
        let mut id = self.struct_named(name)?;
        let mut bits = 0;
        for field in path {
            let (off, member_type) = self
                .find_member(id, field, 0)?
                .ok_or_else(|| anyhow!("{name} has no member {}", path.join(".")))?;
            bits += off;
            id = member_type;
            while let Type::Array { elem } = self.resolve(id)? {
                id = *elem;
            }
        }
        if bits % 8 != 0 {
            bail!("{name}.{} is a bitfield", path.join("."));
        }
        Ok(bits / 8)
    }

    fn find_member(&self, struct_id: u32, field: &str, depth: u32) -> Result<Option<(u32, u32)>> {
        let Type::Struct { members, .. } = self.resolve(struct_id)? else {
            return Ok(None);
        };
        if depth > 8 {
            bail!("BTF: anonymous members nested too deep");
        }
        for m in members {
            if m.name == field {
                return Ok(Some((m.bit_offset, m.type_id)));
            }
            if m.name.is_empty() {
                if let Some((off, ty)) = self.find_member(m.type_id, field, depth + 1)? {
                    return Ok(Some((m.bit_offset + off, ty)));
                }
            }
        }
        Ok(None)
    }

    /// Size in bytes of struct `name`.
    pub fn size_of(&self, name: &str) -> Result<u32> {
        match self.get(self.struct_named(name)?)? {
            Type::Struct { size, .. } | Type::Sized { size } => Ok(*size),
            _ => bail!("{name} has no size"),
        }
    }

    /// Names of an enum's values by value, e.g. `skb_drop_reason`.
    pub fn enum_names(&self, name: &str) -> Result<HashMap<i64, String>> {
        let ids = self
            .names
            .get(name)
            .ok_or_else(|| anyhow!("enum {name} not in the kernel's BTF"))?;
        for &id in ids {
            if let Type::Enum { values } = &self.types[id as usize] {
                return Ok(values.iter().map(|(n, v)| (*v, n.clone())).collect());
            }
        }
        bail!("{name} is not an enum")
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
        assert!(Btf::parse(b"").is_err());
        assert!(Btf::parse(&[
            0x9f, 0xeb, 1, 0, 24, 0, 0, 0, 0, 0, 0, 0, 255, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
        ])
        .is_err());
        let mut raw = std::fs::read("/sys/kernel/btf/vmlinux").unwrap();
        raw.truncate(raw.len() / 2);
        assert!(Btf::parse(&raw).is_err());
    }
}
