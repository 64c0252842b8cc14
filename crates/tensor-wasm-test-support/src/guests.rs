//! Guest modules shared by the tests: the example modules of the repository's
//! `examples/` directory, the C guests built from `examples/c/` on demand, and
//! the inline WASI commands of the streaming tests, and the aliased-matmul
//! attack of the deadline tests.

pub mod tenant_kernels;

use std::path::PathBuf;
use std::process::Command;

/// A tenant hogging the CPU backend: one built-in `matmul` with m = n = k = 4096 whose inputs and output
/// are one 64 MiB buffer (aliased, so the CPU backend runs it as one task: about a minute of
/// one core; hours in the CUDA stand-in's interpreter). Its export `run()` returns the launch's
/// code. Argument records and the descriptor live past the buffer.
pub const ALIASED_MATMUL_WAT: &str = r#"(module
  (import "wasi:cuda" "kernel_from_blueprint" (func $kernel (param i32 i32) (result i32)))
  (import "wasi:cuda" "launch"
    (func $launch (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1025)
  (data (i32.const 67108992) "matmul")
  (func $record (param $at i32) (param $tag i32) (param $aux i32) (param $value i64)
    (i32.store (local.get $at) (local.get $tag))
    (i32.store offset=4 (local.get $at) (local.get $aux))
    (i64.store offset=8 (local.get $at) (local.get $value)))
  (func (export "run") (result i32)
    (local $k i32)
    (local.set $k (call $kernel (i32.const 67108992) (i32.const 6)))
    (if (i32.lt_s (local.get $k) (i32.const 0)) (then (return (local.get $k))))
    (call $record (i32.const 67108864) (i32.const 7) (i32.const 67108864) (i64.const 0))
    (call $record (i32.const 67108880) (i32.const 7) (i32.const 67108864) (i64.const 0))
    (call $record (i32.const 67108896) (i32.const 7) (i32.const 67108864) (i64.const 0))
    (call $record (i32.const 67108912) (i32.const 2) (i32.const 0) (i64.const 4096))
    (call $record (i32.const 67108928) (i32.const 2) (i32.const 0) (i64.const 4096))
    (call $record (i32.const 67108944) (i32.const 2) (i32.const 0) (i64.const 4096))
    (call $launch (local.get $k) (i32.const 256) (i32.const 256) (i32.const 1)
      (i32.const 16) (i32.const 16) (i32.const 1) (i32.const 0)
      (i32.const 67108864) (i32.const 96))))"#;

/// The repository's `examples/` directory.
pub fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// The bytes of `examples/<name>` (a `.wat` text or a `.wasm` binary).
pub fn example(name: &str) -> Vec<u8> {
    let path = examples_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The path of the C guest `examples/c/<name>.wasm`, built with clang for
/// wasm32-wasi if it is not built yet.
pub fn c_guest(name: &str) -> PathBuf {
    let examples = examples_dir();
    let out = examples.join(format!("c/{name}.wasm"));
    if !out.exists() {
        let status = Command::new("clang")
            .args(["--target=wasm32-wasi", "-O2", "-I"])
            .arg(examples.join("../sdk/c"))
            .arg(examples.join(format!("c/{name}.c")))
            .arg("-o")
            .arg(&out)
            .status()
            .expect("clang is installed (make test installs clang, lld, wasi-libc)");
        assert!(status.success(), "building the C guest failed");
    }
    out
}

/// A WASI command: copies stdin to stdout (one write per read), writes
/// "bye\n", "oops\n" to stderr, and exits with code 3.
pub const ECHO_COMMAND: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_read"
    (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "bye\n")
  (data (i32.const 80) "oops\n")
  (func $write (param $fd i32) (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 16))))
  (func (export "_start")
    (local $n i32)
    (loop $more
      (i32.store (i32.const 0) (i32.const 1024))
      (i32.store (i32.const 4) (i32.const 4096))
      (drop (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 16)))
      (local.set $n (i32.load (i32.const 16)))
      (if (i32.gt_u (local.get $n) (i32.const 0))
        (then (call $write (i32.const 1) (i32.const 1024) (local.get $n)) (br $more))))
    (call $write (i32.const 1) (i32.const 64) (i32.const 4))
    (call $write (i32.const 2) (i32.const 80) (i32.const 5))
    (call $proc_exit (i32.const 3))))"#;

/// A WASI command writing 4 KiB of `x` to stdout until a write fails, then
/// exiting with code 2.
pub const FLOOD_COMMAND: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (memory.fill (i32.const 1024) (i32.const 120) (i32.const 4096))
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 4096))
    (loop $more
      (br_if $more (i32.eqz
        (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))))
    (call $proc_exit (i32.const 2))))"#;

/// A component that exports `wasi:http/incoming-handler` with a `handle` of the wrong type
/// (no parameters): classified as an HTTP handler, refused at deploy as `invalid_module`.
pub const MISTYPED_HTTP_HANDLER_COMPONENT: &str = r#"(component
    (core module $m (func (export "handle")))
    (core instance $i (instantiate $m))
    (func $handle (canon lift (core func $i "handle")))
    (instance $h (export "handle" (func $handle)))
    (export "wasi:http/incoming-handler@0.2.0" (instance $h)))"#;
