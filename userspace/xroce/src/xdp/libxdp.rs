//! Attaching through libxdp's multi-program dispatcher, the convention
//! xdp-tools follow (`xdp-loader status IF` lists what runs on an
//! interface; `xdp-filter load IF` joins it). libxdp and libbpf are linked
//! statically already (xsk-rs builds them), so this needs no library on
//! the machine.
//!
//! libxdp loads the program itself from the object (libxdp cannot re-link
//! an already-loaded XDP program: a dispatcher slot takes an EXT program),
//! as a freplace of a dispatcher slot where the kernel allows it, else as
//! a single program attached directly (its own fallback: kernels without
//! EXT support, or one that refuses EXT loads, as under lockdown).

use std::{
    ffi::{c_char, c_int, c_void, CStr},
    ptr,
};

use libxdp_sys as sys;

use super::Mode;

/// Where xroce runs among a dispatcher's programs (lower runs first):
/// after filters (xdp-filter declares 10), so a frame a firewall drops
/// never reaches xroce, and before programs of libxdp's default priority
/// (50), so RoCE frames are steered to xroce's sockets before a program
/// that knows nothing of them could take them. xroce returns XDP_PASS for
/// every frame that is not its own, and only XDP_PASS continues the chain.
pub const RUN_PRIO: u32 = 40;

/// The name libxdp gives its dispatcher program (`bpftool prog` shows it).
pub const DISPATCHER_NAME: &str = "xdp_dispatcher";

type PrintFn = Option<unsafe extern "C" fn(c_int, *const c_char, *mut c_void) -> c_int>;

extern "C" {
    // libbpf's own (linked statically through libxdp-sys, whose bindings
    // leave it out): its warnings go to stderr by default.
    fn libbpf_set_print(f: PrintFn) -> PrintFn;
}

/// Keeps libxdp and libbpf quiet while it lives: where the kernel refuses
/// EXT programs libbpf prints the failed load and libxdp its fallback,
/// which are expected there. XROCE_XDP_DEBUG=1 keeps their messages.
struct Quiet {
    libbpf: PrintFn,
    libxdp: sys::libxdp_print_fn_t,
    active: bool,
}

impl Quiet {
    fn new() -> Quiet {
        if std::env::var_os("XROCE_XDP_DEBUG").is_some() {
            return Quiet {
                libbpf: None,
                libxdp: None,
                active: false,
            };
        }
        // SAFETY: both setters only swap a global function pointer; None
        // turns printing off.
        unsafe {
            Quiet {
                libbpf: libbpf_set_print(None),
                libxdp: sys::libxdp_set_print(None),
                active: true,
            }
        }
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        if self.active {
            // SAFETY: restores the printers saved in new().
            unsafe {
                libbpf_set_print(self.libbpf);
                sys::libxdp_set_print(self.libxdp);
            }
        }
    }
}

fn attach_mode(mode: Mode) -> sys::xdp_attach_mode {
    match mode {
        Mode::Native => sys::xdp_attach_mode_XDP_MODE_NATIVE,
        Mode::Skb => sys::xdp_attach_mode_XDP_MODE_SKB,
    }
}

/// Loads program `name` of `object` through libxdp and attaches it to
/// `ifindex`: under the interface's dispatcher (a new one, or beside the
/// programs an existing one runs) where the kernel allows it, else
/// directly. Returns the errno of the failure (EEXIST/EBUSY: another
/// program runs there without a dispatcher; EINVAL: among others, the
/// verifier refused the program).
pub(super) fn attach(
    object: &'static [u8],
    name: &CStr,
    ifindex: u32,
    mode: Mode,
) -> Result<(), i32> {
    let _quiet = Quiet::new();
    // SAFETY: `object` is a static ELF image libbpf reads in place; every
    // pointer below is checked before use and closed once.
    unsafe {
        let obj = sys::bpf_object__open_mem(object.as_ptr().cast(), object.len(), ptr::null());
        if obj.is_null() {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL));
        }
        // The object also holds the fallback XDP program and the delay
        // bottleneck's TC program, and libbpf loads every program of an
        // object: all but `name` are left unloaded.
        let mut found = false;
        let mut p = sys::bpf_object__next_program(obj, ptr::null_mut());
        while !p.is_null() {
            if CStr::from_ptr(sys::bpf_program__name(p)) == name {
                found = true;
            } else {
                sys::bpf_program__set_autoload(p, false);
            }
            p = sys::bpf_object__next_program(obj, p);
        }
        if !found {
            sys::bpf_object__close(obj);
            return Err(libc::ENOENT);
        }
        let mut opts = sys::xdp_program_opts {
            sz: std::mem::size_of::<sys::xdp_program_opts>(),
            obj,
            opts: ptr::null_mut(),
            prog_name: name.as_ptr(),
            find_filename: ptr::null(),
            open_filename: ptr::null(),
            pin_path: ptr::null(),
            id: 0,
            fd: 0,
        };
        let prog = sys::xdp_program__create(&mut opts);
        let err = sys::libxdp_get_error(prog as *const c_void);
        if err != 0 {
            sys::bpf_object__close(obj);
            return Err((-err) as i32);
        }
        let mut rc = sys::xdp_program__set_run_prio(prog, RUN_PRIO);
        // The program handles multi-buffer frames (section xdp.frags), but
        // libbpf marks it so only when it loads it, after libxdp chose the
        // dispatcher's flags: without this the dispatcher is made without
        // frags and a driver whose MTU needs them (virtio-net above a
        // page) refuses it.
        if rc == 0 {
            rc = sys::xdp_program__set_xdp_frags_support(prog, true);
        }
        if rc == 0 {
            rc = sys::xdp_program__set_chain_call_enabled(prog, sys::xdp_action_XDP_PASS, true);
        }
        if rc == 0 {
            rc = sys::xdp_program__attach(prog, ifindex as c_int, attach_mode(mode), 0);
        }
        sys::xdp_program__close(prog);
        sys::bpf_object__close(obj);
        if rc < 0 {
            return Err(-rc);
        }
    }
    Ok(())
}

/// Removes the component with program id `prog_id` from the dispatcher on
/// `ifindex`: libxdp replaces the dispatcher with one without it (or
/// removes the dispatcher with its last program); the others stay.
pub(super) fn detach_component(ifindex: u32, prog_id: u32, mode: Mode) -> Result<(), i32> {
    let _quiet = Quiet::new();
    // SAFETY: the multiprog and its programs are libxdp's; the programs
    // are freed with the multiprog, closed once at the end.
    unsafe {
        let mp = sys::xdp_multiprog__get_from_ifindex(ifindex as c_int);
        let err = sys::libxdp_get_error(mp as *const c_void);
        if err != 0 {
            return Err((-err) as i32);
        }
        if mp.is_null() {
            return Err(libc::ENOENT);
        }
        let mut rc = -libc::ENOENT;
        let mut p = sys::xdp_multiprog__next_prog(ptr::null(), mp);
        while !p.is_null() {
            if sys::xdp_program__id(p) == prog_id {
                rc = sys::xdp_program__detach(p, ifindex as c_int, attach_mode(mode), 0);
                break;
            }
            p = sys::xdp_multiprog__next_prog(p, mp);
        }
        sys::xdp_multiprog__close(mp);
        if rc < 0 {
            return Err(-rc);
        }
    }
    Ok(())
}

/// The id of the program a dispatcher's slot runs, for each freplace
/// (tracing) link whose target is program `dispatcher_id`. Found through
/// the kernel's links, not libxdp's bpffs pins, so it works in any mount
/// namespace (`ip netns exec` gives a command a private /sys).
pub(super) fn components(dispatcher_id: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut id = 0u32;
    // SAFETY: plain bpf(2) wrappers on values this function owns; every
    // descriptor opened is closed.
    unsafe {
        loop {
            let mut next = 0u32;
            if sys::bpf_link_get_next_id(id, &mut next) != 0 {
                break;
            }
            id = next;
            let fd = sys::bpf_link_get_fd_by_id(id);
            if fd < 0 {
                // Gone since it was listed: not ours to find.
                continue;
            }
            let mut info: sys::bpf_link_info = std::mem::zeroed();
            let mut len = std::mem::size_of::<sys::bpf_link_info>() as u32;
            let rc = sys::bpf_link_get_info_by_fd(fd, &mut info, &mut len);
            libc::close(fd);
            if rc == 0
                && info.type_ == sys::bpf_link_type_BPF_LINK_TYPE_TRACING
                && info.__bindgen_anon_1.tracing.target_obj_id == dispatcher_id
            {
                out.push(info.prog_id);
            }
        }
    }
    out
}

/// libxdp's words for `errno` (its own codes included).
pub(super) fn strerror(errno: i32) -> String {
    let mut buf = [0 as c_char; 256];
    // SAFETY: libxdp writes at most buf.len() bytes, NUL-terminated.
    unsafe {
        if sys::libxdp_strerror(-errno, buf.as_mut_ptr(), buf.len()) == 0 {
            return CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
        }
    }
    std::io::Error::from_raw_os_error(errno).to_string()
}
