//! The run engine. A run is one durable execution of an agent on an input;
//! its append-only log of [`Event`]s is its only truth.
//!
//! The pure core, where one step of a run is: fold the log into a
//! [`RunState`] ([`fold`]), decide the next [`Action`] from the state and
//! the agent ([`decide()`]), then (in the runtime) append the intent, perform
//! the effect, append the completion. Neither folding nor deciding does I/O.
//!
//! The modules in groups, lowest first; each names only the modules before
//! it (the order is `ENGINE_LAYERS` in the tests crate's
//! `all::engine_layers`, which checks it):
//!
//! - identifiers: [`canonical`] (canonical JSON for digests), [`ids`] (run
//!   and call ids, digests, idempotency keys), [`request_hash`] (the model
//!   request's hash and size), [`status`] ([`RunStatus`] and how the store
//!   lists it), [`schema`] (JSON Schema checks), [`tool_errors`] (tool
//!   errors as the model is shown them), [`keys`] (idempotency keys as an
//!   operator sees them), [`start`] ([`StartOptions`]);
//! - settings and payloads the events carry: [`refusal`], [`output`] (typed
//!   results), [`compaction`] (summarising older history), [`budget`]
//!   (limits, usage, pricing, the check order, extensions),
//!   [`policy_hooks`] (policies asked at fixed points: hooks, requests,
//!   verdicts);
//! - [`events`]: the event kinds, their payloads and versioned encoding;
//! - over the events: [`approvals`] (standing approval rules, and when a
//!   call needs approval), [`batch`] (parallel calls' setting), [`retry`]
//!   (the one retry layer for model calls), [`context`] (context sources),
//!   [`channels`] (delivery channels: what each receives, backoff),
//!   [`mcp_servers`] (MCP servers as tools: their sandbox, pinned tool
//!   lists, calls as leases);
//! - [`agent`]: `agent.toml`, parsed strictly, validated, digested, with
//!   agents called as tools ([`agent::child_agents`]) and plan files
//!   ([`agent::plan`]);
//! - [`state`]: folding, the conversation, the deliveries a run owes;
//!   [`view`]: the agent with its tools resolved, as deciding sees it;
//!   [`approval_prompt`]: what a person is asked before approving a call;
//!   [`prompt`]: assembling the model request;
//! - [`mod@decide`]: the decision table (with parallel batches and policy
//!   gates); [`mod@replay`]: folding a recorded log while checking every
//!   decision;
//! - effects: [`policy_plugin`] (policies carried out by WASM components),
//!   [`runtime`] (the verbs, sessions, forks, rules, child runs),
//!   [`turn`] (live turns watched as a stream), [`worker`] (claiming and
//!   driving runs across hosts).
//!
//! Invariants: the log is the only truth (status and conversation are
//! derived from it); an effect's intent is appended before the effect runs;
//! a `write` intent without completion is never re-executed (the run derives
//! to `needs_reconciliation`); replay re-reads recorded facts (completions,
//! clock readings, pricing) and never live configuration.

// Identifiers, digests, the run's status.
pub mod canonical;
pub mod ids;
pub mod keys;
pub mod request_hash;
pub mod schema;
pub mod start;
pub mod status;
pub mod tool_errors;
pub mod witness;

// Settings and payloads the events carry.
pub mod budget;
pub mod ceilings;
pub mod compaction;
pub mod output;
pub mod policy_hooks;
pub mod refusal;

// The log's vocabulary.
pub mod events;

// Over the events.
pub mod approvals;
pub mod batch;
pub mod channels;
pub mod context;
pub mod mcp_servers;
pub mod retry;

// The agent file.
pub mod agent;

// The folded run, the agent as deciding sees it, the request, what a
// person is asked.
pub mod approval_prompt;
pub mod prompt;
pub mod state;
pub mod view;

// Deciding, and checking a log against it.
pub mod decide;
pub mod replay;

// Effects.
mod codes;
pub mod policy_plugin;
pub mod runtime;
pub mod turn;
pub mod worker;

#[cfg(test)]
mod tests;

pub use agent::{Agent, AgentError, ModelDefaults};
pub use approvals::{Rule, RuleError, RuleSpec};
pub use budget::{BudgetKind, BudgetLimits, BudgetOverrun, BudgetUsage, Pricing};
pub use decide::{Action, decide};
pub use events::{Event, EventError, EventKind, FORMAT_VERSION, decode, encode};
pub use ids::{AgentDigest, CallDigest, CallId, RequestHash, RunId, SessionId, idempotency_key};
pub use keys::{KeyInfo, KeyState};
pub use policy_hooks::{
    Policy, PolicyDecision, PolicyError, PolicyHook, PolicyRequest, PolicySubject, PolicyVerdict,
};
pub use replay::{ReplayError, ReplayOptions, replay};
pub use retry::{RetryPolicy, RetrySleep, TokioSleep};
pub use runtime::{
    ApprovalScope, ChildRefusal, Clock, FORKED_FROM_LABEL, FixedClock, FixedRandom, ForkOptions,
    ForkRefusal, OsRandom, Random, RunUpdate, RunUpdates, Runtime, RuntimeError, SessionRun,
    SessionSummary, Step, SystemClock, resolve_history,
};
pub use start::StartOptions;
pub use state::{FoldError, ResumeError, RunState, fold};
pub use status::RunStatus;
pub use turn::{TurnEvent, TurnHandle, TurnOutcome};
pub use view::AgentView;
