//! The memory plan: one arena per execution holding the constants, then every buffer at an
//! offset shared with buffers whose lifetimes do not overlap; and the run of a plan's
//! launches through a [`Launcher`].

use tensor_wasm_gpu::{KernelArg, LaunchConfig};
use tensor_wasm_jit::Blueprint;

use crate::graph::{ConstData, Graph, Source};
use crate::lower::{Arg, ConstBytes, Lowered, Slot};
use crate::{OnnxError, Result};

/// Alignment of every tensor in the arena (a GPU cache line pair; more than any kernel needs).
pub const ALIGN: usize = 256;

/// What runs the kernels: the CPU backend in tests and folding, the runtime's dispatcher
/// (deadline, fairness, the tenant's GPU lane) when serving.
pub trait Launcher {
    /// Runs `blueprint` with `config` and `args` over `memory` and waits for it.
    fn launch(
        &mut self,
        blueprint: &Blueprint,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &mut [u8],
    ) -> Result<()>;
}

/// One launch with its buffers placed.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacedLaunch {
    /// The kernel.
    pub blueprint: Blueprint,
    /// Its grid and block.
    pub config: LaunchConfig,
    /// Its arguments, buffers as arena ranges.
    pub args: Vec<KernelArg>,
    /// The graph node it computes.
    pub node: usize,
}

/// A tensor in the arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// Byte offset in the arena.
    pub offset: usize,
    /// Its dimensions.
    pub dims: Vec<usize>,
}

impl Placed {
    /// Its size in bytes (4 per element).
    pub fn bytes(&self) -> usize {
        4 * self.dims.iter().product::<usize>()
    }
}

/// The graph ready to run for one set of input shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Constants: arena offset and bytes source, written once per arena.
    consts: Vec<(usize, ConstBytes)>,
    /// Bytes the constants take at the start of the arena.
    pub const_bytes: usize,
    /// Bytes of the whole arena.
    pub arena_bytes: usize,
    /// The launches in order.
    pub launches: Vec<PlacedLaunch>,
    /// Where each graph input goes.
    pub inputs: Vec<Placed>,
    /// Where each graph output is after a run.
    pub outputs: Vec<Placed>,
}

fn align(v: usize) -> Option<usize> {
    v.checked_add(ALIGN - 1).map(|v| v / ALIGN * ALIGN)
}

impl Plan {
    /// Places `lowered`: constants first, then buffers by size, each at the lowest offset
    /// that no buffer alive at the same time uses. `max_bytes` bounds the arena.
    pub fn place(graph: &Graph, lowered: Lowered, max_bytes: usize) -> Result<Plan> {
        let too_large = || {
            OnnxError::too_large(format!(
                "the model needs more than {max_bytes} bytes of memory for these shapes"
            ))
        };
        let mut at = 0usize;
        let mut const_offsets = Vec::with_capacity(lowered.consts.len());
        for c in &lowered.consts {
            const_offsets.push(at);
            let len = const_len(graph, c);
            at = align(at.checked_add(len).ok_or_else(too_large)?).ok_or_else(too_large)?;
        }
        let const_bytes = at;
        // Greedy by size: the largest buffers first, each at the lowest free offset among
        // the buffers placed so far whose lifetimes overlap its own.
        let mut order: Vec<usize> = (0..lowered.buffers.len()).collect();
        order.sort_by_key(|&b| std::cmp::Reverse(lowered.buffers[b].bytes));
        let mut offsets = vec![0usize; lowered.buffers.len()];
        let mut placed: Vec<(usize, usize, usize)> = Vec::new(); // (offset, end, buffer)
        let mut peak = 0usize;
        for &b in &order {
            let use_ = lowered.buffers[b];
            let size = align(use_.bytes.max(1)).ok_or_else(too_large)?;
            let mut busy: Vec<(usize, usize)> = placed
                .iter()
                .filter(|&&(_, _, o)| {
                    let other = lowered.buffers[o];
                    other.first <= use_.last && use_.first <= other.last
                })
                .map(|&(s, e, _)| (s, e))
                .collect();
            busy.sort_unstable();
            let mut offset = 0usize;
            for (s, e) in busy {
                if offset.checked_add(size).ok_or_else(too_large)? <= s {
                    break;
                }
                offset = offset.max(e);
            }
            let end = offset.checked_add(size).ok_or_else(too_large)?;
            placed.push((offset, end, b));
            offsets[b] = offset;
            peak = peak.max(end);
        }
        let arena_bytes = const_bytes.checked_add(peak).ok_or_else(too_large)?;
        if arena_bytes > max_bytes {
            return Err(too_large());
        }
        let offset_of = |slot: Slot| match slot {
            Slot::Const(c) => const_offsets[c],
            Slot::Buffer(b) => const_bytes + offsets[b],
        };
        let launches = lowered
            .launches
            .into_iter()
            .map(|l| PlacedLaunch {
                args: l
                    .args
                    .iter()
                    .map(|a| match *a {
                        Arg::Tensor(slot, len) => KernelArg::Buffer {
                            offset: offset_of(slot) as u64,
                            len,
                        },
                        Arg::U32(v) => KernelArg::U32(v),
                        Arg::F32(v) => KernelArg::F32(v),
                    })
                    .collect(),
                blueprint: l.blueprint,
                config: l.config,
                node: l.node,
            })
            .collect();
        let place = |(slot, dims): (Slot, Vec<usize>)| Placed {
            offset: offset_of(slot),
            dims,
        };
        let inputs = lowered.inputs.into_iter().map(place).collect();
        let outputs = lowered.outputs.into_iter().map(place).collect();
        Ok(Plan {
            consts: const_offsets.into_iter().zip(lowered.consts).collect(),
            const_bytes,
            arena_bytes,
            launches,
            inputs,
            outputs,
        })
    }

    /// Writes the constants into `arena` (at least [`Plan::arena_bytes`] long).
    pub fn write_constants(&self, graph: &Graph, arena: &mut [u8]) {
        for (offset, c) in &self.consts {
            match c {
                ConstBytes::Owned(bytes) => {
                    arena[*offset..*offset + bytes.len()].copy_from_slice(bytes)
                }
                ConstBytes::Value(v) => {
                    if let Source::Constant(k) = &graph.values[*v].source {
                        if let ConstData::F32(values) = &k.data {
                            let out = &mut arena[*offset..*offset + 4 * values.len()];
                            for (o, v) in out.chunks_exact_mut(4).zip(values) {
                                o.copy_from_slice(&v.to_le_bytes());
                            }
                        }
                    }
                }
            }
        }
    }

    /// Runs every launch over `arena` (constants and inputs written).
    pub fn run(&self, launcher: &mut dyn Launcher, arena: &mut [u8]) -> Result<()> {
        for launch in &self.launches {
            launcher.launch(&launch.blueprint, &launch.config, &launch.args, arena)?;
        }
        Ok(())
    }
}

fn const_len(graph: &Graph, c: &ConstBytes) -> usize {
    match c {
        ConstBytes::Owned(bytes) => bytes.len(),
        ConstBytes::Value(v) => match &graph.values[*v].source {
            Source::Constant(k) => 4 * k.len(),
            _ => 0,
        },
    }
}
