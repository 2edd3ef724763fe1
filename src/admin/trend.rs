//! The overview's counts over the last hour: sampled by a task of the page's own, started
//! by the first look at the overview and ended when the page is dropped, and drawn as
//! small charts.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use maud::{Markup, html};
use serde::Serialize;

use super::AdminStore;
use super::ops::Overview;
use super::panel::Admin;

/// How often the counts are sampled by default.
pub(super) const SAMPLE_EVERY: Duration = Duration::from_secs(15);

/// How far back the charts reach.
const SPAN: Duration = Duration::from_secs(3600);

/// The counts at one moment.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Sample {
    /// Milliseconds since the epoch.
    pub(crate) at_ms: i64,
    /// Events waiting to be published.
    pub(crate) pending: u64,
    /// Dead events.
    pub(crate) dead: u64,
    /// Events published in the minute before (`None` where the store does not count
    /// them).
    pub(crate) published: Option<u64>,
    /// Timers due and not fired.
    pub(crate) timers_due: i64,
    /// Parked flows.
    pub(crate) parked: u64,
}

impl Sample {
    fn of(o: &Overview) -> Self {
        Sample {
            at_ms: chrono::Utc::now().timestamp_millis(),
            pending: o.outbox.pending,
            dead: o.outbox.dead,
            published: o.outbox.published_last_minute,
            timers_due: o.timers.due,
            parked: o.flows.parked,
        }
    }
}

/// The samples of the last hour, oldest first, and whether the sampling task runs.
#[derive(Debug, Default)]
pub(super) struct Trend {
    samples: Mutex<VecDeque<(Instant, Sample)>>,
    started: AtomicBool,
}

impl Trend {
    /// Keeps `o` as a sample unless the last one is younger than three quarters of
    /// `every` (a tick whose read returned early still counts); drops those older than
    /// the span.
    pub(super) fn add(&self, o: &Overview, every: Duration) {
        let now = Instant::now();
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if samples
            .back()
            .is_some_and(|(at, _)| now.duration_since(*at) < every * 3 / 4)
        {
            return;
        }
        samples.push_back((now, Sample::of(o)));
        while samples
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > SPAN)
        {
            samples.pop_front();
        }
    }

    /// The samples kept, oldest first, and `o` (the counts now) last, so that a chart
    /// ends where the cards stand.
    pub(super) fn samples_to(&self, o: &Overview) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let mut shown: Vec<Sample> = samples.iter().map(|(_, s)| *s).collect();
        let now = Sample::of(o);
        if shown.last().is_none_or(|last| last.at_ms < now.at_ms) {
            shown.push(now);
        }
        shown
    }
}

impl<S: AdminStore> Admin<S> {
    /// Starts the sampling task once (inside the runtime serving the page); it holds the
    /// page weakly and ends once the page is dropped. A failed read skips a sample.
    pub(super) fn sample_on(self: &Arc<Self>) {
        if self.trend.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let page: Weak<Self> = Arc::downgrade(self);
        let every = self.sample_every;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(page) = page.upgrade() else { return };
                match page.overview().await {
                    Ok(o) => page.trend.add(&o, every),
                    Err(e) => tracing::warn!(error = %e, "the overview's sample failed"),
                }
            }
        });
    }
}

/// A small line chart of one count over the samples (`id` names it in the page).
pub(super) fn chart(id: &str, label: &str, samples: &[Sample], of: fn(&Sample) -> f64) -> Markup {
    const W: f64 = 240.0;
    const H: f64 = 48.0;
    // At most a point a pixel: every k-th sample, and the last.
    let stride = samples.len().div_ceil(W as usize).max(1);
    let samples: Vec<Sample> = samples
        .iter()
        .enumerate()
        .filter(|(i, _)| i % stride == 0 || *i + 1 == samples.len())
        .map(|(_, s)| *s)
        .collect();
    let samples = samples.as_slice();
    let values: Vec<f64> = samples.iter().map(of).collect();
    let max = values.iter().copied().fold(0.0, f64::max);
    let (first, last) = (
        samples.first().map_or(0, |s| s.at_ms),
        samples.last().map_or(0, |s| s.at_ms),
    );
    let span = (last - first).max(1) as f64;
    let points: Vec<String> = samples
        .iter()
        .zip(&values)
        .map(|(s, v)| {
            let x = (s.at_ms - first) as f64 / span * W;
            let y = if max > 0.0 { H - v / max * H } else { H };
            format!("{x:.1},{y:.1}")
        })
        .collect();
    // One sample is a level line across.
    let points = match points.as_slice() {
        [one] => {
            let y = one.split_once(',').map_or("0", |(_, y)| y);
            vec![format!("0,{y}"), format!("{W},{y}")]
        }
        _ => points,
    };
    let secs = (last - first).max(0) / 1000;
    let over = if secs < 120 {
        format!("{secs} s")
    } else {
        format!("{} min", secs / 60)
    };
    let now = values.last().copied().unwrap_or(0.0);
    html! {
        figure.chart id=(id) {
            figcaption { (label) ": " b { (now) } " now, " (max) " at most" }
            svg xmlns="http://www.w3.org/2000/svg" viewBox=(format!("-2 -2 {} {}", W + 4.0, H + 4.0))
                width=(W) height=(H) role="img" aria-label=(label) {
                polyline fill="none" stroke="#2f6fd6" stroke-width="1.5" points=(points.join(" ")) {}
            }
            figcaption.small {
                (samples.len()) (if samples.len() == 1 { " sample" } else { " samples" })
                " over the last " (over)
            }
        }
    }
}
