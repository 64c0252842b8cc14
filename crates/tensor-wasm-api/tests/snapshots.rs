//! Snapshot routes over the router with authentication enforced: create, list, start-from,
//! delete, and the documented errors (the cross-tenant checks are in `tenants.rs`).

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use serde_json::{json, Value};
use tensor_wasm_runtime::MAX_SNAPSHOTS_PER_FUNCTION;
use tensor_wasm_test_support::app::{EnforcedApp, Reply};

#[tokio::test]
async fn snapshot_routes_capture_switch_and_delete() {
    let s = EnforcedApp::new();
    let (_, t) = s.tenant("alpha", json!({})).await;
    let w = s.deploy(&t, "warm.wat", "name=warm").await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let uri = format!("/functions/{w}/snapshots");
    assert_eq!(
        s.invoke(&t, &w, "lookup", json!([3])).await.json(),
        json!({"results": [-1]})
    );

    // An empty body means init_export "init", activate true.
    let r = s.as_token(&t, Method::POST, &uri, Value::Null).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let first = r.json();
    assert_eq!(first["init_export"], "init");
    assert_eq!(first["memory_bytes"], 17 * 65_536);
    let first_id = first["id"].as_str().unwrap().to_owned();
    assert_eq!(
        s.invoke(&t, &w, "init_runs", json!([])).await.json(),
        json!({"results": [1]})
    );

    // A second snapshot, not activated.
    let r = s
        .as_token(&t, Method::POST, &uri, json!({"activate": false}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let second_id = r.json()["id"].as_str().unwrap().to_owned();
    let list = s.as_token(&t, Method::GET, &uri, Value::Null).await.json();
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 2);
    assert_eq!(list["start_from_snapshot"], json!(first_id));
    assert_eq!(list["restore_mode"], "eager");

    // The one in use cannot be deleted; switching first makes it deletable.
    let r = s
        .as_token(
            &t,
            Method::DELETE,
            &format!("{uri}/{first_id}"),
            Value::Null,
        )
        .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::CONFLICT, "conflict")
    );
    let r = s
        .as_token(
            &t,
            Method::PATCH,
            &format!("/functions/{w}"),
            json!({"start_from_snapshot": "latest"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["start_from_snapshot"], json!(second_id));
    let r = s
        .as_token(
            &t,
            Method::DELETE,
            &format!("{uri}/{first_id}"),
            Value::Null,
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let r = s
        .as_token(
            &t,
            Method::DELETE,
            &format!("{uri}/{first_id}"),
            Value::Null,
        )
        .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::NOT_FOUND, "not_found")
    );

    // Bad requests: a missing field, a wrong type, an unknown snapshot, an unknown export.
    let patch = format!("/functions/{w}");
    for (body, status, code) in [
        (json!({}), StatusCode::BAD_REQUEST, "bad_request"),
        (
            json!({"start_from_snapshot": 3}),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            // The function exists; its state has no such snapshot.
            json!({"start_from_snapshot": "snap-000000000000000000000000"}),
            StatusCode::CONFLICT,
            "conflict",
        ),
    ] {
        let r = s.as_token(&t, Method::PATCH, &patch, body.clone()).await;
        assert_eq!((r.status, r.code().as_str()), (status, code), "{body}");
    }
    let r = s
        .as_token(&t, Method::POST, &uri, json!({"init_export": "nope"}))
        .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::BAD_REQUEST, "unknown_export")
    );

    // Back to fresh instances.
    let r = s
        .as_token(
            &t,
            Method::PATCH,
            &patch,
            json!({"start_from_snapshot": null}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.json().get("start_from_snapshot").is_none());
    assert_eq!(
        s.invoke(&t, &w, "lookup", json!([3])).await.json(),
        json!({"results": [-1]})
    );
}

#[tokio::test]
async fn wasi_commands_cannot_be_snapshotted() {
    let s = EnforcedApp::new();
    let (_, t) = s.tenant("alpha", json!({})).await;
    let r = s.deploy(&t, "upper.wat", "name=upper&style=wasi").await;
    assert_eq!(r.status, StatusCode::CREATED);
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let r = s
        .as_token(
            &t,
            Method::POST,
            &format!("/functions/{id}/snapshots"),
            Value::Null,
        )
        .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "snapshot_unsupported")
    );
}

/// Hardening item 9: the per-function snapshot count is checked atomically with the write,
/// so requests racing for the last free places cannot together store more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_snapshot_requests_cannot_exceed_the_count() {
    let s = EnforcedApp::new();
    let (_, t) = s.tenant("alpha", json!({})).await;
    let w = s.deploy_id(&t, "warm.wat", "name=warm").await;
    let uri = format!("/functions/{w}/snapshots");
    let already = MAX_SNAPSHOTS_PER_FUNCTION - 2;
    for _ in 0..already {
        let r = s
            .as_token(&t, Method::POST, &uri, json!({"activate": false}))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    }

    let racing = 8;
    let mut tasks = Vec::new();
    for _ in 0..racing {
        let app = s.app.clone();
        let request = Request::builder()
            .method(Method::POST)
            .uri(&uri)
            .header(header::AUTHORIZATION, format!("Bearer {t}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"activate": false}"#))
            .unwrap();
        tasks.push(tokio::spawn(async move { Reply::of(&app, request).await }));
    }
    let mut created = 0;
    for task in tasks {
        let r = task.await.unwrap();
        match r.status {
            StatusCode::CREATED => created += 1,
            StatusCode::CONFLICT => assert_eq!(r.code(), "conflict", "{}", r.text()),
            other => panic!("unexpected {other}: {}", r.text()),
        }
    }
    assert_eq!(created, 2, "only the free places are taken");
    let list = s.as_token(&t, Method::GET, &uri, Value::Null).await.json();
    assert_eq!(
        list["snapshots"].as_array().unwrap().len(),
        MAX_SNAPSHOTS_PER_FUNCTION
    );
}

/// Hardening item 9: a tenant's modules and snapshots together are bounded by its
/// `max_stored_bytes` quota; above it deploys and snapshots get 409
/// `quota_storage_exceeded`, other tenants are unaffected, and deletes give the bytes back.
#[tokio::test]
async fn a_tenant_over_its_stored_bytes_quota_is_refused() {
    let s = EnforcedApp::new();
    let (alpha, t) = s.tenant("alpha", json!({})).await;
    let (_, other) = s.tenant("beta", json!({})).await;
    let r = s.deploy(&t, "warm.wat", "name=warm").await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let w = r.json()["id"].as_str().unwrap().to_owned();
    let module = r.json()["module_size"].as_u64().unwrap();

    // Room for the module and a few bytes, not for a second module or a snapshot.
    let r = s
        .as_token(
            &s.admin,
            Method::PATCH,
            &format!("/tenants/{alpha}"),
            json!({"quotas": {"max_stored_bytes": module + 8}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["quotas"]["max_stored_bytes"], module + 8);

    let r = s.deploy(&t, "warm.wat", "name=again").await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::CONFLICT, "quota_storage_exceeded"),
        "{}",
        r.text()
    );
    let uri = format!("/functions/{w}/snapshots");
    let r = s.as_token(&t, Method::POST, &uri, Value::Null).await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::CONFLICT, "quota_storage_exceeded"),
        "{}",
        r.text()
    );
    let list = s.as_token(&t, Method::GET, &uri, Value::Null).await.json();
    assert_eq!(
        list["snapshots"],
        json!([]),
        "a refused snapshot is not stored"
    );
    assert_eq!(
        s.deploy(&other, "warm.wat", "name=theirs").await.status,
        StatusCode::CREATED,
        "another tenant is not charged"
    );

    // Deleting the function frees its bytes.
    let r = s
        .as_token(&t, Method::DELETE, &format!("/functions/{w}"), Value::Null)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        s.deploy(&t, "warm.wat", "name=again").await.status,
        StatusCode::CREATED
    );
}
