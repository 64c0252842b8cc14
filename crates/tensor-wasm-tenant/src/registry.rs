//! `TenantRegistry`: the set of tenants and tokens, persisted through a
//! `TenantStore`, with lock-light lookups for the request path.
//!
//! Mutations (create, update, delete, tokens, bootstrap) are serialised by one
//! mutex and written to the store before memory changes, so a failed write
//! leaves the registry as it was. Reads on the request path
//! ([`TenantRegistry::lookup`], [`TenantRegistry::authenticate`]) only take
//! the read side of an `RwLock` around a `HashMap`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::store::{StoredAdmin, StoredTenant, StoredToken, TenantStore};
use crate::token::{
    constant_time_eq, hash_secret, new_secret, new_tenant_id, new_token_id, parse_hash, SecretHash,
};
use crate::{
    GpuIsolation, NewToken, Quotas, QuotasPatch, Tenant, TenantError, TenantMetrics, TokenInfo,
    DEFAULT_TENANT_NAME,
};

/// Longest tenant name.
pub const MAX_NAME_LEN: usize = 64;
/// Longest token label.
pub const MAX_LABEL_LEN: usize = 128;

/// Label of the tokens that [`TenantRegistry::bootstrap`] creates.
const BOOTSTRAP_LABEL: &str = "bootstrap";
/// Label of the token that [`TenantRegistry::create_tenant`] creates.
const INITIAL_LABEL: &str = "initial";

/// What is known about a tenant; never contains a secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TenantInfo {
    /// `tn-` and 16 lowercase hex digits.
    pub id: String,
    /// Unique human-readable name.
    pub name: String,
    /// Current limits.
    pub quotas: Quotas,
    /// How its GPU work is isolated.
    pub gpu_isolation: GpuIsolation,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Its tokens, revoked ones included.
    pub tokens: Vec<TokenInfo>,
    /// Whether it may deploy and run raw-kernel (raw PTX, CUDA C++)
    /// functions; granted and revoked by the admin only.
    pub raw_ptx: bool,
}

/// Who presented a bearer token.
#[derive(Clone, Debug)]
pub enum Principal {
    /// The administrator.
    Admin,
    /// A tenant.
    Tenant(Arc<Tenant>),
}

/// Secrets created by the first start, shown once.
#[derive(Clone)]
pub struct Bootstrap {
    /// The admin token's secret.
    pub admin_token: String,
    /// The tenant named [`DEFAULT_TENANT_NAME`].
    pub tenant: TenantInfo,
    /// A secret of that tenant.
    pub tenant_token: String,
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bootstrap")
            .field("admin_token", &"<redacted>")
            .field("tenant", &self.tenant)
            .field("tenant_token", &"<redacted>")
            .finish()
    }
}

/// Whom a token hash belongs to.
enum Credential {
    Admin,
    Tenant(Arc<Tenant>),
}

/// The persisted state, guarded by the writer mutex.
struct Records {
    tenants: BTreeMap<String, StoredTenant>,
    admin: Option<StoredAdmin>,
}

/// All tenants and tokens. `Send + Sync`; share it as `Arc<TenantRegistry>`.
pub struct TenantRegistry {
    store: Arc<dyn TenantStore>,
    metrics: TenantMetrics,
    records: Mutex<Records>,
    live: RwLock<HashMap<String, Arc<Tenant>>>,
    credentials: RwLock<HashMap<SecretHash, Credential>>,
    /// Replicas sharing the tenants' rate and concurrency limits ([`Tenant::set_replica_share`]).
    replicas: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for TenantRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantRegistry")
            .field("tenants", &read(&self.live).len())
            .finish_non_exhaustive()
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether `name` is 1 to 64 characters of `A-Z a-z 0-9 . _ -`.
pub fn is_valid_tenant_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

fn check_label(label: &str) -> Result<(), TenantError> {
    if label.chars().count() > MAX_LABEL_LEN || label.chars().any(char::is_control) {
        return Err(TenantError::InvalidLabel);
    }
    Ok(())
}

fn info_of(record: &StoredTenant) -> TenantInfo {
    TenantInfo {
        id: record.id.clone(),
        name: record.name.clone(),
        quotas: record.quotas.clone(),
        gpu_isolation: record.gpu_isolation,
        created_at_ms: record.created_at_ms,
        tokens: record.tokens.iter().map(StoredToken::info).collect(),
        raw_ptx: record.raw_ptx,
    }
}

/// A fresh token with its persisted form.
fn mint_token(label: &str) -> Result<(StoredToken, NewToken, SecretHash), TenantError> {
    let secret = new_secret()?;
    let hash = hash_secret(&secret);
    let stored = StoredToken {
        id: new_token_id()?,
        label: label.to_owned(),
        created_at_ms: now_ms(),
        revoked: false,
        sha256: hex::encode(hash),
    };
    let token = NewToken {
        info: stored.info(),
        secret,
    };
    Ok((stored, token, hash))
}

impl TenantRegistry {
    /// Loads every tenant and the admin record from `store`.
    ///
    /// Tokens whose stored hash is malformed are skipped with an error log.
    pub fn open(store: Arc<dyn TenantStore>, metrics: TenantMetrics) -> Result<Self, TenantError> {
        let admin = store.admin()?;
        let mut tenants = BTreeMap::new();
        let mut live = HashMap::new();
        let mut credentials = HashMap::new();
        if let Some(admin) = &admin {
            match parse_hash(&admin.token_sha256) {
                Some(hash) => {
                    credentials.insert(hash, Credential::Admin);
                }
                None => tracing::error!("admin record holds a malformed token hash; ignored"),
            }
        }
        for record in store.all()? {
            let tenant = Arc::new(Tenant::new(
                record.id.clone(),
                record.name.clone(),
                record.quotas.clone(),
                record.gpu_isolation,
                record.created_at_ms,
                metrics.series(&record.id),
            ));
            tenant.set_raw_ptx(record.raw_ptx);
            for token in record.tokens.iter().filter(|t| !t.revoked) {
                match parse_hash(&token.sha256) {
                    Some(hash) => {
                        credentials.insert(hash, Credential::Tenant(Arc::clone(&tenant)));
                    }
                    None => tracing::error!(
                        tenant = %record.id,
                        token = %token.id,
                        "token record holds a malformed hash; ignored"
                    ),
                }
            }
            live.insert(record.id.clone(), tenant);
            tenants.insert(record.id.clone(), record);
        }
        tracing::info!(
            tenants = tenants.len(),
            admin = admin.is_some(),
            "tenant registry loaded"
        );
        Ok(TenantRegistry {
            store,
            metrics,
            records: Mutex::new(Records { tenants, admin }),
            live: RwLock::new(live),
            credentials: RwLock::new(credentials),
            replicas: std::sync::atomic::AtomicU64::new(1),
        })
    }

    /// Sets how many replicas share every tenant's rate and concurrency limits (the live
    /// replicas of a shared store; 1 alone): each tenant's limits here become `1/replicas` of
    /// its quotas, rounded up ([`Tenant::set_replica_share`]). Tenants created or loaded later
    /// get the same share.
    pub fn set_replicas(&self, replicas: u64) {
        let replicas = replicas.max(1);
        let before = self
            .replicas
            .swap(replicas, std::sync::atomic::Ordering::AcqRel);
        if before != replicas {
            tracing::info!(
                replicas,
                "tenant rate and concurrency limits are shared by replicas"
            );
        }
        for tenant in read(&self.live).values() {
            tenant.set_replica_share(replicas);
        }
    }

    /// How many replicas share the tenants' rate and concurrency limits.
    pub fn replicas(&self) -> u64 {
        self.replicas.load(std::sync::atomic::Ordering::Acquire)
    }

    fn records(&self) -> MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// On the first start (no admin record), creates the admin token and a
    /// tenant named [`DEFAULT_TENANT_NAME`] with one token, and returns their
    /// secrets, which are never shown again. `None` when an admin exists.
    ///
    /// If a tenant named `default` already exists (a start that crashed
    /// half-way through bootstrapping), it gets a new token instead of a twin.
    /// The admin record is written last, so bootstrapping is complete exactly
    /// when it exists.
    pub fn bootstrap(&self) -> Result<Option<Bootstrap>, TenantError> {
        let mut records = self.records();
        if records.admin.is_some() {
            return Ok(None);
        }
        let existing = records
            .tenants
            .values()
            .find(|t| t.name == DEFAULT_TENANT_NAME)
            .map(|t| t.id.clone());
        let (tenant, tenant_token) = match existing {
            Some(id) => {
                let token = self.create_token_locked(&mut records, &id, BOOTSTRAP_LABEL)?;
                (info_of(&records.tenants[&id]), token)
            }
            None => self.create_tenant_locked(
                &mut records,
                DEFAULT_TENANT_NAME,
                Quotas::default(),
                GpuIsolation::default(),
                BOOTSTRAP_LABEL,
            )?,
        };
        let admin_token = new_secret()?;
        let hash = hash_secret(&admin_token);
        let admin = StoredAdmin {
            created_at_ms: now_ms(),
            token_sha256: hex::encode(hash),
        };
        self.store.put_admin(&admin)?;
        records.admin = Some(admin);
        write(&self.credentials).insert(hash, Credential::Admin);
        tracing::info!(tenant = %tenant.id, "bootstrapped the admin token and the default tenant");
        Ok(Some(Bootstrap {
            admin_token,
            tenant,
            tenant_token: tenant_token.secret,
        }))
    }

    /// Creates a tenant with one token (labelled `initial`), returning the
    /// token's secret, which is never shown again.
    pub fn create_tenant(
        &self,
        name: &str,
        quotas: Quotas,
        isolation: GpuIsolation,
    ) -> Result<(TenantInfo, NewToken), TenantError> {
        let mut records = self.records();
        self.create_tenant_locked(&mut records, name, quotas, isolation, INITIAL_LABEL)
    }

    fn create_tenant_locked(
        &self,
        records: &mut Records,
        name: &str,
        quotas: Quotas,
        isolation: GpuIsolation,
        label: &str,
    ) -> Result<(TenantInfo, NewToken), TenantError> {
        if !is_valid_tenant_name(name) {
            return Err(TenantError::InvalidName(name.to_owned()));
        }
        if records.tenants.values().any(|t| t.name == name) {
            return Err(TenantError::NameTaken(name.to_owned()));
        }
        let id = loop {
            let id = new_tenant_id()?;
            if !records.tenants.contains_key(&id) {
                break id;
            }
        };
        let (stored_token, token, hash) = mint_token(label)?;
        let record = StoredTenant {
            id: id.clone(),
            name: name.to_owned(),
            quotas,
            gpu_isolation: isolation,
            created_at_ms: now_ms(),
            tokens: vec![stored_token],
            raw_ptx: false,
        };
        self.store.put(&record)?;
        let tenant = Arc::new(Tenant::new(
            id.clone(),
            record.name.clone(),
            record.quotas.clone(),
            record.gpu_isolation,
            record.created_at_ms,
            self.metrics.series(&id),
        ));
        tenant.set_replica_share(self.replicas());
        let info = info_of(&record);
        records.tenants.insert(id.clone(), record);
        write(&self.live).insert(id.clone(), Arc::clone(&tenant));
        write(&self.credentials).insert(hash, Credential::Tenant(tenant));
        tracing::info!(tenant = %id, name, "tenant created");
        Ok((info, token))
    }

    /// Every tenant, oldest first.
    pub fn list(&self) -> Vec<TenantInfo> {
        let records = self.records();
        let mut all: Vec<TenantInfo> = records.tenants.values().map(info_of).collect();
        all.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        all
    }

    /// The tenant with this id, if any.
    pub fn info(&self, id: &str) -> Option<TenantInfo> {
        self.records().tenants.get(id).map(info_of)
    }

    /// Number of tenants.
    pub fn len(&self) -> usize {
        read(&self.live).len()
    }

    /// Whether there is no tenant.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Changes the quotas that `patch` sets and, with `name`, the name.
    /// Running holders of the tenant see the new limits at once; usage above a
    /// lowered limit stays until released.
    pub fn update(
        &self,
        id: &str,
        patch: &QuotasPatch,
        name: Option<&str>,
    ) -> Result<TenantInfo, TenantError> {
        let mut records = self.records();
        if !records.tenants.contains_key(id) {
            return Err(TenantError::NotFound(id.to_owned()));
        }
        if let Some(name) = name {
            if !is_valid_tenant_name(name) {
                return Err(TenantError::InvalidName(name.to_owned()));
            }
            if records
                .tenants
                .values()
                .any(|t| t.name == name && t.id != id)
            {
                return Err(TenantError::NameTaken(name.to_owned()));
            }
        }
        let record = self.store.modify(id, &mut |record| {
            if let Some(name) = name {
                record.name = name.to_owned();
            }
            record.quotas.apply(patch);
            Ok(())
        })?;
        let info = info_of(&record);
        self.adopt(&mut records, record);
        tracing::info!(tenant = %id, "tenant updated");
        Ok(info)
    }

    /// Grants (`true`) or revokes (`false`) the raw-kernel capability of a
    /// tenant: whether its functions may load raw PTX or CUDA C++. Durable
    /// when it returns; holders of the tenant's `Arc<Tenant>` see it at once
    /// ([`Tenant::raw_ptx`]). Only the admin may call this (the API checks).
    pub fn set_raw_ptx(&self, id: &str, granted: bool) -> Result<TenantInfo, TenantError> {
        let mut records = self.records();
        if !records.tenants.contains_key(id) {
            return Err(TenantError::NotFound(id.to_owned()));
        }
        let record = self.store.modify(id, &mut |record| {
            record.raw_ptx = granted;
            Ok(())
        })?;
        let info = info_of(&record);
        self.adopt(&mut records, record);
        tracing::info!(tenant = %id, granted, "raw-kernel capability changed");
        Ok(info)
    }

    /// Deletes a tenant, its tokens and its metric series; `false` if there
    /// was no such tenant. Holders of its `Arc<Tenant>` see
    /// [`Tenant::is_deleted`].
    pub fn delete(&self, id: &str) -> Result<bool, TenantError> {
        let mut records = self.records();
        let Some(record) = records.tenants.get(id) else {
            return Ok(false);
        };
        let hashes: Vec<SecretHash> = record
            .tokens
            .iter()
            .filter_map(|t| parse_hash(&t.sha256))
            .collect();
        self.store.delete(id)?;
        records.tenants.remove(id);
        {
            let mut credentials = write(&self.credentials);
            for hash in &hashes {
                credentials.remove(hash);
            }
        }
        if let Some(tenant) = write(&self.live).remove(id) {
            tenant.mark_deleted();
        }
        self.metrics.remove(id);
        tracing::info!(tenant = %id, "tenant deleted");
        Ok(true)
    }

    /// Adds a token to a tenant and returns its secret, which is never shown again.
    pub fn create_token(&self, id: &str, label: &str) -> Result<NewToken, TenantError> {
        let mut records = self.records();
        self.create_token_locked(&mut records, id, label)
    }

    fn create_token_locked(
        &self,
        records: &mut Records,
        id: &str,
        label: &str,
    ) -> Result<NewToken, TenantError> {
        check_label(label)?;
        if !records.tenants.contains_key(id) {
            return Err(TenantError::NotFound(id.to_owned()));
        }
        let (stored_token, token, _hash) = mint_token(label)?;
        let record = self.store.modify(id, &mut |record| {
            record.tokens.push(stored_token.clone());
            Ok(())
        })?;
        self.adopt(records, record);
        tracing::info!(tenant = %id, token = %token.info.id, "token created");
        Ok(token)
    }

    /// Revokes a token: it stops authenticating at once. `Ok(true)` when the
    /// tenant has a token with this id (revoking twice is not an error),
    /// `Ok(false)` when it has none, `NotFound` when there is no such tenant.
    pub fn revoke_token(&self, id: &str, token_id: &str) -> Result<bool, TenantError> {
        let mut records = self.records();
        if !records.tenants.contains_key(id) {
            return Err(TenantError::NotFound(id.to_owned()));
        }
        let mut found = false;
        let record = self.store.modify(id, &mut |record| {
            found = false;
            if let Some(token) = record.tokens.iter_mut().find(|t| t.id == token_id) {
                found = true;
                token.revoked = true;
            }
            Ok(())
        })?;
        self.adopt(&mut records, record);
        if found {
            tracing::info!(tenant = %id, token = %token_id, "token revoked");
        }
        Ok(found)
    }

    /// Brings tenant `id` up to date with the store, for a replica that follows a shared
    /// store's change log (another replica created, changed or deleted the tenant or its
    /// tokens): its credentials become the stored ones, so a token revoked or a tenant deleted
    /// elsewhere stops authenticating here; its name, quotas and capability follow the record;
    /// a tenant gone from the store is deleted here. Usage counters stay as they are.
    ///
    /// # Errors
    /// The store's error; the registry is then unchanged.
    pub fn reload_tenant(&self, id: &str) -> Result<(), TenantError> {
        let mut records = self.records();
        match self.store.get(id)? {
            Some(record) => self.adopt(&mut records, record),
            None => {
                write(&self.credentials).retain(
                    |_, credential| !matches!(credential, Credential::Tenant(t) if t.id() == id),
                );
                records.tenants.remove(id);
                if let Some(tenant) = write(&self.live).remove(id) {
                    tenant.mark_deleted();
                    self.metrics.remove(id);
                }
            }
        }
        Ok(())
    }

    /// Makes `record`, as the store holds it now, this registry's view of its tenant: its
    /// live tenant's name, quotas and capability, and its credentials (exactly its tokens
    /// that are not revoked). Usage counters stay as they are.
    fn adopt(&self, records: &mut Records, record: StoredTenant) {
        let id = record.id.clone();
        let mut credentials = write(&self.credentials);
        credentials
            .retain(|_, credential| !matches!(credential, Credential::Tenant(t) if t.id() == id));
        let tenant = write(&self.live)
            .entry(id.clone())
            .or_insert_with(|| {
                Arc::new(Tenant::new(
                    record.id.clone(),
                    record.name.clone(),
                    record.quotas.clone(),
                    record.gpu_isolation,
                    record.created_at_ms,
                    self.metrics.series(&record.id),
                ))
            })
            .clone();
        tenant.set_replica_share(self.replicas());
        tenant.set_profile(&record.name, &record.quotas);
        tenant.set_raw_ptx(record.raw_ptx);
        for token in record.tokens.iter().filter(|t| !t.revoked) {
            if let Some(hash) = parse_hash(&token.sha256) {
                credentials.insert(hash, Credential::Tenant(Arc::clone(&tenant)));
            }
        }
        records.tenants.insert(id, record);
    }

    /// Brings the admin credential up to date with the store (bootstrapped or replaced by
    /// another replica).
    ///
    /// # Errors
    /// The store's error; the registry is then unchanged.
    pub fn reload_admin(&self) -> Result<(), TenantError> {
        let mut records = self.records();
        let admin = self.store.admin()?;
        let mut credentials = write(&self.credentials);
        credentials.retain(|_, credential| !matches!(credential, Credential::Admin));
        if let Some(hash) = admin.as_ref().and_then(|a| parse_hash(&a.token_sha256)) {
            credentials.insert(hash, Credential::Admin);
        }
        records.admin = admin;
        Ok(())
    }

    /// Who a bearer secret belongs to; `None` for unknown and revoked tokens.
    ///
    /// The presented secret is hashed (SHA-256), the hash is looked up, and
    /// the match is confirmed by a constant-time comparison of the full hashes.
    pub fn authenticate(&self, bearer: &str) -> Option<Principal> {
        let presented = hash_secret(bearer);
        let credentials = read(&self.credentials);
        let (stored, credential) = credentials.get_key_value(&presented)?;
        if !constant_time_eq(stored, &presented) {
            return None;
        }
        Some(match credential {
            Credential::Admin => Principal::Admin,
            Credential::Tenant(tenant) => Principal::Tenant(Arc::clone(tenant)),
        })
    }

    /// The live state of a tenant, for the request path.
    pub fn lookup(&self, id: &str) -> Option<Arc<Tenant>> {
        read(&self.live).get(id).cloned()
    }

    /// Every live tenant, in no particular order.
    pub fn tenants(&self) -> Vec<Arc<Tenant>> {
        read(&self.live).values().cloned().collect()
    }

    /// The metrics the registry updates.
    pub fn metrics(&self) -> &TenantMetrics {
        &self.metrics
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryTenantStore;

    fn registry() -> TenantRegistry {
        TenantRegistry::open(
            Arc::new(MemoryTenantStore::new()),
            TenantMetrics::unregistered().unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn names_are_validated_and_unique() {
        let r = registry();
        for bad in ["", "has space", "slash/", &"x".repeat(65), "ünï"] {
            assert!(
                matches!(
                    r.create_tenant(bad, Quotas::default(), GpuIsolation::default()),
                    Err(TenantError::InvalidName(_))
                ),
                "{bad:?}"
            );
        }
        let (a, _) = r
            .create_tenant("acme", Quotas::default(), GpuIsolation::default())
            .unwrap();
        let (b, _) = r
            .create_tenant("Acme.dev_2-x", Quotas::default(), GpuIsolation::default())
            .unwrap();
        assert!(matches!(
            r.create_tenant("acme", Quotas::default(), GpuIsolation::default()),
            Err(TenantError::NameTaken(_))
        ));
        assert!(matches!(
            r.update(&b.id, &QuotasPatch::default(), Some("acme")),
            Err(TenantError::NameTaken(_))
        ));
        // Keeping one's own name is fine.
        r.update(&a.id, &QuotasPatch::default(), Some("acme"))
            .unwrap();
    }

    #[test]
    fn labels_are_validated() {
        let r = registry();
        let (a, _) = r
            .create_tenant("acme", Quotas::default(), GpuIsolation::default())
            .unwrap();
        assert!(matches!(
            r.create_token(&a.id, "line\nbreak"),
            Err(TenantError::InvalidLabel)
        ));
        assert!(matches!(
            r.create_token(&a.id, &"l".repeat(129)),
            Err(TenantError::InvalidLabel)
        ));
        r.create_token(&a.id, "").unwrap();
    }

    #[test]
    fn missing_tenants_are_reported() {
        let r = registry();
        let ghost = "tn-0000000000000000";
        assert!(matches!(
            r.update(ghost, &QuotasPatch::default(), None),
            Err(TenantError::NotFound(_))
        ));
        assert!(matches!(
            r.create_token(ghost, "x"),
            Err(TenantError::NotFound(_))
        ));
        assert!(matches!(
            r.revoke_token(ghost, "tk-000000000000"),
            Err(TenantError::NotFound(_))
        ));
        assert!(!r.delete(ghost).unwrap());
        assert!(!r.delete("../etc").unwrap());
        assert!(r.info(ghost).is_none());
        assert!(r.lookup(ghost).is_none());
    }

    #[test]
    fn debug_output_hides_bootstrap_secrets() {
        let r = registry();
        let boot = r.bootstrap().unwrap().unwrap();
        let text = format!("{boot:?}");
        assert!(!text.contains(&boot.admin_token));
        assert!(!text.contains(&boot.tenant_token));
    }
}
