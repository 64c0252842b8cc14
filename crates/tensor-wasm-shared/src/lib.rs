//! The shared store of TensorWasm replicas: every record in PostgreSQL, every blob (module
//! binaries, portable snapshot images) in S3-compatible object storage, so that several
//! `tensor-wasm serve` processes can serve the same functions (docs/scale-out.md).
//!
//! [`SharedStore`] implements [`tensor_wasm_runtime::FunctionStore`] over both:
//!
//! - PostgreSQL: function, snapshot and model records (their JSON encoding, as the embedded
//!   store writes them), the indexes of stored modules and model bytes, and a change log
//!   (`tw_changes`) that every change of a function or model record appends to in the same
//!   transaction, with a `NOTIFY tw_changes`;
//! - object storage: `modules/<sha256>.wasm`, `snapshots/<function>/<snapshot>.twsnap` and
//!   `models/<sha256>.onnx` under the configured bucket and prefix.
//!
//! Writes are ordered so that no record names a blob that is not stored yet: a module is stored
//! before the function record that names it, a snapshot's bytes before its record, a model's
//! bytes before its record (`models.rs`; a name is unique per tenant, so a second store of it
//! is refused in its insert). A crash in between leaves an unreferenced blob, never a dangling
//! record.
//!
//! The schema is versioned ([`migrate::migrate`], applied under an advisory lock by
//! [`SharedStore::connect`] and by `tensor-wasm migrate`).
//!
//! A replica keeps its cached records current by following the change log
//! ([`SharedStore::follow_changes`], `follow.rs`): `LISTEN` to wake at once, the log's sequence
//! number to catch up after a reconnect.
//!
//! Tenants, their hashed tokens and the administrator's hashed token are shared too
//! (`tenants.rs`, `tensor_wasm_tenant::TenantStore`), followed the same way.
//!
//! Asynchronous jobs are a durable queue in PostgreSQL (`jobs.rs`,
//! [`tensor_wasm_api::JobQueue`]): claimed with `FOR UPDATE SKIP LOCKED` under a lease, run
//! again by another replica when the lease of a replica that died ends.
//!
//! Each replica writes a heartbeat (`replicas.rs`, `tw_replicas`) and counts the live
//! replicas, which share every tenant's rate and concurrency limits.
//!
//! Orphaned blobs (modules no function names, snapshot images without a record, model bytes no
//! model names) are removed by [`SharedStore::collect_orphans`] (`orphans.rs`,
//! `tensor-wasm collect-orphans`) once older than a grace period.
//!
//! TLS to PostgreSQL (`tls.rs`): a database URL with `sslmode=require` is connected over
//! rustls and the server verified (chain and host name) against `sslrootcert=<PEM file>` or the
//! system's roots.

mod bridge;
mod error;
mod follow;
mod jobs;
mod metrics;
pub mod migrate;
mod models;
mod orphans;
mod pool;
mod replicas;
mod store;
mod tenants;
mod tls;

pub use error::SharedStoreError;
pub use follow::{Change, ChangeFollower, FollowOptions, Freshness, OnChange};
pub use metrics::SharedMetrics;
pub use orphans::Orphans;
pub use pool::PoolOptions;
pub use store::{BlobStoreConfig, SharedStore};
pub use tenants::BOOTSTRAP_LOCK_KEY;
