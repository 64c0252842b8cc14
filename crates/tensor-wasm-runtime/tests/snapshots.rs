//! Snapshots through the runtime's public API: capture after an init export, restore in
//! both modes (eager into pooled memory, lazy into unified host memory), durability across
//! a restart, rebuild of the per-host image, corruption, and what cannot be snapshotted.

use std::path::Path;

use serde_json::json;
use tensor_wasm_runtime::{
    DeploySpec, GuestMemory, RestoreMode, Runtime, RuntimeConfig, RuntimeError,
};
use tensor_wasm_test_support::app::open_runtime;
use tensor_wasm_test_support::guests::example;

fn open_with(config: RuntimeConfig) -> Runtime {
    open_runtime(config, &prometheus::Registry::new())
}

fn config(dir: &Path, memory: GuestMemory) -> RuntimeConfig {
    RuntimeConfig {
        guest_memory: memory,
        ..RuntimeConfig::for_tests(dir)
    }
}

/// The table `examples/warm.wat` builds in `init`.
fn xorshift_table(n: usize) -> Vec<i32> {
    let mut x: u32 = 2_463_534_242;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as i32
        })
        .collect()
}

fn call(rt: &Runtime, id: &str, export: &str, args: &[serde_json::Value]) -> serde_json::Value {
    let mut out = rt.invoke_export(id, export, args).unwrap();
    assert_eq!(out.len(), 1, "{export}");
    out.remove(0)
}

/// Asserts the initialised state of `warm.wat`, without init having run in this instance.
fn assert_initialised(rt: &Runtime, id: &str) {
    let table = xorshift_table(262_144);
    for i in [0usize, 1, 4095, 131_072, 262_143] {
        assert_eq!(
            call(rt, id, "lookup", &[json!(i)]),
            json!(table[i]),
            "lookup({i})"
        );
    }
    assert_eq!(call(rt, id, "lookup", &[json!(262_144)]), json!(-1));
    assert_eq!(call(rt, id, "init_runs", &[]), json!(1));
    // The data segment ("cold") is applied at instantiation; the snapshot wins.
    assert_eq!(call(rt, id, "tag", &[]), json!(0x6d72_6177));
    assert_eq!(call(rt, id, "weight", &[]), json!(1.5));
    // Every instance starts from the snapshot: a mutation does not carry over.
    assert_eq!(call(rt, id, "bump", &[]), json!(1));
    assert_eq!(call(rt, id, "bump", &[]), json!(1));
}

fn round_trip(memory: GuestMemory, expected_mode: RestoreMode) {
    let dir = tempfile::tempdir().unwrap();
    let rt = open_with(config(dir.path(), memory));
    assert_eq!(rt.restore_mode(), expected_mode);
    let f = rt
        .deploy(&example("warm.wat"), DeploySpec::export("warm"))
        .unwrap();
    let id = &f.record.id;
    // Fresh instances are uninitialised.
    assert_eq!(call(&rt, id, "lookup", &[json!(5)]), json!(-1));
    assert_eq!(call(&rt, id, "tag", &[]), json!(0x646c_6f63));

    let snap = rt.create_snapshot(id, "init", true).unwrap();
    assert_eq!(snap.memory_bytes, 17 * 65_536);
    assert_eq!(snap.globals, 3);
    assert!(snap.stored_bytes < snap.memory_bytes);
    assert_eq!(
        rt.function(id).unwrap().record.start_from_snapshot,
        Some(snap.id.clone())
    );
    assert_initialised(&rt, id);
    assert!(rt.metrics().snapshot_restores(expected_mode.as_str()) >= 7);
    assert_eq!(rt.metrics().snapshot_captures(), 1);

    // Durable: a new process starts from the same snapshot.
    drop(rt);
    let rt = open_with(config(dir.path(), memory));
    assert_eq!(rt.snapshots(id).unwrap(), vec![snap.clone()]);
    assert_initialised(&rt, id);

    // Back to fresh instances, and deletion.
    assert!(matches!(
        rt.delete_snapshot(id, &snap.id),
        Err(RuntimeError::Conflict(_))
    ));
    rt.set_start_from_snapshot(id, None).unwrap();
    assert_eq!(call(&rt, id, "lookup", &[json!(5)]), json!(-1));
    assert!(rt.delete_snapshot(id, &snap.id).unwrap());
    assert!(!rt.delete_snapshot(id, &snap.id).unwrap());
    assert!(matches!(
        rt.set_start_from_snapshot(id, Some("latest")),
        Err(RuntimeError::SnapshotNotFound(_))
    ));
}

#[test]
fn eager_restore_into_pooled_memory_continues_from_the_initialised_state() {
    round_trip(GuestMemory::Pooled, RestoreMode::Eager);
}

#[test]
fn lazy_restore_into_unified_memory_continues_from_the_initialised_state() {
    round_trip(GuestMemory::Unified, RestoreMode::Lazy);
}

#[test]
fn the_local_image_is_rebuilt_from_the_portable_snapshot_and_corruption_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open_with(config(dir.path(), GuestMemory::Unified));
    let f = rt
        .deploy(&example("warm.wat"), DeploySpec::export("warm"))
        .unwrap();
    let id = f.record.id.clone();
    let snap = rt.create_snapshot(&id, "init", true).unwrap();
    drop(rt);

    // Missing per-host image: rebuilt from the portable copy on first restore.
    let local = dir
        .path()
        .join("snapshot-cache")
        .join(format!("{}.twlocal", snap.id));
    std::fs::remove_file(&local).unwrap();
    let rt = open_with(config(dir.path(), GuestMemory::Unified));
    assert_initialised(&rt, &id);
    assert!(local.exists());
    drop(rt);

    // A flipped byte in a stored page of the local image: detected, rebuilt.
    let mut bytes = std::fs::read(&local).unwrap();
    let last = bytes.len() - 100;
    bytes[last] ^= 0xff;
    std::fs::write(&local, &bytes).unwrap();
    let rt = open_with(config(dir.path(), GuestMemory::Unified));
    assert_initialised(&rt, &id);
    drop(rt);

    // Both copies damaged: a clear error, the function's other paths keep working.
    std::fs::remove_file(&local).unwrap();
    let portable = dir
        .path()
        .join("snapshots")
        .join(&id)
        .join(format!("{}.twsnap", snap.id));
    let mut bytes = std::fs::read(&portable).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&portable, &bytes).unwrap();
    let rt = open_with(config(dir.path(), GuestMemory::Unified));
    match rt.invoke_export(&id, "lookup", &[json!(1)]) {
        Err(RuntimeError::SnapshotCorrupt { id: bad, message }) => {
            assert_eq!(bad, snap.id);
            assert!(message.contains("checksum"), "{message}");
        }
        other => panic!("expected a corrupt-snapshot error, got {other:?}"),
    }
    rt.set_start_from_snapshot(&id, None).unwrap();
    assert_eq!(call(&rt, &id, "lookup", &[json!(5)]), json!(-1));
}

#[test]
fn deleting_a_function_removes_its_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open_with(config(dir.path(), GuestMemory::Pooled));
    let f = rt
        .deploy(&example("warm.wat"), DeploySpec::export("warm"))
        .unwrap();
    let id = f.record.id.clone();
    let snap = rt.create_snapshot(&id, "init", false).unwrap();
    assert_eq!(rt.function(&id).unwrap().record.start_from_snapshot, None);
    rt.set_start_from_snapshot(&id, Some("latest")).unwrap();
    assert_initialised(&rt, &id);
    assert!(rt.delete(&id).unwrap());
    assert!(!dir.path().join("snapshots").join(&id).exists());
    assert!(!dir
        .path()
        .join("snapshot-cache")
        .join(format!("{}.twlocal", snap.id))
        .exists());
}

#[test]
fn what_cannot_be_snapshotted_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open_with(config(dir.path(), GuestMemory::Pooled));
    let warm = rt
        .deploy(&example("warm.wat"), DeploySpec::export("warm"))
        .unwrap()
        .record
        .id;
    assert!(matches!(
        rt.create_snapshot(&warm, "nope", true),
        Err(RuntimeError::UnknownExport(_))
    ));
    assert!(matches!(
        rt.create_snapshot(&warm, "lookup", true),
        Err(RuntimeError::InvalidArguments(_))
    ));
    // Host-only names never show up as exports.
    let exports = rt.function(&warm).unwrap().exports;
    assert!(exports.iter().all(|e| !e.name.starts_with("tensor-wasm:")));

    let tables = rt
        .deploy(
            br#"(module (table 1 funcref) (func $f)
                 (func (export "init") i32.const 0 ref.func $f table.set 0)
                 (elem declare func $f))"#,
            DeploySpec::export("tables"),
        )
        .unwrap()
        .record
        .id;
    match rt.create_snapshot(&tables, "init", true) {
        Err(RuntimeError::SnapshotUnsupported(message)) => {
            assert!(message.contains("table.set"), "{message}")
        }
        other => panic!("expected unsupported, got {other:?}"),
    }

    let reserved = rt.deploy(
        br#"(module (global (export "tensor-wasm:global:0") i32 (i32.const 0)) (func (export "f")))"#,
        DeploySpec::export("reserved"),
    );
    assert!(matches!(reserved, Err(RuntimeError::InvalidModule(_))));

    // A trap in init: reported like an invocation's, nothing stored.
    let trapping = rt
        .deploy(
            br#"(module (func (export "init") unreachable))"#,
            DeploySpec::export("trap"),
        )
        .unwrap()
        .record
        .id;
    assert!(matches!(
        rt.create_snapshot(&trapping, "init", true),
        Err(RuntimeError::Trap(_))
    ));
    assert!(rt.snapshots(&trapping).unwrap().is_empty());
}

#[test]
fn a_module_without_memory_or_globals_snapshots_trivially() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open_with(config(dir.path(), GuestMemory::Pooled));
    let id = rt
        .deploy(
            br#"(module (func (export "init")) (func (export "one") (result i32) i32.const 1))"#,
            DeploySpec::export("plain"),
        )
        .unwrap()
        .record
        .id;
    let snap = rt.create_snapshot(&id, "init", true).unwrap();
    assert_eq!((snap.memory_bytes, snap.globals), (0, 0));
    assert_eq!(call(&rt, &id, "one", &[]), json!(1));
}

#[test]
fn captures_through_the_kept_encoder_each_store_their_own_bytes() {
    // The runtime keeps one encoder between captures (or none with a keep of 0). Captures of
    // different sizes one after another each store their own portable bytes: restores that
    // must rebuild every local image from them see each function's own state.
    let small_wat = br#"(module (memory 1)
        (func (export "init") i32.const 100 i32.const 7 i32.store)
        (func (export "get") (result i32) i32.const 100 i32.load))"#;
    for keep in [0, 64 << 20] {
        let dir = tempfile::tempdir().unwrap();
        let config = || RuntimeConfig {
            snapshot_encoder_keep_bytes: keep,
            ..config(dir.path(), GuestMemory::Pooled)
        };
        let rt = open_with(config());
        let small = rt
            .deploy(small_wat, DeploySpec::export("small"))
            .unwrap()
            .record
            .id;
        let warm = rt
            .deploy(&example("warm.wat"), DeploySpec::export("warm"))
            .unwrap()
            .record
            .id;
        rt.create_snapshot(&small, "init", false).unwrap();
        rt.create_snapshot(&warm, "init", true).unwrap();
        let last = rt.create_snapshot(&small, "init", true).unwrap();
        assert_eq!(last.memory_bytes, 65_536);
        drop(rt);
        std::fs::remove_dir_all(dir.path().join("snapshot-cache")).unwrap();
        let rt = open_with(config());
        assert_initialised(&rt, &warm);
        assert_eq!(call(&rt, &small, "get", &[]), json!(7), "keep {keep}");
    }
}
