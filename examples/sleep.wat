;; sleep: an export-call function that waits without using CPU, through WASI
;; `poll_oneoff` on the monotonic clock. `nap(ms)` returns 0 after about `ms`
;; milliseconds (or the WASI error code). Useful to hold a slot, e.g. to
;; exercise concurrency quotas.
(module
  (import "wasi_snapshot_preview1" "poll_oneoff"
    (func $poll_oneoff (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; Subscription at 0 (48 bytes), event at 64 (32 bytes), count at 128.
  (func (export "nap") (param $ms i32) (result i32)
    (i64.store (i32.const 0) (i64.const 1))                 ;; userdata
    (i32.store8 (i32.const 8) (i32.const 0))                ;; tag: clock
    (i32.store (i32.const 16) (i32.const 1))                ;; clock id: monotonic
    (i64.store (i32.const 24)                               ;; timeout in ns
      (i64.mul (i64.extend_i32_u (local.get $ms)) (i64.const 1000000)))
    (i64.store (i32.const 32) (i64.const 0))                ;; precision
    (i32.store16 (i32.const 40) (i32.const 0))              ;; flags: relative
    (call $poll_oneoff (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128))))
