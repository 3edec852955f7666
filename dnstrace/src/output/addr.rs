//! Socket addresses as text and as JSON strings, written without `fmt`'s
//! machinery: a journey, as text or as JSON, is mostly addresses, and
//! formatting them through `Display` was a seventh of a replay's time.
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// `a` as its `Display` writes it.
pub fn text(out: &mut Vec<u8>, a: &SocketAddr) {
    match a {
        SocketAddr::V4(v4) => {
            ipv4(out, v4.ip());
            out.push(b':');
            port_digits(out, v4.port());
        }
        SocketAddr::V6(_) => out.extend_from_slice(a.to_string().as_bytes()),
    }
}

/// `a` as a JSON string: `[`, `:`, `%` and hex digits need no escape.
pub fn json(out: &mut Vec<u8>, a: &SocketAddr) {
    out.push(b'"');
    text(out, a);
    out.push(b'"');
}

/// `ip` as a JSON string: the same text as its `Display`.
pub fn json_ip(out: &mut Vec<u8>, ip: &IpAddr) {
    out.push(b'"');
    match ip {
        IpAddr::V4(v4) => ipv4(out, v4),
        IpAddr::V6(_) => out.extend_from_slice(ip.to_string().as_bytes()),
    }
    out.push(b'"');
}

fn ipv4(out: &mut Vec<u8>, ip: &Ipv4Addr) {
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out.push(b'.');
        }
        octet_digits(out, octet);
    }
}

/// A byte in decimal, pushed digit by digit: a copy of one to three
/// bytes is a libc call, and addresses are most of a journey's line.
fn octet_digits(out: &mut Vec<u8>, v: u8) {
    if v >= 100 {
        out.push(b'0' + v / 100);
    }
    if v >= 10 {
        out.push(b'0' + v / 10 % 10);
    }
    out.push(b'0' + v % 10);
}

/// An optional (before, after) pair of a NAT: `null` or two strings.
pub fn pair(out: &mut Vec<u8>, p: Option<&(SocketAddr, SocketAddr)>) {
    match p {
        None => out.extend_from_slice(b"null"),
        Some((a, b)) => {
            out.push(b'[');
            json(out, a);
            out.push(b',');
            json(out, b);
            out.push(b']');
        }
    }
}

/// A port in decimal, pushed digit by digit (see `octet_digits`).
fn port_digits(out: &mut Vec<u8>, v: u16) {
    let mut div = 10_000;
    while div > v && div > 1 {
        div /= 10;
    }
    while div > 0 {
        out.push(b'0' + (v / div % 10) as u8);
        div /= 10;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_what_display_writes() {
        for written in [
            "0.0.0.0:0",
            "10.96.0.10:53",
            "255.255.255.255:65535",
            "1.20.100.7:1024",
            "[fd00::a]:53",
            "[::ffff:10.0.0.1]:5353",
            "[fe80::1%2]:53",
        ] {
            let a: SocketAddr = written.parse().unwrap();
            let b: SocketAddr = "10.244.0.53:53".parse().unwrap();
            let mut out = Vec::new();
            text(&mut out, &a);
            out.push(b' ');
            json(&mut out, &a);
            out.push(b' ');
            pair(&mut out, Some(&(a, b)));
            out.push(b' ');
            json_ip(&mut out, &a.ip());
            let expect = format!(
                "{a} {} {} {}",
                serde_json::json!(a.to_string()),
                serde_json::json!([a.to_string(), b.to_string()]),
                serde_json::json!(a.ip().to_string())
            );
            assert_eq!(String::from_utf8(out).unwrap(), expect, "{written}");
        }
        let mut none = Vec::new();
        pair(&mut none, None);
        assert_eq!(none, b"null");
    }
}
