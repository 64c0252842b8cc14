;; vector_add: an export-call function that launches the built-in
;; `vector_add` kernel through the wasi:cuda ABI on its own linear memory.
;;
;;   {"export": "run", "args": [1000]}  ->  {"results": [1000]}
;;
;; `run(n)` fills a[i] = i and b[i] = 2i (f32), launches out = a + b over
;; ceil(n / 256) blocks of 256 threads, then counts the elements equal to 3i.
;; A negative result is the ABI's error code. n must be in 1..=65536.
(module
  (import "wasi:cuda" "kernel_from_blueprint" (func $kernel (param i32 i32) (result i32)))
  (import "wasi:cuda" "launch"
    (func $launch (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "wasi:cuda" "sync" (func $sync (result i32)))
  (memory (export "memory") 16)
  ;; Layout: argument records at 0 (4 x 16 bytes), descriptor at 128,
  ;; a at 4096, b at 4096 + 4n, out at 4096 + 8n.
  (data (i32.const 128) "vector_add")

  ;; Writes a 16-byte argument record at `at`.
  (func $record (param $at i32) (param $tag i32) (param $aux i32) (param $value i64)
    (i32.store (local.get $at) (local.get $tag))
    (i32.store offset=4 (local.get $at) (local.get $aux))
    (i64.store offset=8 (local.get $at) (local.get $value)))

  (func (export "run") (param $n i32) (result i32)
    (local $i i32) (local $a i32) (local $b i32) (local $out i32)
    (local $bytes i32) (local $k i32) (local $rc i32) (local $ok i32)
    (if (i32.or (i32.lt_s (local.get $n) (i32.const 1))
                (i32.gt_s (local.get $n) (i32.const 65536)))
      (then (return (i32.const -1))))
    (local.set $bytes (i32.shl (local.get $n) (i32.const 2)))
    (local.set $a (i32.const 4096))
    (local.set $b (i32.add (local.get $a) (local.get $bytes)))
    (local.set $out (i32.add (local.get $b) (local.get $bytes)))
    (block $filled
      (loop $fill
        (br_if $filled (i32.ge_u (local.get $i) (local.get $n)))
        (f32.store (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 2)))
                   (f32.convert_i32_u (local.get $i)))
        (f32.store (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2)))
                   (f32.convert_i32_u (i32.shl (local.get $i) (i32.const 1))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $fill)))
    (local.set $k (call $kernel (i32.const 128) (i32.const 10)))
    (if (i32.lt_s (local.get $k) (i32.const 0)) (then (return (local.get $k))))
    (call $record (i32.const 0) (i32.const 7) (local.get $bytes) (i64.extend_i32_u (local.get $a)))
    (call $record (i32.const 16) (i32.const 7) (local.get $bytes) (i64.extend_i32_u (local.get $b)))
    (call $record (i32.const 32) (i32.const 7) (local.get $bytes) (i64.extend_i32_u (local.get $out)))
    (call $record (i32.const 48) (i32.const 2) (i32.const 0) (i64.extend_i32_u (local.get $n)))
    (local.set $rc
      (call $launch (local.get $k)
        (i32.div_u (i32.add (local.get $n) (i32.const 255)) (i32.const 256)) (i32.const 1) (i32.const 1)
        (i32.const 256) (i32.const 1) (i32.const 1)
        (i32.const 0) (i32.const 0) (i32.const 64)))
    (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc))))
    (drop (call $sync))
    (local.set $i (i32.const 0))
    (block $checked
      (loop $check
        (br_if $checked (i32.ge_u (local.get $i) (local.get $n)))
        (if (f32.eq (f32.load (i32.add (local.get $out) (i32.shl (local.get $i) (i32.const 2))))
                    (f32.convert_i32_u (i32.mul (local.get $i) (i32.const 3))))
          (then (local.set $ok (i32.add (local.get $ok) (i32.const 1)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $check)))
    (local.get $ok))

  ;; Passes a buffer that reaches past the end of memory: the host must refuse
  ;; it before launch and return INVALID_ARGUMENT (-1).
  (func (export "out_of_bounds") (result i32)
    (local $k i32)
    (local.set $k (call $kernel (i32.const 128) (i32.const 10)))
    (call $record (i32.const 0) (i32.const 7) (i32.const 4096) (i64.const 1046528))
    (call $record (i32.const 16) (i32.const 7) (i32.const 4096) (i64.const 4096))
    (call $record (i32.const 32) (i32.const 7) (i32.const 4096) (i64.const 8192))
    (call $record (i32.const 48) (i32.const 2) (i32.const 0) (i64.const 1024))
    (call $launch (local.get $k) (i32.const 4) (i32.const 1) (i32.const 1)
      (i32.const 256) (i32.const 1) (i32.const 1) (i32.const 0) (i32.const 0) (i32.const 64))))
