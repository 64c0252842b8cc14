//! `wasi_ephemeral_nn` for core modules: the ABI of the `wasi-nn` witx (the one wasmtime's
//! and WasmEdge's core-module guests import), served by our own host functions over
//! [`NnHost`].
//!
//! Every function returns an `nn_errno` (0 on success) and writes its result through a
//! pointer the guest passes last. Every pointer and length the guest passes is checked
//! against its linear memory: a bad one is `invalid_argument`, never a trap or a panic.
//! Model bytes are read in place from guest memory; tensor data is copied once into the
//! execution context. A deadline passed or a saturated dispatcher during `compute` ends the
//! invocation (as a kernel launch of `wasi:cuda` does).

use wasmtime::{Caller, Extern, Linker};

use super::{NnHost, Requested};
use crate::guest_gpu::Failure;
use crate::invocation_state::{DeadlineExceeded, InvocationState};
use tensor_wasm_onnx::{ErrorCode, OnnxError, TensorIn};

/// The import module.
pub(crate) const MODULE: &str = "wasi_ephemeral_nn";

/// Our extension for core modules: the message of the last refused call
/// (`last_error(ptr, len) -> bytes written`), which an `nn_errno` cannot carry.
pub(crate) const ERROR_MODULE: &str = "tensor_wasm_nn";

/// `nn_errno` values of the witx.
pub(crate) mod errno {
    pub const SUCCESS: i32 = 0;
    pub const INVALID_ARGUMENT: i32 = 1;
    pub const INVALID_ENCODING: i32 = 2;
    pub const MISSING_MEMORY: i32 = 3;
    pub const RUNTIME_ERROR: i32 = 5;
    pub const UNSUPPORTED_OPERATION: i32 = 6;
    pub const TOO_LARGE: i32 = 7;
    pub const NOT_FOUND: i32 = 8;
}

/// The witx `graph_encoding` of ONNX.
const ENCODING_ONNX: i32 = 1;

/// The witx `tensor_type` values this host takes: `f32` (1), `i32` (4), `i64` (5).
fn data_type_of(ty: i32) -> Option<i32> {
    use tensor_wasm_onnx::proto::data_type;
    match ty {
        1 => Some(data_type::FLOAT),
        4 => Some(data_type::INT32),
        5 => Some(data_type::INT64),
        _ => None,
    }
}

/// The `nn_errno` of an executor error.
pub(crate) fn errno_of(e: &OnnxError) -> i32 {
    match e.code {
        ErrorCode::Malformed | ErrorCode::InvalidGraph => errno::INVALID_ENCODING,
        ErrorCode::Unsupported => errno::UNSUPPORTED_OPERATION,
        ErrorCode::TooLarge => errno::TOO_LARGE,
        ErrorCode::InvalidInput => errno::INVALID_ARGUMENT,
        ErrorCode::Deadline | ErrorCode::Kernel => errno::RUNTIME_ERROR,
    }
}

/// A guest range, checked.
fn range(memory: &[u8], ptr: i32, len: u64) -> Result<std::ops::Range<usize>, OnnxError> {
    let start = ptr as u32 as usize;
    let end = usize::try_from(len)
        .ok()
        .and_then(|len| start.checked_add(len))
        .filter(|&end| end <= memory.len())
        .ok_or_else(|| {
            OnnxError::invalid_input(format!(
                "{len} bytes at {start} run past guest memory ({} bytes)",
                memory.len()
            ))
        })?;
    Ok(start..end)
}

fn read_u32(memory: &[u8], at: usize) -> Result<u32, OnnxError> {
    memory
        .get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| OnnxError::invalid_input(format!("a field at {at} is outside guest memory")))
}

fn write_u32(memory: &mut [u8], ptr: i32, value: u32) -> Result<(), OnnxError> {
    let r = range(memory, ptr, 4)?;
    memory[r].copy_from_slice(&value.to_le_bytes());
    Ok(())
}

/// Runs `f` with the guest's memory and the invocation's `wasi-nn` state; maps its error to
/// an errno (logged with its message, which the witx cannot carry), or to a trap for a
/// failure of the launch path.
fn with_nn(
    caller: &mut Caller<'_, InvocationState>,
    f: impl FnOnce(&mut [u8], &mut NnHost) -> Result<(), OnnxError>,
) -> wasmtime::Result<i32> {
    let Some(memory) = caller.get_export("memory").and_then(Extern::into_memory) else {
        return Ok(errno::MISSING_MEMORY);
    };
    let (bytes, state) = memory.data_and_store_mut(caller);
    let Some(nn) = state.nn.as_mut() else {
        return Ok(errno::RUNTIME_ERROR);
    };
    let outcome = f(bytes, nn);
    match nn.failure.take() {
        Some(Failure::Deadline) => return Err(wasmtime::Error::new(DeadlineExceeded)),
        Some(Failure::Saturated(e)) => return Err(wasmtime::Error::new(e)),
        _ => {}
    }
    match outcome {
        Ok(()) => Ok(errno::SUCCESS),
        Err(e) => {
            tracing::debug!(error = %e, "wasi-nn call refused");
            nn.last_error = e.to_string();
            Ok(errno_of(&e))
        }
    }
}

/// Adds `wasi_ephemeral_nn` to `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<InvocationState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        MODULE,
        "load",
        |mut caller: Caller<'_, InvocationState>,
         builders: i32,
         count: i32,
         encoding: i32,
         target: i32,
         graph_out: i32| {
            with_nn(&mut caller, |mem, nn| {
                if encoding != ENCODING_ONNX {
                    return Err(OnnxError::unsupported(format!(
                        "graph encoding {encoding}: this host loads ONNX (1) only"
                    )));
                }
                let target = match target {
                    0 => Requested::Cpu,
                    1 => Requested::Gpu,
                    2 => Requested::Tpu,
                    other => {
                        return Err(OnnxError::invalid_input(format!(
                            "execution target {other}"
                        )))
                    }
                };
                let list = range(mem, builders, 8 * u64::from(count as u32))?;
                if count != 1 {
                    return Err(OnnxError::invalid_input(format!(
                        "ONNX takes one graph builder (the model's bytes), not {count}"
                    )));
                }
                let ptr = read_u32(mem, list.start)?;
                let len = read_u32(mem, list.start + 4)?;
                let bytes = range(mem, ptr as i32, u64::from(len))?;
                let graph = nn.load(&mem[bytes], target)?;
                write_u32(mem, graph_out, graph)
            })
        },
    )?;
    linker.func_wrap(
        MODULE,
        "load_by_name",
        |mut caller: Caller<'_, InvocationState>, name: i32, len: i32, graph_out: i32| {
            let mut missing = false;
            let code = with_nn(&mut caller, |mem, nn| {
                let r = range(mem, name, u64::from(len as u32))?;
                range(mem, graph_out, 4)?;
                let name = std::str::from_utf8(&mem[r])
                    .map_err(|_| OnnxError::invalid_input("a model name is UTF-8"))?
                    .to_owned();
                match nn.load_by_name(&name)? {
                    Some(graph) => write_u32(mem, graph_out, graph),
                    None => {
                        missing = true;
                        Err(OnnxError::invalid_input(format!(
                            "no model named `{name}`: neither the tenant's nor one the \
                             operator preloaded"
                        )))
                    }
                }
            })?;
            Ok(if missing { errno::NOT_FOUND } else { code })
        },
    )?;
    linker.func_wrap(
        MODULE,
        "init_execution_context",
        |mut caller: Caller<'_, InvocationState>, graph: i32, context_out: i32| {
            with_nn(&mut caller, |mem, nn| {
                range(mem, context_out, 4)?;
                let context = nn.init_context(graph as u32)?;
                write_u32(mem, context_out, context)
            })
        },
    )?;
    linker.func_wrap(
        MODULE,
        "set_input",
        |mut caller: Caller<'_, InvocationState>, context: i32, index: i32, tensor: i32| {
            with_nn(&mut caller, |mem, nn| {
                // The witx `tensor` record: dimensions (pointer, count of u32), the type (one
                // byte, padded), data (pointer, length).
                let t = range(mem, tensor, 20)?;
                let dims_at = read_u32(mem, t.start)?;
                let dims_count = read_u32(mem, t.start + 4)?;
                let ty = i32::from(mem[t.start + 8]);
                let data_at = read_u32(mem, t.start + 12)?;
                let data_len = read_u32(mem, t.start + 16)?;
                if dims_count > 8 {
                    return Err(OnnxError::invalid_input(format!(
                        "a tensor of {dims_count} dimensions (at most 8)"
                    )));
                }
                let d = range(mem, dims_at as i32, 4 * u64::from(dims_count))?;
                let dims: Vec<usize> = mem[d]
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                    .collect();
                let data_type = data_type_of(ty).ok_or_else(|| {
                    OnnxError::unsupported(format!(
                        "tensor type {ty} (f32, and i32/i64 indices, only)"
                    ))
                })?;
                let data = range(mem, data_at as i32, u64::from(data_len))?;
                let context = nn.context(context as u32)?;
                context.exec.set_input(
                    index as u32 as usize,
                    TensorIn {
                        dims: &dims,
                        data_type,
                        data: &mem[data],
                    },
                )
            })
        },
    )?;
    linker.func_wrap(
        MODULE,
        "compute",
        |mut caller: Caller<'_, InvocationState>, context: i32| {
            with_nn(&mut caller, |_, nn| nn.compute(context as u32))
        },
    )?;
    linker.func_wrap(
        MODULE,
        "get_output",
        |mut caller: Caller<'_, InvocationState>,
         context: i32,
         index: i32,
         out: i32,
         max: i32,
         written_out: i32| {
            with_nn(&mut caller, |mem, nn| {
                let r = range(mem, out, u64::from(max as u32))?;
                range(mem, written_out, 4)?;
                let context = nn.context(context as u32)?;
                let (_, bytes) = context.exec.output(index as u32 as usize)?;
                if bytes.len() > r.len() {
                    return Err(OnnxError::too_large(format!(
                        "output {index} has {} bytes; the buffer holds {}",
                        bytes.len(),
                        r.len()
                    )));
                }
                let n = bytes.len();
                mem[r.start..r.start + n].copy_from_slice(bytes);
                write_u32(mem, written_out, n as u32)
            })
        },
    )?;
    linker.func_wrap(
        ERROR_MODULE,
        "last_error",
        |mut caller: Caller<'_, InvocationState>, ptr: i32, len: i32| -> wasmtime::Result<i32> {
            let Some(memory) = caller.get_export("memory").and_then(Extern::into_memory) else {
                return Ok(-1);
            };
            let (mem, state) = memory.data_and_store_mut(&mut caller);
            let Some(nn) = state.nn.as_ref() else {
                return Ok(-1);
            };
            let Ok(r) = range(mem, ptr, u64::from(len as u32)) else {
                return Ok(-1);
            };
            let message = nn.last_error.as_bytes();
            let n = message.len().min(r.len());
            mem[r.start..r.start + n].copy_from_slice(&message[..n]);
            Ok(n as i32)
        },
    )?;
    Ok(())
}
