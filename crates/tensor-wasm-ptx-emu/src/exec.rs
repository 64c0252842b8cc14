//! Execution of a launch: blocks one after another, the threads of a block as green threads
//! switched at `bar.sync`, every memory access checked, shared-memory races and barrier
//! deadlocks detected.

use crate::ir::{Addr, Instr, Op, Space, Special, Src, Ty, TyKind};
use crate::ops;
use crate::parse::Kernel;
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

/// The order in which the threads of a block run between two barriers (and the blocks of
/// the grid run). One order hides a missing barrier; several, with the race detector, do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Thread 0 first (x fastest, then y, then z); blocks likewise.
    InOrder,
    /// The last thread first; blocks likewise.
    Reversed,
    /// A fresh pseudo-random order for every block and barrier interval, from this seed.
    Random(u64),
}

impl Schedule {
    /// In order, reversed, and two seeded random orders.
    pub const ALL: [Schedule; 4] = [
        Schedule::InOrder,
        Schedule::Reversed,
        Schedule::Random(0x5eed_0001),
        Schedule::Random(0x5eed_0002),
    ];
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
/// The byte uninitialised shared memory holds, so a read before any write shows.
const SHARED_FILL: u8 = 0xa5;
const NOBODY: u32 = u32::MAX;

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
    let mut spans: Vec<(u64, u64)> = Vec::with_capacity(memory.len());
    for alloc in memory.iter() {
        let Some(end) = alloc.base.checked_add(alloc.bytes.len() as u64) else {
            return Err(invalid(format!(
                "allocation at {:#x} wraps around",
                alloc.base
            )));
        };
        spans.push((alloc.base, end));
    }
    spans.sort_unstable();
    if spans.windows(2).any(|pair| pair[1].0 < pair[0].1) {
        return Err(invalid("allocations overlap".into()));
    }

    let [gx, gy, gz] = launch.grid.map(u64::from);
    if gx * gy * gz > MAX_BLOCKS {
        return Err(invalid(format!(
            "{} blocks, more than the interpreter runs ({MAX_BLOCKS})",
            gx * gy * gz
        )));
    }
    let mut blocks: Vec<u64> = (0..gx * gy * gz).collect();
    let mut rng = Rng(0);
    match launch.schedule {
        Schedule::InOrder => {}
        Schedule::Reversed => blocks.reverse(),
        Schedule::Random(seed) => {
            rng = Rng(seed);
            rng.shuffle(&mut blocks);
        }
    }
    let mut block = Block {
        kernel,
        launch,
        memory,
        ctaid: [0; 3],
        shared: vec![SHARED_FILL; shared as usize],
        race: vec![Cell::EMPTY; shared as usize],
        touched: Vec::new(),
        threads: Vec::with_capacity(threads as usize),
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

/// splitmix64: a small, seedable generator for schedules.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

/// Who touched one shared byte in the current barrier interval.
#[derive(Debug, Clone, Copy)]
struct Cell {
    writer: u32,
    reader: u32,
    /// A second reader other than `reader`, if any.
    other_reader: u32,
}

impl Cell {
    const EMPTY: Cell = Cell {
        writer: NOBODY,
        reader: NOBODY,
        other_reader: NOBODY,
    };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Ready,
    /// Waiting at the `bar.sync` at this instruction index.
    AtBarrier(usize),
    Exited,
}

struct Thread {
    tid: [u32; 3],
    pc: usize,
    regs: Vec<u64>,
    preds: Vec<bool>,
    state: State,
    steps: u64,
}

/// One block being run, and what the launch has counted so far.
struct Block<'k, 'l, 'm, 'a> {
    kernel: &'k Kernel,
    launch: &'l Launch<'l>,
    memory: &'m mut [Allocation<'a>],
    ctaid: [u32; 3],
    shared: Vec<u8>,
    race: Vec<Cell>,
    touched: Vec<usize>,
    threads: Vec<Thread>,
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
                    self.threads.push(Thread {
                        tid: [x, y, z],
                        pc: 0,
                        regs: vec![0; usize::from(self.kernel.regs)],
                        preds: vec![false; usize::from(self.kernel.preds)],
                        state: State::Ready,
                        steps: 0,
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
            let line = |pc: usize| self.kernel.instrs[pc].line;
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

    fn deadlock(&self, detail: String) -> EmuError {
        EmuError::Deadlock {
            kernel: self.kernel.name.clone(),
            block: self.ctaid,
            detail,
        }
    }

    fn clear_races(&mut self) {
        for &offset in &self.touched {
            self.race[offset] = Cell::EMPTY;
        }
        self.touched.clear();
    }

    fn place(&self, t: usize, instr: &Instr) -> Place {
        Place {
            kernel: self.kernel.name.clone(),
            block: self.ctaid,
            thread: self.threads[t].tid,
            line: instr.line,
        }
    }

    fn read(&self, t: usize, src: Src) -> u64 {
        match src {
            Src::Reg(reg) => self.threads[t].regs[usize::from(reg)],
            Src::Imm(value) => value,
            Src::Special(special) => u64::from(match special {
                Special::Tid(axis) => self.threads[t].tid[axis],
                Special::Ntid(axis) => self.launch.block[axis],
                Special::Ctaid(axis) => self.ctaid[axis],
                Special::Nctaid(axis) => self.launch.grid[axis],
            }),
        }
    }

    fn write(&mut self, t: usize, dst: u16, bits: u32, value: u64) {
        self.threads[t].regs[usize::from(dst)] = ops::mask(value, bits);
    }

    /// Runs thread `t` until it waits at a barrier, exits, or faults.
    fn run_thread(&mut self, t: usize) -> Result<(), EmuError> {
        let kernel = self.kernel;
        loop {
            let pc = self.threads[t].pc;
            let Some(instr) = kernel.instrs.get(pc) else {
                self.threads[t].state = State::Exited;
                return Ok(());
            };
            let thread = &mut self.threads[t];
            thread.steps += 1;
            thread.pc += 1;
            self.stats.instructions += 1;
            if thread.steps > self.launch.step_limit {
                return Err(EmuError::StepLimit {
                    at: self.place(t, instr),
                    limit: self.launch.step_limit,
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
                Op::Float { op, dst, a, b } => {
                    let value = ops::float(*op, self.read(t, *a), self.read(t, *b));
                    self.write(t, *dst, 32, value);
                }
                Op::Fma { dst, a, b, c } => {
                    let value = ops::fma(self.read(t, *a), self.read(t, *b), self.read(t, *c));
                    self.write(t, *dst, 32, value);
                }
                Op::Sqrt { dst, a } => {
                    let value = ops::sqrt(self.read(t, *a));
                    self.write(t, *dst, 32, value);
                }
                Op::Unary { op, ty, dst, a } => {
                    let value = ops::unary(*op, *ty, self.read(t, *a));
                    self.write(t, *dst, ty.bits, value);
                }
                Op::Setp {
                    cmp,
                    ty,
                    dst,
                    a,
                    b,
                    combine,
                } => {
                    let mut value = ops::compare(*cmp, *ty, self.read(t, *a), self.read(t, *b));
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
                Op::Ld {
                    space,
                    ty,
                    dsts,
                    addr,
                } => {
                    let base = self.address(t, *addr);
                    let size = ty.bytes();
                    self.check_alignment(t, instr, *space, base, size * dsts.len() as u32, "load")?;
                    for (i, dst) in dsts.iter().enumerate() {
                        let at = base.wrapping_add(u64::from(size) * i as u64);
                        let raw = self.load(t, instr, *space, at, size)?;
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
                    let base = self.address(t, *addr);
                    let size = ty.bytes();
                    self.check_alignment(
                        t,
                        instr,
                        *space,
                        base,
                        size * srcs.len() as u32,
                        "store",
                    )?;
                    for (i, src) in srcs.iter().enumerate() {
                        let at = base.wrapping_add(u64::from(size) * i as u64);
                        let value = self.read(t, *src);
                        self.store(t, instr, *space, at, *ty, value)?;
                    }
                }
                Op::Bra { target } => self.threads[t].pc = *target as usize,
                Op::Bar => {
                    self.threads[t].state = State::AtBarrier(pc);
                    return Ok(());
                }
                Op::Exit => {
                    self.threads[t].state = State::Exited;
                    return Ok(());
                }
            }
        }
    }

    fn address(&self, t: usize, addr: Addr) -> u64 {
        let base = addr.base.map_or(0, |reg| self.read(t, Src::Reg(reg)));
        base.wrapping_add(addr.offset as u64)
    }

    fn check_alignment(
        &self,
        t: usize,
        instr: &Instr,
        space: Space,
        address: u64,
        size: u32,
        what: &str,
    ) -> Result<(), EmuError> {
        if address.is_multiple_of(u64::from(size)) {
            return Ok(());
        }
        Err(EmuError::Misaligned {
            at: self.place(t, instr),
            address,
            size,
            kind: format!("{} {what}", space_name(space)),
        })
    }

    fn illegal(
        &self,
        t: usize,
        instr: &Instr,
        space: Space,
        address: u64,
        size: u32,
        what: &str,
    ) -> EmuError {
        EmuError::IllegalAddress {
            at: self.place(t, instr),
            address,
            size,
            kind: format!("{} {what}", space_name(space)),
        }
    }

    fn load(
        &mut self,
        t: usize,
        instr: &Instr,
        space: Space,
        address: u64,
        size: u32,
    ) -> Result<u64, EmuError> {
        let n = size as usize;
        let bytes: &[u8] = match space {
            Space::Param => {
                let params = self.launch.params;
                match usize::try_from(address)
                    .ok()
                    .filter(|&a| a.checked_add(n).is_some_and(|end| end <= params.len()))
                {
                    Some(start) => &params[start..start + n],
                    None => return Err(self.illegal(t, instr, space, address, size, "load")),
                }
            }
            Space::Shared => {
                let Some(start) = self.shared_range(address, n) else {
                    return Err(self.illegal(t, instr, space, address, size, "load"));
                };
                self.track(t, instr, start, n, false)?;
                &self.shared[start..start + n]
            }
            Space::Global => match find(self.memory, address, n) {
                Some((index, start)) => &self.memory[index].bytes[start..start + n],
                None => return Err(self.illegal(t, instr, space, address, size, "load")),
            },
        };
        let mut raw = [0u8; 8];
        raw[..n].copy_from_slice(bytes);
        Ok(u64::from_le_bytes(raw))
    }

    fn store(
        &mut self,
        t: usize,
        instr: &Instr,
        space: Space,
        address: u64,
        ty: Ty,
        value: u64,
    ) -> Result<(), EmuError> {
        let n = ty.bytes() as usize;
        let raw = value.to_le_bytes();
        match space {
            Space::Param => Err(self.illegal(t, instr, space, address, ty.bytes(), "store")),
            Space::Shared => {
                let Some(start) = self.shared_range(address, n) else {
                    return Err(self.illegal(t, instr, space, address, ty.bytes(), "store"));
                };
                self.track(t, instr, start, n, true)?;
                self.shared[start..start + n].copy_from_slice(&raw[..n]);
                Ok(())
            }
            Space::Global => match find(self.memory, address, n) {
                Some((index, start)) => {
                    self.memory[index].bytes[start..start + n].copy_from_slice(&raw[..n]);
                    Ok(())
                }
                None => Err(self.illegal(t, instr, space, address, ty.bytes(), "store")),
            },
        }
    }

    fn shared_range(&self, address: u64, n: usize) -> Option<usize> {
        let start = usize::try_from(address).ok()?;
        (start.checked_add(n)? <= self.shared.len()).then_some(start)
    }

    /// Records thread `t`'s access to shared bytes `start..start + n`; a race if another
    /// thread wrote one of them, or read one this thread writes, in this barrier interval.
    fn track(
        &mut self,
        t: usize,
        instr: &Instr,
        start: usize,
        n: usize,
        write: bool,
    ) -> Result<(), EmuError> {
        let me = t as u32;
        for offset in start..start + n {
            let cell = &mut self.race[offset];
            if cell.writer == NOBODY && cell.reader == NOBODY {
                self.touched.push(offset);
            }
            let conflict = if cell.writer != NOBODY && cell.writer != me {
                Some((
                    cell.writer,
                    if write {
                        "write after write"
                    } else {
                        "read after write"
                    },
                ))
            } else if write && cell.reader != NOBODY && cell.reader != me {
                Some((cell.reader, "write after read"))
            } else if write && cell.other_reader != NOBODY && cell.other_reader != me {
                Some((cell.other_reader, "write after read"))
            } else {
                None
            };
            if let Some((other, what)) = conflict {
                return Err(EmuError::SharedRace {
                    at: self.place(t, instr),
                    offset: offset as u64,
                    other: self.threads[other as usize].tid,
                    what: what.into(),
                });
            }
            if write {
                cell.writer = me;
            } else if cell.reader == NOBODY {
                cell.reader = me;
            } else if cell.reader != me {
                cell.other_reader = me;
            }
        }
        Ok(())
    }
}

fn space_name(space: Space) -> &'static str {
    match space {
        Space::Global => "global",
        Space::Shared => "shared",
        Space::Param => "param",
    }
}

/// The allocation holding `address .. address + n` and the offset of `address` in it.
fn find(memory: &[Allocation<'_>], address: u64, n: usize) -> Option<(usize, usize)> {
    memory.iter().enumerate().find_map(|(index, alloc)| {
        let start = address.checked_sub(alloc.base)?;
        let end = start.checked_add(n as u64)?;
        (end <= alloc.bytes.len() as u64).then_some((index, start as usize))
    })
}
