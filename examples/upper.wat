;; upper: a WASI command that copies stdin to stdout in upper case (ASCII),
;; then writes "upper: done" to stderr and exits with status 0.
(module
  (import "wasi_snapshot_preview1" "fd_read"
    (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; Layout: iovec at 0 (buf ptr, len), count at 8, message at 16, buffer at 1024.
  (data (i32.const 16) "upper: done\n")

  (func $write (param $fd i32) (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 8))))

  (func (export "_start")
    (local $n i32)
    (local $i i32)
    (local $c i32)
    (block $eof
      (loop $chunk
        (i32.store (i32.const 0) (i32.const 1024))
        (i32.store (i32.const 4) (i32.const 4096))
        (br_if $eof (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
        (local.set $n (i32.load (i32.const 8)))
        (br_if $eof (i32.eqz (local.get $n)))
        (local.set $i (i32.const 0))
        (block $done
          (loop $byte
            (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
            (local.set $c (i32.load8_u (i32.add (i32.const 1024) (local.get $i))))
            (if (i32.and
                  (i32.ge_u (local.get $c) (i32.const 97))
                  (i32.le_u (local.get $c) (i32.const 122)))
              (then
                (i32.store8 (i32.add (i32.const 1024) (local.get $i))
                            (i32.sub (local.get $c) (i32.const 32)))))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $byte)))
        (call $write (i32.const 1) (i32.const 1024) (local.get $n))
        (br $chunk)))
    (call $write (i32.const 2) (i32.const 16) (i32.const 12))))
