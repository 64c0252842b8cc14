//! HTTP-handler components: `examples/components/python/http_app.py`, built by
//! componentize-py against the `wasi:http` WIT the server implements, deployed to a real
//! `tensor-wasm serve` and called at `/functions/{id}/http/{path}` and
//! `/functions/by-name/{name}/http/{path}` over real sockets: methods, paths, queries,
//! headers, JSON bodies, a large body echoed as it streams, a streamed response, the
//! component's own error statuses. Its hostile requests (an exception, an endless loop, a
//! memory hog, an oversized body declared or chunked, a body that stops arriving) answer the
//! usual codes and the server keeps serving. The same API in JavaScript
//! (`examples/components/js/http.js`, componentize-js) is served too. Outgoing HTTP reaches
//! only the origins of `--outgoing-http-allow` (none by default) and ends at the deadline. C's
//! HTTP handler: `toolchain_guests.rs`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use tensor_wasm_test_support::guests::examples_dir;
use tensor_wasm_test_support::serve::{error_code, json_of, ServeProcess};
use tensor_wasm_test_support::toolchains::{
    componentize_js_build, componentize_py_build, wasi_http_proxy_world, wasi_http_wit, wasi_wit_as,
};

const BIN: &str = env!("CARGO_BIN_EXE_tensor-wasm");

/// `examples/components/python/http_app.py` built by componentize-py into `out`.
fn python_handler(out: &Path) -> PathBuf {
    let wit = wasi_http_wit();
    let wasm = out.join("http-python.wasm");
    componentize_py_build(&wit, &wasi_http_proxy_world(&wit), "http_app", &wasm);
    wasm
}

/// One request: status, headers (lowercase names) and body.
fn request(
    server: &ServeProcess,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut req = ServeProcess::agent()
        .request(method, &server.url(path))
        .set("authorization", &server.auth());
    for (name, value) in headers {
        req = req.set(name, value);
    }
    let response = match req.send_bytes(body) {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let status = response.status();
    let names = response.headers_names();
    let headers = names
        .iter()
        .map(|n| {
            let value = response.header(n).unwrap_or_default().to_owned();
            (n.to_ascii_lowercase(), value)
        })
        .collect();
    let mut bytes = Vec::new();
    response
        .into_reader()
        .read_to_end(&mut bytes)
        .unwrap_or_else(|e| panic!("{method} {path}: reading the body: {e}"));
    (status, headers, bytes)
}

/// An answer's status and JSON body.
fn json_answer(
    (status, _, body): (u16, Vec<(String, String)>, Vec<u8>),
) -> (u16, serde_json::Value) {
    (status, json_of(&body))
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// A raw HTTP/1.1 exchange: `head` (without the blank line), then the body `parts` written
/// one after the other. Returns the status code of the answer (not a `100 Continue`), or
/// `None` when the server closed first, and the connection, still open.
fn raw(server: &ServeProcess, head: &str, parts: &[&[u8]]) -> (Option<u16>, TcpStream) {
    let addr = server
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut stream = TcpStream::connect(&addr).expect("connecting");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let head = format!(
        "{head}\r\nhost: {addr}\r\nauthorization: {}\r\n\r\n",
        server.auth()
    );
    stream.write_all(head.as_bytes()).expect("writing the head");
    for part in parts {
        if stream.write_all(part).is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let status = String::from_utf8_lossy(&answer)
            .split("\r\n")
            .filter_map(|line| line.strip_prefix("HTTP/1.1 "))
            .filter_map(|rest| rest.get(..3)?.parse::<u16>().ok())
            .find(|code| *code != 100);
        if status.is_some() {
            return (status, stream);
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return (None, stream),
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
}

/// The answers every implementation of the examples' small JSON API gives (`http_app.py`,
/// `http.js`), at the routes `at` makes: methods, paths, queries, headers, JSON, the handler's
/// own 400 and 404, and a 900 kB body echoed with its content type.
fn check_json_api(server: &ServeProcess, at: &dyn Fn(&str) -> String, language: &str) {
    let (status, headers, body) = request(server, "GET", &at("/hello"), &[], b"");
    let greeting = format!("hello from {language}\n");
    assert_eq!((status, body.as_slice()), (200, greeting.as_bytes()));
    assert_eq!(header(&headers, "content-type"), Some("text/plain"));
    assert_eq!(
        json_answer(request(
            server,
            "DELETE",
            &at("/items/7?x=1&y=two"),
            &[],
            b""
        )),
        (
            200,
            json!({"id": 7, "method": "DELETE", "query": {"x": "1", "y": "two"}})
        )
    );
    assert_eq!(
        json_answer(request(server, "GET", &at("/items/seven"), &[], b"")),
        (400, json!({"error": "an item id is a number"}))
    );
    assert_eq!(
        json_answer(request(server, "GET", &at("/nowhere"), &[], b"")),
        (404, json!({"error": "not found", "path": "/nowhere"}))
    );
    let (status, seen) = json_answer(request(
        server,
        "GET",
        &at("/headers"),
        &[("x-tenant-thing", "blue")],
        b"",
    ));
    assert_eq!((status, &seen["x-tenant-thing"]), (200, &json!("blue")));
    assert_eq!(
        json_answer(request(
            server,
            "POST",
            &at("/sum"),
            &[("content-type", "application/json")],
            br#"{"numbers": [1, 2, 3.5]}"#
        )),
        (200, json!({"sum": 6.5}))
    );
    assert_eq!(
        json_answer(request(server, "POST", &at("/sum"), &[], b"{not json")).0,
        400
    );
    // A large body, echoed (the Python one writes it back while it streams in).
    let large: Vec<u8> = (0..900_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let (status, headers, body) = request(
        server,
        "PUT",
        &at("/echo"),
        &[("content-type", "application/x-test")],
        &large,
    );
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "content-type"), Some("application/x-test"));
    assert!(body == large, "the echoed body differs");
}

#[test]
fn an_http_handler_from_componentize_py_is_served_and_survives_hostile_requests() {
    let out = tempfile::tempdir().unwrap();
    let wasm = python_handler(out.path());
    let dir = tempfile::tempdir().unwrap();
    // One instance slot: a slot a hostile request kept would refuse the last request.
    let limit: usize = 32 << 20;
    let server = ServeProcess::start(
        Path::new(BIN),
        dir.path(),
        &[
            "--max-body-bytes",
            &limit.to_string(),
            "--max-instances",
            "1",
            "--queue-timeout-ms",
            "5000",
        ],
    );
    let id = server.deploy(
        &wasm,
        "name=api&timeout_ms=5000&memory_limit_bytes=134217728",
    );
    let (status, body) = server.get(&format!("/functions/{id}"));
    assert_eq!(status, 200);
    assert_eq!(json_of(&body)["style"], "http");
    let at = |path: &str| format!("/functions/{id}/http{path}");

    // Method, path, query, headers and bodies pass through.
    check_json_api(&server, &at, "Python");
    assert_eq!(
        json_answer(request(&server, "GET", &at(""), &[], b"")),
        (404, json!({"error": "not found", "path": "/"}))
    );
    let (status, _, body) = request(&server, "GET", &at("/stream?n=50"), &[], b"");
    assert_eq!(status, 200);
    let expected: String = (0..50).map(|i| format!("line {i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&body), expected);
    // By name.
    assert_eq!(
        request(
            &server,
            "GET",
            "/functions/by-name/api/http/hello",
            &[],
            b""
        )
        .0,
        200
    );
    let (status, body) = json_answer(request(
        &server,
        "GET",
        "/functions/by-name/nope/http/x",
        &[],
        b"",
    ));
    assert_eq!((status, error_code(&body)), (404, "not_found"));

    // The wrong route for the style, both ways.
    let (status, body, _) = server.post(
        &format!("/functions/{id}/invoke"),
        "application/json",
        b"{}",
    );
    assert_eq!((status, error_code(&json_of(&body))), (400, "wrong_style"));
    let echo = server.deploy(&examples_dir().join("echo-component.wat"), "name=echo");
    let (status, body) = json_answer(request(
        &server,
        "GET",
        &format!("/functions/{echo}/http/"),
        &[],
        b"",
    ));
    assert_eq!((status, error_code(&body)), (400, "wrong_style"));
    let (status, body) = json_answer(request(
        &server,
        "GET",
        "/functions/by-name/echo/http/",
        &[],
        b"",
    ));
    assert_eq!((status, error_code(&body)), (400, "wrong_style"));

    // Hostile requests.
    let code = |r: (u16, Vec<(String, String)>, Vec<u8>)| {
        let (status, body) = json_answer(r);
        (status, error_code(&body).to_owned())
    };
    assert_eq!(
        code(request(&server, "GET", &at("/fail"), &[], b"")),
        (502, "handler_failed".into())
    );
    assert_eq!(
        code(request(&server, "GET", &at("/boom"), &[], b"")),
        (500, "guest_trap".into())
    );
    let started = Instant::now();
    assert_eq!(
        code(request(&server, "GET", &at("/spin"), &[], b"")),
        (504, "invocation_timeout".into())
    );
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(
        code(request(&server, "GET", &at("/hog?mib=512"), &[], b"")),
        (500, "memory_limit_exceeded".into())
    );
    assert_eq!(
        json_answer(request(&server, "GET", &at("/hog?mib=8"), &[], b"")),
        (200, json!({"held": 8 << 20}))
    );
    hoarded_fields_end_at_the_memory_limit(&server, &wasm);
    assert_eq!(request(&server, "GET", &at("/hello"), &[], b"").0, 200);
    // Declared: refused before the component starts.
    assert_eq!(
        raw(
            &server,
            &format!(
                "POST {} HTTP/1.1\r\ncontent-length: {}",
                at("/sum"),
                limit + 1
            ),
            &[]
        )
        .0,
        Some(413)
    );
    // Chunked, so only the reading finds it too large.
    let chunk = vec![b'1'; 1 << 20];
    let mut chunked = Vec::new();
    for _ in 0..(limit >> 20) + 8 {
        chunked.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        chunked.extend_from_slice(&chunk);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    assert_eq!(
        raw(
            &server,
            &format!("POST {} HTTP/1.1\r\ntransfer-encoding: chunked", at("/sum")),
            &[&chunked]
        )
        .0,
        Some(413)
    );
    // A body that stops arriving: the handler's read fails at its deadline, which frees the
    // one slot while the client still holds its connection open.
    let started = Instant::now();
    let (status, stalled) = raw(
        &server,
        &format!("POST {} HTTP/1.1\r\ncontent-length: 100", at("/sum")),
        &[b"{\"numbers\": [1,"],
    );
    assert_eq!(status, Some(504));
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(request(&server, "GET", &at("/hello"), &[], b"").0, 200);
    drop(stalled);

    // A sleep shorter than the deadline is kept; one past it ends at the deadline, which frees
    // the one slot then, not when the sleep would have ended.
    assert_eq!(
        json_answer(request(&server, "GET", &at("/sleep?s=0.2"), &[], b"")),
        (200, json!({"slept": 0.2}))
    );
    let started = Instant::now();
    let (status, body) = json_answer(request(&server, "GET", &at("/sleep?s=600"), &[], b""));
    assert_eq!((status, error_code(&body)), (504, "invocation_timeout"));
    assert_eq!(request(&server, "GET", &at("/hello"), &[], b"").0, 200);
    assert!(started.elapsed() < Duration::from_secs(30));

    // Writes to a response body nobody reads (the response is never set) wait in the host, not
    // in guest code the epoch deadline stops: they end at the deadline all the same, and the
    // one slot is free again each time.
    for _ in 0..3 {
        let started = Instant::now();
        let (status, body) = json_answer(request(&server, "GET", &at("/clog"), &[], b""));
        assert_eq!(
            (status, error_code(&body)),
            (504, "invocation_timeout"),
            "{body}"
        );
        assert_eq!(request(&server, "GET", &at("/hello"), &[], b"").0, 200);
        assert!(started.elapsed() < Duration::from_secs(30));
    }

    hostile_waits_in_a_row(&server, &wasm);
    a_client_going_away_ends_the_component(&server, &wasm);

    // Outgoing HTTP is refused without an allow-list, the server's own API included.
    let own = server.url("/healthz");
    assert_eq!(
        json_answer(request(
            &server,
            "GET",
            &at(&format!("/fetch?url={own}")),
            &[],
            b""
        )),
        (200, json!({"error": "HttpRequestDenied"}))
    );

    // Still serving.
    assert_eq!(request(&server, "GET", &at("/hello"), &[], b"").0, 200);
    server.terminate();
}

/// Header fields the handler keeps making are charged to its memory limit: the host refuses
/// them there, not hundreds of megabytes later. Reaching 128 MiB one 60 kB field at a time
/// takes under a second on an idle machine and several on a loaded one (the server is a debug
/// build), so this function gets a 30 s deadline: the answer must come from the memory limit,
/// never from the deadline.
fn hoarded_fields_end_at_the_memory_limit(server: &ServeProcess, wasm: &Path) {
    let id = server.deploy(
        wasm,
        "name=hoarder&timeout_ms=30000&memory_limit_bytes=134217728",
    );
    let (status, body) = json_answer(request(
        server,
        "GET",
        &format!("/functions/{id}/http/hoard"),
        &[],
        b"",
    ));
    assert_eq!(
        (status, error_code(&body)),
        (500, "memory_limit_exceeded"),
        "{body}"
    );
}

/// 50 hostile invocations in a row (`serve::hostile_waits_in_a_row`) of the Python handler
/// deployed with a 200 ms deadline.
fn hostile_waits_in_a_row(server: &ServeProcess, wasm: &Path) {
    let id = server.deploy(
        wasm,
        "name=hostile&timeout_ms=200&memory_limit_bytes=134217728",
    );
    tensor_wasm_test_support::serve::hostile_waits_in_a_row(server, &id);
}

/// A client that goes away while the handler waits in the host (a write to a body nobody
/// reads) ends the invocation then, far before its deadline (10 minutes): the instance slot is
/// free again and the same tenant's next call answers.
fn a_client_going_away_ends_the_component(server: &ServeProcess, wasm: &Path) {
    let id = server.deploy(wasm, "name=abandoned&timeout_ms=600000");
    let addr = server
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let slots = || {
        server
            .metric("tensor_wasm_instance_slots_in_use")
            .unwrap_or(-1.0)
    };
    tensor_wasm_test_support::wait::wait_until(Duration::from_secs(10), "no slot in use", || {
        slots() == 0.0
    });
    let mut client = TcpStream::connect(&addr).expect("connecting");
    let head = format!(
        "GET /functions/{id}/http/clog HTTP/1.1\r\nhost: {addr}\r\nauthorization: {}\r\n\r\n",
        server.auth()
    );
    client
        .write_all(head.as_bytes())
        .expect("writing the request");
    tensor_wasm_test_support::wait::wait_until(
        Duration::from_secs(30),
        "the handler holds a slot",
        || slots() == 1.0,
    );
    drop(client);
    tensor_wasm_test_support::wait::wait_until(
        Duration::from_secs(30),
        "the slot freed when the client went away",
        || slots() == 0.0,
    );
    let at = format!("/functions/{id}/http/hello");
    assert_eq!(request(server, "GET", &at, &[], b"").0, 200);
}

/// A plain HTTP/1.1 server on a free port that answers every request with its path; and one
/// that accepts connections and never answers. Their threads end with the test process.
fn upstreams() -> (u16, u16) {
    let answering = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let ports = (
        answering.local_addr().unwrap().port(),
        silent.local_addr().unwrap().port(),
    );
    std::thread::spawn(move || {
        for mut conn in answering.incoming().flatten() {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
            let path = head.split(' ').nth(1).unwrap_or("?");
            // A W3C trace context, when the server exports traces, is said so.
            let traced = match head.split("\r\ntraceparent: ").nth(1) {
                Some(rest) if rest.starts_with("00-") => " (traced)",
                _ => "",
            };
            let body = format!("upstream saw {path}{traced}");
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    std::thread::spawn(move || {
        let held: Vec<TcpStream> = silent.incoming().flatten().collect();
        drop(held);
    });
    ports
}

/// `--outgoing-http-allow`: a component reaches the origins on it, exactly (scheme, host and
/// port), and nothing else; a request to an upstream that never answers ends at the
/// invocation's deadline and frees the one instance slot.
#[test]
fn outgoing_http_reaches_only_allowed_origins_and_ends_at_the_deadline() {
    let out = tempfile::tempdir().unwrap();
    let wasm = python_handler(out.path());
    let (answering, silent) = upstreams();
    let dir = tempfile::tempdir().unwrap();
    let allow = format!("http://127.0.0.1:{answering},http://127.0.0.1:{silent}");
    let server = ServeProcess::start(
        Path::new(BIN),
        dir.path(),
        &["--outgoing-http-allow", &allow, "--max-instances", "1"],
    );
    let id = server.deploy(
        &wasm,
        "name=api&timeout_ms=3000&memory_limit_bytes=134217728",
    );
    let fetch = |url: &str| {
        let path = format!("/functions/{id}/http/fetch?url={url}");
        json_answer(request(&server, "GET", &path, &[], b""))
    };
    assert_eq!(
        fetch(&format!("http://127.0.0.1:{answering}/items/7")),
        (200, json!({"status": 200, "body": "upstream saw /items/7"}))
    );
    let denied = (200, json!({"error": "HttpRequestDenied"}));
    // Another port, the same port by another name, another scheme: not on the list.
    assert_eq!(fetch(&server.url("/healthz")), denied);
    assert_eq!(fetch(&format!("http://localhost:{answering}/")), denied);
    assert_eq!(fetch(&format!("https://127.0.0.1:{answering}/")), denied);

    let started = Instant::now();
    let (status, body) = fetch(&format!("http://127.0.0.1:{silent}/"));
    assert_eq!((status, error_code(&body)), (504, "invocation_timeout"));
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(
        fetch(&format!("http://127.0.0.1:{answering}/again")),
        (200, json!({"status": 200, "body": "upstream saw /again"}))
    );
    server.terminate();

    // With traces exported, the component's outgoing request carries `traceparent` (the
    // collector here refuses connections: spans are dropped, requests are not slowed).
    let dir = tempfile::tempdir().unwrap();
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let collector = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let traced = ServeProcess::start_with_env(
        Path::new(BIN),
        dir.path(),
        &["--outgoing-http-allow", &allow],
        &[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            std::ffi::OsStr::new(&collector),
        )],
        "warn",
        std::process::Stdio::inherit(),
    );
    let id = traced.deploy(
        &wasm,
        "name=api&timeout_ms=3000&memory_limit_bytes=134217728",
    );
    let path = format!("/functions/{id}/http/fetch?url=http://127.0.0.1:{answering}/t");
    assert_eq!(
        json_answer(request(&traced, "GET", &path, &[], b"")),
        (
            200,
            json!({"status": 200, "body": "upstream saw /t (traced)"})
        )
    );
}

/// A malformed allow-list stops the server at start with the reason.
#[test]
fn a_malformed_outgoing_allow_list_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .args(["--outgoing-http-allow", "http://example.com/api"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("has no path or query"), "{stderr}");
}

/// An HTTP handler from componentize-js (`examples/components/js/http.js`, its fetch-event API),
/// built against the server's `wasi:http` WIT as version 0.2.10, the version componentize-js
/// 0.23.0's engine exports: the same JSON API over real sockets. An uncaught exception is
/// answered 500 by the component's own runtime (a response it makes, not a trap); an endless
/// loop is stopped at the deadline.
#[test]
fn an_http_handler_from_componentize_js_is_served() {
    let out = tempfile::tempdir().unwrap();
    let wit = wasi_wit_as(out.path(), "0.2.10", None);
    let wasm = out.path().join("http-js.wasm");
    let source = examples_dir().join("components/js/http.js");
    componentize_js_build(&source, &wit, "app", true, &wasm);
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(Path::new(BIN), dir.path(), &[]);
    let id = server.deploy(&wasm, "name=api-js&timeout_ms=3000");
    let at = |path: &str| format!("/functions/{id}/http{path}");

    check_json_api(&server, &at, "JavaScript");
    // componentize-js answers an exception with a 500 whose body it never finishes: the body
    // is cut, as the WIT asks of an unfinished body, after the status.
    assert_eq!(
        raw(&server, &format!("GET {} HTTP/1.1", at("/boom")), &[]).0,
        Some(500)
    );
    let (status, body) = json_answer(request(&server, "GET", &at("/spin"), &[], b""));
    assert_eq!((status, error_code(&body)), (504, "invocation_timeout"));
    assert_eq!(
        request(&server, "GET", &at("/hello"), &[], b"").0,
        200,
        "still serving"
    );
    server.terminate();
}
