//! A concurrent history, checked: three real `tensor-wasm serve` replicas over one PostgreSQL 15
//! and one S3 server (both started here), and clients that send random operations to random
//! replicas for a fixed time from a committed seed: token creation and revocation, the tenant's
//! raw-kernel capability granted and revoked, a quota changed, functions deployed, changed and
//! deleted, snapshots captured and deleted, async jobs submitted and cancelled, with probes
//! that use tokens and the capability, and reads. Every request is
//! recorded with its times, and `tensor_wasm_test_support::history::check` verifies the history
//! against a sequential model (per key, writes in an order consistent with real time, visible
//! everywhere within the documented bound of 1 s): nothing acknowledged lost, nothing deleted
//! back, no revoked token or capability accepted after the bound.
//!
//! The short run (30 s) is part of `make test`. `make history-check` runs it for longer with a
//! replica killed (`kill -9`) and restarted and PostgreSQL stopped and started again during the
//! run, and writes its run file (`HISTORY_SECONDS`, `HISTORY_CHAOS=1`, `HISTORY_RUN_FILE`;
//! `HISTORY_SEED` picks another seed, `HISTORY_BIN` another build of the server, `HISTORY_NOTE`
//! says in the run file what it was).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tensor_wasm_test_support::guests::examples_dir;
use tensor_wasm_test_support::history::{check, Condition, Event, Kind, Outcome, Report, Rng};
use tensor_wasm_test_support::pace::fault_schedule_step;
use tensor_wasm_test_support::serve::{Replicas, ServeProcess};
use tensor_wasm_test_support::servers::{Postgres, S3Server};
use tensor_wasm_test_support::wait::wait_until;

/// The committed seed of the run in `make test`.
const SEED: u64 = 0x7477_6869_7374_6f72;
/// Replicas, and clients sending at once.
const REPLICAS: usize = 3;
const CLIENTS: usize = 6;
/// The documented bound within which a change made on one replica holds on every replica.
const BOUND_S: f64 = 1.0;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one request came back with: status and JSON body, or `None` when it did not (the
/// connection failed: a killed replica, a timeout).
fn send(method: &str, url: &str, auth: &str, body: Option<&Value>) -> Option<(u16, Value)> {
    let req = ServeProcess::agent()
        .request(method, url)
        .set("authorization", auth);
    let result = match body {
        Some(body) => req.send_json(body.clone()),
        None => req.call(),
    };
    let response = match result {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(ureq::Error::Transport(_)) => return None,
    };
    let status = response.status();
    let text = response.into_string().unwrap_or_default();
    Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

fn send_wasm(url: &str, auth: &str, bytes: &[u8]) -> Option<(u16, Value)> {
    let result = ServeProcess::agent()
        .post(url)
        .set("authorization", auth)
        .set("content-type", "application/wasm")
        .send_bytes(bytes);
    let response = match result {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(ureq::Error::Transport(_)) => return None,
    };
    let status = response.status();
    let text = response.into_string().unwrap_or_default();
    Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

fn outcome(answer: &Option<(u16, Value)>) -> Outcome {
    match answer {
        Some((status, _)) if (200..300).contains(status) => Outcome::Done,
        Some((status, _)) if (400..500).contains(status) => Outcome::Refused,
        _ => Outcome::Unknown,
    }
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

/// Tokens and functions the clients know of.
#[derive(Default)]
struct Known {
    /// Every token created: (id, secret).
    tokens: Vec<(String, String)>,
    /// Every function deployed.
    functions: Vec<String>,
    /// Every snapshot captured: (function, snapshot).
    snapshots: Vec<(String, String)>,
    /// Every async job submitted.
    jobs: Vec<String>,
}

impl Known {
    /// A copy of the pools, so that no lock is held across a request.
    fn clone_pools(&self) -> Known {
        Known {
            tokens: Vec::new(),
            functions: self.functions.clone(),
            snapshots: self.snapshots.clone(),
            jobs: self.jobs.clone(),
        }
    }
}

/// One of `items` at random, if any.
fn pick_one<T: Clone>(rng: &mut Rng, items: &[T]) -> Option<T> {
    (!items.is_empty()).then(|| items[rng.below(items.len() as u64) as usize].clone())
}

/// What every client shares.
struct World {
    bases: RwLock<Vec<String>>,
    admin: String,
    user: String,
    tenant: String,
    raw_function: String,
    /// What clients deploy: examples/warm.wat (an `init` to snapshot, `bump` to run).
    module: Vec<u8>,
    known: Mutex<Known>,
    events: Mutex<Vec<Event>>,
    t0: Instant,
}

impl World {
    fn url(&self, replica: usize, path: &str) -> String {
        format!("{}{path}", self.bases.read().unwrap()[replica])
    }

    fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }
}

/// One client's loop: a random operation on a random replica until `until`.
fn client(world: &World, id: usize, seed: u64, until: f64) -> usize {
    let mut rng = Rng::new(seed ^ (id as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut sent = 0;
    let tenant_path = format!("/tenants/{}", world.tenant);
    while world.now() < until {
        let replica = rng.below(REPLICAS as u64) as usize;
        let mut events = Vec::new();
        let event = |key: &str, record: &str, start: f64, end: f64, kind: Kind| Event {
            key: key.to_owned(),
            record: record.to_owned(),
            start,
            end,
            client: id,
            replica,
            kind,
        };
        let write =
            |value: &str, answer: &Option<(u16, Value)>, needs: Option<Condition>| Kind::Write {
                value: value.to_owned(),
                outcome: outcome(answer),
                needs,
            };
        let read = |value: &str| Kind::Read {
            value: value.to_owned(),
        };
        let start = world.now();
        match rng.below(120) {
            // A quota changed.
            0..=9 => {
                let value = (16 << 20) + rng.below(1 << 20);
                let answer = send(
                    "PATCH",
                    &world.url(replica, &tenant_path),
                    &world.admin,
                    Some(&json!({"quotas": {"max_module_bytes": value}})),
                );
                let end = world.now();
                let kind = write(&value.to_string(), &answer, None);
                events.push(event("quota", "tenant", start, end, kind));
            }
            // The raw-kernel capability granted or revoked.
            10..=19 => {
                let granted = rng.below(2) == 0;
                let answer = send(
                    "PATCH",
                    &world.url(replica, &tenant_path),
                    &world.admin,
                    Some(&json!({"raw_ptx": granted})),
                );
                let end = world.now();
                let kind = write(&granted.to_string(), &answer, None);
                events.push(event("raw_ptx", "tenant", start, end, kind));
            }
            // The tenant read: its quota, capability and tokens as this replica knows them.
            20..=29 => {
                let answer = send("GET", &world.url(replica, &tenant_path), &world.admin, None);
                let end = world.now();
                if let Some((200, body)) = answer {
                    let quota = body["quotas"]["max_module_bytes"].to_string();
                    events.push(event("quota", "tenant", start, end, read(&quota)));
                    let raw = body["raw_ptx"].as_bool().unwrap_or(false).to_string();
                    events.push(event("raw_ptx", "tenant", start, end, read(&raw)));
                    let listed: Vec<&str> = body["tokens"]
                        .as_array()
                        .map(|t| {
                            t.iter()
                                .filter(|t| t["revoked"] != json!(true))
                                .filter_map(|t| t["id"].as_str())
                                .collect()
                        })
                        .unwrap_or_default();
                    let known = world.known.lock().unwrap().tokens.clone();
                    for _ in 0..known.len().min(3) {
                        let (token, _) = &known[rng.below(known.len() as u64) as usize];
                        let value = if listed.contains(&token.as_str()) {
                            "valid"
                        } else {
                            "invalid"
                        };
                        let key = format!("token:{token}");
                        events.push(event(&key, "tenant", start, end, read(value)));
                    }
                }
            }
            // The capability used: the raw-kernel function invoked.
            30..=37 => {
                let answer = send(
                    "POST",
                    &world.url(
                        replica,
                        &format!("/functions/{}/invoke", world.raw_function),
                    ),
                    &world.user,
                    Some(&json!({"export": "add", "args": [1, 2]})),
                );
                let end = world.now();
                let seen = match &answer {
                    Some((200, _)) => Some("true"),
                    Some((403, body)) if code(body) == "raw_ptx_not_granted" => Some("false"),
                    _ => None,
                };
                if let Some(seen) = seen {
                    events.push(event("raw_ptx", "tenant", start, end, read(seen)));
                }
            }
            // A token created.
            38..=45 => {
                let answer = send(
                    "POST",
                    &world.url(replica, &format!("{tenant_path}/tokens")),
                    &world.admin,
                    Some(&json!({"label": format!("history-{id}")})),
                );
                let end = world.now();
                if let Some((201, body)) = &answer {
                    let token = body["token_id"].as_str().unwrap_or_default().to_owned();
                    let secret = body["token"].as_str().unwrap_or_default().to_owned();
                    let key = format!("token:{token}");
                    events.push(event(
                        &key,
                        "tenant",
                        start,
                        end,
                        write("valid", &answer, None),
                    ));
                    world.known.lock().unwrap().tokens.push((token, secret));
                }
            }
            // A token revoked.
            46..=53 => {
                let known = world.known.lock().unwrap().tokens.clone();
                if known.is_empty() {
                    continue;
                }
                let (token, _) = &known[rng.below(known.len() as u64) as usize];
                let answer = send(
                    "DELETE",
                    &world.url(replica, &format!("{tenant_path}/tokens/{token}")),
                    &world.admin,
                    None,
                );
                let end = world.now();
                let key = format!("token:{token}");
                let kind = match &answer {
                    // Not found: this replica saw it revoked (or never saw it: "invalid" too).
                    Some((404, _)) => read("invalid"),
                    _ => write("invalid", &answer, None),
                };
                events.push(event(&key, "tenant", start, end, kind));
            }
            // A token used.
            54..=65 => {
                let known = world.known.lock().unwrap().tokens.clone();
                if known.is_empty() {
                    continue;
                }
                let (token, secret) = &known[rng.below(known.len() as u64) as usize];
                let answer = send(
                    "GET",
                    &world.url(replica, "/functions"),
                    &format!("Bearer {secret}"),
                    None,
                );
                let end = world.now();
                let seen = match &answer {
                    Some((200, _)) => Some("valid"),
                    Some((401, _)) => Some("invalid"),
                    _ => None,
                };
                if let Some(seen) = seen {
                    let key = format!("token:{token}");
                    events.push(event(&key, "tenant", start, end, read(seen)));
                }
            }
            // A function deployed.
            66..=71 => {
                let answer = send_wasm(
                    &world.url(replica, &format!("/functions?name=h{id}-{sent}")),
                    &world.user,
                    &world.module,
                );
                let end = world.now();
                if let Some((201, body)) = &answer {
                    let function = body["id"].as_str().unwrap_or_default().to_owned();
                    let key = format!("function:{function}");
                    let kind = write("present:false", &answer, None);
                    events.push(event(&key, &key, start, end, kind));
                    world.known.lock().unwrap().functions.push(function);
                }
            }
            // A function deleted, changed or read.
            72..=99 => {
                let known = world.known.lock().unwrap().functions.clone();
                if known.is_empty() {
                    continue;
                }
                let function = &known[rng.below(known.len() as u64) as usize];
                let key = format!("function:{function}");
                let path = format!("/functions/{function}");
                let pick = rng.below(10);
                let (answer, change) = match pick {
                    0..=2 => (
                        send("DELETE", &world.url(replica, &path), &world.user, None),
                        Some("absent".to_owned()),
                    ),
                    3..=5 => {
                        let raw = rng.below(2) == 0;
                        (
                            send(
                                "PATCH",
                                &world.url(replica, &path),
                                &world.user,
                                Some(&json!({"raw_ptx": raw})),
                            ),
                            Some(format!("present:{raw}")),
                        )
                    }
                    _ => (
                        send("GET", &world.url(replica, &path), &world.user, None),
                        None,
                    ),
                };
                let end = world.now();
                let not_absent = Some(Condition::Not("absent".into()));
                let kind = match (&answer, change) {
                    (Some((404, _)), _) => Some(read("absent")),
                    (Some((200, body)), None) => {
                        let raw = body["limits"]["raw_ptx"].as_bool().unwrap_or(false);
                        Some(read(&format!("present:{raw}")))
                    }
                    (_, None) => None,
                    // A change the tenant may not make now (the capability): no effect.
                    (Some((403, _)), Some(_)) => None,
                    (_, Some(value)) => Some(write(&value, &answer, not_absent)),
                };
                if let Some(kind) = kind {
                    events.push(event(&key, &key, start, end, kind));
                }
            }
            // A snapshot captured, deleted or listed.
            100..=109 => {
                let pick = rng.below(10);
                let known = world.known.lock().unwrap().clone_pools();
                if pick < 4 {
                    let Some(function) = pick_one(&mut rng, &known.functions) else {
                        continue;
                    };
                    let answer = send(
                        "POST",
                        &world.url(replica, &format!("/functions/{function}/snapshots")),
                        &world.user,
                        Some(&json!({"init_export": "init"})),
                    );
                    let end = world.now();
                    let record = format!("function:{function}");
                    match &answer {
                        Some((201, body)) => {
                            let snapshot = body["id"].as_str().unwrap_or_default().to_owned();
                            let key = format!("snapshot:{function}/{snapshot}");
                            let kind = write("present", &answer, None);
                            events.push(event(&key, &record, start, end, kind));
                            let mut known = world.known.lock().unwrap();
                            known.snapshots.push((function.clone(), snapshot));
                        }
                        Some((404, body)) if code(body) == "not_found" => {
                            events.push(event(&record, &record, start, end, read("absent")));
                        }
                        _ => {}
                    }
                } else if pick < 7 {
                    let Some((function, snapshot)) = pick_one(&mut rng, &known.snapshots) else {
                        continue;
                    };
                    let answer = send(
                        "DELETE",
                        &world.url(
                            replica,
                            &format!("/functions/{function}/snapshots/{snapshot}"),
                        ),
                        &world.user,
                        None,
                    );
                    let end = world.now();
                    let key = format!("snapshot:{function}/{snapshot}");
                    let record = format!("function:{function}");
                    let kind = match &answer {
                        Some((404, _)) => read("absent"),
                        _ => write("absent", &answer, Some(Condition::Not("absent".into()))),
                    };
                    events.push(event(&key, &record, start, end, kind));
                } else {
                    let Some(function) = pick_one(&mut rng, &known.functions) else {
                        continue;
                    };
                    let answer = send(
                        "GET",
                        &world.url(replica, &format!("/functions/{function}/snapshots")),
                        &world.user,
                        None,
                    );
                    let end = world.now();
                    let record = format!("function:{function}");
                    let listed: Option<Vec<String>> = match &answer {
                        Some((200, body)) => Some(
                            body.as_array()
                                .or_else(|| body["snapshots"].as_array())
                                .map(|list| {
                                    list.iter()
                                        .filter_map(|s| s["id"].as_str().map(str::to_owned))
                                        .collect()
                                })
                                .unwrap_or_default(),
                        ),
                        Some((404, _)) => {
                            events.push(event(&record, &record, start, end, read("absent")));
                            Some(Vec::new())
                        }
                        _ => None,
                    };
                    if let Some(listed) = listed {
                        for (f, snapshot) in known.snapshots.iter().filter(|(f, _)| f == &function)
                        {
                            let value = if listed.contains(snapshot) {
                                "present"
                            } else {
                                "absent"
                            };
                            let key = format!("snapshot:{f}/{snapshot}");
                            events.push(event(&key, &record, start, end, read(value)));
                        }
                    }
                }
            }
            // An async job submitted, cancelled or read.
            _ => {
                let pick = rng.below(10);
                let known = world.known.lock().unwrap().clone_pools();
                if pick < 4 {
                    let Some(function) = pick_one(&mut rng, &known.functions) else {
                        continue;
                    };
                    let answer = send(
                        "POST",
                        &world.url(replica, &format!("/functions/{function}/invoke-async")),
                        &world.user,
                        Some(&json!({"export": "bump", "args": []})),
                    );
                    let end = world.now();
                    match &answer {
                        Some((202, body)) => {
                            let job = body["job_id"].as_str().unwrap_or_default().to_owned();
                            let key = format!("job:{job}");
                            let kind = write("exists", &answer, None);
                            events.push(event(&key, &key, start, end, kind));
                            world.known.lock().unwrap().jobs.push(job);
                        }
                        Some((404, body)) if code(body) == "not_found" => {
                            let record = format!("function:{function}");
                            events.push(event(&record, &record, start, end, read("absent")));
                        }
                        _ => {}
                    }
                } else {
                    let Some(job) = pick_one(&mut rng, &known.jobs) else {
                        continue;
                    };
                    let cancel = pick < 7;
                    let answer = send(
                        if cancel { "DELETE" } else { "GET" },
                        &world.url(replica, &format!("/jobs/{job}")),
                        &world.user,
                        None,
                    );
                    let end = world.now();
                    let key = format!("job:{job}");
                    let flag = format!("cancel:{job}");
                    match &answer {
                        Some((200, body)) => {
                            events.push(event(&key, &key, start, end, read("exists")));
                            let requested = body["cancel_requested"] == json!(true);
                            let active =
                                matches!(body["status"].as_str(), Some("queued" | "running"));
                            if cancel && requested {
                                let kind = write("requested", &answer, None);
                                events.push(event(&flag, &key, start, end, kind));
                            } else if !cancel && (requested || active) {
                                let seen = if requested { "requested" } else { "none" };
                                events.push(event(&flag, &key, start, end, read(seen)));
                            }
                        }
                        Some((404, _)) => {
                            events.push(event(&key, &key, start, end, read("absent")));
                        }
                        _ => {}
                    }
                }
            }
        }
        sent += 1;
        world.events.lock().unwrap().extend(events);
    }
    sent
}

/// A run: setup, clients for `seconds`, trouble when `chaos`; the history checked.
fn run(seconds: f64, chaos: bool, seed: u64) -> (Report, Value) {
    let bin = std::env::var_os("HISTORY_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_tensor-wasm")),
        PathBuf::from,
    );
    let pg = Postgres::start();
    let s3 = S3Server::start();
    s3.create_bucket("tw-history");
    let database = pg.create_database("history");
    let args = [
        "--store",
        database.as_str(),
        "--blob-store",
        "s3://tw-history/h",
        "--allow-raw-ptx",
        "--max-retained-jobs",
        "1000000",
    ];
    let set = Replicas::new(&bin, REPLICAS, &args, s3.client_env(), "error");
    let mut replicas: Vec<Option<ServeProcess>> =
        (0..REPLICAS).map(|i| Some(set.start(i))).collect();
    let a = replicas[0].as_ref().unwrap();
    let (admin, user, tenant) = (a.admin_auth(), a.auth(), a.tenant_id());
    let setup = send(
        "PATCH",
        &a.url(&format!("/tenants/{tenant}")),
        &admin,
        Some(&json!({"raw_ptx": true, "quotas": {
            "max_functions": 100_000,
            "max_concurrent_deploys": 1000,
            "requests_per_second": 1_000_000,
            "burst": 1_000_000,
            "max_concurrent_invocations": 1000,
            "max_live_instances": 1000,
            "max_stored_bytes": 1u64 << 40,
        }})),
    );
    assert_eq!(setup.as_ref().map(|a| a.0), Some(200), "{setup:?}");
    let calc = std::fs::read(examples_dir().join("calc.wat")).unwrap();
    let module = std::fs::read(examples_dir().join("warm.wat")).unwrap();
    // The quota's value before any client changes it (the raw-kernel capability starts granted).
    let initial_quota = match send("GET", &a.url(&format!("/tenants/{tenant}")), &admin, None) {
        Some((200, body)) => body["quotas"]["max_module_bytes"].to_string(),
        other => panic!("reading the tenant: {other:?}"),
    };
    let raw_function = {
        let answer = send_wasm(&a.url("/functions?name=raw&raw_ptx=true"), &user, &calc);
        match answer {
            Some((201, body)) => body["id"].as_str().unwrap().to_owned(),
            other => panic!("deploying the raw-kernel function: {other:?}"),
        }
    };
    for replica in replicas.iter().flatten() {
        wait_until(
            Duration::from_secs(5),
            "every replica runs the raw-kernel function",
            || replica.call(&raw_function, "add", json!([1, 2])).0 == 200,
        );
    }
    let world = World {
        bases: RwLock::new(replicas.iter().flatten().map(|r| r.base.clone()).collect()),
        admin,
        user,
        tenant,
        raw_function,
        module,
        known: Mutex::new(Known::default()),
        events: Mutex::new(Vec::new()),
        t0: Instant::now(),
    };
    let mut trouble: Vec<(f64, f64)> = Vec::new();
    let mut chaos_log = Vec::new();
    let sent: usize = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|id| {
                let world = &world;
                scope.spawn(move || client(world, id, seed, seconds))
            })
            .collect();
        if chaos {
            // A third of the way in: replica 1 killed, then started again on its data dir.
            pace_until(&world, seconds / 3.0);
            let from = world.now();
            replicas[1].take().unwrap().kill9();
            let restarted = set.start(1);
            world.bases.write().unwrap()[1] = restarted.base.clone();
            replicas[1] = Some(restarted);
            let to = world.now();
            trouble.push((from, to));
            chaos_log.push(
                json!({"what": "kill -9 of replica 1, restarted", "from_s": from, "to_s": to}),
            );
            // Two thirds of the way in: PostgreSQL stopped at once, started 3 s later.
            pace_until(&world, 2.0 * seconds / 3.0);
            let from = world.now();
            pg.stop();
            pace_until(&world, from + 3.0);
            pg.resume();
            for replica in replicas.iter().flatten() {
                wait_until(
                    Duration::from_secs(60),
                    "the replica is ready again",
                    || replica.get("/readyz").0 == 200,
                );
            }
            let to = world.now();
            trouble.push((from, to));
            chaos_log.push(json!({"what": "PostgreSQL stopped (immediate) and started 3 s later", "from_s": from, "to_s": to}));
        }
        clients.into_iter().map(|c| c.join().unwrap()).sum()
    });
    let mut events = world.events.into_inner().unwrap();
    // Deleting a function deletes its snapshots: the same write on each of their keys.
    let snapshots = world.known.into_inner().unwrap().snapshots;
    let deletes: Vec<Event> = events
        .iter()
        .filter(|e| {
            e.key.starts_with("function:")
                && matches!(&e.kind, Kind::Write { value, .. } if value == "absent")
        })
        .cloned()
        .collect();
    for delete in deletes {
        let function = &delete.key["function:".len()..];
        for (f, snapshot) in snapshots.iter().filter(|(f, _)| f == function) {
            events.push(Event {
                key: format!("snapshot:{f}/{snapshot}"),
                kind: match delete.kind.clone() {
                    Kind::Write { value, outcome, .. } => Kind::Write {
                        value,
                        outcome,
                        needs: None,
                    },
                    read => read,
                },
                ..delete.clone()
            });
        }
    }
    let report = check(&events, BOUND_S, &trouble, |key| {
        match key.split(':').next().unwrap_or_default() {
            "token" => "invalid".into(),
            "function" | "snapshot" | "job" => "absent".into(),
            "cancel" => "none".into(),
            "quota" => initial_quota.clone(),
            "raw_ptx" => "true".into(),
            _ => String::new(),
        }
    });
    if let Ok(path) = std::env::var("HISTORY_DUMP") {
        let lines: Vec<String> = events.iter().map(|e| format!("{e:?}")).collect();
        std::fs::write(path, lines.join("\n")).expect("writing the history");
    }
    let summary = json!({
        "server": if std::env::var_os("HISTORY_BIN").is_some() { "HISTORY_BIN" } else { "this build" },
        "note": std::env::var("HISTORY_NOTE").unwrap_or_default(),
        "seed": format!("{seed:#x}"),
        "seconds": seconds,
        "replicas": REPLICAS,
        "clients": CLIENTS,
        "bound_s": BOUND_S,
        "operations": sent,
        "events": report.events,
        "reads": report.reads,
        "writes": report.writes,
        "unknown_writes": report.unknown_writes,
        "conflicting_writes": report.conflicting_writes,
        "anomalies": report.anomalies.len(),
        "anomalies_by_kind": anomalies_by_kind(&report),
        "anomaly_examples": report.anomalies.iter().take(20).map(|a| format!("{}: {}", a.key, a.what)).collect::<Vec<_>>(),
        "trouble": chaos_log,
    });
    (report, summary)
}

/// Anomalies counted by the kind of key (token, raw_ptx, quota, function) and of check (a read
/// the model does not allow; a change acknowledged on a record that was gone).
fn anomalies_by_kind(report: &Report) -> Value {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for a in &report.anomalies {
        let key = a.key.split(':').next().unwrap_or_default();
        let check = if a.what.contains("acknowledged") {
            "change of a gone record"
        } else {
            "read not allowed"
        };
        *counts.entry(format!("{key}: {check}")).or_default() += 1;
    }
    json!(counts)
}

/// Waits until the run's clock reads `at` seconds (the chaos schedule's steps).
fn pace_until(world: &World, at: f64) {
    let left = at - world.now();
    if left > 0.0 {
        fault_schedule_step(Duration::from_secs_f64(left));
    }
}

#[test]
fn a_concurrent_history_over_three_replicas_has_no_anomaly() {
    let seconds = env_or("HISTORY_SECONDS", 30.0);
    let chaos = env_or("HISTORY_CHAOS", 0u8) == 1;
    let seed = std::env::var("HISTORY_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or(SEED);
    let (report, summary) = run(seconds, chaos, seed);
    eprintln!("{summary:#}");
    if let Ok(path) = std::env::var("HISTORY_RUN_FILE") {
        // Relative to the repository's root (tests run in the crate's directory).
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(path);
        std::fs::write(&path, format!("{summary:#}\n")).expect("writing the run file");
    }
    let (min_operations, min_conflicts) = (
        env_or("HISTORY_MIN_OPERATIONS", 1000usize),
        env_or("HISTORY_MIN_CONFLICTS", 100usize),
    );
    assert!(
        summary["operations"].as_u64().unwrap_or(0) as usize >= min_operations,
        "too few operations to tell: {}",
        report.describe(0)
    );
    assert!(
        report.conflicting_writes >= min_conflicts,
        "too few conflicting writes to tell: {}",
        report.describe(0)
    );
    assert!(report.anomalies.is_empty(), "{}", report.describe(20));
}
