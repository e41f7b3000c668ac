//! The watchdog that holds another process to a [`ValidUntil`](super::ValidUntil):
//! a process forked from this one that does nothing but wait for the
//! deadline and kill the fenced process when it passes.
//!
//! Why a forked process: the holder of the deadline may be stopped (SIGSTOP,
//! a debugger, a cgroup frozen on its own) while the process it started
//! goes on writing; no thread of the holder runs then, so the deadline must
//! be watched from outside it. Forking (not spawning a program) keeps the
//! watchdog independent of which binary embeds the sandbox (`warden`, the
//! Python module, a test). After the fork the child runs only system calls
//! that are async-signal-safe (close, poll, read, clock_gettime, the pidfd
//! signal, _exit): no allocation, no lock, nothing of the parent's runtime.
//!
//! The watchdog:
//! - is in a session of its own, so a terminal's job-control signals to
//!   the holder's group (Ctrl-Z, Ctrl-C) do not stop or end it, and it
//!   ignores SIGINT, SIGTERM, SIGHUP and SIGQUIT: it ends when its holder
//!   says so (or dies), never before;
//! - keeps no descriptor but its pipe and the fenced process's pidfd (a
//!   pidfd names that process only, so a reused pid is never killed);
//! - reads each new deadline (8 bytes, nanoseconds on `CLOCK_BOOTTIME`,
//!   the clock the deadline is kept on; 0 when revoked) from the pipe, and
//!   checks the clock at least once a second, so a suspended machine finds
//!   the deadline passed when it wakes;
//! - ends, leaving the process alone, when the pipe's other end closes:
//!   the fence was dropped (the effect ended), or its holder died (then the
//!   fenced process dies with it: a local MCP server's sandbox is started
//!   with `--die-with-parent`).
//!
//! What it cannot do: stop a process at an instant. The kill is SIGKILL,
//! delivered at once, but a system call the fenced process is inside
//! completes first (a `write` lands whole or not at all), and a machine
//! stopped whole (a paused VM) stops the watchdog too: on waking, the
//! fenced process may run a moment before the watchdog kills it.

use std::os::fd::OwnedFd;
#[cfg(target_os = "linux")]
use std::os::fd::{AsRawFd as _, FromRawFd as _};
use std::sync::{Arc, Weak};

/// A process held to a deadline: dropping it ends its watchdog (reaped on
/// a thread of its own if it has not ended yet) and leaves the process
/// alone.
#[derive(Debug)]
pub struct ProcessFence {
    /// The write end of the watchdog's pipe; closing it ends the watchdog.
    pipe: Option<Arc<OwnedFd>>,
    /// The watchdog's process id, to reap it.
    watchdog: i32,
}

/// What a [`ValidUntil`](super::ValidUntil) keeps of a fence: the pipe to
/// its watchdog, while the fence lives.
pub(super) struct Watcher {
    pipe: Weak<OwnedFd>,
}

impl Watcher {
    /// Sends `deadline_ns` to the watchdog; `false` once its fence is gone.
    pub(super) fn tell(&self, deadline_ns: u64) -> bool {
        let Some(pipe) = self.pipe.upgrade() else {
            return false;
        };
        // Eight bytes are written whole (less than PIPE_BUF) or not at
        // all; a full pipe (a watchdog that stopped reading, which it only
        // does once it killed) drops the update.
        let _ = rustix::io::write(&*pipe, &deadline_ns.to_ne_bytes());
        true
    }
}

impl Drop for ProcessFence {
    fn drop(&mut self) {
        // The watchdog reads end of file and exits.
        drop(self.pipe.take());
        reap(self.watchdog);
    }
}

/// Forks the watchdog of process `target`, which kills it once
/// `deadline_ns` (or a later deadline sent through the pipe) passes.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub(super) fn start(target: u32, deadline_ns: u64) -> std::io::Result<(ProcessFence, Watcher)> {
    use std::io::Error;
    let target = libc::pid_t::try_from(target).map_err(Error::other)?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new
    // descriptor, owned from here on.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, target, 0) };
    if pidfd < 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: a descriptor just returned to this process, owned once.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    let mut ends = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    // Close-on-exec: a program another thread spawns meanwhile keeps
    // neither end.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: two descriptors just returned to this process, each owned
    // once.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
    // The holder never waits on a full pipe.
    // SAFETY: fcntl on a descriptor this process owns.
    if unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(Error::last_os_error());
    }
    let (read_fd, pidfd_fd) = (read.as_raw_fd(), pidfd.as_raw_fd());
    // SAFETY: the child runs only `watch`, which makes async-signal-safe
    // system calls on descriptors it inherited, allocates nothing, takes
    // no lock and never returns (it ends with `_exit`), as a child forked
    // from a multi-threaded process must.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(Error::last_os_error()),
        0 => unsafe { watch(read_fd, pidfd_fd, deadline_ns) },
        pid => {
            drop((read, pidfd));
            let write = Arc::new(write);
            let watcher = Watcher {
                pipe: Arc::downgrade(&write),
            };
            Ok((
                ProcessFence {
                    pipe: Some(write),
                    watchdog: pid,
                },
                watcher,
            ))
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn start(_target: u32, _deadline_ns: u64) -> std::io::Result<(ProcessFence, Watcher)> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "a process is held to a claim's deadline on Linux only (pidfd)",
    ))
}

/// The watchdog, in the forked child: waits for the deadline on `pipe`,
/// then kills the process `pidfd` names.
///
/// # Safety
/// Called only in a child just forked, with `pipe` and `pidfd` open.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
unsafe fn watch(pipe: libc::c_int, pidfd: libc::c_int, mut deadline: u64) -> ! {
    // SAFETY (the whole body): each call is async-signal-safe, on
    // descriptors this process holds or plain values; nothing allocates,
    // every arithmetic step saturates or wraps (no panic path runs).
    unsafe {
        libc::setsid();
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            libc::signal(signal, libc::SIG_IGN);
        }
        close_all_but(pipe, pidfd);
        let mut buf = [0u8; 512];
        loop {
            let now = boottime_ns();
            if now >= deadline {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd,
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
                libc::_exit(0);
            }
            let left_ms = (deadline.wrapping_sub(now) / 1_000_000).saturating_add(1);
            let wait_ms = if left_ms > 1000 {
                1000
            } else {
                left_ms as libc::c_int
            };
            let mut fd = libc::pollfd {
                fd: pipe,
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&mut fd, 1, wait_ms) <= 0 {
                // The time passed, or a signal: check the clock.
                continue;
            }
            let n = libc::read(pipe, buf.as_mut_ptr().cast(), buf.len());
            if n == 0 {
                // The fence was dropped or its holder died.
                libc::_exit(0);
            }
            if n < 0 {
                let errno = *libc::__errno_location();
                if errno == libc::EINTR || errno == libc::EAGAIN {
                    continue;
                }
                libc::_exit(1);
            }
            // Every write is 8 bytes, whole: the last one is the newest.
            let whole = (n as usize) & !7;
            if (8..=buf.len()).contains(&whole) {
                let mut last = [0u8; 8];
                let mut i = 0;
                while i < 8 {
                    last[i] = buf[whole - 8 + i];
                    i += 1;
                }
                deadline = u64::from_ne_bytes(last);
            }
        }
    }
}

/// Closes every descriptor but `a` and `b` (the watchdog keeps no other:
/// a pipe end of another watchdog, or the stdin of a server, kept open
/// here would keep its reader from seeing it closed).
///
/// # Safety
/// In the forked child only.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
unsafe fn close_all_but(a: libc::c_int, b: libc::c_int) {
    let (low, high) = if a < b { (a, b) } else { (b, a) };
    let mut first: libc::c_int = 0;
    for keep in [low, high] {
        if keep > first {
            // SAFETY: in the forked child, as this function is.
            unsafe { close_range(first, keep - 1) };
        }
        first = keep.saturating_add(1);
    }
    // SAFETY: as above.
    unsafe { close_range(first, libc::c_int::MAX) };
}

/// Closes descriptors `first` to `last`.
///
/// # Safety
/// In the forked child only.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
unsafe fn close_range(first: libc::c_int, last: libc::c_int) {
    // SAFETY: close_range closes descriptors of this process only.
    let closed = unsafe { libc::syscall(libc::SYS_close_range, first as u32, last as u32, 0u32) };
    if closed == 0 {
        return;
    }
    // Before Linux 5.9: one by one, up to the descriptor limit.
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given.
    let max = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur.min(1 << 20) as libc::c_int
    } else {
        1024
    };
    let mut fd = first;
    while fd <= last && fd < max {
        // SAFETY: closes a descriptor of this process.
        unsafe { libc::close(fd) };
        fd = fd.saturating_add(1);
    }
}

/// Now on `CLOCK_BOOTTIME`, in nanoseconds (the clock
/// [`Moment`](super::Moment) reads on Linux).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn boottime_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut t) };
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

/// Waits for the watchdog `pid` to end: at once if it has, else on a
/// thread of its own (it ends as soon as it reads its pipe closed).
#[allow(unsafe_code)]
fn reap(pid: i32) {
    #[cfg(unix)]
    {
        let mut status = 0;
        // SAFETY: waitpid on a child of this process, by its id.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == 0 {
            std::thread::spawn(move || {
                let mut status = 0;
                // SAFETY: as above, blocking until it ends.
                unsafe { libc::waitpid(pid, &mut status, 0) };
            });
        }
    }
    #[cfg(not(unix))]
    let _ = pid;
}
