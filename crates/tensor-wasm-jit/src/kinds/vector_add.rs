//! `vector_add[N]`: `out = a + b`, `N` consecutive elements per thread.

use std::fmt;

use tensor_wasm_gpu::{KernelArg, LaunchConfig};

use super::elementwise::{self, ElementwiseOp};
use super::{blocks, parse_int, Kind};
use crate::contract::{Param, ParamKind, Shape, BLOCK_1D};
use crate::cpu::{covered, Element, Stage};
use crate::emit::{global_index_1d, global_pointer, ins, label, Ops};
use crate::{Dtype, JitError};

/// Elements per thread of `vector_add[N]`: 1, 2, 4, 8 or 16.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lanes(pub u32);

impl Kind for Lanes {
    const NAME: &'static str = "vector_add";
    const EXAMPLES: &'static [&'static str] = &[
        "vector_add[1]",
        "vector_add[2]",
        "vector_add[4]",
        "vector_add[8]",
        "vector_add[16]",
    ];
    const RANDOM_CASES: u32 = 32;

    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError> {
        parse_int(descriptor, params).map(Lanes)
    }

    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }

    fn check(&self, _dtype: Dtype) -> Result<(), String> {
        if !matches!(self.0, 1 | 2 | 4 | 8 | 16) {
            return Err(format!(
                "vector_add lanes must be 1, 2, 4, 8 or 16, not {}",
                self.0
            ));
        }
        Ok(())
    }

    fn params(&self, _dtype: Dtype) -> Vec<Param> {
        vec![
            Param::new("a", ParamKind::Input),
            Param::new("b", ParamKind::Input),
            Param::new("out", ParamKind::Output),
            Param::new("n", ParamKind::U32),
        ]
    }

    fn grid(&self, shape: &Shape) -> Option<[u64; 3]> {
        let Shape::Elements { n } = shape else {
            return None;
        };
        let threads = u64::from(*n).div_ceil(u64::from(self.0));
        Some([blocks(threads, u64::from(BLOCK_1D)), 1, 1])
    }

    fn shape(&self, sizes: &[u32]) -> Option<Shape> {
        match sizes {
            &[n] => Some(Shape::Elements { n }),
            _ => None,
        }
    }

    fn buffer_elements(&self, shape: &Shape, buffers: usize) -> Vec<Option<u64>> {
        elementwise::elements(shape, buffers)
    }

    /// `4 * min(N, 4)`: the fast path uses vector loads of up to 16 bytes.
    fn buffer_alignment(&self) -> u64 {
        4 * u64::from(self.0.min(4))
    }

    fn in_place(&self) -> bool {
        true
    }

    fn emit(&self, _dtype: Dtype, _params: &[Param], ops: &Ops, out: &mut String) {
        vector_add(out, ops, self.0);
    }

    fn plan<T: Element>(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        shape: &Shape,
        buffers: &[usize],
    ) -> Result<Stage<T>, JitError> {
        let Shape::Elements { n } = shape else {
            return Err(JitError::InvalidLaunch(format!("{shape:?} for vector_add")));
        };
        let count = covered(config, u64::from(self.0), u64::from(*n));
        elementwise::plan(ElementwiseOp::Add, count, args, buffers)
    }

    fn case_shape(&self, dims: [u32; 5]) -> Shape {
        Shape::Elements { n: dims[0] }
    }

    fn suite_shapes(&self) -> [Shape; 2] {
        [Shape::Elements { n: 1003 }, Shape::Elements { n: 70_001 }]
    }
}

/// Thread `t` adds elements `t*lanes .. t*lanes + lanes` (those below n): vector loads of up to
/// four lanes when the whole group is in range, one guarded element at a time otherwise.
fn vector_add(out: &mut String, ops: &Ops, lanes: u32) {
    global_index_1d(out);
    ins!(
        out,
        "mul.lo.u64 %rd4, %rd1, {lanes}; // first element of this thread"
    );
    ins!(out, "ld.param.u32 %r3, [p_n];");
    ins!(out, "cvt.u64.u32 %rd2, %r3;");
    ins!(out, "setp.ge.u64 %p1, %rd4, %rd2; // guard: first < n");
    ins!(out, "@%p1 bra DONE;");
    ins!(out, "shl.b64 %rd3, %rd4, 2;");
    for (reg, name) in [(10, "a"), (11, "b"), (12, "out")] {
        global_pointer(out, reg, name);
        ins!(out, "add.u64 %rd{reg}, %rd{reg}, %rd3;");
    }
    if lanes > 1 {
        ins!(out, "add.u64 %rd5, %rd4, {lanes};");
        ins!(
            out,
            "setp.gt.u64 %p2, %rd5, %rd2; // a partial group takes the guarded path"
        );
        ins!(out, "@%p2 bra TAIL;");
    }
    let width = lanes.min(4);
    let regs = |first: u32| -> String {
        let names: Vec<String> = (first..first + width).map(|r| format!("%v{r}")).collect();
        if width == 1 {
            names[0].clone()
        } else {
            format!("{{{}}}", names.join(", "))
        }
    };
    let vector = if width == 1 {
        String::new()
    } else {
        format!(".v{width}")
    };
    for chunk in 0..lanes / width {
        let offset = chunk * width * 4;
        ins!(out, "ld.global{vector}.b32 {}, [%rd10+{offset}];", regs(0));
        ins!(out, "ld.global{vector}.b32 {}, [%rd11+{offset}];", regs(4));
        for lane in 0..width {
            ins!(out, "{} %v{}, %v{lane}, %v{};", ops.add, 8 + lane, 4 + lane);
        }
        ins!(out, "st.global{vector}.b32 [%rd12+{offset}], {};", regs(8));
    }
    if lanes == 1 {
        return;
    }
    ins!(out, "bra DONE;");
    label!(out, "TAIL");
    for lane in 0..lanes {
        let offset = lane * 4;
        ins!(out, "add.u64 %rd5, %rd4, {lane};");
        ins!(out, "setp.ge.u64 %p3, %rd5, %rd2; // guard: element < n");
        ins!(out, "@%p3 bra DONE;");
        ins!(out, "ld.global.b32 %v0, [%rd10+{offset}];");
        ins!(out, "ld.global.b32 %v1, [%rd11+{offset}];");
        ins!(out, "{} %v2, %v0, %v1;", ops.add);
        ins!(out, "st.global.b32 [%rd12+{offset}], %v2;");
    }
}
