//! The shared job queue (`tw_jobs`) against a real PostgreSQL 15 started by this test:
//! admission exact under concurrent submissions, idempotency keys, claims by many replicas at
//! once that never hand out one job twice, a lease that ends and the job run again with the old
//! attempt fenced off, cancellation, release, retention and a deleted tenant's jobs.
//!
//! One test function, so that one server serves every case. Blobs are never touched here, so
//! the object-store settings name a server that does not exist.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tensor_wasm_api::{Job, JobQueue, JobStatus, Submitted};
use tensor_wasm_shared::SharedStore;
use tensor_wasm_test_support::servers::Postgres;
use tensor_wasm_test_support::wait::wait_for;

fn store(pg: &Postgres, database: &str) -> SharedStore {
    connect(&pg.create_database(database))
}

fn connect(url: &str) -> SharedStore {
    SharedStore::connect(url, &common::no_blobs()).expect("connect")
}

fn job(n: u64, tenant: &str) -> Job {
    Job {
        id: format!("job-{n:024x}"),
        tenant: tenant.into(),
        function_id: "fn-0123456789abcdef01234567".into(),
        export: "add".into(),
        args: vec![json!(n), json!(1)],
        status: JobStatus::Queued,
        results: None,
        error: None,
        created_at_ms: n,
        started_at_ms: None,
        finished_at_ms: None,
        cancel_requested: false,
        attempts: 0,
        idempotency_key: None,
        traceparent: None,
    }
}

const LEASE: Duration = Duration::from_secs(30);

#[test]
fn the_job_queue_on_real_postgresql() {
    let pg = Postgres::start();
    admission_is_exact_and_keys_are_idempotent(&pg);
    concurrent_claims_hand_out_each_job_once(&pg);
    an_ended_lease_runs_the_job_again_and_fences_the_old_attempt(&pg);
    cancellation_release_retention_and_deleted_tenants(&pg);
}

fn admission_is_exact_and_keys_are_idempotent(pg: &Postgres) {
    let queue = Arc::new(store(pg, "jobs_admission"));
    // 40 submissions at once from 4 threads against a bound of 10: exactly 10 are added.
    let added: usize = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let queue = queue.clone();
                scope.spawn(move || {
                    (0..10u64)
                        .filter(|i| {
                            queue.submit(&job(100 + t * 10 + i, "tn-a"), 10).unwrap()
                                == Submitted::Added
                        })
                        .count()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    });
    assert_eq!(added, 10);
    assert_eq!(
        queue.submit(&job(1, "tn-a"), 10).unwrap(),
        Submitted::TooManyActive
    );
    assert_eq!(
        queue.submit(&job(2, "tn-b"), 10).unwrap(),
        Submitted::Added,
        "per tenant"
    );
    assert_eq!(queue.depth().unwrap(), 11);

    // A key answers the first job, for that tenant only.
    let keyed = Job {
        idempotency_key: Some("order-7".into()),
        ..job(3, "tn-b")
    };
    assert_eq!(queue.submit(&keyed, 10).unwrap(), Submitted::Added);
    let again = Job {
        idempotency_key: Some("order-7".into()),
        ..job(4, "tn-b")
    };
    match queue.submit(&again, 10).unwrap() {
        Submitted::Existing(existing) => assert_eq!(existing.id, keyed.id),
        other => panic!("expected the existing job, got {other:?}"),
    }
    let other_tenant = Job {
        idempotency_key: Some("order-7".into()),
        ..job(5, "tn-c")
    };
    assert_eq!(queue.submit(&other_tenant, 10).unwrap(), Submitted::Added);
    assert_eq!(queue.get("tn-b", &keyed.id).unwrap().unwrap(), keyed);
    assert!(
        queue.get("tn-a", &keyed.id).unwrap().is_none(),
        "scoped by tenant"
    );
}

fn concurrent_claims_hand_out_each_job_once(pg: &Postgres) {
    // Four replicas (each its own store and connection) claim 60 jobs at once.
    let url = pg.create_database("jobs_claims");
    let replicas: Vec<SharedStore> = (0..4).map(|_| connect(&url)).collect();
    for n in 0..60 {
        assert_eq!(
            replicas[0].submit(&job(n, "tn-a"), 100).unwrap(),
            Submitted::Added
        );
    }
    let claimed: Vec<Vec<Job>> = std::thread::scope(|scope| {
        let threads: Vec<_> = replicas
            .iter()
            .enumerate()
            .map(|(r, queue)| {
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    while let Some(claim) = queue.claim(&format!("r{r}"), LEASE).unwrap() {
                        assert!(!claim.lease_expired);
                        assert_eq!(claim.job.status, JobStatus::Running);
                        assert_eq!(claim.job.attempts, 1);
                        mine.push(claim.job);
                    }
                    mine
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let ids: Vec<&str> = claimed.iter().flatten().map(|j| j.id.as_str()).collect();
    let distinct: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len(), 60, "every job claimed");
    assert_eq!(distinct.len(), 60, "no job claimed twice");
    assert_eq!(replicas[0].depth().unwrap(), 0);
    // Each finishes its own: the outcome is recorded once.
    for (r, jobs) in claimed.iter().enumerate() {
        for j in jobs {
            let done = Job {
                status: JobStatus::Succeeded,
                results: Some(vec![json!(r)]),
                finished_at_ms: Some(1_000),
                ..j.clone()
            };
            assert!(replicas[r].finish(&done, 1000).unwrap());
            assert!(!replicas[r].finish(&done, 1000).unwrap(), "only once");
        }
    }
    let first = &claimed.iter().flatten().next().unwrap().id;
    let read = replicas[3].get("tn-a", first).unwrap().unwrap();
    assert_eq!(read.status, JobStatus::Succeeded);
    assert!(read.results.is_some());
}

fn an_ended_lease_runs_the_job_again_and_fences_the_old_attempt(pg: &Postgres) {
    let queue = store(pg, "jobs_lease");
    let j = job(1, "tn-a");
    queue.submit(&j, 10).unwrap();
    let short = Duration::from_millis(300);
    let first = queue.claim("dead", short).unwrap().expect("a job");
    assert!(queue.renew(&j.id, 1, short).unwrap());
    assert!(
        queue.claim("other", LEASE).unwrap().is_none(),
        "held while its lease lasts"
    );
    // The replica stops renewing: once the lease has ended, another claims the job again.
    let (second, _) = wait_for(Duration::from_secs(5), "the lease to end", || {
        queue.claim("other", LEASE).unwrap()
    });
    assert!(second.lease_expired);
    assert_eq!(second.job.attempts, 2);
    // The first attempt is fenced off: no renewal, no outcome.
    assert!(!queue.renew(&j.id, 1, LEASE).unwrap());
    let stale = Job {
        status: JobStatus::Succeeded,
        results: Some(vec![json!("stale")]),
        finished_at_ms: Some(5),
        ..first.job
    };
    assert!(!queue.finish(&stale, 100).unwrap());
    let fresh = Job {
        status: JobStatus::Succeeded,
        results: Some(vec![json!("fresh")]),
        finished_at_ms: Some(6),
        ..second.job
    };
    assert!(queue.finish(&fresh, 100).unwrap());
    let read = queue.get("tn-a", &j.id).unwrap().unwrap();
    assert_eq!(read.results, Some(vec![json!("fresh")]));
    assert_eq!(read.attempts, 2);
}

fn cancellation_release_retention_and_deleted_tenants(pg: &Postgres) {
    let queue = store(pg, "jobs_cancel");
    let (queued, running) = (job(1, "tn-a"), job(2, "tn-a"));
    queue.submit(&queued, 10).unwrap();
    queue.submit(&running, 10).unwrap();
    // Claimed in creation order: `queued` (created first) is claimed, then released back.
    let claim = queue.claim("r", LEASE).unwrap().unwrap();
    assert_eq!(claim.job.id, queued.id);
    assert!(queue.release(&queued.id, 1).unwrap());
    assert!(!queue.release(&queued.id, 1).unwrap(), "released once");
    let cancelled = queue.cancel("tn-a", &queued.id).unwrap().unwrap();
    assert_eq!(cancelled.status, JobStatus::Cancelled);
    assert!(cancelled.finished_at_ms.is_some());
    assert!(queue.cancel("tn-b", &queued.id).unwrap().is_none());

    // A running job asked to cancel ends cancelled, whatever its outcome.
    let claim = queue.claim("r", LEASE).unwrap().unwrap();
    assert_eq!(claim.job.id, running.id);
    let asked = queue.cancel("tn-a", &running.id).unwrap().unwrap();
    assert_eq!(
        (asked.status, asked.cancel_requested),
        (JobStatus::Running, true)
    );
    let done = Job {
        status: JobStatus::Succeeded,
        results: Some(vec![json!(1)]),
        finished_at_ms: Some(10),
        ..claim.job
    };
    assert!(queue.finish(&done, 10).unwrap());
    let read = queue.get("tn-a", &running.id).unwrap().unwrap();
    assert_eq!((read.status, read.results), (JobStatus::Cancelled, None));

    // Retention: a tenant keeps its newest finished jobs; old ones are swept.
    for n in 10..15 {
        queue.submit(&job(n, "tn-r"), 10).unwrap();
    }
    while let Some(claim) = queue.claim("r", LEASE).unwrap() {
        let done = Job {
            status: JobStatus::Succeeded,
            finished_at_ms: Some(claim.job.created_at_ms * 1000),
            ..claim.job
        };
        assert!(queue.finish(&done, 2).unwrap());
    }
    let kept: Vec<bool> = (10..15)
        .map(|n| queue.get("tn-r", &job(n, "tn-r").id).unwrap().is_some())
        .collect();
    assert_eq!(kept, [false, false, false, true, true]);
    // Finished before 14 s: tn-a's job finished at 10 ms and tn-r's at 13 s (tn-a's job
    // cancelled while queued finished now).
    assert_eq!(queue.sweep(14_000).unwrap(), 2);
    assert!(queue.get("tn-r", &job(14, "tn-r").id).unwrap().is_some());

    queue.submit(&job(20, "tn-gone"), 10).unwrap();
    assert_eq!(queue.forget_tenant("tn-gone").unwrap(), 1);
    assert!(queue
        .get("tn-gone", &job(20, "tn-gone").id)
        .unwrap()
        .is_none());
}
