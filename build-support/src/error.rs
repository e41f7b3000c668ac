//! The crate's error type: every way a guest build can fail.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

/// Why a [`GuestBuild`](crate::GuestBuild) failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// No manifest was given and `CARGO_MANIFEST_DIR` is not set.
    NoManifest,
    /// A program (cargo or rustc) could not be started.
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why it did not start.
        source: io::Error,
    },
    /// `cargo metadata` failed or printed something unexpected.
    Metadata {
        /// The manifest it was asked about.
        manifest_path: PathBuf,
        /// What went wrong, with cargo's stderr when it failed.
        message: String,
    },
    /// A package named in the build is not a member of the workspace.
    UnknownPackage {
        /// The name given.
        package: String,
        /// The workspace's root directory.
        workspace_root: PathBuf,
    },
    /// No package was named and the manifest is a virtual workspace manifest.
    NoPackage {
        /// The manifest.
        manifest_path: PathBuf,
    },
    /// The Rust toolchain has no standard library for the target.
    TargetMissing {
        /// The target, `wasm32-wasip2`.
        target: String,
        /// What rustc answered, or where the library should have been.
        detail: String,
    },
    /// Reading a file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// `cargo build` failed; its diagnostics were printed to stderr.
    Build {
        /// The packages it was building.
        packages: Vec<String>,
        /// Its exit status.
        status: ExitStatus,
    },
    /// A package built but produced no `.wasm` file: it has neither a
    /// `cdylib` nor a `bin` target.
    NoComponent {
        /// The package.
        package: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoManifest => f.write_str(
                "no manifest path given and CARGO_MANIFEST_DIR is not set \
                 (call `GuestBuild::manifest_path` outside cargo)",
            ),
            Error::Spawn { program, source } => {
                write!(f, "cannot run `{}`: {source}", program.display())
            }
            Error::Metadata {
                manifest_path,
                message,
            } => write!(
                f,
                "`cargo metadata` for {} failed: {message}",
                manifest_path.display()
            ),
            Error::UnknownPackage {
                package,
                workspace_root,
            } => write!(
                f,
                "package `{package}` is not a member of the workspace at {}",
                workspace_root.display()
            ),
            Error::NoPackage { manifest_path } => write!(
                f,
                "{} is a virtual workspace manifest: name the packages to build",
                manifest_path.display()
            ),
            Error::TargetMissing { target, detail } => write!(
                f,
                "the Rust target `{target}` is not installed ({detail}): \
                 run `rustup target add {target}`"
            ),
            Error::Io { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            Error::Build { packages, status } => write!(
                f,
                "building guests [{}] failed ({status}); cargo's errors are above",
                packages.join(", ")
            ),
            Error::NoComponent { package } => write!(
                f,
                "package `{package}` produced no .wasm file: give it a `cdylib` or `bin` target"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Spawn { source, .. } | Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
