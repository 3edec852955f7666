//! pcapng, written one whole block at a time (an abrupt stop leaves at most
//! one partial block), and read back, with classic pcap, from files that may
//! be cut short or hostile.
//!
//! Format: draft-ietf-opsawg-pcapng; classic pcap: draft-ietf-opsawg-pcap.
use std::{fmt, io, io::Read as _};

/// Largest block (or classic pcap record) read or written: anything larger is
/// corruption, and no read allocates more.
pub const MAX_BLOCK: u32 = 16 << 20;
/// The largest block buffer a writer keeps for the next block.
const BUF_KEPT: usize = 64 << 10;
/// Interfaces one section may describe: each costs memory for the whole read.
const MAX_INTERFACES: usize = 1 << 16;

const SHB: u32 = 0x0A0D_0D0A;
const IDB: u32 = 1;
const SPB: u32 = 3;
const EPB: u32 = 6;
const CB_COPY: u32 = 0x0000_0BAD;
const CB_NO_COPY: u32 = 0x4000_0BAD;
const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;

const OPT_ENDOFOPT: u16 = 0;
const OPT_COMMENT: u16 = 1;
const SHB_HARDWARE: u16 = 2;
const SHB_OS: u16 = 3;
const SHB_USERAPPL: u16 = 4;
const IF_NAME: u16 = 2;
const IF_DESCRIPTION: u16 = 3;
const IF_TSRESOL: u16 = 9;
const EPB_FLAGS: u16 = 2;
/// Custom binary options, copied by editors or not.
const OPT_CUSTOM_COPY: u16 = 2989;
const OPT_CUSTOM_NO_COPY: u16 = 19373;

/// `if_tsresol` without the option: microseconds.
const TSRESOL_DEFAULT: u8 = 6;
/// What we write: nanoseconds.
const TSRESOL_NS: u8 = 9;

/// epb_flags direction bits.
pub const FLAG_INBOUND: u32 = 1;
pub const FLAG_OUTBOUND: u32 = 2;

/// Who wrote a section.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SectionInfo {
    pub hardware: String,
    pub os: String,
    pub user_appl: String,
    pub comment: Vec<String>,
}

/// A capture interface; empty strings are left out of the file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Interface {
    pub linktype: u16,
    /// 0: no limit.
    pub snaplen: u32,
    pub name: String,
    pub description: String,
    /// `opt_comment`s, in order.
    pub comment: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PacketOpt {
    Comment(String),
    /// Direction ([`FLAG_INBOUND`], [`FLAG_OUTBOUND`]) and link-layer bits.
    Flags(u32),
    /// Data under an IANA Private Enterprise Number; Wireshark skips it.
    Custom {
        pen: u32,
        data: Vec<u8>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Block {
    /// A new section: interface ids start again from 0.
    Section { info: SectionInfo },
    Interface {
        id: u32,
        iface: Interface,
        /// The raw `if_tsresol` (6 when absent); timestamps come converted.
        tsresol: u8,
    },
    /// From an Enhanced or Simple Packet Block (timestamp 0) or a classic
    /// pcap record (interface 0).
    Packet {
        iface: u32,
        ts_ns: u64,
        data: Vec<u8>,
        orig_len: u32,
        opts: Vec<PacketOpt>,
    },
    /// `data` is as stored: padded with zeros to 32 bits, since the format
    /// keeps no length for it.
    Custom { pen: u32, data: Vec<u8> },
}

/// Writes little-endian pcapng, one `write_all` per block.
pub struct Writer<W: io::Write> {
    w: W,
    interfaces: u32,
    written: u64,
    /// The block being built, kept from block to block: a packet's block
    /// grew from empty through several reallocations, each a copy.
    buf: Vec<u8>,
}

impl<W: io::Write> Writer<W> {
    /// Starts the file with its Section Header Block.
    pub fn new(w: W, info: &SectionInfo) -> io::Result<Self> {
        let mut b = BlockBuf::new(SHB, Vec::new());
        b.u32(BYTE_ORDER_MAGIC);
        b.u16(1);
        b.u16(0);
        b.bytes(&(-1i64).to_le_bytes()); // section length not known
        b.opt_str(SHB_HARDWARE, &info.hardware)?;
        b.opt_str(SHB_OS, &info.os)?;
        b.opt_str(SHB_USERAPPL, &info.user_appl)?;
        for c in &info.comment {
            b.opt_str(OPT_COMMENT, c)?;
        }
        let mut writer = Self {
            w,
            interfaces: 0,
            written: 0,
            buf: Vec::new(),
        };
        writer.emit(b)?;
        Ok(writer)
    }

    /// Describes an interface (timestamps in nanoseconds); returns its id.
    pub fn interface(&mut self, iface: &Interface) -> io::Result<u32> {
        let mut b = self.block(IDB);
        b.u16(iface.linktype);
        b.u16(0);
        b.u32(iface.snaplen);
        b.opt_str(IF_NAME, &iface.name)?;
        b.opt_str(IF_DESCRIPTION, &iface.description)?;
        for c in &iface.comment {
            b.opt_str(OPT_COMMENT, c)?;
        }
        b.opt(IF_TSRESOL, &[TSRESOL_NS])?;
        self.emit(b)?;
        self.interfaces += 1;
        Ok(self.interfaces - 1)
    }

    /// An Enhanced Packet Block: `data` as captured, `orig_len` as it was.
    pub fn packet(
        &mut self,
        iface: u32,
        ts_ns: u64,
        data: &[u8],
        orig_len: u32,
        opts: &[PacketOpt],
    ) -> io::Result<()> {
        if iface >= self.interfaces {
            return Err(invalid(format!("interface {iface} was never described")));
        }
        let mut b = self.block(EPB);
        b.u32(iface);
        b.u32((ts_ns >> 32) as u32);
        b.u32(ts_ns as u32);
        b.u32(len_u32(data.len())?);
        b.u32(orig_len);
        b.padded(data);
        for opt in opts {
            match opt {
                PacketOpt::Comment(c) => b.opt(OPT_COMMENT, c.as_bytes())?,
                PacketOpt::Flags(f) => b.opt(EPB_FLAGS, &f.to_le_bytes())?,
                PacketOpt::Custom { pen, data } => {
                    b.opt_parts(OPT_CUSTOM_COPY, &pen.to_le_bytes(), data)?
                }
            }
        }
        self.emit(b)
    }

    /// A Custom Block (copyable): what recordings of format 1 held their
    /// notes in, written by the tests that read such recordings.
    #[cfg(test)]
    pub fn custom_block(&mut self, pen: u32, data: &[u8]) -> io::Result<()> {
        let mut b = self.block(CB_COPY);
        b.u32(pen);
        b.padded(data);
        self.emit(b)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }

    /// Bytes of complete blocks handed to the inner writer.
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    fn block(&mut self, kind: u32) -> BlockBuf {
        BlockBuf::new(kind, std::mem::take(&mut self.buf))
    }

    fn emit(&mut self, b: BlockBuf) -> io::Result<()> {
        let bytes = b.finish()?;
        let written = self.w.write_all(&bytes);
        if written.is_ok() {
            self.written += bytes.len() as u64;
        }
        // A rare large block (an anomaly's note) is not held on to.
        if bytes.capacity() <= BUF_KEPT {
            self.buf = bytes;
        }
        written
    }
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

fn len_u32(len: usize) -> io::Result<u32> {
    u32::try_from(len).map_err(|_| invalid(format!("{len} bytes do not fit a block")))
}

fn pad4(len: usize) -> usize {
    len.next_multiple_of(4)
}

/// One block being built: type, length placeholder, body, options.
struct BlockBuf {
    bytes: Vec<u8>,
    has_opts: bool,
}

impl BlockBuf {
    /// In `bytes`, emptied: a buffer used before.
    fn new(kind: u32, mut bytes: Vec<u8>) -> Self {
        bytes.clear();
        bytes.extend_from_slice(&kind.to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        Self {
            bytes,
            has_opts: false,
        }
    }

    fn u16(&mut self, v: u16) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    fn bytes(&mut self, v: &[u8]) {
        self.bytes.extend_from_slice(v);
    }

    fn padded(&mut self, v: &[u8]) {
        self.bytes.extend_from_slice(v);
        self.bytes.resize(pad4(self.bytes.len()), 0);
    }

    fn opt(&mut self, code: u16, value: &[u8]) -> io::Result<()> {
        self.opt_parts(code, &[], value)
    }

    /// An option whose value is `head` then `rest`, written in place.
    fn opt_parts(&mut self, code: u16, head: &[u8], rest: &[u8]) -> io::Result<()> {
        let total = head.len() + rest.len();
        let len =
            u16::try_from(total).map_err(|_| invalid(format!("option {code} of {total} bytes")))?;
        self.u16(code);
        self.u16(len);
        self.bytes(head);
        self.padded(rest);
        self.has_opts = true;
        Ok(())
    }

    fn opt_str(&mut self, code: u16, value: &str) -> io::Result<()> {
        if value.is_empty() {
            return Ok(());
        }
        self.opt(code, value.as_bytes())
    }

    /// The whole block, lengths filled in.
    fn finish(mut self) -> io::Result<Vec<u8>> {
        if self.has_opts {
            self.u16(OPT_ENDOFOPT);
            self.u16(0);
        }
        let total = len_u32(self.bytes.len() + 4)?;
        if total > MAX_BLOCK {
            return Err(invalid(format!("block of {total} bytes is over the cap")));
        }
        self.bytes[4..8].copy_from_slice(&total.to_le_bytes());
        self.u32(total);
        Ok(self.bytes)
    }
}

/// Invalid content, at a byte offset of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatError {
    pub offset: u64,
    pub what: String,
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at byte {}: {}", self.offset, self.what)
    }
}

impl std::error::Error for FormatError {}

#[derive(Debug)]
pub enum ReadError {
    /// Not a byte in it.
    Empty,
    /// The file ends inside the block (or record) that starts at `offset`: an
    /// interrupted recording, readable up to there.
    Truncated {
        offset: u64,
    },
    Format(FormatError),
    Io(io::Error),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "the file is empty: nothing was captured into it"),
            // Before any packet: a capture stopped as it began.
            Self::Truncated { offset: 0 } => {
                write!(f, "the file ends inside its header: no packets in it")
            }
            Self::Truncated { offset } => {
                write!(f, "at byte {offset}: the file ends inside a block")
            }
            Self::Format(e) => e.fmt(f),
            Self::Io(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ReadError {}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

fn format_err(offset: u64, what: impl Into<String>) -> ReadError {
    ReadError::Format(FormatError {
        offset,
        what: what.into(),
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    Little,
    Big,
}

impl Order {
    fn u16(self, b: [u8; 2]) -> u16 {
        match self {
            Self::Little => u16::from_le_bytes(b),
            Self::Big => u16::from_be_bytes(b),
        }
    }

    fn u32(self, b: [u8; 4]) -> u32 {
        match self {
            Self::Little => u32::from_le_bytes(b),
            Self::Big => u32::from_be_bytes(b),
        }
    }
}

#[derive(Clone, Copy)]
enum Format {
    Pcapng,
    /// Classic pcap, with micro- or nanosecond timestamps.
    Pcap {
        nanos: bool,
    },
}

/// What a packet needs from its interface.
struct Iface {
    snaplen: u32,
    tsresol: u8,
}

/// Reads pcapng (either byte order, any number of sections) or classic pcap.
/// As an iterator, it ends after the first error.
pub struct Reader<R: io::Read> {
    r: Counting<R>,
    format: Format,
    /// The current section's, or the pcap file's.
    order: Order,
    ifaces: Vec<Iface>,
    pending: Option<Block>,
    done: bool,
}

impl<R: io::Read> Reader<R> {
    /// Reads the file header: pcapng's first section, or pcap's header,
    /// which becomes interface 0.
    pub fn new(r: R) -> Result<Self, ReadError> {
        let mut r = Counting { inner: r, pos: 0 };
        let mut magic = [0; 4];
        match r.fill(&mut magic)? {
            0 => return Err(ReadError::Empty),
            4 => {}
            _ => return Err(ReadError::Truncated { offset: 0 }),
        }
        let (format, order) = match u32::from_le_bytes(magic) {
            SHB => (Format::Pcapng, Order::Little),
            0xa1b2_c3d4 => (Format::Pcap { nanos: false }, Order::Little),
            0xd4c3_b2a1 => (Format::Pcap { nanos: false }, Order::Big),
            0xa1b2_3c4d => (Format::Pcap { nanos: true }, Order::Little),
            0x4d3c_b2a1 => (Format::Pcap { nanos: true }, Order::Big),
            m => {
                let what = format!("not a pcap or pcapng file (magic 0x{m:08x})");
                return Err(format_err(0, what));
            }
        };
        let mut reader = Self {
            r,
            format,
            order,
            ifaces: Vec::new(),
            pending: None,
            done: false,
        };
        reader.pending = match format {
            Format::Pcapng => {
                let len = reader.r.array::<4>(0)?;
                reader.block(0, magic, len)?
            }
            Format::Pcap { nanos } => Some(reader.pcap_header(nanos)?),
        };
        Ok(reader)
    }

    /// The next block, `None` at a clean end of file.
    pub fn next_block(&mut self) -> Result<Option<Block>, ReadError> {
        if let Some(b) = self.pending.take() {
            return Ok(Some(b));
        }
        match self.format {
            Format::Pcapng => loop {
                let start = self.r.pos;
                let mut head = [0; 8];
                match self.r.fill(&mut head)? {
                    0 => return Ok(None),
                    8 => {}
                    _ => return Err(ReadError::Truncated { offset: start }),
                }
                let (kind, len) = split(head);
                if let Some(b) = self.block(start, kind, len)? {
                    return Ok(Some(b));
                }
            },
            Format::Pcap { nanos } => self.pcap_record(nanos),
        }
    }

    /// A pcapng block whose type and length were read; `None` if skipped.
    fn block(
        &mut self,
        start: u64,
        kind: [u8; 4],
        len: [u8; 4],
    ) -> Result<Option<Block>, ReadError> {
        // The section header's type reads the same in both byte orders; its
        // byte-order magic tells how to read the rest of the section.
        let is_shb = u32::from_le_bytes(kind) == SHB;
        let order = if is_shb {
            self.byte_order(start)?
        } else {
            self.order
        };
        let kind = order.u32(kind);
        let len = order.u32(len);
        check_len(start, kind, len)?;
        let head = if is_shb { 12 } else { 8 };
        let body = self.r.vec(len as usize - head - 4, start)?;
        let tail = order.u32(self.r.array::<4>(start)?);
        if tail != len {
            let what = format!("trailing block length {tail} differs from {len}");
            return Err(format_err(start + u64::from(len) - 4, what));
        }
        let body = Body {
            bytes: &body,
            base: start + head as u64,
            order,
        };
        Ok(match kind {
            SHB => Some(self.section(order, &body)?),
            IDB => Some(self.interface(&body)?),
            EPB => Some(self.enhanced(&body)?),
            SPB => Some(self.simple(&body)?),
            CB_COPY | CB_NO_COPY => Some(Block::Custom {
                pen: body.u32(0)?,
                data: body.bytes[4..].to_vec(),
            }),
            _ => None,
        })
    }

    fn byte_order(&mut self, start: u64) -> Result<Order, ReadError> {
        let magic = self.r.array::<4>(start)?;
        match u32::from_le_bytes(magic) {
            BYTE_ORDER_MAGIC => Ok(Order::Little),
            m if m.swap_bytes() == BYTE_ORDER_MAGIC => Ok(Order::Big),
            m => Err(format_err(
                start + 8,
                format!("byte-order magic 0x{m:08x} is not 0x{BYTE_ORDER_MAGIC:08x}"),
            )),
        }
    }

    fn section(&mut self, order: Order, body: &Body) -> Result<Block, ReadError> {
        let (major, minor) = (body.u16(0)?, body.u16(2)?);
        if major != 1 {
            let what = format!("pcapng version {major}.{minor} is not supported");
            return Err(format_err(body.base, what));
        }
        let mut info = SectionInfo::default();
        body.options(12, |code, v| {
            match code {
                SHB_HARDWARE => info.hardware = text(v),
                SHB_OS => info.os = text(v),
                SHB_USERAPPL => info.user_appl = text(v),
                OPT_COMMENT => info.comment.push(text(v)),
                _ => {}
            }
            Ok(())
        })?;
        self.order = order;
        self.ifaces.clear();
        Ok(Block::Section { info })
    }

    fn interface(&mut self, body: &Body) -> Result<Block, ReadError> {
        if self.ifaces.len() >= MAX_INTERFACES {
            let what = format!("more than {MAX_INTERFACES} interfaces in one section");
            return Err(format_err(body.base, what));
        }
        let mut iface = Interface {
            linktype: body.u16(0)?,
            snaplen: body.u32(4)?,
            ..Default::default()
        };
        let mut tsresol = TSRESOL_DEFAULT;
        body.options(8, |code, v| {
            match code {
                IF_NAME => iface.name = text(v),
                IF_DESCRIPTION => iface.description = text(v),
                OPT_COMMENT => iface.comment.push(text(v)),
                IF_TSRESOL => tsresol = *v.first().ok_or("if_tsresol is empty")?,
                _ => {}
            }
            Ok(())
        })?;
        self.ifaces.push(Iface {
            snaplen: iface.snaplen,
            tsresol,
        });
        Ok(Block::Interface {
            id: (self.ifaces.len() - 1) as u32,
            iface,
            tsresol,
        })
    }

    fn enhanced(&self, body: &Body) -> Result<Block, ReadError> {
        let id = body.u32(0)?;
        let tsresol = self.iface(id, body.base)?.tsresol;
        let ts = u64::from(body.u32(4)?) << 32 | u64::from(body.u32(8)?);
        let caplen = body.u32(12)? as usize;
        let opts_at = 20 + pad4(caplen);
        if opts_at > body.bytes.len() {
            let what = format!("captured length {caplen} overruns the block");
            return Err(format_err(body.base + 12, what));
        }
        let mut opts = Vec::new();
        body.options(opts_at, |code, v| {
            opts.extend(packet_opt(body.order, code, v));
            Ok(())
        })?;
        Ok(Block::Packet {
            iface: id,
            ts_ns: ts_to_ns(ts, tsresol),
            data: body.bytes[20..20 + caplen].to_vec(),
            orig_len: body.u32(16)?,
            opts,
        })
    }

    /// A Simple Packet Block: interface 0, no timestamp, captured length
    /// from the snaplen and the block.
    fn simple(&self, body: &Body) -> Result<Block, ReadError> {
        let snaplen = self.iface(0, body.base)?.snaplen;
        let orig_len = body.u32(0)?;
        let mut caplen = body.bytes.len() - 4;
        for limit in [orig_len, snaplen].into_iter().filter(|&l| l > 0) {
            caplen = caplen.min(limit as usize);
        }
        Ok(Block::Packet {
            iface: 0,
            ts_ns: 0,
            data: body.bytes[4..4 + caplen].to_vec(),
            orig_len,
            opts: Vec::new(),
        })
    }

    fn iface(&self, id: u32, offset: u64) -> Result<&Iface, ReadError> {
        self.ifaces
            .get(id as usize)
            .ok_or_else(|| format_err(offset, format!("interface {id} was never described")))
    }

    /// Classic pcap's file header, as interface 0.
    fn pcap_header(&mut self, nanos: bool) -> Result<Block, ReadError> {
        let mut head = [0; 20];
        if self.r.fill(&mut head)? < head.len() {
            return Err(ReadError::Truncated { offset: 0 });
        }
        let head = Body {
            bytes: &head,
            base: 4,
            order: self.order,
        };
        let iface = Interface {
            // The upper bits of the link type field hold FCS information.
            linktype: head.u32(16)? as u16,
            snaplen: head.u32(12)?,
            ..Default::default()
        };
        Ok(Block::Interface {
            id: 0,
            iface,
            tsresol: if nanos { 9 } else { 6 },
        })
    }

    fn pcap_record(&mut self, nanos: bool) -> Result<Option<Block>, ReadError> {
        let start = self.r.pos;
        let mut head = [0; 16];
        match self.r.fill(&mut head)? {
            0 => return Ok(None),
            16 => {}
            _ => return Err(ReadError::Truncated { offset: start }),
        }
        let head = Body {
            bytes: &head,
            base: start,
            order: self.order,
        };
        let caplen = head.u32(8)?;
        if caplen > MAX_BLOCK {
            let what = format!("captured length {caplen} is over the {MAX_BLOCK} byte cap");
            return Err(format_err(start + 8, what));
        }
        let data = self.r.vec(caplen as usize, start)?;
        let frac = u64::from(head.u32(4)?) * if nanos { 1 } else { 1_000 };
        Ok(Some(Block::Packet {
            iface: 0,
            ts_ns: u64::from(head.u32(0)?) * 1_000_000_000 + frac,
            data,
            orig_len: head.u32(12)?,
            opts: Vec::new(),
        }))
    }
}

impl<R: io::Read> Iterator for Reader<R> {
    type Item = Result<Block, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.next_block().transpose();
        self.done = !matches!(next, Some(Ok(_)));
        next
    }
}

fn split(head: [u8; 8]) -> ([u8; 4], [u8; 4]) {
    let [a, b, c, d, e, f, g, h] = head;
    ([a, b, c, d], [e, f, g, h])
}

/// Checks a block length before anything is allocated for it.
fn check_len(start: u64, kind: u32, len: u32) -> Result<(), ReadError> {
    let min = match kind {
        SHB => 28,
        IDB => 20,
        EPB => 32,
        SPB | CB_COPY | CB_NO_COPY => 16,
        _ => 12,
    };
    let what = if len < min {
        format!("block length {len} is below the minimum {min} for type 0x{kind:08x}")
    } else if !len.is_multiple_of(4) {
        format!("block length {len} is not a multiple of 4")
    } else if len > MAX_BLOCK {
        format!("block length {len} is over the {MAX_BLOCK} byte cap")
    } else {
        return Ok(());
    };
    Err(format_err(start + 4, what))
}

fn packet_opt(order: Order, code: u16, v: &[u8]) -> Option<PacketOpt> {
    match code {
        OPT_COMMENT => Some(PacketOpt::Comment(text(v))),
        EPB_FLAGS => Some(PacketOpt::Flags(order.u32(v.try_into().ok()?))),
        OPT_CUSTOM_COPY | OPT_CUSTOM_NO_COPY => Some(PacketOpt::Custom {
            pen: order.u32(v.get(..4)?.try_into().ok()?),
            data: v[4..].to_vec(),
        }),
        _ => None,
    }
}

fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

/// Timestamp units of `if_tsresol` (10^-n, or 2^-n with the top bit set) to
/// nanoseconds, saturating.
fn ts_to_ns(ts: u64, tsresol: u8) -> u64 {
    let ts = u128::from(ts);
    let exp = u32::from(tsresol & 0x7f);
    let ns = if tsresol & 0x80 != 0 {
        (ts * 1_000_000_000) >> exp
    } else if exp <= 9 {
        ts * 10u128.pow(9 - exp)
    } else {
        10u128.checked_pow(exp - 9).map_or(0, |d| ts / d)
    };
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// A block body, read with bounds checks; `base` is its offset in the file.
struct Body<'a> {
    bytes: &'a [u8],
    base: u64,
    order: Order,
}

impl Body<'_> {
    fn u16(&self, at: usize) -> Result<u16, ReadError> {
        Ok(self.order.u16(self.array(at)?))
    }

    fn u32(&self, at: usize) -> Result<u32, ReadError> {
        Ok(self.order.u32(self.array(at)?))
    }

    fn array<const N: usize>(&self, at: usize) -> Result<[u8; N], ReadError> {
        self.bytes
            .get(at..at + N)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| format_err(self.base + at as u64, "block too short for its fields"))
    }

    /// Calls `each` for the options from `at` up to opt_endofopt or the end.
    fn options(
        &self,
        mut at: usize,
        mut each: impl FnMut(u16, &[u8]) -> Result<(), &'static str>,
    ) -> Result<(), ReadError> {
        while at < self.bytes.len() {
            let (code, len) = (self.u16(at)?, self.u16(at + 2)?);
            if code == OPT_ENDOFOPT {
                break;
            }
            let value = at + 4;
            let offset = self.base + at as u64;
            if value + pad4(len.into()) > self.bytes.len() {
                let what = format!("option {code} of {len} bytes overruns the block");
                return Err(format_err(offset, what));
            }
            each(code, &self.bytes[value..value + usize::from(len)])
                .map_err(|what| format_err(offset, what))?;
            at = value + pad4(len.into());
        }
        Ok(())
    }
}

/// Counts the bytes read, for error offsets.
struct Counting<R> {
    inner: R,
    pos: u64,
}

impl<R: io::Read> Counting<R> {
    /// Reads until `buf` is full or the file ends; returns the bytes read.
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            match self.inner.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.pos += n as u64;
        Ok(n)
    }

    /// N bytes of the block that starts at `start`.
    fn array<const N: usize>(&mut self, start: u64) -> Result<[u8; N], ReadError> {
        let mut buf = [0; N];
        if self.fill(&mut buf)? < N {
            return Err(ReadError::Truncated { offset: start });
        }
        Ok(buf)
    }

    /// `len` bytes of the block that starts at `start`; past 64 KiB memory
    /// grows only as bytes arrive, so a lying length costs nothing.
    fn vec(&mut self, len: usize, start: u64) -> Result<Vec<u8>, ReadError> {
        let mut buf = Vec::with_capacity(len.min(1 << 16));
        let n = (&mut self.inner).take(len as u64).read_to_end(&mut buf)?;
        self.pos += n as u64;
        if n < len {
            return Err(ReadError::Truncated { offset: start });
        }
        Ok(buf)
    }
}

#[cfg(test)]
mod tests;
