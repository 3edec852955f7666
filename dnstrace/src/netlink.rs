//! Netlink subscriptions (ctnetlink events, link changes) in a network
//! namespace, and the message and attribute framing they share.
use std::{
    io,
    mem::size_of,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::Path,
};

use anyhow::{anyhow, bail, Result};
use tokio::io::{unix::AsyncFd, Interest};

use crate::netns::in_netns;

const NLA_TYPE_MASK: u16 = 0x3fff;

/// A raw netlink socket of `protocol`, close-on-exec, with `flags` (such as
/// SOCK_NONBLOCK) added.
pub fn socket(protocol: i32, flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned at once.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | flags,
            protocol,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor no one else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// A netlink socket bound to multicast `groups` in a namespace.
pub struct Subscription {
    fd: AsyncFd<OwnedFd>,
    buf: Vec<u8>,
    /// Messages the kernel could not queue for us (ENOBUFS).
    pub overruns: u64,
}

impl Subscription {
    /// `rcvbuf` bytes of queue; root may exceed rmem_max.
    pub fn open(netns: Option<&Path>, protocol: i32, groups: u32, rcvbuf: i32) -> Result<Self> {
        let fd = in_netns(netns, move || {
            let fd = socket(protocol, libc::SOCK_NONBLOCK)
                .map_err(|e| anyhow!("netlink socket: {e}"))?;
            // SAFETY: zeroed sockaddr_nl with its family and groups set.
            let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
            addr.nl_family = libc::AF_NETLINK as u16;
            addr.nl_groups = groups;
            let len = std::mem::size_of::<libc::sockaddr_nl>() as u32;
            // SAFETY: bind with a valid address of the given length.
            if unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
                bail!("{}", io::Error::last_os_error());
            }
            // SAFETY: setsockopt with a valid int.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUFFORCE,
                    (&raw const rcvbuf).cast(),
                    4,
                );
            }
            Ok(fd)
        })?;
        // SAFETY: the AsyncFd owns the socket, which stays open as long as it.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| anyhow!("{}", e.into_parts().1))?;
        Ok(Self {
            fd,
            buf: vec![0; 64 << 10],
            overruns: 0,
        })
    }

    /// Waits until messages arrive, then hands each queued one to `each`.
    pub async fn next(&mut self, mut each: impl FnMut(&[u8])) -> io::Result<()> {
        let mut guard = self.fd.readable_mut().await?;
        loop {
            // SAFETY: recv into our own buffer of the given length.
            let n = unsafe {
                libc::recv(
                    guard.get_inner().as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    0,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => {
                        guard.clear_ready();
                        return Ok(());
                    }
                    Some(libc::ENOBUFS) => self.overruns += 1,
                    _ => return Err(e),
                }
                continue;
            }
            messages(&self.buf[..n as usize]).for_each(&mut each);
        }
    }
}

/// Sends one request: `req` is a plain `#[repr(C)]` netlink message,
/// header first.
pub fn send<T: Copy>(sock: BorrowedFd, req: &T) -> io::Result<()> {
    // SAFETY: sending the bytes of a plain value of the given size.
    let sent = unsafe {
        libc::send(
            sock.as_raw_fd(),
            (req as *const T).cast(),
            size_of::<T>(),
            0,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A dump request of `kind` with its family header `family` (the
/// request's own struct, zeroed but for its family), and every message of
/// the answer, up to its end.
pub fn dump(sock: BorrowedFd, kind: u16, family: &[u8]) -> io::Result<Vec<Vec<u8>>> {
    let len = size_of::<libc::nlmsghdr>() + family.len();
    let mut req = Vec::with_capacity(len);
    req.extend((len as u32).to_ne_bytes());
    req.extend(kind.to_ne_bytes());
    req.extend(((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
    req.extend(1u32.to_ne_bytes());
    req.extend(0u32.to_ne_bytes());
    req.extend(family);
    // SAFETY: sending our own buffer of the given length.
    if unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 64 << 10];
    let mut all = Vec::new();
    loop {
        // SAFETY: receiving into our own buffer of the given length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        for msg in messages(&buf[..n as usize]) {
            match u16::from_ne_bytes([msg[4], msg[5]]) {
                k if k == libc::NLMSG_DONE as u16 => return Ok(all),
                k if k == libc::NLMSG_ERROR as u16 => {
                    let code = msg
                        .get(16..20)
                        .map_or(0, |b| i32::from_ne_bytes(b.try_into().unwrap_or_default()));
                    return Err(io::Error::from_raw_os_error(-code));
                }
                _ => all.push(msg.to_vec()),
            }
        }
        if n == 0 {
            return Ok(all);
        }
    }
}

/// Netlink attributes of `buf`, as (type, payload).
pub fn attrs(mut buf: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8])>> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            buf = &[];
            return Some(Err(anyhow!(
                "netlink attribute of length {len} overruns its message"
            )));
        }
        let payload = &buf[4..len];
        buf = buf.get((len + 3) & !3..).unwrap_or_default();
        Some(Ok((kind, payload)))
    })
}

/// The netlink messages in one datagram.
pub fn messages(mut buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        let len = buf
            .get(..4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize)?;
        if len < 16 || len > buf.len() {
            return None;
        }
        let msg = &buf[..len];
        buf = buf.get((len + 3) & !3..).unwrap_or_default();
        Some(msg)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_framing_is_cut_not_followed() {
        // A message claiming more bytes than the datagram holds.
        let mut msg = vec![0u8; 20];
        msg[..4].copy_from_slice(&64u32.to_ne_bytes());
        assert_eq!(messages(&msg).count(), 0);
        assert_eq!(messages(&msg[..10]).count(), 0);
        // An attribute of length 2 (under its own header) is an error.
        let attr = [2u8, 0, 1, 0];
        assert!(attrs(&attr).next().unwrap().is_err());
    }
}
