//! The first-party plugins built into the `warden` binary.
//!
//! `host/plugins/build.rs` compiles every crate under `plugins/` for `wasm32-wasip2`
//! and embeds each component with its `plugin.toml` and sha256, so an
//! installed `warden` works from any directory and an agent can name them as
//! `builtin:<name>`. The digest is computed at build time from the embedded
//! bytes, and checked again at load like any other plugin's.

use std::path::Path;

use super::manifest::{Manifest, ManifestError};

/// One embedded plugin.
#[derive(Debug)]
pub struct Builtin {
    /// The plugin's name (its directory under `plugins/`).
    pub name: &'static str,
    /// Its `plugin.toml`.
    pub manifest_text: &'static str,
    /// The component.
    pub wasm: &'static [u8],
    /// The component's sha256, hex, computed when the binary was built.
    pub sha256: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/builtin_plugins.rs"));

impl Builtin {
    /// The parsed manifest.
    pub fn manifest(&self) -> Result<Manifest, ManifestError> {
        let path = format!("builtin:{}/plugin.toml", self.name);
        Manifest::parse(self.manifest_text, Path::new(&path), Path::new("."))
    }
}

/// Every built-in plugin.
pub fn all() -> &'static [Builtin] {
    BUILTINS
}

/// The built-in plugin called `name`.
pub fn find(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

/// The names of the built-in plugins.
pub fn names() -> Vec<&'static str> {
    BUILTINS.iter().map(|b| b.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_manifest_is_valid_and_named_after_its_directory() {
        assert!(!all().is_empty());
        for b in all() {
            let m = b.manifest().unwrap();
            assert_eq!(m.name, b.name);
            assert_eq!(
                m.component, None,
                "{}: built-ins carry no component path",
                b.name
            );
            assert!(b.wasm.starts_with(b"\0asm"), "{}", b.name);
        }
    }

    /// `examples/plugins/<name>/grant.toml` exists for every built-in and
    /// applies to its manifest: everything it grants is requested (mount
    /// directories are swapped for a temporary one, which exists).
    #[test]
    fn every_builtin_has_an_example_grant_that_applies() {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/plugins");
        let scratch = tempfile::tempdir().unwrap();
        for b in all() {
            let path = examples.join(b.name).join("grant.toml");
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let mut grant: crate::grant::Grant =
                toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                !grant.mounts.is_empty() || !grant.hosts.is_empty() || !grant.config.is_empty(),
                "{}: the example grants nothing",
                b.name
            );
            for mount in grant.mounts.values_mut() {
                mount.dir = scratch.path().to_owned();
            }
            let manifest = b.manifest().unwrap();
            crate::grant::effective(&manifest, &grant, Path::new("."), |_| Some("value".into()))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let linked = examples.join(b.name).join("plugin.toml");
            assert_eq!(
                std::fs::read_to_string(&linked).unwrap(),
                b.manifest_text,
                "{}",
                linked.display()
            );
        }
    }
}
