//! The on-disk cache of compiled components.
//!
//! An entry is keyed by the component's sha256 and the engine's compatibility
//! hash (wasmtime version, target and every setting that affects code), so a
//! new wasmtime or a different configuration never reuses old code. Each
//! entry carries the sha256 of its own payload: a truncated, corrupt or
//! foreign file fails that check and is recompiled, never handed to wasmtime.
//! Entries are written to a temporary file and renamed into place, so a crash
//! mid-write leaves no half entry under the final name. Quickly compiled code
//! (`SandboxConfig::quick_compile_bytes`) has entries of its own, so a host
//! that compiles optimised code never loads it.
//!
//! The checksum protects against corruption, not against someone who can
//! write to the directory: keep the cache directory writable by the operator
//! only.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::SandboxError;

/// Bytes every entry starts with.
const MAGIC: &[u8; 8] = b"WRDNCWA1";
const HEADER_LEN: usize = MAGIC.len() + 32;

/// Where a component came from when it was loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheStatus {
    /// Compiled now; no cache is configured.
    Uncached,
    /// Compiled now and written to the cache.
    Compiled,
    /// Loaded from a valid cache entry.
    Hit,
    /// A cache entry existed but failed verification; compiled again and the
    /// entry replaced.
    Replaced,
}

/// A directory of compiled components for one engine configuration.
#[derive(Clone, Debug)]
pub(crate) struct ComponentCache {
    dir: PathBuf,
    engine_key: String,
}

impl ComponentCache {
    pub(crate) fn new(dir: PathBuf, engine: &Engine) -> Result<Self, SandboxError> {
        std::fs::create_dir_all(&dir).map_err(|error| SandboxError::Io {
            action: "cannot create component cache directory",
            path: dir.clone(),
            error,
        })?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Ok(ComponentCache {
            dir,
            engine_key: format!("{:016x}", hasher.finish()),
        })
    }

    /// The file an entry for this component's optimised code lives in.
    pub(crate) fn entry_path(&self, component_sha256: &str) -> PathBuf {
        self.dir
            .join(format!("{component_sha256}-{}.cwasm", self.engine_key))
    }

    /// The file an entry for its quickly compiled code lives in.
    fn quick_entry_path(&self, component_sha256: &str) -> PathBuf {
        self.dir.join(format!(
            "{component_sha256}-{}-quick.cwasm",
            self.engine_key
        ))
    }

    /// Loads the compiled component from the cache, or compiles it with
    /// `compile` and stores it. For a `quick` compile, an optimised entry is
    /// taken when there is one, else the quick entry, else the component is
    /// compiled and stored as the quick entry.
    pub(crate) fn load_or_compile(
        &self,
        engine: &Engine,
        quick: bool,
        plugin: &str,
        component_sha256: &str,
        compile: impl FnOnce() -> Result<Component, SandboxError>,
    ) -> Result<(Component, CacheStatus), SandboxError> {
        if quick
            && let Ok(entry) = std::fs::read(self.entry_path(component_sha256))
            && let Some(payload) = verified_payload(&entry)
            && let Ok(component) = deserialize(engine, payload)
        {
            return Ok((component, CacheStatus::Hit));
        }
        let path = if quick {
            self.quick_entry_path(component_sha256)
        } else {
            self.entry_path(component_sha256)
        };
        let mut status = CacheStatus::Compiled;
        match std::fs::read(&path) {
            Ok(entry) => match verified_payload(&entry) {
                Some(payload) => match deserialize(engine, payload) {
                    Ok(component) => return Ok((component, CacheStatus::Hit)),
                    Err(reason) => {
                        tracing::warn!(plugin, path = %path.display(), %reason, "cached component rejected by wasmtime; recompiling");
                        status = CacheStatus::Replaced;
                    }
                },
                None => {
                    tracing::warn!(plugin, path = %path.display(), "cached component is truncated or corrupt; recompiling");
                    status = CacheStatus::Replaced;
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(plugin, path = %path.display(), error = %e, "cannot read cached component; recompiling");
                status = CacheStatus::Replaced;
            }
        }
        let component = compile()?;
        match component.serialize() {
            Ok(payload) => {
                if let Err(e) = self.store(&path, &payload) {
                    tracing::warn!(plugin, path = %path.display(), error = %e, "cannot write component cache entry");
                }
            }
            Err(e) => {
                tracing::warn!(plugin, error = %e, "cannot serialize compiled component");
            }
        }
        Ok((component, status))
    }

    fn store(&self, path: &Path, payload: &[u8]) -> std::io::Result<()> {
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        tmp.write_all(MAGIC)?;
        tmp.write_all(&Sha256::digest(payload))?;
        tmp.write_all(payload)?;
        tmp.as_file().sync_all()?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    }
}

/// Compiles `wasm` into a component of `engine`: on `engine` itself, or on
/// the `quick` engine and loaded into `engine`.
pub(crate) fn compile(
    engine: &Engine,
    quick: Option<&Engine>,
    plugin: &str,
    wasm: &[u8],
) -> Result<Component, SandboxError> {
    let failed = |reason: String| SandboxError::Compile {
        plugin: plugin.to_owned(),
        reason,
    };
    match quick {
        None => Component::new(engine, wasm).map_err(|e| failed(format!("{e:#}"))),
        Some(quick) => {
            let code = quick
                .precompile_component(wasm)
                .map_err(|e| failed(format!("{e:#}")))?;
            deserialize(engine, &code).map_err(failed)
        }
    }
}

/// The payload of a well-formed entry whose checksum matches, or `None`.
fn verified_payload(entry: &[u8]) -> Option<&[u8]> {
    if entry.len() <= HEADER_LEN || &entry[..MAGIC.len()] != MAGIC {
        return None;
    }
    let (header, payload) = entry.split_at(HEADER_LEN);
    let digest = Sha256::digest(payload);
    (header[MAGIC.len()..] == digest[..]).then_some(payload)
}

#[allow(unsafe_code)]
pub(crate) fn deserialize(engine: &Engine, payload: &[u8]) -> Result<Component, String> {
    // SAFETY: wasmtime requires that deserialized bytes were produced by
    // `Component::serialize` (or `Engine::precompile_component`) of a
    // compatible engine. A cache payload was written by
    // `ComponentCache::store` from `serialize`, its sha256 was checked just
    // now, and its file name carries the engine's compatibility hash (which
    // wasmtime checks again in the header); a quick compile's bytes come
    // straight from `precompile_component` of the quick engine, which
    // wasmtime checks against this one in the header the same way, and so
    // do a compiling child process's (`compile.rs`), made by the same
    // code from the same settings.
    unsafe { Component::deserialize(engine, payload) }.map_err(|e| format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_intact_entries_are_verified() {
        let payload = b"compiled code".to_vec();
        let mut entry = MAGIC.to_vec();
        entry.extend_from_slice(&Sha256::digest(&payload));
        entry.extend_from_slice(&payload);
        assert_eq!(verified_payload(&entry), Some(&payload[..]));

        let truncated = &entry[..entry.len() - 1];
        assert_eq!(verified_payload(truncated), None);

        let mut flipped = entry.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(verified_payload(&flipped), None);

        let mut wrong_magic = entry.clone();
        wrong_magic[0] = b'X';
        assert_eq!(verified_payload(&wrong_magic), None);

        assert_eq!(verified_payload(&entry[..HEADER_LEN]), None);
        assert_eq!(verified_payload(b""), None);
    }
}
