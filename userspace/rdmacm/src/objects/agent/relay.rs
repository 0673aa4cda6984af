//! RDMA-CM for every process of a device: the QP1 relay.
//!
//! QP1 belongs to the process holding QPN block 0 (the XDP program and
//! UDP port 4791 deliver QP1 frames to it alone), yet the kernel's
//! rdma_cm lets any number of processes of a host listen and connect on
//! one device. So the block-0 process's agent also serves a relay: a
//! `SOCK_SEQPACKET` unix socket with the abstract name
//! `xroce-cm-relay/IFINDEX` (per network namespace, like the QPN block
//! holds). Any other process's agent runs its own [`xroce_cm::CmEngine`]
//! (its own comm IDs, listeners, timers and retries) and connects to it
//! instead of making a GSI QP:
//!
//! - every MAD its engine sends goes over the socket, and the QP1 holder
//!   posts it on the device's GSI QP as its own (the peer, rxe or xroce,
//!   sees one CM per device; the wire format is unchanged);
//! - the holder learns from those MADs which local comm ID (SIDR request
//!   ID) is whose, and from `Listen`/`Unlisten` messages, sent when a
//!   process's engine starts or stops listening and before `rdma_listen`
//!   returns, which service IDs are whose;
//! - each MAD the holder receives goes to the process owning it: a REQ or
//!   SIDR_REQ by service ID (the holder's own listeners first), a SIDR_REP
//!   by request ID, every other CM MAD by its remote comm ID (our local
//!   one); what no other process owns stays with the holder's engine.
//!
//! Chosen over one shared engine because each process keeps its engine,
//! its state and its exit handling exactly as when it is alone, and the
//! holder only forwards bytes: no connection state crosses the socket.
//! A connection between two processes of the device works as any other:
//! their MADs leave through QP1 to the device's own address and come back.
//!
//! The holder starts its agent as soon as librdmacm opens the device, so
//! its relay is there before its peers need it, and at exit waits up to
//! 3 s for the processes still connected to its relay to leave: their MADs
//! (and its own to them, which loop through the device's own address)
//! travel only while it runs.
//!
//! Limits: a process that is not the QP1 holder needs the holder to use
//! librdmacm (a holder using only libibverbs serves no relay: EBUSY, as
//! before); when the holder exits, the other processes' RDMA-CM MADs go
//! nowhere (no hand-over of QP1: its block stays with the process; their
//! connections then end as with a lost peer). Two processes listening on
//! one service ID are not refused: the first registration wins.

use std::collections::HashMap;
use std::ffi::c_int;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use xroce_cm::{PeerAddr, Transmit};
use xroce_wire::cm::Attribute;
use xroce_wire::mad::{CLASS_CM, HEADER_LEN, MAD_LEN};
use xroce_wire::Gid;

/// One message on the socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Msg {
    /// To the holder: post this. From the holder: this arrived (`local_gid`
    /// the GID it was sent to, `peer` its sender).
    Mad(Box<Transmit>),
    Listen(u64),
    Unlisten(u64),
}

const TAG_MAD: u8 = 1;
const TAG_LISTEN: u8 = 2;
const TAG_UNLISTEN: u8 = 3;
/// The largest message: tag, two GIDs, QPN, P_Key, the MAD.
const FRAME: usize = 1 + 16 + 16 + 4 + 2 + MAD_LEN;

impl Msg {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FRAME);
        match self {
            Msg::Mad(t) => {
                b.push(TAG_MAD);
                b.extend_from_slice(&t.local_gid.0);
                b.extend_from_slice(&t.peer.gid.0);
                b.extend_from_slice(&t.peer.qpn.to_be_bytes());
                b.extend_from_slice(&t.peer.pkey.to_be_bytes());
                b.extend_from_slice(&t.mad);
            }
            Msg::Listen(sid) | Msg::Unlisten(sid) => {
                b.push(if matches!(self, Msg::Listen(_)) {
                    TAG_LISTEN
                } else {
                    TAG_UNLISTEN
                });
                b.extend_from_slice(&sid.to_be_bytes());
            }
        }
        b
    }

    fn decode(b: &[u8]) -> Option<Msg> {
        let gid = |at: usize| Gid(b[at..at + 16].try_into().expect("16 bytes"));
        match (b.first()?, b.len()) {
            (&TAG_MAD, FRAME) => Some(Msg::Mad(Box::new(Transmit {
                local_gid: gid(1),
                peer: PeerAddr {
                    gid: gid(17),
                    qpn: u32::from_be_bytes(b[33..37].try_into().ok()?),
                    pkey: u16::from_be_bytes(b[37..39].try_into().ok()?),
                },
                mad: b[39..].try_into().ok()?,
            }))),
            (&TAG_LISTEN, 9) => Some(Msg::Listen(u64::from_be_bytes(b[1..].try_into().ok()?))),
            (&TAG_UNLISTEN, 9) => Some(Msg::Unlisten(u64::from_be_bytes(b[1..].try_into().ok()?))),
            _ => None,
        }
    }
}

/// What decides which process a received CM MAD is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Service(u64),
    Comm(u32),
}

fn attribute(mad: &[u8]) -> Option<Attribute> {
    if mad.len() < MAD_LEN || mad[1] != CLASS_CM {
        return None;
    }
    Attribute::from_u16(u16::from_be_bytes([mad[16], mad[17]])).ok()
}

fn data_u32(mad: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(
        mad[HEADER_LEN + at..HEADER_LEN + at + 4]
            .try_into()
            .expect("4"),
    )
}

/// Who a received MAD is for: REQ/SIDR_REQ by service ID, SIDR_REP by its
/// request ID, the others by their remote comm ID.
fn owner_of(mad: &[u8]) -> Option<Owner> {
    match attribute(mad)? {
        Attribute::Req | Attribute::SidrReq => Some(Owner::Service(u64::from_be_bytes(
            mad[HEADER_LEN + 8..HEADER_LEN + 16].try_into().ok()?,
        ))),
        Attribute::SidrRep => Some(Owner::Comm(data_u32(mad, 0))),
        _ => Some(Owner::Comm(data_u32(mad, 4))).filter(|o| *o != Owner::Comm(0)),
    }
}

/// The local comm ID (SIDR request ID) a sent MAD makes ours: its first
/// data word, except in a SIDR_REP (the asker's request ID).
fn sender_id(mad: &[u8]) -> Option<u32> {
    match attribute(mad)? {
        Attribute::SidrRep => None,
        _ => Some(data_u32(mad, 0)).filter(|&id| id != 0),
    }
}

/// The socket's address: the abstract name of device `ifindex`'s relay.
fn address(ifindex: u32) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data; all zeros is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = format!("xroce-cm-relay/{ifindex}");
    // sun_path[0] stays 0: an abstract name.
    for (d, s) in a.sun_path[1..].iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    (a, len as libc::socklen_t)
}

fn seqpacket(nonblocking: bool) -> io::Result<OwnedFd> {
    let flags = libc::SOCK_CLOEXEC | if nonblocking { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: socket(2) makes a new fd or fails.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | flags, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the fd just made, owned from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn send(fd: RawFd, msg: &Msg, flags: c_int) -> io::Result<()> {
    let b = msg.encode();
    // SAFETY: a socket and `b.len()` readable bytes.
    let n = unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), flags | libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One message without blocking: Ok(None) if none is queued; an error
/// (UnexpectedEof when the other end closed) ends the connection.
fn recv(fd: RawFd) -> io::Result<Option<Msg>> {
    let mut b = [0u8; FRAME + 1];
    // SAFETY: a socket and `b.len()` writable bytes.
    let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    if n == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Msg::decode(&b[..n as usize])
        .map(Some)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad relay message"))
}

/// A process of the device connected to the holder's relay.
struct Client {
    id: u64,
    fd: OwnedFd,
}

/// The QP1 holder's end.
pub(super) struct Server {
    listener: OwnedFd,
    clients: Vec<Client>,
    next_id: u64,
    services: HashMap<u64, u64>,
    comms: HashMap<u32, u64>,
}

impl Server {
    /// Binds device `ifindex`'s relay name.
    pub(super) fn bind(ifindex: u32) -> io::Result<Server> {
        let listener = seqpacket(true)?;
        let (addr, len) = address(ifindex);
        // SAFETY: our socket and a filled address of `len` bytes.
        let rc = unsafe {
            libc::bind(
                listener.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            )
        };
        // SAFETY: our bound socket.
        if rc != 0 || unsafe { libc::listen(listener.as_raw_fd(), 64) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Server {
            listener,
            clients: Vec::new(),
            next_id: 1,
            services: HashMap::new(),
            comms: HashMap::new(),
        })
    }

    /// How many processes are connected.
    pub(super) fn clients(&self) -> usize {
        self.clients.len()
    }

    /// The fds to poll for reading.
    pub(super) fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        std::iter::once(self.listener.as_raw_fd())
            .chain(self.clients.iter().map(|c| c.fd.as_raw_fd()))
    }

    /// Accepts new processes and takes every queued message: MADs to send
    /// go to `post`, in order.
    pub(super) fn service(&mut self, mut post: impl FnMut(Transmit)) {
        loop {
            // SAFETY: our listening socket; no address wanted.
            let fd = unsafe {
                libc::accept4(
                    self.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                )
            };
            if fd < 0 {
                break;
            }
            // SAFETY: the fd accept4 just made.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            super::debug(format_args!("CM relay: process {} connected", self.next_id));
            self.clients.push(Client {
                id: self.next_id,
                fd,
            });
            self.next_id += 1;
        }
        let mut gone = Vec::new();
        for c in &self.clients {
            loop {
                match recv(c.fd.as_raw_fd()) {
                    Ok(None) => break,
                    Ok(Some(Msg::Mad(t))) => {
                        if let Some(id) = sender_id(&t.mad) {
                            self.comms.insert(id, c.id);
                        }
                        post(*t);
                    }
                    Ok(Some(Msg::Listen(sid))) => {
                        let first = *self.services.entry(sid).or_insert(c.id);
                        super::debug(format_args!(
                            "CM relay: process {} listens on service ID {sid:#x}",
                            c.id
                        ));
                        if first != c.id {
                            super::debug(format_args!(
                                "CM relay: service ID {sid:#x} is process {first}'s already"
                            ));
                        }
                    }
                    Ok(Some(Msg::Unlisten(sid))) => {
                        if self.services.get(&sid) == Some(&c.id) {
                            self.services.remove(&sid);
                        }
                    }
                    Err(e) => {
                        super::debug(format_args!("CM relay: process {} left: {e}", c.id));
                        gone.push(c.id);
                        break;
                    }
                }
            }
        }
        for id in gone {
            self.drop_client(id);
        }
    }

    fn drop_client(&mut self, id: u64) {
        self.clients.retain(|c| c.id != id);
        self.services.retain(|_, c| *c != id);
        self.comms.retain(|_, c| *c != id);
    }

    /// Hands a received MAD to the process that owns it; false if it is
    /// the holder's own (`own_listener`: whether its engine listens on a
    /// service ID).
    pub(super) fn forward(
        &mut self,
        peer: PeerAddr,
        local_gid: Gid,
        mad: &[u8],
        own_listener: impl Fn(u64) -> bool,
    ) -> bool {
        let client = match owner_of(mad) {
            Some(Owner::Service(sid)) if !own_listener(sid) => self.services.get(&sid),
            Some(Owner::Comm(id)) => self.comms.get(&id),
            _ => None,
        };
        let Some(&id) = client else {
            return false;
        };
        let Some(c) = self.clients.iter().find(|c| c.id == id) else {
            return false;
        };
        let msg = Msg::Mad(Box::new(Transmit {
            local_gid,
            peer,
            mad: mad[..MAD_LEN].try_into().expect("a whole MAD"),
        }));
        // A full socket drops the MAD as a lossy network would: the
        // engines' retries recover it.
        if let Err(e) = send(c.fd.as_raw_fd(), &msg, libc::MSG_DONTWAIT) {
            super::debug(format_args!("CM relay: to process {id}: {e}"));
        }
        super::debug(format_args!("CM relay: handed to process {id}"));
        true
    }
}

/// A process's end when another one holds QP1.
pub(super) struct ClientEnd {
    fd: OwnedFd,
}

impl ClientEnd {
    /// Connects to device `ifindex`'s relay, waiting up to `patience` for
    /// the holder to start one.
    pub(super) fn connect(ifindex: u32, patience: Duration) -> io::Result<ClientEnd> {
        let until = Instant::now() + patience;
        let (addr, len) = address(ifindex);
        loop {
            let fd = seqpacket(false)?;
            // SAFETY: our socket and a filled address of `len` bytes.
            let rc = unsafe {
                libc::connect(
                    fd.as_raw_fd(),
                    (&addr as *const libc::sockaddr_un).cast(),
                    len,
                )
            };
            if rc == 0 {
                return Ok(ClientEnd { fd });
            }
            let e = io::Error::last_os_error();
            if Instant::now() >= until {
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub(super) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Sends (blocking while the socket is full: the holder reads it).
    pub(super) fn send(&self, msg: &Msg) -> io::Result<()> {
        send(self.fd.as_raw_fd(), msg, 0)
    }

    pub(super) fn recv(&self) -> io::Result<Option<Msg>> {
        recv(self.fd.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mad(attr: u16, words: &[(usize, u32)]) -> [u8; MAD_LEN] {
        let mut m = [0u8; MAD_LEN];
        m[0] = 1;
        m[1] = CLASS_CM;
        m[2] = 2;
        m[16..18].copy_from_slice(&attr.to_be_bytes());
        for &(at, v) in words {
            m[HEADER_LEN + at..HEADER_LEN + at + 4].copy_from_slice(&v.to_be_bytes());
        }
        m
    }

    #[test]
    fn messages_round_trip() {
        let t = Transmit {
            local_gid: Gid([1; 16]),
            peer: PeerAddr {
                gid: Gid([2; 16]),
                qpn: 1,
                pkey: 0xffff,
            },
            mad: mad(0x13, &[(0, 7), (4, 9)]),
        };
        for m in [
            Msg::Mad(Box::new(t)),
            Msg::Listen(0x1_0106_1234),
            Msg::Unlisten(3),
        ] {
            assert_eq!(Msg::decode(&m.encode()), Some(m));
        }
        assert_eq!(Msg::decode(&[9, 0]), None);
        assert_eq!(Msg::decode(&[TAG_MAD, 0]), None);
    }

    #[test]
    fn received_mads_are_owned_by_service_or_remote_comm_id() {
        let sid = 0x0000_0000_0106_4e21u64;
        let mut req = mad(0x10, &[(0, 0x1111)]);
        req[HEADER_LEN + 8..HEADER_LEN + 16].copy_from_slice(&sid.to_be_bytes());
        assert_eq!(owner_of(&req), Some(Owner::Service(sid)));
        for attr in [0x11, 0x12, 0x13, 0x14, 0x15, 0x16] {
            assert_eq!(
                owner_of(&mad(attr, &[(0, 0xaaaa), (4, 0xbbbb)])),
                Some(Owner::Comm(0xbbbb)),
                "attribute {attr:#x}"
            );
        }
        assert_eq!(
            owner_of(&mad(0x18, &[(0, 0xcccc)])),
            Some(Owner::Comm(0xcccc))
        );
        // A REJ of a REQ nobody answered with a comm ID yet names none.
        assert_eq!(owner_of(&mad(0x12, &[(0, 5)])), None);
        let mut not_cm = mad(0x10, &[]);
        not_cm[1] = 0x01;
        assert_eq!(owner_of(&not_cm), None);
    }

    #[test]
    fn sent_mads_name_their_senders_comm_id() {
        assert_eq!(sender_id(&mad(0x10, &[(0, 0x1234)])), Some(0x1234));
        assert_eq!(sender_id(&mad(0x13, &[(0, 0x55), (4, 0x66)])), Some(0x55));
        assert_eq!(sender_id(&mad(0x17, &[(0, 0x77)])), Some(0x77));
        assert_eq!(sender_id(&mad(0x18, &[(0, 0x77)])), None);
        assert_eq!(sender_id(&mad(0x12, &[(0, 0)])), None);
    }
}
