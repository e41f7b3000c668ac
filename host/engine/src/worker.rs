//! The [`Worker`]: a process's share of the work queue. It claims runs from
//! the store (queued runs, and workers' runs whose claim is gone that are
//! still running or owe deliveries), drives each under its claim with
//! `recover` semantics, renews the claim while it drives, and releases it
//! when the run finishes or parks and owes nothing.
//!
//! What a worker guarantees (see `store/claim.rs` for the store's part):
//! - **one writer per run**: every append carries the claim's fencing
//!   token; once another worker holds a newer claim, this one's appends are
//!   refused and it drops the run ([`RuntimeError::Fenced`]);
//! - **no effect past the claim**: the worker keeps its own view of each
//!   claim, a [`ValidUntil`] on its monotonic clock, set at the start of
//!   the claim and moved at the start of each successful renewal to four
//!   fifths of the time to live after it (the fifth is the margin for the
//!   store's clock against this one). Every plugin lease and MCP call of
//!   the drive carries it: once it passes, the sandbox traps the plugin
//!   before any further effect (a local MCP server is killed by its
//!   watchdog, which runs while the worker is stopped) and the drive stops
//!   without appending
//!   ([`RuntimeError::ClaimExpired`]). A worker paused past its claim
//!   (SIGSTOP, a VM pause, a partition) therefore makes no further effect
//!   when it wakes, even though another worker took the run over and an
//!   operator resolved its write meanwhile;
//! - **a write never runs twice**: a run taken over from a dead worker is
//!   recovered, so a `write` intent without a completion parks it as
//!   `needs_reconciliation` (the listing status is written on release), and
//!   a human `resolve`s it;
//! - **takeover**: a worker that dies stops renewing; after its claim's time
//!   to live another worker claims the run; one that stops on a signal
//!   ([`Worker::run`]'s shutdown) stops claiming, lets its runs finish
//!   within the grace period, then abandons the drives still going and
//!   releases their claims, and the claims of drives that failed and were
//!   left to expire (it will not try them again), so others take them
//!   over at once;
//! - **nothing owed is left behind**: a worker that dies after a run's
//!   terminal event (or its parked notice) and before the delivery leaves
//!   the run listed as owing deliveries; another claims it once the claim
//!   is gone and its recovery makes them (an intent without an outcome
//!   again with the same id, a completed one never). A delivery that fails
//!   retryably is retried within that drive, at the time its failure
//!   recorded (the driver sleeps under its renewed claim), so a failing
//!   channel never makes the run bounce between workers; a drive that
//!   fails otherwise leaves the claim to expire, and the run is tried again
//!   one time to live later (at once, by another worker, if this one stops
//!   meanwhile).
//!
//! The agent of a run is the file its `run_started` event records, loaded
//! on the worker's machine (once per file and worker) by the worker's
//! [`AgentLoader`]: workers need the agent files (and what they name) at the
//! same paths, and must load them as the submitter did, or replay refuses
//! the changed agent.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;

use crate::events::Event;
use crate::{Agent, Clock, ReplayOptions, RunStatus, Runtime, RuntimeError, SystemClock};
use warden_sandbox::{Moment, ValidUntil};
use warden_store::{Claim, StoreError};

/// How a worker turns a run's recorded agent file into an [`Agent`].
pub type AgentLoader = Arc<dyn Fn(&Path) -> Result<Agent, String> + Send + Sync>;

/// A worker cannot run at all (a store error while claiming is retried, not
/// returned).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The owner id is empty or too long.
    #[error("worker id `{owner}` must hold 1 to 200 characters")]
    InvalidOwner {
        /// The id.
        owner: String,
    },
}

/// What a worker did until it stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerReport {
    /// Runs claimed.
    pub claimed: u64,
    /// Drives that ended with the run terminal or parked for a human.
    pub settled: u64,
    /// Drives that ended because another driver owned the run (fenced or
    /// conflict).
    pub lost: u64,
    /// Drives that failed otherwise (left to be retried after the claim
    /// expires; their claims are released when the worker stops).
    pub failed: u64,
    /// Drives abandoned at shutdown (their claims released).
    pub released: u64,
}

/// Configures a [`Worker`].
#[derive(Clone)]
pub struct WorkerBuilder {
    runtime: Runtime,
    owner: String,
    concurrency: usize,
    claim_ttl: Duration,
    poll: Duration,
    grace: Duration,
    clock: Arc<dyn Clock>,
    loader: AgentLoader,
}

impl WorkerBuilder {
    /// The worker's id, recorded as the owner of its claims. Default:
    /// `<hostname>:<pid>:<random>`.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// The most runs driven at once. Default: 4.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// How long a claim lasts unless renewed; it is renewed every third of
    /// it, and a dead worker's runs are taken over after it. A worker that
    /// could not renew makes no further effect four fifths of it after the
    /// start of its last renewal (see the [module docs](self)). Default: 15
    /// seconds.
    pub fn claim_ttl(mut self, ttl: Duration) -> Self {
        self.claim_ttl = ttl.max(Duration::from_millis(30));
        self
    }

    /// How long an idle worker waits before looking for work again.
    /// Default: 250 ms.
    pub fn poll(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// How long a stopping worker lets its drives go on before it abandons
    /// them and releases their claims. Default: 10 seconds.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The clock claims are timed with. Default: the system clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// How agent files are loaded. Default: [`Agent::load`] with no model
    /// defaults.
    pub fn agent_loader(mut self, loader: AgentLoader) -> Self {
        self.loader = loader;
        self
    }

    /// The worker.
    pub fn build(self) -> Result<Worker, WorkerError> {
        if self.owner.is_empty() || self.owner.chars().count() > 200 {
            return Err(WorkerError::InvalidOwner { owner: self.owner });
        }
        Ok(Worker {
            inner: Arc::new(self),
            agents: Arc::default(),
        })
    }
}

/// Claims and drives queued runs; see the [module docs](self).
#[derive(Clone)]
pub struct Worker {
    inner: Arc<WorkerBuilder>,
    /// Agents loaded, by file.
    agents: Arc<Mutex<HashMap<PathBuf, Agent>>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("owner", &self.inner.owner)
            .field("concurrency", &self.inner.concurrency)
            .field("claim_ttl", &self.inner.claim_ttl)
            .finish_non_exhaustive()
    }
}

/// How one drive ended.
enum Ended {
    Settled,
    Lost,
    Failed,
}

impl Worker {
    /// A builder for a worker driving runs with `runtime` (and its store).
    pub fn builder(runtime: Runtime) -> WorkerBuilder {
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "host".to_owned());
        WorkerBuilder {
            runtime,
            owner: format!(
                "{host}:{}:{:08x}",
                std::process::id(),
                rand::random::<u32>()
            ),
            concurrency: 4,
            claim_ttl: Duration::from_secs(15),
            poll: Duration::from_millis(250),
            grace: Duration::from_secs(10),
            clock: Arc::new(SystemClock),
            loader: Arc::new(|path| Agent::load(path, None).map_err(|e| e.to_string())),
        }
    }

    /// The worker's id.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    fn now(&self) -> i64 {
        self.inner.clock.now_ms() as i64
    }

    fn ttl_ms(&self) -> i64 {
        self.inner.claim_ttl.as_millis() as i64
    }

    /// How long after the start of a claim or renewal this worker takes its
    /// claim to hold: the time to live less a fifth, the margin for the
    /// store's (and other workers') clocks running ahead of this one.
    fn valid_for(&self) -> Duration {
        self.inner.claim_ttl - self.inner.claim_ttl / 5
    }

    /// Claims and drives runs until `shutdown` completes, then stops as the
    /// [module docs](self) say.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> WorkerReport {
        let mut report = WorkerReport::default();
        let mut drives: JoinSet<(Claim, Ended)> = JoinSet::new();
        let mut held: HashMap<tokio::task::Id, Claim> = HashMap::new();
        // Claims of drives that failed, left to expire as a back-off while
        // this worker runs, each with a time by which it has surely
        // expired; handed back when it stops.
        let mut failed: Vec<(Claim, i64)> = Vec::new();
        tokio::pin!(shutdown);
        loop {
            // Before every claim, not only when idle: a worker told to stop
            // (a SIGTERM) takes no further run, though a claim just granted
            // or a drive just ended would otherwise send it claiming again.
            if futures::poll!(&mut shutdown).is_ready() {
                break;
            }
            let free = self.inner.concurrency.saturating_sub(drives.len());
            let mut claimed_any = false;
            if free > 0 {
                let store = self.inner.runtime.store();
                // Before the request: the claim is valid from the store's
                // point of view no earlier than this.
                let started = Moment::now();
                match store
                    .claim(&self.inner.owner, self.now(), self.ttl_ms(), free)
                    .await
                {
                    Ok(claims) => {
                        for claim in claims {
                            claimed_any = true;
                            report.claimed += 1;
                            tracing::debug!(owner = %self.inner.owner, run_id = %claim.run_id, token = claim.token, "claimed run");
                            let worker = self.clone();
                            let valid = ValidUntil::at(started.after(self.valid_for()));
                            let handle = drives.spawn({
                                let claim = claim.clone();
                                async move {
                                    let ended = worker.drive(&claim, valid).await;
                                    (claim, ended)
                                }
                            });
                            held.insert(handle.id(), claim);
                        }
                    }
                    Err(error) => {
                        tracing::warn!(owner = %self.inner.owner, %error, "cannot claim runs; retrying");
                    }
                }
            }
            if claimed_any && drives.len() < self.inner.concurrency {
                // More may be waiting: claim again at once.
                continue;
            }
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(done) = drives.join_next_with_id(), if !drives.is_empty() => {
                    self.account(&mut report, &mut held, &mut failed, done);
                }
                () = tokio::time::sleep(self.inner.poll) => {}
            }
        }
        tracing::info!(owner = %self.inner.owner, running = drives.len(), "worker stopping");
        let deadline = tokio::time::sleep(self.inner.grace);
        tokio::pin!(deadline);
        while !drives.is_empty() {
            tokio::select! {
                Some(done) = drives.join_next_with_id() => self.account(&mut report, &mut held, &mut failed, done),
                () = &mut deadline => break,
            }
        }
        drives.abort_all();
        while let Some(done) = drives.join_next_with_id().await {
            if let Err(e) = &done
                && e.is_cancelled()
            {
                report.released += 1;
            }
            self.account(&mut report, &mut held, &mut failed, done);
        }
        // The claims of abandoned drives, and of failed ones not expired
        // yet: release them so that another worker takes the runs over now,
        // not after the time to live. (A claim taken over meanwhile is not
        // current any more, and releasing it changes nothing.)
        let now = self.now();
        let failed = failed
            .into_iter()
            .filter(|(_, lapsed)| *lapsed > now)
            .map(|(claim, _)| claim);
        for claim in held.into_values().chain(failed) {
            if let Err(error) = self.inner.runtime.store().release_claim(&claim, None).await {
                tracing::warn!(run_id = %claim.run_id, %error, "cannot release claim at shutdown");
            }
        }
        report
    }

    /// Counts a finished drive and forgets its claim, keeping it in
    /// `failed` if the drive failed (its claim was left to expire).
    fn account(
        &self,
        report: &mut WorkerReport,
        held: &mut HashMap<tokio::task::Id, Claim>,
        failed: &mut Vec<(Claim, i64)>,
        done: Result<(tokio::task::Id, (Claim, Ended)), tokio::task::JoinError>,
    ) {
        let mut left = |claim: Claim| {
            // Renewed at most until the failure: expired one time to live
            // after it. The list holds the failures of one time to live.
            let now = self.now();
            failed.retain(|(_, lapsed)| *lapsed > now);
            failed.push((claim, now.saturating_add(self.ttl_ms())));
        };
        match done {
            Ok((id, (claim, ended))) => {
                held.remove(&id);
                match ended {
                    Ended::Settled => report.settled += 1,
                    Ended::Lost => report.lost += 1,
                    Ended::Failed => {
                        report.failed += 1;
                        left(claim);
                    }
                }
            }
            // Aborted (kept in `held`, released after) or panicked (its
            // claim left to expire, as a failed drive's).
            Err(e) if e.is_panic() => {
                if let Some(claim) = held.remove(&e.id()) {
                    left(claim);
                }
                report.failed += 1;
                tracing::error!(task = %e.id(), "a drive panicked");
            }
            Err(_) => {}
        }
    }

    /// Drives one claimed run under its claim, renewing it (and `valid`,
    /// this worker's view of it) meanwhile.
    async fn drive(&self, claim: &Claim, valid: ValidUntil) -> Ended {
        let renewing = self.renew_while_driving(claim.clone(), valid.clone());
        let result = tokio::select! {
            result = self.recover(claim, valid) => result,
            () = renewing => Err(RuntimeError::Fenced {
                run_id: claim.run_id.clone(),
                token: claim.token,
                current: claim.token + 1,
            }),
        };
        let store = self.inner.runtime.store();
        let (release, ended) = match result {
            Ok(status) => {
                tracing::debug!(run_id = %claim.run_id, %status, "drive settled");
                (Some(None), Ended::Settled)
            }
            Err(RuntimeError::NeedsReconciliation { run_id, write }) => {
                tracing::warn!(%run_id, call_id = %write.call_id, "run needs reconciliation: a write has no recorded outcome");
                (
                    Some(Some(RunStatus::NeedsReconciliation.listing())),
                    Ended::Settled,
                )
            }
            Err(RuntimeError::Fenced { run_id, .. }) => {
                tracing::info!(%run_id, "claim superseded: another worker drives the run");
                (None, Ended::Lost)
            }
            Err(RuntimeError::ClaimExpired { run_id }) => {
                // Released (a no-op if another worker holds the run now), so
                // that the run is taken over at once.
                tracing::warn!(%run_id, "claim ran out before it was renewed: the drive stopped without further effect");
                (Some(None), Ended::Lost)
            }
            Err(RuntimeError::Conflict { run_id, .. }) => {
                // A verb recorded by someone else: release, and the run is
                // claimable again if it is still running.
                tracing::info!(%run_id, "the log moved under the drive; releasing");
                (Some(None), Ended::Lost)
            }
            Err(error) => {
                // Left claimed: it expires, and the run is retried then (or
                // listed as stalled until someone looks); released at once
                // if this worker stops first.
                tracing::warn!(run_id = %claim.run_id, %error, "drive failed; the run is retried when its claim expires");
                (None, Ended::Failed)
            }
        };
        if let Some(status) = release
            && let Err(error) = store.release_claim(claim, status).await
        {
            tracing::warn!(run_id = %claim.run_id, %error, "cannot release claim");
        }
        ended
    }

    /// Renews `claim` every third of its time to live, moving `valid` on
    /// from the start of each renewal that succeeds; returns once it is
    /// fenced (another driver owns the run), `valid` revoked. Store errors
    /// are retried; meanwhile `valid` runs out on its own.
    async fn renew_while_driving(&self, claim: Claim, valid: ValidUntil) {
        let every = self.inner.claim_ttl / 3;
        loop {
            tokio::time::sleep(every).await;
            let started = Moment::now();
            match self
                .inner
                .runtime
                .store()
                .renew_claim(&claim, self.now(), self.ttl_ms())
                .await
            {
                Ok(_) => {
                    valid.extend(started.after(self.valid_for()));
                }
                Err(StoreError::Fenced { .. }) => {
                    valid.revoke();
                    return;
                }
                Err(error) => {
                    tracing::warn!(run_id = %claim.run_id, %error, "cannot renew claim; retrying");
                }
            }
        }
    }

    async fn recover(&self, claim: &Claim, valid: ValidUntil) -> Result<RunStatus, RuntimeError> {
        let runtime = &self.inner.runtime;
        let events = runtime.events(&claim.run_id).await?;
        let agent = match events.first() {
            Some(Event::RunStarted(started)) => match &started.agent_file {
                Some(file) => {
                    self.agent(Path::new(file))
                        .map_err(|message| RuntimeError::Agent {
                            agent: started.agent.clone(),
                            message,
                        })?
                }
                None => {
                    return Err(RuntimeError::Agent {
                        agent: started.agent.clone(),
                        message: format!(
                            "run {} does not record its agent file; a worker cannot load it",
                            claim.run_id
                        ),
                    });
                }
            },
            _ => {
                return Err(RuntimeError::Agent {
                    agent: String::new(),
                    message: format!("run {} has no run_started event", claim.run_id),
                });
            }
        };
        runtime
            .recover_claimed(&agent, ReplayOptions::default(), claim.clone(), valid)
            .await
    }

    fn agent(&self, path: &Path) -> Result<Agent, String> {
        if let Some(agent) = self
            .agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(path)
        {
            return Ok(agent.clone());
        }
        let agent = (self.inner.loader)(path)?;
        self.agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(path.to_owned(), agent.clone());
        Ok(agent)
    }
}
