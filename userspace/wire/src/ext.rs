//! BTH extension headers other than the AETH (see `aeth.rs`): DETH, RETH,
//! AtomicETH, AtomicAckETH, ImmDt, IETH, FETH. Each has a zero-copy view with
//! checked construction and a `Repr` with `parse`/`emit`.

use crate::bytes::{be24, be32, be64, put24, put32, put64};
use crate::error::{Error, Layer, Result};

fn need(buf: &[u8], n: usize, l: Layer) -> Result<()> {
    if buf.len() < n {
        Err(Error::Truncated(l))
    } else {
        Ok(())
    }
}
fn room(buf: &[u8], n: usize) -> Result<()> {
    if buf.len() < n {
        Err(Error::BufferTooSmall {
            needed: n,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

macro_rules! view {
    ($(#[$m:meta])* $name:ident, $len:expr, $layer:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }
        impl<T: AsRef<[u8]>> $name<T> {
            /// Header length in bytes.
            pub const LEN: usize = $len;
            pub const fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }
            /// Wrap a buffer holding at least the header.
            pub fn new_checked(buffer: T) -> Result<Self> {
                need(buffer.as_ref(), $len, Layer::$layer)?;
                Ok($name { buffer })
            }
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}

// ---------------------------------------------------------------- DETH
view!(
    /// Datagram Extended Transport Header: Q_Key(32) resv(8) SrcQP(24).
    DethHeader, 8, Deth
);
impl<T: AsRef<[u8]>> DethHeader<T> {
    pub fn qkey(&self) -> u32 {
        be32(self.buffer.as_ref(), 0)
    }
    pub fn src_qp(&self) -> u32 {
        be24(self.buffer.as_ref(), 5)
    }
}
/// Parsed DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DethRepr {
    pub qkey: u32,
    /// Source QP, 24 bits.
    pub src_qp: u32,
}
impl DethRepr {
    pub const LEN: usize = 8;
    pub fn parse(buf: &[u8]) -> Result<DethRepr> {
        let h = DethHeader::new_checked(buf)?;
        Ok(DethRepr {
            qkey: h.qkey(),
            src_qp: h.src_qp(),
        })
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        room(buf, Self::LEN)?;
        if self.src_qp > crate::bth::QPN_MASK {
            return Err(Error::FieldOverflow("deth.src_qp"));
        }
        put32(buf, 0, self.qkey);
        buf[4] = 0;
        put24(buf, 5, self.src_qp);
        Ok(Self::LEN)
    }
}

// ---------------------------------------------------------------- RETH
view!(
    /// RDMA Extended Transport Header: VA(64) R_Key(32) DMA length(32).
    RethHeader, 16, Reth
);
impl<T: AsRef<[u8]>> RethHeader<T> {
    pub fn va(&self) -> u64 {
        be64(self.buffer.as_ref(), 0)
    }
    pub fn rkey(&self) -> u32 {
        be32(self.buffer.as_ref(), 8)
    }
    pub fn dma_len(&self) -> u32 {
        be32(self.buffer.as_ref(), 12)
    }
}
/// Parsed RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RethRepr {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}
impl RethRepr {
    pub const LEN: usize = 16;
    pub fn parse(buf: &[u8]) -> Result<RethRepr> {
        let h = RethHeader::new_checked(buf)?;
        Ok(RethRepr {
            va: h.va(),
            rkey: h.rkey(),
            dma_len: h.dma_len(),
        })
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        room(buf, Self::LEN)?;
        put64(buf, 0, self.va);
        put32(buf, 8, self.rkey);
        put32(buf, 12, self.dma_len);
        Ok(Self::LEN)
    }
}

// ---------------------------------------------------------------- AtomicETH
view!(
    /// Atomic Extended Transport Header: VA(64) R_Key(32) SwapOrAdd(64) Compare(64).
    AtomicEthHeader, 28, AtomicEth
);
impl<T: AsRef<[u8]>> AtomicEthHeader<T> {
    pub fn va(&self) -> u64 {
        be64(self.buffer.as_ref(), 0)
    }
    pub fn rkey(&self) -> u32 {
        be32(self.buffer.as_ref(), 8)
    }
    pub fn swap_add(&self) -> u64 {
        be64(self.buffer.as_ref(), 12)
    }
    pub fn compare(&self) -> u64 {
        be64(self.buffer.as_ref(), 20)
    }
}
/// Parsed AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicEthRepr {
    pub va: u64,
    pub rkey: u32,
    /// Swap value (COMPARE SWAP) or addend (FETCH ADD).
    pub swap_add: u64,
    /// Compare value (COMPARE SWAP; ignored by FETCH ADD).
    pub compare: u64,
}
impl AtomicEthRepr {
    pub const LEN: usize = 28;
    pub fn parse(buf: &[u8]) -> Result<AtomicEthRepr> {
        let h = AtomicEthHeader::new_checked(buf)?;
        Ok(AtomicEthRepr {
            va: h.va(),
            rkey: h.rkey(),
            swap_add: h.swap_add(),
            compare: h.compare(),
        })
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        room(buf, Self::LEN)?;
        put64(buf, 0, self.va);
        put32(buf, 8, self.rkey);
        put64(buf, 12, self.swap_add);
        put64(buf, 20, self.compare);
        Ok(Self::LEN)
    }
}

// ---------------------------------------------------------------- AtomicAckETH
view!(
    /// Atomic Acknowledge Extended Transport Header: original remote data (64).
    AtomicAckEthHeader, 8, AtomicAckEth
);
impl<T: AsRef<[u8]>> AtomicAckEthHeader<T> {
    pub fn orig_data(&self) -> u64 {
        be64(self.buffer.as_ref(), 0)
    }
}
/// Parsed AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicAckEthRepr {
    pub orig_data: u64,
}
impl AtomicAckEthRepr {
    pub const LEN: usize = 8;
    pub fn parse(buf: &[u8]) -> Result<AtomicAckEthRepr> {
        Ok(AtomicAckEthRepr {
            orig_data: AtomicAckEthHeader::new_checked(buf)?.orig_data(),
        })
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        room(buf, Self::LEN)?;
        put64(buf, 0, self.orig_data);
        Ok(Self::LEN)
    }
}

// ---------------------------------------------------------------- ImmDt
view!(
    /// Immediate data (32 bits, opaque; kept in network byte order as a u32).
    ImmDtHeader, 4, ImmDt
);
impl<T: AsRef<[u8]>> ImmDtHeader<T> {
    pub fn imm(&self) -> u32 {
        be32(self.buffer.as_ref(), 0)
    }
}
/// Parsed ImmDt: the 4 bytes read big-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImmDtRepr {
    pub imm: u32,
}
impl ImmDtRepr {
    pub const LEN: usize = 4;
    pub fn parse(buf: &[u8]) -> Result<ImmDtRepr> {
        Ok(ImmDtRepr {
            imm: ImmDtHeader::new_checked(buf)?.imm(),
        })
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        room(buf, Self::LEN)?;
        put32(buf, 0, self.imm);
        Ok(Self::LEN)
    }
}

// ---------------------------------------------------------------- IETH
view!(
    /// Invalidate Extended Transport Header: the R_Key to invalidate.
    IethHeader, 4, Ieth
);
impl<T: AsRef<[u8]>> IethHeader<T> {
    pub fn rkey(&self) -> u32 {
        be32(self.buffer.as_ref(), 0)
    }
}
/// Parsed IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IethRepr {
    pub rkey: u32,
}
impl IethRepr {
    pub const LEN: usize = 4;
    pub fn parse(buf: &[u8]) -> Result<IethRepr> {
        Ok(IethRepr {
            rkey: IethHeader::new_checked(buf)?.rkey(),
        })
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        room(buf, Self::LEN)?;
        put32(buf, 0, self.rkey);
        Ok(Self::LEN)
    }
}

// ---------------------------------------------------------------- FETH
view!(
    /// Flush Extended Transport Header (IBTA 1.5): resv(27) SEL(2) PLT(3)... kept raw.
    FethHeader, 4, Feth
);
impl<T: AsRef<[u8]>> FethHeader<T> {
    pub fn raw(&self) -> u32 {
        be32(self.buffer.as_ref(), 0)
    }
}
/// Parsed FETH: selectivity level (bits 5:4) and placement type (bits 3:0) of the last byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FethRepr {
    pub selectivity: u8,
    pub placement_type: u8,
}
impl FethRepr {
    pub const LEN: usize = 4;
    pub fn parse(buf: &[u8]) -> Result<FethRepr> {
        let r = FethHeader::new_checked(buf)?.raw();
        Ok(FethRepr {
            selectivity: ((r >> 4) & 3) as u8,
            placement_type: (r & 0xf) as u8,
        })
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        room(buf, Self::LEN)?;
        if self.selectivity > 3 || self.placement_type > 15 {
            return Err(Error::FieldOverflow("feth"));
        }
        put32(
            buf,
            0,
            ((self.selectivity as u32) << 4) | self.placement_type as u32,
        );
        Ok(Self::LEN)
    }
}

/// Length of the CNP's reserved block after the BTH.
pub const CNP_RESERVED_LEN: usize = 16;
