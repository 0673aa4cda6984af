//! The ABI of xroce's drop-in `libibverbs.so.1` against Debian's rdma-core 44:
//!
//! - layout: size, alignment and the offset and size of every field of the
//!   structs the library fills or reads, as the C compiler sees them in
//!   `<infiniband/verbs.h>` and as Rust sees `userspace/cabi/src/verbs.rs`;
//! - exports: SONAME, every symbol at its default version and, beyond
//!   rdma-core's, only xroce's own node `XROCE_PRIVATE_1`; `dlvsym`, and
//!   `dlsym` for the private names;
//! - loading: the unmodified Debian programs start on it (BIND_NOW), and
//!   `ibv_devices` / `ibv_devinfo -v` show an interface as rxe would.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::CString,
    fmt::Write as _,
    mem::{align_of, offset_of, size_of},
    path::Path,
    process::{Command, Output},
};

use xroce_cabi::verbs as abi;
use xroce_tests::{
    in_netns, require_root, run,
    verbs::{
        default_versioned_exports, dynamic_symbols, exports_list, ibverbs_cdylib,
        layout_mismatches, loader_failures, require_debian_verbs, require_verbs_header, soname,
        xroce_exe, xroce_run, DEBIAN_LIBIBVERBS, PROGRAMS,
    },
    VethPair,
};

// ---------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------

/// One struct as Rust lays it out, with the C names to print for it.
struct StructLayout {
    /// `struct ibv_wc`.
    c_type: String,
    size: usize,
    align: usize,
    fields: Vec<FieldLayout>,
}

struct FieldLayout {
    /// The member designator in C (`wr.rdma.remote_addr`, `imm_data`).
    c: String,
    offset: usize,
    size: usize,
}

/// Size of the field a (never called) projection points at.
fn field_size<S, F>(_project: fn(*const S) -> *const F) -> usize {
    size_of::<F>()
}

/// Offset and size of one field. The C designator is used on the Rust side
/// too unless `=> rust.path` gives bindgen's name (anonymous unions become
/// `__bindgen_anon_N`, `priv` becomes `priv_`).
macro_rules! rust_field {
    ($s:ident; $($c:ident).+;) => {
        rust_field!(@ $s; $($c).+)
    };
    ($s:ident; $($c:ident).+; $($r:ident).+) => {
        rust_field!(@ $s; $($r).+)
    };
    (@ $s:ident; $($p:ident).+) => {
        (
            offset_of!(abi::$s, $($p).+),
            // SAFETY: the closure is never called; only its type is used.
            field_size::<abi::$s, _>(|p| unsafe { core::ptr::addr_of!((*p).$($p).+) }),
        )
    };
}

/// The single list both sides come from: each `KIND NAME { FIELD, ... }`
/// makes the C program print and Rust compute the same entries, so no field
/// can be checked on one side only.
macro_rules! abi_layout {
    ($( $kind:ident $s:ident { $( $($c:ident).+ $(=> $($r:ident).+)? ),* $(,)? } )*) => {
        vec![$(
            StructLayout {
                c_type: format!("{} {}", stringify!($kind), stringify!($s)),
                size: size_of::<abi::$s>(),
                align: align_of::<abi::$s>(),
                fields: vec![$(
                    {
                        let (offset, size) = rust_field!($s; $($c).+; $($($r).+)?);
                        FieldLayout {
                            c: stringify!($($c).+).replace(' ', ""),
                            offset,
                            size,
                        }
                    }
                ),*],
            }
        ),*]
    };
}

fn layouts() -> Vec<StructLayout> {
    abi_layout! {
        struct ibv_device {
            _ops, _ops._dummy1, _ops._dummy2, node_type, transport_type, name, dev_name,
            dev_path, ibdev_path,
        }
        struct ibv_context {
            device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat,
        }
        struct ibv_context_ops {
            _compat_query_device, _compat_query_port, _compat_alloc_pd, _compat_dealloc_pd,
            _compat_reg_mr, _compat_rereg_mr, _compat_dereg_mr, alloc_mw, bind_mw, dealloc_mw,
            _compat_create_cq, poll_cq, req_notify_cq, _compat_cq_event, _compat_resize_cq,
            _compat_destroy_cq, _compat_create_srq, _compat_modify_srq, _compat_query_srq,
            _compat_destroy_srq, post_srq_recv, _compat_create_qp, _compat_query_qp,
            _compat_modify_qp, _compat_destroy_qp, post_send, post_recv, _compat_create_ah,
            _compat_destroy_ah, _compat_attach_mcast, _compat_detach_mcast, _compat_async_event,
        }
        struct verbs_context {
            query_port, advise_mr, alloc_null_mr, read_counters, attach_counters_point_flow,
            create_counters, destroy_counters, reg_dm_mr, alloc_dm, free_dm,
            modify_flow_action_esp, destroy_flow_action, create_flow_action_esp,
            modify_qp_rate_limit, alloc_parent_domain, dealloc_td, alloc_td, modify_cq,
            post_srq_ops, destroy_rwq_ind_table, create_rwq_ind_table, destroy_wq, modify_wq,
            create_wq, query_rt_values, create_cq_ex, priv => priv_, query_device_ex,
            ibv_destroy_flow, ABI_placeholder2, ibv_create_flow, ABI_placeholder1, open_qp,
            create_qp_ex, get_srq_num, create_srq_ex, open_xrcd, close_xrcd, _ABI_placeholder3,
            sz, context, context.abi_compat,
        }
        struct ibv_pd { context, handle }
        struct ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        struct ibv_cq {
            context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed,
        }
        struct ibv_cq_ex {
            context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed, comp_mask, status, wr_id, start_poll, next_poll, end_poll,
            read_opcode, read_vendor_err, read_byte_len, read_imm_data, read_qp_num,
            read_src_qp, read_wc_flags, read_slid, read_sl, read_dlid_path_bits,
            read_completion_ts, read_cvlan, read_flow_tag, read_tm_info,
            read_completion_wallclock_ns,
        }
        struct ibv_qp {
            context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type,
            mutex, cond, events_completed,
        }
        struct ibv_qp_ex {
            qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_atomic_fetch_add,
            wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write, wr_rdma_write_imm, wr_send,
            wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr, wr_set_xrc_srqn,
            wr_set_inline_data, wr_set_inline_data_list, wr_set_sge, wr_set_sge_list, wr_start,
            wr_complete, wr_abort, wr_atomic_write,
        }
        struct ibv_srq {
            context, srq_context, pd, handle, mutex, cond, events_completed,
        }
        struct ibv_comp_channel { context, fd, refcnt }
        struct ibv_wc {
            wr_id, status, opcode, vendor_err, byte_len,
            imm_data => __bindgen_anon_1.imm_data,
            invalidated_rkey => __bindgen_anon_1.invalidated_rkey,
            qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits,
        }
        struct ibv_send_wr {
            wr_id, next, sg_list, num_sge, opcode, send_flags,
            imm_data => __bindgen_anon_1.imm_data,
            invalidate_rkey => __bindgen_anon_1.invalidate_rkey,
            wr, wr.rdma, wr.rdma.remote_addr, wr.rdma.rkey,
            wr.atomic, wr.atomic.remote_addr, wr.atomic.compare_add, wr.atomic.swap,
            wr.atomic.rkey,
            wr.ud, wr.ud.ah, wr.ud.remote_qpn, wr.ud.remote_qkey,
            qp_type, qp_type.xrc, qp_type.xrc.remote_srqn,
            bind_mw => __bindgen_anon_2.bind_mw,
            bind_mw.mw => __bindgen_anon_2.bind_mw.mw,
            bind_mw.rkey => __bindgen_anon_2.bind_mw.rkey,
            bind_mw.bind_info => __bindgen_anon_2.bind_mw.bind_info,
            tso => __bindgen_anon_2.tso,
            tso.hdr => __bindgen_anon_2.tso.hdr,
            tso.hdr_sz => __bindgen_anon_2.tso.hdr_sz,
            tso.mss => __bindgen_anon_2.tso.mss,
        }
        struct ibv_recv_wr { wr_id, next, sg_list, num_sge }
        struct ibv_sge { addr, length, lkey }
        struct ibv_ah { context, pd, handle }
        struct ibv_port_attr {
            state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz,
            bad_pkey_cntr, qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl,
            subnet_timeout, init_type_reply, active_width, active_speed, phys_state,
            link_layer, flags, port_cap_flags2,
        }
        struct ibv_device_attr {
            fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
            vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
            max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
            max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
            max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
            max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
            max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt,
        }
        struct ibv_device_attr_ex {
            orig_attr, comp_mask,
            odp_caps, odp_caps.general_caps, odp_caps.per_transport_caps,
            odp_caps.per_transport_caps.rc_odp_caps, odp_caps.per_transport_caps.uc_odp_caps,
            odp_caps.per_transport_caps.ud_odp_caps,
            completion_timestamp_mask, hca_core_clock, device_cap_flags_ex,
            tso_caps, tso_caps.max_tso, tso_caps.supported_qpts,
            rss_caps, rss_caps.supported_qpts, rss_caps.max_rwq_indirection_tables,
            rss_caps.max_rwq_indirection_table_size, rss_caps.rx_hash_fields_mask,
            rss_caps.rx_hash_function,
            max_wq_type_rq,
            packet_pacing_caps, packet_pacing_caps.qp_rate_limit_min,
            packet_pacing_caps.qp_rate_limit_max, packet_pacing_caps.supported_qpts,
            raw_packet_caps,
            tm_caps, tm_caps.max_rndv_hdr_size, tm_caps.max_num_tags, tm_caps.flags,
            tm_caps.max_ops, tm_caps.max_sge,
            cq_mod_caps, cq_mod_caps.max_cq_count, cq_mod_caps.max_cq_period,
            max_dm_size,
            pci_atomic_caps, pci_atomic_caps.fetch_add, pci_atomic_caps.swap,
            pci_atomic_caps.compare_swap,
            xrc_odp_caps, phys_port_cnt_ex,
        }
        struct ibv_query_device_ex_input { comp_mask }
        struct ibv_qp_attr {
            qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn,
            dest_qp_num, qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index,
            alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic,
            max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry,
            alt_port_num, alt_timeout, rate_limit,
        }
        struct ibv_qp_cap {
            max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data,
        }
        struct ibv_qp_init_attr {
            qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all,
        }
        struct ibv_qp_init_attr_ex {
            qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd,
            create_flags, max_tso_header, rwq_ind_tbl,
            rx_hash_conf, rx_hash_conf.rx_hash_function, rx_hash_conf.rx_hash_key_len,
            rx_hash_conf.rx_hash_key, rx_hash_conf.rx_hash_fields_mask,
            source_qpn, send_ops_flags,
        }
        struct ibv_ah_attr {
            grh, dlid, sl, src_path_bits, static_rate, is_global, port_num,
        }
        struct ibv_global_route {
            dgid, dgid.raw, dgid.global, dgid.global.subnet_prefix, dgid.global.interface_id,
            flow_label, sgid_index, hop_limit, traffic_class,
        }
        union ibv_gid { raw, global, global.subnet_prefix, global.interface_id }
        struct ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
        struct ibv_async_event {
            element, element.cq, element.qp, element.srq, element.wq, element.port_num,
            event_type,
        }
        struct ibv_cq_init_attr_ex {
            cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain,
        }
        struct ibv_srq_init_attr {
            srq_context, attr, attr.max_wr, attr.max_sge, attr.srq_limit,
        }
        struct ibv_srq_init_attr_ex {
            srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap,
            tm_cap.max_num_tags, tm_cap.max_ops,
        }
        struct ibv_srq_attr { max_wr, max_sge, srq_limit }
    }
}

/// `key value...` lines for every struct and field, as Rust sees them.
fn rust_layout(layouts: &[StructLayout]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for s in layouts {
        out.insert(
            s.c_type.clone(),
            format!("size {} align {}", s.size, s.align),
        );
        for f in &s.fields {
            out.insert(
                format!("{}.{}", s.c_type, f.c),
                format!("offset {} size {}", f.offset, f.size),
            );
        }
    }
    out
}

/// A C program printing the same `key value...` lines from the header.
fn c_program(layouts: &[StructLayout]) -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n\n\
         int main(void)\n{\n",
    );
    for s in layouts {
        let t = &s.c_type;
        writeln!(
            c,
            "\tprintf(\"%s\\tsize %zu align %zu\\n\", \"{t}\", sizeof({t}), _Alignof({t}));"
        )
        .unwrap();
        for f in &s.fields {
            let d = &f.c;
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
fn struct_layout_matches_the_c_header() {
    require_verbs_header();
    let layouts = layouts();
    let dir = std::env::temp_dir().join(format!("xroce-verbs-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c_program(&layouts)).unwrap();
    let compiled = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run cc (install gcc: cargo xtask setup does)");
    if !compiled.status.success() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(
        compiled.status.success(),
        "cc rejected the layout program ({}): a field in the list is not in {}:\n{}",
        src.display(),
        xroce_tests::verbs::VERBS_H,
        String::from_utf8_lossy(&compiled.stderr)
    );
    let out = run(&mut Command::new(&exe));
    let _ = std::fs::remove_dir_all(&dir);
    let mismatches = layout_mismatches(&out.stdout, &rust_layout(&layouts));
    let fields: usize = layouts.iter().map(|s| s.fields.len()).sum();
    eprintln!(
        "checked {} structs and {fields} fields against {}",
        layouts.len(),
        xroce_tests::verbs::VERBS_H
    );
    assert!(
        mismatches.is_empty(),
        "{} layout mismatches between <infiniband/verbs.h> and userspace/cabi/src/verbs.rs:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

// ---------------------------------------------------------------------------
// Exports
// ---------------------------------------------------------------------------

/// xroce's own version node (`xroce_create_gsi_qp`, for xroce's librdmacm).
const XROCE_PRIVATE_NODE: &str = "XROCE_PRIVATE_1";

#[test]
fn exports_match_rdma_core() {
    require_debian_verbs();
    let lib = ibverbs_cdylib();
    let mut problems = Vec::new();

    match soname(&lib) {
        Some(s) if s == "libibverbs.so.1" => {}
        other => problems.push(format!("SONAME is {other:?}, not libibverbs.so.1")),
    }

    let ours = default_versioned_exports(&lib);
    let all_ours = dynamic_symbols(&lib);
    let listed = exports_list();
    for (name, node) in &listed {
        if !ours.contains(&(name.clone(), node.clone())) {
            let seen: Vec<String> = all_ours
                .iter()
                .filter(|s| &s.name == name)
                .map(|s| {
                    format!(
                        "{}{}{}",
                        if s.defined { "" } else { "undefined " },
                        if s.default { "@@" } else { "@" },
                        s.version
                    )
                })
                .collect();
            problems.push(format!(
                "exports.txt: {name}@@{node} is not exported (seen: {})",
                if seen.is_empty() {
                    "nothing".to_string()
                } else {
                    seen.join(", ")
                }
            ));
        }
    }

    let debian = default_versioned_exports(Path::new(DEBIAN_LIBIBVERBS));
    assert!(
        debian.len() > 100,
        "read only {} symbols from {DEBIAN_LIBIBVERBS}",
        debian.len()
    );
    for (name, node) in debian.difference(&ours) {
        problems.push(format!(
            "{DEBIAN_LIBIBVERBS} exports {name}@@{node}; ours does not"
        ));
    }
    // exports.txt is rdma-core's list exactly, plus xroce's own node; the
    // library exports nothing else.
    let (private, rdma_core): (BTreeSet<_>, BTreeSet<_>) = listed
        .iter()
        .cloned()
        .partition(|(_, node)| node == XROCE_PRIVATE_NODE);
    for (name, node) in rdma_core.symmetric_difference(&debian) {
        problems.push(format!(
            "exports.txt and {DEBIAN_LIBIBVERBS} differ on {name}@@{node}"
        ));
    }
    for (name, node) in ours.difference(&debian) {
        if !private.contains(&(name.clone(), node.clone())) {
            problems.push(format!(
                "exports {name}@@{node}, neither rdma-core's nor listed at {XROCE_PRIVATE_NODE}"
            ));
        }
    }
    for (name, _) in &private {
        if debian.iter().any(|(n, _)| n == name) {
            problems.push(format!(
                "{name} is rdma-core's, not xroce's own ({XROCE_PRIVATE_NODE})"
            ));
        }
    }

    // What dlopen + dlvsym users (NCCL) see.
    let path = CString::new(lib.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; the library is only looked into
    // (its functions are never called).
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen {}: {}", lib.display(), dlerror());
    let lookup = |name: &str, node: &str| {
        let n = CString::new(name).unwrap();
        let v = CString::new(node).unwrap();
        // SAFETY: a live handle and NUL-terminated strings; dlvsym only
        // reads them.
        !unsafe { libc::dlvsym(handle, n.as_ptr(), v.as_ptr()) }.is_null()
    };
    if !lookup("ibv_get_device_list", "IBVERBS_1.1") {
        problems.push("dlvsym(h, \"ibv_get_device_list\", \"IBVERBS_1.1\") is NULL".into());
    }
    for (name, node) in &listed {
        if !lookup(name, node) {
            problems.push(format!("dlvsym(h, {name:?}, {node:?}) is NULL"));
        }
    }
    // xroce's librdmacm finds its private entry points by name alone.
    for (name, _) in &private {
        let n = CString::new(name.as_str()).unwrap();
        // SAFETY: a live handle and a NUL-terminated string.
        if unsafe { libc::dlsym(handle, n.as_ptr()) }.is_null() {
            problems.push(format!("dlsym(h, {name:?}) is NULL"));
        }
    }
    // The library stays loaded (never dlclose'd): unloading a Rust cdylib
    // buys nothing here and the test process ends soon.

    eprintln!(
        "checked {} listed and {} Debian exports of {}",
        listed.len(),
        debian.len(),
        lib.display()
    );
    assert!(
        problems.is_empty(),
        "{} export problems in {}:\n{}",
        problems.len(),
        lib.display(),
        problems.join("\n")
    );
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until
    // the next dl* call on this thread.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown error".into()
        } else {
            std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

// ---------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The lines of `stderr` that LD_DEBUG did not write (`  PID:\t...`).
fn without_ld_debug(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            let digits = t.bytes().take_while(u8::is_ascii_digit).count();
            !(digits > 0 && t[digits..].starts_with(':'))
        })
        .filter(|l| !l.trim().is_empty())
        .collect()
}

#[test]
fn every_program_starts_on_the_library() {
    require_root();
    require_debian_verbs();
    let lib = ibverbs_cdylib();
    // Where `xroce run` puts its libibverbs.so.1 (next to the executable).
    let expected = xroce_exe()
        .parent()
        .expect("xroce's directory")
        .join("lib/libibverbs.so.1");
    let mut problems = Vec::new();
    for program in PROGRAMS {
        // Usage and exit, without touching a device: perftest knows --help;
        // ibv_devinfo and the pingpongs print usage for an unknown option;
        // ibv_devices takes no options and only lists the devices.
        let help = if program.starts_with("ib_") {
            "--help"
        } else {
            "--xroce-loading-test"
        };
        let out = xroce_run(None, &["--backend", "udp", "--", program, help])
            .env("LD_BIND_NOW", "1")
            .env("LD_DEBUG", "libs,bindings")
            .output()
            .unwrap_or_else(|e| panic!("run xroce run -- {program}: {e}"));
        let (stdout, stderr) = text(&out);
        let program_stderr = without_ld_debug(&stderr);
        let mut why = loader_failures(program_stderr.iter().copied());
        if out.status.code().is_none() {
            why.push(format!("killed: {}", out.status));
        }
        if out.status.code() == Some(127) {
            why.push("exit status 127 (the loader's or xroce run's \"not found\")".into());
        }
        // LD_DEBUG=libs,bindings: `trying file=PATH` while searching, then
        // `binding file PROG [0] to LIB [0]: normal symbol `NAME' [NODE]`.
        let expected_to = format!(" to {} [", expected.display());
        let bound: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains(&expected_to) && l.contains("symbol `ibv_"))
            .collect();
        let debian: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("x86_64-linux-gnu/libibverbs.so"))
            .collect();
        if bound.is_empty() || !debian.is_empty() {
            why.push(format!(
                "the loader did not bind to {} alone: {} ibv_* bindings to it; Debian's \
                 library seen: {}",
                expected.display(),
                bound.len(),
                debian.first().map_or("no", |l| l.trim())
            ));
        }
        if !why.is_empty() {
            problems.push(format!(
                "{program} ({}): {}\n  stderr: {}\n  stdout: {}",
                out.status,
                why.join("; "),
                program_stderr.join(" | "),
                stdout.lines().take(2).collect::<Vec<_>>().join(" | ")
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {} programs did not start on {}:\n{}",
        problems.len(),
        PROGRAMS.len(),
        lib.display(),
        problems.join("\n")
    );
}

/// Node GUID rxe derives from a MAC (modified EUI-64), as ibv_devices
/// prints it.
fn guid_from_mac(mac: [u8; 6]) -> String {
    format!(
        "{:02x}{:02x}{:02x}fffe{:02x}{:02x}{:02x}",
        mac[0] ^ 2,
        mac[1],
        mac[2],
        mac[3],
        mac[4],
        mac[5]
    )
}

/// The lines of `text` as their whitespace-separated words.
fn words(text: &str) -> Vec<Vec<&str>> {
    text.lines()
        .map(|l| l.split_whitespace().collect())
        .collect()
}

/// The `enum ibv_mtu` value ibv_devinfo prints after an MTU.
fn mtu_enum(mtu: u32) -> u32 {
    match mtu {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        4096 => 5,
        other => panic!("not an IB MTU: {other}"),
    }
}

#[test]
fn devices_and_ports_look_like_rxe() {
    require_root();
    require_debian_verbs();
    ibverbs_cdylib();
    // 3000 bytes: active_mtu 2048, so a hard-coded 1024 would show.
    let if_mtu = 3000;
    let pair = VethPair::new(if_mtu);
    let iface = pair.if_a.clone();
    let (mac, mtu) = {
        let iface = iface.clone();
        in_netns(&pair.a.name, move || {
            (
                xroce::device::interface_mac(&iface).expect("MAC"),
                xroce::device::interface_mtu(&iface).expect("MTU"),
            )
        })
    };
    assert_eq!(mtu, if_mtu);
    let device = format!("xroce_{iface}");
    let guid = guid_from_mac(mac);
    let args = ["--backend", "udp", "--iface", iface.as_str(), "--"];
    let mut problems = Vec::new();

    // ibv_devices: "    NAME\tGUID" under a header.
    let mut cmd = xroce_run(Some(&pair.a), &args);
    let out = cmd.arg("ibv_devices").output().expect("run ibv_devices");
    let (stdout, stderr) = text(&out);
    let listed = words(&stdout)
        .into_iter()
        .any(|w| w.len() == 2 && w[0] == device && w[1] == guid);
    if !out.status.success() || !listed {
        problems.push(format!(
            "ibv_devices ({}) should list `{device}  {guid}` (node GUID from MAC {}):\n{stdout}{stderr}",
            out.status,
            mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
        ));
    }

    // ibv_devinfo -v: rdma-core 44's devinfo.c formatting, as for rxe.
    let mut cmd = xroce_run(Some(&pair.a), &args);
    let out = cmd
        .args(["ibv_devinfo", "-v", "-d", &device])
        .output()
        .expect("run ibv_devinfo");
    let (stdout, stderr) = text(&out);
    let lines = words(&stdout);
    let active = xroce::device::path_mtu_for(if_mtu).expect("path MTU");
    let node_guid = format!(
        "{}:{}:{}:{}",
        &guid[0..4],
        &guid[4..8],
        &guid[8..12],
        &guid[12..16]
    );
    let gid = format!("::ffff:{}", pair.addr_a);
    let expected: Vec<(String, Vec<String>)> = vec![
        ("hca_id".into(), vec!["hca_id:".into(), device.clone()]),
        ("node_guid".into(), vec!["node_guid:".into(), node_guid]),
        (
            "port state".into(),
            vec!["state:".into(), "PORT_ACTIVE".into(), "(4)".into()],
        ),
        (
            "active_mtu".into(),
            vec![
                "active_mtu:".into(),
                active.to_string(),
                format!("({})", mtu_enum(active)),
            ],
        ),
        (
            "link_layer".into(),
            vec!["link_layer:".into(), "Ethernet".into()],
        ),
        (
            "GID[1]".into(),
            vec![
                "GID[".into(),
                "1]:".into(),
                format!("{gid},"),
                "RoCE".into(),
                "v2".into(),
            ],
        ),
    ];
    let mut missing = Vec::new();
    for (what, want) in &expected {
        if !lines.iter().any(|l| l == want) {
            missing.push(format!("{what} (`{}`)", want.join(" ")));
        }
    }
    if !out.status.success() || !missing.is_empty() {
        problems.push(format!(
            "ibv_devinfo -v ({}) lacks: {}\n{stdout}{stderr}",
            out.status,
            missing.join(", ")
        ));
    }
    assert!(
        problems.is_empty(),
        "{} on {iface} (MTU {if_mtu}, {}) through `xroce run`:\n{}",
        if problems.len() == 1 {
            "one check failed"
        } else {
            "checks failed"
        },
        pair.addr_a,
        problems.join("\n\n")
    );
}

/// `xroce run`'s own errors, which need no library behaviour: they are
/// what a user sees first.
#[test]
fn xroce_run_explains_what_is_wrong() {
    require_root();
    let pair = VethPair::new(1500);
    // An interface without an IPv4 address, in the same namespace.
    pair.a.exec(&["ip", "addr", "flush", "dev", &pair.if_a]);
    let cases: Vec<(Vec<String>, i32, String)> = vec![
        (
            vec!["--".into(), "xroce-no-such-program".into()],
            127,
            "xroce run: xroce-no-such-program: not found".into(),
        ),
        (
            vec![
                "--iface".into(),
                "xrnosuch0".into(),
                "--".into(),
                "true".into(),
            ],
            1,
            "xrnosuch0 does not exist".into(),
        ),
        (
            vec![
                "--backend".into(),
                "udp".into(),
                "--iface".into(),
                pair.if_a.clone(),
                "--".into(),
                "true".into(),
            ],
            1,
            format!("interface {} has no IPv4 address", pair.if_a),
        ),
    ];
    let mut problems = Vec::new();
    for (args, status, message) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = xroce_run(Some(&pair.a), &args)
            // Whatever the library's state, these fail before it matters.
            .env("XROCE_LIB_DIR", "/usr/lib/x86_64-linux-gnu")
            .output()
            .expect("run xroce run");
        let (_, stderr) = text(&out);
        if out.status.code() != Some(*status) || !stderr.contains(message.as_str()) {
            problems.push(format!(
                "xroce run {}: want status {status} and `{message}`, got {}: {}",
                args.join(" "),
                out.status,
                stderr.trim()
            ));
        }
    }
    // Exit status, PID and environment are the program's own (exec).
    let out = xroce_run(
        Some(&pair.b),
        &[
            "--backend",
            "udp",
            "--iface",
            &pair.if_b,
            "--cc",
            "dcqcn",
            "--",
            "sh",
            "-c",
            "echo \"$XROCE_IFACES $XROCE_BACKEND $XROCE_CC $LD_LIBRARY_PATH\"; exit 42",
        ],
    )
    .env("XROCE_LIB_DIR", "/usr/lib/x86_64-linux-gnu")
    .env("LD_LIBRARY_PATH", "/xroce-test-previous")
    .output()
    .expect("run xroce run sh");
    let (stdout, stderr) = text(&out);
    let want = format!(
        "{} udp dcqcn /usr/lib/x86_64-linux-gnu:/xroce-test-previous",
        pair.if_b
    );
    if out.status.code() != Some(42) || stdout.trim() != want {
        problems.push(format!(
            "xroce run -- sh: want status 42 and `{want}`, got {}: {stdout}{stderr}",
            out.status
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
