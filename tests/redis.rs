//! The Redis front of idempotency records, against a real Redis (`ORDERLY_REDIS_URL`,
//! default `redis://127.0.0.1:6379/`) and, for the outage, a Redis server of the test's
//! own that it kills. The records live on SQLite. A Redis that cannot be reached fails
//! these tests; they never skip.

mod server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use orderly::{
    Claim, Claimed, Error, FrontConfig, Records, RedisFront, ScopeConfig, SqliteStore, Stored,
};

const LEASE: Duration = Duration::from_secs(30);
const FRONT_TTL: Duration = Duration::from_secs(2);
/// The front's timeout where the test needs a live front's answers.
const LIVE: Duration = Duration::from_secs(1);

fn redis_url() -> String {
    server::url("ORDERLY_REDIS_URL", "redis://127.0.0.1:6379/")
}

/// A fresh SQLite database with the records of scope `scope` behind a front on `url`
/// that waits at most `timeout` on Redis. Tests that need the front to answer give it a
/// second (a loaded machine can take longer than the default 20 ms to connect and load
/// the scripts, and the front then stands aside for a second); tests of a silent or dead
/// Redis give it less and bound the wait.
async fn records(
    url: &str,
    timeout: Duration,
) -> (tempfile::TempDir, Records<SqliteStore>, String) {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("records.db").display());
    let store = SqliteStore::demo(&db).await.unwrap();
    // Scopes unique per test run: the shared Redis keeps markers of other runs.
    let scope = format!("pay-{}", uuid_like());
    let config = FrontConfig::default().ttl(FRONT_TTL).timeout(timeout);
    let r = Records::new(store)
        .scope(&scope, ScopeConfig::new(LEASE, Duration::from_secs(3600)))
        .unwrap()
        .front(RedisFront::new(url, config).unwrap());
    (dir, r, scope)
}

fn uuid_like() -> String {
    server::unique_db_name()
}

async fn marker_exists(scope: &str, key: &str) -> bool {
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("the Redis of these tests is reachable");
    let n: i64 = redis::cmd("EXISTS")
        .arg(format!("orderly:idem:{}:{scope}:{key}", scope.len()))
        .query_async(&mut conn)
        .await
        .unwrap();
    n == 1
}

fn claimed(claim: Claim) -> Claimed {
    match claim {
        Claim::Claimed(held) => held,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// 64 identical requests at once: one claims, the others are in flight (told by the
/// database while the claim was pending, by Redis once it was granted). A second wave of
/// 64 while it runs is shed by Redis entirely (their `retry_after` is the marker's, at
/// most 2 s, where the database's would be the 30 s lease). Completed, the marker is gone
/// and every repeat is replayed by the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Redis server and redis-server; run with --ignored"]
async fn a_storm_is_shed_by_redis_and_replayed_by_the_database() {
    let (_dir, r, scope) = records(&redis_url(), LIVE).await;
    let wave = |r: &Records<SqliteStore>| {
        let barrier = Arc::new(tokio::sync::Barrier::new(64));
        (0..64)
            .map(|_| {
                let (r, barrier, scope) = (r.clone(), barrier.clone(), scope.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    r.claim(&scope, "storm", &"same").await
                })
            })
            .collect::<Vec<_>>()
    };
    let mut held = Vec::new();
    for t in wave(&r) {
        match t.await.unwrap() {
            Ok(Claim::Claimed(h)) => held.push(h),
            Err(Error::InFlight { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(held.len(), 1);
    assert!(marker_exists(&scope, "storm").await);
    let mut shed = 0;
    for t in wave(&r) {
        match t.await.unwrap() {
            Err(Error::InFlight { retry_after, .. }) if retry_after <= FRONT_TTL => shed += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(shed, 64);
    r.complete(&held[0], &"done").await.unwrap();
    assert!(
        !marker_exists(&scope, "storm").await,
        "completion removes the marker"
    );
    // A storm of repeats of the finished request: every one replayed, none told to wait.
    for t in wave(&r) {
        assert_eq!(
            t.await.unwrap().unwrap(),
            Claim::Replayed(Stored::Succeeded(r#""done""#.into()))
        );
    }
    assert!(
        !marker_exists(&scope, "storm").await,
        "a replay leaves no marker"
    );
}

/// The front answers only "in flight", and only to the same payload: another payload
/// under a held key goes to the database and is a mismatch; a released or failed record
/// loses its marker and is claimed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Redis server and redis-server; run with --ignored"]
async fn only_identical_requests_are_shed() {
    let (_dir, r, scope) = records(&redis_url(), LIVE).await;
    let held = claimed(r.claim(&scope, "k", &"a").await.unwrap());
    assert!(matches!(
        r.claim(&scope, "k", &"b").await,
        Err(Error::PayloadMismatch { .. })
    ));
    // Scopes and keys may hold `:`: ("<scope>:x", "k") and ("<scope>", "x:k") are two
    // requests, and a held one sheds nothing of the other.
    let r = r
        .scope(
            &format!("{scope}:x"),
            ScopeConfig::new(LEASE, Duration::from_secs(3600)),
        )
        .unwrap();
    let one = claimed(r.claim(&format!("{scope}:x"), "k", &"a").await.unwrap());
    let two = claimed(r.claim(&scope, "x:k", &"a").await.unwrap());
    r.release(&one).await.unwrap();
    r.release(&two).await.unwrap();
    r.release(&held).await.unwrap();
    assert!(!marker_exists(&scope, "k").await);
    let again = claimed(r.claim(&scope, "k", &"a").await.unwrap());
    assert_eq!(again.attempt(), 2);
    r.fail(&again, &"declined", orderly::Failure::Terminal)
        .await
        .unwrap();
    assert!(!marker_exists(&scope, "k").await);
    assert_eq!(
        r.claim(&scope, "k", &"a").await.unwrap(),
        Claim::Replayed(Stored::Failed(Some(r#""declined""#.into())))
    );
}

/// A Redis that accepts connections and never answers: every call gives up after the
/// front's timeout and the database answers, as without a front.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Redis server and redis-server; run with --ignored"]
async fn a_silent_redis_costs_at_most_its_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sink = tokio::spawn({
        let accepted = accepted.clone();
        async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(socket); // read nothing, answer nothing
            }
        }
    });
    let (_dir, r, scope) = records(
        &format!("redis://127.0.0.1:{port}/"),
        Duration::from_millis(100),
    )
    .await;
    let start = Instant::now();
    let held = claimed(r.claim(&scope, "k", &"a").await.unwrap());
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "the claim waited {:?} on a silent Redis",
        start.elapsed()
    );
    assert!(
        accepted.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "the front never reached the silent server: the test shows nothing"
    );
    // The database's own answer: in flight for the rest of the 30 s lease.
    match r.claim(&scope, "k", &"a").await {
        Err(Error::InFlight { retry_after, .. }) => assert!(retry_after > FRONT_TTL),
        other => panic!("{other:?}"),
    }
    r.complete(&held, &1).await.unwrap();
    assert_eq!(
        r.claim(&scope, "k", &"a").await.unwrap(),
        Claim::Replayed(Stored::Succeeded("1".into()))
    );
    sink.abort();
}

/// A Redis server of the test's own, killed (SIGKILL, by pid) while a request holds its
/// marker: the request still completes, every later answer comes from the database, and
/// nothing waits on the dead server beyond the front's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Redis server and redis-server; run with --ignored"]
async fn a_redis_killed_mid_request_changes_no_answer() {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let mut child = std::process::Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server runs");
    let url = format!("redis://127.0.0.1:{port}/");
    let up = server::eventually(Duration::from_secs(10), || async {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    assert!(up, "the test's own redis-server did not start");
    let (_dir, r, scope) = records(&url, Duration::from_millis(250)).await;

    let held = claimed(r.claim(&scope, "k", &"a").await.unwrap());
    match r.claim(&scope, "k", &"a").await {
        Err(Error::InFlight { retry_after, .. }) => {
            assert!(retry_after <= FRONT_TTL, "shed by the live front")
        }
        other => panic!("{other:?}"),
    }
    child.kill().unwrap(); // SIGKILL, this test's own server only
    child.wait().unwrap();

    let start = Instant::now();
    match r.claim(&scope, "k", &"a").await {
        Err(Error::InFlight { retry_after, .. }) => {
            assert!(retry_after > FRONT_TTL, "answered by the database")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        r.claim(&scope, "k", &"b").await,
        Err(Error::PayloadMismatch { .. })
    ));
    r.complete(&held, &"done").await.unwrap();
    assert_eq!(
        r.claim(&scope, "k", &"a").await.unwrap(),
        Claim::Replayed(Stored::Succeeded(r#""done""#.into()))
    );
    let fresh = claimed(r.claim(&scope, "k2", &"a").await.unwrap());
    r.complete(&fresh, &"fresh").await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "requests waited {:?} on a dead Redis",
        start.elapsed()
    );
}

/// A bad URL or configuration is a typed error, before anything runs.
#[test]
fn bad_front_configuration_is_invalid_input() {
    assert!(matches!(
        RedisFront::new("not a url", FrontConfig::default()),
        Err(Error::InvalidInput(_))
    ));
    let zero = FrontConfig::default().timeout(Duration::ZERO);
    assert!(matches!(
        RedisFront::new(&redis_url(), zero),
        Err(Error::InvalidInput(_))
    ));
}
