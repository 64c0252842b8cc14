//! The shared store against a real PostgreSQL 15 and a real S3 server (SeaweedFS), both started
//! by this test on loopback: migrations under concurrent starts, the `FunctionStore` contract,
//! damage and absence reported as errors, calls from the server's blocking threads, and two
//! runtimes over one shared store (a function and a snapshot written through one are served by
//! the other from an empty data dir).
//!
//! One test function, so that one pair of servers serves every case and is stopped at its end.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tensor_wasm_api::{Job, JobQueue, JobStatus, Submitted};
use tensor_wasm_runtime::{
    sha256_hex, DeploySpec, FunctionLimits, FunctionRecord, FunctionStore, GuestMemory,
    InvocationStyle, ModelRecord, Runtime, RuntimeConfig, RuntimeError, RuntimeMetrics,
    SnapshotRecord, WriteBounds, RECORD_FORMAT,
};
use tensor_wasm_shared::{
    migrate::SCHEMA_VERSION, BlobStoreConfig, ChangeFollower, FollowOptions, Orphans, PoolOptions,
    SharedStore, BOOTSTRAP_LOCK_KEY,
};
use tensor_wasm_tenant::{GpuIsolation, Quotas, TenantMetrics, TenantRegistry};
use tensor_wasm_test_support::guests::example;
use tensor_wasm_test_support::pace::periodic_task_period;
use tensor_wasm_test_support::servers::{Postgres, S3Server};
use tensor_wasm_test_support::wait::{wait_for, wait_until};

fn blobs(s3: &S3Server, bucket: &str, prefix: &str) -> BlobStoreConfig {
    BlobStoreConfig {
        url: format!("s3://{bucket}/{prefix}"),
        endpoint: Some(s3.endpoint()),
        access_key_id: Some("tensor-wasm-test".into()),
        secret_access_key: Some("tensor-wasm-test".into()),
        region: Some("us-east-1".into()),
        allow_http: true,
    }
}

fn record(id: &str, module_sha256: &str) -> FunctionRecord {
    FunctionRecord {
        format: RECORD_FORMAT,
        id: id.into(),
        tenant: "acme".into(),
        name: "calc".into(),
        style: InvocationStyle::Export,
        module_sha256: module_sha256.into(),
        module_size: 8,
        created_at_ms: 1,
        limits: FunctionLimits {
            timeout_ms: 1000,
            memory_limit_bytes: 1 << 20,
            fuel: None,
            raw_ptx: false,
        },
        start_from_snapshot: None,
        component: false,
    }
}

fn snapshot(function_id: &str, created_at_ms: u64) -> SnapshotRecord {
    SnapshotRecord {
        id: format!("snap-{created_at_ms:024x}"),
        function_id: function_id.into(),
        tenant: "acme".into(),
        module_sha256: "00".repeat(32),
        init_export: "init".into(),
        created_at_ms,
        memory_bytes: 65_536,
        stored_bytes: 11,
        globals: 0,
        capture_us: 1,
        init_us: 1,
    }
}

/// Rows of `sql` (one text column) through `psql`.
fn psql(pg: &Postgres, database: &str, sql: &str) -> Vec<String> {
    pg.query(database, sql)
}

#[test]
fn the_shared_store_on_real_postgresql_and_s3() {
    let pg = Postgres::start();
    let s3 = S3Server::start();
    s3.create_bucket("tw-test");

    migrations_apply_once_when_replicas_start_together(&pg, &s3);
    the_function_store_contract_holds(&pg, &s3);
    calls_from_the_servers_blocking_threads_work(&pg, &s3);
    two_runtimes_share_functions_and_snapshots(&pg, &s3);
    replicas_follow_each_others_changes(&pg, &s3);
    tenants_are_shared_and_bootstrapped_once(&pg, &s3);
    stored_bytes_and_snapshot_counts_hold_exactly_across_replicas(&pg, &s3);
    orphaned_blobs_are_collected_after_the_grace_period(&pg, &s3);
    concurrent_tenant_changes_are_never_lost(&pg, &s3);
    a_change_never_re_creates_a_deleted_function(&pg, &s3);
    records_written_before_versions_upgrade(&pg, &s3);
    a_deploy_refused_by_a_quota_uploads_nothing(&pg, &s3);
    models_are_unique_per_name_and_followed_by_replicas(&pg, &s3);
    lease_renewals_keep_their_period_during_large_deploys(&pg, &s3);
    a_frozen_database_ends_calls_at_their_timeout(&pg, &s3);
}

fn migrations_apply_once_when_replicas_start_together(pg: &Postgres, s3: &S3Server) {
    let url = pg.create_database("migrations");
    let config = blobs(s3, "tw-test", "migrations");
    let stores: Vec<SharedStore> = std::thread::scope(|scope| {
        let starting: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| SharedStore::connect(&url, &config)))
            .collect();
        starting
            .into_iter()
            .map(|s| s.join().unwrap().expect("connect"))
            .collect()
    });
    assert_eq!(stores.len(), 4);
    let expected: Vec<String> = (1..=SCHEMA_VERSION).map(|v| v.to_string()).collect();
    assert_eq!(
        psql(
            pg,
            "migrations",
            "SELECT version FROM tw_schema_migrations ORDER BY version"
        ),
        expected
    );

    // A database migrated by a newer build is refused with a clear error.
    psql(
        pg,
        "migrations",
        "INSERT INTO tw_schema_migrations (version, name) VALUES (999, 'future')",
    );
    let err = SharedStore::connect(&url, &config).unwrap_err().to_string();
    assert!(err.contains("version 999"), "{err}");
}

fn the_function_store_contract_holds(pg: &Postgres, s3: &S3Server) {
    let url = pg.create_database("contract");
    let store = SharedStore::connect(&url, &blobs(s3, "tw-test", "contract")).unwrap();

    // Modules: content-addressed, idempotent, checked against their digest when read.
    let module = b"\0asm\x01\0\0\0".to_vec();
    let sha = store.put_module(&module).unwrap();
    assert_eq!(store.put_module(&module).unwrap(), sha);
    assert_eq!(store.module(&sha).unwrap(), module);
    assert!(store.module(&"ab".repeat(32)).is_err(), "a missing module");
    let damaged = format!("{}/tw-test/contract/modules/{sha}.wasm", s3.endpoint());
    ureq::put(&damaged).send_bytes(b"not the module").unwrap();
    let err = store.module(&sha).unwrap_err().to_string();
    assert!(err.contains("does not match its digest"), "{err}");
    ureq::put(&damaged).send_bytes(&module).unwrap();

    // Function records: upsert, list, delete; every change is in the change log.
    let a = record("fn-aaaaaaaaaaaaaaaaaaaaaaaa", &sha);
    let mut b = record("fn-bbbbbbbbbbbbbbbbbbbbbbbb", &sha);
    store.put_function(&a).unwrap();
    store.put_function(&b).unwrap();
    b.start_from_snapshot = Some("snap-000000000000000000000000".into());
    store.put_function(&b).unwrap();
    assert_eq!(store.functions().unwrap(), vec![a.clone(), b.clone()]);
    assert!(store.delete_function(&a.id).unwrap());
    assert!(!store.delete_function(&a.id).unwrap());
    assert_eq!(store.functions().unwrap(), vec![b.clone()]);
    assert_eq!(
        psql(pg, "contract", "SELECT key FROM tw_changes ORDER BY seq"),
        vec![a.id.clone(), b.id.clone(), b.id.clone(), a.id.clone()]
    );

    // Snapshots: bytes written from pieces, records oldest first, deletes remove the bytes.
    let first = snapshot(&b.id, 10);
    let second = snapshot(&b.id, 20);
    store
        .put_snapshot(&second, &[b"hello", b" ", b"world"])
        .unwrap();
    store.put_snapshot(&first, &[b"first"]).unwrap();
    assert_eq!(
        store.snapshot_bytes(&b.id, &second.id).unwrap().unwrap(),
        b"hello world"
    );
    assert_eq!(
        store.snapshots(&b.id).unwrap(),
        vec![first.clone(), second.clone()]
    );
    assert_eq!(
        store
            .snapshot_bytes(&b.id, "snap-ffffffffffffffffffffffff")
            .unwrap(),
        None
    );
    assert!(store.delete_snapshot(&b.id, &first.id).unwrap());
    assert!(!store.delete_snapshot(&b.id, &first.id).unwrap());
    assert_eq!(store.snapshot_bytes(&b.id, &first.id).unwrap(), None);
    let first_key = format!(
        "{}/tw-test/contract/snapshots/{}/{}.twsnap",
        s3.endpoint(),
        b.id,
        first.id
    );
    assert!(
        ureq::get(&first_key).call().is_err(),
        "the deleted snapshot's bytes are gone"
    );
    store.delete_snapshots(&b.id).unwrap();
    assert!(store.snapshots(&b.id).unwrap().is_empty());
    let second_key = format!(
        "{}/tw-test/contract/snapshots/{}/{}.twsnap",
        s3.endpoint(),
        b.id,
        second.id
    );
    assert!(ureq::get(&second_key).call().is_err());
    assert!(store
        .put_snapshot(&snapshot("not-an-id", 1), &[b"x"])
        .is_err());
}

fn calls_from_the_servers_blocking_threads_work(pg: &Postgres, s3: &S3Server) {
    // The server calls the store on Tokio's blocking pool, where blocking on another runtime
    // would panic; the store's bridge must not.
    let url = pg.create_database("blocking");
    let store = Arc::new(SharedStore::connect(&url, &blobs(s3, "tw-test", "blocking")).unwrap());
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sha = server.block_on(async {
        let calls: Vec<_> = (0..8)
            .map(|i| {
                let store = store.clone();
                tokio::task::spawn_blocking(move || {
                    store.put_module(format!("module {i}").as_bytes())
                })
            })
            .collect();
        let mut digests = Vec::new();
        for call in calls {
            digests.push(call.await.unwrap().unwrap());
        }
        digests
    });
    assert_eq!(sha.len(), 8);
    assert_eq!(
        psql(pg, "blocking", "SELECT count(*) FROM tw_modules"),
        vec!["8".to_owned()]
    );
}

fn open_runtime(dir: &std::path::Path, store: Arc<SharedStore>) -> Runtime {
    let config = RuntimeConfig {
        guest_memory: GuestMemory::Pooled,
        ..RuntimeConfig::for_tests(dir)
    };
    let metrics = RuntimeMetrics::register(&prometheus::Registry::new()).unwrap();
    Runtime::open(config, store, metrics).expect("runtime over the shared store")
}

fn two_runtimes_share_functions_and_snapshots(pg: &Postgres, s3: &S3Server) {
    let url = pg.create_database("runtimes");
    let config = blobs(s3, "tw-test", "runtimes");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());

    let a = open_runtime(
        dir_a.path(),
        Arc::new(SharedStore::connect(&url, &config).unwrap()),
    );
    let id = a
        .deploy(&example("warm.wat"), DeploySpec::export("warm"))
        .unwrap()
        .record
        .id;
    let snap = a.create_snapshot(&id, "init", true).unwrap();

    // A second runtime with an empty data dir reads the function, fetches the module and the
    // portable snapshot from the shared store, and starts from the initialised state.
    let b = open_runtime(
        dir_b.path(),
        Arc::new(SharedStore::connect(&url, &config).unwrap()),
    );
    assert_eq!(b.snapshots(&id).unwrap(), vec![snap.clone()]);
    assert_eq!(
        b.invoke_export(&id, "init_runs", &[]).unwrap(),
        vec![json!(1)]
    );
    assert_eq!(
        b.invoke_export(&id, "tag", &[]).unwrap(),
        vec![json!(0x6d72_6177)]
    );
    assert!(dir_b
        .path()
        .join("snapshot-cache")
        .join(format!("{}.twlocal", snap.id))
        .exists());

    // Deleting through the first runtime removes the records and blobs for everyone.
    assert!(a.delete(&id).unwrap());
    let c = open_runtime(
        tempfile::tempdir().unwrap().path(),
        Arc::new(SharedStore::connect(&url, &config).unwrap()),
    );
    assert!(c.function(&id).is_err());
    assert_eq!(
        psql(pg, "runtimes", "SELECT count(*) FROM tw_snapshots"),
        vec!["0"]
    );
}

/// A runtime over its own connection to the shared store, following the change log the way a
/// replica does: the log's position read before the records are loaded.
fn replica(
    url: &str,
    config: &BlobStoreConfig,
    dir: &std::path::Path,
) -> (Runtime, ChangeFollower) {
    let store = Arc::new(SharedStore::connect(url, config).unwrap());
    let after = store.latest_change().unwrap();
    let runtime = open_runtime(dir, store.clone());
    let following = runtime.clone();
    let options = FollowOptions {
        poll: Duration::from_secs(1),
        max_backoff: Duration::from_millis(500),
    };
    let follower = store.follow_changes(
        after,
        options,
        Arc::new(move |change| {
            match change.model() {
                Some((tenant, name)) => following.reload_model(tenant, name),
                None => following.reload_function(&change.key).map(drop),
            }
            .map_err(|e| e.to_string())
        }),
    );
    (runtime, follower)
}

fn replicas_follow_each_others_changes(pg: &Postgres, s3: &S3Server) {
    let url = pg.create_database("replicas");
    let config = blobs(s3, "tw-test", "replicas");
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (a, _fa) = replica(&url, &config, dirs[0].path());
    let (b, fb) = replica(&url, &config, dirs[1].path());
    let (c, _fc) = replica(&url, &config, dirs[2].path());

    // Deployed on A: B and C serve it within a second.
    let id = a
        .deploy(&example("calc.wat"), DeploySpec::export("calc"))
        .unwrap()
        .record
        .id;
    for replica in [&b, &c] {
        wait_until(
            Duration::from_secs(1),
            "the deploy reached the replica",
            || replica.function(&id).is_ok(),
        );
        assert_eq!(
            replica
                .invoke_export(&id, "add", &[json!(2), json!(3)])
                .unwrap(),
            vec![json!(5)]
        );
    }
    // Changed on A (its raw-kernel flag would need a grant; a snapshot setting does not).
    let warm = a
        .deploy(&example("warm.wat"), DeploySpec::export("warm"))
        .unwrap()
        .record
        .id;
    let snap = a.create_snapshot(&warm, "init", true).unwrap();
    wait_until(
        Duration::from_secs(1),
        "the new start state reached B",
        || {
            b.function(&warm)
                .is_ok_and(|f| f.record.start_from_snapshot.as_deref() == Some(snap.id.as_str()))
        },
    );
    assert_eq!(
        b.invoke_export(&warm, "init_runs", &[]).unwrap(),
        vec![json!(1)]
    );

    // Deleted on A: B and C answer "not found" within a second.
    assert!(a.delete(&id).unwrap());
    for replica in [&b, &c] {
        wait_until(
            Duration::from_secs(1),
            "the delete reached the replica",
            || replica.function(&id).is_err(),
        );
        assert!(replica
            .invoke_export(&id, "add", &[json!(1), json!(1)])
            .is_err());
    }

    // PostgreSQL stops (an immediate shutdown, as a crash or an outage): B's follower is no
    // longer current after its bound, which is what makes a replica fail closed for raw
    // kernels and answer 503 at /readyz (`--policy-stale-ms`). It restarts: the followers
    // catch up with what was written meanwhile, and B is current again.
    let freshness = fb.freshness();
    let bound = Duration::from_millis(1500);
    wait_until(Duration::from_secs(10), "B's follower is current", || {
        freshness.within(bound)
    });
    pg.stop();
    wait_until(Duration::from_secs(10), "B's follower is behind", || {
        !freshness.within(bound)
    });
    pg.resume();
    let (after_restart, _) = wait_for(
        Duration::from_secs(10),
        "a deploy after the restart",
        || {
            a.deploy(&example("calc.wat"), DeploySpec::export("calc-2"))
                .ok()
                .map(|f| f.record.id)
        },
    );
    wait_until(
        Duration::from_secs(10),
        "B caught up after the restart",
        || b.function(&after_restart).is_ok(),
    );
    wait_until(
        Duration::from_secs(10),
        "B's follower is current again",
        || freshness.within(bound),
    );
}

fn tenants_are_shared_and_bootstrapped_once(pg: &Postgres, s3: &S3Server) {
    let url = pg.create_database("tenants");
    let config = blobs(s3, "tw-test", "tenants");
    let registry = |store: &Arc<SharedStore>| {
        TenantRegistry::open(store.clone(), TenantMetrics::unregistered().unwrap()).unwrap()
    };
    // Three replicas start at once: each opens its registry and bootstraps under the lock;
    // exactly one creates the admin and the default tenant.
    let started: Vec<(Arc<SharedStore>, TenantRegistry, bool)> = std::thread::scope(|scope| {
        let starting: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| {
                    let store = Arc::new(SharedStore::connect(&url, &config).unwrap());
                    let (registry, booted) = store
                        .exclusively(BOOTSTRAP_LOCK_KEY, || {
                            let registry = registry(&store);
                            let booted = registry.bootstrap().unwrap();
                            (registry, booted)
                        })
                        .unwrap();
                    (store, registry, booted.is_some())
                })
            })
            .collect();
        starting.into_iter().map(|s| s.join().unwrap()).collect()
    });
    assert_eq!(started.iter().filter(|(_, _, booted)| *booted).count(), 1);
    assert_eq!(
        psql(pg, "tenants", "SELECT count(*) FROM tw_tenants"),
        vec!["1"]
    );

    // What one registry changes, another follows through the change log.
    let (_, a, _) = &started[0];
    let (store_b, _, _) = &started[1];
    let b = Arc::new(
        TenantRegistry::open(store_b.clone(), TenantMetrics::unregistered().unwrap()).unwrap(),
    );
    let following = b.clone();
    let _follower = store_b.follow_changes(
        store_b.latest_change().unwrap(),
        FollowOptions::default(),
        Arc::new(move |change| {
            match change.kind.as_str() {
                "tenant" => following.reload_tenant(&change.key),
                "admin" => following.reload_admin(),
                _ => Ok(()),
            }
            .map_err(|e| e.to_string())
        }),
    );
    let (info, token) = a
        .create_tenant("acme", Quotas::default(), GpuIsolation::default())
        .unwrap();
    wait_until(
        Duration::from_secs(1),
        "B authenticates the new token",
        || b.authenticate(&token.secret).is_some(),
    );
    a.revoke_token(&info.id, &token.info.id).unwrap();
    wait_until(
        Duration::from_secs(1),
        "B refuses the revoked token",
        || b.authenticate(&token.secret).is_none(),
    );
    assert!(a.delete(&info.id).unwrap());
    wait_until(
        Duration::from_secs(1),
        "B forgets the deleted tenant",
        || b.lookup(&info.id).is_none(),
    );
}

/// Three stores (replicas) writing at once: the tenant's stored bytes and a function's snapshot
/// count are checked in the write's transaction, so the bounds hold exactly; a refused
/// snapshot's bytes are removed again.
fn stored_bytes_and_snapshot_counts_hold_exactly_across_replicas(pg: &Postgres, s3: &S3Server) {
    let url = pg.create_database("quotas");
    let config = blobs(s3, "tw-test", "quotas");
    let replicas: Vec<SharedStore> = (0..3)
        .map(|_| SharedStore::connect(&url, &config).unwrap())
        .collect();
    let sha = replicas[0].put_module(b"\0asm\x01\0\0\0").unwrap();

    // Modules of 30 bytes against 100 stored bytes: 3 of 12 deploys at once.
    let bytes = WriteBounds {
        max_stored_bytes: Some(100),
        ..WriteBounds::default()
    };
    let outcomes: Vec<Result<(), RuntimeError>> = std::thread::scope(|scope| {
        let deploys: Vec<_> = (0..12)
            .map(|i| {
                let store = &replicas[i % 3];
                let record = FunctionRecord {
                    module_size: 30,
                    ..record(&format!("fn-{i:024x}"), &sha)
                };
                scope.spawn(move || store.create_function(&record, &bytes))
            })
            .collect();
        deploys.into_iter().map(|d| d.join().unwrap()).collect()
    });
    assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), 3);
    for refused in outcomes.iter().filter_map(|o| o.as_ref().err()) {
        assert!(
            matches!(
                refused,
                RuntimeError::StorageQuotaExceeded {
                    limit: 100,
                    used: 90,
                    requested: 30
                }
            ),
            "{refused:?}"
        );
    }

    // Snapshots of one function against a bound of 2: 2 of 6 captures at once.
    let function = replicas[1].functions().unwrap()[0].id.clone();
    let count = WriteBounds {
        max_snapshots_per_function: Some(2),
        ..WriteBounds::default()
    };
    let outcomes: Vec<Result<(), RuntimeError>> = std::thread::scope(|scope| {
        let captures: Vec<_> = (0..6u64)
            .map(|i| {
                let (store, record) = (&replicas[i as usize % 3], snapshot(&function, 100 + i));
                scope.spawn(move || store.create_snapshot(&record, &[b"snapshot"], &count))
            })
            .collect();
        captures.into_iter().map(|c| c.join().unwrap()).collect()
    });
    assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), 2);
    for refused in outcomes.iter().filter_map(|o| o.as_ref().err()) {
        assert!(
            refused.to_string().contains("already has 2 snapshots"),
            "{refused}"
        );
    }
    assert_eq!(replicas[2].snapshots(&function).unwrap().len(), 2);

    // Snapshots count toward the stored bytes (2 of 11 bytes beside 90 of modules): one more
    // is refused at 120, and its bytes are gone from object storage.
    let extra = snapshot(&function, 500);
    let refused = replicas[0]
        .create_snapshot(
            &extra,
            &[b"snapshot"],
            &WriteBounds {
                max_stored_bytes: Some(120),
                ..WriteBounds::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(
            refused,
            RuntimeError::StorageQuotaExceeded { used: 112, .. }
        ),
        "{refused:?}"
    );
    let blob = format!(
        "{}/tw-test/quotas/snapshots/{function}/{}.twsnap",
        s3.endpoint(),
        extra.id
    );
    assert!(
        matches!(ureq::get(&blob).call(), Err(ureq::Error::Status(404, _))),
        "the refused snapshot's bytes are removed"
    );
}

/// Modules no function names and snapshot images without a record are removed once older than
/// the grace period; what records name stays; a module stored again is stored whole.
fn orphaned_blobs_are_collected_after_the_grace_period(pg: &Postgres, s3: &S3Server) {
    let url = pg.create_database("orphans");
    let store = SharedStore::connect(&url, &blobs(s3, "tw-test", "orphans")).unwrap();
    let kept_module = b"\0asm\x01\0\0\0".to_vec();
    let kept_sha = store.put_module(&kept_module).unwrap();
    let function = record("fn-cccccccccccccccccccccccc", &kept_sha);
    store.put_function(&function).unwrap();
    let kept_snapshot = snapshot(&function.id, 1);
    store.put_snapshot(&kept_snapshot, &[b"kept"]).unwrap();
    // Orphans: the module of a deleted function, and an image whose capture left no record.
    let gone_module = b"\0asm\x01\0\0\0\0".to_vec();
    let gone_sha = store.put_module(&gone_module).unwrap();
    let deleted = record("fn-dddddddddddddddddddddddd", &gone_sha);
    store.put_function(&deleted).unwrap();
    assert!(store.delete_function(&deleted.id).unwrap());
    let stray = format!(
        "{}/tw-test/orphans/snapshots/{}/snap-00000000000000000000abcd.twsnap",
        s3.endpoint(),
        function.id
    );
    ureq::put(&stray).send_bytes(b"stray image").unwrap();

    let hour = Duration::from_secs(3600);
    assert_eq!(
        store.collect_orphans(hour, false).unwrap(),
        Orphans::default(),
        "too young"
    );
    let counted = store.collect_orphans(Duration::ZERO, true).unwrap();
    assert_eq!((counted.modules, counted.snapshots), (1, 1), "{counted:?}");
    assert!(store.module(&gone_sha).is_ok(), "a dry run removes nothing");
    let removed = store.collect_orphans(Duration::ZERO, false).unwrap();
    assert_eq!(removed, counted);
    assert_eq!(
        removed.bytes,
        (gone_module.len() + b"stray image".len()) as u64
    );
    assert!(store.module(&gone_sha).is_err());
    assert!(matches!(
        ureq::get(&stray).call(),
        Err(ureq::Error::Status(404, _))
    ));
    assert_eq!(store.module(&kept_sha).unwrap(), kept_module);
    assert_eq!(
        store
            .snapshot_bytes(&function.id, &kept_snapshot.id)
            .unwrap()
            .unwrap(),
        b"kept"
    );
    assert_eq!(
        store.collect_orphans(Duration::ZERO, false).unwrap(),
        Orphans::default()
    );
    // Deployed again after its collection: the module is stored again, whole.
    assert_eq!(store.put_module(&gone_module).unwrap(), gone_sha);
    assert_eq!(store.module(&gone_sha).unwrap(), gone_module);
}

/// Two replicas change one tenant at the same moment, each from its own copy: B revokes a
/// token (or grants the raw-kernel capability) while A creates another token. Every change
/// is kept: the revoked token never authenticates again (a third registry, opened fresh, and
/// A itself after it adopts the stored record), and the grant holds. Before changes were
/// written against the version read, the slower writer put its stale copy back (about half
/// of such rounds brought a revoked token back).
fn concurrent_tenant_changes_are_never_lost(pg: &Postgres, s3: &S3Server) {
    let url = pg.create_database("tenant_races");
    let config = blobs(s3, "tw-test", "tenant-races");
    let open = || {
        let store = Arc::new(SharedStore::connect(&url, &config).unwrap());
        TenantRegistry::open(store, TenantMetrics::unregistered().unwrap()).unwrap()
    };
    let (a, b) = (open(), open());
    let (info, _) = a
        .create_tenant("racer", Quotas::default(), GpuIsolation::default())
        .unwrap();
    b.reload_tenant(&info.id).unwrap();
    let mut revoked = Vec::new();
    for round in 0..20 {
        let victim = a
            .create_token(&info.id, &format!("victim-{round}"))
            .unwrap();
        b.reload_tenant(&info.id).unwrap();
        let barrier = std::sync::Barrier::new(2);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                barrier.wait();
                assert!(b.revoke_token(&info.id, &victim.info.id).unwrap());
                b.set_raw_ptx(&info.id, round % 2 == 0).unwrap();
            });
            scope.spawn(|| {
                barrier.wait();
                a.create_token(&info.id, &format!("other-{round}")).unwrap();
            });
        });
        revoked.push(victim);
        // B's grant of this round is the last write to the capability.
        let fresh = open();
        let tenant = fresh.lookup(&info.id).unwrap();
        assert_eq!(tenant.raw_ptx(), round % 2 == 0, "round {round}");
    }
    let fresh = open();
    a.reload_tenant(&info.id).unwrap();
    for (round, token) in revoked.iter().enumerate() {
        assert!(
            fresh.authenticate(&token.secret).is_none() && a.authenticate(&token.secret).is_none(),
            "round {round}: the revoked token authenticates again"
        );
    }
    // Every token created is kept: 20 victims (revoked) and 20 others.
    let stored = fresh.info(&info.id).unwrap();
    assert_eq!(stored.tokens.len(), 1 + 40, "{stored:?}");
}

/// A change made on a replica that has not yet seen a delete made elsewhere finds the function
/// gone and says so; it does not write the record back.
fn a_change_never_re_creates_a_deleted_function(pg: &Postgres, s3: &S3Server) {
    let url = pg.create_database("undelete");
    let config = blobs(s3, "tw-test", "undelete");
    let store = Arc::new(SharedStore::connect(&url, &config).unwrap());
    let module = store.put_module(b"\0asm\x01\0\0\0").unwrap();
    let a = record("fn-undelete", &module);
    store.put_function(&a).unwrap();
    let mut changed = a.clone();
    changed.limits.raw_ptx = true;
    // Changed since it was read: refused, nothing written.
    let mut other = a.clone();
    other.limits.timeout_ms += 1;
    store.put_function(&other).unwrap();
    assert!(!store.replace_function(&a, &changed).unwrap());
    assert_eq!(store.function("fn-undelete").unwrap(), Some(other.clone()));
    // As read: written.
    let mut next = other.clone();
    next.limits.raw_ptx = true;
    assert!(store.replace_function(&other, &next).unwrap());
    // Deleted meanwhile: not found, and still deleted.
    assert!(store.delete_function("fn-undelete").unwrap());
    let err = store.replace_function(&next, &changed).unwrap_err();
    assert!(
        matches!(err, tensor_wasm_runtime::RuntimeError::FunctionNotFound(_)),
        "{err:?}"
    );
    assert_eq!(store.function("fn-undelete").unwrap(), None);

    // The same through a runtime that still holds the function (it has not yet seen the
    // delete another replica made): its change answers not found and writes nothing back.
    let dir = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        guest_memory: GuestMemory::Pooled,
        allow_raw_ptx: true,
        ..RuntimeConfig::for_tests(dir.path())
    };
    let metrics = RuntimeMetrics::register(&prometheus::Registry::new()).unwrap();
    let rt = Runtime::open(config, store.clone(), metrics).unwrap();
    let wat = "(module (func (export \"f\") (result i32) i32.const 1))";
    let id = rt
        .deploy(wat.as_bytes(), DeploySpec::export("soon-deleted"))
        .unwrap()
        .record
        .id;
    assert!(
        store.delete_function(&id).unwrap(),
        "deleted by another replica"
    );
    let err = rt.set_raw_ptx(&id, true).unwrap_err();
    assert!(
        matches!(err, tensor_wasm_runtime::RuntimeError::FunctionNotFound(_)),
        "{err:?}"
    );
    assert_eq!(store.function(&id).unwrap(), None, "re-created by a change");
    assert_eq!(
        psql(pg, "undelete", "SELECT count(*) FROM tw_functions"),
        vec!["0"]
    );
}

/// A database written before records had versions (schema 4) is migrated in place: its
/// tenant and function records keep their contents, start at version 0, and take changes.
fn records_written_before_versions_upgrade(pg: &Postgres, s3: &S3Server) {
    let url = pg.create_database("upgrade");
    let config = blobs(s3, "tw-test", "upgrade");
    // Schema 4 as the previous build left it, with one tenant and one function in it.
    let store = SharedStore::connect(&url, &config).unwrap();
    let registry =
        TenantRegistry::open(Arc::new(store), TenantMetrics::unregistered().unwrap()).unwrap();
    let (info, old_token) = registry
        .create_tenant("old", Quotas::default(), GpuIsolation::default())
        .unwrap();
    let store = SharedStore::connect(&url, &config).unwrap();
    let module = store.put_module(b"\0asm\x01\0\0\0").unwrap();
    store.put_function(&record("fn-old", &module)).unwrap();
    drop(registry);
    psql(
        pg,
        "upgrade",
        "ALTER TABLE tw_tenants DROP COLUMN version; ALTER TABLE tw_functions DROP COLUMN version; \
         ALTER TABLE tw_modules DROP COLUMN generation; DROP SEQUENCE tw_module_generations; \
         DROP TABLE tw_models; DROP TABLE tw_model_blobs; \
         DROP SEQUENCE tw_model_blob_generations; \
         DELETE FROM tw_schema_migrations WHERE version >= 5",
    );
    assert_eq!(
        psql(
            pg,
            "upgrade",
            "SELECT max(version) FROM tw_schema_migrations"
        ),
        vec!["4"]
    );
    // This build migrates it.
    let store = Arc::new(SharedStore::connect(&url, &config).unwrap());
    assert_eq!(
        psql(
            pg,
            "upgrade",
            "SELECT max(version) FROM tw_schema_migrations"
        ),
        vec![SCHEMA_VERSION.to_string()]
    );
    assert_eq!(
        psql(pg, "upgrade", "SELECT version FROM tw_tenants"),
        vec!["0"]
    );
    let registry =
        TenantRegistry::open(store.clone(), TenantMetrics::unregistered().unwrap()).unwrap();
    assert!(registry.authenticate(&old_token.secret).is_some());
    registry.create_token(&info.id, "after-upgrade").unwrap();
    assert_eq!(
        psql(pg, "upgrade", "SELECT version FROM tw_tenants"),
        vec!["1"]
    );
    let old = store
        .function("fn-old")
        .unwrap()
        .expect("the function survives");
    let mut patched = old.clone();
    patched.limits.raw_ptx = true;
    assert!(store.replace_function(&old, &patched).unwrap());
    assert_eq!(store.function("fn-old").unwrap(), Some(patched));
}

/// A tenant at its function-count cap, or at its stored-bytes quota, deploys again: the deploy
/// is refused and object storage holds exactly the objects and bytes it held before (the
/// counts are checked before the module is uploaded). Before, each refused deploy of a
/// distinct module left it in the bucket.
fn a_deploy_refused_by_a_quota_uploads_nothing(pg: &Postgres, s3: &S3Server) {
    let url = pg.create_database("quota_first");
    let store = Arc::new(SharedStore::connect(&url, &blobs(s3, "tw-test", "quota-first")).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let rt = open_runtime(dir.path(), store.clone());
    let module = |n: u32| format!("(module (func (export \"f{n}\") (result i32) i32.const {n}))");
    let spec = |name: &str, max_functions: u64, max_stored_bytes: u64| DeploySpec {
        tenant: "quota-first".into(),
        max_functions: Some(max_functions),
        max_stored_bytes: Some(max_stored_bytes),
        ..DeploySpec::export(name)
    };
    rt.deploy(module(1).as_bytes(), spec("one", 1, 1 << 20))
        .unwrap();
    let before = store.blob_totals().unwrap();
    assert_eq!(before.0, 1, "{before:?}");
    for n in 2..6 {
        let err = rt
            .deploy(module(n).as_bytes(), spec(&format!("f{n}"), 1, 1 << 20))
            .unwrap_err();
        assert!(
            matches!(
                err,
                tensor_wasm_runtime::RuntimeError::FunctionQuotaExceeded { .. }
            ),
            "{err:?}"
        );
        let err = rt
            .deploy(module(n).as_bytes(), spec(&format!("g{n}"), 10, 10))
            .unwrap_err();
        assert!(
            matches!(
                err,
                tensor_wasm_runtime::RuntimeError::StorageQuotaExceeded { .. }
            ),
            "{err:?}"
        );
    }
    assert_eq!(store.blob_totals().unwrap(), before);
}

fn model(tenant: &str, name: &str, bytes: &[u8]) -> ModelRecord {
    ModelRecord {
        tenant: tenant.into(),
        name: name.into(),
        sha256: sha256_hex(bytes),
        bytes: bytes.len() as u64,
        created_unix_ms: 1,
    }
}

/// Models over three stores (replicas): stored through one, read and listed through another,
/// bytes checked against their digest; a name taken is a conflict, and of eight stores of one
/// name at once exactly one succeeds; models count toward the tenant's stored bytes with its
/// modules, exactly, and refuse a deploy past it; a runtime following the change log sees a
/// model stored and deleted elsewhere within a second; a deleted model's bytes stay until the
/// orphan collector finds no record naming them, and bytes another record names are kept.
fn models_are_unique_per_name_and_followed_by_replicas(pg: &Postgres, s3: &S3Server) {
    let url = pg.create_database("models");
    let config = blobs(s3, "tw-test", "models");
    let stores: Vec<SharedStore> = (0..3)
        .map(|_| SharedStore::connect(&url, &config).unwrap())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let (follower, _following) = replica(&url, &config, dir.path());

    // Stored through A: B reads the record and the bytes, C lists it, the follower has it.
    let bytes = b"model one".to_vec();
    let one = model("acme", "one", &bytes);
    stores[0].put_model(&one, &bytes).unwrap();
    assert_eq!(stores[1].model("acme", "one").unwrap(), Some(one.clone()));
    assert_eq!(stores[1].model("acme", "two").unwrap(), None);
    assert_eq!(stores[1].model_bytes(&one.sha256).unwrap(), bytes);
    assert_eq!(stores[2].models().unwrap(), vec![one.clone()]);
    wait_until(Duration::from_secs(1), "the follower has the model", || {
        follower.model("acme", "one").is_ok_and(|r| r == one)
    });
    assert_eq!(
        psql(
            pg,
            "models",
            "SELECT kind || ' ' || key FROM tw_changes ORDER BY seq"
        ),
        vec!["model acme/one"]
    );

    // Damaged bytes are refused when read.
    let object = format!(
        "{}/tw-test/models/models/{}.onnx",
        s3.endpoint(),
        one.sha256
    );
    ureq::put(&object).send_bytes(b"not the model").unwrap();
    let err = stores[1].model_bytes(&one.sha256).unwrap_err().to_string();
    assert!(err.contains("does not match its digest"), "{err}");
    ureq::put(&object).send_bytes(&bytes).unwrap();
    assert!(
        stores[1].model_bytes(&"ab".repeat(32)).is_err(),
        "missing bytes"
    );
    assert!(stores[1].model_bytes("../../x").is_err(), "not a digest");

    // The name is taken: through another store, with other bytes, it is a conflict.
    let other = b"model two".to_vec();
    let err = stores[1]
        .put_model(&model("acme", "one", &other), &other)
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Conflict(m) if m.contains("`one` exists")),
        "{err:?}"
    );
    // Eight stores of one new name at once, each with its own bytes: exactly one succeeds,
    // the others are conflicts.
    let barrier = std::sync::Barrier::new(8);
    let outcomes: Vec<Result<(), RuntimeError>> = std::thread::scope(|scope| {
        let puts: Vec<_> = (0..8)
            .map(|i| {
                let (store, barrier) = (&stores[i % 3], &barrier);
                scope.spawn(move || {
                    let bytes = format!("racer {i}").into_bytes();
                    barrier.wait();
                    store.put_model(&model("acme", "race", &bytes), &bytes)
                })
            })
            .collect();
        puts.into_iter().map(|p| p.join().unwrap()).collect()
    });
    assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), 1);
    for refused in outcomes.iter().filter_map(|o| o.as_ref().err()) {
        assert!(matches!(refused, RuntimeError::Conflict(_)), "{refused:?}");
    }
    let winner = stores[2]
        .model("acme", "race")
        .unwrap()
        .expect("the winner");
    assert_eq!(
        stores[0].model_bytes(&winner.sha256).unwrap().len() as u64,
        winner.bytes
    );

    // Stored bytes: a 30-byte module and models against 100 bytes, counted in the write.
    let bound = WriteBounds {
        max_stored_bytes: Some(100),
        ..WriteBounds::default()
    };
    let module = stores[0].put_module(b"\0asm\x01\0\0\0").unwrap();
    let function = FunctionRecord {
        tenant: "quota".into(),
        module_size: 30,
        ..record("fn-0000000000000000000000e1", &module)
    };
    stores[0].create_function(&function, &bound).unwrap();
    let fifty = vec![5u8; 50];
    stores[1]
        .create_model(&model("quota", "fifty", &fifty), &fifty, &bound)
        .unwrap();
    let thirty = vec![3u8; 30];
    let refused = stores[2]
        .create_model(&model("quota", "thirty", &thirty), &thirty, &bound)
        .unwrap_err();
    assert!(
        matches!(
            refused,
            RuntimeError::StorageQuotaExceeded {
                limit: 100,
                used: 80,
                requested: 30
            }
        ),
        "{refused:?}"
    );
    let deploy = FunctionRecord {
        tenant: "quota".into(),
        module_size: 30,
        ..record("fn-0000000000000000000000e2", &module)
    };
    let refused = stores[0].create_function(&deploy, &bound).unwrap_err();
    assert!(
        matches!(refused, RuntimeError::StorageQuotaExceeded { used: 80, .. }),
        "models count toward a deploy's stored bytes: {refused:?}"
    );
    assert!(stores[1].model("quota", "thirty").unwrap().is_none());

    // The same bytes under a second name; the first deleted through B: gone for every store
    // and, within a second, for the follower; deleting it again finds nothing.
    let twin = model("acme", "twin", &bytes);
    stores[2].put_model(&twin, &bytes).unwrap();
    assert!(stores[1].delete_model("acme", "one").unwrap());
    assert!(!stores[0].delete_model("acme", "one").unwrap());
    assert_eq!(stores[0].model("acme", "one").unwrap(), None);
    wait_until(
        Duration::from_secs(1),
        "the follower dropped the model",
        || follower.model("acme", "one").is_err(),
    );
    assert!(follower.model("acme", "twin").is_ok());

    // The orphan collector: the bytes of the race's losers that got as far as their upload go
    // (no record names them); the bytes the twin names stay, and so do the winner's and the
    // fifty's. The model the quota refused uploaded nothing.
    let rows = |pg: &Postgres| -> usize {
        psql(pg, "models", "SELECT count(*) FROM tw_model_blobs")[0]
            .parse()
            .unwrap()
    };
    let before = rows(pg);
    let removed = stores[0].collect_orphans(Duration::ZERO, false).unwrap();
    assert_eq!(removed.modules, 0, "{removed:?}");
    assert_eq!(removed.models, before - 3, "{removed:?}");
    assert_eq!(rows(pg), 3, "the rows of the bytes records name");
    assert_eq!(stores[1].model_bytes(&twin.sha256).unwrap(), bytes);
    assert_eq!(
        stores[1].model_bytes(&winner.sha256).unwrap().len(),
        winner.bytes as usize
    );
    assert_eq!(stores[1].model_bytes(&sha256_hex(&fifty)).unwrap(), fifty);
    assert!(stores[1].model_bytes(&sha256_hex(&thirty)).is_err());

    // The twin deleted too: its bytes are an orphan now, collected; stored again after, they
    // are stored whole.
    assert!(stores[0].delete_model("acme", "twin").unwrap());
    let removed = stores[0].collect_orphans(Duration::ZERO, false).unwrap();
    assert_eq!(removed.models, 1, "{removed:?}");
    assert_eq!(removed.bytes, bytes.len() as u64);
    assert!(stores[1].model_bytes(&twin.sha256).is_err());
    stores[2].put_model(&twin, &bytes).unwrap();
    assert_eq!(stores[1].model_bytes(&twin.sha256).unwrap(), bytes);
}

/// A job that a replica renews while the same replica stores four 64 MiB modules at once: each
/// renewal takes a connection of its own from the pool (none is held across an upload), so
/// renewals keep their period. With one connection held across each upload, a renewal waited
/// for the uploads queued before it.
fn lease_renewals_keep_their_period_during_large_deploys(pg: &Postgres, s3: &S3Server) {
    let url = pg.create_database("renewals");
    let store = Arc::new(SharedStore::connect(&url, &blobs(s3, "tw-test", "renewals")).unwrap());
    let job = Job {
        id: format!("job-{:024x}", 1),
        tenant: "acme".into(),
        function_id: "fn-0123456789abcdef01234567".into(),
        export: "add".into(),
        args: vec![json!(1), json!(2)],
        status: JobStatus::Queued,
        results: None,
        error: None,
        created_at_ms: 1,
        started_at_ms: None,
        finished_at_ms: None,
        cancel_requested: false,
        attempts: 0,
        idempotency_key: None,
        traceparent: None,
    };
    let lease = Duration::from_secs(30);
    assert!(matches!(store.submit(&job, 10).unwrap(), Submitted::Added));
    let claim = store.claim("replica-a", lease).unwrap().expect("the job");
    let period = Duration::from_millis(50);
    let (renewals, uploads) = std::thread::scope(|scope| {
        let deploys: Vec<_> = (0..4u8)
            .map(|n| {
                let store = store.clone();
                scope.spawn(move || {
                    let bytes = vec![n; 64 << 20];
                    let start = std::time::Instant::now();
                    store.put_module(&bytes).unwrap();
                    start.elapsed()
                })
            })
            .collect();
        let mut renewals = Vec::new();
        while deploys.iter().any(|d| !d.is_finished()) {
            let start = std::time::Instant::now();
            assert!(store.renew(&job.id, claim.job.attempts, lease).unwrap());
            renewals.push(start.elapsed());
            periodic_task_period(period);
        }
        let uploads: Vec<Duration> = deploys.into_iter().map(|d| d.join().unwrap()).collect();
        (renewals, uploads)
    });
    let worst = renewals.iter().max().copied().unwrap_or_default();
    let longest_upload = uploads.iter().max().copied().unwrap_or_default();
    assert!(
        renewals.len() >= 4,
        "the deploys ended too soon to tell ({renewals:?}, uploads {uploads:?})"
    );
    assert!(
        worst < Duration::from_millis(250).min(longest_upload / 2),
        "a renewal waited {worst:?} while deploys ran (uploads {uploads:?}, renewals {renewals:?})"
    );
    assert_eq!(store.blob_totals().unwrap(), (4, 4 * (64 << 20)));
}

/// Thaws a frozen server when dropped, so that a failed assertion does not leave it frozen.
struct Frozen<'a>(&'a Postgres);

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        self.0.thaw();
    }
}

/// A database that stops answering (every process frozen: the pool's idle connection is as a
/// half-open one, and a new connection is accepted by the kernel but never greeted) ends each
/// call with `store_unavailable` within the statement timeout and a margin, instead of hanging
/// the replica; once it answers again, calls succeed.
fn a_frozen_database_ends_calls_at_their_timeout(pg: &Postgres, s3: &S3Server) {
    let url = pg.create_database("frozen");
    let options = PoolOptions {
        statement_timeout: Duration::from_millis(700),
        connect_timeout: Duration::from_millis(700),
        ..PoolOptions::default()
    };
    let store = SharedStore::connect_with(&url, &blobs(s3, "tw-test", "frozen"), options).unwrap();
    let module = store.put_module(b"\0asm\x01\0\0\0").unwrap();
    let id = "fn-f0f0f0f0f0f0f0f0f0f0f0f0";
    store.put_function(&record(id, &module)).unwrap();
    {
        pg.freeze();
        let _frozen = Frozen(pg);
        // The first call finds the pool's idle connection, the second connects anew (the
        // first connection was held as long as a timeout and is not reused).
        for call in 0..2 {
            let start = std::time::Instant::now();
            let err = store.function(id).unwrap_err();
            let took = start.elapsed();
            assert!(
                matches!(err, RuntimeError::StoreUnavailable(_)),
                "call {call}: {err:?}"
            );
            assert!(took < Duration::from_secs(3), "call {call} took {took:?}");
        }
    }
    wait_until(Duration::from_secs(30), "calls succeed again", || {
        matches!(store.function(id), Ok(Some(_)))
    });
}
