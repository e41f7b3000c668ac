//! Run ceilings: the host's bounds on what one model response, and one run,
//! may start, in force whether or not the agent sets any budget.
//!
//! Budgets ([`super::budget`]) are the agent's, and unset by default; a
//! model that asks for hundreds of child runs or tool calls in one response
//! must still meet a bound. The operator sets these in `warden.toml`'s
//! `[ceilings]` (defaults: [`RunCeilings::DEFAULT`]); a run records the
//! ones it started under in its `run_started` (in
//! [`RecordedLimits`](super::budget::RecordedLimits)), so every host that
//! drives or replays it decides the same way whatever its configuration
//! says now.
//!
//! | ceiling                   | what it bounds | when reached |
//! | ------------------------- | -------------- | ------------ |
//! | `tool_calls_per_response` | calls of one model response (agent and plugin calls alike) | each call past it is refused ([`ToolCallError::CeilingReached`](super::events::ToolCallError::CeilingReached)) |
//! | `children_per_response`   | calls to other agents (child runs) of one response | each such call past it is refused |
//! | `children_per_run`        | child runs the run starts in all | each later call to an agent is refused |
//! | `fuel_per_run`            | sandbox fuel the run used, its children's included | each later plugin call or call to an agent is refused |
//!
//! A refused call is the model's to see, as any refused call is: the run
//! goes on, and the first calls of the response (up to the ceiling) run.
//! Fuel is checked before a call starts, as the `max_fuel` budget is, but
//! unlike the budget it does not bound the leases already running: each
//! ends within its own per-lease ceiling, so a run passes `fuel_per_run`
//! by at most what its leases in flight use (one lease's fuel ceiling each,
//! at most `max_parallel_calls` of them). An agent that needs an exact
//! bound sets `max_fuel`.
//! The checks are in [`decide`](super::decide::decide), the one place that
//! decides what a response may start, so every surface (CLI, worker,
//! server, MCP) meets them.

use serde::{Deserialize, Serialize};

/// The host's ceilings for one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunCeilings {
    /// The most tool calls of one model response that start.
    pub tool_calls_per_response: u32,
    /// The most calls to other agents (child runs) of one model response
    /// that start.
    pub children_per_response: u32,
    /// The most child runs one run starts.
    pub children_per_run: u32,
    /// The most fuel one run uses before its plugin calls and child runs
    /// are refused.
    pub fuel_per_run: u64,
}

impl RunCeilings {
    /// The ceilings when `warden.toml` sets none: 64 tool calls and 8 child
    /// runs per response, 32 child runs per run, 1,000,000,000,000 fuel per
    /// run (ten leases at the sandbox's per-lease ceiling).
    pub const DEFAULT: RunCeilings = RunCeilings {
        tool_calls_per_response: 64,
        children_per_response: 8,
        children_per_run: 32,
        fuel_per_run: 1_000_000_000_000,
    };

    /// The value of `ceiling`.
    pub fn get(&self, ceiling: Ceiling) -> u64 {
        match ceiling {
            Ceiling::ToolCallsPerResponse => u64::from(self.tool_calls_per_response),
            Ceiling::ChildrenPerResponse => u64::from(self.children_per_response),
            Ceiling::ChildrenPerRun => u64::from(self.children_per_run),
            Ceiling::FuelPerRun => self.fuel_per_run,
        }
    }
}

impl Default for RunCeilings {
    fn default() -> Self {
        RunCeilings::DEFAULT
    }
}

/// One ceiling, by its `[ceilings]` key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ceiling {
    /// [`RunCeilings::tool_calls_per_response`].
    ToolCallsPerResponse,
    /// [`RunCeilings::children_per_response`].
    ChildrenPerResponse,
    /// [`RunCeilings::children_per_run`].
    ChildrenPerRun,
    /// [`RunCeilings::fuel_per_run`].
    FuelPerRun,
}

impl Ceiling {
    /// Every ceiling, in the order `config show` lists them.
    pub const ALL: [Ceiling; 4] = [
        Ceiling::ToolCallsPerResponse,
        Ceiling::ChildrenPerResponse,
        Ceiling::ChildrenPerRun,
        Ceiling::FuelPerRun,
    ];

    /// The key that sets it in `warden.toml`'s `[ceilings]`.
    pub fn key(self) -> &'static str {
        match self {
            Ceiling::ToolCallsPerResponse => "tool_calls_per_response",
            Ceiling::ChildrenPerResponse => "children_per_response",
            Ceiling::ChildrenPerRun => "children_per_run",
            Ceiling::FuelPerRun => "fuel_per_run",
        }
    }
}

impl std::fmt::Display for Ceiling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_record_by_their_keys() {
        let text = serde_json::to_string(&RunCeilings::DEFAULT).unwrap();
        for ceiling in Ceiling::ALL {
            assert!(text.contains(ceiling.key()), "{text}");
        }
        let back: RunCeilings = serde_json::from_str(&text).unwrap();
        assert_eq!(back, RunCeilings::DEFAULT);
    }
}
