//! Loading a component: the import allow-list, the integrity pin, the
//! compiled-component cache, which recompiles rather than trusts a damaged
//! entry, and quick compiles, whose code keeps every limit and is cached
//! apart from optimised code.

use serde_json::json;
use sha2::Digest;
use warden::sandbox::{
    CacheStatus, Capabilities, PluginKind, Sandbox, SandboxConfig, SandboxError,
};
use warden_tests::guests;

use warden::sandbox::{Limits, Outcome};

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

// A refused component must cost its parse, not a compile: an 18 MB Python
// component takes minutes to compile on a loaded machine, and whatever is
// compiled lands in the cache.
#[test]
fn a_component_with_a_refused_import_is_refused_before_it_is_compiled() {
    let cache = tempfile::tempdir().unwrap();
    let sb = Sandbox::new(SandboxConfig {
        cache_dir: Some(cache.path().to_owned()),
        ..SandboxConfig::default()
    })
    .unwrap();
    for path in [guests::SOCKETS, guests::BACKDOOR] {
        let wasm = std::fs::read(path).unwrap();
        let err = sb.load("guest", &wasm, None).unwrap_err();
        assert!(
            matches!(err, SandboxError::DisallowedImport { .. }),
            "{path}: {err}"
        );
    }
    let entries: Vec<_> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        entries.is_empty(),
        "refused components were compiled into the cache: {entries:?}"
    );
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

/// A component compiled quickly (`quick_compile_bytes`, here for every
/// size) runs in the sandbox's own engine with the same fuel accounting and
/// the same limits as optimised code; its cache entry is its own, so a host
/// compiling optimised code never loads it, and a quick load takes an
/// optimised entry when there is one.
#[tokio::test]
async fn quickly_compiled_code_keeps_every_limit_and_is_cached_apart() {
    let cache = tempfile::tempdir().unwrap();
    let with = |quick: Option<u64>| {
        Sandbox::new(SandboxConfig {
            cache_dir: Some(cache.path().to_owned()),
            quick_compile_bytes: quick,
            ..SandboxConfig::default()
        })
        .unwrap()
    };
    let quick = with(Some(0));
    let wasm = std::fs::read(guests::HOSTILE).unwrap();
    let component = quick.load("hostile", &wasm, None).unwrap();
    assert_eq!(component.cache_status(), CacheStatus::Compiled);
    let entries = || {
        let mut names: Vec<String> = std::fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".cwasm"))
            .collect();
        names.sort();
        names
    };
    assert!(
        matches!(&entries()[..], [one] if one.ends_with("-quick.cwasm")),
        "{:?}",
        entries()
    );
    let granted = quick.grant(&component, Capabilities::none(), test_limits());
    let quick_echo = invoke(&granted, "echo", json!({ "text": "hi" })).await;
    assert_eq!(quick_echo.receipt.outcome, Outcome::Ok);

    // Every limit stops quick code as it stops optimised code.
    let spin = invoke(&granted, "spin", json!({})).await;
    assert_eq!(
        spin.receipt.outcome,
        Outcome::OutOfFuel,
        "{:?}",
        spin.result
    );
    let timed = quick.grant(
        &component,
        Capabilities::none(),
        Limits {
            fuel: None,
            timeout: std::time::Duration::from_millis(200),
            ..Limits::default()
        },
    );
    let spin = invoke(&timed, "spin", json!({})).await;
    assert_eq!(spin.receipt.outcome, Outcome::Timeout, "{:?}", spin.result);
    let small = quick.grant(
        &component,
        Capabilities::none(),
        Limits {
            memory_bytes: 8 << 20,
            ..test_limits()
        },
    );
    let grown = invoke(&small, "grow_memory", json!({ "abort": true })).await;
    assert_eq!(
        grown.receipt.outcome,
        Outcome::MemoryLimit,
        "{:?}",
        grown.result
    );
    assert_serves_normal_call(&granted).await;
    assert_eq!(
        quick.load("hostile", &wasm, None).unwrap().cache_status(),
        CacheStatus::Hit
    );

    // An optimising host compiles its own code, whatever quick code is
    // cached; the same call costs the same fuel in both.
    let optimised = with(None);
    let component = optimised.load("hostile", &wasm, None).unwrap();
    assert_eq!(component.cache_status(), CacheStatus::Compiled);
    assert_eq!(entries().len(), 2, "{:?}", entries());
    let granted = optimised.grant(&component, Capabilities::none(), test_limits());
    let echo = invoke(&granted, "echo", json!({ "text": "hi" })).await;
    assert_eq!(output(&echo), output(&quick_echo));
    assert_eq!(
        echo.receipt.fuel_consumed, quick_echo.receipt.fuel_consumed,
        "fuel counts WebAssembly, not the machine code it became"
    );
    // A quick load now takes the optimised entry.
    assert_eq!(
        with(Some(0))
            .load("hostile", &wasm, None)
            .unwrap()
            .cache_status(),
        CacheStatus::Hit
    );
}

/// A component file is checked before it is read: a device, a FIFO, a
/// directory or a file over the size cap is a typed refusal, never a hang
/// (a FIFO with no writer) or a read that grows without end (`/dev/zero`).
/// A device is outside the plugin's directory, so it is reached only
/// through a grant naming it, and refused there too.
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
    let granted = |component: &str| warden::grant::Grant {
        component: Some(component.into()),
        ..Default::default()
    };
    let cases: [(&str, Option<&str>, &str); 5] = [
        ("/dev/zero", Some("/dev/zero"), "character device"),
        ("zero.wasm", Some("zero.wasm"), "character device"),
        ("component.fifo", None, "FIFO"),
        (".", None, "directory"),
        ("huge.wasm", None, "larger than"),
    ];
    for (component, grant, expected) in cases {
        std::fs::write(
            dir.path().join("plugin.toml"),
            format!(
                "name = \"p\"\nversion = \"1\"\nkind = \"tool\"\ncomponent = {component:?}\nsha256 = \"{}\"\n",
                "0".repeat(64)
            ),
        )
        .unwrap();
        let source = warden::plugins::PluginSource::Manifest(dir.path().join("plugin.toml"));
        let grant = grant.map(granted).unwrap_or_default();
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
    let source = crate::plugin_manifest(dir.path(), "p", "tool", guests::HOSTILE, "");
    let plugin = host
        .load(&source, &Default::default(), dir.path())
        .await
        .unwrap();
    assert_serves_normal_call(plugin.granted()).await;
}

/// A manifest's component must be inside the plugin's directory after
/// symlinks: an absolute path elsewhere, a `..` out, a symlink to a file
/// outside and a symlinked directory leading out are refused with the path
/// and how to allow it, though the pin matches and the file would load; a
/// `..` or symlink that stays inside is followed. The operator's grant can
/// name one file elsewhere, and then only that file loads.
#[tokio::test]
async fn a_component_outside_the_plugin_directory_loads_only_when_the_grant_names_it() {
    use std::os::unix::fs::symlink;
    use warden::grant::{Grant, GrantError};
    use warden::plugins::{ComponentFileError, PluginError, PluginHost, PluginSource};
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let plugin_dir = root.join("plugin");
    let elsewhere = root.join("elsewhere");
    std::fs::create_dir_all(plugin_dir.join("lib")).unwrap();
    std::fs::create_dir(&elsewhere).unwrap();
    let wasm = std::fs::read(guests::HOSTILE).unwrap();
    let sha = hex::encode(sha2::Sha256::digest(&wasm));
    std::fs::write(elsewhere.join("hostile.wasm"), &wasm).unwrap();
    std::fs::write(elsewhere.join("other.wasm"), &wasm).unwrap();
    std::fs::write(plugin_dir.join("lib/hostile.wasm"), &wasm).unwrap();
    symlink("../elsewhere/hostile.wasm", plugin_dir.join("out.wasm")).unwrap();
    symlink("../elsewhere", plugin_dir.join("out")).unwrap();
    symlink("lib/hostile.wasm", plugin_dir.join("in.wasm")).unwrap();
    symlink("lib", plugin_dir.join("in")).unwrap();
    let host = PluginHost::new(sandbox().clone());
    let source = PluginSource::Manifest(plugin_dir.join("plugin.toml"));
    let load = |component: String, grant: Grant| {
        std::fs::write(
            plugin_dir.join("plugin.toml"),
            format!(
                "name = \"p\"\nversion = \"1\"\nkind = \"tool\"\ncomponent = {component:?}\nsha256 = \"{sha}\"\n"
            ),
        )
        .unwrap();
        let (host, source) = (host.clone(), source.clone());
        async move { host.load(&source, &grant, root).await }
    };
    let outside = elsewhere.join("hostile.wasm").display().to_string();
    for component in [
        outside.clone(),
        "../elsewhere/hostile.wasm".into(),
        "lib/../../elsewhere/hostile.wasm".into(),
        "out.wasm".into(),
        "out/hostile.wasm".into(),
        guests::HOSTILE.into(),
    ] {
        match load(component.clone(), Grant::default()).await {
            Err(error @ PluginError::ComponentFile { .. }) => {
                let text = error.to_string();
                let PluginError::ComponentFile { path, problem, .. } = &error else {
                    unreachable!()
                };
                assert!(
                    matches!(problem, ComponentFileError::OutsidePluginDir { .. }),
                    "{component}: {problem:?}"
                );
                assert_eq!(*path, plugin_dir.join(&component), "{component}");
                assert!(text.contains(&component), "{component}: {text}");
                assert!(
                    text.contains("outside the plugin's directory")
                        && text.contains("in the plugin's grant as `component = "),
                    "{component}: {text}"
                );
            }
            other => panic!("{component}: {other:?}"),
        }
    }
    // Inside, through `..` and symlinks that stay inside, and absolute.
    for component in [
        "lib/hostile.wasm".to_owned(),
        "lib/../in.wasm".into(),
        "in.wasm".into(),
        "in/hostile.wasm".into(),
        plugin_dir.join("lib/hostile.wasm").display().to_string(),
    ] {
        let plugin = load(component.clone(), Grant::default())
            .await
            .unwrap_or_else(|e| panic!("{component}: {e}"));
        assert_serves_normal_call(plugin.granted()).await;
    }
    // The grant names the file elsewhere (relative to the grant's file, or
    // absolute): the manifest may name it, however it gets there.
    let granting = |component: &str| Grant {
        component: Some(component.into()),
        ..Grant::default()
    };
    for (component, granted) in [
        ("../elsewhere/hostile.wasm", "elsewhere/hostile.wasm"),
        ("out.wasm", outside.as_str()),
        (outside.as_str(), "plugin/out/hostile.wasm"),
    ] {
        let plugin = load(component.into(), granting(granted))
            .await
            .unwrap_or_else(|e| panic!("{component} granted as {granted}: {e}"));
        assert_serves_normal_call(plugin.granted()).await;
    }
    // ... and then it is the only file: not another one elsewhere, not one
    // inside the plugin's directory, not a granted file that is missing.
    for (component, granted) in [
        ("../elsewhere/other.wasm", "elsewhere/hostile.wasm"),
        ("lib/hostile.wasm", "elsewhere/hostile.wasm"),
        ("../elsewhere/hostile.wasm", "elsewhere/missing.wasm"),
    ] {
        match load(component.into(), granting(granted)).await {
            Err(PluginError::ComponentFile {
                problem: ComponentFileError::NotGranted { granted: named },
                ..
            }) => assert_eq!(named, root.join(granted)),
            other => panic!("{component} granted as {granted}: {other:?}"),
        }
    }
    // A built-in plugin's component is in the binary: granting one is an error.
    match host
        .load(
            &PluginSource::Builtin("fs".into()),
            &granting("elsewhere/hostile.wasm"),
            root,
        )
        .await
    {
        Err(PluginError::Grant(GrantError::Invalid { key, .. })) => assert_eq!(key, "component"),
        other => panic!("{other:?}"),
    }
}
