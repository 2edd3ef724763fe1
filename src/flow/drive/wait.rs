//! A wait step's two recorded points: the flow goes to sleep (its step row `WAITING`,
//! its timer, and a lease as long as the wait and one lease more, in one fenced commit),
//! and it wakes (the step recorded done, the flow on to the next step).

use std::time::Duration;

use super::super::flows::millis;
use super::super::outcome::FlowOutcome;
use super::super::wait::wait_timer;
use super::super::{FlowStore, Touch};
use super::fence::{to_i32, write_arming};
use super::{FORWARD, Run, Then};
use crate::error::Result;

impl<S: FlowStore, I: Send + Sync + 'static> Run<'_, S, I> {
    /// Step `i` waits `wait`: the flow sleeps until the timer job wakes it. Its lease
    /// outlasts the wait by one lease, so a recovery job takes it over only once the
    /// timer is due, and then only if no timer job woke it in that lease.
    pub(super) async fn sleep(&mut self, i: usize, wait: Duration) -> Result<FlowOutcome> {
        let name = self.def.specs[i].name;
        let out = format!("{{\"wait_ms\":{}}}", millis(wait));
        let write = self.step_write(i, FORWARD, "WAITING", true, Some(&out), None);
        let touch = Touch {
            progress: true,
            step_at: Some(to_i32(i)),
            ..self.fence(wait.saturating_add(self.flows.config.lease))
        };
        let timer = wait_timer(
            &self.held.kind,
            &self.held.key,
            name,
            i,
            &self.held.token,
            wait,
        );
        write_arming(
            self.flows,
            &self.held,
            &touch,
            Some(&write),
            None,
            Some(&timer),
        )
        .await?;
        self.note(i, FORWARD, "WAITING", Some(out), None);
        self.held.attempt = 1;
        Ok(FlowOutcome::Sleeping {
            step: name.to_string(),
            wakes_after: wait,
        })
    }

    /// Step `i`'s wait is over: recorded done (its output the wait it recorded), and
    /// the flow on to the next step, completed if it was the last.
    pub(super) async fn woke(&mut self, i: usize) -> Result<()> {
        let out = self
            .rows
            .get(&(i, FORWARD))
            .and_then(|r| r.output.clone())
            .unwrap_or_else(|| "null".to_string());
        let then = Then::Next(i + 1);
        let write = self.step_write(i, FORWARD, "SUCCEEDED", false, Some(&out), None);
        let completed = self.completion(i, FORWARD, &out, then)?;
        let touch = self.after_success(then, completed.as_deref());
        self.write(&touch, Some(&write), None).await?;
        self.succeeded(i, FORWARD, out);
        Ok(())
    }
}
