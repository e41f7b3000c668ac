//! What a component may import, and the linkers that provide exactly that.
//!
//! The allow-list is checked by name when a component is loaded, so a refused
//! component gets an error naming the import; the linkers themselves only hold
//! the allowed interfaces, so nothing else could be reached even if the check
//! were wrong. There are two: the base linker, and the network linker, which
//! adds `wasi:http/{types,outgoing-handler}` and is used only for components
//! that import them (see `net.rs`). `wasi:sockets` is in neither.

use wasmtime::Engine;
use wasmtime::component::{HasSelf, Linker};
use wasmtime_wasi::cli::{WasiCli, WasiCliView};
use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView};
use wasmtime_wasi::p2::bindings::{cli, clocks, filesystem, random};
use wasmtime_wasi::random::{WasiRandom, WasiRandomView};

use super::bindings;
use super::fs::WardenFilesystem;
use super::lease::LeaseState;

/// Interfaces of `warden:plugin` a component may import, at version 0.1.x.
const WARDEN_INTERFACES: &[&str] = &[
    "warden:plugin/host",
    "warden:plugin/types",
    "warden:plugin/secrets",
];

/// WASI 0.2 interfaces a component may import, at any 0.2.x version.
const WASI_INTERFACES: &[&str] = &[
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:clocks/monotonic-clock",
    "wasi:clocks/wall-clock",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
];

/// WASI 0.2 HTTP interfaces, in the network linker only.
const HTTP_INTERFACES: &[&str] = &["wasi:http/types", "wasi:http/outgoing-handler"];

/// Whether the sandbox offers the import named `name` (for example
/// `wasi:io/poll@0.2.6`).
pub(crate) fn is_allowed(name: &str) -> bool {
    let Some((interface, version)) = name.split_once('@') else {
        return false;
    };
    if WARDEN_INTERFACES.contains(&interface) {
        return version.starts_with("0.1.");
    }
    if WASI_INTERFACES.contains(&interface) || HTTP_INTERFACES.contains(&interface) {
        return version.starts_with("0.2.");
    }
    false
}

/// The names a component imports at its top level, read from its bytes
/// without compiling it, so a refused component costs a parse rather than a
/// compile. Nested modules and components are skipped: only the outer
/// component's imports reach the host. Compiling remains the authority on
/// whether the bytes are valid; this only reads names.
pub(crate) fn declared(wasm: &[u8]) -> Result<Vec<String>, String> {
    use wasmparser::{Chunk, Parser, Payload};
    let mut parser = Parser::new(0);
    let mut rest = wasm;
    let mut names = Vec::new();
    loop {
        let (payload, consumed) = match parser.parse(rest, true).map_err(|e| e.to_string())? {
            Chunk::Parsed { payload, consumed } => (payload, consumed),
            Chunk::NeedMoreData(_) => return Err("unexpected end of the component".into()),
        };
        rest = &rest[consumed..];
        let skip = match payload {
            Payload::ComponentImportSection(section) => {
                for import in section {
                    names.push(import.map_err(|e| e.to_string())?.name.name.to_owned());
                }
                0
            }
            Payload::ModuleSection {
                unchecked_range, ..
            }
            | Payload::ComponentSection {
                unchecked_range, ..
            } => unchecked_range.len(),
            Payload::CodeSectionStart { size, .. } => {
                parser.skip_section();
                size as usize
            }
            Payload::End(_) => return Ok(names),
            _ => 0,
        };
        rest = rest
            .get(skip..)
            .ok_or_else(|| "a section runs past the end of the component".to_owned())?;
    }
}

/// Whether the import named `name` needs the network linker.
pub(crate) fn is_http(name: &str) -> bool {
    name.split_once('@')
        .is_some_and(|(interface, _)| HTTP_INTERFACES.contains(&interface))
}

/// The base linker plus `wasi:http/{types,outgoing-handler}`.
pub(crate) fn network_linker(engine: &Engine) -> wasmtime::Result<Linker<LeaseState>> {
    let mut l = linker(engine)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut l)?;
    Ok(l)
}

/// A linker holding the allowed interfaces and nothing else.
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<LeaseState>> {
    let mut l: Linker<LeaseState> = Linker::new(engine);
    wasmtime_wasi_io::add_to_linker_async(&mut l)?;
    clocks::wall_clock::add_to_linker::<_, WasiClocks>(&mut l, |s| s.clocks())?;
    clocks::monotonic_clock::add_to_linker::<_, WasiClocks>(&mut l, |s| s.clocks())?;
    // The host's filesystem layer (`fs.rs`) in front of wasmtime-wasi's.
    filesystem::types::add_to_linker::<_, WardenFilesystem>(&mut l, |s| s.fs())?;
    filesystem::preopens::add_to_linker::<_, WardenFilesystem>(&mut l, |s| s.fs())?;
    random::random::add_to_linker::<_, WasiRandom>(&mut l, |s| s.random())?;
    random::insecure::add_to_linker::<_, WasiRandom>(&mut l, |s| s.random())?;
    random::insecure_seed::add_to_linker::<_, WasiRandom>(&mut l, |s| s.random())?;
    cli::exit::add_to_linker::<_, WasiCli>(&mut l, |s| s.cli())?;
    cli::environment::add_to_linker::<_, WasiCli>(&mut l, |s| s.cli())?;
    cli::stdin::add_to_linker::<_, WasiCli>(&mut l, |s| s.cli())?;
    cli::stdout::add_to_linker::<_, WasiCli>(&mut l, |s| s.cli())?;
    cli::stderr::add_to_linker::<_, WasiCli>(&mut l, |s| s.cli())?;
    cli::terminal_input::add_to_linker::<_, WasiCli>(&mut l, |s| s.cli())?;
    cli::terminal_output::add_to_linker::<_, WasiCli>(&mut l, |s| s.cli())?;
    cli::terminal_stdin::add_to_linker::<_, WasiCli>(&mut l, |s| s.cli())?;
    cli::terminal_stdout::add_to_linker::<_, WasiCli>(&mut l, |s| s.cli())?;
    cli::terminal_stderr::add_to_linker::<_, WasiCli>(&mut l, |s| s.cli())?;
    bindings::host::add_to_linker::<_, HasSelf<LeaseState>>(&mut l, |s| s)?;
    bindings::secrets::add_to_linker::<_, HasSelf<LeaseState>>(&mut l, |s| s)?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allow_list_is_exact() {
        for ok in [
            "warden:plugin/host@0.1.0",
            "warden:plugin/types@0.1.0",
            "warden:plugin/secrets@0.1.0",
            "wasi:io/poll@0.2.6",
            "wasi:cli/stdout@0.2.0",
            "wasi:filesystem/preopens@0.2.3",
            "wasi:http/outgoing-handler@0.2.12",
            "wasi:http/types@0.2.6",
        ] {
            assert!(is_allowed(ok), "{ok}");
        }
        assert!(is_http("wasi:http/types@0.2.12"));
        assert!(!is_http("wasi:io/poll@0.2.12"));
        for refused in [
            "wasi:sockets/tcp@0.2.6",
            "wasi:sockets/ip-name-lookup@0.2.6",
            "wasi:sockets/instance-network@0.2.6",
            "wasi:http/incoming-handler@0.2.6",
            "wasi:http/outgoing-handler@0.3.0",
            "wasi:io/poll@0.3.0",
            "wasi:io/poll",
            "warden:plugin/host@1.0.0",
            "evil:pkg/backdoor@1.0.0",
            "wasi:cli/environment-extra@0.2.6",
        ] {
            assert!(!is_allowed(refused), "{refused}");
        }
    }
}
