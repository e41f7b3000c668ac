//! Running the inner cargo: which binary, which environment, and reading its
//! JSON messages. Also the check that the target is installed.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::Error;
use crate::metadata::Workspace;
use crate::progress::Progress;

/// Environment variables removed from the inner cargo's environment, because
/// through them the outer build would leak into the inner one.
///
/// - `CARGO_ENCODED_RUSTFLAGS`, `RUSTFLAGS`, `CARGO_BUILD_RUSTFLAGS`: flags
///   meant for the outer build's target (cargo hands build scripts the
///   encoded form, and cargo reads it as configuration).
/// - `CARGO_TARGET_DIR`, `CARGO_BUILD_TARGET_DIR`, `CARGO_BUILD_TARGET`: the
///   inner build chooses its own directory and target on the command line.
/// - `RUSTC_WORKSPACE_WRAPPER`, `CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER`,
///   `CLIPPY_ARGS`, `__CLIPPY_INTERNAL_ARGS`: set by `cargo clippy`, which
///   would otherwise lint the guests for wasm instead of compiling them.
/// - `__CARGO_FIX_PLZ`: set by `cargo fix`, which would rewrite guest sources.
///
/// `CARGO_MAKEFLAGS` and `MAKEFLAGS` are kept: the inner cargo then takes job
/// slots from the outer build's jobserver instead of starting as many jobs
/// again. `RUSTC` and `RUSTC_WRAPPER` are kept too, so the inner build uses
/// the same compiler (and cache wrapper) as the outer one.
pub const LEAKING_ENV: &[&str] = &[
    "CARGO_ENCODED_RUSTFLAGS",
    "RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER",
    "CLIPPY_ARGS",
    "__CLIPPY_INTERNAL_ARGS",
    "__CARGO_FIX_PLZ",
];

/// The cargo binary the inner builds run.
pub(crate) struct Cargo {
    program: PathBuf,
}

/// What to build.
pub(crate) struct BuildRequest<'a> {
    pub(crate) manifest_path: &'a Path,
    pub(crate) packages: &'a [&'a str],
    pub(crate) target: &'a str,
    pub(crate) profile: &'a str,
    pub(crate) target_dir: &'a Path,
}

/// One `compiler-artifact` message of cargo's JSON output.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Artifact {
    pub(crate) manifest_path: PathBuf,
    pub(crate) target_name: String,
    pub(crate) filenames: Vec<PathBuf>,
    /// Already up to date: nothing was compiled for it.
    pub(crate) fresh: bool,
}

impl Cargo {
    /// `$CARGO` (the cargo running this build script or test), else `cargo`
    /// from `PATH`.
    pub(crate) fn from_env() -> Self {
        let program = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
        Cargo {
            program: PathBuf::from(program),
        }
    }

    /// Reads the workspace of `manifest_path`. The environment is the outer
    /// one, unchanged, so that a `CARGO_TARGET_DIR` the user set is honoured.
    pub(crate) fn metadata(&self, manifest_path: &Path) -> Result<Workspace, Error> {
        let mut cmd = Command::new(&self.program);
        cmd.args(["metadata", "--format-version", "1", "--no-deps"])
            .arg("--manifest-path")
            .arg(manifest_path)
            .stdin(Stdio::null());
        let output = cmd.output().map_err(|source| Error::Spawn {
            program: self.program.clone(),
            source,
        })?;
        if !output.status.success() {
            return Err(Error::Metadata {
                manifest_path: manifest_path.to_owned(),
                message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        Workspace::from_json(&String::from_utf8_lossy(&output.stdout), manifest_path)
    }

    /// A cargo command with the leaking variables removed.
    fn hygienic_command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        for name in LEAKING_ENV {
            cmd.env_remove(name);
        }
        cmd
    }

    /// The `cargo build` command line for `request`.
    fn build_command(&self, request: &BuildRequest<'_>) -> Command {
        let mut cmd = self.hygienic_command();
        cmd.args(["build", "--message-format=json-render-diagnostics"])
            .arg("--target")
            .arg(request.target)
            .arg("--profile")
            .arg(request.profile)
            .arg("--target-dir")
            .arg(request.target_dir)
            // A configured `build.build-dir` would otherwise be shared with
            // the outer build, and its lock with it.
            .env("CARGO_BUILD_BUILD_DIR", request.target_dir)
            .arg("--manifest-path")
            .arg(request.manifest_path);
        for package in request.packages {
            cmd.arg("--package").arg(package);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        cmd
    }

    /// Runs `cargo build` and returns the artifacts it reported, telling
    /// `progress` of each as it comes. Its diagnostics go to this process's
    /// stderr.
    pub(crate) fn build(
        &self,
        request: &BuildRequest<'_>,
        progress: &mut Progress,
    ) -> Result<Vec<Artifact>, Error> {
        let mut cmd = self.build_command(request);
        // The command as one would type it: `Command`'s Debug form would
        // show the environment scrubbing (`env -u …`) as if it were part
        // of it.
        let shown: Vec<String> = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        eprintln!("warden-build-support: running {}", shown.join(" "));
        let mut child = cmd.spawn().map_err(|source| Error::Spawn {
            program: self.program.clone(),
            source,
        })?;
        let mut artifacts = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            for line in BufReader::new(stdout).lines() {
                let line = line.map_err(|source| Error::Io {
                    path: self.program.clone(),
                    source,
                })?;
                if let Some(artifact) = parse_artifact(&line) {
                    progress.artifact(&artifact);
                    artifacts.push(artifact);
                }
            }
        }
        let status = child.wait().map_err(|source| Error::Spawn {
            program: self.program.clone(),
            source,
        })?;
        if !status.success() {
            return Err(Error::Build {
                packages: request.packages.iter().map(|p| p.to_string()).collect(),
                status,
            });
        }
        Ok(artifacts)
    }
}

/// Reads one line of cargo's JSON output; `None` unless it is a
/// `compiler-artifact` message.
fn parse_artifact(line: &str) -> Option<Artifact> {
    let value: Value = serde_json::from_str(line).ok()?;
    if value.get("reason")?.as_str()? != "compiler-artifact" {
        return None;
    }
    Some(Artifact {
        manifest_path: PathBuf::from(value.get("manifest_path")?.as_str()?),
        target_name: value.get("target")?.get("name")?.as_str()?.to_owned(),
        filenames: value
            .get("filenames")?
            .as_array()?
            .iter()
            .filter_map(Value::as_str)
            .map(PathBuf::from)
            .collect(),
        fresh: value.get("fresh").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// Checks that the toolchain has the standard library for `target`, and
/// where it does not and rustup manages the toolchain, adds it with
/// `rustup target add` first.
///
/// `rust-toolchain.toml` lists the target, but rustup adds listed targets
/// only when it installs the toolchain itself; with `RUSTUP_AUTO_INSTALL=0`
/// (locked-down machines, many CI images) an existing toolchain without the
/// target stays so, and a fresh clone's first `cargo build` would fail. The
/// toolchain named is the one running this build (`RUSTUP_TOOLCHAIN`, which
/// rustup's proxies set), so the target lands where the inner cargo looks.
pub(crate) fn check_target_installed(target: &str) -> Result<(), Error> {
    let rustc = PathBuf::from(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()));
    match target_libdir_state(&rustc, target)? {
        TargetState::Installed => return Ok(()),
        TargetState::Missing(detail) if !rustup_manages_toolchain() => {
            return Err(Error::TargetMissing {
                target: target.to_owned(),
                detail,
            });
        }
        TargetState::Missing(_) => {}
    }
    rustup_add_target(target)?;
    match target_libdir_state(&rustc, target)? {
        TargetState::Installed => Ok(()),
        TargetState::Missing(detail) => Err(Error::TargetMissing {
            target: target.to_owned(),
            detail: format!("`rustup target add {target}` succeeded, yet {detail}"),
        }),
    }
}

enum TargetState {
    Installed,
    Missing(String),
}

fn target_libdir_state(rustc: &Path, target: &str) -> Result<TargetState, Error> {
    let output = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", target])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| Error::Spawn {
            program: rustc.to_owned(),
            source,
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Ok(TargetState::Missing(format!(
            "`{} --print target-libdir --target {target}` failed: {}",
            rustc.display(),
            stderr.trim()
        )));
    }
    let libdir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let has_core = std::fs::read_dir(&libdir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("libcore-"))
    });
    Ok(if has_core {
        TargetState::Installed
    } else {
        TargetState::Missing(format!("no standard library in {}", libdir.display()))
    })
}

/// Whether the toolchain running this build is rustup's: rustup's proxies
/// set `RUSTUP_TOOLCHAIN` (and `RUSTUP_HOME`) for everything below them.
fn rustup_manages_toolchain() -> bool {
    std::env::var_os("RUSTUP_TOOLCHAIN").is_some() || std::env::var_os("RUSTUP_HOME").is_some()
}

fn rustup_add_target(target: &str) -> Result<(), Error> {
    let rustup = PathBuf::from(std::env::var_os("RUSTUP").unwrap_or_else(|| "rustup".into()));
    let mut cmd = Command::new(&rustup);
    cmd.args(["target", "add", target]);
    if let Some(toolchain) = std::env::var_os("RUSTUP_TOOLCHAIN") {
        cmd.arg("--toolchain").arg(toolchain);
    }
    // Cargo shows a build script's stderr only when it fails; a `warning`
    // line tells the user at once why the first build pauses.
    if std::env::var_os("OUT_DIR").is_some() {
        println!(
            "cargo:warning=adding the Rust target `{target}` with `rustup target add {target}` (guests are built for it)"
        );
    }
    eprintln!("adding the Rust target `{target}` (rustup target add {target})");
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| Error::Spawn {
            program: rustup.clone(),
            source,
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::TargetMissing {
            target: target.to_owned(),
            detail: format!(
                "`rustup target add {target}` failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_command_is_hygienic() {
        let cargo = Cargo {
            program: PathBuf::from("cargo"),
        };
        let cmd = cargo.build_command(&BuildRequest {
            manifest_path: Path::new("/ws/Cargo.toml"),
            packages: &["a", "b"],
            target: "wasm32-wasip2",
            profile: "guest",
            target_dir: Path::new("/ws/target/guests"),
        });
        let removed: Vec<_> = cmd
            .get_envs()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        for name in LEAKING_ENV {
            assert!(removed.iter().any(|r| r == name), "{name} is not removed");
        }
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy()).collect();
        assert_eq!(
            args.join(" "),
            "build --message-format=json-render-diagnostics --target wasm32-wasip2 \
             --profile guest --target-dir /ws/target/guests --manifest-path /ws/Cargo.toml \
             --package a --package b"
        );
    }

    #[test]
    fn parses_artifact_messages() {
        let artifact = r#"{"reason":"compiler-artifact","package_id":"x","manifest_path":"/ws/g/Cargo.toml","target":{"kind":["cdylib"],"name":"g"},"filenames":["/ws/target/guests/wasm32-wasip2/guest/g.wasm"],"fresh":true}"#;
        assert_eq!(
            parse_artifact(artifact),
            Some(Artifact {
                manifest_path: PathBuf::from("/ws/g/Cargo.toml"),
                target_name: "g".into(),
                filenames: vec![PathBuf::from(
                    "/ws/target/guests/wasm32-wasip2/guest/g.wasm"
                )],
                fresh: true,
            })
        );
        for other in [
            r#"{"reason":"build-finished","success":true}"#,
            r#"{"reason":"compiler-message"}"#,
            "not json",
            "",
        ] {
            assert_eq!(parse_artifact(other), None, "{other}");
        }
    }

    #[test]
    fn a_missing_target_says_how_to_install_it() {
        let err = check_target_installed("no-such-target-anywhere").unwrap_err();
        assert!(matches!(err, Error::TargetMissing { .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message.contains("rustup target add no-such-target-anywhere"),
            "{message}"
        );
    }
}
