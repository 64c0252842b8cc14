//! Launch contracts: each blueprint's parameter list, the launch configuration it requires, and
//! `validate_launch`, which refuses any launch that could touch memory outside its buffers.

use tensor_wasm_gpu::{KernelArg, LaunchConfig, MAX_GRID_X, MAX_GRID_YZ};

use crate::kinds::{with_kind, Kind};
use crate::{Blueprint, JitError};

/// Threads per block of the one-dimensional kernels (element-wise, vector_add, reduce, conv2d).
pub const BLOCK_1D: u32 = 256;

/// The problem size of a launch: the `u32` shape scalars of the launch contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    /// `n` elements (element-wise, vector_add).
    Elements {
        /// Element count.
        n: u32,
    },
    /// A `rows` × `cols` row-major matrix reduced along its rows (reduce).
    Rows {
        /// Rows, one output each.
        rows: u32,
        /// Elements per row.
        cols: u32,
    },
    /// C (m × n) = A (m × k) · B (k × n) (matmul).
    Matmul {
        /// Rows of A and C.
        m: u32,
        /// Columns of B and C.
        n: u32,
        /// Columns of A, rows of B.
        k: u32,
    },
    /// Input `[n, c, h, w]`, weights `[k, c, r, s]` (conv2d).
    Conv2d {
        /// Images.
        n: u32,
        /// Input channels.
        c: u32,
        /// Input height.
        h: u32,
        /// Input width.
        w: u32,
        /// Output channels.
        k: u32,
    },
    /// The `u32` scalars of kinds without a shape of their own, in parameter order: `len` of
    /// them, the other slots 0 ([`Shape::of_sizes`]).
    Sizes {
        /// How many of `values` are used.
        len: u8,
        /// The scalars.
        values: [u32; MAX_SIZES],
    },
}

/// Most `u32` scalars a [`Shape::Sizes`] holds.
pub const MAX_SIZES: usize = 8;

impl Shape {
    /// A [`Shape::Sizes`] of `sizes` (at most [`MAX_SIZES`]; more are dropped).
    pub fn of_sizes(sizes: &[u32]) -> Shape {
        let mut values = [0; MAX_SIZES];
        let len = sizes.len().min(MAX_SIZES);
        values[..len].copy_from_slice(&sizes[..len]);
        Shape::Sizes {
            len: len as u8,
            values,
        }
    }

    /// The `u32` scalars of a launch of this shape, in parameter order.
    pub fn sizes(&self) -> Vec<u32> {
        match *self {
            Shape::Elements { n } => vec![n],
            Shape::Rows { rows, cols } => vec![rows, cols],
            Shape::Matmul { m, n, k } => vec![m, n, k],
            Shape::Conv2d { n, c, h, w, k } => vec![n, c, h, w, k],
            Shape::Sizes { len, values } => values[..usize::from(len)].to_vec(),
        }
    }
}

/// The type a kernel parameter has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// A buffer the kernel only reads ([`KernelArg::Buffer`]; `.param .u64` in PTX).
    Input,
    /// The buffer the kernel writes ([`KernelArg::Buffer`]; `.param .u64` in PTX).
    Output,
    /// A shape scalar ([`KernelArg::U32`]; `.param .u32`).
    U32,
    /// An f32 scalar ([`KernelArg::F32`]; `.param .f32`).
    F32,
    /// An i32 scalar ([`KernelArg::I32`]; `.param .s32`).
    I32,
}

/// One kernel parameter of a launch contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Param {
    /// Its name in documentation and PTX (`a`, `out`, `n`, ...).
    pub name: &'static str,
    /// Its type.
    pub kind: ParamKind,
}

impl Param {
    /// A parameter named `name` of type `kind`.
    pub(crate) const fn new(name: &'static str, kind: ParamKind) -> Param {
        Param { name, kind }
    }
}

impl Blueprint {
    /// The kernel's parameters in launch order: buffers first (inputs, then the output), then
    /// scalars. Guests pass [`KernelArg`]s in exactly this order; the PTX entry declares them in
    /// this order.
    ///
    /// Each kind declares its list (docs/kernels.md has them all); for example
    /// `elementwise[add]` takes `a, b, out, n`, `matmul[..]` takes `a, b, c, m, n, k` and
    /// `layernorm[rows]` takes `x, scale, bias, out, rows, cols, epsilon`.
    pub fn params(&self) -> Vec<Param> {
        with_kind!(self.kind(), |k| k.params(self.dtype()))
    }

    /// The block shape every launch must use.
    ///
    /// `[256, 1, 1]` for element-wise, vector_add, reduce and conv2d; `[tile.n, tile.m, 1]`
    /// for matmul.
    pub fn block(&self) -> [u32; 3] {
        with_kind!(self.kind(), |k| k.block())
    }

    /// The launch configuration covering `shape` completely:
    ///
    /// - element-wise: `grid.x = ceil(n / 256)`, thread `i` computes element `i`;
    /// - `vector_add[N]`: `grid.x = ceil(ceil(n / N) / 256)`, thread `t` computes elements
    ///   `t*N .. t*N+N`;
    /// - reduce: `grid.x = rows`, block `b` reduces row `b`;
    /// - matmul: `grid = [ceil(n / tile.n), ceil(m / tile.m), 1]`, thread `(x, y)` of block
    ///   `(bx, by)` computes `c[by*tile.m + y][bx*tile.n + x]`;
    /// - conv2d: `grid = [ceil(P*Q / 256), k, n]`, thread `i` of block `(bx, ko, img)` computes
    ///   output pixel `bx*256 + i` (row-major over P × Q) of channel `ko` of image `img`.
    ///
    /// Every grid dimension is at least 1. Other grids with the same block are accepted too
    /// (see [`Blueprint::validate_launch`]); only the covered indices are computed.
    ///
    /// # Errors
    /// [`JitError::InvalidLaunch`] when `shape` is not this blueprint's kind of shape or needs
    /// more blocks than CUDA allows.
    pub fn launch_config(&self, shape: &Shape) -> Result<LaunchConfig, JitError> {
        let Some(grid) = with_kind!(self.kind(), |k| k.grid(shape)) else {
            return Err(JitError::InvalidLaunch(format!(
                "{self} does not take a shape like {shape:?}"
            )));
        };
        let limits = [
            u64::from(MAX_GRID_X),
            u64::from(MAX_GRID_YZ),
            u64::from(MAX_GRID_YZ),
        ];
        let mut config = LaunchConfig {
            grid: [1; 3],
            block: self.block(),
            shared_bytes: 0,
        };
        for (axis, (&blocks, &limit)) in grid.iter().zip(&limits).enumerate() {
            if blocks > limit {
                return Err(JitError::InvalidLaunch(format!(
                    "{shape:?} needs {blocks} blocks along axis {axis}, more than {limit}"
                )));
            }
            // At most MAX_GRID_X, so it fits in u32.
            config.grid[axis] = blocks as u32;
        }
        Ok(config)
    }

    /// The shape named by a launch's `u32` scalars, in parameter order (what
    /// [`Blueprint::launch_config`] takes); `None` when their count is not this kind's.
    pub fn shape(&self, sizes: &[u32]) -> Option<Shape> {
        with_kind!(self.kind(), |k| k.shape(sizes))
    }

    /// The shape named by the scalar arguments of a launch (which must already have the
    /// contract's count and types).
    fn shape_of(&self, args: &[KernelArg]) -> Result<Shape, JitError> {
        // After validation every `U32` argument is a `U32` parameter, in order.
        let mut sizes = [0u32; MAX_SIZES];
        let mut len = 0;
        for arg in args {
            if let KernelArg::U32(value) = arg {
                if len == MAX_SIZES {
                    len += 1;
                    break;
                }
                sizes[len] = *value;
                len += 1;
            }
        }
        let shape = (len <= MAX_SIZES)
            .then(|| with_kind!(self.kind(), |k| k.shape(&sizes[..len])))
            .flatten();
        shape.ok_or_else(|| {
            JitError::InvalidLaunch(format!("{self}: wrong number of shape scalars"))
        })
    }

    /// Elements each buffer parameter must hold for `shape`, in parameter order; `None` when
    /// the count does not fit in 64 bits.
    pub fn buffer_elements(&self, shape: &Shape) -> Vec<Option<u64>> {
        let buffers = self
            .params()
            .iter()
            .filter(|p| matches!(p.kind, ParamKind::Input | ParamKind::Output))
            .count();
        self.buffer_elements_of(shape, buffers)
    }

    /// [`Blueprint::buffer_elements`] for a kind with `buffers` buffer parameters.
    fn buffer_elements_of(&self, shape: &Shape, buffers: usize) -> Vec<Option<u64>> {
        with_kind!(self.kind(), |k| k.buffer_elements(shape, buffers))
    }

    /// Byte alignment every buffer offset must have: 4, or `4 * min(N, 4)` for `vector_add[N]`,
    /// whose fast path uses vector loads of up to 16 bytes. (Guest memory itself must start on
    /// a 16-byte boundary; the runtime's memories are page-aligned.)
    pub fn buffer_alignment(&self) -> u64 {
        with_kind!(self.kind(), |k| k.buffer_alignment())
    }

    /// Checks a launch against the contract, so that the kernel cannot touch a byte outside its
    /// buffers or outside `memory_len` bytes of guest memory. In order:
    ///
    /// 1. argument count and types equal [`Blueprint::params`];
    /// 2. `config.block` equals [`Blueprint::block`], `shared_bytes` is 0 (kernels use static
    ///    shared memory), every grid dimension is at least 1 and within CUDA's limits, and grid
    ///    dimensions the kernel does not use are 1 (y and z except for matmul and conv2d; z
    ///    except for conv2d);
    /// 3. every buffer lies inside `memory_len` (overflow-safe), is aligned to
    ///    [`Blueprint::buffer_alignment`], and holds the elements the shape needs (4 bytes
    ///    each) — the grid may be larger than the shape, the kernels guard every access by it;
    /// 4. the bytes the output buffer's shape covers do not overlap those of an input, except
    ///    that element-wise kernels and vector_add may write in place (output offset equal to
    ///    an input offset).
    ///
    /// # Errors
    /// [`JitError::InvalidLaunch`] naming the first violation.
    pub fn validate_launch(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory_len: usize,
    ) -> Result<(), JitError> {
        let invalid = |reason: String| Err(JitError::InvalidLaunch(format!("{self}: {reason}")));
        let params = self.params();
        if args.len() != params.len() {
            let names: Vec<&str> = params.iter().map(|p| p.name).collect();
            return invalid(format!(
                "expects {} arguments ({}), got {}",
                params.len(),
                names.join(", "),
                args.len()
            ));
        }
        for (param, arg) in params.iter().zip(args) {
            let ok = matches!(
                (param.kind, arg),
                (
                    ParamKind::Input | ParamKind::Output,
                    KernelArg::Buffer { .. }
                ) | (ParamKind::U32, KernelArg::U32(_))
                    | (ParamKind::F32, KernelArg::F32(_))
                    | (ParamKind::I32, KernelArg::I32(_))
            );
            if !ok {
                let expected = match param.kind {
                    ParamKind::Input | ParamKind::Output => "buffer",
                    ParamKind::U32 => "u32",
                    ParamKind::F32 => "f32",
                    ParamKind::I32 => "i32",
                };
                return invalid(format!(
                    "argument {} must be a {expected}, got a {}",
                    param.name,
                    arg.type_name()
                ));
            }
        }

        let block = self.block();
        if config.block != block {
            return invalid(format!("block must be {block:?}, got {:?}", config.block));
        }
        if config.shared_bytes != 0 {
            return invalid(format!(
                "dynamic shared memory must be 0, got {} bytes",
                config.shared_bytes
            ));
        }
        let used_axes = self.grid_axes();
        let limits = [MAX_GRID_X, MAX_GRID_YZ, MAX_GRID_YZ];
        for (axis, (&blocks, &limit)) in config.grid.iter().zip(&limits).enumerate() {
            if blocks == 0 || blocks > limit {
                return invalid(format!(
                    "grid {:?} out of range (1..={limit} along axis {axis})",
                    config.grid
                ));
            }
            if axis >= used_axes && blocks != 1 {
                return invalid(format!(
                    "grid {:?} must be 1 along unused axis {axis}",
                    config.grid
                ));
            }
        }

        let shape = self.shape_of(args)?;
        let buffer_params = params
            .iter()
            .filter(|p| matches!(p.kind, ParamKind::Input | ParamKind::Output))
            .count();
        let elements = self.buffer_elements_of(&shape, buffer_params);
        let alignment = self.buffer_alignment();
        let buffers: Vec<(&Param, u64, u64)> = params
            .iter()
            .zip(args)
            .filter_map(|(param, arg)| match arg {
                KernelArg::Buffer { offset, len } => Some((param, *offset, *len)),
                _ => None,
            })
            .collect();
        let mut used = Vec::with_capacity(buffers.len());
        for ((param, offset, len), needed) in buffers.iter().zip(&elements) {
            let name = param.name;
            let end = offset.checked_add(*len);
            if end.is_none_or(|end| end > memory_len as u64) {
                return invalid(format!(
                    "buffer {name} ({len} bytes at {offset}) lies outside the {memory_len}-byte memory"
                ));
            }
            if offset % alignment != 0 {
                return invalid(format!(
                    "buffer {name} offset {offset} is not {alignment}-byte aligned"
                ));
            }
            let needed_bytes = needed.and_then(|elements| elements.checked_mul(4));
            match needed_bytes {
                Some(bytes) if bytes <= *len => used.push((param.kind, *offset, bytes)),
                Some(bytes) => {
                    return invalid(format!(
                        "buffer {name} holds {len} bytes, the shape {shape:?} needs {bytes}"
                    ))
                }
                None => {
                    return invalid(format!(
                        "buffer {name}: the shape {shape:?} needs more bytes than fit in 64 bits"
                    ))
                }
            }
        }

        let in_place_allowed = with_kind!(self.kind(), |k| k.in_place());
        let outputs = used.iter().filter(|(kind, ..)| *kind == ParamKind::Output);
        for &(_, out_offset, out_bytes) in outputs {
            for &(_, in_offset, in_bytes) in
                used.iter().filter(|(kind, ..)| *kind == ParamKind::Input)
            {
                if in_place_allowed && in_offset == out_offset {
                    continue;
                }
                let overlap = out_bytes > 0
                    && in_bytes > 0
                    && out_offset < in_offset + in_bytes
                    && in_offset < out_offset + out_bytes;
                if overlap {
                    return invalid(format!(
                        "the output ({out_bytes} bytes at {out_offset}) overlaps an input ({in_bytes} bytes at {in_offset})"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Two shapes the GPU suite launches this blueprint on.
    pub fn suite_shapes(&self) -> [Shape; 2] {
        with_kind!(self.kind(), |k| k.suite_shapes())
    }

    /// Grid axes the kernel reads; the others must be 1.
    pub fn grid_axes(&self) -> usize {
        with_kind!(self.kind(), |k| k.grid_axes())
    }

    /// The shape a validated launch computes (its `u32` scalars).
    pub(crate) fn launch_shape(&self, args: &[KernelArg]) -> Result<Shape, JitError> {
        self.shape_of(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn buffer(offset: u64, len: u64) -> KernelArg {
        KernelArg::Buffer { offset, len }
    }

    fn matmul_args(c_len: u64) -> Vec<KernelArg> {
        // m = 3, n = 5, k = 7: a 84 bytes, b 140 bytes, c 60 bytes.
        vec![
            buffer(0, 84),
            buffer(96, 140),
            buffer(240, c_len),
            KernelArg::U32(3),
            KernelArg::U32(5),
            KernelArg::U32(7),
        ]
    }

    fn refusal(
        blueprint: &Blueprint,
        config: &LaunchConfig,
        args: &[KernelArg],
        len: usize,
    ) -> String {
        blueprint
            .validate_launch(config, args, len)
            .expect_err("launch should be refused")
            .to_string()
    }

    #[test]
    fn a_launch_with_buffers_too_small_for_its_shape_is_refused() {
        let blueprint = Blueprint::parse("matmul[16x16x16]").unwrap();
        let shape = Shape::Matmul { m: 3, n: 5, k: 7 };
        let config = blueprint.launch_config(&shape).unwrap();
        assert_eq!(config.grid, [1, 1, 1]);
        blueprint
            .validate_launch(&config, &matmul_args(60), 300)
            .unwrap();
        let error = refusal(&blueprint, &config, &matmul_args(56), 300);
        assert!(error.contains("buffer c holds 56 bytes"), "{error}");
        let mut args = matmul_args(60);
        args[0] = buffer(0, 80);
        assert!(refusal(&blueprint, &config, &args, 300).contains("buffer a"));
        // Nothing was computed: run_cpu refuses the same launch.
        let mut memory = vec![7u8; 300];
        assert!(blueprint.run_cpu(&config, &args, &mut memory).is_err());
        assert!(memory.iter().all(|&b| b == 7));

        let reduce = Blueprint::parse("reduce[sum]").unwrap();
        let config = reduce
            .launch_config(&Shape::Rows { rows: 4, cols: 10 })
            .unwrap();
        let args = [
            buffer(0, 160),
            buffer(160, 12),
            KernelArg::U32(4),
            KernelArg::U32(10),
        ];
        assert!(refusal(&reduce, &config, &args, 256).contains("buffer out"));

        let conv = Blueprint::parse("conv2d[3x3,s1,p1]").unwrap();
        let shape = Shape::Conv2d {
            n: 1,
            c: 2,
            h: 4,
            w: 4,
            k: 3,
        };
        let config = conv.launch_config(&shape).unwrap();
        assert_eq!(config.grid, [1, 3, 1]);
        // input 128 bytes, weight 216 bytes, output 1*3*4*4*4 = 192 bytes.
        let mut args = vec![
            buffer(0, 128),
            buffer(128, 216),
            buffer(352, 192),
            KernelArg::U32(1),
            KernelArg::U32(2),
            KernelArg::U32(4),
            KernelArg::U32(4),
            KernelArg::U32(3),
        ];
        conv.validate_launch(&config, &args, 544).unwrap();
        args[2] = buffer(352, 188);
        assert!(refusal(&conv, &config, &args, 544).contains("buffer output"));
    }

    #[test]
    fn buffers_outside_memory_or_misaligned_are_refused() {
        let blueprint = Blueprint::parse("matmul[16x16x16]").unwrap();
        let config = blueprint
            .launch_config(&Shape::Matmul { m: 3, n: 5, k: 7 })
            .unwrap();
        assert!(refusal(&blueprint, &config, &matmul_args(60), 299).contains("outside"));
        let mut args = matmul_args(60);
        args[2] = buffer(u64::MAX - 3, 60);
        assert!(refusal(&blueprint, &config, &args, usize::MAX).contains("outside"));
        args[2] = buffer(242, 60);
        assert!(refusal(&blueprint, &config, &args, 400).contains("aligned"));

        let vector = Blueprint::parse("vector_add[8]").unwrap();
        let config = vector.launch_config(&Shape::Elements { n: 8 }).unwrap();
        let args = [
            buffer(0, 32),
            buffer(36, 32),
            buffer(80, 32),
            KernelArg::U32(8),
        ];
        assert!(refusal(&vector, &config, &args, 128).contains("16-byte aligned"));
        let args = [
            buffer(0, 32),
            buffer(32, 32),
            buffer(64, 32),
            KernelArg::U32(8),
        ];
        vector.validate_launch(&config, &args, 128).unwrap();
    }

    #[test]
    fn arguments_must_match_the_contract() {
        let blueprint = Blueprint::parse("elementwise[scale]:i32").unwrap();
        let config = blueprint.launch_config(&Shape::Elements { n: 4 }).unwrap();
        let good = [
            buffer(0, 16),
            buffer(16, 16),
            KernelArg::I32(3),
            KernelArg::U32(4),
        ];
        blueprint.validate_launch(&config, &good, 32).unwrap();
        let error = refusal(&blueprint, &config, &good[..3], 32);
        assert!(
            error.contains("expects 4 arguments (x, out, alpha, n), got 3"),
            "{error}"
        );
        let mut wrong = good;
        wrong[2] = KernelArg::F32(3.0);
        assert!(refusal(&blueprint, &config, &wrong, 32).contains("alpha must be a i32"));
        wrong = good;
        wrong[3] = KernelArg::I32(4);
        assert!(refusal(&blueprint, &config, &wrong, 32).contains("n must be a u32"));
        wrong = good;
        wrong[0] = KernelArg::U64(0);
        assert!(refusal(&blueprint, &config, &wrong, 32).contains("x must be a buffer"));
    }

    #[test]
    fn the_configuration_must_be_the_kernels() {
        let blueprint = Blueprint::parse("matmul[16x8x4]").unwrap();
        let config = blueprint
            .launch_config(&Shape::Matmul { m: 3, n: 5, k: 7 })
            .unwrap();
        assert_eq!(config.block, [8, 16, 1]);
        let args = matmul_args(60);
        let mut bad = config;
        bad.block = [16, 16, 1];
        assert!(refusal(&blueprint, &bad, &args, 300).contains("block must be [8, 16, 1]"));
        bad = config;
        bad.shared_bytes = 4;
        assert!(refusal(&blueprint, &bad, &args, 300).contains("shared memory"));
        bad = config;
        bad.grid = [0, 1, 1];
        assert!(refusal(&blueprint, &bad, &args, 300).contains("out of range"));
        bad = config;
        bad.grid = [1, 1, 2];
        assert!(refusal(&blueprint, &bad, &args, 300).contains("unused axis"));
        // A larger grid than the shape needs is fine: the kernel guards by the shape.
        bad = config;
        bad.grid = [9, 9, 1];
        blueprint.validate_launch(&bad, &args, 300).unwrap();
        assert!(blueprint.launch_config(&Shape::Elements { n: 3 }).is_err());
    }

    #[test]
    fn outputs_may_not_overlap_inputs_except_in_place() {
        let matmul = Blueprint::parse("matmul[16x16x16]").unwrap();
        let config = matmul
            .launch_config(&Shape::Matmul { m: 3, n: 5, k: 7 })
            .unwrap();
        let mut args = matmul_args(60);
        args[2] = buffer(80, 60);
        assert!(refusal(&matmul, &config, &args, 300).contains("overlaps"));
        args[2] = buffer(0, 60);
        assert!(refusal(&matmul, &config, &args, 300).contains("overlaps"));

        let add = Blueprint::parse("elementwise[add]").unwrap();
        let config = add.launch_config(&Shape::Elements { n: 4 }).unwrap();
        let in_place = [
            buffer(0, 16),
            buffer(16, 16),
            buffer(0, 16),
            KernelArg::U32(4),
        ];
        add.validate_launch(&config, &in_place, 32).unwrap();
        let shifted = [
            buffer(0, 16),
            buffer(16, 16),
            buffer(4, 16),
            KernelArg::U32(4),
        ];
        assert!(refusal(&add, &config, &shifted, 32).contains("overlaps"));
        // Empty buffers overlap nothing.
        let empty = [buffer(0, 0), buffer(0, 0), buffer(0, 0), KernelArg::U32(0)];
        add.validate_launch(&config, &empty, 0).unwrap();
    }

    #[test]
    fn shapes_too_large_for_64_bits_or_the_grid_are_refused() {
        let conv = Blueprint::parse("conv2d[1x1]").unwrap();
        let max = KernelArg::U32(u32::MAX);
        let args = [
            buffer(0, 0),
            buffer(0, 0),
            buffer(0, 0),
            max,
            max,
            max,
            max,
            max,
        ];
        let config = LaunchConfig {
            grid: [1, 1, 1],
            block: [256, 1, 1],
            shared_bytes: 0,
        };
        assert!(conv.validate_launch(&config, &args, 1 << 20).is_err());
        let shape = Shape::Conv2d {
            n: 70_000,
            c: 1,
            h: 1,
            w: 1,
            k: 1,
        };
        assert!(conv.launch_config(&shape).is_err());
        let huge = Blueprint::parse("matmul[1x1x1]").unwrap();
        assert!(huge
            .launch_config(&Shape::Matmul {
                m: 70_000,
                n: 1,
                k: 1
            })
            .is_err());
    }

    fn arg_strategy() -> impl Strategy<Value = KernelArg> {
        prop_oneof![
            4 => (0u64..512, 0u64..512).prop_map(|(offset, len)| KernelArg::Buffer { offset: offset * 4, len }),
            1 => any::<(u64, u64)>().prop_map(|(offset, len)| KernelArg::Buffer { offset, len }),
            4 => (0u32..40).prop_map(KernelArg::U32),
            1 => any::<u32>().prop_map(KernelArg::U32),
            1 => any::<f32>().prop_map(KernelArg::F32),
            1 => any::<i32>().prop_map(KernelArg::I32),
        ]
    }

    proptest! {
        /// Validation never panics, and whatever it accepts runs on the CPU without touching
        /// memory outside the buffers (run_cpu would panic on an out-of-range slice).
        #[test]
        fn accepted_launches_stay_inside_memory(
            descriptor in prop::sample::select(vec![
                "elementwise[fma]", "elementwise[scale]:i32", "vector_add[4]", "reduce[max]",
                "matmul[4x4x4]", "conv2d[3x3,s2,p1]", "conv2d[1x1]:i32",
            ]),
            grid in (1u32..4, 1u32..4, 1u32..3),
            args in prop::collection::vec(arg_strategy(), 0..9),
            memory_len in 0usize..2048,
        ) {
            let blueprint = Blueprint::parse(descriptor).unwrap();
            let config = LaunchConfig { grid: [grid.0, grid.1, grid.2], block: blueprint.block(), shared_bytes: 0 };
            if blueprint.validate_launch(&config, &args, memory_len).is_ok() {
                let mut memory = vec![0u8; memory_len];
                prop_assert!(blueprint.run_cpu(&config, &args, &mut memory).is_ok());
            }
        }
    }
}
