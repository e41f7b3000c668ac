//! What the build needs to know about the workspace, read from
//! `cargo metadata --no-deps`: its root, its target directory, and its members
//! with their path dependencies.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::Error;

/// A workspace, as `cargo metadata --no-deps` describes it.
#[derive(Debug)]
pub(crate) struct Workspace {
    pub(crate) workspace_root: PathBuf,
    pub(crate) target_directory: PathBuf,
    pub(crate) packages: Vec<Package>,
}

/// One workspace member.
#[derive(Debug)]
pub(crate) struct Package {
    pub(crate) name: String,
    pub(crate) manifest_path: PathBuf,
    /// Directories of its path dependencies (normal, build and dev).
    pub(crate) path_deps: Vec<PathBuf>,
}

impl Workspace {
    /// Reads `cargo metadata --format-version 1` output; `manifest_path` only
    /// names the manifest in errors.
    pub(crate) fn from_json(json: &str, manifest_path: &Path) -> Result<Self, Error> {
        let invalid = |what: &str| Error::Metadata {
            manifest_path: manifest_path.to_owned(),
            message: format!("unexpected output: {what}"),
        };
        let value: Value = serde_json::from_str(json).map_err(|e| invalid(&e.to_string()))?;
        let path_of = |v: &Value, key: &str| {
            v.get(key)
                .and_then(Value::as_str)
                .map(PathBuf::from)
                .ok_or_else(|| invalid(&format!("no `{key}`")))
        };
        let workspace_root = path_of(&value, "workspace_root")?;
        let target_directory = path_of(&value, "target_directory")?;
        let mut packages = Vec::new();
        for package in value
            .get("packages")
            .and_then(Value::as_array)
            .ok_or_else(|| invalid("no `packages`"))?
        {
            let name = package
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("a package without `name`"))?
                .to_owned();
            let manifest_path = path_of(package, "manifest_path")?;
            let path_deps = package
                .get("dependencies")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|dep| dep.get("path").and_then(Value::as_str))
                .map(PathBuf::from)
                .collect();
            packages.push(Package {
                name,
                manifest_path,
                path_deps,
            });
        }
        Ok(Workspace {
            workspace_root,
            target_directory,
            packages,
        })
    }

    /// The packages to build: the named ones, or the manifest's own package
    /// when none is named.
    pub(crate) fn select(
        &self,
        manifest_path: &Path,
        names: &[String],
    ) -> Result<Vec<&Package>, Error> {
        if names.is_empty() {
            return self
                .packages
                .iter()
                .find(|p| crate::same_file(&p.manifest_path, manifest_path))
                .map(|p| vec![p])
                .ok_or_else(|| Error::NoPackage {
                    manifest_path: manifest_path.to_owned(),
                });
        }
        let mut selected: Vec<&Package> = Vec::new();
        for name in names {
            let package = self
                .packages
                .iter()
                .find(|p| &p.name == name)
                .ok_or_else(|| Error::UnknownPackage {
                    package: name.clone(),
                    workspace_root: self.workspace_root.clone(),
                })?;
            if !selected.iter().any(|p| p.name == package.name) {
                selected.push(package);
            }
        }
        Ok(selected)
    }

    /// Whether the workspace root manifest has a `[profile.<name>]` table.
    pub(crate) fn defines_profile(&self, name: &str) -> Result<bool, Error> {
        let path = self.workspace_root.join("Cargo.toml");
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io { path, source })?;
        Ok(manifest_defines_profile(&text, name))
    }

    /// The directories holding the sources of `selected`: their own
    /// directories and those of their path dependencies, transitively through
    /// workspace members.
    pub(crate) fn source_dirs(&self, selected: &[&Package]) -> BTreeSet<PathBuf> {
        let mut dirs = BTreeSet::new();
        let mut todo: Vec<&Package> = selected.to_vec();
        while let Some(package) = todo.pop() {
            let Some(dir) = package.manifest_path.parent() else {
                continue;
            };
            if !dirs.insert(dir.to_owned()) {
                continue;
            }
            for dep in &package.path_deps {
                match self
                    .packages
                    .iter()
                    .find(|p| p.manifest_path.parent() == Some(dep.as_path()))
                {
                    Some(member) => todo.push(member),
                    None => {
                        dirs.insert(dep.clone());
                    }
                }
            }
        }
        dirs
    }
}

/// Whether a manifest's text has a `[profile.<name>]` table header. A line
/// scan, not a TOML parser: enough for the way profiles are written.
fn manifest_defines_profile(manifest: &str, name: &str) -> bool {
    let header = format!("[profile.{name}]");
    manifest.lines().any(|line| {
        let line = line.split('#').next().unwrap_or("");
        let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
        compact == header
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_profile_headers() {
        let cases = [
            ("[profile.guest]\nopt-level = 's'\n", true),
            ("  [ profile.guest ]  # the guests\n", true),
            ("[profile.guest.package.foo]\n", false),
            ("# [profile.guest]\n", false),
            ("[profile.release]\n", false),
            ("", false),
        ];
        for (manifest, expected) in cases {
            assert_eq!(
                manifest_defines_profile(manifest, "guest"),
                expected,
                "{manifest:?}"
            );
        }
    }

    const METADATA: &str = r#"{
        "workspace_root": "/ws",
        "target_directory": "/ws/target",
        "packages": [
            {"name": "tool", "manifest_path": "/ws/plugins/tool/Cargo.toml",
             "dependencies": [{"name": "sdk", "path": "/ws/sdk"}, {"name": "serde_json"}]},
            {"name": "sdk", "manifest_path": "/ws/sdk/Cargo.toml",
             "dependencies": [{"name": "outside", "path": "/elsewhere/outside"}]},
            {"name": "other", "manifest_path": "/ws/other/Cargo.toml", "dependencies": []}
        ]
    }"#;

    #[test]
    fn reads_metadata_and_selects_packages() {
        let ws = Workspace::from_json(METADATA, Path::new("/ws/Cargo.toml")).unwrap();
        assert_eq!(ws.workspace_root, Path::new("/ws"));
        assert_eq!(ws.target_directory, Path::new("/ws/target"));

        let names = |ps: Vec<&Package>| ps.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        let picked = ws
            .select(
                Path::new("/ws/Cargo.toml"),
                &["other".into(), "tool".into()],
            )
            .unwrap();
        assert_eq!(names(picked), ["other", "tool"]);
        let own = ws
            .select(Path::new("/ws/plugins/tool/Cargo.toml"), &[])
            .unwrap();
        assert_eq!(names(own), ["tool"]);

        assert!(matches!(
            ws.select(Path::new("/ws/Cargo.toml"), &["nope".into()]),
            Err(Error::UnknownPackage { package, .. }) if package == "nope"
        ));
        assert!(matches!(
            ws.select(Path::new("/ws/Cargo.toml"), &[]),
            Err(Error::NoPackage { .. })
        ));
    }

    #[test]
    fn source_dirs_follow_path_dependencies() {
        let ws = Workspace::from_json(METADATA, Path::new("/ws/Cargo.toml")).unwrap();
        let tool = ws.select(Path::new("/ws"), &["tool".into()]).unwrap();
        let dirs: Vec<PathBuf> = ws.source_dirs(&tool).into_iter().collect();
        assert_eq!(
            dirs,
            [
                PathBuf::from("/elsewhere/outside"),
                PathBuf::from("/ws/plugins/tool"),
                PathBuf::from("/ws/sdk"),
            ]
        );
    }

    #[test]
    fn rejects_unexpected_output() {
        for json in ["", "{}", r#"{"workspace_root": "/ws"}"#] {
            assert!(matches!(
                Workspace::from_json(json, Path::new("/ws/Cargo.toml")),
                Err(Error::Metadata { .. })
            ));
        }
    }
}
