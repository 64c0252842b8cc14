//! Models tenants store for `wasi-nn`'s `load-by-name`, in the shared store (migration 7):
//! one record per tenant and name in `tw_models`, the bytes content-addressed in object storage
//! as `models/<sha256>.onnx` and indexed by `tw_model_blobs`, as modules are by `tw_modules`.
//!
//! A store writes the bytes before the record, so that no record names missing bytes:
//! 1. a look without locks refuses a name taken or a quota passed before anything is uploaded;
//! 2. the bytes' row is touched under the bytes' advisory lock and its generation read;
//! 3. the bytes are uploaded unless present, with no connection held;
//! 4. one transaction takes the tenant's lock (the one deploys and captures take) and counts
//!    the tenant's stored bytes against its bound, takes the bytes' lock and checks that the
//!    row's generation is unchanged (else the orphan collector removed the bytes meanwhile, and
//!    all goes again from 2), inserts the record with `ON CONFLICT DO NOTHING` (nothing
//!    inserted: the name is taken, [`ModelRecord::name_taken`]) and appends the change to the
//!    change log (kind `model`, key `<tenant>/<name>`), so other replicas reload it
//!    (`Runtime::reload_model`).
//!
//! A delete removes the record and logs the change. The bytes stay until the orphan collector
//! finds that no record names them (`orphans.rs`), as a deleted function's module does: bytes
//! are shared by every record with the same digest, and removing them in the delete would race
//! a store of the same bytes under another name. A store refused after its upload (by a
//! concurrent store of the same name, or the quota) leaves its bytes to the collector too.

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::PutPayload;
use tensor_wasm_runtime::{sha256_hex, ModelRecord, Result, RuntimeError, WriteBounds};

use crate::error::SharedStoreError;
use crate::follow::Change;
use crate::pool::Db;
use crate::store::{
    decode_rows, execute_logged, from_json, lock_tenant, log_change, over_stored_bytes, Shared,
    SharedStore,
};

/// The change-log kind of a model's record.
const CHANGE_KIND: &str = "model";

/// How many times a store uploads bytes that the orphan collector keeps removing meanwhile
/// (only a collector run with a grace period shorter than an upload can).
const MODEL_STORE_ATTEMPTS: usize = 3;

/// The object key of the model bytes with digest `sha256`.
pub(crate) fn model_key(sha256: &str) -> ObjectPath {
    ObjectPath::from(format!("models/{sha256}.onnx"))
}

/// The change-log key of `tenant`'s model `name` (a model name has no `/`).
fn change_key(tenant: &str, name: &str) -> String {
    format!("{tenant}/{name}")
}

impl Change {
    /// The tenant and the name of the model a change of kind `model` is about; `None` for a
    /// change of another kind.
    #[must_use]
    pub fn model(&self) -> Option<(&str, &str)> {
        if self.kind != CHANGE_KIND {
            return None;
        }
        self.key.rsplit_once('/')
    }
}

/// Takes the transaction-level lock of the model bytes with digest `$1`, which stores and the
/// orphan collector take before they touch or remove the bytes' row.
pub(crate) const MODEL_BYTES_LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtext('tw_model_blobs:' || $1))";

async fn lock_model_bytes(tx: &tokio_postgres::Transaction<'_>, sha256: &str) -> Shared<()> {
    tx.execute(MODEL_BYTES_LOCK, &[&sha256]).await?;
    Ok(())
}

/// Whether `s` has the shape of a sha256 digest (lowercase hex), and so is safe in a key.
fn is_digest(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Touches the row of the bytes `sha256` (inserting it with `size`) under the bytes' lock and
/// returns its generation.
async fn touch_bytes(db: &Db, sha256: &str, size: i64) -> Shared<i64> {
    let mut client = db.client().await?;
    let tx = client.transaction().await?;
    lock_model_bytes(&tx, sha256).await?;
    let generation = tx
        .query_one(
            "INSERT INTO tw_model_blobs (sha256, size) VALUES ($1, $2)
             ON CONFLICT (sha256) DO UPDATE SET created_at = now()
             RETURNING generation",
            &[&sha256, &size],
        )
        .await?
        .get(0);
    tx.commit().await?;
    Ok(generation)
}

/// What became of a record's write.
enum Written {
    Stored,
    /// A name taken or a quota passed.
    Refused(RuntimeError),
    /// The bytes' row has another generation than the one read before the upload: the
    /// collector removed the bytes meanwhile.
    BytesGone,
}

/// Writes `record` if the row of its bytes still has `generation` and `bounds` admit it (see
/// the module documentation, step 4).
async fn write_record(
    db: &Db,
    record: &ModelRecord,
    generation: i64,
    bounds: &WriteBounds,
) -> Shared<Written> {
    let mut client = db.client().await?;
    let tx = client.transaction().await?;
    if bounds.max_stored_bytes.is_some() {
        lock_tenant(&tx, &record.tenant).await?;
        if let Some(refusal) = over_stored_bytes(&tx, &record.tenant, record.bytes, bounds).await? {
            return Ok(Written::Refused(refusal));
        }
    }
    lock_model_bytes(&tx, &record.sha256).await?;
    let current: Option<i64> = tx
        .query_opt(
            "SELECT generation FROM tw_model_blobs WHERE sha256 = $1",
            &[&record.sha256],
        )
        .await?
        .map(|row| row.get(0));
    if current != Some(generation) {
        return Ok(Written::BytesGone);
    }
    let json = serde_json::to_value(record).expect("records serialize");
    let inserted = tx
        .execute(
            "INSERT INTO tw_models (tenant, name, sha256, record) VALUES ($1, $2, $3, $4)
             ON CONFLICT (tenant, name) DO NOTHING",
            &[&record.tenant, &record.name, &record.sha256, &json],
        )
        .await?;
    if inserted == 0 {
        return Ok(Written::Refused(ModelRecord::name_taken(&record.name)));
    }
    log_change(&tx, CHANGE_KIND, &change_key(&record.tenant, &record.name)).await?;
    tx.commit().await?;
    Ok(Written::Stored)
}

impl SharedStore {
    /// `FunctionStore::create_model` (and `put_model`, without bounds): see the module
    /// documentation.
    pub(crate) fn store_model(
        &self,
        record: &ModelRecord,
        bytes: &[u8],
        bounds: &WriteBounds,
    ) -> Result<()> {
        if sha256_hex(bytes) != record.sha256 || bytes.len() as u64 != record.bytes {
            return Err(RuntimeError::InvalidConfig(
                "the model record's digest or size is not its bytes'".into(),
            ));
        }
        if let Some(refusal) = self.model_refusal(record, bounds)? {
            return Err(refusal);
        }
        let (record, bounds) = (record.clone(), *bounds);
        let payload = Bytes::copy_from_slice(bytes);
        let (blobs, db) = (self.blobs.clone(), self.db.clone());
        let key = model_key(&record.sha256);
        let what = key.to_string();
        let refused = self
            .timed("objects", async move {
                let size = i64::try_from(record.bytes).unwrap_or(i64::MAX);
                for _ in 0..MODEL_STORE_ATTEMPTS {
                    let generation = db.bounded(touch_bytes(&db, &record.sha256, size)).await?;
                    match blobs.head(&key).await {
                        Ok(_) => {}
                        Err(object_store::Error::NotFound { .. }) => {
                            blobs.put(&key, PutPayload::from(payload.clone())).await?;
                        }
                        Err(e) => return Err(e.into()),
                    }
                    let written = write_record(&db, &record, generation, &bounds);
                    match db.bounded(written).await? {
                        Written::Stored => return Ok(None),
                        Written::Refused(refusal) => return Ok(Some(refusal)),
                        Written::BytesGone => {}
                    }
                }
                Err(SharedStoreError::Io(std::io::Error::other(format!(
                    "model bytes {} were collected as an orphan while they were stored, \
                     {MODEL_STORE_ATTEMPTS} times",
                    record.sha256
                ))))
            })
            .map_err(|e| e.into_runtime(&what))?;
        refused.map_or(Ok(()), Err)
    }

    /// The refusal of `record` as things stand (its name taken, or `bounds` passed), looked at
    /// without locks to spare the upload; the record's write checks again, exactly.
    fn model_refusal(
        &self,
        record: &ModelRecord,
        bounds: &WriteBounds,
    ) -> Result<Option<RuntimeError>> {
        let (tenant, name, adding, bounds) = (
            record.tenant.clone(),
            record.name.clone(),
            record.bytes,
            *bounds,
        );
        self.with_db("tw_models", move |db| async move {
            let mut client = db.client().await?;
            let tx = client.transaction().await?;
            let taken = tx
                .query_opt(
                    "SELECT 1 FROM tw_models WHERE tenant = $1 AND name = $2",
                    &[&tenant, &name],
                )
                .await?
                .is_some();
            if taken {
                return Ok(Some(ModelRecord::name_taken(&name)));
            }
            over_stored_bytes(&tx, &tenant, adding, &bounds).await
        })
    }

    /// `FunctionStore::model_bytes`: the bytes, checked against their digest.
    pub(crate) fn read_model(&self, sha256: &str) -> Result<Vec<u8>> {
        if !is_digest(sha256) {
            return Err(
                SharedStoreError::Corrupt(format!("`{sha256}` is not a sha256 digest"))
                    .into_runtime("tw_models"),
            );
        }
        let expected = sha256.to_owned();
        self.with_blobs(model_key(sha256), |blobs, key| async move {
            let bytes = blobs.get(&key).await?.bytes().await?;
            if sha256_hex(&bytes) != expected {
                return Err(SharedStoreError::Corrupt(format!(
                    "model {expected} does not match its digest"
                )));
            }
            Ok(bytes.to_vec())
        })
    }

    /// `FunctionStore::models`: every record, by tenant and name.
    pub(crate) fn model_records(&self) -> Result<Vec<ModelRecord>> {
        self.with_db("tw_models", |db| async move {
            let client = db.client().await?;
            let rows = client
                .query(
                    "SELECT tenant || '/' || name, record FROM tw_models ORDER BY tenant, name",
                    &[],
                )
                .await?;
            decode_rows(rows, "model")
        })
    }

    /// `FunctionStore::model`: the record of `tenant`'s model `name`.
    pub(crate) fn model_record(&self, tenant: &str, name: &str) -> Result<Option<ModelRecord>> {
        let (tenant, name) = (tenant.to_owned(), name.to_owned());
        self.with_db("tw_models", |db| async move {
            let client = db.client().await?;
            let row = client
                .query_opt(
                    "SELECT record FROM tw_models WHERE tenant = $1 AND name = $2",
                    &[&tenant, &name],
                )
                .await?;
            row.map(|row| {
                from_json(
                    row.get(0),
                    &format!("model record {}", change_key(&tenant, &name)),
                )
            })
            .transpose()
        })
    }

    /// `FunctionStore::delete_model`: the record and its change; the bytes are left to the
    /// orphan collector (see the module documentation).
    pub(crate) fn remove_model(&self, tenant: &str, name: &str) -> Result<bool> {
        let (tenant, name) = (tenant.to_owned(), name.to_owned());
        self.with_db("tw_models", |db| async move {
            let deleted = execute_logged(
                &db,
                "DELETE FROM tw_models WHERE tenant = $1 AND name = $2",
                &[&tenant, &name],
                CHANGE_KIND,
                &change_key(&tenant, &name),
            )
            .await?;
            Ok(deleted > 0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(kind: &str, key: &str) -> Change {
        Change {
            seq: 1,
            kind: kind.into(),
            key: key.into(),
        }
    }

    #[test]
    fn a_model_change_names_its_tenant_and_model() {
        let key = change_key("tn-0123456789abcdef", "digits.v2");
        assert_eq!(
            change(CHANGE_KIND, &key).model(),
            Some(("tn-0123456789abcdef", "digits.v2"))
        );
        // Without tenants the tenant id is empty.
        assert_eq!(
            change(CHANGE_KIND, &change_key("", "m")).model(),
            Some(("", "m"))
        );
        assert_eq!(change("function", &key).model(), None);
        assert_eq!(change(CHANGE_KIND, "no-separator").model(), None);
    }

    #[test]
    fn only_digests_make_keys() {
        let digest = sha256_hex(b"model");
        assert!(is_digest(&digest));
        assert_eq!(model_key(&digest).as_ref(), format!("models/{digest}.onnx"));
        assert!(!is_digest(&digest.to_uppercase()));
        assert!(!is_digest("../../etc/passwd"));
        assert!(!is_digest(&digest[1..]));
    }
}
