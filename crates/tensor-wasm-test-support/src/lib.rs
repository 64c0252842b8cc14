//! Test harnesses shared by the integration tests and benches of the
//! workspace, so that no test file carries its own copy.
//!
//! - [`app`]: the API router in-process over a fresh runtime
//!   ([`app::InsecureApp`], [`app::EnforcedApp`]) and request helpers;
//! - [`gate`]: a function store that holds a deploy's or a delete's write
//!   until the test lets it go ([`gate::GatedStore`]);
//! - [`serve`]: the real `tensor-wasm serve` binary on a loopback port
//!   ([`serve::ServeProcess`]);
//! - [`toolchains`]: the component toolchains under `.tools/` and the `wasi:http` WIT the
//!   server implements;
//! - [`wait`]: bounded polling for a state ([`wait::wait_until`]) instead of
//!   `sleep` as synchronisation, and [`wait::assert_holds_for`] for a property
//!   that must keep holding over a window;
//! - [`pace`]: slowness on purpose (a slow client, a load tool's back-off);
//! - [`guests`]: the example guests, the C guests and inline WASI commands;
//! - [`servers`]: real PostgreSQL and S3 servers on loopback for the shared-store tests.
//!
//! Only ever a dev-dependency (`publish = false`), and only of integration
//! tests and benches: a crate's unit tests in `src/` would see a second copy
//! of its own types through this crate.
//!
//! ```no_run
//! use std::time::Duration;
//! use tensor_wasm_test_support::app::InsecureApp;
//! use tensor_wasm_test_support::wait::wait_until_async;
//!
//! # async fn demo() {
//! let h = InsecureApp::new();
//! let id = h.deploy("calc.wat", "name=calc").await;
//! let r = h
//!     .invoke(&id, serde_json::json!({"export": "add", "args": [1, 2]}))
//!     .await;
//! assert_eq!(r.json(), serde_json::json!({"results": [3]}));
//! let tenant = h.tenant();
//! wait_until_async(Duration::from_secs(10), "no invocation is in flight", || {
//!     tenant.usage(tensor_wasm_tenant::Resource::ConcurrentInvocations) == 0
//! })
//! .await;
//! # }
//! ```

pub mod app;
pub mod gate;
pub mod guests;
pub mod history;
pub mod nn_cases;
pub mod pace;
pub mod serve;
pub mod servers;
pub mod toolchains;
pub mod wait;
