//! The fs plugin's component in the real sandbox, through `warden::testkit`:
//! what a plugin author's own tests look like. The unit tests in `src/`
//! cover the logic natively; these prove the built component behaves the
//! same under grants and limits.

use std::time::Duration;

use serde_json::json;
use warden::grant::EffectClass;
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

#[cfg(unix)]
#[tokio::test]
async fn writes_keep_permissions_through_the_host() {
    use std::os::unix::fs::PermissionsExt;
    let dir = workspace();
    let notes = dir.path().join("notes.md");
    std::fs::set_permissions(&notes, std::fs::Permissions::from_mode(0o751)).unwrap();
    let fs = load(dir.path(), false).await;
    fs.call(
        "edit_file",
        json!({ "path": "notes.md", "old": "beta", "new": "gamma" }),
    )
    .await
    .ok();
    fs.call(
        "write_file",
        json!({ "path": "src/new.rs", "content": "fn beta() {}\n" }),
    )
    .await
    .ok();
    let mode = std::fs::metadata(&notes).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o751);
    assert_eq!(
        std::fs::read_to_string(&notes).unwrap(),
        "# Notes\nalpha\ngamma\n"
    );
    // Only the files the tools wrote: no temporary file is left.
    let mut names: Vec<String> = std::fs::read_dir(dir.path().join("src"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["lib.rs", "new.rs"]);
}

/// A write whose lease runs out of time part way holds the old content or
/// the new, never a mix: the deadline grows from 1 ms until one edit
/// completes, and after every try the file is checked whole. (With a plain
/// truncate-and-write, deadlines that land in the write left the file cut
/// short.)
#[tokio::test]
async fn a_write_cut_short_by_its_deadline_leaves_the_old_content_or_the_new() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.txt");
    let mut old = String::new();
    for i in 0..200_000 {
        old.push_str(&format!("line {i:06} of the file that is edited\n"));
    }
    old.push_str("MARKER\n");
    let new = old.replace("MARKER", "EDITED");
    std::fs::write(&file, &old).unwrap();
    let args = json!({ "path": "big.txt", "old": "MARKER", "new": "EDITED" });
    let (mut cut, mut timeout_ms) = (0, 1);
    loop {
        let fs = TestPlugin::build(env!("CARGO_MANIFEST_DIR"))
            .mount("workspace", dir.path())
            .timeout(Duration::from_millis(timeout_ms))
            .load()
            .await
            .unwrap();
        let call = fs.call("edit_file", args.clone()).await;
        let now = std::fs::read_to_string(&file).unwrap();
        assert!(
            now == old || now == new,
            "with a {timeout_ms} ms deadline the file holds {} bytes of neither version",
            now.len()
        );
        if call.receipt.outcome == Outcome::Ok {
            assert_eq!(now, new);
            break;
        }
        assert_eq!(
            call.lease_failure(),
            &LeaseFailure::Timeout {
                limit: Duration::from_millis(timeout_ms)
            }
        );
        cut += 1;
        if now == new {
            // The rename happened and the deadline hit after it: done.
            break;
        }
        timeout_ms = timeout_ms * 3 / 2 + 1;
        assert!(timeout_ms < 60_000, "the edit never completed");
    }
    assert!(
        cut >= 1,
        "no deadline cut the edit short: nothing was tested"
    );
    eprintln!("{cut} edits cut short before one finished ({timeout_ms} ms)");
}
