//! What is not built yet: multicast and rsockets. Every symbol is defined, so programs
//! load and resolve all of librdmacm; each call fails with -1 and errno
//! ENOSYS, and says so on stderr under XROCE_RDMACM_DEBUG /
//! XROCE_VERBS_DEBUG. rsocket calls that return `ssize_t` or `off_t`
//! return -1 the same way.

use std::ffi::{c_int, c_void};

use crate::{
    abi::*,
    base::errno::{ffi, set_errno},
};

/// -1 with errno ENOSYS, and the debug line naming the call.
fn not_yet(call: &str) -> c_int {
    ffi(-1, || {
        if crate::base::config::debug() {
            eprintln!("xroce librdmacm: {call}: not implemented yet (errno ENOSYS)");
        }
        set_errno(libc::ENOSYS);
        -1
    })
}

/// Defines `fn NAME(ARGS) -> RET` that answers [`not_yet`].
macro_rules! not_implemented {
    ($( $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty; )*) => {$(
        #[doc = concat!("`", stringify!($name), "`: not implemented yet (ENOSYS).")]
        #[no_mangle]
        pub unsafe extern "C" fn $name($(_: $ty),*) -> $ret {
            not_yet(stringify!($name)) as $ret
        }
    )*};
}

use libc::socklen_t;

not_implemented! {
    // Multicast.
    rdma_join_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr, context: *mut c_void) -> c_int;
    rdma_join_multicast_ex(
        id: *mut rdma_cm_id,
        attr: *mut rdma_cm_join_mc_attr_ex,
        context: *mut c_void
    ) -> c_int;
    rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int;
    // rsockets.
    rsocket(domain: c_int, kind: c_int, protocol: c_int) -> c_int;
    rbind(socket: c_int, addr: *const libc::sockaddr, len: socklen_t) -> c_int;
    rlisten(socket: c_int, backlog: c_int) -> c_int;
    raccept(socket: c_int, addr: *mut libc::sockaddr, len: *mut socklen_t) -> c_int;
    rconnect(socket: c_int, addr: *const libc::sockaddr, len: socklen_t) -> c_int;
    rshutdown(socket: c_int, how: c_int) -> c_int;
    rclose(socket: c_int) -> c_int;
    rrecv(socket: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize;
    rrecvfrom(
        socket: c_int,
        buf: *mut c_void,
        len: usize,
        flags: c_int,
        src: *mut libc::sockaddr,
        addrlen: *mut socklen_t
    ) -> isize;
    rrecvmsg(socket: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize;
    rsend(socket: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize;
    rsendto(
        socket: c_int,
        buf: *const c_void,
        len: usize,
        flags: c_int,
        dst: *const libc::sockaddr,
        addrlen: socklen_t
    ) -> isize;
    rsendmsg(socket: c_int, msg: *const libc::msghdr, flags: c_int) -> isize;
    rread(socket: c_int, buf: *mut c_void, count: usize) -> isize;
    rreadv(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize;
    rwrite(socket: c_int, buf: *const c_void, count: usize) -> isize;
    rwritev(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize;
    rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int;
    rselect(
        nfds: c_int,
        readfds: *mut libc::fd_set,
        writefds: *mut libc::fd_set,
        exceptfds: *mut libc::fd_set,
        timeout: *mut libc::timeval
    ) -> c_int;
    rgetpeername(socket: c_int, addr: *mut libc::sockaddr, len: *mut socklen_t) -> c_int;
    rgetsockname(socket: c_int, addr: *mut libc::sockaddr, len: *mut socklen_t) -> c_int;
    rsetsockopt(
        socket: c_int,
        level: c_int,
        optname: c_int,
        optval: *const c_void,
        optlen: socklen_t
    ) -> c_int;
    rgetsockopt(
        socket: c_int,
        level: c_int,
        optname: c_int,
        optval: *mut c_void,
        optlen: *mut socklen_t
    ) -> c_int;
    // Variadic in C (`int rfcntl(int, int, ...)`); the optional argument
    // is never read.
    rfcntl(socket: c_int, cmd: c_int) -> c_int;
    riomap(
        socket: c_int,
        buf: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        offset: libc::off_t
    ) -> libc::off_t;
    riounmap(socket: c_int, buf: *mut c_void, len: usize) -> c_int;
    riowrite(
        socket: c_int,
        buf: *const c_void,
        count: usize,
        offset: libc::off_t,
        flags: c_int
    ) -> usize;
}
