//! Kernel numbers as names: drop reasons (from BTF, since their values differ
//! between kernels) and code addresses (from /proc/kallsyms).
use std::{
    collections::HashMap,
    io::Read,
    sync::{Arc, Mutex, OnceLock, PoisonError},
};

#[derive(Clone, Default)]
pub struct KernelNames {
    drop_reasons: HashMap<u32, String>,
    /// Shared, as kallsyms is large.
    symbols: Arc<Kallsyms>,
    /// Locations named as a recording kept them.
    recorded: HashMap<u64, String>,
}

impl KernelNames {
    /// Drop reasons, and code addresses named from `kallsyms`, read the
    /// first time a location is named. /proc/kallsyms opened by root keeps
    /// showing addresses after capabilities are dropped: the kernel decides
    /// when it is opened.
    pub fn new(drop_reasons: HashMap<u32, String>, kallsyms: impl Read + Send + 'static) -> Self {
        Self {
            drop_reasons,
            symbols: Arc::new(Kallsyms {
                source: Mutex::new(Some(Box::new(kallsyms))),
                symbols: OnceLock::new(),
            }),
            recorded: HashMap::new(),
        }
    }

    /// Names as a recording kept them: drop reasons, and each drop
    /// location already resolved on the recording machine.
    pub fn recorded(drop_reasons: HashMap<u32, String>, locations: HashMap<u64, String>) -> Self {
        Self {
            drop_reasons,
            symbols: Arc::default(),
            recorded: locations,
        }
    }

    /// What starts reading kallsyms ahead of the first location named.
    pub fn preload(&self) -> Preload {
        Preload(Some(self.symbols.clone()))
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
        match self.symbols.get().before(addr) {
            Some((start, name)) if addr - start < 0x10_0000 => {
                format!("{name}+{:#x}", addr - start)
            }
            _ => format!("{addr:#x}"),
        }
    }
}

/// Reads kallsyms on a thread of its own, once: told of the first drop,
/// so that its location is named without a stop of the pipeline when its
/// journey closes. Reading it takes tens of milliseconds, in which the
/// ring buffer fills at tens of thousands of lookups a second.
pub struct Preload(Option<Arc<Kallsyms>>);

impl Preload {
    pub fn started(&self) -> bool {
        self.0.is_none()
    }

    pub fn start(&mut self) {
        let Some(symbols) = self.0.take() else {
            return;
        };
        // Not started, the first location named reads them itself.
        let _ = std::thread::Builder::new()
            .name("kallsyms".into())
            .spawn(move || {
                symbols.get();
            });
    }
}

/// The kernel's text symbols, read from their source the first time a
/// location is named: 4 MiB that a capture without drops never needs.
#[derive(Default)]
struct Kallsyms {
    source: Mutex<Option<Box<dyn Read + Send>>>,
    symbols: OnceLock<Symbols>,
}

impl Kallsyms {
    fn get(&self) -> &Symbols {
        self.symbols.get_or_init(|| {
            let mut text = String::new();
            let source = self
                .source
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            // Unreadable, it names no location: addresses stay numbers, as
            // when kallsyms hides them.
            if let Some(mut source) = source {
                let _ = source.read_to_string(&mut text);
            }
            Symbols::new(&text)
        })
    }
}

/// The kernel's text symbols, sorted by address, their names in one
/// string: kallsyms has over 100,000, and a `String` each (with the file
/// they came from) held 15 MB, most of dnstrace's memory when idle.
#[derive(Default)]
struct Symbols {
    addrs: Box<[u64]>,
    /// Where each name ends in `names`; it starts where the one before ends.
    ends: Box<[u32]>,
    names: Box<str>,
}

impl Symbols {
    fn new(kallsyms: &str) -> Self {
        let mut found: Vec<(u64, &str)> = kallsyms
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let kind = f.next()?;
                let name = f.next()?;
                (addr != 0 && matches!(kind, "t" | "T")).then_some((addr, name))
            })
            .collect();
        found.sort_unstable();
        let mut names = String::with_capacity(found.iter().map(|(_, n)| n.len()).sum());
        let mut ends = Vec::with_capacity(found.len());
        let mut addrs = Vec::with_capacity(found.len());
        for (addr, name) in found {
            names.push_str(name);
            let Ok(end) = u32::try_from(names.len()) else {
                break;
            };
            ends.push(end);
            addrs.push(addr);
        }
        Self {
            addrs: addrs.into(),
            ends: ends.into(),
            names: names.into(),
        }
    }

    /// The symbol at or before `addr`: its address and name.
    fn before(&self, addr: u64) -> Option<(u64, &str)> {
        let i = self.addrs.partition_point(|a| *a <= addr).checked_sub(1)?;
        let start = i.checked_sub(1).map_or(0, |j| self.ends[j] as usize);
        Some((self.addrs[i], &self.names[start..self.ends[i] as usize]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_reasons_and_locations() {
        let names = KernelNames::new(
            HashMap::from([(6, "SKB_DROP_REASON_NETFILTER_DROP".to_owned())]),
            "ffffffff81000000 T _stext\nffffffff81a00000 t nf_hook_slow\nffffffff81a00200 T udp_rcv\n0000000000000000 T hidden\n".as_bytes(),
        );
        assert_eq!(names.drop_reason(6), "NETFILTER_DROP");
        assert_eq!(names.drop_reason(99), "reason 99");
        assert_eq!(names.location(0xffffffff81a0009c), "nf_hook_slow+0x9c");
        assert_eq!(names.location(0xffffffff81000010), "_stext+0x10");
        assert_eq!(names.location(0xffffffff81a00204), "udp_rcv+0x4");
        assert_eq!(names.location(0x10), "0x10");
    }

    /// kallsyms that can be read only once `go` says so.
    struct Gated {
        go: std::sync::mpsc::Receiver<()>,
        text: &'static [u8],
    }

    impl Read for Gated {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let _ = self.go.recv_timeout(std::time::Duration::from_secs(10));
            self.text.read(buf)
        }
    }

    #[test]
    fn preload_reads_kallsyms_on_its_own_thread() {
        let (go, gate) = std::sync::mpsc::channel();
        let text = b"ffffffff81a00000 t nf_hook_slow\n";
        let names = KernelNames::new(HashMap::new(), Gated { go: gate, text });
        let mut preload = names.preload();
        assert!(!preload.started());
        // Read on this thread, `start` would wait out the gate's timeout.
        preload.start();
        assert!(preload.started());
        assert!(names.symbols.symbols.get().is_none());
        drop(go);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while names.symbols.symbols.get().is_none() {
            assert!(std::time::Instant::now() < deadline, "kallsyms not read");
            std::thread::yield_now();
        }
        assert_eq!(names.location(0xffffffff81a00001), "nf_hook_slow+0x1");
    }
}
