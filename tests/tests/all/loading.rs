//! Loading a component: the import allow-list, the integrity pin, and the
//! compiled-component cache, which recompiles rather than trusts a damaged
//! entry.

use serde_json::json;
use sha2::Digest;
use warden::sandbox::{
    CacheStatus, Capabilities, PluginKind, Sandbox, SandboxConfig, SandboxError,
};
use warden_tests::guests;

use crate::{assert_serves_normal_call, invoke, load, output, sandbox, test_limits};

fn load_err(path: &str) -> SandboxError {
    let wasm = std::fs::read(path).unwrap();
    sandbox().load("guest", &wasm, None).unwrap_err()
}

#[test]
fn network_access_without_a_grant_is_refused_at_load() {
    match load_err(guests::SOCKETS) {
        SandboxError::DisallowedImport { plugin, import } => {
            assert_eq!(plugin, "guest");
            assert!(import.starts_with("wasi:sockets/"), "{import}");
        }
        other => panic!("expected a disallowed import, got {other}"),
    }
}

#[test]
fn an_unknown_interface_is_refused_naming_it() {
    let err = load_err(guests::BACKDOOR);
    assert!(
        matches!(&err, SandboxError::DisallowedImport { import, .. } if import == "evil:pkg/backdoor"),
        "{err}"
    );
    assert!(err.to_string().contains("`evil:pkg/backdoor`"), "{err}");
}

#[tokio::test]
async fn a_minimal_component_needs_no_wasi() {
    let noop = load(guests::NOOP);
    assert!(
        noop.imports()
            .iter()
            .all(|i| i.starts_with("warden:plugin/")),
        "{:?}",
        noop.imports()
    );
    assert_eq!(noop.kinds(), [PluginKind::Tool]);
    let g = sandbox().grant(&noop, Capabilities::none(), test_limits());
    let leased = invoke(&g, "noop", json!({})).await;
    assert_eq!(output(&leased), json!({}));
}

#[test]
fn a_component_whose_sha256_does_not_match_the_pin_is_refused() {
    let wasm = std::fs::read(guests::NOOP).unwrap();
    let actual = hex::encode(sha2::Sha256::digest(&wasm));
    let pinned = "00".repeat(32);
    match sandbox().load("noop", &wasm, Some(&pinned)).unwrap_err() {
        SandboxError::IntegrityMismatch {
            plugin,
            expected,
            actual: found,
        } => {
            assert_eq!(plugin, "noop");
            assert_eq!(expected, pinned);
            assert_eq!(found, actual);
        }
        other => panic!("expected an integrity mismatch, got {other}"),
    }
    // The right pin, in any case, loads.
    sandbox()
        .load("noop", &wasm, Some(&actual.to_uppercase()))
        .unwrap();
}

#[test]
fn bytes_that_are_not_a_component_are_a_compile_error() {
    for bytes in [&b"not wasm at all"[..], b"\0asm\x01\0\0\0"] {
        let err = sandbox().load("junk", bytes, None).unwrap_err();
        assert!(matches!(err, SandboxError::Compile { .. }), "{err}");
    }
}

#[tokio::test]
async fn a_corrupt_or_truncated_cache_entry_is_recompiled_not_trusted() {
    let cache = tempfile::tempdir().unwrap();
    let sb = Sandbox::new(SandboxConfig {
        cache_dir: Some(cache.path().to_owned()),
        ..SandboxConfig::default()
    })
    .unwrap();
    let wasm = std::fs::read(guests::HOSTILE).unwrap();
    assert_eq!(
        sb.load("hostile", &wasm, None).unwrap().cache_status(),
        CacheStatus::Compiled
    );
    assert_eq!(
        sb.load("hostile", &wasm, None).unwrap().cache_status(),
        CacheStatus::Hit
    );
    let entry = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .expect("a cache entry");
    let intact = std::fs::read(&entry).unwrap();

    let damaged: Vec<Vec<u8>> = vec![
        intact[..intact.len() / 2].to_vec(),
        {
            let mut flipped = intact.clone();
            let mid = flipped.len() / 2;
            flipped[mid] ^= 0xff;
            flipped
        },
        Vec::new(),
        b"garbage".to_vec(),
    ];
    for bytes in damaged {
        std::fs::write(&entry, &bytes).unwrap();
        let component = sb.load("hostile", &wasm, None).unwrap();
        assert_eq!(component.cache_status(), CacheStatus::Replaced);
        let g = sb.grant(&component, Capabilities::none(), test_limits());
        assert_serves_normal_call(&g).await;
        // The entry was rewritten and is trusted again.
        assert_eq!(
            sb.load("hostile", &wasm, None).unwrap().cache_status(),
            CacheStatus::Hit
        );
    }
}

/// A component file is checked before it is read: a device, a FIFO, a
/// directory or a file over the size cap is a typed refusal, never a hang
/// (a FIFO with no writer) or a read that grows without end (`/dev/zero`).
#[tokio::test]
async fn a_component_that_is_not_a_regular_file_is_refused_without_reading_it() {
    use warden::plugins::{ComponentFileError, MAX_COMPONENT_BYTES, PluginError, PluginHost};
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("component.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let sparse = dir.path().join("huge.wasm");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(MAX_COMPONENT_BYTES + 1)
        .unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.wasm")).unwrap();
    let host = PluginHost::new(sandbox().clone());
    let grant = warden::policy::Grant::default();
    let cases: [(&str, &str); 5] = [
        ("/dev/zero", "character device"),
        ("zero.wasm", "character device"),
        ("component.fifo", "FIFO"),
        (".", "directory"),
        ("huge.wasm", "larger than"),
    ];
    for (component, expected) in cases {
        std::fs::write(
            dir.path().join("plugin.toml"),
            format!(
                "name = \"p\"\nversion = \"1\"\nkind = \"tool\"\ncomponent = {component:?}\nsha256 = \"{}\"\n",
                "0".repeat(64)
            ),
        )
        .unwrap();
        let source = warden::plugins::PluginSource::Manifest(dir.path().join("plugin.toml"));
        // A hang would be the bug itself: bound the wait so it fails, not stalls.
        let loaded = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            host.load(&source, &grant, dir.path()),
        )
        .await
        .unwrap_or_else(|_| panic!("loading `{component}` hung"));
        match loaded {
            Err(PluginError::ComponentFile { problem, .. }) => {
                let text = problem.to_string();
                assert!(text.contains(expected), "{component}: {text}");
                assert!(
                    matches!(
                        problem,
                        ComponentFileError::NotARegularFile { .. }
                            | ComponentFileError::TooLarge { .. }
                    ),
                    "{component}: {problem:?}"
                );
            }
            other => panic!("{component}: {other:?}"),
        }
    }
    // A regular component still loads, and serves a call.
    let wasm = std::fs::read(guests::HOSTILE).unwrap();
    std::fs::write(
        dir.path().join("plugin.toml"),
        format!(
            "name = \"p\"\nversion = \"1\"\nkind = \"tool\"\ncomponent = {:?}\nsha256 = \"{}\"\n",
            guests::HOSTILE,
            hex::encode(sha2::Sha256::digest(&wasm))
        ),
    )
    .unwrap();
    let source = warden::plugins::PluginSource::Manifest(dir.path().join("plugin.toml"));
    let plugin = host.load(&source, &grant, dir.path()).await.unwrap();
    assert_serves_normal_call(plugin.granted()).await;
}
