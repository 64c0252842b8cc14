;; typed-component: a WASI 0.2 component with typed exports (the component text format),
;; called through POST /functions/{id}/invoke with JSON arguments converted by its WIT types.
;;
;;   add(a: s32, b: s32) -> s32
;;   distance(p: point { x: f64, y: f64 }) -> f64
;;   level(l: enum { low, high }) -> u32
;;   or-zero(v: option<u32>) -> u32
;;   length(s: string) -> u32                     (bytes of UTF-8)
;;   checked-div(a: s32, b: s32) -> result<s32, s32>  (err carries a)
;;   boom()                                       (traps)
;;   spin()                                       (never returns)
;;
;;   tensor-wasm deploy examples/typed-component.wat
;;   tensor-wasm invoke $ID --export distance --arg '{"x": 3, "y": 4}'   -> [5.0]
(component
  (core module $m
    (memory (export "memory") 1)
    (global $next (mut i32) (i32.const 1024))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $at i32)
      (local.set $at (global.get $next))
      (global.set $next (i32.add (global.get $next) (local.get 3)))
      (local.get $at))
    (func (export "add") (param i32 i32) (result i32)
      (i32.add (local.get 0) (local.get 1)))
    (func (export "distance") (param f64 f64) (result f64)
      (f64.sqrt (f64.add (f64.mul (local.get 0) (local.get 0))
                         (f64.mul (local.get 1) (local.get 1)))))
    (func (export "level") (param i32) (result i32) (local.get 0))
    (func (export "or-zero") (param i32 i32) (result i32)
      (select (local.get 1) (i32.const 0) (local.get 0)))
    (func (export "length") (param i32 i32) (result i32) (local.get 1))
    (func (export "checked-div") (param i32 i32) (result i32)
      (if (i32.eqz (local.get 1))
        (then
          (i32.store8 (i32.const 0) (i32.const 1))
          (i32.store (i32.const 4) (local.get 0)))
        (else
          (i32.store8 (i32.const 0) (i32.const 0))
          (i32.store (i32.const 4) (i32.div_s (local.get 0) (local.get 1)))))
      (i32.const 0))
    (func (export "boom") unreachable)
    (func (export "spin") (loop $forever (br $forever))))
  (core instance $i (instantiate $m))
  (alias core export $i "memory" (core memory $memory))
  (alias core export $i "realloc" (core func $realloc))

  (type $point-def (record (field "x" f64) (field "y" f64)))
  (export $point "point" (type $point-def))
  (type $level-def (enum "low" "high"))
  (export $level "level-kind" (type $level-def))

  (func (export "add") (param "a" s32) (param "b" s32) (result s32)
    (canon lift (core func $i "add")))
  (func (export "distance") (param "p" $point) (result f64)
    (canon lift (core func $i "distance")))
  (func (export "level") (param "l" $level) (result u32)
    (canon lift (core func $i "level")))
  (func (export "or-zero") (param "v" (option u32)) (result u32)
    (canon lift (core func $i "or-zero")))
  (func (export "length") (param "s" string) (result u32)
    (canon lift (core func $i "length") (memory $memory) (realloc $realloc)))
  (func (export "checked-div") (param "a" s32) (param "b" s32) (result (result s32 (error s32)))
    (canon lift (core func $i "checked-div") (memory $memory)))
  (func (export "boom") (canon lift (core func $i "boom")))
  (func (export "spin") (canon lift (core func $i "spin"))))
