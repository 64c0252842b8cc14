//! Tenants of a TensorWasm server: who they are, how they authenticate, and
//! how much of the machine each may use.
//!
//! - [`TenantRegistry`] holds every tenant and bearer token, persisted through
//!   a [`TenantStore`] ([`FsTenantStore`] on disk, [`MemoryTenantStore`] in
//!   tests). Tokens are kept only as SHA-256 hashes; a secret is returned once,
//!   when the token is created ([`NewToken`], [`Bootstrap`]).
//! - [`TenantRegistry::authenticate`] maps a bearer secret to a [`Principal`]:
//!   the administrator or a tenant.
//! - [`Tenant`] is the live state of one tenant: its [`Quotas`], a lock-free
//!   token bucket ([`Tenant::check_rate`]) and usage counters per
//!   [`Resource`]. [`Tenant::acquire`] returns a [`QuotaGuard`] that gives the
//!   usage back when dropped, whatever way the work ends.
//! - A refusal is a [`QuotaError`] whose [`QuotaKind`] tells the API which
//!   status to answer with.
//! - [`TenantMetrics`] exports per-tenant series labelled by tenant id.
//!
//! ```
//! use std::sync::Arc;
//! use tensor_wasm_tenant::{
//!     GpuIsolation, MemoryTenantStore, Principal, QuotaKind, Quotas, Resource, TenantMetrics,
//!     TenantRegistry,
//! };
//!
//! let registry = TenantRegistry::open(
//!     Arc::new(MemoryTenantStore::new()),
//!     TenantMetrics::register(&prometheus::Registry::new())?,
//! )?;
//! let boot = registry.bootstrap()?.expect("first start");
//! assert!(matches!(registry.authenticate(&boot.admin_token), Some(Principal::Admin)));
//!
//! let quotas = Quotas { max_concurrent_invocations: 1, ..Quotas::default() };
//! let (info, token) = registry.create_tenant("acme", quotas, GpuIsolation::OwnContext)?;
//! let Some(Principal::Tenant(tenant)) = registry.authenticate(&token.secret) else {
//!     panic!("a fresh token authenticates");
//! };
//! assert_eq!(tenant.id(), info.id);
//!
//! tenant.check_rate()?;
//! let running = tenant.acquire(Resource::ConcurrentInvocations, 1)?;
//! let refused = tenant.acquire(Resource::ConcurrentInvocations, 1).unwrap_err();
//! assert_eq!(refused.kind, QuotaKind::Concurrency);
//! drop(running);
//! assert_eq!(tenant.usage(Resource::ConcurrentInvocations), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod metrics;
mod quota;
mod registry;
mod store;
mod tenant;
mod token;

pub use error::TenantError;
pub use metrics::TenantMetrics;
pub use quota::{
    GpuIsolation, QuotaError, QuotaKind, Quotas, QuotasPatch, Resource, RATE_QUOTA_NAME,
};
pub use registry::{
    is_valid_tenant_name, Bootstrap, Principal, TenantInfo, TenantRegistry, MAX_LABEL_LEN,
    MAX_NAME_LEN,
};
pub use store::{
    FsTenantStore, MemoryTenantStore, StoredAdmin, StoredTenant, StoredToken, TenantStore,
};
pub use tenant::{QuotaGuard, Tenant};
pub use token::{constant_time_eq, NewToken, TokenInfo, SECRET_LEN, SECRET_PREFIX};

/// Name of the tenant that [`TenantRegistry::bootstrap`] creates.
pub const DEFAULT_TENANT_NAME: &str = "default";

/// Whether `id` is a tenant id: `tn-` and 16 lowercase hex digits.
pub fn is_valid_tenant_id(id: &str) -> bool {
    id.len() == 19
        && id.starts_with("tn-")
        && id[3..]
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_ids_are_tn_and_sixteen_lowercase_hex_digits() {
        assert!(is_valid_tenant_id("tn-0123456789abcdef"));
        assert!(!is_valid_tenant_id("tn-0123456789ABCDEF"));
        assert!(!is_valid_tenant_id("tn-0123456789abcde"));
        assert!(!is_valid_tenant_id("tn-0123456789abcdef0"));
        assert!(!is_valid_tenant_id("tk-0123456789abcdef"));
        assert!(!is_valid_tenant_id("tn-0123456789abcdeg"));
        assert!(!is_valid_tenant_id("tn-0123456789abcdé"));
        assert!(!is_valid_tenant_id(""));
    }
}
