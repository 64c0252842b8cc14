//! `concat[N]`: joins `N` (2 to 4) tensors along one axis. Each input `q` is viewed as
//! `outer × n_q × inner` (row-major: `outer` is the product of the dimensions before the axis,
//! `inner` of those after it) and the output as `outer × (n_0 + ... + n_{N-1}) × inner`. Pure
//! data movement: every element is copied bit for bit, in f32 and in i32.
//!
//! Parameters: the inputs `a, b[, c[, d]]`, `out`, then `outer, n_a, n_b[, n_c[, n_d]], inner`.
//! A row grid ([`RowGrid::Spread`]): row `o` of the output is the `o`-th slab of every input,
//! one after another.

use std::fmt;

use tensor_wasm_gpu::{KernelArg, LaunchConfig};

use super::rows::{spread_prologue, RowGrid, RowOp, RowRun};
use super::{parse_int, product, Kind};
use crate::contract::{Param, ParamKind, Shape};
use crate::cpu::{Element, Stage};
use crate::emit::{global_pointer, ins, label, Ops};
use crate::{Dtype, JitError};

/// How many tensors a `concat[N]` joins: 2, 3 or 4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConcatInputs(pub u32);

const INPUT_NAMES: [&str; 4] = ["a", "b", "c", "d"];
const SIZE_NAMES: [&str; 4] = ["n_a", "n_b", "n_c", "n_d"];

/// `outer, n_0.., inner` of a shape, when it has `inputs + 2` sizes.
fn sizes(shape: &Shape, inputs: usize) -> Option<(u32, Vec<u32>, u32)> {
    let sizes = shape.sizes();
    if !matches!(shape, Shape::Sizes { .. }) || sizes.len() != inputs + 2 {
        return None;
    }
    Some((sizes[0], sizes[1..=inputs].to_vec(), sizes[inputs + 1]))
}

impl Kind for ConcatInputs {
    const NAME: &'static str = "concat";
    const EXAMPLES: &'static [&'static str] = &["concat[2]", "concat[3]", "concat[4]"];
    const RANDOM_CASES: u32 = 24;

    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError> {
        parse_int(descriptor, params).map(ConcatInputs)
    }

    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }

    fn check(&self, _dtype: Dtype) -> Result<(), String> {
        if !(2..=4).contains(&self.0) {
            return Err(format!("concat joins 2 to 4 tensors, not {}", self.0));
        }
        Ok(())
    }

    fn params(&self, _dtype: Dtype) -> Vec<Param> {
        let n = self.0 as usize;
        let mut params: Vec<Param> = INPUT_NAMES[..n]
            .iter()
            .map(|name| Param::new(name, ParamKind::Input))
            .collect();
        params.push(Param::new("out", ParamKind::Output));
        params.push(Param::new("outer", ParamKind::U32));
        params.extend(
            SIZE_NAMES[..n]
                .iter()
                .map(|name| Param::new(name, ParamKind::U32)),
        );
        params.push(Param::new("inner", ParamKind::U32));
        params
    }

    fn grid_axes(&self) -> usize {
        RowGrid::Spread.axes()
    }

    fn grid(&self, shape: &Shape) -> Option<[u64; 3]> {
        let (outer, lens, inner) = sizes(shape, self.0 as usize)?;
        let along: u64 = lens.iter().map(|&n| u64::from(n)).sum();
        let row_len = along.saturating_mul(u64::from(inner));
        Some(RowGrid::Spread.grid(u64::from(outer), row_len))
    }

    fn shape(&self, sizes: &[u32]) -> Option<Shape> {
        (sizes.len() == self.0 as usize + 2).then(|| Shape::of_sizes(sizes))
    }

    fn buffer_elements(&self, shape: &Shape, _buffers: usize) -> Vec<Option<u64>> {
        let Some((outer, lens, inner)) = sizes(shape, self.0 as usize) else {
            return Vec::new();
        };
        let mut elements: Vec<Option<u64>> =
            lens.iter().map(|&n| product(&[outer, n, inner])).collect();
        let along: u64 = lens.iter().map(|&n| u64::from(n)).sum();
        let total = product(&[outer, inner]).and_then(|slab| slab.checked_mul(along));
        elements.push(total);
        elements
    }

    fn emit(&self, _dtype: Dtype, _params: &[Param], _ops: &Ops, out: &mut String) {
        let n = self.0 as usize;
        ins!(out, "ld.param.u32 %r4, [p_outer];");
        ins!(out, "cvt.u64.u32 %rd3, %r4;");
        ins!(out, "ld.param.u32 %r5, [p_inner];");
        ins!(out, "cvt.u64.u32 %rd7, %r5;");
        ins!(out, "mov.u64 %rd4, 0;");
        for size in &SIZE_NAMES[..n] {
            ins!(out, "ld.param.u32 %r6, [p_{size}];");
            ins!(out, "cvt.u64.u32 %rd6, %r6;");
            ins!(out, "add.u64 %rd4, %rd4, %rd6;");
        }
        ins!(out, "mul.lo.u64 %rd4, %rd4, %rd7; // row length");
        spread_prologue(out);
        ins!(out, "mov.u64 %rd12, %rd2; // element of the output row");
        for (q, size) in SIZE_NAMES[..n].iter().enumerate() {
            ins!(out, "ld.param.u32 %r6, [p_{size}];");
            ins!(out, "cvt.u64.u32 %rd6, %r6;");
            ins!(out, "mul.lo.u64 %rd6, %rd6, %rd7; // slab of input {q}");
            ins!(out, "setp.lt.u64 %p2, %rd2, %rd6;");
            ins!(out, "@%p2 bra TAKE_{q};");
            ins!(out, "sub.u64 %rd2, %rd2, %rd6;");
        }
        ins!(out, "bra DONE;");
        for (q, name) in INPUT_NAMES[..n].iter().enumerate() {
            label!(out, &format!("TAKE_{q}"));
            ins!(out, "mad.lo.u64 %rd10, %rd1, %rd6, %rd2;");
            ins!(out, "shl.b64 %rd10, %rd10, 2;");
            global_pointer(out, 11, name);
            ins!(out, "add.u64 %rd11, %rd11, %rd10;");
            ins!(out, "ld.global.b32 %v1, [%rd11];");
            ins!(out, "bra STORE;");
        }
        label!(out, "STORE");
        ins!(out, "mad.lo.u64 %rd13, %rd1, %rd4, %rd12;");
        ins!(out, "shl.b64 %rd13, %rd13, 2;");
        global_pointer(out, 14, "out");
        ins!(out, "add.u64 %rd14, %rd14, %rd13;");
        ins!(out, "st.global.b32 [%rd14], %v1;");
    }

    fn plan<T: Element>(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        shape: &Shape,
        buffers: &[usize],
    ) -> Result<Stage<T>, JitError> {
        let n = self.0 as usize;
        let (Some((outer, lens, inner)), Some((&out, inputs))) =
            (sizes(shape, n), buffers.split_last())
        else {
            return Err(JitError::InvalidLaunch(format!("concat[{n}]: {args:?}")));
        };
        // Validation checked every buffer against the memory, so these fit in usize.
        let slabs: Vec<usize> = lens.iter().map(|&len| (len * inner) as usize).collect();
        let ranges = inputs
            .iter()
            .zip(&slabs)
            .map(|(&at, &slab)| at..at + 4 * slab * outer as usize)
            .collect();
        let row_len = slabs.iter().sum();
        let op = Concat { slabs };
        Ok(Box::new(RowRun::<T, _>::new(
            op,
            RowGrid::Spread,
            config,
            ranges,
            out,
            outer as usize,
            row_len,
        )))
    }

    fn case_shape(&self, dims: [u32; 5]) -> Shape {
        let mut sizes = vec![dims[0] % 5];
        sizes.extend((0..self.0 as usize).map(|q| dims[1 + q % 3].wrapping_add(q as u32) % 9));
        sizes.push(dims[4] % 40);
        Shape::of_sizes(&sizes)
    }

    fn suite_shapes(&self) -> [Shape; 2] {
        let n = self.0 as usize;
        let mut odd = vec![3];
        odd.extend((0..n).map(|q| 5 + 2 * q as u32));
        odd.push(37);
        let mut large = vec![64];
        large.extend((0..n).map(|q| 100 + q as u32));
        large.push(129);
        [Shape::of_sizes(&odd), Shape::of_sizes(&large)]
    }
}

/// A row of a concat: input `q`'s slab (`slabs[q]` elements) after the slabs before it.
#[derive(Debug)]
struct Concat {
    slabs: Vec<usize>,
}

impl<T: Element> RowOp<T> for Concat {
    fn row_work(&self) -> usize {
        self.slabs.iter().sum()
    }

    fn row(&self, row: usize, inputs: &[&[u8]], out: &mut [u8]) {
        let mut start = 0;
        for (input, &slab) in inputs.iter().zip(&self.slabs) {
            if start >= out.len() {
                break;
            }
            let take = (4 * slab).min(out.len() - start);
            let from = 4 * row * slab;
            out[start..start + take].copy_from_slice(&input[from..from + take]);
            start += 4 * slab;
        }
    }
}
