//! `gather[rows]`: picks rows of a table by index (ONNX Gather on axis 0, an embedding
//! lookup). The table is `rows × cols` elements of the blueprint's dtype (f32 or i32), the
//! indices are `n` i32 whatever the dtype, and output row `i` is table row `indices[i]`, bits
//! copied. An index `k` with `-rows <= k < rows` selects row `k` (a negative one counts from
//! the end, as ONNX does); any other index writes a row of zero bits, since a kernel cannot
//! fail halfway through a launch.
//!
//! Parameters: `table, indices, out, rows, cols, n`. A row grid ([`RowGrid::Spread`]) over the
//! output: row `i` is index `i`, `cols` elements long.

use std::fmt;

use tensor_wasm_gpu::{KernelArg, LaunchConfig};

use super::copy::{CopyOp, CopyRows, CopyRun, Cursor, Word};
use super::rows::{spread_prologue, RowGrid};
use super::{product, Kind};
use crate::conformance::Rng;
use crate::contract::{Param, ParamKind, Shape};
use crate::cpu::{Element, Stage};
use crate::emit::{global_pointer, ins, label, Ops};
use crate::{Dtype, JitError};

/// The one form of `gather`: `gather[rows]`, whole rows of a table (axis 0).
///
/// Launch contract: `table, indices, out, rows, cols, n`; `table` holds `rows × cols`
/// elements, `indices` `n` i32, `out` `n × cols` elements; block `[256, 1, 1]`, grid
/// `[n, ceil(cols / 256), 1]`: thread `t` of block `(i, y)` writes element `y * 256 + t` of
/// output row `i`. An index outside `-rows..rows` gives a row of zero bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GatherRows;

/// Elements of a table row copied per piece of a step.
const ROW_CHUNK: usize = 1 << 14;

/// `rows, cols, n` of a shape.
fn sizes(shape: &Shape) -> Option<[u32; 3]> {
    match (shape, shape.sizes().as_slice()) {
        (Shape::Sizes { .. }, &[rows, cols, n]) => Some([rows, cols, n]),
        _ => None,
    }
}

/// The table row index `index` selects among `rows`, `None` when it is out of range.
fn table_row(index: i32, rows: u64) -> Option<u64> {
    let index = i64::from(index);
    // rows < 2^32, so neither sum overflows; a negative result is out of range.
    let row = if index < 0 {
        index + rows as i64
    } else {
        index
    };
    u64::try_from(row).ok().filter(|&row| row < rows)
}

impl Kind for GatherRows {
    const NAME: &'static str = "gather";
    const EXAMPLES: &'static [&'static str] = &["gather[rows]"];
    const RANDOM_CASES: u32 = 24;

    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError> {
        if params != "rows" {
            return Err(JitError::parse(
                descriptor,
                format!("{params:?}: gather takes whole rows of a table, gather[rows]"),
            ));
        }
        Ok(GatherRows)
    }

    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("rows")
    }

    fn params(&self, _dtype: Dtype) -> Vec<Param> {
        vec![
            Param::new("table", ParamKind::Input),
            Param::new("indices", ParamKind::Input),
            Param::new("out", ParamKind::Output),
            Param::new("rows", ParamKind::U32),
            Param::new("cols", ParamKind::U32),
            Param::new("n", ParamKind::U32),
        ]
    }

    fn grid_axes(&self) -> usize {
        RowGrid::Spread.axes()
    }

    fn grid(&self, shape: &Shape) -> Option<[u64; 3]> {
        let [_, cols, n] = sizes(shape)?;
        Some(RowGrid::Spread.grid(u64::from(n), u64::from(cols)))
    }

    fn shape(&self, sizes: &[u32]) -> Option<Shape> {
        (sizes.len() == 3).then(|| Shape::of_sizes(sizes))
    }

    fn buffer_elements(&self, shape: &Shape, _buffers: usize) -> Vec<Option<u64>> {
        let Some([rows, cols, n]) = sizes(shape) else {
            return Vec::new();
        };
        vec![
            product(&[rows, cols]),
            Some(u64::from(n)),
            product(&[n, cols]),
        ]
    }

    fn emit(&self, _dtype: Dtype, _params: &[Param], _ops: &Ops, out: &mut String) {
        ins!(out, "ld.param.u32 %r4, [p_n];");
        ins!(out, "cvt.u64.u32 %rd3, %r4; // output rows");
        ins!(out, "ld.param.u32 %r5, [p_cols];");
        ins!(out, "cvt.u64.u32 %rd4, %r5; // row length");
        ins!(out, "ld.param.u32 %r6, [p_rows];");
        ins!(out, "cvt.u64.u32 %rd6, %r6; // table rows");
        spread_prologue(out);
        ins!(out, "shl.b64 %rd10, %rd1, 2;");
        global_pointer(out, 11, "indices");
        ins!(out, "add.u64 %rd11, %rd11, %rd10;");
        ins!(out, "ld.global.b32 %r7, [%rd11];");
        ins!(out, "cvt.s64.s32 %rd12, %r7; // the index");
        ins!(out, "add.s64 %rd13, %rd12, %rd6;");
        ins!(out, "setp.lt.s64 %p2, %rd12, 0;");
        ins!(
            out,
            "selp.b64 %rd12, %rd13, %rd12, %p2; // negative: from the end"
        );
        ins!(out, "mov.b32 %v1, 0;");
        ins!(
            out,
            "setp.ge.u64 %p3, %rd12, %rd6; // guard: 0 <= row < rows (unsigned)"
        );
        ins!(out, "@%p3 bra STORE;");
        ins!(out, "mad.lo.u64 %rd14, %rd12, %rd4, %rd2;");
        ins!(out, "shl.b64 %rd14, %rd14, 2;");
        global_pointer(out, 15, "table");
        ins!(out, "add.u64 %rd15, %rd15, %rd14;");
        ins!(out, "ld.global.b32 %v1, [%rd15];");
        label!(out, "STORE");
        ins!(out, "mad.lo.u64 %rd16, %rd1, %rd4, %rd2;");
        ins!(out, "shl.b64 %rd16, %rd16, 2;");
        global_pointer(out, 17, "out");
        ins!(out, "add.u64 %rd17, %rd17, %rd16;");
        ins!(out, "st.global.b32 [%rd17], %v1;");
    }

    fn plan<T: Element>(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        shape: &Shape,
        buffers: &[usize],
    ) -> Result<Stage<T>, JitError> {
        let (Some([rows, cols, n]), &[table, indices, out]) = (sizes(shape), buffers) else {
            return Err(JitError::InvalidLaunch(format!("gather: {args:?}")));
        };
        // Validation checked every buffer against the memory, so these fit in usize.
        let (rows, cols, n) = (rows as usize, cols as usize, n as usize);
        let (covered, covered_cols) = RowGrid::Spread.covered(config, n, cols);
        let copy = GatherCopy {
            table_rows: rows as u64,
        };
        let layout = CopyRows {
            row_len: cols,
            rows: covered,
            cols: covered_cols,
            unit_rows: 1,
            limit: usize::MAX,
        };
        let inputs = vec![table..table + 4 * rows * cols, indices..indices + 4 * n];
        Ok(Box::new(CopyRun::new(copy, layout, inputs, out)))
    }

    fn case_shape(&self, dims: [u32; 5]) -> Shape {
        Shape::of_sizes(&[dims[0] % 40, dims[1] % 300, dims[2] % 40])
    }

    fn suite_shapes(&self) -> [Shape; 2] {
        [
            Shape::of_sizes(&[37, 129, 19]),
            Shape::of_sizes(&[1000, 768, 4096]),
        ]
    }

    fn case_input(&self, dtype: Dtype, input: usize, shape: &Shape, rng: &mut Rng) -> u32 {
        let rows = sizes(shape).map_or(0, |[rows, _, _]| u64::from(rows));
        if input != 1 || rows == 0 {
            return rng.bits(dtype);
        }
        // Mostly rows of the table, counted from either end; some just out of range on
        // either side; some anything.
        let rows = rows as i64;
        let index = match rng.below(8) {
            0..=3 => rng.below(rows as u64) as i64,
            4 | 5 => -1 - rng.below(rows as u64) as i64,
            6 if rng.below(2) == 0 => rows + rng.below(3) as i64,
            6 => -rows - 1 - rng.below(3) as i64,
            _ => i64::from(rng.i32_bits() as i32),
        };
        index as i32 as u32
    }
}

/// A gather on the CPU: units are output rows, as long as table rows.
#[derive(Debug)]
struct GatherCopy {
    table_rows: u64,
}

impl CopyOp for GatherCopy {
    fn copy(
        &self,
        rows: &CopyRows,
        cursor: &mut Cursor,
        inputs: &[&[Word]],
        out: &mut [Word],
        origin: usize,
        work: usize,
    ) {
        let (table, indices) = (inputs[0], inputs[1]);
        let mut spent = 0;
        while cursor.unit < cursor.end && spent < work {
            let row = cursor.unit;
            let stop = rows.cols.min(cursor.b + ROW_CHUNK);
            let to = (row - origin) * rows.row_len;
            let into = &mut out[to + cursor.b..to + stop];
            match table_row(i32::from_le_bytes(indices[row]), self.table_rows) {
                // The row is below `table_rows`, whose rows lie in the table buffer.
                Some(from) => {
                    let from = from as usize * rows.row_len;
                    into.copy_from_slice(&table[from + cursor.b..from + stop]);
                }
                None => into.fill([0; 4]),
            }
            spent += stop - cursor.b + 8;
            if stop < rows.cols {
                cursor.b = stop;
            } else {
                cursor.b = 0;
                cursor.unit += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Blueprint;

    #[test]
    fn only_rows_is_a_gather_and_indices_resolve_as_onnx_says() {
        let blueprint = Blueprint::parse("gather[rows]:i32").unwrap();
        assert_eq!(blueprint.descriptor(), "gather[rows]:i32");
        assert_eq!(blueprint.entry_name(), "tw_gather_rows_i32");
        for text in ["gather[]", "gather[0]", "gather[cols]", "gather[rows,1]"] {
            let error = Blueprint::parse(text).expect_err(text).to_string();
            assert!(error.contains("gather[rows]"), "{text}: {error}");
        }
        assert_eq!(table_row(0, 3), Some(0));
        assert_eq!(table_row(2, 3), Some(2));
        assert_eq!(table_row(-1, 3), Some(2));
        assert_eq!(table_row(-3, 3), Some(0));
        assert_eq!(table_row(3, 3), None);
        assert_eq!(table_row(-4, 3), None);
        assert_eq!(table_row(i32::MIN, 3), None);
        assert_eq!(
            table_row(i32::MAX, u64::from(u32::MAX)),
            Some(i32::MAX as u64)
        );
        assert_eq!(
            table_row(-1, u64::from(u32::MAX)),
            Some(u64::from(u32::MAX) - 1)
        );
        assert_eq!(table_row(0, 0), None);
    }

    #[test]
    fn rows_are_picked_from_either_end_and_out_of_range_rows_are_zero() {
        // A 3 x 2 f32 table, indices [2, -1, 0, 3, -4, -3], 6 x 2 output.
        let table = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let indices = [2i32, -1, 0, 3, -4, -3];
        let mut memory = vec![0xeeu8; 4 * (6 + 6 + 12)];
        for (i, value) in table.iter().enumerate() {
            memory[4 * i..4 * i + 4].copy_from_slice(&value.to_le_bytes());
        }
        for (i, index) in indices.iter().enumerate() {
            memory[24 + 4 * i..28 + 4 * i].copy_from_slice(&index.to_le_bytes());
        }
        let blueprint = Blueprint::parse("gather[rows]").unwrap();
        let shape = Shape::of_sizes(&[3, 2, 6]);
        let config = blueprint.launch_config(&shape).unwrap();
        let args = [
            KernelArg::Buffer { offset: 0, len: 24 },
            KernelArg::Buffer {
                offset: 24,
                len: 24,
            },
            KernelArg::Buffer {
                offset: 48,
                len: 48,
            },
            KernelArg::U32(3),
            KernelArg::U32(2),
            KernelArg::U32(6),
        ];
        blueprint.run_cpu(&config, &args, &mut memory).unwrap();
        let out: Vec<f32> = memory[48..]
            .chunks_exact(4)
            .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect();
        assert_eq!(
            out,
            [5.0, 6.0, 5.0, 6.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0]
        );
        assert!(out.iter().all(|v| v.to_bits() != 0x8000_0000), "+0, not -0");
    }

    #[test]
    fn conformance_indices_hit_rows_from_both_ends_and_miss_on_both_sides() {
        let shape = Shape::of_sizes(&[10, 4, 0]);
        let mut rng = Rng(7);
        let drawn: Vec<i32> = (0..400)
            .map(|_| GatherRows.case_input(Dtype::F32, 1, &shape, &mut rng) as i32)
            .collect();
        assert!(drawn.iter().any(|&k| (0..10).contains(&k)));
        assert!(drawn.iter().any(|&k| (-10..0).contains(&k)));
        assert!(drawn.iter().any(|&k| k >= 10));
        assert!(drawn.iter().any(|&k| k < -10));
    }
}
