//! Budgets through the runtime with real plugins and the injected clock:
//! a tool call in the answer that crossed a budget never runs, time parked
//! for a human is not active time, an input over the cap is refused before
//! anything is recorded, and the limits in force are read from the log.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use warden::engine::StartOptions;

use serde_json::json;
use warden::engine::budget::BudgetKind;
use warden::engine::events::Event;
use warden::engine::{Clock, FixedRandom, RunStatus, Runtime, RuntimeError};
use warden::plugins::PluginHost;
use warden::store::{EventStore, SqliteStore};

use crate::engine::{Fixture, id};
use crate::sandbox;

/// A clock that moves one second each time it is read, and jumps when a
/// test says time passed.
struct TickingClock(AtomicU64);

impl TickingClock {
    fn pass(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for TickingClock {
    fn now_ms(&self) -> u64 {
        self.0.fetch_add(1000, Ordering::SeqCst)
    }
}

const START_MS: u64 = 1_700_000_000_000;
const HOUR_MS: u64 = 3_600_000;

fn runtime(store: Arc<dyn EventStore>, clock: Arc<TickingClock>) -> Runtime {
    Runtime::new(store, PluginHost::new(sandbox().clone()))
        .with_hooks(clock, Arc::new(FixedRandom(7)))
}

fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind().as_str()).collect()
}

const PRICING: &str = "[model.pricing]\ninput_per_million = 3.0\noutput_per_million = 15.0\n";

#[tokio::test]
async fn the_tool_call_of_an_answer_that_crossed_the_cost_budget_never_runs() {
    let fx = Fixture::new();
    // 200,000 input tokens at $3 a million and 10 output tokens at $15:
    // $0.60015 against $0.50, every digit shown.
    let agent = fx.agent(
        r#"
[[turns]]
text = "Recording the effect."
usage = { input_tokens = 200_000, output_tokens = 10 }
[[turns.tool_calls]]
name = "hostile__fs"
arguments = { op = "append", path = "/workspace/effects.log", content = "effect\n" }

[[turns]]
text = "All done."
usage = { input_tokens = 10, output_tokens = 10 }
"#,
        &format!("{PRICING}[budgets]\nmax_cost = 0.50\n"),
    );
    let store: Arc<dyn EventStore> = Arc::new(SqliteStore::open(fx.path("runs.db")).unwrap());
    let rt = runtime(store, Arc::new(TickingClock(AtomicU64::new(START_MS))));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("crossed")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::BudgetExceeded
    );
    assert_eq!(fx.effects(), 0, "the tool call never ran");
    let events = rt.events(&run).await.unwrap();
    assert!(
        !kinds(&events).contains(&"tool_call_intent"),
        "{:?}",
        kinds(&events)
    );
    let Some(Event::BudgetExceeded(overrun)) = events.last() else {
        panic!("{:?}", kinds(&events))
    };
    assert_eq!(overrun.budget, BudgetKind::Cost);
    assert_eq!(
        overrun.describe(Some("USD")),
        "cost: $0.60015 used of $0.50"
    );
    // Raised, the tool call runs, then the run finishes.
    rt.resume(&run, &agent, json!({"max_cost": 1.0}), Some("erin".into()))
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    assert_eq!(fx.effects(), 1);
}

#[tokio::test]
async fn a_model_call_whose_input_alone_would_cross_the_cost_budget_is_not_made() {
    let fx = Fixture::new();
    let agent = fx.agent(
        "[[turns]]\ntext = \"never asked\"\n",
        &format!("{PRICING}[budgets]\nmax_cost = 0.01\n"),
    );
    let rt = runtime(
        Arc::new(SqliteStore::open(fx.path("runs.db")).unwrap()),
        Arc::new(TickingClock(AtomicU64::new(START_MS))),
    );
    // About 5,000 tokens of input: $0.015 against $0.01.
    let run = rt
        .start(
            &agent,
            json!("x".repeat(20_000)),
            StartOptions::new().id(id("big")),
        )
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::BudgetExceeded
    );
    let events = rt.events(&run).await.unwrap();
    assert_eq!(kinds(&events), ["run_started", "budget_exceeded"]);
    let Event::BudgetExceeded(overrun) = &events[1] else {
        unreachable!()
    };
    assert_eq!((overrun.budget, overrun.used), (BudgetKind::Cost, 0));
    let needed = overrun.needed.expect("what the call needed is recorded");
    // The input alone is 20,000 bytes: at least 5,000 tokens, $0.015.
    assert!(needed >= 15_000_000, "{needed}");
}

#[tokio::test]
async fn time_parked_for_a_human_is_not_active_time() {
    let fx = Fixture::new();
    let agent = fx.agent(
        r#"
[[turns]]
text = "Asking."
[[turns.tool_calls]]
name = "ask"
arguments = { question = "Go on?" }

[[turns]]
text = "Reading the input."
[[turns.tool_calls]]
name = "files__read_file"
arguments = { path = "input.txt" }

[[turns]]
text = "All done."
"#,
        "[human_tools.ask]\ndescription = \"Ask the operator\"\n[budgets]\nmax_wall_time = \"1m\"\n",
    );
    let clock = Arc::new(TickingClock(AtomicU64::new(START_MS)));
    let store: Arc<dyn EventStore> = Arc::new(SqliteStore::open(fx.path("runs.db")).unwrap());
    let rt = runtime(store.clone(), clock.clone());
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("parked")))
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Suspended);
    let before = rt.state(&run).await.unwrap().usage.wall_time_ms;
    // Two hours pass before the human answers.
    clock.pass(2 * HOUR_MS);
    rt.resume(&run, &agent, json!("yes"), Some("erin".into()))
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    let state = rt.state(&run).await.unwrap();
    let span = state.last_clock_ms.unwrap() - state.clock_seed_ms;
    assert!(span > 2 * HOUR_MS, "the readings span the park: {span}");
    // Active: a second per reading, the park left out.
    assert!(
        state.usage.wall_time_ms < 60_000 && state.usage.wall_time_ms > before,
        "{} active of {span} elapsed",
        state.usage.wall_time_ms
    );
    // Recovery folds the same numbers from the log.
    let again = runtime(store, clock);
    assert_eq!(
        again.state(&run).await.unwrap().usage.wall_time_ms,
        state.usage.wall_time_ms
    );
}

#[tokio::test]
async fn an_input_over_the_cap_is_refused_before_anything_is_recorded() {
    let fx = Fixture::new();
    let agent = fx.agent(
        r#"
[[turns]]
text = "Asking."
[[turns.tool_calls]]
name = "ask"
arguments = { question = "Which?" }

[[turns]]
text = "All done."
"#,
        "[human_tools.ask]\ndescription = \"Ask the operator\"\n[budgets]\nmax_input_size = \"1KiB\"\n",
    );
    assert_eq!(agent.max_input_bytes, 1024);
    let store: Arc<dyn EventStore> = Arc::new(SqliteStore::open(fx.path("runs.db")).unwrap());
    let rt = runtime(
        store.clone(),
        Arc::new(TickingClock(AtomicU64::new(START_MS))),
    );
    let err = rt
        .start(
            &agent,
            json!("x".repeat(2048)),
            StartOptions::new().id(id("huge")),
        )
        .await
        .unwrap_err();
    match &err {
        RuntimeError::InputTooLarge {
            run_id: None,
            error,
        } => {
            assert_eq!((error.size, error.limit), (2050, 1024));
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("over the limit of 1 KiB"), "{err}");
    assert!(matches!(
        rt.events(&id("huge")).await,
        Err(RuntimeError::UnknownRun { .. })
    ));
    // An answer over the cap is refused the same way, and the run waits on.
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("small")))
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Suspended);
    let recorded = rt.events(&run).await.unwrap().len();
    let err = rt
        .resume(&run, &agent, json!("y".repeat(4096)), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::InputTooLarge {
                run_id: Some(_),
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(rt.events(&run).await.unwrap().len(), recorded);
    // What the run started under is in its log.
    let Event::RunStarted(started) = &rt.events(&run).await.unwrap()[0] else {
        unreachable!()
    };
    let limits = started.limits.as_ref().expect("the limits are recorded");
    assert_eq!(limits.max_input_bytes, 1024);
}
