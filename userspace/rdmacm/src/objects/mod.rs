//! Layer 2: what the kernel's rdma_cm and ib_cm keep and do for a
//! process: the devices, each device's CM agent, event channels, ids,
//! bindings, listens and connections, and what the agents' events and an
//! id's destroy do to them. Imports `base` and `abi` only; the calls
//! (layer 3, `entry`) drive these objects.

pub(crate) mod address;
pub(crate) mod agent;
pub(crate) mod channel;
pub(crate) mod cm_events;
pub(crate) mod conn;
pub(crate) mod connect;
pub(crate) mod devices;
pub(crate) mod id;
pub(crate) mod listen;
pub(crate) mod ports;
pub(crate) mod route;
pub(crate) mod teardown;
