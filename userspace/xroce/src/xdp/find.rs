//! Finding xroce's program through the interface, as `ip link` and
//! xdp-loader do: rtnetlink names the program attached to the interface
//! (IFLA_XDP), and the program's id leads to its maps. Nothing here reads
//! bpffs, so it works in any mount namespace (`ip netns exec` gives a
//! command a private /sys, `nsenter --net` keeps the host's). Under
//! libxdp's dispatcher the interface names the dispatcher; xroce's program
//! is the one a freplace link of the dispatcher runs.

use aya::{
    maps::{MapData, MapInfo},
    programs::{loaded_programs, ProgramError, ProgramInfo},
};
use xroce_common::names;

use super::{bpf_err, if_index, libxdp, Mode, XdpError};

/// xroce's program on an interface, as [`query`](super::query) reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpAttachment {
    /// Kernel index of the interface (this network namespace).
    pub ifindex: u32,
    /// Id of xroce's program (`bpftool prog show id N`).
    pub prog_id: u32,
    /// The mode the interface runs it in.
    pub mode: Mode,
    /// The id of libxdp's multi-program dispatcher when xroce's program is
    /// one of its components (`xdp-loader status` lists them), `None` when
    /// it is the interface's program itself.
    pub dispatcher: Option<u32>,
    /// Made by a process for itself (the device's last process detaches
    /// it), not by `xroce attach` (which stays until `xroce detach`).
    pub by_process: bool,
    /// Where the frames it redirects to AF_XDP carry their arrival time:
    /// which of xroce's programs the kernel took.
    pub arrival: ArrivalStamp,
}

/// Where xroce's XDP program puts a redirected frame's arrival time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrivalStamp {
    /// In the XDP metadata area, in front of the frame (`xroce_xdp`).
    Metadata,
    /// At the start of the frame's data (`xroce_xdp_head`: the kernel
    /// refused the metadata helper).
    Head,
    /// Nowhere (`xroce_xdp_plain`: the kernel refused both, as it does to
    /// a libxdp dispatcher's components that move packet data from 6.12 on).
    None,
}

impl ArrivalStamp {
    /// The program that stamps this way.
    pub fn program(self) -> &'static str {
        match self {
            Self::Metadata => names::PROGRAM,
            Self::Head => names::PROGRAM_HEAD,
            Self::None => names::PROGRAM_PLAIN,
        }
    }

    /// As `xroce status --json` names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Metadata => "metadata",
            Self::Head => "head",
            Self::None => "none",
        }
    }

    fn of(info: &ProgramInfo) -> Self {
        match info.name_as_str() {
            Some(names::PROGRAM_HEAD) => Self::Head,
            Some(names::PROGRAM_PLAIN) => Self::None,
            _ => Self::Metadata,
        }
    }
}

/// The program with id `id`, if it is still loaded.
pub(super) fn program(id: u32) -> Result<Option<ProgramInfo>, XdpError> {
    for info in loaded_programs() {
        let info = match info {
            Ok(info) => info,
            // A program unloaded between listing and opening it (another
            // process's): not ours to find, not a failure.
            Err(ProgramError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
            {
                continue
            }
            Err(e) => return Err(bpf_err("list the loaded BPF programs")(e)),
        };
        if info.id() == id {
            return Ok(Some(info));
        }
    }
    Ok(None)
}

fn is_ours(info: &ProgramInfo) -> bool {
    info.name_as_str()
        .is_some_and(|name| names::PROGRAMS.contains(&name))
}

/// xroce's program on `iface` without its config flags read: the
/// interface's program if it is xroce's; `None` if the interface runs no
/// program or another one.
pub(super) fn find(iface: &str) -> Result<Option<(XdpAttachment, ProgramInfo)>, XdpError> {
    let ifindex = if_index(iface)?;
    let state = xroce_netlink::xdp::xdp_state(ifindex).map_err(|source| XdpError::Io {
        what: format!("read the XDP state of {iface} over rtnetlink"),
        source,
    })?;
    // Native first: with both modes attached, the driver's runs first and
    // is the one AF_XDP sockets meet.
    for (id, mode) in [
        (state.drv_prog_id, Mode::Native),
        (state.skb_prog_id, Mode::Skb),
    ] {
        if id == 0 {
            continue;
        }
        let Some(info) = program(id)? else {
            continue;
        };
        if is_ours(&info) {
            let attachment = XdpAttachment {
                ifindex,
                prog_id: id,
                mode,
                dispatcher: None,
                by_process: false,
                arrival: ArrivalStamp::of(&info),
            };
            return Ok(Some((attachment, info)));
        }
        // libxdp's dispatcher: xroce's program is one of the programs its
        // slots run (freplace links whose target is the dispatcher).
        if info.name_as_str() == Some(libxdp::DISPATCHER_NAME) {
            for component in libxdp::components(id) {
                let Some(c) = program(component)? else {
                    continue;
                };
                if is_ours(&c) {
                    let attachment = XdpAttachment {
                        ifindex,
                        prog_id: component,
                        mode,
                        dispatcher: Some(id),
                        by_process: false,
                        arrival: ArrivalStamp::of(&c),
                    };
                    return Ok(Some((attachment, c)));
                }
            }
        }
    }
    Ok(None)
}

/// The map `name` of program `info`, found by its id.
pub(super) fn map_of(info: &ProgramInfo, name: &str) -> Result<MapData, XdpError> {
    let ids = info
        .map_ids()
        .map_err(bpf_err("read the maps of the XDP program"))?
        .unwrap_or_default();
    for id in ids {
        let Ok(map) = MapInfo::from_id(id) else {
            continue;
        };
        if map.name_as_str() == Some(name) {
            return MapData::from_id(id).map_err(bpf_err(format!("open map {name} (id {id})")));
        }
    }
    Err(XdpError::NoMap(name.to_string()))
}
