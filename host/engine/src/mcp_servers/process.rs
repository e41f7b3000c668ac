//! A local MCP server's process and its OS sandbox: bubblewrap (`bwrap`)
//! with every namespace unshared (the network too, unless granted), all
//! capabilities dropped, a fresh `/proc`, `/dev` and `/tmp`, the system's
//! own directories (`/usr`, `/bin`, `/lib*` and a few files of `/etc`)
//! read-only, the granted directories read-only or read-write, nothing
//! else of the filesystem, and an environment holding only the granted
//! variables. The sandbox dies with Warden (`--die-with-parent`), and a
//! [`Session`](super::session::Session) kills it at a call's deadline.
//!
//! Where bubblewrap is missing or does not work (no user namespaces), a
//! server is refused unless the operator set `unsandboxed = true` for it.
//! The MCP session over the process's stdio is `session.rs`'s.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use tokio::sync::watch;

use super::{LocalServer, McpServerError};

/// The system directories every sandboxed server sees read-only: what a
/// program and its interpreter need to load.
const SYSTEM_DIRS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64"];

/// The files of `/etc` a sandboxed server sees read-only (not `/etc` whole:
/// it holds the machine's secrets, such as `/etc/shadow`).
const ETC_FILES: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
];

/// The files of `/etc` a server granted the network also sees.
const ETC_NETWORK_FILES: &[&str] = &["/etc/resolv.conf", "/etc/hosts", "/etc/gai.conf"];

/// Most bytes of a server's stderr passed to the log; the rest is counted
/// and dropped.
const STDERR_KEPT: usize = 64 << 10;

/// The last bytes of a server's stderr kept to say why it stopped.
const STDERR_TAIL: usize = 1 << 10;

/// How long a server that closed its end is given to exit, and its stderr
/// to be read to its end, before saying why it stopped.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// `name` on `PATH`, if it is there.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The bubblewrap binary, once it proved it can make a sandbox here; why
/// not otherwise.
fn bwrap() -> Result<PathBuf, String> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let bwrap = on_path("bwrap").ok_or("`bwrap` is not on PATH")?;
            let probe = on_path("true").ok_or("`true` is not on PATH")?;
            let out = std::process::Command::new(&bwrap)
                .args(["--ro-bind", "/", "/", "--unshare-all", "--die-with-parent"])
                .args(["--cap-drop", "ALL", "--"])
                .arg(&probe)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run `{}`: {e}", bwrap.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "`{}` cannot make a sandbox here: {}",
                    bwrap.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(bwrap)
        })
        .clone()
}

/// The program a server runs: its path, or a bare name found on `PATH`.
fn program(key: &str, server: &LocalServer) -> Result<PathBuf, McpServerError> {
    if server.command.contains('/') {
        return Ok(PathBuf::from(&server.command));
    }
    on_path(&server.command).ok_or_else(|| McpServerError::Failed {
        server: key.to_owned(),
        message: format!("command `{}` is not on PATH", server.command),
    })
}

/// The granted variables with their values in Warden's environment; an
/// unset one is left out.
fn granted_env(server: &LocalServer) -> BTreeMap<String, OsString> {
    server
        .env
        .iter()
        .filter_map(|k| Some((k.clone(), std::env::var_os(k)?)))
        .collect()
}

/// The bubblewrap arguments that sandbox `server` running `program`.
pub fn sandbox_args(server: &LocalServer, program: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = [
        "--die-with-parent",
        "--new-session",
        "--unshare-all",
        "--cap-drop",
        "ALL",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    if server.network {
        args.push("--share-net".into());
    }
    let ro = |args: &mut Vec<OsString>, p: &str| {
        let path = Path::new(p);
        match std::fs::symlink_metadata(path) {
            // Merged /usr: /bin is a link into /usr, kept a link.
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    args.extend(["--symlink".into(), target.into_os_string(), p.into()]);
                }
            }
            Ok(_) => args.extend(["--ro-bind".into(), p.into(), p.into()]),
            Err(_) => {}
        }
    };
    for p in SYSTEM_DIRS.iter().chain(ETC_FILES) {
        ro(&mut args, p);
    }
    if server.network {
        for p in ETC_NETWORK_FILES {
            ro(&mut args, p);
        }
    }
    args.extend(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"].map(OsString::from));
    for d in &server.read {
        args.extend([
            "--ro-bind".into(),
            d.clone().into_os_string(),
            d.clone().into_os_string(),
        ]);
    }
    for d in &server.write {
        args.extend([
            "--bind".into(),
            d.clone().into_os_string(),
            d.clone().into_os_string(),
        ]);
    }
    let cwd = server
        .write
        .first()
        .or(server.read.first())
        .map_or_else(|| PathBuf::from("/"), Clone::clone);
    args.extend(["--chdir".into(), cwd.into_os_string(), "--".into()]);
    args.push(program.as_os_str().to_owned());
    args.extend(server.args.iter().map(OsString::from));
    args
}

/// Whether `path` is inside what `server`'s sandbox shows: the system's
/// directories and its `read` and `write` directories.
fn visible(server: &LocalServer, path: &Path) -> bool {
    SYSTEM_DIRS
        .iter()
        .map(PathBuf::from)
        .chain(server.read.iter().cloned())
        .chain(server.write.iter().cloned())
        .any(|d| path.starts_with(&d))
}

/// Refuses a `program` the sandbox could not run, naming the path: the
/// program as given, what it resolves to (a link out of the granted
/// directories), and the interpreter its `#!` line names. Inside the
/// sandbox each would only be "No such file or directory".
fn check_visible(key: &str, server: &LocalServer, program: &Path) -> Result<(), McpServerError> {
    let outside = |lead: String| McpServerError::Failed {
        server: key.to_owned(),
        message: format!(
            "{lead} outside what its sandbox sees (the system's directories and its `read` and `write` directories): grant its directory in `read`"
        ),
    };
    let given = format!("command `{}`", program.display());
    if !visible(server, program) {
        return Err(outside(format!("{given} is")));
    }
    let resolved = std::fs::canonicalize(program).map_err(|e| McpServerError::Failed {
        server: key.to_owned(),
        message: format!("{given} cannot be used: {e}"),
    })?;
    if !visible(server, &resolved) {
        return Err(outside(format!(
            "{given} resolves to `{}`,",
            resolved.display()
        )));
    }
    if let Some(interpreter) = interpreter(&resolved) {
        let found = std::fs::canonicalize(&interpreter).unwrap_or_else(|_| interpreter.clone());
        if !visible(server, &interpreter) || !visible(server, &found) {
            return Err(outside(format!(
                "{given} is a script whose interpreter `{}` is",
                found.display()
            )));
        }
    }
    Ok(())
}

/// The interpreter a script's `#!` line names, when it names one by its
/// path (`#!/usr/bin/env name` names `env`, which is the system's).
fn interpreter(program: &Path) -> Option<PathBuf> {
    use std::io::Read as _;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|b| *b == b'\n').next()?;
    let first = std::str::from_utf8(line).ok()?.split_whitespace().next()?;
    first.starts_with('/').then(|| PathBuf::from(first))
}

/// The command that starts `server`: inside bubblewrap, or (the operator
/// opted out) as it is.
fn command(key: &str, server: &LocalServer) -> Result<tokio::process::Command, McpServerError> {
    let program = program(key, server)?;
    let mut command = if server.unsandboxed {
        tracing::warn!(
            server = %key,
            "MCP server `{key}` runs WITHOUT an OS sandbox (`unsandboxed = true` in its grant): it has Warden's own rights over every file, the network and other processes"
        );
        let mut c = tokio::process::Command::new(&program);
        c.args(&server.args);
        if let Some(d) = server.write.first().or(server.read.first()) {
            c.current_dir(d);
        }
        c
    } else {
        let bwrap = bwrap().map_err(|reason| McpServerError::SandboxUnavailable {
            server: key.to_owned(),
            reason,
        })?;
        check_visible(key, server, &program)?;
        let mut c = tokio::process::Command::new(bwrap);
        c.args(sandbox_args(server, &program));
        c
    };
    command
        .env_clear()
        .envs(granted_env(server))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    Ok(command)
}

/// Starts `server` (its key `key`) in its sandbox: the process, its stdout
/// and stdin (the protocol's), and its stderr drained into the log, the
/// first 64 KiB kept.
pub fn spawn(
    key: &str,
    server: &LocalServer,
) -> Result<
    (
        tokio::process::Child,
        tokio::process::ChildStdout,
        tokio::process::ChildStdin,
        Stderr,
    ),
    McpServerError,
> {
    let mut child = command(key, server)?
        .spawn()
        .map_err(|e| McpServerError::Failed {
            server: key.to_owned(),
            message: format!("cannot start `{}`: {e}", server.command),
        })?;
    let stdout = child.stdout.take().expect("piped");
    let stdin = child.stdin.take().expect("piped");
    let (tail, watching) = watch::channel(Tail::default());
    if let Some(mut stderr) = child.stderr.take() {
        let key = key.to_owned();
        tokio::spawn(async move {
            let mut kept = Vec::new();
            let mut buf = [0u8; 4096];
            let mut dropped = 0usize;
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let room = STDERR_KEPT.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                dropped += n.saturating_sub(room);
                tail.send_modify(|t| {
                    t.bytes.extend_from_slice(&buf[..n]);
                    let over = t.bytes.len().saturating_sub(STDERR_TAIL);
                    t.bytes.drain(..over);
                });
            }
            tail.send_modify(|t| t.ended = true);
            if !kept.is_empty() {
                tracing::debug!(server = %key, dropped, "MCP server stderr: {}", String::from_utf8_lossy(&kept).trim_end());
            }
        });
    } else {
        tail.send_modify(|t| t.ended = true);
    }
    Ok((child, stdout, stdin, Stderr(watching)))
}

/// The end of a server's stderr as it is read.
#[derive(Debug, Default)]
struct Tail {
    /// The last [`STDERR_TAIL`] bytes.
    bytes: Vec<u8>,
    /// Whether the stream closed.
    ended: bool,
}

/// A running server's stderr: the first 64 KiB go to the log (at debug),
/// the last bytes are kept to say why it stopped ([`stopped`]).
#[derive(Debug)]
pub struct Stderr(watch::Receiver<Tail>);

/// Why a local server stopped, for the error that reports it: its exit
/// status (once it exited, waiting at most 2 s) and the end of its stderr,
/// as one line of untrusted text. A server still running is said to be.
pub async fn stopped(child: &mut tokio::process::Child, stderr: &mut Stderr) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    let status = match tokio::time::timeout(EXIT_WAIT, child.wait()).await {
        Ok(Ok(status)) => match (status.code(), status.signal()) {
            (Some(code), _) => format!("it exited with status {code}"),
            (None, Some(signal)) => format!("it was killed by signal {signal}"),
            (None, None) => format!("it exited ({status})"),
        },
        Ok(Err(e)) => format!("its exit status cannot be read ({e})"),
        Err(_) => "it is still running".to_owned(),
    };
    let _ = tokio::time::timeout(EXIT_WAIT, stderr.0.wait_for(|t| t.ended)).await;
    let bytes = stderr.0.borrow().bytes.clone();
    let text = String::from_utf8_lossy(&bytes);
    let text = text.trim();
    if text.is_empty() {
        format!("{status}, its stderr empty")
    } else {
        format!(
            "{status}; its stderr ended: {}",
            warden_syntax::untrusted::line(text, STDERR_TAIL)
        )
    }
}
