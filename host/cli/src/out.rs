//! Standard output while a run is driven. A reader that goes away
//! (`warden run … | head`) must not stop a drive halfway, leaving the run
//! "running" with nobody driving it: while a command drives a run, SIGPIPE
//! is ignored, output after the pipe closed is dropped, and the drive goes
//! on to its end (finished or parked, as it would have). The command then
//! says once, on stderr, that its stdout was closed and where the run
//! stands. Commands that only read keep the default: they stop at a closed
//! pipe, as `cat` does.

use std::fmt::Display;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set at the first write that found stdout closed.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// From now on, a closed stdout is an error to this process's writes, not
/// a signal that kills it mid-drive.
pub(crate) fn survive_a_closed_stdout() {
    #[cfg(unix)]
    ignore_sigpipe();
}

#[cfg(unix)]
#[allow(unsafe_code)]
fn ignore_sigpipe() {
    // SAFETY: installs no handler, only the `ignore` disposition, which is
    // process-wide and makes a write to a closed pipe fail with EPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Prints `text` and a newline, unless stdout is closed.
pub(crate) fn line(text: impl Display) {
    write(format_args!("{text}\n"));
}

/// Prints `text` as it is (a model's streamed text), unless stdout is
/// closed.
pub(crate) fn text(text: impl Display) {
    write(format_args!("{text}"));
}

fn write(args: std::fmt::Arguments<'_>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if out.write_fmt(args).and_then(|()| out.flush()).is_err() {
        // Closed (EPIPE) or otherwise unwritable: the drive matters more
        // than its echo.
        CLOSED.store(true, Ordering::Relaxed);
    }
}

/// Whether a write found stdout closed.
pub(crate) fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// Says on stderr, once a drive ended, that stdout had been closed and where
/// the run stands; nothing when stdout stayed open.
pub(crate) fn report_closed(run: &warden::engine::RunId, status: warden::engine::RunStatus) {
    if !closed() {
        return;
    }
    // stderr may be closed too; there is nobody left to tell then.
    let _ = writeln!(
        std::io::stderr(),
        "warden: stdout was closed; run {run} was driven on without it and is {status} (see `warden runs show {run}`)"
    );
}
