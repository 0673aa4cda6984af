//! Packet captures, pcap and pcapng, read and written with the `pcap-file`
//! crate: the frames of a capture for `xroce decode`, the rxe replay tests
//! and anyone else who needs them, and the files `xroce capture -w` writes.
//!
//! [`Capture::parse`] walks a capture held in memory without copying a
//! packet; [`read_packets`] returns every packet of a file, owned. Classic
//! pcap records are taken as written (a packet the snap length cut keeps its
//! original length in [`Packet::orig_len`]); pcapng timestamps honour each
//! interface's `if_tsresol`. [`PcapWriter`] writes classic pcap (Ethernet,
//! micro- or nanosecond timestamps, a snap length), the format tcpdump
//! writes and every reader takes.
use std::borrow::Cow;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapParser};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::{Block, PcapNgParser};
use pcap_file::{PcapError, TsResolution};

/// LINKTYPE_ETHERNET: frames start with an Ethernet header.
pub const LINKTYPE_ETHERNET: u32 = 1;

/// tcpdump's default snap length (and what `-s 0` means to it).
pub const DEFAULT_SNAPLEN: u32 = 262_144;

/// The two capture file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Classic libpcap format (`tcpdump -w`).
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
                }))
            }
            Parser::PcapNg(p) => loop {
                if self.rest.is_empty() {
                    return Ok(None);
                }
                let offset = self.len - self.rest.len();
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
                        }
                    }
                    Block::Packet(b) => {
                        let i = iface(b.interface_id.into())?;
                        Packet {
                            timestamp: ticks(b.timestamp.into(), tsresol(i)),
                            orig_len: b.original_len,
                            link_type: i.linktype.into(),
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

/// How [`PcapWriter`] writes a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// Bytes kept of each frame (0: [`DEFAULT_SNAPLEN`], as tcpdump's `-s 0`).
    pub snaplen: u32,
    /// Nanosecond timestamps (magic 0xa1b23c4d) instead of microseconds.
    pub nanosecond: bool,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            snaplen: DEFAULT_SNAPLEN,
            nanosecond: false,
        }
    }
}

/// Writes Ethernet frames as a classic pcap file, in this host's byte
/// order (as tcpdump does). The file header is pcap-file's; each record is
/// its 16-byte header (seconds, fraction, captured and original length)
/// and the bytes kept. Nothing is buffered here: wrap a file in a
/// `BufWriter` and call [`PcapWriter::flush`].
pub struct PcapWriter<W: Write> {
    out: W,
    snaplen: u32,
    nanosecond: bool,
    packets: u64,
    truncated: u64,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header to `out`.
    pub fn new(mut out: W, options: WriteOptions) -> std::io::Result<Self> {
        let snaplen = match options.snaplen {
            0 => DEFAULT_SNAPLEN,
            n => n,
        };
        let header = PcapHeader {
            snaplen,
            datalink: pcap_file::DataLink::ETHERNET,
            ts_resolution: if options.nanosecond {
                TsResolution::NanoSecond
            } else {
                TsResolution::MicroSecond
            },
            endianness: pcap_file::Endianness::native(),
            ..PcapHeader::default()
        };
        header.write_to(&mut out).map_err(|e| match e {
            PcapError::IoError(e) => e,
            e => std::io::Error::other(e),
        })?;
        Ok(Self {
            out,
            snaplen,
            nanosecond: options.nanosecond,
            packets: 0,
            truncated: 0,
        })
    }

    /// Appends one frame seen at `timestamp` (since the Unix epoch), cut to
    /// the snap length; the record keeps its length on the wire.
    pub fn write(&mut self, timestamp: Duration, frame: &[u8]) -> std::io::Result<()> {
        let orig_len = u32::try_from(frame.len())
            .map_err(|_| std::io::Error::other("frame longer than 4 GiB"))?;
        let kept = orig_len.min(self.snaplen);
        // The format's seconds are 32 bits: they run out in 2106.
        let secs = u32::try_from(timestamp.as_secs())
            .map_err(|_| std::io::Error::other("timestamp after 2106"))?;
        let frac = if self.nanosecond {
            timestamp.subsec_nanos()
        } else {
            timestamp.subsec_micros()
        };
        let mut record = [0u8; 16];
        for (i, v) in [secs, frac, kept, orig_len].into_iter().enumerate() {
            record[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
        }
        self.out.write_all(&record)?;
        self.out.write_all(&frame[..kept as usize])?;
        self.packets += 1;
        if kept < orig_len {
            self.truncated += 1;
        }
        Ok(())
    }

    /// Flushes the underlying writer: the file then holds a complete
    /// capture of everything written so far.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    /// Frames written so far.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Frames the snap length cut.
    pub fn truncated(&self) -> u64 {
        self.truncated
    }

    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }

    /// The underlying writer (not flushed).
    pub fn into_inner(self) -> W {
        self.out
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
        let (r, block) = p.next_block(rest).ok()?;
        match block {
            Block::InterfaceDescription(i) => return Some(i.into_owned()),
            Block::EnhancedPacket(_) | Block::SimplePacket(_) | Block::Packet(_) => return None,
            _ => rest = r,
        }
    }
    None
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
                nanosecond: false,
            },
        )
        .unwrap();
        assert_eq!(w.snaplen(), DEFAULT_SNAPLEN);
        let data = w.into_inner();
        assert_eq!(data.len(), 24);
        assert_eq!(Capture::parse(&data).unwrap().count(), 0);
    }
}
