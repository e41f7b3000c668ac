//! The built-in fs plugin through the plugin host: grants narrow what it
//! gets, effect classes follow the grant, and its tools work inside the
//! mount only.

use std::path::Path;

use serde_json::json;
use warden::grant::{EffectClass, Grant, GrantError};
use warden::plugins::{PluginError, PluginHost, PluginSource};
use warden::sandbox::{Access, Outcome, wit};

use crate::sandbox;

fn grant(text: &str) -> Grant {
    toml::from_str(text).unwrap()
}

fn fs() -> PluginSource {
    "builtin:fs".parse().unwrap()
}

fn effects(plugin: &warden::plugins::LoadedPlugin) -> Vec<(String, EffectClass)> {
    plugin
        .tools()
        .iter()
        .map(|t| (t.name.clone(), t.effect))
        .collect()
}

#[tokio::test]
async fn effect_classes_follow_the_grant_not_the_plugins_claim() {
    let dir = tempfile::tempdir().unwrap();
    let host = PluginHost::new(sandbox().clone());
    let ro = grant(&format!(
        "[mounts.workspace]\ndir = {:?}\naccess = \"read-only\"\n",
        dir.path()
    ));
    let plugin = host.load(&fs(), &ro, Path::new(".")).await.unwrap();
    assert_eq!(
        plugin.granted().capabilities().mounts()[0].access,
        Access::ReadOnly
    );
    assert_eq!(plugin.tool("read_file").unwrap().effect, EffectClass::Read);
    assert_eq!(
        plugin.tool("write_file").unwrap().effect,
        EffectClass::Write
    );
    // A write on a read-only mount is withheld from the model.
    assert!(plugin.tool("write_file").unwrap().withheld.is_some());
    assert!(plugin.tool("read_file").unwrap().withheld.is_none());
    assert_eq!(
        plugin.not_granted(),
        ["mount `workspace`: read-write requested, read-only granted"]
    );

    // With a read-write mount every tool is a write unless the operator says
    // otherwise.
    let rw = grant(&format!("[mounts.workspace]\ndir = {:?}\n", dir.path()));
    let plugin = host.load(&fs(), &rw, Path::new(".")).await.unwrap();
    assert!(
        effects(&plugin)
            .iter()
            .all(|(_, e)| *e == EffectClass::Write),
        "{:?}",
        effects(&plugin)
    );
    let rw_with_override = grant(&format!(
        "[mounts.workspace]\ndir = {:?}\n[tools.read_file]\neffect = \"read\"\n",
        dir.path()
    ));
    let plugin = host
        .load(&fs(), &rw_with_override, Path::new("."))
        .await
        .unwrap();
    assert_eq!(plugin.tool("read_file").unwrap().effect, EffectClass::Read);
    assert_eq!(plugin.tool("list_dir").unwrap().effect, EffectClass::Write);
}

#[tokio::test]
async fn a_grant_for_a_mount_the_plugin_did_not_request_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let host = PluginHost::new(sandbox().clone());
    let bad = grant(&format!("[mounts.home]\ndir = {:?}\n", dir.path()));
    let err = host.load(&fs(), &bad, Path::new(".")).await.unwrap_err();
    assert!(
        matches!(&err, PluginError::Grant(GrantError::UnrequestedMount { mount, .. }) if mount == "home"),
        "{err}"
    );
    let missing = grant("[mounts.workspace]\ndir = \"/no/such/directory\"\n");
    let err = host
        .load(&fs(), &missing, Path::new("."))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("/no/such/directory"), "{err}");
}

#[tokio::test]
async fn the_fs_tools_work_inside_the_mount_and_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "one\ntwo\nthree\n").unwrap();
    let host = PluginHost::new(sandbox().clone());
    let rw = grant(&format!("[mounts.workspace]\ndir = {:?}\n", dir.path()));
    let plugin = host.load(&fs(), &rw, Path::new(".")).await.unwrap();
    let call = |tool: &str, args: serde_json::Value| wit::Call {
        id: "c".into(),
        run_id: "r".into(),
        tool: tool.into(),
        arguments: args.to_string(),
        idempotency_key: "k".into(),
    };

    let read = plugin
        .invoke(
            &call(
                "read_file",
                json!({ "path": "notes.txt", "offset": 2, "limit": 1 }),
            ),
            None,
        )
        .await
        .unwrap();
    let out: serde_json::Value =
        serde_json::from_str(&read.result.unwrap().unwrap().content).unwrap();
    assert_eq!(out["content"], "two\n");

    let preview = plugin
        .preflight(
            &call(
                "edit_file",
                json!({ "path": "notes.txt", "old": "two", "new": "2" }),
            ),
            None,
        )
        .await
        .unwrap();
    let preview = preview.result.unwrap().unwrap();
    assert!(
        preview.detail.contains("-two") && preview.detail.contains("+2"),
        "{}",
        preview.detail
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );

    let edit = plugin
        .invoke(
            &call(
                "edit_file",
                json!({ "path": "notes.txt", "old": "two", "new": "2" }),
            ),
            None,
        )
        .await
        .unwrap();
    assert_eq!(edit.receipt.outcome, Outcome::Ok, "{:?}", edit.result);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "one\n2\nthree\n"
    );

    let escape = plugin
        .invoke(
            &call("read_file", json!({ "path": "../../etc/passwd" })),
            None,
        )
        .await
        .unwrap();
    assert!(
        matches!(escape.result, Ok(Err(wit::ToolError::Denied(_)))),
        "{:?}",
        escape.result
    );

    let unknown = plugin
        .invoke(&call("format_disk", json!({})), None)
        .await
        .unwrap_err();
    assert!(
        matches!(unknown, PluginError::UnknownTool { .. }),
        "{unknown}"
    );
}

fn tool_call(tool: &str, args: serde_json::Value) -> wit::Call {
    wit::Call {
        id: "c".into(),
        run_id: "r".into(),
        tool: tool.into(),
        arguments: args.to_string(),
        idempotency_key: "k".into(),
    }
}

/// Every fs tool, and every preview, refuses a FIFO in the mount with a
/// typed `denied` naming it, at once (the plugin checks before it opens;
/// the host would refuse the open too), where reading or writing it would
/// block forever. A search over the mount passes it by.
#[tokio::test]
async fn the_fs_tools_refuse_a_fifo_with_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "needle\n").unwrap();
    let _fifo = crate::Fifo::new(dir.path().join("pipe"));
    let host = PluginHost::new(sandbox().clone());
    let rw = grant(&format!("[mounts.workspace]\ndir = {:?}\n", dir.path()));
    let plugin = host.load(&fs(), &rw, Path::new(".")).await.unwrap();
    let cases = [
        ("read_file", json!({ "path": "pipe" })),
        ("write_file", json!({ "path": "pipe", "content": "x" })),
        (
            "edit_file",
            json!({ "path": "pipe", "old": "a", "new": "b" }),
        ),
        ("search", json!({ "pattern": "needle", "path": "pipe" })),
    ];
    for (tool, args) in &cases {
        let leased = plugin
            .invoke(&tool_call(tool, args.clone()), None)
            .await
            .unwrap();
        match &leased.result {
            Ok(Err(wit::ToolError::Denied(message))) => {
                assert!(
                    message.contains("`pipe` is not a regular file"),
                    "{tool}: {message}"
                )
            }
            other => panic!("{tool}: {other:?}"),
        }
    }
    for (tool, args) in &cases[1..3] {
        let preview = plugin
            .preflight(&tool_call(tool, args.clone()), None)
            .await
            .unwrap();
        assert!(
            matches!(&preview.result, Ok(Err(wit::ToolError::Denied(_)))),
            "{tool}: {:?}",
            preview.result
        );
    }
    let search = plugin
        .invoke(&tool_call("search", json!({ "pattern": "needle" })), None)
        .await
        .unwrap();
    let out: serde_json::Value =
        serde_json::from_str(&search.result.unwrap().unwrap().content).unwrap();
    assert_eq!(out["matches"][0]["path"], "notes.txt", "{out}");
    let read = plugin
        .invoke(
            &tool_call("read_file", json!({ "path": "notes.txt" })),
            None,
        )
        .await
        .unwrap();
    assert_eq!(read.receipt.outcome, Outcome::Ok, "{:?}", read.result);
}

/// A file that never ends for a reader (a sparse terabyte of zeros, the
/// regular-file cousin of `/dev/zero`) is bounded by the lease's limits:
/// `read_file` on it is stopped at its deadline (or fuel), and the plugin
/// serves the next call.
#[tokio::test]
async fn an_endless_file_is_bounded_by_the_lease_limits() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "one\n").unwrap();
    std::fs::File::create(dir.path().join("zeros"))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let host = PluginHost::new(sandbox().clone());
    let ro = grant(&format!(
        "[mounts.workspace]\ndir = {:?}\naccess = \"read-only\"\n[limits]\ntimeout = \"1s\"\n",
        dir.path()
    ));
    let plugin = host.load(&fs(), &ro, Path::new(".")).await.unwrap();
    let leased = plugin
        .invoke(&tool_call("read_file", json!({ "path": "zeros" })), None)
        .await
        .unwrap();
    assert!(
        matches!(
            leased.receipt.outcome,
            Outcome::Timeout | Outcome::OutOfFuel
        ),
        "{:?}: {:?}",
        leased.receipt.outcome,
        leased.result
    );
    let read = plugin
        .invoke(
            &tool_call("read_file", json!({ "path": "notes.txt" })),
            None,
        )
        .await
        .unwrap();
    assert_eq!(read.receipt.outcome, Outcome::Ok, "{:?}", read.result);
}

/// Paths the operator excludes on the grant (`exclude = [".env", "*.pem",
/// "secrets/**"]`) are gone for every fs tool: not readable, not listed,
/// not found by a search, not writable; the rest of the mount works.
#[tokio::test]
async fn grant_exclusions_hide_paths_from_every_fs_tool() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join(".env"), "API_KEY=sk-live-0123456789\n").unwrap();
    std::fs::create_dir_all(root.join("secrets")).unwrap();
    std::fs::write(root.join("secrets/key"), "PRIVATE KEY MATERIAL\n").unwrap();
    std::fs::create_dir_all(root.join("certs")).unwrap();
    std::fs::write(root.join("certs/server.pem"), "PRIVATE KEY PEM\n").unwrap();
    std::fs::write(root.join("certs/README"), "certs go here\n").unwrap();
    std::fs::write(
        root.join("main.rs"),
        "// reads API_KEY from the environment\n",
    )
    .unwrap();
    let host = PluginHost::new(sandbox().clone());
    let rw = grant(&format!(
        "[mounts.workspace]\ndir = {:?}\nexclude = [\".env\", \"*.pem\", \"secrets/**\"]\n",
        root
    ));
    let plugin = host.load(&fs(), &rw, Path::new(".")).await.unwrap();
    assert_eq!(
        plugin.granted().capabilities().mounts()[0]
            .exclude
            .patterns()
            .collect::<Vec<_>>(),
        [".env", "*.pem", "secrets/**"]
    );
    let run = async |tool: &str, args: serde_json::Value| {
        plugin
            .invoke(&tool_call(tool, args), None)
            .await
            .unwrap()
            .result
            .unwrap()
    };
    for (tool, args) in [
        ("read_file", json!({ "path": ".env" })),
        ("read_file", json!({ "path": "secrets/key" })),
        ("read_file", json!({ "path": "certs/server.pem" })),
        ("list_dir", json!({ "path": "secrets" })),
        ("search", json!({ "pattern": "KEY", "path": ".env" })),
        (
            "write_file",
            json!({ "path": ".env", "content": "API_KEY=changed\n" }),
        ),
        (
            "write_file",
            json!({ "path": "secrets/new", "content": "x", "create_dirs": true }),
        ),
        (
            "edit_file",
            json!({ "path": "secrets/key", "old": "PRIVATE", "new": "PUBLIC" }),
        ),
    ] {
        match run(tool, args.clone()).await {
            Err(wit::ToolError::Denied(message)) => {
                assert!(
                    message.contains("permission denied"),
                    "{tool} {args}: {message}"
                )
            }
            other => panic!("{tool} {args}: {other:?}"),
        }
    }
    let names = |out: &wit::ToolOutput| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(&out.content).unwrap();
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let listed = run("list_dir", json!({})).await.unwrap();
    assert_eq!(names(&listed), ["certs", "main.rs"]);
    let listed = run("list_dir", json!({ "path": "certs" })).await.unwrap();
    assert_eq!(names(&listed), ["README"]);
    let found = run("search", json!({ "pattern": "KEY" })).await.unwrap();
    let found: serde_json::Value = serde_json::from_str(&found.content).unwrap();
    let paths: Vec<&str> = found["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["main.rs"], "{found}");
    assert_eq!(
        std::fs::read_to_string(root.join(".env")).unwrap(),
        "API_KEY=sk-live-0123456789\n"
    );
    assert!(!root.join("secrets/new").exists());
    let read = run("read_file", json!({ "path": "certs/README" }))
        .await
        .unwrap();
    assert!(read.content.contains("certs go here"));
}
