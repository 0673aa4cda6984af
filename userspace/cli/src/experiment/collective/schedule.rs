//! The training step's compute gaps: each rank's gap in each iteration,
//! `gap × (1 ± jitter)` uniformly, drawn from the seed alone. Every run of
//! an experiment (each transport, each loss rate, each op and size) follows
//! the same schedule, so their JCTs differ only by what the network did;
//! the same seed gives the same schedule on any machine.

use std::{io::Write, path::Path};

use anyhow::Context;

use crate::experiment::rng::Rng;

/// `gaps[iter][rank]` in microseconds.
pub type Schedule = Vec<Vec<u64>>;

/// The gaps of `iters` iterations of `ranks` ranks around `gap_s`, each
/// off by up to `jitter` (a fraction of the gap) either way.
pub fn gaps(seed: u64, ranks: usize, iters: usize, gap_s: f64, jitter: f64) -> Schedule {
    let mut rng = Rng::new(seed);
    (0..iters)
        .map(|_| {
            (0..ranks)
                .map(|_| {
                    let off = (2.0 * rng.unit() - 1.0) * jitter;
                    (gap_s * (1.0 + off) * 1e6).round().max(0.0) as u64
                })
                .collect()
        })
        .collect()
}

/// schedule.csv, as the program reads it: `iter,rank,gap_us`.
pub fn write(path: &Path, schedule: &Schedule) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?,
    );
    writeln!(f, "iter,rank,gap_us")?;
    for (iter, row) in schedule.iter().enumerate() {
        for (rank, gap) in row.iter().enumerate() {
            writeln!(f, "{iter},{rank},{gap}")?;
        }
    }
    f.flush()
        .with_context(|| format!("write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let a = gaps(7, 4, 50, 0.005, 0.2);
        assert_eq!(a, gaps(7, 4, 50, 0.005, 0.2));
        assert_ne!(a, gaps(8, 4, 50, 0.005, 0.2));
        assert_eq!(a.len(), 50);
        assert!(a.iter().all(|row| row.len() == 4));
        // Within the jitter, and really jittered.
        let all: Vec<u64> = a.iter().flatten().copied().collect();
        assert!(all.iter().all(|&g| (4000..=6000).contains(&g)), "{all:?}");
        assert!(all.iter().any(|&g| g != all[0]));
    }

    #[test]
    fn no_jitter_is_the_gap() {
        assert!(gaps(1, 3, 4, 0.005, 0.0)
            .iter()
            .flatten()
            .all(|&g| g == 5000));
        assert!(gaps(1, 2, 2, 0.0, 0.5).iter().flatten().all(|&g| g == 0));
    }

    #[test]
    fn the_program_reads_what_is_written() {
        let dir = std::env::temp_dir().join(format!("xroce-sched-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("schedule.csv");
        write(&path, &vec![vec![1, 2], vec![3, 4]]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(text, "iter,rank,gap_us\n0,0,1\n0,1,2\n1,0,3\n1,1,4\n");
    }
}
