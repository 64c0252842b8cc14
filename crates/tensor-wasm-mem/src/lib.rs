//! Guest linear memory for TensorWasm: memory that wasm code and GPU kernels share.
//!
//! A TensorWasm guest launches kernels that read and write its own linear
//! memory. This crate owns that memory. It is one of the places where `unsafe`
//! is allowed (with `tensor-wasm-gpu`, the one artifact-loading call in the
//! runtime's `engine.rs`, and the callers of the file mapping below;
//! docs/ARCHITECTURE.md, "Where `unsafe` lives"; the tidy test enforces the
//! list), and every block says why it is sound.
//!
//! * [`GuardedHostBuffer`]: one anonymous mapping, zero-filled and page-aligned,
//!   followed by a `PROT_NONE` guard region.
//! * [`ManagedBuffer`]: CUDA managed memory (`cuMemAllocManaged`), one address
//!   valid on the host and on the device, with prefetch and advice hooks.
//! * [`UnifiedBuffer`]: either of the two.
//! * [`TensorWasmMemoryCreator`] and [`TensorWasmLinearMemory`]: the
//!   [`wasmtime::MemoryCreator`] / [`wasmtime::LinearMemory`] pair that puts
//!   each instance's linear memory in such a buffer; [`configure_engine`] sets
//!   up a [`wasmtime::Config`] to use them. Behind the default `wasmtime`
//!   feature; crates that need only the buffers and file mappings (the
//!   snapshot formats) turn it off and do not compile wasmtime.
//! * [`map_file_private_fixed`]: maps a file range copy-on-write over memory of
//!   this crate (the lazy restore of snapshot images), and [`AnonymousPages`],
//!   a plain zeroed page-aligned buffer to map into. An `unsafe fn`: alignment,
//!   file length and the memory's owner are checked; the one thing left to the
//!   caller, its `# Safety` contract, is that the file is not truncated or
//!   rewritten while mapped (see its docs for why, and what happens otherwise).
//! * [`LargestRequestAllocator`]: a forwarding global allocator that lets tests
//!   bound the largest single allocation.
//!
//! # Why memories are allocated at their capacity up front
//!
//! Kernels receive raw pointers into guest memory. If `memory.grow` could move
//! the memory (as wasmtime does by default when a reservation runs out), a
//! kernel still in flight, or a pointer cached by the GPU layer, would point at
//! freed memory. So each memory is allocated once, at its *capacity*, and
//! growth only moves the wasm-visible size within it: the base never changes
//! and growing never allocates. Capacity is the smallest of
//!
//! 1. the module's declared maximum, if it has one;
//! 2. the calling thread's capacity hint, if one is set;
//! 3. the creator's `cap_bytes`,
//!
//! rounded down to whole wasm pages. A memory whose declared minimum does not
//! fit is refused, which wasmtime reports as an instantiation error; growth
//! past the capacity makes `memory.grow` return -1.
//!
//! Managed memory cannot have guard pages inside a `cuMemAllocManaged` block,
//! so [`configure_engine`] asks wasmtime for explicit bounds checks (no
//! reservation, no guard) and a memory that never moves. Under that
//! configuration a host-backed memory is also fully accessible up to its
//! capacity; under an engine that relies on guard pages instead, host-backed
//! memories keep the pages past the current size inaccessible and open them on
//! growth, so out-of-bounds accesses trap either way.
//!
//! # The capacity hint
//!
//! The function store knows how much memory a function needs better than a
//! module without a declared maximum says. [`with_capacity_hint`] sets a
//! thread-local hint for the duration of a closure; the creator reads it when
//! wasmtime asks for a memory, which for synchronous instantiation happens on
//! the calling thread. The hint only ever lowers the capacity.
//!
//! # Refusal before overcommit
//!
//! Oversubscribing managed memory does not fail cleanly: it can stall the whole
//! GPU, not just the process. [`ManagedBuffer::new`] therefore queries the
//! device's free memory (`cuMemGetInfo`) *before* allocating and refuses with
//! [`MemError::InsufficientDeviceMemory`] unless the request plus a safety
//! headroom fits ([`device_headroom`]: the larger of 256 MiB and 5 % of the
//! device's memory). The check and the allocation are serialised within the
//! process, and the block is zeroed on the device right away, so that its
//! pages are populated and count as used for the next check.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use tensor_wasm_mem::{configure_engine, with_capacity_hint, MemoryBacking, TensorWasmMemoryCreator};
//!
//! let creator = Arc::new(TensorWasmMemoryCreator::new(MemoryBacking::Host, 64 << 20));
//! let mut config = wasmtime::Config::new();
//! configure_engine(&mut config, Arc::clone(&creator));
//! let engine = wasmtime::Engine::new(&config)?;
//! let module = wasmtime::Module::new(
//!     &engine,
//!     r#"(module (memory (export "mem") 1) (data (i32.const 0) "hi"))"#,
//! )?;
//!
//! let mut store = wasmtime::Store::new(&engine, ());
//! // No declared maximum: the 1 MiB hint (16 pages) sets the capacity.
//! let instance = with_capacity_hint(1 << 20, || wasmtime::Instance::new(&mut store, &module, &[]))?;
//! let memory = instance.get_memory(&mut store, "mem").unwrap();
//! assert_eq!(&memory.data(&store)[..2], b"hi");
//! let base = memory.data_ptr(&store);
//! memory.grow(&mut store, 15)?;
//! assert_eq!(memory.data_ptr(&store), base, "growth never moves the memory");
//! assert!(memory.grow(&mut store, 1).is_err(), "capacity reached");
//!
//! assert_eq!(creator.live_memories(), 1);
//! drop(store);
//! assert_eq!(creator.live_memories(), 0);
//! # Ok::<(), wasmtime::Error>(())
//! ```
#![allow(unsafe_code)]

#[cfg(feature = "wasmtime")]
mod creator;
mod error;
mod file_map;
mod host;
mod largest_request;
mod managed;
mod unified;

#[cfg(feature = "wasmtime")]
pub use creator::{
    configure_engine, current_capacity_hint, with_capacity_hint, MemoryBacking,
    TensorWasmLinearMemory, TensorWasmMemoryCreator,
};
pub use error::MemError;
pub use file_map::{map_file_private_fixed, AnonymousPages, FileView};
pub use host::{host_page_size, round_up_to_page, GuardedHostBuffer};
pub use largest_request::LargestRequestAllocator;
pub use managed::{
    check_device_headroom, device_headroom, ManagedBuffer, DEVICE_HEADROOM_PERCENT,
    MIN_DEVICE_HEADROOM_BYTES,
};
pub use unified::UnifiedBuffer;
