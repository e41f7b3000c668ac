//! Context compaction in the pure core: a prompt over the agent's budget is
//! summarised before the step's model call, the summary stands in for the
//! older history in later requests (and in replay's hashes), a crash
//! between intent and completion makes the same call again, and a failed
//! compaction is counted and leaves the step's prompt uncompacted.

use super::context::{find_event, shape_of, sim_run};
use super::*;
use crate::compaction::{CompactionSettings, estimate_tokens};
use crate::prompt::build_request;
use warden_providers::compaction::summarised_turns;

fn compacting(max_prompt_tokens: u64) -> AgentView {
    AgentView {
        compaction: Some(CompactionSettings {
            max_prompt_tokens,
            keep_recent: 2,
        }),
        ..view()
    }
}

/// Five turns each reading a file (a long path: the simulator's tool
/// output echoes it), then the answer.
fn reading_turns() -> Vec<ScriptedTurn> {
    let mut turns: Vec<ScriptedTurn> = (1..=5)
        .map(|i| {
            turn(
                &format!("Reading file {i}."),
                &[(
                    "fs__read_file",
                    json!({"path": format!("notes/{i}/{}.md", "n".repeat(300))}),
                )],
            )
        })
        .collect();
    turns.push(turn("All five read.", &[]));
    turns
}

fn compaction_kinds(events: &[Event]) -> Vec<&'static str> {
    events
        .iter()
        .map(|e| e.kind().as_str())
        .filter(|k| k.starts_with("compaction") || *k == "model_call_intent")
        .collect()
}

#[test]
fn a_prompt_over_budget_is_summarised_and_the_summary_replaces_older_history() {
    // The budget: what the request of step 3 would be without compaction.
    let plain = sim_run(view(), reading_turns());
    let budget = {
        let at = plain
            .events
            .iter()
            .position(|e| matches!(e, Event::ModelCallIntent(i) if i.step == 3))
            .unwrap();
        let state = fold(&plain.events[..at]).unwrap();
        estimate_tokens(&build_request(&state, &view(), 100)) - 1
    };
    let compacted = compacting(budget);
    let mut sim = Sim::new(compacted.clone(), reading_turns());
    assert_eq!(sim.drive(), Idle::Terminal(RunStatus::Completed));
    let kinds = compaction_kinds(&sim.events);
    assert_eq!(
        &kinds[..4],
        [
            "model_call_intent",
            "model_call_intent",
            "compaction_intent",
            "compaction_completed"
        ],
        "{kinds:?}"
    );
    let state = fold(&sim.events).unwrap();
    assert!(state.compaction.completed >= 1);
    assert_eq!(state.compaction.failed, 0);
    // The scripted model kept its place: every turn was played, in order.
    assert_eq!(state.turns.len(), 6);
    assert_eq!(state.output(), Some(&json!("All five read.")));

    // The request after a compaction: the input, the summary (saying how
    // many turns it replaces), then the messages after the cut; and it is
    // within the budget again.
    let (at, done) = find_event(&sim.events, |e| match e {
        Event::CompactionCompleted(c) => Some(c),
        _ => None,
    });
    let after = fold(&sim.events[..=at]).unwrap();
    let Action::CallModel(call) = decide(&after, &compacted) else {
        panic!("the model is called with the summary");
    };
    let messages = &call.request.messages;
    assert_eq!(messages[0], after.conversation()[0]);
    assert_eq!(summarised_turns(&messages[1]), Some(done.upto as usize / 2));
    let Message::User { content } = &messages[1] else {
        unreachable!()
    };
    assert!(content.ends_with(&done.summary), "{content}");
    assert!(
        done.summary
            .starts_with("Scripted summary: [user] tidy my notes; [assistant] Reading file 1.")
    );
    assert_eq!(&messages[2..], &after.conversation()[done.upto as usize..]);
    // The compaction's usage counts against the token budgets, not steps.
    let before = fold(&sim.events[..at]).unwrap();
    assert!(
        estimate_tokens(&call.request) < estimate_tokens(&build_request(&before, &view(), 100))
    );
    assert_eq!(after.usage.steps, before.usage.steps);
    assert!(after.usage.input_tokens > before.usage.input_tokens);

    // Replay rebuilds every request, summary included, and agrees.
    let replayed = replay(&sim.events, &compacted, ReplayOptions::default()).unwrap();
    assert_eq!(replayed, state);
    // A summary edited in the log changes the next request: caught.
    let mut edited = sim.events.clone();
    if let Event::CompactionCompleted(c) = &mut edited[at] {
        c.summary.push_str(" (edited)");
    }
    assert!(matches!(
        replay(&edited, &compacted, ReplayOptions::default()).unwrap_err(),
        ReplayError::Divergence { position, .. } if position == at + 1
    ));
}

#[test]
fn a_compaction_crashed_in_flight_is_made_again_with_the_same_request() {
    let view = compacting(300);
    let mut sim = Sim::new(view.clone(), reading_turns());
    sim.drive();
    let (at, intent) = find_event(&sim.events, |e| match e {
        Event::CompactionIntent(i) => Some(i),
        _ => None,
    });
    let state = fold(&sim.events[..=at]).unwrap();
    let Action::Compact(call) = decide(&state, &view) else {
        panic!("the compaction in flight is made again");
    };
    assert!(call.recorded);
    assert_eq!(call.request_hash, intent.request_hash);
    assert_eq!(call.upto, intent.upto as usize);
    // Nothing else may happen while it is in flight.
    let mut events = sim.events[..=at].to_vec();
    events.push(model(intent.step, 1));
    assert!(
        fold(&events)
            .unwrap_err()
            .to_string()
            .ends_with("is still in flight")
    );
}

#[test]
fn a_failed_compaction_is_counted_and_the_step_goes_on_uncompacted() {
    let read = |n: usize| ("fs__read_file", json!({"path": format!("{n}.md")}));
    let mut events = log(vec![]);
    for step in 1..=3u32 {
        events.extend([
            model(step, 1),
            answer(step, "", &[read(step as usize)]),
            tool_intent(
                step,
                1,
                "fs__read_file",
                json!({"path": format!("{step}.md")}),
                EffectClass::Read,
            ),
            tool_done(step, 1, json!("x".repeat(400))),
        ]);
    }
    let view = compacting(256);
    assert_eq!(
        shape_of(events.clone(), &view),
        "compact step=4 upto=5 recorded=false"
    );
    events.extend([
        Event::CompactionIntent(CompactionIntent {
            step: 4,
            upto: 5,
            request_hash: RequestHash::from_hex("h"),
            request: None,
        }),
        Event::CompactionFailed(CompactionFailed {
            step: 4,
            upto: 5,
            error: ModelCallError {
                transient: true,
                message: "overloaded".into(),
                status: Some(529),
                retry_after_ms: None,
            },
        }),
    ]);
    let state = fold(&events).unwrap();
    assert_eq!(state.compaction.failed, 1);
    assert_eq!(state.compaction.completed, 0);
    let Action::CallModel(call) = decide(&state, &view) else {
        panic!("a failed compaction never stops the run");
    };
    assert_eq!(call.step, 4);
    assert_eq!(call.request.messages, state.conversation());
    // The next step tries again.
    events.extend([
        model(4, 1),
        answer(4, "", &[read(4)]),
        tool_intent(
            4,
            1,
            "fs__read_file",
            json!({"path": "4.md"}),
            EffectClass::Read,
        ),
        tool_done(4, 1, json!("y")),
    ]);
    assert_eq!(
        shape_of(events.clone(), &view),
        "compact step=5 upto=7 recorded=false"
    );
}

#[test]
fn the_fold_refuses_impossible_compactions() {
    let read = ("fs__read_file", read_args());
    let base = log(vec![
        model(1, 1),
        answer(1, "", std::slice::from_ref(&read)),
        tool_intent(1, 1, "fs__read_file", read_args(), EffectClass::Read),
        tool_done(1, 1, json!("x")),
    ]);
    let intent = |upto: u32| {
        Event::CompactionIntent(CompactionIntent {
            step: 2,
            upto,
            request_hash: RequestHash::from_hex("h"),
            request: None,
        })
    };
    let completed = Event::CompactionCompleted(CompactionCompleted {
        step: 2,
        upto: 1,
        summary: "s".into(),
        usage: Usage {
            input_tokens: 1,
            output_tokens: 1,
        },
        cost_nanos: None,
        pricing: None,
    });
    for (name, extra, problem) in [
        (
            "a completion without an intent",
            vec![completed.clone()],
            "no compaction of step 2 up to message 1 is in flight",
        ),
        (
            "a cut that summarises nothing",
            vec![intent(1)],
            "a compaction up to message 1 must cut past message 1 and before the end (3 messages)",
        ),
        (
            "a cut past the end",
            vec![intent(3)],
            "a compaction up to message 3 must cut past message 1 and before the end (3 messages)",
        ),
    ] {
        let mut events = base.clone();
        events.extend(extra);
        let err = fold(&events).unwrap_err();
        assert!(err.to_string().ends_with(problem), "{name}: {err}");
    }
}
