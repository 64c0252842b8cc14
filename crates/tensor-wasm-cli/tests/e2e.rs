//! End to end: the real `tensor-wasm serve` binary on a loopback port, driven
//! by a real HTTP client and by the CLI itself. Restart, SIGKILL during a
//! burst of deploys, guest faults and 200 concurrent invocations.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tensor_wasm_test_support::guests::{c_guest, examples_dir as examples};
use tensor_wasm_test_support::pace::slow_client_pause;
use tensor_wasm_test_support::serve::{error_code, json_of, ServeProcess as Server};
use tensor_wasm_test_support::wait::{wait_for, wait_until};

/// Cargo builds this binary (same profile) before the tests and names it here.
const BIN: &str = env!("CARGO_BIN_EXE_tensor-wasm");

fn start(data_dir: &Path, extra: &[&str]) -> Server {
    Server::start(Path::new(BIN), data_dir, extra)
}

fn start_logging(data_dir: &Path, extra: &[&str], log: &str, stderr: Stdio) -> Server {
    Server::start_logging(Path::new(BIN), data_dir, extra, log, stderr)
}

#[test]
fn deploy_invoke_restart_without_recompiling() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let calc = server.deploy(&examples().join("calc.wat"), "name=calc");
    let upper = server.deploy(&examples().join("upper.wat"), "name=upper&style=wasi");
    let wc = server.deploy(&c_guest("wordcount"), "name=wordcount&style=wasi");

    assert_eq!(
        server.call(&calc, "add", json!([20, 22])),
        (200, json!({"results": [42]}))
    );
    let (status, out, exit) = server.post(
        &format!("/functions/{upper}/invoke"),
        "text/plain",
        b"tensor wasm",
    );
    assert_eq!(
        (status, out.as_slice(), exit.as_deref()),
        (200, &b"TENSOR WASM"[..], Some("0"))
    );
    let (status, out, exit) = server.post(
        &format!("/functions/{wc}/invoke"),
        "text/plain",
        b"one two\nthree\n",
    );
    assert_eq!(status, 200);
    assert_eq!(json_of(&out), json!({"lines": 2, "words": 3, "bytes": 14}));
    assert_eq!(exit.as_deref(), Some("0"));
    let (_, _, exit) = server.post(&format!("/functions/{wc}/invoke"), "text/plain", b"   ");
    assert_eq!(
        exit.as_deref(),
        Some("3"),
        "the C guest's exit status is reported"
    );

    // The CLI against the same server.
    let out = server.cli(
        &[
            "invoke",
            &calc,
            "--export",
            "mul64",
            "--arg",
            "4294967296",
            "--arg",
            "-2",
        ],
        b"",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json_of(&out.stdout), json!({"results": [-8589934592i64]}));
    let out = server.cli(&["invoke", &upper], b"from stdin");
    assert_eq!(out.stdout, b"FROM STDIN");
    assert!(String::from_utf8_lossy(&out.stderr).contains("upper: done"));
    let out = server.cli(
        &[
            "deploy",
            examples().join("loop.wat").to_str().unwrap(),
            "--timeout-ms",
            "100",
        ],
        b"",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spin = json_of(&out.stdout)["id"].as_str().unwrap().to_owned();
    let out = server.cli(&["functions"], b"");
    assert_eq!(
        json_of(&out.stdout)["functions"].as_array().unwrap().len(),
        4
    );
    let out = server.cli(&["delete", &spin], b"");
    assert!(out.status.success());
    let out = server.cli(&["invoke", &spin, "--export", "spin"], b"");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not_found"));

    assert_eq!(
        server.metric(r#"tensor_wasm_module_loads_total{source="compiled"}"#),
        Some(4.0)
    );
    server.terminate();

    // Restart on the same data dir: everything is there, nothing recompiles.
    let server = start(dir.path(), &[]);
    assert_eq!(
        server.call(&calc, "add", json!([1, 1])),
        (200, json!({"results": [2]}))
    );
    let (_, out, _) = server.post(
        &format!("/functions/{upper}/invoke"),
        "text/plain",
        b"again",
    );
    assert_eq!(out, b"AGAIN");
    let (_, out, _) = server.post(&format!("/functions/{wc}/invoke"), "text/plain", b"a b c");
    assert_eq!(json_of(&out)["words"], 3);
    assert_eq!(
        server.metric(r#"tensor_wasm_module_loads_total{source="compiled"}"#),
        Some(0.0)
    );
    assert_eq!(
        server.metric(r#"tensor_wasm_module_loads_total{source="artifact"}"#),
        Some(3.0)
    );
    assert_eq!(server.get(&format!("/functions/{spin}")).0, 404);
    server.terminate();
}

#[test]
fn guest_faults_and_bad_input_stay_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--max-body-bytes", "1048576"]);
    let spin = server.deploy(&examples().join("loop.wat"), "name=loop&timeout_ms=300");
    let hog = server.deploy(
        &examples().join("hog.wat"),
        "name=hog&memory_limit_bytes=8388608",
    );
    let calc = server.deploy(&examples().join("calc.wat"), "name=calc");

    let start = Instant::now();
    let (status, body) = server.call(&spin, "spin", json!([]));
    let took = start.elapsed();
    assert_eq!(
        (status, error_code(&body)),
        (504, "invocation_timeout"),
        "{body}"
    );
    // Not before the deadline, and long before the client's own 60 s timeout
    // (the loop never ends by itself). How close to the deadline the answer
    // comes is a timing figure for a bench, not a bound to flake on here.
    assert!(took >= Duration::from_millis(290), "{took:?}");
    assert!(
        took < Duration::from_secs(10),
        "timeout answered after {took:?}"
    );

    let (status, body) = server.call(&hog, "grow", json!([]));
    assert_eq!(
        (status, error_code(&body)),
        (500, "memory_limit_exceeded"),
        "{body}"
    );
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("8388608"));

    let (status, body) = server.call(&calc, "div", json!([7, 0]));
    assert_eq!((status, error_code(&body)), (500, "guest_trap"));
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("integer divide by zero"));

    let (status, body) = server.call(&calc, "add", json!(["1", 2]));
    assert_eq!(
        (status, error_code(&json_of(body.to_string().as_bytes()))),
        (400, "invalid_arguments")
    );
    let (status, body, _) =
        server.post("/functions", "application/wasm", b"\0asm\x01\0\0\0garbage");
    assert_eq!(
        (status, error_code(&json_of(&body))),
        (400, "invalid_module")
    );
    let (status, body, _) = server.post(
        &format!("/functions/{calc}/invoke"),
        "application/json",
        b"{\"export\":",
    );
    assert_eq!((status, error_code(&json_of(&body))), (400, "bad_request"));
    let (status, body) = server.call("fn-0123456789abcdef01234567", "add", json!([]));
    assert_eq!((status, error_code(&body)), (404, "not_found"));
    let (status, body) = server.oversize_post("/functions", 2 << 20);
    assert_eq!(
        (status, error_code(&json_of(&body))),
        (413, "payload_too_large")
    );

    // Still serving, limits did not leak into other requests.
    assert_eq!(
        server.call(&calc, "add", json!([2, 2])),
        (200, json!({"results": [4]}))
    );
    assert_eq!(server.get("/healthz").0, 200);
    assert_eq!(
        server.metric(r#"tensor_wasm_invocations_total{outcome="timeout"}"#),
        Some(1.0)
    );
    assert_eq!(
        server.metric(r#"tensor_wasm_invocations_total{outcome="limit"}"#),
        Some(1.0)
    );
    assert_eq!(
        server.metric(r#"tensor_wasm_invocations_total{outcome="trap"}"#),
        Some(1.0)
    );
    server.terminate();
}

#[test]
fn sigkill_during_deploy_burst_loses_no_acknowledged_function() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let base = server.base.clone();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (acked, stop, base) = (acked.clone(), stop.clone(), base.clone());
            let auth = server.auth();
            std::thread::spawn(move || {
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Distinct modules, so module writes happen too, not only records.
                    let wat = format!(
                        r#"(module (func (export "id") (result i32) i32.const {}))"#,
                        w * 100_000 + n
                    );
                    n += 1;
                    let result = ureq::post(&format!("{base}/functions?name=burst"))
                        .set("authorization", &auth)
                        .set("content-type", "application/wasm")
                        .timeout(Duration::from_secs(10))
                        .send_string(&wat);
                    match result {
                        Ok(r) if r.status() == 201 => {
                            let v: Value = r.into_json().unwrap();
                            let expect = i64::from(w * 100_000 + n - 1);
                            acked
                                .lock()
                                .unwrap()
                                .push(format!("{}={expect}", v["id"].as_str().unwrap()));
                        }
                        Ok(r) => panic!("unexpected status {}", r.status()),
                        Err(_) => break, // the server died mid-request: not acknowledged
                    }
                }
            })
        })
        .collect();
    // Enough acknowledged deploys to mean anything, then SIGKILL mid-burst.
    wait_until(
        Duration::from_secs(60),
        "20 deploys of the burst are acknowledged",
        || acked.lock().unwrap().len() >= 20,
    );
    server.kill9();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();

    let server = start(dir.path(), &[]);
    let (_, body) = server.get("/functions");
    let listed: Vec<String> = json_of(&body)["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_owned())
        .collect();
    for entry in &acked {
        let (id, expect) = entry.split_once('=').unwrap();
        assert!(
            listed.iter().any(|l| l == id),
            "acknowledged {id} lost after SIGKILL"
        );
        assert_eq!(
            server.call(id, "id", json!([])),
            (200, json!({"results": [expect.parse::<i64>().unwrap()]}))
        );
    }
    // Records that made it to disk without their ack are fine; half records are not.
    assert!(listed.len() >= acked.len());
    assert!(std::fs::read_dir(dir.path().join("tmp"))
        .unwrap()
        .next()
        .is_none());
    server.terminate();
}

#[test]
fn two_hundred_concurrent_invocations_are_correct_and_isolated() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let calc = server.deploy(&examples().join("calc.wat"), "name=calc");
    let upper = server.deploy(&examples().join("upper.wat"), "name=upper&style=wasi");
    server.raise_quotas(256);
    let base = Arc::new(server.base.clone());
    let auth = Arc::new(server.auth());
    let barrier = Arc::new(std::sync::Barrier::new(200));
    let handles: Vec<_> = (0..200)
        .map(|i| {
            let (base, barrier, calc, upper, auth) = (
                base.clone(),
                barrier.clone(),
                calc.clone(),
                upper.clone(),
                auth.clone(),
            );
            std::thread::spawn(move || {
                barrier.wait();
                let agent = ureq::AgentBuilder::new()
                    .timeout(Duration::from_secs(60))
                    .build();
                match i % 3 {
                    0 => {
                        let r: Value = agent
                            .post(&format!("{base}/functions/{calc}/invoke"))
                            .set("authorization", &auth)
                            .send_json(json!({"export": "add", "args": [i, 1000]}))
                            .unwrap()
                            .into_json()
                            .unwrap();
                        assert_eq!(r, json!({"results": [i + 1000]}));
                    }
                    1 => {
                        let r: Value = agent
                            .post(&format!("{base}/functions/{calc}/invoke"))
                            .set("authorization", &auth)
                            .send_json(json!({"export": "bump"}))
                            .unwrap()
                            .into_json()
                            .unwrap();
                        assert_eq!(
                            r,
                            json!({"results": [1, 1]}),
                            "state leaked between invocations"
                        );
                    }
                    _ => {
                        let text = format!("request {i}");
                        let r = agent
                            .post(&format!("{base}/functions/{upper}/invoke"))
                            .set("authorization", &auth)
                            .send_string(&text)
                            .unwrap()
                            .into_string()
                            .unwrap();
                        assert_eq!(r, text.to_uppercase());
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        server.metric(r#"tensor_wasm_invocations_total{outcome="ok"}"#),
        Some(200.0)
    );
    server.terminate();
}

#[test]
fn guests_launch_kernels_end_to_end_on_the_cpu_backend() {
    let out = Command::new(BIN).arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("CPU"), "{text}");
    assert!(
        text.contains("serve --device auto would use: cpu"),
        "{text}"
    );

    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--device", "cpu"]);
    let vadd = server.deploy(&examples().join("vector_add.wat"), "name=vadd");
    assert_eq!(
        server.call(&vadd, "run", json!([4096])),
        (200, json!({"results": [4096]}))
    );
    assert_eq!(
        server.call(&vadd, "out_of_bounds", json!([])),
        (200, json!({"results": [-1]}))
    );
    let out = server.cli(&["invoke", &vadd, "--export", "run", "--arg", "777"], b"");
    assert_eq!(json_of(&out.stdout), json!({"results": [777]}));

    let matmul = server.deploy(&c_guest("matmul"), "name=matmul&style=wasi");
    for shape in ["64 64 64", "33 17 45", "1 1 1", "100 3 7"] {
        let (status, out, exit) = server.post(
            &format!("/functions/{matmul}/invoke"),
            "text/plain",
            shape.as_bytes(),
        );
        assert_eq!(status, 200);
        let result = json_of(&out);
        assert_eq!(result["mismatches"], 0, "{shape}: {result}");
        assert_eq!(exit.as_deref(), Some("0"));
    }
    let out = server.cli(&["invoke", &matmul], b"16 16 16");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json_of(&out.stdout)["mismatches"], 0);

    // Every JIT blueprint family through HTTP -> guest -> wasi:cuda -> dispatcher -> backend.
    let blueprints = server.deploy(&c_guest("blueprints"), "name=blueprints&style=wasi");
    for scale in ["1", "37", "100"] {
        let (status, out, exit) = server.post(
            &format!("/functions/{blueprints}/invoke"),
            "text/plain",
            scale.as_bytes(),
        );
        assert_eq!(status, 200);
        let result = json_of(&out);
        let families = result.as_object().unwrap_or_else(|| panic!("{result}"));
        assert_eq!(families.len(), 8, "{result}");
        assert!(families.values().all(|v| v == 0), "scale {scale}: {result}");
        assert_eq!(exit.as_deref(), Some("0"));
    }
    server.terminate();

    // The same with unified guest memory (host-backed here).
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &["--device", "cpu", "--guest-memory", "unified"],
    );
    let vadd = server.deploy(&examples().join("vector_add.wat"), "name=vadd");
    assert_eq!(
        server.call(&vadd, "run", json!([65536])),
        (200, json!({"results": [65536]}))
    );
    let matmul = server.deploy(&c_guest("matmul"), "name=matmul&style=wasi");
    let (_, out, _) = server.post(
        &format!("/functions/{matmul}/invoke"),
        "text/plain",
        b"48 40 32",
    );
    assert_eq!(json_of(&out)["mismatches"], 0);
    server.terminate();
}

#[test]
fn tokens_never_reach_the_log_or_the_stores() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("server.log");
    let data = dir.path().join("data");
    let log = std::fs::File::create(&log_path).unwrap();
    let server = start_logging(&data, &[], "debug", Stdio::from(log));
    // A second tenant and token through the admin API, then traffic with both.
    let (status, body, _) = Server::reply(
        Server::agent()
            .post(&server.url("/tenants"))
            .set("authorization", &server.admin_auth())
            .send_json(json!({"name": "second"})),
    );
    assert_eq!(status, 201);
    let second = json_of(&body)["token"].as_str().unwrap().to_owned();
    let calc = server.deploy(&examples().join("calc.wat"), "name=calc");
    assert_eq!(server.call(&calc, "add", json!([1, 2])).0, 200);
    let (status, _, _) = Server::reply(
        Server::agent()
            .get(&server.url("/functions"))
            .set("authorization", &format!("Bearer {second}"))
            .call(),
    );
    assert_eq!(status, 200);
    let (status, _, _) = Server::reply(
        Server::agent()
            .get(&server.url("/functions"))
            .set("authorization", "Bearer twt_not-a-real-token")
            .call(),
    );
    assert_eq!(status, 401);
    let admin = server.admin_auth().trim_start_matches("Bearer ").to_owned();
    let tenant = server.token.clone();
    server.terminate();

    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("request"), "debug logging was on: {log}");
    for secret in [&admin, &tenant, &second, &"twt_not-a-real-token".to_owned()] {
        assert!(!log.contains(secret.as_str()), "a token is in the log");
        for file in walk(&data) {
            // The bootstrap credentials file is the one place secrets are
            // written, by design (mode 0600, for the operator).
            if file.file_name().is_some_and(|n| n == "credentials.json") {
                continue;
            }
            let bytes = std::fs::read(&file).unwrap();
            assert!(
                !String::from_utf8_lossy(&bytes).contains(secret.as_str()),
                "a token is stored in plain text in {}",
                file.display()
            );
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(data.join("credentials.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
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

#[test]
fn insecure_mode_is_refused_off_loopback_and_open_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args([
            "serve",
            "--insecure-no-auth",
            "--listen",
            "0.0.0.0:0",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--insecure-no-auth"));

    let server = start(dir.path(), &["--insecure-no-auth"]);
    let (status, _, _) = Server::reply(Server::agent().get(&server.url("/functions")).call());
    assert_eq!(status, 200, "no token needed in insecure mode");
    server.terminate();
}

#[test]
fn streamed_chunks_arrive_while_the_guest_is_still_running() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let id = server.deploy(&examples().join("stream.wat"), "name=stream");
    // Three ticks, 400 ms apart: the whole call takes >= 800 ms.
    let start = Instant::now();
    let response = Server::agent()
        .post(&server.url(&format!(
            "/functions/{id}/invoke-stream?export=ticks&args=%5B3%2C400%5D"
        )))
        .set("authorization", &server.auth())
        .set("accept", "application/octet-stream")
        .send_bytes(b"")
        .unwrap();
    let mut reader = response.into_reader();
    let mut first = [0u8; 5];
    std::io::Read::read_exact(&mut reader, &mut first).unwrap();
    let first_at = start.elapsed();
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut reader, &mut rest).unwrap();
    let total = start.elapsed();
    assert_eq!(&first, b"tick\n");
    assert_eq!(rest, b"tick\ntick\n");
    // Ordering, not a latency bound: the guest still had two 400 ms naps
    // to go after its first tick, so a first chunk delivered as it was
    // emitted arrives long before the end; one held back until the guest
    // finished would arrive with it.
    assert!(
        total >= Duration::from_millis(800),
        "whole stream in {total:?}"
    );
    assert!(
        total - first_at >= Duration::from_millis(400),
        "first chunk at {first_at:?}, end at {total:?}: not delivered while the guest ran"
    );

    // The CLI streams the same way.
    let out = server.cli(
        &[
            "invoke", &id, "--export", "ticks", "--arg", "2", "--arg", "0", "--stream",
        ],
        b"in:",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"in:tick\ntick\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains(r#"{"results":[3]}"#));
    server.terminate();
}

#[test]
fn async_jobs_from_the_cli_and_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let calc = server.deploy(&examples().join("calc.wat"), "name=calc");
    let nap = server.deploy(&examples().join("sleep.wat"), "name=nap");
    let out = server.cli(
        &[
            "invoke", &calc, "--export", "add", "--arg", "2", "--arg", "40", "--async",
        ],
        b"",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = json_of(&out.stdout)["job_id"].as_str().unwrap().to_owned();
    let out = server.cli(&["job", &job], b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done = json_of(&out.stdout);
    assert_eq!(
        (done["status"].as_str(), done["results"].clone()),
        (Some("succeeded"), json!([42]))
    );

    // A job still running when the server is killed reads "failed: server
    // restarted" afterwards; the finished one is still there.
    let out = server.cli(
        &[
            "invoke", &nap, "--export", "nap", "--arg", "5000", "--async",
        ],
        b"",
    );
    let running = json_of(&out.stdout)["job_id"].as_str().unwrap().to_owned();
    wait_until(Duration::from_secs(10), "the nap job is running", || {
        json_of(&server.get(&format!("/jobs/{running}")).1)["status"] == "running"
    });
    server.kill9();
    let server = start(dir.path(), &[]);
    let out = server.cli(&["job", &running], b"");
    assert!(!out.status.success());
    let failed = json_of(&out.stdout);
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"]["message"], "failed: server restarted");
    let out = server.cli(&["job", &job, "--no-wait"], b"");
    assert_eq!(json_of(&out.stdout)["status"], "succeeded");
    server.terminate();
}

#[test]
fn snapshots_from_the_cli_survive_a_restart_and_skip_init() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let warm = server.deploy(&examples().join("warm.wat"), "name=warm");
    assert_eq!(
        server.call(&warm, "lookup", json!([7])).1["results"],
        json!([-1])
    );
    let ok = |out: &std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_of(&out.stdout)
    };
    let created = ok(&server.cli(&["snapshot", "create", &warm, "--init", "init"], b""));
    let snap = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["memory_bytes"], 17 * 65_536);
    let initialised = server.call(&warm, "lookup", json!([7])).1["results"].clone();
    assert_ne!(initialised, json!([-1]));

    // After a restart the function still starts from the snapshot: init did not run again.
    server.terminate();
    let server = start(dir.path(), &[]);
    assert_eq!(
        server.call(&warm, "init_runs", json!([])).1["results"],
        json!([1])
    );
    assert_eq!(
        server.call(&warm, "lookup", json!([7])).1["results"],
        initialised
    );
    assert!(
        server
            .metric("tensor_wasm_snapshot_restores_total{mode=\"eager\"}")
            .unwrap()
            >= 2.0
    );
    let listed = ok(&server.cli(&["snapshot", "list", &warm], b""));
    assert_eq!(listed["start_from_snapshot"], json!(snap));
    assert_eq!(listed["snapshots"].as_array().unwrap().len(), 1);

    // The snapshot in use cannot be deleted; after `use none` it can.
    let refused = server.cli(&["snapshot", "delete", &warm, &snap], b"");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("conflict"));
    ok(&server.cli(&["snapshot", "use", &warm, "none"], b""));
    let deleted = server.cli(&["snapshot", "delete", &warm, &snap], b"");
    assert!(deleted.status.success());
    assert_eq!(
        server.call(&warm, "lookup", json!([7])).1["results"],
        json!([-1])
    );
    server.terminate();
}

#[test]
fn cli_streams_a_wasi_command_and_exits_with_its_status() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let upper = server.deploy(&examples().join("upper.wat"), "name=upper&style=wasi");
    let out = server.cli(&["invoke", &upper, "--stream"], b"hello stream\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "HELLO STREAM\n");
    let end: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stderr).lines().last().unwrap()).unwrap();
    assert_eq!(end["exit_code"], 0);
    server.terminate();
}

/// Resident set size of process `pid` in bytes (Linux).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

#[test]
fn a_slow_client_holds_the_buffer_bound_and_a_vanished_one_is_released() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let id = server.deploy(&examples().join("stream.wat"), "name=flood");
    let tenant = {
        let credentials: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("credentials.json")).unwrap(),
        )
        .unwrap();
        credentials["tenant_id"].as_str().unwrap().to_owned()
    };
    let in_flight = || {
        server
            .metric(&format!(
                "tensor_wasm_tenant_concurrent_invocations{{tenant=\"{tenant}\"}}"
            ))
            .unwrap_or(0.0)
    };
    // Warm: the module is loaded and an instance has run before the baseline is taken.
    let (status, _) = server.call(&id, "ticks", json!([1, 0]));
    assert_eq!(status, 200);
    let pid = server.child.id();
    let before = rss_bytes(pid);

    // `flood` emits 64 KiB chunks as fast as it may; the client reads 1 KiB/s.
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut socket = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        socket,
        "POST /functions/{id}/invoke-stream?export=flood HTTP/1.1\r\nhost: {addr}\r\n\
         authorization: {}\r\naccept: application/octet-stream\r\ncontent-length: 0\r\n\r\n",
        server.auth()
    )
    .unwrap();
    let mut received = 0usize;
    let mut buf = [0u8; 256];
    let mut peak = before;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let n = socket.read(&mut buf).unwrap();
        assert!(n > 0, "the server ended the stream");
        received += n;
        peak = peak.max(rss_bytes(pid));
        slow_client_pause(Duration::from_millis(250));
    }
    assert!(received <= 4096, "read {received} bytes at 1 KiB/s");
    assert_eq!(
        in_flight(),
        1.0,
        "the guest is held by back-pressure, not finished"
    );
    let growth = peak.saturating_sub(before);
    // Documented bound: 8 buffered chunks of at most 1 MiB per stream, plus socket buffers.
    assert!(
        growth < 16 << 20,
        "server RSS grew by {} KiB under a slow client",
        growth >> 10
    );
    eprintln!("slow client: RSS growth {} KiB over 3 s", growth >> 10);

    // The client vanishes: the guest is stopped and every quota released.
    // (How fast is a figure to measure, not a bound for this test: it is
    // printed, and well under 100 ms on an idle machine.)
    drop(socket);
    let took = wait_until(
        Duration::from_secs(10),
        "the invocation is released after the client left",
        || in_flight() == 0.0,
    );
    eprintln!("released {took:?} after the disconnect");
    assert_eq!(
        server
            .metric(&format!(
                "tensor_wasm_tenant_live_instances{{tenant=\"{tenant}\"}}"
            ))
            .unwrap_or(0.0),
        0.0
    );
    server.terminate();
}

/// Reads the next SSE event (name, data) from `reader`; `None` at the end.
/// Comment lines (keep-alives) are skipped.
fn next_sse_event(reader: &mut impl BufRead) -> Option<(String, String)> {
    let (mut event, mut data) = (String::new(), Vec::<String>::new());
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            if event.is_empty() && data.is_empty() {
                continue;
            }
            return Some((event, data.join("\n")));
        }
        if let Some(v) = line.strip_prefix("event:") {
            event = v.trim_start().to_owned();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
        }
    }
}

fn unix_ns_now() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// The `unix_ns=` stamp the ticker guest puts at the end of each line.
fn stamp(line: &str) -> u128 {
    line.trim_end()
        .rsplit_once("unix_ns=")
        .and_then(|(_, ns)| ns.parse().ok())
        .unwrap_or_else(|| panic!("no stamp in {line:?}"))
}

/// Acceptance 1 for WASI commands: each stdout line of the C ticker reaches
/// the client while the guest still runs. Timing marks, not fixed delays: the
/// client's clock when the first line arrives is compared with the stamp the
/// guest writes just before it exits.
#[test]
fn wasi_stdout_lines_arrive_while_the_command_is_still_running() {
    let ticker = c_guest("ticker");
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let id = server.deploy(&ticker, "name=ticker&style=wasi");
    let stream = |accept: &str, query: &str, stdin: &str| {
        Server::agent()
            .post(&server.url(&format!("/functions/{id}/invoke-stream{query}")))
            .set("authorization", &server.auth())
            .set("accept", accept)
            .send_bytes(stdin.as_bytes())
            .unwrap()
    };

    // Chunked: the raw lines.
    let response = stream("application/octet-stream", "", "3 300 0");
    assert_eq!(response.content_type(), "application/octet-stream");
    let mut reader = BufReader::new(response.into_reader());
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    let first_at = unix_ns_now();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut reader, &mut rest).unwrap();
    let lines: Vec<&str> = rest.lines().collect();
    assert!(first.starts_with("tick 1/3 "), "{first:?}");
    assert_eq!(lines.len(), 3, "{rest:?}");
    assert!(lines[1].starts_with("tick 3/3 ") && lines[2].starts_with("done "));
    let done = stamp(lines[2]);
    assert!(
        first_at < done,
        "the first line arrived {} ms after the guest's last stamp",
        (first_at - done) / 1_000_000
    );

    // SSE: a chunk event per stdout write (wasi-libc decides how a line is
    // written), then the exit code.
    let response = stream("text/event-stream", "?encoding=text", "3 300 7");
    assert_eq!(response.content_type(), "text/event-stream");
    let mut reader = BufReader::new(response.into_reader());
    let (event, first) = next_sse_event(&mut reader).unwrap();
    let first_at = unix_ns_now();
    assert_eq!(event, "chunk");
    assert!(first.starts_with("tick 1/3 "), "{first:?}");
    let mut stdout = first;
    let end = loop {
        let (event, data) = next_sse_event(&mut reader).expect("a final event");
        match event.as_str() {
            "chunk" => stdout.push_str(&data),
            "end" => break json_of(data.as_bytes()),
            _ => panic!("unexpected {event}: {data}"),
        }
    };
    assert!(next_sse_event(&mut reader).is_none());
    assert_eq!(end["exit_code"], 7);
    assert_eq!(end["stdout_bytes"], stdout.len());
    assert_eq!(end["stderr_tail"], "ticker: 3 lines\n");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout:?}");
    assert!(lines[2].starts_with("tick 3/3 ") && lines[3].starts_with("done "));
    let done = stamp(lines[3]);
    assert!(
        first_at < done,
        "the first event arrived {} ms after the guest's last stamp",
        (first_at - done) / 1_000_000
    );
    server.terminate();
}

/// Acceptance 4: SIGTERM with an open stream and running jobs. In-flight work
/// goes on during the grace period (the stream keeps delivering, a short job
/// finishes), then the stream gets a final `shutting_down` event, the process
/// exits within the deadline, and after a restart both jobs read as recorded.
#[test]
fn sigterm_ends_open_streams_with_a_final_event_and_records_jobs() {
    const GRACE_S: u64 = 3;
    let dir = tempfile::tempdir().unwrap();
    let (data, log_path) = (dir.path().join("data"), dir.path().join("server.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut server = start_logging(
        &data,
        &["--shutdown-grace-s", &GRACE_S.to_string()],
        "info",
        Stdio::from(log),
    );
    let ticks = server.deploy(&examples().join("stream.wat"), "name=stream");
    let nap = server.deploy(&examples().join("sleep.wat"), "name=nap");

    // A stream that would run for 100 s: a tick every 100 ms.
    let response = Server::agent()
        .post(&server.url(&format!(
            "/functions/{ticks}/invoke-stream?export=ticks&args=%5B1000%2C100%5D&encoding=text"
        )))
        .set("authorization", &server.auth())
        .set("accept", "text/event-stream")
        .send_bytes(b"")
        .unwrap();
    let mut reader = BufReader::new(response.into_reader());
    assert_eq!(next_sse_event(&mut reader).unwrap().0, "chunk");

    // A job that finishes within the grace period and one that cannot.
    let start_job = |ms: u32| {
        let body = json!({"export": "nap", "args": [ms]}).to_string();
        let (status, reply, _) = server.post(
            &format!("/functions/{nap}/invoke-async"),
            "application/json",
            body.as_bytes(),
        );
        assert_eq!(status, 202, "{}", String::from_utf8_lossy(&reply));
        json_of(&reply)["job_id"].as_str().unwrap().to_owned()
    };
    let short = start_job(1000);
    let long = start_job(60_000);
    for job in [&short, &long] {
        wait_until(Duration::from_secs(10), &format!("job {job} runs"), || {
            json_of(&server.get(&format!("/jobs/{job}")).1)["status"] == "running"
        });
    }

    server.sigterm();
    let signalled = Instant::now();
    let mut chunks_after_signal = 0;
    let last = loop {
        let event = next_sse_event(&mut reader).expect("the stream ended without a final event");
        if event.0 != "chunk" {
            break event;
        }
        chunks_after_signal += 1;
    };
    let ended_after = signalled.elapsed();
    assert_eq!(last.0, "error", "{last:?}");
    assert_eq!(json_of(last.1.as_bytes())["error"]["code"], "shutting_down");
    assert!(
        chunks_after_signal >= 5,
        "the stream should go on during the grace period: {chunks_after_signal} chunks in \
         {ended_after:?}"
    );
    assert!(
        next_sse_event(&mut reader).is_none(),
        "nothing after the final event"
    );

    let limit = Duration::from_secs(GRACE_S) + Duration::from_millis(1500);
    let (status, _) = wait_for(
        limit.saturating_sub(signalled.elapsed()),
        "the server exits within the shutdown deadline",
        || server.child.try_wait().unwrap(),
    );
    assert!(status.success(), "{status:?}");
    assert!(
        ended_after < Duration::from_secs(GRACE_S),
        "the final event came after the deadline: {ended_after:?}"
    );

    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        log.contains("jobs still unfinished at the deadline were recorded as failed"),
        "{log}"
    );

    drop(server);
    let server = start(&data, &[]);
    let done = json_of(&server.get(&format!("/jobs/{short}")).1);
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["results"], json!([0]));
    let failed = json_of(&server.get(&format!("/jobs/{long}")).1);
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "shutting_down", "{failed}");
    server.terminate();
}

/// Hardening item 10: a function record this build cannot read (here: a newer format, as
/// after a downgrade) is quarantined at startup; its module stays, the gauge says so and
/// `doctor --data-dir` fails until it is dealt with.
#[test]
fn an_unreadable_function_record_is_quarantined_and_its_module_kept() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let calc = server.deploy(&examples().join("calc.wat"), "name=calc");
    let upper = server.deploy(&examples().join("upper.wat"), "name=upper&style=wasi");
    assert_eq!(server.metric("tensor_wasm_quarantined_records"), Some(0.0));
    server.terminate();

    let out = Command::new(BIN)
        .args(["doctor", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let record_path = dir.path().join(format!("functions/{calc}.json"));
    let mut record: Value = serde_json::from_slice(&std::fs::read(&record_path).unwrap()).unwrap();
    let module = dir.path().join(format!(
        "modules/{}.wasm",
        record["module_sha256"].as_str().unwrap()
    ));
    assert!(module.exists());
    record["format"] = json!(2);
    std::fs::write(&record_path, serde_json::to_vec(&record).unwrap()).unwrap();

    let server = start(dir.path(), &[]);
    assert!(
        module.exists(),
        "startup removed the unreadable record's module"
    );
    assert_eq!(server.metric("tensor_wasm_quarantined_records"), Some(1.0));
    assert_eq!(server.get(&format!("/functions/{calc}")).0, 404);
    let (status, out, _) = server.post(&format!("/functions/{upper}/invoke"), "text/plain", b"ok");
    assert_eq!(
        (status, out.as_slice()),
        (200, &b"OK"[..]),
        "the rest serves"
    );
    server.terminate();

    let out = Command::new(BIN)
        .args(["doctor", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains(&format!("{calc}.json")), "{text}");
    assert!(text.contains("format 2"), "{text}");

    // Repaired and moved back: the function is served again from its kept module.
    let quarantined = dir
        .path()
        .join(tensor_wasm_runtime::QUARANTINE_DIR)
        .join(format!("{calc}.json"));
    record["format"] = json!(1);
    std::fs::write(&record_path, serde_json::to_vec(&record).unwrap()).unwrap();
    std::fs::remove_file(quarantined).unwrap();
    let server = start(dir.path(), &[]);
    assert_eq!(server.metric("tensor_wasm_quarantined_records"), Some(0.0));
    assert_eq!(
        server.call(&calc, "add", json!([2, 3])),
        (200, json!({"results": [5]}))
    );
    server.terminate();
}

/// A backup taken as docs/deploy.md says (`tar` of `layout::backup_paths()`, the server
/// stopped), restored into an empty data dir: the function still starts from its snapshot
/// (its init does not run again), the snapshot is listed, a finished job's result is there,
/// and the tenant's token still works.
#[test]
fn backup_and_restore_keep_functions_snapshots_and_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let warm = server.deploy(&examples().join("warm.wat"), "name=warm");
    let ok = |out: &std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_of(&out.stdout)
    };
    let snap = ok(&server.cli(&["snapshot", "create", &warm, "--init", "init"], b""))["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let initialised = server.call(&warm, "lookup", json!([7])).1["results"].clone();
    let out = server.cli(&["invoke", &warm, "--export", "init_runs", "--async"], b"");
    let job = json_of(&out.stdout)["job_id"].as_str().unwrap().to_owned();
    let out = server.cli(&["job", &job], b"");
    assert_eq!(json_of(&out.stdout)["status"], "succeeded");
    server.terminate();

    let archive = dir.path().join("backup.tgz");
    let data = dir.path();
    let status = std::process::Command::new("tar")
        .arg("-C")
        .arg(data)
        .args(["--ignore-failed-read", "-czf"])
        .arg(&archive)
        .args(tensor_wasm_runtime::layout::backup_paths())
        .status()
        .expect("tar");
    assert!(status.success());
    let restored = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("tar")
        .arg("-C")
        .arg(restored.path())
        .arg("-xzf")
        .arg(&archive)
        .status()
        .expect("tar");
    assert!(status.success());

    let server = start(restored.path(), &[]);
    assert_eq!(
        server.call(&warm, "init_runs", json!([])).1["results"],
        json!([1]),
        "started from the snapshot, init not run again"
    );
    assert_eq!(
        server.call(&warm, "lookup", json!([7])).1["results"],
        initialised
    );
    let listed = ok(&server.cli(&["snapshot", "list", &warm], b""));
    assert_eq!(listed["start_from_snapshot"], json!(snap));
    let out = server.cli(&["job", &job, "--no-wait"], b"");
    assert_eq!(json_of(&out.stdout)["status"], "succeeded");
    server.terminate();
}
