//! The built-in fs plugin through the plugin host: grants narrow what it
//! gets, effect classes follow the grant, and its tools work inside the
//! mount only.

use std::path::Path;

use serde_json::json;
use warden::plugins::{PluginError, PluginHost, PluginSource};
use warden::policy::{EffectClass, Grant, PolicyError};
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
        matches!(&err, PluginError::Policy(PolicyError::UnrequestedMount { mount, .. }) if mount == "home"),
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
