//! What `xroce lat` says on stderr beside its JSON report, for the tools
//! that read it (the end-to-end latency test, the bench's latency tail): a
//! line per slow iteration (`lat client: iteration 7 took 11.20 ms; ...`)
//! and each side's recovery line at its end (`lat server: 3 iterations
//! over 10ms; 2 retransmit timeouts, ...`), both written by the CLI's
//! `perf/lat.rs`.

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

    const CLIENT: &str = "lat client: iteration 7 took 11.20 ms; since the last slow one: 1 \
        retransmit timeouts, 2 retransmitted, 0 sequence NAKs in, 0 duplicates in\n\
        lat client: iteration 9 took 61.05 ms; its threads waited 3.10 ms for a CPU; since the \
        last slow one: 0 retransmit timeouts, 0 retransmitted, 0 sequence NAKs in, 0 duplicates in\n\
        lat client: 2 iterations over 10ms; 2 retransmit timeouts, 5 retransmitted, 1 retries, \
        0 sequence NAKs in, 0 duplicates in\n";

    #[test]
    fn slow_iterations_are_read_from_their_lines() {
        assert_eq!(slow_iterations_ms(CLIENT), vec![11.20, 61.05]);
        assert!(slow_iterations_ms("").is_empty());
    }

    #[test]
    fn the_recovery_line_gives_the_timeouts() {
        // Not the per-iteration lines' counts: the end's.
        assert_eq!(retransmit_timeouts(CLIENT, "client"), Some(2));
        assert_eq!(retransmit_timeouts(CLIENT, "server"), None);
        let server = "lat server: 0 iterations over 10ms; 0 retransmit timeouts, 0 \
                      retransmitted, 0 retries, 0 sequence NAKs in, 0 duplicates in\n";
        assert_eq!(retransmit_timeouts(server, "server"), Some(0));
    }
}
