//! `wasi:nn` for components (`sdk/wit/wasi-nn.wit`, the interface wasmtime-wasi-nn 48
//! serves, so components built against wasmtime's `wasi-nn` WIT link here unchanged), served
//! by our own host over [`NnHost`]: an error carries the executor's code and message
//! (`onnx_unsupported: node 3 (`LSTM`) ...`), the bytes of tensors the host keeps are charged
//! to the invocation's memory budget, and a deadline passed (or a saturated dispatcher) in
//! `compute` ends the invocation as a kernel launch does.

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../sdk/wit/wasi-nn.wit",
        world: "ml",
        imports: { default: trappable },
        with: {
            "wasi:nn/tensor.tensor": super::NnTensor,
            "wasi:nn/graph.graph": super::NnGraphHandle,
            "wasi:nn/inference.graph-execution-context": super::NnContextHandle,
            "wasi:nn/errors.error": super::NnError,
        },
    });
}

use bindings::wasi::nn::{errors, graph, inference, tensor};
use tensor_wasm_onnx::{ErrorCode, OnnxError, TensorIn};
use wasmtime::component::{HasSelf, Linker, Resource};

use super::Requested;
use crate::component::ComponentState;
use crate::guest_gpu::Failure;
use crate::invocation_state::DeadlineExceeded;

/// A tensor the component made or got back: held by the host, charged to its budget.
pub struct NnTensor {
    dims: Vec<u32>,
    ty: tensor::TensorType,
    data: Vec<u8>,
}

/// A loaded graph: its index in the invocation's [`super::NnHost`].
pub struct NnGraphHandle(u32);

/// An execution context: its index in the invocation's [`super::NnHost`].
pub struct NnContextHandle(u32);

/// A `wasi:nn` error: its code and the executor's message.
pub struct NnError {
    code: errors::ErrorCode,
    data: String,
}

type NnResult<T> = wasmtime::Result<Result<T, Resource<NnError>>>;

fn code_of(e: &OnnxError) -> errors::ErrorCode {
    match e.code {
        ErrorCode::Malformed | ErrorCode::InvalidGraph => errors::ErrorCode::InvalidEncoding,
        ErrorCode::Unsupported => errors::ErrorCode::UnsupportedOperation,
        ErrorCode::TooLarge => errors::ErrorCode::TooLarge,
        ErrorCode::InvalidInput => errors::ErrorCode::InvalidArgument,
        ErrorCode::Deadline => errors::ErrorCode::Timeout,
        ErrorCode::Kernel => errors::ErrorCode::RuntimeError,
    }
}

impl ComponentState {
    /// The invocation's `wasi-nn` state (every component store has one).
    fn nn(&mut self) -> wasmtime::Result<&mut super::NnHost> {
        self.nn
            .as_mut()
            .ok_or_else(|| wasmtime::Error::msg("this store has no wasi-nn state"))
    }

    /// `outcome` as a `wasi:nn` result: an error becomes an error resource, and a failure
    /// of the launch path (deadline, saturation) a trap.
    fn nn_result<T>(&mut self, outcome: Result<T, OnnxError>) -> NnResult<T> {
        match self.nn()?.failure.take() {
            Some(Failure::Deadline) => return Err(wasmtime::Error::new(DeadlineExceeded)),
            Some(Failure::Saturated(e)) => return Err(wasmtime::Error::new(e)),
            _ => {}
        }
        match outcome {
            Ok(v) => Ok(Ok(v)),
            Err(e) => {
                let error = NnError {
                    code: code_of(&e),
                    data: e.to_string(),
                };
                Ok(Err(self.table.push(error)?))
            }
        }
    }

    /// Keeps `tensor` for the component, its bytes charged to the budget.
    fn keep_tensor(&mut self, tensor: NnTensor) -> wasmtime::Result<Resource<NnTensor>> {
        self.budget.charge_host(
            tensor.data.len() + 4 * tensor.dims.len(),
            "a wasi-nn tensor",
        )?;
        Ok(self.table.push(tensor)?)
    }
}

impl tensor::Host for ComponentState {}

impl tensor::HostTensor for ComponentState {
    fn new(
        &mut self,
        dimensions: Vec<u32>,
        ty: tensor::TensorType,
        data: Vec<u8>,
    ) -> wasmtime::Result<Resource<NnTensor>> {
        self.keep_tensor(NnTensor {
            dims: dimensions,
            ty,
            data,
        })
    }

    fn dimensions(&mut self, t: Resource<NnTensor>) -> wasmtime::Result<Vec<u32>> {
        Ok(self.table.get(&t)?.dims.clone())
    }

    fn ty(&mut self, t: Resource<NnTensor>) -> wasmtime::Result<tensor::TensorType> {
        Ok(self.table.get(&t)?.ty)
    }

    fn data(&mut self, t: Resource<NnTensor>) -> wasmtime::Result<Vec<u8>> {
        let data = self.table.get(&t)?.data.clone();
        // The copy handed to the component is charged too (it becomes guest memory).
        self.budget
            .charge_host(data.len(), "a wasi-nn tensor's data")?;
        Ok(data)
    }

    fn drop(&mut self, t: Resource<NnTensor>) -> wasmtime::Result<()> {
        self.table.delete(t)?;
        Ok(())
    }
}

impl graph::Host for ComponentState {
    fn load(
        &mut self,
        builder: Vec<Vec<u8>>,
        encoding: graph::GraphEncoding,
        target: graph::ExecutionTarget,
    ) -> NnResult<Resource<NnGraphHandle>> {
        let outcome = match (encoding, builder.as_slice()) {
            (graph::GraphEncoding::Onnx, [bytes]) => {
                let target = match target {
                    graph::ExecutionTarget::Cpu => Requested::Cpu,
                    graph::ExecutionTarget::Gpu => Requested::Gpu,
                    graph::ExecutionTarget::Tpu => Requested::Tpu,
                };
                self.nn()?.load(bytes, target)
            }
            (graph::GraphEncoding::Onnx, builders) => Err(OnnxError::invalid_input(format!(
                "ONNX takes one graph builder (the model's bytes), not {}",
                builders.len()
            ))),
            (other, _) => Err(OnnxError::unsupported(format!(
                "graph encoding {other:?}: this host loads onnx only"
            ))),
        };
        match self.nn_result(outcome)? {
            Ok(index) => Ok(Ok(self.table.push(NnGraphHandle(index))?)),
            Err(e) => Ok(Err(e)),
        }
    }

    fn load_by_name(&mut self, name: String) -> NnResult<Resource<NnGraphHandle>> {
        let outcome = self.nn()?.load_by_name(&name);
        match self.nn_result(outcome)? {
            Ok(Some(index)) => Ok(Ok(self.table.push(NnGraphHandle(index))?)),
            Ok(None) => {
                let error = NnError {
                    code: errors::ErrorCode::NotFound,
                    data: format!(
                        "no model named `{name}`: neither the tenant's nor one the operator \
                         preloaded"
                    ),
                };
                Ok(Err(self.table.push(error)?))
            }
            Err(e) => Ok(Err(e)),
        }
    }
}

impl graph::HostGraph for ComponentState {
    fn init_execution_context(
        &mut self,
        g: Resource<NnGraphHandle>,
    ) -> NnResult<Resource<NnContextHandle>> {
        let index = self.table.get(&g)?.0;
        let outcome = self.nn()?.init_context(index);
        match self.nn_result(outcome)? {
            Ok(context) => Ok(Ok(self.table.push(NnContextHandle(context))?)),
            Err(e) => Ok(Err(e)),
        }
    }

    fn drop(&mut self, g: Resource<NnGraphHandle>) -> wasmtime::Result<()> {
        self.table.delete(g)?;
        Ok(())
    }
}

impl inference::Host for ComponentState {}

impl inference::HostGraphExecutionContext for ComponentState {
    fn compute(
        &mut self,
        c: Resource<NnContextHandle>,
        inputs: Vec<(String, Resource<NnTensor>)>,
    ) -> NnResult<Vec<(String, Resource<NnTensor>)>> {
        let context = self.table.get(&c)?.0;
        let mut given = Vec::with_capacity(inputs.len());
        for (name, t) in inputs {
            given.push((name, self.table.delete(t)?));
        }
        let outcome = self.run_context(context, &given);
        let outputs = match self.nn_result(outcome)? {
            Ok(outputs) => outputs,
            Err(e) => return Ok(Err(e)),
        };
        let mut named = Vec::with_capacity(outputs.len());
        for (name, tensor) in outputs {
            named.push((name, self.keep_tensor(tensor)?));
        }
        Ok(Ok(named))
    }

    fn drop(&mut self, c: Resource<NnContextHandle>) -> wasmtime::Result<()> {
        self.table.delete(c)?;
        Ok(())
    }
}

impl ComponentState {
    /// Sets `inputs` (by name) on execution context `context`, computes, and returns every
    /// output of the model by name.
    fn run_context(
        &mut self,
        context: u32,
        inputs: &[(String, NnTensor)],
    ) -> Result<Vec<(String, NnTensor)>, OnnxError> {
        use tensor_wasm_onnx::proto::data_type;
        let nn = self
            .nn
            .as_mut()
            .ok_or_else(|| OnnxError::kernel("no wasi-nn state"))?;
        let ctx = nn.context(context)?;
        let model = ctx.exec.model().clone();
        for (name, t) in inputs {
            let index = model
                .inputs()
                .iter()
                .position(|i| &i.name == name)
                .ok_or_else(|| {
                    OnnxError::invalid_input(format!("the model has no input named `{name}`"))
                })?;
            let data_type = match t.ty {
                tensor::TensorType::Fp32 => data_type::FLOAT,
                tensor::TensorType::I32 => data_type::INT32,
                tensor::TensorType::I64 => data_type::INT64,
                other => {
                    return Err(OnnxError::unsupported(format!(
                        "input `{name}` of type {other:?} (FP32, and I32/I64 indices, only)"
                    )))
                }
            };
            let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
            ctx.exec.set_input(
                index,
                TensorIn {
                    dims: &dims,
                    data_type,
                    data: &t.data,
                },
            )?;
        }
        nn.compute(context)?;
        let ctx = nn.context(context)?;
        let names: Vec<String> = model.output_names().iter().map(|s| s.to_string()).collect();
        let mut outputs = Vec::with_capacity(names.len());
        for (i, name) in names.into_iter().enumerate() {
            let (dims, bytes) = ctx.exec.output(i)?;
            let dims = dims
                .iter()
                .map(|&d| u32::try_from(d).map_err(|_| OnnxError::too_large("an output dimension")))
                .collect::<Result<Vec<u32>, OnnxError>>()?;
            outputs.push((
                name,
                NnTensor {
                    dims,
                    ty: tensor::TensorType::Fp32,
                    data: bytes.to_vec(),
                },
            ));
        }
        Ok(outputs)
    }
}

impl errors::Host for ComponentState {}

impl errors::HostError for ComponentState {
    fn code(&mut self, e: Resource<NnError>) -> wasmtime::Result<errors::ErrorCode> {
        Ok(self.table.get(&e)?.code)
    }

    fn data(&mut self, e: Resource<NnError>) -> wasmtime::Result<String> {
        Ok(self.table.get(&e)?.data.clone())
    }

    fn drop(&mut self, e: Resource<NnError>) -> wasmtime::Result<()> {
        self.table.delete(e)?;
        Ok(())
    }
}

/// Adds `wasi:nn` to a component linker.
pub(crate) fn add_to_linker(linker: &mut Linker<ComponentState>) -> wasmtime::Result<()> {
    bindings::Ml::add_to_linker::<_, HasSelf<ComponentState>>(linker, |state| state)
}
