//! Packet I/O backends: they move whole Ethernet frames between the wire and
//! the transport engine and know nothing of RDMA.
pub mod afxdp;
