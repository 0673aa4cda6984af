//! The interface flag of bench, lat and pingpong (`--iface`, `-d`): an
//! interface name, or the name of xroce's verbs device on it (`xroce_eth1`),
//! which is what perftest's and ibv_rc_pingpong's `-d` take, so their
//! command lines work unchanged.

/// `s` as given if it names an interface here; else, for `xroce_IF` where
/// IF exists, IF. Anything else passes through unchanged, so the command
/// reports the missing interface in its own words.
pub fn interface(s: &str) -> Result<String, std::convert::Infallible> {
    if xroce::xdp::if_index(s).is_ok() {
        return Ok(s.to_string());
    }
    match s.strip_prefix("xroce_") {
        Some(iface) if xroce::xdp::if_index(iface).is_ok() => Ok(iface.to_string()),
        _ => Ok(s.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::interface;

    #[test]
    fn a_device_name_means_its_interface() {
        assert_eq!(interface("lo").unwrap(), "lo");
        assert_eq!(interface("xroce_lo").unwrap(), "lo");
        assert_eq!(interface("xroce_nosuchif0").unwrap(), "xroce_nosuchif0");
        assert_eq!(interface("nosuchif0").unwrap(), "nosuchif0");
    }
}
