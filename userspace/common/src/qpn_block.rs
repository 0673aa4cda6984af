//! How the processes sharing one xroce device split its QPN space, and how
//! a frame finds the process that owns its destination QP.
//!
//! Each process holds one block of QPNs: block `b` is the 65,536 QPNs whose
//! top 8 bits are `b` (256 blocks in the 24-bit QPN space). The process of
//! block `b` receives on UDP port [`udp_port`]`(b)`: 4791 for block 0, so one
//! process alone on a device is exactly what RoCEv2 expects, and
//! [`PORT_BASE`]` + b` for the others. The XDP program sends a frame for
//! block `b` to the AF_XDP socket when the AF_XDP owner holds `b`, and
//! otherwise rewrites its UDP destination port to `udp_port(b)` and passes
//! it to the kernel; a process sending to another process on its own host
//! addresses `udp_port(b)` itself. The ICRC is always computed as if the
//! destination port were 4791, so the rewrite does not disturb it.
//! QP1 (the GSI QP) belongs to block 0.
//!
//! Blocks [`ROOT_FIRST`] and up are root's alone: they are held through
//! locks only root can take and receive on privileged ports, so another
//! local user can squat every block and port open to users without
//! keeping root's xroce from a block (`xroce::device::block`).

/// Bits of a QPN below the block number.
pub const SHIFT: u32 = 16;

/// Number of blocks, hence of processes one device can serve at once.
pub const COUNT: u32 = 1 << (24 - SHIFT);

/// The UDP port of block `1 <= b < ROOT_FIRST` is `PORT_BASE + b` (24791
/// ..= 24981): below the kernel's ephemeral range, so no connect() takes it.
pub const PORT_BASE: u16 = 24790;

/// The first of the blocks only root may hold (64 of them).
pub const ROOT_FIRST: u32 = 192;

/// The UDP port of root's block `b` is `ROOT_PORT_BASE + b - ROOT_FIRST`
/// (960 ..= 1023): below 1024, so no unprivileged process can bind it
/// first (net.ipv4.ip_unprivileged_port_start).
pub const ROOT_PORT_BASE: u16 = 960;

/// Whether only root may hold block `block`.
#[inline(always)]
pub const fn is_root_only(block: u32) -> bool {
    block >= ROOT_FIRST
}

/// The first QPN of a block that a QP gets (rxe also starts above the
/// special QPs 0 and 1; the same offset in every block).
pub const FIRST_QPN_OFFSET: u32 = 0x11;

/// QPNs one block (one process) can hand out.
pub const QPNS_PER_BLOCK: u32 = (1 << SHIFT) - FIRST_QPN_OFFSET;

/// The block of a (24-bit) QPN.
#[inline(always)]
pub const fn of_qpn(qpn: u32) -> u32 {
    (qpn & 0x00ff_ffff) >> SHIFT
}

/// The UDP port the process of block `block` receives on.
#[inline(always)]
pub const fn udp_port(block: u32) -> u16 {
    if block == 0 {
        crate::ROCEV2_UDP_PORT
    } else if is_root_only(block) {
        ROOT_PORT_BASE + (block - ROOT_FIRST) as u16
    } else {
        PORT_BASE + block as u16
    }
}

/// Slot of the `XROCE_CONFIG` array holding the block of the process that
/// owns the interface's AF_XDP sockets (0 until one says otherwise).
pub const CONFIG_XSK_BLOCK: u32 = 1;

/// Slot of the `XROCE_CONFIG` array holding how many consecutive blocks,
/// from [`CONFIG_XSK_BLOCK`]'s on, go to the AF_XDP sockets: one device
/// whose QPs are spread over several I/O threads, one block per thread
/// (`xroce::runtime::shards`). 0 (the default) means 1.
pub const CONFIG_XSK_BLOCKS: u32 = 2;

/// A UDP checksum after one 16-bit word of what it covers changed from
/// `old` to `new` (RFC 1624, eqn. 3: `~(~check + ~old + new)`). A result of
/// 0 is sent as 0xffff: over UDP 0 would mean "no checksum".
#[inline(always)]
pub const fn udp_checksum_update(check: u16, old: u16, new: u16) -> u16 {
    let mut sum = (!check) as u32 + (!old) as u32 + new as u32;
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    match !(sum as u16) {
        0 => 0xffff,
        c => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_split_the_qpn_space_and_ports_do_not_collide() {
        assert_eq!(of_qpn(0x11), 0);
        assert_eq!(of_qpn(1), 0);
        assert_eq!(of_qpn(0x01_0011), 1);
        assert_eq!(of_qpn(0xff_ffff), 255);
        assert_eq!(udp_port(0), 4791);
        assert_eq!(udp_port(1), 24791);
        assert_eq!(udp_port(ROOT_FIRST - 1), 24981);
        assert!(
            udp_port(ROOT_FIRST - 1) < 32768,
            "below the ephemeral range"
        );
        assert_eq!(udp_port(ROOT_FIRST), 960);
        assert_eq!(udp_port(COUNT - 1), 1023, "root's ports are privileged");
        let mut taken = [false; 1 << 16];
        for b in 0..COUNT {
            let port = udp_port(b) as usize;
            assert!(!taken[port], "block {b}: port {port} is another block's");
            taken[port] = true;
        }
    }

    /// One's-complement sum of 16-bit words, folded and inverted.
    fn checksum(words: &[u16]) -> u16 {
        let mut sum: u32 = words.iter().map(|&w| w as u32).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn the_incremental_update_equals_a_full_recompute() {
        let mut words = [
            0x0a00u16, 0x0001, 0x0a00, 0x0002, 0x0011, 0x0020, 4791, 4791, 0x0020,
        ];
        for new in [24791u16, 25045, 4791, 0, 0xffff] {
            let check = checksum(&words);
            let old = words[7];
            words[7] = new;
            let want = match checksum(&words) {
                0 => 0xffff,
                c => c,
            };
            assert_eq!(udp_checksum_update(check, old, new), want, "{old} -> {new}");
        }
    }
}
