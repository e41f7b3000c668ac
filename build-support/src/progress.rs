//! Progress of a guest build, written to the terminal. Cargo shows a build
//! script's output only when the script fails, so a first build of the
//! guests (minutes on a small machine: their dependencies are compiled for
//! `wasm32-wasip2` too) would look like a hang behind one line of cargo's
//! progress bar. When the build has a terminal, each guest finished is said
//! on it at once; without one (CI, a pipe), nothing is written.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::cargo::Artifact;

/// Where a build's progress goes and what it has seen so far.
pub(crate) struct Progress {
    out: Option<Box<dyn Write>>,
    /// The requested packages: name and manifest path.
    packages: Vec<(String, PathBuf)>,
    done: BTreeSet<String>,
    compiled: usize,
    announced: bool,
    target: String,
    started: Instant,
}

impl Progress {
    /// Progress on the controlling terminal when running inside a build
    /// script (`OUT_DIR` set) and there is one; otherwise silent.
    pub(crate) fn on_terminal(packages: Vec<(String, PathBuf)>, target: &str) -> Self {
        let out = std::env::var_os("OUT_DIR")
            .and_then(|_| OpenOptions::new().write(true).open("/dev/tty").ok())
            .map(|tty| Box::new(tty) as Box<dyn Write>);
        Self::to(out, packages, target)
    }

    pub(crate) fn to(
        out: Option<Box<dyn Write>>,
        packages: Vec<(String, PathBuf)>,
        target: &str,
    ) -> Self {
        Self {
            out,
            packages,
            done: BTreeSet::new(),
            compiled: 0,
            announced: false,
            target: target.to_owned(),
            started: Instant::now(),
        }
    }

    /// One `compiler-artifact` message of the inner cargo. Artifacts that
    /// were already up to date say nothing: a rebuild with nothing to do
    /// stays quiet.
    pub(crate) fn artifact(&mut self, artifact: &Artifact) {
        if self.out.is_none() {
            return;
        }
        let requested = self
            .packages
            .iter()
            .find(|(_, manifest)| crate::same_file(manifest, &artifact.manifest_path))
            .map(|(name, _)| name.clone());
        if artifact.fresh {
            // Counted among the guests done, so "n of N" stays true.
            self.done.extend(requested);
            return;
        }
        self.compiled += 1;
        if !self.announced {
            self.announced = true;
            let line = format!(
                "Building {} guest{} for {} (a first build compiles their dependencies for it too: a few minutes)",
                self.packages.len(),
                if self.packages.len() == 1 { "" } else { "s" },
                self.target
            );
            self.say(&line);
        }
        let Some(name) = requested else {
            return;
        };
        if self.done.insert(name.clone()) {
            let line = format!(
                "Built guest {name} ({} of {}, {} crate{} compiled, {})",
                self.done.len(),
                self.packages.len(),
                self.compiled,
                if self.compiled == 1 { "" } else { "s" },
                elapsed(self.started.elapsed())
            );
            self.say(&line);
        }
    }

    /// Writes one line, first clearing the line cargo's progress bar is
    /// drawn on (cargo draws it again at its next tick). A write that fails
    /// (the terminal went away) stops the progress, never the build.
    fn say(&mut self, line: &str) {
        if let Some(out) = &mut self.out
            && write!(out, "\r\x1b[K{:>12} {line}\n", "warden").is_err()
        {
            self.out = None;
        }
    }
}

/// `12 s` or `3 min 04 s`.
fn elapsed(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s} s")
    } else {
        format!("{} min {:02} s", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn artifact(manifest: &str, fresh: bool) -> Artifact {
        Artifact {
            manifest_path: PathBuf::from(manifest),
            target_name: "x".into(),
            filenames: vec![],
            fresh,
        }
    }

    /// A progress for the guests `guest-a` and `guest-b`, written to the
    /// returned buffer.
    fn two_guests() -> (Shared, Progress) {
        let shared = Shared::default();
        let progress = Progress::to(
            Some(Box::new(shared.clone())),
            vec![
                ("guest-a".into(), PathBuf::from("/w/a/Cargo.toml")),
                ("guest-b".into(), PathBuf::from("/w/b/Cargo.toml")),
            ],
            "wasm32-wasip2",
        );
        (shared, progress)
    }

    #[test]
    fn each_guest_built_is_said_once_with_the_crates_compiled_before_it() {
        let (shared, mut progress) = two_guests();
        progress.artifact(&artifact("/r/serde/Cargo.toml", true));
        progress.artifact(&artifact("/r/wit-bindgen/Cargo.toml", false));
        progress.artifact(&artifact("/w/a/Cargo.toml", false));
        // A second target of the same package (a lib and a bin).
        progress.artifact(&artifact("/w/a/Cargo.toml", false));
        progress.artifact(&artifact("/w/b/Cargo.toml", false));
        let text = String::from_utf8(shared.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .map(|l| l.trim_start_matches("\r\x1b[K").trim())
            .collect();
        assert_eq!(lines.len(), 3, "{text:?}");
        assert!(
            lines[0].starts_with("warden Building 2 guests for wasm32-wasip2"),
            "{text:?}"
        );
        assert!(
            lines[1].starts_with("warden Built guest guest-a (1 of 2, 2 crates compiled, "),
            "{text:?}"
        );
        assert!(
            lines[2].starts_with("warden Built guest guest-b (2 of 2, 4 crates compiled, "),
            "{text:?}"
        );
    }

    #[test]
    fn a_build_with_nothing_to_compile_says_nothing() {
        let shared = Shared::default();
        let mut progress = Progress::to(
            Some(Box::new(shared.clone())),
            vec![("guest-a".into(), PathBuf::from("/w/a/Cargo.toml"))],
            "wasm32-wasip2",
        );
        progress.artifact(&artifact("/r/serde/Cargo.toml", true));
        progress.artifact(&artifact("/w/a/Cargo.toml", true));
        assert!(shared.0.lock().unwrap().is_empty());
    }

    #[test]
    fn a_guest_already_built_counts_among_those_done() {
        let (shared, mut progress) = two_guests();
        progress.artifact(&artifact("/w/a/Cargo.toml", true));
        progress.artifact(&artifact("/w/b/Cargo.toml", false));
        let text = String::from_utf8(shared.0.lock().unwrap().clone()).unwrap();
        assert!(
            text.contains("Built guest guest-b (2 of 2, 1 crate compiled, "),
            "{text:?}"
        );
        assert!(!text.contains("guest-a"), "{text:?}");
    }

    #[test]
    fn elapsed_reads_in_minutes_past_one() {
        assert_eq!(elapsed(Duration::from_secs(12)), "12 s");
        assert_eq!(elapsed(Duration::from_secs(184)), "3 min 04 s");
    }
}
