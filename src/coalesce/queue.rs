//! The turn behind every coalescing queue (the engine's read-first reads and apply-first
//! writes, the records' claims, the flows' starts): one statement in flight at a time,
//! and the callers that arrive meanwhile queued for the next, which carries them all.
//!
//! Nothing waits on purpose: a caller that finds the turn free takes it and goes at
//! once, alone, on its own task, so a lone caller pays what it would pay without the
//! queue. When it is done (or gives up), it hands the turn on: to a task of its own,
//! the owner's [`Drain`], if callers queued meanwhile, so that no caller's answer waits
//! for theirs and no caller that gives up strands them; otherwise the turn is free. The
//! drain takes batch after batch until the queue is empty.
//!
//! The turn is a guard ([`Turn`]) that owns a handle to its queue's owner, so it can go
//! with the task it is handed to: made before the task is spawned, and outside the
//! queue's lock, it frees the turn whenever the task ends, even dropped before it first
//! ran (its runtime shutting down). A drain that ends any other way than by emptying the
//! queue (a panic, its task dropped) answers the callers still queued "failed" (their
//! items dropped, and with them their reply senders), so that no later caller waits
//! behind a turn nobody holds.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

/// What owns a queue, and serves it.
pub(crate) trait Drain: Send + Sync + Sized + 'static {
    /// A queued caller's request, with its reply sender.
    type Item: Send;

    fn queue(&self) -> &Queue<Self::Item>;

    /// Serves the queue, batch by batch ([`Queue::next`]), until it is empty.
    fn drain(self: Arc<Self>, turn: Turn<Self>) -> impl Future<Output = ()> + Send;
}

/// The queued callers, and whether the turn is taken.
pub(crate) struct Queue<T> {
    state: Mutex<State<T>>,
}

struct State<T> {
    waiting: Vec<T>,
    busy: bool,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue {
            state: Mutex::new(State {
                waiting: Vec::new(),
                busy: false,
            }),
        }
    }
}

/// A caller's place: the turn, or in the queue with what it waits on.
pub(crate) enum Entered<D: Drain, R> {
    /// The turn was free: this caller goes at once, alone.
    Alone(Turn<D>),
    /// Queued for the next batch.
    Queued(R),
}

impl<T> Queue<T> {
    /// Takes the turn for a caller of `owner`'s queue, or queues the item `item()` makes
    /// (with what the caller waits on for its answer).
    pub(crate) fn enter<D, R>(owner: &Arc<D>, item: impl FnOnce() -> (T, R)) -> Entered<D, R>
    where
        D: Drain<Item = T>,
    {
        let mut state = owner.queue().lock();
        if state.busy {
            let (item, waits) = item();
            state.waiting.push(item);
            Entered::Queued(waits)
        } else {
            state.busy = true;
            Entered::Alone(Turn {
                owner: Arc::clone(owner),
                held: true,
                draining: false,
            })
        }
    }

    /// The next batch for the drain holding `turn`: what `take` takes from the queue.
    /// `None` once `take` takes nothing and nothing is left: the turn is then free.
    pub(crate) fn next<D>(
        turn: &mut Turn<D>,
        take: impl FnOnce(&mut Vec<T>) -> Vec<T>,
    ) -> Option<Vec<T>>
    where
        D: Drain<Item = T>,
    {
        let mut state = turn.owner.queue().lock();
        let batch = take(&mut state.waiting);
        if batch.is_empty() && state.waiting.is_empty() {
            state.busy = false;
            turn.held = false;
            return None;
        }
        Some(batch)
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // The state is a queue and a flag, consistent after every statement that holds
        // the lock, so a panic elsewhere while it was held leaves it usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Up to `max` of the queued items, the first ones, keeping those `keep` keeps (a
/// caller that stopped waiting is left out, never sent).
pub(crate) fn first<T>(waiting: &mut Vec<T>, max: usize, keep: impl Fn(&T) -> bool) -> Vec<T> {
    waiting.retain(|item| keep(item));
    let n = waiting.len().min(max);
    waiting.drain(..n).collect()
}

/// The turn, held by one caller, or one drain, at a time.
pub(crate) struct Turn<D: Drain> {
    owner: Arc<D>,
    held: bool,
    /// Held by a drain: freed, not handed on, if it ends before the queue is empty.
    draining: bool,
}

impl<D: Drain> Turn<D> {
    /// Done with the turn: handed on to a drain for the callers queued meanwhile, or
    /// freed. (Dropping the turn does the same.)
    pub(crate) fn hand_on(self) {}

    fn free(&mut self) {
        self.held = false;
        let mut state = self.owner.queue().lock();
        state.waiting.clear();
        state.busy = false;
    }
}

impl<D: Drain> Drop for Turn<D> {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        if self.draining {
            return self.free();
        }
        self.held = false;
        {
            let mut state = self.owner.queue().lock();
            if state.waiting.is_empty() {
                state.busy = false;
                return;
            }
        }
        // Outside the lock: a task dropped as it is spawned drops its turn, which takes
        // the lock.
        let mut turn = Turn {
            owner: Arc::clone(&self.owner),
            held: true,
            draining: true,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let owner = Arc::clone(&self.owner);
                runtime.spawn(owner.drain(turn));
            }
            // No runtime to run a drain on: the queued callers are answered "failed".
            Err(_) => turn.free(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::oneshot;

    use super::{Drain, Entered, Queue, Turn, first};

    /// A queue whose drain answers each item with its number.
    #[derive(Default)]
    struct Echo {
        queue: Queue<(u32, oneshot::Sender<u32>)>,
    }

    impl Drain for Echo {
        type Item = (u32, oneshot::Sender<u32>);

        fn queue(&self) -> &Queue<Self::Item> {
            &self.queue
        }

        async fn drain(self: Arc<Self>, mut turn: Turn<Self>) {
            while let Some(batch) = Queue::next(&mut turn, |w| first(w, 2, |_| true)) {
                for (n, reply) in batch {
                    let _ = reply.send(n);
                }
                tokio::task::yield_now().await;
            }
        }
    }

    fn enter(echo: &Arc<Echo>, n: u32) -> Entered<Echo, oneshot::Receiver<u32>> {
        Queue::enter(echo, || {
            let (reply, answer) = oneshot::channel();
            ((n, reply), answer)
        })
    }

    fn queued(place: Entered<Echo, oneshot::Receiver<u32>>) -> oneshot::Receiver<u32> {
        match place {
            Entered::Queued(answer) => answer,
            Entered::Alone(_) => panic!("took the turn while it was held"),
        }
    }

    /// The callers that queue behind a lone one are served by a drain once it hands the
    /// turn on (in batches of at most two here), and the turn is then free again.
    #[tokio::test]
    async fn queued_callers_are_served_after_the_lone_one() {
        let echo = Arc::new(Echo::default());
        let Entered::Alone(turn) = enter(&echo, 0) else {
            panic!("a lone caller queued");
        };
        let answers: Vec<_> = (1..=5).map(|n| queued(enter(&echo, n))).collect();
        turn.hand_on();
        for (n, answer) in (1..=5).zip(answers) {
            assert_eq!(answer.await, Ok(n));
        }
        tokio::task::yield_now().await;
        assert!(matches!(enter(&echo, 6), Entered::Alone(_)));
    }

    /// A lone caller that gives up (its turn dropped mid-call) still hands the turn on:
    /// the callers queued behind it are served.
    #[tokio::test]
    async fn a_lone_caller_that_gives_up_hands_the_turn_on() {
        let echo = Arc::new(Echo::default());
        let Entered::Alone(turn) = enter(&echo, 0) else {
            panic!("a lone caller queued");
        };
        let answer = queued(enter(&echo, 1));
        drop(turn);
        assert_eq!(answer.await, Ok(1));
    }

    /// The drain is spawned when the lone caller hands the turn on. A runtime that shuts
    /// down before the drain first ran drops it unpolled: the turn must come free, and
    /// the queued caller be answered "failed", or every later caller would queue behind
    /// a turn nobody holds.
    #[test]
    fn a_drain_dropped_before_it_ran_frees_the_turn() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let echo = Arc::new(Echo::default());
        let Entered::Alone(turn) = enter(&echo, 0) else {
            panic!("a lone caller queued");
        };
        let answer = queued(enter(&echo, 1));
        // Handing the turn on spawns the drain; the future returns before it can run.
        runtime.block_on(async { turn.hand_on() });
        let later = queued(enter(&echo, 2));
        drop(runtime);
        assert!(
            answer.blocking_recv().is_err(),
            "the queued caller was answered"
        );
        assert!(
            later.blocking_recv().is_err(),
            "the later caller was answered"
        );
        assert!(
            matches!(enter(&echo, 3), Entered::Alone(_)),
            "the turn stayed taken"
        );
    }

    /// Without a runtime to spawn a drain on, the queued callers are answered "failed"
    /// and the turn is freed.
    #[test]
    fn without_a_runtime_the_turn_is_freed() {
        let echo = Arc::new(Echo::default());
        let Entered::Alone(turn) = enter(&echo, 0) else {
            panic!("a lone caller queued");
        };
        let answer = queued(enter(&echo, 1));
        turn.hand_on();
        assert!(answer.blocking_recv().is_err());
        assert!(matches!(enter(&echo, 2), Entered::Alone(_)));
    }
}
