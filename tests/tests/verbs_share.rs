//! Sharing a device context through the C ABI, as rdma-core documents it:
//! `context->cmd_fd` and `async_fd` are real descriptors (dup, fstat,
//! poll); `ibv_import_device` on a dup of `cmd_fd`, then `ibv_import_pd`
//! and `ibv_import_mr`, give copies of the same objects (same handles and
//! keys; an RDMA WRITE reads the imported MR), with rdma-core's errnos for
//! foreign fds and handles; `ibv_rereg_mr` changes translation (new keys:
//! the old rkey is refused, the new one reaches the new buffer), access
//! (same keys, refused without remote write, accepted with it) and PD,
//! with rdma-core's return codes and errnos for bad input.
//!
//! One C program (tests/c/verbs_share_probe.c) under `xroce run` in a
//! namespace, two RC QPs of its device connected to each other.

use std::collections::BTreeMap;

use xroce_tests::{require_root, verbs::run_verbs_probe};

#[test]
fn contexts_pds_and_mrs_are_shared_and_mrs_reregistered() {
    require_root();
    let out = run_verbs_probe("verbs_share_probe", true, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (einval, enoent, enodev, eopnotsupp) =
        (libc::EINVAL, libc::ENOENT, libc::ENODEV, libc::EOPNOTSUPP);
    // IBV_WC_SUCCESS 0, IBV_WC_REM_ACCESS_ERR 10; IBV_REREG_MR_ERR_INPUT
    // -1, IBV_REREG_MR_ERR_CMD -4.
    let expected: Vec<(&str, String)> = vec![
        ("dup_cmd_fd", "1".into()),
        ("dup_async_fd", "1".into()),
        ("cmd_dup_same_inode", "1".into()),
        ("other_ctx_same_inode", "0".into()),
        // cmd_fd always ready (as the uverbs device), no async event yet.
        ("poll", "1 1 0".into()),
        ("import_device_pipe", format!("0 {einval}")),
        ("import_device_chardev", format!("0 {enodev}")),
        ("import_device_closed", format!("0 {einval}")),
        ("import_device", "1".into()),
        ("imported_fds", "1 1".into()),
        ("import_pd_unknown", format!("0 {enoent}")),
        ("import_pd_of_mr", format!("0 {einval}")),
        ("import_pd_other_ctx", format!("0 {enoent}")),
        ("import_pd", "1 1".into()),
        ("import_mr_of_pd", format!("0 {einval}")),
        ("import_mr", "1".into()),
        ("imported_mr", "1 1 1 1".into()),
        ("connect", "0 0".into()),
        ("write_imported", "0 1".into()),
        ("rereg_bad_flag", format!("-1 {einval}")),
        ("rereg_translation_null", format!("-1 {einval}")),
        ("rereg_access_without_flag", format!("-1 {einval}")),
        ("rereg_imported", format!("-1 {einval}")),
        ("rereg_no_change", format!("-4 {einval}")),
        ("rereg_remote_without_local", format!("-4 {einval}")),
        ("rereg_odp", format!("-4 {eopnotsupp}")),
        ("rereg_pd_of_other_ctx", format!("-4 {einval}")),
        ("after_failures", "1".into()),
        ("rereg_translation", "0 0".into()),
        ("translated", "1 1 1".into()),
        ("write_new_key", "0 1".into()),
        ("write_old_key", "10".into()),
        ("rereg_local_only", "0 0".into()),
        ("access_keeps_keys", "1".into()),
        ("reconnect", "0 0".into()),
        ("write_without_access", "10".into()),
        ("rereg_remote_again", "0 0".into()),
        ("reconnect_again", "0 0".into()),
        ("write_with_access", "0 1".into()),
        ("reg_readonly_for_write", format!("0 {}", libc::EFAULT)),
        ("reg_readonly_for_read", "1".into()),
        ("reg_prot_none", format!("0 {}", libc::EFAULT)),
        ("dereg", "0 0".into()),
        ("dealloc", "0 0".into()),
        ("close_imported", "0".into()),
        ("dup_closed", format!("-1 {}", libc::EBADF)),
        ("close", "0 0".into()),
        ("done", "1".into()),
    ];
    let got: BTreeMap<&str, &str> = stdout.lines().filter_map(|l| l.split_once(' ')).collect();
    let wrong: Vec<String> = expected
        .iter()
        .filter(|(k, v)| got.get(k) != Some(&v.as_str()))
        .map(|(k, v)| format!("{k}: want `{v}`, got {:?}", got.get(k)))
        .collect();
    assert!(
        wrong.is_empty() && out.status.success(),
        "the sharing probe ({}):\n{}\n--- stdout\n{stdout}--- stderr\n{stderr}",
        out.status,
        wrong.join("\n")
    );
}
