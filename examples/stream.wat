;; stream: an export-call function that streams its output through
;; `tw:stream` while it runs. Invoke it with POST /functions/{id}/invoke-stream.
;;
;; `ticks(n, delay_ms)`: emits the request input as one chunk (if any), then
;; "tick\n" n times, sleeping `delay_ms` between ticks (WASI poll_oneoff);
;; returns the number of chunks sent, or the negative code that stopped it
;; (-7 when the client went away).
;; `flood()`: emits 64 KiB chunks until emit_chunk fails; returns that code.
(module
  (import "tw:stream" "input_len" (func $input_len (result i64)))
  (import "tw:stream" "read_input" (func $read_input (param i32 i32) (result i32)))
  (import "tw:stream" "emit_chunk" (func $emit (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff"
    (func $poll_oneoff (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 4)
  ;; 0..128: poll_oneoff scratch; 256: "tick\n"; 65536..: input / flood buffer.
  (data (i32.const 256) "tick\n")

  (func $nap (param $ms i32)
    (i64.store (i32.const 0) (i64.const 1))
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (i64.mul (i64.extend_i32_u (local.get $ms)) (i64.const 1000000)))
    (i64.store (i32.const 32) (i64.const 0))
    (i32.store16 (i32.const 40) (i32.const 0))
    (drop (call $poll_oneoff (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128))))

  (func (export "ticks") (param $n i32) (param $delay i32) (result i32)
    (local $len i32) (local $rc i32) (local $sent i32) (local $i i32)
    (local.set $len (call $read_input (i32.const 65536) (i32.const 131072)))
    (if (i32.gt_s (local.get $len) (i32.const 0))
      (then
        (local.set $rc (call $emit (i32.const 65536) (local.get $len)))
        (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc))))
        (local.set $sent (i32.const 1))))
    (block $done
      (loop $tick
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (if (i32.gt_u (local.get $i) (i32.const 0)) (then (call $nap (local.get $delay))))
        (local.set $rc (call $emit (i32.const 256) (i32.const 5)))
        (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc))))
        (local.set $sent (i32.add (local.get $sent) (i32.const 1)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $tick)))
    (local.get $sent))

  (func (export "flood") (result i32)
    (local $rc i32)
    (loop $more
      (local.set $rc (call $emit (i32.const 65536) (i32.const 65536)))
      (br_if $more (i32.eqz (local.get $rc))))
    (local.get $rc)))
