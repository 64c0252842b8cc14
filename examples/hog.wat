;; hog: grows its memory one 64 KiB page at a time, forever. Invoking `grow`
;; must end in a memory_limit_exceeded error at the function's memory limit.
(module
  (memory 1)
  (func (export "grow") (result i32)
    (loop $more
      (drop (memory.grow (i32.const 1)))
      br $more)
    i32.const 0))
