//! The blueprint catalogue: one module per kind, and one line per kind in the `catalogue!`
//! call at the end of this file.
//!
//! A kind is a type implementing [`Kind`]: its descriptor grammar (`NAME[PARAMS]`), its limits,
//! its launch contract (parameters, block, grid, buffer sizes), its PTX, its CPU steps and the
//! shapes it is tested on. Everything else — the parser, [`crate::Blueprint`]'s contract
//! checks, the CPU backend's runs and parts, the conformance set read by the interpreter's
//! suite, the `ptxas` test and the GPU suite — reaches a kind only through that trait.
//!
//! Adding a kind (the recipe in docs/ARCHITECTURE.md): write `kinds/NAME.rs` with a parameter
//! type implementing [`Kind`], declare the module below, and add one line
//! `Variant(module::Type),` to the `catalogue!` call.

use std::fmt;

use tensor_wasm_gpu::{CpuParts, KernelArg, LaunchConfig};

use crate::conformance::Rng;
use crate::contract::{Param, Shape, BLOCK_1D};
use crate::cpu::{Element, Stage};
use crate::emit::Ops;
use crate::{Dtype, JitError};

pub(crate) mod bmm;
pub(crate) mod chain;
pub(crate) mod concat;
pub(crate) mod conv2d;
mod conv_packed;
pub(crate) mod copy;
pub(crate) mod dwconv;
pub(crate) mod elementwise;
pub(crate) mod gather;
pub(crate) mod layernorm;
pub(crate) mod matmul;
pub(crate) mod permute;
pub(crate) mod pool;
pub(crate) mod reduce;
pub(crate) mod rows;
pub(crate) mod softmax;
pub(crate) mod vector_add;

/// What one blueprint kind defines. `Self` is the kind's parameters (what the brackets of its
/// descriptor hold).
pub(crate) trait Kind: Copy + fmt::Debug + Sized {
    /// The descriptor name before `[`.
    const NAME: &'static str;
    /// The parameter choices the conformance set checks (descriptors without a dtype), each
    /// in f32 and in i32 where the kind is defined for it.
    const EXAMPLES: &'static [&'static str];
    /// Random cases per example in the interpreter's conformance run.
    const RANDOM_CASES: u32 = 16;

    /// The parameters from the text between the brackets.
    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError>;

    /// The canonical text between the brackets.
    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;

    /// Limits: `Err(reason)` when these parameters or this dtype are outside them.
    fn check(&self, _dtype: Dtype) -> Result<(), String> {
        Ok(())
    }

    /// Launch parameters in order: input buffers, the output, then scalars.
    fn params(&self, dtype: Dtype) -> Vec<Param>;

    /// The block every launch uses.
    fn block(&self) -> [u32; 3] {
        [BLOCK_1D, 1, 1]
    }

    /// Grid axes the kernel reads (the others must be 1).
    fn grid_axes(&self) -> usize {
        1
    }

    /// The grid covering `shape` (unclamped block counts), `None` for another kind's shape.
    fn grid(&self, shape: &Shape) -> Option<[u64; 3]>;

    /// The shape named by a launch's `u32` scalars in parameter order.
    fn shape(&self, sizes: &[u32]) -> Option<Shape>;

    /// Elements each buffer must hold for `shape`, in parameter order (`None`: over 64 bits);
    /// `buffers` is how many buffer parameters the kind has.
    fn buffer_elements(&self, shape: &Shape, buffers: usize) -> Vec<Option<u64>>;

    /// Byte alignment of every buffer offset.
    fn buffer_alignment(&self) -> u64 {
        4
    }

    /// Whether the output may be exactly an input (same offset).
    fn in_place(&self) -> bool {
        false
    }

    /// Module-scope PTX declarations (shared memory) before the entry.
    fn shared_ptx(&self, _dtype: Dtype) -> String {
        String::new()
    }

    /// The entry's body, after the standard register declarations; it ends by falling through
    /// or branching to `DONE`.
    fn emit(&self, dtype: Dtype, params: &[Param], ops: &Ops, out: &mut String);

    /// The CPU run of a validated launch. `buffers` are the buffer offsets in parameter order.
    fn plan<T: Element>(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        shape: &Shape,
        buffers: &[usize],
    ) -> Result<Stage<T>, JitError>;

    /// The shape of a conformance case from five drawn numbers (each small, near 256 or below
    /// 700): small enough for the interpreter.
    fn case_shape(&self, dims: [u32; 5]) -> Shape;

    /// Two shapes the GPU suite launches (one odd-sized, one larger).
    fn suite_shapes(&self) -> [Shape; 2];

    /// The bits of the next element of input buffer `input` (its index among the buffer
    /// parameters) in a conformance case of `shape`: by default any value of `dtype`, edge
    /// values included. Kinds whose inputs must mean something (indices) draw their own.
    fn case_input(&self, dtype: Dtype, _input: usize, _shape: &Shape, rng: &mut Rng) -> u32 {
        rng.bits(dtype)
    }
}

/// A kind's CPU run in steps, for kinds whose run is not one of [`Stage`]'s built-in forms.
pub(crate) trait KindRun<T>: fmt::Debug + Send {
    /// Computes about `work` operations over the guest `memory`; `true` once all is computed.
    fn step(&mut self, memory: &mut [u8], work: usize) -> bool;

    /// The same run as parts for up to `workers` cores, `None` when it must run in one piece.
    fn parts(self: Box<Self>, workers: usize) -> Option<CpuParts>;
}

/// Declares [`BlueprintKind`] with one variant per kind and the dispatch over them. The
/// leading `$` is passed in so the generated `with_kind!` macro can have metavariables.
macro_rules! catalogue {
    ($d:tt $($(#[$doc:meta])* $variant:ident($ty:ty),)*) => {
        /// What a blueprint computes, without its element type: one variant per kind of the
        /// catalogue (`crate::kinds`), holding that kind's parameters.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum BlueprintKind {
            $($(#[$doc])* $variant($ty),)*
        }

        /// Evaluates `$body` with `$k` bound to the kind's parameters (each a [`Kind`]).
        macro_rules! with_kind {
            ($d kind:expr, |$d k:ident| $d body:expr) => {
                match $d kind {
                    $(crate::kinds::BlueprintKind::$variant($d k) => $d body,)*
                }
            };
        }
        pub(crate) use with_kind;

        /// Every kind's descriptor name, in catalogue order.
        pub const KIND_NAMES: &[&str] = &[$(<$ty as Kind>::NAME,)*];

        /// The kind named `name` with the parameters `params`; `None` for an unknown name.
        pub(crate) fn parse_kind(
            descriptor: &str,
            name: &str,
            params: &str,
        ) -> Option<Result<BlueprintKind, JitError>> {
            $(if name == <$ty as Kind>::NAME {
                return Some(<$ty as Kind>::parse(descriptor, params).map(BlueprintKind::$variant));
            })*
            None
        }

        /// Every kind's conformance examples (without a dtype), in catalogue order.
        pub fn examples() -> Vec<&'static str> {
            let mut all = Vec::new();
            $(all.extend_from_slice(<$ty as Kind>::EXAMPLES);)*
            all
        }
    };
}

catalogue! {$
    /// `elementwise[OP]`: one element per thread.
    Elementwise(elementwise::ElementwiseOp),
    /// `vector_add[N]`: `out = a + b`, `N` consecutive elements per thread.
    VectorAdd(vector_add::Lanes),
    /// `reduce[OP]`: one output per row of a rows × cols row-major matrix.
    Reduce(reduce::ReduceOp),
    /// `matmul[TMxTNxTK]`: C (m × n) = A (m × k) · B (k × n), row-major.
    Matmul(matmul::MatmulTile),
    /// `conv2d[RxS,sT,pP]`: NCHW input, KCRS weights, NKPQ output.
    Conv2d(conv2d::Conv2dParams),
    /// `concat[N]`: `N` tensors joined along one axis.
    Concat(concat::ConcatInputs),
    /// `permute[P]`: the axes of a 2- to 4-dimensional tensor reordered.
    Permute(permute::Permutation),
    /// `gather[rows]`: rows of a table picked by i32 indices.
    Gather(gather::GatherRows),
    /// `bmm[XY]`: batched C (m × n) = op(A) · op(B), X and Y `n` (normal) or `t` (transposed).
    Bmm(bmm::BmmLayout),
    /// `maxpool[RxS,sT,pP]`: 2-D max pooling over NCHW, padding taps skipped.
    MaxPool(pool::MaxPool),
    /// `avgpool[RxS,sT,pP]`: 2-D average pooling over NCHW, over the in-range taps.
    AvgPool(pool::AvgPool),
    /// `dwconv2d[RxS,sT,pP]`: depthwise 2-D convolution, one filter per channel of NCHW.
    DwConv2d(dwconv::DepthwiseConv2d),
    /// `softmax[axis]`: softmax along one axis, max-subtracted (f32).
    Softmax(softmax::SoftmaxAxis),
    /// `layernorm[rows]`: each row normalised, scaled and shifted (f32).
    LayerNorm(layernorm::LayerNormRows),
    /// `chain[OP1.OP2...]`: 2 to 4 element-wise operations fused, one element per thread (f32).
    Chain(chain::Chain),
}

impl BlueprintKind {
    /// The descriptor name before `[`.
    pub fn name(&self) -> &'static str {
        fn name<K: Kind>(_: &K) -> &'static str {
            K::NAME
        }
        with_kind!(self, |k| name(k))
    }

    /// Random conformance cases of this kind.
    pub(crate) fn random_cases(&self) -> u32 {
        fn cases<K: Kind>(_: &K) -> u32 {
            K::RANDOM_CASES
        }
        with_kind!(self, |k| cases(k))
    }
}

/// Parses a decimal of 1 to 4 digits without a leading zero (the grammar's `int`).
pub(crate) fn parse_int(descriptor: &str, text: &str) -> Result<u32, JitError> {
    let valid = !text.is_empty()
        && text.len() <= 4
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    if !valid {
        return Err(JitError::parse(
            descriptor,
            format!("{text:?} is not a number (1 to 4 digits, no leading zero)"),
        ));
    }
    text.parse()
        .map_err(|_| JitError::parse(descriptor, format!("{text:?} is not a number")))
}

/// `ceil(items / per_block)`, at least 1.
pub(crate) fn blocks(items: u64, per_block: u64) -> u64 {
    items.div_ceil(per_block).max(1)
}

/// The product of `values` as u64, `None` on overflow.
pub(crate) fn product(values: &[u32]) -> Option<u64> {
    values
        .iter()
        .try_fold(1u64, |acc, v| acc.checked_mul(u64::from(*v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_docs_name_every_kind() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/kernels.md");
        let docs = std::fs::read_to_string(path).expect("docs/kernels.md");
        for name in KIND_NAMES {
            assert!(
                docs.contains(&format!("| `{name}[")),
                "docs/kernels.md has no row for the kind {name}"
            );
        }
    }

    #[test]
    fn every_kind_has_examples_that_parse() {
        for example in examples() {
            let parses = |dtype| crate::Blueprint::parse(&format!("{example}:{dtype}")).is_ok();
            assert!(parses("f32") || parses("i32"), "{example}");
        }
    }
}
