//! Invocation deadlines inside host calls, end to end over real HTTP: a kernel launch that
//! would run for minutes ends at the invocation's deadline, and another tenant's small kernel
//! is served meanwhile; the same for a tenant's own spinning PTX kernel, fenced. A test binary of its own, so no other test of this
//! crate shares the CPU with it.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tensor_wasm_test_support::guests::tenant_kernels::{self, KERNEL, SPIN_ARGS};
use tensor_wasm_test_support::guests::{examples_dir as examples, ALIASED_MATMUL_WAT};
use tensor_wasm_test_support::serve::{error_code, json_of, ServeProcess as Server};
use tensor_wasm_test_support::wait::wait_until;

/// Cargo builds this binary (same profile) before the tests and names it here.
const BIN: &str = env!("CARGO_BIN_EXE_tensor-wasm");

/// The invocation deadline of the attacking function.
const TIMEOUT_MS: u64 = 500;

/// How late after its deadline an invocation may answer here. The server's bound is 100 ms
/// (the runtime stops a CPU kernel at its next slice, about a millisecond, and the API answers
/// at the deadline + 100 ms whatever happens); this test runs on shared 2-core machines next to
/// compilers, so it allows more and prints what it measured.
const LATE_TOLERANCE: Duration = Duration::from_millis(400);

/// `POST /functions/{id}/invoke` with `token`: status, JSON answer and how long it took.
fn invoke(
    server: &Server,
    token: &str,
    id: &str,
    export: &str,
    args: Value,
) -> (u16, Value, Duration) {
    let start = Instant::now();
    let (status, body, _) = Server::reply(
        Server::agent()
            .post(&server.url(&format!("/functions/{id}/invoke")))
            .set("authorization", &format!("Bearer {token}"))
            .send_json(json!({"export": export, "args": args})),
    );
    (status, json_of(&body), start.elapsed())
}

#[test]
fn a_kernel_launch_ends_at_the_invocation_deadline_and_other_tenants_keep_their_latency() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(Path::new(BIN), dir.path(), &["--device", "cpu"]);
    let quiet = server.create_tenant("quiet");

    let (status, body, _) = server.post(
        &format!("/functions?name=attack&timeout_ms={TIMEOUT_MS}"),
        "application/wasm",
        ALIASED_MATMUL_WAT.as_bytes(),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let attack = json_of(&body)["id"].as_str().unwrap().to_owned();
    let vadd_wat = std::fs::read(examples().join("vector_add.wat")).unwrap();
    let vadd = server.deploy_as(&quiet, "name=vadd", &vadd_wat);
    let mut unloaded = Duration::ZERO;
    for _ in 0..5 {
        let (status, answer, took) = invoke(&server, &quiet, &vadd, "run", json!([4096]));
        assert_eq!((status, answer), (200, json!({"results": [4096]})));
        unloaded = unloaded.max(took);
    }

    // Two attacks at once, by the default tenant.
    let attacks: Vec<_> = (0..2)
        .map(|_| {
            let (base, token, attack) = (server.base.clone(), server.token.clone(), attack.clone());
            std::thread::spawn(move || {
                let start = Instant::now();
                let (status, body, _) = Server::reply(
                    Server::agent()
                        .post(&format!("{base}/functions/{attack}/invoke"))
                        .set("authorization", &format!("Bearer {token}"))
                        .send_json(json!({"export": "run", "args": []})),
                );
                (status, json_of(&body), start.elapsed())
            })
        })
        .collect();
    wait_until(
        Duration::from_secs(5),
        "both attacking kernels are running",
        || server.metric("tensor_wasm_dispatch_in_flight") == Some(2.0),
    );
    // The quiet tenant's small kernel, timed while both big ones run.
    let mut loaded = Vec::new();
    for _ in 0..5 {
        let (status, answer, took) = invoke(&server, &quiet, &vadd, "run", json!([4096]));
        assert_eq!((status, answer), (200, json!({"results": [4096]})));
        loaded.push(took);
    }
    let mut late = Vec::new();
    for attack in attacks {
        let (status, body, took) = attack.join().unwrap();
        assert_eq!(
            (status, error_code(&body)),
            (504, "invocation_timeout"),
            "{body}"
        );
        late.push(took.saturating_sub(Duration::from_millis(TIMEOUT_MS)));
    }
    eprintln!(
        "deadline {TIMEOUT_MS} ms: attacks answered {late:?} after it; quiet vector_add \
         unloaded max {unloaded:?}, under attack {loaded:?}"
    );
    for overshoot in &late {
        assert!(
            *overshoot <= LATE_TOLERANCE,
            "an attack answered {overshoot:?} after its deadline"
        );
    }
    let slowest = loaded.iter().max().copied().unwrap_or_default();
    assert!(
        slowest < Duration::from_millis(TIMEOUT_MS),
        "the quiet tenant's vector_add took {slowest:?} under attack (unloaded {unloaded:?})"
    );

    // The server keeps serving, and the kernels are gone: nothing is left in flight.
    wait_until(Duration::from_secs(5), "no kernel left in flight", || {
        server.metric("tensor_wasm_dispatch_in_flight") == Some(0.0)
    });
    // The attacker is charged for its kernels' time: two launches of about 0.5 s each.
    let charged = server.metric_sum(
        "tensor_wasm_tenant_kernel_seconds_total",
        &format!("tenant=\"{}\"", server.tenant_id()),
    );
    assert!(
        charged >= 0.8,
        "the attacking tenant was charged {charged} s"
    );
    let (status, answer, _) = invoke(&server, &quiet, &vadd, "run", json!([4096]));
    assert_eq!((status, answer), (200, json!({"results": [4096]})));
}

/// A tenant without the `raw_ptx` capability deploys a module with its own PTX: fenced, its
/// kernels run on the CPU backend's interpreter; a spinning one answers 504 at the deadline
/// (by the fence's cancel word) while another tenant's own kernel completes, and a store far
/// outside its buffer stays inside its memory.
#[test]
fn a_spinning_tenant_kernel_answers_at_its_deadline_while_another_tenant_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(Path::new(BIN), dir.path(), &["--device", "cpu"]);
    let quiet = server.create_tenant("quiet");
    let guest = tenant_kernels::guest();
    let (status, body, _) = server.post(
        &format!("/functions?name=spinner&timeout_ms={TIMEOUT_MS}"),
        "application/wasm",
        guest.as_bytes(),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let spinner = json_of(&body)["id"].as_str().unwrap().to_owned();
    let fill = server.deploy_as(&quiet, "name=fill", guest.as_bytes());
    let (status, answer, _) = invoke(&server, &quiet, &fill, "fill_check", json!([]));
    assert_eq!((status, answer), (200, json!({"results": [0]})));

    let spin = server.invoke_in_background(
        &server.token,
        &spinner,
        json!({"export": "run", "args": [KERNEL.spin, 2, 64, SPIN_ARGS, 16]}),
    );
    wait_until(
        Duration::from_secs(5),
        "the spinning kernel is running",
        || server.metric("tensor_wasm_dispatch_in_flight") == Some(1.0),
    );
    let mut loaded = Vec::new();
    for _ in 0..3 {
        let (status, answer, took) = invoke(&server, &quiet, &fill, "fill_check", json!([]));
        assert_eq!((status, answer), (200, json!({"results": [0]})));
        loaded.push(took);
    }
    let (status, body, took) = spin.join().unwrap();
    assert_eq!(
        (status, error_code(&body)),
        (504, "invocation_timeout"),
        "{body}"
    );
    let late = took.saturating_sub(Duration::from_millis(TIMEOUT_MS));
    eprintln!(
        "deadline {TIMEOUT_MS} ms: the spinning tenant kernel answered {late:?} after it; the \
         other tenant's fill took {loaded:?}"
    );
    assert!(
        late <= LATE_TOLERANCE,
        "answered {late:?} after its deadline"
    );
    wait_until(Duration::from_secs(5), "no kernel left in flight", || {
        server.metric("tensor_wasm_dispatch_in_flight") == Some(0.0)
    });
    // A store 1 GiB past its buffer lands inside the spinner's own memory, once.
    let (status, answer, _) = invoke(&server, &server.token, &spinner, "wild_markers", json!([]));
    assert_eq!((status, answer), (200, json!({"results": [1]})));
}
