//! Registered memory, the transport's own state (as rxe keeps `rxe_mr` in
//! the driver): regions with access flags, lkey/rkey with random key bits
//! (OS-seeded; from a seed in simulation), bounds/permission checks, and
//! deregistration safe while traffic is in flight.
//!
//! A region covers either memory xroce allocated for it
//! ([`MemoryRegion::allocate`], 8-byte aligned so that atomics work) or the
//! application's own memory ([`MemoryRegion::register_user`], as
//! `ibv_reg_mr` does): WRITE, READ, atomics and RECV then land in and come
//! from that memory, never a copy. Addresses in SGEs and RETHs are in the
//! region's iova space (the buffer's address, unless registered with
//! another iova as by `ibv_reg_mr_iova2`).
//!
//! The contract is rdma-core's: while a work request may access a range of
//! a region, the application must not touch it. That is why every direct
//! access from the application ([`MemoryRegion::write`], [`MemoryRegion::read`],
//! ...) is `unsafe`: the engine's I/O thread writes the same bytes.
//!
//! The engine holds `Arc<MrInner>` references while it uses a region, so
//! dropping/deregistering the user's [`MemoryRegion`] removes its keys from
//! the table (new accesses fail with access errors) and marks it invalid,
//! which every copy checks first; xroce-allocated memory is freed when the
//! last in-flight user lets go. Application memory must stay mapped until
//! deregistration (as with any RDMA NIC), and no longer: deregistration
//! (and a re-registration that moves the region) returns only once every
//! engine using the table is past any copy it had started
//! ([`MrTable::on_quiesce`]), so the program may free the memory at once.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::error::{Result, TransportError};
use super::work::Sge;

bitflags::bitflags! {
    /// `ibv_access_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        const LOCAL_WRITE = 1;
        const REMOTE_WRITE = 2;
        const REMOTE_READ = 4;
        const REMOTE_ATOMIC = 8;
    }
}

/// The registered memory and its keys.
pub struct MrInner {
    /// First byte of the registered memory.
    ptr: *mut u8,
    len: usize,
    /// The address peers and SGEs use for the first byte.
    iova: u64,
    /// Memory xroce allocated for the MR; `None` for application memory.
    _owned: Option<Box<[UnsafeCell<u64>]>>,
    pub(crate) pd: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) access: AccessFlags,
    valid: AtomicBool,
}

// SAFETY: the memory is only accessed through raw copies and atomics, like
// RDMA memory is. Application access to bytes a work request uses is
// excluded by the unsafe contract of every such access (see the module
// docs), exactly as with ibv_reg_mr.
unsafe impl Send for MrInner {}
unsafe impl Sync for MrInner {}

/// Why an access to an MR failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MrCheck {
    /// Key unknown, wrong PD or deregistered.
    BadKey,
    /// Range outside the region.
    Bounds,
    /// Access flags do not allow it.
    Perm,
}

impl MrInner {
    /// The iova of the first byte (what RETHs and SGEs name).
    #[inline]
    pub fn addr(&self) -> u64 {
        self.iova
    }
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    #[inline]
    pub fn is_valid(&self) -> bool {
        self.valid.load(Ordering::Acquire)
    }
    #[inline]
    fn base(&self) -> *mut u8 {
        self.ptr
    }

    /// Check `[va, va+len)` against the region and `need`; returns the offset.
    pub fn check(&self, pd: u32, va: u64, len: u64, need: AccessFlags) -> Result<usize, MrCheck> {
        if !self.is_valid() || self.pd != pd {
            return Err(MrCheck::BadKey);
        }
        if !self.access.contains(need) {
            return Err(MrCheck::Perm);
        }
        let start = va.checked_sub(self.addr()).ok_or(MrCheck::Bounds)?;
        let end = start.checked_add(len).ok_or(MrCheck::Bounds)?;
        if end > self.len as u64 {
            return Err(MrCheck::Bounds);
        }
        Ok(start as usize)
    }

    /// Copy `src` into the region at `off`. Panics if out of range (callers
    /// check bounds first).
    #[inline]
    pub fn write_at(&self, off: usize, src: &[u8]) {
        assert!(off.checked_add(src.len()).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds (checked above); UnsafeCell storage.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base().add(off), src.len()) }
    }

    /// Copy from the region at `off` into `dst`.
    #[inline]
    pub fn read_at(&self, off: usize, dst: &mut [u8]) {
        assert!(off.checked_add(dst.len()).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds (checked above).
        unsafe { std::ptr::copy_nonoverlapping(self.base().add(off), dst.as_mut_ptr(), dst.len()) }
    }

    /// The address of `len` bytes at `off`, for the kernel to copy from
    /// (a gathered send, [`super::gather`]). Panics if out of range.
    #[inline]
    pub fn slice_ptr(&self, off: usize, len: usize) -> *const u8 {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.len));
        self.base().wrapping_add(off)
    }

    /// Hands `f` the `len` bytes at `off` (the ICRC of a gathered send).
    /// Panics if out of range.
    #[inline]
    pub fn with_slice(&self, off: usize, len: usize, f: &mut dyn FnMut(&[u8])) {
        let p = self.slice_ptr(off, len);
        // SAFETY: in bounds (checked above) of memory that lives as long
        // as `self` (owned) or until deregistration, which waits for every
        // engine and sender (quiesce). Bytes a work request uses are not
        // the application's to touch meanwhile (the module's contract),
        // the same reads `read_at` makes.
        f(unsafe { std::slice::from_raw_parts(p, len) })
    }

    /// The 64-bit word at `off` (must be 8-byte aligned and in bounds).
    pub fn atomic_at(&self, off: usize) -> Option<&AtomicU64> {
        if !(self.ptr as usize).wrapping_add(off).is_multiple_of(8)
            || off.checked_add(8).is_none_or(|e| e > self.len)
        {
            return None;
        }
        // SAFETY: aligned (checked above), in bounds, and the storage lives
        // as long as `self` (owned) or until deregistration (application).
        Some(unsafe { AtomicU64::from_ptr(self.base().add(off) as *mut u64) })
    }
}

#[derive(Default)]
struct Slots {
    entries: Vec<Option<Arc<MrInner>>>,
    free: Vec<u32>,
    keys: KeySource,
}

/// Where the random bits of MR keys come from.
#[derive(Default)]
enum KeySource {
    /// The thread RNG, seeded from the OS: keys a peer cannot predict.
    #[default]
    Os,
    /// A fixed-algorithm RNG from a seed: the same keys on every run (the
    /// simulator; see [`MrTable::seeded`]).
    Seeded(Box<ChaCha8Rng>),
}

impl KeySource {
    fn next_u32(&mut self) -> u32 {
        match self {
            KeySource::Os => rand::random(),
            KeySource::Seeded(r) => r.next_u32(),
        }
    }
}

/// Device-wide key -> MR table. A key is `(slot + 1) << 16 | 16 random
/// bits`; the lkey and the rkey of one MR share the slot but draw their
/// random bits independently, so neither can be derived from the other and
/// a remote peer guessing an rkey hits 1 in 65536 (and a wrong guess is a
/// class C error that takes its QP to ERR). Lookup is an index, no hashing.
///
/// `MrTable::default()` draws the key bits from the OS-seeded thread RNG;
/// [`MrTable::seeded`] from ChaCha8 with a given seed, for reproducible
/// simulations.
#[derive(Default)]
pub struct MrTable {
    slots: RwLock<Slots>,
    /// One per engine using the table: returns once that engine is past
    /// any copy it had started (it takes and releases the engine's lock;
    /// every copy happens under it, after a validity check); `false` once
    /// the engine is gone (the hook is dropped then).
    quiesce: Mutex<Vec<QuiesceHook>>,
}

/// See [`MrTable::on_quiesce`].
pub type QuiesceHook = Box<dyn Fn() -> bool + Send + Sync>;

const KEY_BITS: u32 = 16;
const MAX_MRS: usize = (1 << (32 - KEY_BITS)) - 2;

impl MrTable {
    /// A table whose key bits come from ChaCha8 seeded with `seed`: the
    /// same registrations get the same keys on every run and platform.
    /// For simulation and tests; production keys come from the OS.
    pub fn seeded(seed: u64) -> Self {
        Self {
            slots: RwLock::new(Slots {
                keys: KeySource::Seeded(Box::new(ChaCha8Rng::seed_from_u64(seed))),
                ..Default::default()
            }),
            quiesce: Mutex::default(),
        }
    }

    /// Add an engine's hook: deregistration waits on it (see the module
    /// docs). It must not be called with that engine's lock held.
    pub fn on_quiesce(&self, hook: QuiesceHook) {
        self.quiesce.lock().unwrap().push(hook);
    }

    /// Waits until every engine using the table is past the copies it had
    /// started before this call (the region was marked invalid first).
    fn quiesce(&self) {
        self.quiesce.lock().unwrap().retain(|h| h());
    }

    /// Register `len` bytes at `ptr` (or, when `ptr` is `None`, memory
    /// allocated here), named `iova` (the buffer's address when `None`).
    fn insert(
        &self,
        pd: u32,
        mem: Option<(*mut u8, u64)>,
        len: usize,
        access: AccessFlags,
    ) -> Result<Arc<MrInner>> {
        let mut s = self.slots.write().unwrap();
        let idx = match s.free.pop() {
            Some(i) => i as usize,
            None => {
                if s.entries.len() >= MAX_MRS {
                    return Err(TransportError::NoResources("memory region keys"));
                }
                s.entries.push(None);
                s.entries.len() - 1
            }
        };
        let (ptr, iova, owned) = match mem {
            Some((ptr, iova)) => (ptr, iova, None),
            None => {
                let words = len.div_ceil(8).max(1);
                let buf: Box<[UnsafeCell<u64>]> = (0..words).map(|_| UnsafeCell::new(0)).collect();
                let ptr = buf.as_ptr() as *mut u8;
                (ptr, ptr as u64, Some(buf))
            }
        };
        let slot = ((idx as u32) + 1) << KEY_BITS;
        let mask = (1u32 << KEY_BITS) - 1;
        let lkey = slot | (s.keys.next_u32() & mask);
        let mut rkey = slot | (s.keys.next_u32() & mask);
        if rkey == lkey {
            rkey = slot | ((lkey + 1) & mask);
        }
        let mr = Arc::new(MrInner {
            ptr,
            len,
            iova,
            _owned: owned,
            pd,
            lkey,
            rkey,
            access,
            valid: AtomicBool::new(true),
        });
        s.entries[idx] = Some(mr.clone());
        Ok(mr)
    }

    /// Re-registration: the region behind `old`'s keys becomes `next` in
    /// one step under the table's write lock, so a lookup sees either the
    /// old region or the new one, never a mix; `old` is marked invalid, so
    /// an access that resolved it before fails its check from now on. With
    /// `new_keys` the region gets fresh random key bits in the same slot
    /// (the old keys then name nothing); otherwise it keeps its keys.
    fn replace(&self, old: &Arc<MrInner>, next: Rereg, new_keys: bool) -> Result<Arc<MrInner>> {
        let mut s = self.slots.write().unwrap();
        let idx = Self::slot_of(old.lkey)
            .filter(|&i| {
                s.entries
                    .get(i)
                    .and_then(Option::as_ref)
                    .is_some_and(|m| Arc::ptr_eq(m, old))
            })
            .ok_or(TransportError::InvalidArgument(
                "the memory region is not registered",
            ))?;
        let (mut lkey, mut rkey) = (old.lkey, old.rkey);
        if new_keys {
            let slot = ((idx as u32) + 1) << KEY_BITS;
            let mask = (1u32 << KEY_BITS) - 1;
            while lkey == old.lkey {
                lkey = slot | (s.keys.next_u32() & mask);
            }
            while rkey == old.rkey || rkey == lkey {
                rkey = slot | (s.keys.next_u32() & mask);
            }
        }
        let mr = Arc::new(MrInner {
            ptr: next.ptr,
            len: next.len,
            iova: next.iova,
            _owned: None,
            pd: next.pd,
            lkey,
            rkey,
            access: next.access,
            valid: AtomicBool::new(true),
        });
        s.entries[idx] = Some(mr.clone());
        old.valid.store(false, Ordering::Release);
        Ok(mr)
    }

    fn slot_of(key: u32) -> Option<usize> {
        (key >> KEY_BITS).checked_sub(1).map(|i| i as usize)
    }

    /// Look up a local key.
    pub fn by_lkey(&self, lkey: u32) -> Option<Arc<MrInner>> {
        let s = self.slots.read().unwrap();
        let mr = s.entries.get(Self::slot_of(lkey)?)?.as_ref()?;
        (mr.lkey == lkey).then(|| mr.clone())
    }

    /// Look up a remote key.
    pub fn by_rkey(&self, rkey: u32) -> Option<Arc<MrInner>> {
        let s = self.slots.read().unwrap();
        let mr = s.entries.get(Self::slot_of(rkey)?)?.as_ref()?;
        (mr.rkey == rkey).then(|| mr.clone())
    }

    fn remove(&self, mr: &MrInner) {
        mr.valid.store(false, Ordering::Release);
        let mut s = self.slots.write().unwrap();
        if let Some(i) = Self::slot_of(mr.lkey) {
            if let Some(e) = s.entries.get_mut(i) {
                if e.as_ref().is_some_and(|m| m.lkey == mr.lkey) {
                    *e = None;
                    s.free.push(i as u32);
                }
            }
        }
    }

    /// Number of registered regions.
    pub fn count(&self) -> usize {
        let s = self.slots.read().unwrap();
        s.entries.iter().filter(|e| e.is_some()).count()
    }
}

/// What a re-registered region becomes (see [`MemoryRegion::rereg`]).
#[derive(Debug, Clone, Copy)]
pub struct Rereg {
    /// First byte of the memory (the caller's).
    pub ptr: *mut u8,
    pub len: usize,
    /// The address SGEs and peers use for `ptr`.
    pub iova: u64,
    pub pd: u32,
    pub access: AccessFlags,
}

/// A registered memory region (`ibv_mr`). Dropping it deregisters it
/// (`ibv_dereg_mr`); in-flight operations keep the memory alive but fail
/// their access checks from then on.
pub struct MemoryRegion {
    pub(crate) inner: Arc<MrInner>,
    table: Arc<MrTable>,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("access", &self.inner.access)
            .finish()
    }
}

impl MemoryRegion {
    /// `ibv_reg_mr` of `len` zeroed bytes xroce allocates (8-byte aligned),
    /// in protection domain `pd`, keys from `table`.
    pub fn allocate(
        table: &Arc<MrTable>,
        pd: u32,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self> {
        Self::register(table, pd, None, len, access)
    }

    /// `ibv_reg_mr_iova2`: register `len` bytes of the caller's memory at
    /// `addr`, named `iova` by SGEs and peers.
    ///
    /// # Safety
    /// `addr..addr+len` stays mapped and writable (readable, if the access
    /// flags allow only reads) until the returned region is dropped, and
    /// the caller keeps the contract of the module docs: no access of its
    /// own to bytes an outstanding work request uses.
    pub unsafe fn register_user(
        table: &Arc<MrTable>,
        pd: u32,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Self> {
        Self::register(table, pd, Some((addr, iova)), len, access)
    }

    /// Register xroce-allocated memory (`mem == None`) or `len` bytes of the
    /// caller's at `mem.0`, named `mem.1` (iova).
    fn register(
        table: &Arc<MrTable>,
        pd: u32,
        mem: Option<(*mut u8, u64)>,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self> {
        check_access(access)?;
        if let Some((ptr, iova)) = mem {
            check_wrap(ptr, iova, len)?;
        }
        Ok(Self {
            inner: table.insert(pd, mem, len, access)?,
            table: table.clone(),
        })
    }
    /// The region's iova: the address remote peers use in RETH / AtomicETH
    /// and SGEs use locally (the buffer's address unless registered with
    /// another).
    pub fn addr(&self) -> u64 {
        self.inner.addr()
    }
    pub fn len(&self) -> usize {
        self.inner.len
    }
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }
    pub fn lkey(&self) -> u32 {
        self.inner.lkey
    }
    pub fn rkey(&self) -> u32 {
        self.inner.rkey
    }
    pub fn access(&self) -> AccessFlags {
        self.inner.access
    }
    /// Raw pointer to the registered memory (for zero-copy users; the
    /// network may write it concurrently, as with any RDMA buffer: access
    /// it only under the contract of the module docs).
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.base()
    }
    /// An SGE covering `len` bytes at `offset` into this region.
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        Sge {
            addr: self.addr() + offset as u64,
            length: len as u32,
            lkey: self.lkey(),
        }
    }
    /// Copy `src` into the region at `offset`.
    ///
    /// # Safety
    /// No work request that may read or write `offset..offset+src.len()`
    /// is outstanding (posted and not yet completed), and no other thread
    /// accesses that range meanwhile: the I/O thread accesses MR memory
    /// without locks, as an RDMA NIC does.
    pub unsafe fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        if offset.checked_add(src.len()).is_none_or(|e| e > self.len()) {
            return Err(TransportError::InvalidArgument(
                "write outside the memory region",
            ));
        }
        self.inner.write_at(offset, src);
        Ok(())
    }
    /// Copy `dst.len()` bytes from the region at `offset`.
    ///
    /// # Safety
    /// No work request that may write `offset..offset+dst.len()` is
    /// outstanding, and no other thread writes that range meanwhile (see
    /// [`MemoryRegion::write`]).
    pub unsafe fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        if offset.checked_add(dst.len()).is_none_or(|e| e > self.len()) {
            return Err(TransportError::InvalidArgument(
                "read outside the memory region",
            ));
        }
        self.inner.read_at(offset, dst);
        Ok(())
    }
    /// A copy of `len` bytes at `offset`.
    ///
    /// # Safety
    /// As for [`MemoryRegion::read`].
    pub unsafe fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0; len];
        // SAFETY: the caller's contract is read's.
        unsafe { self.read(offset, &mut v)? };
        Ok(v)
    }
    /// Atomically load the 64-bit word at `offset` (8-byte aligned).
    ///
    /// # Safety
    /// No outstanding RDMA WRITE, RECV or READ response writes these bytes
    /// (those are plain copies; only remote atomics may run meanwhile).
    pub unsafe fn load_u64(&self, offset: usize) -> Result<u64> {
        self.inner
            .atomic_at(offset)
            .map(|a| a.load(Ordering::SeqCst))
            .ok_or(TransportError::InvalidArgument(
                "unaligned or out-of-range u64",
            ))
    }
    /// What the region is now, as a starting point for [`Self::rereg`].
    pub fn current(&self) -> Rereg {
        Rereg {
            ptr: self.inner.ptr,
            len: self.inner.len,
            iova: self.inner.iova,
            pd: self.inner.pd,
            access: self.inner.access,
        }
    }

    /// `ibv_rereg_mr`: the region becomes `next` at once for the engine
    /// (see [`MrTable`]'s replace): new PD and access keep the keys (as
    /// rxe does); a new translation (memory, length or iova) also gets new
    /// keys, so that the old ones, which peers may still hold, name
    /// nothing. On error the region is unchanged.
    ///
    /// # Safety
    /// As for [`Self::register_user`], for `next.ptr..next.ptr+next.len`.
    /// Memory xroce allocated for the region stays alive until the last
    /// in-flight user lets go but is no longer what the region names.
    pub unsafe fn rereg(&mut self, next: Rereg) -> Result<()> {
        check_access(next.access)?;
        check_wrap(next.ptr, next.iova, next.len)?;
        let now = self.current();
        let translated = now.ptr != next.ptr || now.len != next.len || now.iova != next.iova;
        let inner = self.table.replace(&self.inner, next, translated)?;
        // The old inner keeps any xroce-allocated memory alive for
        // in-flight users; the new one names the caller's memory. The
        // program may release the old memory once this returns.
        self.inner = inner;
        self.table.quiesce();
        Ok(())
    }

    /// Deregister (`ibv_dereg_mr`); same as dropping.
    pub fn dereg(self) {}
}

/// IBTA 10.6.3.1 / ibv_reg_mr: remote write/atomic need local write.
fn check_access(access: AccessFlags) -> Result<()> {
    if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        && !access.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(TransportError::InvalidArgument(
            "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE",
        ));
    }
    Ok(())
}

fn check_wrap(ptr: *mut u8, iova: u64, len: usize) -> Result<()> {
    if (ptr as u64).checked_add(len as u64).is_none() || iova.checked_add(len as u64).is_none() {
        return Err(TransportError::InvalidArgument(
            "the memory region wraps around the address space",
        ));
    }
    Ok(())
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        self.table.remove(&self.inner);
        // ibv_dereg_mr's promise: no access to the memory after it returns.
        self.table.quiesce();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_random_and_die_with_the_mr() {
        let t = Arc::new(MrTable::default());
        let acc = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mrs: Vec<MemoryRegion> = (0..1000)
            .map(|_| MemoryRegion::register(&t, 1, None, 64, acc).unwrap())
            .collect();
        let mut keys = std::collections::HashSet::new();
        let mut low = std::collections::HashSet::new();
        for m in &mrs {
            assert_ne!(m.lkey(), m.rkey());
            assert!(keys.insert(m.lkey()) && keys.insert(m.rkey()));
            low.insert(m.rkey() & 0xffff);
            assert!(t.by_rkey(m.rkey()).is_some());
            assert!(t.by_rkey(m.lkey()).is_none(), "an lkey is not an rkey");
            assert!(t.by_rkey(m.rkey() ^ 1).is_none());
        }
        assert!(
            low.len() > 950,
            "random low bits: {} distinct of 1000",
            low.len()
        );
        let (rk, inner) = (mrs[5].rkey(), mrs[5].inner.clone());
        drop(mrs);
        assert!(t.by_rkey(rk).is_none());
        assert_eq!(t.count(), 0);
        // The memory outlives the registration while someone holds it.
        assert!(!inner.is_valid());
        inner.write_at(0, b"still mapped");
        assert_eq!(
            inner.check(1, inner.addr(), 4, AccessFlags::empty()),
            Err(MrCheck::BadKey)
        );
        // Remote write/atomic without local write is refused (IBTA).
        assert!(MemoryRegion::register(&t, 1, None, 8, AccessFlags::REMOTE_WRITE).is_err());
    }

    #[test]
    fn rereg_swaps_the_region_behind_its_keys_at_once() {
        let t = Arc::new(MrTable::default());
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 32];
        let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        // SAFETY: the buffers outlive the region (dropped before them).
        let mut mr =
            unsafe { MemoryRegion::register_user(&t, 1, a.as_mut_ptr(), 64, 0x1000, rw) }.unwrap();
        let (lkey, rkey, before) = (mr.lkey(), mr.rkey(), mr.inner.clone());
        // New access and PD keep the keys; the old inner is dead at once.
        let next = Rereg {
            access: AccessFlags::LOCAL_WRITE,
            pd: 2,
            ..mr.current()
        };
        // SAFETY: the same memory as before.
        unsafe { mr.rereg(next) }.unwrap();
        assert_eq!((mr.lkey(), mr.rkey()), (lkey, rkey));
        assert!(!before.is_valid());
        let now = t.by_rkey(rkey).unwrap();
        assert_eq!(
            now.check(2, 0x1000, 8, AccessFlags::REMOTE_WRITE),
            Err(MrCheck::Perm)
        );
        assert_eq!(
            now.check(1, 0x1000, 8, AccessFlags::empty()),
            Err(MrCheck::BadKey)
        );
        // A new translation gets new keys; the old ones name nothing.
        let next = Rereg {
            ptr: b.as_mut_ptr(),
            len: 32,
            iova: b.as_ptr() as u64,
            access: rw,
            ..mr.current()
        };
        // SAFETY: b outlives the region.
        unsafe { mr.rereg(next) }.unwrap();
        assert!(mr.lkey() != lkey && mr.rkey() != rkey && mr.lkey() != mr.rkey());
        assert!(t.by_lkey(lkey).is_none() && t.by_rkey(rkey).is_none());
        let now = t.by_rkey(mr.rkey()).unwrap();
        assert_eq!(
            now.check(2, b.as_ptr() as u64 + 24, 8, AccessFlags::REMOTE_WRITE),
            Ok(24)
        );
        // Invalid input leaves the region as it was.
        let bad = Rereg {
            access: AccessFlags::REMOTE_WRITE,
            ..mr.current()
        };
        // SAFETY: the same memory.
        assert!(unsafe { mr.rereg(bad) }.is_err());
        assert!(t.by_rkey(mr.rkey()).is_some_and(|m| m.access == rw));
        drop(mr);
        assert_eq!(t.count(), 0);
        drop((a, b));
    }

    #[test]
    fn seeded_tables_repeat_their_keys() {
        let keys = |t: &Arc<MrTable>| -> Vec<(u32, u32)> {
            let mrs: Vec<MemoryRegion> = (0..64)
                .map(|_| MemoryRegion::register(t, 1, None, 8, AccessFlags::LOCAL_WRITE).unwrap())
                .collect();
            mrs.iter().map(|m| (m.lkey(), m.rkey())).collect()
        };
        let a = keys(&Arc::new(MrTable::seeded(7)));
        assert_eq!(a, keys(&Arc::new(MrTable::seeded(7))));
        assert_ne!(a, keys(&Arc::new(MrTable::seeded(8))));
        let low: std::collections::HashSet<u32> = a.iter().map(|k| k.1 & 0xffff).collect();
        assert!(low.len() > 60, "seeded keys still look random");
        // The OS-seeded default differs from run to run (and from seed 7).
        assert_ne!(a, keys(&Arc::new(MrTable::default())));
    }

    #[test]
    fn application_memory_is_registered_in_place_under_its_iova() {
        let t = Arc::new(MrTable::default());
        let mut buf = vec![0u8; 100];
        let acc = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = MemoryRegion::register(
            &t,
            1,
            Some((buf.as_mut_ptr().wrapping_add(3), 0x1000)),
            50,
            acc,
        )
        .unwrap();
        assert_eq!(mr.addr(), 0x1000);
        assert_eq!(
            mr.inner
                .check(1, 0x1000 + 10, 40, AccessFlags::REMOTE_WRITE),
            Ok(10)
        );
        assert_eq!(
            mr.inner
                .check(1, 0x1000 + 10, 41, AccessFlags::REMOTE_WRITE),
            Err(MrCheck::Bounds)
        );
        mr.inner.write_at(10, b"in place");
        drop(mr);
        assert_eq!(&buf[13..21], b"in place");
        let wraps = MemoryRegion::register(&t, 1, Some((buf.as_mut_ptr(), u64::MAX - 4)), 8, acc);
        assert!(wraps.is_err());
    }
}
