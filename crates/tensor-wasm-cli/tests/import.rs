//! `tensor-wasm import-data-dir` end to end: a single-node server's data dir, with
//! functions, a snapshot and its tokens, is copied into a shared store on a real PostgreSQL 15
//! and a real S3 server; a replica with an empty data dir then serves every function with the
//! old tokens, starting from the imported snapshot. A second run finishes nothing new and
//! fails nothing; another installation's data dir is refused. `collect-orphans` then removes
//! the module of a function deleted on the replica.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::json;
use tensor_wasm_test_support::guests::examples_dir;
use tensor_wasm_test_support::serve::ServeProcess;
use tensor_wasm_test_support::servers::{Postgres, S3Server};

const BIN: &str = env!("CARGO_BIN_EXE_tensor-wasm");

#[test]
fn a_data_dir_moves_into_the_shared_store() {
    let pg = Postgres::start();
    let s3 = S3Server::start();
    s3.create_bucket("tw-import");
    let database = pg.create_database("import");
    let client_env = s3.client_env();
    let env: Vec<(&str, &OsStr)> = client_env
        .iter()
        .map(|(k, v)| (*k, v.as_os_str()))
        .collect();
    let import = |dir: &Path| -> Output {
        Command::new(BIN)
            .arg("import-data-dir")
            .arg("--data-dir")
            .arg(dir)
            .args(["--store", &database, "--blob-store", "s3://tw-import/p"])
            .envs(env.iter().copied())
            .output()
            .expect("running import-data-dir")
    };
    let stdout = |out: &Output| String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();

    // A single node: two functions, one starting from a snapshot.
    let old = tempfile::tempdir().unwrap();
    let single = ServeProcess::start(Path::new(BIN), old.path(), &[]);
    let calc = single.deploy(&examples_dir().join("calc.wat"), "name=calc");
    let warm = single.deploy(&examples_dir().join("warm.wat"), "name=warm");
    let (status, body, _) = single.post(
        &format!("/functions/{warm}/snapshots"),
        "application/json",
        br#"{"init_export": "init"}"#,
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    single.terminate();

    let first = import(old.path());
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stdout(&first).contains("1 tenant(s), 2 function(s), 1 snapshot(s) (0 already present)"),
        "{}",
        stdout(&first)
    );
    // Again: every write is an upsert or skipped, so an interrupted run can be finished.
    let again = import(old.path());
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stdout(&again).contains("0 snapshot(s) (1 already present)"),
        "{}",
        stdout(&again)
    );

    // A replica with an empty data dir and the old credentials serves everything.
    let new = tempfile::tempdir().unwrap();
    std::fs::copy(
        old.path().join("credentials.json"),
        new.path().join("credentials.json"),
    )
    .unwrap();
    let replica = ServeProcess::start_with_env(
        Path::new(BIN),
        new.path(),
        &["--store", &database, "--blob-store", "s3://tw-import/p"],
        &env,
        "warn",
        Stdio::inherit(),
    );
    assert_eq!(
        replica.call(&calc, "add", json!([2, 3])),
        (200, json!({"results": [5]}))
    );
    assert_eq!(
        replica.call(&warm, "init_runs", json!([])),
        (200, json!({"results": [1]})),
        "starts from the imported snapshot"
    );
    // Deleted there, the function's module is an orphan that `collect-orphans` removes.
    let deleted = ServeProcess::agent()
        .delete(&replica.url(&format!("/functions/{calc}")))
        .set("authorization", &replica.auth())
        .call()
        .expect("the delete");
    assert!(matches!(deleted.status(), 200 | 204));
    let collect = |extra: &[&str]| -> Output {
        Command::new(BIN)
            .args([
                "collect-orphans",
                "--store",
                &database,
                "--blob-store",
                "s3://tw-import/p",
            ])
            .args(["--grace-s", "0"])
            .args(extra)
            .envs(env.iter().copied())
            .output()
            .expect("running collect-orphans")
    };
    let dry = collect(&["--dry-run"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert!(
        stdout(&dry).contains("would remove 1 module(s), 0 snapshot image(s) and 0 model(s)"),
        "{}",
        stdout(&dry)
    );
    let done = collect(&[]);
    assert!(
        stdout(&done).contains("removed 1 module(s)"),
        "{}",
        stdout(&done)
    );
    assert_eq!(
        replica.call(&warm, "init_runs", json!([])),
        (200, json!({"results": [1]})),
        "what records name stays"
    );
    replica.terminate();

    // Another installation's data dir is refused: the store holds this one's state.
    let other = tempfile::tempdir().unwrap();
    ServeProcess::start(Path::new(BIN), other.path(), &[]).terminate();
    let refused = import(other.path());
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("another installation"),
        "{}",
        stderr(&refused)
    );
    // And a directory that is no data dir at all.
    let empty = tempfile::tempdir().unwrap();
    let refused = import(empty.path());
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("is not a tensor-wasm data dir"),
        "{}",
        stderr(&refused)
    );
}
