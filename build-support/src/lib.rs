//! Builds Cargo packages into WebAssembly components (`wasm32-wasip2`) from a
//! build script or a test.
//!
//! Warden's extensions are components. Three places need to compile one from
//! Rust on the fly: `tests/build.rs` (the hostile test guests), `host/plugins/build.rs`
//! (first-party plugins it embeds) and the plugin testkit (a plugin author's
//! crate, built from their test). They all go through [`GuestBuild`]:
//!
//! ```no_run
//! // in a build script
//! let components = warden_build_support::GuestBuild::new()
//!     .packages(["warden-test-hostile", "warden-test-noop"])
//!     .build()
//!     .unwrap_or_else(|e| panic!("{e}"));
//! for c in &components {
//!     println!("{} -> {}", c.package, c.path.display());
//! }
//! ```
//!
//! # What one build does
//! - **One cargo invocation** for all requested packages, so they share one
//!   dependency graph and one lock wait.
//! - **Target** `wasm32-wasip2`: a `cdylib` with wit-bindgen exports is already
//!   a component, and so is a `bin`. If the target's standard library is not
//!   installed the build stops early with [`Error::TargetMissing`], whose
//!   message says to run `rustup target add wasm32-wasip2`.
//! - **Profile** `guest` when the workspace root manifest defines
//!   `[profile.guest]` (Warden's does), else `release`.
//! - **Target directory** `<workspace target dir>/guests`: a nested cargo that
//!   used the outer build's target directory would wait forever on the lock
//!   the outer build holds.
//! - **Nested-cargo hygiene**: the cargo binary is the `CARGO` the outer build
//!   runs; variables through which the outer build would leak into the inner
//!   one (its rustflags, target, target directory, clippy's workspace wrapper)
//!   are removed. See [`LEAKING_ENV`]. The jobserver (`CARGO_MAKEFLAGS`) is
//!   kept on purpose, so the inner build shares the outer build's job slots
//!   instead of oversubscribing the machine.
//! - **Progress**: inside a build script with a terminal, each guest built is
//!   said on the terminal as it finishes (cargo would show the script's own
//!   output only if it failed); otherwise nothing is written.
//! - **Rebuild triggers**: inside a build script it prints
//!   `cargo:rerun-if-changed` for each built package's directory, the
//!   directories of its path dependencies (the guest SDK, for example), the
//!   workspace's `wit/`, `Cargo.toml` and `Cargo.lock`, and every file rustc
//!   recorded in the artifacts' dep-info.
//!
//! The crate depends on `serde_json` only, to read cargo's JSON output.
#![forbid(unsafe_code)]

mod cargo;
mod dep_info;
mod error;
mod metadata;
mod progress;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub use cargo::LEAKING_ENV;
pub use error::Error;

use metadata::Workspace;

/// The target every guest is built for.
pub const TARGET: &str = "wasm32-wasip2";

/// The profile used when the workspace defines it.
pub const GUEST_PROFILE: &str = "guest";

/// The profile used when the workspace does not define [`GUEST_PROFILE`].
pub const FALLBACK_PROFILE: &str = "release";

/// The subdirectory of the workspace's target directory the guests are built in.
pub const TARGET_SUBDIR: &str = "guests";

/// A build of one or more packages into components.
///
/// By default it builds the package whose manifest is
/// `$CARGO_MANIFEST_DIR/Cargo.toml` (the crate whose build script or test is
/// running), with the profile, target directory and rebuild triggers described
/// in the [crate docs](crate).
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct GuestBuild {
    manifest_path: Option<PathBuf>,
    packages: Vec<String>,
    profile: Option<String>,
    target_dir: Option<PathBuf>,
    watch: Vec<PathBuf>,
    rerun_if_changed: Option<bool>,
}

/// One component a build produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    /// The Cargo package it came from, for example `warden-test-hostile`.
    pub package: String,
    /// The crate target's name, for example `warden_test_hostile`.
    pub target: String,
    /// Absolute path of the `.wasm` component.
    pub path: PathBuf,
}

impl GuestBuild {
    /// A build with every setting at its default; see the setters.
    pub fn new() -> Self {
        Self::default()
    }

    /// The manifest cargo is pointed at: a package's `Cargo.toml` (inside a
    /// workspace or not) or a workspace root.
    ///
    /// Default: `$CARGO_MANIFEST_DIR/Cargo.toml`.
    pub fn manifest_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.manifest_path = Some(path.into());
        self
    }

    /// Adds a package, by name, of the manifest's workspace.
    ///
    /// Default: no package named, which builds the package of
    /// [`manifest_path`](Self::manifest_path) itself.
    pub fn package(mut self, name: impl Into<String>) -> Self {
        self.packages.push(name.into());
        self
    }

    /// Adds several packages; see [`package`](Self::package).
    pub fn packages<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.packages.extend(names.into_iter().map(Into::into));
        self
    }

    /// The cargo profile to build with.
    ///
    /// Default: [`GUEST_PROFILE`] when the workspace root manifest has a
    /// `[profile.guest]` table, else [`FALLBACK_PROFILE`].
    pub fn profile(mut self, name: impl Into<String>) -> Self {
        self.profile = Some(name.into());
        self
    }

    /// The directory the inner cargo builds in.
    ///
    /// Default: `<workspace target dir>/guests`. It must differ from the
    /// directory of any cargo build that is running this one.
    pub fn target_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.target_dir = Some(dir.into());
        self
    }

    /// Adds a path whose change must re-run the calling build script, on top
    /// of the ones found by themselves (see the [crate docs](crate)).
    ///
    /// Default: none.
    pub fn watch(mut self, path: impl Into<PathBuf>) -> Self {
        self.watch.push(path.into());
        self
    }

    /// Whether to print `cargo:rerun-if-changed` lines.
    ///
    /// Default: true when `OUT_DIR` is set in the environment, that is when
    /// running inside a build script.
    pub fn emit_rerun_if_changed(mut self, yes: bool) -> Self {
        self.rerun_if_changed = Some(yes);
        self
    }

    /// Runs the build and returns the components, in the order the packages
    /// were named (a package with several component targets yields several).
    ///
    /// The inner cargo's diagnostics go to this process's stderr.
    pub fn build(&self) -> Result<Vec<Component>, Error> {
        let manifest_path = match &self.manifest_path {
            Some(path) => path.clone(),
            None => {
                let dir = std::env::var_os("CARGO_MANIFEST_DIR").ok_or(Error::NoManifest)?;
                Path::new(&dir).join("Cargo.toml")
            }
        };
        let cargo = cargo::Cargo::from_env();
        let workspace = cargo.metadata(&manifest_path)?;
        let selected = workspace.select(&manifest_path, &self.packages)?;

        cargo::check_target_installed(TARGET)?;

        let profile = match &self.profile {
            Some(profile) => profile.clone(),
            None if workspace.defines_profile(GUEST_PROFILE)? => GUEST_PROFILE.to_owned(),
            None => FALLBACK_PROFILE.to_owned(),
        };
        let target_dir = self
            .target_dir
            .clone()
            .unwrap_or_else(|| workspace.target_directory.join(TARGET_SUBDIR));

        let names: Vec<&str> = selected.iter().map(|p| p.name.as_str()).collect();
        let mut progress = progress::Progress::on_terminal(
            selected
                .iter()
                .map(|p| (p.name.clone(), p.manifest_path.clone()))
                .collect(),
            TARGET,
        );
        let artifacts = cargo.build(
            &cargo::BuildRequest {
                manifest_path: &manifest_path,
                packages: &names,
                target: TARGET,
                profile: &profile,
                target_dir: &target_dir,
            },
            &mut progress,
        )?;

        let mut components = Vec::new();
        let mut dep_info_files = Vec::new();
        for package in &selected {
            let before = components.len();
            for artifact in artifacts
                .iter()
                .filter(|a| same_file(&a.manifest_path, &package.manifest_path))
            {
                for file in artifact.filenames.iter().filter(|f| is_wasm(f)) {
                    dep_info_files.push(file.with_extension("d"));
                    components.push(Component {
                        package: package.name.clone(),
                        target: artifact.target_name.clone(),
                        path: file.clone(),
                    });
                }
            }
            if components.len() == before {
                return Err(Error::NoComponent {
                    package: package.name.clone(),
                });
            }
        }

        let emit = self
            .rerun_if_changed
            .unwrap_or_else(|| std::env::var_os("OUT_DIR").is_some());
        if emit {
            for path in self.rerun_paths(&workspace, &selected, &dep_info_files) {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
        Ok(components)
    }

    /// Everything whose change should rebuild the guests: see the crate docs.
    fn rerun_paths(
        &self,
        workspace: &Workspace,
        selected: &[&metadata::Package],
        dep_info_files: &[PathBuf],
    ) -> BTreeSet<PathBuf> {
        let mut paths = BTreeSet::new();
        for dir in workspace.source_dirs(selected) {
            paths.insert(dir);
        }
        let root = &workspace.workspace_root;
        for extra in ["wit", "Cargo.toml", "Cargo.lock"] {
            let path = root.join(extra);
            if path.exists() {
                paths.insert(path);
            }
        }
        paths.extend(self.watch.iter().cloned());
        for file in dep_info_files {
            // A missing dep-info file only loses precision: the package
            // directories above are watched anyway.
            if let Ok(text) = std::fs::read_to_string(file) {
                paths.extend(dep_info::parse(&text));
            }
        }
        paths
    }
}

fn is_wasm(path: &Path) -> bool {
    path.extension().is_some_and(|ext| ext == "wasm")
}

/// Compares two paths, resolving symlinks when both exist.
fn same_file(a: &Path, b: &Path) -> bool {
    if a == b {
        return true;
    }
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
