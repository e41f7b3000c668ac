//! Session history by reference, on every store: a run's `run_started`
//! names the shared history chunks instead of copying the history, so it
//! keeps its size however long the session, while the model sees exactly
//! the history a copy would have given; a chunk missing or altered behind
//! the store's back is refused when the run is driven, recovered or
//! verified; a log written before chunks (history inline) still folds,
//! verifies, replays and starts the chain for the next run; and pruning
//! deletes the history no remaining run names.

use std::sync::Arc;

use serde_json::json;
use warden::engine::events::{Event, RunStarted, encode};
use warden::engine::{
    ForkOptions, ReplayOptions, RunId, RunStatus, Runtime, RuntimeError, SessionId, StartOptions,
};
use warden::providers::Message;
use warden::store::{
    EventStore, Listing, ListingStatus, MemoryStore, PruneFilter, RunMeta, SqliteStore, StoreError,
};

use super::sessions::{ChatAgent, ChatModel, assistant, chat_runtime, prompts, session, user};
use super::workers::PgSchema;

/// Drives `turns` runs of one session and checks each one's prompt
/// against the history a copy would hold, and the size of what each run
/// records: the same at the last turn as at the second.
async fn runs_record_history_by_reference(store: Arc<dyn EventStore>, turns: usize) {
    let chat = ChatAgent::new("never");
    let rt = chat_runtime(Arc::clone(&store), Arc::new(ChatModel::default()));
    let s = session("long");
    let mut expected: Vec<Message> = Vec::new();
    let mut sizes = Vec::new();
    for turn in 0..turns {
        let input = format!("message number {turn}");
        let run = start_in(&rt, &chat, &s, &input).await;
        assert_eq!(
            rt.drive(&run, &chat.agent).await.unwrap(),
            RunStatus::Completed
        );
        let mut seen = expected.clone();
        seen.push(user(&input));
        assert_eq!(
            prompts(&rt, &run).await,
            [seen],
            "turn {turn}: the model sees every earlier turn, then the input"
        );
        let stored = store.load(&run).await.unwrap();
        let first = String::from_utf8(stored[0].bytes.to_vec()).unwrap();
        if turn > 0 {
            assert!(
                !first.contains("message number 0"),
                "turn {turn}: no earlier message is copied into run_started: {first}"
            );
        }
        sizes.push(first.len());
        assert!(rt.verify(&run).await.unwrap().is_intact());
        expected.push(user(&input));
        expected.push(assistant(&format!("you said: {input}")));
    }
    // Positions and counts gain digits; nothing else grows.
    let (second, last) = (sizes[1], sizes[turns - 1]);
    assert!(
        last <= second + 8,
        "run_started grows with the session: {second} bytes at turn 2, {last} at turn {turns}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_record_history_by_reference_on_memory() {
    runs_record_history_by_reference(Arc::new(MemoryStore::new()), 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_record_history_by_reference_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
    runs_record_history_by_reference(Arc::new(store), 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_record_history_by_reference_on_postgres() {
    let Some(pg) = PgSchema::new("history_by_reference").await else {
        return;
    };
    runs_record_history_by_reference(Arc::new(pg.store().await), 12).await;
}

/// Starts a run of `chat` in `s` with `input`, recorded and not driven.
async fn start_in(rt: &Runtime, chat: &ChatAgent, s: &SessionId, input: &str) -> RunId {
    rt.start(
        &chat.agent,
        json!(input),
        StartOptions::new().session(s.clone()),
    )
    .await
    .unwrap()
}

/// Two turns of `s`, driven to completion: "hello", then "and now?".
async fn two_turns(rt: &Runtime, chat: &ChatAgent, s: &SessionId) -> Vec<RunId> {
    let mut runs = Vec::new();
    for input in ["hello", "and now?"] {
        let run = start_in(rt, chat, s, input).await;
        assert_eq!(
            rt.drive(&run, &chat.agent).await.unwrap(),
            RunStatus::Completed
        );
        runs.push(run);
    }
    runs
}

fn assert_history_broken(result: Result<impl std::fmt::Debug, RuntimeError>, what: &str) {
    match result {
        Err(
            error @ RuntimeError::Store {
                error: StoreError::HistoryBroken { .. },
            },
        ) => {
            assert_eq!(error.code(), "history_broken", "{what}");
        }
        other => panic!("{what}: expected history_broken, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_altered_or_missing_history_chunk_is_refused_everywhere_it_is_read() {
    for damage in [
        "UPDATE history_chunks SET body = CAST('{\"runs\":[],\"messages\":[]}' AS BLOB) WHERE previous IS NULL",
        "DELETE FROM history_chunks WHERE previous IS NULL",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("runs.db");
        let chat = ChatAgent::new("never");
        let store: Arc<dyn EventStore> = Arc::new(SqliteStore::open(&db).unwrap());
        let rt = chat_runtime(Arc::clone(&store), Arc::new(ChatModel::default()));
        // Two completed turns, and a third started: the history it names
        // is two chunks.
        let s = session("tampered");
        let second = two_turns(&rt, &chat, &s).await.remove(1);
        let third = start_in(&rt, &chat, &s, "bye").await;
        let changed = rusqlite::Connection::open(&db)
            .unwrap()
            .execute(damage, [])
            .unwrap();
        assert_eq!(changed, 1, "{damage}");

        // Nothing is driven, recovered, shown or forked on a history that
        // is not the one recorded.
        assert_history_broken(rt.drive(&third, &chat.agent).await, "drive");
        assert_history_broken(
            rt.recover(&second, &chat.agent, ReplayOptions::default())
                .await,
            "recover",
        );
        assert_history_broken(rt.state(&third).await, "state");
        assert_history_broken(rt.events(&third).await, "events");
        // Verify reports it as a finding on the first event.
        let report = rt.verify(&third).await.unwrap();
        assert!(!report.is_intact(), "{damage}");
        assert_eq!(report.findings[0].seq, 1);
        assert!(
            format!("{:?}", report.findings[0].kind)
                .contains("session history cannot be read back"),
            "{:?}",
            report.findings[0]
        );
        // The third run is untouched: its log still loads and ends as it was.
        assert_eq!(store.load(&third).await.unwrap().len(), 1);
    }
}

/// A log as a build before history chunks wrote it: `run_started` with the
/// history inline. It folds, verifies and replays as it is, and the next
/// run of the session sees its history and its transcript through the
/// chunks the start writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_with_its_history_inline_still_verifies_replays_and_continues() {
    let chat = ChatAgent::new("never");
    let s = session("from-before");
    // Two turns recorded today, on a store of their own.
    let source: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let rt = chat_runtime(Arc::clone(&source), Arc::new(ChatModel::default()));
    let runs = two_turns(&rt, &chat, &s).await;

    // The same logs written the old way into a second store: the second
    // run's history inline, no chain, no chunk.
    let dir = tempfile::tempdir().unwrap();
    let old: Arc<dyn EventStore> = Arc::new(SqliteStore::open(dir.path().join("runs.db")).unwrap());
    for run in &runs {
        let stored = source.load(run).await.unwrap();
        let Event::RunStarted(mut started) = rt.events(run).await.unwrap().remove(0) else {
            panic!("run_started first")
        };
        let inline = started.session.as_mut().unwrap();
        inline.chain = None;
        let first = encode(&Event::RunStarted(started.clone()));
        let meta = RunMeta {
            agent: "chat".into(),
            labels: started.labels.clone(),
            session: Some(s.to_string()),
            session_runs: None,
            history: Vec::new(),
            history_head: None,
            created_ms: started.clock_seed_ms as i64,
        };
        old.create(run, meta, first.into(), ListingStatus::RUNNING)
            .await
            .unwrap();
        let rest: Vec<_> = stored[1..].iter().map(|e| e.bytes.clone()).collect();
        old.append(
            run,
            1,
            &rest,
            Listing::new(ListingStatus::COMPLETED),
            started.clock_seed_ms as i64,
        )
        .await
        .unwrap();
    }
    let first_line =
        String::from_utf8(old.load(&runs[1]).await.unwrap()[0].bytes.to_vec()).unwrap();
    assert!(
        first_line.contains(r#""history":[{"role":"user","content":"hello"}"#)
            && !first_line.contains("chain"),
        "{first_line}"
    );

    let rt = chat_runtime(Arc::clone(&old), Arc::new(ChatModel::default()));
    assert!(rt.verify(&runs[1]).await.unwrap().is_intact());
    assert_eq!(
        rt.state(&runs[1]).await.unwrap().history(),
        [user("hello"), assistant("you said: hello")]
    );
    assert_eq!(
        rt.recover(&runs[1], &chat.agent, ReplayOptions::default())
            .await
            .unwrap(),
        RunStatus::Completed,
        "the old log replays, its request hashes included"
    );
    let listed = rt.session_runs(&s).await.unwrap();
    assert_eq!(
        listed.iter().map(|r| r.history_runs).collect::<Vec<_>>(),
        [0, 1]
    );

    let third = start_in(&rt, &chat, &s, "bye").await;
    assert_eq!(
        rt.drive(&third, &chat.agent).await.unwrap(),
        RunStatus::Completed
    );
    assert_eq!(
        prompts(&rt, &third).await,
        [vec![
            user("hello"),
            assistant("you said: hello"),
            user("and now?"),
            assistant("you said: and now?"),
            user("bye"),
        ]]
    );
    assert!(rt.verify(&third).await.unwrap().is_intact());
    let Event::RunStarted(RunStarted {
        session: Some(recorded),
        ..
    }) = rt.events(&third).await.unwrap().remove(0)
    else {
        panic!("run_started in a session first")
    };
    let chain = recorded.chain.expect("the new run records a chain");
    assert_eq!((chain.runs, chain.messages), (2, 4));
    assert_eq!(
        old.load_history(&chain.head).await.unwrap().len(),
        2,
        "the inline history became the chain's first chunk"
    );
}

/// Pruning a session's runs deletes the history only they reached: a fork
/// of one of them (its first event names the same history) keeps what it
/// sees, and once the fork is pruned too, nothing of the session is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_keeps_the_history_a_fork_still_names_and_then_deletes_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.db");
    let chat = ChatAgent::new("never");
    let store: Arc<dyn EventStore> = Arc::new(SqliteStore::open(&db).unwrap());
    let rt = chat_runtime(Arc::clone(&store), Arc::new(ChatModel::default()));
    let s = session("pruned");
    let runs = two_turns(&rt, &chat, &s).await;
    let fork = rt
        .fork(
            &runs[1],
            1,
            ForkOptions {
                agent: &chat.agent,
                source_agent: None,
                budgets: Default::default(),
                run_id: None,
                by: "test".into(),
            },
        )
        .await
        .unwrap();
    let chunks = || {
        rusqlite::Connection::open(&db)
            .unwrap()
            .query_row("SELECT count(*) FROM history_chunks", [], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap()
    };
    assert_eq!(
        chunks(),
        1,
        "the second run's history: the first run's turn"
    );

    let completed = PruneFilter::new()
        .status("completed")
        .updated_before(i64::MAX);
    assert_eq!(store.prune(&completed, i64::MAX).await.unwrap().len(), 2);
    assert_eq!(chunks(), 1, "the fork still names it");
    assert_eq!(
        rt.state(&fork).await.unwrap().history(),
        [user("hello"), assistant("you said: hello")]
    );
    assert!(rt.verify(&fork).await.unwrap().is_intact());

    assert_eq!(
        rt.drive(&fork, &chat.agent).await.unwrap(),
        RunStatus::Completed
    );
    assert_eq!(store.prune(&completed, i64::MAX).await.unwrap().len(), 1);
    assert_eq!(
        chunks(),
        0,
        "no run is left that names the session's history"
    );
}
