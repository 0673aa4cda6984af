//! The handle check of `XROCE_VERBS_DEBUG` (issue 25, item 9).
//!
//! rdma-core leaves a double destroy, or any use of an object after its
//! destroy, undefined. Under `XROCE_VERBS_DEBUG` this library keeps a
//! table of the objects it handed out: every verb looks its object up
//! first, and one that is not live (destroyed already, or never made here)
//! is reported on stderr with the call that got it, and the call fails
//! with EINVAL (-1/errno EINVAL, or NULL) instead of touching freed
//! memory. Destroyed objects keep their memory for the rest of the
//! process (their contents are dropped): a program reading the C struct
//! of a dead object (the inline `ibv_post_send` reads `qp->context` to
//! find the call) reads what it read before, not another object.
//!
//! Without the variable nothing is recorded and each check is one load of
//! a cached flag.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// An object the table knows, by what a program calls it (each object
/// type implements it).
pub(crate) trait Handle {
    const KIND: &'static str;
}

/// Address -> kind of every live object (debug mode only).
fn live() -> &'static Mutex<HashMap<usize, &'static str>> {
    static LIVE: OnceLock<Mutex<HashMap<usize, &'static str>>> = OnceLock::new();
    LIVE.get_or_init(Mutex::default)
}

fn enabled() -> bool {
    crate::base::config::debug()
}

/// `p` was just handed out.
pub(crate) fn born<T: Handle>(p: *const T) {
    if enabled() {
        live()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p as usize, T::KIND);
    }
}

/// Whether `p` is a live `T` (always true outside debug mode; NULL passes,
/// the callers answer it themselves). A dead one is reported.
pub(crate) fn check<T: Handle>(p: *const T) -> bool {
    if !enabled() || p.is_null() {
        return true;
    }
    let found = live()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(p as usize))
        .copied();
    if found == Some(T::KIND) {
        return true;
    }
    let what = match found {
        Some(other) => format!("is a live {other}, not a {}", T::KIND),
        None => format!(
            "is not a live {} of this library (destroyed already, or never made here)",
            T::KIND
        ),
    };
    eprintln!(
        "xroce libibverbs: {}: {} {p:p} {what}; the call fails with EINVAL",
        calling_verb(),
        T::KIND
    );
    false
}

/// Frees the object `b` owns (its destroy): outside debug mode at once;
/// in debug mode it leaves the table and its contents are dropped, but
/// its memory stays (see the module docs).
pub(crate) fn free<T: Handle>(b: Box<T>) {
    if !enabled() {
        drop(b);
        return;
    }
    let p = Box::into_raw(b);
    live()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(p as usize));
    // SAFETY: `p` came from a Box and nothing else owns it; the memory is
    // never freed (leaked on purpose), only its contents are dropped, once.
    unsafe { std::ptr::drop_in_place(p) };
}

/// The verb being served: the outermost frame of this library on the
/// stack, the entry point the program called (`ibv_destroy_qp`, or
/// `post_send` through `context->ops`), from the symbols the build keeps.
/// Only on the error path.
fn calling_verb() -> String {
    let bt = std::backtrace::Backtrace::force_capture().to_string();
    bt.lines()
        .filter_map(|l| l.trim().split_once(": ").map(|(_, s)| s))
        .filter_map(|s| {
            let s = s.trim_end_matches("::{{closure}}");
            match s.strip_prefix("xroce_ibverbs::") {
                Some(path) => path.rsplit_once("::").map(|(_, name)| name.to_string()),
                // Without debug info: the exported names alone.
                None => s.starts_with("ibv_").then(|| s.to_string()),
            }
        })
        .next_back()
        .unwrap_or_else(|| "a verb".to_string())
}
