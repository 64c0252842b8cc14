//! A core module with its own PTX (`kernel_from_ptx`), for the tenant-kernel tests of the
//! runtime and of the server: kernels `fill`, `spin`, `wild` and a divergent `bad`, and `fill`
//! again from CUDA C++ (`kernel_from_cuda`).

/// `wasi:cuda` argument record tags.
const BUFFER: u32 = 7;
const U32: u32 = 2;
const U64: u32 = 4;

/// The guest's kernel indices (the first argument of its `run`).
#[derive(Debug, Clone, Copy)]
pub struct Kernels {
    pub fill: i64,
    pub spin: i64,
    pub wild: i64,
    pub bad: i64,
    /// `fill` compiled from [`CUDA_FILL`] by NVRTC.
    pub cuda_fill: i64,
}

/// Kernel indices of the guest's `run`.
pub const KERNEL: Kernels = Kernels {
    fill: 0,
    spin: 1,
    wild: 2,
    bad: 3,
    cuda_fill: 4,
};

/// `fill` in CUDA C++: `out[i] = 3i` for `i < n`.
pub const CUDA_FILL: &str =
    "extern \"C\" __global__ void fill(unsigned int* out, unsigned int n) {\n\
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n\
    if (i < n) out[i] = i * 3u;\n}\n";

/// Where the guest keeps the argument records of `fill` (2 records), `spin` (1), `wild` (3).
pub const FILL_ARGS: i64 = 20480;
pub const SPIN_ARGS: i64 = 20544;
pub const WILD_ARGS: i64 = 20608;

pub const PTX: &str = "\
.version 8.0
.target sm_80
.address_size 64
.visible .entry fill(.param .u64 out, .param .u32 n)
{
  .reg .pred %p<2>;
  .reg .b32 %r<6>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.u32 %r2, %r2, %r3, %r4;
  setp.ge.u32 %p1, %r2, %r1;
  @%p1 bra DONE;
  mul.lo.u32 %r5, %r2, 3;
  mul.wide.u32 %rd2, %r2, 4;
  add.u64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r5;
DONE:
  ret;
}
.visible .entry spin(.param .u64 p)
{
  .reg .pred %p<2>;
  .reg .b32 %r<2>;
  .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [p];
LOOP:
  ld.global.u32 %r1, [%rd1];
  setp.ne.u32 %p1, %r1, 12345;
  @%p1 bra LOOP;
  ret;
}
.visible .entry wild(.param .u64 p, .param .u64 offset, .param .u32 value)
{
  .reg .b32 %r<2>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [p];
  ld.param.u64 %rd2, [offset];
  ld.param.u32 %r1, [value];
  add.u64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r1;
  ret;
}
";

/// A barrier only the threads of one branch reach: refused.
pub const DIVERGENT: &str = "\
.version 8.0
.target sm_80
.address_size 64
.visible .entry bad(.param .u64 p)
{
  .reg .pred %p<2>;
  .reg .b32 %r<2>;
  mov.u32 %r1, %tid.x;
  setp.eq.u32 %p1, %r1, 0;
  @%p1 bra SKIP;
  bar.sync 0;
SKIP:
  ret;
}
";

pub const OUT: u32 = 32768;
pub const MARKER: u32 = 0x0bad_f00d;

/// One argument record of the `wasi:cuda` ABI.
fn record(tag: u32, aux: u32, value: u64) -> Vec<u8> {
    let mut r = tag.to_le_bytes().to_vec();
    r.extend_from_slice(&aux.to_le_bytes());
    r.extend_from_slice(&value.to_le_bytes());
    r
}

/// `bytes` as a WAT string literal.
fn wat_string(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("\\{b:02x}")).collect()
}

/// The guest: `run(kernel, gx, bx, args, nargs) -> status` loads entry `kernel` (0 fill,
/// 1 spin, 2 wild, 3 the divergent `bad`) from its PTX and launches it with the argument
/// records at `args` (`nargs` bytes of them); `fill_check()` runs `fill` over 1000 words and returns 0 when
/// `out[i] = 3i` there and nothing was written past them (else a status or the first wrong
/// index + 1), `fill_check_with(k)` the same with kernel `k` (`fill` or `cuda_fill`);
/// `wild_markers()` runs `wild` and returns how many more [`MARKER`] words all of its
/// memory holds than before.
pub fn guest() -> String {
    let fill = [record(BUFFER, 4096, OUT.into()), record(U32, 0, 1000)].concat();
    let spin = record(BUFFER, 4, OUT.into());
    let wild = [
        record(BUFFER, 16, OUT.into()),
        record(U64, 0, 1 << 30),
        record(U32, 0, MARKER.into()),
    ]
    .concat();
    let ptx_len = PTX.len();
    let bad_len = DIVERGENT.len();
    let cuda_len = CUDA_FILL.len();
    format!(
        r#"(module
  (import "wasi:cuda" "kernel_from_ptx" (func $ptx (param i32 i32 i32 i32) (result i32)))
  (import "wasi:cuda" "kernel_from_cuda" (func $cuda (param i32 i32 i32 i32) (result i32)))
  (import "wasi:cuda" "launch" (func $launch (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "wasi:cuda" "last_error" (func $err (param i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 0) "{ptx}")
  (data (i32.const 12288) "{bad}")
  (data (i32.const 24576) "{cuda}")
  (data (i32.const 16384) "fillspinwildbad")
  (data (i32.const 20480) "{fill}")
  (data (i32.const 20544) "{spin}")
  (data (i32.const 20608) "{wild}")
  (func $load (param $k i32) (result i32)
    (if (i32.eq (local.get $k) (i32.const 4))
      (then (return (call $cuda (i32.const 24576) (i32.const {cuda_len}) (i32.const 16384) (i32.const 4)))))
    (if (result i32) (i32.eq (local.get $k) (i32.const 3))
      (then (call $ptx (i32.const 12288) (i32.const {bad_len}) (i32.const 16396) (i32.const 3)))
      (else (call $ptx (i32.const 0) (i32.const {ptx_len})
        (i32.add (i32.const 16384) (i32.mul (local.get $k) (i32.const 4))) (i32.const 4)))))
  (func $run (export "run") (param $k i32) (param $gx i32) (param $bx i32) (param $args i32) (param $n i32) (result i32)
    (local $h i32)
    (local.set $h (call $load (local.get $k)))
    (if (i32.lt_s (local.get $h) (i32.const 0)) (then (return (local.get $h))))
    (call $launch (local.get $h) (local.get $gx) (i32.const 1) (i32.const 1)
      (local.get $bx) (i32.const 1) (i32.const 1) (i32.const 0) (local.get $args) (local.get $n)))
  (func (export "explain") (param $k i32) (param $gx i32) (param $bx i32) (param $args i32) (param $n i32) (param $i i32) (result i32)
    (drop (call $run (local.get $k) (local.get $gx) (local.get $bx) (local.get $args) (local.get $n)))
    (if (i32.ge_u (local.get $i) (call $err (i32.const 40960) (i32.const 4096)))
      (then (return (i32.const -1))))
    (i32.load8_u (i32.add (i32.const 40960) (local.get $i))))
  (func (export "fill_check") (result i32) (call $fill_check (i32.const 0)))
  (func $fill_check (export "fill_check_with") (param $k i32) (result i32)
    (local $s i32) (local $i i32) (local $want i32)
    (local.set $s (call $run (local.get $k) (i32.const 4) (i32.const 256) (i32.const 20480) (i32.const 32)))
    (if (i32.ne (local.get $s) (i32.const 0)) (then (return (local.get $s))))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (i32.const 1024)))
      (local.set $want (select (i32.mul (local.get $i) (i32.const 3)) (i32.const 0)
        (i32.lt_u (local.get $i) (i32.const 1000))))
      (if (i32.ne (i32.load (i32.add (i32.const {OUT}) (i32.mul (local.get $i) (i32.const 4))))
                  (local.get $want))
        (then (return (i32.add (local.get $i) (i32.const 1)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (i32.const 0))
  (func $markers (result i32)
    (local $a i32) (local $n i32)
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $a) (i32.const 131072)))
      (if (i32.eq (i32.load (local.get $a)) (i32.const {MARKER}))
        (then (local.set $n (i32.add (local.get $n) (i32.const 1)))))
      (local.set $a (i32.add (local.get $a) (i32.const 4)))
      (br $next)))
    (local.get $n))
  (func (export "wild_markers") (result i32)
    (local $s i32) (local $before i32)
    (local.set $before (call $markers))
    (local.set $s (call $run (i32.const 2) (i32.const 1) (i32.const 1) (i32.const 20608) (i32.const 48)))
    (if (i32.ne (local.get $s) (i32.const 0)) (then (return (local.get $s))))
    (i32.sub (call $markers) (local.get $before))))"#,
        ptx = wat_string(PTX.as_bytes()),
        bad = wat_string(DIVERGENT.as_bytes()),
        cuda = wat_string(CUDA_FILL.as_bytes()),
        fill = wat_string(&fill),
        spin = wat_string(&spin),
        wild = wat_string(&wild),
    )
}
