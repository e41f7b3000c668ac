//! Parallel batches in the pure core: which call starts beside those in
//! flight (`batch.rs`), up to the bound and only when it would start
//! anyway without stopping the run; outcomes folded only in the model's
//! order; results shown to the model in that order; children's grants
//! reserved from what a call started beside them may use.

use super::*;
use crate::batch::Parallelism;
use crate::events::ChildParked;

fn parallel(max_calls: u32) -> AgentView {
    AgentView {
        parallel: Parallelism {
            max_calls,
            writes: false,
        },
        ..view()
    }
}

fn three(calls: [&str; 3]) -> Vec<Event> {
    vec![
        model(1, 1),
        answer(
            1,
            "",
            &[
                (calls[0], read_args()),
                (calls[1], read_args()),
                (calls[2], read_args()),
            ],
        ),
    ]
}

fn intent(n: usize, name: &str) -> Event {
    let effect = match name {
        "fs__stat" => EffectClass::Idempotent,
        "fs__write_file" => EffectClass::Write,
        _ => EffectClass::Read,
    };
    tool_intent(1, n, name, read_args(), effect)
}

#[test]
fn a_call_starts_beside_those_in_flight_up_to_the_bound() {
    let reads = three(["fs__read_file", "fs__stat", "fs__read_file"]);
    let with = |more: Vec<Event>| log([reads.clone(), more].concat());
    assert_decisions(vec![
        (
            "nothing in flight: the first call, as alone",
            with(vec![]),
            parallel(2),
            "call_tool call-1-1 fs.read_file read recorded=false",
        ),
        (
            "one in flight: the next starts beside it",
            with(vec![intent(1, "fs__read_file")]),
            parallel(2),
            "call_tool call-1-2 fs.stat idempotent recorded=false",
        ),
        (
            "the bound reached: the first in flight is seen to",
            with(vec![intent(1, "fs__read_file"), intent(2, "fs__stat")]),
            parallel(2),
            "call_tool call-1-1 fs.read_file read recorded=true",
        ),
        (
            "the first's outcome recorded: the third starts",
            with(vec![
                intent(1, "fs__read_file"),
                intent(2, "fs__stat"),
                tool_done(1, 1, json!("a")),
            ]),
            parallel(2),
            "call_tool call-1-3 fs.read_file read recorded=false",
        ),
        (
            "one at a time by default",
            with(vec![intent(1, "fs__read_file")]),
            view(),
            "call_tool call-1-1 fs.read_file read recorded=true",
        ),
        (
            "a budget the next call would need used up: it waits for the batch",
            with(vec![intent(1, "fs__read_file")]),
            AgentView {
                budgets: BudgetLimits {
                    tool_calls: Some(1),
                    ..BudgetLimits::default()
                },
                ..parallel(3)
            },
            "call_tool call-1-1 fs.read_file read recorded=true",
        ),
    ]);
    // A write that needs approval never joins: the batch ends first, then
    // it is asked for as it would be alone.
    let mixed = log([
        three(["fs__read_file", "fs__write_file", "fs__read_file"]),
        vec![intent(1, "fs__read_file")],
    ]
    .concat());
    assert_decisions(vec![(
        "a write needing approval",
        mixed.clone(),
        parallel(3),
        "call_tool call-1-1 fs.read_file read recorded=true",
    )]);
    let settled = [mixed, vec![tool_done(1, 1, json!("a"))]].concat();
    assert_decisions(vec![(
        "… asked once the batch has ended",
        settled,
        parallel(3),
        "request_approval call-1-2 fs.write_file",
    )]);
}

#[test]
fn outcomes_are_folded_in_the_models_order_only() {
    let reads = three(["fs__read_file", "fs__read_file", "fs__read_file"]);
    let in_flight = [
        reads.clone(),
        vec![intent(1, "fs__read_file"), intent(2, "fs__read_file")],
    ]
    .concat();
    assert_impossible(
        "the second's outcome before the first's",
        log([in_flight.clone(), vec![tool_done(1, 2, json!("b"))]].concat()),
        5,
        "call-1-2",
    );
    assert_impossible(
        "an intent out of the model's order",
        log([reads.clone(), vec![intent(2, "fs__read_file")]].concat()),
        3,
        "call-1-2",
    );
    assert_impossible(
        "a model call while calls are in flight",
        log([
            in_flight.clone(),
            vec![tool_done(1, 1, json!("a")), model(2, 1)],
        ]
        .concat()),
        6,
        "call-1-2",
    );
    let state = fold(&log([
        in_flight,
        vec![
            tool_done(1, 1, json!("a")),
            intent(3, "fs__read_file"),
            tool_done(1, 2, json!("b")),
            tool_done(1, 3, json!("c")),
        ],
    ]
    .concat()))
    .unwrap();
    assert_eq!(state.usage.tool_calls, 3);
    assert!(state.next_call().is_none());
}

#[test]
fn a_waiting_child_lets_later_outcomes_in_and_results_are_shown_in_order() {
    let events = log(vec![
        model(1, 1),
        answer(
            1,
            "",
            &[
                ("worker", json!({"task": "t"})),
                ("fs__read_file", read_args()),
            ],
        ),
        child_started(1, 1),
        intent(2, "fs__read_file"),
        Event::ChildParked(ChildParked {
            call_id: CallId::new(1, 1),
            child_run: RunId::new("r1.call-1-1").unwrap(),
            status: RunStatus::AwaitingApproval,
        }),
        tool_done(1, 2, json!("b")),
    ]);
    let state = fold(&events).unwrap();
    assert_eq!(state.status(), RunStatus::AwaitingChild);
    // The second call's result waits for the first's: the model reads
    // them in the order it asked.
    assert!(
        !state
            .conversation()
            .iter()
            .any(|m| matches!(m, warden_providers::Message::Tool { .. })),
        "{:?}",
        state.conversation()
    );
    let finished = Event::ChildFinished(crate::events::ChildFinished {
        call_id: CallId::new(1, 1),
        child_run: RunId::new("r1.call-1-1").unwrap(),
        status: RunStatus::Completed,
        result: ToolCallResult::Output(json!("a")),
        usage: Default::default(),
    });
    let state = fold(&[events, vec![finished]].concat()).unwrap();
    let shown: Vec<&str> = state
        .conversation()
        .iter()
        .filter_map(|m| match m {
            warden_providers::Message::Tool { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(shown, ["m1-1", "m1-2"]);
}

#[test]
fn a_childs_grant_is_reserved_from_what_a_call_beside_it_may_use() {
    let mut started = child_started(1, 1);
    if let Event::ChildStarted(c) = &mut started {
        c.budgets.tool_calls = Some(2);
    }
    let events = log(vec![
        model(1, 1),
        answer(
            1,
            "",
            &[
                ("worker", json!({"task": "t"})),
                ("fs__read_file", read_args()),
            ],
        ),
        started,
    ]);
    let state = fold(&events).unwrap();
    assert_eq!(state.usage.tool_calls, 1);
    assert_eq!(state.committed_usage().tool_calls, 3);
    let tight = AgentView {
        budgets: BudgetLimits {
            tool_calls: Some(3),
            ..BudgetLimits::default()
        },
        ..parallel(2)
    };
    // All three tool calls are the child's or its own: the read waits.
    assert_decisions(vec![(
        "the child's grant reserved",
        events.clone(),
        tight,
        "drive_child call-1-1 r1.call-1-1",
    )]);
    let roomy = AgentView {
        budgets: BudgetLimits {
            tool_calls: Some(4),
            ..BudgetLimits::default()
        },
        ..parallel(2)
    };
    assert_decisions(vec![(
        "room for one more",
        events,
        roomy,
        "call_tool call-1-2 fs.read_file read recorded=false",
    )]);
}
