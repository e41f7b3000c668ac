//! The filesystem boundary: a guest sees its mounts and nothing else, and a
//! read-only mount refuses every kind of change. The guest's `fs` tool
//! reports the error kind its std saw.

use serde_json::{Value, json};
use warden::sandbox::{Access, Capabilities};

use crate::{assert_serves_normal_call, failure, hostile, invoke, output, test_limits};

/// A directory tree for the tests: `outside/secret.txt` next to the mounted
/// `mounted/`, which holds `file.txt` and a symlink pointing outside.
struct Tree {
    _root: tempfile::TempDir,
    mounted: std::path::PathBuf,
    outside: std::path::PathBuf,
}

fn tree() -> Tree {
    let root = tempfile::tempdir().unwrap();
    let mounted = root.path().join("mounted");
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&mounted).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "top secret").unwrap();
    std::fs::write(mounted.join("file.txt"), "original").unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), mounted.join("link")).unwrap();
    std::os::unix::fs::symlink(&outside, mounted.join("dirlink")).unwrap();
    Tree {
        _root: root,
        mounted,
        outside,
    }
}

async fn fs_op(caps: &Capabilities, args: Value) -> (Option<Value>, Option<String>) {
    let g = hostile(caps.clone(), test_limits());
    let leased = invoke(&g, "fs", args).await;
    match &leased.result {
        Ok(Ok(_)) => (Some(output(&leased)), None),
        Ok(Err(_)) => (None, Some(failure(&leased))),
        Err(e) => panic!("the fs tool was stopped: {e}"),
    }
}

#[tokio::test]
async fn reads_inside_the_mount_work() {
    let t = tree();
    let caps = Capabilities::none()
        .mount("workspace", &t.mounted, Access::ReadOnly)
        .unwrap();
    let (ok, err) = fs_op(
        &caps,
        json!({ "op": "read", "path": "/workspace/file.txt" }),
    )
    .await;
    assert_eq!(err, None);
    assert!(ok.unwrap().to_string().contains("original"));
}

#[tokio::test]
async fn no_path_leads_out_of_the_mount() {
    let t = tree();
    let caps = Capabilities::none()
        .mount("workspace", &t.mounted, Access::ReadWrite)
        .unwrap();
    let secret = t.outside.join("secret.txt");
    let cases = [
        // `..` escape from the mount.
        json!({ "op": "read", "path": "/workspace/../outside/secret.txt" }),
        // An absolute host path, outside every mount.
        json!({ "op": "read", "path": secret.to_str().unwrap() }),
        // A symlink inside the mount that points outside.
        json!({ "op": "read", "path": "/workspace/link" }),
        json!({ "op": "read", "path": "/workspace/dirlink/secret.txt" }),
        // Writing through the escaping symlink.
        json!({ "op": "write", "path": "/workspace/link", "content": "pwned" }),
        json!({ "op": "list", "path": "/workspace/.." }),
        json!({ "op": "list", "path": "/" }),
    ];
    for args in cases {
        let (ok, err) = fs_op(&caps, args.clone()).await;
        assert!(ok.is_none(), "{args}: the guest got {ok:?}");
        let err = err.unwrap();
        assert!(
            err.contains("PermissionDenied") || err.contains("NotFound"),
            "{args}: {err}"
        );
    }
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "top secret");
}

#[tokio::test]
async fn a_read_only_mount_refuses_every_change() {
    let t = tree();
    let caps = Capabilities::none()
        .mount("workspace", &t.mounted, Access::ReadOnly)
        .unwrap();
    let file = t.mounted.join("file.txt");
    let before = std::fs::metadata(&file).unwrap().modified().unwrap();
    let cases = [
        json!({ "op": "write", "path": "/workspace/file.txt", "content": "changed" }),
        json!({ "op": "truncate", "path": "/workspace/file.txt", "len": 0 }),
        json!({ "op": "create", "path": "/workspace/new.txt" }),
        json!({ "op": "rename", "from": "/workspace/file.txt", "to": "/workspace/moved.txt" }),
        json!({ "op": "unlink", "path": "/workspace/file.txt" }),
        json!({ "op": "set_times", "path": "/workspace/file.txt", "modified_ms": 0 }),
        json!({ "op": "mkdir", "path": "/workspace/dir" }),
    ];
    for args in cases {
        let (ok, err) = fs_op(&caps, args.clone()).await;
        assert!(ok.is_none(), "{args}: the change went through: {ok:?}");
        assert!(err.unwrap().contains("PermissionDenied"), "{args}");
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "original");
    assert_eq!(
        std::fs::metadata(&file).unwrap().modified().unwrap(),
        before
    );
    let mut names: Vec<String> = std::fs::read_dir(&t.mounted)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["dirlink", "file.txt", "link"]);
}

#[tokio::test]
async fn a_read_write_mount_allows_changes_inside_it() {
    let t = tree();
    let caps = Capabilities::none()
        .mount("workspace", &t.mounted, Access::ReadWrite)
        .unwrap();
    let (_, err) = fs_op(
        &caps,
        json!({ "op": "write", "path": "/workspace/new.txt", "content": "made by the guest" }),
    )
    .await;
    assert_eq!(err, None);
    assert_eq!(
        std::fs::read_to_string(t.mounted.join("new.txt")).unwrap(),
        "made by the guest"
    );
}

#[tokio::test]
async fn without_a_mount_there_is_no_filesystem() {
    let g = hostile(Capabilities::none(), test_limits());
    for path in ["/", "/etc/passwd", ".", "/workspace"] {
        let leased = invoke(&g, "fs", json!({ "op": "read", "path": path })).await;
        assert!(
            matches!(&leased.result, Ok(Err(_))),
            "{path}: {:?}",
            leased.result
        );
    }
    assert_serves_normal_call(&g).await;
}

/// A mount is the directory the operator granted, by identity, for the life
/// of the grant. A plugin with a read-write mount above another grant's
/// directory moves that directory away and plants a relative symlink to a
/// private sibling in its place: the other grant still sees the original
/// directory, never the sibling.
#[tokio::test]
async fn a_mount_stays_the_granted_directory_when_its_path_is_swapped_for_a_symlink() {
    let root = tempfile::tempdir().unwrap();
    let outer = root.path().join("outer");
    let shared = outer.join("shared");
    let private = root.path().join("private");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::create_dir_all(&private).unwrap();
    std::fs::write(shared.join("notes.txt"), "shared notes").unwrap();
    std::fs::write(private.join("id_rsa"), "PRIVATE KEY").unwrap();
    let victim = Capabilities::none()
        .mount("workspace", &shared, Access::ReadOnly)
        .unwrap();
    let attacker = Capabilities::none()
        .mount("workspace", &outer, Access::ReadWrite)
        .unwrap();
    let (ok, err) = fs_op(&victim, json!({ "op": "list", "path": "/workspace" })).await;
    assert_eq!(err, None);
    assert_eq!(ok.unwrap()["entries"], json!(["notes.txt"]));

    // The swap: the attacking plugin moves the directory away through its
    // own mount, and a relative symlink to the sibling takes its place (Rust
    // on WASI has no stable symlink call, so the test plants it).
    let (_, err) = fs_op(
        &attacker,
        json!({ "op": "rename", "from": "/workspace/shared", "to": "/workspace/moved" }),
    )
    .await;
    assert_eq!(err, None);
    std::os::unix::fs::symlink("../private", &shared).unwrap();
    // By path, the granted directory now leads to the private sibling.
    assert_eq!(
        std::fs::read_to_string(shared.join("id_rsa")).unwrap(),
        "PRIVATE KEY"
    );

    // The victim's grant still holds the original directory.
    let (ok, err) = fs_op(&victim, json!({ "op": "list", "path": "/workspace" })).await;
    assert_eq!(err, None);
    assert_eq!(ok.unwrap()["entries"], json!(["notes.txt"]));
    let (ok, err) = fs_op(
        &victim,
        json!({ "op": "read", "path": "/workspace/notes.txt" }),
    )
    .await;
    assert_eq!(err, None);
    assert_eq!(ok.unwrap()["content"], "shared notes");
    let (ok, err) = fs_op(
        &victim,
        json!({ "op": "read", "path": "/workspace/id_rsa" }),
    )
    .await;
    assert!(ok.is_none(), "the victim read the sibling: {ok:?}");
    assert!(err.unwrap().contains("NotFound"));
    // Its narrowed leases (a preflight) hold it too.
    let g = hostile(victim.clone(), test_limits());
    let preview = g
        .preflight(
            &crate::call("fs", json!({ "op": "read", "path": "/workspace/id_rsa" })),
            None,
        )
        .await;
    assert!(
        !format!("{:?}", preview.result).contains("PRIVATE KEY"),
        "{:?}",
        preview.result
    );
    assert_serves_normal_call(&g).await;
}

/// Break 11 of issue 37: a write that lost its race (cut short by its
/// deadline, or its own clean-up refused by the lease's fence) left its
/// `.NAME.<hex>.warden-tmp` beside the target. A temporary file a lease
/// created (exclusively, by that suffix) and left is removed by the host
/// when the lease ends; one it did not create, or any other name, stays.
#[tokio::test]
async fn a_temporary_file_a_lease_leaves_behind_is_removed_when_it_ends() {
    let t = tree();
    std::fs::create_dir(t.mounted.join("sub")).unwrap();
    std::fs::write(t.mounted.join(".kept.1.warden-tmp"), "the operator's").unwrap();
    let caps = Capabilities::none()
        .mount("workspace", &t.mounted, Access::ReadWrite)
        .unwrap();
    for (path, stays) in [
        ("/workspace/sub/.a.txt.0123.warden-tmp", false),
        ("/workspace/.b.txt.4567.warden-tmp", false),
        ("/workspace/sub/b.txt", true),
    ] {
        let (_, err) = fs_op(&caps, json!({ "op": "create", "path": path })).await;
        assert_eq!(err, None, "{path}");
        let host = t.mounted.join(path.trim_start_matches("/workspace/"));
        assert_eq!(host.exists(), stays, "{path}");
    }
    // Opened, not created, by the lease: not its debris.
    let (_, err) = fs_op(
        &caps,
        json!({ "op": "write", "path": "/workspace/.kept.1.warden-tmp", "content": "x" }),
    )
    .await;
    assert_eq!(err, None);
    assert!(t.mounted.join(".kept.1.warden-tmp").exists());
}

/// The host opens nothing but regular files and directories: a FIFO (which
/// would block its opener), a socket and devices (`/dev/zero` never ends)
/// are refused at open with `unsupported`, through raw WASI, before any
/// deadline; they can still be listed and inspected.
#[tokio::test]
async fn the_host_refuses_to_open_fifos_sockets_and_devices() {
    let t = tree();
    let _fifo = crate::Fifo::new(t.mounted.join("pipe"));
    let _socket = std::os::unix::net::UnixListener::bind(t.mounted.join("sock")).unwrap();
    let caps = Capabilities::none()
        .mount("workspace", &t.mounted, Access::ReadWrite)
        .unwrap()
        .mount("dev", "/dev", Access::ReadOnly)
        .unwrap();
    let cases = [
        json!({ "op": "read", "path": "/workspace/pipe" }),
        json!({ "op": "write", "path": "/workspace/pipe", "content": "x" }),
        json!({ "op": "append", "path": "/workspace/pipe", "content": "x" }),
        json!({ "op": "read", "path": "/workspace/sock" }),
        json!({ "op": "write", "path": "/workspace/sock", "content": "x" }),
        json!({ "op": "read", "path": "/dev/zero" }),
        json!({ "op": "read", "path": "/dev/urandom" }),
        json!({ "op": "contains", "path": "/dev/null", "needle": "x" }),
    ];
    for args in cases {
        let (ok, err) = fs_op(&caps, args.clone()).await;
        assert!(ok.is_none(), "{args}: the guest got {ok:?}");
        let err = err.unwrap();
        assert!(err.contains("Unsupported"), "{args}: {err}");
    }
    let (ok, err) = fs_op(&caps, json!({ "op": "stat", "path": "/workspace/pipe" })).await;
    assert_eq!(err, None);
    assert_eq!(ok.unwrap()["kind"], "other");
    let (ok, _) = fs_op(&caps, json!({ "op": "list", "path": "/workspace" })).await;
    assert_eq!(
        ok.unwrap()["entries"],
        json!(["dirlink", "file.txt", "link", "pipe", "sock"])
    );
    let (ok, err) = fs_op(
        &caps,
        json!({ "op": "read", "path": "/workspace/file.txt" }),
    )
    .await;
    assert_eq!(err, None);
    assert_eq!(ok.unwrap()["content"], "original");
    assert_serves_normal_call(&hostile(caps, test_limits())).await;
}

/// Grant-level exclusions hold for a third-party plugin using raw WASI,
/// whatever path leads there: as written, through `..`, through a symlink
/// it plants (to the file or to its directory), by rename, link or stat;
/// and listings leave excluded names out.
#[tokio::test]
async fn excluded_paths_are_refused_to_raw_wasi_by_every_route() {
    let t = tree();
    std::fs::write(t.mounted.join(".env"), "API_KEY=sk-live-0123456789").unwrap();
    std::fs::create_dir(t.mounted.join("secrets")).unwrap();
    std::fs::write(t.mounted.join("secrets/key"), "PRIVATE KEY").unwrap();
    std::fs::create_dir(t.mounted.join("config")).unwrap();
    std::fs::write(t.mounted.join("config/prod.toml"), "password = 1").unwrap();
    let caps = Capabilities::none()
        .mount("workspace", &t.mounted, Access::ReadWrite)
        .unwrap()
        .exclude("workspace", &[".env", "secrets/**", "config/prod.toml"])
        .unwrap();
    // Routes planted in the mount (Rust on WASI has no stable symlink call,
    // so the test plants them): symlinks to an excluded file and to an
    // excluded directory.
    std::os::unix::fs::symlink(".env", t.mounted.join("innocent")).unwrap();
    std::os::unix::fs::symlink("secrets", t.mounted.join("s")).unwrap();
    let refused = [
        json!({ "op": "read", "path": "/workspace/.env" }),
        json!({ "op": "read", "path": "/workspace/secrets/../.env" }),
        json!({ "op": "read", "path": "/workspace/secrets/key" }),
        json!({ "op": "read", "path": "/workspace/innocent" }),
        json!({ "op": "read", "path": "/workspace/s/key" }),
        json!({ "op": "list", "path": "/workspace/s" }),
        json!({ "op": "list", "path": "/workspace/secrets" }),
        json!({ "op": "stat", "path": "/workspace/.env" }),
        json!({ "op": "write", "path": "/workspace/.env", "content": "changed" }),
        json!({ "op": "write", "path": "/workspace/s/planted", "content": "x" }),
        json!({ "op": "unlink", "path": "/workspace/s/key" }),
        json!({ "op": "rename", "from": "/workspace/.env", "to": "/workspace/env.txt" }),
        json!({ "op": "rename", "from": "/workspace/secrets", "to": "/workspace/public" }),
        json!({ "op": "rename", "from": "/workspace/config", "to": "/workspace/cfg" }),
        json!({ "op": "rename", "from": "/workspace/file.txt", "to": "/workspace/.env" }),
    ];
    for args in refused {
        let (ok, err) = fs_op(&caps, args.clone()).await;
        assert!(ok.is_none(), "{args}: the guest got {ok:?}");
        let err = err.unwrap();
        assert!(err.contains("PermissionDenied"), "{args}: {err}");
    }
    let (ok, _) = fs_op(&caps, json!({ "op": "list", "path": "/workspace" })).await;
    assert_eq!(
        ok.unwrap()["entries"],
        json!(["config", "dirlink", "file.txt", "innocent", "link", "s"])
    );
    let (ok, _) = fs_op(&caps, json!({ "op": "list", "path": "/workspace/config" })).await;
    assert_eq!(ok.unwrap()["entries"], json!([]));
    assert_eq!(
        std::fs::read_to_string(t.mounted.join(".env")).unwrap(),
        "API_KEY=sk-live-0123456789"
    );
    assert_eq!(
        std::fs::read_to_string(t.mounted.join("secrets/key")).unwrap(),
        "PRIVATE KEY"
    );
    assert!(t.mounted.join("config/prod.toml").exists());
    // What is not excluded works as before, narrowed leases included.
    let (ok, err) = fs_op(
        &caps,
        json!({ "op": "read", "path": "/workspace/file.txt" }),
    )
    .await;
    assert_eq!(err, None);
    assert_eq!(ok.unwrap()["content"], "original");
    let g = hostile(caps.clone(), test_limits());
    let preview = g
        .preflight(
            &crate::call("fs", json!({ "op": "read", "path": "/workspace/.env" })),
            None,
        )
        .await;
    assert!(
        !format!("{:?}", preview.result).contains("sk-live"),
        "{:?}",
        preview.result
    );
    assert_serves_normal_call(&g).await;
}
