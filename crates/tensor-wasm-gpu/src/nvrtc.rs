//! CUDA C++ to PTX and cubin with NVRTC (`libnvrtc.so`), which needs no GPU.
//!
//! cudarc panics when the library is missing, so [`nvrtc_available`] probes for it first and
//! every NVRTC call runs under `catch_unwind` (an older library lacking a symbol also panics
//! inside cudarc).

use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::nvrtc::result::{self, NvrtcError};
use cudarc::nvrtc::sys;

use crate::GpuError;

/// The NVRTC library this crate is built against (cudarc's `cuda-13000`), as a file name.
const NVRTC_LIBRARY: &str = "libnvrtc.so.13";

/// Name given to every compiled program, as it appears in NVRTC's log.
const SOURCE_NAME: &std::ffi::CStr = c"tenant.cu";

/// CUDA C++ compiled by [`compile_cuda`] for one GPU architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaBinary {
    /// PTX text (NVRTC 13.0 writes PTX ISA 9.0, which CUDA 13.0 drivers load).
    pub ptx: String,
    /// The ELF cubin for exactly the `sm_XY` it was compiled for, ready for
    /// [`Backend::load_cubin`](crate::Backend::load_cubin).
    pub cubin: Vec<u8>,
    /// NVRTC's log: warnings, or empty.
    pub log: String,
}

/// Whether NVRTC can be used: `Ok` when the library loads, else why not.
///
/// cudarc looks the library up by bare name (`libnvrtc.so`, `libnvrtc.so.13`, ...), so its
/// directory must be on the dynamic loader's path (`LD_LIBRARY_PATH`, or a system directory).
///
/// # Errors
/// The reason, starting with "libnvrtc.so.13 not found" when no NVRTC library loads.
pub fn nvrtc_available() -> Result<(), String> {
    // SAFETY: `is_culib_present` only tries to dlopen the library by its usual names and closes
    // it again; it has no preconditions.
    if unsafe { sys::is_culib_present() } {
        return Ok(());
    }
    let mut names = cudarc::get_lib_name_candidates("nvrtc");
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| seen.insert(name.clone()));
    Err(format!(
        "{NVRTC_LIBRARY} not found: no NVRTC library loads by any of the names {names:?}; \
         install NVRTC 13.0 (the PyPI wheel nvidia-cuda-nvrtc==13.0.88, which \
         `scripts/install-deps.sh` puts under .tools/nvrtc/nvidia/cu13/lib, or a CUDA 13.0 \
         toolkit) and put its directory on LD_LIBRARY_PATH"
    ))
}

/// The version of the NVRTC library that loads, as (major, minor).
///
/// # Errors
/// `NotAvailable` when NVRTC cannot be loaded.
pub fn nvrtc_version() -> Result<(u32, u32), GpuError> {
    nvrtc_available().map_err(GpuError::NotAvailable)?;
    catching_nvrtc_panics(|| {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: both are valid places for the one int each that NVRTC writes.
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|error| nvrtc_error("nvrtcVersion", error))?;
        let to_u32 = |value: i32| u32::try_from(value).unwrap_or(0);
        Ok((to_u32(major), to_u32(minor)))
    })
}

/// Compiles the CUDA C++ `source` for the GPU architecture `arch` (compute capability, e.g.
/// `(9, 0)` for `sm_90`) into PTX and cubin, with `--gpu-architecture=sm_XY`. No GPU is needed.
///
/// The kernel `entry` must be declared `extern "C" __global__` so that its name is not mangled;
/// the compiled PTX must contain `.entry <entry>`. The source may include only what NVRTC
/// provides built in (no host headers).
///
/// Tenant CUDA C++ is tenant code like tenant PTX: loaded with
/// [`Backend::load_cubin`](crate::Backend::load_cubin) or
/// [`Backend::load_ptx`](crate::Backend::load_ptx), its launches get argument count and size
/// checks only; letting a tenant run it is a trust decision of the caller.
///
/// # Errors
/// - `InvalidArgument`: an entry that is not a C identifier, a source with NUL bytes, an
///   architecture that is not `sm_XY` with `X` in 1..=99 and `Y` in 0..=9, or options NVRTC
///   rejects (an architecture it does not know), with its log;
/// - `Compile { log }`: the source does not compile (NVRTC's log says why), or the compiled code
///   has no kernel named `entry`;
/// - `NotAvailable("libnvrtc.so.13 not found: ...")` when the NVRTC library cannot be loaded
///   (or NVRTC cannot load its builtins library);
/// - `Cuda` for any other NVRTC failure.
///
/// # Example
///
/// ```no_run
/// use tensor_wasm_gpu::{compile_cuda, open_backend, DeviceChoice, TenantKey};
///
/// # fn main() -> Result<(), tensor_wasm_gpu::GpuError> {
/// let source = r#"
///     extern "C" __global__ void negate(const float* x, float* out, unsigned int n) {
///         unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
///         if (i < n) out[i] = -x[i];
///     }
/// "#;
/// let binary = compile_cuda(source, "negate", (9, 0))?;
/// assert!(binary.ptx.contains(".entry negate("));
/// let backend = open_backend(DeviceChoice::Cuda)?;
/// let kernel = backend.load_cubin(&TenantKey::new("tn-1"), &binary.cubin, "negate")?;
/// # let _ = kernel;
/// # Ok(())
/// # }
/// ```
pub fn compile_cuda(source: &str, entry: &str, arch: (u32, u32)) -> Result<CudaBinary, GpuError> {
    let is_identifier = entry
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && entry.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !is_identifier {
        return Err(GpuError::InvalidArgument(format!(
            "kernel entry {entry:?} is not a C identifier (declare the kernel \
             `extern \"C\" __global__` and name it here)"
        )));
    }
    let (major, minor) = arch;
    if !(1..=99).contains(&major) || minor > 9 {
        return Err(GpuError::InvalidArgument(format!(
            "GPU architecture {major}.{minor} cannot be written sm_XY"
        )));
    }
    let source = CString::new(source).map_err(|_| {
        GpuError::InvalidArgument(String::from("CUDA C++ source contains a NUL byte"))
    })?;
    nvrtc_available().map_err(GpuError::NotAvailable)?;
    let options = [format!("--gpu-architecture=sm_{major}{minor}")];
    catching_nvrtc_panics(|| compile(&source, entry, &options))
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the handle came from `create_program` and is destroyed only here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn compile(source: &CString, entry: &str, options: &[String]) -> Result<CudaBinary, GpuError> {
    let program = Program(
        result::create_program(source, Some(SOURCE_NAME))
            .map_err(|error| nvrtc_error("nvrtcCreateProgram", error))?,
    );
    // SAFETY: `program.0` is a live program from `create_program`, destroyed only when
    // `program` drops after every NVRTC call here; `source` outlives it.
    let compiled = unsafe { result::compile_program(program.0, options) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(program.0) }
        .map(|log| text(&log))
        .map_err(|error| nvrtc_error("nvrtcGetProgramLog", error))?;
    match compiled {
        Ok(()) => {}
        Err(NvrtcError(sys::nvrtcResult::NVRTC_ERROR_COMPILATION)) => {
            return Err(GpuError::Compile { log })
        }
        Err(NvrtcError(sys::nvrtcResult::NVRTC_ERROR_INVALID_OPTION)) => {
            return Err(GpuError::InvalidArgument(format!(
                "NVRTC rejected the options {options:?} (an architecture it does not know?): \
                 {log}"
            )))
        }
        Err(NvrtcError(sys::nvrtcResult::NVRTC_ERROR_BUILTIN_OPERATION_FAILURE)) => {
            return Err(GpuError::NotAvailable(format!(
                "NVRTC cannot load its builtins library (libnvrtc-builtins.so.13.*, which must \
                 be on the library path beside {NVRTC_LIBRARY}): {log}"
            )))
        }
        Err(error) => return Err(nvrtc_error("nvrtcCompileProgram", error)),
    }
    // SAFETY: as above.
    let ptx = unsafe { result::get_ptx(program.0) }
        .map(|ptx| text(&ptx))
        .map_err(|error| nvrtc_error("nvrtcGetPTX", error))?;
    let cubin = cubin(&program)?;
    if !has_entry(&ptx, entry) {
        let mut log = log;
        if !log.is_empty() && !log.ends_with('\n') {
            log.push('\n');
        }
        log.push_str(&format!(
            "no kernel entry `{entry}` in the compiled code: declare it `extern \"C\" \
             __global__ void {entry}(...)` (without extern \"C\" its name is mangled)"
        ));
        return Err(GpuError::Compile { log });
    }
    Ok(CudaBinary { ptx, cubin, log })
}

/// The cubin of a compiled program (compiled for a real `sm_XY`).
fn cubin(program: &Program) -> Result<Vec<u8>, GpuError> {
    let mut size = 0usize;
    // SAFETY: `program.0` is live and compiled; `size` is a valid place for the size NVRTC
    // writes.
    unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) }
        .result()
        .map_err(|error| nvrtc_error("nvrtcGetCUBINSize", error))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has room for the `size` bytes NVRTC said it writes.
    unsafe { sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast::<c_char>()) }
        .result()
        .map_err(|error| nvrtc_error("nvrtcGetCUBIN", error))?;
    Ok(cubin)
}

/// Whether `ptx` declares the kernel `entry` (`.entry entry(`, any spacing before the `(`).
fn has_entry(ptx: &str, entry: &str) -> bool {
    ptx.match_indices(".entry").any(|(at, keyword)| {
        let rest = ptx[at + keyword.len()..].trim_start();
        rest.strip_prefix(entry)
            .is_some_and(|after| after.trim_start().starts_with('('))
    })
}

/// NUL-terminated text from NVRTC as a `String`.
fn text(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn nvrtc_error(call: &str, error: NvrtcError) -> GpuError {
    GpuError::Cuda(format!("{:?} from {call}", error.0))
}

/// Runs NVRTC calls, turning a panic inside cudarc (a symbol the installed library lacks) into
/// an error.
fn catching_nvrtc_panics<T>(calls: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    catch_unwind(AssertUnwindSafe(calls)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("unknown panic");
        Err(GpuError::NotAvailable(format!(
            "the NVRTC library is unusable: {message}"
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_found_by_exact_name() {
        let ptx = ".visible .entry negate(\n\t.param .u64 p\n)\n.visible .entry negate_all (\n";
        assert!(has_entry(ptx, "negate"));
        assert!(has_entry(ptx, "negate_all"));
        assert!(!has_entry(ptx, "neg"));
        assert!(!has_entry(ptx, "negate_"));
        assert!(!has_entry(".visible .func negate(", "negate"));
    }

    #[test]
    fn bad_inputs_are_refused_before_nvrtc_is_needed() {
        for entry in ["", "1abc", "a-b", "ns::k", "k(", "é"] {
            let error = compile_cuda("", entry, (8, 0)).unwrap_err();
            assert!(
                matches!(&error, GpuError::InvalidArgument(m) if m.contains("not a C identifier")),
                "{entry:?}: {error:?}"
            );
        }
        for arch in [(0, 0), (100, 0), (9, 10)] {
            let error = compile_cuda("", "k", arch).unwrap_err();
            assert!(
                matches!(&error, GpuError::InvalidArgument(m) if m.contains("sm_XY")),
                "{arch:?}: {error:?}"
            );
        }
        let error = compile_cuda("a\0b", "k", (8, 0)).unwrap_err();
        assert!(
            matches!(&error, GpuError::InvalidArgument(m) if m.contains("NUL")),
            "{error:?}"
        );
    }

    #[test]
    fn text_stops_at_the_nul() {
        let chars: Vec<c_char> = b"ok\0junk".iter().map(|&b| b as c_char).collect();
        assert_eq!(text(&chars), "ok");
        assert_eq!(text(&[]), "");
    }
}
