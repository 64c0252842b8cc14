//! WebAssembly components end to end (the first style): a real `tensor-wasm serve`
//! on a socket deploys a WASI 0.2 command component (`examples/echo-component.wat`) through
//! `POST /functions` and runs it through `POST /functions/{id}/invoke` and `/invoke-stream`,
//! stdin to stdout; a
//! component that never ends is answered `invocation_timeout` at its deadline and the server
//! keeps serving; a component's typed exports take JSON by their WIT types
//! (`examples/typed-component.wat`); an HTTP handler whose `handle` has the wrong type is
//! refused with `invalid_module` (HTTP handlers that run: `http_handlers.rs`); a typed export
//! blocked in a host wait ends at its deadline as a direct call and as async jobs.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use tensor_wasm_test_support::guests::{example, examples_dir, MISTYPED_HTTP_HANDLER_COMPONENT};
use tensor_wasm_test_support::serve::{error_code, json_of, ServeProcess};
use tensor_wasm_test_support::wait::wait_for;

const BIN: &str = env!("CARGO_BIN_EXE_tensor-wasm");

#[test]
fn a_command_component_is_served_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(Path::new(BIN), dir.path(), &[]);
    let echo = server.deploy(&examples_dir().join("echo-component.wat"), "name=echo");
    let (status, body) = server.get(&format!("/functions/{echo}"));
    assert_eq!(status, 200);
    let info = json_of(&body);
    assert_eq!(
        (info["component"].clone(), info["style"].clone()),
        (true.into(), "wasi".into())
    );

    let invoke = format!("/functions/{echo}/invoke");
    let (status, body, exit) = server.post(&invoke, "application/octet-stream", b"over http\n");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(
        (body.as_slice(), exit.as_deref()),
        (&b"over http\n"[..], Some("0"))
    );

    // Streamed: the chunked body carries what the component wrote.
    let streamed = ServeProcess::agent()
        .post(&server.url(&format!("/functions/{echo}/invoke-stream")))
        .set("authorization", &server.auth())
        .set("accept", "application/octet-stream")
        .send_bytes(b"streamed")
        .expect("a streamed answer");
    assert_eq!(streamed.content_type(), "application/octet-stream");
    assert_eq!(streamed.into_string().unwrap(), "streamed");

    // A component that never returns: answered at its deadline; the server keeps serving.
    let spin = String::from_utf8(example("echo-component.wat"))
        .unwrap()
        .replace(
            "call $echo i32.const 0))",
            "(loop $l (br $l)) i32.const 0))",
        );
    let (status, body, _) = server.post(
        "/functions?name=spin&timeout_ms=300",
        "application/wasm",
        spin.as_bytes(),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let spin = json_of(&body)["id"].as_str().unwrap().to_owned();
    let (status, body, _) = server.post(&format!("/functions/{spin}/invoke"), "text/plain", b"");
    assert_eq!(
        (status, error_code(&json_of(&body))),
        (504, "invocation_timeout")
    );
    let (status, body, _) = server.post(&invoke, "application/octet-stream", b"still here");
    assert_eq!((status, body.as_slice()), (200, &b"still here"[..]));

    // Typed exports: JSON arguments by the exports' WIT types; a mismatch is a 400.
    let typed = server.deploy(&examples_dir().join("typed-component.wat"), "name=typed");
    let call = |body: &str| {
        let path = format!("/functions/{typed}/invoke");
        server.post(&path, "application/json", body.as_bytes())
    };
    // The function lists its typed exports with their WIT types, so a client knows what to send.
    let (status, body) = server.get(&format!("/functions/{typed}"));
    assert_eq!(status, 200);
    let listed = json_of(&body);
    assert_eq!(
        listed["typed_exports"][1],
        json!({"name": "distance", "wit": "func(p: record { x: f64, y: f64 }) -> f64"}),
        "{listed}"
    );
    assert_eq!(listed["exports"], json!([]));
    let (status, body, _) = call(r#"{"export": "distance", "args": [{"x": 3, "y": 4}]}"#);
    assert_eq!((status, json_of(&body)), (200, json!({"results": [5.0]})));
    let (status, body, _) = call(r#"{"export": "checked-div", "args": [7, 0]}"#);
    assert_eq!(
        (status, json_of(&body)),
        (200, json!({"results": [{"err": 7}]}))
    );
    let (status, body, _) = call(r#"{"export": "add", "args": ["x", 1]}"#);
    let body = json_of(&body);
    assert_eq!(
        (status, error_code(&body)),
        (400, "invalid_arguments"),
        "{body}"
    );

    // Snapshots of components are refused, saying so.
    let (status, body, _) = server.post(
        &format!("/functions/{typed}/snapshots"),
        "application/json",
        br#"{"init_export": "add"}"#,
    );
    let body = json_of(&body);
    assert_eq!(
        (status, error_code(&body)),
        (422, "snapshot_unsupported"),
        "{body}"
    );

    // An async job of a typed export.
    let (status, body, _) = server.post(
        &format!("/functions/{typed}/invoke-async"),
        "application/json",
        br#"{"export": "add", "args": [20, 22]}"#,
    );
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
    let job = json_of(&body)["job_id"].as_str().unwrap().to_owned();
    let (done, _) = wait_for(Duration::from_secs(10), "the job finishes", || {
        let (status, body) = server.get(&format!("/jobs/{job}"));
        assert_eq!(status, 200);
        let body = json_of(&body);
        (body["status"] != "queued" && body["status"] != "running").then_some(body)
    });
    assert_eq!(
        (done["status"].clone(), done["results"].clone()),
        (json!("succeeded"), json!([42]))
    );

    // An HTTP handler whose `handle` has the wrong type is refused, saying so.
    let (status, body, _) = server.post(
        "/functions?name=handler",
        "application/wasm",
        MISTYPED_HTTP_HANDLER_COMPONENT.as_bytes(),
    );
    let body = json_of(&body);
    assert_eq!(
        (status, error_code(&body)),
        (400, "invalid_module"),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("wasi:http/incoming-handler"),
        "{body}"
    );
    server.terminate();
}

/// A typed export that waits in the host: `clog` makes an outgoing response it never sets and
/// calls `blocking-write-and-flush` on its body, which nobody reads, forever; `ok` returns 1.
const CLOGGING_EXPORT: &str = r#"(component
  (import "wasi:io/error@0.2.0" (instance $ioerr (export "error" (type (sub resource)))))
  (alias export $ioerr "error" (type $ioerror))
  (import "wasi:io/streams@0.2.0" (instance $streams
    (alias outer 1 $ioerror (type $e0))
    (export "error" (type $e (eq $e0)))
    (export "output-stream" (type $os (sub resource)))
    (type $se (variant (case "last-operation-failed" (own $e)) (case "closed")))
    (export "stream-error" (type $se2 (eq $se)))
    (export "[method]output-stream.blocking-write-and-flush"
      (func (param "self" (borrow $os)) (param "contents" (list u8))
        (result (result (error $se2)))))))
  (alias export $streams "output-stream" (type $output-stream))
  (import "wasi:http/types@0.2.0" (instance $http
    (alias outer 1 $output-stream (type $os0))
    (export "output-stream" (type $os (eq $os0)))
    (export "fields" (type $f (sub resource)))
    (export "outgoing-body" (type $ob (sub resource)))
    (export "outgoing-response" (type $or (sub resource)))
    (export "[constructor]fields" (func (result (own $f))))
    (export "[constructor]outgoing-response" (func (param "headers" (own $f)) (result (own $or))))
    (export "[method]outgoing-response.body"
      (func (param "self" (borrow $or)) (result (result (own $ob)))))
    (export "[method]outgoing-body.write"
      (func (param "self" (borrow $ob)) (result (result (own $os)))))))
  (core module $libc (memory (export "memory") 1))
  (core instance $libc (instantiate $libc))
  (alias core export $libc "memory" (core memory $memory))
  (core func $fields (canon lower (func $http "[constructor]fields")))
  (core func $response (canon lower (func $http "[constructor]outgoing-response")))
  (core func $body (canon lower (func $http "[method]outgoing-response.body") (memory $memory)))
  (core func $write (canon lower (func $http "[method]outgoing-body.write") (memory $memory)))
  (core func $flush (canon lower (func $streams "[method]output-stream.blocking-write-and-flush")
    (memory $memory)))
  (core module $main
    (import "host" "memory" (memory 1))
    (import "host" "fields" (func $fields (result i32)))
    (import "host" "response" (func $response (param i32) (result i32)))
    (import "host" "body" (func $body (param i32 i32)))
    (import "host" "write" (func $write (param i32 i32)))
    (import "host" "flush" (func $flush (param i32 i32 i32 i32)))
    (func (export "clog") (result i32)
      (local $stream i32)
      ;; result<own<T>> at 64: its tag, then the handle at 68.
      (call $body (call $response (call $fields)) (i32.const 64))
      (call $write (i32.load (i32.const 68)) (i32.const 64))
      (local.set $stream (i32.load (i32.const 68)))
      (loop $again
        (call $flush (local.get $stream) (i32.const 1024) (i32.const 4096) (i32.const 96))
        (br $again))
      (i32.const 0))
    (func (export "ok") (result i32) (i32.const 1)))
  (core instance $i (instantiate $main (with "host" (instance
    (export "memory" (memory $memory))
    (export "fields" (func $fields))
    (export "response" (func $response))
    (export "body" (func $body))
    (export "write" (func $write))
    (export "flush" (func $flush))))))
  (func $clog (result u32) (canon lift (core func $i "clog")))
  (export "clog" (func $clog))
  (func $ok (result u32) (canon lift (core func $i "ok")))
  (export "ok" (func $ok)))"#;

/// Async jobs of a typed export that waits in the host end at the deadline like a direct
/// call: each fails with `invocation_timeout`, the instance slots are free again, and the
/// next call answers.
#[test]
fn async_jobs_of_a_typed_export_waiting_in_the_host_end_at_their_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(Path::new(BIN), dir.path(), &[]);
    let (status, body, _) = server.post(
        "/functions?name=clogging&timeout_ms=300",
        "application/wasm",
        CLOGGING_EXPORT.as_bytes(),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let id = json_of(&body)["id"].as_str().unwrap().to_owned();
    // Directly, then as jobs.
    let (status, body, _) = server.post(
        &format!("/functions/{id}/invoke"),
        "application/json",
        br#"{"export": "clog", "args": []}"#,
    );
    assert_eq!(
        (status, error_code(&json_of(&body))),
        (504, "invocation_timeout")
    );
    let jobs: Vec<String> = (0..4)
        .map(|_| {
            let (status, body, _) = server.post(
                &format!("/functions/{id}/invoke-async"),
                "application/json",
                br#"{"export": "clog", "args": []}"#,
            );
            assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
            json_of(&body)["job_id"].as_str().unwrap().to_owned()
        })
        .collect();
    for job in &jobs {
        let (done, _) = wait_for(Duration::from_secs(30), "the job ends", || {
            let body = json_of(&server.get(&format!("/jobs/{job}")).1);
            (body["status"] != "queued" && body["status"] != "running").then_some(body)
        });
        assert_eq!(
            (done["status"].as_str(), done["error"]["code"].as_str()),
            (Some("failed"), Some("invocation_timeout")),
            "{done}"
        );
    }
    tensor_wasm_test_support::wait::wait_until(
        Duration::from_secs(10),
        "no instance slot in use",
        || server.metric("tensor_wasm_instance_slots_in_use") == Some(0.0),
    );
    let cancelled = server
        .metric("tensor_wasm_component_deadline_cancellations_total{style=\"export\"}")
        .unwrap_or(0.0);
    assert!(cancelled >= 5.0, "{cancelled}");
    let (status, body, _) = server.post(
        &format!("/functions/{id}/invoke"),
        "application/json",
        br#"{"export": "ok", "args": []}"#,
    );
    assert_eq!((status, json_of(&body)), (200, json!({"results": [1]})));
    server.terminate();
}
