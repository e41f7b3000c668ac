//! Builds the test guests and writes `$OUT_DIR/guests.rs`, the `guests`
//! module of this crate (the wasmtime test-programs pattern).
//!
//! - Every directory `guests/<name>/` is the crate `warden-test-<name>`; they
//!   are built together for `wasm32-wasip2` by `warden-build-support`, in one
//!   cargo invocation.
//! - `wat/table_grow.wat` is a core module (Rust cannot emit `table.grow`):
//!   it is assembled with `wat`, given the `tool-plugin` world's type
//!   metadata and encoded into a component with `wit-component`.
//!
//! `guests.rs` holds one `pub const <NAME>: &str` per component (the absolute
//! path of its `.wasm`), the list `ALL`, and the macro `foreach_guest!`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The package name of the guest in `guests/<dir>/`.
const PACKAGE_PREFIX: &str = "warden-test-";

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());

    // A new or removed guest directory changes the list below.
    println!("cargo:rerun-if-changed=guests");
    let mut guests = build_rust_guests(&manifest_dir.join("guests"));
    guests.push((
        "table_grow".to_owned(),
        build_table_grow(&manifest_dir, &out_dir),
    ));
    guests.sort();

    let out = out_dir.join("guests.rs");
    std::fs::write(&out, generate(&guests))
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", out.display()));
}

/// Builds every crate under `guests_dir`; returns (name, path) per component.
fn build_rust_guests(guests_dir: &Path) -> Vec<(String, PathBuf)> {
    let mut dirs: Vec<String> = std::fs::read_dir(guests_dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", guests_dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.join("Cargo.toml").is_file())
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    let components = warden_build_support::GuestBuild::new()
        .packages(dirs.iter().map(|dir| format!("{PACKAGE_PREFIX}{dir}")))
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    components
        .into_iter()
        .map(|component| {
            let name = component
                .package
                .strip_prefix(PACKAGE_PREFIX)
                .unwrap_or(&component.package)
                .replace('-', "_");
            (name, component.path)
        })
        .collect()
}

/// Assembles `wat/table_grow.wat` into a `tool-plugin` component in `out_dir`.
fn build_table_grow(manifest_dir: &Path, out_dir: &Path) -> PathBuf {
    let wat_path = manifest_dir.join("wat/table_grow.wat");
    let wit_dir = manifest_dir
        .parent()
        .expect("tests/ has a parent")
        .join("wit");
    println!("cargo:rerun-if-changed={}", wat_path.display());
    println!("cargo:rerun-if-changed={}", wit_dir.display());

    let mut module = wat::parse_file(&wat_path)
        .unwrap_or_else(|e| panic!("cannot assemble {}: {e}", wat_path.display()));
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve
        .push_dir(&wit_dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e:?}", wit_dir.display()));
    let world = resolve
        .select_world(&[package], Some("tool-plugin"))
        .unwrap_or_else(|e| panic!("no world `tool-plugin` in {}: {e:?}", wit_dir.display()));
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .unwrap_or_else(|e| panic!("cannot embed the tool-plugin world: {e:?}"));
    let component = wit_component::ComponentEncoder::default()
        .validate(true)
        .module(&module)
        .and_then(|mut encoder| encoder.encode())
        .unwrap_or_else(|e| panic!("cannot make a component of {}: {e:?}", wat_path.display()));

    let path = out_dir.join("table_grow.wasm");
    std::fs::write(&path, component)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    path
}

/// The text of `guests.rs`.
fn generate(guests: &[(String, PathBuf)]) -> String {
    let mut code = String::new();
    for (name, path) in guests {
        let path = path.to_str().expect("guest paths are UTF-8");
        writeln!(
            code,
            "/// The `{name}` test guest component (see `tests/guests/` or `tests/wat/`).\n\
             pub const {}: &str = {path:?};",
            name.to_uppercase()
        )
        .unwrap();
    }
    code.push_str("\n/// Every test guest: (name, path of the component).\npub const ALL: &[(&str, &str)] = &[\n");
    for (name, _) in guests {
        writeln!(code, "    ({name:?}, {}),", name.to_uppercase()).unwrap();
    }
    code.push_str("];\n\n");
    code.push_str(
        "/// Calls `$mac!(name)` once per test guest, with its lowercase name.\n\
         ///\n\
         /// A host test module uses it to make a guest without a test fail to\n\
         /// compile: it defines one test function per guest name and expands\n\
         /// a macro that refers to each.\n\
         #[macro_export]\n\
         macro_rules! foreach_guest {\n    ($mac:ident) => {\n",
    );
    for (name, _) in guests {
        writeln!(code, "        $mac!({name});").unwrap();
    }
    code.push_str("    };\n}\n");
    code
}
