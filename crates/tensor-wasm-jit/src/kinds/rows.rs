//! What kinds computed row by row share: the CPU run in steps and in parts, and the PTX
//! prologue of a row grid.
//!
//! A row kind writes `rows` output rows of `row_len` elements each, row `r` at element
//! `r * row_len` of the output, and computes a row from its inputs alone (the contract refuses
//! an output that overlaps an input). Its grid ([`RowGrid::Spread`]) is
//! `[rows, ceil(row_len / 256), 1]`; thread `t` of block `(r, y)` computes element
//! `y * 256 + t` of row `r`. A launch with a smaller grid computes only the rows and columns
//! it covers, on the CPU as on the GPU.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use std::marker::PhantomData;

use tensor_wasm_gpu::gemm::{decode_into, encode_into};
use tensor_wasm_gpu::{CpuPart, CpuParts, GpuError, LaunchConfig};
use zerocopy::{FromBytes, IntoBytes};

use super::{blocks, KindRun};
use crate::contract::BLOCK_1D;
use crate::cpu::Element;
use crate::cpu_parts::{disjoint, split};
use crate::emit::{ins, label};

/// How a row kind's grid maps onto its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowGrid {
    /// One thread per element: `grid = [rows, ceil(row_len / 256), 1]`.
    Spread,
}

impl RowGrid {
    /// The grid covering `rows` rows of `row_len` elements.
    pub(crate) fn grid(self, rows: u64, row_len: u64) -> [u64; 3] {
        match self {
            RowGrid::Spread => [rows.max(1), blocks(row_len, u64::from(BLOCK_1D)), 1],
        }
    }

    /// Grid axes the kernel reads.
    pub(crate) fn axes(self) -> usize {
        match self {
            RowGrid::Spread => 2,
        }
    }

    /// The rows and the elements of each row a launch with `config` computes.
    pub(crate) fn covered(
        self,
        config: &LaunchConfig,
        rows: usize,
        row_len: usize,
    ) -> (usize, usize) {
        let rows = rows.min(config.grid[0] as usize);
        match self {
            RowGrid::Spread => (
                rows,
                row_len.min(config.grid[1] as usize * BLOCK_1D as usize),
            ),
        }
    }
}

/// The computation of one row of a row kind.
pub(crate) trait RowOp<T>: fmt::Debug + Send + Sync + 'static {
    /// About how many operations one row costs (for step and part sizes).
    fn row_work(&self) -> usize;

    /// Computes the first `out.len() / 4` elements of row `row` into `out` (little-endian,
    /// 4-byte aligned), from `inputs`: the bytes of each input buffer (as far as the launch's
    /// shape needs), in parameter order.
    fn row(&self, row: usize, inputs: &[&[u8]], out: &mut [u8]);

    /// Computes rows `rows` into `out`: row `r` at element `(r - rows.start) · row_len`, its
    /// first `cols` elements (the rest of each row untouched); row by row unless the kind
    /// has a faster way for many rows at once.
    fn rows(
        &self,
        rows: Range<usize>,
        (row_len, cols): (usize, usize),
        inputs: &[&[u8]],
        out: &mut [u8],
    ) {
        each_row(rows, (row_len, cols), out, |row, out| {
            self.row(row, inputs, out)
        });
    }

    /// Whether [`RowOp::row`] may leave elements of `out` as they are (a launch covering part
    /// of a row): then `out` holds the output's current bytes when it is called.
    fn keeps_output(&self) -> bool {
        false
    }
}

/// A row kind's launch on the CPU.
pub(crate) struct RowRun<T, K> {
    op: Arc<K>,
    /// Byte ranges of guest memory of the inputs, in parameter order.
    inputs: Vec<Range<usize>>,
    /// Byte offset of the output.
    out: usize,
    row_len: usize,
    /// Rows and elements per row computed.
    rows: usize,
    cols: usize,
    next: usize,
    /// The row being computed (aligned for `T`), copied into the memory after.
    scratch: Vec<T>,
}

impl<T, K> fmt::Debug for RowRun<T, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RowRun")
            .field("inputs", &self.inputs)
            .field("out", &self.out)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("next", &self.next)
            .finish()
    }
}

impl<T: Element, K: RowOp<T>> RowRun<T, K> {
    /// The run of `op` over `rows` rows of `row_len` elements (of which `config` covers
    /// some), reading `inputs` and writing at byte offset `out`.
    pub(crate) fn new(
        op: K,
        grid: RowGrid,
        config: &LaunchConfig,
        inputs: Vec<Range<usize>>,
        out: usize,
        rows: usize,
        row_len: usize,
    ) -> Self {
        let (rows, cols) = grid.covered(config, rows, row_len);
        Self::covering(op, inputs, out, rows, row_len, cols)
    }

    /// The run of `op` over rows `0..rows` of `row_len` elements, elements `0..cols` of each.
    pub(crate) fn covering(
        op: K,
        inputs: Vec<Range<usize>>,
        out: usize,
        rows: usize,
        row_len: usize,
        cols: usize,
    ) -> Self {
        RowRun {
            op: Arc::new(op),
            inputs,
            out,
            row_len,
            rows,
            cols,
            next: 0,
            scratch: Vec::new(),
        }
    }
}

impl<T: Element + Send, K: RowOp<T>> KindRun<T> for RowRun<T, K> {
    fn step(&mut self, memory: &mut [u8], work: usize) -> bool {
        self.scratch.resize(self.cols, T::ZERO);
        let mut spent = 0;
        while self.next < self.rows && spent < work {
            let at = self.out + 4 * self.next * self.row_len;
            let scratch = self.scratch.as_mut_bytes();
            if self.op.keeps_output() {
                scratch.copy_from_slice(&memory[at..at + 4 * self.cols]);
            }
            let inputs: Vec<&[u8]> = self.inputs.iter().map(|r| &memory[r.clone()]).collect();
            self.op.row(self.next, &inputs, scratch);
            memory[at..at + 4 * self.cols].copy_from_slice(scratch);
            self.next += 1;
            spent += self.op.row_work().max(1);
        }
        self.next >= self.rows
    }

    fn parts(self: Box<Self>, workers: usize) -> Option<CpuParts> {
        let RowRun {
            op,
            inputs,
            out,
            row_len,
            rows,
            cols,
            ..
        } = *self;
        let parts = split(rows, op.row_work(), workers)
            .into_iter()
            .map(|range| {
                let first = out + 4 * range.start * row_len;
                let last = if range.is_empty() {
                    first
                } else {
                    out + 4 * ((range.end - 1) * row_len + cols)
                };
                let part = RowPart {
                    op: op.clone(),
                    row_len,
                    cols,
                    first: range.start,
                    rows: range,
                    _element: PhantomData::<T>,
                };
                (first..last, Box::new(part) as Box<dyn CpuPart>)
            })
            .collect();
        disjoint(CpuParts { inputs, parts })
    }
}

/// Rows `rows` of a row kind, on one core.
struct RowPart<T, K> {
    op: Arc<K>,
    row_len: usize,
    cols: usize,
    /// The first row of the part (at byte 0 of its output range).
    first: usize,
    rows: Range<usize>,
    _element: PhantomData<T>,
}

impl<T: Element + Send, K: RowOp<T>> CpuPart for RowPart<T, K> {
    fn step(&mut self, inputs: &[&[u8]], output: &mut [u8]) -> Result<bool, GpuError> {
        // The rows of one step, at once. The output range holds the memory's current bytes:
        // nothing to load.
        let count = (crate::cpu::STEP_WORK / self.op.row_work().max(1)).clamp(1, self.rows.len());
        let rows = self.rows.start..self.rows.start + count;
        let at = 4 * (rows.start - self.first) * self.row_len;
        self.op
            .rows(rows, (self.row_len, self.cols), inputs, &mut output[at..]);
        self.rows.start += count;
        Ok(self.rows.is_empty())
    }
}

/// PTX: `%rd1` = row (`ctaid.x`), `%rd2` = element of the row (`ctaid.y * 256 + tid.x`) of a
/// [`RowGrid::Spread`] launch, both 64-bit; branches to `DONE` unless `row < %rd3` and
/// `element < %rd4`, which the caller has loaded (rows, row length).
pub(crate) fn spread_prologue(out: &mut String) {
    ins!(out, "mov.u32 %r1, %ctaid.x;");
    ins!(out, "cvt.u64.u32 %rd1, %r1; // row");
    ins!(out, "mov.u32 %r2, %ctaid.y;");
    ins!(out, "mov.u32 %r3, %tid.x;");
    ins!(out, "mul.wide.u32 %rd2, %r2, {BLOCK_1D};");
    ins!(out, "cvt.u64.u32 %rd5, %r3;");
    ins!(out, "add.u64 %rd2, %rd2, %rd5; // element of the row");
    ins!(out, "setp.ge.u64 %p1, %rd1, %rd3; // guard: row < rows");
    ins!(out, "@%p1 bra DONE;");
    ins!(
        out,
        "setp.ge.u64 %p1, %rd2, %rd4; // guard: element < row length"
    );
    ins!(out, "@%p1 bra DONE;");
}

/// Calls `f(row, bytes)` for each row of `rows` with the bytes of its first `cols` elements
/// in `out`, row `r` at element `(r - rows.start) · row_len` (the layout of
/// [`RowOp::rows`]).
pub(crate) fn each_row(
    rows: Range<usize>,
    (row_len, cols): (usize, usize),
    out: &mut [u8],
    mut f: impl FnMut(usize, &mut [u8]),
) {
    let first = rows.start;
    for row in rows {
        let at = 4 * (row - first) * row_len;
        f(row, &mut out[at..at + 4 * cols]);
    }
}

/// Decodes element `index` of a little-endian buffer.
#[inline(always)]
pub(crate) fn load<T: Element>(bytes: &[u8], index: usize) -> T {
    let at = 4 * index;
    T::from_le([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Runs `f` on `out` viewed as `T`s: in place when aligned (always so for guest memory and the
/// row scratch), else through a decoded copy written back after.
pub(crate) fn with_values<T: Element>(out: &mut [u8], f: impl FnOnce(&mut [T])) {
    match <[T]>::mut_from_bytes(out) {
        Ok(values) => f(values),
        Err(_) => {
            let mut values = vec![T::ZERO; out.len() / 4];
            decode_into(out, &mut values);
            f(&mut values);
            encode_into(&values, out);
        }
    }
}

/// PTX of a block that reduces a row: combines the 256 threads' partials `%v0` by the fixed
/// tree (`p[t] = op(p[t], p[t + s])`, `s = 128, ..., 1`) into `%v1` of every thread, with
/// `combine` computing `%v1 = op(%v1, %v2)`. Needs `.shared smem[256]`, `%r2` = the thread,
/// `%r5` = `smem`, `%r7` = `&smem[t]`; leaves the shared memory free for reuse.
pub(crate) fn block_tree(out: &mut String, tag: &str, combine: impl Fn(&mut String)) {
    ins!(out, "st.shared.b32 [%r7], %v0;");
    ins!(out, "bar.sync 0;");
    let mut stride = BLOCK_1D / 2;
    while stride > 0 {
        ins!(out, "setp.ge.u32 %p3, %r2, {stride};");
        ins!(out, "@%p3 bra {tag}_TREE_{stride};");
        ins!(out, "ld.shared.b32 %v1, [%r7];");
        ins!(out, "ld.shared.b32 %v2, [%r7+{}];", stride * 4);
        combine(out);
        ins!(out, "st.shared.b32 [%r7], %v1;");
        label!(out, &format!("{tag}_TREE_{stride}"));
        ins!(out, "bar.sync 0;");
        stride /= 2;
    }
    ins!(out, "ld.shared.b32 %v1, [%r5];");
    ins!(out, "bar.sync 0;");
}
