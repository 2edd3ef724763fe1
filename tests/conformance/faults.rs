//! Right answers under faults: cancelled calls, lost connections, in-doubt commits,
//! twins on a cycle, canonical payloads, corrupt rows. One body per behaviour, run on
//! every backend (the network faults on the server backends).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use orderly::store::{
    Apply, Entity, ErrorClass, FirstWrite, Key, Observed, OwnedKey, Prior, RawTransition, Request,
    Store, Txn, Written,
};
use orderly::{Engine, Error, Outcome, ReadFirst};
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};

use super::{
    Backend, Eng, OrderEvent::*, OrderState::*, TicketEvent, TicketMachine, TicketState, applied,
    assert_order, config, engine, replayed, with_policy,
};
use crate::server::{Cut, eventually};

/// A server backend reached over TCP, so that its connections can be cut and killed.
#[allow(async_fn_in_trait)]
pub trait Networked: Backend {
    /// Where the server listens.
    fn server(&self) -> std::net::SocketAddr;
    /// Where a proxy cuts the connection right after the server committed a transition:
    /// the reply to the apply-first write.
    const CUT: Cut;
    /// Where a proxy cuts the connection right after the server committed a caller's
    /// transaction: the reply to its `COMMIT`.
    const COMMIT_CUT: Cut;
    /// Where a proxy cuts the connection under the apply-first write of a transition,
    /// whether or not it writes: the reply to the request that carries its statement.
    const WRITE_CUT: Cut;
    /// Bytes that only the request executing the apply-first write carries.
    const WRITE_PATTERN: &'static [u8];
    /// A store whose pool of `max` connections reaches this database through `port` on
    /// loopback.
    async fn store_at(&self, port: u16, max: u32) -> Self::S;
    /// Kills (from another connection) every other session on this database; returns how
    /// many.
    async fn kill_sessions(&self) -> usize;
}

/// Polls `fut` until it is ready or has been pending `k` times, then drops it: the drop
/// lands on the `k`-th await point that was not ready at once. `None` if dropped.
pub(crate) async fn poll_at_most<F: Future>(fut: F, k: usize) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let mut pending = 0;
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(out) => Poll::Ready(Some(out)),
        Poll::Pending if pending >= k => Poll::Ready(None),
        Poll::Pending => {
            pending += 1;
            Poll::Pending
        }
    })
    .await
}

/// The pool got every connection back (or replaced it), they are idle, and no session on
/// the server sits in a transaction.
pub(crate) async fn assert_pool_clean<B: Backend>(b: &B, store: &B::S) {
    assert!(
        eventually(Duration::from_secs(10), || async {
            let (size, idle) = B::pool_counts(store);
            size as usize == idle
        })
        .await,
        "connections never came back to the pool: {:?}",
        B::pool_counts(store)
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            b.open_transactions().await == 0
        })
        .await,
        "a session is left idle in a transaction"
    );
}

/// Every kind of call dropped at every await point it reaches (k = 0, 1, 2, … polls,
/// until it completes), on a pool of one connection so that a connection handed back
/// dirty is certainly the next caller's. After each drop, an order is created through
/// the same engine and must be visible to another connection; afterwards the pool is
/// full and idle, no session on the server sits in a transaction, and every request
/// re-sent is answered as its history says.
pub async fn cancelled_calls_leave_the_pool_clean<B: Backend>(b: &B) {
    for policy in [ReadFirst::Never, ReadFirst::Always] {
        let store = b.small_store(1).await;
        let e: Eng<B> = with_policy(store.clone(), policy);
        let base = if policy == ReadFirst::Never {
            0
        } else {
            100_000
        };
        let next_id = AtomicUsize::new(base);
        let fresh = || next_id.fetch_add(1, Ordering::Relaxed) as i64;
        let mut dropped = HashMap::new();
        let mut touched = Vec::new();
        // (kind, the call): each returns its result, or None when dropped.
        for kind in [
            "new", "replay", "conflict", "create", "get", "history", "in_tx",
        ] {
            let (mut k, mut restarts) = (0, 0);
            while k < 200 {
                let id = fresh();
                e.create(id).await.unwrap();
                if kind != "new" && kind != "create" && kind != "in_tx" {
                    e.transition(id, Pay, "p-1").await.unwrap();
                }
                let done = match kind {
                    "new" => poll_at_most(e.transition(id, Pay, "p-1").into_future(), k)
                        .await
                        .map(|r| {
                            assert_eq!(r.unwrap(), applied(Created, Paid, 1));
                        }),
                    "replay" => poll_at_most(e.transition(id, Pay, "p-1").into_future(), k)
                        .await
                        .map(|r| {
                            assert_eq!(r.unwrap(), replayed(Created, Paid, 1));
                        }),
                    "conflict" => poll_at_most(e.transition(id, Pay, "p-2").into_future(), k)
                        .await
                        .map(|r| {
                            assert!(matches!(r, Err(Error::RefConflict { .. })), "{r:?}");
                        }),
                    "create" => poll_at_most(e.create(id + 50_000).into_future(), k)
                        .await
                        .map(|r| assert_eq!(r.unwrap().version, 0)),
                    "get" => poll_at_most(e.get(id), k).await.map(|r| {
                        r.unwrap();
                    }),
                    "history" => poll_at_most(e.history(id), k).await.map(|r| {
                        r.unwrap();
                    }),
                    _ => {
                        // The caller's transaction on a connection of its own. After a
                        // dropped call that connection is in whatever state the driver
                        // left it (sqlx's MySQL driver can hang on it, holding its locks),
                        // so the caller closes it, as `TransitionRequest::within`'s docs say; only a
                        // completed call is committed.
                        let mut conn = store.acquire().await.unwrap();
                        let mut tx = B::begin_on(&mut conn).await;
                        let request = e.transition(id, Pay, "p-1").within(&mut tx);
                        let done = poll_at_most(request.into_future(), k)
                            .await
                            .map(|r| assert_eq!(r.unwrap(), applied(Created, Paid, 1)));
                        if done.is_some() {
                            B::commit_on(tx).await;
                        } else {
                            drop(tx);
                            <B::S as Store>::discard(conn);
                        }
                        done
                    }
                };
                touched.push(id);
                // Whatever was dropped, the engine's next write is committed and visible.
                let probe = fresh();
                e.create(probe).await.unwrap();
                assert_eq!(
                    b.scalar(&format!("SELECT COUNT(*) FROM orders WHERE id = {probe}"))
                        .await,
                    1,
                    "{kind} dropped after {k} polls: a create through the same pool was acknowledged but not committed"
                );
                if done.is_some() {
                    // Loopback can answer a whole call within one poll now and then; sweep
                    // again until this kind was dropped at least once.
                    if !dropped.contains_key(kind) && restarts < 50 {
                        (k, restarts) = (0, restarts + 1);
                        continue;
                    }
                    break;
                }
                *dropped.entry(kind).or_insert(0) += 1;
                k += 1;
            }
        }
        assert_eq!(
            dropped.len(),
            7,
            "some kind of call was never dropped, so the test shows nothing for it: {dropped:?}"
        );
        assert_pool_clean(b, &store).await;
        // Every request re-sent is answered as the history says; nothing is half-done.
        for id in touched {
            let history = e.history(id).await.unwrap();
            let order = e.get(id).await.unwrap();
            assert_eq!(order.version as usize, history.len(), "order {id}");
            assert!(history.len() <= 1, "order {id}: {history:?}");
            let again = e.transition(id, Pay, "p-1").await.unwrap();
            match history.first() {
                Some(row) if row.ref_id == "p-1" => {
                    assert_eq!(again, replayed(Created, Paid, 1), "order {id}")
                }
                _ => assert_eq!(again, applied(Created, Paid, 1), "order {id}"),
            }
        }
    }
}

/// A connection cut right after the server committed a transition (the proxy drops the
/// reply): the caller is answered `Applied`, read back by the request's identity, and a
/// re-send is `Replayed`. When nothing can be read back either (the proxy refuses new
/// connections), the answer is `InDoubt`, retryable, and the re-send is `Replayed`.
pub async fn in_doubt_commit_is_read_back<B: Networked>(b: &B) {
    let direct = engine(b).await;
    for (n, policy) in [ReadFirst::Never, ReadFirst::Always]
        .into_iter()
        .enumerate()
    {
        let id = 10 * n as i64;
        direct.create(id).await.unwrap();
        let proxy = crate::server::Proxy::start(b.server(), B::CUT).await;
        let e: Eng<B> = with_policy(b.store_at(proxy.port, 4).await, policy);
        let answer = e.transition(id, Pay, "p-1").await;
        assert_eq!(
            proxy.cuts(),
            1,
            "the proxy never cut: the test shows nothing"
        );
        assert_eq!(answer.unwrap(), applied(Created, Paid, 1), "{policy:?}");
        assert_eq!(
            e.transition(id, Pay, "p-1").await.unwrap(),
            replayed(Created, Paid, 1)
        );
        assert_order(&direct, id, Paid, 1, 1).await;

        // Nothing can be read back: in doubt, safe to re-send.
        let id = id + 1;
        direct.create(id).await.unwrap();
        let proxy = crate::server::Proxy::start(b.server(), B::CUT).await;
        proxy.refuse_after_cut();
        let config = config(policy).in_doubt_timeout(Duration::from_millis(500));
        // One connection, so none opened before the cut is left to read with.
        let store = b.store_at(proxy.port, 1).await;
        let e: Eng<B> = Engine::with_config(store, config).unwrap();
        let answer = e.transition(id, Pay, "p-1").await;
        assert_eq!(
            proxy.cuts(),
            1,
            "the proxy never cut: the test shows nothing"
        );
        let err = answer.unwrap_err();
        assert!(
            matches!(err, Error::InDoubt { order_id, ref ref_id, .. } if order_id == id && ref_id == "p-1"),
            "{err:?}"
        );
        assert!(err.is_retryable());
        assert_eq!(
            direct.transition(id, Pay, "p-1").await.unwrap(),
            replayed(Created, Paid, 1)
        );
        assert_order(&direct, id, Paid, 1, 1).await;
    }
}

/// A request applied long ago is re-sent and tried write-first (the engine does not read
/// first); the connection dies under that write. The read-back finds the request's
/// history row, written by the first call and not by this one: the answer is `Replayed`,
/// never `Applied` (a caller that ships on `Applied` would ship twice). The first call's
/// own lost acknowledgement is still `Applied` (`in_doubt_commit_is_read_back`).
pub async fn resent_request_cut_under_its_write_is_replayed<B: Networked>(b: &B) {
    let direct = engine(b).await;
    for (id, policy) in [(1, ReadFirst::Never), (2, ReadFirst::Adaptive)] {
        direct.create(id).await.unwrap();
        assert_eq!(
            direct.transition(id, Pay, "p-1").await.unwrap(),
            applied(Created, Paid, 1)
        );
        let proxy = crate::server::Proxy::start(b.server(), B::WRITE_CUT).await;
        // A fresh engine: an adaptive one starts by writing first.
        let e: Eng<B> = with_policy(b.store_at(proxy.port, 2).await, policy);
        let answer = e.transition(id, Pay, "p-1").await;
        assert_eq!(
            proxy.cuts(),
            1,
            "the proxy never cut: the test shows nothing"
        );
        assert_eq!(answer.unwrap(), replayed(Created, Paid, 1), "{policy:?}");
        assert_order(&direct, id, Paid, 1, 1).await;
    }
}

/// The connection dies right after a write-first statement was sent, while that
/// statement waits on a row lock: the read-back finds nothing yet, the next attempt waits
/// behind the orphaned statement, which then commits. The next attempt finds the row the
/// orphan wrote, which carries this call's write id: the answer is `Applied` (this call's
/// own write), never `Replayed` (which would tell the caller nothing was written).
pub async fn own_write_landing_late_is_applied<B: Networked>(b: &B) {
    let direct = engine(b).await;
    direct.create(1).await.unwrap();
    let mut holder = b.begin().await;
    B::exec_in(
        &mut holder,
        "UPDATE orders SET version = version WHERE id = 1",
    )
    .await;
    let proxy = crate::server::Proxy::start(b.server(), Cut::Forward(B::WRITE_PATTERN)).await;
    let e: Eng<B> = with_policy(b.store_at(proxy.port, 2).await, ReadFirst::Never);
    let call = tokio::spawn(async move { e.transition(1, Pay, "p-1").await });
    // The cut, the read-back (nothing recorded yet) and the next attempt, waiting on the
    // lock behind the orphaned statement.
    assert!(
        crate::server::eventually(Duration::from_secs(10), || async { proxy.cuts() == 1 }).await,
        "the proxy never cut: the test shows nothing"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    B::rollback(holder).await;
    let answer = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("no answer")
        .unwrap();
    assert_eq!(answer.unwrap(), applied(Created, Paid, 1));
    assert_order(&direct, 1, Paid, 1, 1).await;
}

/// The database stops answering (a proxy freezes: a dead node, a cut network) under 16
/// concurrent calls on a pool of 4. Every call is answered within its deadline (plus
/// scheduling slack), with an error that says what happened and is retryable:
/// `Unavailable` for a call that never got a connection, `DeadlineExceeded` for one
/// whose statement went unanswered, never `Contention`. Once the database answers
/// again, every request re-sent is answered as the history says.
pub async fn dead_database_answers_within_the_deadline<B: Networked>(b: &B) {
    const CALLS: i64 = 16;
    let deadline = Duration::from_millis(500);
    let direct = engine(b).await;
    for id in 0..=CALLS {
        direct.create(id).await.unwrap();
    }
    let proxy =
        crate::server::Proxy::start(b.server(), Cut::Request(b"no request holds this")).await;
    let config = config(ReadFirst::Never).deadline(deadline);
    let e: Eng<B> = Engine::with_config(b.store_at(proxy.port, 4).await, config).unwrap();
    assert!(e.transition(0, Pay, "p-0").await.unwrap().is_applied());
    proxy.freeze();
    let calls: Vec<_> = (1..=CALLS)
        .map(|id| {
            let e = e.clone();
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let answer = e.transition(id, Pay, "p-1").await;
                (answer, started.elapsed())
            })
        })
        .collect();
    let mut unavailable = 0;
    for call in calls {
        let (answer, took) = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("a call on a dead database was not answered within 20 s")
            .unwrap();
        assert!(
            took < deadline * 4,
            "answered after {took:?}, past the deadline of {deadline:?}"
        );
        let err = answer.unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
        match err {
            Error::Unavailable { .. } => unavailable += 1,
            Error::DeadlineExceeded { .. } => {}
            other => panic!("a dead database answered {other:?}"),
        }
    }
    assert!(
        unavailable >= CALLS - 4,
        "only {unavailable} of {CALLS} calls, most of them without a connection, said the database was unavailable"
    );
    proxy.thaw();
    for id in 1..=CALLS {
        let again = direct.transition(id, Pay, "p-1").await.unwrap();
        assert_eq!(again.version(), 1, "order {id}");
        assert_order(&direct, id, Paid, 1, 1).await;
    }
}

/// Transitions dropped by their callers in the middle of their conversation with the
/// database (after 1 or 2 pending polls: a client timeout) are finished off the
/// caller's task: on a pool of one connection through a proxy that counts connections,
/// dropped calls do not make the pool reconnect, every dropped request is applied at
/// most once, and the connection is never handed on inside a transaction nobody began (the
/// next call's write is committed and visible elsewhere).
pub async fn cancelled_calls_return_their_connection_warm<B: Networked>(b: &B) {
    let direct = engine(b).await;
    let proxy =
        crate::server::Proxy::start(b.server(), Cut::Request(b"no request holds this")).await;
    let store = b.store_at(proxy.port, 1).await;
    let e: Eng<B> = with_policy(store.clone(), ReadFirst::Never);
    direct.create(0).await.unwrap();
    assert!(e.transition(0, Pay, "p-0").await.unwrap().is_applied());
    let opened = proxy.accepted();
    let (mut dropped, mut sent) = (0, 0);
    // Until 30 calls were dropped mid-conversation (loopback answers some within a poll).
    while dropped < 30 && sent < 300 {
        sent += 1;
        let id = sent;
        direct.create(id).await.unwrap();
        let k = 1 + (id as usize) % 2;
        if poll_at_most(e.transition(id, Pay, "p-1").into_future(), k)
            .await
            .is_none()
        {
            dropped += 1;
        }
        // The next caller's write commits: the connection it got was in no transaction.
        let probe = 10_000 + id;
        e.create(probe).await.unwrap();
        assert_eq!(
            b.scalar(&format!("SELECT COUNT(*) FROM orders WHERE id = {probe}"))
                .await,
            1,
            "after order {id}: an acknowledged create was not committed"
        );
    }
    assert!(
        dropped >= 30,
        "only {dropped} of {sent} calls were dropped mid-conversation: the test shows little"
    );
    // A drop can still land in the pool's own check of an idle connection (sqlx pings it
    // before handing it out, and closes it if that is cut short): that is the driver's,
    // and rare. Closing every dropped call's connection would reconnect once per drop.
    let reconnects = proxy.accepted() - opened;
    assert!(
        reconnects * 4 <= dropped,
        "{reconnects} reconnects for {dropped} dropped calls: dropped calls close their connections"
    );
    assert_pool_clean(b, &store).await;
    // Re-sent, every request is answered as the history says: `Replayed` where the
    // dropped call's unit was finished, `Applied` where it was dropped before it got a
    // connection; never twice.
    for id in 1..=sent {
        let again = direct.transition(id, Pay, "p-1").await.unwrap();
        assert_eq!(again.version(), 1, "order {id}");
        assert_order(&direct, id, Paid, 1, 1).await;
    }
}

/// Transitions under load while another connection kills the engine's sessions. The
/// engine gets one attempt per request, so a killed connection reaches the caller: every
/// such error is retryable, and re-sending every request afterwards is answered as its
/// history says (`Replayed` where a killed call had in fact committed).
pub async fn killed_connections_are_retryable<B: Networked>(b: &B) {
    const ORDERS: i64 = 400;
    const TASKS: usize = 8;
    let direct = engine(b).await;
    for id in 0..ORDERS {
        direct.create(id).await.unwrap();
    }
    let config = config(ReadFirst::Adaptive).max_attempts(1);
    let store = b.store_at(b.server().port(), 8).await;
    let e: Eng<B> = Engine::with_config(store, config).unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (e, next) = (e.clone(), next.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= 3 * ORDERS as usize {
                        return answers;
                    }
                    // Each order: Pay p-1, then Pay p-1 again, then Ship s-1.
                    let id = (i % ORDERS as usize) as i64;
                    let (event, r) = match i / ORDERS as usize {
                        2 => (Ship, "s-1"),
                        _ => (Pay, "p-1"),
                    };
                    answers.push((id, event, r, e.transition(id, event, r).await));
                }
            })
        })
        .collect();
    let mut kills = 0;
    let killing = async {
        while !tasks.iter().all(|t| t.is_finished()) {
            kills += b.kill_sessions().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    killing.await;
    let mut errors = 0;
    let mut answers = Vec::new();
    for t in tasks {
        answers.extend(t.await.unwrap());
    }
    for (id, event, r, answer) in &answers {
        match answer {
            Ok(_) | Err(Error::InvalidTransition { .. }) => {}
            Err(err) => {
                errors += 1;
                assert!(
                    err.is_retryable(),
                    "order {id} {event:?} {r}: a killed connection answered do-not-retry: {err:?}"
                );
            }
        }
    }
    assert!(kills > 0, "no session was killed");
    assert!(
        errors > 0,
        "{kills} kills never reached a caller: the test shows nothing"
    );
    // Re-send everything in order: the history decides every answer, and of all the
    // answers one request got (the load's and the re-send's), at most one is `Applied`:
    // a killed call whose write had committed is `Replayed` when re-sent, and a re-send
    // cut under its write is `Replayed` too.
    let mut answers = answers;
    for id in 0..ORDERS {
        let pay = direct.transition(id, Pay, "p-1").await;
        assert_eq!(pay.as_ref().unwrap().version(), 1, "order {id}");
        answers.push((id, Pay, "p-1", pay));
        let ship = direct.transition(id, Ship, "s-1").await;
        assert_eq!(ship.as_ref().unwrap().version(), 2, "order {id}");
        answers.push((id, Ship, "s-1", ship));
        assert_order(&direct, id, Shipped, 2, 2).await;
    }
    let mut applied_per_request: HashMap<(i64, &str), usize> = HashMap::new();
    for (id, _, r, answer) in &answers {
        if matches!(answer, Ok(o) if o.is_applied()) {
            *applied_per_request.entry((*id, *r)).or_default() += 1;
        }
    }
    for ((id, r), n) in applied_per_request {
        assert_eq!(n, 1, "order {id} {r}: {n} calls were told Applied");
    }
    // Every `Applied` the load was told is one recorded row.
    for (id, event, _, answer) in answers {
        if let Ok(Outcome::Applied { version, .. }) = answer {
            let h = direct.history(id).await.unwrap();
            assert_eq!(h[version as usize - 1].event, event, "order {id}");
        }
    }
}

/// A store that watches another. It runs a hook (once) just before the refusal's
/// latest-reference read: the window in which a twin on another engine can apply this
/// very request. With `widen`, every such read also waits a varying 0–2 ms first,
/// widening that window for racing engines; `own_refs` counts the reads that found the
/// request's own reference (the race happened). It counts the retryable errors the
/// database returned to any operation (a premise check for tests of retries).
#[derive(Clone)]
pub struct Hooked<S> {
    inner: S,
    #[allow(clippy::type_complexity)]
    hook: Arc<Mutex<Option<Pin<Box<dyn Future<Output = ()> + Send>>>>>,
    widen: bool,
    reads: Arc<AtomicUsize>,
    own_refs: Arc<AtomicUsize>,
    retryable: Arc<AtomicUsize>,
}

impl<S: Store> Hooked<S> {
    pub fn new(
        inner: S,
        hook: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
        widen: bool,
    ) -> Self {
        Hooked {
            inner,
            hook: Arc::new(Mutex::new(hook)),
            widen,
            reads: Arc::default(),
            own_refs: Arc::default(),
            retryable: Arc::default(),
        }
    }

    /// How many retryable errors the database returned so far.
    pub fn retryable_errors(&self) -> usize {
        self.retryable.load(Ordering::Relaxed)
    }

    fn seen<T>(&self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        if let Err(e) = &result
            && S::classify(e) == ErrorClass::Retryable
        {
            self.retryable.fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}

impl<S: Store> Store for Hooked<S> {
    type Conn = S::Conn;
    type Pooled = S::Pooled;
    const READ_FIRST_FROM: u32 = S::READ_FIRST_FROM;
    const BATCH_READ_MAX: usize = S::BATCH_READ_MAX;

    async fn acquire(&self) -> Result<Self::Pooled, sqlx::Error> {
        self.inner.acquire().await
    }
    fn discard(conn: Self::Pooled) {
        S::discard(conn)
    }
    fn classify(err: &sqlx::Error) -> ErrorClass {
        S::classify(err)
    }
    async fn apply_first(
        &self,
        conn: &mut Self::Conn,
        requests: &[Request<'_>],
    ) -> Result<Vec<FirstWrite>, sqlx::Error> {
        self.seen(self.inner.apply_first(conn, requests).await)
    }
    async fn observe(
        &self,
        conn: &mut Self::Conn,
        key: Key<'_>,
        txn: Txn,
    ) -> Result<Option<Observed>, sqlx::Error> {
        self.seen(self.inner.observe(conn, key, txn).await)
    }
    async fn apply(
        &self,
        conn: &mut Self::Conn,
        apply: &Apply<'_>,
        txn: Txn,
    ) -> Result<Written, sqlx::Error> {
        self.seen(self.inner.apply(conn, apply, txn).await)
    }
    async fn latest_ref(
        &self,
        conn: &mut Self::Conn,
        key: Key<'_>,
        txn: Txn,
    ) -> Result<Option<String>, sqlx::Error> {
        let hook = self.hook.lock().unwrap().take();
        if let Some(hook) = hook {
            hook.await;
        }
        let n = self.reads.fetch_add(1, Ordering::Relaxed) as u64;
        if self.widen {
            // A varying wait (a multiplicative hash of the count), not a random one.
            let micros = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 53;
            tokio::time::sleep(Duration::from_micros(micros)).await;
        }
        let latest = self.seen(self.inner.latest_ref(conn, key, txn).await);
        if matches!(&latest, Ok(Some(r)) if r == key.ref_id) {
            self.own_refs.fetch_add(1, Ordering::Relaxed);
        }
        latest
    }
    async fn prior(
        &self,
        conn: &mut Self::Conn,
        key: Key<'_>,
        txn: Txn,
    ) -> Result<Option<Prior>, sqlx::Error> {
        self.seen(self.inner.prior(conn, key, txn).await)
    }
    async fn priors(
        &self,
        conn: &mut Self::Conn,
        keys: &[OwnedKey],
    ) -> Result<Vec<Option<Prior>>, sqlx::Error> {
        self.seen(self.inner.priors(conn, keys).await)
    }
    async fn create(
        &self,
        conn: &mut Self::Conn,
        order_id: i64,
        initial: &'static str,
        txn: Txn,
    ) -> Result<Entity, sqlx::Error> {
        self.seen(self.inner.create(conn, order_id, initial, txn).await)
    }
    async fn get(
        &self,
        conn: &mut Self::Conn,
        order_id: i64,
    ) -> Result<Option<Entity>, sqlx::Error> {
        self.seen(self.inner.get(conn, order_id).await)
    }
    async fn history(
        &self,
        conn: &mut Self::Conn,
        order_id: i64,
    ) -> Result<Vec<RawTransition>, sqlx::Error> {
        self.seen(self.inner.history(conn, order_id).await)
    }

    async fn count_by_status(
        &self,
        conn: &mut Self::Conn,
    ) -> Result<Vec<(String, i64)>, sqlx::Error> {
        self.seen(self.inner.count_by_status(conn).await)
    }

    async fn by_ref(
        &self,
        conn: &mut Self::Conn,
        ref_id: &str,
        limit: i64,
    ) -> Result<Vec<orderly::store::RefRow>, sqlx::Error> {
        self.seen(self.inner.by_ref(conn, ref_id, limit).await)
    }
}

/// On a cycle, a twin of this request (on another engine) is applied between this
/// engine's judging read (which found the event refused) and its read of the event's
/// latest reference, which is now this request's own: the answer is `Replayed`, never
/// `RefConflict` naming itself.
pub async fn twin_on_a_cycle_is_replayed_not_a_conflict<B: Backend>(b: &B) {
    use TicketEvent::*;
    use TicketState::*;
    for (n, policy) in [ReadFirst::Never, ReadFirst::Always]
        .into_iter()
        .enumerate()
    {
        let id = n as i64;
        let rival: Engine<TicketMachine, B::S> =
            with_policy(b.store(Duration::from_secs(10)).await, policy);
        rival.create(id).await.unwrap();
        rival.transition(id, Start, "s").await.unwrap();
        // Working: Unblock is refused here. The twin blocks and unblocks with u-2.
        let hook: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin({
            let rival = rival.clone();
            async move {
                rival.transition(id, Block, "b-2").await.unwrap();
                let twin = rival.transition(id, Unblock, "u-2").await.unwrap();
                assert!(twin.is_applied());
            }
        });
        let hooked = Hooked::new(b.store(Duration::from_secs(10)).await, Some(hook), false);
        let e: Engine<TicketMachine, Hooked<B::S>> = with_policy(hooked.clone(), policy);
        let answer = e.transition(id, Unblock, "u-2").await;
        assert!(
            hooked.hook.lock().unwrap().is_none(),
            "the twin never stepped in: the test shows nothing"
        );
        assert_eq!(
            answer.unwrap(),
            Outcome::Replayed {
                from: Blocked,
                to: Working,
                version: 3
            },
            "{policy:?}"
        );
        let t = rival.get(id).await.unwrap();
        assert_eq!((t.state, t.version), (Working, 3));
    }
}

/// Two engines (two pools, as on two servers) race around a cycle with shared references,
/// the window between the judging read and the latest-reference read widened by a short
/// wait. Invariant: no answer names the request's own reference as a conflict, and every
/// `RefConflict` names a reference recorded for that event on that ticket. The race is
/// shown to have happened: some latest-reference reads found the request's own reference.
pub async fn racing_engines_never_conflict_with_themselves<B: Backend>(b: &B) {
    use TicketEvent::*;
    const TICKETS: i64 = 6;
    const TASKS: usize = 16;
    const PER_TASK: usize = 150;
    // Rounds on fresh tickets until the window was hit a few times (bounded: on SQLite,
    // whose writes are serialized and coalesced, ten rounds sometimes saw no hit).
    const ROUNDS: i64 = 40;
    const HITS: usize = 3;
    let mut stores = Vec::new();
    for _ in 0..2 {
        stores.push(Hooked::new(
            b.store(Duration::from_secs(10)).await,
            None,
            true,
        ));
    }
    let engines: Vec<Engine<TicketMachine, Hooked<B::S>>> = stores
        .iter()
        .map(|s| with_policy(s.clone(), B::POLICY))
        .collect();
    let own_refs = || -> usize {
        stores
            .iter()
            .map(|s| s.own_refs.load(Ordering::Relaxed))
            .sum()
    };
    let mut conflicts = Vec::new();
    let mut tickets = 0..0;
    for round in 0..ROUNDS {
        if own_refs() >= HITS {
            break;
        }
        let first = round * TICKETS;
        tickets = 0..first + TICKETS;
        for id in first..first + TICKETS {
            engines[0].create(id).await.unwrap();
            engines[0].transition(id, Start, "s").await.unwrap();
        }
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let e = engines[t % 2].clone();
                tokio::spawn(async move {
                    // Tasks 2k and 2k + 1, on the two engines, send the same requests:
                    // every request has a twin racing it.
                    let mut seed = [0u8; 32];
                    seed[0] = (t / 2) as u8;
                    seed[1] = 0x3e;
                    seed[2] = round as u8;
                    let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
                    let mut conflicts = Vec::new();
                    for _ in 0..PER_TASK {
                        let id = first + (rng.next_u64() % TICKETS as u64) as i64;
                        let event = if rng.next_u64().is_multiple_of(2) {
                            Block
                        } else {
                            Unblock
                        };
                        let r = format!("r{}", rng.next_u64() % 64);
                        match e.transition(id, event, &r).await {
                            Ok(_) | Err(Error::InvalidTransition { .. }) => {}
                            Err(Error::RefConflict { existing_ref, .. }) => {
                                conflicts.push((id, event, r, existing_ref))
                            }
                            Err(other) => panic!("unexpected {other:?}"),
                        }
                    }
                    conflicts
                })
            })
            .collect();
        for t in tasks {
            conflicts.extend(t.await.unwrap());
        }
    }
    assert!(
        conflicts.len() > 10,
        "too few conflicts: {}",
        conflicts.len()
    );
    assert!(
        own_refs() > 0,
        "no twin ever stepped into the window: the test shows nothing"
    );
    let mut recorded = HashMap::new();
    for id in tickets {
        for row in engines[1].history(id).await.unwrap() {
            recorded
                .entry((id, row.event))
                .or_insert_with(Vec::new)
                .push(row.ref_id);
        }
    }
    for (id, event, r, existing) in conflicts {
        assert_ne!(
            r, existing,
            "ticket {id}: {event:?} {r} conflicted with itself"
        );
        assert!(
            recorded[&(id, event)].contains(&existing),
            "ticket {id}: {event:?} {r} named {existing}, never recorded for {event:?}"
        );
    }
}

#[derive(serde::Serialize)]
struct PaymentAb {
    amount: u32,
    currency: &'static str,
    card: &'static str,
}

#[derive(serde::Serialize)]
struct PaymentBa {
    currency: &'static str,
    card: &'static str,
    amount: u32,
}

/// Payloads equal as JSON values are one payload whatever their member order: a struct
/// with its fields declared in another order, a `HashMap` built anew (its iteration order
/// differs between instances). A NUL character is `InvalidInput` on every backend, and
/// nothing is written.
pub async fn same_payload_in_any_member_order_is_replayed<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    let ab = PaymentAb {
        amount: 100,
        currency: "EUR",
        card: "4242",
    };
    let ba = PaymentBa {
        currency: "EUR",
        card: "4242",
        amount: 100,
    };
    assert_ne!(
        serde_json::to_string(&ab).unwrap(),
        serde_json::to_string(&ba).unwrap()
    );
    let first = e.transition(1, Pay, "p-1").payload(&ab).await.unwrap();
    assert_eq!(first, applied(Created, Paid, 1));
    let again = e.transition(1, Pay, "p-1").payload(&ba).await.unwrap();
    assert_eq!(again, replayed(Created, Paid, 1));
    let json = serde_json::json!({"card": "4242", "amount": 100, "currency": "EUR"});
    let again = e.transition(1, Pay, "p-1").payload(&json).await.unwrap();
    assert_eq!(again, replayed(Created, Paid, 1));
    // A value that differs is still another payload.
    let other = serde_json::json!({"card": "4242", "amount": 101, "currency": "EUR"});
    assert!(matches!(
        e.transition(1, Pay, "p-1").payload(&other).await,
        Err(Error::PayloadMismatch { .. })
    ));

    // HashMaps: build until two instances iterate in different orders.
    let map = || -> HashMap<String, u32> { (0..24).map(|i| (format!("k{i}"), i)).collect() };
    let one = map();
    let two = (0..100)
        .map(|_| map())
        .find(|m| serde_json::to_string(m).unwrap() != serde_json::to_string(&one).unwrap())
        .expect("two HashMaps that iterate in different orders");
    e.create(2).await.unwrap();
    assert!(
        e.transition(2, Pay, "p-1")
            .payload(&one)
            .await
            .unwrap()
            .is_applied()
    );
    assert_eq!(
        e.transition(2, Pay, "p-1").payload(&two).await.unwrap(),
        replayed(Created, Paid, 1)
    );
    let stored = &e.history(2).await.unwrap()[0];
    assert_eq!(stored.payload, Some(serde_json::to_value(&one).unwrap()));

    // NUL: one answer on every backend, before any write.
    e.create(3).await.unwrap();
    for bad in [
        serde_json::json!({"note": "a\u{0}b"}),
        serde_json::json!({"a\u{0}": 1}),
        serde_json::json!([["\u{0}"]]),
    ] {
        let err = e.transition(3, Pay, "p-1").payload(&bad).await.unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    }
    assert_order(&e, 3, Created, 0, 0).await;
}

/// Row 8 of the outcome table: a negative version, or a status with trailing spaces, is
/// `CorruptState` and nothing is written, on every backend. References, events and states
/// compare exactly: `x` and `x ` are two references everywhere.
pub async fn corrupt_rows_are_reported_not_written_over<B: Backend>(b: &B) {
    for policy in [ReadFirst::Never, ReadFirst::Always] {
        let e: Eng<B> = with_policy(b.store(Duration::from_secs(10)).await, policy);
        b.exec("DELETE FROM orders").await;
        e.create(1).await.unwrap();
        b.exec("UPDATE orders SET version = -4 WHERE id = 1").await;
        let err = e.transition(1, Pay, "p-1").await.unwrap_err();
        assert!(
            matches!(err, Error::CorruptState { order_id: 1, .. }),
            "{policy:?}: {err:?}"
        );
        assert!(matches!(e.get(1).await, Err(Error::CorruptState { .. })));
        assert_eq!(
            b.scalar("SELECT version FROM orders WHERE id = 1").await,
            -4
        );

        e.create(2).await.unwrap();
        b.exec("UPDATE orders SET status = 'Created  ' WHERE id = 2")
            .await;
        let err = e.transition(2, Pay, "p-1").await.unwrap_err();
        assert!(
            matches!(err, Error::CorruptState { order_id: 2, ref value } if value == "Created  "),
            "{policy:?}: {err:?}"
        );
        assert_eq!(b.scalar("SELECT version FROM orders WHERE id = 2").await, 0);
        assert_eq!(b.scalar("SELECT COUNT(*) FROM order_transitions").await, 0);
    }
    b.exec(
        "INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) \
         VALUES (9, 1, 'Created', 'Paid', 'Pay', 'x'), (9, 2, 'Created', 'Paid', 'Pay', 'x ')",
    )
    .await;
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM order_transitions WHERE order_id = 9 AND ref_id = 'x'")
            .await,
        1
    );
}

/// A stored version at `i64::MAX` cannot move: the next version does not exist. Every
/// policy answers `CorruptState` (never the database's overflow error) and writes
/// nothing; `get` says the same.
pub async fn version_at_its_limit_is_corrupt_state<B: Backend>(b: &B) {
    for (id, policy) in [(1, ReadFirst::Never), (2, ReadFirst::Always)] {
        let e: Eng<B> = with_policy(b.store(Duration::from_secs(10)).await, policy);
        e.create(id).await.unwrap();
        b.exec(&format!(
            "UPDATE orders SET version = {} WHERE id = {id}",
            i64::MAX
        ))
        .await;
        let err = e.transition(id, Pay, "p-1").await.unwrap_err();
        assert!(
            matches!(err, Error::CorruptState { order_id, .. } if order_id == id),
            "{policy:?}: {err:?}"
        );
        assert!(matches!(e.get(id).await, Err(Error::CorruptState { .. })));
        assert_eq!(
            b.scalar(&format!("SELECT version FROM orders WHERE id = {id}"))
                .await,
            i64::MAX
        );
        assert_eq!(
            b.scalar(&format!(
                "SELECT COUNT(*) FROM order_transitions WHERE order_id = {id}"
            ))
            .await,
            0
        );
    }
}

/// A request inside a caller's transaction, on a connection cut at each of the
/// statements its unit sends there (`cuts`: a name, where the proxy cuts, before the
/// statement reaches the server or right after, and the request): a new request
/// (`Block`, "b-2"), or one recorded before on a cycle that brought the ticket back to
/// its source state (`Block`, "b-1", whose unit writes, is refused by the history's
/// unique key and restores what it wrote). The server rolls the caller's transaction
/// back with its connection: the call is answered with a retryable error, the ticket is
/// as it was, and the request re-sent is answered as the history says.
pub async fn caller_transaction_cut_at_each_statement<B: Networked>(
    b: &B,
    cuts: &[(&'static str, Cut, &'static str)],
) {
    use TicketEvent::*;
    use TicketState::*;
    let direct: Engine<TicketMachine, B::S> =
        with_policy(b.store(Duration::from_secs(10)).await, ReadFirst::Never);
    for (id, &(what, cut, reference)) in (1..).zip(cuts) {
        direct.create(id).await.unwrap();
        direct.transition(id, Start, "s").await.unwrap();
        direct.transition(id, Block, "b-1").await.unwrap();
        direct.transition(id, Unblock, "u-1").await.unwrap();
        // A connection of its own, so that every statement's text goes out (prepared on
        // the connection's first use of it).
        let proxy = crate::server::Proxy::start(b.server(), cut).await;
        let store = b.store_at(proxy.port, 1).await;
        let e: Engine<TicketMachine, B::S> = with_policy(store.clone(), ReadFirst::Never);
        let mut conn = store.acquire().await.unwrap();
        let answer = {
            let mut tx = B::begin_on(&mut conn).await;
            tokio::time::timeout(
                Duration::from_secs(20),
                e.transition(id, Block, reference).within(&mut tx),
            )
            .await
            .expect("no answer")
        };
        let case = format!("cut {what}, request {reference}");
        assert_eq!(
            proxy.cuts(),
            1,
            "{case}: the proxy never cut, the test shows nothing"
        );
        let error = answer.expect_err(&case);
        assert!(error.is_retryable(), "{case}: {error:?}");
        <B::S as Store>::discard(conn);
        // The server rolls back the dead connection's transaction.
        let as_it_was = eventually(Duration::from_secs(5), || async {
            let t = direct.get(id).await.unwrap();
            (t.state, t.version) == (Working, 3)
        })
        .await;
        assert!(as_it_was, "{case}: {:?}", direct.get(id).await);
        assert_eq!(direct.history(id).await.unwrap().len(), 3, "{case}");
        let again = direct.transition(id, Block, reference).await.unwrap();
        let expected = if reference == "b-1" {
            Outcome::Replayed {
                from: Working,
                to: Blocked,
                version: 2,
            }
        } else {
            Outcome::Applied {
                from: Working,
                to: Blocked,
                version: 4,
            }
        };
        assert_eq!(again, expected, "{case}");
    }
}
