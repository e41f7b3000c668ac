//! A session's run as its drive leaves it, kept up to date from the
//! runtime's updates instead of reloading the log: what a `tools/call`
//! answers from, so the cost of a call does not grow with the session.
//!
//! The view is loaded once (the run's events, folded), subscribed to
//! first, so nothing recorded in between is missed; from then on each event
//! the runtime publishes is folded in place, in order of its position in
//! the log. An event published here out of order means something was
//! recorded by another process meanwhile (an approval from `warden runs
//! approve`): the view is loaded again, as it is when the subscriber
//! lagged. The log stays the truth; this is only a cache of its fold.

use futures::FutureExt as _;

use warden::engine::state::{RunState, fold};
use warden::engine::{Event, RunUpdate, RunUpdates};
use warden::{RunId, Runtime, RuntimeError};

/// The folded state of one run, and how far into its log it is.
pub(crate) struct RunView {
    run_id: RunId,
    updates: RunUpdates,
    state: RunState,
    /// How many events of the log are folded in.
    folded: u64,
}

impl RunView {
    /// Subscribes to `run_id`, then loads and folds its log.
    pub(crate) async fn load(runtime: &Runtime, run_id: &RunId) -> Result<RunView, RuntimeError> {
        let updates = runtime.subscribe(run_id);
        let (state, folded) = Self::fold_log(runtime, run_id).await?;
        Ok(RunView {
            run_id: run_id.clone(),
            updates,
            state,
            folded,
        })
    }

    async fn fold_log(runtime: &Runtime, run_id: &RunId) -> Result<(RunState, u64), RuntimeError> {
        let events = runtime.events(run_id).await?;
        let state = fold(&events).map_err(|error| RuntimeError::Fold {
            run_id: run_id.clone(),
            error,
        })?;
        Ok((state, events.len() as u64))
    }

    /// The run viewed.
    pub(crate) fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// The run's state with every update published so far folded in
    /// (never waiting for more); loaded again after a gap.
    pub(crate) async fn current(&mut self, runtime: &Runtime) -> Result<&RunState, RuntimeError> {
        let mut reload = false;
        while let Some(Some(update)) = self.updates.next().now_or_never() {
            match update {
                RunUpdate::Event { seq, event } if !reload => {
                    reload = !self.fold_in(seq, &event);
                }
                RunUpdate::Lagged { .. } => reload = true,
                _ => {}
            }
        }
        if reload {
            let (state, folded) = Self::fold_log(runtime, &self.run_id).await?;
            self.state = state;
            self.folded = folded;
        }
        Ok(&self.state)
    }

    /// Loads the log again: for what another process may have recorded
    /// without anything after it here to show the gap.
    pub(crate) async fn reload(&mut self, runtime: &Runtime) -> Result<&RunState, RuntimeError> {
        self.current(runtime).await?;
        let (state, folded) = Self::fold_log(runtime, &self.run_id).await?;
        self.state = state;
        self.folded = folded;
        Ok(&self.state)
    }

    /// Folds the event at position `seq`; `false` when it is not the next
    /// one (a gap) or does not fold, so the log must be read again.
    fn fold_in(&mut self, seq: u64, event: &Event) -> bool {
        if seq <= self.folded {
            // Loaded already (recorded between the subscription and the
            // load).
            return true;
        }
        if seq != self.folded + 1 || self.state.apply(event).is_err() {
            return false;
        }
        self.folded = seq;
        true
    }
}
