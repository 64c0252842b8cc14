;; calc: an export-call function. Each export is called with JSON arguments:
;;   {"export": "add", "args": [1, 2]}  ->  {"results": [3]}
(module
  (memory (export "memory") 1)
  (global $calls (mut i32) (i32.const 0))

  ;; i32 addition.
  (func (export "add") (param i32 i32) (result i32)
    local.get 0
    local.get 1
    i32.add)

  ;; i64 multiplication (pass large values as decimal strings).
  (func (export "mul64") (param i64 i64) (result i64)
    local.get 0
    local.get 1
    i64.mul)

  ;; Hypotenuse in f64.
  (func (export "hypot") (param f64 f64) (result f64)
    local.get 0
    local.get 0
    f64.mul
    local.get 1
    local.get 1
    f64.mul
    f64.add
    f64.sqrt)

  ;; Signed division: traps with "integer divide by zero" when the divisor is 0.
  (func (export "div") (param i32 i32) (result i32)
    local.get 0
    local.get 1
    i32.div_s)

  ;; Bumps a global and a memory cell and returns both: every invocation gets
  ;; a fresh instance, so the answer is always (1, 1).
  (func (export "bump") (result i32 i32)
    global.get $calls
    i32.const 1
    i32.add
    global.set $calls
    i32.const 0
    i32.const 0
    i32.load
    i32.const 1
    i32.add
    i32.store
    global.get $calls
    i32.const 0
    i32.load))
