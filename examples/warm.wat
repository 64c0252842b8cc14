;; A function with expensive initialisation, for snapshots: `init` grows memory and
;; builds a 1 MiB lookup table (xorshift32), sets globals that are not exported and
;; overwrites a data segment. A snapshot taken after `init` lets every instance start
;; with the table built.
;;
;;   init        build the table (run once, by POST /functions/{id}/snapshots)
;;   lookup(i)   table[i], or -1 before init
;;   init_runs   how many times init ran in this instance's history
;;   tag         0x6d726177 ("warm") after init, 0x646c6f63 ("cold") before
;;   weight      1.5 after init, 0 before
;;   bump        increments a counter in memory and returns it
(module
  (memory (export "memory") 1 256)
  (global $init_runs (mut i32) (i32.const 0))
  (global $table_len (mut i32) (i32.const 0))
  (global $weight (mut f64) (f64.const 0))
  (data (i32.const 16) "cold")

  (func (export "init")
    (local $i i32)
    (local $x i32)
    (drop (memory.grow (i32.const 16)))
    (i32.store (i32.const 16) (i32.const 0x6d726177))
    (local.set $x (i32.const 2463534242))
    (loop $fill
      (local.set $x (i32.xor (local.get $x) (i32.shl (local.get $x) (i32.const 13))))
      (local.set $x (i32.xor (local.get $x) (i32.shr_u (local.get $x) (i32.const 17))))
      (local.set $x (i32.xor (local.get $x) (i32.shl (local.get $x) (i32.const 5))))
      (i32.store
        (i32.add (i32.const 65536) (i32.shl (local.get $i) (i32.const 2)))
        (local.get $x))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $fill (i32.lt_u (local.get $i) (i32.const 262144))))
    (global.set $table_len (i32.const 262144))
    (global.set $weight (f64.const 1.5))
    (global.set $init_runs (i32.add (global.get $init_runs) (i32.const 1))))

  (func (export "lookup") (param $i i32) (result i32)
    (if (result i32) (i32.lt_u (local.get $i) (global.get $table_len))
      (then (i32.load (i32.add (i32.const 65536) (i32.shl (local.get $i) (i32.const 2)))))
      (else (i32.const -1))))

  (func (export "init_runs") (result i32) (global.get $init_runs))
  (func (export "tag") (result i32) (i32.load (i32.const 16)))
  (func (export "weight") (result f64) (global.get $weight))

  (func (export "bump") (result i32)
    (i32.store (i32.const 32) (i32.add (i32.load (i32.const 32)) (i32.const 1)))
    (i32.load (i32.const 32))))
