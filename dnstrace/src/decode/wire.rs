//! The common DNS message read straight from the wire, without building
//! hickory's message first: one question of class IN; A, AAAA and CNAME
//! answers; SOA in the authority section; at most an OPT record in the
//! additional one; names of plain labels. That is nearly every message a
//! cluster's DNS carries, and reading it this way is several times faster.
//! Anything else is left to hickory (`None`), and so is anything hickory
//! might read differently: what this returns is exactly what `summarize`
//! makes of hickory's reading, which tests and the `dns` fuzz target check.
use std::net::Ipv6Addr;

use hickory_proto::rr::RecordType;

use super::dns::{ipv4_text, plain, type_name, Answer, DnsMessage, Flags, Qtype, Question, Rcode};

const CLASS_IN: u16 = 1;
const TYPE_A: u16 = 1;
const TYPE_CNAME: u16 = 5;
const TYPE_SOA: u16 = 6;
const TYPE_AAAA: u16 = 28;
const TYPE_OPT: u16 = 41;
/// EDNS Client Subnet: hickory parses its data and may refuse it.
const OPTION_SUBNET: u16 = 8;
/// A name's wire length, well inside hickory's limits on both its wire and
/// text lengths.
const MAX_NAME: usize = 250;

/// The message, if it is of the common kind.
pub fn common(msg: &[u8]) -> Option<DnsMessage> {
    let mut r = Reader { msg, at: 12 };
    let head = msg.get(..12)?;
    let word = |i: usize| u16::from_be_bytes([head[i], head[i + 1]]);
    let (flags, qd, an, ns, ar) = (word(2), word(4), word(6), word(8), word(10));
    // Opcode QUERY, one question.
    if (flags >> 11) & 0xf != 0 || qd != 1 {
        return None;
    }
    let question = r.question()?;
    let answers = (0..an)
        .map(|_| r.answer(&question.name))
        .collect::<Option<Vec<_>>>()?;
    for _ in 0..ns {
        r.soa()?;
    }
    let mut rcode_high = None;
    for _ in 0..ar {
        if rcode_high.replace(r.opt()?).is_some() {
            return None;
        }
    }
    let rcode = u16::from(rcode_high.unwrap_or(0)) << 4 | flags & 0xf;
    Some(DnsMessage {
        id: word(0),
        response: flags & 0x8000 != 0,
        opcode: "QUERY".into(),
        flags: Flags {
            aa: flags & 0x0400 != 0,
            tc: flags & 0x0200 != 0,
            rd: flags & 0x0100 != 0,
            ra: flags & 0x0080 != 0,
            ad: flags & 0x0020 != 0,
            cd: flags & 0x0010 != 0,
        },
        rcode: Rcode(rcode),
        questions: vec![question],
        answers,
        authority_count: usize::from(ns),
        additional_count: 0,
        malformed: None,
    })
}

struct Reader<'a> {
    msg: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn u16(&mut self) -> Option<u16> {
        let b = self.msg.get(self.at..self.at + 2)?;
        self.at += 2;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Option<u32> {
        let b = self.msg.get(self.at..self.at + 4)?;
        self.at += 4;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn bytes(&mut self, n: usize) -> Option<&[u8]> {
        let b = self.msg.get(self.at..self.at + n)?;
        self.at += n;
        Some(b)
    }

    /// A name, as hickory writes it: labels each followed by a dot, the
    /// root alone as one. Pointers follow hickory's rules: each points
    /// before the name holding it, and reading it must stay before that.
    fn name(&mut self) -> Option<String> {
        let mut text = Vec::with_capacity(64);
        let (mut at, mut start, mut limit) = (self.at, self.at, usize::MAX);
        let mut end = None;
        let mut wire = 1;
        loop {
            if at >= limit {
                return None;
            }
            let len = *self.msg.get(at)?;
            match len >> 6 {
                0 if len == 0 => {
                    at += 1;
                    break;
                }
                0 => {
                    let label = self.msg.get(at + 1..at + 1 + usize::from(len))?;
                    wire += label.len() + 1;
                    if !plain(label) || wire > MAX_NAME {
                        return None;
                    }
                    text.extend_from_slice(label);
                    text.push(b'.');
                    at += 1 + label.len();
                }
                3 => {
                    let low = *self.msg.get(at + 1)?;
                    let to = usize::from(u16::from_be_bytes([len, low]) & 0x3fff);
                    if to >= start {
                        return None;
                    }
                    end.get_or_insert(at + 2);
                    (limit, start, at) = (start, to, to);
                }
                _ => return None,
            }
        }
        if text.is_empty() {
            text.push(b'.');
        }
        self.at = end.unwrap_or(at);
        String::from_utf8(text).ok()
    }

    fn question(&mut self) -> Option<Question> {
        let name = self.name()?;
        let qtype = self.u16()?;
        (self.u16()? == CLASS_IN).then(|| Question::new(name, Qtype(qtype), "IN"))
    }

    /// A name that may be the question's (`question`, read at 12): a
    /// pointer to it alone, as an answer's name nearly always is, reads as
    /// `name` would read it, without reading it again.
    fn name_or(&mut self, question: &str) -> Option<String> {
        if self.msg.get(self.at..self.at + 2)? == [0xc0, 12] {
            self.at += 2;
            return Some(question.to_owned());
        }
        self.name()
    }

    /// Name (read by `name`), type, class IN, TTL and the data's length.
    fn record(
        &mut self,
        name: impl FnOnce(&mut Self) -> Option<String>,
    ) -> Option<(String, u16, u32, usize)> {
        let name = name(self)?;
        let rtype = self.u16()?;
        if self.u16()? != CLASS_IN {
            return None;
        }
        let ttl = self.u32()?;
        let len = usize::from(self.u16()?);
        Some((name, rtype, ttl, len))
    }

    fn answer(&mut self, question: &str) -> Option<Answer> {
        let (name, rtype, ttl, len) = self.record(|r| r.name_or(question))?;
        let data = match (rtype, len) {
            (TYPE_A, 4) => {
                let b = self.bytes(4)?;
                ipv4_text([b[0], b[1], b[2], b[3]].into())
            }
            (TYPE_AAAA, 16) => {
                let b: [u8; 16] = self.bytes(16)?.try_into().ok()?;
                Ipv6Addr::from(b).to_string()
            }
            (TYPE_CNAME, _) => self.exactly(len, Self::name)?,
            _ => return None,
        };
        Some(Answer {
            name,
            rtype: type_name(RecordType::from(rtype)),
            ttl,
            data,
        })
    }

    /// An SOA record, read through to be sure hickory would read it too.
    fn soa(&mut self) -> Option<()> {
        let (_, rtype, _, len) = self.record(Self::name)?;
        (rtype == TYPE_SOA).then_some(())?;
        self.exactly(len, |r| {
            r.name()?;
            r.name()?;
            r.bytes(20).map(drop)
        })
    }

    /// An OPT record; returns its extended RCODE bits.
    fn opt(&mut self) -> Option<u8> {
        // The root name, type OPT; the class is the UDP payload size.
        if self.bytes(1)? != [0] || self.u16()? != TYPE_OPT {
            return None;
        }
        self.u16()?;
        let high = (self.u32()? >> 24) as u8;
        let len = usize::from(self.u16()?);
        self.exactly(len, |r| {
            let end = r.at + len;
            while r.at < end {
                let code = r.u16()?;
                let n = usize::from(r.u16()?);
                if code == OPTION_SUBNET || n == 0 || r.at + n > end {
                    return None;
                }
                r.bytes(n)?;
            }
            Some(())
        })?;
        Some(high)
    }

    /// `read` must take exactly the next `len` bytes.
    fn exactly<T>(&mut self, len: usize, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<T> {
        let end = self.at + len;
        let got = read(self)?;
        (self.at == end).then_some(got)
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use hickory_proto::{
        op::{Edns, Message, MessageType, Query, ResponseCode},
        rr::{
            rdata::{opt::EdnsOption, A, AAAA, CNAME, MX, SOA},
            Name, RData, Record,
        },
    };

    use super::*;
    use crate::decode::{dns, Body};

    fn name(s: &str) -> Name {
        Name::from_str(s).unwrap()
    }

    /// Reads `bytes` both ways: where this module reads it at all, hickory
    /// must read it too, to the same summary. Returns whether it did.
    fn agrees(bytes: &[u8]) -> bool {
        let Some(quick) = common(bytes) else {
            return false;
        };
        match dns::hickory(bytes) {
            Body::Dns(h) => assert_eq!(quick, *h, "{bytes:02x?}"),
            other => panic!("read what hickory refuses ({other:?}): {bytes:02x?}"),
        }
        true
    }

    fn message(q: &str, response: bool) -> Message {
        let mut m = Message::new();
        m.set_id(0x1234)
            .set_message_type(if response {
                MessageType::Response
            } else {
                MessageType::Query
            })
            .set_recursion_desired(true)
            .add_query(Query::query(name(q), RecordType::A));
        m
    }

    fn soa() -> Record {
        let data = SOA::new(
            name("ns.dns.cluster.local."),
            name("hostmaster.cluster.local."),
            1,
            7200,
            1800,
            86400,
            30,
        );
        Record::from_rdata(name("cluster.local."), 30, RData::SOA(data))
    }

    fn edns(option: Option<EdnsOption>, rcode_high: u8) -> Edns {
        let mut e = Edns::new();
        e.set_max_payload(1232).set_rcode_high(rcode_high);
        if let Some(o) = option {
            e.options_mut().insert(o);
        }
        e
    }

    /// The messages of a cluster's DNS, each read straight from the wire.
    fn common_messages() -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        out.push(message("web.default.svc.cluster.local.", false));
        let mut m = message("Web.Default.SVC.cluster.local.", true);
        m.set_authoritative(true).set_recursion_available(true);
        m.add_answers([
            Record::from_rdata(
                name("Web.Default.SVC.cluster.local."),
                5,
                RData::A(A::new(10, 96, 0, 10)),
            ),
            Record::from_rdata(
                name("web.default.svc.cluster.local."),
                5,
                RData::A(A::new(10, 244, 1, 200)),
            ),
        ]);
        out.push(m);
        let mut m = message("www.example.test.", true);
        m.add_answers([
            Record::from_rdata(
                name("www.example.test."),
                60,
                RData::CNAME(CNAME(name("edge.example.test."))),
            ),
            Record::from_rdata(
                name("edge.example.test."),
                60,
                RData::AAAA(AAAA::from_str("2001:db8::7").unwrap()),
            ),
        ]);
        m.set_truncated(true)
            .set_authentic_data(true)
            .set_checking_disabled(true);
        out.push(m);
        let mut m = message("nope.svc.cluster.local.", true);
        m.set_response_code(ResponseCode::NXDomain)
            .add_name_server(soa());
        out.push(m);
        let mut m = message("_dns._udp.kube-dns.", false);
        m.set_edns(edns(None, 0));
        out.push(m);
        let mut m = message("a.test.", true);
        m.set_edns(edns(Some(EdnsOption::Unknown(10, vec![7; 8])), 1));
        out.push(m);
        let mut m = Message::new();
        m.add_query(Query::query(Name::root(), RecordType::NS));
        out.push(m);
        out.into_iter().map(|m| m.to_vec().unwrap()).collect()
    }

    #[test]
    fn the_common_messages_read_as_hickory_reads_them() {
        for bytes in common_messages() {
            assert!(agrees(&bytes), "left to hickory: {bytes:02x?}");
        }
    }

    #[test]
    fn the_rest_is_left_to_hickory() {
        let mut mx = message("example.test.", true);
        mx.add_answer(Record::from_rdata(
            name("example.test."),
            60,
            RData::MX(MX::new(10, name("mx.example.test."))),
        ));
        let mut subnet = message("a.test.", false);
        subnet.set_edns(edns(
            Some(EdnsOption::Subnet("10.0.0.0/8".parse().unwrap())),
            0,
        ));
        let mut escaped = message("a.test.", false);
        escaped.queries_mut()[0] = Query::query(
            Name::from_labels([&b"a b"[..], b"test"]).unwrap(),
            RecordType::A,
        );
        let idna = message("xn--bcher-kva.test.", false);
        let mut glue = message("a.test.", true);
        glue.add_additional(Record::from_rdata(
            name("ns.test."),
            5,
            RData::A(A::new(192, 0, 2, 1)),
        ));
        for m in [mx, subnet, escaped, idna, glue] {
            let bytes = m.to_vec().unwrap();
            assert!(common(&bytes).is_none(), "{m:?}");
            assert_eq!(
                format!("{:?}", crate::decode::parse(&bytes)),
                format!("{:?}", dns::hickory(&bytes))
            );
        }
    }

    /// The `dns` fuzz target's seeds: messages dig and the resolvers sent.
    fn seeds() -> Vec<Vec<u8>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/dns");
        let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| std::fs::read(e.unwrap().path()).unwrap())
            .collect();
        out.sort();
        out
    }

    /// Every prefix of the common messages and of the seeds, and every byte
    /// of them flipped in a few ways: whatever this reads, hickory reads
    /// the same.
    #[test]
    fn damaged_messages_are_read_alike_or_left_to_hickory() {
        let mut read = 0;
        for bytes in common_messages().into_iter().chain(seeds()) {
            for n in 0..bytes.len() {
                agrees(&bytes[..n]);
            }
            for i in 0..bytes.len() {
                for flip in [0x01, 0x02, 0x10, 0x3f, 0x40, 0x80, 0xc0, 0xff] {
                    let mut b = bytes.clone();
                    b[i] ^= flip;
                    read += usize::from(agrees(&b));
                }
            }
        }
        assert!(
            read > 1000,
            "only {read} damaged messages were read straight"
        );
    }
}
