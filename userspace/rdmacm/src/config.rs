//! What the library reads from the environment (`xroce run` sets it).
//!
//! - `XROCE_IFACES` is read by libibverbs, which offers the devices
//!   (`xroce_IF`); this library only sees the devices it lists.
//! - `XROCE_RDMACM_DEBUG` or `XROCE_VERBS_DEBUG`: say on stderr why a call
//!   failed and which calls are not implemented yet.

use std::sync::OnceLock;

pub(crate) fn debug() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG.get_or_init(|| {
        std::env::var_os("XROCE_RDMACM_DEBUG").is_some()
            || std::env::var_os("XROCE_VERBS_DEBUG").is_some()
    })
}
