//! Socket addresses as JSON strings, written without `fmt`'s machinery:
//! a journey's JSON is mostly addresses, and formatting them through
//! `Display` was a seventh of a replay's time.
use std::{borrow::Borrow, net::SocketAddr};

use serde::{ser::Error as _, Serialize, Serializer};

/// `#[serde(with = "json_addr")]` for a `SocketAddr`; the same text as its
/// `Display`.
pub fn serialize<S: Serializer>(a: &SocketAddr, s: S) -> Result<S::Ok, S::Error> {
    let SocketAddr::V4(v4) = a else {
        return s.collect_str(a);
    };
    let mut buf = [0u8; 21];
    let mut n = 0;
    for (i, octet) in v4.ip().octets().into_iter().enumerate() {
        if i > 0 {
            buf[n] = b'.';
            n += 1;
        }
        n += decimal(&mut buf[n..], u32::from(octet));
    }
    buf[n] = b':';
    n += 1;
    n += decimal(&mut buf[n..], u32::from(v4.port()));
    s.serialize_str(std::str::from_utf8(&buf[..n]).map_err(S::Error::custom)?)
}

/// For an optional (before, after) pair of a NAT, boxed or not.
pub fn pair<S, P>(p: &Option<P>, s: S) -> Result<S::Ok, S::Error>
where
    S: Serializer,
    P: Borrow<(SocketAddr, SocketAddr)>,
{
    match p {
        None => s.serialize_none(),
        Some(p) => {
            let (a, b) = p.borrow();
            (Addr(a), Addr(b)).serialize(s)
        }
    }
}

struct Addr<'a>(&'a SocketAddr);

impl Serialize for Addr<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize(self.0, s)
    }
}

/// Writes `v` in decimal at the start of `buf`; returns how many bytes.
fn decimal(buf: &mut [u8], mut v: u32) -> usize {
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let len = digits.len() - at;
    buf[..len].copy_from_slice(&digits[at..]);
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Both {
        #[serde(with = "super")]
        a: SocketAddr,
        #[serde(serialize_with = "pair")]
        nat: Option<Box<(SocketAddr, SocketAddr)>>,
    }

    #[test]
    fn writes_what_display_writes() {
        for text in [
            "0.0.0.0:0",
            "10.96.0.10:53",
            "255.255.255.255:65535",
            "1.20.100.7:1024",
            "[fd00::a]:53",
            "[::ffff:10.0.0.1]:5353",
        ] {
            let a: SocketAddr = text.parse().unwrap();
            let b: SocketAddr = "10.244.0.53:53".parse().unwrap();
            let json = serde_json::to_string(&Both {
                a,
                nat: Some(Box::new((a, b))),
            })
            .unwrap();
            let expect =
                serde_json::json!({"a": a.to_string(), "nat": [a.to_string(), b.to_string()]});
            assert_eq!(json, expect.to_string(), "{text}");
        }
        let none = Both {
            a: "1.2.3.4:5".parse().unwrap(),
            nat: None,
        };
        assert_eq!(
            serde_json::to_string(&none).unwrap(),
            r#"{"a":"1.2.3.4:5","nat":null}"#
        );
    }
}
