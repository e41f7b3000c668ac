//! A local MCP server's process and its OS sandbox: bubblewrap (`bwrap`)
//! with every namespace unshared (the network too, unless granted), all
//! capabilities dropped, a fresh `/proc`, `/dev` and `/tmp`, the system's
//! own directories (`/usr`, `/bin`, `/lib*` and a few files of `/etc`)
//! read-only, the granted directories read-only or read-write (bound from
//! descriptors opened without following a symlink, never by a path
//! bubblewrap would resolve again), nothing else of the filesystem, and an
//! environment holding only the granted variables. Bubblewrap reads its
//! options from an in-memory file (`--args`), so the sandbox's own command
//! line, which its processes can read as `/proc/1/cmdline`, shows only the
//! server's program and arguments. The sandbox dies with Warden
//! (`--die-with-parent`), and a [`Session`](super::session::Session) kills
//! it at a call's deadline.
//!
//! Where bubblewrap is missing or does not work (no user namespaces), a
//! server is refused unless the operator set `unsandboxed = true` for it.
//! The MCP session over the process's stdio is `session.rs`'s.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
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

/// The granted directories of a server, opened for one start without
/// following a symlink in any component (`warden_sandbox`'s no-follow
/// walk): bubblewrap binds these descriptors, never a path it would
/// resolve again. A directory swapped for a symlink since the agent was
/// loaded is refused, naming it.
pub struct Binds {
    /// Each directory's descriptor, where it is shown, and whether it is
    /// writable.
    dirs: Vec<(OwnedFd, PathBuf, bool)>,
}

impl Binds {
    /// Opens `server`'s `read` and `write` directories.
    pub fn open(key: &str, server: &LocalServer) -> Result<Binds, McpServerError> {
        let read = server.read.iter().map(|d| (d, false));
        let write = server.write.iter().map(|d| (d, true));
        let mut dirs = Vec::new();
        for (dir, writable) in read.chain(write) {
            let opened = warden_sandbox::open_dir_nofollow(Path::new("/"), dir).map_err(|e| {
                McpServerError::Failed {
                    server: key.to_owned(),
                    message: format!("cannot bind `{}` into its sandbox: {e}", dir.display()),
                }
            })?;
            dirs.push((opened.fd, dir.clone(), writable));
        }
        Ok(Binds { dirs })
    }
}

/// The bubblewrap options that sandbox `server`, its directories bound
/// from `binds` (the program and its arguments follow them, after `--`).
pub fn sandbox_args(server: &LocalServer, binds: &Binds) -> Vec<OsString> {
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
    for (fd, dir, writable) in &binds.dirs {
        let option = if *writable {
            "--bind-fd"
        } else {
            "--ro-bind-fd"
        };
        args.extend([
            option.into(),
            fd.as_raw_fd().to_string().into(),
            dir.clone().into_os_string(),
        ]);
    }
    let cwd = server
        .write
        .first()
        .or(server.read.first())
        .map_or_else(|| PathBuf::from("/"), Clone::clone);
    args.extend(["--chdir".into(), cwd.into_os_string()]);
    args
}

/// A sealed-off in-memory file holding `args`, each ended by a NUL, for
/// bubblewrap's `--args`: the sandbox's options never appear on a command
/// line, so its pid 1 (bubblewrap) shows the server nothing of them in
/// `/proc/1/cmdline`.
fn args_file(args: &[OsString]) -> std::io::Result<OwnedFd> {
    use std::io::{Seek as _, Write as _};
    use std::os::unix::ffi::OsStrExt as _;
    let fd = rustix::fs::memfd_create("warden-bwrap-args", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    for arg in args {
        file.write_all(arg.as_bytes())?;
        file.write_all(b"\0")?;
    }
    file.rewind()?;
    Ok(file.into())
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
/// opted out) as it is; with the descriptors it is given, to be kept open
/// until it is spawned.
fn command(
    key: &str,
    server: &LocalServer,
) -> Result<(tokio::process::Command, Vec<OwnedFd>), McpServerError> {
    let program = program(key, server)?;
    let mut kept = Vec::new();
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
        let binds = Binds::open(key, server)?;
        let options =
            args_file(&sandbox_args(server, &binds)).map_err(|e| McpServerError::Failed {
                server: key.to_owned(),
                message: format!("cannot pass its sandbox's options to bubblewrap: {e}"),
            })?;
        let mut c = tokio::process::Command::new(bwrap);
        c.arg("--args")
            .arg(options.as_raw_fd().to_string())
            .arg("--")
            .arg(&program)
            .args(&server.args);
        kept.push(options);
        kept.extend(binds.dirs.into_iter().map(|(fd, _, _)| fd));
        let inherited: Vec<i32> = kept.iter().map(AsRawFd::as_raw_fd).collect();
        // The descriptors are opened close-on-exec, so no other child
        // spawned meanwhile inherits them; only bubblewrap does, which
        // closes each once it has read or bound it.
        #[allow(unsafe_code)]
        // SAFETY: between fork and exec the closure only calls `fcntl` on
        // descriptors this process holds open until the spawn returns;
        // `fcntl` is async-signal-safe and nothing is allocated.
        unsafe {
            c.pre_exec(move || {
                for fd in &inherited {
                    let fd = std::os::fd::BorrowedFd::borrow_raw(*fd);
                    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
                }
                Ok(())
            });
        }
        c
    };
    command
        .env_clear()
        .envs(granted_env(server))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    Ok((command, kept))
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
    let (mut command, kept) = command(key, server)?;
    let mut child = command.spawn().map_err(|e| McpServerError::Failed {
        server: key.to_owned(),
        message: format!("cannot start `{}`: {e}", server.command),
    })?;
    // The child has its copies now.
    drop(kept);
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
