//! The builtin kernels on the CPU, with the same per-element arithmetic as the PTX kernels so
//! results are bit-identical, computed in bounded slices: a task runs one slice, then goes back
//! to its tenant's queue with a cursor saying where to resume (see `cpu/pool.rs`), so a launch
//! can be cancelled between slices and never holds a worker for long.

use std::ops::Range;
use std::time::Instant;

use super::pool::PROGRAM_SLICE;
use crate::gemm::{Gemm, Matrices};
use crate::validate::BuiltinCall;
use crate::LaunchConfig;

/// Elementwise kernels: fewer elements than this per task are not worth another thread.
const MIN_ELEMENTS_PER_TASK: usize = 1 << 15;
/// Matmul: fewer multiply-adds than this per task are not worth another thread.
const MIN_MULADDS_PER_TASK: u64 = 1 << 17;
/// Matmul register/L1 tile: rows computed together, sharing each loaded row segment of `b`.
const TILE_ROWS: usize = 4;
/// Matmul tile width in columns (accumulators stay in a local array the compiler vectorises).
const TILE_COLS: usize = 64;
/// Elementwise kernels: elements one slice computes (tens of microseconds).
const SLICE_ELEMENTS: usize = 1 << 16;
/// Matmul: multiply-adds one slice computes (about 0.1 ms on one core of an optimised build, a
/// few ms unoptimised). Also about the longest a cancelled launch keeps a worker after it was
/// cancelled, and the longest another tenant's task waits per busy worker.
const SLICE_MULADDS: u64 = 1 << 18;

/// The base address of the guest memory a job works on.
#[derive(Clone, Copy)]
pub(super) struct GuestMemory(pub(super) *mut u8);

// SAFETY: the pointer is only dereferenced by the tasks of one job, on the bytes validation put
// inside the guest memory; the `Completion` that borrows that memory (`&'m mut [u8]`) does not
// release the borrow before every task has finished (its drop blocks), and the caller of
// `launch_unscoped` promised not to leak it (the safe `crate::launch` never does), so the
// memory outlives every use on any thread. Concurrent tasks write disjoint bytes (see
// `Work::partition`), and one task's slices run one after another.
unsafe impl Send for GuestMemory {}
// SAFETY: as for `Send`: shared references only copy the address.
unsafe impl Sync for GuestMemory {}

impl GuestMemory {
    /// The f32 data at `offset`. Not necessarily 4-byte aligned in the address space (only the
    /// offset is), so the kernels use unaligned reads and writes.
    fn f32_at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset).cast::<f32>()
    }
}

/// A validated builtin call and the part of it the launch grid covers.
#[derive(Clone, Copy)]
pub(super) struct Work {
    call: BuiltinCall,
    /// Elementwise kernels: elements `0..x_limit`. Matmul: columns `0..x_limit`.
    x_limit: usize,
    /// Matmul: rows `0..y_limit`.
    y_limit: usize,
}

/// Where a part of a builtin launch resumes.
pub(super) enum Cursor {
    /// Elementwise: the next element.
    Elements(usize),
    /// Matmul whose output aliases an input: the tile in progress and its accumulators.
    Matmul(Box<MatmulCursor>),
    /// Matmul into a separate output: the blocked multiply in progress.
    Gemm(Box<Gemm<f32>>),
    /// A host-described program's run, step by step.
    Steps(Box<dyn crate::CpuSteps>),
    /// One part of a host-described program's run ([`crate::CpuParts`]), step by step.
    Part(Box<dyn crate::CpuPart>),
}

/// A matmul part's position: the tile at (`row0`, `col0`), summed up to `p`.
pub(super) struct MatmulCursor {
    col0: usize,
    row0: usize,
    p: usize,
    acc: [[f32; TILE_COLS]; TILE_ROWS],
}

impl Work {
    pub(super) fn new(call: BuiltinCall, config: &LaunchConfig) -> Self {
        let covered = |threads: u64, count: u32| threads.min(u64::from(count)) as usize;
        match call {
            BuiltinCall::VectorAdd { n, .. } | BuiltinCall::Scale { n, .. } => Self {
                call,
                x_limit: covered(config.threads_x(), n),
                y_limit: 1,
            },
            BuiltinCall::Matmul { m, n, .. } => Self {
                call,
                x_limit: covered(config.threads_x(), n),
                y_limit: covered(config.threads_y(), m),
            },
        }
    }

    /// Splits the work into at most `workers` parts: element ranges, or row ranges for matmul.
    /// No part is empty; the parts are disjoint, so their writes are too. When the output
    /// overlaps an input, one part does everything on one thread.
    pub(super) fn partition(&self, workers: usize) -> Vec<Range<usize>> {
        let (total, wanted, granule) = match self.call {
            BuiltinCall::VectorAdd { .. } | BuiltinCall::Scale { .. } => {
                (self.x_limit, self.x_limit / MIN_ELEMENTS_PER_TASK, 16)
            }
            BuiltinCall::Matmul { k, .. } => {
                if self.x_limit == 0 {
                    return Vec::new();
                }
                let muladds = (self.y_limit as u64) * (self.x_limit as u64) * u64::from(k).max(1);
                let wanted = (muladds / MIN_MULADDS_PER_TASK).min(usize::MAX as u64) as usize;
                (self.y_limit, wanted, TILE_ROWS)
            }
        };
        if total == 0 {
            return Vec::new();
        }
        let parts = if self.call.output_aliases_input() {
            1
        } else {
            wanted.clamp(1, workers.max(1))
        };
        let per_part = total.div_ceil(parts).next_multiple_of(granule);
        (0..total)
            .step_by(per_part)
            .map(|start| start..(start + per_part).min(total))
            .collect()
    }

    /// The cursor at the start of `part`.
    pub(super) fn cursor(&self, part: &Range<usize>) -> Cursor {
        match self.call {
            BuiltinCall::VectorAdd { .. } | BuiltinCall::Scale { .. } => {
                Cursor::Elements(part.start)
            }
            BuiltinCall::Matmul { n, k, .. } if !self.call.output_aliases_input() => Cursor::Gemm(
                Box::new(Gemm::new(part.len(), self.x_limit, k as usize, n as usize)),
            ),
            BuiltinCall::Matmul { .. } => Cursor::Matmul(Box::new(MatmulCursor {
                col0: 0,
                row0: part.start,
                p: 0,
                acc: [[0.0; TILE_COLS]; TILE_ROWS],
            })),
        }
    }

    /// Runs the next slice of `part` from `cursor` and moves the cursor on; `true` once the
    /// part is done. Slices of one part run in the order a single uninterrupted run would
    /// compute, so results (aliased buffers included) do not depend on how it was sliced.
    ///
    /// # Safety
    /// `memory` must be the base of the guest memory `self.call` was validated against, valid
    /// for reads and writes for the whole call; `cursor` came from [`Work::cursor`] for this
    /// `part` and was only moved on by this function; no other thread may access the bytes
    /// this part writes, nor write the bytes it reads, while it runs.
    pub(super) unsafe fn run_slice(
        &self,
        memory: GuestMemory,
        part: &Range<usize>,
        cursor: &mut Cursor,
    ) -> bool {
        match (self.call, cursor) {
            (BuiltinCall::VectorAdd { a, b, out, .. }, Cursor::Elements(next)) => {
                let range = *next..part.end.min(next.saturating_add(SLICE_ELEMENTS));
                *next = range.end;
                // SAFETY: validation put `n` f32 values inside guest memory at each offset and
                // `part` lies below `x_limit <= n`; exclusivity is the caller's promise.
                unsafe {
                    vector_add(
                        memory.f32_at(a),
                        memory.f32_at(b),
                        memory.f32_at(out),
                        range,
                    )
                }
                *next >= part.end
            }
            (BuiltinCall::Scale { x, out, alpha, .. }, Cursor::Elements(next)) => {
                let range = *next..part.end.min(next.saturating_add(SLICE_ELEMENTS));
                *next = range.end;
                // SAFETY: as for vector_add.
                unsafe { scale(memory.f32_at(x), memory.f32_at(out), alpha, range) }
                *next >= part.end
            }
            (BuiltinCall::Matmul { a, b, c, n, k, .. }, Cursor::Matmul(at)) => {
                let shape = MatmulShape {
                    n: n as usize,
                    k: k as usize,
                    columns: self.x_limit,
                };
                // SAFETY: validation put m*k, k*n and m*n f32 values at a, b and c; `part` lies
                // below `y_limit <= m` and `columns <= n`; exclusivity is the caller's promise.
                unsafe {
                    matmul_slice(
                        [memory.f32_at(a), memory.f32_at(b), memory.f32_at(c)],
                        shape,
                        part.clone(),
                        at,
                        SLICE_MULADDS,
                    )
                }
            }
            (BuiltinCall::Matmul { a, b, c, n, k, .. }, Cursor::Gemm(gemm)) => {
                let (n, k) = (n as usize, k as usize);
                let at = |offset: usize, first: usize| memory.0.wrapping_add(offset + 4 * first);
                // SAFETY: validation put m*k, k*n and m*n f32 values at a, b and c, and `part`
                // lies below `y_limit <= m`, so each slice is inside guest memory; the output
                // aliases no input (or the cursor would be `Matmul`), no other part writes
                // these rows of c, and no part writes a or b (the caller's promise).
                let (a, b, c) = unsafe {
                    (
                        std::slice::from_raw_parts(at(a, part.start * k), 4 * part.len() * k),
                        std::slice::from_raw_parts(at(b, 0), 4 * k * n),
                        std::slice::from_raw_parts_mut(at(c, part.start * n), 4 * part.len() * n),
                    )
                };
                let source = Matrices { a, b, k, ldb: n };
                // A step is one packing or one column of register tiles (microseconds).
                let started = Instant::now();
                while !gemm.step(&source, c, 1) {
                    if started.elapsed() >= PROGRAM_SLICE {
                        return false;
                    }
                }
                true
            }
            // A cursor of another kind than the call: not made by `Work::cursor`.
            _ => true,
        }
    }
}

/// `out[i] = a[i] + b[i]` for `i` in `range`.
///
/// # Safety
/// `a`, `b` valid for reads and `out` for writes of `range.end` f32 values (any alignment); no
/// other thread touches `out[range]` or writes `a[range]`, `b[range]` meanwhile.
unsafe fn vector_add(a: *const f32, b: *const f32, out: *mut f32, range: Range<usize>) {
    for i in range {
        // SAFETY: `i < range.end`, inside every buffer by the caller's promise.
        unsafe {
            let sum = a.add(i).read_unaligned() + b.add(i).read_unaligned();
            out.add(i).write_unaligned(sum);
        }
    }
}

/// `out[i] = alpha * x[i]` for `i` in `range`.
///
/// # Safety
/// As for [`vector_add`].
unsafe fn scale(x: *const f32, out: *mut f32, alpha: f32, range: Range<usize>) {
    for i in range {
        // SAFETY: `i < range.end`, inside both buffers by the caller's promise.
        unsafe {
            let product = alpha * x.add(i).read_unaligned();
            out.add(i).write_unaligned(product);
        }
    }
}

#[derive(Clone, Copy)]
struct MatmulShape {
    /// Columns of `b` and `c` (row stride).
    n: usize,
    /// Columns of `a`, rows of `b`.
    k: usize,
    /// Columns of `c` the launch covers (`<= n`).
    columns: usize,
}

/// `c[row][col] = sum_{p in 0..k} a[row][p] * b[p][col]` for `row` in `rows` and
/// `col < shape.columns`, each sum taken as `acc = acc + a * b` from `acc = 0` in order of `p`,
/// like the PTX kernel (separate multiply and add, both rounded to nearest), from `at` on, for
/// about `budget` multiply-adds; `true` once every row of `rows` is done.
///
/// Tiled: `TILE_ROWS` rows share each loaded segment of a row of `b`, and `TILE_COLS`
/// accumulators per row live in a local array; tiles go column block by column block, rows
/// within. A slice may stop inside a tile (its accumulators saved in `at`); none of this changes
/// the order of any sum, or the order in which tiles are written.
///
/// # Safety
/// `a` valid for reads of `rows.end * k`, `b` of `k * n`, `c` for writes of `rows.end * n` f32
/// values (any alignment), `columns <= n`; `at` was made for `rows` and only moved on by this
/// function; no other thread touches the written rows of `c` or writes `a` or `b` meanwhile.
unsafe fn matmul_slice(
    [a, b, c]: [*mut f32; 3],
    shape: MatmulShape,
    rows: Range<usize>,
    at: &mut MatmulCursor,
    budget: u64,
) -> bool {
    let MatmulShape { n, k, columns } = shape;
    let mut spent = 0u64;
    while at.col0 < columns && at.row0 < rows.end {
        let (col0, row0) = (at.col0, at.row0);
        let width = TILE_COLS.min(columns - col0);
        let height = TILE_ROWS.min(rows.end - row0);
        // Lanes past `width` are computed but never stored; keep them ordinary numbers.
        let mut b_segment = [0.0f32; TILE_COLS];
        let mut acc = if at.p == 0 {
            [[0.0f32; TILE_COLS]; TILE_ROWS]
        } else {
            at.acc
        };
        let step_cost = (TILE_COLS * height) as u64;
        while at.p < k {
            let p = at.p;
            for (j, slot) in b_segment.iter_mut().enumerate().take(width) {
                // SAFETY: `p < k` and `col0 + j < columns <= n`: inside the k*n values of b.
                *slot = unsafe { b.add(p * n + col0 + j).read_unaligned() };
            }
            for (r, acc_row) in acc.iter_mut().enumerate().take(height) {
                // SAFETY: `row0 + r < rows.end` and `p < k`: inside the rows.end*k values of a.
                let a_value = unsafe { a.add((row0 + r) * k + p).read_unaligned() };
                for (acc, &b_value) in acc_row.iter_mut().zip(&b_segment) {
                    *acc += a_value * b_value;
                }
            }
            at.p += 1;
            spent += step_cost;
            if spent >= budget && at.p < k {
                at.acc = acc;
                return false;
            }
        }
        for (r, acc_row) in acc.iter().enumerate().take(height) {
            for (j, &value) in acc_row.iter().enumerate().take(width) {
                // SAFETY: `row0 + r < rows.end` and `col0 + j < columns <= n`.
                unsafe { c.add((row0 + r) * n + col0 + j).write_unaligned(value) };
            }
        }
        at.p = 0;
        at.row0 += height;
        if at.row0 >= rows.end {
            at.row0 = rows.start;
            at.col0 += TILE_COLS;
        }
        if at.col0 >= columns {
            return true;
        }
        if spent >= budget {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reference matmul: one uninterrupted pass, in the kernel's order.
    fn reference(a: &[f32], b: &[f32], [m, n, k]: [usize; 3]) -> Vec<f32> {
        let mut c = vec![0.0f32; m * n];
        for row in 0..m {
            for col in 0..n {
                let mut acc = 0.0f32;
                for p in 0..k {
                    acc += a[row * k + p] * b[p * n + col];
                }
                c[row * n + col] = acc;
            }
        }
        c
    }

    /// Slicing (down to a budget of one step) never changes a result: every slice resumes
    /// where the last one stopped, inside a tile or between tiles.
    #[test]
    fn a_matmul_sliced_at_any_budget_equals_one_pass() {
        let [m, n, k] = [9usize, 70, 13];
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.37 - 1.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 11) as f32 * 0.21 + 0.5).collect();
        let expected = reference(&a, &b, [m, n, k]);
        for budget in [1u64, 64, 300, 5_000, u64::MAX] {
            let (mut a, mut b, mut c) = (a.clone(), b.clone(), vec![0.0f32; m * n]);
            let shape = MatmulShape { n, k, columns: n };
            let mut at = MatmulCursor {
                col0: 0,
                row0: 0,
                p: 0,
                acc: [[0.0; TILE_COLS]; TILE_ROWS],
            };
            let mut slices = 0;
            // SAFETY: the three vectors hold m*k, k*n and m*n values; nothing else uses them.
            while !unsafe {
                matmul_slice(
                    [a.as_mut_ptr(), b.as_mut_ptr(), c.as_mut_ptr()],
                    shape,
                    0..m,
                    &mut at,
                    budget,
                )
            } {
                slices += 1;
                assert!(slices < 1_000_000, "no progress at budget {budget}");
            }
            assert_eq!(c, expected, "budget {budget}");
            if budget == 1 {
                assert!(slices > 50, "a budget of one step must slice often");
            }
        }
    }
}
