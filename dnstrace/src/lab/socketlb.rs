//! The `socket-lb` proxy mode: no kube-proxy rules for kube-dns; a
//! balancer of the lab's own (dnstrace-ebpf's `socketlb` object) rewrites
//! the service address at the socket, as Cilium's kube-proxy replacement
//! does. Its cgroup programs are attached at the root of cgroup v2, so they
//! see every socket of the machine; they act only on those of the lab's
//! network namespaces, by their cookies. The links are pinned in a bpffs of
//! the lab's own, so they outlive `lab up`; `lab down` unmounts it.
use std::{
    ffi::CString,
    fs::File,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, bail, Context as _, Result};
use aya::{
    maps::HashMap,
    programs::{links::FdLink, CgroupAttachMode, CgroupSockAddr},
    Ebpf,
};
use dnstrace_common::socketlb::{Backends, SockAddr4, MAX_BACKENDS};

use super::faults::Fault;
use crate::mounts::{cgroup2_root, mounted};

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/socketlb.o"));

/// The object's programs: connect and sendmsg forward to a backend,
/// recvmsg and getpeername give the service back.
const PROGRAMS: [&str; 4] = [
    "lb_connect4",
    "lb_sendmsg4",
    "lb_recvmsg4",
    "lb_getpeername4",
];

/// The DNS port, which the lab's services and backends share.
const DNS_PORT: u16 = 53;

/// A service the balancer knows, with the backends it picks from.
pub struct Service {
    pub ip: Ipv4Addr,
    pub backends: Vec<Ipv4Addr>,
}

/// Where the links are pinned: a bpffs mounted for the lab. Beside
/// the lab's directory, not in it: a mount there would stop a `lab down` that knows
/// nothing of it (an older dnstrace's) from removing the directory.
pub fn pin_dir() -> PathBuf {
    PathBuf::from(format!("{}-bpf", super::plan::lab_dir().display()))
}

/// Why `fault` does not apply in this mode, if it does not.
pub fn inapplicable(fault: Fault) -> Option<&'static str> {
    match fault {
        Fault::BridgeNfOff => Some("bridge-nf-off does not apply with --proxy-mode socket-lb: no DNAT is done on the wire, so there is no reverse NAT for br_netfilter to skip"),
        Fault::NoDnsTcp => Some("no-dns-tcp does not apply with --proxy-mode socket-lb: the lab's balancer matches a service by address and port, whatever the protocol, so it has no TCP port to leave out"),
        _ => None,
    }
}

/// Attaches the balancer with `services` and the lab's namespaces
/// `netns`, in place of any attached before (a fault changed them).
pub fn attach(services: &[Service], netns: &[String]) -> Result<()> {
    detach()?;
    let dir = &pin_dir();
    std::fs::create_dir_all(dir)?;
    mount_bpffs(dir)?;
    let mut ebpf = Ebpf::load(OBJECT).map_err(|e| anyhow!("loading the balancer failed: {e}"))?;
    fill_netns(&mut ebpf, netns)?;
    fill_services(&mut ebpf, services)?;
    let root = cgroup2_root()?
        .ok_or_else(|| anyhow!("cgroup v2 is not mounted: the socket-lb mode needs it"))?;
    let cgroup = File::open(root).context("opening the root cgroup")?;
    for name in PROGRAMS {
        attach_program(&mut ebpf, name, &cgroup, dir)
            .with_context(|| format!("attaching the balancer's {name}"))?;
    }
    Ok(())
}

/// Loads `name`, attaches it at `cgroup` beside any other program there,
/// and pins its link in `dir`.
fn attach_program(ebpf: &mut Ebpf, name: &str, cgroup: &File, dir: &Path) -> Result<()> {
    let prog: &mut CgroupSockAddr = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("not in the object"))?
        .try_into()?;
    prog.load()?;
    // A cgroup link always sits beside the programs already there; the
    // kernel refuses the multi flag on one (it is for the older attach).
    let id = prog.attach(cgroup, CgroupAttachMode::Single)?;
    let link = FdLink::try_from(prog.take_link(id)?)?;
    link.pin(dir.join(name))?;
    Ok(())
}

fn fill_netns(ebpf: &mut Ebpf, netns: &[String]) -> Result<()> {
    let mut map: HashMap<_, u64, u8> = HashMap::try_from(
        ebpf.map_mut("LAB_NETNS")
            .ok_or_else(|| anyhow!("no LAB_NETNS map"))?,
    )?;
    for ns in netns {
        let path = Path::new("/run/netns").join(ns);
        let cookie = crate::netns::in_netns(Some(&path), netns_cookie)
            .with_context(|| format!("the cookie of network namespace {ns}"))?;
        map.insert(cookie, 1, 0)?;
    }
    Ok(())
}

fn fill_services(ebpf: &mut Ebpf, services: &[Service]) -> Result<()> {
    let mut map: HashMap<_, SockAddr4, Backends> = HashMap::try_from(
        ebpf.map_mut("SERVICES")
            .ok_or_else(|| anyhow!("no SERVICES map"))?,
    )?;
    for s in services {
        map.insert(SockAddr4::new(s.ip.octets(), DNS_PORT), backends(s)?, 0)?;
    }
    Ok(())
}

/// The map's value for `s`: no backends leaves its sockets untouched.
fn backends(s: &Service) -> Result<Backends> {
    if s.backends.len() > MAX_BACKENDS {
        bail!("{} has more than {MAX_BACKENDS} backends", s.ip);
    }
    let mut b = Backends {
        count: s.backends.len() as u32,
        ..Backends::default()
    };
    for (slot, ip) in b.ips.iter_mut().zip(&s.backends) {
        *slot = SockAddr4::new(ip.octets(), DNS_PORT).ip;
    }
    Ok(b)
}

/// The calling thread's network namespace's cookie, as
/// `bpf_get_netns_cookie` gives it (Linux 5.14 and later).
fn netns_cookie() -> Result<u64> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a u64 out-parameter of its size, on a socket we hold.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&socket),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .context("SO_NETNS_COOKIE (Linux 5.14 or later)");
    }
    Ok(cookie)
}

fn mount_bpffs(dir: &Path) -> Result<()> {
    let target = CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: NUL-terminated strings; no data.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target.as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("mounting a bpffs on {}", dir.display()));
    }
    Ok(())
}

/// Unpins the links, which detaches the programs, and unmounts and removes
/// the lab's bpffs; returns whether there was one.
pub fn detach() -> Result<bool> {
    let dir = &pin_dir();
    if !mounted("bpf", dir)? {
        return Ok(false);
    }
    for name in PROGRAMS {
        match std::fs::remove_file(dir.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
    }
    let target = CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::umount(target.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("unmounting {}", dir.display()));
    }
    std::fs::remove_dir(dir).with_context(|| format!("removing {}", dir.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_are_in_network_order_as_the_socket_holds_addresses() {
        let s = Service {
            ip: Ipv4Addr::new(10, 96, 0, 10),
            backends: vec![Ipv4Addr::new(10, 244, 0, 53), Ipv4Addr::new(10, 244, 0, 54)],
        };
        let b = backends(&s).unwrap();
        assert_eq!(b.count, 2);
        assert_eq!(b.ips[0].to_ne_bytes(), [10, 244, 0, 53]);
        assert_eq!(b.ips[1].to_ne_bytes(), [10, 244, 0, 54]);
        assert_eq!(b.ips[2], 0);
        let key = SockAddr4::new([10, 96, 0, 10], DNS_PORT);
        assert_eq!(key.port.to_ne_bytes(), [0, 53, 0, 0]);
    }

    #[test]
    fn a_service_without_backends_is_left_to_the_wire() {
        let s = Service {
            ip: Ipv4Addr::new(10, 96, 0, 10),
            backends: Vec::new(),
        };
        assert_eq!(backends(&s).unwrap().count, 0);
        let five = Service {
            backends: vec![Ipv4Addr::LOCALHOST; MAX_BACKENDS + 1],
            ..s
        };
        assert!(backends(&five).is_err());
    }

    #[test]
    fn only_the_bridge_and_tcp_port_faults_do_not_apply() {
        assert!(inapplicable(Fault::BridgeNfOff).is_some());
        assert!(inapplicable(Fault::NoDnsTcp).is_some());
        for f in [
            Fault::NoDnat,
            Fault::Drop,
            Fault::UpstreamTimeout,
            Fault::Servfail,
        ] {
            assert_eq!(inapplicable(f), None, "{f:?}");
        }
    }
}
