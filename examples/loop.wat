;; loop: spins forever. Invoking `spin` must end in an invocation_timeout
;; error at the function's deadline, and the server keeps serving.
(module
  (func (export "spin")
    (loop $forever
      br $forever)))
