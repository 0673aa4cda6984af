//! Helpers for end-to-end tests: network namespaces, veth pairs, processes.
