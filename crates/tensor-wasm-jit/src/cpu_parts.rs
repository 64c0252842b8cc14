//! Blueprints on the CPU as parts that run on every core at once ([`CpuParts`]): each kind's
//! run (`crate::kinds::KindRun::parts`) splits its outputs into ranges computed in the PTX's
//! exact order per output — element-wise kinds by elements, row kinds by rows, matmul and
//! conv2d by output rows of a blocked, vectorised multiply ([`tensor_wasm_gpu::gemm`]); the
//! kind's module says how. What they share is here: [`Blueprint::cpu_parts`], the split into
//! ranges worth a core, and the check that no output overlaps an input.
//!
//! Parts need an output that overlaps no input: an element-wise kernel in place runs as one
//! [`crate::CpuRun`] instead (validation refuses aliasing for the rest; `disjoint` checks every
//! launch, and the CPU backend checks the parts once more).

use std::ops::Range;

use tensor_wasm_gpu::{CpuParts, GpuError, KernelArg, LaunchConfig};

use crate::cpu::Element;
use crate::{Blueprint, Dtype, JitError, Shape};

/// A step of a part's multiply: about this many multiply-adds (packings count one per value),
/// at least one packing or one column of register tiles: a few microseconds on an optimised
/// build, so that a small multiply is one step and the CPU backend, which reads the clock
/// after every step until its slice of time is up, does not read it for every column.
/// (Unit tests step one column at a time, to test resuming between them.)
pub(crate) const GEMM_STEP: usize = if cfg!(test) { 1 } else { 1 << 16 };

/// The work of one value that a simple operation streams through memory (an element-wise
/// operation, a pooling tap), in multiply-adds of a register tile: about what it takes, so
/// that such launches split as soon as the second core pays. A launch split into halves
/// keeps its halves' data on the same cores as the launches before and after it, whose
/// halves are the same (the launching thread takes the last part).
pub(crate) const STREAMED: usize = 16;

/// Fewer multiply-adds than this per part are not worth another core (unit tests split even
/// the smallest launches, to test the parts' edges).
const MIN_PART_WORK: usize = if cfg!(test) { 1 } else { 1 << 17 };

impl Blueprint {
    /// The CPU run of a launch as parts for up to `workers` cores, after
    /// [`Blueprint::validate_launch`]; `None` when the output overlaps an input (an element-wise
    /// kernel in place): that launch runs as one [`Blueprint::cpu_run`], whose order defines the
    /// result.
    ///
    /// # Errors
    /// Whatever `validate_launch` reports.
    pub fn cpu_parts(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory_len: usize,
        workers: usize,
    ) -> Result<Option<CpuParts>, JitError> {
        self.validate_launch(config, args, memory_len)?;
        let shape = self.launch_shape(args)?;
        Ok(match self.dtype() {
            Dtype::F32 => self.parts::<f32>(config, args, &shape, workers),
            Dtype::I32 => self.parts::<i32>(config, args, &shape, workers),
        })
    }

    fn parts<T: Element + Send>(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        shape: &Shape,
        workers: usize,
    ) -> Option<CpuParts> {
        self.plan::<T>(config, args, shape).ok()?.parts(workers)
    }
}

/// `rows` rows of `row_work` multiply-adds each, as at most `workers` ranges of whole rows, none
/// smaller than is worth a core.
pub(crate) fn split(rows: usize, row_work: usize, workers: usize) -> Vec<Range<usize>> {
    if rows == 0 {
        return Vec::new();
    }
    let worth = rows.saturating_mul(row_work.max(1)) / MIN_PART_WORK;
    let count = workers.min(worth).clamp(1, rows);
    let per = rows.div_ceil(count);
    (0..rows)
        .step_by(per)
        .map(|start| start..(start + per).min(rows))
        .collect()
}

/// `parts`, when no output overlaps an input (outputs are disjoint by construction).
pub(crate) fn disjoint(parts: CpuParts) -> Option<CpuParts> {
    let overlap = |x: &Range<usize>, y: &Range<usize>| x.start < y.end && y.start < x.end;
    let clear = parts.parts.iter().all(|(output, _)| {
        output.is_empty()
            || parts
                .inputs
                .iter()
                .all(|input| input.is_empty() || !overlap(output, input))
    });
    clear.then_some(parts)
}

pub(crate) fn internal(kernel: &str) -> GpuError {
    GpuError::Cuda(format!(
        "{kernel} part got the wrong inputs (internal error)"
    ))
}
