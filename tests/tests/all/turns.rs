//! Live turns: `Runtime::start_turn` and its `TurnHandle`. Text deltas
//! reach the handle while the provider is still streaming (an HTTP model on
//! loopback that holds its answer open, and an in-process model behind a
//! gate the test opens), tool calls and approvals come through with their
//! receipts, cancelling through the handle or by dropping it interrupts the
//! model and records the cancellation, and a session of three turns with
//! the middle one cancelled in flight keeps only the completed turns as
//! history, on every store.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use serde_json::json;
use tokio::sync::Semaphore;
use warden::engine::events::{Event, ToolCallResult};
use warden::engine::turn::{DROPPED_REASON, TurnEvent, TurnHandle, TurnOutcome};
use warden::engine::{Agent, RunStatus, Runtime, RuntimeError};
use warden::grant::EffectClass;
use warden::plugins::PluginHost;
use warden::providers::{
    ModelProvider, ModelRequest, ModelStream, ProviderEvent, StopReason, Usage,
};
use warden::store::{EventStore, MemoryStore, SqliteStore};
use warden_tests::guests;

use super::model_server::{After, FakeModel, Reply};
use super::providers::{WIRES, conversation, model_table, render_stream, write_agent};
use super::sessions::{ChatAgent, ChatModel, assistant, chat_runtime, prompts, session, user};
use super::workers::PgSchema;
use crate::sandbox;

/// The next event of `turn`, failing after 30 s (a hang, not a timing).
async fn next(turn: &mut TurnHandle) -> TurnEvent {
    tokio::time::timeout(Duration::from_secs(30), turn.next())
        .await
        .expect("the turn reports within 30 s")
        .expect("the turn's stream ends only after Finished")
}

/// Events of `turn` up to and including the first text delta.
async fn until_text(turn: &mut TurnHandle) -> String {
    loop {
        if let TurnEvent::TextDelta { text, .. } = next(turn).await {
            return text;
        }
    }
}

/// The rest of `turn`'s events; checks the stream ends after `Finished`.
async fn rest(turn: &mut TurnHandle) -> Vec<TurnEvent> {
    let mut events = Vec::new();
    loop {
        let event = next(turn).await;
        let finished = matches!(event, TurnEvent::Finished(_));
        events.push(event);
        if finished {
            assert!(turn.next().await.is_none(), "nothing after Finished");
            return events;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_reach_the_handle_while_an_http_model_streams_and_cancel_closes_its_socket() {
    for wire in WIRES {
        let dir = tempfile::tempdir().unwrap();
        let turns = conversation();
        // The answer stops after its first text and the server holds the
        // connection open: the provider has not finished.
        let server = FakeModel::start(move |_, _| {
            let full = render_stream(wire, &turns[0]);
            let at = full.find("Let ").unwrap();
            let end = at + full[at..].find("\n\n").unwrap() + 2;
            Reply::sse(vec![full.as_bytes()[..end].to_vec()]).then(After::Hang)
        })
        .await;
        let agent = write_agent(dir.path(), &model_table(Some(wire), Some(&server), ""));
        let rt = Runtime::new(
            Arc::new(MemoryStore::new()),
            PluginHost::new(sandbox().clone()),
        );
        let mut turn = rt.start_turn(None, &agent, json!("go")).await.unwrap();
        assert_eq!(until_text(&mut turn).await, "Let ", "{wire:?}");
        // Seen through the handle while the answer is still open.
        assert_eq!(server.closed_by_client(), 0);
        let recorded = rt.events(turn.run_id()).await.unwrap();
        assert!(
            !recorded
                .iter()
                .any(|e| matches!(e, Event::ModelCallCompleted(_))),
            "{wire:?}: nothing completed yet"
        );
        turn.cancel(Some("the user pressed stop".into()))
            .await
            .unwrap();
        let events = rest(&mut turn).await;
        assert_eq!(
            events.last(),
            Some(&TurnEvent::Finished(TurnOutcome::Cancelled {
                reason: Some("the user pressed stop".into())
            })),
            "{wire:?}"
        );
        server
            .wait_for("the connection close", |s| s.closed_by_client() == 1)
            .await;
        // A second cancel of an ended turn changes nothing.
        turn.cancel(None).await.unwrap();
        let log = rt.events(turn.run_id()).await.unwrap();
        assert!(matches!(
            &log[..],
            [
                Event::RunStarted(_),
                Event::ModelCallIntent(_),
                Event::RunCancelled(_)
            ]
        ));
        assert_eq!(
            turn.finish().await.unwrap(),
            TurnOutcome::Cancelled {
                reason: Some("the user pressed stop".into())
            }
        );
    }
}

/// A model that streams `Hel`, waits for a permit of `gate`, then streams
/// `lo` and stops.
struct GatedModel {
    gate: Arc<Semaphore>,
    finished: Arc<AtomicBool>,
}

impl ModelProvider for GatedModel {
    fn name(&self) -> &str {
        "gated"
    }

    fn stream(&self, _: &ModelRequest) -> ModelStream {
        let (gate, finished) = (Arc::clone(&self.gate), Arc::clone(&self.finished));
        let first = futures::stream::iter([Ok(ProviderEvent::TextDelta("Hel".into()))]);
        let after_gate = futures::stream::once(async move {
            gate.acquire().await.unwrap().forget();
            finished.store(true, Ordering::SeqCst);
            futures::stream::iter(
                [
                    ProviderEvent::TextDelta("lo".into()),
                    ProviderEvent::Usage(Usage {
                        input_tokens: 5,
                        output_tokens: 2,
                    }),
                    ProviderEvent::Stop(StopReason::EndTurn),
                ]
                .map(Ok),
            )
        })
        .flatten();
        Box::pin(first.chain(after_gate))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_reach_the_handle_before_a_gated_model_finishes_and_finish_returns_the_output() {
    let chat = ChatAgent::new("never");
    let model = Arc::new(GatedModel {
        gate: Arc::new(Semaphore::new(0)),
        finished: Arc::default(),
    });
    let rt = Runtime::new(
        Arc::new(MemoryStore::new()),
        PluginHost::new(sandbox().clone()),
    )
    .with_provider(Arc::clone(&model) as Arc<dyn ModelProvider>);
    let mut turn = rt.start_turn(None, &chat.agent, json!("hi")).await.unwrap();
    assert_eq!(until_text(&mut turn).await, "Hel");
    assert!(
        !model.finished.load(Ordering::SeqCst),
        "the delta came through before the model went on"
    );
    model.gate.add_permits(1);
    assert_eq!(
        rest(&mut turn).await,
        [
            TurnEvent::TextDelta {
                step: 1,
                text: "lo".into()
            },
            TurnEvent::Finished(TurnOutcome::Completed {
                output: json!("Hello")
            }),
        ]
    );
    let run = turn.run_id().clone();
    assert_eq!(
        turn.finish().await.unwrap(),
        TurnOutcome::Completed {
            output: json!("Hello")
        }
    );
    assert_eq!(rt.state(&run).await.unwrap().status(), RunStatus::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_and_approvals_come_through_the_handle_with_receipts() {
    let chat = ChatAgent::new("always");
    let rt = chat_runtime(Arc::new(MemoryStore::new()), Arc::new(ChatModel::default()));
    let s = session("tools");
    let mut turn = rt
        .start_turn(Some(&s), &chat.agent, json!("read the file"))
        .await
        .unwrap();
    let run = turn.run_id().clone();
    let events = rest(&mut turn).await;
    let [
        TurnEvent::ApprovalNeeded {
            call_id,
            tool,
            arguments,
            preview,
        },
        TurnEvent::Finished(outcome),
    ] = &events[..]
    else {
        panic!("an approval, then the park: {events:?}")
    };
    assert_eq!(tool, "files__read_file");
    assert_eq!(arguments, &json!({ "path": "input.txt" }));
    assert!(preview.is_some(), "the preflight's preview");
    assert_eq!(
        outcome,
        &TurnOutcome::Parked {
            status: RunStatus::AwaitingApproval
        }
    );
    // A parked turn's handle is dropped without cancelling it.
    drop(turn);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        rt.state(&run).await.unwrap().status(),
        RunStatus::AwaitingApproval
    );
    rt.approve(&run, call_id, "tester").await.unwrap();
    let mut turn = rt.continue_turn(&run, &chat.agent).await.unwrap();
    let events = rest(&mut turn).await;
    let [
        TurnEvent::ToolCallStarted {
            call_id: started,
            tool,
            arguments,
            effect,
        },
        TurnEvent::ToolCallFinished {
            call_id: finished,
            tool: finished_tool,
            result: ToolCallResult::Output(output),
            receipt: Some(receipt),
        },
        TurnEvent::TextDelta { text, .. },
        TurnEvent::Finished(TurnOutcome::Completed { .. }),
    ] = &events[..]
    else {
        panic!("the call, its result, the answer: {events:?}")
    };
    assert_eq!((started, finished), (call_id, call_id));
    assert_eq!(
        (tool.as_str(), finished_tool.as_str()),
        ("files__read_file", "files__read_file")
    );
    assert_eq!(arguments, &json!({ "path": "input.txt" }));
    assert_eq!(*effect, EffectClass::Read);
    assert!(output.to_string().contains("the input file"), "{output}");
    assert!(receipt.fuel_consumed > 0, "{receipt:?}");
    assert!(text.starts_with("read: "), "{text}");
    // The session is free once the turn completed.
    rt.start_turn(Some(&s), &chat.agent, json!("thanks"))
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_unfinished_turn_cancels_it_records_it_and_releases_its_session() {
    let chat = ChatAgent::new("never");
    let model = Arc::new(ChatModel::default());
    let rt = chat_runtime(Arc::new(MemoryStore::new()), Arc::clone(&model));
    let s = session("dropped");
    let mut turn = rt
        .start_turn(Some(&s), &chat.agent, json!("hold this thought"))
        .await
        .unwrap();
    let run = turn.run_id().clone();
    until_text(&mut turn).await;
    drop(turn);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while rt.state(&run).await.unwrap().status() != RunStatus::Cancelled {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dropped turn was never cancelled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let log = rt.events(&run).await.unwrap();
    assert!(
        matches!(&log[..], [Event::RunStarted(_), Event::ModelCallIntent(_), Event::RunCancelled(c)]
            if c.reason.as_deref() == Some(DROPPED_REASON)),
        "{log:?}"
    );
    assert_eq!(model.dropped_holds.load(Ordering::SeqCst), 1);
    let next = rt
        .start_turn(Some(&s), &chat.agent, json!("hello again"))
        .await
        .unwrap();
    assert_eq!(
        next.finish().await.unwrap(),
        TurnOutcome::Completed {
            output: json!("you said: hello again")
        }
    );
}

/// Three turns in one session through their handles, the middle one
/// cancelled while the model streams: the third turn's recorded prompt
/// holds the first turn and not the second.
async fn three_turns_with_the_middle_one_cancelled(store: Arc<dyn EventStore>) {
    let chat = ChatAgent::new("never");
    let model = Arc::new(ChatModel::default());
    let rt = chat_runtime(store, Arc::clone(&model));
    let s = session("three-turns");
    let first = rt
        .start_turn(Some(&s), &chat.agent, json!("hello"))
        .await
        .unwrap();
    assert_eq!(
        first.finish().await.unwrap(),
        TurnOutcome::Completed {
            output: json!("you said: hello")
        }
    );

    let mut second = rt
        .start_turn(Some(&s), &chat.agent, json!("hold on, write an essay"))
        .await
        .unwrap();
    assert_eq!(until_text(&mut second).await, "let me think about ");
    match rt.start_turn(Some(&s), &chat.agent, json!("hi?")).await {
        Err(RuntimeError::SessionBusy { active_run, .. }) => {
            assert_eq!(&active_run, second.run_id());
        }
        other => panic!("expected a busy session, got {other:?}"),
    }
    second.cancel(Some("too long".into())).await.unwrap();
    let second_run = second.run_id().clone();
    assert_eq!(
        second.finish().await.unwrap(),
        TurnOutcome::Cancelled {
            reason: Some("too long".into())
        }
    );
    assert_eq!(model.dropped_holds.load(Ordering::SeqCst), 1);
    assert_eq!(
        rt.events(&second_run).await.unwrap().len(),
        3,
        "nothing lost"
    );

    let third = rt
        .start_turn(Some(&s), &chat.agent, json!("and now?"))
        .await
        .unwrap();
    let third_run = third.run_id().clone();
    third.finish().await.unwrap();
    assert_eq!(
        prompts(&rt, &third_run).await,
        [vec![
            user("hello"),
            assistant("you said: hello"),
            user("and now?")
        ]]
    );
    let statuses: Vec<RunStatus> = rt
        .session_runs(&s)
        .await
        .unwrap()
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(
        statuses,
        [
            RunStatus::Completed,
            RunStatus::Cancelled,
            RunStatus::Completed
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_turns_with_the_middle_one_cancelled_through_its_handle_on_memory() {
    three_turns_with_the_middle_one_cancelled(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_turns_with_the_middle_one_cancelled_through_its_handle_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
    three_turns_with_the_middle_one_cancelled(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_turns_with_the_middle_one_cancelled_through_its_handle_on_postgres() {
    let Some(pg) = PgSchema::new("turns_three").await else {
        return;
    };
    three_turns_with_the_middle_one_cancelled(Arc::new(pg.store().await)).await;
}

/// A turn is over at its run's terminal event: `Finished` comes while a
/// channel is still being retried, and dropping the handle then does not
/// stop the delivery, which completes in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_finishes_at_its_terminal_event_and_its_deliveries_go_on_after_a_drop() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("outbox")).unwrap();
    crate::plugin_manifest(
        dir.path(),
        "test-channel",
        "channel",
        guests::CHANNEL,
        "[mounts.outbox]\naccess = \"read-write\"\n",
    );
    std::fs::write(
        dir.path().join("transcript.toml"),
        "[[turns]]\ntext = \"The answer is 42.\"\n",
    )
    .unwrap();
    // The channel fails its first two attempts; retries wait 2 s each.
    std::fs::write(
        dir.path().join("agent.toml"),
        r#"
name = "notifier"
instructions = "Answer."

[model]
provider = "scripted"
name = "script"
transcript = "transcript.toml"

[plugins.outbox]
source = "test-channel.toml"
[plugins.outbox.grant.mounts.outbox]
dir = "outbox"
[plugins.outbox.grant.config]
fail_first = "2"

[channels.notify]
plugin = "outbox"
max_attempts = 3
backoff = "2s"
backoff_cap = "2s"
"#,
    )
    .unwrap();
    let agent = Agent::load(&dir.path().join("agent.toml"), None).unwrap();
    let rt = Runtime::new(
        Arc::new(MemoryStore::new()),
        PluginHost::new(sandbox().clone()),
    );
    let mut turn = rt.start_turn(None, &agent, json!("?")).await.unwrap();
    let run = turn.run_id().clone();
    let events = rest(&mut turn).await;
    assert_eq!(
        events.last(),
        Some(&TurnEvent::Finished(TurnOutcome::Completed {
            output: json!("The answer is 42.")
        }))
    );
    let delivered = |log: &[Event]| log.iter().any(|e| matches!(e, Event::DeliveryCompleted(_)));
    assert!(
        !delivered(&rt.events(&run).await.unwrap()),
        "the turn finished before its delivery (4 s of retries)"
    );
    drop(turn);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let log = rt.events(&run).await.unwrap();
        if delivered(&log) {
            assert!(
                !log.iter().any(|e| matches!(e, Event::RunCancelled(_))),
                "{log:?}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the delivery never completed: {log:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
