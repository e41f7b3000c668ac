//! Test guest `hostile`: one tool component whose tools misbehave on purpose,
//! so the host's tests can prove a plugin cannot escape or starve it.
//!
//! `invoke` dispatches on the tool name; each behaviour is one small function
//! below. Arguments are a JSON object (`call.arguments`); the keys each tool
//! reads are in its `describe` schema and its function's doc. A tool that
//! returns reports JSON text; errors it understands are `failed` (or
//! `invalid-arguments` for bad arguments).
//!
//! Imports: `warden:plugin/host` and, through Rust's std, WASI cli,
//! clocks, filesystem, io and random. Nothing else.

mod bindings {
    //! wit-bindgen glue for the `tool-plugin` world, and the export of
    //! [`Hostile`](super::Hostile): the only generated unsafe code.
    #![allow(missing_docs, unsafe_code, clippy::all)]
    wit_bindgen::generate!({ path: "../../../wit", world: "tool-plugin" });
    use super::Hostile;
    export!(Hostile with_types_in crate::bindings);
}

use std::fs::{self, FileTimes, OpenOptions};
use std::hint::black_box;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bindings::exports::warden::plugin::tool::Guest;
use bindings::warden::plugin::host;
use bindings::warden::plugin::types::{
    Call, Effect, Failure, LogLevel, Preview, ToolError, ToolOutput, ToolSpec,
};
use serde_json::{Map, Value, json};

const MIB: u64 = 1 << 20;

/// Every tool: name, description, JSON Schema of the arguments, effect.
const TOOLS: &[(&str, &str, &str, Effect)] = &[
    (
        "noop",
        "Returns {} at once.",
        r#"{"type":"object"}"#,
        Effect::Read,
    ),
    (
        "spin",
        "Loops forever without calling the host.",
        r#"{"type":"object"}"#,
        Effect::Read,
    ),
    (
        "sleep_forever",
        "Blocks forever in a host call (a WASI clock poll).",
        r#"{"type":"object"}"#,
        Effect::Read,
    ),
    (
        "host_call_loop",
        "Calls the host's config import forever.",
        r#"{"type":"object"}"#,
        Effect::Read,
    ),
    (
        "grow_memory",
        "Allocates chunk_bytes at a time until an allocation fails; with abort, lets the failure abort the guest.",
        r#"{"type":"object","properties":{"chunk_bytes":{"type":"integer","minimum":1},"abort":{"type":"boolean"}}}"#,
        Effect::Read,
    ),
    (
        "recurse",
        "Recurses without end until the stack overflows.",
        r#"{"type":"object"}"#,
        Effect::Read,
    ),
    (
        "huge_stdout",
        "Writes bytes (default 64 MiB) to stdout in chunks.",
        r#"{"type":"object","properties":{"bytes":{"type":"integer","minimum":0},"chunk_bytes":{"type":"integer","minimum":1}}}"#,
        Effect::Read,
    ),
    (
        "huge_stderr",
        "Writes bytes (default 64 MiB) to stderr in chunks.",
        r#"{"type":"object","properties":{"bytes":{"type":"integer","minimum":0},"chunk_bytes":{"type":"integer","minimum":1}}}"#,
        Effect::Read,
    ),
    (
        "huge_output",
        "Returns an output of exactly bytes bytes (default 16 MiB): a JSON string.",
        r#"{"type":"object","properties":{"bytes":{"type":"integer","minimum":2}}}"#,
        Effect::Read,
    ),
    (
        "log_flood",
        "Sends lines log lines of line_bytes bytes each to the host's log import.",
        r#"{"type":"object","properties":{"lines":{"type":"integer","minimum":0},"line_bytes":{"type":"integer","minimum":0}}}"#,
        Effect::Read,
    ),
    (
        "panic",
        "Panics with message.",
        r#"{"type":"object","properties":{"message":{"type":"string"}}}"#,
        Effect::Read,
    ),
    (
        "fs",
        "Performs one filesystem operation, after waiting delay_ms (default 0) in a host call: op is read, write, append, contains, truncate, create, rename, unlink, set_times, mkdir, rmdir, list, read_link or stat.",
        r#"{"type":"object","required":["op"],"properties":{"op":{"enum":["read","write","append","contains","truncate","create","rename","unlink","set_times","mkdir","rmdir","list","read_link","stat"]},"needle":{"type":"string"},"path":{"type":"string"},"content":{"type":"string"},"len":{"type":"integer","minimum":0},"from":{"type":"string"},"to":{"type":"string"},"modified_ms":{"type":"integer","minimum":0},"delay_ms":{"type":"integer","minimum":0}}}"#,
        Effect::Write,
    ),
    (
        "env",
        "Reports the environment variables named in names, and all it sees.",
        r#"{"type":"object","properties":{"names":{"type":"array","items":{"type":"string"}}}}"#,
        Effect::Read,
    ),
    (
        "set_marker",
        "Leaves a marker in guest memory, in the environment and, if path is given, in a file.",
        r#"{"type":"object","properties":{"path":{"type":"string"}}}"#,
        Effect::Read,
    ),
    (
        "get_marker",
        "Reports which markers left by set_marker are visible.",
        r#"{"type":"object","properties":{"path":{"type":"string"}}}"#,
        Effect::Read,
    ),
    (
        "scatter_secret",
        "Writes a secret derived from seed across its linear memory (the stack, a zero-initialised static, a static with initial data, the heap, freshly grown pages), then scans its memory for it: {\"written\": words, \"found\": words}.",
        r#"{"type":"object","required":["seed"],"properties":{"seed":{"type":"integer","minimum":0}}}"#,
        Effect::Read,
    ),
    (
        "scan_secret",
        "Scans all of its linear memory for the secrets of seeds: {\"found\": words, \"data_restored\": bool, \"pages\": n}.",
        r#"{"type":"object","required":["seeds"],"properties":{"seeds":{"type":"array","items":{"type":"integer","minimum":0}}}}"#,
        Effect::Read,
    ),
    (
        "echo",
        "Returns its arguments, logs them and reads config_key (default echo) from the host's config.",
        r#"{"type":"object","properties":{"config_key":{"type":"string"}}}"#,
        Effect::Read,
    ),
    (
        "nested_output",
        "Returns a JSON array nested depth (default 125) levels deep.",
        r#"{"type":"object","properties":{"depth":{"type":"integer","minimum":0}}}"#,
        Effect::Read,
    ),
    (
        "flaky",
        "Fails with a retryable error the first fail_times calls (a counter in the file at path), then succeeds; appends the idempotency key it was given to <path>.keys every time.",
        r#"{"type":"object","required":["path"],"properties":{"path":{"type":"string"},"fail_times":{"type":"integer","minimum":0}}}"#,
        Effect::Read,
    ),
    (
        "write_then_sleep",
        "Appends content to the file at path, then blocks forever: a write whose lease dies after its effect.",
        r#"{"type":"object","required":["path","content"],"properties":{"path":{"type":"string"},"content":{"type":"string"}}}"#,
        Effect::Write,
    ),
    (
        "block_once",
        "Appends content to the file at path and the idempotency key to <path>.keys; the first time (no <path>.blocked yet) it then blocks forever, later it returns: a call whose driver dies mid-call, then succeeds on retry.",
        r#"{"type":"object","required":["path","content"],"properties":{"path":{"type":"string"},"content":{"type":"string"}}}"#,
        Effect::Write,
    ),
    (
        "slow_append",
        "Appends the lines step-0 to step-<steps - 1> to the file at path, one write each through one open file, waiting step_ms (default 0) in a host call after each: a write that takes long, in many steps.",
        r#"{"type":"object","required":["path","steps"],"properties":{"path":{"type":"string"},"steps":{"type":"integer","minimum":0},"step_ms":{"type":"integer","minimum":0}}}"#,
        Effect::Write,
    ),
    (
        "sleep",
        "Appends +label to the file at trace, waits as many milliseconds as the JSON object in the file at delays gives label (0 if none), appends -label, then returns {\"label\": label}: a call that takes as long as it is told from outside its arguments.",
        r#"{"type":"object","required":["label","trace","delays"],"properties":{"label":{"type":"string"},"trace":{"type":"string"},"delays":{"type":"string"}}}"#,
        Effect::Read,
    ),
    (
        "say",
        "Says exactly what it is given: logs log through the host, writes stdout and stderr, then returns output as its output text (default {}), or fails with error.",
        r#"{"type":"object","properties":{"output":{"type":"string"},"log":{"type":"string"},"stdout":{"type":"string"},"stderr":{"type":"string"},"error":{"type":"string"}}}"#,
        Effect::Read,
    ),
];

struct Hostile;

impl Guest for Hostile {
    fn describe() -> Vec<ToolSpec> {
        TOOLS
            .iter()
            .map(|&(name, description, schema, effect)| ToolSpec {
                name: name.into(),
                description: description.into(),
                input_schema: schema.into(),
                effect,
            })
            .collect()
    }

    /// Side-effect free, as the contract requires: names the tool and echoes
    /// the arguments; or, when the arguments hold `preview` (and
    /// `preview_detail`), says exactly that, decoded: a preview with the
    /// bytes a forging plugin would send.
    fn preflight(call: Call) -> Result<Preview, ToolError> {
        if !TOOLS.iter().any(|(name, ..)| *name == call.tool) {
            return Err(unknown_tool(&call.tool));
        }
        let args = parse_arguments(&call.arguments).unwrap_or(Value::Null);
        if let Some(summary) = args["preview"].as_str() {
            return Ok(Preview {
                summary: summary.to_owned(),
                detail: args["preview_detail"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            });
        }
        Ok(Preview {
            summary: format!("hostile tool `{}`", call.tool),
            detail: call.arguments,
        })
    }

    fn invoke(call: Call) -> Result<ToolOutput, ToolError> {
        let args = parse_arguments(&call.arguments)?;
        let content = match call.tool.as_str() {
            "noop" => Ok("{}".to_owned()),
            "spin" => spin(),
            "sleep_forever" => sleep_forever(),
            "host_call_loop" => host_call_loop(),
            "grow_memory" => grow_memory(&args),
            "recurse" => Ok(json!({ "depth": recurse(0) }).to_string()),
            "huge_stdout" => huge_write(&args, &mut io::stdout().lock()),
            "huge_stderr" => huge_write(&args, &mut io::stderr().lock()),
            "huge_output" => huge_output(&args),
            "log_flood" => log_flood(&args),
            "panic" => panic_now(&args),
            "fs" => fs_op(&args),
            "env" => env(&args),
            "set_marker" => set_marker(&args),
            "get_marker" => get_marker(&args),
            "echo" => echo(&args),
            "scatter_secret" => secret::scatter(&args),
            "scan_secret" => secret::scan(&args),
            "say" => say(&args),
            "sleep" => sleep(&args),
            "nested_output" => nested_output(&args),
            "flaky" => flaky(&args, &call.idempotency_key),
            "write_then_sleep" => write_then_sleep(&args),
            "block_once" => block_once(&args, &call.idempotency_key),
            "slow_append" => slow_append(&args),
            other => Err(unknown_tool(other)),
        }?;
        Ok(ToolOutput { content })
    }
}

/// `spin`: burns CPU forever without a host call. Only fuel or the epoch
/// deadline stop it.
fn spin() -> ! {
    let mut counter: u64 = 0;
    loop {
        counter = black_box(counter.wrapping_add(1));
    }
}

/// `sleep_forever`: blocks in a host call (a `wasi:clocks` subscription
/// polled through `wasi:io/poll`) that never returns in practice. Only the
/// host's timeout or cancellation ends it; fuel does not run out while the
/// guest is blocked.
fn sleep_forever() -> ! {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);
    loop {
        std::thread::sleep(CENTURY);
    }
}

/// `host_call_loop`: calls the host's `config` import forever, so the guest
/// spends most of its time in the host.
fn host_call_loop() -> ! {
    loop {
        black_box(host::config(black_box("host_call_loop")));
    }
}

/// `grow_memory {chunk_bytes?: u64 = 1 MiB, abort?: bool}`: keeps allocating chunks,
/// writing one byte per 64 KiB page of each, until an allocation fails; then
/// returns a `failed` error naming how many bytes it got. A host that traps
/// on a refused `memory.grow` ends the call before that. With `abort`,
/// allocation failure aborts the guest (an `unreachable` trap) instead.
fn grow_memory(args: &Value) -> Result<String, ToolError> {
    let chunk = usize_arg(args, "chunk_bytes", MIB)?.max(1);
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut total: u64 = 0;
    if args.get("abort").and_then(Value::as_bool) == Some(true) {
        // Plain allocation: a refused growth ends in `handle_alloc_error`,
        // which aborts (an `unreachable` trap), as most guests would.
        loop {
            let mut block = vec![0u8; chunk];
            block[0] = 1;
            held.push(black_box(block));
        }
    }
    loop {
        let mut block: Vec<u8> = Vec::new();
        if let Err(e) = block
            .try_reserve_exact(chunk)
            .and_then(|()| held.try_reserve(1))
        {
            return Err(failed(format!(
                "allocation failed after {total} bytes: {e}"
            )));
        }
        for page in block.spare_capacity_mut().chunks_mut(64 * 1024) {
            page[0].write(1);
        }
        held.push(black_box(block));
        total += chunk as u64;
    }
}

/// `recurse`: recursion the optimiser can neither end nor turn into a loop:
/// the base case is hidden behind `black_box`, and work remains after each
/// call returns. Ends with a stack overflow trap.
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    if black_box(depth) == u64::MAX {
        return depth;
    }
    let below = recurse(depth + 1);
    black_box(below).wrapping_add(depth)
}

/// `huge_stdout` / `huge_stderr {bytes?: u64 = 64 MiB, chunk_bytes?: u64 =
/// 64 KiB}`: writes `bytes` bytes in chunks of `x`s, each ending in a newline.
/// Returns `{"written": n}`, or a `failed` error when a write is refused
/// (for example once the host's capture is full).
fn huge_write(args: &Value, out: &mut dyn Write) -> Result<String, ToolError> {
    let total = u64_arg(args, "bytes", 64 * MIB)?;
    let chunk_size = usize_arg(args, "chunk_bytes", 64 * 1024)?.max(1);
    let mut chunk = vec![b'x'; chunk_size];
    if let Some(last) = chunk.last_mut() {
        *last = b'\n';
    }
    let mut written: u64 = 0;
    while written < total {
        let n = chunk_size.min(usize::try_from(total - written).unwrap_or(usize::MAX));
        if let Err(e) = out.write_all(&chunk[..n]).and_then(|()| out.flush()) {
            return Err(failed(format!("write failed after {written} bytes: {e}")));
        }
        written += n as u64;
    }
    Ok(json!({ "written": written }).to_string())
}

/// `huge_output {bytes?: u64 = 16 MiB}`: returns an output of exactly `bytes`
/// bytes (at least 2): a JSON string of `a`s, quotes included.
fn huge_output(args: &Value) -> Result<String, ToolError> {
    let n = usize_arg(args, "bytes", 16 * MIB)?;
    if n < 2 {
        return Err(ToolError::InvalidArguments(format!(
            "bytes must be at least 2 (two quotes), got {n}"
        )));
    }
    let mut content = String::new();
    content
        .try_reserve_exact(n)
        .map_err(|e| failed(format!("cannot allocate {n} bytes: {e}")))?;
    content.push('"');
    content.extend(std::iter::repeat_n('a', n - 2));
    content.push('"');
    Ok(content)
}

/// `log_flood {lines?: u64 = 100000, line_bytes?: u64 = 1024}`: sends
/// `lines` lines of `line_bytes` `x`s to the host's `log` import at `info`.
/// Returns `{"lines": n}`.
fn log_flood(args: &Value) -> Result<String, ToolError> {
    let lines = u64_arg(args, "lines", 100_000)?;
    let line = "x".repeat(usize_arg(args, "line_bytes", 1024)?);
    for _ in 0..lines {
        host::log(LogLevel::Info, &line);
    }
    Ok(json!({ "lines": lines }).to_string())
}

/// `panic {message?: string}`: panics; a Rust panic in a guest is an
/// `unreachable` trap for the host.
fn panic_now(args: &Value) -> ! {
    let message = args
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("hostile guest panicked on purpose");
    panic!("{message}")
}

/// `fs {op, ...}`: one filesystem operation through WASI, on guest paths
/// (mounts appear at absolute paths such as `/workspace`):
///
/// | op | arguments | returns |
/// | --- | --- | --- |
/// | `read` | `path` | `{"content": text}` (lossy UTF-8) |
/// | `write` | `path`, `content` | `{"written": bytes}` (creates or truncates) |
/// | `append` | `path`, `content` | `{"appended": bytes}` (creates if missing) |
/// | `contains` | `path`, `needle` | `{"contains": bool}` (binary-safe search) |
/// | `truncate` | `path`, `len?` = 0 | `{"len": len}` |
/// | `create` | `path` | `{"created": path}` (fails if it exists) |
/// | `rename` | `from`, `to` | `{"renamed": [from, to]}` |
/// | `unlink` | `path` | `{"removed": path}` |
/// | `set_times` | `path`, `modified_ms?` = 0 | `{"modified_ms": ms}` (access time too) |
/// | `mkdir` / `rmdir` | `path` | `{"created": path}` / `{"removed": path}` |
/// | `list` | `path` | `{"entries": [names, sorted]}` |
/// | `read_link` | `path` | `{"target": text}` |
/// | `stat` | `path` | `{"kind": "file"/"dir"/"symlink"/"other", "len", "modified_ms"}` (does not follow a final symlink) |
///
/// With `delay_ms`, it first waits that long in a host call (a clock
/// poll). An I/O error is a `failed` tool error: `"<op> <path>: <error>
/// (kind: <ErrorKind>)"`.
fn fs_op(args: &Value) -> Result<String, ToolError> {
    let op = str_arg(args, "op")?;
    let delay = u64_arg(args, "delay_ms", 0)?;
    if delay > 0 {
        std::thread::sleep(Duration::from_millis(delay));
    }
    let (subject, result): (String, io::Result<Value>) = match op {
        "rename" => {
            let (from, to) = (str_arg(args, "from")?, str_arg(args, "to")?);
            let result = fs::rename(from, to).map(|()| json!({ "renamed": [from, to] }));
            (format!("{from} -> {to}"), result)
        }
        _ => {
            let path = str_arg(args, "path")?;
            let result = match op {
                "read" => fs::read(path)
                    .map(|bytes| json!({ "content": String::from_utf8_lossy(&bytes) })),
                "write" => {
                    let content = str_arg(args, "content")?;
                    fs::write(path, content).map(|()| json!({ "written": content.len() }))
                }
                // Appends `content`: a side-effect counter (one line per
                // execution) for the engine's exactly-once tests.
                "append" => {
                    let content = str_arg(args, "content")?;
                    OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .and_then(|mut f| f.write_all(content.as_bytes()))
                        .map(|()| json!({ "appended": content.len() }))
                }
                // Whether the file's bytes contain `needle` (binary-safe):
                // lets a tool look into a store file during its own call.
                "contains" => {
                    let needle = str_arg(args, "needle")?.as_bytes();
                    fs::read(path).map(|bytes| {
                        let found =
                            !needle.is_empty() && bytes.windows(needle.len()).any(|w| w == needle);
                        json!({ "contains": found })
                    })
                }
                "truncate" => {
                    let len = u64_arg(args, "len", 0)?;
                    OpenOptions::new()
                        .write(true)
                        .open(path)
                        .and_then(|file| file.set_len(len))
                        .map(|()| json!({ "len": len }))
                }
                "create" => OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .map(|_| json!({ "created": path })),
                "unlink" => fs::remove_file(path).map(|()| json!({ "removed": path })),
                "set_times" => {
                    let ms = u64_arg(args, "modified_ms", 0)?;
                    let time = UNIX_EPOCH + Duration::from_millis(ms);
                    let times = FileTimes::new().set_modified(time).set_accessed(time);
                    OpenOptions::new()
                        .write(true)
                        .open(path)
                        .and_then(|file| file.set_times(times))
                        .map(|()| json!({ "modified_ms": ms }))
                }
                "mkdir" => fs::create_dir(path).map(|()| json!({ "created": path })),
                "rmdir" => fs::remove_dir(path).map(|()| json!({ "removed": path })),
                "list" => list_dir(path).map(|entries| json!({ "entries": entries })),
                "read_link" => {
                    fs::read_link(path).map(|target| json!({ "target": target.to_string_lossy() }))
                }
                "stat" => fs::symlink_metadata(path).map(|meta| {
                    let kind = if meta.is_symlink() {
                        "symlink"
                    } else if meta.is_dir() {
                        "dir"
                    } else if meta.is_file() {
                        "file"
                    } else {
                        "other"
                    };
                    json!({
                        "kind": kind,
                        "len": meta.len(),
                        "modified_ms": meta.modified().ok().and_then(millis_since_epoch),
                    })
                }),
                other => {
                    return Err(ToolError::InvalidArguments(format!(
                        "unknown fs op `{other}`"
                    )));
                }
            };
            (path.to_owned(), result)
        }
    };
    result
        .map(|value| value.to_string())
        .map_err(|e| failed(format!("{op} {subject}: {e} (kind: {:?})", e.kind())))
}

fn list_dir(path: &str) -> io::Result<Vec<String>> {
    let mut names = fs::read_dir(path)?
        .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<io::Result<Vec<_>>>()?;
    names.sort();
    Ok(names)
}

fn millis_since_epoch(time: SystemTime) -> Option<u64> {
    let millis = time.duration_since(UNIX_EPOCH).ok()?.as_millis();
    u64::try_from(millis).ok()
}

/// `env {names?: [string]}`: returns `{"vars": {name: value or null},
/// "all": {name: value}}`, the named variables as `std::env::var` sees them
/// and everything `std::env::vars_os` lists (lossy UTF-8).
fn env(args: &Value) -> Result<String, ToolError> {
    let names = match args.get("names") {
        None => Vec::new(),
        Some(Value::Array(names)) => names
            .iter()
            .map(|n| n.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| invalid("names must be an array of strings"))?,
        Some(_) => return Err(invalid("names must be an array of strings")),
    };
    let vars: Map<String, Value> = names
        .into_iter()
        .map(|name| {
            let value = std::env::var(&name).ok();
            (name, json!(value))
        })
        .collect();
    let all: Map<String, Value> = std::env::vars_os()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), json!(v.to_string_lossy())))
        .collect();
    Ok(json!({ "vars": vars, "all": all }).to_string())
}

/// Set by `set_marker` in this instance's linear memory.
static MEMORY_MARKER: AtomicBool = AtomicBool::new(false);

/// The environment variable `set_marker` sets at run time.
const ENV_MARKER: &str = "WARDEN_HOSTILE_MARKER";

/// `set_marker {path?: string}`: sets a static in linear memory, sets the
/// environment variable `WARDEN_HOSTILE_MARKER` and, if `path` is given,
/// writes `marker` to that file. Returns `{"memory": true, "env": true,
/// "file": path or null}`, or a `failed` error if the file cannot be written.
fn set_marker(args: &Value) -> Result<String, ToolError> {
    MEMORY_MARKER.store(true, Ordering::SeqCst);
    set_env_marker();
    let path = optional_str_arg(args, "path")?;
    if let Some(path) = path {
        fs::write(path, "marker").map_err(|e| failed(format!("write {path}: {e}")))?;
    }
    Ok(json!({ "memory": true, "env": true, "file": path }).to_string())
}

#[allow(unsafe_code)]
fn set_env_marker() {
    // SAFETY: a component instance is single-threaded; nothing else reads
    // or writes the environment while this runs.
    unsafe { std::env::set_var(ENV_MARKER, "set") };
}

/// `get_marker {path?: string}`: returns `{"memory": bool, "env": bool,
/// "file": bool or null, "visible": bool}`: which of `set_marker`'s markers
/// this instance sees (`file` is null without `path`), and whether any is.
fn get_marker(args: &Value) -> Result<String, ToolError> {
    let memory = MEMORY_MARKER.load(Ordering::SeqCst);
    let env = std::env::var_os(ENV_MARKER).is_some();
    let file = optional_str_arg(args, "path")?.map(|path| Path::new(path).exists());
    let visible = memory || env || file == Some(true);
    Ok(json!({ "memory": memory, "env": env, "file": file, "visible": visible }).to_string())
}

/// `scatter_secret` and `scan_secret`: the proof, from inside a guest, that
/// nothing a lease wrote to its linear memory is there for the next lease,
/// however the host resets memory between leases.
///
/// The secret is position-dependent: the 8-byte word at address `a` is
/// `mix(seed ^ a)`, so a scan checks each aligned word against the value
/// its own address would hold, needing no copy of the secret (which would
/// itself be found), and a word left where the last lease wrote it is found
/// exactly. Reads and writes are volatile and go around the allocator: this
/// is raw linear memory, which wasm allows a guest to read whole.
#[allow(unsafe_code)]
mod secret {
    use super::{ToolError, Value, failed, invalid, json};

    const PAGE: usize = 65536;
    /// Words on the stack (128 KiB), in a zero-initialised static (256 KiB),
    /// in a static with initial data (32 KiB), on the heap (1 MiB), and
    /// pages grown for the purpose (2 MiB): more than a pooling allocator
    /// keeps resident, so both of wasmtime's resets are exercised.
    const STACK_WORDS: usize = 16 * 1024;
    const BSS_WORDS: usize = 32 * 1024;
    const DATA_WORDS: usize = 4 * 1024;
    const HEAP_WORDS: usize = 128 * 1024;
    const GROWN_PAGES: usize = 32;
    /// What the static with initial data holds when an instance starts.
    const DATA_WORD: u64 = 0x5741_5244_454e_2121;

    static mut BSS: [u64; BSS_WORDS] = [0; BSS_WORDS];
    static mut DATA: [u64; DATA_WORDS] = [DATA_WORD; DATA_WORDS];

    /// The secret word of `seed` at `addr`: splitmix64's finaliser.
    fn mix(seed: u64, addr: usize) -> u64 {
        let mut z = seed ^ addr as u64;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Writes the secret over `words` words from `start`; returns `words`.
    ///
    /// # Safety
    /// `start..start + 8 * words` is memory this instance owns and nothing
    /// else uses while the secret is there.
    unsafe fn fill(start: *mut u64, words: usize, seed: u64) -> u64 {
        for i in 0..words {
            // SAFETY: in the range the caller vouches for.
            unsafe {
                let p = start.add(i);
                p.write_volatile(mix(seed, p as usize));
            }
        }
        words as u64
    }

    fn seed_arg(value: &Value) -> Result<u64, ToolError> {
        value.as_u64().ok_or_else(|| {
            invalid(&format!(
                "a seed must be a non-negative integer, got {value}"
            ))
        })
    }

    /// `scatter_secret {seed}`.
    pub(super) fn scatter(args: &Value) -> Result<String, ToolError> {
        let seed = seed_arg(args.get("seed").unwrap_or(&Value::Null))?;
        let mut written = 0;
        let mut stack = [0u64; STACK_WORDS];
        let mut heap: Vec<u64> = Vec::with_capacity(HEAP_WORDS);
        // SAFETY: each range is this function's own stack array, the two
        // statics only this module touches, its own heap allocation, and
        // pages it just grew; all stay alive until the scan below.
        unsafe {
            written += fill(stack.as_mut_ptr(), STACK_WORDS, seed);
            written += fill((&raw mut BSS).cast(), BSS_WORDS, seed);
            written += fill((&raw mut DATA).cast(), DATA_WORDS, seed);
            written += fill(heap.as_mut_ptr(), HEAP_WORDS, seed);
            let grown = grow(GROWN_PAGES)?;
            written += fill(grown, GROWN_PAGES * PAGE / 8, seed);
        }
        // The scan finds what this instance wrote: were memory handed on
        // unreset, the next lease's scan would find it too.
        let found = count(&[seed]);
        std::hint::black_box((&stack, &heap));
        Ok(json!({ "written": written, "found": found }).to_string())
    }

    /// `scan_secret {seeds}`.
    pub(super) fn scan(args: &Value) -> Result<String, ToolError> {
        let seeds = args
            .get("seeds")
            .and_then(Value::as_array)
            .ok_or_else(|| invalid("missing array `seeds`"))?
            .iter()
            .map(seed_arg)
            .collect::<Result<Vec<u64>, _>>()?;
        // SAFETY: a static only this module touches, read whole.
        let data_restored = (0..DATA_WORDS).all(|i| unsafe {
            (&raw const DATA).cast::<u64>().add(i).read_volatile() == DATA_WORD
        });
        Ok(json!({
            "found": count(&seeds),
            "data_restored": data_restored,
            "pages": pages(),
        })
        .to_string())
    }

    /// Aligned words anywhere in linear memory (but page 0, where address
    /// 0 is) holding the secret of one of `seeds` at their own address.
    fn count(seeds: &[u64]) -> u64 {
        let mut found = 0;
        for addr in (PAGE..pages() * PAGE).step_by(8) {
            // SAFETY: inside linear memory, which is all readable.
            let word = unsafe { (addr as *const u64).read_volatile() };
            found += seeds.iter().filter(|&&s| word == mix(s, addr)).count() as u64;
        }
        found
    }

    #[cfg(target_arch = "wasm32")]
    fn pages() -> usize {
        core::arch::wasm32::memory_size::<0>()
    }

    #[cfg(target_arch = "wasm32")]
    fn grow(pages: usize) -> Result<*mut u64, ToolError> {
        match core::arch::wasm32::memory_grow::<0>(pages) {
            usize::MAX => Err(failed(format!("cannot grow memory by {pages} pages"))),
            old => Ok((old * PAGE) as *mut u64),
        }
    }

    // Natively (for the workspace's clippy and tests) there is no linear
    // memory to scan.
    #[cfg(not(target_arch = "wasm32"))]
    fn pages() -> usize {
        1
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn grow(_pages: usize) -> Result<*mut u64, ToolError> {
        Err(failed(
            "only a wasm32 guest has linear memory to grow".into(),
        ))
    }
}

/// `flaky {path, fail_times?: u64 = 1}`: counts its calls in the file at
/// `path`, appends the idempotency key it was given to `<path>.keys`, and
/// fails with a retryable `failed` error while the count is at most
/// `fail_times`; then returns `{"attempt": n, "key": key}`.
fn flaky(args: &Value, key: &str) -> Result<String, ToolError> {
    let path = str_arg(args, "path")?;
    let fail_times = args.get("fail_times").and_then(Value::as_u64).unwrap_or(1);
    let count = fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0)
        + 1;
    fs::write(path, count.to_string()).map_err(|e| failed(format!("write {path}: {e}")))?;
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(format!("{path}.keys"))
        .and_then(|mut f| f.write_all(format!("{key}\n").as_bytes()))
        .map_err(|e| failed(format!("append {path}.keys: {e}")))?;
    if count <= fail_times {
        return Err(ToolError::Failed(Failure {
            message: format!("transient failure {count} of {fail_times}"),
            retryable: true,
        }));
    }
    Ok(json!({ "attempt": count, "key": key }).to_string())
}

/// `write_then_sleep {path, content}`: appends `content` to the file at
/// `path`, then blocks forever in a host call, so the lease dies by its
/// deadline after the effect happened.
fn write_then_sleep(args: &Value) -> Result<String, ToolError> {
    let (path, content) = (str_arg(args, "path")?, str_arg(args, "content")?);
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(content.as_bytes()))
        .map_err(|e| failed(format!("append {path}: {e}")))?;
    sleep_forever()
}

/// `slow_append {path, steps, step_ms?}`: opens the file at `path` for
/// appending once, then writes `step-<i>\n` for each step, each its own
/// write, flushed, waiting `step_ms` after each. Returns `{"steps": n}`, or
/// `failed` naming the step a write failed at.
fn slow_append(args: &Value) -> Result<String, ToolError> {
    let path = str_arg(args, "path")?;
    let steps = u64_arg(args, "steps", 0)?;
    let wait = Duration::from_millis(u64_arg(args, "step_ms", 0)?);
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| failed(format!("open {path}: {e}")))?;
    for step in 0..steps {
        file.write_all(format!("step-{step}\n").as_bytes())
            .and_then(|()| file.flush())
            .map_err(|e| failed(format!("step {step}: {e}")))?;
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
    Ok(json!({ "steps": steps }).to_string())
}

/// `sleep {label, trace, delays}`: appends `+<label>` to the file at
/// `trace`, waits `delays[label]` milliseconds (the JSON object in the file
/// at `delays`; 0 when absent) in a host call, appends `-<label>`, and
/// returns `{"label": label}`. The trace shows which calls overlapped and
/// in which order they ended; the output does not depend on the delay.
fn sleep(args: &Value) -> Result<String, ToolError> {
    let label = str_arg(args, "label")?;
    let trace = str_arg(args, "trace")?;
    let delays = str_arg(args, "delays")?;
    let append = |line: String| {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(trace)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(|e| failed(format!("append {trace}: {e}")))
    };
    append(format!("+{label}\n"))?;
    let ms = fs::read_to_string(delays)
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .and_then(|v| v.get(label).and_then(Value::as_u64))
        .unwrap_or(0);
    if ms > 0 {
        std::thread::sleep(Duration::from_millis(ms));
    }
    append(format!("-{label}\n"))?;
    Ok(json!({ "label": label }).to_string())
}

/// `block_once {path, content}`: appends `content` to the file at `path`
/// and `key` to `<path>.keys`; then, the first time only (it leaves
/// `<path>.blocked` behind), blocks forever in a host call.
fn block_once(args: &Value, key: &str) -> Result<String, ToolError> {
    let (path, content) = (str_arg(args, "path")?, str_arg(args, "content")?);
    for (file, line) in [
        (path.to_owned(), content.to_owned()),
        (format!("{path}.keys"), format!("{key}\n")),
    ] {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(|e| failed(format!("append {file}: {e}")))?;
    }
    let marker = format!("{path}.blocked");
    if fs::metadata(&marker).is_err() {
        fs::write(&marker, "").map_err(|e| failed(format!("write {marker}: {e}")))?;
        sleep_forever()
    }
    Ok(json!({ "appended": content, "key": key }).to_string())
}

/// `echo {config_key?: string = "echo", ...}`: logs `echo: <arguments>` at
/// `info` through the host's `log` import, reads `config_key` through its
/// `config` import, and returns `{"arguments": <the arguments>,
/// "config_key": key, "config": value or null}`.
fn echo(args: &Value) -> Result<String, ToolError> {
    let key = optional_str_arg(args, "config_key")?.unwrap_or("echo");
    host::log(LogLevel::Info, &format!("echo: {args}"));
    let config = host::config(key);
    Ok(json!({ "arguments": args, "config_key": key, "config": config }).to_string())
}

/// `say {output?, log?, stdout?, stderr?, error?}`: passes each text on
/// verbatim (no JSON re-encoding on the way), so tests can hand the host
/// exactly the bytes a plugin would.
fn say(args: &Value) -> Result<String, ToolError> {
    if let Some(text) = optional_str_arg(args, "log")? {
        host::log(LogLevel::Info, text);
    }
    if let Some(text) = optional_str_arg(args, "stdout")? {
        let mut out = io::stdout().lock();
        let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    }
    if let Some(text) = optional_str_arg(args, "stderr")? {
        let mut err = io::stderr().lock();
        let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
    }
    if let Some(text) = optional_str_arg(args, "error")? {
        return Err(failed(text.to_owned()));
    }
    Ok(optional_str_arg(args, "output")?.unwrap_or("{}").to_owned())
}

/// `nested_output {depth: u64}`: returns `[[…[1]…]]` nested `depth` levels
/// deep, built as text (so no parser limit applies on this side).
fn nested_output(args: &Value) -> Result<String, ToolError> {
    let depth = u64_arg(args, "depth", 125)? as usize;
    Ok(format!("{}1{}", "[".repeat(depth), "]".repeat(depth)))
}

/// The arguments as a JSON object; empty text counts as `{}`.
fn parse_arguments(text: &str) -> Result<Value, ToolError> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(other) => Err(invalid(&format!(
            "arguments must be a JSON object, got {other}"
        ))),
        Err(e) => Err(invalid(&format!("arguments are not JSON: {e}"))),
    }
}

fn str_arg<'a>(args: &'a Value, key: &str) -> Result<&'a str, ToolError> {
    optional_str_arg(args, key)?.ok_or_else(|| invalid(&format!("missing string `{key}`")))
}

fn optional_str_arg<'a>(args: &'a Value, key: &str) -> Result<Option<&'a str>, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(invalid(&format!("`{key}` must be a string, got {other}"))),
    }
}

fn u64_arg(args: &Value, key: &str, default: u64) -> Result<u64, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(value) => value.as_u64().ok_or_else(|| {
            invalid(&format!(
                "`{key}` must be a non-negative integer, got {value}"
            ))
        }),
    }
}

fn usize_arg(args: &Value, key: &str, default: u64) -> Result<usize, ToolError> {
    let n = u64_arg(args, key, default)?;
    usize::try_from(n).map_err(|_| invalid(&format!("`{key}` is too large: {n}")))
}

fn unknown_tool(name: &str) -> ToolError {
    invalid(&format!("unknown tool `{name}`"))
}

fn invalid(message: &str) -> ToolError {
    ToolError::InvalidArguments(message.to_owned())
}

fn failed(message: String) -> ToolError {
    ToolError::Failed(Failure {
        message,
        retryable: false,
    })
}
