//! Loading the eBPF programs, attaching them to interfaces, and detaching
//! everything again when the `Probes` value is dropped, on every exit path.
mod btf;
mod hooks;
mod kernel_log;
mod leftovers;
mod misses;
mod netlink;
mod offsets;

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    net::IpAddr,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, bail, Context as _, Result};
use aya::{
    maps::{perf::PerfEventArray, Array, HashMap, MapData, PerCpuArray, PerCpuHashMap},
    programs::{
        tc::{NlOptions, SchedClassifierLink, TcAttachOptions},
        BtfTracePoint, CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, KProbe, LinkOrder,
        Program, ProgramError, ProgramType, SchedClassifier, TcAttachType,
    },
    Ebpf, EbpfLoader,
};
pub use hooks::DeviceHooks;
pub use kernel_log::{BpfLog, KernelLog};

use dnstrace_common::{
    lookups::{LookupCount, LookupKey, Pending, PendingKey},
    port_slot, IfaceConfig, KernelOffsets, SampleLevel, TargetFilter, COUNT_APART_LOST,
    COUNT_FOLLOWED, COUNT_LAPS, COUNT_LOST, COUNT_SHED, COUNT_STARTED, L2_LEN_MIXED, MAX_SCOPE,
    MAX_VIEWED, PORT_WORDS,
};

/// What to attach, and how: the probes' own options, which the command
/// line fills in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeOptions {
    /// tc on these interfaces; none: the node-wide tracepoints.
    pub ifaces: Vec<String>,
    /// Ports that are DNS.
    pub ports: Vec<u16>,
    /// The ring buffer's size in MiB, a power of two.
    pub ring_buffer_mib: u32,
    /// How tc programs attach.
    pub attach: AttachMode,
    /// Kernel structs read with probe reads where direct loads would do
    /// (slower; the tests check the two read alike).
    pub probe_reads: bool,
    /// The programs log why they skip packets; without it they are loaded
    /// without their logging code.
    pub debug_bpf: Option<BpfLog>,
    /// Count every UDP lookup in the kernel, before the ring (the agent).
    pub count_lookups: bool,
    /// cgroup v2 (or a directory with it under `unified/`) whose sockets'
    /// answers are counted as they take them; none: where it is mounted.
    pub cgroup_root: Option<PathBuf>,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            ifaces: Vec::new(),
            ports: vec![53],
            ring_buffer_mib: 4,
            attach: AttachMode::Auto,
            probe_reads: false,
            debug_bpf: None,
            count_lookups: false,
            cgroup_root: None,
        }
    }
}

/// How programs are attached to interfaces: TCX links where the kernel has
/// them (6.6+), else a clsact qdisc over netlink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    Auto,
    Tcx,
    Netlink,
}

/// The kernel side of a target: its namespace and watched addresses.
pub struct KernelFilter {
    pub netns: u32,
    pub watched: Vec<([u8; 16], u8)>,
}

/// The kernel side of `--node`: the network namespaces (inodes) of one
/// node of several on this kernel. Packets elsewhere are skipped, and not
/// counted.
#[derive(Clone, Debug, Default)]
pub struct KernelScope {
    pub netns: BTreeSet<u32>,
}

/// Where user space keeps the programs' scope current as pods come and go.
pub struct ScopeMap(HashMap<MapData, u32, u8>);

impl ScopeMap {
    /// Makes the map hold `scope` and nothing else; the stale go first, so
    /// that the map's room is never short.
    pub fn set(&mut self, scope: &KernelScope) -> Result<()> {
        anyhow::ensure!(
            scope.netns.len() <= MAX_SCOPE as usize,
            "{} network namespaces in scope, more than {MAX_SCOPE}",
            scope.netns.len()
        );
        let stale: Vec<u32> = self
            .0
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !scope.netns.contains(k))
            .collect();
        for key in &stale {
            self.0.remove(key).context("SCOPE map")?;
        }
        for key in &scope.netns {
            self.0.insert(key, 1, 0).context("SCOPE map")?;
        }
        Ok(())
    }
}

/// The maps events come through: the ring buffer, and the perf buffers of
/// the TCP payloads the tracepoints send apart.
pub struct EventMaps {
    pub ring: MapData,
    pub payloads: PerfEventArray<MapData>,
}

/// Where the kernel counts lookups (`dnstrace_common::lookups`).
pub struct LookupMaps {
    /// `PendingSlot`s, mapped by the reader.
    pub slots: MapData,
    pub pending: HashMap<MapData, PendingKey, Pending>,
    pub counts: PerCpuHashMap<MapData, LookupKey, LookupCount>,
    pub stats: PerCpuArray<MapData, u64>,
}

/// Where user space sets the programs' sampling level.
pub type SampleMap = Array<MapData, SampleLevel>;

/// The programs' counters (lost, shed), per CPU.
pub struct Counts(PerCpuArray<MapData, u64>);

impl Counts {
    /// Events the ring could not take, so far.
    pub fn lost(&self) -> Result<u64> {
        Ok(self.0.get(&COUNT_LOST, 0)?.iter().sum())
    }

    /// Lookups the kernel started to follow, so far (when it counts them).
    pub fn started(&self) -> Result<u64> {
        Ok(self.0.get(&COUNT_STARTED, 0)?.iter().sum())
    }

    /// Of those, the ones the sampling level kept, so far.
    pub fn followed(&self) -> Result<u64> {
        Ok(self.0.get(&COUNT_FOLLOWED, 0)?.iter().sum())
    }
}

/// The addresses the programs watch for a target, and their roles; and
/// the target's network namespace.
pub struct Watched {
    addrs: HashMap<MapData, [u8; 16], u8>,
    netns: Array<MapData, u32>,
}

impl Watched {
    /// Keeps everything seen in the network namespace `inode` (0: none).
    pub fn follow_netns(&mut self, inode: u32) -> Result<()> {
        self.netns.set(0, inode, 0).context("TARGET_NETNS map")
    }

    /// Makes the map hold `watched` and nothing else; the stale go first,
    /// so that the map's room is never short.
    pub fn set(&mut self, watched: &[([u8; 16], u8)]) -> Result<()> {
        let stale: Vec<[u8; 16]> = self
            .addrs
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !watched.iter().any(|(w, _)| w == k))
            .collect();
        for key in &stale {
            self.addrs.remove(key).context("WATCHED map")?;
        }
        for (key, role) in watched {
            self.addrs.insert(key, role, 0).context("WATCHED map")?;
        }
        Ok(())
    }
}

/// Addresses as the programs store them: IPv4 in the first four bytes.
pub fn address_key(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => {
            let mut k = [0; 16];
            k[..4].copy_from_slice(&v4.octets());
            k
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The client addresses cluster views follow whole, whatever the level
/// (`VIEWED`), and their count, which spares every packet the look while
/// it is 0.
pub struct ViewMap {
    addrs: HashMap<MapData, [u8; 16], u8>,
    count: Array<MapData, u32>,
}

impl ViewMap {
    /// Makes the map hold `ips` and nothing else: the count first to 0 and
    /// last to how many, so that no packet looks while it changes.
    pub fn set(&mut self, ips: &[IpAddr]) -> Result<()> {
        anyhow::ensure!(
            ips.len() <= MAX_VIEWED as usize,
            "{} addresses viewed, more than {MAX_VIEWED}",
            ips.len()
        );
        self.count.set(0, 0, 0).context("VIEWING map")?;
        let old: Vec<[u8; 16]> = self.addrs.keys().filter_map(Result::ok).collect();
        for key in &old {
            self.addrs.remove(key).context("VIEWED map")?;
        }
        for ip in ips {
            self.addrs
                .insert(address_key(*ip), 1, 0)
                .context("VIEWED map")?;
        }
        self.count
            .set(0, ips.len() as u32, 0)
            .context("VIEWING map")
    }
}

/// The programs; empty in a debug build made without the eBPF toolchain
/// (build.rs), which can do all but trace.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/dnstrace-ebpf.o"));
/// The same programs, built to log why they skip packets (`debug_bpf`).
static LOGGING_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/dnstrace-ebpf-log.o"));

/// An interface in dnstrace's network namespace.
#[derive(Clone, Debug)]
pub struct Iface {
    pub name: String,
    pub index: u32,
    pub netns: u32,
    l2_len: u32,
}

impl Iface {
    pub fn lookup(name: &str, netns: u32) -> Result<Self> {
        let cname =
            std::ffi::CString::new(name).map_err(|_| anyhow!("bad interface name {name:?}"))?;
        // SAFETY: valid NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if index == 0 {
            bail!(
                "no interface named {name:?} in this network namespace (list them with `ip link`)"
            );
        }
        let arp_type =
            std::fs::read_to_string(format!("/sys/class/net/{name}/type")).unwrap_or_default();
        // Ethernet-like devices (and loopback) carry a 14-byte header; tun,
        // wireguard, ipip... start at the IP header.
        let l2_len = match arp_type.trim() {
            "1" | "772" => 14,
            _ => 0,
        };
        Ok(Self {
            name: name.to_owned(),
            index,
            netns,
            l2_len,
        })
    }
}

/// `--iface` names devices of this network namespace, and with `--node`
/// the programs skip packets outside the node's: unless this namespace is
/// the node's, every packet on them would be skipped.
fn check_ifaces_in_scope(ifaces: &[Iface], scope: Option<&KernelScope>) -> Result<()> {
    let Some(scope) = scope else {
        return Ok(());
    };
    match ifaces.iter().find(|i| !scope.netns.contains(&i.netns)) {
        Some(i) => bail!(
            "--iface {} is in this network namespace, not the --node's (--node-netns): none of its packets would be traced; run dnstrace inside the node's namespace (ip netns exec) or leave --iface out",
            i.name
        ),
        None => Ok(()),
    }
}

/// The link-layer header length all `ifaces` share, so that the tc programs
/// need not look each packet's interface up before parsing it.
fn tc_l2_len(ifaces: &[Iface]) -> u32 {
    match ifaces.split_first() {
        Some((first, rest)) if rest.iter().all(|i| i.l2_len == first.l2_len) => first.l2_len,
        _ => L2_LEN_MIXED,
    }
}

/// The step of backlog past which the kernel wakes the reader: a quarter
/// of the ring (a power of two, as the ring is), so a burst is read well
/// before it fills. Below it the capture reads on its tick
/// (`commands::trace::LiveSource`).
fn wake_bytes(ring_bytes: u32) -> u64 {
    u64::from(ring_bytes / 4)
}

/// One program attached somewhere.
#[derive(Debug)]
pub struct Attachment {
    pub program: &'static str,
    /// The kernel's id of the program, as `bpftool prog show` lists it.
    pub prog_id: u32,
    /// An interface, or the tracepoint.
    pub target: String,
    pub how: &'static str,
}

/// kprobes on the conntrack and NAT paths: (program, kernel function, return probe).
const KPROBES: [(&str, &str, bool); 4] = [
    ("nat_enter_nf_nat_manip_pkt", "nf_nat_manip_pkt", false),
    (
        "ct_enter_nf_conntrack_confirm",
        "__nf_conntrack_confirm",
        false,
    ),
    (
        "ct_exit_nf_conntrack_confirm",
        "__nf_conntrack_confirm",
        true,
    ),
    ("ct_enter_nf_ct_resolve_clash", "nf_ct_resolve_clash", false),
];

/// Where the agent counts lookups (cgroup v2's egress and ingress, at its
/// root): a query as its socket sends it, an answer as its socket takes
/// it, whether the device hooks follow packets or not.
const SOCKETS: [(&str, CgroupSkbAttachType, &str, &str); 2] = [
    (
        "dns_sock_egress",
        CgroupSkbAttachType::Egress,
        "egress",
        "queries as sockets send them",
    ),
    (
        "dns_sock_ingress",
        CgroupSkbAttachType::Ingress,
        "ingress",
        "answers as sockets take them",
    ),
];

/// A BTF tracepoint that sees every device of every network namespace.
struct Tracepoint {
    /// Loads the kernel's structs directly: a few instructions a field.
    program: &'static str,
    /// Reads them with a helper call each, for a kernel whose verifier
    /// refuses the direct loads.
    read: &'static str,
    tracepoint: &'static str,
    /// It only follows packets (a drop also marks its lookup's count): its
    /// link is among the `DeviceHooks` the agent closes between windows.
    follows: bool,
}

const TRACEPOINTS: [Tracepoint; 3] = [
    Tracepoint {
        program: "dns_dev_xmit",
        read: "dns_xmit_read",
        tracepoint: "net_dev_start_xmit",
        follows: true,
    },
    Tracepoint {
        program: "dns_dev_receive",
        read: "dns_recv_read",
        tracepoint: "netif_receive_skb",
        follows: true,
    },
    Tracepoint {
        program: "dns_kfree_skb",
        read: "dns_kfree_read",
        tracepoint: "kfree_skb",
        follows: false,
    },
];

pub struct Probes {
    ebpf: Ebpf,
    pub attachments: Vec<Attachment>,
    ifaces: Vec<Iface>,
    /// clsact qdiscs dnstrace added (netlink mode): removed on drop.
    added_qdiscs: Vec<Iface>,
    /// Filters attached over netlink: detached on drop.
    nl_links: Vec<SchedClassifierLink>,
    /// What a SIGKILL would leave behind, for the next start to remove.
    ledger: leftovers::Ledger,
    /// Hooks or parts left off, and why.
    pub off: Vec<String>,
    /// `skb_drop_reason` names of the running kernel.
    pub drop_reasons: std::collections::HashMap<u32, String>,
    /// The programs' log, when asked for (`debug_bpf`).
    kernel_log: Option<KernelLog>,
    /// The device tracepoints that only follow, attached while here.
    device_hooks: DeviceHooks,
}

/// Which programs to load.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// What this kernel can attach: verifying the rest would only slow start-up.
    Attachable,
    /// Every program, so the verifier checks each (`dnstrace check`).
    All,
}

const NO_KPROBES: &str = "this kernel has no kprobes (CONFIG_KPROBES is off)";

/// Each node-wide program's load (and verification) result, by name.
type Loaded = std::collections::HashMap<String, Result<()>>;

const PROGRAMS: [(&str, TcAttachType); 2] = [
    ("dns_tc_ingress", TcAttachType::Ingress),
    ("dns_tc_egress", TcAttachType::Egress),
];

impl Probes {
    /// Checks privileges and kernel support, loads the programs and attaches
    /// them: tc on every interface in `args`, or, with none named, the BTF
    /// tracepoints that see the whole node (of several on this kernel,
    /// the one `scope` holds).
    pub fn attach(
        args: &ProbeOptions,
        target: Option<&KernelFilter>,
        scope: Option<&KernelScope>,
        load: Load,
    ) -> Result<Self> {
        check_built_with_programs(OBJECT)?;
        check_privileges()?;
        let netns = crate::netns::inode(None)?;
        for line in leftovers::reap(netns) {
            log::info!("{line}");
        }
        let ifaces = args
            .ifaces
            .iter()
            .map(|name| Iface::lookup(name, netns))
            .collect::<Result<Vec<_>>>()?;
        check_ifaces_in_scope(&ifaces, scope)?;
        check_kernel()?;
        let cgroup = match &args.cgroup_root {
            Some(dir) => Some(crate::mounts::cgroup2_at(dir).context("--cgroup-root")?),
            None if args.count_lookups => crate::mounts::cgroup2_root()?,
            None => None,
        };
        let btf = btf::Btf::from_sys_fs()?;
        let (offsets, ct_off) = match offsets::kernel_offsets(&btf) {
            Ok(found) => found,
            // tc needs no kernel struct; only the node-wide hooks are lost.
            Err(e) if !ifaces.is_empty() => (KernelOffsets::UNSET, Some(format!("node-wide tracepoints: {e:#}"))),
            Err(e) => return Err(e.context("the kernel's BTF lacks a field the node-wide tracepoints read; name interfaces with --iface to use tc only")),
        };
        let ring_bytes = args.ring_buffer_mib << 20;
        let mut loader = EbpfLoader::new();
        let log_level = args.debug_bpf.map(kernel_log::level);
        let object = match &log_level {
            Some(level) => {
                loader.override_global("LOG_LEVEL", level, true);
                LOGGING_OBJECT
            }
            None => OBJECT,
        };
        let mut ebpf = loader
            .map_max_entries("EVENTS", ring_bytes)
            .override_global("WAKE_BYTES", &wake_bytes(ring_bytes), true)
            .override_global("OFFSETS", &offsets, true)
            .override_global("TC_L2_LEN", &tc_l2_len(&ifaces), true)
            .override_global("COUNT_LOOKUPS", &u32::from(args.count_lookups), true)
            .override_global("SCOPED", &u32::from(scope.is_some()), true)
            .override_global(
                "FILTER",
                &target.map_or(TargetFilter::OFF, |_| TargetFilter::ON),
                true,
            )
            .load(object)
            .map_err(|e| anyhow!("loading the eBPF object failed: {e}"))?;
        let kernel_log = args
            .debug_bpf
            .map(|_| KernelLog::open(&mut ebpf))
            .transpose()?;
        let mut probes = Self {
            ebpf,
            attachments: Vec::new(),
            ifaces: ifaces.clone(),
            added_qdiscs: Vec::new(),
            nl_links: Vec::new(),
            ledger: leftovers::Ledger::new(),
            off: ct_off.into_iter().collect(),
            drop_reasons: btf
                .enum_names("skb_drop_reason")
                .unwrap_or_default()
                .into_iter()
                .map(|(v, n)| (v as u32, n))
                .collect(),
            kernel_log,
            device_hooks: DeviceHooks::new(),
        };
        probes.configure(&args.ports, &ifaces)?;
        if let Some(t) = target {
            let mut watched = probes.watched()?;
            watched.set(&t.watched)?;
            watched.follow_netns(t.netns)?;
        }
        if let Some(scope) = scope {
            probes.scope()?.set(scope)?;
        }
        if ifaces.is_empty() {
            let btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF")?;
            let mut loaded = probes.load_node_wide(&btf, load, args.probe_reads)?;
            probes.attach_tracepoints(&btf, &mut loaded, args.probe_reads)?;
            probes.attach_kprobes(&mut loaded);
            if args.count_lookups {
                match probes.attach_sockets(cgroup) {
                    // `check` says so and goes on; the agent cannot count.
                    Err(e) if load == Load::All => probes.off.push(format!("{e:#}")),
                    attached => attached?,
                }
            }
        } else {
            for (name, _) in PROGRAMS {
                probes
                    .program(name)?
                    .load()
                    .map_err(|e| load_error(name, e))?;
            }
            for iface in &ifaces {
                probes.attach_iface(iface, args.attach)?;
            }
        }
        Ok(probes)
    }

    /// Loads the node-wide programs, each on a thread of its own: the
    /// verifier takes most of start-up, and it can use every core. The
    /// tracepoints' probe-read twins only for `check`; with `probe_reads`,
    /// no tracepoint program (`attach_tracepoints` loads the twins).
    fn load_node_wide(&mut self, btf: &aya::Btf, load: Load, probe_reads: bool) -> Result<Loaded> {
        let tracepoint = |name: &str| {
            TRACEPOINTS.iter().find_map(|t| {
                let wanted = match load {
                    Load::All => name == t.program || name == t.read,
                    Load::Attachable => !probe_reads && name == t.program,
                };
                wanted.then_some(t.tracepoint)
            })
        };
        let with_kprobes = load == Load::All || kprobes_available();
        let kprobe = |name: &str| with_kprobes && KPROBES.iter().any(|(n, ..)| *n == name);
        Ok(std::thread::scope(|scope| {
            let loads: Vec<_> = self
                .ebpf
                .programs_mut()
                .filter_map(|(name, prog)| {
                    let result = match (prog, tracepoint(name)) {
                        (Program::BtfTracePoint(p), Some(tp)) => {
                            scope.spawn(move || p.load(tp, btf))
                        }
                        (Program::KProbe(p), None) if kprobe(name) => scope.spawn(move || p.load()),
                        _ => return None,
                    };
                    Some((name.to_owned(), result))
                })
                .collect();
            loads
                .into_iter()
                .map(|(name, load)| {
                    let result = match load.join() {
                        Ok(r) => r.map_err(|e| load_error(&name, e)),
                        Err(_) => Err(anyhow!("loading {name} panicked")),
                    };
                    (name, result)
                })
                .collect()
        }))
    }

    /// Attaches each tracepoint's direct-load program, or its probe-read
    /// twin where the verifier refused that one. `probe_reads` takes the
    /// same way as a refusal, so that its tests cover it.
    fn attach_tracepoints(
        &mut self,
        btf: &aya::Btf,
        loaded: &mut Loaded,
        probe_reads: bool,
    ) -> Result<()> {
        const READS: &str = "every device, every netns, probe reads";
        for t in &TRACEPOINTS {
            let direct = if probe_reads {
                Err(anyhow!("not loaded (probe reads asked for)"))
            } else {
                loaded
                    .remove(t.program)
                    .unwrap_or_else(|| Err(missing(t.program)))
            };
            let (program, how) = match direct {
                Ok(()) => (t.program, "every device, every netns"),
                Err(refused) => {
                    self.load_read(t, btf, loaded)
                        .map_err(|e| e.context(format!("{refused:#}")))?;
                    self.off.push(format!(
                        "direct loads in {}: {refused:#}; {} reads with probe reads instead",
                        t.program, t.read
                    ));
                    (t.read, READS)
                }
            };
            if program == t.read {
                loaded
                    .remove(t.read)
                    .unwrap_or_else(|| Err(missing(t.read)))?;
            } else if let Some(verified) = loaded.remove(t.read) {
                let standby = self.standby(t, verified);
                self.off.push(standby);
            }
            let prog_id = self.attach_tracepoint(program, t)?;
            self.attachments.push(Attachment {
                program,
                prog_id,
                target: format!("tp_btf/{}", t.tracepoint),
                how,
            });
        }
        Ok(())
    }

    /// Loads `t`'s probe-read twin, after its direct-load program failed.
    fn load_read(&mut self, t: &Tracepoint, btf: &aya::Btf, loaded: &mut Loaded) -> Result<()> {
        if !loaded.contains_key(t.read) {
            let prog: &mut BtfTracePoint = self
                .ebpf
                .program_mut(t.read)
                .ok_or_else(|| missing(t.read))?
                .try_into()?;
            let result = prog
                .load(t.tracepoint, btf)
                .map_err(|e| load_error(t.read, e));
            loaded.insert(t.read.to_owned(), result);
        }
        match loaded.get(t.read) {
            Some(Err(e)) => Err(anyhow!("{e:#}")),
            _ => Ok(()),
        }
    }

    /// What `check` says of a probe-read twin it verified but left unattached.
    fn standby(&self, t: &Tracepoint, verified: Result<()>) -> String {
        match verified.and_then(|()| self.prog_id(t.read)) {
            Ok(id) => format!(
                "{} on {}: loaded and verified (prog id {id}); attached only where {} is refused",
                t.read, t.tracepoint, t.program
            ),
            Err(e) => format!("{} on {}: {e:#}", t.read, t.tracepoint),
        }
    }

    fn prog_id(&self, name: &str) -> Result<u32> {
        let prog = self.ebpf.program(name).ok_or_else(|| missing(name))?;
        Ok(prog.info()?.id())
    }

    fn attach_tracepoint(&mut self, name: &str, t: &Tracepoint) -> Result<u32> {
        let prog: &mut BtfTracePoint = self
            .ebpf
            .program_mut(name)
            .ok_or_else(|| missing(name))?
            .try_into()?;
        let attached = match t.follows {
            true => self
                .device_hooks
                .attach(prog.fd()?.try_clone()?)
                .map_err(|e| e.to_string()),
            false => prog.attach().map(drop).map_err(|e| e.to_string()),
        };
        attached.map_err(|e| anyhow!("attaching {name} to tracepoint {}: {e}", t.tracepoint))?;
        Ok(prog.info()?.id())
    }

    /// The device tracepoints that only follow, to close between windows
    /// of following; they stay attached while the probes last otherwise.
    pub fn take_device_hooks(&mut self) -> DeviceHooks {
        std::mem::replace(&mut self.device_hooks, DeviceHooks::new())
    }

    fn program(&mut self, name: &str) -> Result<&mut SchedClassifier> {
        let prog = self
            .ebpf
            .program_mut(name)
            .ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))?;
        Ok(prog.try_into()?)
    }

    fn configure(&mut self, ports: &[u16], ifaces: &[Iface]) -> Result<()> {
        let mut bitmap = vec![0u32; PORT_WORDS as usize];
        for &port in ports {
            let (word, bit) = port_slot(port);
            bitmap[word as usize] |= bit;
        }
        let mut map: Array<_, u32> = self
            .ebpf
            .map_mut("PORTS")
            .context("PORTS map")?
            .try_into()?;
        for (i, word) in bitmap.into_iter().enumerate().filter(|(_, w)| *w != 0) {
            map.set(i as u32, word, 0)?;
        }
        let mut map: HashMap<_, u32, IfaceConfig> = self
            .ebpf
            .map_mut("IFACES")
            .context("IFACES map")?
            .try_into()?;
        for iface in ifaces {
            map.insert(
                iface.index,
                IfaceConfig {
                    netns: iface.netns,
                    l2_len: iface.l2_len,
                },
                0,
            )?;
        }
        Ok(())
    }

    fn attach_iface(&mut self, iface: &Iface, mode: AttachMode) -> Result<()> {
        let tcx = match mode {
            AttachMode::Auto => aya::util::KernelVersion::current()
                .is_ok_and(|v| v >= aya::util::KernelVersion::new(6, 6, 0)),
            AttachMode::Tcx => true,
            AttachMode::Netlink => false,
        };
        let mut qdisc_added = false;
        if !tcx {
            match aya::programs::tc::qdisc_add_clsact(&iface.name) {
                Ok(()) => {
                    qdisc_added = true;
                    self.added_qdiscs.push(iface.clone());
                }
                Err(e) if is_exists(&e) => {}
                Err(e) => return Err(anyhow!("adding a clsact qdisc to {}: {e}", iface.name)),
            }
        }
        let mut filters = Vec::new();
        for (name, attach_type) in PROGRAMS {
            let options = if tcx {
                TcAttachOptions::TcxOrder(LinkOrder::default())
            } else {
                TcAttachOptions::Netlink(NlOptions::default())
            };
            let prog = self.program(name)?;
            let id = prog
                .attach_with_options(&iface.name, attach_type, options)
                .map_err(|e| anyhow!("attaching {name} to {}: {e}", iface.name))?;
            let prog_id = prog.info()?.id();
            if !tcx {
                let link = prog.take_link(id)?;
                let ingress = attach_type == TcAttachType::Ingress;
                filters.push((ingress, link.priority()?, u32::from(link.handle()?)));
                self.nl_links.push(link);
            }
            let how = if tcx { "tcx link" } else { "clsact filter" };
            self.attachments.push(Attachment {
                program: name,
                prog_id,
                target: iface.name.clone(),
                how,
            });
        }
        if !tcx {
            let entry = leftovers::Entry {
                netns: iface.netns,
                iface: iface.name.clone(),
                ifindex: iface.index,
                qdisc_added,
                filters,
            };
            self.ledger
                .add(entry)
                .context("noting the tc filters in /run/dnstrace")?;
        }
        Ok(())
    }

    /// Attaches each loaded kprobe where the kernel allows; what is off is
    /// reported, with why.
    fn attach_kprobes(&mut self, loaded: &mut Loaded) {
        for (name, function, ret) in KPROBES {
            let load = loaded.remove(name).unwrap_or_else(|| {
                Err(if kprobes_available() {
                    anyhow!("program {name} missing from the eBPF object")
                } else {
                    anyhow!("not loaded: {NO_KPROBES}; `dnstrace check` verifies it")
                })
            });
            match load.and_then(|()| self.attach_kprobe(name, function)) {
                Ok(prog_id) => {
                    let kind = if ret { "kretprobe" } else { "kprobe" };
                    self.attachments.push(Attachment {
                        program: name,
                        prog_id,
                        target: format!("{kind}/{function}"),
                        how: "conntrack and NAT",
                    });
                }
                Err(e) => self.off.push(format!("{name} on {function}: {e:#}")),
            }
        }
    }

    /// Attaches the socket programs at cgroup v2's root, beside any
    /// other there: lookups are counted nowhere else.
    fn attach_sockets(&mut self, root: Option<PathBuf>) -> Result<()> {
        let root = root.ok_or_else(|| {
            anyhow!("lookups are counted at sockets, through cgroup v2, which is not mounted here (in a container, mount the host's /sys/fs/cgroup and name it with --cgroup-root)")
        })?;
        for (program, attach, hook, how) in SOCKETS {
            let prog_id = self
                .attach_cgroup(program, attach, &root)
                .with_context(|| {
                    format!("counting lookups at cgroup v2's root {}", root.display())
                })?;
            self.attachments.push(Attachment {
                program,
                prog_id,
                target: format!("cgroup_skb/{hook} {}", root.display()),
                how,
            });
        }
        Ok(())
    }

    fn attach_cgroup(
        &mut self,
        name: &str,
        attach: CgroupSkbAttachType,
        root: &Path,
    ) -> Result<u32> {
        let cgroup = std::fs::File::open(root)
            .with_context(|| format!("opening the root cgroup {}", root.display()))?;
        let prog: &mut CgroupSkb = self
            .ebpf
            .program_mut(name)
            .ok_or_else(|| missing(name))?
            .try_into()?;
        prog.load().map_err(|e| load_error(name, e))?;
        // A link (Linux 5.7+; the ring buffer needs 5.8) sits beside the
        // programs already there, the kernel refuses the multi flag on one,
        // and it goes with the process, SIGKILL included.
        prog.attach(cgroup, attach, CgroupAttachMode::Single)
            .with_context(|| format!("attaching {name}"))?;
        Ok(prog.info()?.id())
    }

    fn attach_kprobe(&mut self, name: &'static str, function: &str) -> Result<u32> {
        let prog: &mut KProbe = self
            .ebpf
            .program_mut(name)
            .ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))?
            .try_into()?;
        let prog_id = prog.info()?.id();
        prog.attach(function, 0).map_err(|e| {
            let why = if kprobes_available() {
                e.to_string()
            } else {
                NO_KPROBES.to_owned()
            };
            anyhow!("loaded and verified (prog id {prog_id}) but not attached: {why}")
        })?;
        Ok(prog_id)
    }

    /// Where programs are attached, each once.
    pub fn targets(&self) -> Vec<String> {
        let mut targets: Vec<String> = self.attachments.iter().map(|a| a.target.clone()).collect();
        targets.dedup();
        targets
    }

    /// Interface names by ifindex, for output.
    pub fn iface_names(&self) -> std::collections::HashMap<u32, String> {
        self.ifaces
            .iter()
            .map(|i| (i.index, i.name.clone()))
            .collect()
    }

    /// The maps the programs write events to.
    pub fn take_events(&mut self) -> Result<EventMaps> {
        let map = self.ebpf.take_map("EVENTS").context("EVENTS map")?;
        let aya::maps::Map::RingBuf(ring) = map else {
            bail!("the EVENTS map is not a ring buffer");
        };
        let map = self.ebpf.take_map("PAYLOADS").context("PAYLOADS map")?;
        let payloads = PerfEventArray::try_from(map)?;
        Ok(EventMaps { ring, payloads })
    }

    /// Events the kernel could not queue because the ring buffer was full.
    /// Attached and set up, dnstrace needs no privilege but CAP_NET_ADMIN
    /// to remove netlink filters at exit: every other capability goes, for
    /// good (bounding set, no new privileges). Call it before starting any
    /// thread: capabilities are per thread.
    pub fn drop_privileges(&self) -> Result<()> {
        const CAP_NET_ADMIN: u64 = 1 << 12;
        let netlink = !self.nl_links.is_empty() || !self.added_qdiscs.is_empty();
        limit_capabilities(if netlink { CAP_NET_ADMIN } else { 0 })
            .context("dropping capabilities after attaching")
    }

    pub fn lost_events(&self) -> Result<u64> {
        self.count(COUNT_LOST)
    }

    /// Packets the sampling level left out.
    pub fn shed_events(&self) -> Result<u64> {
        self.count(COUNT_SHED)
    }

    /// Laps of a query going round one place that were not sent.
    pub fn laps_left_out(&self) -> Result<u64> {
        self.count(COUNT_LAPS)
    }

    /// TCP payloads the perf buffers had no room for.
    pub fn apart_lost(&self) -> Result<u64> {
        self.count(COUNT_APART_LOST)
    }

    /// Runs of the programs the kernel skipped (one already running on
    /// that CPU): packets not seen, though no event was lost.
    pub fn skipped_runs(&self) -> u64 {
        misses::skipped_runs(&self.ebpf)
    }

    /// The instructions the verifier walked to load `program`.
    pub fn verified(&self, program: &str) -> Option<u32> {
        misses::verified(&self.ebpf, program)
    }

    fn count(&self, counter: u32) -> Result<u64> {
        let map: PerCpuArray<_, u64> = self.ebpf.map("COUNTS").context("COUNTS map")?.try_into()?;
        Ok(map.get(&counter, 0)?.iter().sum())
    }

    /// A handle of its own on the counters, for the ring's reader: losses
    /// are what raise the sampling level.
    pub fn counts(&self) -> Result<Counts> {
        let map = self.ebpf.map("COUNTS").context("COUNTS map")?;
        let fd = match map {
            aya::maps::Map::PerCpuArray(data) => {
                std::os::fd::AsFd::as_fd(data.fd()).try_clone_to_owned()?
            }
            _ => anyhow::bail!("COUNTS is not a per-CPU array"),
        };
        let map = aya::maps::Map::from_map_data(MapData::from_fd(fd)?)?;
        Ok(Counts(map.try_into()?))
    }

    /// A handle of its own on the watched addresses, for whoever follows
    /// a target that moves while tracing (a pod re-created, a resolver
    /// restarted). Take it before dropping privileges.
    pub fn watched(&self) -> Result<Watched> {
        Ok(Watched {
            addrs: self.own_map("WATCHED")?.try_into()?,
            netns: self.own_map("TARGET_NETNS")?.try_into()?,
        })
    }

    /// A handle of its own on the addresses cluster views follow.
    pub fn view_map(&self) -> Result<ViewMap> {
        Ok(ViewMap {
            addrs: self.own_map("VIEWED")?.try_into()?,
            count: self.own_map("VIEWING")?.try_into()?,
        })
    }

    /// A handle of its own on the scope, for whoever follows the node's
    /// pods. Take it before dropping privileges.
    pub fn scope(&self) -> Result<ScopeMap> {
        Ok(ScopeMap(self.own_map("SCOPE")?.try_into()?))
    }

    /// A handle of its own on map `name`.
    fn own_map(&self, name: &str) -> Result<aya::maps::Map> {
        let map = self.ebpf.map(name).with_context(|| format!("{name} map"))?;
        let data = match map {
            aya::maps::Map::HashMap(data) | aya::maps::Map::Array(data) => data,
            _ => anyhow::bail!("{name} is not a hash map or an array"),
        };
        let fd = std::os::fd::AsFd::as_fd(data.fd()).try_clone_to_owned()?;
        Ok(aya::maps::Map::from_map_data(MapData::from_fd(fd)?)?)
    }

    /// The programs' log, for the caller to forward once privileges are
    /// dropped; `None` unless asked for.
    pub fn take_kernel_log(&mut self) -> Option<KernelLog> {
        self.kernel_log.take()
    }

    /// The maps where the kernel counts lookups (`count_lookups`).
    pub fn take_lookup_maps(&mut self) -> Result<LookupMaps> {
        let mut take = |name: &str| {
            self.ebpf
                .take_map(name)
                .with_context(|| format!("{name} map"))
        };
        let aya::maps::Map::Array(slots) = take("PENDING_SLOTS")? else {
            anyhow::bail!("PENDING_SLOTS is not an array");
        };
        Ok(LookupMaps {
            slots,
            pending: take("PENDING")?.try_into()?,
            counts: take("LOOKUPS")?.try_into()?,
            stats: take("LOOKUP_STATS")?.try_into()?,
        })
    }

    /// The sampling level the programs read, for the ring's reader to set.
    pub fn take_sample_level(&mut self) -> Result<SampleMap> {
        let map = self.ebpf.take_map("SAMPLE").context("SAMPLE map")?;
        Ok(map.try_into()?)
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        // Dropping a netlink link detaches its filter.
        self.nl_links.clear();
        for (name, _) in PROGRAMS {
            if let Ok(prog) = self.program(name) {
                // Unloading detaches every link and netlink filter of the program.
                let _ = prog.unload();
            }
        }
        for iface in &self.added_qdiscs {
            if let Err(e) = netlink::delete_clsact(iface.index) {
                log::warn!(
                    "could not remove the clsact qdisc dnstrace added to {}: {e}",
                    iface.name
                );
            }
        }
    }
}

/// Keeps only the capabilities in `keep` (a bit per capability) in the
/// effective, permitted and bounding sets; clears inheritable and ambient.
fn limit_capabilities(keep: u64) -> std::io::Result<()> {
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    let check = |rc: libc::c_int| match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    };
    // SAFETY: prctl(2) with integer arguments only.
    unsafe {
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        for cap in (0..=last.min(63)).filter(|c| keep & (1 << c) == 0) {
            let rc = libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0);
            let e = std::io::Error::last_os_error();
            // Without CAP_SETPCAP (a container given only what dnstrace
            // needs) the bounding set stays as the runtime made it; the
            // sets below are still cleared.
            if rc != 0 && e.raw_os_error() == Some(libc::EPERM) {
                break;
            }
            check(rc)?;
        }
        check(libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        ))?;
    }
    let header = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let words = [keep as u32, (keep >> 32) as u32].map(|w| Data {
        effective: w,
        permitted: w,
        inheritable: 0,
    });
    // SAFETY: capset(2) with a version 3 header and its two data words.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, words.as_ptr()) };
    check(rc as libc::c_int)
}

/// Whether kprobes can attach here: the kprobe PMU (or, on older kernels,
/// tracefs's kprobe_events) exists only where the kernel has kprobe events.
fn kprobes_available() -> bool {
    [
        "/sys/bus/event_source/devices/kprobe",
        "/sys/kernel/tracing/kprobe_events",
        "/sys/kernel/debug/tracing/kprobe_events",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists())
}

/// The interface already had a clsact qdisc (someone else's: leave it on exit).
fn is_exists(e: &aya::programs::tc::TcError) -> bool {
    use aya::programs::tc::TcError;
    match e {
        TcError::NetlinkError(e) => e.raw_os_error() == Some(libc::EEXIST),
        TcError::IoError(e) => e.raw_os_error() == Some(libc::EEXIST),
        TcError::AlreadyAttached => true,
        _ => false,
    }
}

/// An empty object: build.rs found no eBPF toolchain.
fn check_built_with_programs(object: &[u8]) -> Result<()> {
    if object.is_empty() {
        bail!("built without the eBPF programs: run `cargo xtask setup` and rebuild");
    }
    Ok(())
}

/// Root, or the capabilities loading and attaching need.
pub fn check_privileges() -> Result<()> {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| eff & (1 << cap) != 0;
    let bpf = has(CAP_BPF) || has(CAP_SYS_ADMIN);
    let perfmon = has(CAP_PERFMON) || has(CAP_SYS_ADMIN);
    if !(bpf && perfmon && has(CAP_NET_ADMIN)) {
        bail!("dnstrace needs root, or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN: run it with sudo");
    }
    Ok(())
}

fn check_kernel() -> Result<()> {
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        bail!("this kernel exposes no BTF (/sys/kernel/btf/vmlinux is missing): dnstrace needs a kernel built with CONFIG_DEBUG_INFO_BTF=y");
    }
    let tc = aya::sys::is_program_supported(ProgramType::SchedClassifier).unwrap_or(false);
    if !tc {
        bail!("this kernel cannot load tc classifier programs (CONFIG_NET_CLS_BPF / CONFIG_NET_CLS_ACT): dnstrace cannot capture here");
    }
    let ringbuf = aya::sys::is_map_supported(aya::maps::MapType::RingBuf).unwrap_or(false);
    if !ringbuf {
        bail!("this kernel has no BPF ring buffer (Linux 5.8 or later is needed)");
    }
    Ok(())
}

/// What `off` says when answers cannot be counted at the socket.
fn missing(name: &str) -> anyhow::Error {
    anyhow!("program {name} missing from the eBPF object")
}

/// A load failure, with the verifier's last lines when it rejected the program.
fn load_error(name: &str, e: ProgramError) -> anyhow::Error {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            anyhow!(
                "{}",
                verifier_message(name, &io_error, &verifier_log.to_string())
            )
        }
        e => anyhow!("loading program {name} failed: {e}"),
    }
}

fn verifier_message(name: &str, io_error: &std::io::Error, log: &str) -> String {
    let mut msg =
        format!("the kernel's verifier rejected program {name} ({io_error}); its last lines:");
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    for line in &lines[lines.len().saturating_sub(8)..] {
        let _ = write!(msg, "\n    {line}");
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_iface_outside_the_nodes_namespaces_is_refused() {
        let iface = Iface {
            name: "eth0".into(),
            index: 2,
            netns: 7,
            l2_len: 14,
        };
        let scope = |netns: &[u32]| KernelScope {
            netns: netns.iter().copied().collect(),
        };
        let ifaces = [iface];
        assert!(check_ifaces_in_scope(&ifaces, None).is_ok());
        assert!(check_ifaces_in_scope(&ifaces, Some(&scope(&[7, 9]))).is_ok());
        let err = check_ifaces_in_scope(&ifaces, Some(&scope(&[8, 9]))).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--iface eth0 is in this network namespace, not the --node's"),
            "{err}"
        );
    }

    #[test]
    fn verifier_message_keeps_the_last_lines() {
        let log: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        let err = std::io::Error::from_raw_os_error(libc::EACCES);
        let msg = verifier_message("dns_tc_ingress", &err, &log);
        assert!(msg.starts_with("the kernel's verifier rejected program dns_tc_ingress"));
        assert!(msg.ends_with("    line 20"));
        assert!(msg.contains("line 13") && !msg.contains("line 12\n"));
    }

    #[test]
    fn a_build_without_programs_says_so() {
        let err = check_built_with_programs(&[]).unwrap_err().to_string();
        assert_eq!(
            err,
            "built without the eBPF programs: run `cargo xtask setup` and rebuild"
        );
    }

    #[test]
    fn tc_l2_len_is_shared_or_mixed() {
        let iface = |l2_len| Iface {
            name: String::new(),
            index: 1,
            netns: 0,
            l2_len,
        };
        assert_eq!(tc_l2_len(&[iface(14), iface(14)]), 14);
        assert_eq!(tc_l2_len(&[iface(0)]), 0);
        assert_eq!(tc_l2_len(&[iface(14), iface(0)]), L2_LEN_MIXED);
    }

    #[test]
    fn unknown_interface_is_a_clear_error() {
        let err = Iface::lookup("no-such-if0", 0).unwrap_err().to_string();
        assert!(err.contains("no interface named \"no-such-if0\""), "{err}");
    }
}
