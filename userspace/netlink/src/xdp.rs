//! The XDP program of an interface over rtnetlink: what RTM_GETLINK reports
//! in IFLA_XDP, and attaching or detaching with RTM_SETLINK. An attachment
//! made this way belongs to the interface (no bpf_link, no pin): it lasts
//! until detached or the interface goes, whatever the mount namespace of
//! the process that made it.

use std::io;

use netlink_packet_core::{
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLMSG_ALIGNTO, NLM_F_ACK,
    NLM_F_REQUEST,
};
use netlink_packet_route::{
    link::{LinkAttribute, LinkMessage, LinkXdp, XdpAttached},
    RouteNetlinkMessage,
};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr as NetlinkAddr};

/// `XDP_FLAGS_*` of linux/if_link.h.
pub mod flags {
    /// Fail with EBUSY instead of replacing a program already attached.
    pub const UPDATE_IF_NOEXIST: u32 = 1;
    pub const SKB_MODE: u32 = 2;
    pub const DRV_MODE: u32 = 4;
    pub const HW_MODE: u32 = 8;
    /// Replace (or remove) only the program given as IFLA_XDP_EXPECTED_FD.
    pub const REPLACE: u32 = 16;
}

/// The XDP programs of one interface, by mode (0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpState {
    pub drv_prog_id: u32,
    pub skb_prog_id: u32,
    pub hw_prog_id: u32,
}

impl XdpState {
    /// Whether no program is attached in any mode.
    pub fn is_empty(&self) -> bool {
        *self == XdpState::default()
    }
}

/// Reads IFLA_XDP out of an RTM_NEWLINK reply.
fn state_of(link: &LinkMessage) -> XdpState {
    let mut state = XdpState::default();
    let mut single = None;
    for attr in &link.attributes {
        let LinkAttribute::Xdp(nlas) = attr else {
            continue;
        };
        let mut attached = XdpAttached::None;
        for nla in nlas {
            match nla {
                LinkXdp::Attached(a) => attached = *a,
                LinkXdp::ProgId(id) => single = Some(*id),
                LinkXdp::DrvProgId(id) => state.drv_prog_id = *id,
                LinkXdp::SkbProgId(id) => state.skb_prog_id = *id,
                LinkXdp::HwProgId(id) => state.hw_prog_id = *id,
                _ => {}
            }
        }
        // Kernels before 4.20 name only the one program and its mode.
        if let Some(id) = single.filter(|_| state.is_empty()) {
            match attached {
                XdpAttached::Driver => state.drv_prog_id = id,
                XdpAttached::SocketBuffer => state.skb_prog_id = id,
                XdpAttached::Hardware => state.hw_prog_id = id,
                _ => {}
            }
        }
    }
    state
}

/// Sends one request and reads until its reply: the link message for a
/// GETLINK, the ACK for a SETLINK.
fn request(msg: RouteNetlinkMessage, flags: u16) -> io::Result<Option<LinkMessage>> {
    let socket = Socket::new(NETLINK_ROUTE)?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | flags;
    header.sequence_number = 1;
    let mut req = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    socket.send_to(&buf, &NetlinkAddr::new(0, 0), 0)?;
    loop {
        let (datagram, _) = socket.recv_from_full()?;
        if datagram.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "rtnetlink closed without an answer",
            ));
        }
        let mut rest = &datagram[..];
        while !rest.is_empty() {
            let len = NetlinkBuffer::new_checked(rest)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
                .length() as usize;
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rest[..len])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            match msg.payload {
                NetlinkPayload::Error(e) => match e.code {
                    Some(_) => return Err(e.to_io()),
                    None => return Ok(None),
                },
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => {
                    return Ok(Some(link))
                }
                _ => {}
            }
            rest = rest
                .get(len.next_multiple_of(NLMSG_ALIGNTO.into())..)
                .unwrap_or_default();
        }
    }
}

/// The XDP programs attached to interface `ifindex` (this thread's network
/// namespace), as `ip link show` prints them.
pub fn xdp_state(ifindex: u32) -> io::Result<XdpState> {
    let mut link = LinkMessage::default();
    link.header.index = ifindex;
    match request(RouteNetlinkMessage::GetLink(link), 0)? {
        Some(reply) => Ok(state_of(&reply)),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "RTM_GETLINK answered without the link",
        )),
    }
}

/// Attaches program `prog_fd` (or, with -1, detaches) on `ifindex` with
/// `flags` (see [`flags`]); `expected_fd` with [`flags::REPLACE`] makes the
/// kernel act only if that program is the one attached (EEXIST otherwise).
pub fn set_xdp(ifindex: u32, prog_fd: i32, flags: u32, expected_fd: Option<i32>) -> io::Result<()> {
    let mut nlas = vec![LinkXdp::Fd(prog_fd), LinkXdp::Flags(flags)];
    if let Some(fd) = expected_fd {
        nlas.push(LinkXdp::ExpectedFd(fd as u32));
    }
    let mut link = LinkMessage::default();
    link.header.index = ifindex;
    link.attributes.push(LinkAttribute::Xdp(nlas));
    request(RouteNetlinkMessage::SetLink(link), NLM_F_ACK).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(nlas: Vec<LinkXdp>) -> LinkMessage {
        let mut l = LinkMessage::default();
        l.attributes.push(LinkAttribute::Xdp(nlas));
        l
    }

    #[test]
    fn ids_by_mode_are_read_and_the_single_id_of_old_kernels_too() {
        let s = state_of(&link(vec![
            LinkXdp::Attached(XdpAttached::Multiple),
            LinkXdp::DrvProgId(7),
            LinkXdp::SkbProgId(9),
        ]));
        assert_eq!(
            s,
            XdpState {
                drv_prog_id: 7,
                skb_prog_id: 9,
                hw_prog_id: 0
            }
        );
        let s = state_of(&link(vec![
            LinkXdp::Attached(XdpAttached::SocketBuffer),
            LinkXdp::ProgId(5),
        ]));
        assert_eq!(s.skb_prog_id, 5);
        assert_eq!(s.drv_prog_id, 0);
        assert!(state_of(&link(vec![LinkXdp::Attached(XdpAttached::None)])).is_empty());
    }

    #[test]
    fn loopback_has_no_xdp_program() {
        // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
        let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
        assert!(xdp_state(lo).unwrap().is_empty());
        assert!(xdp_state(0x7fff_fff0).is_err(), "no such interface");
    }
}
