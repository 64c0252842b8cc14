//! Quota limits (`Quotas`, `QuotasPatch`), the metered `Resource`s and the
//! `QuotaError` a refused request carries.

use serde::{Deserialize, Serialize};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The limits of one tenant.
///
/// Every field has a default, so a JSON body may name only some of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Quotas {
    /// Functions deployed at once. Default 100.
    pub max_functions: u32,
    /// Size of one module in bytes (checked per module, not summed). Default 64 MiB.
    pub max_module_bytes: u64,
    /// Live instances at once. Default 64.
    pub max_live_instances: u32,
    /// Guest linear memory summed over live instances, in bytes. Default 4 GiB.
    pub max_guest_memory_bytes: u64,
    /// Managed (GPU) memory held at once, in bytes. Default 4 GiB.
    pub max_gpu_memory_bytes: u64,
    /// Invocations running at once. Default 32.
    pub max_concurrent_invocations: u32,
    /// Sustained request rate; 0 means unlimited. Default 1000.
    pub requests_per_second: u32,
    /// Requests that may arrive at once after an idle period (the bucket size).
    /// A value of 0 with a non-zero rate acts as 1. Default 2000.
    pub burst: u32,
    /// Deploys (compiles) in progress at once. Default 2.
    pub max_concurrent_deploys: u32,
    /// Bytes of modules and snapshots the tenant may keep on disk, summed. `None` (the
    /// default, and absent in JSON): the server's `--max-stored-bytes-per-tenant`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_stored_bytes: Option<u64>,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            max_functions: 100,
            max_module_bytes: 64 * MIB,
            max_live_instances: 64,
            max_guest_memory_bytes: 4 * GIB,
            max_gpu_memory_bytes: 4 * GIB,
            max_concurrent_invocations: 32,
            requests_per_second: 1000,
            burst: 2000,
            max_concurrent_deploys: 2,
            max_stored_bytes: None,
        }
    }
}

/// A partial update of [`Quotas`]: `None` keeps the current value.
///
/// Unknown fields are rejected, so a misspelt quota in a request body is an
/// error rather than a silent no-op (do not `#[serde(flatten)]` it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotasPatch {
    /// New [`Quotas::max_functions`].
    pub max_functions: Option<u32>,
    /// New [`Quotas::max_module_bytes`].
    pub max_module_bytes: Option<u64>,
    /// New [`Quotas::max_live_instances`].
    pub max_live_instances: Option<u32>,
    /// New [`Quotas::max_guest_memory_bytes`].
    pub max_guest_memory_bytes: Option<u64>,
    /// New [`Quotas::max_gpu_memory_bytes`].
    pub max_gpu_memory_bytes: Option<u64>,
    /// New [`Quotas::max_concurrent_invocations`].
    pub max_concurrent_invocations: Option<u32>,
    /// New [`Quotas::requests_per_second`].
    pub requests_per_second: Option<u32>,
    /// New [`Quotas::burst`].
    pub burst: Option<u32>,
    /// New [`Quotas::max_concurrent_deploys`].
    pub max_concurrent_deploys: Option<u32>,
    /// New [`Quotas::max_stored_bytes`].
    pub max_stored_bytes: Option<u64>,
}

impl QuotasPatch {
    /// Whether the patch changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == QuotasPatch::default()
    }
}

impl Quotas {
    /// Overwrites every field that `patch` sets.
    pub fn apply(&mut self, patch: &QuotasPatch) {
        let QuotasPatch {
            max_functions,
            max_module_bytes,
            max_live_instances,
            max_guest_memory_bytes,
            max_gpu_memory_bytes,
            max_concurrent_invocations,
            requests_per_second,
            burst,
            max_concurrent_deploys,
            max_stored_bytes,
        } = *patch;
        set(&mut self.max_functions, max_functions);
        set(&mut self.max_module_bytes, max_module_bytes);
        set(&mut self.max_live_instances, max_live_instances);
        set(&mut self.max_guest_memory_bytes, max_guest_memory_bytes);
        set(&mut self.max_gpu_memory_bytes, max_gpu_memory_bytes);
        set(
            &mut self.max_concurrent_invocations,
            max_concurrent_invocations,
        );
        set(&mut self.requests_per_second, requests_per_second);
        set(&mut self.burst, burst);
        set(&mut self.max_concurrent_deploys, max_concurrent_deploys);
        if max_stored_bytes.is_some() {
            self.max_stored_bytes = max_stored_bytes;
        }
    }

    /// The limit that applies to `resource`.
    pub fn limit(&self, resource: Resource) -> u64 {
        match resource {
            Resource::Functions => u64::from(self.max_functions),
            Resource::ModuleBytes => self.max_module_bytes,
            Resource::LiveInstances => u64::from(self.max_live_instances),
            Resource::GuestMemoryBytes => self.max_guest_memory_bytes,
            Resource::GpuMemoryBytes => self.max_gpu_memory_bytes,
            Resource::ConcurrentInvocations => u64::from(self.max_concurrent_invocations),
            Resource::ConcurrentDeploys => u64::from(self.max_concurrent_deploys),
        }
    }
}

fn set<T: Copy>(field: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *field = v;
    }
}

/// How a tenant's GPU work is separated from other tenants', as recorded for
/// the tenant. This crate only stores it; the API passes it to the runtime
/// (`Runtime::set_tenant_gpu_isolation`), whose GPU backend enforces it.
///
/// The names are older than the GPU crate's `GpuIsolation` and do not pair
/// with its variants one to one: the default, [`SharedContextOwnStream`],
/// asks for nothing of the tenant's own, and the tenant gets the server-wide
/// level (`serve --gpu-isolation`, `stream` unless set to `context`);
/// [`OwnContext`] gives the tenant a CUDA context of its own whatever the
/// server-wide level. A tenant can thus raise its isolation above the
/// server's, never lower it. The serialised names stay as they are (they are
/// in stored records and in the API).
///
/// [`SharedContextOwnStream`]: GpuIsolation::SharedContextOwnStream
/// [`OwnContext`]: GpuIsolation::OwnContext
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuIsolation {
    /// The server-wide level: a stream of its own in the CUDA context all such
    /// tenants share, unless the server gives every tenant a context
    /// (`--gpu-isolation context`).
    #[default]
    SharedContextOwnStream,
    /// A CUDA context of its own (with a stream in it), whatever the
    /// server-wide level.
    OwnContext,
}

/// A metered resource of a tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    /// Deployed functions (a count that persists while the functions exist).
    Functions,
    /// Size of one module: checked per module, never summed.
    ModuleBytes,
    /// Live instances.
    LiveInstances,
    /// Guest linear memory summed over live instances.
    GuestMemoryBytes,
    /// Managed (GPU) memory.
    GpuMemoryBytes,
    /// Invocations running at once.
    ConcurrentInvocations,
    /// Deploys in progress at once (held by the deploy's work, not its
    /// connection).
    ConcurrentDeploys,
}

impl Resource {
    /// Every resource, in discriminant order.
    pub const ALL: [Resource; 7] = [
        Resource::Functions,
        Resource::ModuleBytes,
        Resource::LiveInstances,
        Resource::GuestMemoryBytes,
        Resource::GpuMemoryBytes,
        Resource::ConcurrentInvocations,
        Resource::ConcurrentDeploys,
    ];

    /// The name of the quota that limits this resource, as used in errors and
    /// the `quota` metrics label.
    pub fn quota_name(self) -> &'static str {
        match self {
            Resource::Functions => "max_functions",
            Resource::ModuleBytes => "max_module_bytes",
            Resource::LiveInstances => "max_live_instances",
            Resource::GuestMemoryBytes => "max_guest_memory_bytes",
            Resource::GpuMemoryBytes => "max_gpu_memory_bytes",
            Resource::ConcurrentInvocations => "max_concurrent_invocations",
            Resource::ConcurrentDeploys => "max_concurrent_deploys",
        }
    }
}

/// Name of the rate quota in [`QuotaError::quota`] and the metrics label.
pub const RATE_QUOTA_NAME: &str = "requests_per_second";

/// What kind of limit refused a request; the API maps it to a status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuotaKind {
    /// Too many requests per second: retry later (429).
    Rate,
    /// Too much in use right now (instances, memory, invocations): retry later (429).
    Concurrency,
    /// The request alone is larger than the limit: retrying cannot help (403).
    Size,
    /// Too many persistent objects (functions) (409).
    Count,
}

/// A request refused by a quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{quota} quota exceeded: limit {limit}")]
pub struct QuotaError {
    /// The quota's name, a field name of [`Quotas`].
    pub quota: &'static str,
    /// The quota's value when the request was refused.
    pub limit: u64,
    /// What kind of limit it is.
    pub kind: QuotaKind,
    /// Seconds after which a retry may succeed, for `Rate` and `Concurrency`.
    pub retry_after_s: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documented_values() {
        let q = Quotas::default();
        assert_eq!(q.max_functions, 100);
        assert_eq!(q.max_module_bytes, 64 << 20);
        assert_eq!(q.max_live_instances, 64);
        assert_eq!(q.max_guest_memory_bytes, 4 << 30);
        assert_eq!(q.max_gpu_memory_bytes, 4 << 30);
        assert_eq!(q.max_concurrent_invocations, 32);
        assert_eq!(q.requests_per_second, 1000);
        assert_eq!(q.burst, 2000);
        assert_eq!(q.max_concurrent_deploys, 2);
    }

    #[test]
    fn partial_json_fills_in_defaults() {
        let q: Quotas = serde_json::from_str(r#"{"max_functions": 3}"#).unwrap();
        assert_eq!(q.max_functions, 3);
        assert_eq!(q.burst, 2000);
    }

    #[test]
    fn apply_changes_only_fields_the_patch_sets() {
        let patch: QuotasPatch =
            serde_json::from_str(r#"{"max_live_instances": 2, "burst": 5}"#).unwrap();
        assert!(!patch.is_empty());
        assert!(serde_json::from_str::<QuotasPatch>(r#"{"max_function": 1}"#).is_err());
        assert!(serde_json::from_str::<QuotasPatch>("{}")
            .unwrap()
            .is_empty());
        let mut q = Quotas::default();
        q.apply(&patch);
        assert_eq!(q.max_live_instances, 2);
        assert_eq!(q.burst, 5);
        assert_eq!(q.max_functions, 100);
        let mut same = q.clone();
        same.apply(&QuotasPatch::default());
        assert_eq!(same, q);
    }

    #[test]
    fn isolation_serialises_in_snake_case() {
        let s = serde_json::to_string(&GpuIsolation::SharedContextOwnStream).unwrap();
        assert_eq!(s, r#""shared_context_own_stream""#);
        let own: GpuIsolation = serde_json::from_str(r#""own_context""#).unwrap();
        assert_eq!(own, GpuIsolation::OwnContext);
        assert_eq!(
            GpuIsolation::default(),
            GpuIsolation::SharedContextOwnStream
        );
    }

    #[test]
    fn error_message_names_the_quota_and_limit() {
        let e = QuotaError {
            quota: "max_functions",
            limit: 7,
            kind: QuotaKind::Count,
            retry_after_s: None,
        };
        assert_eq!(e.to_string(), "max_functions quota exceeded: limit 7");
    }
}
