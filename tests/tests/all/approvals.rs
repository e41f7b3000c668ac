//! Approvals that cannot be reused, through the real engine, sandbox and
//! stores: an approval approves one frozen call (its digest), a stale
//! digest is refused, an approval recorded for other arguments approves
//! nothing; standing rules approve what they match and record themselves,
//! stop approving once revoked or expired, also for a call they approved
//! that has not run; and, under a kill at every event boundary followed by
//! a takeover by another driver on SQLite and PostgreSQL, a rule-approved
//! write runs at most once and a rule revoked before the takeover approves
//! nothing. Writes are counted by the side-effect file the test guest
//! appends to, never by reading the log.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::json;
use warden::engine::events::{ApprovalGranted, Event, WithdrawReason};
use warden::engine::{
    Agent, CallDigest, Clock, ReplayOptions, RuleSpec, RunId, RunStatus, Runtime, RuntimeError,
    StartOptions,
};
use warden::plugins::PluginHost;
use warden::sandbox::ValidUntil;
use warden::store::{EventStore, Listing, ListingStatus, MemoryStore, SqliteStore, StoreError};

use super::engine::{CrashPoint, Fixture, READ_WRITE_FINISH, crashing, id};
use super::workers::PgSchema;
use crate::sandbox;
use warden::store::testing::{AppendVia, BeforeAppend, Hooks, Intercepted};

/// The fixture's agent with the hostile plugin's tools under the default
/// approval rule: its append (a write) waits for approval.
fn approving_agent(fx: &Fixture) -> Agent {
    fx.agent(READ_WRITE_FINISH, "");
    let text = std::fs::read_to_string(fx.path("agent.toml"))
        .unwrap()
        .replace(
            "approval = { fs = \"never\", flaky = \"never\", write_then_sleep = \"never\" }\n",
            "",
        );
    std::fs::write(fx.path("agent-approve.toml"), text).unwrap();
    Agent::load(&fx.path("agent-approve.toml"), None).unwrap()
}

/// A clock the test moves.
struct TestClock(AtomicU64);

impl Clock for TestClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

const T0: u64 = 1_700_000_000_000;

fn runtime_at(store: Arc<dyn EventStore>, clock: Arc<TestClock>) -> Runtime {
    Runtime::new(store, PluginHost::new(sandbox().clone()))
        .with_hooks(clock, Arc::new(warden::engine::FixedRandom(7)))
}

fn runtime(store: Arc<dyn EventStore>) -> Runtime {
    Runtime::new(store, PluginHost::new(sandbox().clone()))
}

/// The rule the tests make: the hostile plugin's `fs` appends.
fn appends() -> RuleSpec {
    RuleSpec {
        arguments: BTreeMap::from([
            ("op".to_owned(), "append".to_owned()),
            ("path".to_owned(), "/workspace/*".to_owned()),
        ]),
        ..RuleSpec::for_tool(Some("hostile"), Some("fs")).unwrap()
    }
}

fn withdrawals(events: &[Event]) -> Vec<WithdrawReason> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ApprovalWithdrawn(w) => Some(w.reason),
            _ => None,
        })
        .collect()
}

fn grants(events: &[Event]) -> Vec<ApprovalGranted> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ApprovalGranted(g) => Some(g.clone()),
            _ => None,
        })
        .collect()
}

/// The call awaiting approval and its digest, as the last approval request
/// recorded it (the same as the call's own).
async fn pending(rt: &Runtime, run: &RunId) -> (warden::engine::CallId, CallDigest) {
    let state = rt.state(run).await.unwrap();
    assert_eq!(state.status(), RunStatus::AwaitingApproval);
    let call = state.next_call().unwrap();
    let requested = rt
        .events(run)
        .await
        .unwrap()
        .into_iter()
        .rev()
        .find_map(|e| match e {
            Event::ApprovalRequested(a) => Some(a),
            _ => None,
        })
        .expect("an approval request");
    assert_eq!(requested.call_id, call.call_id);
    assert_eq!(requested.digest.as_ref(), Some(&call.digest()));
    (call.call_id.clone(), call.digest())
}

#[tokio::test]
async fn an_approval_names_the_call_the_approver_saw_and_a_stale_digest_is_refused() {
    let fx = Fixture::new();
    let agent = approving_agent(&fx);
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("bound")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::AwaitingApproval
    );
    let (call, digest) = pending(&rt, &run).await;
    // The digest shown is the call's: its tool and frozen arguments.
    let state = rt.state(&run).await.unwrap();
    let next = state.next_call().unwrap();
    assert_eq!(next.digest(), digest);
    assert_eq!(
        digest,
        CallDigest::of_call("hostile__fs", &next.call.arguments)
    );
    let before = rt.events(&run).await.unwrap().len();
    let stale = CallDigest::of_call("hostile__fs", &json!({"op": "append"}));
    match rt
        .approve_digest(&run, &call, "alice", Some(stale.as_str()))
        .await
    {
        Err(RuntimeError::DigestMismatch {
            expected, actual, ..
        }) => {
            assert_eq!((expected.as_str(), &actual), (stale.as_str(), &digest));
        }
        other => panic!("expected a digest mismatch, got {other:?}"),
    }
    assert_eq!(
        rt.events(&run).await.unwrap().len(),
        before,
        "nothing recorded"
    );
    rt.approve_digest(&run, &call, "alice", Some(digest.as_str()))
        .await
        .unwrap();
    let granted = grants(&rt.events(&run).await.unwrap());
    assert_eq!(granted.len(), 1);
    assert_eq!(granted[0].digest.as_ref(), Some(&digest));
    assert_eq!(granted[0].rule, None);
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    assert_eq!(fx.effects(), 1);
}

/// An approval in the log naming the digest of other arguments (written
/// behind the engine's back, with a valid chain) approves nothing: the
/// driver records the withdrawal and parks; the write runs only after an
/// approval of the call itself, once.
#[tokio::test]
async fn an_approval_recorded_for_other_arguments_approves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, store) in super::engine::stores(dir.path()) {
        let fx = Fixture::new();
        let agent = approving_agent(&fx);
        let rt = runtime(store.clone());
        let run = rt
            .start(&agent, json!("go"), StartOptions::new().id(id("tampered")))
            .await
            .unwrap();
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::AwaitingApproval
        );
        let (call, digest) = pending(&rt, &run).await;
        let other = CallDigest::of_call(
            "hostile__fs",
            &json!({"op": "append", "path": "/workspace/other.log", "content": "x"}),
        );
        let forged = Event::ApprovalGranted(ApprovalGranted {
            call_id: call.clone(),
            by: "mallory".into(),
            digest: Some(other.clone()),
            rule: None,
            at_ms: None,
        });
        let len = store.load(&run).await.unwrap().len() as u64;
        store
            .append(
                &run,
                len,
                &[Bytes::from(warden::engine::encode(&forged))],
                Listing::new(ListingStatus::RUNNING),
                0,
            )
            .await
            .unwrap();
        // Another host picks the run up.
        let host = runtime(store.clone());
        assert_eq!(
            host.recover(&run, &agent, ReplayOptions::default())
                .await
                .unwrap(),
            RunStatus::AwaitingApproval,
            "{kind}"
        );
        assert_eq!(fx.effects(), 0, "{kind}: the forged approval ran nothing");
        let events = host.events(&run).await.unwrap();
        match events.last().unwrap() {
            Event::ApprovalWithdrawn(w) => {
                assert_eq!(w.reason, WithdrawReason::DigestMismatch, "{kind}");
                assert_eq!(
                    (w.approved.as_ref(), &w.call),
                    (Some(&other), &digest),
                    "{kind}"
                );
            }
            other => panic!("{kind}: expected the withdrawal, got {other:?}"),
        }
        // Replay agrees with the recorded withdrawal.
        assert!(host.verify(&run).await.unwrap().is_intact());
        host.approve(&run, &call, "alice").await.unwrap();
        assert_eq!(
            host.drive(&run, &agent).await.unwrap(),
            RunStatus::Completed
        );
        assert_eq!(fx.effects(), 1, "{kind}: the approved call ran once");
    }
}

#[tokio::test]
async fn a_rule_approves_what_it_matches_and_names_itself_and_its_creator() {
    let fx = Fixture::new();
    let agent = approving_agent(&fx);
    let rt = runtime(Arc::new(MemoryStore::new()));
    // A rule for other paths leaves the call to a human.
    let elsewhere = RuleSpec {
        arguments: BTreeMap::from([("path".to_owned(), "/elsewhere/*".to_owned())]),
        ..appends()
    };
    rt.add_rule(elsewhere, "api:ops", None).await.unwrap();
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("parked")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::AwaitingApproval
    );

    let rule = rt.add_rule(appends(), "api:ops", None).await.unwrap();
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("ruled")))
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    assert_eq!(fx.effects(), 1);
    let events = rt.events(&run).await.unwrap();
    let granted = grants(&events);
    assert_eq!(granted.len(), 1);
    assert_eq!(granted[0].by, format!("rule:{}", rule.id));
    let granting = granted[0].rule.as_ref().unwrap();
    assert_eq!(
        (granting.id.as_str(), granting.created_by.as_str()),
        (rule.id.as_str(), "api:ops")
    );
    // The request (with its preview) is recorded before the grant.
    let at = events
        .iter()
        .position(|e| matches!(e, Event::ApprovalGranted(_)))
        .unwrap();
    assert!(matches!(events[at - 1], Event::ApprovalRequested(_)));
    assert!(rt.verify(&run).await.unwrap().is_intact());
    // Listed with both rules.
    let rules = rt.rules().await.unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[1], rule);
}

/// Crashes the driver right after the append that carries `needle` lands.
struct CrashAfter {
    needle: &'static str,
    done: AtomicBool,
}

#[async_trait]
impl Hooks for CrashAfter {
    async fn before_append(&self, _: AppendVia, _: &RunId, events: &[Bytes]) -> BeforeAppend {
        let hit = events
            .iter()
            .any(|e| String::from_utf8_lossy(e).contains(self.needle));
        if hit && !self.done.swap(true, Ordering::SeqCst) {
            BeforeAppend::WriteThenFail(StoreError::Backend {
                context: "append".into(),
                error: Box::new(std::io::Error::other("injected crash")),
            })
        } else {
            BeforeAppend::Write
        }
    }
}

/// A rule grants the call, the driver dies before the call runs, then
/// the rule lapses (revoked, or its time is up); the host that takes the
/// run over withdraws the approval and parks: nothing runs.
#[tokio::test]
async fn a_rule_that_lapses_before_its_call_runs_approves_nothing() {
    for lapse in ["revoked", "expired"] {
        let fx = Fixture::new();
        let agent = approving_agent(&fx);
        let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
        let clock = Arc::new(TestClock(AtomicU64::new(T0)));
        let first = runtime_at(
            Arc::new(Intercepted {
                inner: store.clone(),
                hooks: CrashAfter {
                    needle: "\"type\":\"approval_granted\"",
                    done: AtomicBool::new(false),
                },
            }),
            clock.clone(),
        );
        let rule = first
            .add_rule(appends(), "api:ops", Some(T0 as i64 + 60_000))
            .await
            .unwrap();
        let run = first
            .start(&agent, json!("go"), StartOptions::new().id(id(lapse)))
            .await
            .unwrap();
        let err = first.drive(&run, &agent).await.unwrap_err();
        assert!(err.to_string().contains("injected crash"), "{lapse}: {err}");
        assert_eq!(grants(&first.events(&run).await.unwrap()).len(), 1);
        assert_eq!(fx.effects(), 0);

        let second = runtime_at(store.clone(), clock.clone());
        match lapse {
            "revoked" => {
                second.revoke_rule(&rule.id, "api:alice").await.unwrap();
            }
            _ => clock.0.store(T0 + 60_000, Ordering::SeqCst),
        }
        assert_eq!(
            second
                .recover(&run, &agent, ReplayOptions::default())
                .await
                .unwrap(),
            RunStatus::AwaitingApproval,
            "{lapse}"
        );
        assert_eq!(fx.effects(), 0, "{lapse}: the lapsed rule ran nothing");
        let want = if lapse == "revoked" {
            WithdrawReason::RuleRevoked
        } else {
            WithdrawReason::RuleExpired
        };
        assert_eq!(
            withdrawals(&second.events(&run).await.unwrap()),
            [want],
            "{lapse}"
        );
        // A lapsed rule grants no new call either.
        let again = second
            .start(
                &agent,
                json!("go"),
                StartOptions::new().id(id(&format!("{lapse}-again"))),
            )
            .await
            .unwrap();
        assert_eq!(
            second.drive(&again, &agent).await.unwrap(),
            RunStatus::AwaitingApproval,
            "{lapse}"
        );
        assert!(grants(&second.events(&again).await.unwrap()).is_empty());
        // A human approves the call itself: it runs, once.
        let (call, _) = pending(&second, &run).await;
        second.approve(&run, &call, "alice").await.unwrap();
        assert_eq!(
            second.drive(&run, &agent).await.unwrap(),
            RunStatus::Completed
        );
        assert_eq!(fx.effects(), 1, "{lapse}");
    }
}

/// Approving for the run makes a rule scoped to it: the next run's call
/// still waits for a human.
#[tokio::test]
async fn an_approval_for_the_run_is_a_rule_scoped_to_it() {
    let fx = Fixture::new();
    let agent = approving_agent(&fx);
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("scoped")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::AwaitingApproval
    );
    let (call, digest) = pending(&rt, &run).await;
    let rule = rt
        .approve_scoped(
            &run,
            &call,
            "alice",
            Some(digest.as_str()),
            warden::engine::ApprovalScope::Run,
            None,
        )
        .await
        .unwrap()
        .expect("a rule for the run");
    assert_eq!(rule.spec.run.as_ref(), Some(&run));
    assert_eq!(
        (rule.spec.plugin.as_deref(), rule.spec.tool.as_deref()),
        (Some("hostile"), Some("fs"))
    );
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    let other = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("other-run")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&other, &agent).await.unwrap(),
        RunStatus::AwaitingApproval
    );
    // Outside any session, a session-wide approval is refused, recording
    // nothing.
    let (call, _) = pending(&rt, &other).await;
    assert!(matches!(
        rt.approve_scoped(
            &other,
            &call,
            "alice",
            None,
            warden::engine::ApprovalScope::Session,
            None
        )
        .await,
        Err(RuntimeError::Rule(_))
    ));
    assert_eq!(rt.rules().await.unwrap().len(), 1);
    assert_eq!(fx.effects(), 1);
}

fn valid() -> ValidUntil {
    ValidUntil::for_next(Duration::from_secs(60))
}

/// The property: for every append of a rule-approved run, at both crash
/// points, a driver holding the run's claim dies there; another driver
/// takes the claim over (a higher fencing token) and recovers the run,
/// with the rule still standing or revoked in between. Whatever the
/// boundary, the write ran at most once; with the rule standing a
/// completed run ran it exactly once; and after the revocation the
/// takeover ran no write at all (a run left parked waits for a human, and
/// approving it then runs the write once).
async fn at_most_once_under_kills_and_takeovers(
    kind: &str,
    open: &dyn Fn(&str) -> Arc<dyn EventStore>,
) {
    let fx = Fixture::new();
    let agent = approving_agent(&fx);
    // The control run counts the appends of an uninterrupted drive, made
    // as the cases make theirs: submitted, then driven under a claim.
    let control_store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let counted = crashing(control_store.clone(), u64::MAX, CrashPoint::BeforeWrite);
    let control = runtime(counted.clone());
    control.add_rule(appends(), "api:ops", None).await.unwrap();
    let run = id("control");
    control
        .submit(&agent, json!("go"), StartOptions::new().id(run.clone()))
        .await
        .unwrap();
    let claim = control_store
        .acquire_claim(&run, "control", super::workers::now_ms(), 60_000)
        .await
        .unwrap();
    assert_eq!(
        control
            .recover_claimed(&agent, ReplayOptions::default(), claim, valid())
            .await
            .unwrap(),
        RunStatus::Completed
    );
    // One append may carry two events (a rule's grant with its request).
    let appends_made = counted.hooks.appends.load(Ordering::SeqCst);
    assert_eq!(fx.effects(), 1);

    let (mut cases, mut parked, mut withdrawn) = (0, 0, 0);
    for at in 0..appends_made {
        for point in [CrashPoint::BeforeWrite, CrashPoint::AfterWrite] {
            for revoke in [false, true] {
                let case = format!("{kind}: crash at append {at} {point:?}, revoked {revoke}");
                let _ = std::fs::remove_file(fx.path("work/effects.log"));
                let store = open(&format!("{at}-{point:?}-{revoke}"));
                let run = id(&format!("case-{at}-{point:?}-{revoke}"));
                let a = runtime(crashing(store.clone(), at, point));
                let rule = a.add_rule(appends(), "api:ops", None).await.unwrap();
                a.submit(&agent, json!("go"), StartOptions::new().id(run.clone()))
                    .await
                    .unwrap();
                let now = super::workers::now_ms();
                let claim_a = store
                    .acquire_claim(&run, "worker-a", now, 60_000)
                    .await
                    .unwrap();
                let err = a
                    .recover_claimed(&agent, ReplayOptions::default(), claim_a.clone(), valid())
                    .await
                    .unwrap_err();
                assert!(err.to_string().contains("injected crash"), "{case}: {err}");
                drop(a);
                let ran_before = fx.effects();
                assert!(ran_before <= 1, "{case}");

                let b = runtime(store.clone());
                if revoke {
                    b.revoke_rule(&rule.id, "api:alice").await.unwrap();
                }
                let claim_b = store
                    .acquire_claim(&run, "worker-b", claim_a.expires_ms, 60_000)
                    .await
                    .unwrap();
                assert!(claim_b.token > claim_a.token, "{case}");
                let outcome = b
                    .recover_claimed(&agent, ReplayOptions::default(), claim_b.clone(), valid())
                    .await;
                let ran = fx.effects();
                assert!(ran <= 1, "{case}: the write ran {ran} times");
                if revoke {
                    assert_eq!(ran, ran_before, "{case}: the revoked rule approved a write");
                }
                match outcome {
                    Ok(RunStatus::Completed) => {
                        assert_eq!(ran, 1, "{case}: completed without its write");
                    }
                    Ok(RunStatus::AwaitingApproval) => {
                        assert!(revoke, "{case}: a standing rule left the call to a human");
                        assert_eq!(ran, 0, "{case}");
                        parked += 1;
                        let events = b.events(&run).await.unwrap();
                        if !withdrawals(&events).is_empty() {
                            // A granted the call; the revocation reached it.
                            assert_eq!(withdrawals(&events), [WithdrawReason::RuleRevoked]);
                            withdrawn += 1;
                        }
                        // A human approves the call itself: it runs, once.
                        let (call, _) = pending(&b, &run).await;
                        b.approve(&run, &call, "alice").await.unwrap();
                        let claim_c = store
                            .acquire_claim(&run, "worker-b", super::workers::now_ms(), 60_000)
                            .await
                            .unwrap();
                        assert_eq!(
                            b.recover_claimed(&agent, ReplayOptions::default(), claim_c, valid())
                                .await
                                .unwrap(),
                            RunStatus::Completed,
                            "{case}"
                        );
                        assert_eq!(fx.effects(), 1, "{case}");
                    }
                    Err(RuntimeError::NeedsReconciliation { write, .. }) => {
                        // The write's intent was recorded: never run again.
                        assert_eq!(write.tool.tool, "fs", "{case}");
                    }
                    other => panic!("{case}: {other:?}"),
                }
                assert!(b.verify(&run).await.unwrap().is_intact(), "{case}");
                // A store shared by the cases keeps no rule of this one live.
                b.revoke_rule(&rule.id, "test").await.unwrap();
                cases += 1;
            }
        }
    }
    assert_eq!(cases as u64, appends_made * 4, "{kind}");
    // Both ways a revocation stops a call were reached: before the rule
    // granted it, and after the grant but before the call ran.
    assert!(
        parked > withdrawn && withdrawn > 0,
        "{kind}: {parked} parked, {withdrawn} withdrawn"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_approved_write_runs_at_most_once_under_kills_and_takeovers_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    at_most_once_under_kills_and_takeovers("sqlite", &move |name| {
        Arc::new(SqliteStore::open(path.join(format!("{name}.db"))).unwrap()) as Arc<dyn EventStore>
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_approved_write_runs_at_most_once_under_kills_and_takeovers_on_postgres() {
    let Some(schema) = PgSchema::new("approvals").await else {
        return;
    };
    // One schema for every case (run ids differ), so the rules of earlier
    // cases are there too, as on a shared store; each case makes its own.
    let store: Arc<dyn EventStore> = Arc::new(schema.store().await);
    at_most_once_under_kills_and_takeovers("postgres", &move |_| store.clone()).await;
}
