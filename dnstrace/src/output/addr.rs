//! Socket addresses as text and as JSON strings, written without `fmt`'s
//! machinery: a journey, as text or as JSON, is mostly addresses, and
//! formatting them through `Display` was a seventh of a replay's time.
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};

/// `a` as its `Display` writes it.
pub fn text(out: &mut Vec<u8>, a: &SocketAddr) {
    match a {
        SocketAddr::V4(v4) => Digits::v4(v4).put(out),
        SocketAddr::V6(_) => out.extend_from_slice(a.to_string().as_bytes()),
    }
}

/// IPv4 socket addresses' text, kept by address: a lookup's legs name the
/// same three or four, and the service's and its endpoints' recur across
/// lookups. Writing each anew (about 150 instructions) was a third of a
/// journey's text; a kept one is a copy. Its spots are made at first use.
#[derive(Default)]
pub(super) struct Texts {
    spots: Vec<(u64, Digits)>,
}

/// A power of two: a spot is the top bits of the key's hash.
const SPOTS: usize = 256;
const _: () = assert!(SPOTS.is_power_of_two());

impl Texts {
    /// `text`, from the spot of `a` when it holds `a`.
    pub(super) fn text(&mut self, out: &mut Vec<u8>, a: &SocketAddr) {
        let SocketAddr::V4(v4) = a else {
            return text(out, a);
        };
        if self.spots.is_empty() {
            self.spots.resize_with(SPOTS, Default::default);
        }
        // Bit 48 set: no key is 0, an empty spot's.
        let key = u64::from(v4.ip().to_bits()) << 16 | u64::from(v4.port()) | 1 << 48;
        let at = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (u64::BITS - SPOTS.ilog2());
        let (held, digits) = &mut self.spots[at as usize];
        if *held != key {
            *held = key;
            *digits = Digits::v4(v4);
        }
        digits.put(out);
    }

    /// `json`, through `text` above.
    pub(super) fn json(&mut self, out: &mut Vec<u8>, a: &SocketAddr) {
        out.push(b'"');
        self.text(out, a);
        out.push(b'"');
    }

    /// An optional (before, after) pair of a NAT: `null` or two strings.
    pub(super) fn pair(&mut self, out: &mut Vec<u8>, p: Option<&(SocketAddr, SocketAddr)>) {
        match p {
            None => out.extend_from_slice(b"null"),
            Some((a, b)) => {
                out.push(b'[');
                self.json(out, a);
                out.push(b',');
                self.json(out, b);
                out.push(b']');
            }
        }
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
        IpAddr::V4(v4) => {
            let mut buf = Digits::default();
            buf.ipv4(v4);
            buf.put(out);
        }
        IpAddr::V6(_) => out.extend_from_slice(ip.to_string().as_bytes()),
    }
    out.push(b'"');
}

/// Room for the longest IPv4 address and port, `255.255.255.255:65535`,
/// and the 4-byte copies that write it: written here, then copied out at
/// once, where a push a digit checked the vector's room each time.
#[derive(Default)]
struct Digits {
    buf: [u8; 28],
    len: usize,
}

/// Each byte's decimal digits, padded to 4 bytes, and how many there are:
/// an octet is one 4-byte copy, not divisions and a push a digit.
const OCTETS: [([u8; 4], u8); 256] = {
    let mut t = [([0; 4], 0); 256];
    let mut v = 0;
    while v < 256 {
        let (h, d, u) = ((v / 100) as u8, (v / 10 % 10) as u8, (v % 10) as u8);
        t[v] = match v {
            0..=9 => ([b'0' + u, 0, 0, 0], 1),
            10..=99 => ([b'0' + d, b'0' + u, 0, 0], 2),
            _ => ([b'0' + h, b'0' + d, b'0' + u, 0], 3),
        };
        v += 1;
    }
    t
};

impl Digits {
    /// `a`'s address and port.
    fn v4(a: &SocketAddrV4) -> Self {
        let mut buf = Self::default();
        buf.ipv4(a.ip());
        buf.push(b':');
        buf.port(a.port());
        buf
    }

    /// Appends what was written to `out`: all of the buffer, a copy of
    /// known size done in a few moves, then cut back, where a copy of the
    /// written length was a call to `memcpy`.
    fn put(&self, out: &mut Vec<u8>) {
        let at = out.len();
        out.extend_from_slice(&self.buf);
        out.truncate(at + self.len);
    }

    fn push(&mut self, b: u8) {
        self.buf[self.len] = b;
        self.len += 1;
    }

    fn ipv4(&mut self, ip: &Ipv4Addr) {
        let [a, b, c, d] = ip.octets();
        self.octet(a);
        for o in [b, c, d] {
            self.push(b'.');
            self.octet(o);
        }
    }

    /// A byte in decimal: its 4 bytes copied, its digits counted.
    fn octet(&mut self, v: u8) {
        let (digits, n) = OCTETS[usize::from(v)];
        self.buf[self.len..self.len + 4].copy_from_slice(&digits);
        self.len += usize::from(n);
    }

    /// A port in decimal.
    fn port(&mut self, v: u16) {
        let mut b = itoa::Buffer::new();
        let digits = b.format(v).as_bytes();
        self.buf[self.len..self.len + digits.len()].copy_from_slice(digits);
        self.len += digits.len();
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
            // Twice through one cache: the second from its spots.
            let mut texts = Texts::default();
            for _ in 0..2 {
                let mut out = Vec::new();
                text(&mut out, &a);
                out.push(b' ');
                json(&mut out, &a);
                out.push(b' ');
                texts.text(&mut out, &a);
                out.push(b' ');
                texts.pair(&mut out, Some(&(a, b)));
                out.push(b' ');
                json_ip(&mut out, &a.ip());
                let expect = format!(
                    "{a} {} {a} {} {}",
                    serde_json::json!(a.to_string()),
                    serde_json::json!([a.to_string(), b.to_string()]),
                    serde_json::json!(a.ip().to_string())
                );
                assert_eq!(String::from_utf8(out).unwrap(), expect, "{written}");
            }
        }
        let mut none = Vec::new();
        Texts::default().pair(&mut none, None);
        assert_eq!(none, b"null");
    }

    /// Ten times as many addresses as spots, twice over: each spot held by
    /// many in turn, and the zero address, whose key must not read as empty.
    #[test]
    fn kept_texts_are_each_address_s_own_whoever_held_the_spot() {
        let mut texts = Texts::default();
        let addrs: Vec<SocketAddr> = (0..10 * SPOTS as u32)
            .map(|i| SocketAddr::from((i.to_be_bytes(), (i % 7) as u16)))
            .collect();
        for _ in 0..2 {
            for a in &addrs {
                let mut out = Vec::new();
                texts.text(&mut out, a);
                assert_eq!(String::from_utf8(out).unwrap(), a.to_string());
            }
        }
    }

    #[test]
    fn every_octet_and_port_width_reads_as_display_writes_it() {
        for v in 0..=255u8 {
            for port in [0, 9, 10, 99, 100, 999, 1000, 9999, 10000, 65535] {
                let a = SocketAddr::from(([v, 255 - v, v / 3, 7], port));
                let mut out = Vec::new();
                text(&mut out, &a);
                assert_eq!(String::from_utf8(out).unwrap(), a.to_string());
            }
        }
    }
}
