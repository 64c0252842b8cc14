//! What a component makes the host hold is bounded and charged to the function's memory
//! limit: `wasi:http` fields it hoards, host resources it piles up, one oversized fields
//! resource, GPU buffers beside its linear memory, and a typed export's oversized result. Each
//! ends with a stable error (`MemoryLimit` or `ResourceLimit`), and the runtime goes on
//! serving: a small call of the same function answers after every refusal.

use serde_json::json;
use tensor_wasm_runtime::{ComponentLimits, DeploySpec, Runtime, RuntimeConfig, RuntimeError};
use tensor_wasm_test_support::app::open_runtime;

/// The function's memory limit in these tests (`RuntimeConfig::for_tests`' default).
const MEMORY_LIMIT: u64 = 16 << 20;

/// A component of typed exports over `wasi:http/types` fields and `tensor-wasm:gpu` buffers:
/// - `hoard(n, len)`: `n` new fields resources, each with one `len`-byte value, all kept;
/// - `grow(n, len)`: one fields resource, `n` values of `len` bytes appended to it;
/// - `many(n)`: `n` empty fields resources, all kept;
/// - `big(len) -> list<u8>`: a result of `len` bytes (its memory grown to hold them);
/// - `gpu(len, pages) -> u32`: a GPU buffer of `len` bytes (0 when allocated, 1 when refused),
///   then its linear memory grown by `pages` pages.
///
/// Each returns `n` (or 0) when it gets that far.
const HOARDER: &str = r#"(component
  (import "wasi:http/types@0.2.0" (instance $http
    (export "fields" (type $f (sub resource)))
    (type $he (variant (case "invalid-syntax") (case "forbidden") (case "immutable")))
    (export "header-error" (type $he2 (eq $he)))
    (export "[constructor]fields" (func (result (own $f))))
    (export "[method]fields.append" (func (param "self" (borrow $f)) (param "name" string)
      (param "value" (list u8)) (result (result (error $he2)))))))
  (import "tensor-wasm:gpu/types@0.1.0" (instance $gtypes
    (type $e (variant (case "invalid-argument" string) (case "not-available" string)
      (case "permission-denied" string) (case "limit-exceeded" string) (case "device" string)))
    (export "error" (type $e2 (eq $e)))))
  (alias export $gtypes "error" (type $gerror))
  (import "tensor-wasm:gpu/buffers@0.1.0" (instance $buffers
    (alias outer 1 $gerror (type $outer))
    (export "error" (type $e (eq $outer)))
    (export "buffer" (type $b (sub resource)))
    (export "[static]buffer.allocate" (func (param "len-bytes" u64) (result (result (own $b) (error $e)))))))
  (core module $libc
    (memory (export "memory") 2)
    (global $next (mut i32) (i32.const 1024))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $at i32)
      (local.set $at (global.get $next))
      (global.set $next (i32.add (global.get $next) (local.get 3)))
      (local.get $at)))
  (core instance $libc (instantiate $libc))
  (alias core export $libc "memory" (core memory $memory))
  (alias core export $libc "realloc" (core func $realloc))
  (core func $new (canon lower (func $http "[constructor]fields")))
  (core func $append (canon lower (func $http "[method]fields.append") (memory $memory)))
  (core func $allocate (canon lower (func $buffers "[static]buffer.allocate") (memory $memory)
    (realloc $realloc)))
  (core module $main
    (import "host" "memory" (memory 2))
    (import "host" "new" (func $new (result i32)))
    (import "host" "append" (func $append (param i32 i32 i32 i32 i32 i32)))
    (import "host" "allocate" (func $allocate (param i64 i32)))
    (data (i32.const 0) "x-a")
    ;; A header value of `len` bytes of 'a' at 8192 (the memory grown when it needs to be).
    (func $value (param $len i32)
      (local $need i32)
      (local.set $need (i32.sub (i32.shr_u (i32.add (i32.add (local.get $len) (i32.const 8192))
        (i32.const 65535)) (i32.const 16)) (memory.size)))
      (if (i32.gt_s (local.get $need) (i32.const 0))
        (then (drop (memory.grow (local.get $need)))))
      (memory.fill (i32.const 8192) (i32.const 97) (local.get $len)))
    (func (export "hoard") (param $n i32) (param $len i32) (result i32)
      (local $i i32)
      (call $value (local.get $len))
      (block $done (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (call $append (call $new) (i32.const 0) (i32.const 3) (i32.const 8192) (local.get $len)
          (i32.const 128))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
      (local.get $n))
    (func (export "grow") (param $n i32) (param $len i32) (result i32)
      (local $i i32) (local $f i32)
      (call $value (local.get $len))
      (local.set $f (call $new))
      (block $done (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (call $append (local.get $f) (i32.const 0) (i32.const 3) (i32.const 8192)
          (local.get $len) (i32.const 128))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
      (local.get $n))
    (func (export "many") (param $n i32) (result i32)
      (local $i i32)
      (block $done (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (drop (call $new))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
      (local.get $n))
    (func (export "big") (param $len i32) (result i32)
      (call $value (local.get $len))
      (i32.store (i32.const 256) (i32.const 8192))
      (i32.store (i32.const 260) (local.get $len))
      (i32.const 256))
    (func (export "gpu") (param $len i64) (param $pages i32) (result i32)
      (local $refused i32)
      (call $allocate (local.get $len) (i32.const 512))
      (local.set $refused (i32.load8_u (i32.const 512)))
      (if (i32.lt_s (memory.grow (local.get $pages)) (i32.const 0)) (then unreachable))
      (local.get $refused)))
  (core instance $i (instantiate $main (with "host" (instance
    (export "memory" (memory $memory))
    (export "new" (func $new))
    (export "append" (func $append))
    (export "allocate" (func $allocate))))))
  (func $hoard (param "n" u32) (param "len" u32) (result u32) (canon lift (core func $i "hoard")))
  (export "hoard" (func $hoard))
  (func $grow (param "n" u32) (param "len" u32) (result u32) (canon lift (core func $i "grow")))
  (export "grow" (func $grow))
  (func $many (param "n" u32) (result u32) (canon lift (core func $i "many")))
  (export "many" (func $many))
  (func $big (param "len" u32) (result (list u8))
    (canon lift (core func $i "big") (memory $memory)))
  (export "big" (func $big))
  (func $gpu (param "len" u64) (param "pages" u32) (result u32)
    (canon lift (core func $i "gpu")))
  (export "gpu" (func $gpu)))"#;

/// A runtime whose component invocations may hold `max_resources` host resources, and the
/// hoarder deployed on it.
fn hoarder(dir: &std::path::Path, max_resources: usize) -> (Runtime, String) {
    let config = RuntimeConfig {
        component_limits: ComponentLimits {
            max_resources,
            max_field_bytes: 64 << 10,
        },
        ..RuntimeConfig::for_tests(dir)
    };
    let rt = open_runtime(config, &prometheus::Registry::new());
    let binary = wat::parse_str(HOARDER).expect("the hoarder assembles");
    let spec = DeploySpec {
        memory_limit_bytes: Some(MEMORY_LIMIT),
        ..DeploySpec::export("hoarder")
    };
    let id = rt.deploy(&binary, spec).expect("deploys").record.id;
    (rt, id)
}

/// Calls `export` of `id` with `args`, expecting a failure.
fn refused(rt: &Runtime, id: &str, export: &str, args: &[serde_json::Value]) -> RuntimeError {
    match rt.invoke_export(id, export, args) {
        Ok(out) => panic!("{export}{args:?} answered {out:?}"),
        Err(e) => e,
    }
}

/// The runtime still serves the function: a small call of each kind answers.
fn still_serves(rt: &Runtime, id: &str) {
    assert_eq!(
        rt.invoke_export(id, "hoard", &[json!(4), json!(100)])
            .unwrap(),
        vec![json!(4)]
    );
    assert_eq!(
        rt.invoke_export(id, "many", &[json!(10)]).unwrap(),
        vec![json!(10)]
    );
}

#[test]
fn fields_a_component_hoards_are_charged_to_its_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, id) = hoarder(dir.path(), 1000);
    still_serves(&rt, &id);
    // 400 values of 60 kB: 24 MB of host memory, past the 16 MiB limit with fewer resources
    // than their cap (1000): the charge stops it.
    let error = refused(&rt, &id, "hoard", &[json!(400), json!(60_000)]);
    let RuntimeError::MemoryLimit(message) = &error else {
        panic!("{error:?}");
    };
    assert!(
        message.contains("bytes held by the host") && message.contains(&MEMORY_LIMIT.to_string()),
        "{message}"
    );
    still_serves(&rt, &id);
}

#[test]
fn host_resources_of_one_invocation_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, id) = hoarder(dir.path(), 200);
    // 150 empty fields fit under the cap of 200 resources; 300 do not.
    assert_eq!(
        rt.invoke_export(&id, "many", &[json!(150)]).unwrap(),
        vec![json!(150)]
    );
    let error = refused(&rt, &id, "many", &[json!(300)]);
    let RuntimeError::ResourceLimit(message) = &error else {
        panic!("{error:?}");
    };
    assert!(message.contains("200 host resources"), "{message}");
    still_serves(&rt, &id);
}

#[test]
fn one_fields_resource_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, id) = hoarder(dir.path(), 200);
    // Two values of 20 kB fit in 64 KiB; four do not.
    assert_eq!(
        rt.invoke_export(&id, "grow", &[json!(2), json!(20_000)])
            .unwrap(),
        vec![json!(2)]
    );
    let error = refused(&rt, &id, "grow", &[json!(4), json!(20_000)]);
    let RuntimeError::ResourceLimit(message) = &error else {
        panic!("{error:?}");
    };
    assert!(message.contains("65536 bytes"), "{message}");
    still_serves(&rt, &id);
}

#[test]
fn a_typed_export_result_is_bounded_before_it_is_converted() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, id) = hoarder(dir.path(), 200);
    let small = rt.invoke_export(&id, "big", &[json!(1000)]).unwrap();
    assert_eq!(small[0].as_array().map(Vec::len), Some(1000));
    // 1 MiB of u8 fits in the guest's 16 MiB, but as host values it takes more than the
    // function's memory limit (less than wasmtime's default of 128 MiB per call): refused
    // before the values are made.
    let error = refused(&rt, &id, "big", &[json!(1 << 20)]);
    let RuntimeError::MemoryLimit(message) = &error else {
        panic!("{error:?}");
    };
    assert!(message.contains("results of a typed export"), "{message}");
    still_serves(&rt, &id);
}

#[test]
fn gpu_buffers_and_linear_memory_share_one_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, id) = hoarder(dir.path(), 200);
    // 4 MiB of buffer and 4 MiB (64 pages) more linear memory fit in 16 MiB together.
    assert_eq!(
        rt.invoke_export(&id, "gpu", &[json!(4 << 20), json!(64)])
            .unwrap(),
        vec![json!(0)]
    );
    // A 12 MiB buffer is granted, but then 8 MiB more of linear memory is not.
    let error = refused(&rt, &id, "gpu", &[json!(12 << 20), json!(128)]);
    let RuntimeError::MemoryLimit(message) = &error else {
        panic!("{error:?}");
    };
    assert!(message.contains("GPU buffers 12582912"), "{message}");
    // A buffer larger than what the linear memory leaves is refused to the guest.
    assert_eq!(
        rt.invoke_export(&id, "gpu", &[json!(MEMORY_LIMIT), json!(0)])
            .unwrap(),
        vec![json!(1)]
    );
    still_serves(&rt, &id);
}
