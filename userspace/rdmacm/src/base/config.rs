//! What the library reads from the environment (`xroce run` sets it).
//!
//! - `XROCE_IFACES` is read by libibverbs, which offers the devices
//!   (`xroce_IF`); this library only sees the devices it lists.
//! - `XROCE_RDMACM_DEBUG` or `XROCE_VERBS_DEBUG`: say on stderr why a call
//!   failed and which calls are not implemented yet (unset, empty or
//!   "0": quiet).

use std::sync::OnceLock;

pub(crate) fn debug() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG.get_or_init(|| {
        // Set and not "0" (or empty): on.
        let on = |name| std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0");
        on("XROCE_RDMACM_DEBUG") || on("XROCE_VERBS_DEBUG")
    })
}
