//! Bounded compiles: a component is compiled within the operator's
//! [`CompileLimits`] (its size, the wall time and the memory the compile
//! may take), or refused with [`SandboxError::CompileLimit`] naming the one
//! it passed.
//!
//! Cranelift cannot be interrupted, and a hostile component (one huge
//! function with thousands of locals live across thousands of blocks)
//! kept a compile going for minutes and a gigabyte. So the size is checked
//! before anything is parsed, and the compile itself runs where it can be
//! stopped:
//! - **in a child process** when the sandbox is given a [`CompileCommand`]
//!   (the `warden` binary gives itself, `warden __compile-component`): the
//!   child reads the component from a temporary file, compiles it with an engine whose
//!   code this sandbox's engine loads (the same settings, allocated on
//!   demand, as the quick engine is), and writes the code on stdout; the
//!   parent kills it at the deadline, or when its resident memory passes
//!   the limit (read from `/proc` every few milliseconds on Linux), and
//!   the child caps its own writable memory (`RLIMIT_DATA`) at twice the
//!   limit as a backstop;
//! - **in this process** otherwise (an embedder without a binary to run):
//!   the compile runs on a thread of its own and the load returns at the
//!   deadline with the same error, but the abandoned compile runs on to its
//!   end and its memory is not bounded. Hosts facing untrusted components
//!   set a [`CompileCommand`].

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use wasmtime::Engine;
use wasmtime::component::Component;

use super::SandboxError;

/// How much a compile may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompileLimits {
    /// The largest component compiled, in bytes of its file.
    pub max_bytes: u64,
    /// The longest a compile may run.
    pub timeout: Duration,
    /// The most resident memory a compile may use, in bytes (bounded only
    /// when compiling in a child process).
    pub memory_bytes: u64,
}

impl CompileLimits {
    /// The limits when the operator sets none: components up to 64 MiB,
    /// compiled within 600 s and 4 GiB. Generous, so that a big trusted
    /// component compiles on a busy machine: SpiderMonkey's 10.5 MB module
    /// took 67 s (22 s of CPU) and 435 MB on two shared cores; the hostile
    /// component of `cli::compiling_a_hostile_component_stops_at_the_operators_limits`
    /// was past 1.2 GB at 100 s.
    pub const DEFAULT: CompileLimits = CompileLimits {
        max_bytes: 64 << 20,
        timeout: Duration::from_secs(600),
        memory_bytes: 4 << 30,
    };
}

impl Default for CompileLimits {
    fn default() -> Self {
        CompileLimits::DEFAULT
    }
}

/// Which compile limit a component passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompileLimit {
    /// Its size.
    Size,
    /// The compile's wall time.
    Time,
    /// The compile's memory.
    Memory,
}

impl CompileLimit {
    /// The operator's setting that raises it, as `warden.toml` names it.
    pub fn setting(self) -> &'static str {
        match self {
            CompileLimit::Size => "[compile] max_size",
            CompileLimit::Time => "[compile] timeout",
            CompileLimit::Memory => "[compile] memory",
        }
    }
}

impl std::fmt::Display for CompileLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CompileLimit::Size => "size",
            CompileLimit::Time => "time",
            CompileLimit::Memory => "memory",
        })
    }
}

/// The program run to compile a component in a child process: `program`
/// with `args`, then the component's file, then `--quick` for a quick
/// compile. It writes the compiled code on stdout ([`run_compile_child`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileCommand {
    /// The executable.
    pub program: PathBuf,
    /// Its arguments before `--quick`.
    pub args: Vec<OsString>,
}

/// Compiles `wasm` into code `engine` loads, within `limits`: in a child
/// process when `command` is given, else on a thread of this process.
/// `child_quick` says whether the child compiles quickly (it makes the
/// engine itself); `compile` is the in-process compile.
pub(crate) fn bounded(
    plugin: &str,
    wasm: &[u8],
    limits: &CompileLimits,
    command: Option<&CompileCommand>,
    child_quick: bool,
    engine: &Engine,
    compile: impl FnOnce() -> Result<Component, SandboxError> + Send + 'static,
) -> Result<Component, SandboxError> {
    // A progress span around either way of compiling: the command line
    // shows a spinner naming the plugin.
    let _progress = tracing::info_span!(target: "warden::progress", "compile", plugin).entered();
    let over = |limit: CompileLimit, used: String| passed(plugin, limit, used, limits);
    match command {
        Some(command) => {
            let code = in_child(plugin, wasm, limits, command, child_quick, &over)?;
            super::cache::deserialize(engine, &code).map_err(|reason| SandboxError::Compile {
                plugin: plugin.to_owned(),
                reason: format!("the compiling process's code does not load: {reason}"),
            })
        }
        None => {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("warden-compile".into())
                .spawn(move || {
                    let _ = tx.send(compile());
                })
                .map_err(|e| SandboxError::Compile {
                    plugin: plugin.to_owned(),
                    reason: format!("cannot start the compile thread: {e}"),
                })?;
            match rx.recv_timeout(limits.timeout) {
                Ok(result) => result,
                Err(_) => {
                    tracing::warn!(
                        plugin,
                        "compile past its deadline abandoned; it runs on in this process"
                    );
                    Err(over(
                        CompileLimit::Time,
                        format!("still compiling after {}s", limits.timeout.as_secs_f64()),
                    ))
                }
            }
        }
    }
}

/// The refusal of a component of `size` bytes, over `limits.max_bytes`:
/// checked before anything reads it.
pub(crate) fn too_large(plugin: &str, size: u64, limits: &CompileLimits) -> SandboxError {
    passed(plugin, CompileLimit::Size, size_text(size), limits)
}

fn passed(plugin: &str, limit: CompileLimit, used: String, limits: &CompileLimits) -> SandboxError {
    SandboxError::CompileLimit {
        plugin: plugin.to_owned(),
        limit,
        value: match limit {
            CompileLimit::Size => size_text(limits.max_bytes),
            CompileLimit::Time => format!("{}s", limits.timeout.as_secs_f64()),
            CompileLimit::Memory => size_text(limits.memory_bytes),
        },
        used,
    }
}

/// How often the parent looks at the child.
const POLL: Duration = Duration::from_millis(5);
/// The most of the child's stderr kept for an error message.
const STDERR_KEPT: u64 = 16 << 10;

fn in_child(
    plugin: &str,
    wasm: &[u8],
    limits: &CompileLimits,
    command: &CompileCommand,
    quick: bool,
    over: &dyn Fn(CompileLimit, String) -> SandboxError,
) -> Result<Vec<u8>, SandboxError> {
    let failed = |reason: String| SandboxError::Compile {
        plugin: plugin.to_owned(),
        reason,
    };
    // The component goes by file: a pipe to a child that dies mid-read
    // would raise SIGPIPE here, and the CLI does not ignore it.
    let mut input = tempfile::NamedTempFile::new().map_err(|e| {
        failed(format!(
            "cannot write the component for the compiling process: {e}"
        ))
    })?;
    input
        .write_all(wasm)
        .and_then(|()| input.flush())
        .map_err(|e| {
            failed(format!(
                "cannot write the component for the compiling process: {e}"
            ))
        })?;
    let mut cmd = Command::new(&command.program);
    cmd.args(&command.args).arg(input.path());
    if quick {
        cmd.arg("--quick");
    }
    let mut child = cmd
        .env(MEMORY_ENV, limits.memory_bytes.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            failed(format!(
                "cannot start the compiling process `{}`: {e}",
                command.program.display()
            ))
        })?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    // Draining on threads of their own: a child that writes more than a
    // pipe holds never blocks the watch.
    let reader = std::thread::spawn(move || {
        let mut code = Vec::new();
        stdout.read_to_end(&mut code).map(|_| code)
    });
    let errors = std::thread::spawn(move || {
        let mut kept = Vec::new();
        let _ = (&mut stderr).take(STDERR_KEPT).read_to_end(&mut kept);
        let _ = std::io::copy(&mut stderr, &mut std::io::sink());
        String::from_utf8_lossy(&kept).into_owned()
    });
    let started = Instant::now();
    let mut peak = 0u64;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(failed(format!("cannot watch the compiling process: {e}"))),
        }
        let elapsed = started.elapsed();
        let resident = resident_bytes(child.id()).unwrap_or(0);
        peak = peak.max(resident);
        let passed = if elapsed >= limits.timeout {
            Some((
                CompileLimit::Time,
                format!("still compiling after {:.1}s", elapsed.as_secs_f64()),
            ))
        } else if resident > limits.memory_bytes {
            Some((
                CompileLimit::Memory,
                format!(
                    "{} resident after {:.1}s",
                    size_text(resident),
                    elapsed.as_secs_f64()
                ),
            ))
        } else {
            None
        };
        if let Some((limit, used)) = passed {
            let _ = child.kill();
            let _ = child.wait();
            tracing::warn!(plugin, %limit, %used, "compile stopped at its limit");
            return Err(over(limit, used));
        }
        std::thread::sleep(POLL);
    };
    drop(input);
    let code = reader
        .join()
        .map_err(|_| failed("the compiling process's output was lost".into()))?
        .map_err(|e| failed(format!("cannot read the compiling process's output: {e}")))?;
    let message = errors.join().unwrap_or_default();
    if !status.success() {
        // Stopped by the `RLIMIT_DATA` backstop, the allocator's abort
        // reads as an allocation failure: it passed the memory limit.
        if message.contains("memory allocation") || message.contains("out of memory") {
            return Err(over(
                CompileLimit::Memory,
                format!("ran out of memory ({} resident at most)", size_text(peak)),
            ));
        }
        let message = message.trim();
        return Err(failed(if message.is_empty() {
            format!("the compiling process ended with {status}")
        } else {
            message.to_owned()
        }));
    }
    Ok(code)
}

/// The variable the child reads its memory limit from.
const MEMORY_ENV: &str = "WARDEN_COMPILE_MEMORY";

/// The resident memory of process `pid`, in bytes, where the system says.
fn resident_bytes(pid: u32) -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = pid;
        None
    }
}

/// The child's side ([`CompileCommand`]): reads the component from the
/// file `args` name, compiles it (quickly with `--quick` among `args`) with an engine whose
/// code the sandbox's engine loads, and writes the code on stdout. Its
/// writable memory is capped first at twice the memory limit the parent
/// passed. Returns the process's exit code.
pub fn run_compile_child(args: &[OsString]) -> u8 {
    let quick = args.iter().any(|a| a == "--quick");
    let Some(path) = args.iter().find(|a| *a != "--quick") else {
        eprintln!("no component file given");
        return 2;
    };
    if let Some(limit) = std::env::var(MEMORY_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        cap_writable_memory(limit.saturating_mul(2));
    }
    let wasm = match std::fs::read(path) {
        Ok(wasm) => wasm,
        Err(e) => {
            eprintln!("cannot read the component: {e}");
            return 2;
        }
    };
    let engine = match super::compile_engine(quick) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("cannot make the compile engine: {e:#}");
            return 2;
        }
    };
    let code = match engine.precompile_component(&wasm) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{e:#}");
            return 1;
        }
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(&code).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cannot write the compiled code: {e}");
            2
        }
    }
}

#[allow(unsafe_code)]
fn cap_writable_memory(bytes: u64) {
    #[cfg(unix)]
    {
        let limit = libc::rlimit {
            rlim_cur: bytes as libc::rlim_t,
            rlim_max: bytes as libc::rlim_t,
        };
        // SAFETY: setrlimit reads the struct it is given and changes only
        // this process's own limit.
        unsafe {
            libc::setrlimit(libc::RLIMIT_DATA, &limit);
        }
    }
    #[cfg(not(unix))]
    let _ = bytes;
}

/// Bytes as `4.9 MiB`, `512 KiB` or `900 bytes`.
fn size_text(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} bytes"),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        1_048_576..1_073_741_824 => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
        _ => format!("{:.1} GiB", bytes as f64 / 1_073_741_824.0),
    }
}
