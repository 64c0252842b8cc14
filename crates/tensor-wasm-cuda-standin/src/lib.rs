//! A stand-in CUDA driver for tests: a `libcuda.so` exporting the driver functions TensorWasm
//! calls through cudarc, with host memory as "managed memory" and the PTX interpreter
//! (`tensor-wasm-ptx-emu`) as the device. It is not a GPU and never claims to be one: the
//! device is named [`DEVICE_NAME`].
//!
//! cudarc opens the driver once per process by bare name through the normal loader search and
//! resolves each function with `dlsym` on first use, so a test puts this library where the
//! loader looks ([`install`] writes `libcuda.so` and `libcuda.so.1` links into a directory)
//! and runs the code under test as a child process with `LD_LIBRARY_PATH` set to it.
//!
//! What it does:
//! - one device, sm_90-class, with managed memory and concurrent managed access; pageable
//!   memory access is reported only with `TENSOR_WASM_STANDIN_PAGEABLE=1` (without it, the
//!   backend must prove guest memory is managed memory, which the stand-in can check);
//! - primary and own contexts, streams and events; a launch on a created stream runs on
//!   that stream's own thread, without the driver lock, while the host and other streams go
//!   on; events complete when the work queued before them has, and `cuStreamSynchronize`,
//!   `cuEventSynchronize`, `cuCtxSynchronize` and `cuMemFree` (of memory a launch uses)
//!   wait for it; a launch on the null stream runs at once, inside `cuLaunchKernel`;
//! - a 4-byte allocation advised to prefer the host (`cuMemAdvise`,
//!   `SET_PREFERRED_LOCATION` on the host: the CUDA backend's cancel words) is a launch's
//!   *live word*: the interpreter reads it atomically while the kernel runs, so a host store
//!   reaches a running kernel, as concurrent managed access does on a GPU;
//! - managed memory is page-aligned anonymous host memory; device pointers are host addresses;
//! - modules load from PTX text only (cubin and fatbin: `CUDA_ERROR_NOT_SUPPORTED`; a PTX
//!   `.version` newer than the driver loads, 9.0 for CUDA 13.0:
//!   `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`);
//! - `cuLaunchKernel` runs the interpreter over the managed allocations the kernel's pointer
//!   parameters point into: a fault (an access outside them, a race, ...) is reported, as on a
//!   GPU, by the next synchronization in that context and is sticky from then on; the
//!   interpreter's report goes to stderr.
//!
//! Environment (read on the first driver call):
//! - `TENSOR_WASM_STANDIN_FAULT=launch|event-record|sync`: a sticky `CUDA_ERROR_ILLEGAL_ADDRESS`
//!   caused by launch number `TENSOR_WASM_STANDIN_FAULT_AT` (1-based, default 1) of kernels whose
//!   name contains `TENSOR_WASM_STANDIN_FAULT_KERNEL` (default: any), reported by that launch,
//!   by the next `cuEventRecord`, or by the next synchronization of that context;
//! - `TENSOR_WASM_STANDIN_OOM=1`: every managed allocation fails with `CUDA_ERROR_OUT_OF_MEMORY`;
//!   `TENSOR_WASM_STANDIN_MEMORY_BYTES`: the device's memory size (default 16 GiB);
//! - `TENSOR_WASM_STANDIN_INVALID_PTX=1`: every module load fails with `CUDA_ERROR_INVALID_PTX`;
//! - `TENSOR_WASM_STANDIN_DRIVER_VERSION`: what `cuDriverGetVersion` reports (default 13000);
//!   PTX whose `.version` is newer than that driver loads is
//!   `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`;
//! - `TENSOR_WASM_STANDIN_SCHEDULE=in-order|reversed|<seed>`: the interpreter's thread order;
//! - `TENSOR_WASM_STANDIN_STEP_LIMIT`: most instructions one thread runs before its launch
//!   times out (`CUDA_ERROR_LAUNCH_TIMEOUT`; default 2^22);
//! - `TENSOR_WASM_STANDIN_TRACE=<file>`: one line per driver call appended to the file
//!   (`<function> <result code>`), so a test can read which calls ran.

mod config;
// The C ABI and the memory it hands out need raw pointers (out-parameters, mappings).
#[allow(unsafe_code)]
mod driver;
#[allow(unsafe_code)]
mod exports;
#[allow(unsafe_code)]
mod memory;
#[allow(unsafe_code)]
mod streams;

use std::io;
use std::path::{Path, PathBuf};

/// The device name the stand-in reports (`cuDeviceGetName`), so `tensor-wasm doctor` says
/// plainly what it runs on.
pub const DEVICE_NAME: &str = "TensorWasm stand-in driver (PTX interpreter; not a GPU)";

/// The file name cargo gives the stand-in's cdylib.
pub const LIBRARY_FILE: &str = "libtensor_wasm_cuda_standin.so";

/// The built stand-in library, looked up beside the running executable: cargo puts test and
/// binary executables in `target/<profile>/deps` or `target/<profile>`, and the cdylib of a
/// (dev-)dependency in `target/<profile>/deps`.
///
/// # Errors
/// `NotFound` when no built library is there (build this crate first).
pub fn library_path() -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent();
    for _ in 0..2 {
        let Some(here) = dir else { break };
        for candidate in [
            here.join(LIBRARY_FILE),
            here.join("deps").join(LIBRARY_FILE),
        ] {
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
        dir = here.parent();
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "{LIBRARY_FILE} not found near {}: build tensor-wasm-cuda-standin first",
            exe.display()
        ),
    ))
}

/// Makes `dir` a directory the loader finds the stand-in in: `libcuda.so` and `libcuda.so.1`
/// links to the built library. Put `dir` on `LD_LIBRARY_PATH` of a child process.
///
/// # Errors
/// The library is not built, or the links cannot be made.
pub fn install(dir: &Path) -> io::Result<()> {
    let library = library_path()?;
    for name in ["libcuda.so", "libcuda.so.1"] {
        let link = dir.join(name);
        if link.symlink_metadata().is_ok() {
            std::fs::remove_file(&link)?;
        }
        std::os::unix::fs::symlink(&library, &link)?;
    }
    Ok(())
}

/// Like [`install`], but the installed driver lacks the exported functions named in `missing`:
/// a copy of the library whose dynamic symbol table spells each of those names with its first
/// letter replaced by `X`, so the loader's
/// `dlsym` finds no function of that name (the names keep their length, the hash tables stay
/// as they were and only the string comparison fails). This is how a test meets a driver
/// older than the functions the backend calls, such as one without `cuGetErrorString`.
///
/// # Errors
/// The library is not built, is not a 64-bit ELF file, does not export one of `missing`, or
/// cannot be written.
pub fn install_without(dir: &Path, missing: &[&str]) -> io::Result<()> {
    let mut image = std::fs::read(library_path()?)?;
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let names =
        dynamic_string_table(&image).ok_or_else(|| invalid("not an ELF64 library".into()))?;
    for name in missing {
        let needle = format!("\0{name}\0");
        let at = image[names.clone()]
            .windows(needle.len())
            .position(|window| window == needle.as_bytes())
            .ok_or_else(|| invalid(format!("the stand-in does not export {name}")))?;
        image[names.start + at + 1] = b'X';
    }
    let library = dir.join("libcuda.so.1");
    std::fs::write(&library, &image)?;
    let link = dir.join("libcuda.so");
    if link.symlink_metadata().is_ok() {
        std::fs::remove_file(&link)?;
    }
    std::os::unix::fs::symlink(&library, &link)
}

/// The byte range of the string table of an ELF64 little-endian image's dynamic symbol table
/// (`.dynstr`: the section that the `SHT_DYNSYM` section links to).
fn dynamic_string_table(image: &[u8]) -> Option<std::ops::Range<usize>> {
    const SHT_DYNSYM: u32 = 11;
    let bytes = |at: usize, n: usize| image.get(at..at.checked_add(n)?);
    let u16_at = |at| Some(u16::from_le_bytes(bytes(at, 2)?.try_into().ok()?));
    let u32_at = |at| Some(u32::from_le_bytes(bytes(at, 4)?.try_into().ok()?));
    let u64_at = |at| usize::try_from(u64::from_le_bytes(bytes(at, 8)?.try_into().ok()?)).ok();
    if bytes(0, 6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let (table, entry, count) = (u64_at(0x28)?, usize::from(u16_at(0x3a)?), u16_at(0x3c)?);
    let header = |index: usize| table.checked_add(index.checked_mul(entry)?);
    let dynsym = (0..usize::from(count))
        .find(|&i| header(i).and_then(|at| u32_at(at + 4)) == Some(SHT_DYNSYM))?;
    let strings = header(usize::try_from(u32_at(header(dynsym)? + 0x28)?).ok()?)?;
    let (offset, size) = (u64_at(strings + 0x18)?, u64_at(strings + 0x20)?);
    bytes(offset, size)?;
    Some(offset..offset + size)
}
