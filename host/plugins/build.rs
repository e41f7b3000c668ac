//! Builds the first-party plugins under `plugins/` for `wasm32-wasip2` and
//! generates `builtin_plugins.rs`, which embeds each component with its
//! `plugin.toml` and sha256 (see `src/builtin.rs`). Without the `builtin`
//! feature it builds nothing and no plugin is built in.
//!
//! Each directory `plugins/<name>/` holds the crate `warden-plugin-<name>` and
//! its `plugin.toml`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    // host/plugins/ → the repository root.
    let root = manifest_dir.parent().unwrap().parent().unwrap();
    let plugins_dir = root.join("plugins");
    println!("cargo:rerun-if-changed={}", plugins_dir.display());
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    if std::env::var_os("CARGO_FEATURE_BUILTIN").is_none() {
        let none = "/// Every plugin built into this binary: none (no `builtin` feature).\nstatic BUILTINS: &[Builtin] = &[];\n";
        std::fs::write(out_dir.join("builtin_plugins.rs"), none).unwrap();
        return;
    }

    let mut plugins: Vec<(String, PathBuf)> = std::fs::read_dir(&plugins_dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", plugins_dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file() && p.join("plugin.toml").is_file())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    plugins.sort();

    let packages: Vec<String> = plugins
        .iter()
        .map(|(name, _)| format!("warden-plugin-{name}"))
        .collect();
    let components = warden_build_support::GuestBuild::new()
        .manifest_path(root.join("Cargo.toml"))
        .packages(packages.iter().cloned())
        .build()
        .unwrap_or_else(|e| panic!("cannot build the built-in plugins: {e}"));

    let mut out = String::from(
        "/// Every plugin built into this binary.\nstatic BUILTINS: &[Builtin] = &[\n",
    );
    for ((name, dir), package) in plugins.iter().zip(&packages) {
        let component = components
            .iter()
            .find(|c| &c.package == package)
            .unwrap_or_else(|| panic!("{package} produced no component"));
        let wasm = std::fs::read(&component.path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", component.path.display()));
        let sha256 = hex(&Sha256::digest(&wasm));
        let manifest = dir.join("plugin.toml");
        println!("cargo:rerun-if-changed={}", manifest.display());
        writeln!(
            out,
            "    Builtin {{ name: {name:?}, manifest_text: include_str!({}), wasm: include_bytes!({}), sha256: {sha256:?} }},",
            quoted(&manifest),
            quoted(&component.path),
        )
        .unwrap();
    }
    out.push_str("];\n");
    std::fs::write(out_dir.join("builtin_plugins.rs"), out).unwrap();
}

fn quoted(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
