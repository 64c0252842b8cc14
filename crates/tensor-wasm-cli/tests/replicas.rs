//! Scale-out end to end: three real `tensor-wasm serve` processes, each on
//! its own port and data dir, over one shared store on a real PostgreSQL 15 and a real S3
//! server (both started here). A model stored on one is listed and loaded by name on another;
//! a second store of its name is a conflict; deleted there, the first stops loading it within a
//! second. A function deployed on one is served by the others at once;
//! deleted on one, the others answer 404 within a second; a token created on one works on the
//! others, and once revoked on one, the others refuse it within a second (test 1). A snapshot
//! captured on one is where an invocation on another starts (test 2). With
//! PostgreSQL stopped, loaded functions keep answering and writes answer 503 with Retry-After
//! until it is back; with object storage stopped, deploys answer 503 and leave no record
//! (test 6); readiness fails while PostgreSQL is down. With PostgreSQL frozen (nothing
//! answers), a replica fails closed for raw kernels past `--policy-stale-ms`. Fifty deploys at once over the three against `max_functions = 10`: exactly 10
//! succeed (test 3, the count quota). `kill -9` of a replica during a burst of deploys: every
//! acknowledged deploy is served by the others, every stored record is whole (test 5). Async
//! jobs over four replicas, one killed while running some: every job completes, those it held
//! once more elsewhere (test 4). Rate and concurrency limits shared by the live replicas, each
//! enforcing its share (test 3).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use tensor_wasm_test_support::guests::examples_dir;
use tensor_wasm_test_support::nn_cases::{self, parse_outputs};
use tensor_wasm_test_support::serve::{error_code, json_of, Replicas, ServeProcess};
use tensor_wasm_test_support::servers::{Postgres, S3Server};
use tensor_wasm_test_support::wait::{wait_for, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_tensor-wasm");

/// A request with `auth` as the bearer: status and JSON body.
fn request(method: &str, url: &str, auth: &str, body: Option<Value>) -> (u16, Value) {
    let req = ServeProcess::agent()
        .request(method, url)
        .set("authorization", auth);
    let result = match body {
        Some(body) => req.send_json(body),
        None => req.call(),
    };
    let (status, body, _) = ServeProcess::reply(result);
    (
        status,
        if body.is_empty() {
            Value::Null
        } else {
            json_of(&body)
        },
    )
}

#[test]
fn three_replicas_share_functions_and_tokens() {
    let pg = Postgres::start();
    let s3 = S3Server::start();
    s3.create_bucket("tw-replicas");
    let database = pg.create_database("replicas");
    let args = [
        "--store",
        database.as_str(),
        "--blob-store",
        "s3://tw-replicas/e2e",
        "--allow-raw-ptx",
    ];
    let set = Replicas::new(Path::new(BIN), 3, &args, s3.client_env(), "warn");
    let (a, b, c) = (set.start(0), set.start(1), set.start(2));

    models_are_shared_by_the_replicas(&a, &b);

    // Deployed on A: B and C invoke it, at the same time.
    let id = a.deploy(&examples_dir().join("calc.wat"), "name=calc");
    for replica in [&b, &c] {
        wait_until(
            Duration::from_secs(1),
            "the replica serves the new function",
            || replica.call(&id, "add", json!([2, 3])).0 == 200,
        );
    }
    let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let calls: Vec<_> = [&b, &c]
            .into_iter()
            .map(|replica| scope.spawn(|| replica.call(&id, "add", json!([20, 22]))))
            .collect();
        calls.into_iter().map(|call| call.join().unwrap()).collect()
    });
    for (status, body) in answers {
        assert_eq!(status, 200, "{body}");
        assert_eq!(body, json!({"results": [42]}));
    }

    // Deleted on A: B and C answer 404 within a second.
    let (status, body) = request(
        "DELETE",
        &a.url(&format!("/functions/{id}")),
        &a.auth(),
        None,
    );
    assert!(status == 200 || status == 204, "{status} {body}");
    for replica in [&b, &c] {
        wait_until(Duration::from_secs(1), "the replica answers 404", || {
            let (status, body) = replica.call(&id, "add", json!([1, 1]));
            status == 404 && error_code(&body) == "not_found"
        });
    }

    // A token created on A works on B and C; revoked on A, they refuse it within a second.
    let tenant = a.tenant_id();
    let (status, token) = request(
        "POST",
        &a.url(&format!("/tenants/{tenant}/tokens")),
        &a.admin_auth(),
        Some(json!({"label": "replicas"})),
    );
    assert_eq!(status, 201, "{token}");
    let secret = format!("Bearer {}", token["token"].as_str().expect("the secret"));
    let token_id = token["token_id"].as_str().expect("token id").to_owned();
    for replica in [&b, &c] {
        wait_until(
            Duration::from_secs(1),
            "the replica accepts the new token",
            || request("GET", &replica.url("/functions"), &secret, None).0 == 200,
        );
    }
    let (status, body) = request(
        "DELETE",
        &a.url(&format!("/tenants/{tenant}/tokens/{token_id}")),
        &a.admin_auth(),
        None,
    );
    assert!(status == 200 || status == 204, "{status} {body}");
    for replica in [&b, &c] {
        wait_until(
            Duration::from_secs(1),
            "the replica refuses the revoked token",
            || request("GET", &replica.url("/functions"), &secret, None).0 == 401,
        );
    }

    // The raw-kernel capability granted on A reaches B within a second (B deploys a raw-kernel
    // function); revoked on A, B stops starting that function within a second. Before the
    // runtime asked the tenant registry, B kept its own copy: the grant never reached it, and
    // a revoke made elsewhere left B running raw kernels until it restarted.
    let capability = |granted: bool| {
        let (status, body) = request(
            "PATCH",
            &a.url(&format!("/tenants/{tenant}")),
            &a.admin_auth(),
            Some(json!({ "raw_ptx": granted })),
        );
        assert_eq!(status, 200, "{body}");
    };
    assert_eq!(
        deploy_raw(&b, "name=raw-early&raw_ptx=true").1,
        "raw_ptx_not_granted"
    );
    capability(true);
    let mut raw = String::new();
    wait_until(
        Duration::from_secs(1),
        "B deploys a raw-kernel function",
        || {
            let bytes = std::fs::read(examples_dir().join("calc.wat")).unwrap();
            let (status, body, _) = b.post(
                "/functions?name=raw-b&raw_ptx=true",
                "application/wasm",
                &bytes,
            );
            if status == 201 {
                raw = json_of(&body)["id"].as_str().unwrap().to_owned();
            }
            status == 201
        },
    );
    assert_eq!(b.call(&raw, "add", json!([1, 2])).0, 200);
    capability(false);
    wait_until(
        Duration::from_secs(1),
        "B stops the raw-kernel function",
        || {
            let (status, body) = b.call(&raw, "add", json!([1, 2]));
            status == 403 && error_code(&body) == "raw_ptx_not_granted"
        },
    );
    let (status, body) = request(
        "DELETE",
        &b.url(&format!("/functions/{raw}")),
        &b.auth(),
        None,
    );
    assert!(status == 200 || status == 204, "{status} {body}");

    // A snapshot captured on A: an invocation on B starts from it (B fetches the portable
    // image from object storage and builds its local one).
    let warm = a.deploy(&examples_dir().join("warm.wat"), "name=warm");
    let (status, body, _) = a.post(
        &format!("/functions/{warm}/snapshots"),
        "application/json",
        br#"{"init_export": "init"}"#,
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    wait_until(
        Duration::from_secs(1),
        "B starts warm from A's snapshot",
        || b.call(&warm, "init_runs", json!([])) == (200, json!({"results": [1]})),
    );
    assert_eq!(
        b.call(&warm, "tag", json!([])),
        (200, json!({"results": [0x6d72_6177]}))
    );
    let (status, body) = request(
        "DELETE",
        &a.url(&format!("/functions/{warm}")),
        &a.auth(),
        None,
    );
    assert!(status == 200 || status == 204, "{status} {body}");

    // 50 deploys at once, spread over the three replicas, against max_functions = 10: exactly
    // 10 succeed (the shared store counts in the write's transaction), the others are 409.
    let patch = |quotas: Value| {
        let (status, body) = request(
            "PATCH",
            &a.url(&format!("/tenants/{tenant}")),
            &a.admin_auth(),
            Some(json!({ "quotas": quotas })),
        );
        assert_eq!(status, 200, "{body}");
    };
    patch(json!({
        "max_functions": 10,
        "max_concurrent_deploys": 100,
        "requests_per_second": 100_000,
        "burst": 100_000,
    }));
    quota_reaches(&[&b, &c], &a.admin_auth(), "max_functions", &json!(10));
    let replicas = [&a, &b, &c];
    let outcomes: Vec<(u16, String, Option<String>)> = std::thread::scope(|scope| {
        let deploys: Vec<_> = (0..50)
            .map(|i| {
                let replica = replicas[i % 3];
                scope.spawn(move || deploy_raw(replica, &format!("name=burst-{i}")))
            })
            .collect();
        deploys.into_iter().map(|d| d.join().unwrap()).collect()
    });
    let created = outcomes
        .iter()
        .filter(|(status, ..)| *status == 201)
        .count();
    assert_eq!(created, 10, "{outcomes:?}");
    for (status, code, _) in &outcomes {
        assert!(
            *status == 201 || (*status == 409 && code == "quota_count_exceeded"),
            "{status} {code}"
        );
    }
    assert_eq!(
        pg.query("replicas", "SELECT count(*) FROM tw_functions"),
        vec!["10"]
    );
    patch(json!({ "max_functions": 1000 }));

    // kill -9 of a replica during a burst of deploys: every deploy it acknowledged is served by
    // the others, and every function record in the store is whole (its module is there).
    let dir_d = tempfile::tempdir().unwrap();
    let d = set.start_in(dir_d.path(), &[]);
    let (base, auth) = (d.url(""), d.auth());
    let acked = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        let burst = scope.spawn(|| {
            let calc = std::fs::read(examples_dir().join("calc.wat")).unwrap();
            for i in 0..200 {
                let sent = ServeProcess::agent()
                    .post(&format!("{base}/functions?name=killed-{i}"))
                    .set("content-type", "application/wasm")
                    .set("authorization", &auth)
                    .send_bytes(&calc);
                match sent {
                    Ok(response) if response.status() == 201 => {
                        let body = response.into_string().unwrap();
                        let id = json_of(body.as_bytes())["id"].as_str().unwrap().to_owned();
                        acked.lock().unwrap().push(id);
                    }
                    // Refused or cut off by the kill: not acknowledged.
                    _ => {}
                }
            }
        });
        wait_until(
            Duration::from_secs(30),
            "some deploys on D are acknowledged",
            || acked.lock().unwrap().len() >= 5,
        );
        d.kill9();
        burst.join().unwrap();
    });
    let acked = acked.into_inner().unwrap();
    for id in &acked {
        wait_until(
            Duration::from_secs(1),
            "B serves every acknowledged deploy",
            || b.call(id, "add", json!([1, 2])).0 == 200,
        );
    }
    for id in pg.query("replicas", "SELECT id FROM tw_functions") {
        wait_until(
            Duration::from_secs(1),
            "every stored function is whole",
            || c.call(&id, "add", json!([1, 2])).0 == 200,
        );
    }

    async_jobs_survive_a_killed_replica(&pg, &[&a, &b, &c], &|extra: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let server = set.start_in(dir.path(), extra);
        (server, dir)
    });

    limits_are_shared_within_the_documented_overshoot(&[&a, &b, &c], &patch);

    // PostgreSQL stopped: functions the replicas have loaded keep answering; writes answer
    // 503 with Retry-After; once it is back, writes succeed again by themselves.
    let calc = a.deploy(&examples_dir().join("calc.wat"), "name=calc-2");
    wait_until(Duration::from_secs(1), "B serves calc-2", || {
        b.call(&calc, "add", json!([1, 2])).0 == 200
    });
    pg.stop();
    assert_eq!(b.call(&calc, "add", json!([1, 2])).0, 200);
    let (status, code, retry_after) = deploy_raw(&a, "name=during-outage");
    assert_eq!((status, code.as_str()), (503, "store_unavailable"));
    assert_eq!(retry_after.as_deref(), Some("1"));
    // Readiness follows the database, so a load balancer sends new traffic elsewhere.
    wait_until(Duration::from_secs(5), "B is not ready", || {
        b.get("/readyz").0 == 503
    });
    pg.resume();
    wait_until(Duration::from_secs(10), "deploys succeed again", || {
        deploy_raw(&a, "name=after-outage").0 == 201
    });
    wait_until(Duration::from_secs(10), "B is ready again", || {
        b.get("/readyz").0 == 200
    });
    // PostgreSQL frozen (every process stopped: connections stay open, nothing answers, as
    // with a hung server or a half-open path): B stops hearing the change log, and past
    // --policy-stale-ms (5 s) it fails closed: raw kernels refused, /readyz 503, ordinary
    // functions still served. Once the database answers again, B catches up and runs raw
    // kernels again.
    capability(true);
    let raw = wait_for(
        Duration::from_secs(5),
        "A deploys a raw-kernel function",
        || {
            let bytes = std::fs::read(examples_dir().join("calc.wat")).unwrap();
            let (status, body, _) = a.post(
                "/functions?name=raw-frozen&raw_ptx=true",
                "application/wasm",
                &bytes,
            );
            (status == 201).then(|| json_of(&body)["id"].as_str().unwrap().to_owned())
        },
    )
    .0;
    wait_until(Duration::from_secs(1), "B runs the raw kernel", || {
        b.call(&raw, "add", json!([1, 2])).0 == 200
    });
    {
        pg.freeze();
        let _thaw = Thaw(&pg);
        wait_until(Duration::from_secs(15), "B fails closed", || {
            let (status, body) = b.call(&raw, "add", json!([1, 2]));
            status == 403 && error_code(&body) == "raw_ptx_not_granted" && b.get("/readyz").0 == 503
        });
        assert_eq!(b.call(&calc, "add", json!([1, 2])).0, 200);
    }
    wait_until(Duration::from_secs(15), "B runs raw kernels again", || {
        b.call(&raw, "add", json!([1, 2])).0 == 200 && b.get("/readyz").0 == 200
    });

    // The outage and the followers are in the metrics.
    assert!(
        metric_sum(
            &a,
            "tensor_wasm_shared_store_errors_total",
            &["kind=\"unavailable\""]
        ) >= 1.0
    );
    assert!(metric_sum(&b, "tensor_wasm_invalidation_lag_seconds_count", &[]) >= 1.0);
    // Per kind of change: B applied function and tenant changes made on A.
    for kind in ["kind=\"function\"", "kind=\"tenant\""] {
        assert!(
            metric_sum(&b, "tensor_wasm_invalidation_lag_seconds_count", &[kind]) >= 1.0,
            "{kind}"
        );
    }
    assert!(
        metric_sum(
            &a,
            "tensor_wasm_shared_store_seconds_count",
            &["store=\"objects\""]
        ) >= 1.0
    );
    let functions = || pg.query("replicas", "SELECT count(*) FROM tw_functions");

    // Object storage stopped: deploys answer 503 and leave no record behind.
    let before = functions();
    let mut s3 = s3;
    s3.kill();
    let (status, code, _) = deploy_raw(&a, "name=no-blob-store");
    assert_eq!((status, code.as_str()), (503, "store_unavailable"));
    assert_eq!(functions(), before);
    for replica in [a, b, c] {
        replica.terminate();
    }
}

/// A model stored on A is listed on B within a second and loaded by name by a function that B
/// invokes, with ONNX Runtime's outputs; a second store of its name on B is `409 conflict`;
/// deleted on B, A stops listing it within a second (the bound functions have), and a load by
/// name on A fails with `wasi-nn`'s `not-found` (the C guest's exit status 18).
fn models_are_shared_by_the_replicas(a: &ServeProcess, b: &ServeProcess) {
    let cases_dir = tempfile::tempdir().unwrap();
    nn_cases::write_cases(cases_dir.path());
    let cases = nn_cases::cases(cases_dir.path());
    let mlp = cases
        .iter()
        .find(|c| c.name == "mlp")
        .expect("the mlp case");
    let guest = examples_dir().join("c/nn_run.wasm");
    let id = a.deploy(
        &guest,
        "name=nn-c&style=wasi&memory_limit_bytes=268435456&timeout_ms=60000",
    );
    let stdin = nn_cases::stdin_by_name("mlp", &mlp.inputs);
    let invoke = |replica: &ServeProcess| {
        replica.post(
            &format!("/functions/{id}/invoke"),
            "application/octet-stream",
            &stdin,
        )
    };

    let (status, body, _) = a.post("/models?name=mlp", "application/octet-stream", &mlp.model);
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let record = json_of(&body);
    wait_until(Duration::from_secs(1), "B lists the model", || {
        let (status, body) = b.get("/models");
        status == 200 && json_of(&body)["models"] == json!([record])
    });
    wait_until(Duration::from_secs(1), "B serves the function", || {
        b.get(&format!("/functions/{id}")).0 == 200
    });
    let (status, out, exit) = invoke(b);
    assert_eq!(
        (status, exit.as_deref()),
        (200, Some("0")),
        "{}",
        String::from_utf8_lossy(&out)
    );
    mlp.check(&parse_outputs(&out).unwrap()).unwrap();

    let (status, body, _) = b.post("/models?name=mlp", "application/octet-stream", &mlp.model);
    assert_eq!((status, error_code(&json_of(&body))), (409, "conflict"));

    let (status, _, _) = ServeProcess::reply(
        ServeProcess::agent()
            .delete(&b.url("/models/mlp"))
            .set("authorization", &b.auth())
            .call(),
    );
    assert_eq!(status, 204);
    wait_until(Duration::from_secs(1), "A drops the model", || {
        a.get("/models/mlp").0 == 404
    });
    let (status, body) = a.get("/models");
    assert_eq!((status, json_of(&body)["models"].clone()), (200, json!([])));
    let (status, out, exit) = invoke(a);
    assert_eq!(
        (status, exit.as_deref()),
        (200, Some("18")),
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert!(
        metric_sum(
            a,
            "tensor_wasm_invalidation_lag_seconds_count",
            &["kind=\"model\""]
        ) >= 1.0
    );
    let (status, body) = request(
        "DELETE",
        &a.url(&format!("/functions/{id}")),
        &a.auth(),
        None,
    );
    assert!(status == 200 || status == 204, "{status} {body}");
}

/// Thaws a frozen PostgreSQL when dropped, so that a failed assertion does not leave it frozen
/// (its teardown would wait for ever).
struct Thaw<'a>(&'a Postgres);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.0.thaw();
    }
}

/// Test 4: async jobs submitted over four replicas; `kill -9` of the replica running some of
/// them. Every job completes, those the killed replica held exactly once more on another
/// replica once its lease ended (`attempts` 2, counted in the survivors' lease expiries), every
/// other job exactly once. An idempotency key answers the same job on any replica.
fn async_jobs_survive_a_killed_replica(
    pg: &Postgres,
    survivors: &[&ServeProcess],
    start: &dyn Fn(&[&str]) -> (ServeProcess, tempfile::TempDir),
) {
    let (e, _dir) = start(&["--replica-name", "E", "--job-lease-s", "1"]);
    let id = survivors[0].deploy(&examples_dir().join("sleep.wat"), "name=nap");
    wait_until(Duration::from_secs(1), "E serves the function", || {
        e.call(&id, "nap", json!([1])).0 == 200
    });
    let submit = |replica: &ServeProcess, ms: u32| -> String {
        let (status, body) = request(
            "POST",
            &replica.url(&format!("/functions/{id}/invoke-async")),
            &replica.auth(),
            Some(json!({"export": "nap", "args": [ms]})),
        );
        assert_eq!(status, 202, "{body}");
        body["job_id"].as_str().expect("a job id").to_owned()
    };
    // E wakes at once for jobs submitted to it; the others look every 500 ms.
    let mut jobs: Vec<String> = (0..4).map(|_| submit(&e, 2000)).collect();
    let held_by_e = || {
        pg.query(
            "replicas",
            "SELECT id FROM tw_jobs WHERE lease_owner = 'E' AND status = 'running' ORDER BY id",
        )
    };
    wait_until(Duration::from_secs(10), "E runs a job", || {
        !held_by_e().is_empty()
    });
    for replica in survivors {
        jobs.extend((0..3).map(|_| submit(replica, 200)));
    }
    e.kill9();
    let held = held_by_e();
    assert!(!held.is_empty());

    let expiries_before: f64 = survivors
        .iter()
        .map(|r| metric_sum(r, "tensor_wasm_job_lease_expiries_total", &[]))
        .sum();
    for job in &jobs {
        let (done, _) = wait_for(Duration::from_secs(30), "every job finishes", || {
            let (status, body) = request(
                "GET",
                &survivors[1].url(&format!("/jobs/{job}")),
                &survivors[1].auth(),
                None,
            );
            assert_eq!(status, 200, "{body}");
            (body["status"] != "queued" && body["status"] != "running").then_some(body)
        });
        assert_eq!(done["status"], "succeeded", "{done}");
        assert_eq!(done["results"], json!([0]), "{done}");
        let expected = if held.contains(job) { 2 } else { 1 };
        assert_eq!(done["attempts"], expected, "{done}");
    }
    let expiries: f64 = survivors
        .iter()
        .map(|r| metric_sum(r, "tensor_wasm_job_lease_expiries_total", &[]))
        .sum();
    assert_eq!(expiries - expiries_before, held.len() as f64);
    let metrics = String::from_utf8(survivors[0].get("/metrics").1).unwrap();
    assert!(
        metrics.contains("\ntensor_wasm_job_queue_depth "),
        "the depth gauge is served"
    );

    // The same idempotency key on two replicas: one job.
    let keyed = |replica: &ServeProcess| {
        let response = ServeProcess::agent()
            .post(&replica.url(&format!("/functions/{id}/invoke-async")))
            .set("authorization", &replica.auth())
            .set("idempotency-key", "nightly-2026-11-25")
            .send_json(json!({"export": "nap", "args": [1]}))
            .expect("202 Accepted");
        assert_eq!(response.status(), 202);
        let replayed = response.header("idempotent-replayed") == Some("true");
        let body = response.into_string().unwrap();
        (json_of(body.as_bytes())["job_id"].clone(), replayed)
    };
    let (first, replayed) = keyed(survivors[0]);
    assert!(!replayed);
    assert_eq!(keyed(survivors[2]), (first, true));
}

/// Test 3, rate and concurrency: with three live replicas each enforces a third of the
/// tenant's limits, rounded up, so the tenant gets at most `limit + replicas - 1` in all
/// (docs/scale-out.md). Four concurrent invocations allowed: each replica admits 2 of 4 sent at
/// once (6 in all = 4 + 3 - 1). Three requests per second with a burst of 3: each admits one
/// of a burst, plus one per second that the burst takes.
fn limits_are_shared_within_the_documented_overshoot(
    replicas: &[&ServeProcess; 3],
    patch: &dyn Fn(Value),
) {
    let [a, ..] = *replicas;
    // The replicas killed earlier stop counting once their heartbeats are 3 s old.
    for replica in replicas {
        wait_until(Duration::from_secs(15), "three live replicas", || {
            metric_sum(replica, "tensor_wasm_live_replicas", &[]) == 3.0
        });
    }
    let quotas_reach =
        |field: &str, value: Value| quota_reaches(replicas, &a.admin_auth(), field, &value);
    let nap = a.deploy(&examples_dir().join("sleep.wat"), "name=nap-limits");
    for replica in replicas {
        wait_until(Duration::from_secs(1), "the replica serves nap", || {
            replica.call(&nap, "nap", json!([1])).0 == 200
        });
    }

    patch(json!({ "max_concurrent_invocations": 4 }));
    quotas_reach("max_concurrent_invocations", json!(4));
    let answers = at_once_on_each(replicas, 4, |replica| {
        replica.call(&nap, "nap", json!([1500]))
    });
    for outcomes in &answers {
        let admitted = outcomes.iter().filter(|(status, _)| *status == 200).count();
        assert_eq!(admitted, 2, "ceil(4 / 3) per replica: {outcomes:?}");
        for (status, body) in outcomes.iter().filter(|(status, _)| *status != 200) {
            assert_eq!(
                (*status, error_code(body)),
                (429, "quota_exhausted"),
                "{body}"
            );
            let message = body["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("across 3 replicas"), "{message}");
        }
    }

    patch(json!({ "max_concurrent_invocations": 32, "requests_per_second": 3, "burst": 3 }));
    quotas_reach("requests_per_second", json!(3));
    let start = std::time::Instant::now();
    let answers = at_once_on_each(replicas, 6, |replica| {
        request("GET", &replica.url("/functions"), &replica.auth(), None).0
    });
    let elapsed = start.elapsed().as_secs();
    for statuses in &answers {
        let admitted = statuses.iter().filter(|s| **s == 200).count() as u64;
        assert!(
            (1..=1 + elapsed).contains(&admitted),
            "a burst of ceil(3 / 3) = 1 and 1 per second in {elapsed} s: {statuses:?}"
        );
        assert!(
            statuses.iter().all(|s| *s == 200 || *s == 429),
            "{statuses:?}"
        );
    }
    patch(json!({ "requests_per_second": 100_000, "burst": 100_000 }));
    quotas_reach("requests_per_second", json!(100_000));
}

/// `call` sent `each` times to every replica, all at once; the answers per replica.
fn at_once_on_each<T: Send>(
    replicas: &[&ServeProcess],
    each: usize,
    call: impl Fn(&ServeProcess) -> T + Sync,
) -> Vec<Vec<T>> {
    std::thread::scope(|scope| {
        let per_replica: Vec<Vec<_>> = replicas
            .iter()
            .map(|replica| (0..each).map(|_| scope.spawn(|| call(replica))).collect())
            .collect();
        per_replica
            .into_iter()
            .map(|calls| calls.into_iter().map(|c| c.join().unwrap()).collect())
            .collect()
    })
}

/// Waits until every replica's view of its tenant has quota `field` at `value` (a tenant
/// change reaches the others through the change log).
fn quota_reaches(replicas: &[&ServeProcess], admin: &str, field: &str, value: &Value) {
    for replica in replicas {
        let tenant = replica.tenant_id();
        wait_until(
            Duration::from_secs(1),
            "the replica has the new quota",
            || {
                let url = replica.url(&format!("/tenants/{tenant}"));
                request("GET", &url, admin, None).1["quotas"][field] == *value
            },
        );
    }
}

/// Deploys `calc.wat` on `server` with `query`: status, error code (empty on success) and
/// `Retry-After`.
fn deploy_raw(server: &ServeProcess, query: &str) -> (u16, String, Option<String>) {
    let bytes = std::fs::read(examples_dir().join("calc.wat")).unwrap();
    let result = ServeProcess::agent()
        .post(&server.url(&format!("/functions?{query}")))
        .set("content-type", "application/wasm")
        .set("authorization", &server.auth())
        .send_bytes(&bytes);
    let response = match result {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("transport error: {e}"),
    };
    let status = response.status();
    let retry_after = response.header("retry-after").map(str::to_owned);
    let body = response.into_string().unwrap_or_default();
    let code = if status >= 400 {
        error_code(&json_of(body.as_bytes())).to_owned()
    } else {
        String::new()
    };
    (status, code, retry_after)
}

/// The sum of the series of metric `name` on `server` whose labels contain every one of
/// `labels`.
fn metric_sum(server: &ServeProcess, name: &str, labels: &[&str]) -> f64 {
    let text = String::from_utf8(server.get("/metrics").1).expect("UTF-8 metrics");
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
                && labels.iter().all(|label| line.contains(label))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
