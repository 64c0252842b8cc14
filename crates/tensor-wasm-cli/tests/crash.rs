//! Crash consistency: the real server is killed with SIGKILL at a random point of a mixed
//! write load (deploys, deletes, snapshots, tenant creation and deletion, token rotation,
//! async jobs), restarted on the same data dir, and checked, round after round on one
//! growing data dir: every acknowledged write is there after the restart, every acknowledged
//! delete stays done, and startup removed no file a record refers to (each function still
//! runs, each function still starts from its snapshot).
//!
//! `TENSOR_WASM_CRASH_ROUNDS` sets the number of rounds (default 50, the issue's bound;
//! `make soak` runs more) and `TENSOR_WASM_CRASH_SEED` the seed of the kill points and the
//! operation mix (default: from the clock, printed, so a failure can be replayed).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tensor_wasm_test_support::pace::fault_schedule_step;
use tensor_wasm_test_support::serve::{json_of, ServeProcess as Server};

const BIN: &str = env!("CARGO_BIN_EXE_tensor-wasm");

/// Live functions the load keeps at most: past it, workers delete instead of deploying, so
/// the data dir (and each restart) stays small over many rounds.
const LIVE_FUNCTIONS: usize = 24;

/// A function whose `id` export returns `value`, and whose `get` export returns it too once
/// `init` ran (a snapshot after `init` starts every later instance with it set).
fn module(value: i32) -> String {
    format!(
        r#"(module
  (memory (export "memory") 1)
  (global $g (mut i32) (i32.const 0))
  (func (export "init") (global.set $g (i32.const {value})))
  (func (export "id") (result i32) (i32.const {value}))
  (func (export "get") (result i32) (global.get $g)))"#
    )
}

/// What the server acknowledged, across rounds. A write whose answer never came (the kill
/// cut it off) is "maybe": it may or may not have happened, and nothing is checked of it.
#[derive(Default)]
struct Acked {
    /// Function id → the value its module returns; `true` once a snapshot of it was acked.
    functions: BTreeMap<String, (i32, bool)>,
    deleted_functions: BTreeSet<String>,
    /// Function ids whose delete or snapshot was in flight at the kill.
    maybe: BTreeSet<String>,
    /// Snapshot id → its function.
    snapshots: BTreeMap<String, String>,
    /// Tenant id → a token acknowledged for it (the latest rotation).
    tenants: BTreeMap<String, String>,
    /// Tenants whose delete was acked, with a token that must no longer work.
    deleted_tenants: BTreeMap<String, String>,
    maybe_tenants: BTreeSet<String>,
    /// Job id → its function and the value the function returns; only this round's.
    jobs: BTreeMap<String, (String, i32)>,
}

/// xorshift64*: a small seeded generator, enough for kill points and the operation mix.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One request's outcome: the status and JSON body, or `None` when the connection broke
/// (the server died under it: not acknowledged).
fn request(method: &str, url: &str, auth: &str, body: Option<&str>) -> Option<(u16, Value)> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(20))
        .build();
    let call = agent.request(method, url).set("authorization", auth);
    let result = match body {
        Some(body) if body.starts_with("(module") => call
            .set("content-type", "application/wasm")
            .send_string(body),
        Some(body) => call
            .set("content-type", "application/json")
            .send_string(body),
        None => call.call(),
    };
    let response = match result {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(ureq::Error::Transport(_)) => return None,
    };
    let status = response.status();
    let text = response.into_string().ok()?;
    Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// Everything a worker needs to reach the server.
#[derive(Clone)]
struct Target {
    base: String,
    auth: String,
    admin: String,
}

/// One write of the mix; records what the server acknowledged.
fn one_write(target: &Target, acked: &Mutex<Acked>, rng: &mut Rng, next_value: &AtomicI32) {
    let url = |path: &str| format!("{}{path}", target.base);
    // Picks a live function and marks it "maybe" under one lock, so that no two workers
    // write to one function at once (a delete racing a snapshot would answer 404).
    let claim = |rng: &mut Rng| -> Option<String> {
        let mut acked = acked.lock().unwrap();
        let live: Vec<&String> = acked
            .functions
            .keys()
            .filter(|id| !acked.maybe.contains(*id))
            .collect();
        let id = live.get(rng.below(live.len() as u64) as usize)?.to_string();
        acked.maybe.insert(id.clone());
        Some(id)
    };
    // The same for tenants, with the token acknowledged for the claimed one, when at least
    // `at_least` are unclaimed.
    let claim_tenant = |rng: &mut Rng, at_least: usize| -> Option<(String, String)> {
        let mut acked = acked.lock().unwrap();
        let free: Vec<(&String, &String)> = acked
            .tenants
            .iter()
            .filter(|(id, _)| !acked.maybe_tenants.contains(*id))
            .collect();
        if free.len() < at_least.max(1) {
            return None;
        }
        let (id, token) = free[rng.below(free.len() as u64) as usize];
        let (id, token) = (id.clone(), token.clone());
        acked.maybe_tenants.insert(id.clone());
        Some((id, token))
    };
    match rng.below(10) {
        0..=3 => {
            let full = acked.lock().unwrap().functions.len() >= LIVE_FUNCTIONS;
            if let Some(id) = full.then(|| claim(rng)).flatten() {
                let reply = request(
                    "DELETE",
                    &url(&format!("/functions/{id}")),
                    &target.auth,
                    None,
                );
                if let Some((status, body)) = reply {
                    assert_eq!(status, 204, "delete {id}: {body}");
                    let mut acked = acked.lock().unwrap();
                    acked.functions.remove(&id);
                    acked.maybe.remove(&id);
                    acked.snapshots.retain(|_, function| *function != id);
                    acked.deleted_functions.insert(id);
                }
                return;
            }
            let value = next_value.fetch_add(1, Ordering::Relaxed);
            let reply = request(
                "POST",
                &url("/functions?name=crash"),
                &target.auth,
                Some(&module(value)),
            );
            if let Some((status, body)) = reply {
                // More deploys at once than the tenant's `max_concurrent_deploys`
                // are refused: not acknowledged, so nothing to check later.
                if status == 429 && body["error"]["code"] == "quota_exhausted" {
                    return;
                }
                assert_eq!(status, 201, "deploy: {body}");
                let id = body["id"].as_str().expect("an id").to_owned();
                acked.lock().unwrap().functions.insert(id, (value, false));
            }
        }
        4 | 5 => {
            let Some(id) = claim(rng) else { return };
            let reply = request(
                "POST",
                &url(&format!("/functions/{id}/snapshots")),
                &target.auth,
                Some(r#"{"init_export":"init"}"#),
            );
            let mut acked = acked.lock().unwrap();
            match reply {
                Some((201, body)) => {
                    let snapshot = body["id"].as_str().expect("a snapshot id").to_owned();
                    acked.snapshots.insert(snapshot, id.clone());
                    if let Some(entry) = acked.functions.get_mut(&id) {
                        entry.1 = true;
                    }
                    acked.maybe.remove(&id);
                }
                // A snapshot count or stored-bytes quota is reached: nothing was written.
                Some((403 | 409, _)) => {
                    acked.maybe.remove(&id);
                }
                Some((status, body)) => panic!("snapshot of {id}: {status} {body}"),
                // Left "maybe": a snapshot may have become the function's start.
                None => {}
            }
        }
        6 => {
            let Some(id) = claim(rng) else { return };
            let value = acked.lock().unwrap().functions[&id].0;
            let reply = request(
                "POST",
                &url(&format!("/functions/{id}/invoke-async")),
                &target.auth,
                Some(r#"{"export":"id","args":[]}"#),
            );
            if let Some((status, body)) = reply {
                assert_eq!(status, 202, "job of {id}: {body}");
                let job = body["job_id"].as_str().expect("a job id").to_owned();
                let mut acked = acked.lock().unwrap();
                acked.jobs.insert(job, (id.clone(), value));
                acked.maybe.remove(&id);
            }
        }
        7 => {
            let name = format!("crash-{}", rng.next() % 1_000_000_000);
            let body = json!({"name": name, "quotas": {"max_functions": 3}}).to_string();
            if let Some((status, body)) =
                request("POST", &url("/tenants"), &target.admin, Some(&body))
            {
                if status == 409 {
                    return; // the name was taken by an earlier round: nothing written
                }
                assert_eq!(status, 201, "tenant: {body}");
                let id = body["tenant"]["id"]
                    .as_str()
                    .expect("a tenant id")
                    .to_owned();
                let token = body["token"].as_str().expect("a token").to_owned();
                acked.lock().unwrap().tenants.insert(id, token);
            }
        }
        8 => {
            let Some((tenant, _)) = claim_tenant(rng, 1) else {
                return;
            };
            let reply = request(
                "POST",
                &url(&format!("/tenants/{tenant}/tokens")),
                &target.admin,
                Some(r#"{"label":"rotated"}"#),
            );
            if let Some((status, body)) = reply {
                assert_eq!(status, 201, "token of {tenant}: {body}");
                let token = body["token"].as_str().expect("a token").to_owned();
                let mut acked = acked.lock().unwrap();
                acked.maybe_tenants.remove(&tenant);
                acked.tenants.insert(tenant, token);
            }
        }
        _ => {
            let Some((tenant, token)) = claim_tenant(rng, 5) else {
                return;
            };
            let reply = request(
                "DELETE",
                &url(&format!("/tenants/{tenant}")),
                &target.admin,
                None,
            );
            if let Some((status, body)) = reply {
                assert_eq!(status, 204, "delete tenant {tenant}: {body}");
                let mut acked = acked.lock().unwrap();
                acked.tenants.remove(&tenant);
                acked.maybe_tenants.remove(&tenant);
                acked.deleted_tenants.insert(tenant, token);
            }
        }
    }
}

/// Checks the restarted `server` against everything acknowledged so far.
fn check(server: &Server, acked: &mut Acked, round: u32) {
    let (status, body) = server.get("/functions");
    assert_eq!(status, 200);
    let listed: BTreeSet<String> = json_of(&body)["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .map(|f| f["id"].as_str().expect("an id").to_owned())
        .collect();
    for (id, (value, snapshotted)) in &acked.functions {
        if acked.maybe.contains(id) {
            continue;
        }
        assert!(
            listed.contains(id),
            "round {round}: acknowledged function {id} is gone"
        );
        assert_eq!(
            server.call(id, "id", json!([])),
            (200, json!({"results": [value]})),
            "round {round}: function {id} no longer runs (its module file?)"
        );
        if *snapshotted {
            // It starts from one of its snapshots, whose image must still be there.
            assert_eq!(
                server.call(id, "get", json!([])),
                (200, json!({"results": [value]})),
                "round {round}: function {id} lost the snapshot it starts from"
            );
        }
    }
    for id in &acked.deleted_functions {
        assert!(
            !listed.contains(id),
            "round {round}: deleted function {id} is back"
        );
    }
    for (snapshot, function) in &acked.snapshots {
        if acked.maybe.contains(function) {
            continue;
        }
        let (status, body) = server.get(&format!("/functions/{function}/snapshots"));
        assert_eq!(status, 200);
        let listed = json_of(&body)["snapshots"].to_string();
        assert!(
            listed.contains(snapshot.as_str()),
            "round {round}: acknowledged snapshot {snapshot} of {function} is gone"
        );
    }
    let url = server.url("/functions");
    for (tenant, token) in &acked.tenants {
        if acked.maybe_tenants.contains(tenant) {
            continue;
        }
        let reply = request("GET", &url, &format!("Bearer {token}"), None);
        assert_eq!(
            reply.map(|r| r.0),
            Some(200),
            "round {round}: tenant {tenant}'s acknowledged token no longer works"
        );
    }
    for (tenant, token) in &acked.deleted_tenants {
        let reply = request("GET", &url, &format!("Bearer {token}"), None);
        assert_eq!(
            reply.map(|r| r.0),
            Some(401),
            "round {round}: deleted tenant {tenant} is back"
        );
    }
    for (job, (function, value)) in std::mem::take(&mut acked.jobs) {
        let (status, body) = server.get(&format!("/jobs/{job}"));
        let body = json_of(&body);
        assert_eq!(
            status, 200,
            "round {round}: acknowledged job {job} is gone: {body}"
        );
        match body["status"].as_str() {
            Some("succeeded") => assert_eq!(body["results"], json!([value]), "{body}"),
            // Killed before it finished: it says so. A job whose function a later write
            // deleted may fail for that instead.
            Some("failed") => assert!(
                body.to_string().contains("restarted") || !acked.functions.contains_key(&function),
                "round {round}: job {job}: {body}"
            ),
            Some("queued" | "running") => {}
            other => panic!("round {round}: job {job}: {other:?} {body}"),
        }
    }
}

#[test]
fn sigkill_during_mixed_writes_loses_no_acknowledged_write() {
    let rounds: u32 = std::env::var("TENSOR_WASM_CRASH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50);
    let seed: u64 = std::env::var("TENSOR_WASM_CRASH_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("TENSOR_WASM_CRASH_SEED={seed} TENSOR_WASM_CRASH_ROUNDS={rounds}");
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(seed);
    let acked = Arc::new(Mutex::new(Acked::default()));
    let next_value = Arc::new(AtomicI32::new(1));
    let started = Instant::now();
    let mut writes = 0usize;
    let mut server = Server::start(Path::new(BIN), dir.path(), &[]);
    server.raise_quotas(64);
    let body = json!({"quotas": {"max_functions": 1000, "requests_per_second": 0}}).to_string();
    let tenant = server.tenant_id();
    let reply = request(
        "PATCH",
        &server.url(&format!("/tenants/{tenant}")),
        &server.admin_auth(),
        Some(&body),
    );
    assert_eq!(reply.map(|r| r.0), Some(200));
    for round in 0..rounds {
        let target = Target {
            base: server.base.clone(),
            auth: server.auth(),
            admin: server.admin_auth(),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let (target, acked, stop, next_value) = (
                    target.clone(),
                    acked.clone(),
                    stop.clone(),
                    next_value.clone(),
                );
                let mut rng = Rng(rng.next() | 1);
                std::thread::spawn(move || {
                    let mut n = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        one_write(&target, &acked, &mut rng, &next_value);
                        n += 1;
                    }
                    let _ = w;
                    n
                })
            })
            .collect();
        // The kill comes at a random point of the burst: the schedule under test.
        fault_schedule_step(Duration::from_millis(50 + rng.below(400)));
        server.kill9();
        stop.store(true, Ordering::Relaxed);
        for worker in workers {
            writes += worker.join().expect("a worker panicked");
        }
        server = Server::start(Path::new(BIN), dir.path(), &[]);
        check(&server, &mut acked.lock().unwrap(), round);
        // What was in flight at the kill is settled now: whatever the restart shows.
        let mut acked = acked.lock().unwrap();
        let (status, body) = server.get("/functions");
        assert_eq!(status, 200);
        let listed = json_of(&body)["functions"].to_string();
        for id in std::mem::take(&mut acked.maybe) {
            if !listed.contains(id.as_str()) {
                acked.functions.remove(&id);
                acked.snapshots.retain(|_, function| *function != id);
                acked.deleted_functions.insert(id);
            } else if let Some(entry) = acked.functions.get_mut(&id) {
                // A snapshot may have been captured: `get` is either value; check `id` only.
                entry.1 = false;
            }
        }
        for tenant in std::mem::take(&mut acked.maybe_tenants) {
            if let Some(token) = acked.tenants.remove(&tenant) {
                let reply = request(
                    "GET",
                    &server.url("/functions"),
                    &format!("Bearer {token}"),
                    None,
                );
                if reply.map(|r| r.0) == Some(200) {
                    acked.tenants.insert(tenant, token);
                }
            }
        }
    }
    let acked = acked.lock().unwrap();
    println!(
        "crash consistency: {rounds} SIGKILLs over {writes} writes in {:.1} s; at the end {} functions, {} snapshots, {} tenants acknowledged and present",
        started.elapsed().as_secs_f64(),
        acked.functions.len(),
        acked.snapshots.len(),
        acked.tenants.len()
    );
    drop(acked);
    server.terminate();
}
