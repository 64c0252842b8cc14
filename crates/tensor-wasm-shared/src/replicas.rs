//! Replica membership: each replica writes a heartbeat to `tw_replicas` (migration 4) and
//! counts the replicas whose heartbeat is recent, to enforce its share of every tenant's rate
//! and concurrency limits (`TenantRegistry::set_replicas`, docs/scale-out.md).

use std::time::Duration;

use tensor_wasm_runtime::Result;

use crate::store::SharedStore;

/// Rows of replicas silent this long are deleted by the next heartbeat of any replica.
const FORGET_AFTER_S: f64 = 3600.0;

impl SharedStore {
    /// Records that `replica` is alive now and returns how many replicas (itself included)
    /// have written a heartbeat within `live_within`.
    ///
    /// # Errors
    /// When the database cannot be reached or refuses the statements.
    pub fn heartbeat(&self, replica: &str, live_within: Duration) -> Result<u64> {
        let replica = replica.to_owned();
        let live = self.with_db("tw_replicas", move |db| async move {
            let client = db.client().await?;
            client
                .execute(
                    "INSERT INTO tw_replicas (name) VALUES ($1)
                     ON CONFLICT (name) DO UPDATE SET last_seen = now()",
                    &[&replica],
                )
                .await?;
            client
                .execute(
                    "DELETE FROM tw_replicas
                     WHERE last_seen < now() - make_interval(secs => $1)",
                    &[&FORGET_AFTER_S],
                )
                .await?;
            let live: i64 = client
                .query_one(
                    "SELECT count(*) FROM tw_replicas
                     WHERE last_seen >= now() - make_interval(secs => $1)",
                    &[&live_within.as_secs_f64()],
                )
                .await?
                .get(0);
            Ok(u64::try_from(live).unwrap_or(1).max(1))
        })?;
        if let Some(metrics) = &self.metrics {
            metrics.set_live_replicas(live);
        }
        Ok(live)
    }

    /// Removes `replica`'s heartbeat (it is stopping), so that the others take back its share
    /// at their next heartbeat.
    ///
    /// # Errors
    /// When the database cannot be reached or refuses the statement.
    pub fn leave(&self, replica: &str) -> Result<()> {
        let replica = replica.to_owned();
        self.with_db("tw_replicas", move |db| async move {
            db.client()
                .await?
                .execute("DELETE FROM tw_replicas WHERE name = $1", &[&replica])
                .await?;
            Ok(())
        })
    }
}
