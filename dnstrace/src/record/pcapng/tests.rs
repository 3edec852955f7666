use std::io::{self, Read as _};

use super::*;
use crate::record::tests::Rng;

/// Any enterprise number: the reader keeps it as it is.
const PEN: u32 = 0x0102_0304;

fn info() -> SectionInfo {
    SectionInfo {
        hardware: "x86_64".into(),
        os: "Linux 6.1".into(),
        user_appl: "dnstrace 0.1.0".into(),
        comment: vec!["first".into(), "second comment".into()],
    }
}

fn ifaces() -> [Interface; 2] {
    [
        Interface {
            linktype: 101,
            snaplen: 0,
            name: "eth0".into(),
            description: "netns 4026531840 tc_ingress".into(),
            comment: vec!["a comment".into(), "and another: é".into()],
        },
        Interface {
            linktype: 1,
            snaplen: 128,
            name: "cni0".into(),
            description: String::new(),
            comment: vec![],
        },
    ]
}

fn all_opts() -> Vec<PacketOpt> {
    vec![
        PacketOpt::Comment("retransmitted".into()),
        PacketOpt::Flags(FLAG_INBOUND),
        PacketOpt::Custom {
            pen: PEN,
            data: vec![1, 2, 3],
        },
        PacketOpt::Flags(FLAG_OUTBOUND),
    ]
}

/// A file of every block kind we write, and the blocks it holds, with the
/// offset each block ends at.
fn sample() -> (Vec<u8>, Vec<Block>, Vec<u64>) {
    let mut out = Vec::new();
    let mut blocks = vec![Block::Section { info: info() }];
    let mut ends = Vec::new();
    let mut w = Writer::new(&mut out, &info()).unwrap();
    ends.push(w.bytes_written());
    for (i, iface) in ifaces().into_iter().enumerate() {
        assert_eq!(w.interface(&iface).unwrap(), i as u32);
        ends.push(w.bytes_written());
        blocks.push(Block::Interface {
            id: i as u32,
            iface,
            tsresol: 9,
        });
    }
    let packets = [
        (
            0,
            1_700_000_000_123_456_789,
            vec![0x45, 1, 2, 3, 4],
            60,
            all_opts(),
        ),
        (1, 5, vec![9; 3], 3, vec![]),
        (0, u64::MAX, vec![], 0, vec![PacketOpt::Comment("é".into())]),
    ];
    for (iface, ts_ns, data, orig_len, opts) in packets {
        w.packet(iface, ts_ns, &data, orig_len, &opts).unwrap();
        ends.push(w.bytes_written());
        blocks.push(Block::Packet {
            iface,
            ts_ns,
            data,
            orig_len,
            opts,
        });
    }
    for data in [&b"{\"anomaly\":1}"[..], &[7; 8]] {
        w.custom_block(PEN, data).unwrap();
        ends.push(w.bytes_written());
        let mut padded = data.to_vec();
        padded.resize(data.len().next_multiple_of(4), 0);
        blocks.push(Block::Custom {
            pen: PEN,
            data: padded,
        });
    }
    w.flush().unwrap();
    (out, blocks, ends)
}

/// Every block read, and the error that ended the read, if any.
fn read_all(bytes: &[u8]) -> (Vec<Block>, Option<ReadError>) {
    let mut reader = match Reader::new(bytes) {
        Ok(r) => r,
        Err(e) => return (vec![], Some(e)),
    };
    let mut blocks = Vec::new();
    loop {
        match reader.next_block() {
            Ok(Some(b)) => blocks.push(b),
            Ok(None) => return (blocks, None),
            Err(e) => return (blocks, Some(e)),
        }
    }
}

/// For tests only: I/O errors compare by their text.
impl PartialEq for ReadError {
    fn eq(&self, other: &Self) -> bool {
        format!("{self:?}") == format!("{other:?}")
    }
}

fn format_error(bytes: &[u8]) -> FormatError {
    match read_all(bytes).1 {
        Some(ReadError::Format(e)) => e,
        other => panic!("expected a format error, got {other:?}"),
    }
}

#[test]
fn what_is_written_reads_back_equal() {
    let (bytes, blocks, ends) = sample();
    assert_eq!(read_all(&bytes), (blocks, None));
    assert_eq!(ends.last(), Some(&(bytes.len() as u64)));
    // The iterator gives the same.
    let iterated: Vec<_> = Reader::new(&bytes[..])
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(iterated, sample().1);
}

#[test]
fn each_block_is_one_write_and_nothing_flushes_unasked() {
    #[derive(Default)]
    struct Writes {
        sizes: Vec<usize>,
        flushes: usize,
    }
    impl io::Write for Writes {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.sizes.push(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            self.flushes += 1;
            Ok(())
        }
    }
    let mut writes = Writes::default();
    let mut w = Writer::new(&mut writes, &info()).unwrap();
    let id = w.interface(&ifaces()[0]).unwrap();
    w.packet(id, 1, &[1; 33], 33, &all_opts()).unwrap();
    w.custom_block(PEN, b"x").unwrap();
    let total = w.bytes_written();
    assert_eq!(writes.sizes.len(), 4);
    assert_eq!(writes.sizes.iter().sum::<usize>() as u64, total);
    assert_eq!(writes.flushes, 0);
    Writer::new(&mut writes, &info()).unwrap().flush().unwrap();
    assert_eq!(writes.flushes, 1);
}

#[test]
fn writer_refuses_what_would_make_a_bad_file() {
    let mut out = Vec::new();
    let mut w = Writer::new(&mut out, &SectionInfo::default()).unwrap();
    let e = w.packet(0, 0, b"x", 1, &[]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    let id = w.interface(&Interface::default()).unwrap();
    let long = PacketOpt::Comment("x".repeat(70_000));
    assert!(w.packet(id, 0, b"x", 1, &[long]).is_err());
    let huge = vec![0; MAX_BLOCK as usize];
    assert!(w.packet(id, 0, &huge, 1, &[]).is_err());
    let written = w.bytes_written();
    assert_eq!(out.len() as u64, written);
    // Only whole blocks were written: the file still reads.
    assert!(read_all(&out).1.is_none());
}

/// Hand-built blocks, for the byte order and content we do not write.
struct Raw {
    be: bool,
}

impl Raw {
    fn u16(&self, v: u16) -> [u8; 2] {
        if self.be {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }

    fn u32(&self, v: u32) -> [u8; 4] {
        if self.be {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }

    fn opt(&self, code: u16, value: &[u8]) -> Vec<u8> {
        let mut o = [
            &self.u16(code)[..],
            &self.u16(value.len() as u16)[..],
            value,
        ]
        .concat();
        o.resize(o.len().next_multiple_of(4), 0);
        o
    }

    fn block(&self, kind: u32, body: &[&[u8]]) -> Vec<u8> {
        let body = body.concat();
        let len = self.u32(12 + body.len() as u32);
        [&self.u32(kind)[..], &len, &body, &len].concat()
    }

    fn shb(&self, opts: &[u8]) -> Vec<u8> {
        let (bom, ver) = (
            self.u32(BYTE_ORDER_MAGIC),
            [self.u16(1), self.u16(0)].concat(),
        );
        self.block(SHB, &[&bom, &ver, &[0xff; 8], opts])
    }

    fn idb(&self, linktype: u16, snaplen: u32, opts: &[u8]) -> Vec<u8> {
        let fixed = [&self.u16(linktype)[..], &[0, 0], &self.u32(snaplen)].concat();
        self.block(IDB, &[&fixed, opts])
    }

    fn epb(&self, iface: u32, ts: u64, data: &[u8], opts: &[u8]) -> Vec<u8> {
        let mut fixed = [
            self.u32(iface),
            self.u32((ts >> 32) as u32),
            self.u32(ts as u32),
            self.u32(data.len() as u32),
            self.u32(data.len() as u32 + 10),
        ]
        .concat();
        fixed.extend_from_slice(data);
        fixed.resize(fixed.len().next_multiple_of(4), 0);
        self.block(EPB, &[&fixed, opts])
    }
}

#[test]
fn big_endian_files_read_like_little_endian_ones() {
    for be in [true, false] {
        let r = Raw { be };
        let end = r.opt(OPT_ENDOFOPT, &[]);
        let bytes = [
            r.shb(&[r.opt(SHB_OS, b"SunOS"), end.clone()].concat()),
            // Milliseconds, then 2^-10 s.
            r.idb(
                1,
                96,
                &[r.opt(IF_NAME, b"le0"), r.opt(IF_TSRESOL, &[3])].concat(),
            ),
            r.idb(101, 0, &r.opt(IF_TSRESOL, &[0x80 | 10])),
            r.epb(0, 1_500, b"abcde", &r.opt(EPB_FLAGS, &r.u32(2))),
            r.epb(
                1,
                512,
                b"",
                &r.opt(OPT_CUSTOM_NO_COPY, &[&r.u32(PEN)[..], b"xy"].concat()),
            ),
            // A block we do not read (interface statistics) is skipped.
            r.block(0x0000_0005, &[&[1, 2, 3, 4]]),
            r.block(SPB, &[&r.u32(200), &[0xaa; 100]]),
            r.block(CB_NO_COPY, &[&r.u32(PEN), b"data"]),
        ]
        .concat();
        let (blocks, err) = read_all(&bytes);
        assert!(err.is_none(), "{err:?}");
        let [Block::Section { info }, Block::Interface {
            iface, tsresol: 3, ..
        }, Block::Interface {
            id: 1,
            tsresol: 0x8a,
            ..
        }, p1, p2, spb, custom] = &blocks[..]
        else {
            panic!("{blocks:?}");
        };
        assert_eq!(info.os, "SunOS");
        assert_eq!(
            (iface.linktype, iface.snaplen, &*iface.name),
            (1, 96, "le0")
        );
        let packet = |iface, ts_ns, data: &[u8], orig_len, opts| Block::Packet {
            iface,
            ts_ns,
            data: data.to_vec(),
            orig_len,
            opts,
        };
        assert_eq!(
            p1,
            &packet(0, 1_500_000_000, b"abcde", 15, vec![PacketOpt::Flags(2)])
        );
        let custom_opt = PacketOpt::Custom {
            pen: PEN,
            data: b"xy".to_vec(),
        };
        assert_eq!(p2, &packet(1, 500_000_000, b"", 10, vec![custom_opt]));
        // Interface 0's snaplen (96) cuts the simple packet.
        assert_eq!(spb, &packet(0, 0, &[0xaa; 96], 200, vec![]));
        let data = b"data".to_vec();
        assert_eq!(custom, &Block::Custom { pen: PEN, data });
    }
}

#[test]
fn a_new_section_starts_interfaces_again() {
    let be = Raw { be: true };
    let (le_file, le_blocks, _) = sample();
    let first = [
        be.shb(&[]),
        be.idb(1, 0, &[]),
        be.idb(1, 0, &[]),
        be.idb(1, 0, &[]),
    ]
    .concat();
    let (blocks, err) = read_all(&[&first[..], &le_file].concat());
    assert!(err.is_none(), "{err:?}");
    assert_eq!(blocks[4..], le_blocks[..]);
    // Interface 2 of the first section does not exist in the second.
    let le = Raw { be: false };
    let stray = le.epb(2, 0, b"", &[]);
    let bytes = [&first[..], &le.shb(&[]), &le.idb(1, 0, &[]), &stray].concat();
    let e = format_error(&bytes);
    assert_eq!(e.offset, (bytes.len() - stray.len() + 8) as u64);
    assert!(e.what.contains("interface 2"), "{e}");
}

fn pcap(be: bool, nanos: bool, records: &[(u32, u32, &[u8], u32)]) -> Vec<u8> {
    let r = Raw { be };
    let magic = if nanos { 0xa1b2_3c4d } else { 0xa1b2_c3d4 };
    let mut bytes = [
        &r.u32(magic)[..],
        &r.u16(2),
        &r.u16(4),
        &[0; 8],
        &r.u32(262_144),
        &r.u32(276),
    ]
    .concat();
    for &(sec, frac, data, orig) in records {
        let head = [
            r.u32(sec),
            r.u32(frac),
            r.u32(data.len() as u32),
            r.u32(orig),
        ];
        bytes.extend_from_slice(&head.concat());
        bytes.extend_from_slice(data);
    }
    bytes
}

#[test]
fn classic_pcap_reads_in_both_byte_orders_and_resolutions() {
    for be in [true, false] {
        for nanos in [true, false] {
            let records: [(u32, u32, &[u8], u32); 2] =
                [(1_700_000_000, 999, b"abc", 3), (2, 0, b"", 1500)];
            let (blocks, err) = read_all(&pcap(be, nanos, &records));
            assert!(err.is_none(), "{err:?}");
            let iface = Interface {
                linktype: 276,
                snaplen: 262_144,
                ..Default::default()
            };
            let unit = if nanos { 1 } else { 1_000 };
            let expected = vec![
                Block::Interface {
                    id: 0,
                    iface,
                    tsresol: if nanos { 9 } else { 6 },
                },
                Block::Packet {
                    iface: 0,
                    ts_ns: 1_700_000_000_000_000_000 + 999 * unit,
                    data: b"abc".to_vec(),
                    orig_len: 3,
                    opts: vec![],
                },
                Block::Packet {
                    iface: 0,
                    ts_ns: 2_000_000_000,
                    data: vec![],
                    orig_len: 1500,
                    opts: vec![],
                },
            ];
            assert_eq!(blocks, expected);
        }
    }
}

#[test]
fn a_cut_file_gives_its_complete_blocks_then_truncated() {
    let (bytes, blocks, ends) = sample();
    for cut in 0..bytes.len() {
        let complete = ends.iter().filter(|&&e| e <= cut as u64).count();
        let (read, err) = read_all(&bytes[..cut]);
        assert_eq!(read, blocks[..complete], "cut at {cut}");
        if cut == 0 {
            assert_eq!(err, Some(ReadError::Empty));
        } else if ends.contains(&(cut as u64)) {
            assert!(err.is_none(), "cut at {cut}: {err:?}");
        } else {
            let start = complete.checked_sub(1).map_or(0, |i| ends[i]);
            assert_eq!(err, Some(ReadError::Truncated { offset: start }));
        }
    }
    let records: [(u32, u32, &[u8], u32); 2] = [(1, 2, b"abcdef", 6), (3, 4, b"gh", 2)];
    let file = pcap(false, false, &records);
    let ends = [24, 46, file.len()];
    for cut in 0..file.len() {
        let (read, err) = read_all(&file[..cut]);
        let complete = ends.iter().filter(|&&e| e <= cut).count();
        assert_eq!(read.len(), complete, "cut at {cut}");
        match err {
            None => assert!(ends.contains(&cut)),
            Some(ReadError::Empty) => assert_eq!(cut, 0),
            Some(ReadError::Truncated { offset }) => {
                assert_eq!(offset, [0, 24, 46][complete] as u64, "cut at {cut}")
            }
            Some(e) => panic!("cut at {cut}: {e}"),
        }
    }
}

/// The sample with the little-endian u32 at `at` replaced.
fn patched(at: usize, v: u32) -> Vec<u8> {
    let mut bytes = sample().0;
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    bytes
}

#[test]
fn corruption_is_a_format_error_at_its_offset() {
    let (_, _, ends) = sample();
    let epb = ends[2] as usize; // the first packet block
    let epb_len = ends[3] as usize - epb;
    let cases: Vec<(Vec<u8>, usize, &str)> = vec![
        (
            b"GIF89a\0\0\0\0\0\0".to_vec(),
            0,
            "not a pcap or pcapng file (magic 0x38464947)",
        ),
        (patched(8, 0x1234_5678), 8, "byte-order magic 0x12345678"),
        (
            patched(epb + 4, 0xffff_fff0),
            epb + 4,
            "over the 16777216 byte cap",
        ),
        (patched(epb + 4, 33), epb + 4, "not a multiple of 4"),
        (patched(epb + 4, 28), epb + 4, "below the minimum 32"),
        (patched(epb + 4, 8), epb + 4, "below the minimum 32"),
        (
            patched(epb + 20, 1_000),
            epb + 20,
            "captured length 1000 overruns",
        ),
        (
            patched(epb + epb_len - 4, 0),
            epb + epb_len - 4,
            "trailing block length 0",
        ),
        (
            patched(epb + 8, 7),
            epb + 8,
            "interface 7 was never described",
        ),
        // The first option of the section header claims 1000 bytes.
        (
            patched(24, 1000 << 16 | 2),
            24,
            "option 2 of 1000 bytes overruns",
        ),
        (patched(12, 2), 12, "pcapng version 2.0"),
    ];
    for (bytes, offset, what) in cases {
        let e = format_error(&bytes);
        assert_eq!(e.offset, offset as u64, "{e}");
        assert!(e.to_string().contains(what), "{e}");
        assert!(e.to_string().starts_with(&format!("at byte {offset}: ")));
    }
    // An empty if_tsresol.
    let r = Raw { be: false };
    let bytes = [r.shb(&[]), r.idb(1, 0, &r.opt(IF_TSRESOL, &[]))].concat();
    assert!(format_error(&bytes).what.contains("if_tsresol is empty"));
    // A packet before any interface.
    let bytes = [r.shb(&[]), r.block(SPB, &[&[0; 4]])].concat();
    assert!(format_error(&bytes).what.contains("interface 0"));
    let mut pcap_file = pcap(true, false, &[(0, 0, b"x", 1)]);
    pcap_file[32..36].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(format_error(&pcap_file).offset, 32);
}

#[test]
fn a_lying_length_reads_nothing_before_failing() {
    // A block claiming 4 GiB followed by an endless stream: if the reader
    // trusted the length, this would not end.
    let (bytes, _, ends) = sample();
    let mut head = bytes[..ends[0] as usize].to_vec();
    head.extend_from_slice(&EPB.to_le_bytes());
    head.extend_from_slice(&0xffff_fff0u32.to_le_bytes());
    let mut reader = Reader::new(head.as_slice().chain(io::repeat(0))).unwrap();
    assert!(matches!(reader.next(), Some(Ok(Block::Section { .. }))));
    assert!(matches!(reader.next(), Some(Err(ReadError::Format(_)))));
    assert!(reader.next().is_none());
    // Within the cap, memory follows the bytes that really arrive.
    let mut head = bytes[..ends[0] as usize].to_vec();
    head.extend_from_slice(&EPB.to_le_bytes());
    head.extend_from_slice(&(MAX_BLOCK - 4).to_le_bytes());
    head.extend_from_slice(&[0; 100]);
    let (_, err) = read_all(&head);
    assert_eq!(err, Some(ReadError::Truncated { offset: ends[0] }));
}

#[test]
fn timestamps_in_any_resolution_become_nanoseconds() {
    assert_eq!(ts_to_ns(1, 6), 1_000);
    assert_eq!(ts_to_ns(7, 9), 7);
    assert_eq!(ts_to_ns(1_234_567, 12), 1_234);
    assert_eq!(ts_to_ns(3, 0), 3_000_000_000);
    assert_eq!(ts_to_ns(1 << 10, 0x80 | 10), 1_000_000_000);
    assert_eq!(ts_to_ns(u64::MAX, 0), u64::MAX);
    assert_eq!(ts_to_ns(u64::MAX, 127), 0);
    assert_eq!(ts_to_ns(u64::MAX, 0xff), 0);
    assert_eq!(ts_to_ns(u64::MAX, 0x80), u64::MAX);
}

#[test]
fn mutated_files_never_panic() {
    let records: [(u32, u32, &[u8], u32); 2] = [(1, 2, b"abcdef", 6), (3, 4, b"gh", 2)];
    let files = [sample().0, pcap(true, true, &records)];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..4_000 {
        let mut bytes = files[round % 2].clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(bytes.len());
            // Small values hit lengths and codes more often than noise would.
            bytes[at] = match rng.below(3) {
                0 => rng.next() as u8,
                1 => rng.below(8) as u8,
                _ => 0xff,
            };
        }
        let cut = bytes.len() - rng.below(8);
        let mut total = 0;
        let (blocks, _) = read_all(&bytes[..cut]);
        for b in blocks {
            if let Block::Packet { data, .. } | Block::Custom { data, .. } = b {
                total += data.len();
            }
        }
        assert!(total <= bytes.len());
    }
}

#[test]
fn errors_read_well() {
    let e = ReadError::Truncated { offset: 96 };
    assert_eq!(e.to_string(), "at byte 96: the file ends inside a block");
    // Too short for any magic: a recording stopped at once.
    let cut = read_all(&[0x0a, 0x0d]).1;
    assert_eq!(cut, Some(ReadError::Truncated { offset: 0 }));
    assert_eq!(
        cut.unwrap().to_string(),
        "the file ends inside its header: no packets in it"
    );
    let empty = read_all(&[]).1;
    assert_eq!(empty, Some(ReadError::Empty));
    assert_eq!(
        empty.unwrap().to_string(),
        "the file is empty: nothing was captured into it"
    );
}
