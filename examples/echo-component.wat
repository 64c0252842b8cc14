;; echo-component: a WASI 0.2 command component (the component text format) that copies
;; up to 4 KiB of stdin to stdout and exits 0. It imports wasi:io/streams, wasi:cli/stdin and
;; wasi:cli/stdout as a guest built by a toolchain would, lowers get-stdin, blocking-read,
;; get-stdout and blocking-write-and-flush, and lifts wasi:cli/run's `run`.
;;
;;   tensor-wasm deploy examples/echo-component.wat
;;   curl -d 'hello' .../functions/<id>/invoke
(component
  (import "wasi:io/error@0.2.0" (instance $error
    (export "error" (type (sub resource)))))
  (alias export $error "error" (type $err))
  (import "wasi:io/streams@0.2.0" (instance $streams
    (alias outer 1 $err (type $e))
    (export "error" (type $error (eq $e)))
    (export "input-stream" (type $is (sub resource)))
    (export "output-stream" (type $os (sub resource)))
    (type $se (variant (case "last-operation-failed" (own $error)) (case "closed")))
    (export "stream-error" (type $stream-error (eq $se)))
    (export "[method]input-stream.blocking-read"
      (func (param "self" (borrow $is)) (param "len" u64)
            (result (result (list u8) (error $stream-error)))))
    (export "[method]output-stream.blocking-write-and-flush"
      (func (param "self" (borrow $os)) (param "contents" (list u8))
            (result (result (error $stream-error)))))))
  (alias export $streams "input-stream" (type $input))
  (alias export $streams "output-stream" (type $output))
  (import "wasi:cli/stdin@0.2.0" (instance $stdin
    (alias outer 1 $input (type $i))
    (export "input-stream" (type $is (eq $i)))
    (export "get-stdin" (func (result (own $is))))))
  (import "wasi:cli/stdout@0.2.0" (instance $stdout
    (alias outer 1 $output (type $o))
    (export "output-stream" (type $os (eq $o)))
    (export "get-stdout" (func (result (own $os))))))

  (core module $libc
    (memory (export "memory") 1)
    (global $next (mut i32) (i32.const 4096))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $at i32)
      (local.set $at (global.get $next))
      (global.set $next (i32.add (global.get $next) (local.get 3)))
      (local.get $at)))
  (core instance $libc (instantiate $libc))
  (alias core export $libc "memory" (core memory $memory))
  (alias core export $libc "realloc" (core func $realloc))

  (core func $get-stdin (canon lower (func $stdin "get-stdin")))
  (core func $get-stdout (canon lower (func $stdout "get-stdout")))
  (core func $read (canon lower (func $streams "[method]input-stream.blocking-read")
    (memory $memory) (realloc $realloc)))
  (core func $write (canon lower (func $streams "[method]output-stream.blocking-write-and-flush")
    (memory $memory)))

  (core module $main
    (import "host" "memory" (memory 1))
    (import "host" "get-stdin" (func $get-stdin (result i32)))
    (import "host" "get-stdout" (func $get-stdout (result i32)))
    (import "host" "read" (func $read (param i32 i64 i32)))
    (import "host" "write" (func $write (param i32 i32 i32 i32)))
    ;; Echoes up to 4 KiB of stdin (the result of blocking-read at 16: tag, then the list's
    ;; pointer and length at 20 and 24).
    (func $echo
      (call $read (call $get-stdin) (i64.const 4096) (i32.const 16))
      (if (i32.eqz (i32.load8_u (i32.const 16)))
        (then
          (call $write (call $get-stdout)
            (i32.load (i32.const 20)) (i32.load (i32.const 24)) (i32.const 32)))))
    (func (export "run") (result i32)
      call $echo i32.const 0))
  (core instance $i (instantiate $main (with "host" (instance
    (export "memory" (memory $memory))
    (export "get-stdin" (func $get-stdin))
    (export "get-stdout" (func $get-stdout))
    (export "read" (func $read))
    (export "write" (func $write))))))
  (func $run (result (result)) (canon lift (core func $i "run")))
  (instance $cli (export "run" (func $run)))
  (export "wasi:cli/run@0.2.0" (instance $cli)))
