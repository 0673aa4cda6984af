//! RoCEv2 wire codec. `no_std`, no allocation, no I/O.
#![no_std]
