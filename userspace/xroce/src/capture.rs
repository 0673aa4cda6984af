//! Packet captures, pcap and pcapng, read and written with the `pcap-file`
//! crate: the frames of a capture for `xroce decode`, the rxe replay tests
//! and anyone else who needs them, and the files `xroce capture -w` writes.
//!
//! [`Capture::parse`] walks a capture held in memory without copying a
//! packet; [`read_packets`] returns every packet of a file, owned. Classic
//! pcap records are taken as written (a packet the snap length cut keeps its
//! original length in [`Packet::orig_len`]); pcapng timestamps honour each
//! interface's `if_tsresol`, and a pcapng packet's `epb_flags` direction
//! (received or sent) becomes [`Packet::direction`]. Blocks other than
//! section headers, interface descriptions and packets are skipped without
//! their bodies being parsed.
//!
//! [`PcapWriter`] writes classic pcap (Ethernet, micro- or nanosecond
//! timestamps, a snap length), the format tcpdump writes and every reader
//! takes, or pcapng ([`WriteOptions::format`]): one Ethernet interface with
//! `if_tsresol`, `if_name` and `if_description`, and Enhanced Packet Blocks
//! whose `epb_flags` say whether the frame was received or sent, as
//! dumpcap marks them.
//!
//! pcapng is written with pcap-file's `PcapNgWriter` rather than by hand:
//! it already writes every block and option needed here (EPB flags,
//! `if_tsresol`, `if_name`, `if_description`, padding, trailing lengths),
//! its reader is the one this module uses, and the classic writer stays as
//! it was. Its one trap is that option lengths are written as 16 bits
//! without a check, so the interface strings are checked here.
use std::borrow::Cow;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapParser};
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::blocks::packet::PacketOption;
use pcap_file::pcapng::blocks::section_header::{SectionHeaderBlock, SectionHeaderOption};
use pcap_file::pcapng::blocks::{
    ENHANCED_PACKET_BLOCK, INTERFACE_DESCRIPTION_BLOCK, PACKET_BLOCK, SECTION_HEADER_BLOCK,
    SIMPLE_PACKET_BLOCK,
};
use pcap_file::pcapng::{Block, PcapNgParser, PcapNgWriter};
use pcap_file::{Endianness, PcapError, TsResolution};

/// LINKTYPE_ETHERNET: frames start with an Ethernet header.
pub const LINKTYPE_ETHERNET: u32 = 1;

/// tcpdump's default snap length (and what `-s 0` means to it).
pub const DEFAULT_SNAPLEN: u32 = 262_144;

/// The two capture file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Classic libpcap format (`tcpdump -w`).
    #[default]
    Pcap,
    /// pcapng (Wireshark, dumpcap, `editcap -F pcapng`).
    PcapNg,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Pcap => "pcap",
            Format::PcapNg => "pcapng",
        })
    }
}

/// Whether a frame was received or sent by the capturing host: pcapng's
/// `epb_flags` bits 0-1 (01 inbound, 10 outbound). Classic pcap cannot
/// record it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Received.
    Inbound,
    /// Sent.
    Outbound,
}

impl Direction {
    /// The direction bits of an `epb_flags` word; `None` for "not
    /// available" (00) and the invalid 11.
    pub fn from_epb_flags(flags: u32) -> Option<Self> {
        match flags & 0b11 {
            0b01 => Some(Direction::Inbound),
            0b10 => Some(Direction::Outbound),
            _ => None,
        }
    }

    /// The `epb_flags` word that says this direction and nothing else.
    pub fn epb_flags(self) -> u32 {
        match self {
            Direction::Inbound => 0b01,
            Direction::Outbound => 0b10,
        }
    }

    /// "in" or "out", as `xroce decode` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Inbound => "in",
            Direction::Outbound => "out",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a capture could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file starts with neither a pcap nor a pcapng magic number.
    #[error("not a pcap or pcapng capture")]
    NotACapture,
    #[error("{format} capture ends inside a block or record at byte {offset}")]
    Truncated { format: Format, offset: usize },
    #[error("malformed {format} capture at byte {offset}")]
    Malformed {
        format: Format,
        offset: usize,
        #[source]
        source: PcapError,
    },
    #[error(
        "pcapng packet at byte {offset} refers to interface {interface}, which is not described"
    )]
    UnknownInterface { offset: usize, interface: u32 },
}

/// One captured packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<'a> {
    /// Since the Unix epoch, as recorded (zero for a pcapng simple packet).
    pub timestamp: Duration,
    /// Length on the wire; more than `data.len()` when the snap length cut it.
    pub orig_len: u32,
    /// LINKTYPE_* of the interface it was captured on.
    pub link_type: u32,
    /// The captured bytes.
    pub data: Cow<'a, [u8]>,
    /// Received or sent, when a pcapng packet's flags say so (always
    /// `None` in classic pcap).
    pub direction: Option<Direction>,
}

impl Packet<'_> {
    /// The snap length cut this packet short.
    pub fn is_truncated(&self) -> bool {
        (self.data.len() as u64) < u64::from(self.orig_len)
    }

    /// The same packet, owning its bytes.
    pub fn into_owned(self) -> Packet<'static> {
        Packet {
            timestamp: self.timestamp,
            orig_len: self.orig_len,
            link_type: self.link_type,
            data: Cow::Owned(self.data.into_owned()),
            direction: self.direction,
        }
    }
}

enum Parser {
    Pcap(PcapParser),
    PcapNg(PcapNgParser),
}

/// A pcap or pcapng capture held in memory; iterating yields its packets
/// in file order, borrowing their bytes. After an error it yields nothing.
pub struct Capture<'a> {
    format: Format,
    link_type: Option<u32>,
    nanosecond: bool,
    len: usize,
    rest: &'a [u8],
    parser: Parser,
    failed: bool,
}

const PCAP_MAGICS: [[u8; 4]; 4] = [
    [0xa1, 0xb2, 0xc3, 0xd4], // microseconds, big-endian
    [0xd4, 0xc3, 0xb2, 0xa1], // microseconds, little-endian
    [0xa1, 0xb2, 0x3c, 0x4d], // nanoseconds, big-endian
    [0x4d, 0x3c, 0xb2, 0xa1], // nanoseconds, little-endian
];
/// Block type of the pcapng section header block, the first of the file.
const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

impl<'a> Capture<'a> {
    /// Recognise the format by its magic number and read the file header.
    pub fn parse(data: &'a [u8]) -> Result<Self, CaptureError> {
        let magic: [u8; 4] = match data.get(..4) {
            Some(m) => m.try_into().unwrap(),
            None => return Err(CaptureError::NotACapture),
        };
        if PCAP_MAGICS.contains(&magic) {
            let (rest, parser) = PcapParser::new(data).map_err(|e| error(Format::Pcap, 0, e))?;
            let h = parser.header();
            Ok(Capture {
                format: Format::Pcap,
                // The upper bits carry the FCS length, not the link type.
                link_type: Some(u32::from(h.datalink) & 0x0fff_ffff),
                nanosecond: h.ts_resolution == TsResolution::NanoSecond,
                len: data.len(),
                rest,
                parser: Parser::Pcap(parser),
                failed: false,
            })
        } else if magic == PCAPNG_MAGIC {
            let (rest, parser) =
                PcapNgParser::new(data).map_err(|e| error(Format::PcapNg, 0, e))?;
            let first = first_interface(data);
            Ok(Capture {
                format: Format::PcapNg,
                link_type: first.as_ref().map(|i| u32::from(i.linktype)),
                nanosecond: first.as_ref().is_some_and(|i| tsresol(i) == 9),
                len: data.len(),
                rest,
                parser: Parser::PcapNg(parser),
                failed: false,
            })
        } else {
            Err(CaptureError::NotACapture)
        }
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// The link type of the file (pcap) or of its first interface (pcapng;
    /// `None` if it describes none).
    pub fn link_type(&self) -> Option<u32> {
        self.link_type
    }

    /// Timestamps in nanoseconds: a nanosecond pcap, or a pcapng whose
    /// first interface has `if_tsresol` 9.
    pub fn nanosecond(&self) -> bool {
        self.nanosecond
    }

    fn offset(&self) -> usize {
        self.len - self.rest.len()
    }

    fn next_packet(&mut self) -> Result<Option<Packet<'a>>, CaptureError> {
        let (format, offset) = (self.format, self.offset());
        match &mut self.parser {
            Parser::Pcap(p) => {
                if self.rest.is_empty() {
                    return Ok(None);
                }
                // Raw records: pcap-file's checked ones refuse a packet
                // whose original length exceeds the snap length, which is
                // every packet the snap length cut.
                let (rest, raw) = p
                    .next_raw_packet(self.rest)
                    .map_err(|e| error(format, offset, e))?;
                self.rest = rest;
                let frac = u64::from(raw.ts_frac);
                let nanos = if self.nanosecond { frac } else { frac * 1000 };
                Ok(Some(Packet {
                    timestamp: Duration::from_secs(raw.ts_sec.into()) + Duration::from_nanos(nanos),
                    orig_len: raw.orig_len,
                    link_type: self.link_type.unwrap_or(LINKTYPE_ETHERNET),
                    data: raw.data,
                    direction: None,
                }))
            }
            Parser::PcapNg(p) => loop {
                if self.rest.is_empty() {
                    return Ok(None);
                }
                let offset = self.len - self.rest.len();
                if !is_parsed_block(p.section().endianness, self.rest) {
                    // Only the block's framing is checked: a block we have
                    // no use for cannot fail the read with its contents.
                    let (rest, _) = p
                        .next_raw_block(self.rest)
                        .map_err(|e| error(format, offset, e))?;
                    self.rest = rest;
                    continue;
                }
                let (rest, block) = p
                    .next_block(self.rest)
                    .map_err(|e| error(format, offset, e))?;
                self.rest = rest;
                let iface = |id: u32| {
                    p.interfaces()
                        .get(id as usize)
                        .ok_or(CaptureError::UnknownInterface {
                            offset,
                            interface: id,
                        })
                };
                let packet = match block {
                    Block::EnhancedPacket(b) => {
                        let i = iface(b.interface_id)?;
                        Packet {
                            // pcap-file keeps the raw units in the nanoseconds.
                            timestamp: ticks(b.timestamp.as_nanos(), tsresol(i)),
                            orig_len: b.original_len,
                            link_type: i.linktype.into(),
                            direction: b.options.iter().find_map(|o| match o {
                                EnhancedPacketOption::Flags(f) => Direction::from_epb_flags(*f),
                                _ => None,
                            }),
                            data: b.data,
                        }
                    }
                    Block::SimplePacket(b) => {
                        let i = iface(0)?;
                        // The block holds padding too: the captured length
                        // is the original one, cut to the snap length.
                        let mut n = b.original_len as usize;
                        if i.snaplen != 0 {
                            n = n.min(i.snaplen as usize);
                        }
                        let data = match b.data {
                            Cow::Borrowed(d) => Cow::Borrowed(&d[..n.min(d.len())]),
                            Cow::Owned(mut d) => {
                                d.truncate(n);
                                Cow::Owned(d)
                            }
                        };
                        Packet {
                            timestamp: Duration::ZERO,
                            orig_len: b.original_len,
                            link_type: i.linktype.into(),
                            data,
                            direction: None,
                        }
                    }
                    Block::Packet(b) => {
                        let i = iface(b.interface_id.into())?;
                        Packet {
                            timestamp: ticks(b.timestamp.into(), tsresol(i)),
                            orig_len: b.original_len,
                            link_type: i.linktype.into(),
                            // The obsolete Packet Block's pack_flags are
                            // laid out as epb_flags.
                            direction: b.options.iter().find_map(|o| match o {
                                PacketOption::Flags(f) => Direction::from_epb_flags(*f),
                                _ => None,
                            }),
                            data: b.data,
                        }
                    }
                    _ => continue,
                };
                return Ok(Some(packet));
            },
        }
    }
}

impl<'a> Iterator for Capture<'a> {
    type Item = Result<Packet<'a>, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let r = self.next_packet();
        self.failed = r.is_err();
        r.transpose()
    }
}

/// Every packet of the pcap or pcapng file at `path`, owned.
pub fn read_packets(path: impl AsRef<Path>) -> Result<Vec<Packet<'static>>, CaptureError> {
    let path = path.as_ref();
    let data = std::fs::read(path).map_err(|source| CaptureError::Io {
        path: path.to_owned(),
        source,
    })?;
    Capture::parse(&data)?
        .map(|p| p.map(Packet::into_owned))
        .collect()
}

/// The format [`PcapWriter`] writes: classic pcap (the default) or pcapng,
/// the two [`Format`]s a [`Capture`] reads.
pub type FileFormat = Format;

/// How [`PcapWriter`] writes a file. Build it with `..Default::default()`:
/// classic pcap, microseconds, tcpdump's snap length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOptions {
    /// Bytes kept of each frame (0: [`DEFAULT_SNAPLEN`], as tcpdump's `-s 0`).
    pub snaplen: u32,
    /// Nanosecond timestamps (pcap: magic 0xa1b23c4d; pcapng: `if_tsresol`
    /// 9) instead of microseconds.
    pub nanosecond: bool,
    /// Classic pcap (the default) or pcapng.
    pub format: FileFormat,
    /// pcapng `if_name` of the one interface (e.g. "eth1"); classic pcap
    /// has no place for it.
    pub if_name: Option<String>,
    /// pcapng `if_description` (e.g. "xroce capture").
    pub if_description: Option<String>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            snaplen: DEFAULT_SNAPLEN,
            nanosecond: false,
            format: FileFormat::Pcap,
            if_name: None,
            if_description: None,
        }
    }
}

/// Where [`PcapWriter`] puts what it writes.
enum Sink<W: Write> {
    /// Classic pcap: 16-byte record headers written here.
    Pcap(W),
    /// pcapng: blocks written by pcap-file, which holds the writer.
    PcapNg(PcapNgWriter<W>),
}

/// Writes Ethernet frames as a classic pcap file or a pcapng file, in this
/// host's byte order (as tcpdump and dumpcap do).
///
/// Classic pcap: the file header is pcap-file's; each record is its 16-byte
/// header (seconds, fraction, captured and original length) and the bytes
/// kept. pcapng: a Section Header Block, one Interface Description Block
/// (Ethernet, the snap length, `if_tsresol` 6 or 9, the optional name and
/// description) and one Enhanced Packet Block per frame, with `epb_flags`
/// when its direction is known.
///
/// Nothing is buffered here: wrap a file in a `BufWriter` and call
/// [`PcapWriter::flush`].
pub struct PcapWriter<W: Write> {
    sink: Sink<W>,
    snaplen: u32,
    nanosecond: bool,
    packets: u64,
    truncated: u64,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header of `options.format` to `out`: the pcap
    /// header, or the pcapng section header and interface description.
    pub fn new(mut out: W, options: WriteOptions) -> std::io::Result<Self> {
        let snaplen = match options.snaplen {
            0 => DEFAULT_SNAPLEN,
            n => n,
        };
        let nanosecond = options.nanosecond;
        let sink = match options.format {
            Format::Pcap => {
                let header = PcapHeader {
                    snaplen,
                    datalink: pcap_file::DataLink::ETHERNET,
                    ts_resolution: if nanosecond {
                        TsResolution::NanoSecond
                    } else {
                        TsResolution::MicroSecond
                    },
                    endianness: Endianness::native(),
                    ..PcapHeader::default()
                };
                header.write_to(&mut out).map_err(io_error)?;
                Sink::Pcap(out)
            }
            Format::PcapNg => Sink::PcapNg(start_pcapng(out, snaplen, options)?),
        };
        Ok(Self {
            sink,
            snaplen,
            nanosecond,
            packets: 0,
            truncated: 0,
        })
    }

    /// Appends one frame seen at `timestamp` (since the Unix epoch), cut to
    /// the snap length; the record keeps its length on the wire. Its
    /// direction is not known: `write_with(timestamp, frame, frame.len(),
    /// None)`.
    pub fn write(&mut self, timestamp: Duration, frame: &[u8]) -> std::io::Result<()> {
        let orig_len = u32::try_from(frame.len())
            .map_err(|_| std::io::Error::other("frame longer than 4 GiB"))?;
        self.write_with(timestamp, frame, orig_len, None)
    }

    /// Appends one frame seen at `timestamp` (since the Unix epoch) that was
    /// `orig_len` bytes long on the wire (at least `frame.len()`: whoever
    /// copied the frame may have cut it already), cut to the snap length.
    /// pcapng records `direction` in the packet's `epb_flags`; classic pcap
    /// cannot record it and drops it.
    pub fn write_with(
        &mut self,
        timestamp: Duration,
        frame: &[u8],
        orig_len: u32,
        direction: Option<Direction>,
    ) -> std::io::Result<()> {
        if (orig_len as usize) < frame.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "original length {orig_len} is less than the {} bytes of the frame",
                    frame.len()
                ),
            ));
        }
        let kept = &frame[..frame.len().min(self.snaplen as usize)];
        match &mut self.sink {
            Sink::Pcap(out) => write_pcap_record(out, timestamp, self.nanosecond, kept, orig_len)?,
            Sink::PcapNg(w) => {
                let units = if self.nanosecond {
                    timestamp.as_nanos()
                } else {
                    timestamp.as_micros()
                };
                // 64 bits of nanoseconds run out in 2554.
                let units = u64::try_from(units).map_err(|_| {
                    std::io::Error::other("timestamp beyond pcapng's 64-bit timestamps")
                })?;
                let options = match direction {
                    Some(d) => vec![EnhancedPacketOption::Flags(d.epb_flags())],
                    None => Vec::new(),
                };
                w.write_pcapng_block(EnhancedPacketBlock {
                    interface_id: 0,
                    // pcap-file carries the raw units in the nanoseconds.
                    timestamp: Duration::from_nanos(units),
                    original_len: orig_len,
                    data: Cow::Borrowed(kept),
                    options,
                })
                .map_err(io_error)?;
            }
        }
        self.packets += 1;
        if (kept.len() as u64) < u64::from(orig_len) {
            self.truncated += 1;
        }
        Ok(())
    }

    /// Flushes the underlying writer: the file then holds a complete
    /// capture of everything written so far.
    pub fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.sink {
            Sink::Pcap(out) => out.flush(),
            Sink::PcapNg(w) => w.get_mut().flush(),
        }
    }

    /// The format being written.
    pub fn format(&self) -> Format {
        match self.sink {
            Sink::Pcap(_) => Format::Pcap,
            Sink::PcapNg(_) => Format::PcapNg,
        }
    }

    /// Frames written so far.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Frames written shorter than they were on the wire (cut by the snap
    /// length, or before they were handed to [`PcapWriter::write_with`]).
    pub fn truncated(&self) -> u64 {
        self.truncated
    }

    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }

    /// The underlying writer (not flushed).
    pub fn into_inner(self) -> W {
        match self.sink {
            Sink::Pcap(out) => out,
            Sink::PcapNg(w) => w.into_inner(),
        }
    }
}

impl PcapWriter<std::io::BufWriter<std::fs::File>> {
    /// Creates (or truncates) the file at `path` and writes its header.
    pub fn create(path: impl AsRef<Path>, options: WriteOptions) -> std::io::Result<Self> {
        let file = std::fs::File::create(path)?;
        // Big enough for a batch of jumbo frames between flushes.
        Self::new(std::io::BufWriter::with_capacity(1 << 20, file), options)
    }
}

/// Records every frame `link` carries (both directions, before loss or
/// marking) into a classic pcap file at `path`, with the simulated
/// timestamps in nanoseconds, for `xroce decode`, tshark or Wireshark.
/// A write error stops the recording; the run goes on.
pub fn record_sim_link(
    link: &mut xroce_transport::engine::sim::SimLink,
    path: impl AsRef<Path>,
) -> std::io::Result<()> {
    let options = WriteOptions {
        nanosecond: true,
        ..Default::default()
    };
    let mut writer = Some(PcapWriter::create(path, options)?);
    link.tap_frames(move |now_ns, frame| {
        if let Some(w) = &mut writer {
            if w.write(Duration::from_nanos(now_ns), frame).is_err() {
                writer = None;
            }
        }
    });
    Ok(())
}

/// One classic pcap record: its 16-byte header and the bytes kept.
fn write_pcap_record(
    out: &mut impl Write,
    timestamp: Duration,
    nanosecond: bool,
    kept: &[u8],
    orig_len: u32,
) -> std::io::Result<()> {
    // The format's seconds are 32 bits: they run out in 2106.
    let secs = u32::try_from(timestamp.as_secs())
        .map_err(|_| std::io::Error::other("timestamp after 2106"))?;
    let frac = if nanosecond {
        timestamp.subsec_nanos()
    } else {
        timestamp.subsec_micros()
    };
    // kept.len() <= orig_len, a u32.
    let kept_len = kept.len() as u32;
    let mut record = [0u8; 16];
    for (i, v) in [secs, frac, kept_len, orig_len].into_iter().enumerate() {
        record[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
    }
    out.write_all(&record)?;
    out.write_all(kept)
}

/// The pcapng file header: a Section Header Block naming xroce as the
/// writer, and the Interface Description Block of the one Ethernet
/// interface every packet is recorded on.
fn start_pcapng<W: Write>(
    out: W,
    snaplen: u32,
    options: WriteOptions,
) -> std::io::Result<PcapNgWriter<W>> {
    let section = SectionHeaderBlock {
        endianness: Endianness::native(),
        options: vec![SectionHeaderOption::UserApplication(Cow::Borrowed("xroce"))],
        ..SectionHeaderBlock::default()
    };
    let tsresol = if options.nanosecond { 9 } else { 6 };
    let mut interface_options = vec![InterfaceDescriptionOption::IfTsResol(tsresol)];
    if let Some(name) = options.if_name {
        let name = option_text("if_name", name)?;
        interface_options.push(InterfaceDescriptionOption::IfName(name));
    }
    if let Some(text) = options.if_description {
        let text = option_text("if_description", text)?;
        interface_options.push(InterfaceDescriptionOption::IfDescription(text));
    }
    let interface = InterfaceDescriptionBlock {
        linktype: pcap_file::DataLink::ETHERNET,
        snaplen,
        options: interface_options,
    };
    let mut w = PcapNgWriter::with_section_header(out, section).map_err(io_error)?;
    w.write_pcapng_block(interface).map_err(io_error)?;
    Ok(w)
}

/// A pcapng option's text, refused if its length does not fit the 16-bit
/// length field (pcap-file would write the length cut to 16 bits).
fn option_text(option: &str, text: String) -> std::io::Result<Cow<'static, str>> {
    if text.len() > usize::from(u16::MAX) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("pcapng {option} longer than 65535 bytes"),
        ));
    }
    Ok(Cow::Owned(text))
}

fn io_error(e: PcapError) -> std::io::Error {
    match e {
        PcapError::IoError(e) => e,
        e => std::io::Error::other(e),
    }
}

fn error(format: Format, offset: usize, e: PcapError) -> CaptureError {
    match e {
        PcapError::IncompleteBuffer => CaptureError::Truncated { format, offset },
        source => CaptureError::Malformed {
            format,
            offset,
            source,
        },
    }
}

/// The first interface a pcapng file describes, if one precedes its first
/// packet (errors are left for the walk over the packets to report).
fn first_interface(data: &[u8]) -> Option<InterfaceDescriptionBlock<'static>> {
    let (mut rest, mut p) = PcapNgParser::new(data).ok()?;
    while !rest.is_empty() {
        // Raw blocks: the parser still reads and keeps interface
        // descriptions, and skips the rest unparsed as the walk does.
        let (r, raw) = p.next_raw_block(rest).ok()?;
        match raw.type_ {
            INTERFACE_DESCRIPTION_BLOCK => return p.interfaces().last().cloned(),
            ENHANCED_PACKET_BLOCK | SIMPLE_PACKET_BLOCK | PACKET_BLOCK => return None,
            _ => rest = r,
        }
    }
    None
}

/// Whether the pcapng block at the start of `data` is one [`Capture`]
/// parses: section headers and interface descriptions (the parser keeps
/// them) and the three packet blocks. A block type it cannot read yet is
/// left to the parser, which reports the truncation.
fn is_parsed_block(endianness: Endianness, data: &[u8]) -> bool {
    let Some(&bytes) = data.first_chunk::<4>() else {
        return true;
    };
    let block_type = match endianness {
        Endianness::Big => u32::from_be_bytes(bytes),
        Endianness::Little => u32::from_le_bytes(bytes),
    };
    matches!(
        block_type,
        SECTION_HEADER_BLOCK
            | INTERFACE_DESCRIPTION_BLOCK
            | ENHANCED_PACKET_BLOCK
            | SIMPLE_PACKET_BLOCK
            | PACKET_BLOCK
    )
}

/// `if_tsresol` of an interface: 6 (microseconds) unless it says otherwise.
fn tsresol(i: &InterfaceDescriptionBlock) -> u8 {
    i.options
        .iter()
        .find_map(|o| match o {
            InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
            _ => None,
        })
        .unwrap_or(6)
}

/// `n` timestamp units of resolution `tsresol` (10^-r s, or 2^-r s with
/// the top bit set).
fn ticks(n: u128, tsresol: u8) -> Duration {
    let r = u32::from(tsresol & 0x7f);
    let per_sec = if tsresol & 0x80 == 0 {
        10u128.checked_pow(r)
    } else {
        2u128.checked_pow(r)
    }
    .unwrap_or(u128::MAX);
    let nanos = n.saturating_mul(1_000_000_000) / per_sec;
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::simple_packet::SimplePacketBlock;
    use pcap_file::pcapng::PcapNgWriter;
    use pcap_file::{DataLink, Endianness};

    fn frames() -> Vec<Vec<u8>> {
        (0..5u8).map(|i| vec![i; 60 + i as usize]).collect()
    }

    fn pcap(endianness: Endianness, ts_resolution: TsResolution) -> Vec<u8> {
        let h = PcapHeader {
            endianness,
            ts_resolution,
            ..PcapHeader::default()
        };
        let mut w = PcapWriter::with_header(Vec::new(), h).unwrap();
        for (i, f) in frames().iter().enumerate() {
            let ts = Duration::new(1_700_000_000 + i as u64, 123_456_000);
            w.write_packet(&PcapPacket::new(ts, f.len() as u32, f))
                .unwrap();
        }
        w.into_writer()
    }

    fn pcapng(tsresol: Option<u8>) -> Vec<u8> {
        let mut w = PcapNgWriter::with_endianness(Vec::new(), Endianness::Little).unwrap();
        let mut idb = InterfaceDescriptionBlock::new(DataLink::ETHERNET, 0);
        if let Some(r) = tsresol {
            idb.options.push(InterfaceDescriptionOption::IfTsResol(r));
        }
        w.write_pcapng_block(idb).unwrap();
        let unit = 10u64.pow(9 - u32::from(tsresol.unwrap_or(6)));
        for (i, f) in frames().iter().enumerate() {
            let ns = (1_700_000_000 + i as u64) * 1_000_000_000 + 123_456_000;
            w.write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: Duration::from_nanos(ns / unit),
                original_len: f.len() as u32,
                data: Cow::Borrowed(f),
                options: vec![],
            })
            .unwrap();
        }
        w.into_inner()
    }

    fn check(data: &[u8], format: Format, nanosecond: bool) {
        let c = Capture::parse(data).unwrap();
        assert_eq!(c.format(), format);
        assert_eq!(c.link_type(), Some(LINKTYPE_ETHERNET));
        assert_eq!(c.nanosecond(), nanosecond);
        let got: Vec<Packet> = c.map(Result::unwrap).collect();
        assert_eq!(got.len(), frames().len());
        for (i, (p, f)) in got.iter().zip(frames()).enumerate() {
            assert_eq!(&p.data[..], &f[..]);
            assert_eq!(p.orig_len as usize, f.len());
            assert_eq!(p.link_type, LINKTYPE_ETHERNET);
            assert_eq!(
                p.timestamp,
                Duration::new(1_700_000_000 + i as u64, 123_456_000)
            );
        }
    }

    #[test]
    fn pcap_in_every_byte_order_and_resolution() {
        for e in [Endianness::Little, Endianness::Big] {
            for r in [TsResolution::MicroSecond, TsResolution::NanoSecond] {
                check(&pcap(e, r), Format::Pcap, r == TsResolution::NanoSecond);
            }
        }
    }

    #[test]
    fn pcapng_honours_tsresol() {
        check(&pcapng(None), Format::PcapNg, false);
        check(&pcapng(Some(6)), Format::PcapNg, false);
        check(&pcapng(Some(9)), Format::PcapNg, true);
    }

    #[test]
    fn pcapng_simple_packets_lose_their_padding() {
        let mut w = PcapNgWriter::new(Vec::new()).unwrap();
        w.write_pcapng_block(InterfaceDescriptionBlock::new(DataLink::ETHERNET, 0))
            .unwrap();
        for f in frames() {
            w.write_pcapng_block(SimplePacketBlock {
                original_len: f.len() as u32,
                data: Cow::Owned(f),
            })
            .unwrap();
        }
        let data = w.into_inner();
        let got: Vec<Packet> = Capture::parse(&data).unwrap().map(Result::unwrap).collect();
        let want: Vec<Vec<u8>> = frames();
        assert_eq!(
            got.iter().map(|p| p.data.to_vec()).collect::<Vec<_>>(),
            want
        );
    }

    #[test]
    fn snap_length_cuts_are_kept_not_refused() {
        let h = PcapHeader {
            snaplen: 64,
            ..PcapHeader::default()
        };
        let mut w = PcapWriter::with_header(Vec::new(), h).unwrap();
        w.write_packet(&PcapPacket::new(Duration::ZERO, 1000, &[7; 64]))
            .unwrap();
        let data = w.into_writer();
        let p = Capture::parse(&data).unwrap().next().unwrap().unwrap();
        assert!(p.is_truncated());
        assert_eq!((p.data.len(), p.orig_len), (64, 1000));
    }

    /// Every prefix and many one-byte corruptions of both formats: an
    /// error or packets, never a panic.
    #[test]
    fn damaged_captures_do_not_panic() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for good in [
            pcap(Endianness::Big, TsResolution::NanoSecond),
            pcapng(Some(9)),
            write_pcapng(true),
        ] {
            for n in 0..good.len() {
                let _ = Capture::parse(&good[..n]).map(|c| c.count());
            }
            for _ in 0..20_000 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let mut bad = good.clone();
                let at = (seed as usize) % bad.len();
                bad[at] ^= (seed >> 32) as u8 | 1;
                let _ = Capture::parse(&bad).map(|c| c.count());
            }
        }
    }

    #[test]
    fn neither_format_nor_whole_is_an_error() {
        for junk in [&b""[..], b"abc", b"hello, world\n", &[0u8; 64]] {
            assert!(matches!(
                Capture::parse(junk),
                Err(CaptureError::NotACapture)
            ));
        }
        let data = pcap(Endianness::Little, TsResolution::MicroSecond);
        assert!(matches!(
            Capture::parse(&data[..20]),
            Err(CaptureError::Truncated { .. })
        ));
        let mut c = Capture::parse(&data[..data.len() - 3]).unwrap();
        assert_eq!(c.by_ref().filter(Result::is_ok).count(), 4);
        let ng = pcapng(None);
        let r: Result<Vec<_>, _> = Capture::parse(&ng[..ng.len() - 3]).unwrap().collect();
        assert!(matches!(r, Err(CaptureError::Truncated { .. })));
    }

    /// What our writer writes, pcap-file's reader (through `Capture`)
    /// reads back: both resolutions, the snap length cut recorded.
    #[test]
    fn written_captures_read_back() {
        for nanosecond in [false, true] {
            let options = WriteOptions {
                snaplen: 64,
                nanosecond,
                ..WriteOptions::default()
            };
            let mut w = super::PcapWriter::new(Vec::new(), options).unwrap();
            let ts = |i: usize| Duration::new(1_700_000_000 + i as u64, 123_456_789);
            for (i, f) in frames().iter().enumerate() {
                w.write(ts(i), f).unwrap();
            }
            w.write(ts(5), &[9; 1000]).unwrap();
            assert_eq!((w.packets(), w.truncated(), w.snaplen()), (6, 1, 64));
            let data = w.into_inner();
            let c = Capture::parse(&data).unwrap();
            assert_eq!(c.format(), Format::Pcap);
            assert_eq!(c.link_type(), Some(LINKTYPE_ETHERNET));
            assert_eq!(c.nanosecond(), nanosecond);
            let got: Vec<Packet> = c.map(Result::unwrap).collect();
            assert_eq!(got.len(), 6);
            for (i, p) in got.iter().enumerate() {
                let want = if nanosecond {
                    ts(i)
                } else {
                    Duration::new(1_700_000_000 + i as u64, 123_456_000)
                };
                assert_eq!(p.timestamp, want);
            }
            for (p, f) in got.iter().zip(frames()) {
                assert_eq!((&p.data[..], p.orig_len as usize), (&f[..], f.len()));
            }
            assert_eq!((got[5].data.len(), got[5].orig_len), (64, 1000));
            assert!(got[5].is_truncated());
        }
    }

    #[test]
    fn snaplen_zero_means_tcpdump_default_and_header_is_24_bytes() {
        let w = super::PcapWriter::new(
            Vec::new(),
            WriteOptions {
                snaplen: 0,
                ..WriteOptions::default()
            },
        )
        .unwrap();
        assert_eq!(w.snaplen(), DEFAULT_SNAPLEN);
        let data = w.into_inner();
        assert_eq!(data.len(), 24);
        assert_eq!(Capture::parse(&data).unwrap().count(), 0);
    }

    /// The frames of the pcapng tests with their directions: every
    /// direction, a frame the snap length (64) cuts, one handed over cut
    /// already (60 of 1500 bytes).
    fn directed() -> Vec<(Vec<u8>, u32, Option<Direction>)> {
        let mut v: Vec<_> = frames()
            .into_iter()
            .zip([
                Some(Direction::Inbound),
                Some(Direction::Outbound),
                None,
                Some(Direction::Outbound),
                Some(Direction::Inbound),
            ])
            .map(|(f, d)| {
                let n = f.len() as u32;
                (f, n, d)
            })
            .collect();
        v.push((vec![9; 1000], 1000, Some(Direction::Outbound)));
        v.push((vec![8; 60], 1500, Some(Direction::Inbound)));
        v
    }

    fn ts(i: usize) -> Duration {
        Duration::new(1_700_000_000 + i as u64, 123_456_789)
    }

    fn write_pcapng(nanosecond: bool) -> Vec<u8> {
        let options = WriteOptions {
            snaplen: 64,
            nanosecond,
            format: FileFormat::PcapNg,
            if_name: Some("eth1".into()),
            if_description: Some("xroce capture".into()),
        };
        let mut w = super::PcapWriter::new(Vec::new(), options).unwrap();
        assert_eq!(w.format(), Format::PcapNg);
        for (i, (f, orig_len, d)) in directed().iter().enumerate() {
            w.write_with(ts(i), f, *orig_len, *d).unwrap();
        }
        // The 1000-byte frame and the one cut before.
        assert_eq!((w.packets(), w.truncated(), w.snaplen()), (7, 2, 64));
        w.into_inner()
    }

    #[test]
    fn pcapng_written_reads_back() {
        for nanosecond in [false, true] {
            let data = write_pcapng(nanosecond);
            let c = Capture::parse(&data).unwrap();
            assert_eq!(c.format(), Format::PcapNg);
            assert_eq!(c.link_type(), Some(LINKTYPE_ETHERNET));
            assert_eq!(c.nanosecond(), nanosecond);
            let got: Vec<Packet> = c.map(Result::unwrap).collect();
            let want = directed();
            assert_eq!(got.len(), want.len());
            for (i, (p, (f, orig_len, d))) in got.iter().zip(&want).enumerate() {
                let kept = &f[..f.len().min(64)];
                assert_eq!(&p.data[..], kept, "packet {i}");
                assert_eq!(p.orig_len, *orig_len, "packet {i}");
                assert_eq!(p.direction, *d, "packet {i}");
                assert_eq!(p.link_type, LINKTYPE_ETHERNET);
                let t = if nanosecond {
                    ts(i)
                } else {
                    Duration::new(1_700_000_000 + i as u64, 123_456_000)
                };
                assert_eq!(p.timestamp, t, "packet {i}");
            }
            assert!(got[5].is_truncated() && got[6].is_truncated());
            assert_eq!((got[5].data.len(), got[5].orig_len), (64, 1000));
            assert_eq!((got[6].data.len(), got[6].orig_len), (60, 1500));
        }
    }

    /// The written pcapng walked by hand, not by pcap-file: block lengths
    /// repeated at the end and multiples of 4, the section header's byte
    /// order magic, the interface's options, `epb_flags` only on packets
    /// with a direction.
    #[test]
    fn pcapng_layout() {
        let u16_at = |b: &[u8], at: usize| u16::from_ne_bytes([b[at], b[at + 1]]);
        let u32_at = |b: &[u8], at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap());
        /// (code, value) of the options in `b`, up to opt_endofopt.
        fn options(b: &[u8]) -> Vec<(u16, Vec<u8>)> {
            let mut out = Vec::new();
            let mut at = 0;
            loop {
                let code = u16::from_ne_bytes([b[at], b[at + 1]]);
                let len = usize::from(u16::from_ne_bytes([b[at + 2], b[at + 3]]));
                if code == 0 {
                    assert_eq!((len, at + 4), (0, b.len()), "opt_endofopt ends the block");
                    return out;
                }
                out.push((code, b[at + 4..at + 4 + len].to_vec()));
                at += 4 + len.next_multiple_of(4);
            }
        }
        for (nanosecond, tsresol) in [(false, 6u8), (true, 9)] {
            let data = write_pcapng(nanosecond);
            let mut blocks = Vec::new();
            let mut at = 0;
            while at < data.len() {
                let (kind, len) = (u32_at(&data, at), u32_at(&data, at + 4) as usize);
                assert_eq!(len % 4, 0);
                assert_eq!(u32_at(&data, at + len - 4) as usize, len, "trailing length");
                blocks.push((kind, &data[at + 8..at + len - 4]));
                at += len;
            }
            assert_eq!(at, data.len());
            let kinds: Vec<u32> = blocks.iter().map(|b| b.0).collect();
            assert_eq!(kinds, [0x0a0d_0d0a, 1, 6, 6, 6, 6, 6, 6, 6]);

            let shb = blocks[0].1;
            assert_eq!(u32_at(shb, 0), 0x1a2b_3c4d, "byte order magic");
            assert_eq!((u16_at(shb, 4), u16_at(shb, 6)), (1, 0), "version 1.0");
            assert_eq!(options(&shb[16..]), [(4, b"xroce".to_vec())]);

            let idb = blocks[1].1;
            assert_eq!(
                (u16_at(idb, 0), u16_at(idb, 2)),
                (1, 0),
                "LINKTYPE_ETHERNET"
            );
            assert_eq!(u32_at(idb, 4), 64, "snaplen");
            assert_eq!(
                options(&idb[8..]),
                [
                    (9, vec![tsresol]),
                    (2, b"eth1".to_vec()),
                    (3, b"xroce capture".to_vec()),
                ]
            );

            for ((_, epb), (f, orig_len, d)) in blocks[2..].iter().zip(directed()) {
                assert_eq!(u32_at(epb, 0), 0, "interface");
                let caplen = u32_at(epb, 12) as usize;
                assert_eq!(caplen, f.len().min(64));
                assert_eq!(u32_at(epb, 16), orig_len);
                assert_eq!(&epb[20..20 + caplen], &f[..caplen]);
                let padded = 20 + caplen.next_multiple_of(4);
                assert!(epb[20 + caplen..padded].iter().all(|&b| b == 0), "padding");
                match d {
                    None => assert_eq!(epb.len(), padded, "no options"),
                    Some(d) => assert_eq!(
                        options(&epb[padded..]),
                        [(2, d.epb_flags().to_ne_bytes().to_vec())]
                    ),
                }
            }
        }
    }

    /// Every prefix of a written pcapng: an error, or the packets of the
    /// whole file up to some point; never a panic.
    #[test]
    fn pcapng_prefixes_never_panic() {
        let data = write_pcapng(true);
        let whole: Vec<Packet> = Capture::parse(&data).unwrap().map(Result::unwrap).collect();
        let mut errors = 0;
        for n in 0..data.len() {
            let Ok(c) = Capture::parse(&data[..n]) else {
                errors += 1;
                continue;
            };
            let mut got = Vec::new();
            for p in c {
                match p {
                    Ok(p) => got.push(p),
                    Err(_) => {
                        errors += 1;
                        break;
                    }
                }
            }
            assert_eq!(got[..], whole[..got.len()], "prefix of {n} bytes");
        }
        assert!(errors > data.len() / 2, "most prefixes end inside a block");
    }

    /// Blocks of types the reader has no use for (here an unknown type, a
    /// custom block and an interface statistics block) are skipped.
    #[test]
    fn unknown_pcapng_blocks_are_skipped() {
        let data = write_pcapng(false);
        let block = |kind: u32, body: &[u8]| {
            let len = (12 + body.len()) as u32;
            let mut b = kind.to_ne_bytes().to_vec();
            b.extend_from_slice(&len.to_ne_bytes());
            b.extend_from_slice(body);
            b.extend_from_slice(&len.to_ne_bytes());
            b
        };
        let shb_len = u32::from_ne_bytes(data[4..8].try_into().unwrap()) as usize;
        let idb_len =
            u32::from_ne_bytes(data[shb_len + 4..shb_len + 8].try_into().unwrap()) as usize;
        let mut spliced = data[..shb_len + idb_len].to_vec();
        spliced.extend(block(0x0000_4242, b"not a packet, 4-aligned!"));
        spliced.extend(block(0x0000_0bad, &[0xff; 8]));
        let mut rest = data[shb_len + idb_len..].to_vec();
        // An interface statistics block for interface 0 at the end.
        rest.extend(block(5, &[0; 12]));
        spliced.extend(rest);
        let got: Vec<Packet> = Capture::parse(&spliced)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let want: Vec<Packet> = Capture::parse(&data).unwrap().map(Result::unwrap).collect();
        assert_eq!(got, want);
        // An unknown block cut short is still a truncated file.
        let r: Result<Vec<_>, _> = Capture::parse(&spliced[..shb_len + idb_len + 20])
            .unwrap()
            .collect();
        assert!(matches!(r, Err(CaptureError::Truncated { .. })), "{r:?}");
    }

    /// Two interfaces (Ethernet in microseconds, Linux cooked in
    /// nanoseconds), written big- and little-endian by pcap-file: each
    /// packet gets its interface's link type and resolution, and its flags.
    #[test]
    fn pcapng_interfaces_and_byte_orders() {
        for endianness in [Endianness::Big, Endianness::Little] {
            let mut w = PcapNgWriter::with_endianness(Vec::new(), endianness).unwrap();
            let mut eth = InterfaceDescriptionBlock::new(DataLink::ETHERNET, 0);
            eth.options.push(InterfaceDescriptionOption::IfTsResol(6));
            let mut sll = InterfaceDescriptionBlock::new(DataLink::LINUX_SLL, 0);
            sll.options.push(InterfaceDescriptionOption::IfTsResol(9));
            w.write_pcapng_block(eth).unwrap();
            w.write_pcapng_block(sll).unwrap();
            let at = Duration::new(1_700_000_000, 123_456_789);
            for (interface_id, units, flags) in [
                (0, at.as_micros(), 1),
                (1, at.as_nanos(), 2),
                (1, at.as_nanos(), 0),
                // A flags word with other bits and the invalid 11.
                (0, at.as_micros(), 0x0000_0103),
            ] {
                w.write_pcapng_block(EnhancedPacketBlock {
                    interface_id,
                    timestamp: Duration::from_nanos(units as u64),
                    original_len: 60,
                    data: Cow::Owned(vec![1; 60]),
                    options: vec![EnhancedPacketOption::Flags(flags)],
                })
                .unwrap();
            }
            let data = w.into_inner();
            let c = Capture::parse(&data).unwrap();
            assert!(!c.nanosecond(), "the first interface's resolution");
            let got: Vec<_> = c
                .map(Result::unwrap)
                .map(|p| (p.link_type, p.timestamp, p.direction))
                .collect();
            let micro = Duration::new(1_700_000_000, 123_456_000);
            assert_eq!(
                got,
                [
                    (LINKTYPE_ETHERNET, micro, Some(Direction::Inbound)),
                    (113, at, Some(Direction::Outbound)),
                    (113, at, None),
                    (LINKTYPE_ETHERNET, micro, None),
                ],
                "{endianness:?}"
            );
        }
    }

    #[test]
    fn write_with_refuses_a_frame_longer_than_its_original_length() {
        for format in [FileFormat::Pcap, FileFormat::PcapNg] {
            let options = WriteOptions {
                format,
                ..WriteOptions::default()
            };
            let mut w = super::PcapWriter::new(Vec::new(), options).unwrap();
            let before = w.packets();
            let e = w
                .write_with(Duration::ZERO, &[0; 100], 99, None)
                .unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
            assert_eq!(w.packets(), before);
        }
    }

    /// Classic pcap has no place for a direction: `write_with` writes the
    /// same record as `write`, and the reader says "unknown".
    #[test]
    fn classic_pcap_drops_the_direction() {
        let write = |direction: Option<Direction>| {
            let mut w = super::PcapWriter::new(Vec::new(), WriteOptions::default()).unwrap();
            assert_eq!(w.format(), Format::Pcap);
            for (i, f) in frames().iter().enumerate() {
                w.write_with(ts(i), f, f.len() as u32, direction).unwrap();
            }
            w.into_inner()
        };
        let plain = {
            let mut w = super::PcapWriter::new(Vec::new(), WriteOptions::default()).unwrap();
            for (i, f) in frames().iter().enumerate() {
                w.write(ts(i), f).unwrap();
            }
            w.into_inner()
        };
        assert_eq!(write(Some(Direction::Outbound)), plain);
        assert_eq!(write(None), plain);
        assert!(Capture::parse(&plain)
            .unwrap()
            .all(|p| p.unwrap().direction.is_none()));
    }

    #[test]
    fn pcapng_option_text_longer_than_16_bits_is_refused() {
        let options = WriteOptions {
            format: FileFormat::PcapNg,
            if_description: Some("x".repeat(70_000)),
            ..WriteOptions::default()
        };
        let e = super::PcapWriter::new(Vec::new(), options).err().unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    }

    /// tshark reads what we write: one received and one sent RoCEv2 frame
    /// (built by xroce-wire) in a nanosecond pcapng, with their direction,
    /// our interface name and timestamp, dissected as InfiniBand.
    #[test]
    fn tshark_reads_pcapng_directions() {
        use std::process::Command;
        use xroce_wire::{emit_frame, rocev2_src_port, BthRepr, FrameRepr, Gid, Opcode};
        use xroce_wire::{TransportRepr, ICRC_LEN};

        let tshark = Command::new("tshark").arg("--version").output();
        assert!(
            tshark.is_ok_and(|o| o.status.success()),
            "tshark is not installed: install the Debian package `tshark` \
             (apt-get install tshark); this test must not be skipped"
        );
        let (a, b) = (
            Gid::from_ipv4([10, 99, 0, 11]),
            Gid::from_ipv4([10, 99, 0, 12]),
        );
        let frame = |src: Gid, dst: Gid, op: Opcode, qpn: u32, psn: u32| {
            let t = TransportRepr::new(BthRepr::new(op, qpn, psn));
            let r = FrameRepr::new(
                [2, 0, 0, 0, 0, 1],
                [2, 0, 0, 0, 0, 2],
                src,
                dst,
                rocev2_src_port(0, 0x10, qpn),
                t,
            );
            let payload: &[u8] = &[];
            let mut buf = vec![0u8; r.frame_len(payload.len())];
            let n = emit_frame(&r, payload, &mut buf).unwrap();
            buf.truncate(n);
            assert!(n > ICRC_LEN);
            buf
        };
        let received = frame(b, a, Opcode::RC_SEND_ONLY, 0x11, 7);
        let sent = frame(a, b, Opcode::RC_SEND_ONLY, 0x12, 8);

        let dir = std::env::temp_dir().join(format!("xroce-capture-tshark-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("directions.pcapng");
        let options = WriteOptions {
            nanosecond: true,
            format: FileFormat::PcapNg,
            if_name: Some("eth1".into()),
            if_description: Some("xroce capture".into()),
            ..WriteOptions::default()
        };
        let mut w = super::PcapWriter::create(&path, options).unwrap();
        let at = Duration::new(1_700_000_000, 123_456_789);
        w.write_with(
            at,
            &received,
            received.len() as u32,
            Some(Direction::Inbound),
        )
        .unwrap();
        w.write_with(at, &sent, sent.len() as u32, Some(Direction::Outbound))
            .unwrap();
        w.flush().unwrap();
        drop(w);

        let out = Command::new("tshark")
            .args(["-n", "-r"])
            .arg(&path)
            .args(["-Y", "infiniband", "-T", "fields", "-E", "separator=|"])
            // Its RPC-over-RDMA guesser takes any RC SEND for its own and
            // calls it malformed.
            .args(["--disable-protocol", "rpcordma"])
            .args(["-e", "frame.packet_flags_direction"])
            .args(["-e", "frame.interface_name", "-e", "frame.time_epoch"])
            .args(["-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp"])
            .args(["-e", "_ws.malformed"])
            .output()
            .expect("run tshark");
        std::fs::remove_dir_all(&dir).ok();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "tshark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows: Vec<Vec<&str>> = stdout.lines().map(|l| l.split('|').collect()).collect();
        // Direction as tshark prints the two flag bits, then the opcode (4:
        // RC SEND Only) and the QP.
        let direction = |r: &Vec<&str>| u32::from_str_radix(r[0].trim_start_matches("0x"), 16);
        assert_eq!(
            rows.len(),
            2,
            "both frames dissected as InfiniBand:\n{stdout}"
        );
        assert_eq!(direction(&rows[0]), Ok(1), "inbound:\n{stdout}");
        assert_eq!(direction(&rows[1]), Ok(2), "outbound:\n{stdout}");
        for (r, qp) in rows.iter().zip(["0x000011", "0x000012"]) {
            assert_eq!(r[1], "eth1", "{stdout}");
            assert_eq!(r[2], "1700000000.123456789", "{stdout}");
            assert_eq!(r[3], "4", "{stdout}");
            assert_eq!(r[4], qp, "{stdout}");
            assert_eq!(r[5], "", "not malformed: {stdout}");
        }
    }
}
