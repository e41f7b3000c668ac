//! The `warden` binary: see `warden --help`.

fn main() -> std::process::ExitCode {
    restore_sigpipe();
    warden_cli::main()
}

/// Rust ignores SIGPIPE, so `warden runs events … | head` would panic on the
/// closed pipe; a command-line tool should just stop, as `cat` does.
#[cfg(unix)]
#[allow(unsafe_code)]
fn restore_sigpipe() {
    // SAFETY: called first thing in `main`, before any other thread exists;
    // setting a signal's disposition to its default has no other effect.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn restore_sigpipe() {}
