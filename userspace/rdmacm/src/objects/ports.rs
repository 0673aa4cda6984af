//! Port spaces and bindings: which (port space, address, port) the ids of
//! this process hold, ephemeral ports from the kernel's local port range,
//! and EADDRINUSE as the kernel's rdma_cm decides it.
//!
//! The kernel keeps one table for the whole host; without the rdma_cm
//! device the table is per process (two xroce programs on one host could
//! both bind a port; their connections are still told apart by QPN).

use std::{
    net::{IpAddr, SocketAddr},
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
};

/// One bound id.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Binding {
    key: u64,
    ps: u32,
    addr: IpAddr,
    port: u16,
    reuse: bool,
    /// IPV6_V6ONLY: an IPv6 wildcard that does not cover IPv4.
    afonly: bool,
}

static BINDINGS: Mutex<Vec<Binding>> = Mutex::new(Vec::new());

/// A binding held by an id; released by [`release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BindingKey(u64);

/// Whether `addr` may not share a port with binding `a`, and the kernel's
/// errno (`cma_check_port`): EADDRNOTAVAIL when either is a wildcard (or
/// loopback, which the kernel's rdma_cm binds alike) covering the other's
/// family (an IPv6 one covers IPv4 unless AFONLY), EADDRINUSE when they
/// are equal.
fn conflict(a: &Binding, addr: IpAddr, afonly: bool) -> Option<i32> {
    let covers = |wild: IpAddr, wild_afonly: bool, other: IpAddr| {
        crate::base::sockaddr::is_any_addr(wild)
            && (wild.is_ipv4() == other.is_ipv4() || (wild.is_ipv6() && !wild_afonly))
    };
    if covers(a.addr, a.afonly, addr) || covers(addr, afonly, a.addr) {
        Some(libc::EADDRNOTAVAIL)
    } else if a.addr == addr {
        Some(libc::EADDRINUSE)
    } else {
        None
    }
}

/// The kernel's ephemeral range (net.ipv4.ip_local_port_range, which
/// rdma_cm also uses for IPv6).
pub(crate) fn local_port_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|v| v.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .filter(|(lo, hi)| lo <= hi && *lo > 0)
        .unwrap_or((32768, 60999))
}

pub(crate) fn random_u32() -> u32 {
    let mut v = 0u32;
    // SAFETY: getrandom fills the 4 bytes of v.
    unsafe { libc::getrandom(&mut v as *mut u32 as *mut _, 4, 0) };
    v
}

/// Binds `addr` in port space `ps` (port 0: an ephemeral port from a
/// random start in the local range, as the kernel picks). Returns the key
/// and the port. EADDRINUSE or EADDRNOTAVAIL when taken ([`conflict`]),
/// EADDRNOTAVAIL when the range is full.
pub(crate) fn bind(
    ps: u32,
    addr: SocketAddr,
    reuse: bool,
    afonly: bool,
) -> Result<(BindingKey, u16), i32> {
    static NEXT_KEY: AtomicU64 = AtomicU64::new(1);
    let mut table = BINDINGS.lock().unwrap();
    let taken = |table: &[Binding], port: u16| {
        table
            .iter()
            .filter(|b| b.ps == ps && b.port == port && !(b.reuse && reuse))
            .find_map(|b| conflict(b, addr.ip(), afonly))
    };
    let port = if addr.port() != 0 {
        if let Some(errno) = taken(&table, addr.port()) {
            return Err(errno);
        }
        addr.port()
    } else {
        let (lo, hi) = local_port_range();
        let span = u32::from(hi - lo) + 1;
        let start = random_u32() % span;
        (0..span)
            .map(|i| lo + ((start + i) % span) as u16)
            .find(|p| taken(&table, *p).is_none())
            .ok_or(libc::EADDRNOTAVAIL)?
    };
    let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
    table.push(Binding {
        key,
        ps,
        addr: addr.ip(),
        port,
        reuse,
        afonly,
    });
    Ok((BindingKey(key), port))
}

pub(crate) fn release(key: BindingKey) {
    BINDINGS.lock().unwrap().retain(|b| b.key != key.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    const PS: u32 = 0x7fff_0000; // a port space no other test uses

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ephemeral_ports_come_from_the_local_range() {
        let (lo, hi) = local_port_range();
        let (k, port) = bind(PS, sa("0.0.0.0:0"), false, false).unwrap();
        assert!((lo..=hi).contains(&port), "{port} not in {lo}..={hi}");
        release(k);
    }

    #[test]
    fn same_port_conflicts_unless_both_reuse_or_addresses_differ() {
        let ps = PS + 1;
        let (a, _) = bind(ps, sa("10.0.0.1:7000"), false, false).unwrap();
        assert_eq!(
            bind(ps, sa("10.0.0.1:7000"), false, false),
            Err(libc::EADDRINUSE)
        );
        assert_eq!(
            bind(ps, sa("0.0.0.0:7000"), false, false),
            Err(libc::EADDRNOTAVAIL)
        );
        assert_eq!(
            bind(ps, sa("[::]:7000"), false, false),
            Err(libc::EADDRNOTAVAIL)
        );
        let (b, _) = bind(ps, sa("[::]:7000"), false, true).unwrap();
        let (c, _) = bind(ps, sa("10.0.0.2:7000"), false, false).unwrap();
        // Another port space is another table.
        let (d, _) = bind(ps + 1, sa("10.0.0.1:7000"), false, false).unwrap();
        for k in [a, b, c, d] {
            release(k);
        }
        let (r1, _) = bind(ps, sa("10.0.0.1:7001"), true, false).unwrap();
        let (r2, _) = bind(ps, sa("10.0.0.1:7001"), true, false).unwrap();
        release(r1);
        release(r2);
        let (again, port) = bind(ps, sa("10.0.0.1:7000"), false, false).unwrap();
        assert_eq!(port, 7000);
        release(again);
    }

    #[test]
    fn a_loopback_binding_covers_its_family_as_a_wildcard_does() {
        let ps = PS + 3;
        let (lo, _) = bind(ps, sa("127.0.0.1:7002"), false, false).unwrap();
        assert_eq!(
            bind(ps, sa("10.0.0.1:7002"), false, false),
            Err(libc::EADDRNOTAVAIL)
        );
        assert_eq!(
            bind(ps, sa("127.0.0.1:7002"), false, false),
            Err(libc::EADDRNOTAVAIL)
        );
        let (v6, _) = bind(ps, sa("[fd00::1]:7002"), false, true).unwrap();
        release(lo);
        release(v6);
    }
}
