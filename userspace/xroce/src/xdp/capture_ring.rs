//! The reader of the XDP program's capture copies (`XROCE_CAPTURE`, a perf
//! event array; `xroce_common::capture`): one perf ring per online CPU,
//! opened here rather than with aya's `PerfEventArray`, whose rings wake
//! their reader at every sample. A wake-up is an irq_work on the CPU that
//! runs XDP, per frame: a capture of a WRITE stream cut it to 0.3 x its
//! rate on a 2-core host. These rings wake the reader only when a quarter
//! full (perf's watermark), and the capture reads them on its own clock
//! as well, every millisecond or so.

use std::{
    io,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd},
    sync::atomic::{AtomicU64, Ordering},
};

use aya::maps::MapData;

use super::{open_map, XdpError};

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_BPF_OUTPUT: u64 = 10;
const PERF_SAMPLE_RAW: u64 = 1 << 10;
/// perf_event_attr.watermark: wake-ups by bytes, not by samples.
const ATTR_FLAG_WATERMARK: u64 = 1 << 14;
const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_SAMPLE: u32 = 9;
/// _IO('$', 0).
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
/// Offsets in struct perf_event_mmap_page.
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;

/// perf_event_attr as of PERF_ATTR_SIZE_VER0 (64 bytes; the kernel takes
/// any size it knows and zero-fills the rest).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_watermark: u32,
    bp_type: u32,
    config1: u64,
}

/// The part of union bpf_attr that BPF_MAP_*_ELEM read.
#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

fn bpf_map_elem(cmd: libc::c_long, map: RawFd, key: u32, value: Option<u32>) -> io::Result<()> {
    let attr = MapElemAttr {
        map_fd: map as u32,
        _pad: 0,
        key: &key as *const u32 as u64,
        value: value.as_ref().map_or(0, |v| v as *const u32 as u64),
        flags: 0,
    };
    // SAFETY: bpf(2) reads `attr` (and the key and value it points to, all
    // alive for the call) and writes nothing of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            &attr as *const MapElemAttr,
            std::mem::size_of::<MapElemAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One CPU's ring: the perf event and its mapping (a header page, then
/// `size` bytes of records).
struct Ring {
    cpu: u32,
    fd: OwnedFd,
    base: *mut u8,
    mapped: usize,
    page: usize,
    size: usize,
}

impl Ring {
    fn open(cpu: u32, pages: usize) -> io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let size = page * pages;
        let attr = PerfEventAttr {
            kind: PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<PerfEventAttr>() as u32,
            config: PERF_COUNT_SW_BPF_OUTPUT,
            sample_period: 1,
            sample_type: PERF_SAMPLE_RAW,
            flags: ATTR_FLAG_WATERMARK,
            wakeup_watermark: (size / 4) as u32,
            ..PerfEventAttr::default()
        };
        // SAFETY: perf_event_open(2) reads `attr`; pid -1 with a cpu: every
        // process on that CPU, as BPF output events are opened.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &attr as *const PerfEventAttr,
                -1,
                cpu as libc::c_int,
                -1,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let mapped = page + size;
        // SAFETY: a shared mapping of the perf event, as perf's ABI wants
        // (header page + 2^n data pages); checked against MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ring = Self {
            cpu,
            fd,
            base: base.cast(),
            mapped,
            page,
            size,
        };
        // SAFETY: an ioctl on our own perf event.
        if unsafe { libc::ioctl(ring.fd.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ring)
    }

    fn head_tail(&self) -> (&AtomicU64, &AtomicU64) {
        // SAFETY: both fields lie in the mapped header page, 8-aligned,
        // and the kernel updates them atomically.
        unsafe {
            (
                &*(self.base.add(DATA_HEAD) as *const AtomicU64),
                &*(self.base.add(DATA_TAIL) as *const AtomicU64),
            )
        }
    }

    /// `len` bytes of the data area from position `at`, across the wrap.
    fn read(&self, at: u64, len: usize, out: &mut Vec<u8>) {
        out.clear();
        let start = (at % self.size as u64) as usize;
        let first = len.min(self.size - start);
        // SAFETY: positions below data_head and at or above data_tail hold
        // records the kernel finished (read after the acquire load of the
        // head) and will not touch until we move the tail past them; the
        // ranges lie inside the data area.
        unsafe {
            let data = self.base.add(self.page);
            out.extend_from_slice(std::slice::from_raw_parts(data.add(start), first));
            out.extend_from_slice(std::slice::from_raw_parts(data, len - first));
        }
    }

    /// Hands every finished sample to `f`; returns (samples, lost).
    fn drain(&mut self, scratch: &mut Vec<u8>, f: &mut dyn FnMut(&[u8])) -> (u64, u64) {
        let (head, tail) = self.head_tail();
        let head = head.load(Ordering::Acquire);
        let mut at = tail.load(Ordering::Relaxed);
        let (mut samples, mut lost) = (0, 0);
        while at < head {
            // struct perf_event_header { u32 type; u16 misc; u16 size; }
            self.read(at, 8, scratch);
            let kind = u32::from_ne_bytes(scratch[0..4].try_into().unwrap());
            let size = u16::from_ne_bytes(scratch[6..8].try_into().unwrap()) as usize;
            if size < 8 || at + size as u64 > head {
                break;
            }
            match kind {
                PERF_RECORD_SAMPLE => {
                    // header, u32 raw size, raw bytes.
                    self.read(at + 8, size - 8, scratch);
                    if scratch.len() >= 4 {
                        let raw = u32::from_ne_bytes(scratch[0..4].try_into().unwrap()) as usize;
                        let end = (4 + raw).min(scratch.len());
                        f(&scratch[4..end]);
                        samples += 1;
                    }
                }
                PERF_RECORD_LOST => {
                    // header, u64 id, u64 lost.
                    self.read(at + 8, 16, scratch);
                    lost += u64::from_ne_bytes(scratch[8..16].try_into().unwrap());
                }
                _ => {}
            }
            at += size as u64;
        }
        tail.store(at, Ordering::Release);
        (samples, lost)
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; nothing borrows it now.
        unsafe { libc::munmap(self.base.cast(), self.mapped) };
    }
}

/// The capture's rings on one interface's program, one per online CPU.
pub struct CaptureRings {
    map: MapData,
    rings: Vec<Ring>,
    scratch: Vec<u8>,
    lost: u64,
}

// SAFETY: the mappings belong to this value alone and are only read and
// written through &mut self.
unsafe impl Send for CaptureRings {}

impl CaptureRings {
    /// Opens a ring of `bytes_per_cpu` (rounded up to a power of two of
    /// pages) for every online CPU and puts it in the program's capture
    /// map; the program copies into them while its snap length is set
    /// ([`super::set_capture_snaplen`]).
    pub fn open(iface: &str, bytes_per_cpu: usize) -> Result<Self, XdpError> {
        let map = open_map(iface, xroce_common::names::CAPTURE)?;
        let cpus = aya::util::online_cpus().map_err(|(what, e)| XdpError::Io {
            what: format!("online CPUs ({what})"),
            source: e,
        })?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let pages = bytes_per_cpu.div_ceil(page).max(1).next_power_of_two();
        let mut rings = Vec::new();
        for cpu in cpus {
            let ring = Ring::open(cpu, pages).map_err(|e| XdpError::Io {
                what: format!("open the capture's perf ring on CPU {cpu}"),
                source: e,
            })?;
            bpf_map_elem(
                BPF_MAP_UPDATE_ELEM,
                map.fd().as_fd().as_raw_fd(),
                cpu,
                Some(ring.fd.as_raw_fd() as u32),
            )
            .map_err(|e| XdpError::Io {
                what: format!("put CPU {cpu}'s ring in the capture map"),
                source: e,
            })?;
            rings.push(ring);
        }
        Ok(Self {
            map,
            rings,
            scratch: Vec::with_capacity(16 * 1024),
            lost: 0,
        })
    }

    /// Hands every copy waiting in the rings to `f` (the ring's CPU, then
    /// a `CaptureMeta` and the frame's first bytes, padding after; each
    /// ring's in the order the program made them); returns how many.
    pub fn drain(&mut self, f: &mut dyn FnMut(u32, &[u8])) -> u64 {
        let mut n = 0;
        for r in &mut self.rings {
            let cpu = r.cpu;
            let (samples, lost) = r.drain(&mut self.scratch, &mut |sample| f(cpu, sample));
            n += samples;
            self.lost += lost;
        }
        n
    }

    /// Copies the kernel could not put in a full ring.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// The rings' descriptors: readable when a ring is a quarter full.
    pub fn fds(&self) -> Vec<RawFd> {
        self.rings.iter().map(|r| r.fd.as_raw_fd()).collect()
    }
}

impl Drop for CaptureRings {
    fn drop(&mut self) {
        // The program finds no ring from now on (its copies fail quietly).
        for r in &self.rings {
            let _ = bpf_map_elem(
                BPF_MAP_DELETE_ELEM,
                self.map.fd().as_fd().as_raw_fd(),
                r.cpu,
                None,
            );
        }
    }
}
