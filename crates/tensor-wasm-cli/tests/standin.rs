//! The real binary on the CUDA backend without a GPU: `tensor-wasm doctor` and
//! `serve --device cuda` run as child processes whose `libcuda.so` is the stand-in driver
//! (`tensor-wasm-cuda-standin`, kernels run in the PTX interpreter), found through
//! `LD_LIBRARY_PATH`. Each test reads the stand-in's call trace and prints how many driver
//! calls it exercised.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use tensor_wasm_test_support::guests::tenant_kernels::{self, KERNEL, SPIN_ARGS};
use tensor_wasm_test_support::guests::{c_guest, examples_dir as examples, ALIASED_MATMUL_WAT};
use tensor_wasm_test_support::serve::{error_code, json_of, ServeProcess as Server};
use tensor_wasm_test_support::wait::{wait_for, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_tensor-wasm");

/// A directory holding the stand-in as `libcuda.so`/`libcuda.so.1`, and a trace file.
struct StandIn {
    dir: tempfile::TempDir,
    trace: PathBuf,
    /// Extra `TENSOR_WASM_STANDIN_*` settings.
    settings: Vec<(&'static str, String)>,
}

impl StandIn {
    fn new(settings: &[(&'static str, &str)]) -> StandIn {
        let dir = tempfile::tempdir().unwrap();
        tensor_wasm_cuda_standin::install(dir.path()).expect("the stand-in driver is built");
        StandIn {
            trace: dir.path().join("trace"),
            dir,
            settings: settings
                .iter()
                .map(|&(name, value)| (name, value.to_owned()))
                .collect(),
        }
    }

    fn env(&self) -> Vec<(&str, &OsStr)> {
        let mut env = vec![
            ("LD_LIBRARY_PATH", self.dir.path().as_os_str()),
            ("TENSOR_WASM_STANDIN_TRACE", self.trace.as_os_str()),
        ];
        env.extend(
            self.settings
                .iter()
                .map(|(name, value)| (*name, OsStr::new(value.as_str()))),
        );
        env
    }

    fn serve(&self, data_dir: &Path) -> Server {
        Server::start_with_env(
            Path::new(BIN),
            data_dir,
            &["--device", "cuda"],
            &self.env(),
            "warn",
            Stdio::inherit(),
        )
    }

    /// Calls per driver function (with result codes), and prints the total.
    fn calls(&self, test: &str) -> BTreeMap<String, u64> {
        let text = std::fs::read_to_string(&self.trace).unwrap_or_default();
        let mut calls = BTreeMap::new();
        for line in text.lines() {
            *calls.entry(line.to_owned()).or_insert(0) += 1;
        }
        // Past the test harness's capture, so that `make test` shows it.
        let _ = writeln!(
            std::io::stderr(),
            "stand-in: {test}: {} driver calls ({} distinct function/result pairs)",
            text.lines().count(),
            calls.len()
        );
        calls
    }
}

#[test]
fn doctor_says_the_driver_is_the_stand_in() {
    let standin = StandIn::new(&[]);
    let out = Command::new(BIN)
        .arg("doctor")
        .envs(standin.env())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("cuda:0  TensorWasm stand-in driver (PTX interpreter; not a GPU)"),
        "{text}"
    );
    assert!(text.contains("driver version             13.0"), "{text}");
    let calls = standin.calls("doctor");
    assert!(calls.contains_key("cuDeviceGetName 0"), "{calls:?}");
}

#[test]
fn guests_launch_kernels_on_the_cuda_backend_over_the_stand_in() {
    // Kernels timed between timing events (the stand-in's are host time, not a GPU's).
    let standin = StandIn::new(&[("TENSOR_WASM_CUDA_TIMING_EVENTS", "true")]);
    let data = tempfile::tempdir().unwrap();
    let server = standin.serve(data.path());

    let vadd = server.deploy(&examples().join("vector_add.wat"), "name=vadd");
    assert_eq!(
        server.call(&vadd, "run", json!([4096])),
        (200, json!({"results": [4096]}))
    );
    let series = format!(
        "tensor_wasm_tenant_kernel_seconds_total{{backend=\"cuda\",function=\"{vadd}\",\
         tenant=\"{}\",timing=\"cuda_event\"}}",
        server.tenant_id()
    );
    assert!(
        server.metric(&series).is_some_and(|s| s > 0.0),
        "{series} in {}",
        String::from_utf8_lossy(&server.get("/metrics").1)
    );
    // Hostile pointers are refused before any launch.
    assert_eq!(
        server.call(&vadd, "out_of_bounds", json!([])),
        (200, json!({"results": [-1]}))
    );

    let matmul = server.deploy(&c_guest("matmul"), "name=matmul&style=wasi");
    for shape in ["16 16 16", "33 17 45", "1 1 1"] {
        let (status, out, exit) = server.post(
            &format!("/functions/{matmul}/invoke"),
            "text/plain",
            shape.as_bytes(),
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
        let result = json_of(&out);
        assert_eq!(result["mismatches"], 0, "{shape}: {result}");
        assert_eq!(exit.as_deref(), Some("0"));
    }

    // Every JIT blueprint family: emitted PTX run by the interpreter.
    let blueprints = server.deploy(&c_guest("blueprints"), "name=blueprints&style=wasi");
    for scale in ["1", "37"] {
        let (status, out, exit) = server.post(
            &format!("/functions/{blueprints}/invoke"),
            "text/plain",
            scale.as_bytes(),
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
        let result = json_of(&out);
        let families = result.as_object().unwrap_or_else(|| panic!("{result}"));
        assert_eq!(families.len(), 8, "{result}");
        assert!(families.values().all(|v| v == 0), "scale {scale}: {result}");
        assert_eq!(exit.as_deref(), Some("0"));
    }
    server.terminate();

    let calls = standin.calls("kernels over the stand-in");
    assert!(calls.contains_key("cuLaunchKernel 0"), "{calls:?}");
    assert!(
        !calls
            .keys()
            .any(|call| call.starts_with("cuLaunchKernel ") && call != "cuLaunchKernel 0"),
        "a launch failed: {calls:?}"
    );
}

/// The GPU for components on the CUDA backend: the functions of
/// `examples/components/python/gpu_app.py` (componentize-py) and `examples/components/c/gpu.c`
/// (wit-bindgen) allocate `tensor-wasm:gpu` buffers in CUDA managed memory, chain `vector_add`
/// and `scale` and run `matmul` on them through the stand-in driver, with the same results as
/// on the CPU backend.
#[test]
fn components_launch_kernels_on_gpu_buffers_over_the_stand_in() {
    use tensor_wasm_test_support::toolchains::{
        c_gpu_component, check_gpu_demo, python_gpu_component,
    };
    let out = tempfile::tempdir().unwrap();
    let python = python_gpu_component(&out.path().join("python"));
    let c = c_gpu_component(&out.path().join("c"));
    let standin = StandIn::new(&[]);
    let data = tempfile::tempdir().unwrap();
    let server = standin.serve(data.path());
    check_gpu_demo(&server, &python, "gpu-python");
    check_gpu_demo(&server, &c, "gpu-c");
    server.terminate();

    let calls = standin.calls("component buffers over the stand-in");
    assert!(calls.contains_key("cuLaunchKernel 0"), "{calls:?}");
    assert!(calls.contains_key("cuMemAllocManaged 0"), "{calls:?}");
}

/// A sticky device fault, reported by the launch, by the completion event's record or by
/// its synchronization: the guest gets `DEVICE_ERROR` (-6), the server keeps serving, and the
/// call that reported it is in the trace.
#[test]
fn an_injected_device_fault_is_a_device_error_not_a_crash() {
    for (at, reported_by) in [
        ("launch", "cuLaunchKernel 700"),
        ("event-record", "cuEventRecord 700"),
        ("sync", "cuEventSynchronize 700"),
    ] {
        let standin = StandIn::new(&[("TENSOR_WASM_STANDIN_FAULT", at)]);
        let data = tempfile::tempdir().unwrap();
        let server = standin.serve(data.path());
        let vadd = server.deploy(&examples().join("vector_add.wat"), "name=vadd");
        assert_eq!(
            server.call(&vadd, "run", json!([4096])),
            (200, json!({"results": [-6]})),
            "fault reported at {at}"
        );
        assert_eq!(server.get("/healthz").0, 200);
        server.terminate();
        let calls = standin.calls(&format!("fault reported at {at}"));
        assert_eq!(calls.get(reported_by), Some(&1), "{at}: {calls:?}");
    }
}

/// `--gpu-isolation context`: each tenant launches in a CUDA context of its own (guest memory
/// stays in the primary context).
#[test]
fn tenants_with_their_own_context_launch_kernels() {
    let standin = StandIn::new(&[]);
    let data = tempfile::tempdir().unwrap();
    let server = Server::start_with_env(
        Path::new(BIN),
        data.path(),
        &["--device", "cuda", "--gpu-isolation", "context"],
        &standin.env(),
        "warn",
        Stdio::inherit(),
    );
    let vadd = server.deploy(&examples().join("vector_add.wat"), "name=vadd");
    for n in [1, 4096, 65536] {
        assert_eq!(
            server.call(&vadd, "run", json!([n])),
            (200, json!({"results": [n]}))
        );
    }
    let matmul = server.deploy(&c_guest("matmul"), "name=matmul&style=wasi");
    let (status, out, _) = server.post(
        &format!("/functions/{matmul}/invoke"),
        "text/plain",
        b"33 17 45",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
    assert_eq!(json_of(&out)["mismatches"], 0);
    server.terminate();
    let calls = standin.calls("own contexts");
    assert!(calls.contains_key("cuCtxCreate_v4 0"), "{calls:?}");
}

/// A snapshot of a function's memory, taken and restored on the CUDA path (guest memory in
/// managed memory), survives a restart; kernels run after the restore.
#[test]
fn snapshots_restore_into_managed_guest_memory() {
    let standin = StandIn::new(&[]);
    let data = tempfile::tempdir().unwrap();
    let server = standin.serve(data.path());
    let warm = server.deploy(&examples().join("warm.wat"), "name=warm");
    let out = server.cli(&["snapshot", "create", &warm, "--init", "init"], b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let initialised = server.call(&warm, "lookup", json!([7])).1["results"].clone();
    assert_ne!(initialised, json!([-1]));
    server.terminate();

    let server = standin.serve(data.path());
    assert_eq!(
        server.call(&warm, "init_runs", json!([])).1["results"],
        json!([1])
    );
    assert_eq!(
        server.call(&warm, "lookup", json!([7])).1["results"],
        initialised
    );
    let vadd = server.deploy(&examples().join("vector_add.wat"), "name=vadd");
    assert_eq!(
        server.call(&vadd, "run", json!([4096])),
        (200, json!({"results": [4096]}))
    );
    server.terminate();
    standin.calls("snapshots");
}

/// A fault in a tenant's own context is reported (here by the launch, by the completion
/// event's record, or by its synchronization); the tenant's next invocation gets a fresh
/// context and succeeds.
///
/// Regression test: a fault reported by the launch or by `cuEventRecord`
/// used to leave the lane unmarked, so its context was never replaced and every later launch
/// of the tenant failed.
#[test]
fn a_faulted_own_context_is_replaced() {
    for at in ["sync", "launch", "event-record"] {
        let standin = StandIn::new(&[("TENSOR_WASM_STANDIN_FAULT", at)]);
        let data = tempfile::tempdir().unwrap();
        let server = Server::start_with_env(
            Path::new(BIN),
            data.path(),
            &["--device", "cuda", "--gpu-isolation", "context"],
            &standin.env(),
            "warn",
            Stdio::inherit(),
        );
        let vadd = server.deploy(&examples().join("vector_add.wat"), "name=vadd");
        assert_eq!(
            server.call(&vadd, "run", json!([4096])),
            (200, json!({"results": [-6]})),
            "{at}"
        );
        assert_eq!(
            server.call(&vadd, "run", json!([4096])),
            (200, json!({"results": [4096]})),
            "after a fault reported at {at}"
        );
        server.terminate();
    }
}

/// On an older driver (CUDA 12.4: PTX ISA 8.4 at most) the JIT emits PTX that driver loads:
/// the stand-in refuses any newer `.version`, as a real driver does.
#[test]
fn an_older_driver_gets_ptx_it_can_load() {
    let standin = StandIn::new(&[("TENSOR_WASM_STANDIN_DRIVER_VERSION", "12040")]);
    let data = tempfile::tempdir().unwrap();
    let server = standin.serve(data.path());
    let blueprints = server.deploy(&c_guest("blueprints"), "name=blueprints&style=wasi");
    let (status, out, exit) = server.post(
        &format!("/functions/{blueprints}/invoke"),
        "text/plain",
        b"7",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
    let result = json_of(&out);
    let families = result.as_object().unwrap_or_else(|| panic!("{result}"));
    assert!(families.values().all(|v| v == 0), "{result}");
    assert_eq!(exit.as_deref(), Some("0"));
    server.terminate();
    let calls = standin.calls("driver 12.4");
    assert!(!calls.contains_key("cuModuleLoadData 222"), "{calls:?}");
    assert!(calls.contains_key("cuLaunchKernel 0"), "{calls:?}");
}

/// With a CUDA context per tenant, a fault in one tenant's context leaves another tenant's
/// kernels running, and the faulted tenant gets a fresh context for its next invocation.
/// (The fault is reported at synchronization; `a_faulted_own_context_is_replaced` covers the
/// launch and the event record too.)
#[test]
fn a_fault_in_one_tenants_context_leaves_another_tenant_running() {
    let standin = StandIn::new(&[
        ("TENSOR_WASM_STANDIN_FAULT", "sync"),
        ("TENSOR_WASM_STANDIN_FAULT_KERNEL", "vector_add"),
    ]);
    let data = tempfile::tempdir().unwrap();
    let server = Server::start_with_env(
        Path::new(BIN),
        data.path(),
        &["--device", "cuda", "--gpu-isolation", "context"],
        &standin.env(),
        "warn",
        Stdio::inherit(),
    );
    let bystander = Tenant::create(&server, "bystander");
    let theirs = bystander.deploy(&server, &examples().join("vector_add.wat"));
    let run_theirs = || bystander.call(&server, &theirs, "run", json!([4096]));
    let ours = server.deploy(&examples().join("vector_add.wat"), "name=vadd");

    // The first vector_add launch faults: ours.
    assert_eq!(
        server.call(&ours, "run", json!([4096])),
        (200, json!({"results": [-6]}))
    );
    assert_eq!(run_theirs(), (200, json!({"results": [4096]})));
    assert_eq!(
        server.call(&ours, "run", json!([4096])),
        (200, json!({"results": [4096]}))
    );
    server.terminate();
    let calls = standin.calls("fault in one tenant's context");
    assert_eq!(calls.get("cuEventSynchronize 700"), Some(&1), "{calls:?}");
}

/// A tenant other than the default one, with its token.
struct Tenant {
    auth: String,
}

impl Tenant {
    fn create(server: &Server, name: &str) -> Tenant {
        Tenant {
            auth: format!("Bearer {}", server.create_tenant(name)),
        }
    }

    /// Deploys the module at `path` as this tenant and returns the function id.
    fn deploy(&self, server: &Server, path: &Path) -> String {
        let module = std::fs::read(path).unwrap();
        let (status, body, _) = Server::reply(
            Server::agent()
                .post(&server.url("/functions?name=vadd"))
                .set("authorization", &self.auth)
                .set("content-type", "application/wasm")
                .send_bytes(&module),
        );
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        json_of(&body)["id"].as_str().unwrap().to_owned()
    }

    fn call(
        &self,
        server: &Server,
        id: &str,
        export: &str,
        args: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let (status, body, _) = Server::reply(
            Server::agent()
                .post(&server.url(&format!("/functions/{id}/invoke")))
                .set("authorization", &self.auth)
                .send_json(json!({ "export": export, "args": args })),
        );
        (status, json_of(&body))
    }
}

/// At the default isolation level every tenant gets a CUDA stream of its own in the one
/// shared (primary) context. Three calls by three tenants create exactly two more streams
/// than three calls by one tenant (whatever else a call creates), and no context.
#[test]
fn tenants_get_stream_lanes_of_their_own_through_the_server() {
    let streams_and_contexts = |tenants: usize| {
        let standin = StandIn::new(&[]);
        let data = tempfile::tempdir().unwrap();
        let server = standin.serve(data.path());
        let vadd = server.deploy(&examples().join("vector_add.wat"), "name=vadd");
        for _ in tenants..=3 {
            assert_eq!(
                server.call(&vadd, "run", json!([4096])),
                (200, json!({"results": [4096]}))
            );
        }
        for n in 1..tenants {
            let other = Tenant::create(&server, &format!("tenant-{n}"));
            let theirs = other.deploy(&server, &examples().join("vector_add.wat"));
            assert_eq!(
                other.call(&server, &theirs, "run", json!([4096])),
                (200, json!({"results": [4096]}))
            );
        }
        server.terminate();
        let calls = standin.calls(&format!("stream lanes, {tenants} tenant(s), 3 calls"));
        let count = |prefix: &str| -> u64 {
            calls
                .iter()
                .filter(|(call, _)| call.starts_with(prefix))
                .map(|(_, n)| n)
                .sum()
        };
        (count("cuStreamCreate "), count("cuCtxCreate"))
    };
    let (one_tenant, one_contexts) = streams_and_contexts(1);
    let (three_tenants, three_contexts) = streams_and_contexts(3);
    assert_eq!(
        three_tenants,
        one_tenant + 2,
        "one stream lane per extra tenant"
    );
    assert_eq!(
        (one_contexts, three_contexts),
        (0, 0),
        "no context of their own"
    );
}

/// On CUDA a kernel cannot be stopped (here a 4096³ matmul in the stand-in's
/// interpreter, which would run for hours). The client still gets `invocation_timeout` at the
/// deadline (+ 100 ms), the server keeps serving, and the invocation keeps its quota (and so its
/// guest memory) while the kernel runs.
#[test]
fn an_unstoppable_kernel_is_answered_at_the_deadline_and_keeps_its_memory() {
    let standin = StandIn::new(&[]);
    let data = tempfile::tempdir().unwrap();
    let server = standin.serve(data.path());
    let (status, body, _) = server.post(
        "/functions?name=attack&timeout_ms=300",
        "application/wasm",
        ALIASED_MATMUL_WAT.as_bytes(),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let attack = json_of(&body)["id"].as_str().unwrap().to_owned();
    let start = Instant::now();
    let (status, body) = server.call(&attack, "run", json!([]));
    let took = start.elapsed();
    assert_eq!(
        (status, error_code(&body)),
        (504, "invocation_timeout"),
        "{body}"
    );
    eprintln!("stand-in: answered {took:?} after a 300 ms deadline's start");
    // Generous for a loaded machine; the server's bound is the deadline + 100 ms.
    assert!(
        took < Duration::from_millis(300 + 1000),
        "answered after {took:?}"
    );
    let tenant = server.tenant_id();
    let running = server.metric(&format!(
        "tensor_wasm_tenant_concurrent_invocations{{tenant=\"{tenant}\"}}"
    ));
    assert_eq!(
        running,
        Some(1.0),
        "the invocation holds its quota while its kernel runs"
    );

    // A streamed call ends its stream with `invocation_timeout` at the deadline too ...
    let start = Instant::now();
    let (status, body, _) = Server::reply(
        Server::agent()
            .post(&server.url(&format!("/functions/{attack}/invoke-stream?export=run")))
            .set("authorization", &server.auth())
            .set("accept", "text/event-stream")
            .send_bytes(b""),
    );
    let took = start.elapsed();
    let events = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{events}");
    assert!(
        events.contains("event: error") && events.contains("invocation_timeout"),
        "{events}"
    );
    eprintln!("stand-in: the stream ended {took:?} after a 300 ms deadline's start");
    assert!(
        took < Duration::from_millis(300 + 1000),
        "the stream ended after {took:?}"
    );

    // ... and an async job fails with it by then.
    let (status, body, _) = server.post(
        &format!("/functions/{attack}/invoke-async"),
        "application/json",
        br#"{"export": "run"}"#,
    );
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
    let job = json_of(&body)["job_id"].as_str().unwrap().to_owned();
    let (failed, took) = wait_for(Duration::from_secs(10), "the job has finished", || {
        let (status, body) = server.get(&format!("/jobs/{job}"));
        assert_eq!(status, 200);
        let job = json_of(&body);
        (job["status"] != "queued" && job["status"] != "running").then_some(job)
    });
    assert_eq!(
        (&failed["status"], &failed["error"]["code"]),
        (&json!("failed"), &json!("invocation_timeout")),
        "{failed}"
    );
    eprintln!("stand-in: the job failed {took:?} after its submission (300 ms deadline)");
    assert!(
        took < Duration::from_millis(300 + 1000),
        "the job failed after {took:?}"
    );
    assert_eq!(server.get("/healthz").0, 200);
}

/// A tenant without `raw_ptx` runs its own PTX on the CUDA backend: verified, fenced and
/// launched with its window, through the stand-in. `fill` computes what it should and a store
/// 1 GiB past its buffer lands inside the function's memory, once. A spinning kernel answers
/// 504 at its 300 ms deadline, ended by its cancel word (the stand-in runs it on its stream's
/// thread and serves the word live, with no step limit to end it otherwise), while another
/// tenant's fenced kernel completes beside it in the same context; then nothing is left in
/// flight, and the same function runs on.
#[test]
fn tenant_kernels_are_fenced_over_the_stand_in() {
    // No step limit to speak of: only the cancel word can end the spinning kernel.
    let standin = StandIn::new(&[("TENSOR_WASM_STANDIN_STEP_LIMIT", "1099511627776")]);
    let data = tempfile::tempdir().unwrap();
    let server = Server::start_with_env(
        Path::new(BIN),
        data.path(),
        &["--device", "cuda"],
        &standin.env(),
        "warn",
        Stdio::inherit(),
    );
    let guest = tenant_kernels::guest();
    let (status, body, _) = server.post(
        "/functions?name=own&timeout_ms=300",
        "application/wasm",
        guest.as_bytes(),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let own = json_of(&body)["id"].as_str().unwrap().to_owned();
    assert_eq!(
        server.call(&own, "fill_check", json!([])),
        (200, json!({"results": [0]}))
    );
    assert_eq!(
        server.call(&own, "wild_markers", json!([])),
        (200, json!({"results": [1]}))
    );

    let quiet = server.create_tenant("quiet");
    let fill = server.deploy_as(&quiet, "name=fill", guest.as_bytes());
    let quiet_fill = || {
        let start = Instant::now();
        let (status, body, _) = Server::reply(
            Server::agent()
                .post(&server.url(&format!("/functions/{fill}/invoke")))
                .set("authorization", &format!("Bearer {quiet}"))
                .send_json(json!({"export": "fill_check", "args": []})),
        );
        (status, json_of(&body), start.elapsed())
    };
    let (status, answer, _) = quiet_fill();
    assert_eq!((status, answer), (200, json!({"results": [0]})));

    let spin = server.invoke_in_background(
        &server.token,
        &own,
        json!({"export": "run", "args": [KERNEL.spin, 1, 32, SPIN_ARGS, 16]}),
    );
    let in_flight = |n: f64| server.metric("tensor_wasm_dispatch_in_flight") == Some(n);
    wait_until(
        Duration::from_secs(5),
        "the spinning kernel is running",
        || in_flight(1.0),
    );
    // The quiet tenant's kernel, on its own stream of the same context, while the spinner
    // runs.
    let mut beside = Vec::new();
    for _ in 0..3 {
        let (status, answer, took) = quiet_fill();
        assert_eq!((status, answer), (200, json!({"results": [0]})));
        beside.push(took);
    }
    assert!(!spin.is_finished(), "the kernel spins until its deadline");
    let (status, body, took) = spin.join().unwrap();
    assert_eq!(
        (status, error_code(&body)),
        (504, "invocation_timeout"),
        "{body}"
    );
    let late = took.saturating_sub(Duration::from_millis(300));
    // The kernel is gone once its cancel word stopped it.
    let ended = wait_until(Duration::from_secs(5), "no kernel left in flight", || {
        in_flight(0.0)
    });
    eprintln!(
        "stand-in: a spinning fenced kernel answered {late:?} after its 300 ms deadline and \
         was gone {ended:?} after that; the other tenant's fill took {beside:?} beside it"
    );
    assert!(late < Duration::from_millis(1000), "answered {late:?} late");
    assert!(ended < Duration::from_millis(1000), "ran on for {ended:?}");
    // No fault: the same function runs on, and so does the other tenant.
    assert_eq!(
        server.call(&own, "fill_check", json!([])),
        (200, json!({"results": [0]}))
    );
    let (status, answer, _) = quiet_fill();
    assert_eq!((status, answer), (200, json!({"results": [0]})));
    assert_eq!(server.get("/healthz").0, 200);
}

/// `wasi-nn` with the `gpu` target on the CUDA backend: the small ONNX cases of
/// `scripts/onnx/graphs.py` (every operator kind among them) and the digits CNN and the
/// transformer encoder of `models.py` run by the C core module and the Python component with
/// target `gpu` (kernels in the stand-in's PTX interpreter) and with target `cpu` (the CPU
/// backend beside the CUDA one) on the same server: identical bytes, within ONNX Runtime's
/// tolerance.
#[test]
fn wasi_nn_models_give_the_same_bytes_on_the_gpu_target() {
    use tensor_wasm_test_support::nn_cases::{self, parse_outputs};
    let cases_dir = tempfile::tempdir().unwrap();
    nn_cases::write_cases(cases_dir.path());
    let models_dir = tempfile::tempdir().unwrap();
    nn_cases::write_models(models_dir.path());
    let models = ["digits_cnn@1", "transformer@1"];
    let cases: Vec<_> = nn_cases::cases(cases_dir.path())
        .into_iter()
        .filter(|c| c.largest <= 1024)
        .chain(
            nn_cases::cases(models_dir.path())
                .into_iter()
                .filter(|c| models.contains(&c.name.as_str())),
        )
        .collect();
    let out = tempfile::tempdir().unwrap();
    let python = tensor_wasm_test_support::toolchains::python_nn_component(out.path());
    let standin = StandIn::new(&[]);
    let data = tempfile::tempdir().unwrap();
    let server = standin.serve(data.path());
    let limits = "memory_limit_bytes=67108864&timeout_ms=120000";
    let c = server.deploy(
        &c_guest("nn_run"),
        &format!("name=nn-c&style=wasi&{limits}"),
    );
    let py = server.deploy(&python, &format!("name=nn-python&{limits}"));
    let run = |id: &str, stdin: &[u8]| -> Result<Vec<Vec<u8>>, String> {
        let (status, body, exit) = server.post(
            &format!("/functions/{id}/invoke"),
            "application/octet-stream",
            stdin,
        );
        if status != 200 || exit.as_deref() != Some("0") {
            return Err(format!("HTTP {status}, exit {exit:?}"));
        }
        parse_outputs(&body)
    };
    let started = Instant::now();
    let mut failures = Vec::new();
    for case in &cases {
        let cpu = run(&c, &case.stdin(0));
        let outcomes = [
            ("C gpu", run(&c, &case.stdin(1))),
            ("Python gpu", run(&py, &case.stdin(1))),
        ];
        let cpu = match cpu.and_then(|o| case.check(&o).map(|()| o)) {
            Ok(cpu) => cpu,
            Err(e) => {
                failures.push(format!("{}: C cpu: {e}", case.name));
                continue;
            }
        };
        for (what, outcome) in outcomes {
            match outcome {
                Ok(gpu) if gpu == cpu => {}
                Ok(_) => failures.push(format!("{}: {what}: bytes differ from cpu", case.name)),
                Err(e) => failures.push(format!("{}: {what}: {e}", case.name)),
            }
        }
    }
    server.terminate();
    standin.calls("wasi-nn, gpu and cpu targets");
    assert!(cases.len() >= 62, "{} small cases", cases.len());
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    let _ = writeln!(
        std::io::stderr(),
        "stand-in: wasi-nn: {} ONNX cases identical on the gpu and cpu targets ({:?})",
        cases.len(),
        started.elapsed()
    );
}
