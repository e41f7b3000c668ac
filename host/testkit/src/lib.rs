//! The testkit for plugin authors: load your built component into the real
//! sandbox, under the grants and limits you choose, call a tool and assert
//! on its output, its typed error, a denial or a limit hit, with the usage
//! receipt at hand.
//!
//! ```no_run
//! use warden_testkit::TestPlugin;
//! use serde_json::json;
//!
//! # async fn example() {
//! let dir = tempfile::tempdir().unwrap();
//! std::fs::write(dir.path().join("hello.txt"), "hi").unwrap();
//! // Builds this crate for wasm32-wasip2 and loads it with its plugin.toml.
//! let plugin = TestPlugin::build(env!("CARGO_MANIFEST_DIR"))
//!     .mount_read_only("workspace", dir.path())
//!     .load()
//!     .await
//!     .unwrap();
//! let call = plugin.call("read_file", json!({ "path": "hello.txt" })).await;
//! assert_eq!(call.output()["content"], "hi");
//! assert!(call.receipt.fuel_consumed > 0);
//! let escape = plugin.call("read_file", json!({ "path": "../secret" })).await;
//! escape.denied();
//! # }
//! ```
//!
//! Context sources and channels are called with [`TestPlugin::resolve`] and
//! [`TestPlugin::deliver`], which return the lease's result and receipt.
//!
//! Every test shares one process-wide [`Sandbox`], with compiled components
//! cached under the system's temporary directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use warden_plugins::grant::{Grant, MountGrant};
use warden_plugins::manifest::{FuelSetting, Unmetered};
use warden_plugins::{
    LoadedPlugin, Manifest, PluginError, PluginHost, PluginSource, ToolDescriptor,
};
use warden_sandbox::{
    Access, LeaseError, LeaseFailure, Leased, Outcome, Sandbox, SandboxConfig, UsageReceipt, wit,
};
use warden_syntax::units::{ByteSize, HumanDuration};

/// The sandbox every test in this process shares.
pub fn shared_sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        Sandbox::new(SandboxConfig {
            cache_dir: Some(std::env::temp_dir().join("warden-testkit-components")),
            ..SandboxConfig::default()
        })
        .expect("cannot create the testkit sandbox")
    })
}

fn shared_host() -> &'static PluginHost {
    static HOST: OnceLock<PluginHost> = OnceLock::new();
    HOST.get_or_init(|| PluginHost::new(shared_sandbox().clone()))
}

/// A plugin loaded in the real sandbox for a test.
#[derive(Clone, Debug)]
pub struct TestPlugin {
    plugin: LoadedPlugin,
}

enum Origin {
    /// A crate to build, with its `plugin.toml` next to its `Cargo.toml`.
    Crate(PathBuf),
    /// A component file and a manifest for it, pin ignored.
    Component { manifest: PathBuf, wasm: PathBuf },
    /// A manifest (pinned) or a built-in.
    Source(PluginSource),
}

/// How a [`TestPlugin`] is loaded: which plugin, what it is granted, its
/// limits. By default nothing is granted and the manifest's limits apply.
#[must_use]
pub struct TestPluginBuilder {
    origin: Origin,
    grant: Grant,
    env: BTreeMap<String, String>,
}

impl TestPlugin {
    /// Builds the plugin crate in `crate_dir` for `wasm32-wasip2` (in
    /// `<target>/guests`, with the workspace's `guest` profile if it has one)
    /// and loads the component with `crate_dir/plugin.toml`. The manifest's
    /// `component` and `sha256`, if any, are ignored: the test runs what was
    /// just built.
    pub fn build(crate_dir: impl AsRef<Path>) -> TestPluginBuilder {
        TestPluginBuilder::new(Origin::Crate(crate_dir.as_ref().to_owned()))
    }

    /// Loads `wasm` with the manifest at `manifest`, ignoring the manifest's
    /// pin.
    pub fn component(manifest: impl AsRef<Path>, wasm: impl AsRef<Path>) -> TestPluginBuilder {
        TestPluginBuilder::new(Origin::Component {
            manifest: manifest.as_ref().to_owned(),
            wasm: wasm.as_ref().to_owned(),
        })
    }

    /// Loads the plugin as production would: a `plugin.toml` with its pinned
    /// component, or `builtin:<name>`.
    pub fn source(source: &str) -> TestPluginBuilder {
        TestPluginBuilder::new(Origin::Source(source.parse().expect("infallible")))
    }

    /// The loaded plugin.
    pub fn plugin(&self) -> &LoadedPlugin {
        &self.plugin
    }

    /// The tools it offers, with effective effect classes.
    pub fn tools(&self) -> &[ToolDescriptor] {
        self.plugin.tools()
    }

    /// Calls `tool` with `arguments` in a fresh lease.
    ///
    /// # Panics
    /// If the plugin has no such tool.
    pub async fn call(&self, tool: &str, arguments: Value) -> ToolCall<wit::ToolOutput> {
        let call = test_call(tool, &arguments);
        let leased = self
            .plugin
            .invoke(&call, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        ToolCall {
            tool: tool.to_owned(),
            result: leased.result,
            receipt: leased.receipt,
        }
    }

    /// Asks `tool` for its preview of a call with `arguments`.
    ///
    /// # Panics
    /// If the plugin has no such tool.
    pub async fn preflight(&self, tool: &str, arguments: Value) -> ToolCall<wit::Preview> {
        let call = test_call(tool, &arguments);
        let leased = self
            .plugin
            .preflight(&call, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        ToolCall {
            tool: tool.to_owned(),
            result: leased.result,
            receipt: leased.receipt,
        }
    }
}

impl TestPlugin {
    /// Asks the plugin's context source for items, with `query` (JSON, sent
    /// as text) in a fresh lease.
    ///
    /// # Panics
    /// If the plugin is not a context source.
    pub async fn resolve(
        &self,
        query: Value,
    ) -> Leased<Result<Vec<wit::ContextItem>, wit::ContextError>> {
        let request = wit::ContextRequest {
            run_id: "test-run".into(),
            query: if query.is_null() {
                String::new()
            } else {
                query.to_string()
            },
        };
        self.plugin
            .resolve(&request, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Delivers a message of `kind` with `payload` (id `test-delivery`)
    /// through the plugin's channel in a fresh lease.
    ///
    /// # Panics
    /// If the plugin is not a channel.
    pub async fn deliver(
        &self,
        kind: &str,
        payload: Value,
    ) -> Leased<Result<(), wit::DeliveryError>> {
        let delivery = wit::Delivery {
            id: "test-delivery".into(),
            run_id: "test-run".into(),
            kind: kind.into(),
            payload: payload.to_string(),
        };
        self.plugin
            .deliver(&delivery, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Asks the plugin's policy for its decision at `hook` about `subject`
    /// (a JSON object; its `hook` tag is added if missing) in a fresh lease,
    /// as run `test-run` of agent `test-agent`, under the plugin's name.
    ///
    /// # Panics
    /// If the plugin is not a policy, or `subject` is not a JSON object.
    pub async fn decide(
        &self,
        hook: wit::PolicyHook,
        subject: Value,
    ) -> Leased<Result<wit::Decision, wit::PolicyError>> {
        let request = policy_request(self.plugin.name(), hook, subject);
        self.plugin
            .decide(&request, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// The request a policy named `policy` gets at `hook` about `subject`, in
/// run `test-run` of agent `test-agent`.
///
/// # Panics
/// If `subject` is not a JSON object.
pub fn policy_request(policy: &str, hook: wit::PolicyHook, subject: Value) -> wit::PolicyRequest {
    let Value::Object(mut subject) = subject else {
        panic!("a policy subject is a JSON object, not {subject}");
    };
    subject
        .entry("hook")
        .or_insert_with(|| Value::String(hook_name(hook).to_owned()));
    wit::PolicyRequest {
        run_id: "test-run".into(),
        agent: "test-agent".into(),
        policy: policy.into(),
        hook,
        subject: Value::Object(subject).to_string(),
    }
}

fn hook_name(hook: wit::PolicyHook) -> &'static str {
    warden_engine::PolicyHook::from(hook).as_str()
}

fn test_call(tool: &str, arguments: &Value) -> wit::Call {
    wit::Call {
        id: "test-call".into(),
        run_id: "test-run".into(),
        tool: tool.into(),
        arguments: arguments.to_string(),
        idempotency_key: "test-key".into(),
    }
}

impl TestPluginBuilder {
    fn new(origin: Origin) -> Self {
        TestPluginBuilder {
            origin,
            grant: Grant::default(),
            env: BTreeMap::new(),
        }
    }

    /// Binds the requested mount `name` to `dir` with the access requested.
    pub fn mount(mut self, name: &str, dir: impl AsRef<Path>) -> Self {
        self.grant.mounts.insert(
            name.into(),
            MountGrant {
                dir: dir.as_ref().to_owned(),
                access: None,
                exclude: Vec::new(),
            },
        );
        self
    }

    /// Binds the requested mount `name` to `dir`, read-only.
    pub fn mount_read_only(mut self, name: &str, dir: impl AsRef<Path>) -> Self {
        self.grant.mounts.insert(
            name.into(),
            MountGrant {
                dir: dir.as_ref().to_owned(),
                access: Some(Access::ReadOnly),
                exclude: Vec::new(),
            },
        );
        self
    }

    /// Grants the requested environment variable `name` with `value`.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.grant.env.push(name.into());
        self.env.insert(name.into(), value.into());
        self
    }

    /// Grants the secret `name` with `value`, attached only to requests for
    /// `hosts` (each must also be granted with [`host`](Self::host)) and
    /// not readable by the plugin. The call's receipt
    /// (`receipt.secrets`) says for which host it was attached or withheld.
    pub fn secret(self, name: &str, value: &str, hosts: &[&str]) -> Self {
        self.secret_grant(name, value, hosts, false)
    }

    /// Grants the secret `name` with `value` with `reveal = true`: the
    /// plugin can read it (and then only redaction stands between it and
    /// what the plugin returns).
    pub fn revealed_secret(self, name: &str, value: &str) -> Self {
        self.secret_grant(name, value, &[], true)
    }

    fn secret_grant(mut self, name: &str, value: &str, hosts: &[&str], reveal: bool) -> Self {
        // Handed over as an environment variable only this builder's
        // lookup knows.
        let var = format!("WARDEN_TESTKIT_SECRET_{}", name.replace('-', "_"));
        self.env.insert(var.clone(), value.into());
        self.grant.secrets.insert(
            name.into(),
            warden_plugins::grant::SecretGrant {
                env: Some(var),
                hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
                reveal,
                ..Default::default()
            },
        );
        self
    }

    /// Grants the requested outbound host `host`.
    pub fn host(mut self, host: &str) -> Self {
        self.grant.hosts.push(host.into());
        self
    }

    /// Sets a value for the plugin's `config` import.
    pub fn config(mut self, key: &str, value: &str) -> Self {
        self.grant.config.insert(key.into(), value.into());
        self
    }

    /// Sets the fuel limit; `None` for no fuel budget.
    pub fn fuel(mut self, fuel: Option<u64>) -> Self {
        self.grant.limits.fuel = Some(match fuel {
            Some(n) => FuelSetting::Limit(n),
            None => FuelSetting::Unmetered(Unmetered::Unmetered),
        });
        self
    }

    /// Sets the wall-clock deadline.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.grant.limits.timeout = Some(HumanDuration(timeout));
        self
    }

    /// Sets the linear memory limit, in bytes.
    pub fn memory(mut self, bytes: u64) -> Self {
        self.grant.limits.memory = Some(ByteSize(bytes));
        self
    }

    /// Sets the output limit, in bytes.
    pub fn output(mut self, bytes: u64) -> Self {
        self.grant.limits.output = Some(ByteSize(bytes));
        self
    }

    /// Sets the outbound HTTP request limit per lease.
    pub fn http_requests(mut self, requests: u64) -> Self {
        self.grant.limits.http_requests = Some(requests);
        self
    }

    /// Sets the outbound HTTP response byte limit per lease.
    pub fn http_response_bytes(mut self, bytes: u64) -> Self {
        self.grant.limits.http_response = Some(ByteSize(bytes));
        self
    }

    /// Widens a context source or a policy: `resolve` and `decide` run with
    /// the whole grant instead of the narrowed one (read-only mounts, no
    /// host). Preflights are never widened.
    pub fn widened(mut self) -> Self {
        self.grant.widened = true;
        self
    }

    /// Sets the operator's effect class for `tool`.
    pub fn effect(mut self, tool: &str, effect: warden_plugins::grant::EffectClass) -> Self {
        self.grant.tools.entry(tool.into()).or_default().effect = Some(effect);
        self
    }

    /// Replaces the whole grant (mounts, env names, hosts, limits, config,
    /// tool overrides). Relative directories resolve against the working
    /// directory.
    pub fn grant(mut self, grant: Grant) -> Self {
        self.grant = grant;
        self
    }

    /// Builds (if needed) and loads the plugin.
    ///
    /// # Panics
    /// If the crate cannot be built: the build's errors are on stderr.
    pub async fn load(self) -> Result<TestPlugin, PluginError> {
        let host = shared_host();
        let base = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        let env = self.env;
        let lookup = move |k: &str| env.get(k).cloned().or_else(|| std::env::var(k).ok());
        let plugin = match self.origin {
            Origin::Source(source) => {
                host.load_with_env(&source, &self.grant, &base, lookup)
                    .await?
            }
            Origin::Crate(dir) => {
                let dir = dir.canonicalize().unwrap_or(dir);
                let built = tokio::task::spawn_blocking({
                    let dir = dir.clone();
                    move || {
                        warden_build_support::GuestBuild::new()
                            .manifest_path(dir.join("Cargo.toml"))
                            .build()
                    }
                })
                .await
                .expect("the guest build does not panic")
                .unwrap_or_else(|e| panic!("cannot build the plugin in {}: {e}", dir.display()));
                let wasm = &built
                    .first()
                    .unwrap_or_else(|| panic!("{} built no component", dir.display()))
                    .path;
                load_unpinned(
                    host,
                    &dir.join("plugin.toml"),
                    wasm,
                    &self.grant,
                    &base,
                    lookup,
                )
                .await?
            }
            Origin::Component { manifest, wasm } => {
                load_unpinned(host, &manifest, &wasm, &self.grant, &base, lookup).await?
            }
        };
        Ok(TestPlugin { plugin })
    }
}

async fn load_unpinned(
    host: &PluginHost,
    manifest: &Path,
    wasm: &Path,
    grant: &Grant,
    base: &Path,
    env: impl Fn(&str) -> Option<String>,
) -> Result<LoadedPlugin, PluginError> {
    let mut manifest = Manifest::load(manifest)?;
    manifest.component = Some(wasm.to_owned());
    manifest.sha256 = None;
    let bytes = std::fs::read(wasm).map_err(|error| warden_sandbox::SandboxError::Io {
        action: "cannot read component",
        path: wasm.to_owned(),
        error,
    })?;
    host.load_parts(
        PluginSource::Manifest(wasm.to_owned()),
        manifest,
        bytes.into(),
        None,
        grant,
        base,
        env,
    )
    .await
}

/// The result of one test call, with assertions that panic with a message
/// naming the tool and what happened instead.
#[derive(Debug)]
pub struct ToolCall<T> {
    /// The tool called.
    pub tool: String,
    /// What the guest returned, or why the host stopped it.
    pub result: Result<Result<T, wit::ToolError>, LeaseError>,
    /// What the lease used.
    pub receipt: UsageReceipt,
}

impl<T: std::fmt::Debug> ToolCall<T> {
    /// The guest's successful answer.
    ///
    /// # Panics
    /// If the call did not succeed.
    pub fn ok(&self) -> &T {
        match &self.result {
            Ok(Ok(v)) => v,
            other => panic!("tool `{}` did not succeed: {other:?}", self.tool),
        }
    }

    /// The guest's typed error.
    ///
    /// # Panics
    /// If the guest did not return a tool error.
    pub fn tool_error(&self) -> &wit::ToolError {
        match &self.result {
            Ok(Err(e)) => e,
            other => panic!("tool `{}` returned no tool error: {other:?}", self.tool),
        }
    }

    /// The message of a `denied` tool error.
    ///
    /// # Panics
    /// If the call was not denied.
    pub fn denied(&self) -> &str {
        match self.tool_error() {
            wit::ToolError::Denied(m) => m,
            other => panic!("tool `{}` was not denied: {other:?}", self.tool),
        }
    }

    /// The message of an `invalid-arguments` tool error.
    ///
    /// # Panics
    /// If the arguments were not refused.
    pub fn invalid_arguments(&self) -> &str {
        match self.tool_error() {
            wit::ToolError::InvalidArguments(m) => m,
            other => panic!(
                "tool `{}` did not refuse its arguments: {other:?}",
                self.tool
            ),
        }
    }

    /// The message of a `failed` tool error.
    ///
    /// # Panics
    /// If the call did not fail with `failed`.
    pub fn failed(&self) -> &wit::Failure {
        match self.tool_error() {
            wit::ToolError::Failed(f) => f,
            other => panic!("tool `{}` did not fail: {other:?}", self.tool),
        }
    }

    /// Why the host stopped the call.
    ///
    /// # Panics
    /// If the host did not stop it.
    pub fn lease_failure(&self) -> &LeaseFailure {
        match &self.result {
            Err(e) => &e.failure,
            other => panic!(
                "tool `{}` was not stopped by the host: {other:?}",
                self.tool
            ),
        }
    }

    /// Asserts the receipt's outcome.
    ///
    /// # Panics
    /// If the outcome differs.
    pub fn assert_outcome(&self, expected: Outcome) -> &Self {
        assert_eq!(
            self.receipt.outcome, expected,
            "tool `{}`: {:?}",
            self.tool, self.result
        );
        self
    }
}

impl ToolCall<wit::ToolOutput> {
    /// The output, parsed as JSON.
    ///
    /// # Panics
    /// If the call did not succeed or the output is not JSON.
    pub fn output(&self) -> Value {
        let out = self.ok();
        serde_json::from_str(&out.content).unwrap_or_else(|e| {
            panic!(
                "tool `{}` returned output that is not JSON ({e}): {}",
                self.tool, out.content
            )
        })
    }
}
