//! The run engine. A run is one durable execution of an agent on an input;
//! its append-only log of [`Event`]s is its only truth.
//!
//! The pure core, where one step of a run is: fold the log into a
//! [`RunState`] ([`fold`]), decide the next [`Action`] from the state and
//! the agent ([`decide()`]), then (in the runtime) append the intent, perform
//! the effect, append the completion. Neither folding nor deciding does I/O.
//!
//! - [`agent`]: `agent.toml`, parsed strictly, validated, digested.
//! - [`view`]: the agent with its plugins' tools resolved, as deciding sees it.
//! - [`approvals`]: standing approval rules: what one matches, read back
//!   from the store.
//! - [`events`]: the event kinds and their versioned encoding.
//! - [`state`]: folding, [`RunStatus`], the conversation.
//! - [`mod@decide`]: the decision table.
//! - [`budget`]: limits, usage, pricing, the fixed check order, extensions.
//! - [`mcp_servers`]: MCP servers as tools (`[mcp_servers.<name>]`): their
//!   OS sandbox, their pinned tool lists, their calls as leases.
//! - [`child_agents`]: agents as tools: `[agents.<name>]`, child run ids,
//!   nested budgets.
//! - [`plan`]: plan files: roles, phases, stopping rules and a result; a
//!   plan loads as an agent whose model is the plan.
//! - [`channels`]: delivery channels: what each receives, the delivery
//!   events, the next delivery a run owes, backoff.
//! - [`retry`]: the one retry layer for model calls: attempts, backoff,
//!   `Retry-After` up to a cap, and parking on a longer wait.
//! - [`prompt`]: assembling the model request.
//! - [`context`]: context sources: settings, what the log recorded, quoting.
//! - [`compaction`]: summarising older history when the prompt outgrows its
//!   budget.
//! - [`policy_hooks`]: policies asked at fixed points of a run, their
//!   decisions recorded.
//! - [`policy_plugin`]: policies carried out by WASM components.
//! - [`output`]: typed results: the final answer checked against the
//!   agent's output schema.
//! - [`mod@replay`]: folding a recorded log while checking every decision.
//! - [`schema`]: JSON Schema checks (resume input, agent schemas).
//! - [`session`]: sessions: the history a run in a session sees, fixed
//!   when it starts.
//! - [`start`]: [`StartOptions`], what a run starts with besides its agent
//!   and input.
//! - [`turn`]: live turns: a run driven in the background, watched as a
//!   stream of turn events, cancelled through its handle or by dropping it.
//! - [`ids`]: run and call ids, digests, idempotency keys.
//! - [`canonical`]: canonical JSON for digests.
//!
//! Invariants: the log is the only truth (status and conversation are
//! derived from it); an effect's intent is appended before the effect runs;
//! a `write` intent without completion is never re-executed (the run derives
//! to `needs_reconciliation`); replay re-reads recorded facts (completions,
//! clock readings, pricing) and never live configuration.

pub mod agent;
pub mod approvals;
pub mod budget;
pub mod canonical;
pub mod channels;
pub mod child_agents;
mod codes;
pub mod compaction;
pub mod context;
pub mod decide;
pub mod events;
pub mod ids;
pub mod keys;
pub mod mcp_servers;
pub mod output;
pub mod plan;
pub mod policy_hooks;
pub mod policy_plugin;
pub mod prompt;
pub mod refusal;
pub mod replay;
pub mod retry;
pub mod runtime;
pub mod schema;
pub mod session;
pub mod start;
pub mod state;
pub mod turn;
pub mod view;
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
    ForkRefusal, OsRandom, Random, RunUpdate, RunUpdates, Runtime, RuntimeError, Step, SystemClock,
};
pub use session::{SessionRun, SessionSummary};
pub use start::StartOptions;
pub use state::{FoldError, ResumeError, RunState, RunStatus, fold};
pub use turn::{TurnEvent, TurnHandle, TurnOutcome};
pub use view::AgentView;
