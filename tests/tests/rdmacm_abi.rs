//! xroce's drop-in `librdmacm.so.1` against Debian's rdma-core 44:
//!
//! - layout: size, alignment and the offset and size of every field of the
//!   structs the library fills or reads, as the C compiler sees them in
//!   `<rdma/rdma_cma.h>` and as Rust sees `userspace/cabi/src/rdma_cm.rs`;
//! - exports: SONAME, every symbol of Debian's library at its default
//!   version and no other, `dlvsym`, libibverbs.so.1 linked dynamically;
//! - programs: a C program built against the real header drives channels,
//!   ids, binding, address and route resolution, QPs, getaddrinfo and
//!   endpoints between two namespaces under `xroce run`, and loopback and
//!   wildcard addresses as the kernel's rdma_cm treats them (down to a
//!   connection to 127.0.0.1 within the process; connections between the
//!   namespaces: tests/rdmacm_programs.rs).

use std::{
    collections::BTreeMap,
    ffi::CString,
    fmt::Write as _,
    mem::{align_of, offset_of, size_of},
    path::Path,
    process::Command,
};

use xroce_cabi::rdma_cm as abi;
use xroce_tests::{
    require_root, run,
    verbs::{
        compile_c, default_versioned_exports, dynamic_symbols, ibverbs_cdylib, layout_mismatches,
        loader_failures, rdmacm_cdylib, soname, which, workspace_root, xroce_exe, xroce_run,
        Scratch,
    },
    VethPair,
};

/// The header the library's types mirror.
const RDMA_CMA_H: &str = "/usr/include/rdma/rdma_cma.h";
/// Debian's own librdmacm (rdma-core 44), the ABI to match.
const DEBIAN_LIBRDMACM: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";

fn require_header() {
    assert!(
        Path::new(RDMA_CMA_H).exists(),
        "{RDMA_CMA_H} is missing: install librdmacm-dev (cargo xtask setup does)"
    );
}

fn require_debian_rdmacm() {
    assert!(
        Path::new(DEBIAN_LIBRDMACM).exists() && which("rping").is_some(),
        "{DEBIAN_LIBRDMACM} or rping is missing: install rdmacm-utils (cargo xtask setup does)"
    );
}

// ---------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------

/// `key -> "size S align A"` / `"offset O size S"` lines of one side.
type Layout = BTreeMap<String, String>;

/// Size of the field a (never called) projection points at.
fn field_size<S, F>(_project: fn(*const S) -> *const F) -> usize {
    size_of::<F>()
}

/// One list of `struct NAME { c.path [=> rust.path], ... }` makes both the
/// Rust entries and the C designators, so no field is checked on one side
/// only. `=> path` names bindgen's field where it differs (anonymous
/// unions become `__bindgen_anon_N`).
macro_rules! layouts {
    ($( $kind:ident $s:ident { $( $($c:ident).+ $(=> $($r:ident).+)? ),* $(,)? } )*) => {{
        let mut rust = Layout::new();
        let mut c_fields: Vec<(String, Vec<String>)> = Vec::new();
        $(
            let t = format!("{} {}", stringify!($kind), stringify!($s));
            rust.insert(t.clone(), format!("size {} align {}", size_of::<abi::$s>(), align_of::<abi::$s>()));
            let mut fields = Vec::new();
            $(
                let c = stringify!($($c).+).replace(' ', "");
                let (offset, size) = layouts!(@field $s; $($c).+; $($($r).+)?);
                rust.insert(format!("{t}.{c}"), format!("offset {offset} size {size}"));
                fields.push(c);
            )*
            c_fields.push((t, fields));
        )*
        (rust, c_fields)
    }};
    (@field $s:ident; $($c:ident).+;) => { layouts!(@at $s; $($c).+) };
    (@field $s:ident; $($c:ident).+; $($r:ident).+) => { layouts!(@at $s; $($r).+) };
    (@at $s:ident; $($p:ident).+) => {
        (
            offset_of!(abi::$s, $($p).+),
            // SAFETY: the closure is never called; only its type is used.
            field_size::<abi::$s, _>(|p| unsafe { core::ptr::addr_of!((*p).$($p).+) }),
        )
    };
}

fn layouts() -> (Layout, Vec<(String, Vec<String>)>) {
    layouts! {
        struct rdma_event_channel { fd }
        struct rdma_ib_addr { sgid, dgid, pkey }
        struct rdma_addr {
            src_addr => __bindgen_anon_1.src_addr,
            src_sin => __bindgen_anon_1.src_sin,
            src_sin6 => __bindgen_anon_1.src_sin6,
            src_storage => __bindgen_anon_1.src_storage,
            dst_addr => __bindgen_anon_2.dst_addr,
            dst_sin => __bindgen_anon_2.dst_sin,
            dst_sin6 => __bindgen_anon_2.dst_sin6,
            dst_storage => __bindgen_anon_2.dst_storage,
            // ibaddr's fields: rdma_ib_addr above (bindgen wraps ibaddr in
            // ManuallyDrop, which offset_of! cannot enter; it is
            // repr(transparent), so their offsets are rdma_ib_addr's).
            addr, addr.ibaddr,
        }
        struct rdma_route { addr, path_rec, num_paths }
        struct rdma_cm_id {
            verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel, send_cq,
            recv_cq_channel, recv_cq, srq, pd, qp_type,
        }
        struct rdma_conn_param {
            private_data, private_data_len, responder_resources, initiator_depth, flow_control,
            retry_count, rnr_retry_count, srq, qp_num,
        }
        struct rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }
        struct rdma_cm_event { id, listen_id, event, status, param, param.conn, param.ud }
        struct rdma_addrinfo {
            ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len, ai_src_addr,
            ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route,
            ai_connect_len, ai_connect, ai_next,
        }
        struct rdma_cm_join_mc_attr_ex { comp_mask, join_flags, addr }
        struct ibv_sa_path_rec {
            dgid, sgid, dlid, slid, raw_traffic, flow_label, hop_limit, traffic_class,
            reversible, numb_path, pkey, sl, mtu_selector, mtu, rate_selector, rate,
            packet_life_time_selector, packet_life_time, preference,
        }
        struct ibv_path_data { flags, reserved, path }
        struct ibv_ece { vendor_id, options, comp_mask }
    }
}

/// A C program printing the same lines from the real headers.
fn c_program(structs: &[(String, Vec<String>)]) -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <rdma/rdma_cma.h>\n\
         #include <rdma/rdma_verbs.h>\n\nint main(void)\n{\n",
    );
    for (t, fields) in structs {
        writeln!(
            c,
            "\tprintf(\"%s\\tsize %zu align %zu\\n\", \"{t}\", sizeof({t}), _Alignof({t}));"
        )
        .unwrap();
        for d in fields {
            writeln!(
                c,
                "\tprintf(\"%s\\toffset %zu size %zu\\n\", \"{t}.{d}\", offsetof({t}, {d}), \
                 sizeof((({t} *)0)->{d}));"
            )
            .unwrap();
        }
    }
    c.push_str("\treturn 0;\n}\n");
    c
}

#[test]
fn struct_layout_matches_the_c_headers() {
    require_header();
    let (rust, structs) = layouts();
    let dir = Scratch::new("rdmacm-layout");
    let src = dir.0.join("layout.c");
    let exe = dir.0.join("layout");
    std::fs::write(&src, c_program(&structs)).unwrap();
    compile_c(&src, &exe, &[]);
    let out = run(&mut Command::new(&exe));
    let mismatches = layout_mismatches(&out.stdout, &rust);
    let fields: usize = structs.iter().map(|(_, f)| f.len()).sum();
    eprintln!(
        "checked {} structs and {fields} fields against {RDMA_CMA_H}",
        structs.len()
    );
    assert!(
        mismatches.is_empty(),
        "{} layout mismatches between <rdma/rdma_cma.h> and userspace/cabi/src/rdma_cm.rs:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

// ---------------------------------------------------------------------------
// Exports
// ---------------------------------------------------------------------------

#[test]
fn exports_match_rdma_core() {
    require_debian_rdmacm();
    let lib = rdmacm_cdylib();
    assert_eq!(soname(&lib).as_deref(), Some("librdmacm.so.1"));
    // (objdump lines without a version, such as weak imports, are not
    // exports.)
    let ours: std::collections::BTreeSet<(String, String)> = default_versioned_exports(&lib)
        .into_iter()
        .filter(|(_, node)| node.starts_with("RDMACM_"))
        .collect();
    let debian = default_versioned_exports(Path::new(DEBIAN_LIBRDMACM));
    assert_eq!(debian.len(), 68, "read {debian:?} from {DEBIAN_LIBRDMACM}");
    let missing: Vec<_> = debian.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&debian).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{} exports Debian's library has and ours lacks: {missing:?}\n\
         {} exports only ours has: {extra:?}",
        missing.len(),
        extra.len()
    );
    // The list build.rs versions is Debian's too.
    let listed = std::fs::read_to_string(workspace_root().join("userspace/rdmacm/exports.txt"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (n, v) = l.split_once(' ').unwrap();
            (n.to_string(), v.to_string())
        })
        .collect::<std::collections::BTreeSet<_>>();
    assert_eq!(listed, debian, "userspace/rdmacm/exports.txt");

    // Nothing else leaks out: every defined dynamic symbol but the nodes
    // themselves is a listed export at its default version.
    let nm = run(Command::new("nm").args(["-D", "--defined-only"]).arg(&lib));
    let leaked: Vec<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[1] != "A").then(|| f[2].to_string())
        })
        .filter(|sym| {
            let (name, node) = sym.split_once("@@").unwrap_or((sym, ""));
            !debian.contains(&(name.to_string(), node.to_string()))
        })
        .collect();
    assert!(
        leaked.is_empty(),
        "defined beyond Debian's exports: {leaked:?}"
    );

    // libibverbs comes from the library path at run time (xroce's), never
    // built in: DT_NEEDED libibverbs.so.1, and the verbs it calls undefined.
    let needed = run(Command::new("objdump").arg("-p").arg(&lib));
    let needed = String::from_utf8_lossy(&needed.stdout);
    assert!(
        needed
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["NEEDED", "libibverbs.so.1"]),
        "{} does not need libibverbs.so.1:\n{needed}",
        lib.display()
    );
    let undefined_verbs = dynamic_symbols(&lib)
        .into_iter()
        .filter(|s| !s.defined && s.name.starts_with("ibv_"))
        .count();
    assert!(
        undefined_verbs >= 10,
        "only {undefined_verbs} ibv_* imports"
    );

    // dlvsym, as programs that load it at run time look names up. The
    // library's libibverbs.so.1 must resolve too: ours, from its directory.
    let _ = ibverbs_cdylib();
    let ibverbs = CString::new(
        lib.with_file_name("libxroce_ibverbs.so")
            .as_os_str()
            .as_encoded_bytes(),
    )
    .unwrap();
    let path = CString::new(lib.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid NUL-terminated paths; our libibverbs is loaded first
    // under its SONAME so that the loader finds it for librdmacm's
    // DT_NEEDED; nothing of either is called.
    let handle = unsafe {
        libc::dlopen(ibverbs.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
        libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL)
    };
    assert!(!handle.is_null(), "dlopen {}", lib.display());
    let mut not_found = Vec::new();
    for (name, node) in &debian {
        let (n, v) = (
            CString::new(name.as_str()).unwrap(),
            CString::new(node.as_str()).unwrap(),
        );
        // SAFETY: a live handle and NUL-terminated strings.
        if unsafe { libc::dlvsym(handle, n.as_ptr(), v.as_ptr()) }.is_null() {
            not_found.push(format!("{name}@{node}"));
        }
    }
    assert!(not_found.is_empty(), "dlvsym finds none of {not_found:?}");
}

// ---------------------------------------------------------------------------
// Programs
// ---------------------------------------------------------------------------

/// The probe's `key value...` lines (the first word is the key).
fn facts(stdout: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The RoCEv2 GID of an IPv4 address as the probe prints it.
fn gid_hex(ip: std::net::Ipv4Addr) -> String {
    ip.to_ipv6_mapped()
        .octets()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An IPv6 address's 16 bytes as the probe prints a GID.
fn ipv6_hex(ip: &std::net::Ipv6Addr) -> String {
    ip.octets().iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_c_program_resolves_addresses_and_routes_over_xroce() {
    require_root();
    require_header();
    let _ = (ibverbs_cdylib(), rdmacm_cdylib());
    let dir = Scratch::new("rdmacm-probe");
    let exe = dir.0.join("rdmacm_probe");
    compile_c(
        &workspace_root().join("tests/c/rdmacm_probe.c"),
        &exe,
        &["-lrdmacm", "-libverbs", "-lpthread"],
    );
    let pair = VethPair::new(1500);
    let unreachable = std::net::Ipv4Addr::new(
        pair.addr_a.octets()[0],
        pair.addr_a.octets()[1],
        pair.addr_a.octets()[2],
        99,
    );
    let (addr6_a, addr6_b) = pair.add_ipv6();
    let out = xroce_run(
        Some(&pair.a),
        &["--backend", "udp", "--iface", &pair.if_a, "--"],
    )
    .arg(&exe)
    .args([
        pair.addr_a.to_string(),
        pair.addr_b.to_string(),
        unreachable.to_string(),
        addr6_a.to_string(),
        addr6_b.to_string(),
    ])
    .output()
    .expect("run the probe under xroce run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let got = facts(&stdout);
    let device = format!("xroce_{}", pair.if_a);
    let (lo, hi) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let v: Vec<u16> = s
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            Some((*v.first()?, *v.get(1)?))
        })
        .unwrap_or((32768, 60999));
    let (enosys, einval, eagain) = (libc::ENOSYS, libc::EINVAL, libc::EAGAIN);
    let expected: Vec<(&str, String)> = vec![
        ("devices", "1".into()),
        ("device0", device.clone()),
        ("channel", "1".into()),
        ("get_empty", format!("-1 {eagain}")),
        ("poll_empty", "0".into()),
        ("create_id", "0 0".into()),
        ("id_context", "1".into()),
        ("id_qp_type", "2".into()), // IBV_QPT_RC
        ("create_id_bad_ps", format!("-1 {einval}")),
        ("bind", "0 0".into()),
        ("bound_port_num", "1".into()),
        ("bound_device", device.clone()),
        ("bind_again", format!("-1 {einval}")),
        ("bind_in_use", format!("-1 {}", libc::EADDRINUSE)),
        ("udp_qp_type", "4".into()), // IBV_QPT_UD
        ("bind_other_ps", "0 0".into()),
        ("bind_foreign", format!("-1 {}", libc::EADDRNOTAVAIL)),
        ("bind_any6", "0 0".into()),
        ("any6_port_nonzero", "1".into()),
        ("opt_tos", "0 0".into()),
        ("opt_tos_len", format!("-1 {einval}")),
        ("opt_reuse_bound", format!("-1 {einval}")),
        ("opt_unknown", format!("-1 {enosys}")),
        ("opt_level", format!("-1 {enosys}")),
        ("resolve_route_early", format!("-1 {einval}")),
        ("resolve_addr", "0 0".into()),
        ("addr_event_poll", "1".into()),
        ("addr_event", "RDMA_CM_EVENT_ADDR_RESOLVED 0".into()),
        ("addr_event_id", "1".into()),
        ("addr_event_context", "1".into()),
        ("dst_port", "7471".into()),
        ("src_port_kept", "1".into()),
        ("local_addr", pair.addr_a.to_string()),
        ("peer_addr", pair.addr_b.to_string()),
        ("resolve_route", "0 0".into()),
        ("route_event_poll", "1".into()),
        ("route_event", "RDMA_CM_EVENT_ROUTE_RESOLVED 0".into()),
        ("num_paths", "1".into()),
        ("sgid", gid_hex(pair.addr_a)),
        ("dgid", gid_hex(pair.addr_b)),
        ("path_sgid", gid_hex(pair.addr_a)),
        ("path_dgid", gid_hex(pair.addr_b)),
        ("path_mtu", "3".into()), // IBV_MTU_1024 on a 1500-byte link
        ("port_active_mtu", "3".into()),
        ("path_pkey", "65535".into()),
        ("path_tclass", "32".into()), // the TOS set before
        ("create_qp", "0 0".into()),
        ("own_cqs", "1".into()),
        ("cqs_written_back", "1".into()),
        ("qp_state", "1".into()), // IBV_QPS_INIT
        ("qp_port", "1".into()),
        ("create_qp_twice", format!("-1 {einval}")),
        ("qp_gone", "1".into()),
        ("create_srq", "0 0".into()),
        ("srq_max_wr_ok", "1".into()),
        ("srq_has_pd", "1".into()),
        ("srq_gone", "1".into()),
        ("listen", format!("-1 {einval}")),
        ("connect", format!("-1 {einval}")),
        ("resolve_unreachable", "0 0".into()),
        ("unreachable_event_poll", "1".into()),
        (
            "unreachable_event",
            format!("RDMA_CM_EVENT_ADDR_ERROR -{}", libc::ETIMEDOUT),
        ),
        ("resolve_unroutable", format!("-1 {}", libc::ENETUNREACH)),
        ("create_sync", "0 0".into()),
        ("sync_has_channel", "1".into()),
        ("sync_resolve_addr", "0 0".into()),
        ("sync_event", "0".into()), // RDMA_CM_EVENT_ADDR_RESOLVED
        ("sync_resolve_route", "0 0".into()),
        ("sync_route_event", "2".into()), // RDMA_CM_EVENT_ROUTE_RESOLVED
        ("migrate", "0 0".into()),
        ("migrated_channel", "1".into()),
        ("destroy_sync", "0 0".into()),
        ("sync_unreachable", format!("-1 {}", libc::ETIMEDOUT)),
        ("ud_resolve_addr", "0 0".into()),
        ("ud_create_qp", "0 0".into()),
        ("ud_qp_state", "3".into()),          // IBV_QPS_RTS
        ("ud_qkey", 0x0123_4567.to_string()), // RDMA_UDP_QKEY
        ("getaddrinfo", "0 0".into()),
        ("gai_port_space", "262".into()), // RDMA_PS_TCP
        ("gai_qp_type", "2".into()),
        ("gai_family", libc::AF_INET.to_string()),
        ("gai_dst_port", "7471".into()),
        ("gai_src_null", "1".into()),
        ("getaddrinfo_passive", "0 0".into()),
        ("gai_passive_port", "7472".into()),
        ("gai_passive_dst_null", "1".into()),
        ("create_ep_passive", "0 0".into()),
        ("ep_port", "7473".into()),
        ("create_ep_active", "0 0".into()),
        ("ep_qp", "1".into()),
        ("bind6", "0 0".into()),
        ("resolve_addr6", "0 0".into()),
        ("addr6_event", "RDMA_CM_EVENT_ADDR_RESOLVED 0".into()),
        ("resolve_route6", "0 0".into()),
        ("route6_event", "RDMA_CM_EVENT_ROUTE_RESOLVED 0".into()),
        ("sgid6", ipv6_hex(&addr6_a)),
        ("dgid6", ipv6_hex(&addr6_b)),
        ("dst6_port", "7475".into()),
        ("destroy6", "0 0".into()),
        // Loopback and wildcard addresses as the kernel's cma_any_addr:
        // binding attaches no device and holds the port against every
        // address of the family (EADDRNOTAVAIL)...
        ("bind_lo", "0 0".into()),
        ("bind_lo_port_nonzero", "1".into()),
        ("bind_lo_verbs_null", "1".into()),
        ("bind_lo6", "0 0".into()),
        ("resolve_lo_other_family", format!("-1 {einval}")),
        ("bind_lo_port_taken", format!("-1 {}", libc::EADDRNOTAVAIL)),
        // ... libfabric's "localhost" endpoint binds ...
        ("gai_localhost", "0 0".into()),
        ("ep_localhost", "0 0".into()),
        ("ep_localhost_verbs_null", "1".into()),
        // ... and a loopback or wildcard destination resolves to the
        // device, from and to its own (IPv4) GID; an unbound id's source
        // becomes the loopback address.
        ("resolve_lo", "0 0".into()),
        ("lo_event", "RDMA_CM_EVENT_ADDR_RESOLVED 0".into()),
        ("lo_device", device.clone()),
        ("lo_local_addr", "127.0.0.1".into()),
        ("lo_sgid", gid_hex(pair.addr_a)),
        ("lo_dgid", gid_hex(pair.addr_a)),
        ("resolve_lo_route", "0 0".into()),
        ("lo_route", "RDMA_CM_EVENT_ROUTE_RESOLVED 0".into()),
        ("resolve_any", "0 0".into()),
        ("any_event", "RDMA_CM_EVENT_ADDR_RESOLVED 0".into()),
        ("any_device", device.clone()),
        ("any_local_addr", "127.0.0.1".into()),
        ("any_sgid", gid_hex(pair.addr_a)),
        ("any_dgid", gid_hex(pair.addr_a)),
        ("resolve_any_route", "0 0".into()),
        ("any_route", "RDMA_CM_EVENT_ROUTE_RESOLVED 0".into()),
        ("resolve_lo6", "0 0".into()),
        ("lo6_event", "RDMA_CM_EVENT_ADDR_RESOLVED 0".into()),
        ("lo6_device", device.clone()),
        ("lo6_local_addr", "::1".into()),
        ("lo6_sgid", gid_hex(pair.addr_a)),
        ("lo6_dgid", gid_hex(pair.addr_a)),
        ("resolve_lo6_route", "0 0".into()),
        ("lo6_route", "RDMA_CM_EVENT_ROUTE_RESOLVED 0".into()),
        ("resolve_lo_bound", "0 0".into()),
        ("lo_bound_event", "RDMA_CM_EVENT_ADDR_RESOLVED 0".into()),
        ("lo_bound_device", device.clone()),
        ("lo_bound_local_addr", pair.addr_a.to_string()),
        ("lo_bound_sgid", gid_hex(pair.addr_a)),
        ("lo_bound_dgid", gid_hex(pair.addr_a)),
        ("resolve_lo_bound_route", "0 0".into()),
        ("lo_bound_route", "RDMA_CM_EVENT_ROUTE_RESOLVED 0".into()),
        // A connection to 127.0.0.1 within the process carries a SEND and
        // ends with DISCONNECTED on both sides.
        ("loop_listen", "0 0".into()),
        ("loop_addr_event", "RDMA_CM_EVENT_ADDR_RESOLVED 0".into()),
        ("loop_route_event", "RDMA_CM_EVENT_ROUTE_RESOLVED 0".into()),
        ("loop_client_qp", "0 0".into()),
        ("loop_connect", "0 0".into()),
        ("loop_request", "1".into()),
        ("loop_server_qp", "0 0".into()),
        ("loop_accept", "0 0".into()),
        ("loop_established", "1".into()),
        ("loop_send_ok", "1".into()),
        ("loop_recv_ok", "1".into()),
        ("loop_disconnect", "0 0".into()),
        ("loop_server_disconnected", "1".into()),
        ("loop_server_disconnect", "0 0".into()),
        ("loop_client_disconnected", "1".into()),
        ("loop_destroy", "0 0".into()),
        ("held_event", "RDMA_CM_EVENT_ADDR_RESOLVED 0".into()),
        ("destroy_held", "0 0".into()),
        ("destroy_lost", "0 0".into()),
        ("destroy_id", "0 0".into()),
        ("done", "1".into()),
    ];
    let mut problems: Vec<String> = stdout
        .lines()
        .filter(|l| l.starts_with("loop_unexpected"))
        .map(|l| format!("an event the loopback connection did not expect: {l}"))
        .collect();
    for (key, want) in &expected {
        match got.get(*key) {
            Some(v) if v == want => {}
            Some(v) => problems.push(format!("{key}: got `{v}`, want `{want}`")),
            None => problems.push(format!("{key}: not printed (want `{want}`)")),
        }
    }
    let number = |key: &str| got.get(key).and_then(|v| v.parse::<u64>().ok());
    match number("src_port") {
        Some(p) if (u64::from(lo)..=u64::from(hi)).contains(&p) => {}
        other => problems.push(format!(
            "src_port {other:?} not in the local range {lo}..={hi}"
        )),
    }
    // The 700 ms timeout is honoured: not much sooner, not much later.
    match number("unreachable_ms") {
        Some(ms) if (650..1500).contains(&ms) => {}
        other => problems.push(format!("ADDR_ERROR after {other:?} ms, want about 700")),
    }
    // rdma_destroy_id waited for the ack 300 ms later.
    match number("destroy_waited_ms") {
        Some(ms) if (250..2000).contains(&ms) => {}
        other => problems.push(format!(
            "destroy_id returned after {other:?} ms, want about 300"
        )),
    }
    assert!(
        problems.is_empty() && out.status.success(),
        "the probe over xroce's librdmacm ({}): {} problems:\n{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status,
        problems.len(),
        problems.join("\n")
    );
}

/// rdmacm-utils' programs (Debian 12).
const RDMACM_PROGRAMS: &[&str] = &[
    "cmtime",
    "mckey",
    "rcopy",
    "rdma_client",
    "rdma_server",
    "rdma_xclient",
    "rdma_xserver",
    "riostream",
    "rping",
    "rstream",
    "ucmatose",
    "udaddy",
    "udpong",
];

#[test]
fn every_rdmacm_utils_program_loads_on_the_library() {
    require_root();
    require_debian_rdmacm();
    let _ = (ibverbs_cdylib(), rdmacm_cdylib());
    // Where `xroce run` links it (made by the first run).
    let ours = xroce_exe()
        .parent()
        .expect("xroce's directory")
        .join("lib/librdmacm.so.1");
    let mut problems = Vec::new();
    for program in RDMACM_PROGRAMS {
        assert!(
            which(program).is_some(),
            "{program} is missing: install rdmacm-utils"
        );
        // An unknown option: usage and exit, after every symbol was bound
        // (LD_BIND_NOW); `timeout` guards against one that waits instead.
        let out = xroce_run(None, &["--backend", "udp", "--"])
            .args(["timeout", "20", program, "--xroce-loading-test"])
            .env("LD_BIND_NOW", "1")
            .env("LD_DEBUG", "bindings")
            .output()
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let mut why = loader_failures(stderr.lines());
        let to_ours = format!(" to {} [", ours.display());
        let bound = stderr
            .lines()
            .filter(|l| l.contains(&to_ours) && l.contains("symbol `r"))
            .count();
        if bound == 0 {
            why.push(format!("no symbol bound to {}", ours.display()));
        }
        if let Some(l) = stderr
            .lines()
            .find(|l| l.contains("x86_64-linux-gnu/librdmacm.so"))
        {
            why.push(format!("Debian's librdmacm seen: {}", l.trim()));
        }
        match out.status.code() {
            None => why.push(format!("killed: {}", out.status)),
            Some(124) => why.push("still running after 20 s".into()),
            Some(127) => why.push("exit status 127".into()),
            Some(_) => {}
        }
        if !why.is_empty() {
            problems.push(format!("{program} ({}): {}", out.status, why.join("; ")));
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {} rdmacm-utils programs did not start on xroce's librdmacm:\n{}",
        problems.len(),
        RDMACM_PROGRAMS.len(),
        problems.join("\n")
    );
}
