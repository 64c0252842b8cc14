//! Execution of a launch: blocks one after another, the threads of a block as green threads
//! switched at `bar.sync` and at warp operations (`shfl.sync`, resolved in `warp.rs` once
//! every lane has arrived), calls on a per-thread stack of frames, every memory access
//! checked (`memory.rs`), shared-memory races and barrier deadlocks detected.

use crate::ir::{Instr, Op, Special, Src, TyKind};
use crate::limits::{frame_cost, CancelWord, BLOCK_MEMORY, CANCEL_CHECK, MAX_THREAD_BYTES};
use crate::memory::cvta;
use crate::ops;
use crate::parse::{Func, Kernel};
use crate::schedule::Rng;
pub use crate::schedule::Schedule;
use crate::{EmuError, Place};

/// A byte range of device memory a launch may touch: global addresses
/// `base .. base + bytes.len()`.
#[derive(Debug)]
pub struct Allocation<'a> {
    /// Device address of `bytes[0]`.
    pub base: u64,
    /// The memory.
    pub bytes: &'a mut [u8],
}

/// What to launch: grid, block, dynamic shared memory, the packed parameters
/// ([`Kernel::pack_params`]), and how.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    /// Blocks (x, y, z), each at least 1.
    pub grid: [u32; 3],
    /// Threads per block (x, y, z), each at least 1, at most 1024 in all.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub dynamic_shared_bytes: u32,
    /// The parameter buffer: exactly [`Kernel::param_bytes`] bytes.
    pub params: &'a [u8],
    /// Thread order.
    pub schedule: Schedule,
    /// Most instructions one thread may execute before the launch fails as a runaway loop.
    pub step_limit: u64,
    /// The host's cancel word, if the launch has one.
    pub cancel: Option<CancelWord<'a>>,
}

impl<'a> Launch<'a> {
    /// A launch in order, without dynamic shared memory, with a step limit of 2^22.
    pub fn new(grid: [u32; 3], block: [u32; 3], params: &'a [u8]) -> Self {
        Launch {
            grid,
            block,
            dynamic_shared_bytes: 0,
            params,
            schedule: Schedule::InOrder,
            step_limit: 1 << 22,
            cancel: None,
        }
    }

    /// The same launch with another schedule.
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedule = schedule;
        self
    }
}

/// What a launch executed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaunchStats {
    /// Blocks run.
    pub blocks: u64,
    /// Threads run.
    pub threads: u64,
    /// Instructions executed (guarded-off ones included).
    pub instructions: u64,
    /// Barrier intervals completed.
    pub barriers: u64,
}

/// Most threads per block.
const MAX_THREADS: u64 = 1024;
/// Most blocks in one launch (the interpreter runs them one after another).
const MAX_BLOCKS: u64 = 1 << 24;
/// Most shared memory per block (static and dynamic), in bytes.
const MAX_SHARED: u64 = 228 * 1024;
/// The byte uninitialised shared and local memory holds, so a read before any write shows.
const SHARED_FILL: u8 = 0xa5;
pub(crate) const NOBODY: u32 = u32::MAX;
/// Most nested calls in one thread.
const MAX_CALL_DEPTH: usize = 256;
/// Most bytes of local memory (all frames together) of one thread.
const MAX_LOCAL_STACK: usize = 1 << 20;

/// The checks [`launch`] makes before anything runs, for a launch over allocations
/// `regions` (base and length): what a driver refuses at submission.
///
/// # Errors
/// [`EmuError::InvalidLaunch`], as [`launch`] returns it.
pub fn check_launch(
    kernel: &Kernel,
    launch: &Launch<'_>,
    regions: &[(u64, usize)],
) -> Result<(), EmuError> {
    let invalid = |reason: String| EmuError::InvalidLaunch {
        kernel: kernel.name.clone(),
        reason,
    };
    if launch.grid.contains(&0) || launch.block.contains(&0) {
        return Err(invalid(format!(
            "grid {:?} and block {:?} must be at least 1 along every axis",
            launch.grid, launch.block
        )));
    }
    let threads: u64 = launch.block.iter().map(|&d| u64::from(d)).product();
    if threads > MAX_THREADS {
        return Err(invalid(format!(
            "{threads} threads per block, more than {MAX_THREADS}"
        )));
    }
    let thread_bytes = MAX_THREAD_BYTES.min(BLOCK_MEMORY / threads.max(1));
    let entry_bytes = frame_cost(&kernel.body);
    if entry_bytes > thread_bytes {
        return Err(invalid(format!(
            "each of the block's {threads} threads needs {entry_bytes} bytes of registers and \
             local memory; the interpreter holds at most {BLOCK_MEMORY} bytes for a block \
             ({thread_bytes} per thread here)"
        )));
    }
    if launch.params.len() != kernel.param_bytes as usize {
        return Err(invalid(format!(
            "{} parameter bytes, the entry takes {}",
            launch.params.len(),
            kernel.param_bytes
        )));
    }
    let shared = u64::from(kernel.shared_bytes) + u64::from(launch.dynamic_shared_bytes);
    if shared > MAX_SHARED {
        return Err(invalid(format!(
            "{shared} bytes of shared memory, more than {MAX_SHARED}"
        )));
    }
    let mut spans: Vec<(u64, u64)> = Vec::with_capacity(regions.len() + 1);
    for &(base, len) in regions {
        let Some(end) = base.checked_add(len as u64) else {
            return Err(invalid(format!("allocation at {base:#x} wraps around")));
        };
        spans.push((base, end));
    }
    if let Some(word) = &launch.cancel {
        if !word.address.is_multiple_of(4) || word.address.checked_add(4).is_none() {
            return Err(invalid(format!(
                "the cancel word at {:#x} is not a 4-byte aligned address",
                word.address
            )));
        }
        spans.push((word.address, word.address + 4));
    }
    spans.sort_unstable();
    if spans.windows(2).any(|pair| pair[1].0 < pair[0].1) {
        return Err(invalid("allocations (or the cancel word) overlap".into()));
    }

    let [gx, gy, gz] = launch.grid.map(u64::from);
    if gx * gy * gz > MAX_BLOCKS {
        return Err(invalid(format!(
            "{} blocks, more than the interpreter runs ({MAX_BLOCKS})",
            gx * gy * gz
        )));
    }
    Ok(())
}

/// Runs `kernel` over `memory`.
///
/// # Errors
/// [`EmuError::InvalidLaunch`] for bad dimensions (more than 2^24 blocks included),
/// parameter bytes or overlapping allocations (nothing runs then); otherwise the first fault of the launch:
/// [`EmuError::IllegalAddress`], [`EmuError::Misaligned`], [`EmuError::SharedRace`],
/// [`EmuError::Deadlock`], [`EmuError::StepLimit`], [`EmuError::Undefined`]. Memory written
/// before the fault stays written, as on a device.
pub fn launch(
    kernel: &Kernel,
    launch: &Launch<'_>,
    memory: &mut [Allocation<'_>],
) -> Result<LaunchStats, EmuError> {
    let regions: Vec<(u64, usize)> = memory.iter().map(|a| (a.base, a.bytes.len())).collect();
    check_launch(kernel, launch, &regions)?;
    let shared = u64::from(kernel.shared_bytes) + u64::from(launch.dynamic_shared_bytes);
    let [gx, gy, gz] = launch.grid.map(u64::from);
    let threads: u64 = launch.block.iter().map(|&d| u64::from(d)).product();
    let thread_bytes = MAX_THREAD_BYTES.min(BLOCK_MEMORY / threads.max(1));
    let count = gx * gy * gz;
    let mut rng = Rng(0);
    // Only a random order is materialised: in order and reversed need no list of 2^24 blocks.
    let shuffled: Option<Vec<u64>> = match launch.schedule {
        Schedule::InOrder | Schedule::Reversed => None,
        Schedule::Random(seed) => {
            rng = Rng(seed);
            let mut blocks: Vec<u64> = (0..count).collect();
            rng.shuffle(&mut blocks);
            Some(blocks)
        }
    };
    let reversed = launch.schedule == Schedule::Reversed;
    let blocks = (0..count).map(|i| match &shuffled {
        Some(order) => order[i as usize],
        None if reversed => count - 1 - i,
        None => i,
    });
    let mut block = Block {
        kernel,
        launch,
        memory,
        ctaid: [0; 3],
        shared: vec![SHARED_FILL; shared as usize],
        race: vec![Cell::EMPTY; shared as usize],
        touched: Vec::new(),
        threads: Vec::with_capacity(threads as usize),
        thread_bytes,
        stats: LaunchStats::default(),
        rng,
    };
    for index in blocks {
        block.ctaid = [
            (index % gx) as u32,
            (index / gx % gy) as u32,
            (index / (gx * gy)) as u32,
        ];
        block.run()?;
    }
    Ok(block.stats)
}

/// Who touched one shared byte in the current barrier interval.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cell {
    pub writer: u32,
    pub reader: u32,
    /// A second reader other than `reader`, if any.
    pub other_reader: u32,
}

impl Cell {
    pub const EMPTY: Cell = Cell {
        writer: NOBODY,
        reader: NOBODY,
        other_reader: NOBODY,
    };
}

/// An instruction of the module: the function (`None`: the entry) and its index there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pc {
    pub func: Option<u32>,
    pub index: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Ready,
    /// Waiting at this `bar.sync`.
    AtBarrier(Pc),
    /// Waiting at this warp operation for the other lanes of its mask.
    AtWarp(Pc),
    Exited,
}

/// A caller's frame, kept while its callee runs.
struct Saved {
    func: Option<u32>,
    pc: usize,
    regs: Vec<u64>,
    preds: Vec<bool>,
    frame: Vec<u8>,
    local_base: u32,
    /// The caller's `.param` variable that receives the return value.
    ret: Option<u32>,
}

pub(crate) struct Thread {
    pub tid: [u32; 3],
    /// The running function (`None`: the entry) and the next instruction in it.
    pub func: Option<u32>,
    pub pc: usize,
    pub regs: Vec<u64>,
    pub preds: Vec<bool>,
    /// The current frame's `.param` space.
    pub frame: Vec<u8>,
    /// Where the current frame's `.local` variables start in `local`.
    pub local_base: u32,
    /// Every frame's `.local` variables, the entry's first.
    pub local: Vec<u8>,
    calls: Vec<Saved>,
    pub state: State,
    pub(crate) steps: u64,
    /// `steps` when the thread last read the cancel word.
    pub(crate) polled_at: u64,
    /// The host memory the thread's frames hold (see [`frame_cost`]).
    held: u64,
}

/// One block being run, and what the launch has counted so far.
pub(crate) struct Block<'k, 'l, 'm, 'a> {
    pub kernel: &'k Kernel,
    pub launch: &'l Launch<'l>,
    pub memory: &'m mut [Allocation<'a>],
    pub ctaid: [u32; 3],
    pub shared: Vec<u8>,
    pub race: Vec<Cell>,
    pub touched: Vec<usize>,
    pub threads: Vec<Thread>,
    /// Most host memory one thread may hold (see [`BLOCK_MEMORY`]).
    thread_bytes: u64,
    stats: LaunchStats,
    rng: Rng,
}

impl Block<'_, '_, '_, '_> {
    fn run(&mut self) -> Result<(), EmuError> {
        let [bx, by, bz] = self.launch.block;
        self.shared.fill(SHARED_FILL);
        self.clear_races();
        self.threads.clear();
        for z in 0..bz {
            for y in 0..by {
                for x in 0..bx {
                    let body = &self.kernel.body;
                    self.threads.push(Thread {
                        tid: [x, y, z],
                        func: None,
                        pc: 0,
                        regs: vec![0; usize::from(body.regs)],
                        preds: vec![false; usize::from(body.preds)],
                        frame: vec![0; body.frame_bytes as usize],
                        local_base: 0,
                        local: vec![SHARED_FILL; body.local_bytes as usize],
                        calls: Vec::new(),
                        state: State::Ready,
                        steps: 0,
                        polled_at: 0,
                        held: frame_cost(body),
                    });
                }
            }
        }
        self.stats.blocks += 1;
        self.stats.threads += self.threads.len() as u64;
        let mut order: Vec<usize> = (0..self.threads.len()).collect();
        if self.launch.schedule == Schedule::Reversed {
            order.reverse();
        }
        loop {
            if let Schedule::Random(_) = self.launch.schedule {
                self.rng.shuffle(&mut order);
            }
            for &t in &order {
                if self.threads[t].state == State::Ready {
                    self.run_thread(t)?;
                }
            }
            // No thread can run: lanes waiting at a warp operation go first (their warp-mates
            // can only be waiting there too, or the warp can never complete).
            if self
                .threads
                .iter()
                .any(|thread| matches!(thread.state, State::AtWarp(_)))
            {
                self.resolve_warps()?;
                continue;
            }
            let waiting: Vec<usize> = (0..self.threads.len())
                .filter(|&t| matches!(self.threads[t].state, State::AtBarrier(_)))
                .collect();
            let Some(&first) = waiting.first() else {
                return Ok(());
            };
            let exited = self.threads.len() - waiting.len();
            let State::AtBarrier(at) = self.threads[first].state else {
                unreachable!("filtered above")
            };
            let line = |pc: Pc| self.line_of(pc);
            if exited > 0 {
                let gone = self
                    .threads
                    .iter()
                    .find(|t| t.state == State::Exited)
                    .map_or([0; 3], |t| t.tid);
                return Err(self.deadlock(format!(
                    "{} threads wait at bar.sync (PTX line {}) but {exited} exited (e.g. thread {gone:?})",
                    waiting.len(),
                    line(at)
                )));
            }
            if let Some(other) = waiting
                .iter()
                .find(|&&t| self.threads[t].state != State::AtBarrier(at))
            {
                let thread = &self.threads[*other];
                let State::AtBarrier(elsewhere) = thread.state else {
                    unreachable!("filtered above")
                };
                return Err(self.deadlock(format!(
                    "threads wait at different barriers: thread {:?} at PTX line {}, thread {:?} at line {}",
                    self.threads[first].tid,
                    line(at),
                    thread.tid,
                    line(elsewhere)
                )));
            }
            for thread in &mut self.threads {
                thread.state = State::Ready;
            }
            self.clear_races();
            self.stats.barriers += 1;
        }
    }

    /// The source line of an instruction.
    pub(crate) fn line_of(&self, pc: Pc) -> u32 {
        self.kernel.code(pc.func).instrs[pc.index].line
    }

    pub(crate) fn deadlock(&self, detail: String) -> EmuError {
        EmuError::Deadlock {
            kernel: self.kernel.name.clone(),
            block: self.ctaid,
            detail,
        }
    }

    pub(crate) fn place(&self, t: usize, instr: &Instr) -> Place {
        Place {
            kernel: self.kernel.name.clone(),
            block: self.ctaid,
            thread: self.threads[t].tid,
            line: instr.line,
        }
    }

    pub(crate) fn read(&self, t: usize, src: Src) -> u64 {
        match src {
            Src::Reg(reg) => self.threads[t].regs[usize::from(reg)],
            Src::Imm(value) => value,
            Src::Local(offset) => u64::from(self.threads[t].local_base) + u64::from(offset),
            Src::Special(special) => u64::from(match special {
                Special::Tid(axis) => self.threads[t].tid[axis],
                Special::Ntid(axis) => self.launch.block[axis],
                Special::Ctaid(axis) => self.ctaid[axis],
                Special::Nctaid(axis) => self.launch.grid[axis],
                Special::LaneId => (t % 32) as u32,
                Special::WarpSize => 32,
            }),
        }
    }

    pub(crate) fn write(&mut self, t: usize, dst: u16, bits: u32, value: u64) {
        self.threads[t].regs[usize::from(dst)] = ops::mask(value, bits);
    }

    /// Runs thread `t` until it waits at a barrier or warp operation, exits, or faults.
    fn run_thread(&mut self, t: usize) -> Result<(), EmuError> {
        let kernel = self.kernel;
        loop {
            let thread = &mut self.threads[t];
            let (func, pc) = (thread.func, thread.pc);
            let Some(instr) = kernel.code(func).instrs.get(pc) else {
                // Falling off the end of a function returns from it.
                self.ret(t);
                if self.threads[t].state == State::Exited {
                    return Ok(());
                }
                continue;
            };
            thread.steps += 1;
            thread.pc += 1;
            self.stats.instructions += 1;
            if thread.steps > self.launch.step_limit {
                return Err(EmuError::StepLimit {
                    at: self.place(t, instr),
                    limit: self.launch.step_limit,
                });
            }
            if thread.steps - thread.polled_at > CANCEL_CHECK
                && thread.steps.is_multiple_of(CANCEL_CHECK)
                && self.launch.cancel.is_some_and(|word| word.value() != 0)
            {
                return Err(EmuError::Cancelled {
                    at: self.place(t, instr),
                });
            }
            if let Some(guard) = instr.guard {
                if thread.preds[usize::from(guard.reg)] == guard.negated {
                    continue;
                }
            }
            match &instr.op {
                Op::Mov { bits, dst, src } => {
                    let value = self.read(t, *src);
                    self.write(t, *dst, *bits, value);
                }
                Op::Int { op, ty, dst, a, b } => {
                    let (a, b) = (self.read(t, *a), self.read(t, *b));
                    let Some(value) = ops::int(*op, *ty, a, b) else {
                        return Err(EmuError::Undefined {
                            at: self.place(t, instr),
                            what: "integer division by zero (the result is unspecified)".into(),
                        });
                    };
                    self.write(t, *dst, ty.bits, value);
                }
                Op::MulWide { ty, dst, a, b } => {
                    let value = ops::mul_wide(*ty, self.read(t, *a), self.read(t, *b));
                    self.write(t, *dst, ty.bits * 2, value);
                }
                Op::MadLo { ty, dst, a, b, c } => {
                    let product = self.read(t, *a).wrapping_mul(self.read(t, *b));
                    let value = product.wrapping_add(self.read(t, *c));
                    self.write(t, *dst, ty.bits, value);
                }
                Op::Float {
                    op,
                    bits,
                    ftz,
                    dst,
                    a,
                    b,
                } => {
                    let value = ops::float(*op, *bits, *ftz, self.read(t, *a), self.read(t, *b));
                    self.write(t, *dst, *bits, value);
                }
                Op::Fma {
                    bits,
                    ftz,
                    dst,
                    a,
                    b,
                    c,
                } => {
                    let (a, b, c) = (self.read(t, *a), self.read(t, *b), self.read(t, *c));
                    let value = ops::fma(*bits, *ftz, a, b, c);
                    self.write(t, *dst, *bits, value);
                }
                Op::Sqrt { bits, ftz, dst, a } => {
                    let value = ops::sqrt(*bits, *ftz, self.read(t, *a));
                    self.write(t, *dst, *bits, value);
                }
                Op::Unary { op, ty, dst, a } => {
                    let value = ops::unary(*op, *ty, self.read(t, *a));
                    self.write(t, *dst, ty.bits, value);
                }
                Op::Setp {
                    cmp,
                    ty,
                    ftz,
                    dst,
                    a,
                    b,
                    combine,
                } => {
                    let (a, b) = (self.read(t, *a), self.read(t, *b));
                    let mut value = ops::compare(*cmp, *ty, *ftz, a, b);
                    if let Some((op, pred)) = combine {
                        let other = self.threads[t].preds[usize::from(pred.reg)] != pred.negated;
                        value = ops::combine(*op, value, other);
                    }
                    self.threads[t].preds[usize::from(*dst)] = value;
                }
                Op::Selp {
                    bits,
                    dst,
                    a,
                    b,
                    pred,
                } => {
                    let take_a = self.threads[t].preds[usize::from(pred.reg)] != pred.negated;
                    let value = self.read(t, if take_a { *a } else { *b });
                    self.write(t, *dst, *bits, value);
                }
                Op::IsSpace { space, dst, a } => {
                    let (found, _) = crate::memory::generic(self.read(t, *a));
                    self.threads[t].preds[usize::from(*dst)] = found == *space;
                }
                Op::PredLogic { op, dst, a, b } => {
                    let preds = &mut self.threads[t].preds;
                    let get = |p: crate::ir::Pred| preds[usize::from(p.reg)] != p.negated;
                    let a = get(*a);
                    let b = b.map(get);
                    let value = match (op, b) {
                        (crate::ir::PredOp::And, Some(b)) => a && b,
                        (crate::ir::PredOp::Or, Some(b)) => a || b,
                        (crate::ir::PredOp::Xor, Some(b)) => a != b,
                        (crate::ir::PredOp::Not, _) => !a,
                        _ => a,
                    };
                    preds[usize::from(*dst)] = value;
                }
                Op::Cvt {
                    dst_ty,
                    src_ty,
                    rounding,
                    sat,
                    dst,
                    src,
                } => {
                    let mut value = ops::cvt(*dst_ty, *src_ty, *rounding, *sat, self.read(t, *src));
                    // A narrow signed result fills a 32-bit register sign-extended.
                    if dst_ty.kind == TyKind::S && dst_ty.bits < 32 {
                        value = ops::sext(value, dst_ty.bits) as u64;
                    }
                    self.write(t, *dst, dst_ty.bits.max(32), value);
                }
                Op::Cvta {
                    space,
                    to,
                    dst,
                    src,
                } => {
                    let value = cvta(*space, *to, self.read(t, *src));
                    self.write(t, *dst, 64, value);
                }
                Op::Ld {
                    space,
                    ty,
                    dsts,
                    addr,
                } => {
                    let (space, base) = Self::concrete(*space, self.address(t, *space, *addr));
                    let size = ty.bytes();
                    self.check_alignment(t, instr, space, base, size * dsts.len() as u32, "load")?;
                    for (i, dst) in dsts.iter().enumerate() {
                        let at = base.wrapping_add(u64::from(size) * i as u64);
                        let raw = self.load(t, instr, space, at, size, false)?;
                        let value = if ty.kind == TyKind::S {
                            ops::sext(raw, ty.bits) as u64
                        } else {
                            raw
                        };
                        self.write(t, *dst, ty.bits.max(32), value);
                    }
                }
                Op::St {
                    space,
                    ty,
                    srcs,
                    addr,
                } => {
                    let (space, base) = Self::concrete(*space, self.address(t, *space, *addr));
                    let size = ty.bytes();
                    let bytes = size * srcs.len() as u32;
                    self.check_alignment(t, instr, space, base, bytes, "store")?;
                    for (i, src) in srcs.iter().enumerate() {
                        let at = base.wrapping_add(u64::from(size) * i as u64);
                        let value = self.read(t, *src);
                        self.store(t, instr, (space, at), *ty, value, false)?;
                    }
                }
                Op::Atom {
                    op,
                    space,
                    ty,
                    dst,
                    addr,
                    b,
                    c,
                } => {
                    let (space, at) = Self::concrete(*space, self.address(t, *space, *addr));
                    self.check_alignment(t, instr, space, at, ty.bytes(), "atomic")?;
                    let old = self.load(t, instr, space, at, ty.bytes(), true)?;
                    let (b, c) = (self.read(t, *b), c.map_or(0, |c| self.read(t, c)));
                    if let Some(new) = ops::atom(*op, *ty, old, b, c) {
                        self.store(t, instr, (space, at), *ty, new, true)?;
                    }
                    if let Some(dst) = dst {
                        self.write(t, *dst, ty.bits, old);
                    }
                }
                Op::Shfl { .. } => {
                    self.threads[t].state = State::AtWarp(Pc { func, index: pc });
                    return Ok(());
                }
                Op::Call { func, args, ret } => self.call(t, instr, *func, args, *ret)?,
                Op::Bra { target } => self.threads[t].pc = *target as usize,
                Op::Bar => {
                    self.threads[t].state = State::AtBarrier(Pc { func, index: pc });
                    return Ok(());
                }
                Op::Ret => {
                    self.ret(t);
                    if self.threads[t].state == State::Exited {
                        return Ok(());
                    }
                }
                Op::Exit => {
                    self.threads[t].state = State::Exited;
                    return Ok(());
                }
            }
        }
    }

    /// Enters function `func`: the caller's frame is saved, the arguments (the caller's
    /// `.param` variables at `args`) copied into the callee's parameters, its `.local`
    /// variables placed after the caller's.
    fn call(
        &mut self,
        t: usize,
        instr: &Instr,
        func: u32,
        args: &[u32],
        ret: Option<u32>,
    ) -> Result<(), EmuError> {
        let kernel = self.kernel;
        let callee: &Func = kernel.code(Some(func));
        let thread = &self.threads[t];
        let caller_local = kernel.code(thread.func).local_bytes;
        let local_base = thread.local_base as usize + caller_local as usize;
        let local_end = local_base + callee.local_bytes as usize;
        let held = thread.held + frame_cost(callee);
        if thread.calls.len() >= MAX_CALL_DEPTH
            || local_end > MAX_LOCAL_STACK
            || held > self.thread_bytes
        {
            return Err(EmuError::CallDepth {
                at: self.place(t, instr),
                limit: MAX_CALL_DEPTH as u32,
            });
        }
        let mut frame = vec![0u8; callee.frame_bytes as usize];
        for (&arg, &(offset, size)) in args.iter().zip(&callee.params) {
            let (arg, offset, size) = (arg as usize, offset as usize, size as usize);
            let Some(value) = thread.frame.get(arg..arg + size) else {
                return Err(EmuError::Undefined {
                    at: self.place(t, instr),
                    what: "a call argument smaller than the parameter it is passed as".into(),
                });
            };
            frame[offset..offset + size].copy_from_slice(value);
        }
        let thread = &mut self.threads[t];
        thread.local.resize(local_end, SHARED_FILL);
        let saved = Saved {
            func: thread.func,
            pc: thread.pc,
            regs: std::mem::replace(&mut thread.regs, vec![0; usize::from(callee.regs)]),
            preds: std::mem::replace(&mut thread.preds, vec![false; usize::from(callee.preds)]),
            frame: std::mem::replace(&mut thread.frame, frame),
            local_base: thread.local_base,
            ret,
        };
        thread.calls.push(saved);
        thread.held = held;
        thread.func = Some(func);
        thread.pc = 0;
        thread.local_base = local_base as u32;
        Ok(())
    }

    /// Returns from the running function (the entry: the thread exits), copying the return
    /// value into the caller's variable.
    fn ret(&mut self, t: usize) {
        let kernel = self.kernel;
        let thread = &mut self.threads[t];
        let Some(saved) = thread.calls.pop() else {
            thread.state = State::Exited;
            return;
        };
        let callee = kernel.code(thread.func);
        thread.held -= frame_cost(callee);
        let callee_frame = std::mem::replace(&mut thread.frame, saved.frame);
        if let (Some(var), Some((offset, size))) = (saved.ret, callee.ret) {
            let (var, offset, size) = (var as usize, offset as usize, size as usize);
            let end = (var + size).min(thread.frame.len());
            if var < end {
                thread.frame[var..end].copy_from_slice(&callee_frame[offset..offset + end - var]);
            }
        }
        thread.local.truncate(thread.local_base as usize);
        thread.func = saved.func;
        thread.pc = saved.pc;
        thread.regs = saved.regs;
        thread.preds = saved.preds;
        thread.local_base = saved.local_base;
    }
}
