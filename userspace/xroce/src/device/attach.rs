//! The attach policy: use an xroce XDP program already on the interface,
//! else attach one if asked (native first, then skb when allowed).

use super::{Attachment, NetDeviceConfig, NetDeviceError};
use crate::xdp::{self, Mode, XdpError};

/// Finds or makes the XDP attachment `cfg` asks for on `iface`. Errors that
/// skb mode would meet as well (not root, no bpffs, no interface) are not
/// retried in skb mode; any other native failure is, when allowed, and is
/// kept as the reason in [`Attachment::Ours`].
pub(super) fn attach(iface: &str, cfg: NetDeviceConfig) -> Result<Attachment, NetDeviceError> {
    if xdp::is_attached(iface) {
        return Ok(Attachment::Existing);
    }
    if !cfg.attach {
        return Ok(Attachment::None);
    }
    match xdp::attach(iface, cfg.mode) {
        Ok(()) => Ok(Attachment::Ours {
            mode: cfg.mode,
            fallback: None,
        }),
        // Another process of the device attached it since we looked.
        Err(XdpError::AlreadyAttached(_)) => Ok(Attachment::Existing),
        Err(
            e @ (XdpError::NotRoot
            | XdpError::NoBpffs
            | XdpError::NoSuchInterface(_)
            | XdpError::OtherProgram(_)),
        ) => Err(e.into()),
        Err(e) if cfg.fallback_to_skb && cfg.mode == Mode::Native => {
            match xdp::attach(iface, Mode::Skb) {
                Ok(()) => Ok(Attachment::Ours {
                    mode: Mode::Skb,
                    fallback: Some(e.to_string()),
                }),
                Err(XdpError::AlreadyAttached(_)) => Ok(Attachment::Existing),
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}
