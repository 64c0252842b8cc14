//! ONNX graphs on TensorWasm's blueprint kernels.
//!
//! A model goes through these steps, each bounded:
//!
//! 1. [`proto`] decodes the ONNX protobuf (our own decoder: every length checked against the
//!    bytes, every count against [`proto::Limits`], a deadline);
//! 2. [`graph`] checks it into a graph: values defined once, nodes ordered (a cycle is
//!    refused), operators known ([`ops`]), float32 everywhere but indices, shapes and axes;
//! 3. [`fold`] computes the nodes whose inputs are all constants, once, on the CPU backend;
//! 4. for each set of input shapes (a dynamic batch dimension gives one per batch size),
//!    [`lower`] infers shapes and turns every node into blueprint launches (element-wise
//!    chains fused into one `chain[..]` launch), and [`plan`]
//!    places the tensors in one arena, reusing the memory of tensors no longer needed;
//! 5. [`Execution`] writes the inputs into an arena, runs the launches through a
//!    [`Launcher`] and reads the outputs back.
//!
//! Every operation runs as a blueprint kernel, so a model gives the same bytes on the CPU
//! backend and on a GPU. Errors carry a stable [`ErrorCode`].

pub mod error;
pub mod fold;
pub mod graph;
pub mod launcher;
pub mod lower;
pub mod ops;
pub mod plan;
pub mod proto;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

pub use error::{ErrorCode, OnnxError, Result};
pub use graph::{Elem, Graph, Input, InputDim};
pub use launcher::BackendLauncher;
pub use plan::{Launcher, Plan};

/// Bounds on loading and running a model.
#[derive(Debug, Clone)]
pub struct Options {
    /// Bounds on the decoder (model size, counts, the parse deadline).
    pub limits: proto::Limits,
    /// Largest arena (weights, inputs, activations) one execution may use.
    pub max_arena_bytes: usize,
    /// Plans (one per set of input shapes) kept per model.
    pub max_plans: usize,
    /// Whether element-wise chains run as one `chain[..]` launch (the same bits; off only to
    /// compare).
    pub fuse: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            limits: proto::Limits::default(),
            max_arena_bytes: 1 << 30,
            max_plans: 8,
            fuse: true,
        }
    }
}

/// A cached plan and the input shapes it is for.
type PlanEntry = (Vec<Vec<usize>>, Arc<Plan>);

/// A loaded model: checked, folded, ready to plan for input shapes.
#[derive(Debug)]
pub struct Model {
    graph: Graph,
    options: Options,
    /// Plans by input shapes, most recent last.
    plans: Mutex<Vec<PlanEntry>>,
    folded: usize,
}

impl Model {
    /// Decodes, checks and folds the ONNX model in `bytes`.
    pub fn load(bytes: &[u8], options: &Options) -> Result<Model> {
        let model = proto::decode_model(bytes, &options.limits)?;
        let mut graph = Graph::build(&model, options.limits.deadline)?;
        drop(model);
        let folded =
            fold::fold_batchnorm(&mut graph)? + fold::fold(&mut graph, options.max_arena_bytes)?;
        Ok(Model {
            graph,
            options: options.clone(),
            plans: Mutex::new(Vec::new()),
            folded,
        })
    }

    /// The checked graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Nodes computed at load time.
    pub fn folded_nodes(&self) -> usize {
        self.folded
    }

    /// The graph inputs.
    pub fn inputs(&self) -> &[Input] {
        &self.graph.inputs
    }

    /// The graph outputs' names.
    pub fn output_names(&self) -> Vec<&str> {
        self.graph
            .outputs
            .iter()
            .map(|&v| self.graph.values[v].name.as_str())
            .collect()
    }

    /// Bytes of the constants every execution's arena holds.
    pub fn constant_bytes(&self) -> usize {
        self.graph
            .values
            .iter()
            .filter_map(|v| match &v.source {
                graph::Source::Constant(c) => Some(4 * c.len()),
                _ => None,
            })
            .sum()
    }

    /// The plan for `shapes` (one per input), from the model's cache or made now.
    pub fn plan(&self, shapes: &[Vec<usize>], deadline: Option<Instant>) -> Result<Arc<Plan>> {
        for (input, shape) in self.graph.inputs.iter().zip(shapes) {
            if let Some(dims) = &input.dims {
                let fits = dims.len() == shape.len()
                    && dims.iter().zip(shape).all(|(d, &s)| match d {
                        InputDim::Fixed(f) => *f == s,
                        InputDim::Dynamic(_) => true,
                    });
                if !fits {
                    return Err(OnnxError::invalid_input(format!(
                        "input `{}` has shape {shape:?}; the model declares {}",
                        input.name,
                        describe_dims(dims)
                    )));
                }
            }
        }
        let mut plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = plans.iter().position(|(s, _)| s == shapes) {
            let entry = plans.remove(at);
            let plan = entry.1.clone();
            plans.push(entry);
            return Ok(plan);
        }
        drop(plans);
        let lowered = lower::Lower::run(&self.graph, shapes, deadline, self.options.fuse)?;
        let plan = Arc::new(Plan::place(
            &self.graph,
            lowered,
            self.options.max_arena_bytes,
        )?);
        let mut plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        if plans.len() >= self.options.max_plans.max(1) {
            plans.remove(0);
        }
        plans.push((shapes.to_vec(), plan.clone()));
        Ok(plan)
    }
}

fn describe_dims(dims: &[InputDim]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| match d {
            InputDim::Fixed(v) => v.to_string(),
            InputDim::Dynamic(p) if p.is_empty() => "?".to_owned(),
            InputDim::Dynamic(p) => p.clone(),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

/// An input tensor as a caller gives it: dimensions, element type and little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorIn<'a> {
    /// Dimensions.
    pub dims: &'a [usize],
    /// Element type: [`proto::data_type::FLOAT`], or INT64 / INT32 for index inputs.
    pub data_type: i32,
    /// The elements, little-endian.
    pub data: &'a [u8],
}

/// Memory one execution's tensors live in: host memory, or memory a GPU can reach.
pub trait Arena: Send {
    /// The whole arena.
    fn bytes(&mut self) -> &mut [u8];
}

impl Arena for Vec<u8> {
    fn bytes(&mut self) -> &mut [u8] {
        self
    }
}

/// One execution context: inputs set, then [`Execution::compute`], then outputs read.
pub struct Execution<A: Arena> {
    model: Arc<Model>,
    inputs: Vec<Option<(Vec<usize>, Vec<u8>)>>,
    /// The plan the arena is laid out for, and the arena (constants written).
    current: Option<(Arc<Plan>, A)>,
}

impl<A: Arena> Execution<A> {
    /// A context for `model`.
    pub fn new(model: Arc<Model>) -> Self {
        let inputs = vec![None; model.graph.inputs.len()];
        Execution {
            model,
            inputs,
            current: None,
        }
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Sets input `index` (float32, or int64/int32 for an index input, which is narrowed to
    /// i32 here: a value outside i32 is refused).
    pub fn set_input(&mut self, index: usize, tensor: TensorIn<'_>) -> Result<()> {
        let input = self.model.graph.inputs.get(index).ok_or_else(|| {
            OnnxError::invalid_input(format!(
                "input {index}: the model has {} inputs",
                self.model.graph.inputs.len()
            ))
        })?;
        let count = tensor
            .dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| OnnxError::too_large(format!("input `{}`", input.name)))?;
        let bytes = match (input.elem, tensor.data_type) {
            (Elem::F32, proto::data_type::FLOAT) => {
                check_len(&input.name, tensor.data, count, 4)?;
                tensor.data.to_vec()
            }
            (Elem::Index, proto::data_type::INT32) => {
                check_len(&input.name, tensor.data, count, 4)?;
                tensor.data.to_vec()
            }
            (Elem::Index, proto::data_type::INT64) => {
                check_len(&input.name, tensor.data, count, 8)?;
                let mut out = Vec::with_capacity(count * 4);
                for b in tensor.data.chunks_exact(8) {
                    let v = i64::from_le_bytes(b.try_into().expect("8 bytes"));
                    let v = i32::try_from(v).map_err(|_| {
                        OnnxError::invalid_input(format!(
                            "input `{}`: index {v} does not fit in int32",
                            input.name
                        ))
                    })?;
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out
            }
            (_, other) => {
                return Err(OnnxError::invalid_input(format!(
                    "input `{}` takes {}, not {}",
                    input.name,
                    proto::data_type::name(input.onnx_type),
                    proto::data_type::name(other)
                )))
            }
        };
        self.inputs[index] = Some((tensor.dims.to_vec(), bytes));
        Ok(())
    }

    /// Runs the model on the inputs set: plans for their shapes (cached per model), lays out
    /// an arena from `new_arena` when the plan changes, and runs every launch through
    /// `launcher`.
    pub fn compute(
        &mut self,
        launcher: &mut dyn Launcher,
        new_arena: &mut dyn FnMut(usize) -> Result<A>,
        deadline: Option<Instant>,
    ) -> Result<()> {
        let mut shapes = Vec::with_capacity(self.inputs.len());
        for (i, input) in self.inputs.iter().enumerate() {
            let (dims, _) = input.as_ref().ok_or_else(|| {
                OnnxError::invalid_input(format!(
                    "input {i} (`{}`) is not set",
                    self.model.graph.inputs[i].name
                ))
            })?;
            shapes.push(dims.clone());
        }
        let plan = self.model.plan(&shapes, deadline)?;
        let same = matches!(&self.current, Some((p, _)) if Arc::ptr_eq(p, &plan));
        if !same {
            self.current = None;
            let mut arena = new_arena(plan.arena_bytes)?;
            plan.write_constants(&self.model.graph, arena.bytes());
            self.current = Some((plan.clone(), arena));
        }
        let (plan, arena) = self.current.as_mut().expect("set above");
        let memory = arena.bytes();
        for (placed, input) in plan.inputs.iter().zip(&self.inputs) {
            let (_, bytes) = input.as_ref().expect("checked above");
            memory[placed.offset..placed.offset + bytes.len()].copy_from_slice(bytes);
        }
        plan.run(launcher, memory)
    }

    /// Output `index` of the last [`Execution::compute`]: its dimensions and bytes.
    pub fn output(&mut self, index: usize) -> Result<(Vec<usize>, &[u8])> {
        let Some((plan, arena)) = self.current.as_mut() else {
            return Err(OnnxError::invalid_input("no output: compute has not run"));
        };
        let placed = plan.outputs.get(index).ok_or_else(|| {
            OnnxError::invalid_input(format!(
                "output {index}: the model has {} outputs",
                plan.outputs.len()
            ))
        })?;
        let (offset, len) = (placed.offset, placed.bytes());
        Ok((placed.dims.clone(), &arena.bytes()[offset..offset + len]))
    }

    /// Bytes of the arena held now (0 before the first compute).
    pub fn arena_bytes(&self) -> usize {
        self.current.as_ref().map_or(0, |(p, _)| p.arena_bytes)
    }
}

fn check_len(name: &str, data: &[u8], count: usize, size: usize) -> Result<()> {
    if count.checked_mul(size) != Some(data.len()) {
        return Err(OnnxError::invalid_input(format!(
            "input `{name}`: {} bytes for {count} elements of {size} bytes",
            data.len()
        )));
    }
    Ok(())
}
