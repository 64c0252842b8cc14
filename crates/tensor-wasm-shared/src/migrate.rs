//! Versioned schema migrations, applied in order under a PostgreSQL advisory lock so that
//! replicas starting together apply each one exactly once.

use tokio_postgres::Client;

use crate::error::SharedStoreError;

/// The migrations this build knows: (version, name, SQL), in version order.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "records", include_str!("../migrations/0001_records.sql")),
    (2, "tenants", include_str!("../migrations/0002_tenants.sql")),
    (3, "jobs", include_str!("../migrations/0003_jobs.sql")),
    (
        4,
        "replicas",
        include_str!("../migrations/0004_replicas.sql"),
    ),
    (
        5,
        "versions",
        include_str!("../migrations/0005_versions.sql"),
    ),
    (
        6,
        "module generations",
        include_str!("../migrations/0006_module_generations.sql"),
    ),
    (7, "models", include_str!("../migrations/0007_models.sql")),
];

/// Key of the session-level advisory lock held while migrating (ASCII "twmigrat").
const LOCK_KEY: i64 = 0x7477_6d69_6772_6174;

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// Connects to the database at `url` and applies what it lacks ([`migrate`]), for
/// `tensor-wasm migrate`.
///
/// # Errors
/// As [`migrate`], and [`SharedStoreError::Database`] when the database cannot be reached.
pub fn run(url: &str) -> Result<Vec<i32>, SharedStoreError> {
    let bridge = crate::bridge::Bridge::new()?;
    let url = url.to_owned();
    bridge.run(async move {
        let db = crate::pool::Db::new(&url, crate::pool::PoolOptions::default());
        let mut client = db.connect(true).await?;
        migrate(&mut client).await
    })
}

/// Applies every migration the database lacks, each in its own transaction, and returns the
/// versions applied now (empty when the schema was current).
///
/// # Errors
/// [`SharedStoreError::SchemaTooNew`] when the database holds a version this build does not
/// know (a newer build migrated it); [`SharedStoreError::Database`] on any database error.
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>, SharedStoreError> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&LOCK_KEY])
        .await?;
    let applied = apply(client).await;
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&LOCK_KEY])
        .await;
    let applied = applied?;
    unlocked?;
    Ok(applied)
}

async fn apply(client: &mut Client) -> Result<Vec<i32>, SharedStoreError> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS tw_schema_migrations (
                 version    INT PRIMARY KEY,
                 name       TEXT NOT NULL,
                 applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
             )",
        )
        .await?;
    let done: Vec<i32> = client
        .query(
            "SELECT version FROM tw_schema_migrations ORDER BY version",
            &[],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    if let Some(&newest) = done.last() {
        if newest > SCHEMA_VERSION {
            return Err(SharedStoreError::SchemaTooNew {
                database: newest,
                known: SCHEMA_VERSION,
            });
        }
    }
    let mut applied = Vec::new();
    for &(version, name, sql) in MIGRATIONS {
        if done.contains(&version) {
            continue;
        }
        let tx = client.transaction().await?;
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO tw_schema_migrations (version, name) VALUES ($1, $2)",
            &[&version, &name],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(version, name, "applied schema migration");
        applied.push(version);
    }
    Ok(applied)
}
