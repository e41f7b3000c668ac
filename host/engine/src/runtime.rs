//! The [`Runtime`]: drives runs over an [`EventStore`], a [`PluginHost`] and
//! model providers, one step at a time, and offers the verbs a host needs:
//! `start`, `step`, `drive`, `recover`, `resume`, `approve`, `deny`,
//! `resolve`, `abandon`, `cancel`, `verify`, `subscribe`; sessions
//! (`StartOptions::session`, `session_runs`) and live turns (`start_turn`,
//! `continue_turn`, in `turn.rs`).
//!
//! One step: load (or keep) the log, fold it, [`decide`](super::decide()), then perform the
//! action: for a model or tool call, append the intent, perform the effect,
//! append the completion; for anything else, append its one event. Every
//! append carries the log length it expects, so two drivers of one run
//! cannot both write (the loser gets [`RuntimeError::Conflict`] and writes
//! nothing).
//!
//! # Durability
//!
//! Every event is committed before the driver makes the next effect, but
//! not every one is its own append, and not every append waits for the
//! disk. An event after which the run only decides, with no effect in
//! between, is held (`Log::held`) and rides with the run's next append:
//! a model call's completion (with the tool intents or the end the model's
//! answer leads to), a tool call's completion (with the next model call's
//! intent). An append the run can lose in a machine crash and make again
//! without harm is [deferred](warden_store::Durability::Deferred) to the store's next
//! synced write, which syncs it too: a model call's completion (its intent
//! is synced; lost, the call is made again, as after a crash mid-stream),
//! a read's intent and completion (lost, the read is made again: harmless
//! by definition). Everything else is synced: a write's intent before the
//! write starts (the write-ahead rule), its completion before any further
//! effect starts, a keyed call's settlement, approvals, parks, the end.
//! What a step does before anything it appends (a context source, a policy,
//! a child, a call recorded before a crash, a delivery) has what is held
//! written first (`writes_first`), and so does every end of a drive or a
//! step. A turn calling one read tool costs two appends (the model's
//! completion with the read's intent, the read's completion with the next
//! model call's intent) and one fsync; a turn calling a write two of each
//! (its intent, and the next model call's). A store keeps
//! what a crash leaves a prefix of what it acknowledged, so what a crash
//! can leave is a log cut at some append boundary after the last synced
//! append: a state the crash tests already recover from (`all::engine`,
//! every boundary).
//!
//! Clock and randomness are injected ([`Runtime::with_hooks`]) so that a
//! killed-and-recovered run records the same log as an uninterrupted one;
//! so is the sleep a driver waits out a model call's backoff with
//! ([`Runtime::with_sleep`]).
//!
//! # Files
//!
//! This file holds [`Runtime`] and its settings (the `with_*` builders);
//! each concern is a file of its own under `runtime/`: the error type
//! (`error.rs`), clock and randomness (`clock.rs`), the verbs on runs
//! (`verbs.rs`) and on idempotency keys (`commitments.rs`), driving
//! (`driving.rs`) with its model and tool calls (`calls.rs`), the log as a
//! driver holds it (`log.rs`), agents loaded to run (`agents.rs`), live runs
//! with their subscribers and drivers (`live.rs`); and parallel batches,
//! child runs, forks, approval rules and sessions (`batch.rs`,
//! `children.rs`, `fork.rs`, `rules.rs`, `session.rs`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::ceilings::RunCeilings;
use super::ids::{AgentDigest, RunId};
use super::policy_hooks::{DEFAULT_POLICY_TIMEOUT, Policy};
use super::retry::{RetrySleep, TokioSleep};
use super::witness::Witness;
use warden_plugins::PluginHost;
use warden_providers::ModelProvider;
use warden_store::EventStore;

mod agents;
mod batch;
mod calls;
mod children;
mod clock;
mod commitments;
mod driving;
mod error;
mod fork;
mod live;
mod log;
mod rules;
mod session;
mod verbs;
use agents::Prepared;
pub use children::ChildRefusal;
pub use clock::{Clock, FixedClock, FixedRandom, OsRandom, Random, SystemClock};
pub use driving::Step;
pub use error::RuntimeError;
pub use fork::{FORKED_FROM_LABEL, ForkOptions, ForkRefusal};
use live::Live;
pub use live::{RunUpdate, RunUpdates};
pub use log::verify_log;
pub use rules::ApprovalScope;
pub use session::{SessionRun, SessionSummary, resolve_history};

/// The engine: runs, verbs and subscribers over a store, plugins and
/// providers. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn EventStore>,
    plugins: PluginHost,
    clock: Arc<dyn Clock>,
    random: Arc<dyn Random>,
    sleep: Arc<dyn RetrySleep>,
    record_prompts: bool,
    labels: BTreeMap<String, String>,
    provider: Option<Arc<dyn ModelProvider>>,
    commitment_wait: Duration,
    policies: BTreeMap<String, Arc<dyn Policy>>,
    policy_timeout: Duration,
    witness: Option<Arc<Witness>>,
    ceilings: RunCeilings,
    prepared: Mutex<HashMap<AgentDigest, Arc<Prepared>>>,
    live: Mutex<HashMap<RunId, Live>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("record_prompts", &self.inner.record_prompts)
            .field("labels", &self.inner.labels)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// A runtime over `store` and `plugins`, with the system clock, the OS
    /// random source, prompts not recorded, no extra labels, and each agent's
    /// own model provider.
    pub fn new(store: Arc<dyn EventStore>, plugins: PluginHost) -> Self {
        Runtime {
            inner: Arc::new(Inner {
                store,
                plugins,
                clock: Arc::new(SystemClock),
                random: Arc::new(OsRandom),
                sleep: Arc::new(TokioSleep),
                record_prompts: false,
                labels: BTreeMap::new(),
                provider: None,
                commitment_wait: DEFAULT_COMMITMENT_WAIT,
                policies: BTreeMap::new(),
                policy_timeout: DEFAULT_POLICY_TIMEOUT,
                witness: None,
                ceilings: RunCeilings::DEFAULT,
                prepared: Mutex::default(),
                live: Mutex::default(),
            }),
        }
    }

    fn rebuild(self, f: impl FnOnce(&mut Inner)) -> Self {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|shared| Inner {
            store: Arc::clone(&shared.store),
            plugins: shared.plugins.clone(),
            clock: Arc::clone(&shared.clock),
            random: Arc::clone(&shared.random),
            sleep: Arc::clone(&shared.sleep),
            record_prompts: shared.record_prompts,
            labels: shared.labels.clone(),
            provider: shared.provider.clone(),
            commitment_wait: shared.commitment_wait,
            policies: shared.policies.clone(),
            policy_timeout: shared.policy_timeout,
            witness: shared.witness.clone(),
            ceilings: shared.ceilings,
            prepared: Mutex::default(),
            live: Mutex::default(),
        });
        let mut inner = inner;
        f(&mut inner);
        Runtime {
            inner: Arc::new(inner),
        }
    }

    /// Uses `clock` and `random` instead of the system's. Default: the
    /// system clock and the OS random source.
    pub fn with_hooks(self, clock: Arc<dyn Clock>, random: Arc<dyn Random>) -> Self {
        self.rebuild(|i| {
            i.clock = clock;
            i.random = random;
        })
    }

    /// Waits out a model call's backoff with `sleep` instead of the tokio
    /// timer (a test's sleep can move an injected clock instead). Default:
    /// [`TokioSleep`].
    pub fn with_sleep(self, sleep: Arc<dyn RetrySleep>) -> Self {
        self.rebuild(|i| i.sleep = sleep)
    }

    /// Records each model request in full with its intent. Default: off
    /// (prompts may hold secrets; only their hash is recorded).
    pub fn with_record_prompts(self, record: bool) -> Self {
        self.rebuild(|i| i.record_prompts = record)
    }

    /// Checks every run this runtime records anything on against
    /// `witness` (see `engine/witness.rs`): a run whose log holds fewer
    /// events than the witness saw, or another event at that position, is
    /// refused ([`RuntimeError::RolledBack`]) by every verb that writes
    /// (driving it, resuming, approving, denying, resolving, forking it),
    /// before anything is written or performed. Default: none.
    pub fn with_witness(self, witness: Witness) -> Self {
        let witness = Arc::new(witness);
        self.rebuild(|i| i.witness = Some(witness))
    }

    /// The ceilings every run this runtime starts records and meets (see
    /// [`crate::ceilings`]). Default: [`RunCeilings::DEFAULT`].
    pub fn with_ceilings(self, ceilings: RunCeilings) -> Self {
        self.rebuild(|i| i.ceilings = ceilings)
    }

    /// Labels added to every run this runtime starts (a run's own and its
    /// agent's win on the same key). Default: none.
    pub fn with_labels(self, labels: BTreeMap<String, String>) -> Self {
        self.rebuild(|i| i.labels = labels)
    }

    /// Calls `provider` for every agent instead of the agent's own. Default:
    /// each agent's provider, from its `[model]` table.
    pub fn with_provider(self, provider: Arc<dyn ModelProvider>) -> Self {
        self.rebuild(|i| i.provider = Some(provider))
    }

    /// How long a keyed call waits for another run that holds its
    /// idempotency commitment unsettled before the drive stops with
    /// [`RuntimeError::CommitmentHeld`]. Default: 2 minutes.
    pub fn with_commitment_wait(self, wait: Duration) -> Self {
        self.rebuild(|i| i.commitment_wait = wait)
    }

    /// Registers `policy` under `name`: agents that enable `[policies.<name>]`
    /// have it asked at their hooks (see [`super::policy_hooks`]). A run of
    /// an agent enabling a policy no one registered is refused at start;
    /// replay never needs the policy (it reads the recorded decisions).
    pub fn with_policy(self, name: impl Into<String>, policy: Arc<dyn Policy>) -> Self {
        let name = name.into();
        self.rebuild(|i| {
            i.policies.insert(name, policy);
        })
    }

    /// How long a policy may take to decide before its decision is recorded
    /// as failed (and the run fails). Default: 30 s.
    pub fn with_policy_timeout(self, timeout: Duration) -> Self {
        self.rebuild(|i| i.policy_timeout = timeout)
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn EventStore> {
        &self.inner.store
    }
}

/// How long a keyed call waits for another run holding its commitment
/// before the drive gives up (the run stays as it was), by default.
const DEFAULT_COMMITMENT_WAIT: Duration = Duration::from_secs(120);

#[cfg(test)]
mod tests {
    use super::*;
    use warden_sandbox::{Sandbox, SandboxConfig};
    use warden_store::MemoryStore;

    fn runtime() -> Runtime {
        let sandbox = Sandbox::new(SandboxConfig {
            max_concurrent_leases: 1,
            ..SandboxConfig::default()
        })
        .unwrap();
        Runtime::new(Arc::new(MemoryStore::new()), PluginHost::new(sandbox))
    }

    #[test]
    fn a_dropped_subscription_leaves_nothing_behind() {
        let rt = runtime();
        let run = RunId::new("r").unwrap();
        let first = rt.subscribe(&run);
        let second = rt.subscribe(&run);
        assert_eq!(rt.lock_live().len(), 1);
        drop(first);
        assert_eq!(rt.lock_live().len(), 1, "one subscriber is still there");
        drop(second);
        assert!(rt.lock_live().is_empty());
    }

    #[test]
    fn the_builders_keep_what_was_set_before() {
        let rt = runtime()
            .with_record_prompts(true)
            .with_labels(BTreeMap::from([("team".into(), "ops".into())]))
            .with_hooks(Arc::new(FixedClock(5)), Arc::new(FixedRandom(9)));
        assert!(rt.inner.record_prompts);
        assert_eq!(rt.inner.labels["team"], "ops");
        assert_eq!(rt.inner.clock.now_ms(), 5);
        assert_eq!(rt.inner.random.next_u64(), 9);
    }
}
