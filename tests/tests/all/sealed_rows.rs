//! The tables outside the run logs whose content decides what runs
//! (standing approval rules, idempotency commitments) are sealed (issue 36,
//! break 3): with `WARDEN_CHAIN_KEY` set, a rule widened and a settled
//! result rewritten directly in the database are refused by the driving
//! verbs (`warden run`, `runs resume`) and reported by `runs verify`,
//! through real `warden` processes on SQLite and PostgreSQL. Writes are
//! counted by the side-effect file the test guest appends to. The
//! store-level cases (every read refused, a seal copied from another row,
//! rows sealed by the migration) are in the store conformance suite.

use std::path::Path;
use std::process::{Command, Output};

use super::engine::{Fixture, READ_WRITE_FINISH};
use super::workers::PgSchema;
use crate::binary::warden_binary;

/// The operator's chain key (hex, 32 bytes).
const KEY: &str = "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e";

/// Where the runs are kept: a SQLite file in the fixture, or a fresh
/// PostgreSQL schema.
enum Db {
    Sqlite,
    Postgres(PgSchema),
}

impl Db {
    /// Each store the tests run on; `None` only where PostgreSQL is skipped
    /// by hand (`WARDEN_SKIP_POSTGRES=1`, said loudly).
    async fn all(name: &str) -> Vec<Db> {
        let mut all = vec![Db::Sqlite];
        if let Some(schema) = PgSchema::new(name).await {
            all.push(Db::Postgres(schema));
        }
        all
    }

    fn name(&self) -> &'static str {
        match self {
            Db::Sqlite => "sqlite",
            Db::Postgres(_) => "postgres",
        }
    }

    /// `WARDEN_STORE` for the binary.
    fn store(&self, dir: &Path) -> String {
        match self {
            Db::Sqlite => dir.join("runs.db").display().to_string(),
            Db::Postgres(schema) => schema.url.clone(),
        }
    }

    /// Runs `sql` on the database behind the store's back (as someone with
    /// write access to it), expecting it to change `rows` rows.
    async fn tamper(&self, dir: &Path, sql_sqlite: &str, sql_postgres: &str, rows: u64) {
        match self {
            Db::Sqlite => {
                let conn = rusqlite::Connection::open(dir.join("runs.db")).unwrap();
                assert_eq!(conn.execute(sql_sqlite, []).unwrap() as u64, rows);
            }
            Db::Postgres(schema) => {
                let (base, name) = schema.url.rsplit_once("schema=").unwrap();
                let base = base.trim_end_matches(['?', '&']);
                let (client, connection) = tokio_postgres::connect(base, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("SET search_path TO {name}"))
                    .await
                    .unwrap();
                assert_eq!(client.execute(sql_postgres, &[]).await.unwrap(), rows);
            }
        }
    }
}

/// `warden ARGS` from `dir` on `db`'s store, keyed with [`KEY`].
fn warden(db: &Db, dir: &Path, args: &[&str]) -> Output {
    Command::new(warden_binary())
        .args(args)
        .current_dir(dir)
        .env("WARDEN_STORE", db.store(dir))
        .env("WARDEN_CHAIN_KEY", KEY)
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-tests-components"),
        )
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The fixture's agent with the hostile plugin's `fs` under the default
/// approval rule (its append waits for approval), as `agent-approve.toml`.
fn approving_agent(fx: &Fixture) {
    fx.agent(READ_WRITE_FINISH, "");
    let text = std::fs::read_to_string(fx.path("agent.toml"))
        .unwrap()
        .replace(
            "approval = { fs = \"never\", flaky = \"never\", write_then_sleep = \"never\" }\n",
            "",
        );
    std::fs::write(fx.path("agent-approve.toml"), text).unwrap();
}

/// A narrow standing rule (appends under `/elsewhere/`) widened in the
/// database to every path approves nothing: the write that needs approval
/// does not run (the driving verbs refuse, naming the rule), nothing
/// records an approval by it, and `runs verify` reports the rule.
#[tokio::test(flavor = "multi_thread")]
async fn a_standing_rule_widened_in_the_database_approves_nothing_and_verify_reports_it() {
    for db in Db::all("widened_rule").await {
        let fx = Fixture::new();
        approving_agent(&fx);
        let dir = fx.dir.path();
        let name = db.name();
        // The first run makes the store, and parks: no rule covers it.
        let out = warden(
            &db,
            dir,
            &["run", "agent-approve.toml", "go", "--run-id", "first"],
        );
        assert_eq!(out.status.code(), Some(4), "{name}: {}", text(&out));
        let out = warden(
            &db,
            dir,
            &[
                "--json",
                "approvals",
                "add",
                "--plugin",
                "hostile",
                "--tool",
                "fs",
                "--arg",
                "path=/elsewhere/*",
                "--by",
                "ops",
            ],
        );
        assert!(out.status.success(), "{name}: {}", text(&out));
        let rule: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let rule = rule["id"].as_str().unwrap().to_owned();
        // Widened behind the store's back: every path.
        db.tamper(
            dir,
            "UPDATE approval_rules SET spec = replace(spec, '/elsewhere/*', '*')",
            "UPDATE approval_rules SET spec = replace(spec, '/elsewhere/*', '*')",
            1,
        )
        .await;

        let out = warden(
            &db,
            dir,
            &["run", "agent-approve.toml", "go", "--run-id", "second"],
        );
        assert!(!out.status.success(), "{name}: {}", text(&out));
        let shown = text(&out);
        assert!(
            shown.contains("approval_rules") && shown.contains(&rule),
            "{name}: the refusal names the table and the rule: {shown}"
        );
        assert!(shown.contains("warden store restore"), "{name}: {shown}");
        assert_eq!(fx.effects(), 0, "{name}: the write did not run");
        // Every driving verb refuses the same way.
        let out = warden(&db, dir, &["runs", "resume", "second"]);
        assert!(!out.status.success(), "{name}: {}", text(&out));
        assert!(text(&out).contains(&rule), "{name}: {}", text(&out));
        assert_eq!(fx.effects(), 0, "{name}: the write did not run");
        let out = warden(&db, dir, &["runs", "events", "second", "--json"]);
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains(&format!("rule:{rule}")),
            "{name}: no approval by the rule was recorded: {}",
            text(&out)
        );

        let out = warden(&db, dir, &["runs", "verify"]);
        assert_eq!(out.status.code(), Some(1), "{name}: {}", text(&out));
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(shown.contains("approval_rules: BROKEN"), "{name}: {shown}");
        assert!(shown.contains(&rule), "{name}: {shown}");
        assert!(shown.contains("commitments: intact"), "{name}: {shown}");
    }
}

/// A keyed write settled by one run, its result rewritten in the
/// commitments table: a later run with the same key refuses to use it
/// (nothing forged is recorded, the write is not made again), and `runs
/// verify` reports the commitment.
#[tokio::test(flavor = "multi_thread")]
async fn a_settled_result_rewritten_in_the_database_is_refused_and_verify_reports_it() {
    for db in Db::all("forged_result").await {
        let fx = Fixture::new();
        fx.agent(
            r#"
[[turns]]
text = "Paying."
[[turns.tool_calls]]
name = "hostile__fs"
arguments = { op = "append", path = "/workspace/effects.log", content = "paid\n", claim_id = "claim-42" }

[[turns]]
text = "Paid."
"#,
            "[plugins.hostile.grant.tools.fs]\nidempotency_key = \"claim_id\"\n",
        );
        let dir = fx.dir.path();
        let name = db.name();
        let out = warden(&db, dir, &["run", "agent.toml", "go", "--run-id", "first"]);
        assert!(out.status.success(), "{name}: {}", text(&out));
        assert_eq!(fx.effects(), 1);
        let out = warden(&db, dir, &["runs", "verify"]);
        assert!(out.status.success(), "{name}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("commitments: intact (1 rows)"),
            "{name}: {}",
            text(&out)
        );
        // The settled result rewritten behind the store's back.
        db.tamper(
            dir,
            "UPDATE commitments SET result = CAST(replace(CAST(result AS TEXT), 'appended', 'FORGED') AS BLOB)",
            "UPDATE commitments SET result = convert_to(replace(convert_from(result, 'UTF8'), 'appended', 'FORGED'), 'UTF8')",
            1,
        )
        .await;

        let out = warden(&db, dir, &["run", "agent.toml", "go", "--run-id", "second"]);
        assert!(!out.status.success(), "{name}: {}", text(&out));
        let shown = text(&out);
        assert!(
            shown.contains("commitments") && shown.contains("fails its integrity check"),
            "{name}: the refusal names the table: {shown}"
        );
        assert_eq!(fx.effects(), 1, "{name}: the write was not made again");
        let out = warden(&db, dir, &["runs", "resume", "second"]);
        assert!(!out.status.success(), "{name}: {}", text(&out));
        assert_eq!(fx.effects(), 1, "{name}: the write was not made again");
        let out = warden(&db, dir, &["runs", "events", "second", "--json"]);
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("FORGED"),
            "{name}: the forged result was not recorded: {}",
            text(&out)
        );

        let out = warden(&db, dir, &["runs", "verify"]);
        assert_eq!(out.status.code(), Some(1), "{name}: {}", text(&out));
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(shown.contains("commitments: BROKEN"), "{name}: {shown}");
        assert!(shown.contains("approval_rules: intact"), "{name}: {shown}");
    }
}
