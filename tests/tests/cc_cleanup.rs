//! Ctrl-C in the middle of an experiment: the receiver and senders are
//! ended, and the namespaces, bridge, veths and XDP pins are removed.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use xroce_tests::{
    experiment::{leftovers, processes_mentioning},
    require_root, workspace_bin,
};

#[test]
fn interrupted_experiment_ends_its_processes_and_removes_its_namespaces() {
    require_root();
    let dir = std::env::temp_dir().join(format!("xroce-cc-cleanup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut child = Command::new(workspace_bin("xroce"))
        .args(["experiment", "incast", "--senders", "2", "--cc", "dcqcn"])
        .args(["--link-rate", "200mbit", "--duration", "60", "--out"])
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start xroce experiment");
    let pid = child.id();
    let needle = dir.to_string_lossy().into_owned();
    // Running: queue.csv is being written and both senders are up (their
    // --trace paths name the folder, as does the experiment's --out).
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(dir.join("queue.csv").exists() && processes_mentioning(&needle).len() >= 3) {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "the experiment ended ({status}) before it ran: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(
            Instant::now() < deadline,
            "the experiment did not start its senders within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (netns, _) = leftovers(pid);
    assert!(
        netns.len() >= 4,
        "bridge, receiver and 2 senders: {netns:?}"
    );
    std::thread::sleep(Duration::from_millis(500));

    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the experiment did not end within 20 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "an interrupted run reports failure");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let (netns, pins) = leftovers(pid);
    assert!(netns.is_empty(), "namespaces left behind: {netns:?}");
    assert!(pins.is_empty(), "XDP pins left behind: {pins:?}");
    let procs = processes_mentioning(&needle);
    assert!(procs.is_empty(), "processes left running: {procs:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
