//! Warden's integration tests against real wasmtime, compiled into one
//! binary so they link once (the wasmtime `tests/all` pattern).
//!
//! - `hostile`: guests that try to exhaust fuel, time, memory, tables,
//!   stack, stdio or output; each case asserts the typed outcome and that the
//!   host then serves a normal call.
//! - `filesystem`: escapes from a mount, writes through a read-only one,
//!   a mount's path swapped for a symlink, FIFOs, sockets and devices.
//! - `isolation`: leakage between leases, environment grants and redaction,
//!   starvation, cancellation.
//! - `fencing`: a claim's validity (`ValidUntil`): passed, a claim never
//!   runs; passing mid-call, no further filesystem change of any kind and
//!   no further request, a compute loop trapped, a wait stopped; kept
//!   extended, the call finishes.
//! - `loading`: the import allow-list, integrity pins, the component cache.
//! - `budgets`: budgets through the runtime on the injected clock: a tool
//!   call of an answer that crossed a budget never runs, a call whose input
//!   alone would cross one is not made, parked time is not active time,
//!   inputs over the cap are refused before anything is recorded.
//! - `ceilings`: operator ceilings over a manifest's huge limits, and leases
//!   bounded by what is left of their run's fuel and wall time.
//! - `kinds`: context sources, channels and policies through their adapters.
//! - `context`: context sources in runs: quoted into recorded prompts,
//!   failing sources skipped or failing the run, recovery without
//!   resolving a recorded step again.
//! - `fs_plugin`: the built-in fs plugin through the plugin host and grants.
//! - `attack_matrix`: the surface × attacker matrix of issue 37, from the
//!   lists in `warden::threat_model`: each cell names the tests that prove
//!   containment; the breaks of issue 37 and their next variants (a
//!   plugin's preview on a real terminal, untrusted text on the terminal,
//!   rules over canonical paths).
//! - `approvals`: approvals bound to one frozen call (its digest), a
//!   stale digest refused, a forged approval approving nothing; standing
//!   rules granting, naming themselves, lapsing (revoked, expired) before
//!   their call runs; a rule-approved write at most once under a kill at
//!   every boundary and a takeover, on SQLite and PostgreSQL.
//! - `engine`: runs end to end over both stores, the verbs, subscribers,
//!   and crash tests at every event boundary.
//! - `channels`: delivery channels in runs: retries with backoff, failures
//!   that leave the result alone, parked notices, recovery around a
//!   delivery's completion.
//! - `effects`: idempotency commitments across runs, retries by effect
//!   class, unknown outcomes, external tools.
//! - `sealed_rows`: with a chain key, a standing rule widened and a
//!   settled idempotency result rewritten directly in the database, through
//!   `warden` processes on SQLite and PostgreSQL: the driving verbs refuse,
//!   the write does not run, `runs verify` reports the row.
//! - `effects_matrix`: every effect kind of `warden::fault_model` crossed
//!   with every fault (a kill at every append, a store failure at every
//!   append, a pause past the claim and a lost claim inside the effect) on
//!   SQLite and PostgreSQL: each write at most once, no torn target,
//!   nothing acknowledged lost, every run ended as the docs say.
//! - `children`: agents as tools, as child runs on every store: a planner
//!   with two workers killed at every event boundary of parent and children
//!   recovers with each write once; a child waiting for approval parks its
//!   parent; budgets nest.
//! - `plans`: orchestrated runs (plan files) on every store: the example
//!   completes offline and replays; a plan and its children killed at
//!   every event boundary recover with each write once and no second
//!   child; stopping rules (a typed result, max rounds); a role waiting for
//!   approval parks the plan; bad plans are refused by kind.
//! - `forks`: forks on every store: a fork at each position of a recorded
//!   run reuses every earlier effect and asks again for later writes;
//!   changed agents and budgets; bad positions; a fork cut short by a
//!   crash.
//! - `journal`: JSON nested past what decoding reads, from a hostile model,
//!   tool or final answer, is answered and recorded readably; arbitrary
//!   values round-trip through append and decode on both stores.
//! - `kill`: the `warden` binary killed with SIGKILL mid-run, again and again.
//! - `torn_edits`: the fs plugin's `edit_file` under SIGKILLs of `warden
//!   run` and `warden worker` on SQLite and PostgreSQL: no file torn, each
//!   holding exactly the edits the log records.
//! - `network`: outbound HTTP against a loopback server (`server`): what a
//!   host grant lets through, and every way to reach what it does not.
//! - `narrowed`: calls ahead of an effect (a preflight, and by default a
//!   context source or a policy) under the narrowed grant: a write and a
//!   request planted in a preflight are refused, the approval still shows.
//! - `pause`: a paused writer: a `warden worker` stopped with SIGSTOP
//!   mid-write past its claim on PostgreSQL, taken over, resolved by an
//!   operator, then woken, writes nothing more; a driver whose own view of
//!   its claim passes mid-write stops and records nothing.
//! - `parsing`: agent files, manifests, stored events and guest output,
//!   mangled at random, parse or fail typed, never panic.
//! - `plugins`: the other first-party plugins through the testkit.
//! - `workers`: run claims with fencing through the engine, and `warden
//!   worker` processes killed at random while sharing 200 runs on
//!   PostgreSQL.
//! - `policies`: native policies at every hook: a denied tool call never
//!   runs, feedback asks the model again, recorded decisions are never
//!   asked again (recovery, replay with no policy registered), failing
//!   policies fail the run closed.
//! - `typed_results`: agents with an output schema: validation, one
//!   rejection sent back, typed failure, `finish_with`, replay of each.
//! - `providers`: the OpenAI-compatible and Anthropic providers against a
//!   fake model API on loopback (`model_server`): wire formats, one
//!   request per call, errors, broken streams, cancellation, pooling, conformance with the scripted
//!   provider, and agents end to end.
//! - `retries`: the one retry layer for model calls through the engine:
//!   requests counted per `max_attempts`, `Retry-After` waited by the
//!   injected clock, recovery mid-wait, a long wait parking the run until a
//!   later drive, a worker or a new `warden worker` process takes it up.
//! - `corpus`: responses recorded byte for byte from third-party servers
//!   (`tests/fixtures/providers/corpus/`), replayed exactly and in pieces
//!   into the providers and through the engine.
//! - `sessions`: runs in a session on every store: one active run, history
//!   from completed runs only, a run cancelled mid-stream rolled back, two
//!   hosts racing to start.
//! - `session_history`: history recorded by reference on every store (a
//!   `run_started` the same size at any turn, the model seeing what a copy
//!   would hold), altered or missing chunks refused on drive, recover and
//!   verify, and a log with its history inline (written before chunks)
//!   verifying, replaying and continuing.
//! - `python_host`: the Python package's pytest suite (`host/python/tests`)
//!   in the virtual environment `.ci/run` prepares: the runtime's verbs
//!   from Python on both stores, a killed Python process recovered,
//!   Python policies and external tools, live turns, exceptions by code.
//! - `turns`: live turns through their handles: deltas before the provider
//!   finishes, tool calls and approvals, cancel and drop.
//! - `policy_plugins`: policies as WASM components in runs, through the
//!   engine and the `warden` binary: denial, feedback, receipts, recovery
//!   and replay without asking again, hostile policies failing closed.
//! - `python_guest`: a Python tool plugin built with componentize-py by
//!   the Python SDK, through the `warden` binary: typed output and errors,
//!   denials outside its mount, the receipt.
//! - `languages`: one tool plugin per language (Rust, Python, JavaScript)
//!   from `warden plugin new` through `build`, `test` (the shared contract
//!   cases: denials, variables and hosts not granted, every limit),
//!   `inspect`, `call` and an agent's `warden run`.
//! - `serve`: `warden serve` on loopback over SQLite and PostgreSQL with a
//!   real worker: refusing to start without tokens or TLS beyond loopback,
//!   requests refused without a token, below the role, naming another Host
//!   or Origin; a live stream resumed with `Last-Event-ID`; an approval
//!   through the API recorded as `api:<name>` and picked up by the worker.
//! - `otel`: `warden otel export` to a real OTLP receiver (Arize Phoenix,
//!   started by the test): the demo, a child waiting for approval, a
//!   crashed and recovered run and a fork, read back through Phoenix's API
//!   with their parentage and attributes, with no duplicate after a second
//!   and a third export.
//! - `metrics`: `/metrics` on `warden serve` and `warden worker`, accepted
//!   by `promtool check metrics`, its counters moving as a run proceeds.
//! - `signing`: plugin bundles signed with the real `minisign` tool
//!   through the `warden` binary: a valid signature loads and each receipt
//!   names the bundle and signer; tampered components, manifests and
//!   statements, untrusted keys and missing signatures refused before
//!   compiling; unsigned plugins only where the operator allows them; a
//!   lock file holding runs to the locked bundle; upgrades that widen
//!   stopped with their diff until accepted, narrowing ones taken.
//! - `layers`: the host's crates depend on each other one way only: no
//!   lower crate (sandbox, store, providers) ever reaches the engine,
//!   plugins or CLI.
//! - `feature_sets`: building the Python package alone (as `maturin
//!   develop` does) reuses the default members' build: no dependency is
//!   resolved with other features.
//! - `binary` (support): the `warden` binary, built fresh for the tests
//!   that drive it.
//! - `sweep` (support): the every-boundary crash sweep of `children`,
//!   `batches` and `plans`: a fresh store per case, the crash, a new
//!   runtime for the test's check.
//! - `store_suite`: the store conformance suite (`warden_store::testing`)
//!   run from outside the store crate, against the intercepting store
//!   around the memory store: a store written elsewhere runs it the same way.

mod approvals;
mod attack_matrix;
mod batches;
mod binary;
mod budgets;
mod canary;
mod ceilings;
mod channels;
mod children;
mod console;
mod context;
mod corpus;
mod effects;
mod effects_matrix;
mod engine;
mod engine_layers;
mod feature_sets;
mod fencing;
mod filesystem;
mod forks;
mod fs_plugin;
mod hostile;
mod isolation;
mod journal;
mod kill;
mod kinds;
mod languages;
mod layers;
mod loading;
mod mcp;
mod mcp_servers;
mod metrics;
mod model_server;
mod narrowed;
mod network;
mod otel;
mod parsing;
mod pause;
mod plans;
mod plugins;
mod policies;
mod policy_plugins;
mod providers;
mod python_guest;
mod python_host;
mod retries;
mod sealed_rows;
mod secrets;
mod serve;
mod server;
mod session_history;
mod sessions;
mod signing;
mod store_suite;
mod sweep;
mod torn_edits;
mod turns;
mod typed_results;
mod workers;

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};
use warden::sandbox::{
    Capabilities, GrantedComponent, Leased, Limits, Outcome, PluginComponent, Sandbox,
    SandboxConfig, wit,
};
use warden_tests::guests;

/// One sandbox for the whole binary, as in production: one engine per
/// process.
fn sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        Sandbox::new(SandboxConfig {
            cache_dir: Some(std::env::temp_dir().join("warden-tests-components")),
            ..SandboxConfig::default()
        })
        .unwrap()
    })
}

/// Loads a test guest by path.
fn load(path: &str) -> PluginComponent {
    let name = std::path::Path::new(path)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .replace('_', "-");
    let wasm = std::fs::read(path).unwrap();
    sandbox().load(&name, &wasm, None).unwrap()
}

/// Writes `dir/<name>.toml`, the manifest of plugin `name` of `kind` whose
/// component is the test guest at `guest`, copied into `dir` as
/// `<name>.wasm` (a manifest's component must be inside the plugin's
/// directory) and pinned to its digest; `extra` is appended as it is.
fn plugin_manifest(
    dir: &std::path::Path,
    name: &str,
    kind: &str,
    guest: &str,
    extra: &str,
) -> warden::plugins::PluginSource {
    use sha2::Digest as _;
    let wasm = std::fs::read(guest).unwrap();
    let sha = hex::encode(sha2::Sha256::digest(&wasm));
    std::fs::write(dir.join(format!("{name}.wasm")), &wasm).unwrap();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "name = \"{name}\"\nversion = \"0.1.0\"\nkind = \"{kind}\"\ncomponent = \"{name}.wasm\"\nsha256 = \"{sha}\"\n{extra}"
        ),
    )
    .unwrap();
    warden::plugins::PluginSource::Manifest(path)
}

/// Limits small enough for tests to hit quickly.
fn test_limits() -> Limits {
    Limits {
        fuel: Some(2_000_000_000),
        timeout: Duration::from_secs(5),
        ..Limits::default()
    }
}

/// The hostile guest with `capabilities` and `limits`.
fn hostile(capabilities: Capabilities, limits: Limits) -> GrantedComponent {
    static COMPONENT: OnceLock<PluginComponent> = OnceLock::new();
    let component = COMPONENT.get_or_init(|| load(guests::HOSTILE));
    sandbox().grant(component, capabilities, limits)
}

fn call(tool: &str, args: Value) -> wit::Call {
    wit::Call {
        id: "call-1".into(),
        run_id: "run-1".into(),
        tool: tool.into(),
        arguments: args.to_string(),
        idempotency_key: "run-1/call-1".into(),
    }
}

async fn invoke(
    g: &GrantedComponent,
    tool: &str,
    args: Value,
) -> Leased<Result<wit::ToolOutput, wit::ToolError>> {
    g.invoke(&call(tool, args), None).await
}

/// The output of a successful call, as JSON.
fn output(leased: &Leased<Result<wit::ToolOutput, wit::ToolError>>) -> Value {
    match &leased.result {
        Ok(Ok(out)) => serde_json::from_str(&out.content).unwrap(),
        other => panic!("expected success, got {other:?}"),
    }
}

/// The message of a `failed` tool error.
fn failure(leased: &Leased<Result<wit::ToolOutput, wit::ToolError>>) -> String {
    match &leased.result {
        Ok(Err(wit::ToolError::Failed(f))) => f.message.clone(),
        other => panic!("expected a failed tool error, got {other:?}"),
    }
}

/// After whatever the guest did, the same plugin still serves a normal call.
async fn assert_serves_normal_call(g: &GrantedComponent) {
    let leased = invoke(g, "noop", json!({})).await;
    assert_eq!(leased.receipt.outcome, Outcome::Ok, "{:?}", leased.result);
    assert_eq!(output(&leased), json!({}));
}

/// A FIFO made with `mkfifo`: opening it blocks until its other end is
/// opened. While it lives a rescue thread opens its other end now and then
/// (non-blocking), so that a host that ever opened it blocking makes the test
/// fail instead of hang.
struct Fifo {
    path: std::path::PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    rescue: Option<std::thread::JoinHandle<()>>,
}

impl Fifo {
    fn new(path: std::path::PathBuf) -> Fifo {
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success(), "mkfifo {}", path.display());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let rescue = {
            let (path, stop) = (path.clone(), std::sync::Arc::clone(&stop));
            std::thread::spawn(move || {
                use std::os::unix::fs::OpenOptionsExt as _;
                const O_NONBLOCK: i32 = 0o4000; // Linux
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(500));
                    let open = |write: bool| {
                        std::fs::OpenOptions::new()
                            .read(!write)
                            .write(write)
                            .custom_flags(O_NONBLOCK)
                            .open(&path)
                    };
                    // Releases a blocked writer, then a blocked reader.
                    drop(open(false));
                    drop(open(true));
                }
            })
        };
        Fifo {
            path,
            stop,
            rescue: Some(rescue),
        }
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(rescue) = self.rescue.take() {
            let _ = rescue.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Everything the host logs at the `warden` binary's most verbose level on this thread
/// while the guard lives, as plain text: for tests that prove what never
/// reaches the logs. Tests using it run on the current-thread runtime, so
/// every lease they start logs on this thread.
struct Logs {
    text: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

impl Logs {
    fn capture() -> Logs {
        let text = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let writer = {
            let text = std::sync::Arc::clone(&text);
            move || LogWriter(std::sync::Arc::clone(&text))
        };
        // The most the `warden` binary logs (`-vv`).
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(warden_cli::TRACE_FILTER))
            .with_ansi(false)
            .with_writer(writer)
            .finish();
        Logs {
            text,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.text.lock().unwrap()).into_owned()
    }
}

struct LogWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every test guest must be used by some test: a guest added without one
/// fails to compile here. Each constant names the test that covers it.
#[allow(non_upper_case_globals, dead_code)]
mod coverage {
    pub(crate) const backdoor: &str = "loading::an_unknown_interface_is_refused_naming_it";
    pub(crate) const channel: &str = "kinds::channels_deliver_and_report_typed_errors";
    pub(crate) const context: &str = "kinds::context_sources_resolve_items_and_typed_errors, context::recovery_uses_the_recorded_context_and_never_resolves_a_recorded_step_again";
    pub(crate) const hostile: &str = "hostile::*";
    pub(crate) const net: &str = "network::*";
    pub(crate) const policy: &str = "kinds::policies_decide_from_their_config_and_count_their_calls, kinds::a_misbehaving_policy_is_stopped_with_a_typed_failure, policy_plugins::*";
    pub(crate) const noop: &str = "loading::a_minimal_component_needs_no_wasi";
    pub(crate) const sockets: &str = "loading::network_access_without_a_grant_is_refused_at_load";
    pub(crate) const table_grow: &str = "hostile::table_growth_is_denied_at_the_limit, signing::a_lock_holds_runs_to_the_locked_bundle_and_upgrades_show_the_diff";
    macro_rules! covered {
        ($name:ident) => {
            const _: &str = $name;
        };
    }
    warden_tests::foreach_guest!(covered);
}
