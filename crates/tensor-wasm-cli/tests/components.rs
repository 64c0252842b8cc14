//! WebAssembly components end to end (issue 20, the first style): a real `tensor-wasm serve`
//! on a socket deploys a WASI 0.2 command component (`examples/echo-component.wat`) through
//! `POST /functions` and runs it through `POST /functions/{id}/invoke` and `/invoke-stream`,
//! stdin to stdout; a
//! component that never ends is answered `invocation_timeout` at its deadline and the server
//! keeps serving; a component's typed exports take JSON by their WIT types
//! (`examples/typed-component.wat`); an HTTP handler whose `handle` has the wrong type is
//! refused with `invalid_module` (HTTP handlers that run: `http_handlers.rs`).

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
