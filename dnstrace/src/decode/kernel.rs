//! Kernel numbers as names: drop reasons (from BTF, since their values differ
//! between kernels) and code addresses (from /proc/kallsyms).
use std::{collections::HashMap, sync::Arc};

#[derive(Clone, Default)]
pub struct KernelNames {
    drop_reasons: HashMap<u32, String>,
    /// Sorted by address; shared, as kallsyms is large.
    symbols: Arc<[(u64, String)]>,
    /// Locations named as a recording kept them.
    recorded: HashMap<u64, String>,
}

impl KernelNames {
    pub fn new(drop_reasons: HashMap<u32, String>, kallsyms: &str) -> Self {
        let mut symbols: Vec<(u64, String)> = kallsyms
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let kind = f.next()?;
                let name = f.next()?;
                (addr != 0 && matches!(kind, "t" | "T")).then(|| (addr, name.to_owned()))
            })
            .collect();
        symbols.sort_unstable();
        Self {
            drop_reasons,
            symbols: symbols.into(),
            recorded: HashMap::new(),
        }
    }

    /// Names as a recording kept them: drop reasons, and each drop
    /// location already resolved on the recording machine.
    pub fn recorded(drop_reasons: HashMap<u32, String>, locations: HashMap<u64, String>) -> Self {
        Self {
            drop_reasons,
            symbols: Arc::new([]),
            recorded: locations,
        }
    }

    pub fn drop_reasons(&self) -> &HashMap<u32, String> {
        &self.drop_reasons
    }

    /// `NETFILTER_DROP` for `SKB_DROP_REASON_NETFILTER_DROP`.
    pub fn drop_reason(&self, reason: u32) -> String {
        self.drop_reasons
            .get(&reason)
            .map(|n| n.trim_start_matches("SKB_DROP_REASON_").to_owned())
            .unwrap_or_else(|| format!("reason {reason}"))
    }

    /// `nf_hook_slow+0x9c`, or the raw address when kallsyms hides it.
    pub fn location(&self, addr: u64) -> String {
        if let Some(name) = self.recorded.get(&addr) {
            return name.clone();
        }
        let i = self.symbols.partition_point(|(a, _)| *a <= addr);
        match i.checked_sub(1).map(|i| &self.symbols[i]) {
            Some((start, name)) if addr - start < 0x10_0000 => {
                format!("{name}+{:#x}", addr - start)
            }
            _ => format!("{addr:#x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_reasons_and_locations() {
        let names = KernelNames::new(
            HashMap::from([(6, "SKB_DROP_REASON_NETFILTER_DROP".to_owned())]),
            "ffffffff81000000 T _stext\nffffffff81a00000 t nf_hook_slow\nffffffff81a00200 T udp_rcv\n0000000000000000 T hidden\n",
        );
        assert_eq!(names.drop_reason(6), "NETFILTER_DROP");
        assert_eq!(names.drop_reason(99), "reason 99");
        assert_eq!(names.location(0xffffffff81a0009c), "nf_hook_slow+0x9c");
        assert_eq!(names.location(0x10), "0x10");
    }
}
