//! `/functions/{id}/invoke-stream`: chunked and SSE delivery, errors before
//! the stream starts, back-pressure and client disconnects.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use base64::Engine as _;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tensor_wasm_tenant::Resource;
use tensor_wasm_tenant::Tenant;
use tensor_wasm_test_support::app::{EnforcedApp, Reply};
use tensor_wasm_test_support::guests::{ECHO_COMMAND, FLOOD_COMMAND};
use tensor_wasm_test_support::wait::{assert_holds_for_async, wait_for_async, wait_until_async};
use tower::ServiceExt;

fn stream_request(token: &str, id: &str, query: &str, accept: &str, body: &str) -> Request<Body> {
    Request::post(format!("/functions/{id}/invoke-stream?{query}"))
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::ACCEPT, accept)
        .body(Body::from(body.to_owned()))
        .unwrap()
}

/// How long a guest whose client does not read is watched staying in flight
/// (an observation window, not synchronisation: a guest that is not held
/// runs on to the output cap or its deadline and ends).
const HELD_WINDOW: Duration = Duration::from_millis(300);

/// Waits until the tenant holds no invocation, instance or guest memory.
async fn all_released(tenant: &Tenant) {
    for resource in [
        Resource::ConcurrentInvocations,
        Resource::LiveInstances,
        Resource::GuestMemoryBytes,
    ] {
        wait_until_async(
            Duration::from_secs(10),
            &format!("{resource:?} is released after the client left"),
            || tenant.usage(resource) == 0,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_and_sse_deliver_every_chunk_then_the_outcome() {
    let s = EnforcedApp::new();
    let (_, t) = s.tenant("streamer", json!({})).await;
    let id = s.deploy(&t, "stream.wat", "name=stream").await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let args = "export=ticks&args=%5B3%2C0%5D"; // args=[3,0]

    let response = s
        .app
        .clone()
        .oneshot(stream_request(&t, &id, args, "*/*", "hello "))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/octet-stream"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hello tick\ntick\ntick\n");

    let response = s
        .app
        .clone()
        .oneshot(stream_request(&t, &id, args, "text/event-stream", "hi"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let events = sse_events(&text);
    let chunks: Vec<Vec<u8>> = events
        .iter()
        .filter(|(e, _)| e == "chunk")
        .map(|(_, d)| base64::engine::general_purpose::STANDARD.decode(d).unwrap())
        .collect();
    assert_eq!(
        chunks,
        vec![
            b"hi".to_vec(),
            b"tick\n".to_vec(),
            b"tick\n".to_vec(),
            b"tick\n".to_vec()
        ]
    );
    let (last, data) = events.last().unwrap();
    assert_eq!(last, "end");
    assert_eq!(
        serde_json::from_str::<Value>(data).unwrap(),
        json!({"results": [4]})
    );
}

#[tokio::test]
async fn bad_calls_are_refused_before_the_stream_starts() {
    let s = EnforcedApp::new();
    let (_, t) = s.tenant("streamer", json!({})).await;
    let id = s.deploy(&t, "stream.wat", "name=stream").await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for (query, code) in [
        ("export=nope", "unknown_export"),
        ("export=ticks&args=%5B1%5D", "invalid_arguments"),
        ("args=%5B%5D", "bad_request"),
        ("export=ticks&args=oops", "bad_request"),
        ("export=ticks&encoding=hex", "bad_request"),
    ] {
        let response = s
            .app
            .clone()
            .oneshot(stream_request(&t, &id, query, "*/*", ""))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{query}");
        let body: Value =
            serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes())
                .unwrap();
        assert_eq!(body["error"]["code"], code, "{query}");
    }
}

/// A client that stops reading holds the guest (bounded buffer, no runaway
/// memory); a client that goes away cancels it and every quota is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_pressure_and_disconnect_release_everything() {
    let s = EnforcedApp::new();
    let (tid, t) = s.tenant("flooder", json!({})).await;
    let id = s.deploy(&t, "stream.wat", "name=stream").await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let tenant = s.tenants.lookup(&tid).unwrap();

    let response = s
        .app
        .clone()
        .oneshot(stream_request(&t, &id, "export=flood", "*/*", ""))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    // Nobody reads: the guest blocks on the full buffer and stays in flight.
    assert_holds_for_async(HELD_WINDOW, "the guest is held, not finished", || {
        tenant.usage(Resource::ConcurrentInvocations) == 1
    })
    .await;
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap().len(), 65536);
    drop(body); // the client goes away

    all_released(&tenant).await;
}

async fn get_job(s: &EnforcedApp, token: &str, job: &str) -> Value {
    let r = s
        .as_token(
            token,
            axum::http::Method::GET,
            &format!("/jobs/{job}"),
            Value::Null,
        )
        .await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    r.json()
}

/// Waits until `job` has left `queued`/`running`; returns its final document.
async fn wait_finished(s: &EnforcedApp, token: &str, job: &str) -> Value {
    wait_for_async(Duration::from_secs(20), "the job finishes", || async move {
        let j = get_job(s, token, job).await;
        (!matches!(j["status"].as_str(), Some("queued" | "running"))).then_some(j)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_jobs_run_detached_are_scoped_and_cancellable() {
    let s = EnforcedApp::new();
    let (_, t) = s.tenant("jobs", json!({})).await;
    let (_, other) = s.tenant("other", json!({})).await;
    let calc = s.deploy(&t, "calc.wat", "name=calc").await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let nap = s.deploy(&t, "sleep.wat", "name=nap").await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let r = s
        .as_token(
            &t,
            axum::http::Method::POST,
            &format!("/functions/{calc}/invoke-async"),
            json!({"export": "add", "args": [20, 22]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    let job = r.json()["job_id"].as_str().unwrap().to_owned();
    assert_eq!(r.headers[header::LOCATION], format!("/jobs/{job}"));
    let done = wait_finished(&s, &t, &job).await;
    assert_eq!(done["status"], "succeeded");
    assert_eq!(done["results"], json!([42]));
    assert!(done["finished_at_ms"].as_u64() >= done["started_at_ms"].as_u64());

    // A failing job reports its error code.
    let r = s
        .as_token(
            &t,
            axum::http::Method::POST,
            &format!("/functions/{calc}/invoke-async"),
            json!({"export": "div", "args": [1, 0]}),
        )
        .await;
    let failed = wait_finished(&s, &t, r.json()["job_id"].as_str().unwrap()).await;
    assert_eq!(
        (failed["status"].as_str(), failed["error"]["code"].as_str()),
        (Some("failed"), Some("guest_trap"))
    );

    // Another tenant cannot see or cancel it.
    let r = s
        .as_token(
            &other,
            axum::http::Method::GET,
            &format!("/jobs/{job}"),
            Value::Null,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = s
        .as_token(
            &other,
            axum::http::Method::DELETE,
            &format!("/jobs/{job}"),
            Value::Null,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    // Cancelling a running job discards its outcome.
    let r = s
        .as_token(
            &t,
            axum::http::Method::POST,
            &format!("/functions/{nap}/invoke-async"),
            json!({"export": "nap", "args": [2000]}),
        )
        .await;
    let running = r.json()["job_id"].as_str().unwrap().to_owned();
    // Cancel once it runs (the nap lasts far longer than the cancel takes).
    let (s_ref, t_ref, job_ref) = (&s, t.as_str(), running.as_str());
    wait_for_async(Duration::from_secs(10), "the nap job is running", || async move {
        (get_job(s_ref, t_ref, job_ref).await["status"] == "running").then_some(())
    })
    .await;
    let r = s
        .as_token(
            &t,
            axum::http::Method::DELETE,
            &format!("/jobs/{running}"),
            Value::Null,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["cancel_requested"], true);
    assert_eq!(
        r.json()["status"],
        "running",
        "the cancel must hit a running job"
    );
    let cancelled = wait_finished(&s, &t, &running).await;
    assert_eq!(cancelled["status"], "cancelled");
    assert!(cancelled.get("results").is_none());

    // Bad calls are refused up front.
    let r = s
        .as_token(
            &t,
            axum::http::Method::POST,
            &format!("/functions/{calc}/invoke-async"),
            json!({"export": "nope"}),
        )
        .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::BAD_REQUEST, "unknown_export")
    );
}

/// Submits an async call of `export` with `args`; returns the reply.
async fn submit(s: &EnforcedApp, token: &str, id: &str, export: &str, args: Value) -> Reply {
    s.as_token(
        token,
        axum::http::Method::POST,
        &format!("/functions/{id}/invoke-async"),
        json!({"export": export, "args": args}),
    )
    .await
}

/// Job records on disk.
fn job_files(s: &EnforcedApp) -> usize {
    std::fs::read_dir(s.dir.path().join("jobs"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("json".as_ref()))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_are_bounded_per_tenant_in_memory_and_on_disk() {
    let s = EnforcedApp::with_api(|dir, api| {
        api.jobs_dir = Some(dir.to_owned());
        api.jobs.max_retained_per_tenant = 3;
    });
    let (_, t) = s.tenant("busy", json!({})).await;
    let (_, other) = s.tenant("quiet", json!({})).await;
    let calc = s.deploy_id(&t, "calc.wat", "name=calc").await;
    let other_calc = s.deploy_id(&other, "calc.wat", "name=calc").await;

    let r = submit(&s, &other, &other_calc, "add", json!([1, 1])).await;
    let kept = r.json()["job_id"].as_str().unwrap().to_owned();
    wait_finished(&s, &other, &kept).await;
    let mut jobs = Vec::new();
    for i in 0..6 {
        let r = submit(&s, &t, &calc, "add", json!([i, 1])).await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
        let job = r.json()["job_id"].as_str().unwrap().to_owned();
        assert_eq!(wait_finished(&s, &t, &job).await["results"], json!([i + 1]));
        jobs.push(job);
    }

    // The three newest stay; the older ones are gone from memory and disk.
    for (i, job) in jobs.iter().enumerate() {
        let r = s
            .as_token(
                &t,
                axum::http::Method::GET,
                &format!("/jobs/{job}"),
                Value::Null,
            )
            .await;
        let expected = if i < 3 {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::OK
        };
        assert_eq!(r.status, expected, "job {i}: {}", r.text());
        let file = s.dir.path().join(format!("jobs/{job}.json"));
        assert_eq!(file.exists(), i >= 3, "job {i}'s record on disk");
    }
    // Another tenant's jobs do not count against this one's bound.
    assert_eq!(get_job(&s, &other, &kept).await["status"], "succeeded");
    assert_eq!(job_files(&s), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_call_bodies_and_results_are_bounded() {
    let s = EnforcedApp::with_api(|_, api| {
        api.jobs.max_request_bytes = 256;
        api.jobs.max_result_bytes = 8;
    });
    let (_, t) = s.tenant("jobs", json!({})).await;
    let calc = s.deploy_id(&t, "calc.wat", "name=calc").await;

    let padded = json!(["1", format!("{:>300}", "")]);
    let r = submit(&s, &t, &calc, "mul64", padded).await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
        "{}",
        r.text()
    );

    // `[42]` fits in 8 bytes, a 19-digit product does not.
    let r = submit(&s, &t, &calc, "add", json!([40, 2])).await;
    let small = wait_finished(&s, &t, r.json()["job_id"].as_str().unwrap()).await;
    assert_eq!(small["results"], json!([42]));
    let r = submit(&s, &t, &calc, "mul64", json!(["3037000499", "3037000499"])).await;
    let big = wait_finished(&s, &t, r.json()["job_id"].as_str().unwrap()).await;
    assert_eq!(
        (big["status"].as_str(), big["error"]["code"].as_str()),
        (Some("failed"), Some("output_too_large")),
        "{big}"
    );
    assert!(big.get("results").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_decimal_strings_are_refused_before_they_are_kept() {
    let s = EnforcedApp::with_api(|dir, api| api.jobs_dir = Some(dir.to_owned()));
    let (_, t) = s.tenant("digits", json!({})).await;
    let calc = s.deploy_id(&t, "calc.wat", "name=calc").await;

    // Leading zeros keep the value in range; only the length gives it away.
    let long = format!("{}3", "0".repeat(100));
    let r = submit(&s, &t, &calc, "mul64", json!([long, "2"])).await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::BAD_REQUEST, "invalid_arguments"),
        "{}",
        r.text()
    );
    assert!(r.text().contains("at most 40 characters"), "{}", r.text());
    assert_eq!(job_files(&s), 0, "nothing of the call was kept");
    let r = s.invoke(&t, &calc, "mul64", json!([long, "2"])).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text().len() < 400, "the argument is not echoed whole");

    // Up to the bound, leading zeros and all, the string is a number.
    let fits = format!("{}3", "0".repeat(39));
    let r = submit(&s, &t, &calc, "mul64", json!([fits, "2"])).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let done = wait_finished(&s, &t, r.json()["job_id"].as_str().unwrap()).await;
    assert_eq!(done["results"], json!([6]));
    assert_eq!(job_files(&s), 1);
}

async fn deploy_command(s: &EnforcedApp, token: &str, wat: &str) -> String {
    let r = s
        .send(
            axum::http::Method::POST,
            "/functions?name=command&style=wasi",
            Some(&format!("Bearer {token}")),
            "application/wasm",
            wat.as_bytes().to_vec(),
        )
        .await;
    assert_eq!(
        r.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    r.json()["id"].as_str().unwrap().to_owned()
}

fn sse_events(text: &str) -> Vec<(String, String)> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let field = |name: &str| {
                e.lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}:")))
                    .map(|v| v.trim_start().to_owned())
                    .unwrap_or_default()
            };
            (field("event"), field("data"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasi_stdout_streams_as_chunks_and_ends_with_the_exit_code() {
    let s = EnforcedApp::new();
    let (_, t) = s.tenant("commands", json!({})).await;
    let id = deploy_command(&s, &t, ECHO_COMMAND).await;

    // Chunked: stdout as written, nothing else.
    let response = s
        .app
        .clone()
        .oneshot(stream_request(&t, &id, "", "*/*", "hello stdin"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hello stdinbye\n");

    // SSE: one chunk per write, then the exit code and stderr tail.
    let response = s
        .app
        .clone()
        .oneshot(stream_request(
            &t,
            &id,
            "encoding=text",
            "text/event-stream",
            "hi",
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let events = sse_events(&text);
    let chunks: Vec<&str> = events
        .iter()
        .filter(|(e, _)| e == "chunk")
        .map(|(_, d)| d.as_str())
        .collect();
    // SSE data lines carry no newline: "bye\n" is "bye" plus an empty line.
    assert_eq!(chunks.len(), 2, "{text}");
    assert_eq!(chunks[0], "hi");
    assert!(chunks[1].starts_with("bye"), "{text}");
    let (last, data) = events.last().unwrap();
    assert_eq!(last, "end");
    assert_eq!(
        serde_json::from_str::<Value>(data).unwrap(),
        json!({"exit_code": 3, "stdout_bytes": 6, "stderr_tail": "oops\n", "stderr_truncated": false})
    );

    // A WASI command takes no export or arguments.
    for query in ["export=_start", "args=%5B%5D"] {
        let response = s
            .app
            .clone()
            .oneshot(stream_request(&t, &id, query, "*/*", ""))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{query}");
        let body: Value =
            serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes())
                .unwrap();
        assert_eq!(body["error"]["code"], "wrong_style", "{query}");
    }
}

/// The same bounded buffer holds a WASI command whose client does not read;
/// a client that leaves stops it at its next write (it does not get to see
/// an error and exit 2 by itself) and every quota is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasi_stdout_back_pressure_and_disconnect_stop_the_command() {
    let s = EnforcedApp::new();
    let (tid, t) = s.tenant("flooder", json!({})).await;
    let id = deploy_command(&s, &t, FLOOD_COMMAND).await;
    let tenant = s.tenants.lookup(&tid).unwrap();

    let response = s
        .app
        .clone()
        .oneshot(stream_request(&t, &id, "", "*/*", ""))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    assert_holds_for_async(
        HELD_WINDOW,
        "the command is held by the full buffer, not finished",
        || tenant.usage(Resource::ConcurrentInvocations) == 1,
    )
    .await;
    for _ in 0..3 {
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap().len(), 4096);
    }
    drop(body);

    all_released(&tenant).await;
    let metrics = s
        .as_token(&s.admin, axum::http::Method::GET, "/metrics", Value::Null)
        .await;
    let text = String::from_utf8(metrics.body).unwrap();
    assert!(
        text.contains(r#"tensor_wasm_invocations_total{outcome="ok"} 0"#),
        "the command must not have ended by itself: {text}"
    );
    assert!(
        text.contains(r#"tensor_wasm_invocations_total{outcome="error"} 1"#),
        "{text}"
    );
}
