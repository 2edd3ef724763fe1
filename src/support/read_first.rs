//! When a request starts with a read of its history row instead of the apply-first write.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// Which round trip a transition starts with (inside a caller's transaction too). The
/// outcome is the same either way; only the cost differs.
///
/// Trying to apply first answers a new request with the floor's statements (on PostgreSQL
/// one statement; on MySQL/MariaDB and SQLite `BEGIN; UPDATE; INSERT; COMMIT`, for an
/// event with one source state). But a replay then costs the attempt, which writes
/// nothing, and the read after it: two round trips on PostgreSQL, four on MySQL/MariaDB,
/// and on SQLite a wait for the single write lock. Reading the request's history row
/// first answers a replay with that one read, and costs a new request one round trip
/// more.
///
/// On a store that batches reads (PostgreSQL, MySQL/MariaDB), the engine reads first
/// before taking a connection, and the reads of concurrent callers share statements:
/// while one is in flight, those that arrive queue for the next, which reads them all. A
/// lone caller's read goes at once; no answer changes (docs/design.md, "Why are the reads
/// of a storm batched?").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadFirst {
    /// Always try to apply first.
    Never,
    /// Always read first.
    Always,
    /// Try to apply first, but read first while replays make up enough of the recent
    /// requests through this engine (an exponentially weighted share, over roughly the
    /// last 16) for reading first to be cheaper: a storm of redelivered callbacks. Each
    /// store declares the share from which reading first pays
    /// ([`Store::READ_FIRST_FROM`](crate::Store::READ_FIRST_FROM)): 3/8 on PostgreSQL,
    /// 1/4 on MySQL/MariaDB and SQLite.
    #[default]
    Adaptive,
}

/// An engine's [`ReadFirst`] policy, with the recent share of replays that `Adaptive`
/// goes by. Clones share the share, so every clone of an engine feeds the same one.
#[derive(Debug, Clone)]
pub(crate) struct FirstRound {
    policy: ReadFirst,
    /// In 1/1024ths, the share from which `Adaptive` reads first.
    read_first_from: u32,
    replays: Arc<ReplayRate>,
}

impl FirstRound {
    pub(crate) fn new(policy: ReadFirst, read_first_from: u32) -> Self {
        FirstRound {
            policy,
            read_first_from,
            replays: Arc::default(),
        }
    }

    /// Whether the next request should start with the read.
    pub(crate) fn reads_first(&self) -> bool {
        match self.policy {
            ReadFirst::Never => false,
            ReadFirst::Always => true,
            ReadFirst::Adaptive => self.replays.get() >= self.read_first_from,
        }
    }

    /// Counts a request that ran to its answer: whether it had been recorded before.
    pub(crate) fn note(&self, replay: bool) {
        if self.policy == ReadFirst::Adaptive {
            self.replays.note(replay);
        }
    }

    /// The share, between 0 and 1.
    pub(crate) fn share(&self) -> f64 {
        f64::from(self.replays.get()) / f64::from(ReplayRate::ONE)
    }
}

/// The share of recent requests that were replays, exponentially weighted (each new
/// request weighs 1/16), in 1/1024ths.
#[derive(Debug, Default)]
struct ReplayRate(AtomicU32);

impl ReplayRate {
    const ONE: u32 = 1024;

    /// Concurrent callers may overwrite each other's update: the share is a hint, and a
    /// lost sample only delays it.
    fn note(&self, replay: bool) {
        let old = self.0.load(Relaxed);
        let sample = if replay { Self::ONE } else { 0 };
        self.0.store(old - old / 16 + sample / 16, Relaxed);
    }

    fn get(&self) -> u32 {
        self.0.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::{FirstRound, ReadFirst};

    /// How many replays in a row switch an adaptive engine to reading first, and how many
    /// new requests after that switch it back.
    fn switch_points(read_first_from: u32) -> (u32, u32) {
        let first = FirstRound::new(ReadFirst::Adaptive, read_first_from);
        let mut replays = 0;
        while !first.reads_first() {
            first.note(true);
            replays += 1;
            assert!(replays < 200, "never reads first");
        }
        for _ in 0..100 {
            first.note(true);
        }
        let mut fresh = 0;
        while first.reads_first() {
            first.note(false);
            fresh += 1;
        }
        (replays, fresh)
    }

    #[test]
    fn adaptive_reads_first_in_a_storm_and_stops_after_it() {
        // 1 - (15/16)^n reaches 3/4 at n = 22 and 1/4 at n = 5; the share falls below 3/4
        // after 5 new requests and below 1/4 after 22 (integer rounding may add one).
        let (on, off) = switch_points(768);
        assert!(
            (22..=23).contains(&on) && (5..=6).contains(&off),
            "{on} {off}"
        );
        let (on, off) = switch_points(256);
        assert!(
            (5..=6).contains(&on) && (21..=23).contains(&off),
            "{on} {off}"
        );
    }

    #[test]
    fn fixed_policies_ignore_the_share() {
        let never = FirstRound::new(ReadFirst::Never, 0);
        let always = FirstRound::new(ReadFirst::Always, 1024);
        for _ in 0..50 {
            never.note(true);
            always.note(false);
        }
        assert!(!never.reads_first() && always.reads_first());
        assert_eq!((never.share(), always.share()), (0.0, 0.0));
    }
}
