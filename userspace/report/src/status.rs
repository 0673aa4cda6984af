//! `xroce status --json`: the interfaces of this network namespace that run
//! xroce's XDP program or have processes on them, and those processes.

use serde::{Deserialize, Serialize};

use crate::required;

/// `xroce status --json`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StatusReport {
    /// By interface index.
    pub interfaces: Vec<InterfaceStatus>,
}

/// One interface in [`StatusReport`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct InterfaceStatus {
    pub iface: String,
    pub ifindex: u32,
    /// xroce's XDP program on it; null: none (its processes run over UDP).
    #[serde(deserialize_with = "required")]
    pub xdp: Option<XdpStatus>,
    /// Processes holding a QPN block of the device, by pid.
    pub processes: Vec<ProcessStatus>,
    /// Blocks held by sockets whose process could not be seen (another
    /// user's, without root).
    pub unattributed_blocks: Vec<u32>,
}

/// xroce's XDP program on an interface.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct XdpStatus {
    /// `bpftool prog show id N`.
    pub prog_id: u32,
    /// native or skb.
    pub mode: String,
    /// libxdp's dispatcher program id when xroce's program runs under it.
    #[serde(deserialize_with = "required")]
    pub dispatcher: Option<u32>,
    /// Attached by a process for itself (its device's last process detaches
    /// it) rather than by `xroce attach`.
    pub by_process: bool,
    /// Where the frames it redirects to AF_XDP carry their arrival time:
    /// `metadata` (xroce_xdp), `head` (xroce_xdp_head: the kernel refused
    /// the metadata helper) or `none` (xroce_xdp_plain: it refused both);
    /// absent in older reports, from before the timestamps: read as none.
    #[serde(default = "no_arrival_times")]
    pub arrival_times: String,
}

fn no_arrival_times() -> String {
    "none".into()
}

/// A process using a device.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ProcessStatus {
    pub pid: u32,
    /// Its command name (/proc/PID/comm).
    pub command: String,
    /// The QPN blocks it holds (its QPNs are `block << 16 | n`).
    pub blocks: Vec<u32>,
    /// Whether it owns the device's AF_XDP sockets.
    pub afxdp: bool,
    /// The UDP ports its blocks receive on.
    pub udp_ports: Vec<u16>,
    /// Its live QPs as its engine last published them (every half
    /// second); null when it publishes nothing (e.g. not root).
    #[serde(deserialize_with = "required")]
    pub qpns: Option<Vec<u32>>,
    /// With --qps: the state of each of its QPs as its engine last
    /// published it; left out without --qps or when the engine publishes
    /// no QP state (an older xroce, not root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qps: Option<Vec<crate::QpStatus>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_report_round_trips_and_nulls_are_required() {
        let json = r#"{"interfaces":[{"iface":"eth1","ifindex":3,"xdp":{"prog_id":42,"mode":"native","dispatcher":null,"by_process":false,"arrival_times":"metadata"},"processes":[{"pid":7,"command":"xroce","blocks":[1],"afxdp":false,"udp_ports":[24791],"qpns":[65553]}],"unattributed_blocks":[]}]}"#;
        let r: StatusReport = serde_json::from_str(json).unwrap();
        assert_eq!(r.interfaces[0].xdp.as_ref().unwrap().prog_id, 42);
        assert_eq!(r.interfaces[0].processes[0].qpns, Some(vec![65553]));
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::from_str::<serde_json::Value>(json).unwrap()
        );
        let e = serde_json::from_str::<StatusReport>(&json.replace(r#","qpns":[65553]"#, ""))
            .unwrap_err();
        assert!(e.to_string().contains("missing field `qpns`"), "{e}");
        // A report from before the timestamps.
        let old = json.replace(r#","arrival_times":"metadata""#, "");
        let read = serde_json::from_str::<StatusReport>(&old).unwrap();
        assert_eq!(
            read.interfaces[0].xdp.as_ref().unwrap().arrival_times,
            "none"
        );
    }
}
