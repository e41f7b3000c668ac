//! Tests of the pure core with plain data: what every log folds to (status,
//! conversation, usage), what [`decide`] does in every state, the fold's
//! refusals, and checked replay. Table-driven: one helper per area takes a
//! log and the expected outcome.
//!
//! [`Sim`] plays the runtime's part without I/O (scripted model turns, tool
//! outputs made up from the arguments), so whole runs are built by deciding
//! and recording, exactly as the runtime will.

use std::path::Path;

use serde_json::{Value, json};

use super::budget::{BudgetKind, BudgetLimits, BudgetOverrun, ExtensionError, Pricing};
use super::decide::{Action, Idle, Park, decide};
use super::events::*;
use super::ids::{AgentDigest, CallDigest, CallId, RequestHash, RunId, idempotency_key};
use super::replay::{ReplayError, ReplayOptions, replay};
use super::retry::{DEFAULT_MAX_ATTEMPTS as MAX_MODEL_ATTEMPTS, RetryPolicy};
use super::state::{FoldError, RunState, fold};
use super::status::RunStatus;
use super::view::{AgentTool, AgentView, ToolTarget};
use warden_plugins::grant::EffectClass;
use warden_providers::scripted::{ScriptedProvider, ScriptedToolCall, ScriptedTurn};
use warden_providers::{Message, ResponseAssembler, StopReason, ToolCall, Usage};
use warden_sandbox::{Outcome, UsageReceipt};

// ---------------------------------------------------------------- fixtures

fn run_id() -> RunId {
    RunId::new("r1").unwrap()
}

fn plugin_tool(tool: &str, effect: EffectClass, needs_approval: bool) -> AgentTool {
    let tool = ToolRef {
        plugin: "fs".into(),
        tool: tool.into(),
    };
    AgentTool {
        name: tool.model_name(),
        description: format!("{tool}"),
        input_schema: json!({"type": "object"}),
        target: ToolTarget::Plugin {
            tool,
            effect,
            needs_approval,
            key: None,
        },
    }
}

/// An agent with a read, an idempotent and a write tool (the write needs
/// approval), and a human tool.
fn view() -> AgentView {
    AgentView {
        name: "notes".into(),
        digest: AgentDigest::from_hex("d1"),
        model: "demo".into(),
        provider: "scripted".into(),
        instructions: "You keep notes.".into(),
        max_tokens: 100,
        retry: RetryPolicy::default(),
        tools: vec![
            AgentTool {
                name: "ask".into(),
                description: "Ask the operator".into(),
                input_schema: json!({"type": "object"}),
                target: ToolTarget::Human {
                    response_schema: json!({"type": "string"}),
                },
            },
            AgentTool {
                input_schema: json!({"type": "nonsense"}),
                ..plugin_tool("broken", EffectClass::Read, false)
            },
            AgentTool {
                input_schema: json!({"properties": {"pattern": {"type": "string"}}}),
                ..plugin_tool("grep", EffectClass::Read, false)
            },
            plugin_tool("read_file", EffectClass::Read, false),
            plugin_tool("stat", EffectClass::Idempotent, false),
            plugin_tool("write_file", EffectClass::Write, true),
        ],
        budgets: BudgetLimits::default(),
        pricing: None,
        context: Vec::new(),
        max_invalid_tool_calls: 3,
        parallel: Default::default(),
        input_schemas: Default::default(),
        on_refusal: Default::default(),
        compaction: None,
        output_schema: None,
        channels: vec![],
        policies: vec![],
        mcp_tools: Default::default(),
    }
}

fn view_with(budgets: BudgetLimits) -> AgentView {
    AgentView { budgets, ..view() }
}

fn receipt(fuel: u64) -> UsageReceipt {
    UsageReceipt {
        outcome: Outcome::Ok,
        fuel_consumed: fuel,
        peak_memory_bytes: 0,
        wall_time_us: 0,
        output_bytes: 0,
        stdout_bytes: 0,
        stderr_bytes: 0,
        log_bytes: 0,
        stdio_dropped_bytes: 0,
        denied_growth: None,
        network: None,
        unlisted: None,
        secrets: Vec::new(),
        bundle: None,
    }
}

// ------------------------------------------------------- event shorthands

fn started() -> Event {
    Event::RunStarted(RunStarted {
        run_id: run_id(),
        agent: "notes".into(),
        agent_digest: AgentDigest::from_hex("d1"),
        input: json!("tidy my notes"),
        labels: Default::default(),
        clock_seed_ms: 10_000,
        random_seed: 7,
        agent_file: None,
        session: None,
        limits: None,
        parent: None,
        mcp_tools: Default::default(),
    })
}

fn model(step: u32, attempt: u32) -> Event {
    Event::ModelCallIntent(ModelCallIntent {
        step,
        attempt,
        request_hash: RequestHash::from_hex("h"),
        request: None,
        provider: None,
        model: None,
    })
}

/// A model answer at `step` calling `calls` (by model name, with arguments),
/// each with the provider id `m<step>-<n>`, using 10 tokens in and out.
fn answer(step: u32, text: &str, calls: &[(&str, Value)]) -> Event {
    answer_with(step, text, calls, StopReason::EndTurn)
}

fn answer_with(step: u32, text: &str, calls: &[(&str, Value)], stop: StopReason) -> Event {
    Event::ModelCallCompleted(ModelCallCompleted {
        step,
        text: text.into(),
        tool_calls: calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| ToolCall {
                id: format!("m{step}-{}", i + 1),
                name: (*name).into(),
                arguments: args.clone(),
            })
            .collect(),
        blocks: vec![],
        usage: Usage {
            input_tokens: 10,
            output_tokens: 10,
        },
        cost_nanos: Some(5),
        at_ms: None,
        pricing: None,
        stop_reason: stop,
    })
}

/// A transient failure at `at_ms` whose next attempt is due at `retry_at_ms`.
fn model_failed_at(step: u32, at_ms: u64, retry_at_ms: u64) -> Event {
    Event::ModelCallFailed(ModelCallFailed {
        step,
        error: ModelCallError {
            transient: true,
            message: "slow down".into(),
            status: Some(429),
            retry_after_ms: Some(retry_at_ms - at_ms),
        },
        at_ms: Some(at_ms),
        retry_at_ms: Some(retry_at_ms),
    })
}

fn model_failed(step: u32, transient: bool) -> Event {
    Event::ModelCallFailed(ModelCallFailed {
        step,
        error: ModelCallError {
            transient,
            message: "busy".into(),
            status: None,
            retry_after_ms: None,
        },
        at_ms: None,
        retry_at_ms: None,
    })
}

fn tool_ref(model_name: &str) -> ToolRef {
    let (plugin, tool) = model_name.split_once("__").unwrap();
    ToolRef {
        plugin: plugin.into(),
        tool: tool.into(),
    }
}

fn tool_intent_of(
    step: u32,
    n: usize,
    name: &str,
    args: Value,
    effect: EffectClass,
) -> ToolCallIntent {
    let call_id = CallId::new(step, n);
    ToolCallIntent {
        idempotency_key: idempotency_key(&run_id(), &call_id),
        call_id,
        tool: tool_ref(name),
        arguments: args,
        effect,
        keyed_by: None,
    }
}

fn tool_intent(step: u32, n: usize, name: &str, args: Value, effect: EffectClass) -> Event {
    Event::ToolCallIntent(tool_intent_of(step, n, name, args, effect))
}

fn tool_done(step: u32, n: usize, output: Value) -> Event {
    Event::ToolCallCompleted(ToolCallCompleted {
        call_id: CallId::new(step, n),
        result: ToolCallResult::Output(output),
        receipt: receipt(100),
    })
}

fn approval(step: u32, n: usize, name: &str) -> Event {
    Event::ApprovalRequested(ApprovalRequested {
        call_id: CallId::new(step, n),
        tool: tool_ref(name),
        effect: None,
        preview: None,
        preflight_error: None,
        receipt: Some(receipt(50)),
        digest: None,
        at_ms: None,
    })
}

fn granted(step: u32, n: usize) -> Event {
    Event::ApprovalGranted(ApprovalGranted {
        call_id: CallId::new(step, n),
        by: "alice".into(),
        digest: None,
        rule: None,
        at_ms: None,
    })
}

/// An approval of call `n` of `step` naming the digest of a call to `name`
/// with `args`.
fn granted_for(step: u32, n: usize, name: &str, args: &Value) -> Event {
    Event::ApprovalGranted(ApprovalGranted {
        call_id: CallId::new(step, n),
        by: "alice".into(),
        digest: Some(CallDigest::of_call(name, args)),
        rule: None,
        at_ms: None,
    })
}

fn denied(step: u32, n: usize) -> Event {
    Event::ApprovalDenied(ApprovalDenied {
        call_id: CallId::new(step, n),
        by: "bob".into(),
        reason: "not that file".into(),
        at_ms: None,
    })
}

fn suspended(step: u32, n: usize) -> Event {
    Event::Suspended(Suspended {
        call_id: CallId::new(step, n),
        reason: "human tool `ask` called with {}".into(),
        schema: json!({"type": "string"}),
    })
}

fn resumed(input: Value) -> Event {
    Event::Resumed(Resumed {
        input,
        by: None,
        at_ms: None,
    })
}

fn exceeded(budget: BudgetKind, used: u64, limit: u64) -> Event {
    Event::BudgetExceeded(BudgetOverrun {
        budget,
        used,
        limit,
        needed: None,
    })
}

fn extended(limits: BudgetLimits) -> Event {
    Event::BudgetExtended(BudgetExtended {
        limits,
        by: None,
        at_ms: None,
    })
}

fn clock(at_ms: u64) -> Event {
    Event::ClockObserved(ClockObserved { at_ms })
}

fn resolved(step: u32, n: usize) -> Event {
    Event::ToolCallResolved(ToolCallResolved {
        call_id: CallId::new(step, n),
        by: "alice".into(),
        output: json!({"written": true}),
        note: None,
        at_ms: None,
    })
}

fn completed(output: &str) -> Event {
    Event::RunCompleted(RunCompleted {
        output: json!(output),
        by_host: false,
    })
}

fn run_failed() -> Event {
    Event::RunFailed(RunFailed {
        error: RunError::Host {
            message: "plugin failed to load".into(),
        },
    })
}

fn cancelled(unresolved: Option<&ToolCallIntent>) -> Event {
    Event::RunCancelled(RunCancelled {
        reason: None,
        by: None,
        unresolved_write: unresolved.map(UnresolvedWrite::from),
    })
}

fn abandoned(unresolved: Option<&ToolCallIntent>) -> Event {
    Event::RunAbandoned(RunAbandoned {
        reason: "superseded".into(),
        by: None,
        unresolved_write: unresolved.map(UnresolvedWrite::from),
    })
}

fn log(rest: Vec<Event>) -> Vec<Event> {
    let mut events = vec![started()];
    events.extend(rest);
    events
}

fn write_args() -> Value {
    json!({"path": "a.txt", "content": "hi"})
}

fn read_args() -> Value {
    json!({"path": "a.txt"})
}

/// A log ending with the write `call-1-1` approved and in flight.
fn dangling_write() -> Vec<Event> {
    log(vec![
        model(1, 1),
        answer(1, "", &[("fs__write_file", write_args())]),
        approval(1, 1, "fs__write_file"),
        granted(1, 1),
        tool_intent(1, 1, "fs__write_file", write_args(), EffectClass::Write),
    ])
}

fn write_intent() -> ToolCallIntent {
    tool_intent_of(1, 1, "fs__write_file", write_args(), EffectClass::Write)
}

// ------------------------------------------------------------------ status

/// Each status is listed under its own serialized name, in the store class
/// that matches what the engine means by it: only terminal statuses settle
/// (release their session), only `running` is driven, only `waiting` wakes
/// by itself, and nothing the engine derives is `queued` (a store state).
#[test]
fn every_status_lists_under_its_own_name() {
    use warden_store::StatusClass;
    for status in RunStatus::ALL {
        let listing = status.listing();
        let serialized = serde_json::to_value(status).unwrap();
        assert_eq!(serialized, json!(listing.name()), "{status:?}");
        let expected = match status {
            RunStatus::Running => StatusClass::Running,
            RunStatus::Waiting => StatusClass::Waiting,
            s if s.is_terminal() => StatusClass::Settled,
            _ => StatusClass::Parked,
        };
        assert_eq!(listing.class(), expected, "{status:?}");
        assert_eq!(
            status.is_terminal(),
            [
                RunStatus::Completed,
                RunStatus::Failed,
                RunStatus::Cancelled,
                RunStatus::Abandoned
            ]
            .contains(&status),
            "{status:?}"
        );
    }
}

#[test]
fn every_status_is_derived_from_the_log_alone() {
    let cases: Vec<(&str, Vec<Event>, RunStatus)> = vec![
        ("just started", log(vec![]), RunStatus::Running),
        (
            "model in flight",
            log(vec![model(1, 1)]),
            RunStatus::Running,
        ),
        (
            "read in flight",
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__read_file", read_args())]),
                tool_intent(1, 1, "fs__read_file", read_args(), EffectClass::Read),
            ]),
            RunStatus::Running,
        ),
        (
            "approval pending",
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__write_file", write_args())]),
                approval(1, 1, "fs__write_file"),
            ]),
            RunStatus::AwaitingApproval,
        ),
        (
            "suspended",
            log(vec![
                model(1, 1),
                answer(1, "", &[("ask", json!({}))]),
                suspended(1, 1),
            ]),
            RunStatus::Suspended,
        ),
        (
            "awaiting an external tool",
            log(vec![
                model(1, 1),
                answer(1, "", &[("pay", json!({"invoice": "i-1"}))]),
                Event::ExternalCallRequested(crate::events::ExternalCallRequested {
                    call_id: CallId::new(1, 1),
                    tool: "pay".into(),
                    arguments: json!({"invoice": "i-1"}),
                    output_schema: json!({"type": "object"}),
                    must_match: vec!["invoice".into()],
                }),
            ]),
            RunStatus::AwaitingExternal,
        ),
        (
            "a child run in flight",
            log(vec![
                model(1, 1),
                answer(1, "", &[("worker", json!({"task": "t"}))]),
                child_started(1, 1),
            ]),
            RunStatus::Running,
        ),
        (
            "awaiting a child",
            log(vec![
                model(1, 1),
                answer(1, "", &[("worker", json!({"task": "t"}))]),
                child_started(1, 1),
                Event::ChildParked(crate::events::ChildParked {
                    call_id: CallId::new(1, 1),
                    child_run: RunId::new("r1.call-1-1").unwrap(),
                    status: RunStatus::AwaitingApproval,
                }),
            ]),
            RunStatus::AwaitingChild,
        ),
        (
            "a child finished",
            log(vec![
                model(1, 1),
                answer(1, "", &[("worker", json!({"task": "t"}))]),
                child_started(1, 1),
                Event::ChildFinished(crate::events::ChildFinished {
                    call_id: CallId::new(1, 1),
                    child_run: RunId::new("r1.call-1-1").unwrap(),
                    status: RunStatus::Completed,
                    result: ToolCallResult::Output(json!({"done": true})),
                    usage: crate::budget::BudgetUsage {
                        steps: 2,
                        ..Default::default()
                    },
                }),
            ]),
            RunStatus::Running,
        ),
        (
            "over budget",
            log(vec![exceeded(BudgetKind::Steps, 0, 0)]),
            RunStatus::BudgetExceeded,
        ),
        (
            "extended",
            log(vec![
                exceeded(BudgetKind::Steps, 0, 0),
                extended(BudgetLimits {
                    steps: Some(5),
                    ..BudgetLimits::default()
                }),
            ]),
            RunStatus::Running,
        ),
        (
            "waiting for a retry's due time",
            log(vec![
                model(1, 1),
                model_failed_at(1, 1_000, 121_000),
                Event::WaitStarted(WaitStarted {
                    step: 1,
                    since_ms: 1_000,
                    until_ms: 121_000,
                }),
            ]),
            RunStatus::Waiting,
        ),
        (
            "the wait ended",
            log(vec![
                model(1, 1),
                model_failed_at(1, 1_000, 121_000),
                Event::WaitStarted(WaitStarted {
                    step: 1,
                    since_ms: 1_000,
                    until_ms: 121_000,
                }),
                Event::WaitEnded(WaitEnded { at_ms: 121_000 }),
            ]),
            RunStatus::Running,
        ),
        (
            "dangling write",
            dangling_write(),
            RunStatus::NeedsReconciliation,
        ),
        (
            "resolved write",
            [dangling_write(), vec![resolved(1, 1)]].concat(),
            RunStatus::Running,
        ),
        (
            "completed",
            log(vec![model(1, 1), answer(1, "done", &[]), completed("done")]),
            RunStatus::Completed,
        ),
        ("failed", log(vec![run_failed()]), RunStatus::Failed),
        (
            "cancelled",
            log(vec![cancelled(None)]),
            RunStatus::Cancelled,
        ),
        (
            "abandoned with its write",
            [dangling_write(), vec![abandoned(Some(&write_intent()))]].concat(),
            RunStatus::Abandoned,
        ),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for (name, events, expected) in cases {
        let state = fold(&events).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(state.status(), expected, "{name}");
        assert_eq!(state.event_count, events.len(), "{name}");
        seen.insert(expected.as_str());
    }
    assert_eq!(seen.len(), RunStatus::ALL.len(), "every status is covered");
}

/// `child_started` for call `n` of step `step`, its child `r1.call-…`.
fn child_started(step: u32, n: usize) -> Event {
    let call_id = CallId::new(step, n);
    Event::ChildStarted(crate::events::ChildStarted {
        child_run: RunId::new(format!("r1.{call_id}")).unwrap(),
        call_id,
        agent: "worker".into(),
        agent_digest: crate::ids::AgentDigest::from_hex("ab"),
        input: json!({"task": "t"}),
        budgets: BudgetLimits::default(),
        capped: vec![],
    })
}

/// A child's finish is charged to its parent and is the call's result;
/// a finish for another child, or with no child started, is refused.
#[test]
fn a_childs_finish_settles_its_call_and_charges_its_use() {
    let started = log(vec![
        model(1, 1),
        answer(1, "", &[("worker", json!({"task": "t"}))]),
        child_started(1, 1),
    ]);
    let finished = |child: &str| {
        Event::ChildFinished(crate::events::ChildFinished {
            call_id: CallId::new(1, 1),
            child_run: RunId::new(child).unwrap(),
            status: RunStatus::Completed,
            result: ToolCallResult::Output(json!({"done": true})),
            usage: crate::budget::BudgetUsage {
                steps: 2,
                tool_calls: 3,
                fuel: 10,
                ..Default::default()
            },
        })
    };
    let state = fold(&[started.clone(), vec![finished("r1.call-1-1")]].concat()).unwrap();
    assert_eq!(state.usage.steps, 1 + 2);
    assert_eq!(state.usage.tool_calls, 1 + 3);
    assert_eq!(state.usage.fuel, 10);
    assert_eq!(
        state.turns[0].calls[0].progress.result_for_model(),
        Some((r#"{"done":true}"#.to_owned(), false))
    );
    let err = fold(&[started.clone(), vec![finished("r1.other")]].concat()).unwrap_err();
    assert!(err.to_string().contains("child_run"), "{err}");
    let no_child = log(vec![
        model(1, 1),
        answer(1, "", &[("worker", json!({"task": "t"}))]),
        finished("r1.call-1-1"),
    ]);
    assert!(fold(&no_child).is_err());
}

#[test]
fn statuses_serialize_snake_case_and_parse_back() {
    for status in RunStatus::ALL {
        assert_eq!(
            serde_json::to_value(status).unwrap(),
            json!(status.as_str())
        );
        assert_eq!(status.as_str().parse::<RunStatus>(), Ok(status));
        assert_eq!(
            status.is_terminal(),
            matches!(
                status,
                RunStatus::Completed
                    | RunStatus::Failed
                    | RunStatus::Cancelled
                    | RunStatus::Abandoned
            )
        );
    }
    assert!(
        "done"
            .parse::<RunStatus>()
            .unwrap_err()
            .contains("running, awaiting_approval")
    );
    assert!(RunStatus::NeedsReconciliation.is_parked());
    assert!(!RunStatus::Running.is_parked());
}

// ------------------------------------------------------------------- fold

/// Asserts that folding `events` fails at `position` with a problem whose
/// message contains `message`.
fn assert_impossible(name: &str, events: Vec<Event>, position: usize, message: &str) {
    match fold(&events) {
        Err(FoldError::Impossible {
            position: p,
            problem,
            kind,
        }) => {
            assert_eq!(p, position, "{name}: {problem}");
            assert_eq!(kind, events[position].kind(), "{name}");
            assert!(
                problem.to_string().contains(message),
                "{name}: `{problem}` does not say `{message}`"
            );
        }
        other => panic!("{name}: expected an impossible event, got {other:?}"),
    }
}

#[test]
fn impossible_sequences_are_refused_naming_the_position() {
    assert_eq!(fold(&[]), Err(FoldError::Empty));
    let cases: Vec<(&str, Vec<Event>, usize, &str)> = vec![
        (
            "not started",
            vec![model(1, 1)],
            0,
            "must start with run_started",
        ),
        ("started twice", log(vec![started()]), 1, "already started"),
        (
            "after terminal",
            log(vec![run_failed(), clock(1)]),
            2,
            "already failed",
        ),
        (
            "completion without intent",
            log(vec![answer(1, "x", &[])]),
            1,
            "no model call of step 1",
        ),
        (
            "wrong step",
            log(vec![model(2, 1)]),
            1,
            "expected step 1 attempt 1, found step 2",
        ),
        (
            "two model calls at once",
            log(vec![model(1, 1), model(1, 1)]),
            2,
            "still in flight",
        ),
        (
            "retry with the wrong attempt",
            log(vec![model(1, 1), model_failed(1, true), model(1, 1)]),
            3,
            "expected step 1 attempt 2",
        ),
        (
            "a wait without a failed model call",
            log(vec![Event::WaitStarted(WaitStarted {
                step: 1,
                since_ms: 1_000,
                until_ms: 121_000,
            })]),
            1,
            "wait_started needs a failed model call",
        ),
        (
            "a wait ended before its wake-up time",
            log(vec![
                model(1, 1),
                model_failed_at(1, 1_000, 121_000),
                Event::WaitStarted(WaitStarted {
                    step: 1,
                    since_ms: 1_000,
                    until_ms: 121_000,
                }),
                Event::WaitEnded(WaitEnded { at_ms: 120_999 }),
            ]),
            4,
            "before the wake-up time 121000",
        ),
        (
            "a model call while waiting",
            log(vec![
                model(1, 1),
                model_failed_at(1, 1_000, 121_000),
                Event::WaitStarted(WaitStarted {
                    step: 1,
                    since_ms: 1_000,
                    until_ms: 121_000,
                }),
                model(1, 2),
            ]),
            4,
            "waiting",
        ),
        (
            "a wait ended twice",
            log(vec![
                model(1, 1),
                model_failed_at(1, 1_000, 121_000),
                Event::WaitStarted(WaitStarted {
                    step: 1,
                    since_ms: 1_000,
                    until_ms: 121_000,
                }),
                Event::WaitEnded(WaitEnded { at_ms: 121_000 }),
                Event::WaitEnded(WaitEnded { at_ms: 121_001 }),
            ]),
            5,
            "not waiting",
        ),
        (
            "model call after the final answer",
            log(vec![model(1, 1), answer(1, "done", &[]), model(2, 1)]),
            3,
            "final answer at step 1",
        ),
        (
            "model call with a tool call outstanding",
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__read_file", read_args())]),
                model(2, 1),
            ]),
            3,
            "`call-1-1` is not settled",
        ),
        (
            "tool calls out of order",
            log(vec![
                model(1, 1),
                answer(
                    1,
                    "",
                    &[("fs__read_file", read_args()), ("fs__stat", json!({}))],
                ),
                tool_intent(1, 2, "fs__stat", json!({}), EffectClass::Idempotent),
            ]),
            3,
            "`call-1-2` is not the next tool call to settle (that is `call-1-1`)",
        ),
        (
            "intent with other arguments",
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__read_file", read_args())]),
                tool_intent(
                    1,
                    1,
                    "fs__read_file",
                    json!({"path": "b"}),
                    EffectClass::Read,
                ),
            ]),
            3,
            "arguments recorded for `call-1-1` does not match",
        ),
        (
            "intent for another tool",
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__read_file", read_args())]),
                tool_intent(1, 1, "fs__write_file", read_args(), EffectClass::Write),
            ]),
            3,
            "tool recorded for `call-1-1`",
        ),
        (
            "intent with a foreign key",
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__read_file", read_args())]),
                Event::ToolCallIntent(ToolCallIntent {
                    idempotency_key: "forged".into(),
                    ..tool_intent_of(1, 1, "fs__read_file", read_args(), EffectClass::Read)
                }),
            ]),
            3,
            "idempotency key",
        ),
        (
            "intent while awaiting approval",
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__write_file", write_args())]),
                approval(1, 1, "fs__write_file"),
                tool_intent(1, 1, "fs__write_file", write_args(), EffectClass::Write),
            ]),
            4,
            "is awaiting approval, not pending or approved",
        ),
        (
            "intent after a denial",
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__write_file", write_args())]),
                approval(1, 1, "fs__write_file"),
                denied(1, 1),
                tool_intent(1, 1, "fs__write_file", write_args(), EffectClass::Write),
            ]),
            5,
            "is not the next tool call to settle (that is none)",
        ),
        (
            "completion without intent",
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__read_file", read_args())]),
                tool_done(1, 1, json!(1)),
            ]),
            3,
            "is pending, not in flight",
        ),
        (
            "approval without request",
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__write_file", write_args())]),
                granted(1, 1),
            ]),
            3,
            "is pending, not awaiting approval",
        ),
        (
            "resolving a read",
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__read_file", read_args())]),
                tool_intent(1, 1, "fs__read_file", read_args(), EffectClass::Read),
                resolved(1, 1),
            ]),
            4,
            "not a write in flight",
        ),
        (
            "resumed without suspension",
            log(vec![resumed(json!("x"))]),
            1,
            "not suspended",
        ),
        (
            "extension without overrun",
            log(vec![extended(BudgetLimits::default())]),
            1,
            "no budget is exceeded",
        ),
        (
            "overrun while a model call is in flight",
            log(vec![model(1, 1), exceeded(BudgetKind::Steps, 1, 1)]),
            2,
            "still in flight",
        ),
        (
            "model call while over budget",
            log(vec![exceeded(BudgetKind::Steps, 0, 0), model(1, 1)]),
            2,
            "the run is budget_exceeded",
        ),
        (
            "completion with a call outstanding",
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__read_file", read_args())]),
                completed("x"),
            ]),
            3,
            "not settled",
        ),
        (
            "failing over a dangling write",
            [dangling_write(), vec![run_failed()]].concat(),
            6,
            "must name the dangling write (`call-1-1`)",
        ),
        (
            "abandoning without naming the dangling write",
            [dangling_write(), vec![abandoned(None)]].concat(),
            6,
            "must name the dangling write",
        ),
        (
            "cancelling with a write that is not dangling",
            log(vec![cancelled(Some(&write_intent()))]),
            1,
            "must name the dangling write (none)",
        ),
    ];
    for (name, events, position, message) in cases {
        assert_impossible(name, events, position, message);
    }
}

#[test]
fn a_refused_event_leaves_the_state_unchanged() {
    let mut state = fold(&log(vec![model(1, 1)])).unwrap();
    let before = state.clone();
    let err = state.apply(&model(1, 1)).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("impossible event at position 2 (model_call_intent)"),
        "{err}"
    );
    assert_eq!(state, before);
}

#[test]
fn usage_and_the_conversation_are_folded_from_the_log() {
    let events = log(vec![
        model(1, 1),
        answer(
            1,
            "Looking.",
            &[
                ("fs__read_file", read_args()),
                ("nope", json!({})),
                ("fs__write_file", write_args()),
                ("ask", json!({"question": "ok?"})),
            ],
        ),
        tool_intent(1, 1, "fs__read_file", read_args(), EffectClass::Read),
        tool_done(1, 1, json!({"content": "hello"})),
        Event::ToolCallRejected(ToolCallRejected {
            call_id: CallId::new(1, 2),
            error: ToolCallError::UnknownTool {
                name: "nope".into(),
            },
        }),
        approval(1, 3, "fs__write_file"),
        denied(1, 3),
        suspended(1, 4),
        resumed(json!("yes")),
        clock(12_500),
        model(2, 1),
        answer(2, "All done.", &[]),
    ]);
    let state = fold(&events).unwrap();
    assert_eq!(state.usage.steps, 2);
    assert_eq!(state.usage.input_tokens, 20);
    assert_eq!(state.usage.output_tokens, 20);
    assert_eq!(state.usage.cost_nanos, 10);
    assert_eq!(
        state.usage.tool_calls, 1,
        "rejected and denied calls do not count"
    );
    assert_eq!(state.usage.fuel, 150, "the read's lease and the preflight");
    assert_eq!(state.usage.wall_time_ms, 2_500);
    assert!(!state.clock_fresh);
    let tool = |id: &str, name: &str, content: &str, is_error: bool| Message::Tool {
        call_id: id.into(),
        name: name.into(),
        content: content.into(),
        is_error,
    };
    let conversation = state.conversation();
    assert_eq!(
        conversation[..2],
        [
            Message::User {
                content: "tidy my notes".into()
            },
            Message::Assistant {
                text: "Looking.".into(),
                tool_calls: state.turns[0]
                    .calls
                    .iter()
                    .map(|c| c.call.clone())
                    .collect(),
                blocks: vec![],
            },
        ]
    );
    assert_eq!(
        conversation[2..],
        [
            tool("m1-1", "fs__read_file", r#"{"content":"hello"}"#, false),
            tool("m1-2", "nope", "there is no tool `nope`", true),
            tool(
                "m1-3",
                "fs__write_file",
                "the call was denied by bob: not that file",
                true
            ),
            tool("m1-4", "ask", "yes", false),
            Message::Assistant {
                text: "All done.".into(),
                tool_calls: vec![],
                blocks: vec![],
            },
        ]
    );
}

// ----------------------------------------------------------------- decide

/// What an action is, in one line, for tables.
fn shape(action: &Action) -> String {
    match action {
        Action::CallModel(c) => format!(
            "call_model step={} attempt={} recorded={} max_tokens={}",
            c.step, c.attempt, c.recorded, c.request.max_tokens
        ),
        Action::CallTool(t) => format!(
            "call_tool {} {} {} recorded={}",
            t.intent.call_id, t.intent.tool, t.intent.effect, t.recorded
        ),
        Action::RequestApproval(a) => format!("request_approval {} {}", a.call_id, a.tool),
        Action::RejectToolCall(r) => format!("reject {}: {}", r.call_id, r.error),
        Action::WithdrawApproval(w) => format!(
            "withdraw {} {} approved={} call={}",
            w.call_id,
            w.reason.as_str(),
            w.approved.as_ref().map_or("none", |d| &d.as_str()[..6]),
            &w.call.as_str()[..6]
        ),
        Action::RejectOutput(r) => format!("reject_output step={}: {}", r.step, r.violation),
        Action::ObserveClock => "observe_clock".into(),
        Action::ConsultPolicy(c) => format!("consult {} at {:?}", c.policy, c.point),
        Action::ResolveContext(r) => format!("resolve_context {} step={}", r.source, r.step),
        Action::Compact(c) => format!(
            "compact step={} upto={} recorded={}",
            c.step, c.upto, c.recorded
        ),
        Action::Finish(c) => format!("finish {}", c.output),
        Action::Park(Park::BudgetExceeded(o)) => {
            format!("park budget {} {}/{}", o.budget, o.used, o.limit)
        }
        Action::Park(Park::Suspend(s)) => format!("park suspend {} {}", s.call_id, s.schema),
        Action::Park(Park::External(r)) => format!("park external {} {}", r.call_id, r.tool),
        Action::Park(Park::Wait(w)) => {
            format!("park wait step={} {}..{}", w.step, w.since_ms, w.until_ms)
        }
        Action::Fail(e) => format!("fail {e}"),
        Action::Idle(Idle::Terminal(s)) => format!("idle {s}"),
        Action::Idle(Idle::AwaitingApproval { call_id }) => {
            format!("idle awaiting_approval {call_id}")
        }
        Action::Idle(Idle::Suspended { call_id }) => format!("idle suspended {call_id}"),
        Action::Idle(Idle::AwaitingExternal { call_id }) => {
            format!("idle awaiting_external {call_id}")
        }
        Action::Idle(Idle::BudgetExceeded(o)) => format!("idle budget_exceeded {}", o.budget),
        Action::Idle(Idle::NeedsReconciliation { call_id }) => {
            format!("idle needs_reconciliation {call_id}")
        }
        Action::Idle(Idle::ReconciliationRequired { since_ms }) => {
            format!("idle reconciliation_required {since_ms:?}")
        }
        Action::Idle(Idle::Waiting { until_ms }) => format!("idle waiting until {until_ms}"),
        Action::Idle(Idle::AwaitingChild {
            call_id, status, ..
        }) => format!("idle awaiting_child {call_id} {status}"),
        Action::StartChild(c) => format!(
            "start_child {} {} {} steps={:?}",
            c.call_id, c.child_run, c.agent, c.budgets.steps
        ),
        Action::DriveChild(d) => format!("drive_child {} {}", d.call_id, d.child_run),
    }
}

fn assert_decisions(cases: Vec<(&str, Vec<Event>, AgentView, &str)>) {
    for (name, events, view, expected) in cases {
        let state = fold(&events).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(shape(&decide(&state, &view)), expected, "{name}");
    }
}

#[test]
fn every_decision() {
    let one_call = |name: &str, args: Value| log(vec![model(1, 1), answer(1, "", &[(name, args)])]);
    let cases: Vec<(&str, Vec<Event>, AgentView, &str)> = vec![
        (
            "first step",
            log(vec![]),
            view(),
            "call_model step=1 attempt=1 recorded=false max_tokens=100",
        ),
        (
            "model intent without completion",
            log(vec![model(1, 1)]),
            view(),
            "call_model step=1 attempt=1 recorded=true max_tokens=100",
        ),
        (
            "read tool",
            one_call("fs__read_file", read_args()),
            view(),
            "call_tool call-1-1 fs.read_file read recorded=false",
        ),
        (
            "read intent without completion",
            [
                one_call("fs__read_file", read_args()),
                vec![tool_intent(
                    1,
                    1,
                    "fs__read_file",
                    read_args(),
                    EffectClass::Read,
                )],
            ]
            .concat(),
            view(),
            "call_tool call-1-1 fs.read_file read recorded=true",
        ),
        (
            "idempotent intent without completion",
            [
                one_call("fs__stat", json!({})),
                vec![tool_intent(
                    1,
                    1,
                    "fs__stat",
                    json!({}),
                    EffectClass::Idempotent,
                )],
            ]
            .concat(),
            view(),
            "call_tool call-1-1 fs.stat idempotent recorded=true",
        ),
        (
            "write intent without completion",
            dangling_write(),
            view(),
            "idle needs_reconciliation call-1-1",
        ),
        (
            "resolved write: next step",
            [dangling_write(), vec![resolved(1, 1)]].concat(),
            view(),
            "call_model step=2 attempt=1 recorded=false max_tokens=100",
        ),
        (
            "write needs approval",
            one_call("fs__write_file", write_args()),
            view(),
            "request_approval call-1-1 fs.write_file",
        ),
        (
            "awaiting approval",
            [
                one_call("fs__write_file", write_args()),
                vec![approval(1, 1, "fs__write_file")],
            ]
            .concat(),
            view(),
            "idle awaiting_approval call-1-1",
        ),
        (
            "approved write",
            [
                one_call("fs__write_file", write_args()),
                vec![approval(1, 1, "fs__write_file"), granted(1, 1)],
            ]
            .concat(),
            view(),
            "call_tool call-1-1 fs.write_file write recorded=false",
        ),
        (
            "approved with the call's own digest",
            [
                one_call("fs__write_file", write_args()),
                vec![
                    approval(1, 1, "fs__write_file"),
                    granted_for(1, 1, "fs__write_file", &write_args()),
                ],
            ]
            .concat(),
            view(),
            "call_tool call-1-1 fs.write_file write recorded=false",
        ),
        (
            "approved for other arguments: the approval approves nothing",
            [
                one_call("fs__write_file", write_args()),
                vec![
                    approval(1, 1, "fs__write_file"),
                    granted_for(
                        1,
                        1,
                        "fs__write_file",
                        &json!({"path": "b.txt", "content": "hi"}),
                    ),
                ],
            ]
            .concat(),
            view(),
            "withdraw call-1-1 digest_mismatch approved=776c38 call=06bcdc",
        ),
        (
            "a withdrawn approval: the call waits for approval again",
            [
                one_call("fs__write_file", write_args()),
                vec![
                    approval(1, 1, "fs__write_file"),
                    granted_for(1, 1, "fs__write_file", &json!({"path": "b.txt"})),
                    Event::ApprovalWithdrawn(ApprovalWithdrawn {
                        call_id: CallId::new(1, 1),
                        reason: WithdrawReason::DigestMismatch,
                        approved: Some(CallDigest::of_call(
                            "fs__write_file",
                            &json!({"path": "b.txt"}),
                        )),
                        call: CallDigest::of_call("fs__write_file", &write_args()),
                        rule: None,
                        at_ms: None,
                    }),
                ],
            ]
            .concat(),
            view(),
            "idle awaiting_approval call-1-1",
        ),
        (
            "approved for another tool: the approval approves nothing",
            [
                one_call("fs__write_file", write_args()),
                vec![
                    approval(1, 1, "fs__write_file"),
                    granted_for(1, 1, "fs__delete_file", &write_args()),
                ],
            ]
            .concat(),
            view(),
            "withdraw call-1-1 digest_mismatch approved=0ad157 call=06bcdc",
        ),
        (
            "approved, but the tool is gone from the agent",
            [
                one_call("fs__write_file", write_args()),
                vec![approval(1, 1, "fs__write_file"), granted(1, 1)],
            ]
            .concat(),
            AgentView {
                tools: vec![],
                ..view()
            },
            "reject call-1-1: there is no tool `fs__write_file`",
        ),
        (
            "denied write: the model hears about it",
            [
                one_call("fs__write_file", write_args()),
                vec![approval(1, 1, "fs__write_file"), denied(1, 1)],
            ]
            .concat(),
            view(),
            "call_model step=2 attempt=1 recorded=false max_tokens=100",
        ),
        (
            "unknown tool",
            one_call("fs__rm", json!({})),
            view(),
            "reject call-1-1: there is no tool `fs__rm`",
        ),
        (
            "arguments that are not an object",
            one_call("fs__read_file", json!([1])),
            view(),
            "reject call-1-1: invalid arguments: arguments must be a JSON object, got `[1]`",
        ),
        (
            "human tool",
            one_call("ask", json!({"question": "which?"})),
            view(),
            r#"park suspend call-1-1 {"type":"string"}"#,
        ),
        (
            "arguments that fail the tool's schema",
            one_call("fs__grep", json!({"pattern": 3})),
            view(),
            "reject call-1-1: invalid arguments: at `/pattern`: 3 is not of type \"string\"",
        ),
        (
            "a tool whose schema is unusable",
            one_call("fs__broken", json!({})),
            view(),
            "reject call-1-1: the tool is unavailable: the tool's input schema is unusable: invalid JSON Schema: \"nonsense\" is not valid under any of the schemas listed in the 'anyOf' keyword",
        ),
        (
            "suspended",
            [one_call("ask", json!({})), vec![suspended(1, 1)]].concat(),
            view(),
            "idle suspended call-1-1",
        ),
        (
            "answered",
            [
                one_call("ask", json!({})),
                vec![suspended(1, 1), resumed(json!("a"))],
            ]
            .concat(),
            view(),
            "call_model step=2 attempt=1 recorded=false max_tokens=100",
        ),
        (
            "final answer",
            log(vec![model(1, 1), answer(1, "done", &[])]),
            view(),
            "finish \"done\"",
        ),
        (
            "final answer cut short",
            log(vec![
                model(1, 1),
                answer_with(1, "do", &[], StopReason::MaxTokens),
            ]),
            view(),
            "fail the model's answer at step 1 was cut short by max_tokens",
        ),
        (
            "transient failure: retry",
            log(vec![model(1, 1), model_failed(1, true)]),
            view(),
            "call_model step=1 attempt=2 recorded=false max_tokens=100",
        ),
        (
            "permanent failure",
            log(vec![model(1, 1), model_failed(1, false)]),
            view(),
            "fail the model call at step 1 failed: busy",
        ),
        (
            "transient failures until attempts run out",
            log((1..=MAX_MODEL_ATTEMPTS)
                .flat_map(|a| [model(1, a), model_failed(1, true)])
                .collect()),
            view(),
            "fail the model call at step 1 failed 3 times: busy",
        ),
        (
            "max_attempts is the agent's: more attempts",
            log((1..=MAX_MODEL_ATTEMPTS)
                .flat_map(|a| [model(1, a), model_failed(1, true)])
                .collect()),
            AgentView {
                retry: RetryPolicy {
                    max_attempts: 5,
                    ..RetryPolicy::default()
                },
                ..view()
            },
            "call_model step=1 attempt=4 recorded=false max_tokens=100",
        ),
        (
            "max_attempts is the agent's: one attempt only",
            log(vec![model(1, 1), model_failed(1, true)]),
            AgentView {
                retry: RetryPolicy {
                    max_attempts: 1,
                    ..RetryPolicy::default()
                },
                ..view()
            },
            "fail the model call at step 1 failed 1 times: busy",
        ),
        (
            "a wait up to max_retry_wait: the driver waits, then calls",
            log(vec![model(1, 1), model_failed_at(1, 1_000, 61_000)]),
            view(),
            "call_model step=1 attempt=2 recorded=false max_tokens=100",
        ),
        (
            "a wait beyond max_retry_wait parks the run until due",
            log(vec![model(1, 1), model_failed_at(1, 1_000, 121_000)]),
            view(),
            "park wait step=1 1000..121000",
        ),
        (
            "parked on a wait",
            log(vec![
                model(1, 1),
                model_failed_at(1, 1_000, 121_000),
                Event::WaitStarted(WaitStarted {
                    step: 1,
                    since_ms: 1_000,
                    until_ms: 121_000,
                }),
            ]),
            view(),
            "idle waiting until 121000",
        ),
        (
            "the wait ended: the next attempt",
            log(vec![
                model(1, 1),
                model_failed_at(1, 1_000, 121_000),
                Event::WaitStarted(WaitStarted {
                    step: 1,
                    since_ms: 1_000,
                    until_ms: 121_000,
                }),
                Event::WaitEnded(WaitEnded { at_ms: 121_500 }),
            ]),
            view(),
            "call_model step=1 attempt=2 recorded=false max_tokens=100",
        ),
        (
            "completed",
            log(vec![model(1, 1), answer(1, "done", &[]), completed("done")]),
            view(),
            "idle completed",
        ),
        (
            "abandoned",
            log(vec![abandoned(None)]),
            view(),
            "idle abandoned",
        ),
        (
            "over budget",
            log(vec![exceeded(BudgetKind::Steps, 0, 0)]),
            view(),
            "idle budget_exceeded steps",
        ),
        (
            "tools in order: the second after the first settles",
            log(vec![
                model(1, 1),
                answer(
                    1,
                    "",
                    &[("fs__read_file", read_args()), ("fs__stat", json!({}))],
                ),
                tool_intent(1, 1, "fs__read_file", read_args(), EffectClass::Read),
                tool_done(1, 1, json!("x")),
            ]),
            view(),
            "call_tool call-1-2 fs.stat idempotent recorded=false",
        ),
    ];
    assert_decisions(cases);
}

#[test]
fn budgets_park_in_the_fixed_order_before_each_effect() {
    let limits = |f: fn(&mut BudgetLimits)| {
        let mut l = BudgetLimits::default();
        f(&mut l);
        view_with(l)
    };
    let after_one_step = || {
        log(vec![
            model(1, 1),
            answer(1, "", &[("fs__read_file", read_args())]),
            tool_intent(1, 1, "fs__read_file", read_args(), EffectClass::Read),
            tool_done(1, 1, json!(1)),
        ])
    };
    let one_read = || {
        log(vec![
            model(1, 1),
            answer(1, "", &[("fs__read_file", read_args())]),
        ])
    };
    let cases: Vec<(&str, Vec<Event>, AgentView, &str)> = vec![
        (
            "steps",
            after_one_step(),
            limits(|l| l.steps = Some(1)),
            "park budget steps 1/1",
        ),
        (
            "input tokens",
            after_one_step(),
            limits(|l| l.input_tokens = Some(10)),
            "park budget input_tokens 10/10",
        ),
        (
            "output tokens",
            after_one_step(),
            limits(|l| l.output_tokens = Some(10)),
            "park budget output_tokens 10/10",
        ),
        (
            "cost",
            after_one_step(),
            limits(|l| l.cost_nanos = Some(5)),
            "park budget cost 5/5",
        ),
        (
            "steps come before tokens and cost",
            after_one_step(),
            limits(|l| {
                l.cost_nanos = Some(1);
                l.input_tokens = Some(1);
                l.steps = Some(1);
            }),
            "park budget steps 1/1",
        ),
        (
            "room left: output tokens cap the request",
            after_one_step(),
            limits(|l| l.output_tokens = Some(15)),
            "call_model step=2 attempt=1 recorded=false max_tokens=5",
        ),
        (
            "tool calls do not gate a model call",
            after_one_step(),
            limits(|l| l.tool_calls = Some(1)),
            "call_model step=2 attempt=1 recorded=false max_tokens=100",
        ),
        (
            "tool calls, before the next tool",
            log(vec![
                model(1, 1),
                answer(
                    1,
                    "",
                    &[("fs__read_file", read_args()), ("fs__stat", json!({}))],
                ),
                tool_intent(1, 1, "fs__read_file", read_args(), EffectClass::Read),
                tool_done(1, 1, json!(1)),
            ]),
            limits(|l| l.tool_calls = Some(1)),
            "park budget tool_calls 1/1",
        ),
        (
            "fuel, before the next tool",
            log(vec![
                model(1, 1),
                answer(
                    1,
                    "",
                    &[("fs__read_file", read_args()), ("fs__stat", json!({}))],
                ),
                tool_intent(1, 1, "fs__read_file", read_args(), EffectClass::Read),
                tool_done(1, 1, json!(1)),
            ]),
            limits(|l| l.fuel = Some(100)),
            "park budget fuel 100/100",
        ),
        (
            "tool calls come before fuel",
            one_read(),
            limits(|l| {
                l.fuel = Some(0);
                l.tool_calls = Some(0);
            }),
            "park budget tool_calls 0/0",
        ),
        (
            "an approval request is gated too",
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__write_file", write_args())]),
            ]),
            limits(|l| l.tool_calls = Some(0)),
            "park budget tool_calls 0/0",
        ),
        (
            "wall time: read the clock first",
            one_read(),
            limits(|l| l.wall_time_ms = Some(1000)),
            "observe_clock",
        ),
        (
            "wall time: within",
            [one_read(), vec![clock(10_999)]].concat(),
            limits(|l| l.wall_time_ms = Some(1000)),
            "call_tool call-1-1 fs.read_file read recorded=false",
        ),
        (
            "wall time: over",
            [one_read(), vec![clock(11_000)]].concat(),
            limits(|l| l.wall_time_ms = Some(1000)),
            "park budget wall_time 1000/1000",
        ),
        (
            "wall time: a reading goes stale after any other event",
            [
                one_read(),
                vec![
                    clock(10_500),
                    Event::RandomObserved(RandomObserved { value: 1 }),
                ],
            ]
            .concat(),
            limits(|l| l.wall_time_ms = Some(1000)),
            "observe_clock",
        ),
        (
            "wall time: before the first step too",
            log(vec![]),
            limits(|l| l.wall_time_ms = Some(1000)),
            "observe_clock",
        ),
        (
            "counted budgets come before reading the clock",
            after_one_step(),
            limits(|l| {
                l.wall_time_ms = Some(1);
                l.steps = Some(1);
            }),
            "park budget steps 1/1",
        ),
        (
            "a retry is not a new step",
            log(vec![model(1, 1), model_failed(1, true)]),
            limits(|l| l.steps = Some(0)),
            "call_model step=1 attempt=2 recorded=false max_tokens=100",
        ),
        (
            "an extension lifts the overrun",
            [
                after_one_step(),
                vec![
                    exceeded(BudgetKind::Steps, 1, 1),
                    extended(BudgetLimits {
                        steps: Some(2),
                        ..BudgetLimits::default()
                    }),
                ],
            ]
            .concat(),
            limits(|l| l.steps = Some(1)),
            "call_model step=2 attempt=1 recorded=false max_tokens=100",
        ),
        (
            "an in-flight read is finished without a budget check",
            [
                one_read(),
                vec![tool_intent(
                    1,
                    1,
                    "fs__read_file",
                    read_args(),
                    EffectClass::Read,
                )],
            ]
            .concat(),
            limits(|l| l.tool_calls = Some(1)),
            "call_tool call-1-1 fs.read_file read recorded=true",
        ),
        (
            "a model call that crossed the cost budget starts none of its tool calls",
            one_read(),
            limits(|l| l.cost_nanos = Some(4)),
            "park budget cost 5/4",
        ),
        (
            "… nor its approval requests",
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__write_file", write_args())]),
            ]),
            limits(|l| l.output_tokens = Some(9)),
            "park budget output_tokens 10/9",
        ),
        (
            "a model budget reached, not crossed, lets the tool calls run",
            one_read(),
            limits(|l| {
                l.cost_nanos = Some(5);
                l.input_tokens = Some(10);
                l.output_tokens = Some(10);
            }),
            "call_tool call-1-1 fs.read_file read recorded=false",
        ),
        (
            "a first model call whose input alone would cross the input tokens is not made",
            log(vec![]),
            limits(|l| l.input_tokens = Some(5)),
            "park budget input_tokens 0/5",
        ),
    ];
    assert_decisions(cases);
}

#[test]
fn a_model_call_whose_input_alone_would_cross_a_budget_parks_with_what_it_needed() {
    let pricing = Pricing {
        currency: "USD".into(),
        input_micros_per_million: 3_000_000,
        output_micros_per_million: 0,
    };
    let state = fold(&log(vec![])).unwrap();
    let roomy = AgentView {
        pricing: Some(pricing.clone()),
        ..view_with(BudgetLimits {
            cost_nanos: Some(1_000_000_000),
            ..BudgetLimits::default()
        })
    };
    let Action::CallModel(call) = decide(&state, &roomy) else {
        panic!("a call within the budget is made")
    };
    assert!(call.request_size > 0);
    // The same request against a cost budget smaller than its input's price.
    let estimate = call.request_size.div_ceil(4);
    let price = estimate * 3_000;
    let tight = AgentView {
        budgets: BudgetLimits {
            cost_nanos: Some(price - 1),
            ..BudgetLimits::default()
        },
        ..roomy.clone()
    };
    let action = decide(&state, &tight);
    assert_eq!(
        action,
        Action::Park(Park::BudgetExceeded(BudgetOverrun {
            budget: BudgetKind::Cost,
            used: 0,
            limit: price - 1,
            needed: Some(price),
        }))
    );
    // Recorded, the park replays; an extension must cover what was needed.
    let mut events = log(vec![]);
    events.push(action.event().unwrap());
    let parked = replay(&events, &tight, ReplayOptions::default()).unwrap();
    assert_eq!(parked.status(), RunStatus::BudgetExceeded);
    let err = parked
        .check_extension(&tight.budgets, &json!({"max_cost": 0.0}), None)
        .unwrap_err();
    assert!(matches!(err, ExtensionError::TooSmall { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("what the refused model call needs"),
        "{err}"
    );
    let extension = parked
        .check_extension(&tight.budgets, &json!({"max_cost": 1.0}), None)
        .unwrap();
    events.push(Event::BudgetExtended(extension));
    let state = replay(&events, &tight, ReplayOptions::default()).unwrap();
    assert!(matches!(decide(&state, &tight), Action::CallModel(_)));
}

#[test]
fn wall_time_is_active_time_and_a_park_does_not_count_whatever_ends_it() {
    // The run's seed is 10_000. Each park lasts a day; the human acts are
    // stamped with the clock.
    const DAY: u64 = 86_400_000;
    let at = |mut e: Event, ms: u64| {
        match &mut e {
            Event::ApprovalRequested(x) => x.at_ms = Some(ms),
            Event::ApprovalGranted(x) => x.at_ms = Some(ms),
            Event::ApprovalDenied(x) => x.at_ms = Some(ms),
            Event::Resumed(x) => x.at_ms = Some(ms),
            Event::BudgetExtended(x) => x.at_ms = Some(ms),
            Event::ToolCallResolved(x) => x.at_ms = Some(ms),
            Event::ModelCallCompleted(x) => x.at_ms = Some(ms),
            _ => unreachable!(),
        }
        e
    };
    let approved = log(vec![
        clock(11_000),
        model(1, 1),
        at(answer(1, "", &[("fs__write_file", write_args())]), 12_000),
        clock(12_500),
        at(approval(1, 1, "fs__write_file"), 12_600),
        at(granted(1, 1), 12_600 + DAY),
        clock(13_000 + DAY),
    ]);
    let state = fold(&approved).unwrap();
    // 1s to the first reading, 1s for the model call, 0.6s to the park,
    // then 0.4s after the approval.
    assert_eq!(state.usage.wall_time_ms, 3_000);
    let five_seconds = view_with(BudgetLimits {
        wall_time_ms: Some(5_000),
        ..BudgetLimits::default()
    });
    assert_eq!(
        shape(&decide(&state, &five_seconds)),
        "call_tool call-1-1 fs.write_file write recorded=false"
    );
    // Suspended for input, then over budget: each park is left out.
    let parked_twice = log(vec![
        model(1, 1),
        at(answer(1, "", &[("ask", json!({}))]), 11_000),
        suspended(1, 1),
        at(resumed(json!("yes")), 11_000 + DAY),
        clock(12_000 + DAY),
        exceeded(BudgetKind::Steps, 1, 1),
        at(
            extended(BudgetLimits {
                steps: Some(2),
                ..BudgetLimits::default()
            }),
            12_000 + 2 * DAY,
        ),
        clock(12_500 + 2 * DAY),
    ]);
    assert_eq!(fold(&parked_twice).unwrap().usage.wall_time_ms, 2_500);
    // A write with no recorded outcome waits for a human too.
    let mut resolved_later = dangling_write();
    resolved_later.push(at(resolved(1, 1), 10_000 + DAY));
    resolved_later.push(clock(10_700 + DAY));
    assert_eq!(fold(&resolved_later).unwrap().usage.wall_time_ms, 700);
    // A clock set back counts nothing, and what was counted stays.
    let back = log(vec![clock(11_000), clock(10_500), clock(11_200)]);
    assert_eq!(fold(&back).unwrap().usage.wall_time_ms, 1_200);
}

#[test]
fn extensions_are_checked_against_the_overrun() {
    let state = fold(&log(vec![exceeded(BudgetKind::Steps, 3, 3)])).unwrap();
    let agent = BudgetLimits {
        steps: Some(3),
        ..BudgetLimits::default()
    };
    let ok = state
        .check_extension(&agent, &json!({"max_steps": 5}), Some("alice".into()))
        .unwrap();
    assert_eq!(ok.limits.steps, Some(5));
    assert_eq!(ok.by.as_deref(), Some("alice"));
    let err = state
        .check_extension(&agent, &json!({"max_steps": 3}), None)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the extension must raise `max_steps` to more than 3 (what was used), got 3"
    );
    let err = state
        .check_extension(&agent, &json!({"max_fuel": 10}), None)
        .unwrap_err();
    assert!(
        matches!(err, ExtensionError::TooSmall { given: None, .. }),
        "{err}"
    );
    // Only a run parked over budget takes an extension.
    let running = fold(&log(vec![])).unwrap();
    let err = running
        .check_extension(&agent, &json!({"max_steps": 9}), None)
        .unwrap_err();
    assert_eq!(err, ExtensionError::NotExceeded);
}

#[test]
fn action_events_record_exactly_the_decision() {
    let state = fold(&log(vec![model(1, 1), answer(1, "done", &[])])).unwrap();
    let action = decide(&state, &view());
    assert_eq!(action.event(), Some(completed("done")));
    let state = fold(&log(vec![])).unwrap();
    let Action::CallModel(call) = decide(&state, &view()) else {
        panic!("first step calls the model");
    };
    assert_eq!(call.request.messages, state.conversation());
    assert_eq!(call.request.tools, view().tool_specs());
    assert_eq!(call.request.instructions, "You keep notes.");
    let Event::ModelCallIntent(quiet) = call.intent(false) else {
        unreachable!()
    };
    assert_eq!(quiet.request, None);
    assert_eq!(
        quiet.request_hash,
        super::request_hash::request_hash(&call.request)
    );
    let Event::ModelCallIntent(loud) = call.intent(true) else {
        unreachable!()
    };
    assert_eq!(loud.request.as_ref(), Some(&call.request));
    assert_eq!(loud.request_hash, quiet.request_hash);

    // A model completion records the pricing it was priced with.
    let pricing = Pricing {
        currency: "USD".into(),
        input_micros_per_million: 1_000_000,
        output_micros_per_million: 2_000_000,
    };
    let response = warden_providers::ModelResponse {
        text: "hi".into(),
        tool_calls: vec![],
        blocks: vec![],
        usage: Usage {
            input_tokens: 1000,
            output_tokens: 10,
        },
        stop_reason: Some(StopReason::EndTurn),
    };
    let Event::ModelCallCompleted(c) = call.completion(&response, Some(&pricing), 0) else {
        unreachable!()
    };
    assert_eq!(c.cost_nanos, Some(1_000_000 + 20_000));
    assert_eq!(c.pricing, Some(pricing));

    // The call handed to a plugin carries the derived idempotency key.
    let state = fold(&log(vec![
        model(1, 1),
        answer(1, "", &[("fs__stat", json!({"p": 1}))]),
    ]))
    .unwrap();
    let Action::CallTool(invocation) = decide(&state, &view()) else {
        panic!("an idempotent tool needs no approval");
    };
    let call = invocation.wit_call(&run_id());
    assert_eq!(call.tool, "stat");
    assert_eq!(call.arguments, r#"{"p":1}"#);
    assert_eq!(
        call.idempotency_key,
        idempotency_key(&run_id(), &CallId::new(1, 1))
    );
    assert_eq!(call.id, "call-1-1");
    assert_eq!(call.run_id, "r1");
}

// ---------------------------------------------------- whole runs and replay

/// Plays the runtime's part without I/O: decides, records intents and
/// completions, answers the model from a script and tools from their
/// arguments.
struct Sim {
    view: AgentView,
    script: ScriptedProvider,
    events: Vec<Event>,
    clock_ms: u64,
    tool_runs: Vec<CallId>,
}

impl Sim {
    fn new(view: AgentView, turns: Vec<ScriptedTurn>) -> Sim {
        Sim {
            view,
            script: ScriptedProvider::from_turns("sim.toml", turns).unwrap(),
            events: vec![started()],
            clock_ms: 10_000,
            tool_runs: Vec::new(),
        }
    }

    fn state(&self) -> RunState {
        fold(&self.events).unwrap()
    }

    /// The scripted model's answer to `request`.
    fn respond(&self, request: &warden_providers::ModelRequest) -> warden_providers::ModelResponse {
        let mut assembler = ResponseAssembler::new("scripted");
        for event in self.script.events_for(request).unwrap() {
            assembler.push(event).unwrap();
        }
        assembler.finish().unwrap()
    }

    /// Drives until there is nothing to do; returns why.
    fn drive(&mut self) -> Idle {
        for _ in 0..100 {
            match decide(&self.state(), &self.view) {
                Action::CallModel(call) => {
                    if !call.recorded {
                        self.events.push(call.intent(false));
                    }
                    let response = self.respond(&call.request);
                    self.events.push(call.completion(
                        &response,
                        self.view.pricing.as_ref(),
                        self.clock_ms,
                    ));
                }
                Action::CallTool(invocation) => {
                    if !invocation.recorded {
                        self.events.push(invocation.intent());
                    }
                    self.tool_runs.push(invocation.intent.call_id.clone());
                    let output = json!({"ran": invocation.intent.tool.tool, "with": invocation.intent.arguments});
                    let outcome = Ok(Ok(warden_sandbox::wit::ToolOutput {
                        content: output.to_string(),
                    }));
                    self.events
                        .push(invocation.completion(&outcome, receipt(100)));
                }
                Action::RequestApproval(request) => {
                    self.events.push(request.event(None, self.clock_ms))
                }
                Action::ObserveClock => {
                    self.clock_ms += 1000;
                    self.events.push(clock(self.clock_ms));
                }
                Action::Compact(call) => {
                    if !call.recorded {
                        self.events.push(call.intent(false));
                    }
                    let response = self.respond(&call.request);
                    self.events
                        .push(call.completion(&response, self.view.pricing.as_ref()));
                }
                Action::ResolveContext(r) => {
                    self.events.push(context::sim_resolution(&r, self.clock_ms));
                }
                Action::Idle(idle) => return idle,
                other => self
                    .events
                    .push(other.event().expect("a recorded decision")),
            }
        }
        panic!("the run did not settle in 100 actions");
    }
}

fn turn(text: &str, calls: &[(&str, Value)]) -> ScriptedTurn {
    ScriptedTurn {
        text: text.into(),
        tool_calls: calls
            .iter()
            .map(|(name, args)| ScriptedToolCall {
                id: None,
                name: (*name).into(),
                arguments: args.clone(),
            })
            .collect(),
        usage: None,
        stop_reason: None,
        text_after_error: None,
    }
}

fn demo_turns() -> Vec<ScriptedTurn> {
    vec![
        turn(
            "Reading.",
            &[("fs__read_file", read_args()), ("fs__stat", json!({}))],
        ),
        turn("Writing.", &[("fs__write_file", write_args())]),
        turn("Asking.", &[("ask", json!({"question": "ok?"}))]),
        turn("Done.", &[]),
    ]
}

/// The demo run to completion: two reads, an approved write, a question.
fn demo_run(view: AgentView) -> Sim {
    let mut sim = Sim::new(view, demo_turns());
    assert_eq!(
        sim.drive(),
        Idle::AwaitingApproval {
            call_id: CallId::new(2, 1)
        }
    );
    sim.events.push(granted(2, 1));
    assert_eq!(
        sim.drive(),
        Idle::Suspended {
            call_id: CallId::new(3, 1)
        }
    );
    sim.events.push(resumed(json!("yes")));
    assert_eq!(sim.drive(), Idle::Terminal(RunStatus::Completed));
    sim
}

#[test]
fn a_whole_run_executes_tool_calls_in_order_each_with_its_intent_and_completion() {
    let sim = demo_run(view());
    let kinds: Vec<&str> = sim.events.iter().map(|e| e.kind().as_str()).collect();
    assert_eq!(
        kinds,
        [
            "run_started",
            "model_call_intent",
            "model_call_completed",
            "tool_call_intent",
            "tool_call_completed",
            "tool_call_intent",
            "tool_call_completed",
            "model_call_intent",
            "model_call_completed",
            "approval_requested",
            "approval_granted",
            "tool_call_intent",
            "tool_call_completed",
            "model_call_intent",
            "model_call_completed",
            "suspended",
            "resumed",
            "model_call_intent",
            "model_call_completed",
            "run_completed",
        ]
    );
    assert_eq!(
        sim.tool_runs,
        [CallId::new(1, 1), CallId::new(1, 2), CallId::new(2, 1)]
    );
    let state = sim.state();
    assert_eq!(
        state.terminal,
        Some(super::state::Terminal::Completed(RunCompleted {
            output: json!("Done."),
            by_host: false,
        }))
    );
    // Every event survives the encoding.
    for event in &sim.events {
        assert_eq!(&decode(&encode(event)).unwrap(), event);
    }
}

#[test]
fn recovery_from_every_prefix_reaches_the_same_log_and_never_reruns_a_write() {
    let control = demo_run(view());
    let write = CallId::new(2, 1);
    let write_intent_at = control
        .events
        .iter()
        .position(|e| matches!(e, Event::ToolCallIntent(i) if i.call_id == write))
        .unwrap();
    for k in 1..control.events.len() {
        // A crash after `k` events: recover from the prefix.
        let mut sim = Sim::new(view(), demo_turns());
        sim.events = control.events[..k].to_vec();
        replay(&sim.events, &view(), ReplayOptions::default())
            .unwrap_or_else(|e| panic!("prefix {k}: {e}"));
        let mut resolved_at = None;
        loop {
            match sim.drive() {
                Idle::Terminal(status) => {
                    assert_eq!(status, RunStatus::Completed, "prefix {k}");
                    break;
                }
                Idle::NeedsReconciliation { call_id } => {
                    // Only when the crash fell between the write's intent
                    // and its completion; a human records what it did.
                    assert_eq!((call_id.clone(), k), (write.clone(), write_intent_at + 1));
                    let Event::ToolCallCompleted(c) = &control.events[k] else {
                        panic!("prefix {k}: the control log completes the write next");
                    };
                    let ToolCallResult::Output(output) = &c.result else {
                        unreachable!()
                    };
                    resolved_at = Some(sim.events.len());
                    sim.events.push(Event::ToolCallResolved(ToolCallResolved {
                        call_id,
                        by: "alice".into(),
                        output: output.clone(),
                        note: None,
                        at_ms: None,
                    }));
                }
                // A human act: the one the control run recorded next.
                _ => sim.events.push(control.events[sim.events.len()].clone()),
            }
        }
        let mut expected = control.events.clone();
        if let Some(at) = resolved_at {
            expected[at] = sim.events[at].clone();
        }
        assert_eq!(sim.events, expected, "prefix {k}");
        // The write ran live exactly when its intent was not yet recorded,
        // and never again after.
        let write_runs = sim.tool_runs.iter().filter(|c| **c == write).count();
        assert_eq!(write_runs, usize::from(k <= write_intent_at), "prefix {k}");
    }
}

/// Which pinned MCP tool lists a run was offered is recorded at its start
/// and checked like its agent's digest: another pinned list, or other tools
/// of it, is refused unless the change is accepted; a log from before it
/// was recorded is not held to it.
#[test]
fn replay_refuses_a_run_whose_mcp_tools_changed() {
    let offered = |pins: &str, tools: &[&str]| {
        std::collections::BTreeMap::from([(
            "remote".to_owned(),
            crate::events::McpToolsOffered {
                pins: pins.into(),
                offered: tools.iter().map(|t| (*t).to_owned()).collect(),
            },
        )])
    };
    let with = AgentView {
        mcp_tools: offered("sha256:aa", &["search"]),
        ..view()
    };
    let mut control = demo_run(view());
    let Event::RunStarted(started) = &mut control.events[0] else {
        unreachable!()
    };
    started.mcp_tools = with.mcp_tools.clone();
    replay(&control.events, &with, ReplayOptions::default()).unwrap();
    for now in [
        offered("sha256:bb", &["search"]),
        offered("sha256:aa", &["search", "publish"]),
        Default::default(),
    ] {
        let changed = AgentView {
            mcp_tools: now,
            ..view()
        };
        let err = replay(&control.events, &changed, ReplayOptions::default()).unwrap_err();
        assert!(
            matches!(err, ReplayError::Divergence { position: 0, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("sha256:aa (search)"), "{err}");
        let accepted = ReplayOptions {
            accept_agent_change: true,
        };
        replay(&control.events, &changed, accepted).unwrap();
    }
    // Recorded before the field existed: nothing to compare.
    let old = demo_run(view());
    replay(&old.events, &with, ReplayOptions::default()).unwrap();
}

#[test]
fn replay_accepts_the_recorded_run_and_refuses_a_changed_agent() {
    let control = demo_run(view());
    let state = replay(&control.events, &view(), ReplayOptions::default()).unwrap();
    assert_eq!(state, control.state());

    // A new definition: refused unless accepted.
    let changed = AgentView {
        digest: AgentDigest::from_hex("d2"),
        ..view()
    };
    let err = replay(&control.events, &changed, ReplayOptions::default()).unwrap_err();
    assert!(matches!(err, ReplayError::AgentChanged { .. }), "{err}");
    assert!(
        err.to_string().contains("accept the change explicitly"),
        "{err}"
    );
    let accepted = ReplayOptions {
        accept_agent_change: true,
    };
    replay(&control.events, &changed, accepted).unwrap();

    // New instructions: the prompt changed, which the request hash shows.
    let reworded = AgentView {
        instructions: "You keep notes carefully.".into(),
        ..view()
    };
    let err = replay(&control.events, &reworded, ReplayOptions::default()).unwrap_err();
    match err {
        ReplayError::Divergence { position, kind, .. } => {
            assert_eq!((position, kind), (1, EventKind::ModelCallIntent));
        }
        other => panic!("expected a divergence, got {other}"),
    }
    // ... unless the change is accepted.
    replay(
        &control.events,
        &AgentView {
            digest: AgentDigest::from_hex("d3"),
            ..reworded
        },
        accepted,
    )
    .unwrap();

    // The write became a read: the recorded intent and approval no longer
    // match what the agent decides, even with the change accepted.
    let mut tools = view().tools;
    tools[5] = plugin_tool("write_file", EffectClass::Read, false);
    let retyped = AgentView { tools, ..view() };
    let err = replay(&control.events, &retyped, accepted).unwrap_err();
    let ReplayError::Divergence {
        position,
        kind,
        expected,
        recorded,
    } = err
    else {
        panic!("expected a divergence, got {err}");
    };
    assert_eq!((position, kind), (9, EventKind::ApprovalRequested));
    assert_eq!(
        expected,
        "tool call `call-2-1` to fs.write_file (read) with {\"content\":\"hi\",\"path\":\"a.txt\"}"
    );
    assert_eq!(
        recorded,
        "an approval request for `call-2-1` to fs.write_file"
    );

    // A tool that disappeared: the recorded intent diverges.
    let mut tools = view().tools;
    tools.remove(3);
    let fewer = AgentView { tools, ..view() };
    let err = replay(&control.events, &fewer, accepted).unwrap_err();
    assert!(
        matches!(
            err,
            ReplayError::Divergence {
                position: 3,
                kind: EventKind::ToolCallIntent,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("rejecting `call-1-1`: there is no tool `fs__read_file`"),
        "{err}"
    );

    // A new wall-time budget would have read the clock first.
    let timed = view_with(BudgetLimits {
        wall_time_ms: Some(60_000),
        ..BudgetLimits::default()
    });
    let err = replay(&control.events, &timed, ReplayOptions::default()).unwrap_err();
    assert!(
        matches!(err, ReplayError::Divergence { position: 1, .. }),
        "{err}"
    );
    // A log that is impossible in itself is a fold error.
    let mut broken = control.events.clone();
    broken.swap(3, 4);
    assert!(matches!(
        replay(&broken, &view(), ReplayOptions::default()),
        Err(ReplayError::Fold(_))
    ));
}

#[test]
fn a_budgeted_run_reads_the_clock_before_each_effect_and_replays_identically() {
    let budgets = BudgetLimits {
        wall_time_ms: Some(4_500),
        steps: Some(10),
        ..BudgetLimits::default()
    };
    let mut sim = Sim::new(
        view_with(budgets),
        vec![
            turn("Reading.", &[("fs__read_file", read_args())]),
            turn("Again.", &[("fs__read_file", read_args())]),
            turn("Done.", &[]),
        ],
    );
    // Each effect is preceded by a clock reading, 1s apart (the clock starts
    // at the run's seed): the fifth reading is over the budget.
    let idle = sim.drive();
    assert_eq!(
        idle,
        Idle::BudgetExceeded(BudgetOverrun {
            budget: BudgetKind::WallTime,
            used: 5_000,
            limit: 4_500,
            needed: None,
        })
    );
    let kinds: Vec<&str> = sim.events.iter().map(|e| e.kind().as_str()).collect();
    assert_eq!(
        kinds,
        [
            "run_started",
            "clock_observed",
            "model_call_intent",
            "model_call_completed",
            "clock_observed",
            "tool_call_intent",
            "tool_call_completed",
            "clock_observed",
            "model_call_intent",
            "model_call_completed",
            "clock_observed",
            "tool_call_intent",
            "tool_call_completed",
            "clock_observed",
            "budget_exceeded",
        ]
    );
    replay(&sim.events, &sim.view, ReplayOptions::default()).unwrap();
    // An extension continues it.
    let state = sim.state();
    let extension = state
        .check_extension(&sim.view.budgets, &json!({"max_wall_time": "1m"}), None)
        .unwrap();
    sim.events.push(Event::BudgetExtended(extension));
    assert_eq!(sim.drive(), Idle::Terminal(RunStatus::Completed));
    replay(&sim.events, &sim.view, ReplayOptions::default()).unwrap();
}

#[test]
fn a_cost_budget_uses_recorded_pricing() {
    // Output is what costs: the input check lets the first call be made,
    // and its answer crosses the budget.
    let pricing = Pricing {
        currency: "USD".into(),
        input_micros_per_million: 0,
        output_micros_per_million: 1_000_000_000,
    };
    let view = AgentView {
        pricing: Some(pricing.clone()),
        budgets: BudgetLimits {
            cost_nanos: Some(1),
            ..BudgetLimits::default()
        },
        ..view()
    };
    let mut sim = Sim::new(
        view.clone(),
        vec![
            turn("Reading.", &[("fs__read_file", read_args())]),
            turn("Done.", &[]),
        ],
    );
    let Idle::BudgetExceeded(overrun) = sim.drive() else {
        panic!("the first call costs more than the budget");
    };
    assert_eq!(overrun.budget, BudgetKind::Cost);
    let state = sim.state();
    assert_eq!(state.usage.cost_nanos, overrun.used);
    // The pricing is in the log: a cheaper price list later changes nothing
    // about what was spent.
    let Event::ModelCallCompleted(c) = &sim.events[2] else {
        unreachable!()
    };
    assert_eq!(c.pricing.as_ref(), Some(&pricing));
    let cheaper = AgentView {
        pricing: None,
        ..view
    };
    assert_eq!(fold(&sim.events).unwrap().usage.cost_nanos, overrun.used);
    assert!(matches!(
        decide(&fold(&sim.events).unwrap(), &cheaper),
        Action::Idle(Idle::BudgetExceeded(_))
    ));
}

#[test]
fn the_demo_agent_and_transcript_in_examples_fit_together() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents");
    let agent = super::agent::Agent::load(&root.join("notes.toml"), None).unwrap();
    let script = ScriptedProvider::load(agent.model.transcript.as_deref().unwrap()).unwrap();
    let fs: Vec<warden_plugins::ToolDescriptor> = [
        ("read_file", EffectClass::Read),
        ("list_dir", EffectClass::Read),
        ("search", EffectClass::Read),
        ("write_file", EffectClass::Write),
        ("edit_file", EffectClass::Write),
    ]
    .into_iter()
    .map(|(name, effect)| warden_plugins::ToolDescriptor {
        plugin: "fs".into(),
        name: name.into(),
        description: name.into(),
        input_schema: json!({"type": "object"}),
        claimed_effect: effect,
        effect,
        idempotency_key: None,
        withheld: None,
    })
    .collect();
    // `notes-files` is the files-context source and `outbox` the
    // jsonl-channel: no tools.
    let view = AgentView::new(
        &agent,
        &[("fs", &fs), ("notes-files", &[]), ("outbox", &[])],
    )
    .unwrap();
    let mut sim = Sim::new(view, script.turns().to_vec());
    sim.events[0] = Event::RunStarted(RunStarted {
        agent: agent.name.clone(),
        agent_digest: agent.digest.clone(),
        ..match started() {
            Event::RunStarted(s) => s,
            _ => unreachable!(),
        }
    });
    // The demo asks for approval of its write, then finishes.
    let idle = sim.drive();
    let Idle::AwaitingApproval { call_id } = idle else {
        panic!("the demo writes a file, which needs approval: {idle:?}");
    };
    sim.events.push(Event::ApprovalGranted(ApprovalGranted {
        call_id,
        by: "demo".into(),
        digest: None,
        rule: None,
        at_ms: None,
    }));
    assert_eq!(sim.drive(), Idle::Terminal(RunStatus::Completed));
    // Every call the transcript makes names a tool the agent offers.
    for turn in &sim.state().turns {
        for call in &turn.calls {
            assert!(
                !matches!(call.progress, super::state::ToolCallProgress::Rejected(_)),
                "{}: {:?}",
                call.call.name,
                call.progress
            );
        }
    }
}

#[test]
fn resume_input_is_validated_before_anything_is_recorded() {
    let limits = BudgetLimits {
        steps: Some(1),
        ..BudgetLimits::default()
    };
    let asked = |schema: Value| {
        fold(&log(vec![
            model(1, 1),
            answer(1, "", &[("ask", json!({}))]),
            Event::Suspended(Suspended {
                call_id: CallId::new(1, 1),
                reason: "which file?".into(),
                schema,
            }),
        ]))
        .unwrap()
    };
    // The recorded schema decides, typeless object schemas included.
    let state = asked(json!({"properties": {"file": {"type": "string"}}, "required": ["file"]}));
    for bad in [json!(null), json!("a.txt"), json!({"file": 3}), json!({})] {
        let err = state.check_resume(&limits, &bad, None).unwrap_err();
        assert!(
            matches!(err, super::state::ResumeError::InputRejected(_)),
            "{bad}: {err}"
        );
        assert!(
            err.to_string().starts_with("resume input rejected: "),
            "{err}"
        );
    }
    let event = state
        .check_resume(&limits, &json!({"file": "a.txt"}), Some("alice".into()))
        .unwrap();
    assert_eq!(
        event,
        Event::Resumed(Resumed {
            input: json!({"file": "a.txt"}),
            by: Some("alice".into()),
            at_ms: None,
        })
    );
    let mut resumed = state.clone();
    resumed.apply(&event).unwrap();
    assert_eq!(resumed.status(), RunStatus::Running);

    // Over budget, the input is an extension.
    let over = fold(&log(vec![exceeded(BudgetKind::Steps, 1, 1)])).unwrap();
    let event = over
        .check_resume(&limits, &json!({"max_steps": 2}), None)
        .unwrap();
    assert!(matches!(event, Event::BudgetExtended(_)));
    let err = over
        .check_resume(&limits, &json!({"max_steps": 1}), None)
        .unwrap_err();
    assert!(
        err.to_string().starts_with("budget extension rejected: "),
        "{err}"
    );

    // Anything else is not resumable.
    for (events, status) in [
        (log(vec![]), RunStatus::Running),
        (dangling_write(), RunStatus::NeedsReconciliation),
        (
            log(vec![
                model(1, 1),
                answer(1, "", &[("fs__write_file", write_args())]),
                approval(1, 1, "fs__write_file"),
            ]),
            RunStatus::AwaitingApproval,
        ),
        (log(vec![run_failed()]), RunStatus::Failed),
    ] {
        let err = fold(&events)
            .unwrap()
            .check_resume(&limits, &json!("x"), None)
            .unwrap_err();
        assert_eq!(err, super::state::ResumeError::NotResumable { status });
    }
}

// ------------------------------------------------------------ typed results

fn typed_view() -> AgentView {
    AgentView {
        output_schema: Some(json!({
            "type": "object",
            "properties": {"title": {"type": "string"}, "count": {"type": "integer"}},
            "required": ["title", "count"]
        })),
        ..view()
    }
}

#[test]
fn a_valid_final_answer_completes_with_its_json_value() {
    let mut sim = Sim::new(
        typed_view(),
        vec![turn(r#"{"title": "notes", "count": 2}"#, &[])],
    );
    assert_eq!(sim.drive(), Idle::Terminal(RunStatus::Completed));
    let state = sim.state();
    assert_eq!(state.output(), Some(&json!({"title": "notes", "count": 2})));
    assert_eq!(state.output_rejections, 0);
    replay(&sim.events, &sim.view, ReplayOptions::default()).unwrap();
}

#[test]
fn an_invalid_final_answer_is_sent_back_once_with_its_violation() {
    let mut sim = Sim::new(
        typed_view(),
        vec![
            turn(r#"{"title": "notes", "count": "two"}"#, &[]),
            turn(r#"{"title": "notes", "count": 2}"#, &[]),
        ],
    );
    assert_eq!(sim.drive(), Idle::Terminal(RunStatus::Completed));
    let kinds: Vec<&str> = sim.events.iter().map(|e| e.kind().as_str()).collect();
    assert_eq!(
        kinds,
        [
            "run_started",
            "model_call_intent",
            "model_call_completed",
            "output_rejected",
            "model_call_intent",
            "model_call_completed",
            "run_completed"
        ]
    );
    let Event::OutputRejected(rejected) = &sim.events[3] else {
        panic!("{:?}", sim.events[3]);
    };
    assert_eq!(rejected.step, 1);
    assert!(
        rejected.violation.contains("at `/count`"),
        "{}",
        rejected.violation
    );
    // The model saw the violation after its answer.
    let state = sim.state();
    let Message::User { content } = &state.conversation()[2] else {
        panic!("{:?}", state.conversation());
    };
    assert!(content.contains("at `/count`"), "{content}");
    assert_eq!(state.output(), Some(&json!({"title": "notes", "count": 2})));
    // The second request carries the feedback after the rejected answer.
    let Action::CallModel(call) = decide(&fold(&sim.events[..4]).unwrap(), &sim.view) else {
        panic!("a second model call");
    };
    assert_eq!(call.step, 2);
    assert!(matches!(
        call.request.messages.last(),
        Some(Message::User { content }) if content.starts_with("Your final answer was rejected")
    ));
    replay(&sim.events, &sim.view, ReplayOptions::default()).unwrap();
    // Replay checks the rejection: an agent without the schema would have
    // finished at step 1.
    let err = replay(
        &sim.events,
        &view(),
        ReplayOptions {
            accept_agent_change: true,
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            &err,
            ReplayError::Divergence {
                position: 3,
                kind: EventKind::OutputRejected,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_final_answer_invalid_twice_fails_the_run_naming_the_violation() {
    let mut sim = Sim::new(
        typed_view(),
        vec![turn("Two notes.", &[]), turn(r#"{"title": "notes"}"#, &[])],
    );
    assert_eq!(sim.drive(), Idle::Terminal(RunStatus::Failed));
    let Some(Event::RunFailed(RunFailed {
        error: RunError::OutputInvalid { step, violation },
    })) = sim.events.last()
    else {
        panic!("{:?}", sim.events.last());
    };
    assert_eq!(*step, 2);
    assert!(
        violation.contains("\"count\" is a required property"),
        "{violation}"
    );
    let Event::OutputRejected(first) = &sim.events[3] else {
        panic!("{:?}", sim.events[3]);
    };
    assert!(
        first
            .violation
            .starts_with("the final answer is not a JSON value")
    );
    replay(&sim.events, &sim.view, ReplayOptions::default()).unwrap();
    // A second rejection is not a possible log.
    let mut twice = sim.events[..6].to_vec();
    twice.push(Event::OutputRejected(OutputRejected {
        step: 2,
        violation: "again".into(),
    }));
    let err = fold(&twice).unwrap_err();
    assert!(
        err.to_string().contains("sent back at most 1 time"),
        "{err}"
    );
}

#[test]
fn an_output_rejection_must_name_the_latest_final_answer() {
    let events = log(vec![
        model(1, 1),
        answer(1, "", &[("fs__read_file", read_args())]),
        Event::OutputRejected(OutputRejected {
            step: 1,
            violation: "no".into(),
        }),
    ]);
    let err = fold(&events).unwrap_err();
    assert!(
        err.to_string()
            .contains("step 1 is not the latest turn's final answer"),
        "{err}"
    );
}

// --------------------------------------------------------------- policies

fn policy_view() -> AgentView {
    AgentView {
        policies: vec![
            super::policy_hooks::EnabledPolicy {
                name: "audit".into(),
                hooks: super::policy_hooks::PolicyHook::ALL.to_vec(),
            },
            super::policy_hooks::EnabledPolicy {
                name: "tools-only".into(),
                hooks: vec![super::policy_hooks::PolicyHook::BeforeToolCall],
            },
        ],
        ..view()
    }
}

fn decided(
    hook: super::policy_hooks::PolicyHook,
    step: Option<u32>,
    call: Option<CallId>,
    policy: &str,
    decision: super::policy_hooks::PolicyVerdict,
    reason: Option<&str>,
) -> Event {
    Event::PolicyDecided(PolicyDecided {
        hook,
        step,
        call_id: call,
        policy: policy.into(),
        decision,
        reason: reason.map(Into::into),
        receipt: None,
    })
}

#[test]
fn policies_are_asked_at_every_hook_in_name_order_and_their_decisions_steer_the_run() {
    use super::policy_hooks::PolicyHook::*;
    use super::policy_hooks::PolicyVerdict::*;
    let allow = |hook, step, call, policy| decided(hook, step, call, policy, Allow, None);
    let c11 = || Some(CallId::new(1, 1));
    let started_allowed = || vec![allow(RunStart, None, None, "audit")];
    let answered = || {
        let mut l = started_allowed();
        l.extend([
            model(1, 1),
            answer(1, "", &[("fs__read_file", read_args())]),
        ]);
        l
    };
    let reviewed = || {
        let mut l = answered();
        l.push(allow(AfterResponse, Some(1), None, "audit"));
        l
    };
    let denied = || {
        let mut l = reviewed();
        l.extend([
            allow(BeforeToolCall, None, c11(), "audit"),
            decided(
                BeforeToolCall,
                None,
                c11(),
                "tools-only",
                Deny,
                Some("not today"),
            ),
        ]);
        l
    };
    let finished = || {
        let mut l = denied();
        l.extend([
            model(2, 1),
            answer(2, "Done.", &[]),
            allow(AfterResponse, Some(2), None, "audit"),
        ]);
        l
    };
    assert_decisions(vec![
        (
            "run start",
            log(vec![]),
            policy_view(),
            "consult audit at RunStart",
        ),
        (
            "then the model",
            log(started_allowed()),
            policy_view(),
            "call_model step=1 attempt=1 recorded=false max_tokens=100",
        ),
        (
            "after the response",
            log(answered()),
            policy_view(),
            "consult audit at AfterResponse { step: 1 }",
        ),
        (
            "before the call",
            log(reviewed()),
            policy_view(),
            "consult audit at BeforeToolCall { call_id: CallId(\"call-1-1\") }",
        ),
        (
            "the next policy",
            log({
                let mut l = reviewed();
                l.push(allow(BeforeToolCall, None, c11(), "audit"));
                l
            }),
            policy_view(),
            "consult tools-only at BeforeToolCall { call_id: CallId(\"call-1-1\") }",
        ),
        (
            "a denied call is settled",
            log(denied()),
            policy_view(),
            "call_model step=2 attempt=1 recorded=false max_tokens=100",
        ),
        (
            "before finishing",
            log(finished()),
            policy_view(),
            "consult audit at BeforeFinish { step: 2 }",
        ),
        (
            "feedback asks again",
            log({
                let mut l = finished();
                l.push(decided(
                    BeforeFinish,
                    Some(2),
                    None,
                    "audit",
                    Feedback,
                    Some("cite"),
                ));
                l
            }),
            policy_view(),
            "call_model step=3 attempt=1 recorded=false max_tokens=100",
        ),
        (
            "allowed: finish",
            log({
                let mut l = finished();
                l.push(allow(BeforeFinish, Some(2), None, "audit"));
                l
            }),
            policy_view(),
            "finish \"Done.\"",
        ),
        (
            "a denial at the start fails the run",
            log(vec![decided(
                RunStart,
                None,
                None,
                "audit",
                Deny,
                Some("closed"),
            )]),
            policy_view(),
            "fail policy `audit` denied the run at run_start: closed",
        ),
        (
            "a failed policy fails the run",
            log({
                let mut l = answered();
                l.push(decided(
                    AfterResponse,
                    Some(1),
                    None,
                    "audit",
                    Failed,
                    Some("the policy panicked: x"),
                ));
                l
            }),
            policy_view(),
            "fail policy `audit` failed at after_response: the policy panicked: x",
        ),
        (
            "no policies: nothing asked",
            log(vec![]),
            view(),
            "call_model step=1 attempt=1 recorded=false max_tokens=100",
        ),
    ]);
    // The denial is the call's result, as the model sees it.
    let state = fold(&log(denied())).unwrap();
    assert!(matches!(
        state.conversation().last(),
        Some(Message::Tool { content, is_error: true, .. })
            if content == "the call was denied by policy `tools-only`: not today"
    ));
    // Feedback follows the answer in the conversation.
    let mut with_feedback = log(finished());
    with_feedback.push(decided(
        BeforeFinish,
        Some(2),
        None,
        "audit",
        Feedback,
        Some("cite"),
    ));
    let state = fold(&with_feedback).unwrap();
    assert!(matches!(
        state.conversation().last(),
        Some(Message::User { content }) if content == "Policy `audit` sent your answer back: cite"
    ));
    // Replay checks that each decision was due, and never asks.
    let mut whole = with_feedback.clone();
    whole.extend([
        model(3, 1),
        answer(3, "Done, see a.txt.", &[]),
        allow(AfterResponse, Some(3), None, "audit"),
        allow(BeforeFinish, Some(3), None, "audit"),
        completed("Done, see a.txt."),
    ]);
    let state = replay(
        &whole,
        &policy_view(),
        ReplayOptions {
            accept_agent_change: true,
        },
    )
    .unwrap();
    assert_eq!(state.status(), RunStatus::Completed);
    // Without the policies, the first recorded decision diverges.
    let err = replay(
        &whole,
        &view(),
        ReplayOptions {
            accept_agent_change: true,
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            &err,
            ReplayError::Divergence {
                position: 1,
                kind: EventKind::PolicyDecided,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn impossible_policy_decisions_are_refused() {
    use super::policy_hooks::PolicyHook::*;
    use super::policy_hooks::PolicyVerdict::*;
    let call = || Some(CallId::new(1, 1));
    let answered = || {
        vec![
            model(1, 1),
            answer(1, "", &[("fs__read_file", read_args())]),
        ]
    };
    let cases = vec![
        (
            "feedback at a tool call",
            {
                let mut l = answered();
                l.push(decided(
                    BeforeToolCall,
                    None,
                    call(),
                    "audit",
                    Feedback,
                    Some("x"),
                ));
                l
            },
            "feedback is only possible before_finish, not at before_tool_call",
        ),
        (
            "twice",
            vec![
                decided(RunStart, None, None, "audit", Allow, None),
                decided(RunStart, None, None, "audit", Allow, None),
            ],
            "policy `audit` already decided here",
        ),
        (
            "a tool call decision naming a step",
            {
                let mut l = answered();
                l.push(decided(BeforeToolCall, Some(1), None, "audit", Allow, None));
                l
            },
            "a before_tool_call decision needs a call and no step",
        ),
        (
            "run start after the first call",
            {
                let mut l = answered();
                l.push(decided(RunStart, None, None, "audit", Allow, None));
                l
            },
            "the run is not at that run_start point",
        ),
        (
            "a call that is not next",
            {
                let mut l = answered();
                l.push(decided(
                    BeforeToolCall,
                    None,
                    Some(CallId::new(1, 2)),
                    "audit",
                    Allow,
                    None,
                ));
                l
            },
            "is not the next tool call to settle",
        ),
    ];
    for (name, events, message) in cases {
        let err = fold(&log(events)).unwrap_err();
        assert!(err.to_string().contains(message), "{name}: {err}");
    }
}
mod batch;
mod compaction;
mod context;
