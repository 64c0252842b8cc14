//! Persistence of tenants and the admin token: the `TenantStore` trait, the
//! durable file store `FsTenantStore` and the in-memory `MemoryTenantStore`.
//!
//! Records hold SHA-256 hashes of token secrets, never the secrets.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tensor_wasm_durable::{write_file, DurableError, WriteOptions};

use crate::{is_valid_tenant_id, GpuIsolation, Quotas, TenantError, TokenInfo};

/// A token as persisted: its description and the hex SHA-256 of its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredToken {
    /// `tk-` and 12 lowercase hex digits.
    pub id: String,
    /// Free text given at creation.
    #[serde(default)]
    pub label: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Whether the token was revoked.
    #[serde(default)]
    pub revoked: bool,
    /// Lowercase hex SHA-256 of the secret.
    pub sha256: String,
}

impl StoredToken {
    /// The public description of the token.
    pub fn info(&self) -> TokenInfo {
        TokenInfo {
            id: self.id.clone(),
            label: self.label.clone(),
            created_at_ms: self.created_at_ms,
            revoked: self.revoked,
        }
    }
}

/// A tenant as persisted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredTenant {
    /// `tn-` and 16 lowercase hex digits.
    pub id: String,
    /// Unique human-readable name.
    pub name: String,
    /// The tenant's limits.
    #[serde(default)]
    pub quotas: Quotas,
    /// How its GPU work is isolated.
    #[serde(default)]
    pub gpu_isolation: GpuIsolation,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Its tokens, revoked ones included.
    #[serde(default)]
    pub tokens: Vec<StoredToken>,
    /// Whether the admin granted the raw-kernel capability (raw PTX and CUDA
    /// C++ functions); only the admin sets it. Absent in older records: not granted.
    #[serde(default)]
    pub raw_ptx: bool,
}

/// The administrator's credentials as persisted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredAdmin {
    /// When the admin token was created, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Lowercase hex SHA-256 of the admin token's secret.
    pub token_sha256: String,
}

/// Where tenants and the admin token are kept.
///
/// Each method is durable when it returns `Ok`.
pub trait TenantStore: Send + Sync + 'static {
    /// Inserts or replaces the record of `tenant.id`.
    fn put(&self, tenant: &StoredTenant) -> Result<(), TenantError>;
    /// Removes a tenant's record; `false` if there was none.
    fn delete(&self, id: &str) -> Result<bool, TenantError>;
    /// Every readable tenant record.
    fn all(&self) -> Result<Vec<StoredTenant>, TenantError>;
    /// The record of tenant `id` (`None` if there is none). The default reads every record;
    /// stores that can look one up override it.
    fn get(&self, id: &str) -> Result<Option<StoredTenant>, TenantError> {
        Ok(self.all()?.into_iter().find(|tenant| tenant.id == id))
    }
    /// Changes the record of tenant `id` by `change`, applied to the record as stored now
    /// (never to a copy read earlier), and returns the record written. A shared store writes
    /// conditionally on the version it read and, when another writer came first, reads again
    /// and applies `change` again, so that no concurrent change is lost. `NotFound` when
    /// there is no such tenant: a change never re-creates a deleted one. An error of
    /// `change` is returned as it is, with nothing written.
    ///
    /// The default reads, changes and writes back: right for a store that one process owns,
    /// whose registry serializes its writes.
    fn modify(
        &self,
        id: &str,
        change: &mut dyn FnMut(&mut StoredTenant) -> Result<(), TenantError>,
    ) -> Result<StoredTenant, TenantError> {
        let mut record = self
            .get(id)?
            .ok_or_else(|| TenantError::NotFound(id.to_owned()))?;
        change(&mut record)?;
        self.put(&record)?;
        Ok(record)
    }
    /// Inserts or replaces the admin record.
    fn put_admin(&self, admin: &StoredAdmin) -> Result<(), TenantError>;
    /// The admin record, if one was written.
    fn admin(&self) -> Result<Option<StoredAdmin>, TenantError>;
}

/// A directory of JSON records: `<dir>/tenants/<id>.json` and `<dir>/admin.json`.
///
/// Each write goes to a file in `<dir>/tmp/`, is fsynced, renamed into place,
/// and the target directory is fsynced, so a record is either the old or the
/// new version after a crash. Files are created with mode 0600 on Unix.
#[derive(Debug)]
pub struct FsTenantStore {
    root: PathBuf,
}

impl FsTenantStore {
    /// Opens (creating if needed) the store in `dir`, and removes partial
    /// writes left by a crash.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, TenantError> {
        let root = dir.as_ref().to_path_buf();
        for sub in [root.clone(), root.join("tenants"), root.join("tmp")] {
            tensor_wasm_durable::create_dir_all(&sub).map_err(storage_error)?;
        }
        let tmp = root.join("tmp");
        let leftovers = fs::read_dir(&tmp).map_err(|e| TenantError::storage(&tmp, e))?;
        for entry in leftovers.flatten() {
            let _ = fs::remove_file(entry.path());
        }
        Ok(FsTenantStore { root })
    }

    /// The directory the store lives in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn tenant_path(&self, id: &str) -> Result<PathBuf, TenantError> {
        if !is_valid_tenant_id(id) {
            return Err(TenantError::InvalidId(id.to_owned()));
        }
        Ok(self.root.join("tenants").join(format!("{id}.json")))
    }

    fn admin_path(&self) -> PathBuf {
        self.root.join("admin.json")
    }

    fn write_json<T: Serialize>(&self, dest: &Path, value: &T) -> Result<(), TenantError> {
        let bytes = serde_json::to_vec_pretty(value).map_err(|e| TenantError::serde(dest, e))?;
        let options = WriteOptions::new()
            .staging_dir(self.root.join("tmp"))
            .mode(0o600);
        write_file(dest, &bytes, &options).map_err(storage_error)
    }
}

fn storage_error(e: DurableError) -> TenantError {
    let (path, source) = e.into_parts();
    TenantError::storage(&path, source)
}

fn sync_dir(dir: &Path) -> Result<(), TenantError> {
    tensor_wasm_durable::sync_dir(dir).map_err(storage_error)
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, TenantError> {
    let bytes = fs::read(path).map_err(|e| TenantError::storage(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| TenantError::serde(path, e))
}

impl TenantStore for FsTenantStore {
    fn put(&self, tenant: &StoredTenant) -> Result<(), TenantError> {
        let path = self.tenant_path(&tenant.id)?;
        self.write_json(&path, tenant)
    }

    fn delete(&self, id: &str) -> Result<bool, TenantError> {
        let path = self.tenant_path(id)?;
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(TenantError::storage(&path, e)),
        }
        sync_dir(&self.root.join("tenants"))?;
        Ok(true)
    }

    fn all(&self) -> Result<Vec<StoredTenant>, TenantError> {
        let dir = self.root.join("tenants");
        let entries = fs::read_dir(&dir).map_err(|e| TenantError::storage(&dir, e))?;
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| TenantError::storage(&dir, e))?;
            let path = entry.path();
            let Some(stem) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            if !is_valid_tenant_id(stem) {
                continue;
            }
            match read_json::<StoredTenant>(&path) {
                Ok(record) if record.id == stem => out.push(record),
                Ok(record) => tracing::error!(
                    path = %path.display(),
                    record_id = %record.id,
                    "tenant record's id does not match its file name; skipped"
                ),
                Err(error) => tracing::error!(
                    path = %path.display(),
                    error = %error_chain(&error),
                    "unreadable tenant record skipped"
                ),
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    fn put_admin(&self, admin: &StoredAdmin) -> Result<(), TenantError> {
        self.write_json(&self.admin_path(), admin)
    }

    fn admin(&self) -> Result<Option<StoredAdmin>, TenantError> {
        let path = self.admin_path();
        if !path.exists() {
            return Ok(None);
        }
        read_json(&path).map(Some)
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// A store that keeps records in memory only, for tests and ephemeral servers.
#[derive(Debug, Default)]
pub struct MemoryTenantStore {
    state: Mutex<MemoryState>,
}

#[derive(Debug, Default)]
struct MemoryState {
    tenants: BTreeMap<String, StoredTenant>,
    admin: Option<StoredAdmin>,
}

impl MemoryTenantStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl TenantStore for MemoryTenantStore {
    fn put(&self, tenant: &StoredTenant) -> Result<(), TenantError> {
        self.state()
            .tenants
            .insert(tenant.id.clone(), tenant.clone());
        Ok(())
    }

    fn delete(&self, id: &str) -> Result<bool, TenantError> {
        Ok(self.state().tenants.remove(id).is_some())
    }

    fn all(&self) -> Result<Vec<StoredTenant>, TenantError> {
        Ok(self.state().tenants.values().cloned().collect())
    }

    fn put_admin(&self, admin: &StoredAdmin) -> Result<(), TenantError> {
        self.state().admin = Some(admin.clone());
        Ok(())
    }

    fn admin(&self) -> Result<Option<StoredAdmin>, TenantError> {
        Ok(self.state().admin.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> StoredTenant {
        StoredTenant {
            id: id.to_owned(),
            name: "acme".into(),
            quotas: Quotas::default(),
            gpu_isolation: GpuIsolation::OwnContext,
            created_at_ms: 1,
            tokens: vec![StoredToken {
                id: "tk-0123456789ab".into(),
                label: "ci".into(),
                created_at_ms: 2,
                revoked: false,
                sha256: hex::encode([7u8; 32]),
            }],
            raw_ptx: false,
        }
    }

    const ID: &str = "tn-0123456789abcdef";

    #[test]
    fn fs_store_round_trips_and_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsTenantStore::open(dir.path()).unwrap();
        assert!(store.all().unwrap().is_empty());
        assert_eq!(store.admin().unwrap(), None);
        store.put(&record(ID)).unwrap();
        let admin = StoredAdmin {
            created_at_ms: 3,
            token_sha256: hex::encode([1u8; 32]),
        };
        store.put_admin(&admin).unwrap();

        let reopened = FsTenantStore::open(dir.path()).unwrap();
        assert_eq!(reopened.all().unwrap(), vec![record(ID)]);
        assert_eq!(reopened.admin().unwrap(), Some(admin));
        assert!(reopened.delete(ID).unwrap());
        assert!(!reopened.delete(ID).unwrap());
        assert!(reopened.all().unwrap().is_empty());
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn fs_store_rejects_ids_that_are_not_tenant_ids() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsTenantStore::open(dir.path()).unwrap();
        let mut bad = record(ID);
        bad.id = "../admin".into();
        assert!(matches!(store.put(&bad), Err(TenantError::InvalidId(_))));
        assert!(matches!(
            store.delete("../admin"),
            Err(TenantError::InvalidId(_))
        ));
    }

    #[test]
    fn fs_store_skips_unreadable_and_foreign_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsTenantStore::open(dir.path()).unwrap();
        store.put(&record(ID)).unwrap();
        let tenants = dir.path().join("tenants");
        fs::write(tenants.join("tn-ffffffffffffffff.json"), b"{not json").unwrap();
        fs::write(tenants.join("notes.txt"), b"hello").unwrap();
        // A valid record under someone else's file name.
        fs::write(
            tenants.join("tn-eeeeeeeeeeeeeeee.json"),
            serde_json::to_vec(&record(ID)).unwrap(),
        )
        .unwrap();
        assert_eq!(store.all().unwrap(), vec![record(ID)]);
    }

    #[test]
    fn fs_store_removes_partial_writes_on_open() {
        let dir = tempfile::tempdir().unwrap();
        drop(FsTenantStore::open(dir.path()).unwrap());
        fs::write(dir.path().join("tmp/1-0.partial"), b"half").unwrap();
        drop(FsTenantStore::open(dir.path()).unwrap());
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }

    #[cfg(unix)]
    #[test]
    fn fs_store_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let store = FsTenantStore::open(dir.path()).unwrap();
        store.put(&record(ID)).unwrap();
        let meta = fs::metadata(dir.path().join(format!("tenants/{ID}.json"))).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn memory_store_round_trips() {
        let store = MemoryTenantStore::new();
        store.put(&record(ID)).unwrap();
        assert_eq!(store.all().unwrap(), vec![record(ID)]);
        assert!(store.delete(ID).unwrap());
        assert!(!store.delete(ID).unwrap());
    }
}
