//! `warden plugin inspect`, `call` (a tool), `resolve` (a context source),
//! `deliver` (a channel) and `decide` (a policy); `new` and `build` are in
//! `scaffold.rs`, `test` in `plugin_test.rs`.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{Context, Exit};
use warden::grant::{Grant, MountGrant};
use warden::plugins::manifest::{FuelSetting, Unmetered};
use warden::plugins::{LoadedPlugin, PluginHost, PluginSource};
use warden::sandbox::{
    Access, Capabilities, Leased, Limits, PluginKind, Sandbox, UsageReceipt, wit,
};
use warden::units::{ByteSize, HumanDuration, format_duration, parse_bytes, parse_duration};

// Parsed once per process; the size difference does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub(crate) enum PluginCommand {
    /// Show a plugin's kind, imports, exports, tools with their schemas and
    /// effect classes, requested capabilities and limits.
    Inspect {
        /// A plugin.toml, a component .wasm, or builtin:NAME.
        plugin: String,
    },
    /// Call one tool in a fresh sandbox and print its output and usage receipt.
    Call(CallArgs),
    /// Ask a context source for items in a fresh sandbox and print them and
    /// the usage receipt.
    Resolve(ResolveArgs),
    /// Deliver one message through a channel in a fresh sandbox and print
    /// the usage receipt.
    Deliver(DeliverArgs),
    /// Ask a policy for its decision at a hook in a fresh sandbox and print
    /// it and the usage receipt.
    Decide(DecideArgs),
    /// Create a plugin crate: guest SDK dependency, manifest, one example
    /// tool (or context source, channel or policy) and a test in the real
    /// sandbox.
    New(super::scaffold::NewArgs),
    /// Build a plugin crate for wasm32-wasip2, copy the component next to
    /// its plugin.toml and pin it there (component and sha256).
    Build(super::scaffold::BuildArgs),
    /// Run a plugin's declarative test cases (tests/*.toml) against its
    /// built component in the real sandbox, each under its own grant.
    Test(super::plugin_test::TestArgs),
    /// Write the bundle statement a publisher signs (plugin.bundle: the
    /// plugin's name, version and the sha256 of its manifest and
    /// component); sign it with `minisign -Sm plugin.bundle`.
    Bundle(super::publish::BundleArgs),
    /// Pin the exact bundle (digest and signer) of each plugin an agent
    /// uses in AGENT.lock next to it, each verified first; runs then
    /// refuse a plugin whose bundle differs.
    Lock(super::publish::LockArgs),
    /// Verify a plugin's new version and show what it asks for compared
    /// with the locked one; take it if it asks for nothing more, else only
    /// with --accept DIFF (recorded in the lock: who, when, the diff).
    Upgrade(super::publish::UpgradeArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ResolveArgs {
    /// A plugin.toml or builtin:NAME.
    plugin: String,
    /// The query: free text or JSON, as the source understands it.
    #[arg(default_value = "")]
    query: String,
    #[command(flatten)]
    grant: GrantArgs,
}

#[derive(Debug, Args)]
pub(crate) struct DeliverArgs {
    /// A plugin.toml or builtin:NAME.
    plugin: String,
    /// What happened, for example `completed`.
    kind: String,
    /// The payload, a JSON object.
    #[arg(default_value = "{}")]
    payload: String,
    #[command(flatten)]
    grant: GrantArgs,
}

#[derive(Debug, Args)]
pub(crate) struct DecideArgs {
    /// A plugin.toml or builtin:NAME.
    plugin: String,
    /// The hook: run_start, after_response, before_tool_call or
    /// before_finish.
    hook: String,
    /// What the hook is about, a JSON object, for example
    /// '{"tool": "fs__write_file", "arguments": {"path": "a"}}'; its `hook`
    /// tag is added.
    #[arg(default_value = "{}")]
    subject: String,
    #[command(flatten)]
    grant: GrantArgs,
}

#[derive(Debug, Args)]
pub(crate) struct CallArgs {
    /// A plugin.toml or builtin:NAME.
    plugin: String,
    /// The tool to call.
    tool: String,
    /// The arguments, a JSON object.
    #[arg(default_value = "{}")]
    arguments: String,
    #[command(flatten)]
    grant: GrantArgs,
    /// Ask for the tool's side-effect-free preview instead of calling it.
    #[arg(long)]
    preflight: bool,
}

/// The operator's grant, from flags and an optional grant file.
#[derive(Debug, Args)]
pub(crate) struct GrantArgs {
    /// A grant file (TOML); the flags below add to it.
    #[arg(long = "grant", value_name = "FILE")]
    grant_file: Option<PathBuf>,
    /// Bind a requested mount to a directory; `:ro` makes it read-only.
    #[arg(long = "mount", value_name = "NAME=DIR[:ro|:rw]")]
    mounts: Vec<String>,
    /// Pass a requested environment variable through from this shell.
    #[arg(long = "env", value_name = "VAR")]
    env: Vec<String>,
    /// Allow outbound requests to a requested host.
    #[arg(long = "allow-host", value_name = "HOST")]
    hosts: Vec<String>,
    /// Set a value for the plugin's config import.
    #[arg(long = "config", value_name = "KEY=VALUE")]
    config: Vec<String>,
    /// Fuel for the call, or `unmetered`.
    #[arg(long, value_name = "N|unmetered")]
    fuel: Option<String>,
    /// Wall-clock deadline, for example 5s or 500ms.
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,
    /// Linear memory limit, for example 64MiB.
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
}

pub(crate) async fn run(cmd: PluginCommand, ctx: &Context) -> anyhow::Result<()> {
    match cmd {
        PluginCommand::Inspect { plugin } => inspect(&plugin, ctx).await,
        PluginCommand::Call(args) => call(args, ctx).await,
        PluginCommand::Resolve(args) => resolve(args, ctx).await,
        PluginCommand::Deliver(args) => deliver(args, ctx).await,
        PluginCommand::Decide(args) => decide(args, ctx).await,
        PluginCommand::New(args) => super::scaffold::new(args, ctx),
        PluginCommand::Build(args) => super::scaffold::build(args, ctx).await,
        PluginCommand::Test(args) => super::plugin_test::test(args, ctx).await,
        PluginCommand::Bundle(args) => super::publish::bundle(args, ctx),
        PluginCommand::Lock(args) => super::publish::lock(args, ctx).await,
        PluginCommand::Upgrade(args) => super::publish::upgrade(args, ctx).await,
    }
}

/// Loads `plugin` under the grant of `args`.
async fn load_granted(
    plugin: &str,
    args: &GrantArgs,
    ctx: &Context,
) -> anyhow::Result<LoadedPlugin> {
    let (grant, base) = args.grant()?;
    let host = super::plugin_host(&ctx.settings)?;
    let source: PluginSource = plugin.parse().expect("infallible");
    let plugin = host.load(&source, &grant, &base).await?;
    // A mount left out is the usual reason a tool "finds no file": say so
    // by default, with the flag that grants it.
    for (name, request) in &plugin.manifest().mounts {
        if !grant.mounts.contains_key(name) && !super::quiet() {
            eprintln!(
                "note: plugin `{}` requested mount `{name}` ({}) and it is not granted, so the \
                 plugin sees no files there; grant it with --mount {name}=DIR{}",
                plugin.name(),
                request.access,
                if request.access == Access::ReadWrite {
                    " (or DIR:ro, read-only)"
                } else {
                    ""
                }
            );
        }
    }
    for line in plugin.not_granted() {
        tracing::info!("not granted: {line}");
    }
    Ok(plugin)
}

async fn resolve(args: ResolveArgs, ctx: &Context) -> anyhow::Result<()> {
    let plugin = load_granted(&args.plugin, &args.grant, ctx).await?;
    let request = wit::ContextRequest {
        run_id: String::new(),
        query: args.query.clone(),
    };
    let leased = plugin.resolve(&request, None).await?;
    let answer = Answer {
        operation: "resolve",
        effect: "read",
        error_key: "context_error",
        extra: json!({}),
    };
    answer.report(ctx, &leased, context_error_json, |list| {
        let items = items_json(list);
        let text = serde_json::to_string_pretty(&items).unwrap_or_default();
        (json!({ "items": items }), text)
    })
}

async fn deliver(args: DeliverArgs, ctx: &Context) -> anyhow::Result<()> {
    let payload: serde_json::Value = serde_json::from_str(&args.payload)
        .with_context(|| format!("the payload is not valid JSON: `{}`", args.payload))?;
    if !payload.is_object() {
        bail!("the payload must be a JSON object, got `{}`", args.payload);
    }
    let plugin = load_granted(&args.plugin, &args.grant, ctx).await?;
    let delivery = wit::Delivery {
        id: format!("cli-{}", std::process::id()),
        run_id: String::new(),
        kind: args.kind.clone(),
        payload: payload.to_string(),
    };
    let leased = plugin.deliver(&delivery, None).await?;
    let answer = Answer {
        operation: "deliver",
        effect: "write",
        error_key: "delivery_error",
        extra: json!({ "id": delivery.id }),
    };
    answer.report(ctx, &leased, delivery_error_json, |()| {
        (json!({}), format!("delivered {}", delivery.id))
    })
}

async fn decide(args: DecideArgs, ctx: &Context) -> anyhow::Result<()> {
    let hook: warden::engine::PolicyHook = serde_json::from_value(Value::String(args.hook.clone()))
        .map_err(|_| {
            let hooks: Vec<&str> = warden::engine::PolicyHook::ALL
                .iter()
                .map(|h| h.as_str())
                .collect();
            anyhow::anyhow!(
                "`{}` is not a policy hook (hooks: {})",
                args.hook,
                hooks.join(", ")
            )
        })?;
    let subject: Value = serde_json::from_str(&args.subject)
        .with_context(|| format!("the subject is not valid JSON: `{}`", args.subject))?;
    let Value::Object(mut subject) = subject else {
        bail!("the subject must be a JSON object, got `{}`", args.subject);
    };
    match subject.get("hook") {
        Some(tag) if tag != hook.as_str() => {
            bail!("the subject's `hook` is {tag}, but the hook asked is `{hook}`")
        }
        _ => subject.insert("hook".into(), json!(hook.as_str())),
    };
    let plugin = load_granted(&args.plugin, &args.grant, ctx).await?;
    let request = wit::PolicyRequest {
        run_id: String::new(),
        agent: String::new(),
        policy: plugin.name().to_owned(),
        hook: hook.into(),
        subject: Value::Object(subject).to_string(),
    };
    let leased = plugin.decide(&request, None).await?;
    let answer = Answer {
        operation: "decide",
        effect: "read",
        error_key: "policy_error",
        extra: json!({ "hook": hook.as_str() }),
    };
    answer.report(ctx, &leased, policy_error_json, |decision| {
        let text = match decision {
            wit::Decision::Allow => "allow".to_owned(),
            wit::Decision::Deny(reason) => format!("deny: {reason}"),
            wit::Decision::Feedback(message) => format!("feedback: {message}"),
        };
        (decision_json(decision), text)
    })
}

/// A context source's items, as `resolve --json` and `plugin test` show them.
pub(crate) fn items_json(items: &[wit::ContextItem]) -> Value {
    items
        .iter()
        .map(|i| {
            json!({
                "source": i.source,
                "size": i.size,
                "modified_ms": i.modified_ms,
                "truncated": i.truncated,
                "content": i.content,
            })
        })
        .collect()
}

pub(crate) fn context_error_json(e: &wit::ContextError) -> Value {
    match e {
        wit::ContextError::InvalidRequest(m) => json!({ "kind": "invalid_request", "message": m }),
        wit::ContextError::Denied(m) => json!({ "kind": "denied", "message": m }),
        wit::ContextError::Failed(f) => {
            json!({ "kind": "failed", "message": f.message, "retryable": f.retryable })
        }
    }
}

pub(crate) fn delivery_error_json(e: &wit::DeliveryError) -> Value {
    match e {
        wit::DeliveryError::InvalidDelivery(m) => {
            json!({ "kind": "invalid_delivery", "message": m })
        }
        wit::DeliveryError::Denied(m) => json!({ "kind": "denied", "message": m }),
        wit::DeliveryError::Rejected(r) => {
            json!({ "kind": "rejected", "status": r.status, "message": r.message })
        }
        wit::DeliveryError::Failed(f) => {
            json!({ "kind": "failed", "message": f.message, "retryable": f.retryable })
        }
    }
}

pub(crate) fn policy_error_json(e: &wit::PolicyError) -> Value {
    match e {
        wit::PolicyError::InvalidRequest(m) => json!({ "kind": "invalid_request", "message": m }),
        wit::PolicyError::Failed(f) => {
            json!({ "kind": "failed", "message": f.message, "retryable": f.retryable })
        }
    }
}

/// A policy's decision, as `decide --json` and `plugin test` show it.
pub(crate) fn decision_json(decision: &wit::Decision) -> Value {
    match decision {
        wit::Decision::Allow => json!({ "decision": "allow" }),
        wit::Decision::Deny(reason) => json!({ "decision": "deny", "reason": reason }),
        wit::Decision::Feedback(message) => json!({ "decision": "feedback", "message": message }),
    }
}

/// How one lease's answer is printed by `resolve`, `deliver` and `decide`.
struct Answer {
    operation: &'static str,
    effect: &'static str,
    /// The JSON key of the guest's own error, also its name in text
    /// (`context_error` → `context error: ...`).
    error_key: &'static str,
    /// Fields every JSON answer carries.
    extra: Value,
}

impl Answer {
    /// Prints the answer: with `--json` one object (`ok`, the answer's
    /// fields or the guest's error or the lease error, the receipt);
    /// otherwise the answer on stdout or the error on stderr, then the
    /// receipt line. The result is the command's exit.
    fn report<T, E>(
        &self,
        ctx: &Context,
        leased: &Leased<Result<T, E>>,
        error: impl Fn(&E) -> Value,
        answer: impl Fn(&T) -> (Value, String),
    ) -> anyhow::Result<()> {
        if ctx.json {
            let mut body = match &leased.result {
                Ok(Ok(t)) => {
                    let mut body = json!({ "ok": true });
                    merge(&mut body, answer(t).0);
                    body
                }
                Ok(Err(e)) => json!({ "ok": false, self.error_key: error(e) }),
                Err(e) => {
                    json!({ "ok": false, "lease_error": { "outcome": e.failure.outcome(), "message": e.to_string() } })
                }
            };
            merge(&mut body, self.extra.clone());
            body["receipt"] = serde_json::to_value(&leased.receipt)?;
            println!("{}", serde_json::to_string_pretty(&body)?);
        } else {
            match &leased.result {
                Ok(Ok(t)) => println!("{}", answer(t).1),
                Ok(Err(e)) => {
                    let e = error(e);
                    eprintln!(
                        "{}: {}: {}",
                        self.error_key.replace('_', " "),
                        e["kind"].as_str().unwrap_or_default().replace('_', " "),
                        e["message"].as_str().unwrap_or_default()
                    )
                }
                Err(e) => eprintln!("error: {e}"),
            }
            if !super::quiet() {
                eprintln!(
                    "{}",
                    receipt_line(self.operation, self.effect, &leased.receipt)
                );
            }
        }
        exit_for(&leased.result)
    }
}

/// Adds the fields of the object `from` to the object `into`.
fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(into), Value::Object(from)) = (into, from) {
        into.extend(from);
    }
}

fn exit_for<T, E>(
    result: &Result<Result<T, E>, warden::sandbox::LeaseError>,
) -> anyhow::Result<()> {
    match result {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(_)) => Err(Exit::ToolFailed.into()),
        Err(_) => Err(Exit::LeaseFailed.into()),
    }
}

impl GrantArgs {
    /// The grant, with flag directories resolved against the working
    /// directory, and the directory the grant file's paths resolve against.
    fn grant(&self) -> anyhow::Result<(Grant, PathBuf)> {
        let cwd = std::env::current_dir().context("cannot read the working directory")?;
        let (mut grant, base) = match &self.grant_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read grant file `{}`", path.display()))?;
                let grant: Grant = toml::from_str(&text).map_err(|e| {
                    anyhow::anyhow!(
                        "grant file `{}`: {}",
                        path.display(),
                        warden::toml_errors::one_line(&text, &e)
                    )
                })?;
                let base = path.parent().map_or(cwd.clone(), |p| cwd.join(p));
                (grant, base)
            }
            None => (Grant::default(), cwd.clone()),
        };
        for spec in &self.mounts {
            let (name, rest) = spec
                .split_once('=')
                .with_context(|| format!("--mount `{spec}`: expected NAME=DIR[:ro|:rw]"))?;
            let (dir, access) = match rest.rsplit_once(':') {
                Some((dir, "ro")) => (dir, Some(Access::ReadOnly)),
                Some((dir, "rw")) => (dir, Some(Access::ReadWrite)),
                _ => (rest, None),
            };
            if dir.is_empty() {
                bail!("--mount `{spec}`: the directory is empty");
            }
            grant.mounts.insert(
                name.to_owned(),
                MountGrant {
                    dir: cwd.join(dir),
                    access,
                    exclude: Vec::new(),
                },
            );
        }
        grant.env.extend(self.env.iter().cloned());
        grant.hosts.extend(self.hosts.iter().cloned());
        for kv in &self.config {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("--config `{kv}`: expected KEY=VALUE"))?;
            grant.config.insert(k.to_owned(), v.to_owned());
        }
        let limits = &mut grant.limits;
        if let Some(fuel) = &self.fuel {
            limits.fuel = Some(if fuel == "unmetered" {
                FuelSetting::Unmetered(Unmetered::Unmetered)
            } else {
                FuelSetting::Limit(fuel.replace('_', "").parse().with_context(|| {
                    format!("--fuel `{fuel}`: expected a number or `unmetered`")
                })?)
            });
        }
        if let Some(t) = &self.timeout {
            limits.timeout = Some(HumanDuration(
                parse_duration(t).map_err(|e| anyhow::anyhow!("--timeout: {e}"))?,
            ));
        }
        if let Some(m) = &self.memory {
            limits.memory = Some(ByteSize(
                parse_bytes(m).map_err(|e| anyhow::anyhow!("--memory: {e}"))?,
            ));
        }
        Ok((grant, base))
    }
}

async fn call(args: CallArgs, ctx: &Context) -> anyhow::Result<()> {
    let arguments: serde_json::Value = serde_json::from_str(&args.arguments)
        .with_context(|| format!("the arguments are not valid JSON: `{}`", args.arguments))?;
    if !arguments.is_object() {
        bail!(
            "the arguments must be a JSON object, got `{}`",
            args.arguments
        );
    }
    let plugin = load_granted(&args.plugin, &args.grant, ctx).await?;
    let call = wit::Call {
        id: "cli-call".into(),
        run_id: String::new(),
        tool: args.tool.clone(),
        arguments: arguments.to_string(),
        idempotency_key: format!("cli-{}", std::process::id()),
    };
    let effect = plugin
        .tool(&args.tool)
        .map(|t| t.effect.to_string())
        .unwrap_or_default();
    let (content, receipt) = if args.preflight {
        let leased = plugin.preflight(&call, None).await?;
        (
            leased.result.map(|r| {
                r.map(|p| {
                    if p.detail.is_empty() {
                        p.summary
                    } else {
                        format!("{}\n{}", p.summary, p.detail)
                    }
                })
            }),
            leased.receipt,
        )
    } else {
        let leased = plugin.invoke(&call, None).await?;
        (leased.result.map(|r| r.map(|o| o.content)), leased.receipt)
    };
    if ctx.json {
        let body = match &content {
            Ok(Ok(text)) => json!({
                "ok": true,
                "output": serde_json::from_str::<serde_json::Value>(text).unwrap_or_else(|_| json!(text)),
            }),
            Ok(Err(e)) => json!({ "ok": false, "tool_error": tool_error_json(e) }),
            Err(e) => {
                json!({ "ok": false, "lease_error": { "outcome": e.failure.outcome(), "message": e.to_string() } })
            }
        };
        let mut body = body;
        body["tool"] = json!(args.tool);
        body["effect"] = json!(effect);
        body["receipt"] = serde_json::to_value(&receipt)?;
        println!("{}", serde_json::to_string_pretty(&body)?);
    } else {
        match &content {
            Ok(Ok(text)) => match serde_json::from_str::<serde_json::Value>(text) {
                Ok(v) if !args.preflight => println!("{}", serde_json::to_string_pretty(&v)?),
                _ => println!("{text}"),
            },
            Ok(Err(e)) => eprintln!("tool error: {}", describe_tool_error(e)),
            Err(e) => eprintln!("error: {e}"),
        }
        if !super::quiet() {
            eprintln!("{}", receipt_line(&args.tool, &effect, &receipt));
        }
    }
    match content {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(_)) => Err(Exit::ToolFailed.into()),
        Err(_) => Err(Exit::LeaseFailed.into()),
    }
}

pub(crate) fn tool_error_json(e: &wit::ToolError) -> serde_json::Value {
    match e {
        wit::ToolError::InvalidArguments(m) => json!({ "kind": "invalid_arguments", "message": m }),
        wit::ToolError::Denied(m) => json!({ "kind": "denied", "message": m }),
        wit::ToolError::Failed(f) => {
            json!({ "kind": "failed", "message": f.message, "retryable": f.retryable })
        }
    }
}

fn describe_tool_error(e: &wit::ToolError) -> String {
    match e {
        wit::ToolError::InvalidArguments(m) => format!("invalid arguments: {m}"),
        wit::ToolError::Denied(m) => format!("denied: {m}"),
        wit::ToolError::Failed(f) if f.retryable => format!("failed (retryable): {}", f.message),
        wit::ToolError::Failed(f) => format!("failed: {}", f.message),
    }
}

/// One line: outcome, effect class, fuel, peak memory, time, output size.
fn receipt_line(tool: &str, effect: &str, r: &UsageReceipt) -> String {
    let mut line = format!(
        "── {tool} [{effect}] {} · fuel {} · memory {} · {:.2} ms · output {}",
        r.outcome,
        r.fuel_consumed,
        human_bytes(r.peak_memory_bytes),
        r.wall_time_us as f64 / 1000.0,
        human_bytes(r.output_bytes),
    );
    if r.stdout_bytes + r.stderr_bytes > 0 {
        line.push_str(&format!(
            " · stdio {}",
            human_bytes(r.stdout_bytes + r.stderr_bytes)
        ));
    }
    if r.stdio_dropped_bytes > 0 {
        line.push_str(&format!(
            " ({} dropped)",
            human_bytes(r.stdio_dropped_bytes)
        ));
    }
    if let Some(n) = &r.network {
        line.push_str(&format!(
            " · http {} req, {} in, {} out",
            n.requests,
            human_bytes(n.bytes_in),
            human_bytes(n.bytes_out)
        ));
        if n.denied > 0 {
            line.push_str(&format!(", {} denied", n.denied));
        }
    }
    if let Some(u) = &r.unlisted {
        line.push_str(&format!(" · {}", super::render::unlisted(u)));
    }
    if let Some(b) = &r.bundle {
        line.push_str(&format!(
            " · bundle {} {}",
            &b.digest[..12.min(b.digest.len())],
            b.signer
        ));
        if let Some(p) = &b.publisher {
            line.push_str(&format!(" ({p})"));
        }
    }
    line
}

fn human_bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1 << 20) as f64)
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}

async fn inspect(target: &str, ctx: &Context) -> anyhow::Result<()> {
    let as_json = ctx.json;
    let sandbox = super::sandbox(&ctx.settings)?;
    let is_wasm = Path::new(target).extension().is_some_and(|e| e == "wasm");
    if is_wasm {
        // A bare component has no bundle to verify: compiling it is what
        // an operator who requires signatures has ruled out.
        if ctx.settings.trust.is_enforcing() {
            return Err(super::errors::CliError::new(
                "plugin_unsigned",
                format!(
                    "`{target}` is a bare component, and [trust] in warden.toml requires plugins to be signed bundles: inspect its plugin.toml instead"
                ),
            )
            .into());
        }
        return inspect_component(&sandbox, Path::new(target), as_json).await;
    }
    let host = PluginHost::new(sandbox).with_trust(ctx.settings.trust.clone());
    let source: PluginSource = target.parse().expect("infallible");
    // Load with no grant at all: inspect shows what the plugin requests and
    // claims, not what some operator granted.
    let plugin = host
        .load(&source, &Grant::default(), Path::new("."))
        .await?;
    let report = Report::from_plugin(&plugin);
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(())
}

async fn inspect_component(sandbox: &Sandbox, path: &Path, as_json: bool) -> anyhow::Result<()> {
    let wasm = std::fs::read(path)
        .with_context(|| format!("cannot read component `{}`", path.display()))?;
    let name = path
        .file_stem()
        .map_or("component".into(), |s| s.to_string_lossy().into_owned());
    let sb = sandbox.clone();
    let n = name.clone();
    let component = tokio::task::spawn_blocking(move || sb.load(&n, &wasm, None)).await??;
    let granted = sandbox.grant(&component, Capabilities::none(), Limits::default());
    let mut tools = Vec::new();
    if component.kinds().contains(&PluginKind::Tool) {
        tools = granted.describe_tools().await.result?;
    }
    let report = Report {
        name,
        version: None,
        kinds: component.kinds(),
        description: String::new(),
        source: path.display().to_string(),
        sha256: component.sha256().to_owned(),
        imports: component.imports().to_vec(),
        exports: component.exports().to_vec(),
        mounts: Vec::new(),
        env: Vec::new(),
        hosts: Vec::new(),
        limits: None,
        bundle: None,
        tools: tools
            .into_iter()
            .map(|t| ToolReport {
                schema: serde_json::from_str(&t.input_schema).unwrap_or(json!(t.input_schema)),
                name: t.name,
                description: t.description,
                effect: warden::grant::EffectClass::from(t.effect).to_string(),
            })
            .collect(),
    };
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(())
}

/// What `inspect` shows.
struct Report {
    name: String,
    version: Option<String>,
    kinds: Vec<PluginKind>,
    description: String,
    source: String,
    sha256: String,
    imports: Vec<String>,
    exports: Vec<String>,
    mounts: Vec<(String, Access, String)>,
    env: Vec<String>,
    hosts: Vec<String>,
    limits: Option<Limits>,
    tools: Vec<ToolReport>,
    /// The verified bundle: digest and signer.
    bundle: Option<warden::plugins::Provenance>,
}

struct ToolReport {
    name: String,
    description: String,
    effect: String,
    schema: serde_json::Value,
}

impl Report {
    fn from_plugin(p: &LoadedPlugin) -> Report {
        let m = p.manifest();
        let component = p.granted();
        Report {
            name: m.name.clone(),
            version: Some(m.version.clone()),
            kinds: m.kinds.clone(),
            description: m.description.clone(),
            source: p.source().to_string(),
            sha256: component.component().sha256().to_owned(),
            imports: component.component().imports().to_vec(),
            exports: component.component().exports().to_vec(),
            mounts: m
                .mounts
                .iter()
                .map(|(n, r)| (n.clone(), r.access, r.description.clone()))
                .collect(),
            env: m.env.clone(),
            hosts: m.hosts.clone(),
            limits: Some(component.limits().clone()),
            bundle: p.bundle().cloned(),
            tools: p
                .tools()
                .iter()
                .map(|t| ToolReport {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    effect: t.claimed_effect.to_string(),
                    schema: t.input_schema.clone(),
                })
                .collect(),
        }
    }

    fn to_json(&self) -> serde_json::Value {
        json!({
            "name": self.name,
            "version": self.version,
            "kinds": self.kinds,
            "description": self.description,
            "source": self.source,
            "sha256": self.sha256,
            "bundle": self.bundle,
            "imports": self.imports,
            "exports": self.exports,
            "requests": {
                "mounts": self.mounts.iter().map(|(n, a, d)| json!({"name": n, "access": a, "description": d})).collect::<Vec<_>>(),
                "env": self.env,
                "hosts": self.hosts,
            },
            "limits": self.limits.as_ref().map(limits_json),
            "tools": self.tools.iter().map(|t| json!({
                "name": t.name,
                "description": t.description,
                "effect": t.effect,
                "input_schema": t.schema,
            })).collect::<Vec<_>>(),
        })
    }

    fn to_text(&self) -> String {
        let mut s = String::new();
        let kinds = self
            .kinds
            .iter()
            .map(PluginKind::to_string)
            .collect::<Vec<_>>()
            .join(" + ");
        s.push_str(&format!(
            "plugin {}{} ({kinds})\n",
            self.name,
            self.version
                .as_ref()
                .map(|v| format!(" {v}"))
                .unwrap_or_default()
        ));
        if !self.description.is_empty() {
            s.push_str(&format!("  {}\n", self.description));
        }
        s.push_str(&format!(
            "source:  {}\nsha256:  {}\n",
            self.source, self.sha256
        ));
        if let Some(b) = &self.bundle {
            s.push_str(&format!(
                "bundle:  {} signed {}{}\n",
                b.digest,
                b.signer,
                b.publisher
                    .as_deref()
                    .map(|p| format!(" (publisher {p})"))
                    .unwrap_or_default()
            ));
        }
        s.push_str("exports:\n");
        for e in &self.exports {
            s.push_str(&format!("  {e}\n"));
        }
        s.push_str("imports:\n");
        for i in &self.imports {
            s.push_str(&format!("  {i}\n"));
        }
        if self.limits.is_some() {
            s.push_str("requests:\n");
            if self.mounts.is_empty() && self.env.is_empty() && self.hosts.is_empty() {
                s.push_str("  nothing\n");
            }
            for (name, access, description) in &self.mounts {
                s.push_str(&format!(
                    "  mount {name} (/{name}, {access}) {description}\n"
                ));
            }
            for e in &self.env {
                s.push_str(&format!("  env {e}\n"));
            }
            for h in &self.hosts {
                s.push_str(&format!("  host {h}\n"));
            }
        }
        if let Some(l) = &self.limits {
            s.push_str(&format!(
                "limits:  fuel {} · memory {} · tables {} · timeout {} · output {} · stdio {}\n",
                l.fuel.map_or("unmetered".into(), |f| f.to_string()),
                human_bytes(l.memory_bytes),
                l.table_elements,
                format_duration(l.timeout),
                human_bytes(l.output_bytes),
                human_bytes(l.stdio_bytes),
            ));
            if !self.hosts.is_empty() {
                s.push_str(&format!(
                    "         http {} requests · {} of responses per lease\n",
                    l.http_requests,
                    human_bytes(l.http_response_bytes),
                ));
            }
        }
        if !self.tools.is_empty() {
            s.push_str("tools (effect as claimed by the plugin):\n");
            for t in &self.tools {
                s.push_str(&format!(
                    "  {} [{}]\n    {}\n    schema: {}\n",
                    t.name, t.effect, t.description, t.schema
                ));
            }
        }
        s
    }
}

fn limits_json(l: &Limits) -> serde_json::Value {
    json!({
        "fuel": l.fuel,
        "memory_bytes": l.memory_bytes,
        "table_elements": l.table_elements,
        "timeout": format_duration(l.timeout),
        "output_bytes": l.output_bytes,
        "stdio_bytes": l.stdio_bytes,
        "http_requests": l.http_requests,
        "http_response_bytes": l.http_response_bytes,
    })
}
