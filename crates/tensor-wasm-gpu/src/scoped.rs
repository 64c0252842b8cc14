//! `launch`: the safe way to launch a kernel, with its completion scoped to a closure.

use crate::{Backend, Completion, GpuError, Kernel, KernelArg, LaunchConfig, TenantKey};

/// Validates and launches `kernel` on `backend` for `tenant` over the guest memory `memory`,
/// lends the launch's [`Completion`] to `wait`, and returns what `wait` returned once the kernel
/// has finished.
///
/// `tenant` picks the lane the kernel runs in on a CUDA backend (its stream, or its context, at
/// the [`GpuIsolation`](crate::GpuIsolation) level the key names or else the backend's); on the
/// CPU backend it picks the queue the launch waits in (tenants take turns for the workers).
///
/// `wait` gets `&mut Completion`: wait on it blocking with [`Completion::wait_mut`], or use it
/// as a future (`&mut Completion` is `Future + Unpin`), for example through a runtime's
/// `block_on` or a wrapper that holds a dispatch permit until it resolves. Whatever `wait` does,
/// and also when it panics, the completion is dropped before `launch` returns or unwinds, and
/// dropping it blocks until the kernel is done: when `launch` is over, no kernel touches
/// `memory` any more. The kernel's own outcome is only seen by waiting on the completion; the
/// outer `Result` reports a launch that did not happen.
///
/// Validation and the errors are those of [`Backend::launch_unscoped`].
///
/// # Errors
/// `InvalidArgument` for anything validation rejects (nothing is launched then, and `wait` is
/// not called); `NotAvailable` when the device cannot reach `memory`; `Cuda` for driver errors.
///
/// # Why this is safe
/// A launched kernel may read and write `memory` until it finishes, and only the completion
/// keeps `memory` borrowed until then (its drop blocks). The hazard is a completion that is
/// leaked (`std::mem::forget`, an `Rc` cycle): its borrow ends without waiting, which is why
/// [`Backend::launch_unscoped`], returning an owned completion, is unsafe. Here the completion
/// cannot be leaked:
/// - it is a local owned by this function, which drops it on every path out, normal return or
///   unwinding; it is never moved out of it;
/// - `wait` only gets `&mut Completion`, and moving a value out from behind a mutable reference
///   needs another value of the same type to leave in its place (`std::mem::replace`,
///   `std::mem::swap`); `Completion` has no public constructor and neither `Default` nor
///   `Clone`, so safe code never owns one to put there;
/// - `wait` must accept a completion of any lifetime `'c` (`for<'c>`), so it cannot swap in
///   another borrowed completion either (the one a nested `launch` lends has a different,
///   equally unnameable lifetime, and `&mut T` needs both sides of a swap to have exactly the
///   same type), nor return the reference or stash it anywhere that outlives the call (`R` is
///   chosen outside of `'c`);
/// - forgetting the `&mut Completion` itself (`std::mem::forget(completion)`) forgets only the
///   reference; the completion is still dropped here.
///
/// For example, the completion cannot be smuggled out of the closure:
///
/// ```compile_fail
/// use tensor_wasm_gpu::{launch, Backend, Completion, Kernel, LaunchConfig, TenantKey};
///
/// fn smuggle(backend: &dyn Backend, tenant: &TenantKey, kernel: &Kernel, memory: &mut [u8]) {
///     let mut stash: Option<&mut Completion<'_>> = None;
///     let config = LaunchConfig::linear(1, 1);
///     let _ = launch(backend, tenant, kernel, &config, &[], memory, |completion| {
///         stash = Some(completion);
///     });
/// }
/// ```
///
/// nor returned from it:
///
/// ```compile_fail
/// use tensor_wasm_gpu::{launch, Backend, Kernel, LaunchConfig, TenantKey};
///
/// fn smuggle(backend: &dyn Backend, tenant: &TenantKey, kernel: &Kernel, memory: &mut [u8]) {
///     let config = LaunchConfig::linear(1, 1);
///     let completion =
///         launch(backend, tenant, kernel, &config, &[], memory, |completion| completion);
///     drop(completion);
/// }
/// ```
///
/// nor exchanged with the one a nested launch lends:
///
/// ```compile_fail
/// use tensor_wasm_gpu::{launch, Backend, Kernel, LaunchConfig, TenantKey};
///
/// fn swap(
///     backend: &dyn Backend,
///     tenant: &TenantKey,
///     kernel: &Kernel,
///     outer: &mut [u8],
///     inner: &mut [u8],
/// ) {
///     let config = LaunchConfig::linear(1, 1);
///     let _ = launch(backend, tenant, kernel, &config, &[], outer, |first| {
///         launch(backend, tenant, kernel, &config, &[], inner, |second| {
///             std::mem::swap(first, second);
///         })
///     });
/// }
/// ```
///
/// # Example
///
/// ```
/// use tensor_wasm_gpu::{
///     launch, open_backend, BuiltinKernel, DeviceChoice, KernelArg, LaunchConfig, TenantKey,
/// };
///
/// # fn main() -> Result<(), tensor_wasm_gpu::GpuError> {
/// let backend = open_backend(DeviceChoice::Cpu)?;
/// let kernel = backend.load_builtin(BuiltinKernel::Scale)?;
/// // x = [1, 2] at byte 0, out at 8.
/// let mut memory = vec![0u8; 16];
/// memory[0..4].copy_from_slice(&1.0f32.to_le_bytes());
/// memory[4..8].copy_from_slice(&2.0f32.to_le_bytes());
/// let args = [
///     KernelArg::Buffer { offset: 0, len: 8 },
///     KernelArg::Buffer { offset: 8, len: 8 },
///     KernelArg::F32(3.0),
///     KernelArg::U32(2),
/// ];
/// let config = LaunchConfig::linear(2, 32);
/// launch(&*backend, &TenantKey::new("tn-1"), &kernel, &config, &args, &mut memory, |c| {
///     c.wait_mut()
/// })??;
/// assert_eq!(memory[8..12], 3.0f32.to_le_bytes());
/// assert_eq!(memory[12..16], 6.0f32.to_le_bytes());
/// # Ok(())
/// # }
/// ```
pub fn launch<R>(
    backend: &dyn Backend,
    tenant: &TenantKey,
    kernel: &Kernel,
    config: &LaunchConfig,
    args: &[KernelArg],
    memory: &mut [u8],
    wait: impl for<'c> FnOnce(&mut Completion<'c>) -> R,
) -> Result<R, GpuError> {
    // SAFETY: `completion` is a local of this function and is never moved out of it: `wait`
    // only gets a mutable reference, through which safe code cannot take it (no other
    // `Completion` exists for it to leave in its place; see "Why this is safe"), and it is
    // dropped below, or by unwinding if `wait` panics. Its drop blocks until the kernel has
    // finished, so it is never leaked and `memory` is not used again before then.
    let mut completion = unsafe { backend.launch_unscoped(tenant, kernel, config, args, memory) }?;
    let output = wait(&mut completion);
    // Blocks until the kernel is done with `memory` (a no-op when `wait` already waited).
    drop(completion);
    Ok(output)
}
