//! A relay killed by SIGKILL (a real process): another finishes its work.

#[allow(unused_imports)]
use super::*;

/// A relay in a process of its own, killed with SIGKILL in the middle of a batch (its
/// sink published part of the batch and hangs): another relay, here, finishes the work
/// once the child's lease ran out. Every event is published; the only duplicates are
/// events the child published in the batch it never recorded; each entity's events,
/// first receipts across both relays, are in version order.
pub async fn relay_killed_by_sigkill_another_finishes<B: Backend>(b: &B) {
    killed_relay_another_finishes(b, Claim::Lease, "relay_killed_by_sigkill_another_finishes")
        .await;
}

/// A relay claiming by row locks, in a process of its own, killed with SIGKILL in the
/// middle of a batch (published in part, the rest hanging): its batch is claimable as
/// soon as the server sees the connection gone, with no lease to run out (none was ever
/// written). Another relay, here, publishes everything; the only duplicates are events
/// of the batch the child never recorded (at most one batch); each entity's events, first
/// receipts across both, are in version order; every event counts one attempt (the
/// killed batch's was never recorded).
pub async fn locked_relay_killed_by_sigkill_another_finishes<B: Networked>(b: &B) {
    if !holds_claims_by_lock(b).await {
        return assert_claims_fall_back_to_a_lease(b).await;
    }
    killed_relay_another_finishes(
        b,
        Claim::Lock,
        "locked_relay_killed_by_sigkill_another_finishes",
    )
    .await;
}

pub(crate) async fn killed_relay_another_finishes<B: Backend>(b: &B, claim: Claim, name: &str) {
    let (entities, per_entity) = (20, 5);
    seed(b, entities, per_entity).await;
    let dir = tempfile::tempdir().unwrap();
    let thread = std::thread::current();
    let test = thread.name().filter(|n| n.ends_with(name)).unwrap_or(name);
    let mode = if claim == Claim::Lock {
        "lock"
    } else {
        "lease"
    };
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(
            crate::conformance::CHILD,
            format!(
                "{RELAY_CHILD}{mode}|{}|{}",
                b.child_handle(),
                dir.path().display()
            ),
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let hung = dir.path().join("hung");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !hung.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child exited early"
        );
        assert!(std::time::Instant::now() < deadline, "the child never hung");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{status}");
    }
    let by_child: Vec<(i64, i64)> = std::fs::read_to_string(dir.path().join("published"))
        .unwrap()
        .lines()
        .map(|l| {
            let (e, v) = l
                .split_once(' ')
                .unwrap_or_else(|| panic!("a partial line in the child's log: {l:?}"));
            (e.parse().unwrap(), v.parse().unwrap())
        })
        .collect();
    let unrecorded = if claim == Claim::Lock {
        assert_no_lease(b).await;
        // The child's session is gone once the server saw its socket close: nothing of
        // it holds a lock.
        until_no_transaction_is_open(b).await;
        // Unrecorded: published by the child and still pending (its last batch).
        let pending: HashSet<(i64, i64)> = list_pending(b).await;
        let held = by_child.iter().filter(|k| pending.contains(k)).count() as i64;
        assert!(
            held > 0,
            "the child was killed holding no published, unrecorded event"
        );
        assert!(held <= 8, "{held} unrecorded events, more than one batch");
        held
    } else {
        let unrecorded = b
            .scalar(
                "SELECT COUNT(*) FROM orderly_outbox WHERE status = 'PENDING' AND owner_token IS NOT NULL",
            )
            .await;
        assert!(unrecorded > 0, "the child was killed holding no claim");
        unrecorded
    };
    assert!(
        !by_child.is_empty(),
        "the child published nothing before it was killed"
    );
    let rec = Arc::new(Recorder::default());
    let relay = Relay::new(
        b.store(Duration::from_secs(10)).await,
        RecordingSink {
            rec: rec.clone(),
            relay: 1,
        },
    )
    .with_config(fast(8))
    .unwrap();
    drain(&relay).await;
    let mut all: Vec<(i64, i64)> = by_child.clone();
    all.extend(rec.received().iter().map(|r| (r.0, r.1)));
    let mut firsts: HashMap<i64, Vec<i64>> = HashMap::new();
    let mut twice = 0;
    for (entity, version) in &all {
        let seen = firsts.entry(*entity).or_default();
        if seen.contains(version) {
            twice += 1;
        } else {
            seen.push(*version);
        }
    }
    for entity in 1..=entities {
        assert_eq!(
            firsts.get(&entity),
            Some(&(1..=per_entity).collect::<Vec<_>>()),
            "entity {entity}"
        );
    }
    assert!(
        twice as i64 <= unrecorded,
        "{twice} duplicates, more than the {unrecorded} events the child left claimed"
    );
    if claim == Claim::Lock {
        assert_eq!(
            b.scalar(
                "SELECT COUNT(*) FROM orderly_outbox WHERE attempts <> 1 OR status <> 'PUBLISHED'"
            )
            .await,
            0,
            "an event counted an attempt the killed child never recorded"
        );
    }
}

/// The keys of the pending events.
pub(crate) async fn list_pending<B: Backend>(b: &B) -> HashSet<(i64, i64)> {
    Outbox::new(b.store(Duration::from_secs(10)).await)
        .pending(1000)
        .await
        .unwrap()
        .iter()
        .map(|e| (e.entity_id, e.version))
        .collect()
}

/// The child of `relay_killed_by_sigkill_another_finishes`: relays with a lease of one
/// second through a sink that logs each publish to a file and, from the 25th on, logs
/// and then hangs (marking `hung`).
pub(crate) async fn relay_child<B: Backend>(spec: &str) {
    let (mode, spec) = spec.split_once('|').expect("mode|handle|directory");
    let claim = if mode == "lock" {
        Claim::Lock
    } else {
        Claim::Lease
    };
    let (handle, dir) = spec.split_once('|').expect("handle|directory");
    let dir = std::path::PathBuf::from(dir);
    let store = B::child_store(handle).await;
    let sink = FileSink {
        dir,
        count: Arc::new(AtomicUsize::new(0)),
    };
    let relay = Relay::new(store, sink)
        .with_config(
            fast_by(8, claim)
                .lease(Duration::from_secs(1))
                .publish_timeout(Duration::from_millis(400))
                // Hung publishes time out and are retried until the kill: none may go dead
                // first, however late the kill comes on a loaded machine.
                .max_attempts(1000),
        )
        .unwrap();
    relay.run(std::future::pending()).await.unwrap();
}

#[derive(Clone)]
pub(crate) struct FileSink {
    pub(crate) dir: std::path::PathBuf,
    pub(crate) count: Arc<AtomicUsize>,
}

impl Sink for FileSink {
    async fn publish(&self, m: &Message) -> Result<(), SinkError> {
        use std::io::Write;
        let n = self.count.fetch_add(1, Ordering::SeqCst);
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("published"))
            .unwrap();
        // One write call per line: publishes run concurrently, and the child is killed
        // while some of them are writing. `writeln!` on a `File` writes each piece of
        // the line with a call of its own, so a kill between two left a partial line.
        let line = format!("{} {}\n", m.entity_id, m.version);
        log.write_all(line.as_bytes()).unwrap();
        log.sync_all().unwrap();
        if n >= 25 {
            std::fs::write(self.dir.join("hung"), b"").unwrap();
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}
