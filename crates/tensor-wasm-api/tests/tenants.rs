//! Tenants through the router with authentication enforced: the cross-tenant
//! matrix (also over the shared store on real PostgreSQL and S3 servers), quotas and their
//! release, the admin routes, tokens never stored in plain text.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use serde_json::{json, Value};
use tensor_wasm_shared::{BlobStoreConfig, SharedStore};
use tensor_wasm_tenant::Resource;
use tensor_wasm_test_support::app::EnforcedApp;
use tensor_wasm_test_support::servers::{Postgres, S3Server};
use tensor_wasm_test_support::wait::wait_until_async;
use tower::ServiceExt;

#[tokio::test]
async fn cross_tenant_matrix_denies_everything_and_changes_nothing() {
    cross_tenant_matrix(EnforcedApp::new()).await;
}

/// The same matrix with functions, snapshots, tenants and tokens in the shared store (real
/// PostgreSQL and S3 servers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_tenant_matrix_holds_on_the_shared_store() {
    let pg = Postgres::start();
    let s3 = S3Server::start();
    s3.create_bucket("tw-matrix");
    let blobs = BlobStoreConfig {
        url: "s3://tw-matrix/matrix".into(),
        endpoint: Some(s3.endpoint()),
        access_key_id: Some("tensor-wasm-test".into()),
        secret_access_key: Some("tensor-wasm-test".into()),
        region: Some("us-east-1".into()),
        allow_http: true,
    };
    let url = pg.create_database("matrix");
    let shared = tokio::task::spawn_blocking(move || SharedStore::connect(&url, &blobs))
        .await
        .unwrap()
        .unwrap();
    let shared = Arc::new(shared);
    let app = tokio::task::spawn_blocking(move || EnforcedApp::over_stores(shared.clone(), shared))
        .await
        .unwrap();
    cross_tenant_matrix(app).await;
}

/// The cross-tenant matrix over `s`: tenant B and callers without a valid token are refused
/// on every route of tenant A's resources, and A's state is unchanged afterwards.
async fn cross_tenant_matrix(s: EnforcedApp) {
    let (a_id, a) = s.tenant("alpha", json!({})).await;
    let (_, b) = s.tenant("beta", json!({})).await;
    let r = s.deploy(&a, "calc.wat", "name=calc").await;
    assert_eq!(r.status, StatusCode::CREATED);
    let f = r.json()["id"].as_str().unwrap().to_owned();
    let r = s.deploy(&a, "warm.wat", "name=warm").await;
    assert_eq!(r.status, StatusCode::CREATED);
    let w = r.json()["id"].as_str().unwrap().to_owned();
    let r = s
        .as_token(
            &a,
            Method::POST,
            &format!("/functions/{w}/snapshots"),
            json!({"init_export": "init"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let snap = r.json()["id"].as_str().unwrap().to_owned();

    // A revoked token of A.
    let r = s
        .as_token(
            &s.admin,
            Method::POST,
            &format!("/tenants/{a_id}/tokens"),
            json!({"label": "old"}),
        )
        .await;
    let revoked = r.json()["token"].as_str().unwrap().to_owned();
    let revoked_id = r.json()["token_id"].as_str().unwrap().to_owned();
    assert_eq!(
        s.invoke(&revoked, &f, "add", json!([1, 1])).await.status,
        StatusCode::OK
    );
    let r = s
        .as_token(
            &s.admin,
            Method::DELETE,
            &format!("/tenants/{a_id}/tokens/{revoked_id}"),
            Value::Null,
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);

    // B with its own token, on A's function: 404 everywhere, never 403.
    let list = s.as_token(&b, Method::GET, "/functions", Value::Null).await;
    assert_eq!(list.json()["functions"], json!([]));
    for (method, uri, body) in [
        (Method::GET, format!("/functions/{f}"), Value::Null),
        (
            Method::POST,
            format!("/functions/{f}/invoke"),
            json!({"export": "add", "args": [1, 2]}),
        ),
        (Method::DELETE, format!("/functions/{f}"), Value::Null),
        (
            Method::GET,
            format!("/functions/{w}/snapshots"),
            Value::Null,
        ),
        (
            Method::POST,
            format!("/functions/{w}/snapshots"),
            json!({"init_export": "init"}),
        ),
        (
            Method::DELETE,
            format!("/functions/{w}/snapshots/{snap}"),
            Value::Null,
        ),
        (
            Method::PATCH,
            format!("/functions/{w}"),
            json!({"start_from_snapshot": null}),
        ),
    ] {
        let r = s.as_token(&b, method.clone(), &uri, body.clone()).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (StatusCode::NOT_FOUND, "not_found"),
            "{method} {uri}"
        );
        // No token, a revoked token, malformed headers: 401.
        for auth in [
            None,
            Some(format!("Bearer {revoked}")),
            Some("Basic abc".into()),
            Some("Bearer".into()),
            Some(format!("Bearer {a}x")),
        ] {
            let bytes = if body.is_null() {
                vec![]
            } else {
                body.to_string().into_bytes()
            };
            let r = s
                .send(
                    method.clone(),
                    &uri,
                    auth.as_deref(),
                    "application/json",
                    bytes,
                )
                .await;
            assert_eq!(
                r.status,
                StatusCode::UNAUTHORIZED,
                "{method} {uri} with {auth:?}"
            );
            assert_eq!(r.code(), "unauthorized");
            assert_eq!(r.headers[header::WWW_AUTHENTICATE], "Bearer");
        }
    }
    // Tenants cannot administer tenants or read metrics.
    for uri in ["/tenants", "/metrics"] {
        let r = s.as_token(&b, Method::GET, uri, Value::Null).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (StatusCode::FORBIDDEN, "forbidden"),
            "{uri}"
        );
    }
    // The admin token owns no functions.
    let r = s
        .as_token(&s.admin, Method::GET, "/functions", Value::Null)
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    // A's function is unchanged and still A's.
    assert_eq!(
        s.invoke(&a, &f, "add", json!([2, 3])).await.json(),
        json!({"results": [5]})
    );
    let list = s.as_token(&a, Method::GET, "/functions", Value::Null).await;
    assert_eq!(list.json()["functions"].as_array().unwrap().len(), 2);
    let snaps = s
        .as_token(
            &a,
            Method::GET,
            &format!("/functions/{w}/snapshots"),
            Value::Null,
        )
        .await
        .json();
    assert_eq!(snaps["snapshots"].as_array().unwrap().len(), 1);
    assert_eq!(snaps["start_from_snapshot"], json!(snap));
    assert_eq!(
        s.invoke(&a, &w, "init_runs", json!([])).await.json(),
        json!({"results": [1]})
    );
    // Health needs no token.
    assert_eq!(
        s.send(Method::GET, "/healthz", None, "text/plain", vec![])
            .await
            .status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn quotas_refuse_with_the_documented_status_and_name_the_limit() {
    let s = EnforcedApp::new();
    let (_, t) = s
        .tenant(
            "small",
            json!({"max_functions": 1, "max_module_bytes": 4096, "requests_per_second": 0}),
        )
        .await;
    assert_eq!(
        s.deploy(&t, "calc.wat", "name=one").await.status,
        StatusCode::CREATED
    );
    let r = s.deploy(&t, "calc.wat", "name=two").await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::CONFLICT, "quota_count_exceeded")
    );
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_functions"));
    let big = vec![b' '; 8192];
    let r = s
        .send(
            Method::POST,
            "/functions",
            Some(&format!("Bearer {t}")),
            "application/wasm",
            big,
        )
        .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::FORBIDDEN, "quota_size_exceeded")
    );
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("4096"));

    let (_, rate) = s
        .tenant("rate", json!({"requests_per_second": 1, "burst": 2}))
        .await;
    let f = s.deploy(&rate, "calc.wat", "name=calc").await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = s.invoke(&rate, &f, "add", json!([1, 1])).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = s.invoke(&rate, &f, "add", json!([1, 1])).await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "rate_limited")
    );
    assert!(r.headers.contains_key(header::RETRY_AFTER));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_returns_to_zero_after_a_thousand_mixed_failures() {
    let s = EnforcedApp::new();
    let (id, t) = s
        .tenant("mixed", json!({"max_concurrent_invocations": 64, "max_live_instances": 64, "requests_per_second": 0}))
        .await;
    let calc = s.deploy(&t, "calc.wat", "name=calc").await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let spin = s
        .deploy(&t, "loop.wat", "name=spin&timeout_ms=5")
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let hog = s
        .deploy(&t, "hog.wat", "name=hog&memory_limit_bytes=1048576")
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let tenant = s.tenants.lookup(&id).unwrap();
    let mut tasks = Vec::new();
    for i in 0..1000u32 {
        let app = s.app.clone();
        let (t, calc, spin, hog) = (t.clone(), calc.clone(), spin.clone(), hog.clone());
        tasks.push(tokio::spawn(async move {
            let (id, body) = match i % 5 {
                0 => (calc, json!({"export": "div", "args": [1, 0]})), // trap
                1 => (spin, json!({"export": "spin"})),                // timeout
                2 => (hog, json!({"export": "grow"})),                 // memory limit
                3 => (calc, json!({"export": "add", "args": ["x"]})),  // bad arguments
                _ => (calc, json!({"export": "add", "args": [1, 2]})), // ok, but the client goes away
            };
            let req = Request::post(format!("/functions/{id}/invoke"))
                .header(header::AUTHORIZATION, format!("Bearer {t}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string()))
                .unwrap();
            if i % 5 == 4 {
                // A dropped connection: the request future is dropped mid-flight.
                let _ = tokio::time::timeout(Duration::from_micros(50), app.oneshot(req)).await;
            } else {
                let status = app.oneshot(req).await.unwrap().status();
                assert!(
                    status.is_client_error() || status.is_server_error(),
                    "{status}"
                );
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    for resource in [
        Resource::ConcurrentInvocations,
        Resource::LiveInstances,
        Resource::GuestMemoryBytes,
    ] {
        wait_until_async(
            Duration::from_secs(30),
            &format!("{resource:?} is released (no leak)"),
            || tenant.usage(resource) == 0,
        )
        .await;
    }
    assert_eq!(tenant.usage(Resource::Functions), 3);
}

#[tokio::test]
async fn tokens_are_never_stored_in_plain_text() {
    let s = EnforcedApp::new();
    let (id, token) = s.tenant("secretive", json!({})).await;
    let r = s
        .as_token(
            &s.admin,
            Method::POST,
            &format!("/tenants/{id}/tokens"),
            json!({"label": "ci"}),
        )
        .await;
    let second = r.json()["token"].as_str().unwrap().to_owned();
    let listed = s
        .as_token(
            &s.admin,
            Method::GET,
            &format!("/tenants/{id}"),
            Value::Null,
        )
        .await;
    let listed = String::from_utf8(listed.body).unwrap();
    for secret in [&token, &second, &s.admin] {
        assert!(!listed.contains(secret.as_str()));
        for entry in walk(s.dir.path()) {
            let bytes = std::fs::read(&entry).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            assert!(
                !text.contains(secret.as_str()),
                "a token is stored in plain text in {}",
                entry.display()
            );
        }
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test]
async fn admin_routes_create_update_and_delete_tenants() {
    let s = EnforcedApp::new();
    let (id, token) = s.tenant("ops", json!({"max_functions": 5})).await;
    let r = s
        .as_token(
            &s.admin,
            Method::PATCH,
            &format!("/tenants/{id}"),
            json!({"quotas": {"max_functions": 7}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["quotas"]["max_functions"], 7);
    let f = s.deploy(&token, "calc.wat", "name=calc").await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = s
        .as_token(
            &s.admin,
            Method::GET,
            &format!("/tenants/{id}"),
            Value::Null,
        )
        .await;
    assert_eq!(r.json()["usage"]["max_functions"], 1);
    let r = s
        .as_token(&s.admin, Method::POST, "/tenants", json!({"name": "ops"}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    let r = s
        .as_token(
            &s.admin,
            Method::DELETE,
            &format!("/tenants/{id}"),
            Value::Null,
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    // Its token and its functions went with it.
    let r = s.invoke(&token, &f, "add", json!([1, 1])).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = s
        .as_token(
            &s.admin,
            Method::GET,
            &format!("/tenants/{id}"),
            Value::Null,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_tenants_gpu_isolation_reaches_the_runtime() {
    use tensor_wasm_runtime::GpuIsolation;
    let s = EnforcedApp::new();
    // The test server runs the CPU backend at the default (stream) level.
    assert_eq!(
        s.runtime.tenant_gpu_isolation("tn-0000000000000000"),
        GpuIsolation::StreamPerTenant
    );
    let create = |name: &str, body: Value| {
        let mut body = body;
        body["name"] = json!(name);
        s.as_token(&s.admin, Method::POST, "/tenants", body)
    };

    // `own_context`: a CUDA context of the tenant's own.
    let r = create("isolated", json!({"gpu_isolation": "own_context"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    assert_eq!(r.json()["tenant"]["gpu_isolation"], "own_context");
    let isolated = r.json()["tenant"]["id"].as_str().unwrap().to_owned();
    let isolated_token = r.json()["token"].as_str().unwrap().to_owned();
    assert_eq!(
        s.runtime.tenant_gpu_isolation(&isolated),
        GpuIsolation::ContextPerTenant
    );

    // Not asking, or asking for `shared_context_own_stream`: the server-wide level.
    let r = create("plain", json!({})).await;
    assert_eq!(
        r.json()["tenant"]["gpu_isolation"],
        "shared_context_own_stream"
    );
    let plain = r.json()["tenant"]["id"].as_str().unwrap().to_owned();
    let r = create(
        "shared",
        json!({"gpu_isolation": "shared_context_own_stream"}),
    )
    .await;
    let shared = r.json()["tenant"]["id"].as_str().unwrap().to_owned();
    for id in [&plain, &shared] {
        assert_eq!(
            s.runtime.tenant_gpu_isolation(id),
            GpuIsolation::StreamPerTenant
        );
    }

    // An unknown level is refused, and creates nothing.
    let r = create("bad", json!({"gpu_isolation": "context"})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(s.tenants.list().iter().all(|t| t.name != "bad"));

    // On the CPU backend the level changes nothing the guest sees.
    let r = s.deploy(&isolated_token, "calc.wat", "name=calc").await;
    assert_eq!(r.status, StatusCode::CREATED);
    let f = r.json()["id"].as_str().unwrap().to_owned();
    let r = s.invoke(&isolated_token, &f, "add", json!([2, 3])).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());

    // Renaming keeps the level (PATCH cannot change it).
    let r = s
        .as_token(
            &s.admin,
            Method::PATCH,
            &format!("/tenants/{isolated}"),
            json!({"name": "isolated-2"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["gpu_isolation"], "own_context");
    assert_eq!(
        s.runtime.tenant_gpu_isolation(&isolated),
        GpuIsolation::ContextPerTenant
    );

    // Deleting the tenant forgets its level.
    let r = s
        .as_token(
            &s.admin,
            Method::DELETE,
            &format!("/tenants/{isolated}"),
            Value::Null,
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        s.runtime.tenant_gpu_isolation(&isolated),
        GpuIsolation::StreamPerTenant
    );
}

#[tokio::test]
async fn existing_tenants_gpu_isolation_reaches_the_runtime_at_start() {
    use std::sync::Arc;
    use tensor_wasm_api::{ApiConfig, AppState, AuthMode};
    use tensor_wasm_runtime::{
        FsFunctionStore, GpuIsolation, Runtime, RuntimeConfig, RuntimeMetrics,
    };
    use tensor_wasm_tenant::{FsTenantStore, Quotas, TenantMetrics, TenantRegistry};

    let dir = tempfile::tempdir().unwrap();
    let open_registry = |metrics: &prometheus::Registry| {
        Arc::new(
            TenantRegistry::open(
                Arc::new(FsTenantStore::open(dir.path()).unwrap()),
                TenantMetrics::register(metrics).unwrap(),
            )
            .unwrap(),
        )
    };
    // A previous run of the server created the tenants.
    let (own, plain) = {
        let tenants = open_registry(&prometheus::Registry::new());
        tenants.bootstrap().unwrap();
        let (own, _) = tenants
            .create_tenant(
                "isolated",
                Quotas::default(),
                tensor_wasm_tenant::GpuIsolation::OwnContext,
            )
            .unwrap();
        let (plain, _) = tenants
            .create_tenant(
                "plain",
                Quotas::default(),
                tensor_wasm_tenant::GpuIsolation::SharedContextOwnStream,
            )
            .unwrap();
        (own.id, plain.id)
    };

    let metrics = prometheus::Registry::new();
    let tenants = open_registry(&metrics);
    let runtime = Runtime::open(
        RuntimeConfig::for_tests(dir.path()),
        Arc::new(FsFunctionStore::open(dir.path()).unwrap()),
        RuntimeMetrics::register(&metrics).unwrap(),
    )
    .unwrap();
    assert_eq!(
        runtime.tenant_gpu_isolation(&own),
        GpuIsolation::StreamPerTenant,
        "nothing set before the API starts"
    );
    let _state = AppState::new(
        runtime.clone(),
        metrics,
        ApiConfig::default(),
        tenants,
        AuthMode::Enforced,
    )
    .unwrap();
    assert_eq!(
        runtime.tenant_gpu_isolation(&own),
        GpuIsolation::ContextPerTenant
    );
    assert_eq!(
        runtime.tenant_gpu_isolation(&plain),
        GpuIsolation::StreamPerTenant
    );
}

/// The raw-kernel capability is the admin's to grant and revoke: a tenant cannot deploy or PATCH its way to raw PTX, nor grant
/// itself the capability; once the admin revokes it, the tenant's raw-kernel
/// functions get no new instance while its other functions keep working.
#[tokio::test]
async fn raw_ptx_is_a_capability_only_the_admin_grants() {
    let s = EnforcedApp::with(
        |c| c.allow_raw_ptx = true,
        tensor_wasm_api::ApiConfig::default(),
    );
    let (id, t) = s.tenant("kernels", json!({})).await;
    let refused = |r: &tensor_wasm_test_support::app::Reply| {
        (r.status, r.code()) == (StatusCode::FORBIDDEN, "raw_ptx_not_granted".to_owned())
    };

    // The tenant alone: no raw PTX at deploy, by PATCH, or by granting itself.
    let r = s.deploy(&t, "calc.wat", "name=raw&raw_ptx=true").await;
    assert!(refused(&r), "{} {}", r.status, r.text());
    let plain = s.deploy_id(&t, "calc.wat", "name=plain").await;
    let r = s
        .as_token(
            &t,
            Method::PATCH,
            &format!("/functions/{plain}"),
            json!({"raw_ptx": true}),
        )
        .await;
    assert!(refused(&r), "{} {}", r.status, r.text());
    let r = s
        .as_token(
            &t,
            Method::PATCH,
            &format!("/tenants/{id}"),
            json!({"raw_ptx": true}),
        )
        .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::FORBIDDEN, "forbidden")
    );
    assert_eq!(
        s.runtime.functions_of(&id).len(),
        1,
        "nothing raw was stored"
    );

    // The admin grants it: deploy and PATCH now succeed.
    let tenant_uri = format!("/tenants/{id}");
    let grant = |granted: bool| {
        s.as_token(
            &s.admin,
            Method::PATCH,
            &tenant_uri,
            json!({"raw_ptx": granted}),
        )
    };
    let r = grant(true).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["raw_ptx"], true);
    let r = s.deploy(&t, "calc.wat", "name=raw&raw_ptx=true").await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(r.json()["limits"]["raw_ptx"], true);
    let raw = r.json()["id"].as_str().unwrap().to_owned();
    let r = s
        .as_token(
            &t,
            Method::PATCH,
            &format!("/functions/{plain}"),
            json!({"raw_ptx": true}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["limits"]["raw_ptx"], true);
    for f in [&raw, &plain] {
        let r = s.invoke(&t, f, "add", json!([2, 3])).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }

    // Revoked: its raw-kernel functions no longer start; a function the
    // tenant turns back into a plain one does.
    let r = grant(false).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["raw_ptx"], false);
    for f in [&raw, &plain] {
        let r = s.invoke(&t, f, "add", json!([2, 3])).await;
        assert!(refused(&r), "{} {}", r.status, r.text());
    }
    let r = s
        .as_token(
            &t,
            Method::PATCH,
            &format!("/functions/{plain}"),
            json!({"raw_ptx": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = s.invoke(&t, &plain, "add", json!([2, 3])).await;
    assert_eq!(r.json(), json!({"results": [5]}));

    // Granted at creation by the admin.
    let r = s
        .as_token(
            &s.admin,
            Method::POST,
            "/tenants",
            json!({"name": "trusted", "raw_ptx": true}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(r.json()["tenant"]["raw_ptx"], true);
    let trusted = r.json()["token"].as_str().unwrap().to_owned();
    let r = s
        .deploy(&trusted, "calc.wat", "name=raw&raw_ptx=true")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
}

/// A request to the router, spawned: the task is the client, and aborting it
/// is the client going away.
fn spawn_request(
    s: &EnforcedApp,
    method: Method,
    uri: String,
    token: &str,
    ctype: &str,
    body: Vec<u8>,
) -> tokio::task::JoinHandle<StatusCode> {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, ctype)
        .body(Body::from(body))
        .unwrap();
    let app = s.app.clone();
    tokio::spawn(async move { app.oneshot(request).await.unwrap().status() })
}

/// An [`EnforcedApp`] over a [`GatedStore`]; returns the module-write and
/// the record-delete gates.
fn gated_app() -> (
    EnforcedApp,
    std::sync::Arc<tensor_wasm_test_support::gate::Gate>,
    std::sync::Arc<tensor_wasm_test_support::gate::Gate>,
) {
    use tensor_wasm_test_support::gate::GatedStore;
    let mut gates = None;
    let s = EnforcedApp::over_store(
        |_| {},
        tensor_wasm_api::ApiConfig::default(),
        |fs| {
            let gated = std::sync::Arc::new(GatedStore::new(fs));
            gates = Some((gated.put_module.clone(), gated.delete_function.clone()));
            gated
        },
    );
    let (writes, deletes) = gates.unwrap();
    (s, writes, deletes)
}

/// A deploy that reaches its commit while its tenant is
/// being deleted (the delete has retired the tenant and is sweeping its
/// functions, held here at its first record delete) is refused with 410
/// `tenant_deleted` and stores nothing: no record, no module, nothing the
/// sweep could miss.
#[tokio::test]
async fn a_deploy_in_flight_when_its_tenant_is_deleted_leaves_nothing() {
    let (s, _, deletes) = gated_app();
    let (id, t) = s.tenant("leaving", json!({})).await;
    s.deploy_id(&t, "calc.wat", "name=first").await;
    let count =
        |s: &EnforcedApp, dir: &str| std::fs::read_dir(s.dir.path().join(dir)).unwrap().count();
    let modules_before = count(&s, "modules");

    let held = deletes.close();
    let delete = spawn_request(
        &s,
        Method::DELETE,
        format!("/tenants/{id}"),
        &s.admin,
        "application/json",
        Vec::new(),
    );
    deletes.wait_for_waiting(1).await;
    // The delete is sweeping; the tenant's token still authenticates.
    let r = s.deploy(&t, "warm.wat", "name=late").await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::GONE, "tenant_deleted"),
        "{}",
        r.text()
    );
    drop(held);
    assert_eq!(delete.await.unwrap(), StatusCode::NO_CONTENT);
    assert!(s.runtime.functions_of(&id).is_empty(), "an orphan function");
    assert_eq!(count(&s, "functions"), 0, "an orphan record");
    assert_eq!(
        count(&s, "modules"),
        modules_before,
        "the late deploy stored its module"
    );
}

/// The function count is taken and given back by the
/// deploy's and the delete's work, not by their connections. A client that
/// goes away while its deploy is storing the module still ends with the
/// function counted (so a quota of 1 refuses a second one), and one that goes
/// away mid-delete still gets the count back.
#[tokio::test]
async fn the_function_count_follows_the_work_not_the_connection() {
    let (s, writes, deletes) = gated_app();
    let (id, t) = s
        .tenant(
            "leaver",
            json!({"max_functions": 1, "requests_per_second": 0}),
        )
        .await;
    let tenant = s.tenants.lookup(&id).unwrap();
    let example = tensor_wasm_test_support::guests::example;

    let held = writes.close();
    let client = spawn_request(
        &s,
        Method::POST,
        "/functions?name=gone".into(),
        &t,
        "application/wasm",
        example("calc.wat"),
    );
    writes.wait_for_waiting(1).await;
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    drop(held);
    wait_until_async(
        Duration::from_secs(30),
        "the abandoned deploy stored its function",
        || s.runtime.functions_of(&id).len() == 1,
    )
    .await;
    wait_until_async(
        Duration::from_secs(30),
        "the deploy slot is given back",
        || tenant.usage(Resource::ConcurrentDeploys) == 0,
    )
    .await;
    assert_eq!(
        tenant.usage(Resource::Functions),
        1,
        "the function is counted"
    );
    let r = s.deploy(&t, "calc.wat", "name=second").await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::CONFLICT, "quota_count_exceeded"),
        "a quota of 1 holds exactly"
    );

    let f = s.runtime.functions_of(&id)[0].id.clone();
    let held = deletes.close();
    let client = spawn_request(
        &s,
        Method::DELETE,
        format!("/functions/{f}"),
        &t,
        "application/json",
        Vec::new(),
    );
    deletes.wait_for_waiting(1).await;
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    drop(held);
    wait_until_async(
        Duration::from_secs(30),
        "the abandoned delete removed the function",
        || s.runtime.functions_of(&id).is_empty(),
    )
    .await;
    wait_until_async(Duration::from_secs(30), "the count is given back", || {
        tenant.usage(Resource::Functions) == 0
    })
    .await;
    s.deploy_id(&t, "calc.wat", "name=again").await;
    assert_eq!(tenant.usage(Resource::Functions), 1);
}

/// Deploys (compiles) of one tenant in progress at once are
/// bounded by its `max_concurrent_deploys`: the one over it is refused at
/// once with 429 `quota_exhausted`, and the slots come back when the deploys end.
#[tokio::test]
async fn concurrent_deploys_per_tenant_are_bounded() {
    let (s, writes, _) = gated_app();
    let (id, t) = s
        .tenant(
            "builder",
            json!({"max_concurrent_deploys": 2, "requests_per_second": 0}),
        )
        .await;
    let tenant = s.tenants.lookup(&id).unwrap();
    let example = tensor_wasm_test_support::guests::example;
    let held = writes.close();
    let running: Vec<_> = (0..2)
        .map(|i| {
            spawn_request(
                &s,
                Method::POST,
                format!("/functions?name=slow{i}"),
                &t,
                "application/wasm",
                example("calc.wat"),
            )
        })
        .collect();
    writes.wait_for_waiting(2).await;
    assert_eq!(tenant.usage(Resource::ConcurrentDeploys), 2);
    let third = tokio::time::timeout(
        Duration::from_secs(20),
        s.deploy(&t, "calc.wat", "name=third"),
    )
    .await
    .expect("the deploy over the bound is answered at once, not queued");
    assert_eq!(
        (third.status, third.code().as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "quota_exhausted"),
        "{}",
        third.text()
    );
    assert!(
        third.text().contains("max_concurrent_deploys"),
        "{}",
        third.text()
    );
    assert!(third.headers.contains_key(header::RETRY_AFTER));
    drop(held);
    for deploy in running {
        assert_eq!(deploy.await.unwrap(), StatusCode::CREATED);
    }
    assert_eq!(tenant.usage(Resource::ConcurrentDeploys), 0);
    s.deploy_id(&t, "calc.wat", "name=third").await;
    assert_eq!(s.runtime.functions_of(&id).len(), 3);
}
