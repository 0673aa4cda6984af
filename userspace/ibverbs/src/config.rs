//! What the library reads from the environment (`xroce run` sets it).
//!
//! - `XROCE_IFACES`: comma-separated interfaces to offer as devices
//!   (`xroce_IF` each). Unset: every interface that is up, has an
//!   Ethernet address and an IPv4 address, except loopback.
//! - `XROCE_BACKEND`: `afxdp` or `udp`. Unset: AF_XDP on an interface
//!   where xroce's XDP program is attached, UDP elsewhere.
//! - `XROCE_CC`: congestion control, `none` (default), `dcqcn`, `timely` or
//!   `swift` (parameters: `XROCE_DCQCN`, `XROCE_TIMELY`, `XROCE_SWIFT`, see `xroce::cc`).
//! - `XROCE_VERBS_DEBUG`: say on stderr why a verb failed.

use std::sync::OnceLock;

use xroce::device::BackendKind;

pub(crate) fn ifaces() -> Option<Vec<String>> {
    let v = std::env::var("XROCE_IFACES").ok()?;
    Some(
        v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
    )
}

/// The backend asked for, or `None` to choose per interface.
pub(crate) fn backend() -> Result<Option<BackendKind>, String> {
    match std::env::var("XROCE_BACKEND") {
        Err(_) => Ok(None),
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => v
            .parse()
            .map(Some)
            .map_err(|_| format!("XROCE_BACKEND={v}: use afxdp or udp")),
    }
}

pub(crate) fn cc() -> Result<xroce::cc::CcKind, String> {
    match std::env::var("XROCE_CC") {
        Err(_) => Ok(xroce::cc::CcKind::None),
        Ok(v) => v
            .parse()
            .map_err(|_| format!("XROCE_CC={v}: use none, dcqcn, timely or swift")),
    }
}

pub(crate) fn debug() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("XROCE_VERBS_DEBUG").is_some())
}
