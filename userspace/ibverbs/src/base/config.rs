//! What the library reads from the environment (`xroce run` sets it).
//!
//! - `XROCE_IFACES`: comma-separated interfaces to offer as devices
//!   (`xroce_IF` each). Unset: every interface that is up, has an
//!   Ethernet address and an IPv4 address, except loopback.
//! - `XROCE_BACKEND`: `afxdp` or `udp`. Unset: AF_XDP on an interface
//!   where xroce's XDP program is attached, UDP elsewhere.
//! - `XROCE_CC`: congestion control, `none` (default), `dcqcn`, `timely` or
//!   `swift` (parameters: `XROCE_DCQCN`, `XROCE_TIMELY`, `XROCE_SWIFT`, see `xroce::cc`).
//! - `XROCE_IO_THREADS`: I/O threads (engines) a device spreads its QPs
//!   over, 1 (default) to 64. With N > 1 each context's device runs N
//!   engines, each with its own QPN block and I/O thread (on AF_XDP: the RX
//!   queues q with q % N == i, sending on its own queue); a new QP goes to
//!   the engine with the fewest QPs; PDs, MRs, CQs and SRQs serve QPs of
//!   every engine. Needs xroce's XDP program (attached by the library, so
//!   root), AF_XDP unless `XROCE_BACKEND=udp`, at least N RX queues, and
//!   the interface's AF_XDP sockets to this process alone.
//! - `XROCE_SELECTIVE_REPEAT`: `auto` (default: each RC QP agrees on
//!   selective repeat with an xroce peer in band, go-back-N with any other
//!   RoCE device), `off` (go-back-N always) or `on` (forced: only when
//!   every peer is xroce).
//! - `XROCE_APP_PROGRESS`: `on` (default: on AF_XDP, a thread whose
//!   `ibv_poll_cq` finds the CQ empty runs the transport itself when
//!   frames or posted work wait, instead of waiting for the device's I/O
//!   thread to get a core) or `off` (only the I/O thread does).
//! - `XROCE_SPIN_US`: microseconds the device's I/O thread keeps polling
//!   after its last frame before it sleeps, 0 to 100000 (default 300).
//!   Less saves CPU while a stream waits for ACKs and costs latency
//!   (docs/verbs.md has the figures).
//! - `XROCE_VERBS_DEBUG`: say on stderr why a verb failed.

use std::sync::OnceLock;

use xroce::device::BackendKind;
use xroce::engine::SrMode;

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

/// `XROCE_SELECTIVE_REPEAT`, Auto if unset or empty.
pub(crate) fn selective_repeat() -> Result<SrMode, String> {
    parse_selective_repeat(std::env::var("XROCE_SELECTIVE_REPEAT").ok().as_deref())
}

fn parse_selective_repeat(v: Option<&str>) -> Result<SrMode, String> {
    match v.map(str::trim) {
        None | Some("") => Ok(SrMode::Auto),
        Some(t) => t
            .parse()
            .map_err(|_| format!("XROCE_SELECTIVE_REPEAT={t}: use {}", SrMode::NAMES)),
    }
}

/// Most I/O threads `XROCE_IO_THREADS` may ask for.
const MAX_IO_THREADS: usize = 64;

/// `XROCE_IO_THREADS`, 1 if unset or empty.
pub(crate) fn io_threads() -> Result<usize, String> {
    parse_io_threads(std::env::var("XROCE_IO_THREADS").ok().as_deref())
}

fn parse_io_threads(v: Option<&str>) -> Result<usize, String> {
    match v.map(str::trim) {
        None | Some("") => Ok(1),
        Some(t) => match t.parse::<usize>() {
            Ok(n) if (1..=MAX_IO_THREADS).contains(&n) => Ok(n),
            _ => Err(format!(
                "XROCE_IO_THREADS={t}: use a number of I/O threads from 1 to {MAX_IO_THREADS}"
            )),
        },
    }
}

/// `XROCE_APP_PROGRESS`, on if unset or empty.
pub(crate) fn app_progress() -> Result<bool, String> {
    parse_app_progress(std::env::var("XROCE_APP_PROGRESS").ok().as_deref())
}

fn parse_app_progress(v: Option<&str>) -> Result<bool, String> {
    match v.map(str::trim) {
        None | Some("") | Some("on") => Ok(true),
        Some("off") => Ok(false),
        Some(t) => Err(format!("XROCE_APP_PROGRESS={t}: use on or off")),
    }
}

pub(crate) fn spin_after_activity() -> Result<std::time::Duration, String> {
    parse_spin_us(std::env::var("XROCE_SPIN_US").ok().as_deref())
}

/// Most microseconds `XROCE_SPIN_US` takes (a tenth of a second: beyond
/// it the thread would spin through whole pauses of a program).
const MAX_SPIN_US: u64 = 100_000;

fn parse_spin_us(v: Option<&str>) -> Result<std::time::Duration, String> {
    parse_micros(
        "XROCE_SPIN_US",
        v,
        xroce::runtime::SPIN_AFTER_ACTIVITY_US,
        MAX_SPIN_US,
    )
}

pub(crate) fn stream_nap() -> Result<std::time::Duration, String> {
    parse_stream_nap_us(std::env::var("XROCE_STREAM_NAP_US").ok().as_deref())
}

/// Most microseconds `XROCE_STREAM_NAP_US` takes: a nap is a frame's
/// longest extra wait while a stream runs.
const MAX_STREAM_NAP_US: u64 = 1_000;

fn parse_stream_nap_us(v: Option<&str>) -> Result<std::time::Duration, String> {
    parse_micros(
        "XROCE_STREAM_NAP_US",
        v,
        xroce::runtime::STREAM_NAP_US,
        MAX_STREAM_NAP_US,
    )
}

/// A variable `name` of microseconds from 0 to `max`, `default` if unset
/// or empty.
fn parse_micros(
    name: &str,
    v: Option<&str>,
    default: u64,
    max: u64,
) -> Result<std::time::Duration, String> {
    let us = match v.map(str::trim) {
        None | Some("") => default,
        Some(t) => match t.parse::<u64>() {
            Ok(us) if us <= max => us,
            _ => {
                return Err(format!(
                    "{name}={t}: use microseconds from 0 to {max} (default {default})"
                ))
            }
        },
    };
    Ok(std::time::Duration::from_micros(us))
}

pub(crate) fn debug() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("XROCE_VERBS_DEBUG").is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spin_defaults_to_the_runtime_default_and_names_the_accepted_values() {
        use std::time::Duration;
        let default = xroce::runtime::RuntimeConfig::default().spin_after_activity;
        assert_eq!(parse_spin_us(None), Ok(default));
        assert_eq!(parse_spin_us(Some(" ")), Ok(default));
        assert_eq!(parse_spin_us(Some("0")), Ok(Duration::ZERO));
        assert_eq!(parse_spin_us(Some(" 50 ")), Ok(Duration::from_micros(50)));
        assert_eq!(
            parse_spin_us(Some("100000")),
            Ok(Duration::from_micros(100_000))
        );
        for bad in ["-1", "1ms", "100001", "x"] {
            assert_eq!(
                parse_spin_us(Some(bad)).unwrap_err(),
                format!("XROCE_SPIN_US={bad}: use microseconds from 0 to 100000 (default 300)")
            );
        }
    }

    #[test]
    fn stream_nap_defaults_to_the_runtime_default_and_names_the_accepted_values() {
        use std::time::Duration;
        let default = xroce::runtime::RuntimeConfig::default().stream_nap;
        assert_eq!(parse_stream_nap_us(None), Ok(default));
        assert_eq!(parse_stream_nap_us(Some("0")), Ok(Duration::ZERO));
        assert_eq!(
            parse_stream_nap_us(Some(" 5 ")),
            Ok(Duration::from_micros(5))
        );
        for bad in ["-1", "20us", "1001"] {
            assert_eq!(
                parse_stream_nap_us(Some(bad)).unwrap_err(),
                format!("XROCE_STREAM_NAP_US={bad}: use microseconds from 0 to 1000 (default 20)")
            );
        }
    }

    #[test]
    fn app_progress_defaults_to_on_and_names_the_accepted_values() {
        assert_eq!(parse_app_progress(None), Ok(true));
        assert_eq!(parse_app_progress(Some("")), Ok(true));
        assert_eq!(parse_app_progress(Some("on")), Ok(true));
        assert_eq!(parse_app_progress(Some(" off ")), Ok(false));
        for bad in ["0", "1", "yes"] {
            assert_eq!(
                parse_app_progress(Some(bad)).unwrap_err(),
                format!("XROCE_APP_PROGRESS={bad}: use on or off")
            );
        }
    }

    #[test]
    fn selective_repeat_defaults_to_auto_and_names_the_accepted_values() {
        assert_eq!(parse_selective_repeat(None), Ok(SrMode::Auto));
        assert_eq!(parse_selective_repeat(Some("")), Ok(SrMode::Auto));
        assert_eq!(parse_selective_repeat(Some("off")), Ok(SrMode::Off));
        assert_eq!(parse_selective_repeat(Some(" ON ")), Ok(SrMode::On));
        assert_eq!(parse_selective_repeat(Some("auto")), Ok(SrMode::Auto));
        for bad in ["1", "yes", "gbn"] {
            let e = parse_selective_repeat(Some(bad)).unwrap_err();
            assert_eq!(
                e,
                format!("XROCE_SELECTIVE_REPEAT={bad}: use off, auto or on")
            );
        }
    }

    #[test]
    fn io_threads_default_to_one_and_reject_what_is_not_1_to_64() {
        assert_eq!(parse_io_threads(None), Ok(1));
        assert_eq!(parse_io_threads(Some(" ")), Ok(1));
        assert_eq!(parse_io_threads(Some("2")), Ok(2));
        assert_eq!(parse_io_threads(Some(" 64 ")), Ok(64));
        for bad in ["0", "65", "two", "-1"] {
            let e = parse_io_threads(Some(bad)).unwrap_err();
            assert!(e.starts_with(&format!("XROCE_IO_THREADS={bad}: ")), "{e}");
        }
    }
}
