//! Python bindings for the Warden host: the native module `warden._native`
//! of the `warden` Python package (host/python/python/warden). It holds
//! handles and nothing else: every verb is the engine's [`warden::Runtime`] method
//! of the same name over the store it opened, so the sandbox, the log,
//! approvals, budgets and recovery are the Rust engine's, and a run started
//! here can be operated by the command line and the other way round.
//!
//! Every verb returns an awaitable (run on the bindings' Tokio runtime,
//! the GIL released while the engine works); the package's `Runtime` class
//! is the thin synchronous wrapper over it. Values cross as plain JSON
//! (`json.rs`), errors as `warden.errors` exceptions carrying the engine's
//! codes (`errors.rs`), policies are Python callables (`policy.rs`), and a
//! live turn is an async iterator of events (`turn.rs`).

mod aio;
mod errors;
mod json;
mod policy;
mod turn;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::{Value, json};
use warden::engine::events::Event;
use warden::engine::state::{Parked, Terminal};
use warden::engine::{
    CallId, ReplayOptions, RunId, RunState, SessionId, StartOptions, Step, decode,
};
use warden::plugins::PluginHost;
use warden::sandbox::{Sandbox, SandboxConfig};
use warden::store::{EventStore, OpenMode, PostgresStore, RunFilter, SqliteStore, StoreLocation};

use errors::{engine_error, invalid};
use json::{Json, from_python};

/// A loaded agent file: its definition as the engine validated it.
#[pyclass(frozen, module = "warden._native")]
struct Agent {
    agent: Arc<warden::Agent>,
}

#[pymethods]
impl Agent {
    /// The agent's name.
    #[getter]
    fn name(&self) -> &str {
        &self.agent.name
    }

    /// The digest of its definition, which a run records and recovery
    /// compares.
    #[getter]
    fn digest(&self) -> &str {
        self.agent.digest.as_str()
    }

    /// The agent file.
    #[getter]
    fn path(&self) -> PathBuf {
        self.agent.path.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "Agent(name={:?}, path={:?})",
            self.agent.name, self.agent.path
        )
    }
}

/// The runtime over one store: the engine's verbs, each an awaitable.
#[pyclass(frozen, module = "warden._native")]
struct Runtime {
    runtime: aio::KeptAtExit<warden::Runtime>,
    store: aio::KeptAtExit<Arc<dyn EventStore>>,
}

/// A run id from Python text.
fn run_id(text: &str) -> PyResult<RunId> {
    RunId::new(text)
        .map_err(|e| errors::raise("invalid_run_id", &e.to_string(), json!({ "run_id": text })))
}

/// A session id from Python text.
fn session_id(text: &str) -> PyResult<SessionId> {
    SessionId::new(text).map_err(|e| {
        errors::raise(
            "invalid_session_id",
            &e.to_string(),
            json!({ "session": text }),
        )
    })
}

#[pymethods]
impl Runtime {
    /// Opens the store `store` (a SQLite file, `sqlite:PATH`, or a
    /// `postgres://` / `postgresql://` URL; a SQLite file and its directory
    /// are created when missing) and a runtime over it. `policies` maps the
    /// names agents enable (`[policies.<name>]`) to Python callables.
    /// `witness` (default: the `WARDEN_WITNESS` variable) is what `warden
    /// store witness` wrote: every verb that records on a run refuses one
    /// whose log was rolled back past it (`rolled_back`).
    #[staticmethod]
    #[pyo3(signature = (store, *, cache_dir = None, policies = None, record_prompts = false, witness = None))]
    fn open<'py>(
        py: Python<'py>,
        store: String,
        cache_dir: Option<PathBuf>,
        policies: Option<Bound<'py, PyDict>>,
        record_prompts: bool,
        witness: Option<PathBuf>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let witness = witness.or_else(|| {
            std::env::var_os("WARDEN_WITNESS")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        // Read before anything is opened; a Python store is never keyed.
        let witness = witness
            .map(|path| warden::engine::witness::Witness::read(&path, None))
            .transpose()
            .map_err(|e| engine_error(&e))?;
        let mut registered: Vec<(String, Py<PyAny>)> = Vec::new();
        if let Some(policies) = policies {
            for (name, callable) in policies.iter() {
                let name: String = name
                    .extract()
                    .map_err(|_| invalid("policies: every name must be a string"))?;
                if !callable.is_callable() {
                    return Err(invalid(format!(
                        "policies[{name:?}]: a policy must be callable"
                    )));
                }
                registered.push((name, callable.unbind()));
            }
        }
        // An `async def` policy runs on the loop the runtime is opened from.
        let event_loop = py
            .import("asyncio")?
            .call_method0("get_running_loop")
            .ok()
            .map(Bound::unbind);
        aio::future_into_py(py, async move {
            let opened = open_store(&store).await?;
            let sandbox = Sandbox::new(SandboxConfig {
                cache_dir,
                ..SandboxConfig::default()
            })
            .map_err(|e| engine_error(&e))?;
            let mut runtime = warden::Runtime::new(Arc::clone(&opened), PluginHost::new(sandbox))
                .with_record_prompts(record_prompts);
            if let Some(witness) = witness {
                runtime = runtime.with_witness(witness);
            }
            for (name, callable) in registered {
                let policy = policy::PythonPolicy::new(
                    callable,
                    event_loop
                        .as_ref()
                        .map(|l| Python::attach(|py| l.clone_ref(py))),
                );
                runtime = runtime.with_policy(name, Arc::new(policy));
            }
            Ok(Runtime {
                runtime: aio::KeptAtExit::new(runtime),
                store: aio::KeptAtExit::new(opened),
            })
        })
    }

    /// Loads and validates the agent file at `path` (relative paths from
    /// the working directory).
    fn load_agent(&self, py: Python<'_>, path: PathBuf) -> PyResult<Agent> {
        py.detach(|| {
            let absolute =
                path.canonicalize()
                    .map_err(|error| warden::engine::AgentError::Read {
                        path: path.clone(),
                        error,
                    })?;
            warden::Agent::load(&absolute, None)
        })
        .map(|agent| Agent {
            agent: Arc::new(agent),
        })
        .map_err(|e| engine_error(&e))
    }

    /// Builds and validates an agent from `spec`, a dict shaped like an
    /// agent file (its tables as dicts). Relative paths in it (plugins,
    /// schema files) resolve against `base_dir` (the working directory when
    /// omitted), as a file's resolve against its directory.
    #[pyo3(signature = (spec, *, base_dir = None))]
    fn agent_from_dict(
        &self,
        py: Python<'_>,
        spec: &Bound<'_, PyAny>,
        base_dir: Option<PathBuf>,
    ) -> PyResult<Agent> {
        let value = from_python(spec, "spec")?;
        py.detach(|| {
            let dir = base_dir.unwrap_or_else(|| PathBuf::from("."));
            let absolute =
                dir.canonicalize()
                    .map_err(|error| warden::engine::AgentError::Read {
                        path: dir.clone(),
                        error,
                    })?;
            warden::Agent::from_json(value, &absolute.join("<dict>"), None)
        })
        .map(|agent| Agent {
            agent: Arc::new(agent),
        })
        .map_err(|e| engine_error(&e))
    }

    /// Records a new run of `agent` on `input` (any JSON value) and returns
    /// its id; drive it afterwards. `run_id` chooses the id (else a random
    /// one), `labels` are recorded with it, `session` makes it the next run
    /// of that conversation (refused while another run of it is active).
    #[pyo3(signature = (agent, input, *, run_id = None, labels = None, session = None))]
    fn start<'py>(
        &self,
        py: Python<'py>,
        agent: &Agent,
        input: &Bound<'py, PyAny>,
        run_id: Option<String>,
        labels: Option<BTreeMap<String, String>>,
        session: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let input = from_python(input, "input")?;
        let id = match run_id {
            Some(r) => self::run_id(&r)?,
            None => RunId::from_random(rand::random()),
        };
        let session = session.map(|s| session_id(&s)).transpose()?;
        let labels = labels.unwrap_or_default();
        let runtime = warden::Runtime::clone(&self.runtime);
        let agent = Arc::clone(&agent.agent);
        aio::future_into_py(py, async move {
            let mut options = StartOptions::new().id(id).labels(labels);
            if let Some(session) = session {
                options = options.session(session);
            }
            let started = runtime.start(&agent, input, options).await;
            started
                .map(|id| id.as_str().to_owned())
                .map_err(|e| engine_error(&e))
        })
    }

    /// Performs one operation of the run (a model call, a tool call, an
    /// approval request, a record); `True` when there may be more to do.
    fn step<'py>(
        &self,
        py: Python<'py>,
        run_id: &str,
        agent: &Agent,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = self::run_id(run_id)?;
        let runtime = warden::Runtime::clone(&self.runtime);
        let agent = Arc::clone(&agent.agent);
        aio::future_into_py(py, async move {
            match runtime.step(&id, &agent).await {
                Ok(Step::Progressed) => Ok(true),
                Ok(_) => Ok(false),
                Err(e) => Err(engine_error(&e)),
            }
        })
    }

    /// Steps the run until it is terminal or parked; its status.
    fn drive<'py>(
        &self,
        py: Python<'py>,
        run_id: &str,
        agent: &Agent,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = self::run_id(run_id)?;
        let runtime = warden::Runtime::clone(&self.runtime);
        let agent = Arc::clone(&agent.agent);
        aio::future_into_py(py, async move {
            runtime
                .drive(&id, &agent)
                .await
                .map(|s| s.as_str().to_owned())
                .map_err(|e| engine_error(&e))
        })
    }

    /// Replays the recorded log against the agent, checking every decision,
    /// then continues live; its status. A write without a recorded outcome
    /// is never performed again (`needs_reconciliation`).
    fn recover<'py>(
        &self,
        py: Python<'py>,
        run_id: &str,
        agent: &Agent,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = self::run_id(run_id)?;
        let runtime = warden::Runtime::clone(&self.runtime);
        let agent = Arc::clone(&agent.agent);
        aio::future_into_py(py, async move {
            runtime
                .recover(&id, &agent, ReplayOptions::default())
                .await
                .map(|s| s.as_str().to_owned())
                .map_err(|e| engine_error(&e))
        })
    }

    /// Approves the call awaiting approval (one event); drive afterwards.
    #[pyo3(signature = (run_id, call_id, *, by = "python".to_owned()))]
    fn approve<'py>(
        &self,
        py: Python<'py>,
        run_id: &str,
        call_id: String,
        by: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = self::run_id(run_id)?;
        let runtime = warden::Runtime::clone(&self.runtime);
        aio::future_into_py(py, async move {
            runtime
                .approve(&id, &CallId::from_text(&call_id), &by)
                .await
                .map_err(|e| engine_error(&e))
        })
    }

    /// Denies the call awaiting approval; the model sees `reason` as the
    /// tool's result. One event; drive afterwards.
    #[pyo3(signature = (run_id, call_id, reason, *, by = "python".to_owned()))]
    fn deny<'py>(
        &self,
        py: Python<'py>,
        run_id: &str,
        call_id: String,
        reason: String,
        by: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = self::run_id(run_id)?;
        let runtime = warden::Runtime::clone(&self.runtime);
        aio::future_into_py(py, async move {
            runtime
                .deny(&id, &CallId::from_text(&call_id), &by, &reason)
                .await
                .map_err(|e| engine_error(&e))
        })
    }

    /// Gives a suspended run its input (checked against the recorded
    /// schema), or a run over budget its extension; its status. Drive
    /// afterwards.
    #[pyo3(signature = (run_id, agent, input, *, by = None))]
    fn resume<'py>(
        &self,
        py: Python<'py>,
        run_id: &str,
        agent: &Agent,
        input: &Bound<'py, PyAny>,
        by: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = self::run_id(run_id)?;
        let input = from_python(input, "input")?;
        let runtime = warden::Runtime::clone(&self.runtime);
        let agent = Arc::clone(&agent.agent);
        aio::future_into_py(py, async move {
            runtime
                .resume(&id, &agent, input, by)
                .await
                .map(|s| s.as_str().to_owned())
                .map_err(|e| engine_error(&e))
        })
    }

    /// Records the output of the external tool call the run waits for, as
    /// the application performed it (checked against the tool's output
    /// schema and `must_match`). One event; drive afterwards.
    #[pyo3(signature = (run_id, call_id, output, *, by = None))]
    fn complete_external<'py>(
        &self,
        py: Python<'py>,
        run_id: &str,
        call_id: String,
        output: &Bound<'py, PyAny>,
        by: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = self::run_id(run_id)?;
        let output = from_python(output, "output")?;
        let runtime = warden::Runtime::clone(&self.runtime);
        aio::future_into_py(py, async move {
            runtime
                .complete_external(&id, &CallId::from_text(&call_id), output, by)
                .await
                .map_err(|e| engine_error(&e))
        })
    }

    /// Records by hand the outcome of the write whose completion is
    /// missing (a human checked what happened); recover afterwards.
    #[pyo3(signature = (run_id, output, *, by = "python".to_owned(), note = None))]
    fn resolve<'py>(
        &self,
        py: Python<'py>,
        run_id: &str,
        output: &Bound<'py, PyAny>,
        by: String,
        note: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = self::run_id(run_id)?;
        let output = from_python(output, "output")?;
        let runtime = warden::Runtime::clone(&self.runtime);
        aio::future_into_py(py, async move {
            runtime
                .resolve(&id, output, &by, note)
                .await
                .map_err(|e| engine_error(&e))
        })
    }

    /// Cancels the run; one driven by this runtime is interrupted.
    #[pyo3(signature = (run_id, *, reason = None, by = None))]
    fn cancel<'py>(
        &self,
        py: Python<'py>,
        run_id: &str,
        reason: Option<String>,
        by: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = self::run_id(run_id)?;
        let runtime = warden::Runtime::clone(&self.runtime);
        aio::future_into_py(py, async move {
            runtime
                .cancel(&id, by.as_deref(), reason)
                .await
                .map_err(|e| engine_error(&e))
        })
    }

    /// Ends the run for good, whatever it waits for.
    #[pyo3(signature = (run_id, reason, *, by = "python".to_owned()))]
    fn abandon<'py>(
        &self,
        py: Python<'py>,
        run_id: &str,
        reason: String,
        by: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = self::run_id(run_id)?;
        let runtime = warden::Runtime::clone(&self.runtime);
        aio::future_into_py(py, async move {
            runtime
                .abandon(&id, &by, &reason)
                .await
                .map_err(|e| engine_error(&e))
        })
    }

    /// The runs in the store, newest first, as dicts (the command line's
    /// `runs list --json` rows).
    #[pyo3(signature = (*, status = None, agent = None, session = None, labels = None, limit = None))]
    fn list_runs<'py>(
        &self,
        py: Python<'py>,
        status: Option<Vec<String>>,
        agent: Option<String>,
        session: Option<String>,
        labels: Option<BTreeMap<String, String>>,
        limit: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut filter = RunFilter::new();
        for s in status.into_iter().flatten() {
            filter = filter.status(s);
        }
        if let Some(a) = agent {
            filter = filter.agent(a);
        }
        if let Some(s) = session {
            filter = filter.session(s);
        }
        for (k, v) in labels.into_iter().flatten() {
            filter = filter.label(k, v);
        }
        if let Some(n) = limit {
            filter = filter.limit(n);
        }
        let store = Arc::clone(&*self.store);
        aio::future_into_py(py, async move {
            let runs = store.list(&filter).await.map_err(|e| engine_error(&e))?;
            Ok(Json(Value::Array(
                runs.iter()
                    .map(|r| {
                        json!({
                            "run_id": r.run_id,
                            "agent": r.agent,
                            "status": r.status,
                            "labels": r.labels,
                            "session": r.session,
                            "created_ms": r.created_ms,
                            "updated_ms": r.updated_ms,
                            "events": r.event_count,
                            "owes_deliveries": r.owes_deliveries,
                            "wake_ms": r.wake_ms,
                        })
                    })
                    .collect(),
            )))
        })
    }

    /// Every session in the store, by name, as dicts (the command line's
    /// `sessions list --json` rows): its run count, its active run and that
    /// run's status when it is busy, and when it was created and updated.
    fn sessions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let runtime = warden::Runtime::clone(&self.runtime);
        aio::future_into_py(py, async move {
            let sessions = runtime.sessions().await.map_err(|e| engine_error(&e))?;
            Ok(Json(json!(sessions)))
        })
    }

    /// The runs of `session`, in the order they were started, as dicts (the
    /// command line's `sessions show --json` rows): status, input, output,
    /// position and how many earlier runs each saw as history.
    fn session_runs<'py>(&self, py: Python<'py>, session: &str) -> PyResult<Bound<'py, PyAny>> {
        let id = session_id(session)?;
        let runtime = warden::Runtime::clone(&self.runtime);
        aio::future_into_py(py, async move {
            let runs = runtime
                .session_runs(&id)
                .await
                .map_err(|e| engine_error(&e))?;
            Ok(Json(json!(runs)))
        })
    }

    /// How the run stands, as a dict: its status and what it waits for
    /// (`awaiting`: the approval, input or external call, with its
    /// `call_id`), its input, output or error, labels and session.
    fn show<'py>(&self, py: Python<'py>, run_id: &str) -> PyResult<Bound<'py, PyAny>> {
        let id = self::run_id(run_id)?;
        let runtime = warden::Runtime::clone(&self.runtime);
        aio::future_into_py(py, async move {
            let state = runtime.state(&id).await.map_err(|e| engine_error(&e))?;
            Ok(Json(shown(&state)))
        })
    }

    /// The run's log: one dict per event, `{"seq": n, "event": {...}}`
    /// (the command line's event lines), in order.
    fn events<'py>(&self, py: Python<'py>, run_id: &str) -> PyResult<Bound<'py, PyAny>> {
        let id = self::run_id(run_id)?;
        let store = Arc::clone(&*self.store);
        aio::future_into_py(py, async move {
            let stored = store.load(&id).await.map_err(|e| engine_error(&e))?;
            let mut lines = Vec::with_capacity(stored.len());
            for s in &stored {
                let event = decode(&s.bytes).map_err(|error| {
                    engine_error(&warden::RuntimeError::Log {
                        run_id: id.clone(),
                        seq: s.seq,
                        error,
                    })
                })?;
                lines.push(event_line(s.seq, &event));
            }
            Ok(Json(Value::Array(lines)))
        })
    }

    /// Starts a run of `agent` on `input` (in `session` when given) and
    /// drives it in the background; the live turn to iterate.
    #[pyo3(signature = (agent, input, *, session = None))]
    fn start_turn<'py>(
        &self,
        py: Python<'py>,
        agent: &Agent,
        input: &Bound<'py, PyAny>,
        session: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let input = from_python(input, "input")?;
        let session = session.map(|s| session_id(&s)).transpose()?;
        let runtime = warden::Runtime::clone(&self.runtime);
        let agent = Arc::clone(&agent.agent);
        aio::future_into_py(py, async move {
            let handle = runtime
                .start_turn(session.as_ref(), &agent, input)
                .await
                .map_err(|e| engine_error(&e))?;
            Ok(turn::Turn::new(runtime, handle))
        })
    }

    /// Drives run `run_id` again (after a human acted on a parked turn) as
    /// a live turn.
    fn continue_turn<'py>(
        &self,
        py: Python<'py>,
        run_id: &str,
        agent: &Agent,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = self::run_id(run_id)?;
        let runtime = warden::Runtime::clone(&self.runtime);
        let agent = Arc::clone(&agent.agent);
        aio::future_into_py(py, async move {
            let handle = runtime
                .continue_turn(&id, &agent)
                .await
                .map_err(|e| engine_error(&e))?;
            Ok(turn::Turn::new(runtime, handle))
        })
    }
}

/// An event line: `{"seq", "event"}`.
fn event_line(seq: u64, event: &Event) -> Value {
    json!({ "seq": seq, "event": event })
}

/// The dict `show` returns.
fn shown(state: &RunState) -> Value {
    let mut body = json!({
        "run_id": state.run_id,
        "agent": state.agent,
        "agent_digest": state.agent_digest.as_str(),
        "status": state.status().as_str(),
        "input": state.input,
        "labels": state.labels,
        "session": state.session_id,
        "events": state.event_count,
    });
    if let Some(output) = state.output() {
        body["output"] = output.clone();
    }
    if let Some(Terminal::Failed(failed)) = &state.terminal {
        let mut details = serde_json::to_value(&failed.error).unwrap_or_else(|_| json!({}));
        let code = details
            .as_object_mut()
            .and_then(|d| d.remove("kind"))
            .unwrap_or_else(|| json!("run_failed"));
        body["error"] =
            json!({ "code": code, "message": failed.error.to_string(), "details": details });
    }
    if let Some(awaiting) = state.parked().map(|p| awaiting(&p)) {
        body["awaiting"] = awaiting;
    }
    body
}

/// What a parked run waits for.
fn awaiting(parked: &Parked<'_>) -> Value {
    match parked {
        Parked::Approval { call } => json!({
            "kind": "approval",
            "call_id": call.call_id,
            "tool": call.call.name,
            "arguments": call.call.arguments,
        }),
        Parked::Input {
            call_id,
            reason,
            schema,
        } => json!({ "kind": "input", "call_id": call_id, "reason": reason, "schema": schema }),
        Parked::External(request) => json!({
            "kind": "external",
            "call_id": request.call_id,
            "tool": request.tool,
            "arguments": request.arguments,
            "output_schema": request.output_schema,
        }),
        Parked::Budget(overrun) => json!({ "kind": "budget", "overrun": overrun }),
        Parked::Wait(wait) => json!({ "kind": "wait", "until_ms": wait.until_ms }),
        Parked::Reconciliation(intent) => json!({
            "kind": "reconciliation",
            "call_id": intent.call_id,
            "tool": intent.tool,
        }),
        Parked::Hold(hold) => json!({ "kind": "reconciliation", "reason": hold.reason }),
        Parked::Child {
            call_id,
            child_run,
            status,
        } => json!({
            "kind": "child",
            "call_id": call_id,
            "child_run": child_run,
            "status": status,
        }),
    }
}

/// Opens the store `location` names, creating a SQLite file when missing.
async fn open_store(location: &str) -> PyResult<Arc<dyn EventStore>> {
    let cwd = std::env::current_dir()
        .map_err(|e| invalid(format!("store: the current directory is unreadable: {e}")))?;
    let path =
        match StoreLocation::parse(location, &cwd).map_err(|e| invalid(format!("store: {e}")))? {
            StoreLocation::Postgres(url) => {
                let store = PostgresStore::builder(&url)
                    .mode(OpenMode::Create)
                    .open()
                    .await
                    .map_err(|e| engine_error(&e))?;
                return Ok(Arc::new(store));
            }
            StoreLocation::Sqlite(path) => path,
        };
    // No Python on the blocking thread (one that attached to Python there
    // aborts the interpreter's exit): the errors become exceptions here.
    let opened = tokio::task::spawn_blocking(move || {
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(|e| {
                Err(format!(
                    "cannot create the store's directory `{}`: {e}",
                    dir.display()
                ))
            })?;
        }
        SqliteStore::builder(&path)
            .mode(OpenMode::Create)
            .open()
            .map(|s| Arc::new(s) as Arc<dyn EventStore>)
            .map_err(Ok)
    })
    .await
    .map_err(|e| invalid(format!("the store could not be opened: {e}")))?;
    opened.map_err(|e| match e {
        Ok(store_error) => engine_error(&store_error),
        Err(message) => invalid(message),
    })
}

/// The native module. With `RUST_LOG` set, the engine's logs go to stderr
/// under that filter, as the command line's do.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    if std::env::var_os("RUST_LOG").is_some() {
        // An application that installed its own subscriber keeps it.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    m.add_class::<Runtime>()?;
    m.add_class::<Agent>()?;
    m.add_class::<turn::Turn>()?;
    m.add_function(wrap_pyfunction!(aio::_shutdown, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
