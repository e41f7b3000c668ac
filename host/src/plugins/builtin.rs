//! The first-party plugins built into the `warden` binary.
//!
//! `host/build.rs` compiles every crate under `plugins/` for `wasm32-wasip2`
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
}
