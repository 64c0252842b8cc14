//! The one launch path of the core ABI, components and `wasi-nn`:
//! [`GpuShared::launch_on`] (a dispatch permit, the deadline, the kernel's
//! trace span and its accounting).

use std::time::Instant;

use tensor_wasm_gpu::{GpuError, Kernel, LaunchConfig, TenantKey};

use crate::guest_gpu::{Failure, GpuShared};

impl GpuShared {
    /// Launches `kernel` for `tenant` on `memory` (buffer arguments are ranges of it), with a
    /// dispatch permit waited for until `deadline`, and waits for it to complete: the one
    /// launch path of the core ABI and of components' `tensor-wasm:gpu`. At the deadline the
    /// kernel is cancelled: a CPU kernel stops at its next slice; a CUDA kernel cannot be
    /// stopped and is waited for (the memory it uses stays the caller's until then; the API
    /// answers the client at the deadline meanwhile). The tenant is charged the kernel's time
    /// whatever the outcome.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_on(
        &self,
        tenant: &TenantKey,
        function: &str,
        deadline: Instant,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: &[tensor_wasm_gpu::KernelArg],
        memory: &mut [u8],
    ) -> Result<(), Failure> {
        self.launch_on_backend(
            &*self.backend,
            tenant,
            function,
            deadline,
            kernel,
            config,
            args,
            memory,
        )
    }

    /// [`GpuShared::launch_on`] on `backend` (a kernel it loaded): the `wasi-nn` `cpu`
    /// target runs on a CPU backend beside a CUDA host's, with the same dispatcher, deadline
    /// and kernel seconds.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_on_backend(
        &self,
        backend: &dyn tensor_wasm_gpu::Backend,
        tenant: &TenantKey,
        function: &str,
        deadline: Instant,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: &[tensor_wasm_gpu::KernelArg],
        memory: &mut [u8],
    ) -> Result<(), Failure> {
        let span = crate::trace::kernel_span(backend, tenant, kernel, config, args);
        let _entered = span.enter();
        let asked = Instant::now();
        let permit = self.dispatcher.acquire_blocking_until(deadline)?;
        let launched = Instant::now();
        let mut timer = None;
        let outcome = tensor_wasm_gpu::launch(
            backend,
            tenant,
            kernel,
            config,
            args,
            memory,
            |completion| {
                timer = Some(completion.kernel_time());
                self.dispatcher
                    .track(permit, completion)
                    .wait_until(deadline, |completion| completion.cancel())
            },
        )?;
        // The kernel has finished here (the launch waits for it, past the deadline too).
        let ran = launched.elapsed();
        let device = if backend.device().is_cuda() {
            "cuda"
        } else {
            "cpu"
        };
        self.accounts
            .kernel(tenant.as_str(), function, device, timer.as_ref(), ran);
        self.accounts.moved(
            tenant.as_str(),
            function,
            crate::accounting::Moved::KernelArgs,
            crate::trace::buffer_bytes(args),
        );
        crate::trace::kernel_done(&span, launched - asked, ran, &outcome);
        match outcome {
            Err(GpuError::Cancelled(_)) => Err(Failure::Deadline),
            Err(e) => Err(e.into()),
            Ok(()) if Instant::now() >= deadline => Err(Failure::Deadline),
            Ok(()) => Ok(()),
        }
    }
}
