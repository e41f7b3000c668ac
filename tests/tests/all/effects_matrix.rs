//! The effect kind × fault matrix (issue 36): every [`EffectKind`] of
//! `warden::fault_model` crossed with every [`Fault`], on SQLite and
//! PostgreSQL, through the real engine, sandbox and stores. The lists are
//! the code's: [`cell`] and [`scenario`] are exhaustive `match`es, so a new
//! kind or fault does not build until its cells are decided.
//!
//! Each kind is a scenario: agent files whose scripted model makes the
//! effect, and what the operator and the application do as the docs say
//! ([`play`]: resolve a dangling write after checking the counter, answer
//! an external call, abandon a run and settle its key). Every write lands
//! as one labelled line in a file outside the sandbox, so what was
//! performed is counted there, never read from the log. Each case then
//! checks the same four things ([`check`]): each write performed at most
//! once (a read or an idempotent call may be made again, a delivery at
//! most twice with one id, as docs/channels.md says), no target torn
//! (every line whole and known), every append the store acknowledged still
//! in the log (and every log intact), and every run ended in a state the
//! docs name.
//!
//! The faults, at the store's boundary ([`Strike`], an intercepting
//! store's hooks):
//! - the driver dies at an append (before it is durable, or after): at
//!   every append of every run in turn; the next process is a new runtime
//!   over the same store. The real binary under real SIGKILLs is `kill`
//!   and `torn_edits`.
//! - one append fails and the same process goes on (a full disk: nothing
//!   written; a server restart: written, never acknowledged), at every
//!   append of every run.
//! - the driver, holding a claim, stops inside the effect (before the
//!   append that opens it, after that append, before the append that
//!   closes it) until its claim has run out; the claim's run is taken
//!   over and finished; then the driver wakes and must change nothing, in
//!   the files or the logs. A local MCP tool is also stopped in the
//!   middle of its server's own (slow) write, the driver's thread blocked
//!   whole as SIGSTOP would block it: only the claim's watchdog can stop
//!   the server then. Real processes stopped with SIGSTOP are `pause`.
//! - the driver learns right after the effect opened that its claim is
//!   gone (its validity revoked) and goes on (a local MCP tool's also
//!   while its server writes): it must make the effect no further and
//!   append nothing.
//!
//! A seeded random walk over the same cases runs outside CI:
//! `WARDEN_MATRIX_ROUNDS=200 cargo test --test all -- --ignored
//! effects_matrix::random` (docs/dev/invariants.md). By hand,
//! `WARDEN_MATRIX_KINDS=<part of a row's name>` plays only those rows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::Notify;
use warden::engine::events::Event;
use warden::engine::{
    Agent, KeyState, ReplayOptions, RuleSpec, RunId, RunStatus, Runtime, RuntimeError, StartOptions,
};
use warden::fault_model::{EffectKind, Fault};
use warden::grant::EffectClass;
use warden::plugins::PluginHost;
use warden::sandbox::ValidUntil;
use warden::store::testing::{AppendVia, BeforeAppend, Hooks, Intercepted};
use warden::store::{Claim, CommitmentFilter, EventStore, MemoryStore, SqliteStore, StoreError};
use warden_tests::guests;

use super::engine::{CrashPoint, Fixture};
use super::mcp_servers::{HttpServer, python};
use super::workers::{PgSchema, now_ms};
use crate::sandbox;

// ---- the cells ----

/// How one fault is tried on one kind.
enum Cell {
    /// At every append of every run the scenario makes, at both points.
    EveryAppend,
    /// At these places inside the effect.
    Inside(&'static [Stop]),
    /// This fault cannot strike this kind, and why.
    Inapplicable(&'static str),
}

/// Where a driver is stopped inside an effect: the first append (of the
/// run named by this suffix of its id, or of any run) carrying an event of
/// `kind`, before it is written or once it is durable.
#[derive(Clone, Copy, Debug)]
struct Stop {
    kind: &'static str,
    run: Option<&'static str>,
    after: bool,
}

const fn before(kind: &'static str) -> Stop {
    Stop {
        kind,
        run: None,
        after: false,
    }
}

const fn after(kind: &'static str) -> Stop {
    Stop {
        kind,
        run: None,
        after: true,
    }
}

const fn in_child(stop: Stop) -> Stop {
    Stop {
        run: Some(".call-1-1"),
        ..stop
    }
}

const TOOL_PAUSES: &[Stop] = &[
    before("tool_call_intent"),
    after("tool_call_intent"),
    before("tool_call_completed"),
];
const TOOL_LOSSES: &[Stop] = &[after("tool_call_intent")];
/// Not at an append: while the local MCP server is in the middle of its
/// (slow) write, a process of its own that a stopped driver does not stop.
const IN_MCP_CALL: Stop = Stop {
    kind: "inside the MCP server's write",
    run: None,
    after: false,
};
const MCP_LOCAL_PAUSES: &[Stop] = &[
    before("tool_call_intent"),
    after("tool_call_intent"),
    IN_MCP_CALL,
    before("tool_call_completed"),
];
const MCP_LOCAL_LOSSES: &[Stop] = &[after("tool_call_intent"), IN_MCP_CALL];
const CHILD_PAUSES: &[Stop] = &[
    before("child_started"),
    after("child_started"),
    in_child(after("tool_call_intent")),
    in_child(before("tool_call_completed")),
    before("child_finished"),
];
const CHILD_LOSSES: &[Stop] = &[after("child_started"), in_child(after("tool_call_intent"))];
const DELIVERY_PAUSES: &[Stop] = &[
    before("delivery_intent"),
    after("delivery_intent"),
    before("delivery_completed"),
];
const DELIVERY_LOSSES: &[Stop] = &[after("delivery_intent")];
const EXTERNAL_PAUSES: &[Stop] = &[
    before("external_call_requested"),
    after("external_call_requested"),
];
const EXTERNAL_LOSSES: &[Stop] = &[after("external_call_requested")];

/// The matrix. Each arm decides one cell; the `match` is exhaustive.
fn cell(kind: EffectKind, fault: Fault) -> Cell {
    use EffectKind as K;
    use Fault as F;
    match (kind, fault) {
        (_, F::KillBeforeAppend | F::KillAfterAppend | F::StoreFailure) => Cell::EveryAppend,
        (K::PluginTool(_) | K::KeyedWrite | K::RuleApproval, F::PausePastClaim) => {
            Cell::Inside(TOOL_PAUSES)
        }
        (K::PluginTool(_) | K::KeyedWrite | K::RuleApproval, F::ClaimLost) => {
            Cell::Inside(TOOL_LOSSES)
        }
        // A local server is stopped with the claim (its watchdog kills it)
        // in the middle of its write too.
        (K::McpLocalTool, F::PausePastClaim) => Cell::Inside(MCP_LOCAL_PAUSES),
        (K::McpLocalTool, F::ClaimLost) => Cell::Inside(MCP_LOCAL_LOSSES),
        // A remote server is not: a request it has received it may carry
        // out whatever the driver does (the limit docs/operations.md
        // states, as for a plugin's HTTP request in flight); the driver's
        // part is checked at every append around it.
        (K::McpRemoteTool, F::PausePastClaim) => Cell::Inside(TOOL_PAUSES),
        (K::McpRemoteTool, F::ClaimLost) => Cell::Inside(TOOL_LOSSES),
        (K::ChildRun | K::ChildBatch, F::PausePastClaim) => Cell::Inside(CHILD_PAUSES),
        (K::ChildRun | K::ChildBatch, F::ClaimLost) => Cell::Inside(CHILD_LOSSES),
        (K::Delivery, F::PausePastClaim) => Cell::Inside(DELIVERY_PAUSES),
        (K::Delivery, F::ClaimLost) => Cell::Inside(DELIVERY_LOSSES),
        (K::ExternalTool, F::PausePastClaim) => Cell::Inside(EXTERNAL_PAUSES),
        (K::ExternalTool, F::ClaimLost) => Cell::Inside(EXTERNAL_LOSSES),
        (K::KeySettlement, F::PausePastClaim | F::ClaimLost) => Cell::Inapplicable(
            "`keys settle` is an operator's verb and holds no claim: its one append is \
             conditional on the key still being orphaned (kills and store failures strike it); \
             a driver paused around the keyed write is the keyed write's row",
        ),
    }
}

// ---- the scenarios ----

/// How often one labelled effect may be performed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Repeat {
    /// A write: at most once, and exactly once unless an operator resolved
    /// it.
    AtMostOnce,
    /// A read or an idempotent call: made again after a fault.
    Again,
    /// A delivery: at least once, made again with the same id when the
    /// process died while the channel ran (docs/channels.md).
    AtLeastOnceById,
}

/// One effect kind, ready to play.
struct Scenario {
    kind: EffectKind,
    fx: Fixture,
    /// The agent of every root run.
    agent: Agent,
    /// The runs the application starts, in order.
    roots: Vec<RunId>,
    repeat: Repeat,
    /// Every label a write of this scenario writes.
    labels: BTreeSet<String>,
    /// The remote MCP server, stopped with the scenario.
    _server: Option<HttpServer>,
}

/// An agent whose one call appends `m` to `out/notes.log` through the test
/// MCP server (`tests/mcp/server.py`): run by Warden in its OS sandbox, or
/// `remote`, served over HTTP by a process started here.
pub(crate) fn mcp_agent(fx: &Fixture, remote: bool) -> (Agent, Option<HttpServer>) {
    let (python, base) = python();
    let d = fx.dir.path();
    for sub in ["data", "out", "srv"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::copy(repo.join("tests/mcp/server.py"), d.join("srv/server.py")).unwrap();
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap().display().to_string();
    let (table, server) = if remote {
        let server = HttpServer::serve(d, None);
        (
            format!(
                "url = \"{}\"\nhosts = [\"127.0.0.1:{}\"]\n",
                server.url(),
                server.port
            ),
            Some(server),
        )
    } else {
        // Through the venv's real directory (it may be a link).
        let venv = std::fs::canonicalize(python.parent().unwrap().parent().unwrap()).unwrap();
        (
            format!(
                "command = \"{}\"\nargs = [\"{}/server.py\", \"{}\", \"{}\"]\nread = [\"data\", \"srv\", \"{}\", \"{}\"]\nwrite = [\"out\"]\n",
                venv.join("bin/python").display(),
                canon(&d.join("srv")),
                canon(&d.join("data")),
                canon(&d.join("out")),
                venv.display(),
                canon(&base),
            ),
            None,
        )
    };
    let agent = agent_file(
        fx,
        "mcp-user",
        &one_call(
            "notes__append_note",
            "{ name = \"notes.log\", line = \"m\" }",
        ),
        &format!(
            "[mcp_servers.notes]\n{table}timeout = \"20s\"\n[mcp_servers.notes.tools.append_note]\napproval = \"never\"\n"
        ),
    );
    (agent, server)
}

fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

/// One turn calling `tool` with `arguments` (TOML inline table), then an
/// answer.
fn one_call(tool: &str, arguments: &str) -> String {
    format!(
        "[[turns]]\ntext = \"Working.\"\n[[turns.tool_calls]]\nname = \"{tool}\"\narguments = {arguments}\n\n[[turns]]\ntext = \"Done.\"\n"
    )
}

/// An append of `label` to the counter, as `hostile__fs` arguments.
fn append(label: &str, extra: &str) -> String {
    format!(
        "{{ op = \"append\", path = \"/workspace/effects.log\", content = \"{label}\\n\"{extra} }}"
    )
}

/// The hostile guest over `work/`, with `approval` and `rest` (grant
/// tables).
fn hostile(approval: &str, rest: &str) -> String {
    format!(
        "[plugins.hostile]\nsource = \"hostile.toml\"\n{approval}\n[plugins.hostile.grant.mounts.workspace]\ndir = \"work\"\n{rest}\n"
    )
}

/// Writes `<name>.toml` (scripted by `<name>.transcript.toml`, holding
/// `turns`) with `body`; loads it.
fn agent_file(fx: &Fixture, name: &str, turns: &str, body: &str) -> Agent {
    std::fs::write(fx.path(&format!("{name}.transcript.toml")), turns).unwrap();
    std::fs::write(
        fx.path(&format!("{name}.toml")),
        format!(
            "name = \"{name}\"\ninstructions = \"Make the effect.\"\n\n[model]\nprovider = \"scripted\"\nname = \"script\"\ntranscript = \"{name}.transcript.toml\"\n\n{body}"
        ),
    )
    .unwrap();
    Agent::load(&fx.path(&format!("{name}.toml")), None).unwrap()
}

const NO_APPROVAL: &str = "approval = { fs = \"never\", write_then_sleep = \"never\" }";

/// The scenario of `kind` (the `match` is exhaustive: a new kind does not
/// build until it has one).
fn scenario(kind: EffectKind) -> Scenario {
    let fx = Fixture::new();
    let one = |agent: Agent, repeat: Repeat, labels: &[&str]| {
        (
            agent,
            vec![id("r")],
            repeat,
            labels
                .iter()
                .map(|s| s.to_string())
                .collect::<BTreeSet<_>>(),
        )
    };
    let mut server_slot = None;
    let (agent, roots, repeat, labels) = match kind {
        EffectKind::PluginTool(class) => {
            let agent = agent_file(
                &fx,
                "tool",
                &one_call("hostile__fs", &append("w", "")),
                &hostile(
                    NO_APPROVAL,
                    &format!("[plugins.hostile.grant.tools.fs]\neffect = \"{class}\"\n"),
                ),
            );
            let repeat = match class {
                EffectClass::Write => Repeat::AtMostOnce,
                EffectClass::Read | EffectClass::Idempotent => Repeat::Again,
            };
            one(agent, repeat, &["w"])
        }
        EffectKind::KeyedWrite => {
            let agent = agent_file(
                &fx,
                "payer",
                &one_call("hostile__fs", &append("paid", ", claim_id = \"k-1\"")),
                &hostile(
                    NO_APPROVAL,
                    "[plugins.hostile.grant.tools.fs]\nidempotency_key = \"claim_id\"\n",
                ),
            );
            let (agent, _, repeat, labels) = one(agent, Repeat::AtMostOnce, &["paid"]);
            (agent, vec![id("a"), id("b")], repeat, labels)
        }
        EffectKind::KeySettlement => {
            let agent = agent_file(
                &fx,
                "payer",
                &one_call(
                    "hostile__write_then_sleep",
                    "{ path = \"/workspace/effects.log\", content = \"paid\\n\", claim_id = \"k-2\" }",
                ),
                &hostile(
                    NO_APPROVAL,
                    "[plugins.hostile.grant.limits]\ntimeout = \"300ms\"\n[plugins.hostile.grant.tools.write_then_sleep]\nidempotency_key = \"claim_id\"\n",
                ),
            );
            let (agent, _, repeat, labels) = one(agent, Repeat::AtMostOnce, &["paid"]);
            (agent, vec![id("a"), id("b")], repeat, labels)
        }
        EffectKind::RuleApproval => {
            // No approval table: the write asks, and the rule answers.
            let agent = agent_file(
                &fx,
                "ruled",
                &one_call("hostile__fs", &append("w", "")),
                &hostile("", ""),
            );
            one(agent, Repeat::AtMostOnce, &["w"])
        }
        EffectKind::ChildRun | EffectKind::ChildBatch => {
            let workers: &[&str] = if kind == EffectKind::ChildRun {
                &["w1"]
            } else {
                &["w1", "w2"]
            };
            let mut calls = String::new();
            let mut tables = String::new();
            for w in workers {
                agent_file(
                    &fx,
                    w,
                    &one_call("hostile__fs", &append(w, "")),
                    &hostile(NO_APPROVAL, ""),
                );
                calls.push_str(&format!(
                    "[[turns.tool_calls]]\nname = \"{w}\"\narguments = {{ task = \"write\" }}\n"
                ));
                tables.push_str(&format!(
                    "[agents.{w}]\nagent = \"{w}.toml\"\ndescription = \"Writes\"\n"
                ));
            }
            let agent = agent_file(
                &fx,
                "parent",
                &format!(
                    "[[turns]]\ntext = \"Delegating.\"\n{calls}\n[[turns]]\ntext = \"Delegated.\"\n"
                ),
                &tables,
            );
            one(agent, Repeat::AtMostOnce, workers)
        }
        EffectKind::Delivery => {
            std::fs::create_dir(fx.path("outbox")).unwrap();
            crate::plugin_manifest(
                fx.dir.path(),
                "test-channel",
                "channel",
                guests::CHANNEL,
                "[mounts.outbox]\naccess = \"read-write\"\n",
            );
            let agent = agent_file(
                &fx,
                "notifier",
                "[[turns]]\ntext = \"The answer is 42.\"\n",
                "[plugins.outbox]\nsource = \"test-channel.toml\"\n[plugins.outbox.grant.mounts.outbox]\ndir = \"outbox\"\n\n[channels.notify]\nplugin = \"outbox\"\n",
            );
            one(agent, Repeat::AtLeastOnceById, &[])
        }
        EffectKind::ExternalTool => {
            let agent = agent_file(
                &fx,
                "invoicer",
                super::effects::PAY_INVOICE,
                super::effects::EXTERNAL,
            );
            one(agent, Repeat::AtMostOnce, &["invoice inv-1"])
        }
        EffectKind::McpLocalTool | EffectKind::McpRemoteTool => {
            let (agent, server) = mcp_agent(&fx, kind == EffectKind::McpRemoteTool);
            server_slot = server;
            one(agent, Repeat::AtMostOnce, &["m"])
        }
    };
    Scenario {
        kind,
        fx,
        agent,
        roots,
        repeat,
        labels,
        _server: server_slot,
    }
}

impl Scenario {
    /// What was performed, counted outside the sandbox: each labelled
    /// line of the counter, each delivery by its id, each payment the
    /// application made. Panics on a line that is not whole and known (a
    /// torn target).
    fn performed(&self) -> BTreeMap<String, usize> {
        let mut seen = BTreeMap::new();
        for file in ["work/effects.log", "work/paid.log", "out/notes.log"] {
            let text = std::fs::read_to_string(self.fx.path(file)).unwrap_or_default();
            assert!(
                text.is_empty() || text.ends_with('\n'),
                "{file} ends in a torn line: {text:?}"
            );
            for line in text.lines() {
                assert!(
                    self.labels.contains(line),
                    "{file} holds a line no write makes: {line:?}"
                );
                *seen.entry(line.to_owned()).or_default() += 1;
            }
        }
        let outbox =
            std::fs::read_to_string(self.fx.path("outbox/deliveries.jsonl")).unwrap_or_default();
        for line in outbox.lines() {
            let delivery: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a torn delivery line {line:?}: {e}"));
            let id = delivery["id"].as_str().expect("a delivery's id").to_owned();
            *seen.entry(format!("delivery {id}")).or_default() += 1;
        }
        seen
    }

    /// What `check` allows to be performed after the operator resolved
    /// `resolved` writes by hand.
    fn check_performed(&self, resolved: u64, case: &str) {
        let performed = self.performed();
        match self.repeat {
            Repeat::AtMostOnce => {
                for label in &self.labels {
                    let n = performed.get(label).copied().unwrap_or(0);
                    assert!(n <= 1, "{case}: `{label}` performed {n} times");
                    if resolved == 0 {
                        assert_eq!(n, 1, "{case}: `{label}` recorded but not performed");
                    }
                }
            }
            Repeat::Again => {
                for label in &self.labels {
                    let n = performed.get(label).copied().unwrap_or(0);
                    assert!(n >= 1, "{case}: `{label}` never made");
                }
            }
            Repeat::AtLeastOnceById => {
                assert!(!performed.is_empty(), "{case}: nothing delivered");
                for (id, n) in &performed {
                    assert!(*n <= 2, "{case}: `{id}` delivered {n} times");
                }
            }
        }
    }
}

// ---- what the application and the operator do ----

fn runtime(store: Arc<dyn EventStore>) -> Runtime {
    Runtime::new(store, PluginHost::new(sandbox().clone()))
        .with_commitment_wait(Duration::from_secs(5))
}

/// The rule the operator adds for [`EffectKind::RuleApproval`]: appends
/// under the workspace.
fn rule() -> RuleSpec {
    RuleSpec {
        arguments: BTreeMap::from([
            ("op".to_owned(), "append".to_owned()),
            ("path".to_owned(), "/workspace/*".to_owned()),
        ]),
        ..RuleSpec::for_tool(Some("hostile"), Some("fs")).unwrap()
    }
}

/// What has to be in place before a root is driven.
async fn prepare(sc: &Scenario, rt: &Runtime) -> Result<(), RuntimeError> {
    if sc.kind == EffectKind::RuleApproval && rt.rules().await?.is_empty() {
        rt.add_rule(rule(), "ops", None).await?;
    }
    Ok(())
}

/// Drives `run` once, as `runs resume` would; a dangling write is not an
/// error here (the state says so next).
async fn drive(sc: &Scenario, rt: &Runtime, run: &RunId) -> Result<(), RuntimeError> {
    match rt.recover(run, &sc.agent, ReplayOptions::default()).await {
        Ok(_) | Err(RuntimeError::NeedsReconciliation { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The operator reconciles `run`'s dangling write as the docs say: checks
/// the counter and records what it holds; for the key settlement, gives up
/// on the holder and settles its key.
async fn reconcile(sc: &Scenario, rt: &Runtime, run: &RunId) -> Result<(), RuntimeError> {
    if sc.kind == EffectKind::KeySettlement && *run == sc.roots[0] {
        return rt.abandon(run, "ops", "the payment provider is down").await;
    }
    let lines = sc.performed().values().sum::<usize>();
    rt.resolve(
        run,
        json!({ "checked": lines }),
        "ops",
        Some("checked the counter".into()),
    )
    .await
}

/// The application and the operator, from whatever the store holds to the
/// end of every root: start what is not started, drive, reconcile, answer
/// external calls, settle orphaned keys. Returns how many writes the
/// operator resolved by hand; stops at the first error.
async fn play(sc: &Scenario, rt: &Runtime) -> Result<u64, RuntimeError> {
    prepare(sc, rt).await?;
    let mut resolved = 0;
    for root in &sc.roots {
        let mut ended = false;
        for _ in 0..24 {
            let Ok(summary) = rt.store().summary(root).await else {
                rt.start(&sc.agent, json!("go"), StartOptions::new().id(root.clone()))
                    .await?;
                continue;
            };
            let state = rt.state(root).await?;
            match state.status() {
                RunStatus::Completed if summary.owes_deliveries == 0 => {
                    ended = true;
                    break;
                }
                RunStatus::Abandoned if sc.kind == EffectKind::KeySettlement => {
                    settle_orphaned(rt).await?;
                    ended = true;
                    break;
                }
                RunStatus::NeedsReconciliation => {
                    reconcile(sc, rt, root).await?;
                    resolved += 1;
                }
                RunStatus::AwaitingChild => {
                    let children: Vec<RunId> =
                        state.children_in_flight().map(|(_, c)| c.clone()).collect();
                    for child in children {
                        if rt.state(&child).await?.status() == RunStatus::NeedsReconciliation {
                            reconcile(sc, rt, &child).await?;
                            resolved += 1;
                        }
                    }
                    drive(sc, rt, root).await?;
                }
                RunStatus::AwaitingExternal => {
                    pay_and_report(sc, rt, root).await?;
                }
                RunStatus::Running | RunStatus::Waiting | RunStatus::Completed => {
                    drive(sc, rt, root).await?;
                }
                other => panic!("{root} is {other:?}, which no scenario here leads to"),
            }
        }
        assert!(ended, "{root} never ended");
    }
    Ok(resolved)
}

/// The application performs the external call the run waits for, unless
/// its ledger shows it did already (it keys its ledger by call id, as
/// docs/external-tools.md asks), then reports it.
async fn pay_and_report(sc: &Scenario, rt: &Runtime, run: &RunId) -> Result<(), RuntimeError> {
    let events = rt.events(run).await?;
    let request = events
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::ExternalCallRequested(r) => Some(r.clone()),
            _ => None,
        })
        .expect("a run awaiting an external call has its request");
    let ledger = sc.fx.path("work/paid.log");
    let paid = sc.fx.path("work/paid.ids");
    let ids = std::fs::read_to_string(&paid).unwrap_or_default();
    if !ids.lines().any(|l| l == request.call_id.as_str()) {
        use std::io::Write as _;
        let open = |p: &std::path::Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .unwrap()
        };
        writeln!(open(&ledger), "invoice inv-1").unwrap();
        writeln!(open(&paid), "{}", request.call_id.as_str()).unwrap();
    }
    rt.complete_external(
        run,
        &request.call_id,
        json!({ "invoice_id": "inv-1", "status": "paid" }),
        Some("billing".into()),
    )
    .await
}

/// `keys settle` for every orphaned key: the operator checked that the
/// payment went through.
async fn settle_orphaned(rt: &Runtime) -> Result<(), RuntimeError> {
    for key in rt.keys(&CommitmentFilter::new()).await? {
        if key.state == KeyState::Orphaned {
            rt.settle_key(
                &key.key,
                json!({ "paid": true }),
                "ops",
                Some("in the ledger".into()),
            )
            .await?;
        }
    }
    Ok(())
}

// ---- the faults ----

/// What a [`Strike`] does.
#[derive(Clone, Debug)]
enum Plan {
    /// Nothing: counts each run's appends.
    Count,
    /// The driver dies at the `at`-th append of `run`; every append after
    /// fails, whichever run makes it.
    Kill {
        run: RunId,
        at: u64,
        point: CrashPoint,
    },
    /// The `at`-th append of `run` fails; the store works again after.
    Fail {
        run: RunId,
        at: u64,
        point: CrashPoint,
    },
    /// The driver stops at `stop` until released.
    Stop(Stop),
}

/// The intercepting store's hooks for one case.
struct Strike {
    plan: Plan,
    /// Appends seen, per run.
    seen: Mutex<BTreeMap<RunId, u64>>,
    struck: AtomicBool,
    /// Every append the store acknowledged: the run and each event.
    acked: Mutex<Vec<(RunId, Bytes)>>,
    /// The append written but reported failed.
    unacked: Mutex<Option<Vec<Bytes>>>,
    /// The stop was reached.
    reached: Notify,
    /// The stopped driver may go on.
    release: Notify,
    released: AtomicBool,
    /// Appends written after the release.
    late: AtomicU64,
}

impl Strike {
    fn new(plan: Plan) -> Strike {
        Strike {
            plan,
            seen: Mutex::default(),
            struck: AtomicBool::new(false),
            acked: Mutex::default(),
            unacked: Mutex::default(),
            reached: Notify::new(),
            release: Notify::new(),
            released: AtomicBool::new(false),
            late: AtomicU64::new(0),
        }
    }

    fn carries(stop: &Stop, run: &RunId, events: &[Bytes]) -> bool {
        stop.run.is_none_or(|suffix| run.as_str().ends_with(suffix))
            && events.iter().any(|bytes| {
                warden::engine::decode(bytes).is_ok_and(|e| e.kind().as_str() == stop.kind)
            })
    }

    async fn stop_here(&self) {
        self.reached.notify_one();
        self.release.notified().await;
        self.released.store(true, Ordering::SeqCst);
    }
}

fn injected(what: &str) -> StoreError {
    StoreError::Backend {
        context: "append".into(),
        error: Box::new(std::io::Error::other(format!("injected {what}"))),
    }
}

#[async_trait]
impl Hooks for Strike {
    async fn before_append(&self, _: AppendVia, run_id: &RunId, events: &[Bytes]) -> BeforeAppend {
        let n = {
            let mut seen = self.seen.lock().unwrap();
            let n = seen.entry(run_id.clone()).or_default();
            *n += 1;
            *n - 1
        };
        match &self.plan {
            Plan::Count => BeforeAppend::Write,
            Plan::Kill { run, at, point } => {
                if self.struck.load(Ordering::SeqCst) {
                    return BeforeAppend::Fail(injected("crash"));
                }
                if run != run_id || n != *at {
                    return BeforeAppend::Write;
                }
                self.struck.store(true, Ordering::SeqCst);
                match point {
                    CrashPoint::BeforeWrite => BeforeAppend::Fail(injected("crash")),
                    CrashPoint::AfterWrite => {
                        *self.unacked.lock().unwrap() = Some(events.to_vec());
                        BeforeAppend::WriteThenFail(injected("crash"))
                    }
                }
            }
            Plan::Fail { run, at, point } => {
                if run != run_id || n != *at || self.struck.swap(true, Ordering::SeqCst) {
                    return BeforeAppend::Write;
                }
                match point {
                    CrashPoint::BeforeWrite => {
                        BeforeAppend::Fail(injected("store failure: no space left on device"))
                    }
                    CrashPoint::AfterWrite => {
                        *self.unacked.lock().unwrap() = Some(events.to_vec());
                        BeforeAppend::WriteThenFail(injected(
                            "store failure: the server restarted before acknowledging the commit",
                        ))
                    }
                }
            }
            Plan::Stop(stop) => {
                if !stop.after
                    && Strike::carries(stop, run_id, events)
                    && !self.struck.swap(true, Ordering::SeqCst)
                {
                    self.stop_here().await;
                }
                BeforeAppend::Write
            }
        }
    }

    fn after_append(&self, _: AppendVia, run_id: &RunId, events: &[Bytes]) {
        if self.released.load(Ordering::SeqCst) {
            self.late.fetch_add(1, Ordering::SeqCst);
        }
        let mut unacked = self.unacked.lock().unwrap();
        if unacked.as_deref() == Some(events) {
            *unacked = None;
            return;
        }
        let mut acked = self.acked.lock().unwrap();
        for bytes in events {
            acked.push((run_id.clone(), bytes.clone()));
        }
    }

    async fn before_acknowledge(&self, _: AppendVia, run_id: &RunId, events: &[Bytes]) {
        if let Plan::Stop(stop) = &self.plan
            && stop.after
            && Strike::carries(stop, run_id, events)
            && !self.struck.swap(true, Ordering::SeqCst)
        {
            self.stop_here().await;
        }
    }
}

/// A fresh store of `kind` for one case, and the schema to drop after it.
async fn fresh(kind: &str, fx: &Fixture, case: u64) -> (Arc<dyn EventStore>, Option<PgSchema>) {
    match kind {
        "sqlite" => (
            Arc::new(SqliteStore::open(fx.path(&format!("matrix-{case}.db"))).unwrap()),
            None,
        ),
        "postgres" => {
            let pg = PgSchema::new("matrix").await.expect(
                "PostgreSQL is required for the matrix (.ci/run starts it; \
                 WARDEN_SKIP_POSTGRES=1 skips before this point)",
            );
            (Arc::new(pg.store().await), Some(pg))
        }
        other => panic!("no store `{other}`"),
    }
}

/// Removes what the last case performed.
fn reset(sc: &Scenario) {
    for file in [
        "work/effects.log",
        "work/paid.log",
        "work/paid.ids",
        "outbox/deliveries.jsonl",
        "out/notes.log",
        "out/append-started",
        "data/delay",
    ] {
        let _ = std::fs::remove_file(sc.fx.path(file));
    }
}

/// The four checks every case ends with.
async fn check(
    sc: &Scenario,
    store: &Arc<dyn EventStore>,
    strike: &Strike,
    resolved: u64,
    case: &str,
) {
    let rt = runtime(store.clone());
    for (n, root) in sc.roots.iter().enumerate() {
        let summary = store.summary(root).await.unwrap();
        let status = rt.state(root).await.unwrap().status();
        let expected = if sc.kind == EffectKind::KeySettlement && n == 0 {
            RunStatus::Abandoned
        } else {
            RunStatus::Completed
        };
        assert_eq!(status, expected, "{case}: {root}");
        assert_eq!(summary.owes_deliveries, 0, "{case}: {root} owes deliveries");
    }
    let acked = strike.acked.lock().unwrap().clone();
    let mut logs: BTreeMap<RunId, Vec<Bytes>> = BTreeMap::new();
    for run in store.run_ids().await.unwrap() {
        assert!(
            store.verify(&run).await.unwrap().is_intact(),
            "{case}: {run}'s log is not intact"
        );
        let events = store.load(&run).await.unwrap();
        logs.insert(run, events.into_iter().map(|e| e.bytes).collect());
    }
    for (run, bytes) in &acked {
        assert!(
            logs.get(run).is_some_and(|log| log.contains(bytes)),
            "{case}: an event of {run} the store acknowledged is gone"
        );
    }
    if sc.kind == EffectKind::ExternalTool {
        let requests = rt
            .events(&sc.roots[0])
            .await
            .unwrap()
            .iter()
            .filter(|e| matches!(e, Event::ExternalCallRequested(_)))
            .count();
        assert_eq!(
            requests, 1,
            "{case}: the external call was requested {requests} times"
        );
    }
    sc.check_performed(resolved, case);
}

/// Each run's appends in an uninterrupted play, on a memory store.
async fn appends_per_run(sc: &Scenario) -> Vec<(RunId, u64)> {
    reset(sc);
    let strike = Arc::new(Intercepted {
        inner: Arc::new(MemoryStore::new()) as Arc<dyn EventStore>,
        hooks: Strike::new(Plan::Count),
    });
    let resolved = play(sc, &runtime(strike.clone())).await.unwrap();
    let by_design = u64::from(sc.kind == EffectKind::KeySettlement);
    assert_eq!(resolved, by_design, "{:?}: uninterrupted", sc.kind);
    let seen = strike.hooks.seen.lock().unwrap().clone();
    seen.into_iter().collect()
}

/// Kills or store failures at every append of every run: the cases run.
async fn every_append(
    sc: &Scenario,
    appends: &[(RunId, u64)],
    store: &str,
    fault: Fault,
    counter: &mut u64,
) -> u64 {
    let mut cases = 0;
    for (run, appends) in appends {
        for at in 0..*appends {
            let points: &[CrashPoint] = match fault {
                Fault::KillBeforeAppend => &[CrashPoint::BeforeWrite],
                Fault::KillAfterAppend => &[CrashPoint::AfterWrite],
                _ => &[CrashPoint::BeforeWrite, CrashPoint::AfterWrite],
            };
            for point in points {
                let plan = if fault == Fault::StoreFailure {
                    Plan::Fail {
                        run: run.clone(),
                        at,
                        point: *point,
                    }
                } else {
                    Plan::Kill {
                        run: run.clone(),
                        at,
                        point: *point,
                    }
                };
                *counter += 1;
                let case = format!(
                    "{store}: {} × {} at append {at} of {run} ({point:?})",
                    sc.kind.name(),
                    fault.name()
                );
                one_append_case(sc, store, plan, fault, *counter, &case).await;
                cases += 1;
            }
        }
    }
    cases
}

async fn one_append_case(
    sc: &Scenario,
    store_kind: &str,
    plan: Plan,
    fault: Fault,
    n: u64,
    case: &str,
) {
    reset(sc);
    let (store, _pg) = fresh(store_kind, &sc.fx, n).await;
    let struck = Arc::new(Intercepted {
        inner: store.clone(),
        hooks: Strike::new(plan),
    });
    let first = runtime(struck.clone());
    let mut resolved = 0;
    match play(sc, &first).await {
        Err(e) => assert!(e.to_string().contains("injected"), "{case}: {e}"),
        Ok(r) if fault == Fault::StoreFailure => resolved += r,
        Ok(_) => panic!("{case}: the driver went on past its death"),
    }
    let next = if fault == Fault::StoreFailure {
        // The same process goes on, as `runs resume` would.
        first
    } else {
        drop(first);
        runtime(store.clone())
    };
    resolved += play(sc, &next)
        .await
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    check(sc, &store, &struck.hooks, resolved, case).await;
}

/// A claim's life in the stop cases: long enough for a loaded machine to
/// reach the stop, short enough that the matrix stays quick.
const CLAIM: Duration = Duration::from_millis(1500);

/// A driver holding a claim on the first root is stopped at `stop`; for a
/// pause, its claim runs out, the run is taken over and finished, then it
/// wakes; for a lost claim, its validity is revoked and it goes on.
async fn stop_case(sc: &Scenario, store_kind: &str, stop: Stop, lost: bool, n: u64, case: &str) {
    let in_call = stop.kind == IN_MCP_CALL.kind;
    if in_call && !lost {
        return stopped_in_mcp_call(sc, store_kind, n, case).await;
    }
    reset(sc);
    if in_call {
        slow_mcp_writes(sc);
    }
    let (store, _pg) = fresh(store_kind, &sc.fx, n).await;
    let struck = Arc::new(Intercepted {
        inner: store.clone(),
        hooks: Strike::new(Plan::Stop(stop)),
    });
    let first = runtime(struck.clone());
    let root = sc.roots[0].clone();
    prepare(sc, &first).await.unwrap();
    first
        .start(&sc.agent, json!("go"), StartOptions::new().id(root.clone()))
        .await
        .unwrap();
    let claim = store
        .acquire_claim(&root, "paused", now_ms(), CLAIM.as_millis() as i64)
        .await
        .unwrap();
    let valid = ValidUntil::for_next(CLAIM);
    let driving = tokio::spawn({
        let (first, agent, claim, valid) = (
            first.clone(),
            sc.agent.clone(),
            claim.clone(),
            valid.clone(),
        );
        async move {
            first
                .recover_claimed(&agent, ReplayOptions::default(), claim, valid)
                .await
        }
    });
    loop {
        tokio::select! {
            () = struck.hooks.reached.notified(), if !in_call => break,
            () = tokio::time::sleep(Duration::from_millis(10)) => {
                if in_call && mcp_write_started(sc) {
                    break;
                }
                assert!(
                    !driving.is_finished(),
                    "{case}: the driver ended before it reached the stop (within its {CLAIM:?} claim)"
                );
            }
        }
    }
    let reached = Instant::now();
    let performed_at_stop = sc.performed();
    let mut resolved = 0;
    if lost {
        let logs_at_stop = logs(&store).await;
        valid.revoke();
        struck.hooks.release.notify_one();
        // It may end either way (a parked run has nothing left to do);
        // what it must not do is go on.
        let _ = driving.await.unwrap();
        if in_call {
            // Past the time its server's write was due.
            tokio::time::sleep(
                (MCP_DELAY + Duration::from_millis(500)).saturating_sub(reached.elapsed()),
            )
            .await;
            assert!(
                logs(&store).await == logs_at_stop,
                "{case}: appended after it lost its claim"
            );
        }
        assert_eq!(
            struck.hooks.late.load(Ordering::SeqCst),
            0,
            "{case}: appended after it lost its claim"
        );
        assert_eq!(
            sc.performed(),
            performed_at_stop,
            "{case}: went on with the effect"
        );
        // The claim is gone: another takes the run.
        let _ = store.release_claim(&claim, None).await;
        let next = runtime(store.clone());
        resolved += play(sc, &next)
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"));
    } else {
        // Stopped past its claim; then the run is taken over.
        let expires = claim.expires_ms;
        while now_ms() <= expires {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let next = runtime(store.clone());
        resolved += play(sc, &next)
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        let performed = sc.performed();
        let mut logs = Vec::new();
        for run in store.run_ids().await.unwrap() {
            logs.push(store.load(&run).await.unwrap());
        }
        struck.hooks.release.notify_one();
        tokio::time::timeout(Duration::from_secs(60), driving)
            .await
            .unwrap_or_else(|_| panic!("{case}: the woken driver never ended"))
            .unwrap()
            .ok();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            sc.performed(),
            performed,
            "{case}: the woken driver made an effect"
        );
        let mut after = Vec::new();
        for run in store.run_ids().await.unwrap() {
            after.push(store.load(&run).await.unwrap());
        }
        assert!(after == logs, "{case}: the woken driver changed a log");
    }
    check(sc, &store, &struck.hooks, resolved, case).await;
}

/// How long the local MCP server takes over its write in the cases
/// stopped inside it: longer than the claim, a takeover and a
/// reconciliation (the server is started again for the next driver), so
/// a write that is not stopped lands after the operator looked.
const MCP_DELAY: Duration = Duration::from_secs(15);

/// Makes the MCP server's appends slow ([`MCP_DELAY`]; `tests/mcp/server.py`
/// reads `data/delay`).
fn slow_mcp_writes(sc: &Scenario) {
    std::fs::write(sc.fx.path("data/delay"), MCP_DELAY.as_secs().to_string()).unwrap();
}

/// Whether the slow MCP write has started (the server says so first); the
/// next call is quick again.
fn mcp_write_started(sc: &Scenario) -> bool {
    let started = sc.fx.path("out/append-started").exists();
    if started {
        let _ = std::fs::remove_file(sc.fx.path("data/delay"));
    }
    started
}

/// Every run's log in `store`.
async fn logs(store: &Arc<dyn EventStore>) -> Vec<Vec<warden::store::StoredEvent>> {
    let mut logs = Vec::new();
    for run in store.run_ids().await.unwrap() {
        logs.push(store.load(&run).await.unwrap());
    }
    logs
}

/// A driver stopped whole (its one thread blocked: no task, timer or
/// select of it runs, as under SIGSTOP) while its local MCP server is in
/// the middle of a slow write, until its claim has run out; the run is
/// taken over and reconciled while the server's write is still due; then
/// the server's write must never land, and the woken driver must change
/// nothing. Only the claim's watchdog, a process of its own, can stop the
/// server here. The real binary under SIGSTOP is
/// `pause::a_worker_paused_inside_an_mcp_servers_write_leaves_one_write`.
async fn stopped_in_mcp_call(sc: &Scenario, store_kind: &str, n: u64, case: &str) {
    reset(sc);
    slow_mcp_writes(sc);
    let (store, pg) = fresh(store_kind, &sc.fx, n).await;
    let root = sc.roots[0].clone();
    // The driver, on a thread and a runtime of its own, with its own
    // connection to the store: it starts the run (its MCP server started
    // with it), then drives it under the claim it is handed.
    let (handle_to, handle) = std::sync::mpsc::channel();
    let (started_to, started) = tokio::sync::oneshot::channel();
    let (claim_to, claimed) = tokio::sync::oneshot::channel::<(Claim, ValidUntil)>();
    let (agent, run) = (sc.agent.clone(), root.clone());
    let (url, db) = (
        pg.as_ref().map(|p| p.url.clone()),
        sc.fx.path(&format!("matrix-{n}.db")),
    );
    let driver = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        handle_to.send(rt.handle().clone()).unwrap();
        rt.block_on(async move {
            let store: Arc<dyn EventStore> = match url {
                Some(url) => Arc::new(warden::store::PostgresStore::open(&url).await.unwrap()),
                None => Arc::new(SqliteStore::open(db).unwrap()),
            };
            let first = runtime(store);
            first
                .start(&agent, json!("go"), StartOptions::new().id(run))
                .await
                .unwrap();
            started_to.send(()).unwrap();
            let (claim, valid) = claimed.await.unwrap();
            first
                .recover_claimed(&agent, ReplayOptions::default(), claim, valid)
                .await
                // Either way is fine: what it must not do is go on.
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    });
    let handle: tokio::runtime::Handle = handle.recv().unwrap();
    started.await.unwrap();
    let claim = store
        .acquire_claim(&root, "paused", now_ms(), CLAIM.as_millis() as i64)
        .await
        .unwrap();
    let expires = claim.expires_ms;
    claim_to.send((claim, ValidUntil::for_next(CLAIM))).unwrap();
    while !mcp_write_started(sc) {
        assert!(
            !driver.is_finished(),
            "{case}: the driver ended before its MCP write started (within its {CLAIM:?} claim)"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reached = Instant::now();
    // Stopped: a task that blocks the driver's only thread.
    let (thaw, frozen) = std::sync::mpsc::channel::<()>();
    handle.spawn(async move {
        let _ = frozen.recv();
    });
    while now_ms() <= expires {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let next = runtime(store.clone());
    let resolved = play(sc, &next)
        .await
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    assert!(
        reached.elapsed() < MCP_DELAY,
        "{case}: the takeover took longer than the server's write ({MCP_DELAY:?}): raise MCP_DELAY"
    );
    let performed = sc.performed();
    let finished = logs(&store).await;
    // Past the time the server's write was due, the driver wakes.
    tokio::time::sleep((MCP_DELAY + Duration::from_millis(500)).saturating_sub(reached.elapsed()))
        .await;
    assert_eq!(
        sc.performed(),
        performed,
        "{case}: the MCP server wrote after its driver's claim ran out"
    );
    thaw.send(()).unwrap();
    let woke = Instant::now();
    while !driver.is_finished() {
        assert!(
            woke.elapsed() < Duration::from_secs(60),
            "{case}: the woken driver never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = driver.join().unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        sc.performed(),
        performed,
        "{case}: the woken driver made an effect"
    );
    assert!(
        logs(&store).await == finished,
        "{case}: the woken driver changed a log"
    );
    check(sc, &store, &Strike::new(Plan::Count), resolved, case).await;
}

// ---- the matrix ----

/// Runs every cell on `store`; prints the table of case counts.
async fn matrix(store: &str) {
    let started = Instant::now();
    let mut counts: BTreeMap<(usize, usize), String> = BTreeMap::new();
    let mut n = 0;
    // By hand only: `WARDEN_MATRIX_KINDS=local` plays the rows whose name
    // holds it (CI plays every row).
    let only = std::env::var("WARDEN_MATRIX_KINDS").ok();
    for kind in EffectKind::ALL {
        if only.as_deref().is_some_and(|o| !kind.name().contains(o)) {
            continue;
        }
        let sc = scenario(kind);
        let appends = appends_per_run(&sc).await;
        for fault in Fault::ALL {
            let cases = match cell(kind, fault) {
                Cell::EveryAppend => every_append(&sc, &appends, store, fault, &mut n)
                    .await
                    .to_string(),
                Cell::Inside(stops) => {
                    for stop in stops {
                        n += 1;
                        let case =
                            format!("{store}: {} × {} at {stop:?}", kind.name(), fault.name());
                        stop_case(&sc, store, *stop, fault == Fault::ClaimLost, n, &case).await;
                    }
                    stops.len().to_string()
                }
                Cell::Inapplicable(why) => {
                    assert!(!why.is_empty());
                    "n/a".into()
                }
            };
            counts.insert((kind.ordinal(), fault.ordinal()), cases);
        }
    }
    let mut table = format!("| {store} |");
    for fault in Fault::ALL {
        table.push_str(&format!(" {} |", fault.name()));
    }
    for kind in EffectKind::ALL {
        table.push_str(&format!("\n| {} |", kind.name()));
        for fault in Fault::ALL {
            table.push_str(&format!(
                " {} |",
                counts
                    .get(&(kind.ordinal(), fault.ordinal()))
                    .map_or("not played", String::as_str)
            ));
        }
    }
    eprintln!(
        "\neffects matrix on {store}: {n} cases in {:.1?}\n{table}\n",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_kind_survives_every_fault_on_sqlite() {
    matrix("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_kind_survives_every_fault_on_postgres() {
    if PgSchema::new("matrix_probe").await.is_none() {
        return;
    }
    matrix("postgres").await;
}

/// The seeded random walk: `WARDEN_MATRIX_ROUNDS` cases (default 100),
/// each a kind, a fault, a store and a place drawn from the seed
/// (`WARDEN_MATRIX_SEED`, else the time), printed before each case so a
/// failure names the seed and round that replay it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by hand (docs/dev/invariants.md)"]
async fn random() {
    let seed: u64 = std::env::var("WARDEN_MATRIX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| now_ms() as u64 | 1);
    let rounds: u64 = std::env::var("WARDEN_MATRIX_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let mut rng = seed;
    let mut next = move |bound: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % bound.max(1)
    };
    let mut built: BTreeMap<usize, Scenario> = BTreeMap::new();
    for round in 0..rounds {
        let kind = EffectKind::ALL[next(EffectKind::ALL.len() as u64) as usize];
        let fault = Fault::ALL[next(Fault::ALL.len() as u64) as usize];
        let store = ["sqlite", "postgres"][next(2) as usize];
        let sc: &Scenario = built
            .entry(kind.ordinal())
            .or_insert_with(|| scenario(kind));
        let case = format!(
            "seed {seed} round {round}: {store}: {} × {}",
            kind.name(),
            fault.name()
        );
        eprintln!("{case}");
        let n = 1_000_000 + round;
        match cell(kind, fault) {
            Cell::EveryAppend => {
                let runs = appends_per_run(sc).await;
                let (run, appends) = &runs[next(runs.len() as u64) as usize];
                let at = next(*appends);
                let point = if fault == Fault::KillBeforeAppend || next(2) == 0 {
                    CrashPoint::BeforeWrite
                } else {
                    CrashPoint::AfterWrite
                };
                let point = if fault == Fault::KillAfterAppend {
                    CrashPoint::AfterWrite
                } else {
                    point
                };
                let run = run.clone();
                let plan = if fault == Fault::StoreFailure {
                    Plan::Fail { run, at, point }
                } else {
                    Plan::Kill { run, at, point }
                };
                let case = format!("{case} at append {at} ({point:?})");
                one_append_case(sc, store, plan, fault, n, &case).await;
            }
            Cell::Inside(stops) => {
                let stop = stops[next(stops.len() as u64) as usize];
                let case = format!("{case} at {stop:?}");
                stop_case(sc, store, stop, fault == Fault::ClaimLost, n, &case).await;
            }
            Cell::Inapplicable(_) => {}
        }
    }
    eprintln!("random effects matrix: seed {seed}, {rounds} rounds held");
}
