//! A store that runs a hook before each of its operations (to cut, delay or fail one),
//! delegating the rest to the store it wraps.

#[allow(unused_imports)]
use super::*;

/// A store that watches another. It runs a hook (once) just before the refusal's
/// latest-reference read: the window in which a twin on another engine can apply this
/// very request. With `widen`, every such read also waits a varying 0–2 ms first,
/// widening that window for racing engines; `own_refs` counts the reads that found the
/// request's own reference (the race happened). It counts the retryable errors the
/// database returned to any operation (a premise check for tests of retries).
#[derive(Clone)]
pub struct Hooked<S> {
    pub(crate) inner: S,
    #[allow(clippy::type_complexity)]
    pub(crate) hook: Arc<Mutex<Option<Pin<Box<dyn Future<Output = ()> + Send>>>>>,
    pub(crate) widen: bool,
    pub(crate) reads: Arc<AtomicUsize>,
    pub(crate) own_refs: Arc<AtomicUsize>,
    pub(crate) retryable: Arc<AtomicUsize>,
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

/// Creates and checks no table (the default schema): its tables are its inner store's.
impl<S: Store> orderly::store::Schema for Hooked<S> {}

impl<S: Store> Store for Hooked<S> {
    type Conn = S::Conn;
    type Pooled = S::Pooled;
    const READ_FIRST_FROM: u32 = S::READ_FIRST_FROM;
    const BATCH_READ_MAX: usize = S::BATCH_READ_MAX;

    async fn acquire(&self) -> Result<Self::Pooled, sqlx::Error> {
        self.inner.acquire().await
    }
    fn give_back(&self, conn: Self::Pooled) {
        self.inner.give_back(conn)
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
    fn writes_unpooled(&self) -> bool {
        self.inner.writes_unpooled()
    }
    async fn apply_first_unpooled(
        &self,
        requests: &[Request<'_>],
    ) -> Result<Unpooled, sqlx::Error> {
        self.seen(self.inner.apply_first_unpooled(requests).await)
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
}
