//! A bottleneck that really queues: on one port's egress a `tbf` qdisc
//! sends at the configured link rate and holds what waits, so packets wait
//! as behind a real switch port and RTT grows with the queue. A TC program
//! (ebpf/src/bottleneck.rs, attached as a TCX link, which runs before the
//! qdisc) keeps the same link as a clock of departures: it decides marks
//! and drops on the bytes queued when a packet arrives, by the XDP
//! congestion point's policy ([`EcnConfig`]: RED or step for RoCEv2,
//! tail drop at the buffer for everything), and keeps the queue's figures
//! for samplers.
//!
//! Why tbf and not fq holding packets to earliest-departure times that the
//! program would stamp: the kernels xroce runs on here are built without
//! sch_fq (and without netem, etf); tbf (CONFIG_NET_SCH_TBF) is there. tbf
//! is set so it agrees with the program's clock: its rate is the link
//! rate, its bucket the clock's (a token bucket too: after an idle period
//! a burst of [`DEFAULT_BURST_US`] at the rate leaves at once; tbf sends on
//! a timer, and a smaller bucket loses rate to the timer's lateness), and
//! its limit above the buffer, so only the program drops.
//!
//! tbf replaces the interface's root qdisc (a veth's is none).
//! [`Bottleneck`] removes both (the link, then tbf: the interface gets its
//! default root back) when dropped, from any thread: it remembers the
//! network namespace it was attached in. If the process is killed, the
//! link goes with its descriptor; tbf stays until its interface does (or
//! `tc qdisc del dev IF root`). Before kernel 6.6 (no TCX) the program
//! hangs under a clsact qdisc, removed with it.

use std::{
    fs::File,
    os::fd::AsRawFd,
    process::Command,
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, MapData},
    programs::{tc::TcAttachType, SchedClassifier},
    Ebpf, EbpfLoader,
};
use xroce_common::{
    bottleneck::{effective_buffer, names, DelayQueue},
    congestion::EcnConfig,
};

#[derive(Debug, thiserror::Error)]
pub enum BottleneckError {
    #[error("the delay bottleneck needs root (CAP_BPF and CAP_NET_ADMIN); run it with sudo")]
    NotRoot,
    #[error("invalid bottleneck settings: {0}")]
    Config(&'static str),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`tc {args}` failed: {stderr}")]
    Tc { args: String, stderr: String },
    #[error("{what}")]
    Bpf {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

fn bpf_err<E>(what: impl Into<String>) -> impl FnOnce(E) -> BottleneckError
where
    E: std::error::Error + Send + Sync + 'static,
{
    let what = what.into();
    move |e| BottleneckError::Bpf {
        what,
        source: Box::new(e),
    }
}

/// Runs `tc ARGS` in the calling thread's network namespace.
fn tc(args: &[&str]) -> Result<(), BottleneckError> {
    let out = Command::new("tc")
        .args(args)
        .output()
        .map_err(|source| BottleneckError::Io {
            what: "run tc (install iproute2: `cargo xtask setup`)".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(BottleneckError::Tc {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Default bucket of tbf (and of the program's clock), in transmission
/// time at the link rate: tbf only sends when its timer fires, and a
/// bucket that holds less than the timer's lateness loses rate (measured
/// on a loaded 2-core host: a one-frame bucket carried 0.33 of 1 Gbit/s).
pub const DEFAULT_BURST_US: u64 = 200;

/// `$XROCE_BOTTLENECK_BURST_US` overrides [`DEFAULT_BURST_US`].
pub const BURST_ENV: &str = "XROCE_BOTTLENECK_BURST_US";

fn burst_us() -> u64 {
    std::env::var(BURST_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_BURST_US)
}

/// The tbf settings for a bottleneck configured as `cfg` on an interface
/// of MTU `mtu` with a bucket of `burst_us` at the link rate: `(burst,
/// limit)` in bytes. The bucket holds at least one frame (with a VLAN tag)
/// and 512 bytes for the kernel's rounding of the burst into time: tbf
/// drops a packet longer than its bucket. The limit leaves the buffer to
/// the program.
pub fn tbf_parameters(cfg: &EcnConfig, mtu: u32, burst_us: u64) -> (u64, u64) {
    let frame = mtu as u64 + 18 + 512;
    let burst = (cfg.link_rate_bps / 8 / 1_000_000 * burst_us).max(frame);
    let limit = (effective_buffer(cfg) + 2 * burst).min(u32::MAX as u64);
    (burst, limit)
}

/// What one read of the queue says, for samplers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueSample {
    /// Bytes still to send now (from the departure clock).
    pub backlog_bytes: u64,
    /// How long a packet arriving now would wait before it starts to go.
    pub delay_ns: u64,
    pub state: DelayQueue,
}

/// A handle on the queue's state that works from any thread.
pub struct QueueReader {
    queue: Array<MapData, DelayQueue>,
    link_rate_bps: u64,
}

impl QueueReader {
    pub fn read(&self) -> Result<QueueSample, BottleneckError> {
        read(&self.queue, self.link_rate_bps)
    }
}

fn read(
    queue: &Array<MapData, DelayQueue>,
    link_rate_bps: u64,
) -> Result<QueueSample, BottleneckError> {
    {
        let state = queue
            .get(&0, 0)
            .map_err(bpf_err("read the bottleneck's queue"))?;
        let now = monotonic_ns();
        Ok(QueueSample {
            backlog_bytes: state.backlog_at(now, link_rate_bps),
            delay_ns: state.wait_at(now),
            state,
        })
    }
}

/// CLOCK_MONOTONIC in ns: the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The delay bottleneck on one interface's egress; removed on drop.
pub struct Bottleneck {
    iface: String,
    /// The network namespace the interface is in (for removing tbf).
    netns: File,
    /// Holds the program and its TCX link: dropping it detaches.
    ebpf: Option<Ebpf>,
    config: Array<MapData, EcnConfig>,
    queue: Array<MapData, DelayQueue>,
    queue_id: u32,
    link_rate_bps: u64,
    /// tbf's bucket (and the clock's), bytes.
    burst_bytes: u64,
    /// This bottleneck added a clsact qdisc (kernels before TCX).
    clsact: bool,
}

impl Bottleneck {
    /// Puts the bottleneck on `iface` (in the calling thread's network
    /// namespace): tbf at its root, then the TC program on its egress,
    /// configured as `cfg` (which must be enabled).
    pub fn attach(iface: &str, cfg: EcnConfig) -> Result<Self, BottleneckError> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(BottleneckError::NotRoot);
        }
        if cfg.enabled == 0 {
            return Err(BottleneckError::Config("the bottleneck must be enabled"));
        }
        cfg.validate().map_err(BottleneckError::Config)?;
        let netns =
            File::open("/proc/thread-self/ns/net").map_err(|source| BottleneckError::Io {
                what: "open this thread's network namespace".into(),
                source,
            })?;
        let object = crate::xdp::ebpf_object().map_err(|_| {
            BottleneckError::Config(
                "this xroce was built with XROCE_BUILD_EBPF=0 and has no eBPF object; rebuild without it",
            )
        })?;
        let mut ebpf = EbpfLoader::new()
            .load(object)
            .map_err(bpf_err("load the xroce eBPF object"))?;
        let take = |ebpf: &mut Ebpf, name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| BottleneckError::Config("the eBPF object lacks a bottleneck map"))
        };
        let config: Array<MapData, EcnConfig> =
            Array::try_from(take(&mut ebpf, names::CONFIG)?).map_err(bpf_err("config map"))?;
        let queue_map = take(&mut ebpf, names::QUEUE)?;
        let queue_id = match &queue_map {
            aya::maps::Map::Array(data) => data.info().map_err(bpf_err("queue map info"))?.id(),
            _ => return Err(BottleneckError::Config("the queue map is not an array")),
        };
        let queue: Array<MapData, DelayQueue> =
            Array::try_from(queue_map).map_err(bpf_err("queue map"))?;
        let mut me = Bottleneck {
            iface: iface.to_string(),
            netns,
            ebpf: None,
            config,
            queue,
            queue_id,
            link_rate_bps: cfg.link_rate_bps,
            burst_bytes: 0,
            clsact: false,
        };
        me.burst_bytes = tbf("replace", iface, &cfg)?;
        me.write_config(cfg)?;
        let program: &mut SchedClassifier = ebpf
            .program_mut(names::PROGRAM)
            .ok_or(BottleneckError::Config(
                "the eBPF object lacks the TC program",
            ))?
            .try_into()
            .map_err(bpf_err("TC program type"))?;
        program
            .load()
            .map_err(bpf_err("the kernel verifier rejected the TC program"))?;
        // Before 6.6 aya attaches through netlink, under a clsact qdisc
        // (TCX needs none).
        let tcx = aya::util::KernelVersion::current()
            .map(|v| v >= aya::util::KernelVersion::new(6, 6, 0))
            .unwrap_or(true);
        if !tcx {
            match tc(&["qdisc", "add", "dev", iface, "clsact"]) {
                Ok(()) => me.clsact = true,
                // Someone else's: theirs to remove.
                Err(BottleneckError::Tc { stderr, .. })
                    if stderr.contains("xists") || stderr.contains("Exclusivity") => {}
                Err(e) => return Err(e),
            }
        }
        // On failure `me` drops here and takes tbf away again.
        program
            .attach(iface, TcAttachType::Egress)
            .map_err(bpf_err(format!(
                "attach the TC program to {iface}'s egress"
            )))?;
        me.ebpf = Some(ebpf);
        Ok(me)
    }

    fn write_config(&mut self, cfg: EcnConfig) -> Result<(), BottleneckError> {
        // The clock restarts: no departures from an older setting linger.
        self.queue
            .set(
                0,
                DelayQueue {
                    burst_ns: self.burst_bytes * 8_000_000_000 / cfg.link_rate_bps.max(1),
                    ..Default::default()
                },
                0,
            )
            .map_err(bpf_err("reset the bottleneck's queue"))?;
        self.config
            .set(0, cfg, 0)
            .map_err(bpf_err("write the bottleneck's settings"))?;
        self.link_rate_bps = cfg.link_rate_bps;
        Ok(())
    }

    /// Changes the settings (and restarts the queue's clock); tbf follows.
    pub fn reconfigure(&mut self, cfg: EcnConfig) -> Result<(), BottleneckError> {
        if cfg.enabled == 0 {
            return Err(BottleneckError::Config("the bottleneck must be enabled"));
        }
        cfg.validate().map_err(BottleneckError::Config)?;
        let ns = self
            .netns
            .try_clone()
            .map_err(|source| BottleneckError::Io {
                what: "duplicate the namespace descriptor".into(),
                source,
            })?;
        let iface = self.iface.clone();
        self.burst_bytes = in_netns(ns, move || tbf("change", &iface, &cfg))??;
        self.write_config(cfg)
    }

    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The bucket of tbf and of the program's clock, in bytes: up to this
    /// much leaves at once after an idle period.
    pub fn burst_bytes(&self) -> u64 {
        self.burst_bytes
    }

    pub fn config(&self) -> Result<EcnConfig, BottleneckError> {
        self.config
            .get(&0, 0)
            .map_err(bpf_err("read the bottleneck's settings"))
    }

    /// The queue now.
    pub fn sample(&self) -> Result<QueueSample, BottleneckError> {
        read(&self.queue, self.link_rate_bps)
    }

    fn reopen_queue(&self) -> Result<Array<MapData, DelayQueue>, BottleneckError> {
        let data = MapData::from_id(self.queue_id).map_err(bpf_err("reopen the queue map"))?;
        Array::try_from(aya::maps::Map::Array(data)).map_err(bpf_err("queue map"))
    }

    /// A reader of the queue for another thread (a sampler).
    pub fn reader(&self) -> Result<QueueReader, BottleneckError> {
        Ok(QueueReader {
            queue: self.reopen_queue()?,
            link_rate_bps: self.link_rate_bps,
        })
    }
}

/// `tc qdisc VERB dev IFACE root tbf ...` for a bottleneck set as `cfg`;
/// returns the bucket in bytes.
fn tbf(verb: &str, iface: &str, cfg: &EcnConfig) -> Result<u64, BottleneckError> {
    let mtu = crate::device::interface_mtu(iface).map_err(|e| BottleneckError::Io {
        what: format!("read the MTU of {iface}"),
        source: std::io::Error::other(e.to_string()),
    })?;
    let (burst, limit) = tbf_parameters(cfg, mtu, burst_us());
    tc(&[
        "qdisc",
        verb,
        "dev",
        iface,
        "root",
        "tbf",
        "rate",
        &format!("{}bit", cfg.link_rate_bps),
        "burst",
        &burst.to_string(),
        "limit",
        &limit.to_string(),
    ])?;
    Ok(burst)
}

/// Runs `f` on a new thread inside the namespace `ns` refers to.
fn in_netns<T: Send + 'static>(
    ns: File,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BottleneckError> {
    std::thread::spawn(move || {
        // SAFETY: setns on a namespace descriptor we own; it changes only
        // this (new, short-lived) thread.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(BottleneckError::Io {
                what: "enter the bottleneck's network namespace".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(f())
    })
    .join()
    .unwrap_or_else(|_| {
        Err(BottleneckError::Io {
            what: "a thread in the bottleneck's namespace panicked".into(),
            source: std::io::Error::other("panic"),
        })
    })
}

/// Whether `iface` (in the calling thread's namespace) has tbf at its root.
pub fn has_tbf(iface: &str) -> bool {
    Command::new("tc")
        .args(["qdisc", "show", "dev", iface, "root"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("qdisc tbf "))
        .unwrap_or(false)
}

/// How many TCX programs run on `iface`'s egress (calling thread's
/// namespace): 0 once a bottleneck is gone, unless someone else's are there.
pub fn tcx_egress_programs(iface: &str) -> Result<usize, BottleneckError> {
    SchedClassifier::query_tcx(iface, TcAttachType::Egress)
        .map(|(_, programs)| programs.len())
        .map_err(bpf_err(format!("query TCX programs on {iface}")))
}

impl Drop for Bottleneck {
    fn drop(&mut self) {
        // The program first: it must not count packets tbf no longer holds.
        drop(self.ebpf.take());
        // tbf never set (attach failed before): the root is not ours.
        if self.burst_bytes == 0 && !self.clsact {
            return;
        }
        let tbf_set = self.burst_bytes != 0;
        let Ok(ns) = self.netns.try_clone() else {
            return;
        };
        let iface = self.iface.clone();
        let clsact = self.clsact;
        let removed = in_netns(ns, move || {
            if clsact {
                let _ = tc(&["qdisc", "del", "dev", &iface, "clsact"]);
            }
            if !tbf_set {
                return Ok(());
            }
            // Gone with its namespace is fine; anything else is reported.
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match tc(&["qdisc", "del", "dev", &iface, "root"]) {
                    Ok(()) => return Ok(()),
                    Err(BottleneckError::Tc { stderr, .. })
                        if stderr.contains("Cannot find device")
                            || stderr.contains("Cannot delete qdisc with handle of zero") =>
                    {
                        return Ok(())
                    }
                    Err(e) if Instant::now() > deadline => return Err(e),
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        match removed {
            Ok(Ok(())) => {}
            Ok(Err(e)) | Err(e) => eprintln!(
                "xroce: the delay bottleneck's tbf stays on {}: {e}",
                self.iface
            ),
        }
    }
}
