//! The conformance suite ([`crate::testing::suite`]) run against this
//! crate's stores: the memory store, and the SQLite and PostgreSQL stores
//! with their back doors (a raw connection to their database, to damage it
//! behind the store's back), which the stores' own tests also use.

#[cfg(feature = "sqlite")]
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;

#[cfg(feature = "sqlite")]
use crate::SqliteStore;
use crate::testing::{Backend, HistoryTamper, RowTamper, Tamper};
use crate::{ChainKey, EventStore, HistoryDigest, RunId};

crate::conformance_suite!(memory, crate::testing::MemoryBackend::new());
#[cfg(feature = "sqlite")]
crate::conformance_suite!(sqlite, crate::conformance::SqliteBackend::new(), durable);
#[cfg(feature = "postgres")]
crate::conformance_suite!(
    postgres,
    match crate::conformance::PostgresBackend::connect().await {
        Some(backend) => backend,
        None => return,
    },
    durable
);

#[cfg(feature = "sqlite")]
pub(crate) struct SqliteBackend {
    dir: tempfile::TempDir,
}

#[cfg(feature = "sqlite")]
impl SqliteBackend {
    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.dir.path().join("runs.db")
    }

    /// A raw connection to the database file, bypassing the store.
    pub(crate) fn raw(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(self.path()).unwrap()
    }

    pub(crate) fn pk(conn: &rusqlite::Connection, run_id: &RunId) -> i64 {
        conn.query_row(
            "SELECT pk FROM runs WHERE id = ?1",
            [run_id.as_str()],
            |r| r.get(0),
        )
        .unwrap()
    }
}

#[cfg(feature = "sqlite")]
#[async_trait]
impl Backend for SqliteBackend {
    async fn open(&self) -> Arc<dyn EventStore> {
        Arc::new(SqliteStore::open(self.path()).unwrap())
    }

    async fn open_keyed(&self, key: ChainKey) -> Arc<dyn EventStore> {
        let path = self.dir.path().join("keyed.db");
        Arc::new(SqliteStore::builder(path).chain_key(key).open().unwrap())
    }

    async fn tamper(&self, run_id: &RunId, tamper: Tamper) {
        let conn = self.raw();
        let pk = Self::pk(&conn, run_id);
        let sql = |sql: &str, params: &[&dyn rusqlite::ToSql]| {
            let changed = conn.execute(sql, params).unwrap();
            assert!(changed > 0, "tamper changed nothing: {sql}");
        };
        match tamper {
            Tamper::Edit { seq, bytes } => sql(
                "UPDATE events SET bytes = ?3 WHERE run_pk = ?1 AND seq = ?2",
                &[&pk, &(seq as i64), &bytes],
            ),
            Tamper::Drop { seq } => sql(
                "DELETE FROM events WHERE run_pk = ?1 AND seq = ?2",
                &[&pk, &(seq as i64)],
            ),
            Tamper::Swap { a, b } => {
                let renumber = "UPDATE events SET seq = ?3 WHERE run_pk = ?1 AND seq = ?2";
                sql(renumber, &[&pk, &(a as i64), &-1i64]);
                sql(renumber, &[&pk, &(b as i64), &(a as i64)]);
                sql(renumber, &[&pk, &-1i64, &(b as i64)]);
            }
            Tamper::Truncate { keep } => sql(
                "DELETE FROM events WHERE run_pk = ?1 AND seq > ?2",
                &[&pk, &(keep as i64)],
            ),
            Tamper::Rehash { seq, hash } => sql(
                "UPDATE events SET hash = ?3 WHERE run_pk = ?1 AND seq = ?2",
                &[&pk, &(seq as i64), &hash.as_slice()],
            ),
            Tamper::RollBackHead { to } => sql(
                "UPDATE runs SET event_count = ?2,
                     head_hash = (SELECT hash FROM events WHERE run_pk = ?1 AND seq = ?2)
                 WHERE pk = ?1",
                &[&pk, &(to as i64)],
            ),
        }
    }

    async fn tamper_history(&self, digest: &HistoryDigest, tamper: HistoryTamper) {
        let conn = self.raw();
        let key = digest.as_bytes().as_slice();
        let changed = match tamper {
            HistoryTamper::Edit(body) => conn.execute(
                "UPDATE history_chunks SET body = ?2 WHERE digest = ?1",
                rusqlite::params![key, body],
            ),
            HistoryTamper::Relink(previous) => conn.execute(
                "UPDATE history_chunks SET previous = ?2 WHERE digest = ?1",
                rusqlite::params![key, previous.map(|p| p.as_bytes().to_vec())],
            ),
            HistoryTamper::Delete => {
                conn.execute("DELETE FROM history_chunks WHERE digest = ?1", [key])
            }
        };
        assert_eq!(changed.unwrap(), 1, "the tampered chunk exists");
    }

    async fn tamper_row(&self, keyed: bool, tamper: RowTamper) {
        let path = if keyed {
            self.dir.path().join("keyed.db")
        } else {
            self.path()
        };
        let conn = rusqlite::Connection::open(path).unwrap();
        let one = |sql: &str, params: &[&dyn rusqlite::ToSql]| {
            assert_eq!(conn.execute(sql, params).unwrap(), 1, "{sql}");
        };
        match tamper {
            RowTamper::RuleSpec { id, spec } => one(
                "UPDATE approval_rules SET spec = ?2 WHERE id = ?1",
                &[&id, &spec],
            ),
            RowTamper::CommitmentResult { key, result } => one(
                "UPDATE commitments SET result = ?2 WHERE key = ?1",
                &[&key, &result],
            ),
            RowTamper::CopySeal { table, from, to } => {
                let column = if table == crate::RULES { "id" } else { "key" };
                one(
                    &format!(
                        "UPDATE {table} SET seal = (SELECT seal FROM {table} WHERE {column} = ?1)
                         WHERE {column} = ?2"
                    ),
                    &[&from, &to],
                )
            }
            RowTamper::Unseal => conn
                .execute_batch(
                    "ALTER TABLE approval_rules DROP COLUMN seal;
                     ALTER TABLE commitments DROP COLUMN seal;
                     PRAGMA user_version = 10;",
                )
                .unwrap(),
        }
    }
}

/// A fresh schema (and a second one for the keyed store) in the test
/// database: `WARDEN_TEST_POSTGRES`, else
/// `postgres://postgres@127.0.0.1:5432/test`. Both schemas are dropped
/// with the backend.
#[cfg(feature = "postgres")]
pub(crate) struct PostgresBackend {
    url: String,
    schema: String,
}

#[cfg(feature = "postgres")]
impl PostgresBackend {
    /// The test database's URL.
    pub(crate) fn url() -> String {
        std::env::var("WARDEN_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
    }

    /// A backend with a fresh schema. An unreachable server fails the test
    /// (a test that passes without its server proves nothing); only with
    /// `WARDEN_SKIP_POSTGRES=1`, set by hand, is it skipped, loudly, and
    /// `None` returned.
    pub(crate) async fn connect() -> Option<Self> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let url = Self::url();
        if let Err(error) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
            if std::env::var_os("WARDEN_SKIP_POSTGRES").is_some_and(|v| v == "1") {
                eprintln!(
                    "\n*** SKIPPED (WARDEN_SKIP_POSTGRES=1): no PostgreSQL at {url} ({error}) ***\n"
                );
                return None;
            }
            panic!(
                "PostgreSQL at {url} is unreachable: {error}. Start it (see .ci/run), point \
                 WARDEN_TEST_POSTGRES at one, or set WARDEN_SKIP_POSTGRES=1 to skip these tests"
            );
        }
        let schema = format!(
            "warden_test_{}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            rand::random::<u32>()
        );
        Some(Self { url, schema })
    }

    fn keyed_schema(&self) -> String {
        format!("{}_keyed", self.schema)
    }

    /// A raw connection to the test database, bypassing the store.
    pub(crate) async fn raw(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(&format!("SET search_path TO {}", self.schema))
            .await
            .unwrap();
        client
    }

    /// A builder for a store in the backend's schema.
    pub(crate) fn builder(&self) -> crate::PostgresStoreBuilder {
        crate::PostgresStore::builder(&self.url).schema(&self.schema)
    }

    pub(crate) async fn store(&self) -> crate::PostgresStore {
        crate::PostgresStore::builder(&self.url)
            .schema(&self.schema)
            .max_connections(8)
            .open()
            .await
            .unwrap()
    }
}

#[cfg(feature = "postgres")]
impl Drop for PostgresBackend {
    fn drop(&mut self) {
        let (url, schemas) = (self.url.clone(), [self.schema.clone(), self.keyed_schema()]);
        // Dropped inside a runtime: clean up on a thread of its own.
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok((client, connection)) =
                    tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                {
                    tokio::spawn(connection);
                    for schema in schemas {
                        let _ = client
                            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                            .await;
                    }
                }
            });
        });
        let _ = cleanup.join();
    }
}

#[cfg(feature = "postgres")]
#[async_trait]
impl Backend for PostgresBackend {
    async fn open(&self) -> Arc<dyn EventStore> {
        Arc::new(self.store().await)
    }

    async fn open_keyed(&self, key: ChainKey) -> Arc<dyn EventStore> {
        Arc::new(
            crate::PostgresStore::builder(&self.url)
                .schema(self.keyed_schema())
                .chain_key(key)
                .open()
                .await
                .unwrap(),
        )
    }

    async fn tamper(&self, run_id: &RunId, tamper: Tamper) {
        let client = self.raw().await;
        let pk: i64 = client
            .query_one("SELECT pk FROM runs WHERE id = $1", &[&run_id.as_str()])
            .await
            .unwrap()
            .get(0);
        let sql = async |sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]| {
            let changed = client.execute(sql, params).await.unwrap();
            assert!(changed > 0, "tamper changed nothing: {sql}");
        };
        match tamper {
            Tamper::Edit { seq, bytes } => {
                sql(
                    "UPDATE events SET bytes = $3 WHERE run_pk = $1 AND seq = $2",
                    &[&pk, &(seq as i64), &bytes],
                )
                .await
            }
            Tamper::Drop { seq } => {
                sql(
                    "DELETE FROM events WHERE run_pk = $1 AND seq = $2",
                    &[&pk, &(seq as i64)],
                )
                .await
            }
            Tamper::Swap { a, b } => {
                let renumber = "UPDATE events SET seq = $3 WHERE run_pk = $1 AND seq = $2";
                sql(renumber, &[&pk, &(a as i64), &-1i64]).await;
                sql(renumber, &[&pk, &(b as i64), &(a as i64)]).await;
                sql(renumber, &[&pk, &-1i64, &(b as i64)]).await;
            }
            Tamper::Truncate { keep } => {
                sql(
                    "DELETE FROM events WHERE run_pk = $1 AND seq > $2",
                    &[&pk, &(keep as i64)],
                )
                .await
            }
            Tamper::Rehash { seq, hash } => {
                sql(
                    "UPDATE events SET hash = $3 WHERE run_pk = $1 AND seq = $2",
                    &[&pk, &(seq as i64), &hash.as_slice()],
                )
                .await
            }
            Tamper::RollBackHead { to } => {
                sql(
                    "UPDATE runs SET event_count = $2,
                         head_hash = (SELECT hash FROM events WHERE run_pk = $1 AND seq = $2)
                     WHERE pk = $1",
                    &[&pk, &(to as i64)],
                )
                .await
            }
        }
    }

    async fn tamper_history(&self, digest: &HistoryDigest, tamper: HistoryTamper) {
        let client = self.raw().await;
        let key = digest.as_bytes().as_slice();
        let changed = match tamper {
            HistoryTamper::Edit(body) => {
                client
                    .execute(
                        "UPDATE history_chunks SET body = $2 WHERE digest = $1",
                        &[&key, &body],
                    )
                    .await
            }
            HistoryTamper::Relink(previous) => {
                let previous = previous.map(|p| p.as_bytes().to_vec());
                client
                    .execute(
                        "UPDATE history_chunks SET previous = $2 WHERE digest = $1",
                        &[&key, &previous],
                    )
                    .await
            }
            HistoryTamper::Delete => {
                client
                    .execute("DELETE FROM history_chunks WHERE digest = $1", &[&key])
                    .await
            }
        };
        assert_eq!(changed.unwrap(), 1, "the tampered chunk exists");
    }

    async fn tamper_row(&self, keyed: bool, tamper: RowTamper) {
        let client = self.raw().await;
        if keyed {
            client
                .batch_execute(&format!("SET search_path TO {}", self.keyed_schema()))
                .await
                .unwrap();
        }
        let one = async |sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]| {
            assert_eq!(client.execute(sql, params).await.unwrap(), 1, "{sql}");
        };
        match tamper {
            RowTamper::RuleSpec { id, spec } => {
                one(
                    "UPDATE approval_rules SET spec = $2 WHERE id = $1",
                    &[&id, &spec],
                )
                .await
            }
            RowTamper::CommitmentResult { key, result } => {
                one(
                    "UPDATE commitments SET result = $2 WHERE key = $1",
                    &[&key, &result],
                )
                .await
            }
            RowTamper::CopySeal { table, from, to } => {
                let column = if table == crate::RULES { "id" } else { "key" };
                one(
                    &format!(
                        "UPDATE {table} SET seal = (SELECT seal FROM {table} WHERE {column} = $1)
                         WHERE {column} = $2"
                    ),
                    &[&from, &to],
                )
                .await
            }
            RowTamper::Unseal => client
                .batch_execute(
                    "ALTER TABLE approval_rules DROP COLUMN seal;
                     ALTER TABLE commitments DROP COLUMN seal;
                     UPDATE store_meta SET value = '9' WHERE key = 'schema_version';",
                )
                .await
                .unwrap(),
        }
    }
}
