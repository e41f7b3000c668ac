//! `warden plugin test`: declarative test cases run by this binary against
//! a built component in the real sandbox, under the grants and limits each
//! case writes, with the same grant semantics as production (the grant goes
//! through the plugin host's checks; a context source and a policy run
//! narrowed, as in a run).
//!
//! Cases live in TOML files (`tests/*.toml` next to `plugin.toml`; the
//! format is docs/writing-plugins.md#test-cases). A case calls one tool,
//! context source, channel or policy hook; its mounts are fixtures created
//! in a temporary directory for the case; it expects an output (exact or a
//! subset), a typed error, a denial or a limit hit, and may assert on the
//! usage receipt and on the files the call left in its mounts. A failed
//! expectation prints a diff of expected and actual; any failure makes the
//! exit code 1.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Args;
use serde::Deserialize;
use serde_json::{Value, json};

use super::errors::CliError;
use super::{Context, Exit};
use warden::grant::{Grant, MountGrant};
use warden::plugins::manifest::LimitSettings;
use warden::plugins::{LoadedPlugin, PluginHost, PluginSource};
use warden::sandbox::{Access, Leased, UsageReceipt, wit};
use warden::units::{ByteSize, HumanDuration};

/// `warden plugin test`.
#[derive(Debug, Args)]
pub(crate) struct TestArgs {
    /// A plugin directory (its `tests/*.toml` are run) or one case file.
    #[arg(default_value = ".")]
    path: PathBuf,
    /// Run only the cases whose name contains this text.
    #[arg(long, value_name = "TEXT")]
    filter: Option<String>,
}

/// One case file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    /// The plugin: a `plugin.toml` (relative to this file) or
    /// `builtin:NAME`. Default: the `plugin.toml` of the nearest directory
    /// above this file that has one.
    plugin: Option<String>,
    /// What every case of the file starts from; a case's own settings win
    /// (per mount, variable and config key; per limit).
    #[serde(default)]
    defaults: Setup,
    #[serde(default, rename = "case")]
    cases: Vec<Case>,
}

/// A case's grant: mount fixtures, environment, hosts, config and limits.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Setup {
    #[serde(default)]
    mounts: BTreeMap<String, MountFixture>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    config: BTreeMap<String, String>,
    #[serde(default)]
    limits: LimitSettings,
}

/// A mount's contents for one case, in a fresh temporary directory.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MountFixture {
    /// Narrows the requested access, as a grant's `access` does.
    access: Option<Access>,
    /// A directory (relative to the case file) copied in first.
    dir: Option<PathBuf>,
    /// Files to create, by path inside the mount, with their text.
    #[serde(default)]
    files: BTreeMap<String, String>,
    /// Paths taken out of the grant, as a grant's `exclude`.
    #[serde(default)]
    exclude: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    /// Call this tool with `arguments`.
    tool: Option<String>,
    arguments: Option<Value>,
    /// Ask the tool for its preview instead of calling it.
    #[serde(default)]
    preflight: bool,
    /// Resolve this query (text, or a table sent as JSON).
    resolve: Option<Value>,
    /// Deliver a message of this kind with `payload`.
    deliver: Option<String>,
    payload: Option<Value>,
    /// Ask the policy at this hook about `subject`.
    decide: Option<String>,
    subject: Option<Value>,
    #[serde(default)]
    mounts: BTreeMap<String, MountFixture>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    config: BTreeMap<String, String>,
    #[serde(default)]
    limits: LimitSettings,
    #[serde(default)]
    expect: Expect,
}

/// What a case expects. With none of `output`, `output_includes`, `error`,
/// `denied`, `limit` and `outcome`, it expects success.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    /// Exactly this output.
    output: Option<Value>,
    /// An output holding at least these fields.
    output_includes: Option<Value>,
    /// A typed error of this kind (`invalid_arguments`, `denied`, `failed`, …).
    error: Option<String>,
    /// A denial: a typed `denied` error, or a policy's `deny`.
    #[serde(default)]
    denied: bool,
    /// Text the error's message (or the denial's reason) contains.
    message: Option<String>,
    /// Whether a `failed` error says retryable.
    retryable: Option<bool>,
    /// The sandbox stopped the call at this limit.
    limit: Option<LimitHit>,
    /// The receipt's outcome, any of them (`trap`, …).
    outcome: Option<String>,
    #[serde(default)]
    receipt: ReceiptExpect,
    /// Files in the case's mounts after the call, as `MOUNT/PATH`.
    #[serde(default)]
    files: BTreeMap<String, FileExpect>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum LimitHit {
    Fuel,
    Timeout,
    Memory,
    Tables,
    Output,
}

impl LimitHit {
    fn outcome(self) -> &'static str {
        match self {
            LimitHit::Fuel => "out_of_fuel",
            LimitHit::Timeout => "timeout",
            LimitHit::Memory => "memory_limit",
            LimitHit::Tables => "table_limit",
            LimitHit::Output => "output_limit",
        }
    }
}

/// Bounds on the usage receipt.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReceiptExpect {
    min_fuel: Option<u64>,
    max_fuel: Option<u64>,
    max_memory: Option<ByteSize>,
    max_time: Option<HumanDuration>,
    max_output: Option<ByteSize>,
    max_stdio: Option<ByteSize>,
    http_requests: Option<u64>,
    http_denied: Option<u64>,
}

/// A file the call should have left, or not.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FileExpect {
    /// Exactly this text.
    Exact(String),
    Check(FileCheck),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileCheck {
    /// Text the file contains.
    contains: Option<String>,
    /// The file must not exist.
    #[serde(default)]
    absent: bool,
}

/// What the case asks the plugin.
#[derive(Debug)]
enum Operation {
    Tool {
        tool: String,
        arguments: Value,
        preflight: bool,
    },
    Resolve(String),
    Deliver {
        kind: String,
        payload: Value,
    },
    Decide {
        hook: warden::engine::PolicyHook,
        subject: Value,
    },
}

impl Operation {
    fn describe(&self) -> String {
        match self {
            Operation::Tool {
                tool,
                preflight: true,
                ..
            } => format!("preflight {tool}"),
            Operation::Tool { tool, .. } => format!("tool {tool}"),
            Operation::Resolve(_) => "resolve".into(),
            Operation::Deliver { kind, .. } => format!("deliver {kind}"),
            Operation::Decide { hook, .. } => format!("decide {}", hook.as_str()),
        }
    }
}

/// What one call produced: the answer (output, typed error or the lease's
/// failure) and the receipt.
struct Actual {
    /// `ok`, `error` or `lease_error`, and its body.
    result: ActualResult,
    receipt: UsageReceipt,
}

enum ActualResult {
    Ok(Value),
    /// A typed error: `{"kind", "message", "retryable"?}`.
    Error(Value),
    /// The sandbox stopped the call: outcome and message.
    Lease {
        outcome: String,
        message: String,
    },
}

impl Actual {
    fn to_json(&self) -> Value {
        match &self.result {
            ActualResult::Ok(v) => json!({ "ok": true, "output": v }),
            ActualResult::Error(e) => json!({ "ok": false, "error": e }),
            ActualResult::Lease { outcome, message } => {
                json!({ "ok": false, "lease_error": { "outcome": outcome, "message": message } })
            }
        }
    }

    /// One line for a failure message.
    fn summary(&self) -> String {
        match &self.result {
            ActualResult::Ok(v) => format!("output {}", short(v)),
            ActualResult::Error(e) => format!(
                "{} error: {}",
                e["kind"].as_str().unwrap_or_default(),
                e["message"].as_str().unwrap_or_default()
            ),
            ActualResult::Lease { message, .. } => format!("stopped by the sandbox: {message}"),
        }
    }
}

/// One failed check of a case.
struct Failure {
    check: &'static str,
    message: String,
    expected: Option<Value>,
    actual: Option<Value>,
    /// Line diff of expected and actual, when both are values.
    diff: Option<String>,
}

impl Failure {
    fn new(check: &'static str, message: impl Into<String>) -> Self {
        Failure {
            check,
            message: message.into(),
            expected: None,
            actual: None,
            diff: None,
        }
    }

    fn to_json(&self) -> Value {
        let mut v = json!({ "check": self.check, "message": self.message });
        if let Some(e) = &self.expected {
            v["expected"] = e.clone();
        }
        if let Some(a) = &self.actual {
            v["actual"] = a.clone();
        }
        if let Some(d) = &self.diff {
            v["diff"] = json!(d);
        }
        v
    }
}

/// A case's result.
struct CaseResult {
    file: String,
    name: String,
    operation: String,
    actual: Option<Actual>,
    failures: Vec<Failure>,
}

pub(crate) async fn test(args: TestArgs, ctx: &Context) -> anyhow::Result<()> {
    let files = case_files(&args.path)?;
    let host = super::plugin_host(&ctx.settings)?;
    let cwd = std::env::current_dir().context("cannot read the working directory")?;
    let mut results = Vec::new();
    let mut plugins = Vec::new();
    let mut total = 0;
    for file in &files {
        let (parsed, plugin) = read_case_file(file)?;
        let shown = std::path::absolute(file)
            .map(|abs| super::scaffold::relative(&cwd, &abs))
            .unwrap_or_else(|_| file.clone())
            .display()
            .to_string();
        if !plugins.contains(&plugin.to_string()) {
            plugins.push(plugin.to_string());
        }
        for case in parsed.cases {
            total += 1;
            if args
                .filter
                .as_ref()
                .is_some_and(|f| !case.name.contains(f.as_str()))
            {
                continue;
            }
            let result = run_case(&host, &plugin, file, &shown, &parsed.defaults, case).await?;
            if !ctx.json {
                print_case(&result);
            }
            results.push(result);
        }
    }
    if total == 0 {
        return Err(CliError::new(
            "test_case_invalid",
            format!(
                "no test cases in {}: write `[[case]]` tables in tests/*.toml next to plugin.toml",
                files
                    .iter()
                    .map(|f| format!("`{}`", f.display()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
        .into());
    }
    let failed = results.iter().filter(|r| !r.failures.is_empty()).count();
    let passed = results.len() - failed;
    if ctx.json {
        let body = json!({
            "v": super::contract::VERSION,
            "ok": failed == 0,
            "plugins": plugins,
            "passed": passed,
            "failed": failed,
            "skipped": total - results.len(),
            "cases": results.iter().map(|r| {
                let mut v = json!({
                    "file": r.file,
                    "name": r.name,
                    "operation": r.operation,
                    "ok": r.failures.is_empty(),
                    "failures": r.failures.iter().map(Failure::to_json).collect::<Vec<_>>(),
                });
                if let Some(a) = &r.actual {
                    v["actual"] = a.to_json();
                    v["receipt"] = serde_json::to_value(&a.receipt).unwrap_or_default();
                }
                v
            }).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&body)?);
    } else {
        let skipped = total - results.len();
        println!(
            "{} case{}: {passed} passed, {failed} failed{}",
            results.len(),
            if results.len() == 1 { "" } else { "s" },
            if skipped > 0 {
                format!(", {skipped} filtered out")
            } else {
                String::new()
            }
        );
    }
    if failed > 0 {
        return Err(Exit::TestsFailed.into());
    }
    Ok(())
}

/// The case files `path` names: a case file, or a directory's
/// `tests/*.toml` (sorted).
fn case_files(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_owned()]);
    }
    if !path.is_dir() {
        return Err(CliError::new(
            "usage",
            format!(
                "`{}` is neither a plugin directory nor a case file",
                path.display()
            ),
        )
        .into());
    }
    let tests = path.join("tests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&tests)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "toml") && p.is_file())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    if files.is_empty() {
        return Err(CliError::new(
            "test_case_invalid",
            format!(
                "`{}` holds no case files (`*.toml`): see `warden plugin new` for an example",
                tests.display()
            ),
        )
        .into());
    }
    Ok(files)
}

/// The parsed file and the plugin its cases test.
fn read_case_file(file: &Path) -> anyhow::Result<(CaseFile, PluginSource)> {
    let invalid = |message: String| {
        anyhow::Error::from(
            CliError::new("test_case_invalid", message).with_details(json!({ "file": file })),
        )
    };
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read case file `{}`", file.display()))?;
    let parsed: CaseFile = toml::from_str(&text).map_err(|e| {
        invalid(format!(
            "case file `{}`: {}",
            file.display(),
            warden::toml_errors::one_line(&text, &e)
        ))
    })?;
    let dir = file.parent().unwrap_or(Path::new("."));
    let plugin = match &parsed.plugin {
        Some(p) if p.starts_with("builtin:") => p.parse().expect("infallible"),
        Some(p) => PluginSource::Manifest(dir.join(p)),
        None => {
            let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
            let found = abs
                .ancestors()
                .map(|d| d.join("plugin.toml"))
                .find(|m| m.is_file())
                .ok_or_else(|| {
                    invalid(format!(
                        "case file `{}`: no plugin.toml above it; name one with `plugin = \"…\"`",
                        file.display()
                    ))
                })?;
            PluginSource::Manifest(found)
        }
    };
    for (i, case) in parsed.cases.iter().enumerate() {
        operation(case).map_err(|e| {
            invalid(format!(
                "case file `{}`, case {} (`{}`): {e}",
                file.display(),
                i + 1,
                case.name
            ))
        })?;
        check_expect(&case.expect).map_err(|e| {
            invalid(format!(
                "case file `{}`, case {} (`{}`): {e}",
                file.display(),
                i + 1,
                case.name
            ))
        })?;
    }
    Ok((parsed, plugin))
}

/// The operation a case asks for, or why the case is malformed.
fn operation(case: &Case) -> Result<Operation, String> {
    let asked = [
        case.tool.is_some(),
        case.resolve.is_some(),
        case.deliver.is_some(),
        case.decide.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if asked != 1 {
        return Err("give exactly one of `tool`, `resolve`, `deliver` and `decide`".into());
    }
    let stray = |key: &str, set: bool, owner: &str| {
        if set {
            Err(format!("`{key}` belongs with `{owner}`"))
        } else {
            Ok(())
        }
    };
    if let Some(tool) = &case.tool {
        stray("payload", case.payload.is_some(), "deliver")?;
        stray("subject", case.subject.is_some(), "decide")?;
        let arguments = case.arguments.clone().unwrap_or_else(|| json!({}));
        if !arguments.is_object() {
            return Err("`arguments` must be a table".into());
        }
        return Ok(Operation::Tool {
            tool: tool.clone(),
            arguments,
            preflight: case.preflight,
        });
    }
    stray("arguments", case.arguments.is_some(), "tool")?;
    stray("preflight", case.preflight, "tool")?;
    if let Some(query) = &case.resolve {
        stray("payload", case.payload.is_some(), "deliver")?;
        stray("subject", case.subject.is_some(), "decide")?;
        let query = match query {
            Value::String(s) => s.clone(),
            Value::Object(_) => query.to_string(),
            _ => return Err("`resolve` must be text or a table".into()),
        };
        return Ok(Operation::Resolve(query));
    }
    if let Some(kind) = &case.deliver {
        stray("subject", case.subject.is_some(), "decide")?;
        let payload = case.payload.clone().unwrap_or_else(|| json!({}));
        if !payload.is_object() {
            return Err("`payload` must be a table".into());
        }
        return Ok(Operation::Deliver {
            kind: kind.clone(),
            payload,
        });
    }
    let name = case.decide.as_deref().unwrap_or_default();
    stray("payload", case.payload.is_some(), "deliver")?;
    let hook: warden::engine::PolicyHook = serde_json::from_value(json!(name)).map_err(|_| {
        let hooks: Vec<&str> = warden::engine::PolicyHook::ALL
            .iter()
            .map(|h| h.as_str())
            .collect();
        format!(
            "`{name}` is not a policy hook (hooks: {})",
            hooks.join(", ")
        )
    })?;
    let Value::Object(mut subject) = case.subject.clone().unwrap_or_else(|| json!({})) else {
        return Err("`subject` must be a table".into());
    };
    match subject.get("hook") {
        Some(tag) if tag != hook.as_str() => {
            return Err(format!(
                "the subject's `hook` is {tag}, but the case decides at `{}`",
                hook.as_str()
            ));
        }
        _ => subject.insert("hook".into(), json!(hook.as_str())),
    };
    Ok(Operation::Decide {
        hook,
        subject: Value::Object(subject),
    })
}

fn check_expect(expect: &Expect) -> Result<(), String> {
    let kinds = [
        ("output", expect.output.is_some()),
        ("output_includes", expect.output_includes.is_some()),
        ("error", expect.error.is_some()),
        ("denied", expect.denied),
        ("limit", expect.limit.is_some()),
        ("outcome", expect.outcome.is_some()),
    ];
    let set: Vec<&str> = kinds.iter().filter(|k| k.1).map(|k| k.0).collect();
    if set.len() > 1 {
        return Err(format!(
            "`expect` names {}: give one of them",
            set.iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(" and ")
        ));
    }
    if (expect.message.is_some() || expect.retryable.is_some())
        && !matches!(set.first(), Some(&"error" | &"denied"))
    {
        return Err("`message` and `retryable` go with `error` or `denied`".into());
    }
    for (path, check) in &expect.files {
        if !path.contains('/') {
            return Err(format!(
                "`expect.files` key `{path}` must be MOUNT/PATH, for example `outbox/{path}`"
            ));
        }
        if let FileExpect::Check(c) = check
            && c.absent
            && c.contains.is_some()
        {
            return Err(format!(
                "`expect.files.\"{path}\"`: `absent` and `contains` exclude each other"
            ));
        }
    }
    Ok(())
}

/// Runs one case: fixtures, load under the case's grant, the call, checks.
async fn run_case(
    host: &PluginHost,
    plugin: &PluginSource,
    file: &Path,
    shown: &str,
    defaults: &Setup,
    case: Case,
) -> anyhow::Result<CaseResult> {
    let op = operation(&case).expect("checked when the file was read");
    let mut result = CaseResult {
        file: shown.to_owned(),
        name: case.name.clone(),
        operation: op.describe(),
        actual: None,
        failures: Vec::new(),
    };
    let setup = merge(defaults, &case);
    let base = file.parent().unwrap_or(Path::new(".")).to_owned();
    let fixtures = tempfile::tempdir().context("cannot create a temporary directory")?;
    let mut grant = Grant::default();
    for (name, fixture) in &setup.mounts {
        let dir = fixtures.path().join(name);
        if let Err(e) = make_fixture(&dir, &base, fixture) {
            result
                .failures
                .push(Failure::new("setup", format!("mount `{name}`: {e}")));
            return Ok(result);
        }
        grant.mounts.insert(
            name.clone(),
            MountGrant {
                dir,
                access: fixture.access,
                exclude: fixture.exclude.clone(),
            },
        );
    }
    grant.env = setup.env.keys().cloned().collect();
    grant.hosts = setup.hosts.clone();
    grant.config = setup.config.clone();
    grant.limits = setup.limits.clone();
    let loaded = match host
        .load_with_env(plugin, &grant, &base, |k| setup.env.get(k).cloned())
        .await
    {
        Ok(p) => p,
        Err(e) => {
            let report = super::errors::report(&anyhow::Error::from(e));
            result.failures.push(Failure::new(
                "setup",
                format!(
                    "the plugin did not load under the case's grant ({}): {}",
                    report.code, report.message
                ),
            ));
            return Ok(result);
        }
    };
    let actual = match call(&loaded, &op).await {
        Ok(a) => a,
        Err(e) => {
            let report = super::errors::report(&e);
            result.failures.push(Failure::new(
                "call",
                format!("{}: {}", report.code, report.message),
            ));
            return Ok(result);
        }
    };
    let expect = &case.expect;
    check_result(expect, &op, &actual, &mut result.failures);
    check_receipt(&expect.receipt, &actual.receipt, &mut result.failures);
    for (path, check) in &expect.files {
        check_file(fixtures.path(), path, check, &mut result.failures);
    }
    result.actual = Some(actual);
    Ok(result)
}

/// The case's setup over the file's defaults.
fn merge(defaults: &Setup, case: &Case) -> Setup {
    let mut setup = defaults.clone();
    setup.mounts.extend(case.mounts.clone());
    setup.env.extend(case.env.clone());
    setup.hosts.extend(case.hosts.iter().cloned());
    setup.config.extend(case.config.clone());
    let (l, c) = (&mut setup.limits, &case.limits);
    l.fuel = c.fuel.or(l.fuel);
    l.memory = c.memory.or(l.memory);
    l.tables = c.tables.or(l.tables);
    l.timeout = c.timeout.or(l.timeout);
    l.output = c.output.or(l.output);
    l.stdio = c.stdio.or(l.stdio);
    l.http_requests = c.http_requests.or(l.http_requests);
    l.http_response = c.http_response.or(l.http_response);
    setup
}

/// Fills `dir` with the fixture: its `dir` copied, then its `files`.
fn make_fixture(dir: &Path, base: &Path, fixture: &MountFixture) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    if let Some(from) = &fixture.dir {
        let from = base.join(from);
        copy_dir(&from, dir).with_context(|| format!("cannot copy `{}`", from.display()))?;
    }
    for (path, text) in &fixture.files {
        let relative = Path::new(path);
        if relative.is_absolute()
            || relative
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            anyhow::bail!("fixture file `{path}` must be a plain relative path");
        }
        let target = dir.join(relative);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&target, text)
            .with_context(|| format!("cannot write fixture file `{path}`"))?;
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            std::fs::create_dir_all(&target)?;
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Makes the call in a fresh lease.
async fn call(plugin: &LoadedPlugin, op: &Operation) -> anyhow::Result<Actual> {
    Ok(match op {
        Operation::Tool {
            tool,
            arguments,
            preflight,
        } => {
            let call = wit::Call {
                id: "call-1-1".into(),
                run_id: "test-run".into(),
                tool: tool.clone(),
                arguments: arguments.to_string(),
                idempotency_key: "test-run/call-1-1".into(),
            };
            if *preflight {
                let leased = plugin.preflight(&call, None).await?;
                actual(
                    leased,
                    super::plugin::tool_error_json,
                    |p| json!({ "summary": p.summary, "detail": p.detail }),
                )
            } else {
                let leased = plugin.invoke(&call, None).await?;
                actual(leased, super::plugin::tool_error_json, |o| {
                    serde_json::from_str(&o.content).unwrap_or_else(|_| json!(o.content))
                })
            }
        }
        Operation::Resolve(query) => {
            let request = wit::ContextRequest {
                run_id: "test-run".into(),
                query: query.clone(),
            };
            let leased = plugin.resolve(&request, None).await?;
            actual(leased, super::plugin::context_error_json, |items| {
                super::plugin::items_json(items)
            })
        }
        Operation::Deliver { kind, payload } => {
            let delivery = wit::Delivery {
                id: "test-delivery".into(),
                run_id: "test-run".into(),
                kind: kind.clone(),
                payload: payload.to_string(),
            };
            let leased = plugin.deliver(&delivery, None).await?;
            actual(leased, super::plugin::delivery_error_json, |()| json!(null))
        }
        Operation::Decide { hook, subject } => {
            let request = wit::PolicyRequest {
                run_id: "test-run".into(),
                agent: "test-agent".into(),
                policy: plugin.name().to_owned(),
                hook: (*hook).into(),
                subject: subject.to_string(),
            };
            let leased = plugin.decide(&request, None).await?;
            actual(
                leased,
                super::plugin::policy_error_json,
                super::plugin::decision_json,
            )
        }
    })
}

fn actual<T, E>(
    leased: Leased<Result<T, E>>,
    error: impl Fn(&E) -> Value,
    output: impl Fn(&T) -> Value,
) -> Actual {
    let result = match &leased.result {
        Ok(Ok(t)) => ActualResult::Ok(output(t)),
        Ok(Err(e)) => ActualResult::Error(error(e)),
        Err(e) => ActualResult::Lease {
            outcome: e.failure.outcome().to_string(),
            message: e.to_string(),
        },
    };
    Actual {
        result,
        receipt: leased.receipt,
    }
}

fn check_result(expect: &Expect, op: &Operation, actual: &Actual, failures: &mut Vec<Failure>) {
    let outcome = actual.receipt.outcome.as_str();
    let unexpected = |wanted: String| {
        Failure::new(
            "result",
            format!("expected {wanted}, got {}", actual.summary()),
        )
    };
    if let Some(hit) = expect.limit {
        if outcome != hit.outcome() {
            failures.push(unexpected(format!(
                "the {} limit to stop the call",
                hit_name(hit)
            )));
        }
        return;
    }
    if let Some(wanted) = &expect.outcome {
        if outcome != wanted {
            failures.push(unexpected(format!("outcome `{wanted}`")));
        }
        return;
    }
    let is_policy = matches!(op, Operation::Decide { .. });
    if expect.denied {
        let reason = match &actual.result {
            ActualResult::Error(e) if e["kind"] == "denied" => e["message"].as_str(),
            ActualResult::Ok(d) if is_policy && d["decision"] == "deny" => d["reason"].as_str(),
            _ => {
                failures.push(unexpected("a denial".into()));
                return;
            }
        };
        check_message(expect, reason.unwrap_or_default(), failures);
        return;
    }
    if let Some(kind) = &expect.error {
        match &actual.result {
            ActualResult::Error(e) if e["kind"] == kind.as_str() => {
                check_message(expect, e["message"].as_str().unwrap_or_default(), failures);
                if let Some(r) = expect.retryable
                    && e["retryable"].as_bool() != Some(r)
                {
                    failures.push(Failure::new(
                        "retryable",
                        format!("expected retryable = {r}, got {}", e["retryable"]),
                    ));
                }
            }
            _ => failures.push(unexpected(format!("a `{kind}` error"))),
        }
        return;
    }
    let ActualResult::Ok(output) = &actual.result else {
        failures.push(unexpected("success".into()));
        return;
    };
    if let Some(wanted) = &expect.output
        && wanted != output
    {
        failures.push(value_failure(
            "output",
            "the output differs",
            wanted,
            output.clone(),
        ));
    }
    if let Some(wanted) = &expect.output_includes
        && !includes(output, wanted)
    {
        failures.push(value_failure(
            "output_includes",
            "the output does not include what was expected",
            wanted,
            project(output, wanted),
        ));
    }
}

fn hit_name(hit: LimitHit) -> &'static str {
    match hit {
        LimitHit::Fuel => "fuel",
        LimitHit::Timeout => "time",
        LimitHit::Memory => "memory",
        LimitHit::Tables => "table",
        LimitHit::Output => "output",
    }
}

fn check_message(expect: &Expect, message: &str, failures: &mut Vec<Failure>) {
    if let Some(wanted) = &expect.message
        && !message.contains(wanted.as_str())
    {
        failures.push(Failure {
            expected: Some(json!(wanted)),
            actual: Some(json!(message)),
            ..Failure::new(
                "message",
                format!("expected the message to contain `{wanted}`, got `{message}`"),
            )
        });
    }
}

fn value_failure(check: &'static str, message: &str, expected: &Value, actual: Value) -> Failure {
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default();
    Failure {
        check,
        message: message.into(),
        diff: Some(diff(&pretty(expected), &pretty(&actual))),
        expected: Some(expected.clone()),
        actual: Some(actual),
    }
}

/// Whether `actual` holds `wanted`: every field of an object (recursively),
/// arrays of the same length element by element, other values equal.
fn includes(actual: &Value, wanted: &Value) -> bool {
    match (actual, wanted) {
        (Value::Object(a), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| a.get(k).is_some_and(|av| includes(av, wv))),
        (Value::Array(a), Value::Array(w)) => {
            a.len() == w.len() && a.iter().zip(w).all(|(av, wv)| includes(av, wv))
        }
        _ => actual == wanted,
    }
}

/// `actual` cut down to the fields `wanted` names, so that a diff against
/// `wanted` shows only what differs.
fn project(actual: &Value, wanted: &Value) -> Value {
    match (actual, wanted) {
        (Value::Object(a), Value::Object(w)) => Value::Object(
            w.iter()
                .filter_map(|(k, wv)| a.get(k).map(|av| (k.clone(), project(av, wv))))
                .collect(),
        ),
        (Value::Array(a), Value::Array(w)) if a.len() == w.len() => {
            Value::Array(a.iter().zip(w).map(|(av, wv)| project(av, wv)).collect())
        }
        _ => actual.clone(),
    }
}

/// A line diff: ` ` common, `-` only in `expected`, `+` only in `actual`.
fn diff(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    // Longest common subsequence, by suffix lengths.
    let mut lcs = vec![vec![0usize; a.len() + 1]; e.len() + 1];
    for i in (0..e.len()).rev() {
        for j in (0..a.len()).rev() {
            lcs[i][j] = if e[i] == a[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < e.len() || j < a.len() {
        if i < e.len() && j < a.len() && e[i] == a[j] {
            out.push_str(&format!("  {}\n", e[i]));
            i += 1;
            j += 1;
        } else if i < e.len() && (j == a.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push_str(&format!("- {}\n", e[i]));
            i += 1;
        } else {
            out.push_str(&format!("+ {}\n", a[j]));
            j += 1;
        }
    }
    out
}

fn check_receipt(expect: &ReceiptExpect, r: &UsageReceipt, failures: &mut Vec<Failure>) {
    let mut bound = |name: &str, ok: bool, wanted: String, got: String| {
        if !ok {
            failures.push(Failure::new(
                "receipt",
                format!("receipt: expected {name} {wanted}, got {got}"),
            ));
        }
    };
    if let Some(min) = expect.min_fuel {
        bound(
            "fuel",
            r.fuel_consumed >= min,
            format!("at least {min}"),
            r.fuel_consumed.to_string(),
        );
    }
    if let Some(max) = expect.max_fuel {
        bound(
            "fuel",
            r.fuel_consumed <= max,
            format!("at most {max}"),
            r.fuel_consumed.to_string(),
        );
    }
    if let Some(ByteSize(max)) = expect.max_memory {
        bound(
            "peak memory",
            r.peak_memory_bytes <= max,
            format!("at most {max} bytes"),
            format!("{} bytes", r.peak_memory_bytes),
        );
    }
    if let Some(HumanDuration(max)) = expect.max_time {
        bound(
            "wall time",
            u128::from(r.wall_time_us) <= max.as_micros(),
            format!("at most {}", warden::units::format_duration(max)),
            format!("{:.2} ms", r.wall_time_us as f64 / 1000.0),
        );
    }
    if let Some(ByteSize(max)) = expect.max_output {
        bound(
            "output",
            r.output_bytes <= max,
            format!("at most {max} bytes"),
            format!("{} bytes", r.output_bytes),
        );
    }
    if let Some(ByteSize(max)) = expect.max_stdio {
        let stdio = r.stdout_bytes + r.stderr_bytes + r.log_bytes;
        bound(
            "stdio",
            stdio <= max,
            format!("at most {max} bytes"),
            format!("{stdio} bytes"),
        );
    }
    let network = r.network.as_ref();
    if let Some(n) = expect.http_requests {
        let got = network.map_or(0, |n| n.requests);
        bound("http requests", got == n, n.to_string(), got.to_string());
    }
    if let Some(n) = expect.http_denied {
        let got = network.map_or(0, |n| n.denied);
        bound(
            "denied http requests",
            got == n,
            n.to_string(),
            got.to_string(),
        );
    }
}

fn check_file(root: &Path, path: &str, check: &FileExpect, failures: &mut Vec<Failure>) {
    let target = root.join(path);
    let text = std::fs::read(&target)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    match (check, text) {
        (FileExpect::Check(FileCheck { absent: true, .. }), None) => {}
        (FileExpect::Check(FileCheck { absent: true, .. }), Some(_)) => failures.push(
            Failure::new("files", format!("expected no file `{path}`, but it exists")),
        ),
        (_, None) => failures.push(Failure::new(
            "files",
            format!("expected a file `{path}`, but there is none"),
        )),
        (FileExpect::Exact(wanted), Some(text)) => {
            if *wanted != text {
                failures.push(Failure {
                    diff: Some(diff(wanted, &text)),
                    expected: Some(json!(wanted)),
                    actual: Some(json!(text)),
                    ..Failure::new("files", format!("file `{path}` differs"))
                });
            }
        }
        (FileExpect::Check(FileCheck { contains, .. }), Some(text)) => {
            if let Some(wanted) = contains
                && !text.contains(wanted.as_str())
            {
                failures.push(Failure {
                    expected: Some(json!(wanted)),
                    actual: Some(json!(text)),
                    ..Failure::new(
                        "files",
                        format!(
                            "expected file `{path}` to contain `{wanted}`, got `{}`",
                            text.trim_end()
                        ),
                    )
                });
            }
        }
    }
}

/// A value on one line, cut at 200 characters.
fn short(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() > 200 {
        format!("{}…", text.chars().take(200).collect::<String>())
    } else {
        text
    }
}

fn print_case(r: &CaseResult) {
    let receipt = r.actual.as_ref().map_or(String::new(), |a| {
        format!(
            " ({} · fuel {} · {:.2} ms)",
            a.receipt.outcome,
            a.receipt.fuel_consumed,
            a.receipt.wall_time_us as f64 / 1000.0
        )
    });
    if r.failures.is_empty() {
        println!("ok    {}: {}{receipt}", r.file, r.name);
        return;
    }
    println!("FAIL  {}: {} [{}]{receipt}", r.file, r.name, r.operation);
    for f in &r.failures {
        println!("      {}", f.message);
        if let Some(d) = &f.diff {
            println!("      (- expected, + actual)");
            for line in d.lines() {
                println!("      {line}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diff_marks_what_only_one_side_has() {
        assert_eq!(
            diff(
                "{\n  \"a\": 1,\n  \"b\": 2\n}",
                "{\n  \"a\": 1,\n  \"b\": 3\n}"
            ),
            "  {\n    \"a\": 1,\n-   \"b\": 2\n+   \"b\": 3\n  }\n"
        );
    }

    #[test]
    fn includes_is_a_subset_of_fields_and_exact_elsewhere() {
        let actual = json!({ "a": 1, "b": { "c": [ { "d": 1, "e": 2 } ] } });
        assert!(includes(&actual, &json!({ "b": { "c": [ { "e": 2 } ] } })));
        assert!(!includes(&actual, &json!({ "b": { "c": [] } })));
        assert!(!includes(&actual, &json!({ "z": null })));
        assert_eq!(
            project(&actual, &json!({ "b": { "c": [ { "e": 5 } ] } })),
            json!({ "b": { "c": [ { "e": 2 } ] } })
        );
    }

    #[test]
    fn a_case_names_what_is_wrong_with_it() {
        let parse = |text: &str| toml::from_str::<CaseFile>(text).map(|f| f.cases);
        let cases = parse(
            "[[case]]\nname = \"x\"\ntool = \"t\"\ndeliver = \"completed\"\n\n[[case]]\nname = \"y\"\nresolve = \"q\"\nexpect = { output = 1, error = \"failed\" }\n",
        )
        .unwrap();
        assert!(operation(&cases[0]).unwrap_err().contains("exactly one of"));
        assert!(
            check_expect(&cases[1].expect)
                .unwrap_err()
                .contains("`output` and `error`")
        );
        assert!(parse("[[case]]\nname = \"z\"\ntool = \"t\"\nexpect = { outptu = 1 }\n").is_err());
    }
}
