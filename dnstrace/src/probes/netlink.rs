//! The one rtnetlink request aya lacks: removing a clsact qdisc.
use std::{
    io,
    mem::size_of,
    os::fd::{AsFd, AsRawFd},
};

const TC_H_CLSACT: u32 = 0xffff_fff1;
const CLSACT_HANDLE: u32 = 0xffff_0000;

#[derive(Clone, Copy)]
#[repr(C)]
struct TcMsg {
    family: u8,
    pad1: u8,
    pad2: u16,
    ifindex: i32,
    handle: u32,
    parent: u32,
    info: u32,
}

#[derive(Clone, Copy)]
#[repr(C)]
struct Request {
    header: libc::nlmsghdr,
    tc: TcMsg,
}

/// Deletes the clsact qdisc of interface `ifindex` (and the filters on it).
pub fn delete_clsact(ifindex: u32) -> io::Result<()> {
    let sock = crate::netlink::socket(libc::NETLINK_ROUTE, 0)?;
    let req = Request {
        header: libc::nlmsghdr {
            nlmsg_len: size_of::<Request>() as u32,
            nlmsg_type: libc::RTM_DELQDISC,
            nlmsg_flags: (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16,
            nlmsg_seq: 1,
            nlmsg_pid: 0,
        },
        tc: TcMsg {
            family: 0,
            pad1: 0,
            pad2: 0,
            ifindex: ifindex as i32,
            handle: CLSACT_HANDLE,
            parent: TC_H_CLSACT,
            info: 0,
        },
    };
    crate::netlink::send(sock.as_fd(), &req)?;
    let mut buf = [0u8; 1024];
    // SAFETY: receiving into a local buffer of the given length.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    ack_status(&buf[..n as usize])
}

/// The error code of a netlink ACK (NLMSG_ERROR with 0 meaning success).
fn ack_status(msg: &[u8]) -> io::Result<()> {
    let hdr = size_of::<libc::nlmsghdr>();
    let kind = msg.get(4..6).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    let code = msg
        .get(hdr..hdr + 4)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    match (kind, code) {
        (Some(t), Some(0)) if t == libc::NLMSG_ERROR as u16 => Ok(()),
        (Some(t), Some(e)) if t == libc::NLMSG_ERROR as u16 => {
            Err(io::Error::from_raw_os_error(-e))
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "unexpected netlink reply",
        )),
    }
}
