//! What the data-movement kinds (`permute`, `gather`) share on the CPU: a run over their output
//! rows in steps and in parts that copies 4-byte words as they are (no element type: the bits
//! move, whatever the dtype), straight between guest memory's input and output bytes.
//!
//! Such a kind writes rows of `row_len` elements, row `r` at element `r * row_len` of the
//! output. A launch covers the first `rows` rows, in each the first `cols` elements, and of
//! those the ones before element `limit` of the whole output: a row grid (`kinds/rows.rs`)
//! covers a rectangle, a one-dimensional grid a prefix. Rows come in units of `unit_rows`
//! consecutive rows (what the kind copies together, e.g. the rows a permute tiles across);
//! parts are ranges of whole units, so each writes one contiguous byte range.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use tensor_wasm_gpu::{CpuPart, CpuParts, GpuError};

use super::KindRun;
use crate::cpu::{Element, STEP_WORK};
use crate::cpu_parts::{disjoint, split};

/// One element's bytes, copied as they are.
pub(crate) type Word = [u8; 4];

/// Where a copy run is: the next unit, and inside it the kind's own position (`m`, `b`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cursor {
    /// The unit being copied.
    pub(crate) unit: usize,
    /// The unit after the last of the run (or part).
    pub(crate) end: usize,
    /// A position inside the unit the kind defines (e.g. a row of a tile); 0 at its start.
    pub(crate) m: usize,
    /// The first column not yet copied of the current row or block.
    pub(crate) b: usize,
}

/// The output rows of a copy launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CopyRows {
    /// Elements per output row.
    pub(crate) row_len: usize,
    /// Rows the launch covers.
    pub(crate) rows: usize,
    /// Elements of each row the launch covers (at most `row_len`).
    pub(crate) cols: usize,
    /// Rows per unit (at least 1).
    pub(crate) unit_rows: usize,
    /// Elements of the whole output covered: those before this one (`usize::MAX`: all).
    pub(crate) limit: usize,
}

impl CopyRows {
    /// Units holding a covered element.
    pub(crate) fn units(&self) -> usize {
        if self.cols == 0 {
            return 0;
        }
        self.rows.div_ceil(self.unit_rows.max(1))
    }

    /// Elements of covered row `row` the launch covers (from the first).
    pub(crate) fn cols_of(&self, row: usize) -> usize {
        self.cols.min(self.limit.saturating_sub(row * self.row_len))
    }

    /// The output bytes (from the output's offset) the covered elements of `units` occupy.
    fn bytes(&self, units: Range<usize>) -> Range<usize> {
        let first = (units.start * self.unit_rows).min(self.rows);
        let end = (units.end * self.unit_rows).min(self.rows);
        if end <= first || self.cols == 0 {
            return 4 * first * self.row_len..4 * first * self.row_len;
        }
        4 * first * self.row_len..4 * ((end - 1) * self.row_len + self.cols_of(end - 1))
    }
}

/// How a data-movement kind copies its units.
pub(crate) trait CopyOp: fmt::Debug + Send + Sync + 'static {
    /// Copies the covered elements of `rows` from `cursor` on, up to unit `cursor.end`
    /// (exclusive), about `work` of them, and advances `cursor`; `cursor.unit == cursor.end`
    /// once done. `inputs` are the input buffers in parameter order; `out` starts at output
    /// row `origin` (element `(r - origin) * row_len + c` is row `r`, column `c`).
    fn copy(
        &self,
        rows: &CopyRows,
        cursor: &mut Cursor,
        inputs: &[&[Word]],
        out: &mut [Word],
        origin: usize,
        work: usize,
    );
}

/// A copy kind's launch on the CPU.
#[derive(Debug)]
pub(crate) struct CopyRun<K> {
    op: Arc<K>,
    rows: CopyRows,
    /// Byte ranges of guest memory of the inputs, in parameter order.
    inputs: Vec<Range<usize>>,
    /// Byte offset of the output.
    out: usize,
    cursor: Cursor,
}

impl<K: CopyOp> CopyRun<K> {
    /// The run of `op` over `rows`, reading `inputs` (byte ranges) and writing at byte `out`.
    /// The output must overlap no input (the launch contract of every copy kind says so).
    pub(crate) fn new(op: K, rows: CopyRows, inputs: Vec<Range<usize>>, out: usize) -> Self {
        CopyRun {
            op: Arc::new(op),
            rows,
            inputs,
            out,
            cursor: Cursor::default(),
        }
    }
}

impl<T: Element, K: CopyOp> KindRun<T> for CopyRun<K> {
    fn step(&mut self, memory: &mut [u8], work: usize) -> bool {
        let units = self.rows.units();
        self.cursor.end = units;
        if self.cursor.unit >= units {
            return true;
        }
        let bytes = self.rows.bytes(0..units);
        let output = self.out + bytes.start..self.out + bytes.end;
        let (inputs, out) = split_memory(memory, &self.inputs, output);
        let inputs: Vec<&[Word]> = inputs.into_iter().map(words).collect();
        let out = words_mut(out);
        self.op
            .copy(&self.rows, &mut self.cursor, &inputs, out, 0, work.max(1));
        self.cursor.unit >= units
    }

    fn parts(self: Box<Self>, workers: usize) -> Option<CpuParts> {
        let CopyRun {
            op,
            rows,
            inputs,
            out,
            cursor,
        } = *self;
        // Parts start from the beginning: a run is split before its first step.
        debug_assert_eq!(cursor.unit, 0);
        let unit_work = rows.unit_rows.saturating_mul(rows.cols);
        let parts = split(rows.units(), unit_work, workers)
            .into_iter()
            .map(|units| {
                let bytes = rows.bytes(units.clone());
                let part = CopyPart {
                    op: op.clone(),
                    rows,
                    cursor: Cursor {
                        unit: units.start,
                        end: units.end,
                        ..Cursor::default()
                    },
                    origin: units.start * rows.unit_rows,
                };
                (
                    out + bytes.start..out + bytes.end,
                    Box::new(part) as Box<dyn CpuPart>,
                )
            })
            .collect();
        disjoint(CpuParts { inputs, parts })
    }
}

/// Units `cursor.unit..cursor.end` of a copy kind, on one core; its output range starts at
/// row `origin`.
struct CopyPart<K> {
    op: Arc<K>,
    rows: CopyRows,
    cursor: Cursor,
    origin: usize,
}

impl<K: CopyOp> CpuPart for CopyPart<K> {
    fn step(&mut self, inputs: &[&[u8]], output: &mut [u8]) -> Result<bool, GpuError> {
        let inputs: Vec<&[Word]> = inputs.iter().map(|bytes| words(bytes)).collect();
        self.op.copy(
            &self.rows,
            &mut self.cursor,
            &inputs,
            words_mut(output),
            self.origin,
            STEP_WORK,
        );
        Ok(self.cursor.unit >= self.cursor.end)
    }
}

/// `memory` as the byte ranges `inputs` (read) and `output` (written), none of which may
/// overlap `output`.
fn split_memory<'m>(
    memory: &'m mut [u8],
    inputs: &[Range<usize>],
    output: Range<usize>,
) -> (Vec<&'m [u8]>, &'m mut [u8]) {
    let (head, rest) = memory.split_at_mut(output.start);
    let (out, tail) = rest.split_at_mut(output.len());
    let (head, tail): (&'m [u8], &'m [u8]) = (head, tail);
    let views = inputs
        .iter()
        .map(|range| {
            if range.is_empty() {
                &[][..]
            } else if range.end <= output.start {
                &head[range.clone()]
            } else {
                &tail[range.start - output.end..range.end - output.end]
            }
        })
        .collect();
    (views, out)
}

/// `bytes` as words (a trailing partial word is dropped; buffers are whole words).
fn words(bytes: &[u8]) -> &[Word] {
    bytes.as_chunks::<4>().0
}

/// `bytes` as words to write.
fn words_mut(bytes: &mut [u8]) -> &mut [Word] {
    bytes.as_chunks_mut::<4>().0
}

#[cfg(test)]
mod tests {
    use tensor_wasm_gpu::{KernelArg, LaunchConfig};

    use crate::conformance::{Layout, Rng};
    use crate::kinds::gather::GatherRows;
    use crate::kinds::Kind;
    use crate::{Blueprint, ParamKind, Shape};

    /// A launch of `descriptor` on `sizes` with the grid `short` blocks short per axis: the
    /// blueprint, its configuration and arguments, and the memory before it runs.
    fn launch(
        descriptor: &str,
        sizes: &[u32],
        short: [u32; 2],
    ) -> (Blueprint, LaunchConfig, Vec<KernelArg>, Vec<u8>) {
        let blueprint = Blueprint::parse(descriptor).unwrap();
        let shape = Shape::of_sizes(sizes);
        let elements: Vec<usize> = blueprint
            .buffer_elements(&shape)
            .iter()
            .map(|count| count.unwrap() as usize)
            .collect();
        let lens: Vec<usize> = elements.iter().map(|count| 4 * count).collect();
        let mut layout = Layout::new(&lens);
        let mut rng = Rng::named(descriptor);
        for (input, &count) in elements[..elements.len() - 1].iter().enumerate() {
            let words: Vec<u32> = (0..count)
                .map(|_| GatherRows.case_input(blueprint.dtype(), input, &shape, &mut rng))
                .collect();
            layout.write(input, &words);
        }
        let (mut buffer, mut size) = (0, 0);
        let args = blueprint
            .params()
            .iter()
            .map(|param| match param.kind {
                ParamKind::U32 => {
                    size += 1;
                    KernelArg::U32(sizes[size - 1])
                }
                _ => {
                    buffer += 1;
                    layout.arg(buffer - 1)
                }
            })
            .collect();
        let mut config = blueprint.launch_config(&shape).unwrap();
        for (grid, short) in config.grid.iter_mut().zip(short) {
            *grid = grid.saturating_sub(short).max(1);
        }
        (blueprint, config, args, layout.memory)
    }

    /// Permutes whose units are rows, tiles and partly covered tiles, and gathers: a run
    /// paused at any step size, and the same run as parts on 1 to 5 cores, write exactly what
    /// one pass writes.
    #[test]
    fn steps_and_parts_of_every_size_equal_one_pass() {
        let launches = [
            ("permute[10]:f32", &[37u32, 150][..], [1, 0]),
            ("permute[021]:i32", &[3, 300, 19], [5, 1]),
            ("permute[201]:f32", &[5, 300, 40], [3, 1]),
            ("permute[0213]:i32", &[2, 5, 3, 300], [1, 1]),
            ("permute[1032]:f32", &[3, 2, 17, 67], [0, 0]),
            ("permute[3210]:i32", &[3, 4, 5, 70], [0, 0]),
            ("gather[rows]:f32", &[50, 300, 40], [2, 1]),
            ("gather[rows]:i32", &[7, 33, 90], [0, 0]),
        ];
        for (descriptor, sizes, short) in launches {
            let (blueprint, config, args, initial) = launch(descriptor, sizes, short);
            let mut expected = initial.clone();
            let mut run = blueprint.cpu_run(&config, &args, initial.len()).unwrap();
            assert!(run.step(&mut expected).unwrap(), "{descriptor}: one step");
            assert_ne!(expected, initial, "{descriptor} copied nothing");
            for work in [1, 7, 64, 500] {
                let mut memory = initial.clone();
                let mut run = blueprint
                    .cpu_run(&config, &args, memory.len())
                    .unwrap()
                    .with_step_work(work);
                let mut steps = 1;
                while !run.step(&mut memory).unwrap() {
                    steps += 1;
                }
                assert!(steps > 1, "{descriptor}: steps of {work} must slice");
                assert!(memory == expected, "{descriptor}: steps of {work}");
            }
            for workers in 1..=5 {
                let mut memory = initial.clone();
                let parts = blueprint
                    .cpu_parts(&config, &args, memory.len(), workers)
                    .unwrap()
                    .expect("separate buffers run as parts");
                assert_eq!(parts.parts.len(), workers, "{descriptor}");
                parts.run_in_order(&mut memory).unwrap();
                assert!(memory == expected, "{descriptor} on {workers} cores");
            }
        }
    }
}
