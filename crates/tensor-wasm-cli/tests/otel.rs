//! Traces over OTLP from the real server binary: the spans of a deploy, an
//! invoke that launches a kernel (under a caller's `traceparent`), a guest's
//! own spans, a stream and an async job, read back and checked as a tree;
//! the trace id in the JSON log lines; and a collector that never answers
//! costing requests nothing.
//!
//! `make test` decodes what the server exports with an OTLP/HTTP receiver of
//! this file's own (the protobuf messages of `opentelemetry-proto`). `make
//! otel-check` runs the same workload against a real trace store (Arize
//! Phoenix from PyPI, `scripts/otel-store.sh`) and reads the spans back from
//! its query API (the ignored test at the end).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;
use serde_json::{json, Value};
use tensor_wasm_test_support::serve::{json_of, ServeProcess};
use tensor_wasm_test_support::wait::wait_until;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tensor-wasm"))
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// A guest that wraps its work in spans of its own (`tw:trace`).
const TRACED_GUEST: &str = r#"(module
  (import "tw:trace" "span_start" (func $start (param i32 i32) (result i32)))
  (import "tw:trace" "span_set" (func $set (param i32 i32 i32 i32 i32) (result i32)))
  (import "tw:trace" "span_end" (func $end (param i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "prepare")
  (data (i32.const 16) "rows")
  (data (i32.const 32) "128")
  (data (i32.const 48) "inner")
  (data (i32.const 64) "faas.name")
  (func (export "run") (result i32)
    (local $outer i32) (local $inner i32) (local $denied i32)
    (local.set $outer (call $start (i32.const 0) (i32.const 7)))
    (drop (call $set (local.get $outer) (i32.const 16) (i32.const 4) (i32.const 32) (i32.const 3)))
    (local.set $inner (call $start (i32.const 48) (i32.const 5)))
    ;; A host key is refused (PERMISSION_DENIED, -3).
    (local.set $denied
      (call $set (local.get $inner) (i32.const 64) (i32.const 9) (i32.const 32) (i32.const 3)))
    (drop (call $end (local.get $inner)))
    (drop (call $end (local.get $outer)))
    (local.get $denied)))"#;

/// A component that traces a step of its own (`tensor-wasm:trace`): `run`
/// answers 0 when its attribute was set.
const TRACED_COMPONENT: &str = r#"(component
  (import "tensor-wasm:trace/spans@0.1.0" (instance $spans
    (type $e (variant (case "invalid-argument" string) (case "limit-exceeded" string)
      (case "permission-denied" string)))
    (export "error" (type $e2 (eq $e)))
    (export "span" (type $s (sub resource)))
    (export "[static]span.start" (func (param "name" string) (result (result (own $s) (error $e2)))))
    (export "[method]span.set" (func (param "self" (borrow $s)) (param "key" string)
      (param "value" string) (result (result (error $e2)))))
    (export "[method]span.end" (func (param "self" (borrow $s))))))
  (alias export $spans "span" (type $span))
  (core module $libc
    (memory (export "memory") 1)
    (global $next (mut i32) (i32.const 1024))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $at i32)
      (local.set $at (global.get $next))
      (global.set $next (i32.add (global.get $next) (local.get 3)))
      (local.get $at)))
  (core instance $libc (instantiate $libc))
  (alias core export $libc "memory" (core memory $memory))
  (alias core export $libc "realloc" (core func $realloc))
  (core func $start (canon lower (func $spans "[static]span.start") (memory $memory)
    (realloc $realloc)))
  (core func $set (canon lower (func $spans "[method]span.set") (memory $memory)
    (realloc $realloc)))
  (core func $end (canon lower (func $spans "[method]span.end")))
  (core func $drop (canon resource.drop $span))
  (core module $main
    (import "host" "memory" (memory 1))
    (import "host" "start" (func $start (param i32 i32 i32)))
    (import "host" "set" (func $set (param i32 i32 i32 i32 i32 i32)))
    (import "host" "end" (func $end (param i32)))
    (import "host" "drop" (func $drop (param i32)))
    (data (i32.const 0) "component-step")
    (data (i32.const 32) "items")
    (data (i32.const 48) "3")
    (func (export "run") (result i32)
      (local $h i32)
      (call $start (i32.const 0) (i32.const 14) (i32.const 512))
      (if (i32.load8_u (i32.const 512)) (then (return (i32.const 99))))
      (local.set $h (i32.load (i32.const 516)))
      (call $set (local.get $h) (i32.const 32) (i32.const 5) (i32.const 48) (i32.const 1)
        (i32.const 544))
      (call $end (local.get $h))
      (call $drop (local.get $h))
      (i32.load8_u (i32.const 544))))
  (core instance $i (instantiate $main (with "host" (instance
    (export "memory" (memory $memory))
    (export "start" (func $start))
    (export "set" (func $set))
    (export "end" (func $end))
    (export "drop" (func $drop))))))
  (func $run (result u32) (canon lift (core func $i "run")))
  (export "run" (func $run)))"#;

/// One exported span, as both readers give it.
#[derive(Debug, Clone)]
struct SpanRec {
    trace_id: String,
    span_id: String,
    parent: Option<String>,
    name: String,
    /// OTLP's span kind (1 internal, 2 server, 3 client, 4 producer, 5
    /// consumer); `None` where the store does not keep it.
    kind: Option<i32>,
    attributes: BTreeMap<String, String>,
    /// (trace id, span id) of each link; `None` where the store does not keep them.
    links: Option<Vec<(String, String)>>,
    error: bool,
}

impl SpanRec {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// An OTLP/HTTP receiver on loopback: decodes every export request.
struct Receiver {
    endpoint: String,
    spans: Arc<Mutex<Vec<SpanRec>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let sink = spans.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let sink = sink.clone();
                std::thread::spawn(move || serve_otlp(conn, &sink));
            }
        });
        Receiver { endpoint, spans }
    }

    fn spans(&self) -> Vec<SpanRec> {
        self.spans.lock().unwrap().clone()
    }
}

/// Answers OTLP/HTTP export requests on one connection (keep-alive).
fn serve_otlp(conn: TcpStream, sink: &Mutex<Vec<SpanRec>>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut writer = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        assert!(line.starts_with("POST /v1/traces "), "{line:?}");
        let mut length = 0usize;
        let mut ctype = String::new();
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).unwrap();
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().unwrap(),
                "content-type" => ctype = value.trim().to_owned(),
                _ => {}
            }
        }
        assert_eq!(ctype, "application/x-protobuf");
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP protobuf");
        let mut decoded = Vec::new();
        for resource in request.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())));
            assert_eq!(service.as_deref(), Some("tensor-wasm"));
            for scope in resource.scope_spans {
                for span in scope.spans {
                    decoded.push(SpanRec {
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent: (!span.parent_span_id.is_empty())
                            .then(|| hex(&span.parent_span_id)),
                        name: span.name,
                        kind: Some(span.kind),
                        attributes: span
                            .attributes
                            .iter()
                            .map(|kv| {
                                (
                                    kv.key.clone(),
                                    text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                                )
                            })
                            .collect(),
                        links: Some(
                            span.links
                                .iter()
                                .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                                .collect(),
                        ),
                        // STATUS_CODE_ERROR
                        error: span.status.is_some_and(|s| s.code == 2),
                    });
                }
            }
        }
        sink.lock().unwrap().extend(decoded);
        let answer =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if writer.write_all(answer).is_err() {
            return;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// A server exporting to `endpoint`, logging JSON lines into `log`.
fn traced_server(
    dir: &Path,
    endpoint: &str,
    extra_env: &[(&str, &str)],
    log: &Path,
) -> ServeProcess {
    let mut env: Vec<(&str, &OsStr)> = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", OsStr::new(endpoint)),
        ("OTEL_BSP_SCHEDULE_DELAY", OsStr::new("100")),
    ];
    env.extend(extra_env.iter().map(|(k, v)| (*k, OsStr::new(*v))));
    ServeProcess::start_with_env(
        bin(),
        dir,
        &["--log-format", "json"],
        &env,
        "warn,tensor_wasm_api=debug",
        Stdio::from(std::fs::File::create(log).unwrap()),
    )
}

/// What the workload did, to find its spans by.
struct Workload {
    /// The caller's trace the invoke joined (its `traceparent`).
    caller_trace: String,
    caller_span: String,
    vadd: String,
    traced: String,
    component: String,
    stream: String,
    job: String,
}

/// Deploys, invokes a kernel under a caller's trace, runs a traced guest, a
/// stream and an async job.
fn run_workload(server: &ServeProcess) -> Workload {
    let vadd = server.deploy(&examples().join("vector_add.wat"), "name=vadd");
    let (status, body, _) = server.post(
        "/functions?name=traced",
        "application/wasm",
        TRACED_GUEST.as_bytes(),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let traced = json_of(&body)["id"].as_str().unwrap().to_owned();
    let stream = server.deploy(&examples().join("stream.wat"), "name=stream");
    let (status, body, _) = server.post(
        "/functions?name=traced-component",
        "application/wasm",
        TRACED_COMPONENT.as_bytes(),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let component = json_of(&body)["id"].as_str().unwrap().to_owned();
    assert_eq!(
        server.call(&component, "run", json!([])),
        (200, json!({"results": [0]}))
    );

    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736".to_owned();
    let caller_span = "00f067aa0ba902b7".to_owned();
    let answer = ServeProcess::agent()
        .post(&server.url(&format!("/functions/{vadd}/invoke")))
        .set("authorization", &server.auth())
        .set(
            "traceparent",
            &format!("00-{caller_trace}-{caller_span}-01"),
        )
        .send_json(json!({"export": "run", "args": [1000]}))
        .expect("invoke");
    assert_eq!(
        answer.into_json::<Value>().unwrap()["results"],
        json!([1000])
    );

    assert_eq!(
        server.call(&traced, "run", json!([])),
        (200, json!({"results": [-3]}))
    );

    let answer = ServeProcess::agent()
        .post(&server.url(&format!(
            "/functions/{stream}/invoke-stream?export=ticks&args=%5B2%2C0%5D"
        )))
        .set("authorization", &server.auth())
        .set("accept", "application/octet-stream")
        .send_bytes(b"")
        .expect("stream");
    let mut streamed = Vec::new();
    answer.into_reader().read_to_end(&mut streamed).unwrap();

    let (status, body, _) = server.post(
        &format!("/functions/{vadd}/invoke-async"),
        "application/json",
        json!({"export": "run", "args": [512]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
    let job = json_of(&body)["job_id"].as_str().unwrap().to_owned();
    wait_until(Duration::from_secs(30), "the job succeeds", || {
        json_of(&server.get(&format!("/jobs/{job}")).1)["status"] == "succeeded"
    });
    Workload {
        caller_trace,
        caller_span,
        vadd,
        traced,
        component,
        stream,
        job,
    }
}

/// Checks the span tree of `work` in `spans`.
fn check_tree(spans: &[SpanRec], work: &Workload) {
    let by_id: BTreeMap<&str, &SpanRec> = spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let parent = |s: &SpanRec| s.parent.as_deref().and_then(|p| by_id.get(p).copied());
    let find = |what: &str, pred: &dyn Fn(&SpanRec) -> bool| -> &SpanRec {
        spans
            .iter()
            .find(|s| pred(s))
            .unwrap_or_else(|| panic!("no span {what} among {spans:#?}"))
    };
    let kind = |s: &SpanRec, k: i32| {
        if let Some(kind) = s.kind {
            assert_eq!(kind, k, "kind of {s:#?}");
        }
    };

    // The deploy: a server span with a compile span under it.
    let deploy = find("for the deploy", &|s| {
        s.name == "POST /functions"
            && spans.iter().any(|c| {
                c.parent.as_deref() == Some(&s.span_id) && c.attr("faas.name") == Some("vadd")
            })
    });
    kind(deploy, 2);
    assert_eq!(deploy.attr("http.request.method"), Some("POST"));
    assert_eq!(deploy.attr("http.route"), Some("/functions"));
    assert_eq!(deploy.attr("http.response.status_code"), Some("201"));
    let compile = find("compile", &|s| {
        s.name == "compile" && s.parent.as_deref() == Some(&deploy.span_id)
    });
    assert_eq!(compile.attr("tensor_wasm.module.component"), Some("false"));

    // The invoke: joined the caller's trace, FaaS span, kernel span.
    let invoke = find("for the traced invoke", &|s| {
        s.trace_id == work.caller_trace && s.name == "POST /functions/{id}/invoke"
    });
    kind(invoke, 2);
    assert_eq!(invoke.parent.as_deref(), Some(work.caller_span.as_str()));
    assert_eq!(invoke.attr("http.response.status_code"), Some("200"));
    let request_id = invoke.attr("tensor_wasm.request_id").expect("a request id");
    let faas = find("FaaS of the invoke", &|s| {
        s.parent.as_deref() == Some(&invoke.span_id) && s.attr("faas.trigger") == Some("http")
    });
    assert_eq!(faas.name, format!("invoke {}", work.vadd));
    assert_eq!(faas.attr("faas.invocation_id"), Some(request_id));
    assert_eq!(faas.attr("tensor_wasm.function"), Some(work.vadd.as_str()));
    assert!(faas
        .attr("tensor_wasm.tenant")
        .is_some_and(|t| !t.is_empty()));
    assert!(matches!(
        faas.attr("faas.coldstart"),
        Some("true" | "false")
    ));
    let kernel = find("kernel of the invoke", &|s| {
        parent(s).is_some_and(|p| p.span_id == faas.span_id) && s.name == "kernel vector_add"
    });
    assert_eq!(kernel.trace_id, work.caller_trace);
    assert_eq!(kernel.attr("tensor_wasm.kernel.backend"), Some("cpu"));
    assert_eq!(kernel.attr("tensor_wasm.kernel.grid"), Some("4,1,1"));
    assert_eq!(kernel.attr("tensor_wasm.kernel.block"), Some("256,1,1"));
    assert_eq!(kernel.attr("tensor_wasm.kernel.bytes"), Some("12000"));
    for timing in [
        "tensor_wasm.kernel.queue_wait_us",
        "tensor_wasm.kernel.run_us",
    ] {
        assert!(
            kernel
                .attr(timing)
                .is_some_and(|v| v.parse::<u64>().is_ok()),
            "{timing} of {kernel:#?}"
        );
    }
    assert!(!kernel.error);

    // The guest's own spans, nested under its invocation; its host key refused.
    let guest_faas = find("FaaS of the traced guest", &|s| {
        s.attr("tensor_wasm.function") == Some(work.traced.as_str())
            && s.attr("faas.trigger").is_some()
    });
    let prepare = find("guest span prepare", &|s| s.name == "prepare");
    assert_eq!(prepare.parent.as_deref(), Some(guest_faas.span_id.as_str()));
    assert_eq!(prepare.attr("rows"), Some("128"));
    assert_eq!(prepare.attr("tensor_wasm.guest"), Some("true"));
    let inner = find("guest span inner", &|s| s.name == "inner");
    assert_eq!(inner.parent.as_deref(), Some(prepare.span_id.as_str()));
    assert_eq!(inner.attr("faas.name"), None);

    // A component's own span, under its invocation.
    let component_faas = find("FaaS of the traced component", &|s| {
        s.attr("tensor_wasm.function") == Some(work.component.as_str())
            && s.attr("faas.trigger").is_some()
    });
    let step = find("component span", &|s| s.name == "component-step");
    assert_eq!(
        step.parent.as_deref(),
        Some(component_faas.span_id.as_str())
    );
    assert_eq!(step.attr("items"), Some("3"));

    // The stream: its FaaS span under its server span.
    let stream = find("FaaS of the stream", &|s| {
        s.attr("tensor_wasm.function") == Some(work.stream.as_str())
            && s.attr("faas.trigger").is_some()
    });
    let stream_http = parent(stream).expect("the stream's server span");
    assert_eq!(stream_http.name, "POST /functions/{id}/invoke-stream");
    assert_eq!(stream.attr("faas.trigger"), Some("http"));

    // The job: a root of its own, linked to the request that submitted it.
    let job = find("FaaS of the job", &|s| {
        s.attr("faas.invocation_id") == Some(work.job.as_str())
    });
    kind(job, 5);
    assert_eq!(job.parent, None);
    assert_eq!(job.attr("faas.trigger"), Some("pubsub"));
    let submit = find("submit of the job", &|s| {
        s.name == "POST /functions/{id}/invoke-async"
            && s.attr("http.response.status_code") == Some("202")
    });
    if let Some(links) = &job.links {
        assert_eq!(
            links,
            &vec![(submit.trace_id.clone(), submit.span_id.clone())],
            "the job links to its submission"
        );
    }
    find("kernel of the job", &|s| {
        s.parent.as_deref() == Some(&job.span_id) && s.name == "kernel vector_add"
    });
}

#[test]
fn spans_of_deploys_invokes_guests_streams_and_jobs_form_one_tree() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let server = traced_server(&dir.path().join("data"), &receiver.endpoint, &[], &log);
    let work = run_workload(&server);
    wait_until(
        Duration::from_secs(20),
        "the job's kernel span is exported",
        || {
            receiver.spans().iter().any(|s| {
                s.name == "kernel vector_add"
                    && s.parent.is_some()
                    && s.trace_id != work.caller_trace
            })
        },
    );
    check_tree(&receiver.spans(), &work);
    // Counted once the receiver's answer is back (after it has the spans).
    wait_until(
        Duration::from_secs(10),
        "exported spans are counted",
        || {
            server
                .metric("tensor_wasm_otel_spans_exported_total")
                .is_some_and(|n| n > 0.0)
        },
    );
    assert_eq!(
        server.metric("tensor_wasm_otel_spans_dropped_total{reason=\"queue_full\"}"),
        Some(0.0)
    );
    server.terminate();
    // The request log line of the traced invoke carries the caller's trace id.
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.lines().any(
            |l| l.starts_with(&format!("{{\"trace_id\":\"{}\"", work.caller_trace))
                && l.contains("\"message\":\"request\"")
        ),
        "no request line with the trace id in {logged}"
    );
}

#[test]
fn an_untrusted_sampled_flag_does_not_force_sampling() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    // The operator samples nothing; a caller asks for its trace to be sampled.
    let server = traced_server(
        &dir.path().join("data"),
        &receiver.endpoint,
        &[
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0"),
        ],
        &log,
    );
    let calc = server.deploy(&examples().join("calc.wat"), "name=calc");
    for _ in 0..5 {
        let answer = ServeProcess::agent()
            .post(&server.url(&format!("/functions/{calc}/invoke")))
            .set("authorization", &server.auth())
            .set(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            )
            .send_json(json!({"export": "add", "args": [1, 2]}))
            .expect("invoke");
        assert_eq!(answer.status(), 200);
    }
    // A graceful stop sends whatever is queued before the process exits.
    server.terminate();
    assert!(receiver.spans().is_empty(), "{:#?}", receiver.spans());
}

/// A collector that accepts connections and never answers: requests cost
/// what they cost without telemetry, spans past the queue are dropped and
/// counted.
#[test]
fn a_collector_that_never_answers_adds_no_latency() {
    let stuck = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", stuck.local_addr().unwrap());
    // Connections are accepted and held, never read from.
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for conn in stuck.incoming().flatten() {
            keep.lock().unwrap().push(conn);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let down = traced_server(
        &dir.path().join("down"),
        &endpoint,
        &[
            ("OTEL_BSP_MAX_QUEUE_SIZE", "32"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "8"),
        ],
        &dir.path().join("down.log"),
    );
    let off = ServeProcess::start(bin(), &dir.path().join("off"), &[]);
    let ids: Vec<String> = [&down, &off]
        .iter()
        .map(|s| s.deploy(&examples().join("calc.wat"), "name=calc"))
        .collect();
    let mut took = [Vec::new(), Vec::new()];
    // Interleaved, so both see the same machine.
    for round in 0..200 {
        for (i, server) in [&down, &off].iter().enumerate() {
            let start = Instant::now();
            let (status, _) = server.call(&ids[i], "add", json!([round, 1]));
            took[i].push(start.elapsed());
            assert_eq!(status, 200);
        }
    }
    for t in &mut took {
        t.sort();
    }
    let (down_median, off_median) = (took[0][100], took[1][100]);
    let down_max = *took[0].last().unwrap();
    // The export timeout is 10 s: a request waiting on the collector would show.
    assert!(down_max < Duration::from_secs(2), "slowest {down_max:?}");
    assert!(
        down_median <= off_median * 2 + Duration::from_millis(2),
        "median {down_median:?} with the collector stuck, {off_median:?} without telemetry"
    );
    let dropped = down
        .metric("tensor_wasm_otel_spans_dropped_total{reason=\"queue_full\"}")
        .unwrap();
    assert!(dropped > 0.0, "spans past the queue are counted as dropped");
    eprintln!(
        "collector stuck: median {down_median:?}, max {down_max:?}; telemetry off: median \
         {off_median:?}; {dropped} spans dropped"
    );
}

/// Kernel time and bytes are charged per tenant and function, measured by
/// the backend (CPU worker time here), with function labels past the limit
/// counted as `other`.
#[test]
fn kernels_are_accounted_per_function_under_bounded_labels() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(bin(), dir.path(), &["--metrics-max-functions", "2"]);
    let ids: Vec<String> = (0..3)
        .map(|i| server.deploy(&examples().join("vector_add.wat"), &format!("name=v{i}")))
        .collect();
    for id in &ids {
        for _ in 0..2 {
            assert_eq!(
                server.call(id, "run", json!([1000])),
                (200, json!({"results": [1000]}))
            );
        }
    }
    let tenant = server.tenant_id();
    let text = String::from_utf8(server.get("/metrics").1).unwrap();
    for (i, id) in ids.iter().enumerate() {
        let label = if i < 2 { id.as_str() } else { "other" };
        let series = format!(
            "tensor_wasm_tenant_kernel_seconds_total{{backend=\"cpu\",function=\"{label}\",\
             tenant=\"{tenant}\",timing=\"cpu_worker\"}}"
        );
        let seconds = server.metric(&series);
        assert!(
            seconds.is_some_and(|s| s > 0.0),
            "{series}: {seconds:?} in {text}"
        );
        // Two launches over three buffers of 4000 bytes each.
        let bytes = format!(
            "tensor_wasm_tenant_bytes_moved_total{{direction=\"kernel_args\",function=\"{label}\",\
             tenant=\"{tenant}\"}}"
        );
        assert_eq!(server.metric(&bytes), Some(24000.0), "{bytes} in {text}");
    }
    assert!(
        !text.contains(&ids[2]),
        "the third function has no series of its own"
    );
    assert!(
        server.metric_sum(
            "tensor_wasm_tenant_kernel_seconds_total",
            &format!("tenant=\"{tenant}\"")
        ) > 0.0
    );
    // Nothing is held once the invocations are over.
    assert_eq!(
        server.metric_sum("tensor_wasm_tenant_device_memory_bytes", ""),
        0.0
    );
}

/// Scaled out over PostgreSQL and S3: shared-store calls are client spans
/// under the request that made them, and an async job whose replica died is
/// run by another replica, whose span links to the submitting request (the
/// `traceparent` kept in the shared job record).
#[test]
fn shared_store_calls_and_a_job_moved_across_replicas_are_traced() {
    use tensor_wasm_test_support::serve::Replicas;
    use tensor_wasm_test_support::servers::{Postgres, S3Server};

    let receiver = Receiver::start();
    let pg = Postgres::start();
    let s3 = S3Server::start();
    s3.create_bucket("tw-traced");
    let database = pg.create_database("traced");
    let args = [
        "--store",
        database.as_str(),
        "--blob-store",
        "s3://tw-traced/e2e",
        "--job-lease-s",
        "1",
        "--job-poll-ms",
        "100",
    ];
    let mut env = s3.client_env();
    env.push((
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        receiver.endpoint.clone().into(),
    ));
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "100".into()));
    let set = Replicas::new(bin(), 2, &args, env, "warn");
    let a = set.start_in(set.dirs[0].path(), &["--replica-name", "A"]);
    let b = set.start_in(set.dirs[1].path(), &["--replica-name", "B"]);

    let nap = a.deploy(&examples().join("sleep.wat"), "name=nap");
    // A is killed below: what it exported of the deploy must have arrived first.
    wait_until(
        Duration::from_secs(10),
        "A's deploy spans are exported",
        || {
            let spans = receiver.spans();
            spans.iter().any(|s| s.name == "POST /functions")
                && spans.iter().any(|s| s.attr("db.system.name") == Some("s3"))
        },
    );
    let caller_trace = "5bf92f3577b34da6a3ce929d0e0e4737";
    let answer = ServeProcess::agent()
        .post(&a.url(&format!("/functions/{nap}/invoke-async")))
        .set("authorization", &a.auth())
        .set(
            "traceparent",
            &format!("00-{caller_trace}-10f067aa0ba902b8-01"),
        )
        .send_json(json!({"export": "nap", "args": [3000]}))
        .expect("submit");
    assert_eq!(answer.status(), 202);
    let job = answer.into_json::<Value>().unwrap()["job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // A runs it (jobs submitted to a replica wake it at once); it dies mid-job.
    wait_until(Duration::from_secs(10), "A runs the job", || {
        pg.query(
            "traced",
            &format!("SELECT id FROM tw_jobs WHERE id = '{job}' AND lease_owner = 'A'"),
        )
        .len()
            == 1
    });
    a.kill9();
    wait_until(Duration::from_secs(30), "B finishes the job", || {
        json_of(&b.get(&format!("/jobs/{job}")).1)["status"] == "succeeded"
    });
    wait_until(Duration::from_secs(10), "B's job span is exported", || {
        receiver
            .spans()
            .iter()
            .any(|s| s.attr("faas.invocation_id") == Some(job.as_str()))
    });
    let spans = receiver.spans();
    // Only B can have exported the job's span: A died with it open.
    let run = spans
        .iter()
        .find(|s| s.attr("faas.invocation_id") == Some(job.as_str()))
        .unwrap();
    assert_eq!(run.parent, None);
    let links = run.links.as_ref().unwrap();
    assert_eq!(links.len(), 1, "{run:#?}");
    assert_eq!(
        links[0].0, caller_trace,
        "the run links to the submitting request's trace"
    );
    // The submit's shared-store calls (B's reads of the job included) are client spans.
    let store_calls: Vec<&SpanRec> = spans
        .iter()
        .filter(|s| s.name == "shared database" || s.name == "shared objects")
        .collect();
    assert!(
        store_calls
            .iter()
            .any(|s| s.attr("db.system.name") == Some("postgresql") && s.kind == Some(3)),
        "{store_calls:#?}"
    );
    assert!(store_calls
        .iter()
        .any(|s| s.attr("db.system.name") == Some("s3") && s.parent.is_some()));
    let by_id: BTreeMap<&str, &SpanRec> = spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    assert!(
        store_calls.iter().any(|s| s
            .parent
            .as_deref()
            .and_then(|p| by_id.get(p))
            .is_some_and(|p| p.name == "POST /functions")),
        "the deploy's uploads are children of its request"
    );
}

/// The same workload against a real trace store: `make otel-check` starts
/// one (Arize Phoenix, `scripts/otel-store.sh`) and names its URL in
/// `TENSOR_WASM_OTEL_STORE`. The store keeps neither span kinds nor links,
/// so those two are checked by the test above only.
#[test]
#[ignore = "needs a trace store: make otel-check"]
fn spans_reach_a_real_trace_store() {
    let store = std::env::var("TENSOR_WASM_OTEL_STORE").expect("TENSOR_WASM_OTEL_STORE");
    let dir = tempfile::tempdir().unwrap();
    let server = traced_server(
        &dir.path().join("data"),
        &store,
        &[],
        &dir.path().join("server.log"),
    );
    let work = run_workload(&server);
    // Sent on shutdown at the latest.
    server.terminate();
    let mut spans = Vec::new();
    wait_until(
        Duration::from_secs(30),
        "the job's kernel span is stored",
        || {
            spans = read_store(&store);
            spans
                .iter()
                .any(|s| s.name == "kernel vector_add" && s.trace_id != work.caller_trace)
        },
    );
    check_tree(&spans, &work);
    eprintln!("{} spans read back from {store}", spans.len());
}

/// Every span of the store's default project, from its REST API.
fn read_store(store: &str) -> Vec<SpanRec> {
    let mut spans = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{store}/v1/projects/default/spans?limit=1000");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let page: Value = match ureq::get(&url).call() {
            Ok(answer) => answer.into_json().unwrap(),
            Err(ureq::Error::Status(404, _)) => return spans,
            Err(e) => panic!("{url}: {e}"),
        };
        for s in page["data"].as_array().unwrap() {
            let attributes = flatten(&s["attributes"]);
            spans.push(SpanRec {
                trace_id: s["context"]["trace_id"].as_str().unwrap().to_lowercase(),
                span_id: s["context"]["span_id"].as_str().unwrap().to_lowercase(),
                parent: s["parent_id"].as_str().map(str::to_lowercase),
                name: s["name"].as_str().unwrap().to_owned(),
                kind: None,
                attributes,
                links: None,
                error: s["status_code"] == "ERROR",
            });
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return spans,
        }
    }
}

/// The store nests dotted keys: `{"faas": {"name": …}}` back to `faas.name`.
fn flatten(value: &Value) -> BTreeMap<String, String> {
    fn walk(prefix: &str, value: &Value, out: &mut BTreeMap<String, String>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            Value::String(s) => {
                out.insert(prefix.to_owned(), s.clone());
            }
            other => {
                out.insert(prefix.to_owned(), other.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", value, &mut out);
    out
}
