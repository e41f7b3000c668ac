//! The fs plugin's component in the real sandbox, through `warden::testkit`:
//! what a plugin author's own tests look like. The unit tests in `src/`
//! cover the logic natively; these prove the built component behaves the
//! same under grants and limits.

use std::time::Duration;

use serde_json::json;
use warden::policy::EffectClass;
use warden::sandbox::{LeaseFailure, Outcome};
use warden::testkit::TestPlugin;

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.md"), "# Notes\nalpha\nbeta\n").unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/lib.rs"), "fn alpha() {}\n").unwrap();
    dir
}

async fn load(dir: &std::path::Path, read_only: bool) -> TestPlugin {
    let builder = TestPlugin::build(env!("CARGO_MANIFEST_DIR"));
    let builder = if read_only {
        builder.mount_read_only("workspace", dir)
    } else {
        builder.mount("workspace", dir)
    };
    builder.load().await.unwrap()
}

#[tokio::test]
async fn reads_lists_and_searches_under_a_read_only_mount() {
    let dir = workspace();
    let fs = load(dir.path(), true).await;
    assert_eq!(
        fs.plugin().tool("read_file").unwrap().effect,
        EffectClass::Read
    );

    let read = fs
        .call("read_file", json!({ "path": "notes.md", "offset": 2 }))
        .await;
    assert_eq!(read.output()["content"], "alpha\nbeta\n");
    assert!(read.receipt.fuel_consumed > 0);
    read.assert_outcome(Outcome::Ok);

    let list = fs.call("list_dir", json!({})).await.output();
    let names: Vec<&str> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["notes.md", "src"]);

    let found = fs
        .call("search", json!({ "pattern": "alpha" }))
        .await
        .output();
    let paths: Vec<&str> = found["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["notes.md", "src/lib.rs"]);
}

#[tokio::test]
async fn writes_are_refused_by_a_read_only_mount_and_escapes_are_denied() {
    let dir = workspace();
    let fs = load(dir.path(), true).await;
    let write = fs
        .call("write_file", json!({ "path": "new.txt", "content": "x" }))
        .await;
    assert!(write.denied().contains("new.txt"), "{}", write.denied());
    assert!(!dir.path().join("new.txt").exists());

    let escape = fs
        .call("read_file", json!({ "path": "../etc/passwd" }))
        .await;
    assert!(escape.denied().contains("../etc/passwd"));
    let absolute = fs.call("read_file", json!({ "path": "/etc/passwd" })).await;
    absolute.denied();

    let bad = fs.call("read_file", json!({ "path": 7 })).await;
    assert!(
        bad.invalid_arguments().contains("path"),
        "{}",
        bad.invalid_arguments()
    );
}

#[tokio::test]
async fn edits_preview_first_and_then_apply() {
    let dir = workspace();
    let fs = load(dir.path(), false).await;
    assert_eq!(
        fs.plugin().tool("edit_file").unwrap().effect,
        EffectClass::Write
    );

    let args = json!({ "path": "notes.md", "old": "beta", "new": "gamma" });
    let preview = fs.preflight("edit_file", args.clone()).await;
    assert!(
        preview.ok().detail.contains("+gamma"),
        "{}",
        preview.ok().detail
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.md")).unwrap(),
        "# Notes\nalpha\nbeta\n"
    );
    fs.call("edit_file", args).await.ok();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.md")).unwrap(),
        "# Notes\nalpha\ngamma\n"
    );
    let missing = fs
        .call(
            "edit_file",
            json!({ "path": "notes.md", "old": "delta", "new": "x" }),
        )
        .await;
    assert!(matches!(
        missing.tool_error(),
        warden::sandbox::wit::ToolError::Failed(_)
            | warden::sandbox::wit::ToolError::InvalidArguments(_)
    ));
}

#[tokio::test]
async fn limits_are_enforced_on_the_real_component() {
    let dir = workspace();
    let starved = TestPlugin::build(env!("CARGO_MANIFEST_DIR"))
        .mount_read_only("workspace", dir.path())
        .fuel(Some(10_000))
        .timeout(Duration::from_secs(5))
        .load()
        .await
        .unwrap();
    let call = starved.call("search", json!({ "pattern": "alpha" })).await;
    assert_eq!(
        call.lease_failure(),
        &LeaseFailure::OutOfFuel { limit: 10_000 }
    );
    call.assert_outcome(Outcome::OutOfFuel);
}
