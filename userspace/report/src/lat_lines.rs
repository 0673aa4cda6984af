//! What `xroce lat` says on stderr beside its JSON report, for the tools
//! that read it (the end-to-end latency test, the bench's latency tail): a
//! line per slow iteration (`lat client: iteration 7 took 11.20 ms; ...`)
//! and each side's recovery line at its end (`lat server: 3 iterations
//! over 10ms; 2 retransmit timeouts, ...`). The CLI's `perf/lat.rs`
//! writes them with [`slow_iteration_line`] and [`recovery_line`], so the
//! readers here and the writers cannot drift apart.

use std::time::Duration;

/// The engine's recovery counters a line reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    pub retransmit_timeouts: u64,
    pub retransmitted: u64,
    /// Retries started (the recovery line only).
    pub retries: u64,
    pub sequence_naks_in: u64,
    pub duplicates_in: u64,
}

impl Recovery {
    /// The counts since `earlier` (counters only grow).
    pub fn since(&self, earlier: &Recovery) -> Recovery {
        Recovery {
            retransmit_timeouts: self.retransmit_timeouts - earlier.retransmit_timeouts,
            retransmitted: self.retransmitted - earlier.retransmitted,
            retries: self.retries - earlier.retries,
            sequence_naks_in: self.sequence_naks_in - earlier.sequence_naks_in,
            duplicates_in: self.duplicates_in - earlier.duplicates_in,
        }
    }
}

/// `side`'s line for its iteration `i`, which took `took`; `cpu_wait`: how
/// long its threads waited for a CPU meanwhile, where known; `since`: the
/// counters since the last slow iteration.
pub fn slow_iteration_line(
    side: &str,
    i: u64,
    took: Duration,
    cpu_wait: Option<Duration>,
    since: &Recovery,
) -> String {
    let waited = cpu_wait.map_or(String::new(), |w| {
        format!(
            "; its threads waited {:.2} ms for a CPU",
            w.as_secs_f64() * 1e3
        )
    });
    format!(
        "lat {side}: iteration {i} took {:.2} ms{waited}; since the last slow one: {} \
         retransmit timeouts, {} retransmitted, {} sequence NAKs in, {} duplicates in",
        took.as_secs_f64() * 1e3,
        since.retransmit_timeouts,
        since.retransmitted,
        since.sequence_naks_in,
        since.duplicates_in,
    )
}

/// `side`'s line at its end: `slow` iterations took longer than `over`;
/// `total`: the counters of the whole run.
pub fn recovery_line(side: &str, slow: u64, over: Duration, total: &Recovery) -> String {
    format!(
        "lat {side}: {slow} iterations over {over:?}; {} retransmit timeouts, {} retransmitted, \
         {} retries, {} sequence NAKs in, {} duplicates in",
        total.retransmit_timeouts,
        total.retransmitted,
        total.retries,
        total.sequence_naks_in,
        total.duplicates_in,
    )
}

/// The iterations the client reported as slow, in ms.
pub fn slow_iterations_ms(stderr: &str) -> Vec<f64> {
    stderr
        .lines()
        .filter(|l| l.starts_with("lat client: iteration "))
        .filter_map(|l| l.split(" took ").nth(1)?.split(" ms").next()?.parse().ok())
        .collect()
}

/// The local ACK timeouts `side` (`client` or `server`) reported at its
/// end; `None` without its recovery line.
pub fn retransmit_timeouts(stderr: &str, side: &str) -> Option<u64> {
    let prefix = format!("lat {side}: ");
    stderr
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(" iterations over "))
        .find_map(|l| {
            l.split("; ")
                .nth(1)?
                .split(" retransmit timeouts")
                .next()?
                .parse()
                .ok()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(n: u64) -> Recovery {
        Recovery {
            retransmit_timeouts: n,
            retransmitted: n + 3,
            retries: 1,
            sequence_naks_in: 0,
            duplicates_in: 0,
        }
    }

    /// What a client prints: two slow iterations (one with its CPU wait),
    /// then its recovery line.
    fn client() -> String {
        let ms = Duration::from_micros;
        [
            slow_iteration_line("client", 7, ms(11_200), None, &counts(1)),
            slow_iteration_line("client", 9, ms(61_050), Some(ms(3_100)), &counts(0)),
            recovery_line("client", 2, Duration::from_millis(10), &counts(2)),
        ]
        .join("\n")
    }

    #[test]
    fn the_lines_read_as_written() {
        let client = client();
        assert!(client.contains("iterations over 10ms"), "{client}");
        assert!(client.contains("waited 3.10 ms for a CPU"), "{client}");
    }

    #[test]
    fn a_slow_line_counts_since_the_last_one() {
        let since = counts(5).since(&counts(2));
        assert_eq!(
            (
                since.retransmit_timeouts,
                since.retransmitted,
                since.retries
            ),
            (3, 3, 0)
        );
    }

    #[test]
    fn slow_iterations_are_read_from_their_lines() {
        assert_eq!(slow_iterations_ms(&client()), vec![11.20, 61.05]);
        assert!(slow_iterations_ms("").is_empty());
    }

    #[test]
    fn the_recovery_line_gives_the_timeouts() {
        let client = client();
        // Not the per-iteration lines' counts: the end's.
        assert_eq!(retransmit_timeouts(&client, "client"), Some(2));
        assert_eq!(retransmit_timeouts(&client, "server"), None);
        let server = recovery_line("server", 0, Duration::from_millis(10), &counts(0));
        assert_eq!(retransmit_timeouts(&server, "server"), Some(0));
    }
}
