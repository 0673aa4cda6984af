//! At exit, the connections a program leaves open end as the kernel ends
//! them when the process's rdma_cm file closes (DREQ, DREP or REJ:
//! [`crate::objects::teardown::end_connections_at_exit`]), and the MADs a program's
//! last calls queued still leave: the DREQ of rdma_disconnect, the DREP or
//! REJ of rdma_destroy_id. The kernel's rdma_cm sends those after the
//! process is gone; here the process must, or its peers wait through
//! every CM retry (ucmatose's and rping's servers waited a minute for the
//! DREP of a client that had exited; a client that disconnected at once
//! sent DREQ after DREQ to a server that had exited with its connection
//! open).

use std::time::{Duration, Instant};

/// The most the library's destructor waits for the agents to take in
/// what arrived (an RTU behind the data the program got last).
const EXIT_CATCH_UP: Duration = Duration::from_millis(50);
/// The most the library's destructor waits for the ids' locks.
const EXIT_END: Duration = Duration::from_millis(100);
/// The most the library's destructor waits for all agents.
const EXIT_FLUSH: Duration = Duration::from_millis(500);

/// Runs when the library is unloaded (exit or dlclose), before
/// libibverbs' own destructors (this library depends on it), while the
/// agents' and the device's threads still run.
extern "C" fn flush_at_exit() {
    if !crate::objects::agent::running_here() {
        return;
    }
    crate::objects::agent::catch_up_all(EXIT_CATCH_UP);
    crate::objects::teardown::end_connections_at_exit(Instant::now() + EXIT_END);
    crate::objects::agent::flush_all(EXIT_FLUSH);
}

// A function pointer in .fini_array is how an
// ELF shared object asks the dynamic linker to call it at unload.
#[used]
#[link_section = ".fini_array"]
static FLUSH_AT_EXIT: extern "C" fn() = flush_at_exit;
