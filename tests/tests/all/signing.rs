//! Signed plugin bundles, lock files and upgrades (issue 40), through the
//! `warden` binary with bundles signed by the real `minisign` tool (a test
//! fails, never skips, when it is missing): a valid signature loads and
//! every receipt names the bundle and its signer; a tampered component, a
//! tampered manifest, a tampered statement, an untrusted key and a missing
//! signature are each refused with their own code, naming the plugin,
//! before anything is compiled (the component cache stays empty); unsigned
//! plugins load only where the operator allows them, built-ins always; a
//! run refuses a bundle that is not the locked one; an upgrade that adds a
//! host or turns a read into a write stops and shows the diff, is taken
//! when that exact diff is accepted (recorded: who, when, the diff), and
//! one that only narrows goes through.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use sha2::Digest as _;
use warden_tests::guests;

use crate::binary::warden_binary;

/// Runs the real `minisign` in `cwd`.
fn minisign(args: &[&str], cwd: &Path) -> Output {
    Command::new("minisign")
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `minisign` ({e}): these tests sign with the real tool; install it \
                 (`apt-get install -y minisign`, as .ci/run does)"
            )
        })
}

/// A minisign key pair made by the real tool, without a password.
struct Key {
    /// The public key, `RW…`, as warden.toml lists it.
    public: String,
    /// The key ID as minisign prints it.
    id: String,
    secret: PathBuf,
}

fn new_key(dir: &Path, name: &str) -> Key {
    let public = dir.join(format!("{name}.pub"));
    let secret = dir.join(format!("{name}.key"));
    let out = minisign(
        &[
            "-G",
            "-W",
            "-p",
            public.to_str().unwrap(),
            "-s",
            secret.to_str().unwrap(),
        ],
        dir,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&public).unwrap();
    let mut lines = text.lines();
    let id = lines.next().unwrap().rsplit(' ').next().unwrap().to_owned();
    Key {
        public: lines.next().unwrap().to_owned(),
        id,
        secret,
    }
}

/// `warden` in `cwd` (where warden.toml is read), compiling into `cache`.
fn warden(args: &[&str], cwd: &Path, cache: &Path) -> Output {
    Command::new(warden_binary())
        .args(args)
        .current_dir(cwd)
        .env("WARDEN_CACHE_DIR", cache)
        .env_remove("RUST_LOG")
        .env_remove("WARDEN_STORE")
        .env_remove("WARDEN_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            stderr(o)
        )
    })
}

/// Files under `dir`, recursively (none when it does not exist).
fn files_under(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .map(|e| e.unwrap().path())
        .map(|p| if p.is_dir() { files_under(&p) } else { 1 })
        .sum()
}

/// Writes a plugin `name` into `dir`: the component `wasm` and a manifest
/// pinning it, with `extra` appended.
fn write_plugin(dir: &Path, name: &str, wasm: &[u8], extra: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(format!("{name}.wasm")), wasm).unwrap();
    let sha = hex::encode(sha2::Sha256::digest(wasm));
    std::fs::write(
        dir.join("plugin.toml"),
        format!(
            "name = \"{name}\"\nversion = \"0.1.0\"\nkind = \"tool\"\ncomponent = \"{name}.wasm\"\nsha256 = \"{sha}\"\n{extra}"
        ),
    )
    .unwrap();
}

/// What a publisher does: `warden plugin bundle`, then `minisign -S`.
fn sign(root: &Path, plugin_dir: &Path, key: &Key) {
    let out = warden(
        &["plugin", "bundle", plugin_dir.to_str().unwrap()],
        root,
        &root.join("cache-bundle"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let statement = plugin_dir.join("plugin.bundle");
    let out = minisign(
        &[
            "-S",
            "-s",
            key.secret.to_str().unwrap(),
            "-m",
            statement.to_str().unwrap(),
        ],
        root,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(plugin_dir.join("plugin.bundle.minisig").is_file());
}

fn trust_config(root: &Path, key: &Key, extra: &str) {
    std::fs::write(
        root.join("warden.toml"),
        format!(
            "[trust]\n{extra}\n[trust.publishers.acme]\nkeys = [\"{}\"]\n",
            key.public
        ),
    )
    .unwrap();
}

const FS_MOUNT: &str = "[mounts.workspace]\naccess = \"read-write\"\n";

/// `warden plugin call <manifest> list_dir --json` with its own cache.
fn call_list_dir(root: &Path, manifest: &str, cache: &Path) -> Output {
    warden(
        &[
            "plugin",
            "call",
            manifest,
            "list_dir",
            "{}",
            "--mount",
            "workspace=.:ro",
            "--json",
        ],
        root,
        cache,
    )
}

#[test]
fn a_signed_bundle_loads_and_its_receipt_names_the_bundle_and_signer() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let acme = new_key(root, "acme");
    trust_config(root, &acme, "");
    let fs = warden::plugins::builtin::find("fs").unwrap();
    let plugin = root.join("files");
    write_plugin(&plugin, "files", fs.wasm, FS_MOUNT);
    sign(root, &plugin, &acme);

    let out = call_list_dir(root, "files/plugin.toml", &root.join("cache"));
    assert!(out.status.success(), "{}", stderr(&out));
    let json = json_of(&out);
    let bundle = &json["receipt"]["bundle"];
    let statement = std::fs::read(plugin.join("plugin.bundle")).unwrap();
    assert_eq!(
        bundle["digest"],
        hex::encode(sha2::Sha256::digest(&statement))
    );
    assert_eq!(bundle["signer"], format!("minisign:{}", acme.id));
    assert_eq!(bundle["publisher"], "acme");

    // The text receipt line says it too, and `inspect` shows the signer.
    let out = warden(
        &["plugin", "inspect", "files/plugin.toml"],
        root,
        &root.join("cache"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("signed minisign:{} (publisher acme)", acme.id)),
        "{text}"
    );
}

#[test]
fn tampered_untrusted_and_unsigned_bundles_are_refused_before_compiling() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let acme = new_key(root, "acme");
    let stranger = new_key(root, "stranger");
    trust_config(root, &acme, "");
    let fs = warden::plugins::builtin::find("fs").unwrap();
    let http = warden::plugins::builtin::find("http").unwrap();
    let plugin = root.join("files");
    let fresh = || {
        write_plugin(&plugin, "files", fs.wasm, FS_MOUNT);
    };

    // Each case: what is done to the signed bundle, the code, and what the
    // message must say.
    type Tamper<'a> = Box<dyn Fn() + 'a>;
    let cases: Vec<(&str, Tamper<'_>, &str, String)> = vec![
        (
            "component",
            Box::new(|| std::fs::write(plugin.join("files.wasm"), http.wasm).unwrap()),
            "plugin_tampered",
            "the component is not the one its publisher signed".into(),
        ),
        (
            "manifest",
            Box::new(|| {
                let mut text = std::fs::read_to_string(plugin.join("plugin.toml")).unwrap();
                text = text.replace(
                    "kind = \"tool\"",
                    "kind = \"tool\"\nhosts = [\"evil.example\"]",
                );
                std::fs::write(plugin.join("plugin.toml"), text).unwrap();
            }),
            "plugin_tampered",
            "the manifest is not the one its publisher signed".into(),
        ),
        (
            "statement",
            Box::new(|| {
                // A manifest changed and its statement written again, but
                // not signed again: the old signature does not cover it.
                let mut text = std::fs::read_to_string(plugin.join("plugin.toml")).unwrap();
                text = text.replace("kind = \"tool\"", "kind = \"tool\"\nenv = [\"HOME\"]");
                std::fs::write(plugin.join("plugin.toml"), text).unwrap();
                let out = warden(
                    &["plugin", "bundle", "files"],
                    root,
                    &root.join("cache-bundle"),
                );
                assert!(out.status.success(), "{}", stderr(&out));
            }),
            "plugin_bad_signature",
            format!(
                "the signature by key {} (publisher `acme`) does not verify",
                acme.id
            ),
        ),
        (
            "untrusted key",
            Box::new(|| sign(root, &plugin, &stranger)),
            "plugin_untrusted_key",
            format!(
                "is signed by minisign key {}, which no `[trust.publishers]`",
                stranger.id
            ),
        ),
        (
            "missing signature",
            Box::new(|| std::fs::remove_file(plugin.join("plugin.bundle.minisig")).unwrap()),
            "plugin_unsigned",
            "is not signed (no `plugin.bundle.minisig` next to it)".into(),
        ),
    ];
    for (case, tamper, code, message) in cases {
        fresh();
        sign(root, &plugin, &acme);
        tamper();
        let cache = root.join(format!("cache-{}", case.replace(' ', "-")));
        let out = call_list_dir(root, "files/plugin.toml", &cache);
        assert_eq!(out.status.code(), Some(2), "{case}: {}", stderr(&out));
        let json = json_of(&out);
        assert_eq!(json["error"]["code"], code, "{case}: {json}");
        let text = json["error"]["message"].as_str().unwrap();
        assert!(text.contains("plugin `files`"), "{case}: {text}");
        assert!(text.contains(&message), "{case}: {text}");
        assert_eq!(
            json["error"]["details"]["plugin"], "files",
            "{case}: {json}"
        );
        // Refused before compiling: nothing reached the component cache.
        assert_eq!(files_under(&cache), 0, "{case}: something was compiled");
    }

    // The same bundle signed again by the trusted key loads.
    fresh();
    sign(root, &plugin, &acme);
    let out = call_list_dir(root, "files/plugin.toml", &root.join("cache-ok"));
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn unsigned_plugins_load_only_where_the_operator_allows_them_and_builtins_always() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let fs = warden::plugins::builtin::find("fs").unwrap();
    write_plugin(&root.join("dev/files"), "files", fs.wasm, FS_MOUNT);
    let cache = root.join("cache");

    // No [trust]: development; the receipt says it was unsigned.
    let out = call_list_dir(root, "dev/files/plugin.toml", &cache);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json_of(&out)["receipt"]["bundle"]["signer"], "unsigned");

    // [trust] present: fail-closed.
    let acme = new_key(root, "acme");
    trust_config(root, &acme, "");
    let out = call_list_dir(root, "dev/files/plugin.toml", &cache);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(json_of(&out)["error"]["code"], "plugin_unsigned");
    let out = warden(&["config", "show", "--json"], root, &cache);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json_of(&out)["trust"]["require_signatures"], true);

    // A built-in is trusted by being compiled into the binary.
    let out = call_list_dir(root, "builtin:fs", &cache);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json_of(&out)["receipt"]["bundle"]["signer"], "builtin");

    // Allowed from beneath a directory the operator names, and only there.
    trust_config(root, &acme, "allow_unsigned = [\"dev\"]");
    let out = call_list_dir(root, "dev/files/plugin.toml", &cache);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json_of(&out)["receipt"]["bundle"]["signer"], "unsigned");
    write_plugin(&root.join("elsewhere"), "files", fs.wasm, FS_MOUNT);
    let out = call_list_dir(root, "elsewhere/plugin.toml", &cache);
    assert_eq!(json_of(&out)["error"]["code"], "plugin_unsigned");
}

/// The table-grow guest with its one tool's effect patched from read to
/// write: the `i32.const 0` stored as the effect (`i32.store8 offset=24`)
/// becomes `i32.const 2`.
fn table_grow_as_write() -> Vec<u8> {
    let mut wasm = std::fs::read(guests::TABLE_GROW).unwrap();
    let pattern = [0x41, 0x00, 0x3a, 0x00, 0x18];
    let at: Vec<usize> = wasm
        .windows(pattern.len())
        .enumerate()
        .filter(|(_, w)| *w == pattern)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "the effect store is not where it was");
    wasm[at[0] + 1] = 0x02;
    wasm
}

const AGENT: &str = r#"
name = "grower"
instructions = "Say done."

[model]
provider = "scripted"
name = "demo"
transcript = "agent.transcript.toml"

[plugins.grow]
source = "grow/plugin.toml"
"#;

#[test]
fn a_lock_holds_runs_to_the_locked_bundle_and_upgrades_show_the_diff() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let cache = root.join("cache");
    let acme = new_key(root, "acme");
    trust_config(root, &acme, "");
    std::fs::write(root.join("agent.toml"), AGENT).unwrap();
    std::fs::write(
        root.join("agent.transcript.toml"),
        "[[turns]]\ntext = \"done\"\n",
    )
    .unwrap();
    let grow = root.join("grow");
    let read = std::fs::read(guests::TABLE_GROW).unwrap();
    let version = |wasm: &[u8], extra: &str| {
        std::fs::remove_dir_all(&grow).ok();
        write_plugin(&grow, "grow", wasm, extra);
        sign(root, &grow, &acme);
    };
    let run = |id: &str| warden(&["run", "agent.toml", "go", "--run-id", id], root, &cache);
    let upgrade = |extra: &[&str]| {
        let mut args = vec![
            "plugin",
            "upgrade",
            "grow",
            "--agent",
            "agent.toml",
            "--json",
        ];
        args.extend(extra);
        warden(&args, root, &cache)
    };
    let lock_text = || std::fs::read_to_string(root.join("agent.lock")).unwrap();

    version(&read, "");
    let out = warden(&["plugin", "lock", "agent.toml"], root, &cache);
    assert!(out.status.success(), "{}", stderr(&out));
    let locked: toml::Table = toml::from_str(&lock_text()).unwrap();
    assert_eq!(
        locked["plugins"]["grow"]["signer"].as_str(),
        Some(format!("minisign:{}", acme.id).as_str())
    );
    let out = run("r1");
    assert!(out.status.success(), "{}", stderr(&out));

    // v2 asks for a host: runs refuse it, the upgrade stops with the diff.
    version(&read, "hosts = [\"api.example.com\"]\n");
    let out = run("r2");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("warden plugin upgrade grow"),
        "{}",
        stderr(&out)
    );
    let before = lock_text();
    let out = upgrade(&[]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let refusal = json_of(&out);
    assert_eq!(refusal["error"]["code"], "upgrade_needs_acceptance");
    let details = &refusal["error"]["details"];
    assert_eq!(details["widens"], true);
    assert_eq!(
        details["changes"],
        serde_json::json!([{"what": "host `api.example.com`", "from": null, "to": "requested", "widens": true}])
    );
    assert_eq!(lock_text(), before, "a refused upgrade changed the lock");
    // In text, the diff is shown line by line.
    let out = warden(
        &["plugin", "upgrade", "grow", "--agent", "agent.toml"],
        root,
        &cache,
    );
    assert_eq!(out.status.code(), Some(4));
    assert!(
        stderr(&out).contains("+ host `api.example.com` added"),
        "{}",
        stderr(&out)
    );
    // Accepting another diff than the one shown changes nothing.
    let out = upgrade(&["--accept", &"0".repeat(64)]);
    assert_eq!(json_of(&out)["error"]["code"], "upgrade_diff_changed");
    assert_eq!(lock_text(), before);
    // Accepting this diff is recorded: who, when, the diff, from what.
    let digest = details["diff"].as_str().unwrap().to_owned();
    let out = upgrade(&["--accept", &digest, "--by", "ada"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let locked: toml::Table = toml::from_str(&lock_text()).unwrap();
    let accepted = &locked["plugins"]["grow"]["accepted"];
    assert_eq!(accepted["by"].as_str(), Some("ada"));
    assert_eq!(accepted["diff"].as_str(), Some(digest.as_str()));
    assert!(accepted["at_ms"].as_integer().unwrap() > 1_700_000_000_000);
    let out = run("r3");
    assert!(out.status.success(), "{}", stderr(&out));

    // v3 turns the read into a write: stopped, shown.
    version(&table_grow_as_write(), "hosts = [\"api.example.com\"]\n");
    let out = upgrade(&[]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(
        json_of(&out)["error"]["details"]["changes"],
        serde_json::json!([{"what": "tool `table_grow`", "from": "read", "to": "write", "widens": true}])
    );

    // v4 only narrows (the host dropped, less memory): taken at once.
    version(&read, "[limits]\nmemory = \"16MiB\"\n");
    let out = upgrade(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let locked: toml::Table = toml::from_str(&lock_text()).unwrap();
    assert!(locked["plugins"]["grow"].get("accepted").is_none());
    assert_eq!(
        locked["plugins"]["grow"]["permissions"]["hosts"]
            .as_array()
            .map(Vec::len),
        Some(0)
    );
    let out = run("r4");
    assert!(out.status.success(), "{}", stderr(&out));
}
