//! DNS messages decoded with hickory-proto into a flat summary.
use std::{
    borrow::Cow,
    collections::BTreeMap,
    fmt,
    hash::{BuildHasher as _, Hash, Hasher},
    net::Ipv4Addr,
    sync::{Arc, Mutex, PoisonError},
};

use foldhash::fast::FixedState;
use hickory_proto::{
    op::{Header, Message, MessageType, OpCode, Query},
    rr::{DNSClass, Name, RData, Record, RecordType},
    serialize::binary::{BinDecodable as _, BinDecoder, BinEncodable as _},
};
use serde::Serialize;

use super::Body;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DnsMessage {
    pub id: u16,
    pub response: bool,
    /// Mnemonics are static; only unknown codes are formatted.
    pub opcode: Cow<'static, str>,
    pub flags: Flags,
    pub rcode: Rcode,
    pub questions: Vec<Question>,
    pub answers: Vec<Answer>,
    pub authority_count: usize,
    pub additional_count: usize,
    /// Where and why the message could not be read whole: what is above
    /// is what was read before that.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub malformed: Option<Arc<str>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Flags {
    pub aa: bool,
    pub tc: bool,
    pub rd: bool,
    pub ra: bool,
    pub ad: bool,
    pub cd: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Question {
    pub name: String,
    #[serde(rename = "type")]
    pub qtype: Qtype,
    pub class: &'static str,
    /// `name_hash(name)`: hashed once as the message is decoded, not again
    /// at each hop that carries it.
    #[serde(skip)]
    pub name_hash: u64,
}

impl Question {
    pub fn new(name: String, qtype: Qtype, class: &'static str) -> Self {
        Self {
            name_hash: name_hash(&name),
            name,
            qtype,
            class,
        }
    }
}

/// A name hashed as DNS compares names, ignoring ASCII case; the same in
/// every run and every process.
pub fn name_hash(name: &str) -> u64 {
    FixedState::with_seed(NAME_SEED).hash_one(AnyCase(name))
}

const NAME_SEED: u64 = 0x646e_7374_7261_6365;

/// A name hashed as its lowercase, as names compare ignoring case.
struct AnyCase<'a>(&'a str);

impl Hash for AnyCase<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let mut buf = [0u8; 64];
        for chunk in self.0.as_bytes().chunks(buf.len()) {
            let lower = &mut buf[..chunk.len()];
            lower.copy_from_slice(chunk);
            lower.make_ascii_lowercase();
            h.write(lower);
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Answer {
    pub name: String,
    #[serde(rename = "type")]
    pub rtype: &'static str,
    pub ttl: u32,
    pub data: String,
}

/// Parses a DNS message with hickory alone; one that does not read whole
/// but whose header does is what could be read of it, marked malformed.
pub fn hickory(payload: &[u8]) -> Body {
    match Message::from_vec(payload) {
        Ok(msg) => Body::Dns(Arc::new(summarize(&msg))),
        Err(e) => match lenient(payload, &e.to_string()) {
            Some(msg) => Body::Dns(Arc::new(msg)),
            None => Body::Malformed {
                reason: e.to_string(),
                len: payload.len(),
            },
        },
    }
}

/// What can be read of a message that does not read whole but whose
/// header and questions do: those, and the answers before the first record
/// that fails, as Wireshark shows them, with where reading stopped and why
/// (`whole_error` when every record reads and the message as a whole does
/// not).
fn lenient(payload: &[u8], whole_error: &str) -> Option<DnsMessage> {
    let mut decoder = BinDecoder::new(payload);
    let header = Header::read(&mut decoder).ok()?;
    let mut msg = head(&header);
    // Without its question a message says nothing to go by: not DNS.
    let queries = Message::read_queries(&mut decoder, header.query_count().into()).ok()?;
    msg.questions = queries.iter().map(question).collect();
    let sections = [
        ("answer", header.answer_count()),
        ("authority", header.name_server_count()),
        ("additional", header.additional_count()),
    ];
    for (section, count) in sections {
        for i in 0..count {
            let at = decoder.index();
            match Record::read(&mut decoder) {
                Ok(r) if section == "answer" => msg.answers.push(answer(&r)),
                Ok(_) if section == "authority" => msg.authority_count += 1,
                Ok(_) => msg.additional_count += 1,
                Err(e) => {
                    let why = format!("{section} record {} of {count}, at byte {at}: {e}", i + 1);
                    msg.malformed = Some(why.into());
                    return Some(msg);
                }
            }
        }
    }
    msg.malformed = Some(format!("end of its records: {whole_error}").into());
    Some(msg)
}

/// The header and questions of a message whose end is missing (a
/// fragment lost, a payload cut by the capture): what says which query an
/// answer belongs to. No record is read, and none is made up: `answers` is
/// empty and the counts 0, whatever the header announces; the rcode lacks
/// EDNS's extended bits, which travel in a record.
pub fn header_and_questions(payload: &[u8]) -> Option<DnsMessage> {
    let mut decoder = BinDecoder::new(payload);
    let header = Header::read(&mut decoder).ok()?;
    let queries = Message::read_queries(&mut decoder, header.query_count().into()).ok()?;
    Some(DnsMessage {
        questions: queries.iter().map(question).collect(),
        ..head(&header)
    })
}

fn summarize(msg: &Message) -> DnsMessage {
    DnsMessage {
        // Includes the EDNS extended bits, which hickory merges in.
        rcode: Rcode(u16::from(msg.response_code())),
        questions: msg.queries().iter().map(question).collect(),
        answers: msg.answers().iter().map(answer).collect(),
        authority_count: msg.name_servers().len(),
        additional_count: msg.additionals().len(),
        malformed: None,
        ..head(msg.header())
    }
}

/// What the header alone says (rcode without EDNS's bits; no records).
fn head(h: &Header) -> DnsMessage {
    DnsMessage {
        id: h.id(),
        response: h.message_type() == MessageType::Response,
        opcode: opcode_name(h.op_code()),
        flags: Flags {
            aa: h.authoritative(),
            tc: h.truncated(),
            rd: h.recursion_desired(),
            ra: h.recursion_available(),
            ad: h.authentic_data(),
            cd: h.checking_disabled(),
        },
        rcode: Rcode(h.response_code().low().into()),
        questions: Vec::new(),
        answers: Vec::new(),
        authority_count: 0,
        additional_count: 0,
        malformed: None,
    }
}

fn question(q: &Query) -> Question {
    Question::new(
        name_text(q.name()),
        Qtype(q.query_type().into()),
        class_name(q.query_class()),
    )
}

/// A response code, with EDNS's extended bits where the message had them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rcode(pub u16);

impl Rcode {
    pub const NOERROR: Self = Self(0);
    pub const SERVFAIL: Self = Self(2);
    pub const NXDOMAIN: Self = Self(3);
    pub const REFUSED: Self = Self(5);

    /// The mnemonic dig and the RFCs use, or `RCODE` and its number.
    pub fn name(self) -> &'static str {
        const NAMES: [&str; 11] = [
            "NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "YXDOMAIN",
            "YXRRSET", "NXRRSET", "NOTAUTH", "NOTZONE",
        ];
        match NAMES.get(usize::from(self.0)) {
            Some(name) => name,
            None if self.0 == 16 => "BADVERS",
            None => numbered("RCODE", self.0),
        }
    }
}

impl fmt::Display for Rcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Rcode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// A question's record type: its number, named when shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Qtype(pub u16);

impl Qtype {
    /// What a message with no question asks.
    pub const NONE: Self = Self(0);
    pub const A: Self = Self(1);
    pub const HINFO: Self = Self(13);
    /// The tests' type for a large answer; no rule asks for it.
    #[cfg(test)]
    pub const TXT: Self = Self(16);
    pub const AAAA: Self = Self(28);

    /// The mnemonic, or `TYPE` and its number (`type_name`).
    pub fn name(self) -> &'static str {
        type_name(RecordType::from(self.0))
    }
}

impl fmt::Display for Qtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, as a `&str` would, should a width ever be asked for.
        f.pad(self.name())
    }
}

impl Serialize for Qtype {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// A record type's mnemonic, or `TYPE` and its number when hickory has
/// none (RFC 3597), as dig writes it.
pub(super) fn type_name(t: RecordType) -> &'static str {
    match t {
        RecordType::Unknown(n) => numbered("TYPE", n),
        known => known.into(),
    }
}

fn class_name(c: DNSClass) -> &'static str {
    match c {
        DNSClass::Unknown(n) => numbered("CLASS", n),
        known => known.into(),
    }
}

/// Interned so that summaries keep `&'static str`: at most 3 × 65,536
/// short strings, whatever the traffic.
fn numbered(prefix: &'static str, n: u16) -> &'static str {
    static SEEN: Mutex<BTreeMap<(&str, u16), &'static str>> = Mutex::new(BTreeMap::new());
    let mut seen = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
    seen.entry((prefix, n))
        .or_insert_with(|| Box::leak(format!("{prefix}{n}").into_boxed_str()))
}

fn opcode_name(op: OpCode) -> Cow<'static, str> {
    match op {
        OpCode::Query => Cow::Borrowed("QUERY"),
        OpCode::Status => Cow::Borrowed("STATUS"),
        OpCode::Notify => Cow::Borrowed("NOTIFY"),
        OpCode::Update => Cow::Borrowed("UPDATE"),
        OpCode::Unknown(n) => Cow::Owned(format!("UNKNOWN({n})")),
    }
}

/// A name as dig writes it: printable bytes as they are, in the case
/// sent, `.`, `\`, `"`, `(`, `)`, `;`, `@` and `$` after a backslash, the
/// others (space included) as `\DDD`; IDNA labels in their `xn--` form.
fn name_text(name: &Name) -> String {
    let mut text = Vec::with_capacity(name.len());
    for (i, label) in name.iter().enumerate() {
        if i > 0 {
            text.push(b'.');
        }
        if plain(label) {
            text.extend_from_slice(label);
        } else {
            escape(label, &mut text);
        }
    }
    if name.is_root() || name.is_fqdn() {
        text.push(b'.');
    }
    // ASCII throughout: the plain labels' bytes and the escapes'.
    String::from_utf8_lossy(&text).into_owned()
}

/// One label's bytes as dig escapes them.
fn escape(label: &[u8], out: &mut Vec<u8>) {
    for &b in label {
        match b {
            b'.' | b'\\' | b'"' | b'(' | b')' | b';' | b'@' | b'$' => out.extend([b'\\', b]),
            0x21..=0x7e => out.push(b),
            _ => out.extend(format!("\\{b:03}").bytes()),
        }
    }
}

/// A label written as it is, the fast path's: letters, digits and `_`,
/// `-` past the first byte, `*` as the first; not IDNA.
pub(super) fn plain(label: &[u8]) -> bool {
    let Some((&first, rest)) = label.split_first() else {
        return true;
    };
    (PLAIN[usize::from(first)] || first == b'*')
        && rest.iter().all(|&b| PLAIN[usize::from(b)] || b == b'-')
        && !label.starts_with(b"xn--")
}

/// Letters, digits and `_`.
static PLAIN: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric() || c == b'_';
        b += 1;
    }
    t
};

/// An IPv4 address as `Display` writes it, without `fmt`: most answers
/// are A records.
pub(super) fn ipv4_text(ip: Ipv4Addr) -> String {
    let mut text = String::with_capacity(15);
    for (i, o) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            text.push('.');
        }
        if o >= 100 {
            text.push(char::from(b'0' + o / 100));
        }
        if o >= 10 {
            text.push(char::from(b'0' + o / 10 % 10));
        }
        text.push(char::from(b'0' + o % 10));
    }
    text
}

fn answer(r: &Record) -> Answer {
    let data = match r.data() {
        RData::A(a) => ipv4_text(a.0),
        RData::TXT(txt) => txt_presentation(txt.iter()),
        other => presentation(other),
    };
    Answer {
        name: name_text(r.name()),
        rtype: type_name(r.record_type()),
        ttl: r.ttl(),
        data,
    }
}

/// Record data as zone files show it. What hickory has no text for (an
/// OPT record among the answers: its Display fails, and `to_string` would
/// panic) gets RFC 3597's generic form, `\# <length> <hex>`.
fn presentation(data: &RData) -> String {
    let mut text = String::new();
    if fmt::write(&mut text, format_args!("{data}")).is_ok() {
        return text;
    }
    match data.to_bytes() {
        Ok(bytes) if bytes.is_empty() => "\\# 0".to_owned(),
        Ok(bytes) => {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            format!("\\# {} {hex}", bytes.len())
        }
        Err(e) => format!("(unprintable {} data: {e})", data.record_type()),
    }
}

/// TXT strings as zone files and dig show them: each quoted, `"` and `\`
/// escaped, unprintable bytes as `\DDD`.
fn txt_presentation<'a>(strings: impl Iterator<Item = &'a Box<[u8]>>) -> String {
    let quoted: Vec<String> = strings
        .map(|s| {
            let mut q = String::from("\"");
            for &b in s.iter() {
                match b {
                    b'"' | b'\\' => {
                        q.push('\\');
                        q.push(char::from(b));
                    }
                    0x20..=0x7e => q.push(char::from(b)),
                    _ => q.push_str(&format!("\\{b:03}")),
                }
            }
            q.push('"');
            q
        })
        .collect();
    quoted.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::parse;
    use hickory_proto::{
        op::{Message, MessageType, Query, ResponseCode},
        rr::{
            rdata::{A, AAAA, CNAME, PTR, SRV, TXT},
            Name, RData, Record, RecordType,
        },
    };
    use std::str::FromStr;

    fn name(s: &str) -> Name {
        Name::from_str(s).unwrap()
    }

    fn response(records: Vec<Record>) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(0xbeef)
            .set_message_type(MessageType::Response)
            .set_recursion_desired(true)
            .set_recursion_available(true)
            .set_authoritative(true)
            .add_query(Query::query(name("www.example.test."), RecordType::A));
        m.add_answers(records);
        m.to_vec().unwrap()
    }

    fn dns(body: Body) -> DnsMessage {
        match body {
            Body::Dns(m) => (*m).clone(),
            other => panic!("not a whole message: {other:?}"),
        }
    }

    #[test]
    fn decodes_header_question_and_answers_of_every_common_type() {
        let n = name("www.example.test.");
        let records = vec![
            Record::from_rdata(
                n.clone(),
                60,
                RData::CNAME(CNAME(name("web.example.test."))),
            ),
            Record::from_rdata(
                name("web.example.test."),
                30,
                RData::A(A::new(192, 0, 2, 7)),
            ),
            Record::from_rdata(
                n.clone(),
                30,
                RData::AAAA(AAAA::from_str("2001:db8::7").unwrap()),
            ),
            Record::from_rdata(
                n.clone(),
                30,
                RData::TXT(TXT::new(vec!["hello \"world\"".into(), "\u{1}".into()])),
            ),
            Record::from_rdata(n.clone(), 30, RData::PTR(PTR(name("host.example.test.")))),
            Record::from_rdata(
                n,
                30,
                RData::SRV(SRV::new(10, 5, 53, name("ns.example.test."))),
            ),
        ];
        let m = dns(parse(&response(records)));
        assert_eq!(m.id, 0xbeef);
        assert!(m.response && m.flags.aa && m.flags.rd && m.flags.ra && !m.flags.tc);
        assert_eq!(m.opcode, "QUERY");
        assert_eq!(m.rcode.name(), "NOERROR");
        assert_eq!(m.questions[0].name, "www.example.test.");
        assert_eq!(m.questions[0].qtype, Qtype::A);
        let got: Vec<(&str, &str)> = m
            .answers
            .iter()
            .map(|a| (a.rtype, a.data.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("CNAME", "web.example.test."),
                ("A", "192.0.2.7"),
                ("AAAA", "2001:db8::7"),
                ("TXT", "\"hello \\\"world\\\"\" \"\\001\""),
                ("PTR", "host.example.test."),
                ("SRV", "10 5 53 ns.example.test."),
            ]
        );
    }

    #[test]
    fn nxdomain_and_query_flags() {
        let mut m = Message::new();
        m.set_id(7)
            .set_message_type(MessageType::Response)
            .set_response_code(ResponseCode::NXDomain);
        let m = dns(parse(&m.to_vec().unwrap()));
        assert_eq!(m.rcode.name(), "NXDOMAIN");
        assert_eq!(Rcode(2).name(), "SERVFAIL");
        assert_eq!(Rcode(23).name(), "RCODE23");
        assert!(m.answers.is_empty());
    }

    /// Names as dig writes them: the fast path's labels as they are, any
    /// other byte escaped, nothing lowercased.
    #[test]
    fn names_read_as_dig_writes_them() {
        let labels: [(&[u8], &str); 10] = [
            (b"www", "www"),
            (b"Mixed-Case", "Mixed-Case"),
            (b"_srv", "_srv"),
            (b"*", "*"),
            (b"-lead", "-lead"),
            (b"a=b/c+d", "a=b/c+d"),
            (b"a.b", "a\\.b"),
            (b"sp ace", "sp\\032ace"),
            (b"\xff\x01\"@", "\\255\\001\\\"\\@"),
            (b"xn--bcher-kva", "xn--bcher-kva"),
        ];
        for (label, text) in labels {
            for (fqdn, dot) in [(true, "."), (false, "")] {
                let mut n = Name::from_labels([label, &b"example"[..]]).unwrap();
                n.set_fqdn(fqdn);
                assert_eq!(name_text(&n), format!("{text}.example{dot}"), "{label:?}");
            }
        }
        assert_eq!(name_text(&Name::root()), ".");
    }

    #[test]
    fn ipv4_answers_read_as_display_writes_them() {
        for ip in ["0.0.0.0", "10.96.0.10", "192.168.100.255", "1.20.203.9"] {
            let ip: Ipv4Addr = ip.parse().unwrap();
            assert_eq!(ipv4_text(ip), ip.to_string());
        }
    }

    /// Both readers: class IN is the wire reader's, any other hickory's.
    #[test]
    fn unknown_types_and_classes_are_named_by_number() {
        let query = |qtype: u16, class: u16| {
            let mut q = vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 4];
            q.extend(b"test\0");
            q.extend(qtype.to_be_bytes());
            q.extend(class.to_be_bytes());
            dns(parse(&q)).questions.remove(0)
        };
        let q = query(65534, 1);
        assert_eq!((q.qtype.name(), q.class), ("TYPE65534", "IN"));
        let q = query(65534, 0x1234);
        assert_eq!((q.qtype.name(), q.class), ("TYPE65534", "CLASS4660"));
        let q = query(28, 0x1234);
        assert_eq!((q.qtype, q.class), (Qtype::AAAA, "CLASS4660"));
        assert!(std::ptr::eq(
            type_name(RecordType::Unknown(9)),
            type_name(RecordType::Unknown(9))
        ));
    }

    /// Rules compare qtypes as numbers where they compared names: the same
    /// only while no two numbers share a name.
    #[test]
    fn each_qtype_has_a_name_of_its_own() {
        let names: std::collections::HashSet<&str> =
            (0..=u16::MAX).map(|n| Qtype(n).name()).collect();
        assert_eq!(names.len(), 1 << 16);
        assert_eq!(
            (Qtype::HINFO.name(), Qtype::TXT.to_string()),
            ("HINFO", "TXT".into())
        );
        assert_eq!(format!("{:<6}|", Qtype(65534)), "TYPE65534|");
        assert_eq!(format!("{:<6}|", Qtype::A), "A     |");
        assert_eq!(serde_json::to_string(&Qtype::AAAA).unwrap(), "\"AAAA\"");
    }

    #[test]
    fn opcodes_have_their_mnemonics() {
        assert_eq!(opcode_name(OpCode::Update), "UPDATE");
        assert_eq!(opcode_name(OpCode::Unknown(9)), "UNKNOWN(9)");
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        for bad in [&b""[..], &[1, 2, 3], &[0xff; 40]] {
            assert!(matches!(parse(bad), Body::Malformed { .. }), "{bad:?}");
        }
    }

    #[test]
    fn header_claiming_more_records_than_present_is_malformed() {
        let mut raw = response(vec![]);
        raw[7] = 5; // ANCOUNT = 5, none present
                    // What it is, as far as it reads, and where it stops.
        let read = dns(parse(&raw));
        assert_eq!(
            (read.id, read.questions[0].name.as_str(), read.answers.len()),
            (0xbeef, "www.example.test.", 0)
        );
        assert_eq!(
            read.malformed.as_deref(),
            Some("answer record 1 of 5, at byte 34: unexpected end of input reached")
        );
        // Cut short, it still says which query it answers, and no more.
        let cut = header_and_questions(&raw).unwrap();
        assert_eq!(
            (cut.id, cut.response, cut.rcode.name()),
            (0xbeef, true, "NOERROR")
        );
        assert_eq!(cut.questions[0].name, "www.example.test.");
        assert!(cut.answers.is_empty() && cut.authority_count == 0);
    }

    /// The header and question of a message cut anywhere past them, as the
    /// whole message has them; nothing before the question's end.
    #[test]
    fn a_cut_message_keeps_its_header_and_question() {
        let mut m = Message::new();
        m.set_id(77)
            .set_message_type(MessageType::Response)
            .set_response_code(ResponseCode::ServFail)
            .set_recursion_desired(true)
            .add_query(Query::query(name("cut.example.test."), RecordType::AAAA));
        m.add_answers(vec![Record::from_rdata(
            name("cut.example.test."),
            30,
            RData::AAAA(AAAA::from_str("2001:db8::1").unwrap()),
        )]);
        let raw = m.to_vec().unwrap();
        let whole = dns(parse(&raw));
        let question_end = 12 + 18 + 4;
        for at in 0..raw.len() {
            match header_and_questions(&raw[..at]) {
                Some(cut) => {
                    assert!(at >= question_end, "{at}");
                    assert_eq!(
                        (cut.id, cut.response, &cut.flags, &cut.rcode, &cut.questions),
                        (
                            whole.id,
                            whole.response,
                            &whole.flags,
                            &whole.rcode,
                            &whole.questions
                        )
                    );
                    assert!(cut.answers.is_empty());
                }
                None => assert!(at < question_end, "{at}"),
            }
        }
    }

    /// Found by fuzzing: an OPT record among the answers, which hickory
    /// cannot print, made `to_string` panic.
    #[test]
    fn answers_hickory_cannot_print_get_the_generic_form() {
        let mut raw = response(vec![]);
        raw[7] = 1; // ANCOUNT = 1
                    // Root name, type OPT (41), class 512, TTL 0, 4 bytes: option 3, empty.
        raw.extend_from_slice(&[0, 0, 41, 2, 0, 0, 0, 0, 0, 0, 4, 0, 3, 0, 0]);
        let m = dns(parse(&raw));
        assert_eq!(m.answers[0].rtype, "OPT");
        assert_eq!(m.answers[0].data, "\\# 4 00030000");
        // The fuzzer's input itself.
        let found: &[u8] = &[
            0x00, 0x03, 0x41, 0x64, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x0d, 0x0d,
            0x0d, 0x78, 0x6e, 0x2d, 0x2d, 0x0d, 0x0d, 0x0d, 0x0d, 0x0d, 0x0d, 0x00, 0x0d, 0x0d,
            0x0d, 0x0d, 0x2d, 0xf3, 0xf2, 0xf2, 0xf1, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x6c,
            0x6c, 0x6c, 0x6c, 0x00, 0x00, 0x29, 0x02, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x30,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1f, 0x00, 0x00,
            0xdd, 0x6b, 0x1f, 0x00, 0x00, 0x03, 0x81, 0x03, 0x00, 0x01, 0x3f, 0x00, 0x01, 0x07,
            0x63, 0x6c, 0x73, 0x65, 0x74, 0x75, 0x72, 0x05, 0x6c, 0x90, 0x6f, 0x63, 0x61, 0x6c,
            0x00, 0x00, 0x1c, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x74, 0x76,
            0x03, 0x73, 0x63, 0x07, 0x63, 0x6c, 0x00, 0x00, 0x00, 0x00,
        ];
        let _ = parse(found);
    }

    #[test]
    fn compression_pointer_loop_is_malformed() {
        // Header with QDCOUNT=1, then a name that is a pointer to itself (offset 12).
        let mut raw = vec![0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        raw.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        assert!(matches!(parse(&raw), Body::Malformed { .. }));
    }
}
