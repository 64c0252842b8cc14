//! [`TenantStore`] over PostgreSQL: tenants (with their hashed tokens) and the administrator's
//! hashed token, each change announced in the change log so that every replica's registry
//! follows it (`TenantRegistry::reload_tenant`, `reload_admin`).

use std::path::PathBuf;

use tensor_wasm_tenant::{StoredAdmin, StoredTenant, TenantError, TenantStore};

use crate::error::SharedStoreError;
use crate::store::{decode_rows, execute_logged, from_json, Shared, SharedStore};

/// How many times a change is read and applied again when other writers keep coming first.
pub(crate) const MAX_WRITE_ATTEMPTS: usize = 32;

/// Key of the advisory lock under which a replica opens its registry and bootstraps the
/// administrator and the default tenant, so that replicas starting together bootstrap once
/// (ASCII "twbootst").
pub const BOOTSTRAP_LOCK_KEY: i64 = 0x7477_626f_6f74_7374;

fn tenant_error(table: &str, e: SharedStoreError) -> TenantError {
    if e.is_unavailable() {
        return TenantError::Unavailable(format!("{table}: {e}"));
    }
    TenantError::Storage {
        path: PathBuf::from(table),
        source: std::io::Error::other(e.to_string()),
    }
}

impl SharedStore {
    fn tenants_db<T, F, Fut>(&self, table: &str, body: F) -> Result<T, TenantError>
    where
        T: Send + 'static,
        F: FnOnce(std::sync::Arc<crate::pool::Db>) -> Fut,
        Fut: std::future::Future<Output = Shared<T>> + Send + 'static,
    {
        self.run_db(body).map_err(|e| tenant_error(table, e))
    }
}

impl TenantStore for SharedStore {
    fn put(&self, tenant: &StoredTenant) -> Result<(), TenantError> {
        let id = tenant.id.clone();
        let json = serde_json::to_value(tenant).expect("tenant records serialize");
        self.tenants_db("tw_tenants", |db| async move {
            execute_logged(
                &db,
                "INSERT INTO tw_tenants (id, record) VALUES ($1, $2)
                 ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record,
                     version = tw_tenants.version + 1, updated_at = now()",
                &[&id, &json],
                "tenant",
                &id,
            )
            .await
            .map(drop)
        })
    }

    fn modify(
        &self,
        id: &str,
        change: &mut dyn FnMut(&mut StoredTenant) -> Result<(), TenantError>,
    ) -> Result<StoredTenant, TenantError> {
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let key = id.to_owned();
            let current = self.tenants_db("tw_tenants", |db| async move {
                let client = db.client().await?;
                let row = client
                    .query_opt(
                        "SELECT record, version FROM tw_tenants WHERE id = $1",
                        &[&key],
                    )
                    .await?;
                row.map(|row| {
                    let record: StoredTenant =
                        from_json(row.get(0), &format!("tenant record {key}"))?;
                    Ok((record, row.get::<_, i64>(1)))
                })
                .transpose()
            })?;
            let Some((mut record, version)) = current else {
                return Err(TenantError::NotFound(id.to_owned()));
            };
            change(&mut record)?;
            let (key, json) = (
                id.to_owned(),
                serde_json::to_value(&record).expect("tenant records serialize"),
            );
            let written = self.tenants_db("tw_tenants", |db| async move {
                execute_logged(
                    &db,
                    "UPDATE tw_tenants SET record = $2, version = version + 1, updated_at = now()
                     WHERE id = $1 AND version = $3",
                    &[&key, &json, &version],
                    "tenant",
                    &key,
                )
                .await
            })?;
            if written == 1 {
                return Ok(record);
            }
            // Another writer came first, or the tenant is gone: read again.
        }
        Err(TenantError::Unavailable(format!(
            "tenant {id}: {MAX_WRITE_ATTEMPTS} other writers changed it first; retry"
        )))
    }

    fn delete(&self, id: &str) -> Result<bool, TenantError> {
        let id = id.to_owned();
        self.tenants_db("tw_tenants", |db| async move {
            let deleted = execute_logged(
                &db,
                "DELETE FROM tw_tenants WHERE id = $1",
                &[&id],
                "tenant",
                &id,
            )
            .await?;
            Ok(deleted > 0)
        })
    }

    fn all(&self) -> Result<Vec<StoredTenant>, TenantError> {
        self.tenants_db("tw_tenants", |db| async move {
            let client = db.client().await?;
            let rows = client
                .query("SELECT id, record FROM tw_tenants ORDER BY id", &[])
                .await?;
            decode_rows(rows, "tenant")
        })
    }

    fn get(&self, id: &str) -> Result<Option<StoredTenant>, TenantError> {
        let id = id.to_owned();
        self.tenants_db("tw_tenants", |db| async move {
            let client = db.client().await?;
            let row = client
                .query_opt("SELECT record FROM tw_tenants WHERE id = $1", &[&id])
                .await?;
            row.map(|row| from_json(row.get(0), &format!("tenant record {id}")))
                .transpose()
        })
    }

    fn put_admin(&self, admin: &StoredAdmin) -> Result<(), TenantError> {
        let json = serde_json::to_value(admin).expect("admin records serialize");
        self.tenants_db("tw_admin", |db| async move {
            execute_logged(
                &db,
                "INSERT INTO tw_admin (singleton, record) VALUES (TRUE, $1)
                 ON CONFLICT (singleton) DO UPDATE SET record = EXCLUDED.record",
                &[&json],
                "admin",
                "admin",
            )
            .await
            .map(drop)
        })
    }

    fn admin(&self) -> Result<Option<StoredAdmin>, TenantError> {
        self.tenants_db("tw_admin", |db| async move {
            let client = db.client().await?;
            let row = client.query_opt("SELECT record FROM tw_admin", &[]).await?;
            row.map(|row| from_json(row.get(0), "admin record"))
                .transpose()
        })
    }
}
