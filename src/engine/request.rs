//! The requests an engine takes: built by [`Engine::transition`] (or
//! [`Engine::create`]), given their options, awaited.

use std::future::{Future, IntoFuture};
use std::pin::Pin;

use serde::Serialize;
use tracing::Instrument;

use std::sync::Arc;

use super::attempt;
use super::detach::{Detached, Stage};
use super::input::{Payload, fingerprint, validate_audit, validate_ref};
use super::req::{Conn, Req, write_id};
use super::{Engine, Order, Outcome, created};
use crate::error::Result;
use crate::machine::StateMachine;
use crate::store::{Audit, Key, Lease, Store, Txn, db_error};
use crate::support::trace::TraceContext;

/// A transition request, from [`Engine::transition`] or [`Engine::transition_named`].
/// Nothing happens until it is awaited; the options below may be set first.
///
/// ```no_run
/// # orderly::state_machine! {
/// #     OrderMachine {
/// #         states: OrderState { Created, Paid }
/// #         events: OrderEvent { Pay }
/// #         initial: Created;
/// #         terminal: [Paid];
/// #         transitions: { Created + Pay => Paid }
/// #     }
/// # }
/// # async fn demo(engine: orderly::Engine<OrderMachine, orderly::SqliteStore>) -> Result<(), Box<dyn std::error::Error>> {
/// #[derive(serde::Serialize)]
/// struct Callback { amount: u64, currency: &'static str }
///
/// let callback = Callback { amount: 4200, currency: "EUR" };
/// let outcome = engine
///     .transition(42, OrderEvent::Pay, "pay-7781")
///     .payload(&callback)
///     .await?;
///
/// // Inside your own transaction, with your own writes. On SQLite, begin it with
/// // `BEGIN IMMEDIATE` (it takes the write lock at once); on PostgreSQL and
/// // MySQL/MariaDB, `pool.begin()`.
/// let mut tx = engine.store().pool().begin_with("BEGIN IMMEDIATE").await?;
/// let outcome = engine.transition(43, OrderEvent::Pay, "pay-7782").within(&mut tx).await?;
/// if outcome.is_applied() {
///     // Your own write, once: a repeat of this request is `Replayed` and skips it.
/// }
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[must_use = "a transition does nothing until it is awaited"]
pub struct TransitionRequest<'a, M: StateMachine, S: Store> {
    engine: &'a Engine<M, S>,
    order_id: i64,
    event: Result<M::Event>,
    ref_id: &'a str,
    payload: Option<Result<Payload>>,
    event_body: Option<Result<String>>,
    trace: Option<TraceContext>,
    audit: Audit<'a>,
    conn: Option<&'a mut S::Conn>,
    at_version: Option<i64>,
    armed_in: Option<M::State>,
}

impl<'a, M: StateMachine, S: Store> TransitionRequest<'a, M, S> {
    pub(super) fn new(
        engine: &'a Engine<M, S>,
        order_id: i64,
        event: Result<M::Event>,
        ref_id: &'a str,
    ) -> Self {
        TransitionRequest {
            engine,
            order_id,
            event,
            ref_id,
            payload: None,
            event_body: None,
            trace: None,
            audit: Audit::default(),
            conn: None,
            at_version: None,
            armed_in: None,
        }
    }

    /// A timer's firing: applies only while the entity is at `version` (the version its
    /// state's timer was armed at); at any other, unless recorded before, the answer is
    /// [`Error::Moot`](crate::Error::Moot) and nothing is written.
    pub(crate) fn at_version(mut self, version: i64) -> Self {
        self.at_version = Some(version);
        self
    }

    /// A timer's firing armed by `state` at `version` ([`at_version`](Self::at_version)):
    /// inside a caller's transaction, an edge with no guard, effect or timers is then
    /// written first with the state and the version as its predicate (one statement per
    /// row where a unit would read first), and judged only if that wrote nothing.
    pub(crate) fn armed_at(mut self, state: M::State, version: i64) -> Self {
        self.armed_in = Some(state);
        self.at_version(version)
    }

    /// Who asks for this transition (a user, an operator, a service), stored with the
    /// history row it writes and returned by [`history`](Engine::history): 1 to 255
    /// characters, no control or invisible format characters, no spaces at either end, else
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) when awaited. Not part of the
    /// request's identity: a repeat by someone else is still a replay, and the row keeps
    /// the first call's actor.
    pub fn actor(mut self, actor: &'a str) -> Self {
        self.audit.actor = Some(actor);
        self
    }

    /// Why (free text, line breaks allowed, 1 to 1,000 characters, not blank, no NUL), stored and
    /// returned with the actor, and like it not part of the request's identity.
    pub fn reason(mut self, reason: &'a str) -> Self {
        self.audit.reason = Some(reason);
        self
    }

    /// Attaches the body of the event the transition emits: stored, as JSON, in the
    /// outbox row of an edge that emits (and published as the message's body); ignored
    /// along an edge that emits nothing. It is not part of the request's identity: a
    /// replay writes no event, whatever body it carries (put what must match in the
    /// [`payload`](Self::payload)). A body that does not serialize, or whose JSON is
    /// larger than [`EngineConfig::max_event_body`](super::EngineConfig::max_event_body),
    /// is [`Error::InvalidInput`](crate::Error::InvalidInput) when awaited, and nothing is
    /// written (also along an edge that emits nothing).
    pub fn event_body<B: Serialize + ?Sized>(mut self, body: &B) -> Self {
        self.event_body = Some(event_body(body));
        self
    }

    /// Carries the caller's trace context (W3C `traceparent` and `tracestate`) into the
    /// outbox row of an edge that emits, in the same statement as the move: the relay
    /// then sends it with the message, so the consumer's work joins the caller's trace.
    /// Ignored along an edge that emits nothing; not part of the request's identity (a
    /// replay writes no event). The HTTP layer puts the context of a request's
    /// `traceparent` header in the request's extensions. With the `otel` feature, a call
    /// given none carries its own `orderly.transition` span's context, a child of the
    /// current span, when a `tracing-opentelemetry` layer records it.
    pub fn trace_context(mut self, context: TraceContext) -> Self {
        self.trace = Some(context);
        self
    }

    /// Records `payload` with the transition. Its fingerprint (the SHA-256 of its
    /// canonical JSON) is part of the request's identity: repeating the reference with a
    /// different payload is [`Error::PayloadMismatch`](crate::Error::PayloadMismatch). Two
    /// payloads are the same when they serialize to equal JSON values, whatever the
    /// order of their members. A payload that does not serialize, or that holds a NUL
    /// character, is [`Error::InvalidInput`](crate::Error::InvalidInput) when awaited.
    pub fn payload<P: Serialize + ?Sized>(mut self, payload: &P) -> Self {
        self.payload = Some(fingerprint(payload));
        self
    }

    /// Runs the transition inside the caller's transaction, so the caller's own writes
    /// and the state change commit or roll back together. A lost race (a request
    /// recorded before, a twin that committed first) is undone without aborting the
    /// caller's transaction: on PostgreSQL its one statement changes nothing then; on
    /// MySQL/MariaDB and SQLite, where a failed statement undoes only itself, the update
    /// before the refused history row is restored; a request whose edge emits an event
    /// writes in a savepoint. Any other error may leave the transaction unusable (on
    /// PostgreSQL it is aborted) or holding part of the transition's writes: roll it
    /// back.
    ///
    /// The engine writes first and reads only if that did not settle it, unless
    /// replays are common enough for it to read first. On SQLite, begin the
    /// transaction with `BEGIN IMMEDIATE`; on MySQL/MariaDB the reads take row locks,
    /// since a plain read would see the transaction's snapshot.
    ///
    /// If you drop this future before it completes (a timeout, `select!`), your
    /// connection may be in the middle of a statement, and your transaction may hold
    /// part of the transition's writes: do not commit; roll back by closing
    /// the connection (`PoolConnection::detach`, then drop it). A retryable error here
    /// means your whole transaction is gone: run it again from its `BEGIN`.
    pub fn within(mut self, conn: &'a mut S::Conn) -> Self {
        self.conn = Some(conn);
        self
    }

    async fn run(self) -> Result<Outcome<M::State>> {
        let event = self.event?;
        validate_ref(self.ref_id)?;
        let payload = self.payload.transpose()?;
        let event_body = self.event_body.transpose()?;
        let limit = self.engine.config.max_event_body;
        if let Some(body) = &event_body
            && body.len() > limit
        {
            return Err(crate::error::Error::InvalidInput(format!(
                "the event body is {} bytes, more than max_event_body ({limit})",
                body.len()
            )));
        }
        validate_audit(&self.audit)?;
        let write_id = write_id();
        let Some(conn) = self.conn else {
            return pooled(
                self.engine,
                Call {
                    order_id: self.order_id,
                    event,
                    ref_id: self.ref_id.to_string(),
                    payload,
                    event_body,
                    trace: self.trace,
                    write_id,
                    actor: self.audit.actor.map(str::to_string),
                    reason: self.audit.reason.map(str::to_string),
                    at_version: self.at_version,
                    armed_in: self.armed_in,
                },
            )
            .await;
        };
        let stage = Arc::new(Stage::default());
        let req = Req {
            key: Key {
                order_id: self.order_id,
                event: event.into(),
                ref_id: self.ref_id,
            },
            event,
            payload: payload.as_ref(),
            write_id,
            audit: self.audit,
            stage: &stage,
            event_body: event_body.as_deref(),
            trace: self.trace.as_ref(),
            read_history: Default::default(),
            at_version: self.at_version,
            armed_in: self.armed_in,
        };
        let answer = attempt::run(
            self.engine,
            &mut Conn::Caller(conn),
            &req,
            super::writes::First::Write,
        )
        .await;
        // Counted for `ReadFirst::Adaptive` as on the engine's own connections: else an
        // engine whose requests all run inside callers' transactions would keep reading
        // first after a storm of replays had passed.
        attempt::note_answer(self.engine, &answer);
        answer
    }
}

/// An event body as the outbox stores it: JSON text (bounded when the request runs).
fn event_body<B: Serialize + ?Sized>(body: &B) -> Result<String> {
    serde_json::to_string(body).map_err(|e| {
        crate::error::Error::InvalidInput(format!("the event body does not serialize: {e}"))
    })
}

/// What a pooled call owns.
struct Call<E, St> {
    order_id: i64,
    event: E,
    ref_id: String,
    payload: Option<Payload>,
    event_body: Option<String>,
    trace: Option<TraceContext>,
    write_id: i64,
    actor: Option<String>,
    reason: Option<String>,
    at_version: Option<i64>,
    armed_in: Option<St>,
}

/// A request on the engine's own connections, answered within the engine's deadline.
/// The work owns what it needs, so that if the caller stops waiting (or the deadline
/// passes) its unit is finished off the caller's task (see `detach.rs`).
async fn pooled<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    call: Call<M::Event, M::State>,
) -> Result<Outcome<M::State>> {
    let deadline = engine.config.deadline;
    let stage = Arc::new(Stage::default());
    let work = {
        let (engine, stage) = (engine.clone(), stage.clone());
        async move {
            let req = Req {
                key: Key {
                    order_id: call.order_id,
                    event: call.event.into(),
                    ref_id: &call.ref_id,
                },
                event: call.event,
                payload: call.payload.as_ref(),
                write_id: call.write_id,
                audit: Audit {
                    actor: call.actor.as_deref(),
                    reason: call.reason.as_deref(),
                },
                stage: &stage,
                event_body: call.event_body.as_deref(),
                trace: call.trace.as_ref(),
                read_history: Default::default(),
                at_version: call.at_version,
                armed_in: call.armed_in,
            };
            attempt::pooled(&engine, &req).await
        }
    };
    // Past the deadline, the work is dropped (abandoned: it sends no write it had not
    // sent) before the answer reads how far it got.
    let answer = tokio::time::timeout(deadline, Detached::new(work, deadline, stage.clone())).await;
    answer.map_err(|_| past_deadline(&stage, deadline))?
}

/// The answer of a call whose deadline passed, by how far it got.
pub(super) fn past_deadline(stage: &Stage, deadline: std::time::Duration) -> crate::error::Error {
    if stage.never_connected() {
        crate::error::Error::Unavailable { waited: deadline }
    } else {
        crate::error::Error::DeadlineExceeded {
            deadline,
            in_doubt: stage.sent_a_write(),
        }
    }
}

impl<'a, M: StateMachine, S: Store> IntoFuture for TransitionRequest<'a, M, S> {
    type Output = Result<Outcome<M::State>>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    /// The call runs in its `orderly.transition` span, made when the future is first
    /// polled: a child of the span current there (so `.into_future().instrument(span)`
    /// puts it under `span`).
    fn into_future(self) -> Self::IntoFuture {
        let event: &'static str = match &self.event {
            Ok(event) => (*event).into(),
            Err(_) => "unknown",
        };
        #[cfg_attr(not(feature = "otel"), allow(unused_mut))]
        let mut this = self;
        Box::pin(async move {
            let span = tracing::info_span!(
                "orderly.transition",
                machine = M::NAME,
                event,
                outcome = tracing::field::Empty,
            );
            // With OpenTelemetry, a call given no trace context carries this span's: the
            // event it writes joins the caller's trace as this span's child.
            #[cfg(feature = "otel")]
            if this.trace.is_none() {
                this.trace = TraceContext::of_span(&span);
            }
            let started = std::time::Instant::now();
            async move {
                let engine = this.engine;
                let out = match this.run().await {
                    Err(e) => Err(engine.explain(e).await),
                    ok => ok,
                };
                let outcome = match &out {
                    Ok(Outcome::Applied { .. }) => "applied",
                    Ok(Outcome::Replayed { .. }) => "replayed",
                    Err(e) => crate::observe::error_label(e),
                };
                tracing::Span::current().record("outcome", outcome);
                crate::observe::transition(M::NAME, event, outcome, started.elapsed());
                out
            }
            .instrument(span)
            .await
        })
    }
}

/// A create request, from [`Engine::create`]. Nothing happens until it is awaited.
#[must_use = "a create does nothing until it is awaited"]
pub struct CreateRequest<'a, M: StateMachine, S: Store> {
    engine: &'a Engine<M, S>,
    order_id: i64,
    conn: Option<&'a mut S::Conn>,
}

impl<'a, M: StateMachine, S: Store> CreateRequest<'a, M, S> {
    pub(super) fn new(engine: &'a Engine<M, S>, order_id: i64) -> Self {
        CreateRequest {
            engine,
            order_id,
            conn: None,
        }
    }

    /// Creates the entity inside the caller's transaction, so that it commits or rolls
    /// back with the caller's own writes.
    pub fn within(mut self, conn: &'a mut S::Conn) -> Self {
        self.conn = Some(conn);
        self
    }

    async fn run(self) -> Result<Order<M::State>> {
        let (store, order_id) = (&self.engine.store, self.order_id);
        let row = match self.conn {
            Some(conn) => create::<M, S>(self.engine, conn, order_id, Txn::Caller).await,
            None => {
                let deadline = self.engine.config.deadline;
                return super::within_deadline(deadline, true, async {
                    // A create that arms timers is a unit of its own: with the store's
                    // writer's turn, where it hands them out.
                    let mut lease = if M::timers_of(M::INITIAL).next().is_some() {
                        Lease::acquire_for_write(store).await
                    } else {
                        Lease::acquire(store).await
                    }
                    .map_err(db_error::<S>)?;
                    let row = create::<M, S>(self.engine, lease.conn(), order_id, Txn::Own).await;
                    lease.release_after(&row);
                    created::<M>(order_id, row.map_err(db_error::<S>)?)
                })
                .await;
            }
        };
        created::<M>(order_id, row.map_err(db_error::<S>)?)
    }
}

/// The create: one statement, or, where the initial state carries timers, a unit of its
/// own that creates the entity and arms them (each unless armed before: a repeated create
/// arms nothing new).
async fn create<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    conn: &mut S::Conn,
    order_id: i64,
    txn: Txn,
) -> std::result::Result<crate::store::Entity, sqlx::Error> {
    let store = &engine.store;
    let initial: &'static str = M::INITIAL.into();
    let timers = engine.armed_in(M::INITIAL);
    if timers.is_empty() {
        return store.create(conn, order_id, initial, txn).await;
    }
    let mut unit = store.begin_unit(conn, txn).await?;
    let entity = match unit.create(order_id, initial).await {
        Ok(entity) => entity,
        Err(e) => return Err(unit.fail(e).await),
    };
    if entity.status == initial && entity.version == 0 {
        let arm = crate::store::timers::Arm {
            machine: M::NAME,
            entity_id: order_id,
            state: initial,
            version: 0,
            timers: &timers,
        };
        if let Err(e) = unit.arm(&arm).await {
            return Err(unit.fail(e).await);
        }
    }
    unit.commit().await?;
    Ok(entity)
}

impl<'a, M: StateMachine, S: Store> IntoFuture for CreateRequest<'a, M, S> {
    type Output = Result<Order<M::State>>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        let engine = self.engine;
        Box::pin(async move {
            match self.run().await {
                Err(e) => Err(engine.explain(e).await),
                ok => ok,
            }
        })
    }
}
