//! What `workload` and `collective --background` share: flow sizes from
//! a measured distribution (cdf.rs), the seeded flows and their data
//! pattern (flows.rs), and the per-namespace processes that send and
//! receive them over xroce, checking every byte (node.rs).

pub mod cdf;
pub mod flows;
pub mod node;
