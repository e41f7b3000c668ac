//! Sessions end to end on every store (memory, SQLite, PostgreSQL): one
//! active run per session, history from completed runs only (a run
//! cancelled while its model is streaming is rolled back), the history a
//! run saw recorded in its log and replayed from there, a parked run
//! keeping its session, and two hosts racing to start in one session.
//! (`warden run --session` and `warden sessions show`: `host/cli/tests/cli.rs`.)
//!
//! The model is [`ChatModel`], an in-process provider that answers each
//! request from its last message and holds a stream open, after a first
//! delta, when asked to (`hold …`), so a test can act while the model is
//! mid-answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use warden::engine::StartOptions;

use serde_json::{Value, json};
use warden::engine::events::Event;
use warden::engine::{
    Agent, FixedClock, FixedRandom, ReplayOptions, RunId, RunStatus, RunUpdate, Runtime,
    RuntimeError, SessionId,
};
use warden::plugins::PluginHost;
use warden::providers::{
    Message, ModelProvider, ModelRequest, ModelStream, ProviderEvent, StopReason, ToolCall, Usage,
};
use warden::store::testing::{Hooks, Intercepted, Read};
use warden::store::{EventStore, MemoryStore, SqliteStore};

use super::workers::PgSchema;
use crate::sandbox;

/// A model that answers from the last message of the request:
/// - a user message `hold …`: a first delta, then nothing until the stream
///   is dropped (counted in `dropped_holds`);
/// - a user message `read …`: a call to `files__read_file` on `input.txt`;
/// - a tool result: `read: <the result>`;
/// - anything else: `you said: <the message>`, in two deltas.
#[derive(Default)]
pub(crate) struct ChatModel {
    pub(crate) dropped_holds: Arc<AtomicUsize>,
}

/// Counts itself when the stream holding it is dropped.
struct DropCounter(Arc<AtomicUsize>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn ends(usage: u64, stop: StopReason) -> Vec<ProviderEvent> {
    vec![
        ProviderEvent::Usage(Usage {
            input_tokens: usage,
            output_tokens: 3,
        }),
        ProviderEvent::Stop(stop),
    ]
}

impl ModelProvider for ChatModel {
    fn name(&self) -> &str {
        "chat"
    }

    fn stream(&self, request: &ModelRequest) -> ModelStream {
        use futures::StreamExt as _;
        let n = request.messages.len() as u64;
        let events = match request.messages.last() {
            Some(Message::User { content }) if content.starts_with("hold") => {
                let guard = DropCounter(Arc::clone(&self.dropped_holds));
                let first = futures::stream::iter([Ok(ProviderEvent::TextDelta(
                    "let me think about ".into(),
                ))]);
                let held = futures::stream::pending().map(move |e| {
                    let _ = &guard;
                    e
                });
                return Box::pin(first.chain(held));
            }
            Some(Message::User { content }) if content.starts_with("read") => {
                let mut events = vec![ProviderEvent::ToolCall(ToolCall {
                    id: format!("read-{n}"),
                    name: "files__read_file".into(),
                    arguments: json!({ "path": "input.txt" }),
                })];
                events.extend(ends(n, StopReason::ToolUse));
                events
            }
            Some(Message::Tool { content, .. }) => {
                let mut events = vec![ProviderEvent::TextDelta(format!("read: {content}"))];
                events.extend(ends(n, StopReason::EndTurn));
                events
            }
            Some(Message::User { content }) => {
                let mut events = vec![
                    ProviderEvent::TextDelta("you said: ".into()),
                    ProviderEvent::TextDelta(content.clone()),
                ];
                events.extend(ends(n, StopReason::EndTurn));
                events
            }
            other => panic!("unexpected last message {other:?}"),
        };
        Box::pin(futures::stream::iter(events.into_iter().map(Ok)))
    }
}

/// A directory with `agent.toml` (the built-in fs plugin as `files`,
/// read-only over `work/`, `read_file` needing approval when `approval`
/// says so) and `work/input.txt`.
pub(crate) struct ChatAgent {
    /// Holds the directory the agent file names.
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) agent: Agent,
}

impl ChatAgent {
    pub(crate) fn new(approval: &str) -> ChatAgent {
        let dir = tempfile::tempdir().unwrap();
        let path = |rel: &str| dir.path().join(rel);
        std::fs::create_dir(path("work")).unwrap();
        std::fs::write(path("work/input.txt"), "the input file").unwrap();
        std::fs::write(
            path("transcript.toml"),
            "[[turns]]\ntext = \"(the tests replace this model)\"\n",
        )
        .unwrap();
        std::fs::write(
            path("agent.toml"),
            format!(
                r#"
name = "chat"
instructions = "Chat with the user."

[model]
provider = "scripted"
name = "script"
transcript = "transcript.toml"

[plugins.files]
source = "builtin:fs"
approval = {{ read_file = "{approval}" }}
[plugins.files.grant.mounts.workspace]
dir = "work"
access = "read-only"
"#
            ),
        )
        .unwrap();
        let agent = Agent::load(&path("agent.toml"), None).unwrap();
        ChatAgent { _dir: dir, agent }
    }
}

pub(crate) fn chat_runtime(store: Arc<dyn EventStore>, model: Arc<ChatModel>) -> Runtime {
    Runtime::new(store, PluginHost::new(sandbox().clone()))
        .with_provider(model)
        .with_record_prompts(true)
}

pub(crate) fn session(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

/// The messages of every recorded model request of `run`, in order.
pub(crate) async fn prompts(rt: &Runtime, run: &RunId) -> Vec<Vec<Message>> {
    rt.events(run)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e {
            Event::ModelCallIntent(i) => Some(i.request.expect("prompts are recorded").messages),
            _ => None,
        })
        .collect()
}

pub(crate) fn user(text: &str) -> Message {
    Message::User {
        content: text.into(),
    }
}

pub(crate) fn assistant(text: &str) -> Message {
    Message::Assistant {
        text: text.into(),
        tool_calls: vec![],
        blocks: vec![],
    }
}

fn busy(result: Result<RunId, RuntimeError>, expected_active: &RunId) {
    match result {
        Err(RuntimeError::SessionBusy {
            session_id,
            active_run,
        }) => {
            assert_eq!(&active_run, expected_active);
            assert_eq!(
                RuntimeError::SessionBusy {
                    session_id: session_id.clone(),
                    active_run: active_run.clone(),
                }
                .to_string(),
                format!("session `{session_id}` is busy: run `{active_run}` is still active in it")
            );
        }
        other => panic!("expected SessionBusy naming {expected_active}, got {other:?}"),
    }
}

/// Three runs in one session, the middle one cancelled while its model is
/// streaming: the third sees the first and not the second, and what it saw
/// is in its log.
async fn three_runs_with_the_middle_one_cancelled(store: Arc<dyn EventStore>) {
    let chat = ChatAgent::new("never");
    let model = Arc::new(ChatModel::default());
    let rt = chat_runtime(Arc::clone(&store), Arc::clone(&model));
    let s = session("chat-1");

    let first = rt
        .start(
            &chat.agent,
            json!("hello"),
            StartOptions::new().session(s.clone()),
        )
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&first, &chat.agent).await.unwrap(),
        RunStatus::Completed
    );

    // The second run's model holds its stream open after a first delta.
    let second = RunId::new("second").unwrap();
    let mut updates = rt.subscribe(&second);
    rt.start(
        &chat.agent,
        json!("hold on, write me an essay"),
        StartOptions::new().session(s.clone()).id(second.clone()),
    )
    .await
    .unwrap();
    let driver = {
        let (rt, agent, second) = (rt.clone(), chat.agent.clone(), second.clone());
        tokio::spawn(async move { rt.drive(&second, &agent).await })
    };
    loop {
        match tokio::time::timeout(Duration::from_secs(30), updates.next())
            .await
            .expect("the model's first delta arrives")
        {
            Some(RunUpdate::TextDelta { text, .. }) => {
                assert_eq!(text, "let me think about ");
                break;
            }
            Some(_) => continue,
            None => panic!("updates ended"),
        }
    }
    // While it streams, the session is busy, and nothing is written.
    busy(
        rt.start(
            &chat.agent,
            json!("are you there?"),
            StartOptions::new().session(s.clone()),
        )
        .await,
        &second,
    );
    assert_eq!(rt.session_runs(&s).await.unwrap().len(), 2);

    rt.cancel(&second, None, Some("the user changed their mind".into()))
        .await
        .unwrap();
    assert_eq!(driver.await.unwrap().unwrap(), RunStatus::Cancelled);
    assert_eq!(
        model.dropped_holds.load(Ordering::SeqCst),
        1,
        "cancelling dropped the model's stream"
    );
    let second_log = rt.events(&second).await.unwrap();
    assert!(
        matches!(&second_log[..], [Event::RunStarted(_), Event::ModelCallIntent(_), Event::RunCancelled(c)]
            if c.reason.as_deref() == Some("the user changed their mind")),
        "the intent stays recorded and the cancellation is added: {second_log:?}"
    );

    // The session is free again; the third run sees the first only.
    let third = rt
        .start(
            &chat.agent,
            json!("and now?"),
            StartOptions::new().session(s.clone()),
        )
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&third, &chat.agent).await.unwrap(),
        RunStatus::Completed
    );
    let expected = vec![
        user("hello"),
        assistant("you said: hello"),
        user("and now?"),
    ];
    assert_eq!(prompts(&rt, &third).await, std::slice::from_ref(&expected));
    let Event::RunStarted(started) = &rt.events(&third).await.unwrap()[0] else {
        panic!("run_started first")
    };
    let recorded = started.session.as_ref().expect("the session is recorded");
    assert_eq!(
        (&recorded.session_id, recorded.position, &recorded.runs),
        (&s, 2, &vec![first.clone()])
    );
    assert_eq!(recorded.history, expected[..2]);
    let state = rt.state(&third).await.unwrap();
    assert_eq!(
        state.transcript(),
        [user("and now?"), assistant("you said: and now?")]
    );

    // A fourth run sees the first and the third.
    let fourth = rt
        .start(
            &chat.agent,
            json!("bye"),
            StartOptions::new().session(s.clone()),
        )
        .await
        .unwrap();
    rt.drive(&fourth, &chat.agent).await.unwrap();
    assert_eq!(
        prompts(&rt, &fourth).await,
        [vec![
            user("hello"),
            assistant("you said: hello"),
            user("and now?"),
            assistant("you said: and now?"),
            user("bye"),
        ]]
    );

    // Replay reads the recorded history, not the session as it is now: the
    // third run replays (its request hash included) after the fourth.
    assert_eq!(
        rt.recover(&third, &chat.agent, ReplayOptions::default())
            .await
            .unwrap(),
        RunStatus::Completed
    );

    let listed = rt.session_runs(&s).await.unwrap();
    let summary: Vec<(u64, &RunId, RunStatus, &Value)> = listed
        .iter()
        .map(|r| (r.position, &r.run_id, r.status, &r.input))
        .collect();
    assert_eq!(
        summary,
        [
            (0, &first, RunStatus::Completed, &json!("hello")),
            (
                1,
                &second,
                RunStatus::Cancelled,
                &json!("hold on, write me an essay")
            ),
            (2, &third, RunStatus::Completed, &json!("and now?")),
            (3, &fourth, RunStatus::Completed, &json!("bye")),
        ]
    );
    assert_eq!(listed[3].output, Some(json!("you said: bye")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_runs_with_the_middle_one_cancelled_in_flight_on_memory() {
    three_runs_with_the_middle_one_cancelled(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_runs_with_the_middle_one_cancelled_in_flight_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
    three_runs_with_the_middle_one_cancelled(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_runs_with_the_middle_one_cancelled_in_flight_on_postgres() {
    let Some(pg) = PgSchema::new("sessions_three").await else {
        return;
    };
    three_runs_with_the_middle_one_cancelled(Arc::new(pg.store().await)).await;
}

/// A run parked for approval keeps its session; denying the call lets it
/// finish and frees the session. A failed run frees it too, and adds no
/// history.
async fn a_parked_run_keeps_its_session(store: Arc<dyn EventStore>) {
    let chat = ChatAgent::new("always");
    let rt = chat_runtime(store, Arc::new(ChatModel::default()));
    let s = session("parked");
    let reader = rt
        .start(
            &chat.agent,
            json!("read the file"),
            StartOptions::new().session(s.clone()),
        )
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&reader, &chat.agent).await.unwrap(),
        RunStatus::AwaitingApproval
    );
    busy(
        rt.start(
            &chat.agent,
            json!("hello"),
            StartOptions::new().session(s.clone()),
        )
        .await,
        &reader,
    );
    let call = rt
        .state(&reader)
        .await
        .unwrap()
        .next_call()
        .unwrap()
        .call_id
        .clone();
    rt.approve(&reader, &call, "tester").await.unwrap();
    busy(
        rt.start(
            &chat.agent,
            json!("hello"),
            StartOptions::new().session(s.clone()),
        )
        .await,
        &reader,
    );
    assert_eq!(
        rt.drive(&reader, &chat.agent).await.unwrap(),
        RunStatus::Completed
    );

    // The next run sees the whole transcript: the call and its result.
    let next = rt
        .start(
            &chat.agent,
            json!("thanks"),
            StartOptions::new().session(s.clone()),
        )
        .await
        .unwrap();
    rt.drive(&next, &chat.agent).await.unwrap();
    let prompt = &prompts(&rt, &next).await[0];
    assert_eq!(prompt.len(), 5, "{prompt:?}");
    assert_eq!(prompt[0], user("read the file"));
    assert!(
        matches!(&prompt[1], Message::Assistant { tool_calls, .. } if tool_calls[0].name == "files__read_file")
    );
    assert!(
        matches!(&prompt[2], Message::Tool { content, .. } if content.contains("the input file"))
    );
    assert_eq!(prompt[4], user("thanks"));

    // An abandoned run frees the session and adds nothing.
    let parked = rt
        .start(
            &chat.agent,
            json!("read it again"),
            StartOptions::new().session(s.clone()),
        )
        .await
        .unwrap();
    rt.drive(&parked, &chat.agent).await.unwrap();
    rt.abandon(&parked, "tester", "not needed").await.unwrap();
    let last = rt
        .start(
            &chat.agent,
            json!("still there?"),
            StartOptions::new().session(s.clone()),
        )
        .await
        .unwrap();
    rt.drive(&last, &chat.agent).await.unwrap();
    let prompt = &prompts(&rt, &last).await[0];
    assert_eq!(prompt.len(), 7, "four of the reader, two of the next, one");
    assert!(!prompt.contains(&user("read it again")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_run_keeps_its_session_on_memory() {
    a_parked_run_keeps_its_session(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_run_keeps_its_session_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
    a_parked_run_keeps_its_session(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_run_keeps_its_session_on_postgres() {
    let Some(pg) = PgSchema::new("sessions_parked").await else {
        return;
    };
    a_parked_run_keeps_its_session(Arc::new(pg.store().await)).await;
}

/// Two runtimes (two hosts) on one PostgreSQL store start in one session
/// at once: one wins, the other is told which run holds the session, and
/// the loser's run is not recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_racing_to_start_in_one_session_have_one_winner_on_postgres() {
    let Some(pg) = PgSchema::new("sessions_race").await else {
        return;
    };
    let chat = ChatAgent::new("never");
    let hosts = [
        chat_runtime(Arc::new(pg.store().await), Arc::default()),
        chat_runtime(Arc::new(pg.store().await), Arc::default()),
    ];
    let s = session("raced");
    let starts: Vec<_> = (0..8)
        .map(|i| {
            let (rt, agent, s) = (hosts[i % 2].clone(), chat.agent.clone(), s.clone());
            tokio::spawn(async move {
                let id = RunId::new(format!("racer-{i}")).unwrap();
                rt.start(
                    &agent,
                    json!("hi"),
                    StartOptions::new().session(s.clone()).id(id),
                )
                .await
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for start in starts {
        match start.await.unwrap() {
            Ok(run) => winners.push(run),
            Err(RuntimeError::SessionBusy { active_run, .. }) => losers.push(active_run),
            Err(other) => panic!("unexpected {other}"),
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert!(losers.iter().all(|l| *l == winners[0]), "{losers:?}");
    let runs = hosts[1].session_runs(&s).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].run_id, winners[0]);
}

/// Runs created in the same millisecond, with ids that sort against their
/// order: the history still follows the order the session was lived in.
async fn ties_in_creation_time_never_reorder_a_session(store: Arc<dyn EventStore>) {
    let chat = ChatAgent::new("never");
    let rt = chat_runtime(store, Arc::new(ChatModel::default())).with_hooks(
        Arc::new(FixedClock(1_700_000_000_000)),
        Arc::new(FixedRandom(7)),
    );
    let s = session("same-millisecond");
    for (id, input) in [
        ("c-first", "one"),
        ("b-second", "two"),
        ("a-third", "three"),
    ] {
        let run = RunId::new(id).unwrap();
        rt.start(
            &chat.agent,
            json!(input),
            StartOptions::new().session(s.clone()).id(run.clone()),
        )
        .await
        .unwrap();
        assert_eq!(
            rt.drive(&run, &chat.agent).await.unwrap(),
            RunStatus::Completed
        );
    }
    let last = RunId::new("0-fourth").unwrap();
    rt.start(
        &chat.agent,
        json!("four"),
        StartOptions::new().session(s.clone()).id(last.clone()),
    )
    .await
    .unwrap();
    rt.drive(&last, &chat.agent).await.unwrap();
    assert_eq!(
        prompts(&rt, &last).await,
        [vec![
            user("one"),
            assistant("you said: one"),
            user("two"),
            assistant("you said: two"),
            user("three"),
            assistant("you said: three"),
            user("four"),
        ]]
    );
    let order: Vec<String> = rt
        .session_runs(&s)
        .await
        .unwrap()
        .iter()
        .map(|r| r.run_id.to_string())
        .collect();
    assert_eq!(order, ["c-first", "b-second", "a-third", "0-fourth"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ties_in_creation_time_never_reorder_a_session_on_memory() {
    ties_in_creation_time_never_reorder_a_session(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ties_in_creation_time_never_reorder_a_session_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
    ties_in_creation_time_never_reorder_a_session(Arc::new(store)).await;
}

/// Counts the reads a start makes: logs loaded and listings read.
#[derive(Default)]
struct Reads {
    logs: AtomicUsize,
    lists: AtomicUsize,
}

struct CountReads(Arc<Reads>);

impl Hooks for CountReads {
    fn before_read(&self, read: Read<'_>) {
        match read {
            Read::Log(_) => self.0.logs.fetch_add(1, Ordering::SeqCst),
            Read::List(_) => self.0.lists.fetch_add(1, Ordering::SeqCst),
            Read::SessionHead(_) => 0,
        };
    }
}

/// A start late in a session reads what a start early in it reads: the
/// store's head of the session and one log (the run that completed last),
/// never the listing of the session's runs, so a session's life costs
/// O(n), not O(n²). A failed run in between changes nothing.
async fn a_start_reads_the_same_however_long_the_session(store: Arc<dyn EventStore>) {
    let reads = Arc::new(Reads::default());
    let store: Arc<dyn EventStore> = Arc::new(Intercepted {
        inner: store,
        hooks: CountReads(Arc::clone(&reads)),
    });
    let chat = ChatAgent::new("never");
    let rt = chat_runtime(Arc::clone(&store), Arc::new(ChatModel::default()));
    let s = session("long");
    let mut seen = Vec::new();
    for turn in 0..12 {
        let (logs, lists) = (
            reads.logs.load(Ordering::SeqCst),
            reads.lists.load(Ordering::SeqCst),
        );
        let run = rt
            .start(
                &chat.agent,
                json!(format!("turn {turn}")),
                StartOptions::new().session(s.clone()),
            )
            .await
            .unwrap();
        seen.push((
            reads.logs.load(Ordering::SeqCst) - logs,
            reads.lists.load(Ordering::SeqCst) - lists,
        ));
        if turn == 5 {
            rt.cancel(&run, None, None).await.unwrap();
            continue;
        }
        assert_eq!(
            rt.drive(&run, &chat.agent).await.unwrap(),
            RunStatus::Completed
        );
    }
    assert_eq!(seen[0], (0, 0), "the first start reads no log");
    assert!(
        seen[1..].iter().all(|&r| r == (1, 0)),
        "each later start reads one log and lists nothing: {seen:?}"
    );
    let runs = rt.session_runs(&s).await.unwrap();
    assert_eq!(runs.len(), 12);
    assert_eq!(runs[11].position, 11);
    assert_eq!(runs[11].history_runs, 10, "every completed run before it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_reads_the_same_however_long_the_session_on_memory() {
    a_start_reads_the_same_however_long_the_session(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_reads_the_same_however_long_the_session_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
    a_start_reads_the_same_however_long_the_session(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_reads_the_same_however_long_the_session_on_postgres() {
    let Some(pg) = PgSchema::new("sessions_flat").await else {
        return;
    };
    a_start_reads_the_same_however_long_the_session(Arc::new(pg.store().await)).await;
}
