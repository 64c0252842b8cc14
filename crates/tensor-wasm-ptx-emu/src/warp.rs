//! Warp operations: `shfl.sync` completes once every lane its member mask names waits at
//! it. Lanes are the linear thread index (x fastest) modulo 32; a warp is 32 consecutive
//! linear threads.

use crate::exec::{Block, State};
use crate::ir::{Op, ShflMode};
use crate::EmuError;

/// Lanes per warp.
const WARP: usize = 32;

/// The lane `shfl.sync` reads for `lane`, and whether it is in range (`false`: the lane
/// keeps its own value), per the ISA: `c` packs the clamp (bits 0–4) and the segment mask
/// (bits 8–12).
pub(crate) fn source_lane(mode: ShflMode, lane: u32, b: u32, c: u32) -> (u32, bool) {
    let b = b & 31;
    let clamp = c & 31;
    let segmask = (c >> 8) & 31;
    let max_lane = (lane & segmask) | (clamp & !segmask);
    let min_lane = lane & segmask;
    let (j, in_range) = match mode {
        ShflMode::Up => {
            let j = lane as i32 - b as i32;
            (j, j >= max_lane as i32)
        }
        ShflMode::Down => {
            let j = (lane + b) as i32;
            (j, j <= max_lane as i32)
        }
        ShflMode::Bfly => {
            let j = (lane ^ b) as i32;
            (j, j <= max_lane as i32)
        }
        ShflMode::Idx => {
            let j = (min_lane | (b & !segmask)) as i32;
            (j, j <= max_lane as i32)
        }
    };
    if in_range {
        (j as u32, true)
    } else {
        (lane, false)
    }
}

impl Block<'_, '_, '_, '_> {
    /// Completes every waiting warp operation, or fails: called when no thread can run, so
    /// a lane that is not waiting at the same instruction never will be.
    pub(crate) fn resolve_warps(&mut self) -> Result<(), EmuError> {
        let mut results: Vec<(usize, u16, Option<u16>, u64, bool)> = Vec::new();
        for t in 0..self.threads.len() {
            let State::AtWarp(pc) = self.threads[t].state else {
                continue;
            };
            let instr = &self.kernel.code(pc.func).instrs[pc.index];
            let Op::Shfl {
                mode,
                dst,
                pred,
                a: _,
                b,
                c,
                mask,
            } = instr.op
            else {
                unreachable!("threads wait only at shfl.sync")
            };
            let lane = (t % WARP) as u32;
            let warp_start = t - t % WARP;
            let mask = self.read(t, mask) as u32;
            let undefined = |what: String| EmuError::Undefined {
                at: self.place(t, instr),
                what,
            };
            if mask & (1 << lane) == 0 {
                return Err(undefined(format!(
                    "shfl.sync by lane {lane}, which its member mask {mask:#010x} leaves out"
                )));
            }
            for other in (0..WARP as u32).filter(|l| mask & (1 << l) != 0) {
                let index = warp_start + other as usize;
                match self.threads.get(index).map(|thread| thread.state) {
                    Some(State::AtWarp(at)) if at == pc => {}
                    None => {
                        return Err(undefined(format!(
                            "shfl.sync names lane {other} in its member mask {mask:#010x}, \
                             past the block's last thread"
                        )))
                    }
                    Some(State::Exited) => {
                        return Err(undefined(format!(
                            "shfl.sync names lane {other} in its member mask {mask:#010x}, \
                             which has exited"
                        )))
                    }
                    Some(state) => {
                        let elsewhere = match state {
                            State::AtWarp(at) | State::AtBarrier(at) => {
                                format!("PTX line {}", self.line_of(at))
                            }
                            _ => "another place".to_owned(),
                        };
                        return Err(self.deadlock(format!(
                            "lane {lane} waits at shfl.sync (PTX line {}) for lane {other}, \
                             which waits at {elsewhere}",
                            instr.line
                        )));
                    }
                }
            }
            let (b, c) = (self.read(t, b) as u32, self.read(t, c) as u32);
            let (source, in_range) = source_lane(mode, lane, b, c);
            if mask & (1 << source) == 0 {
                return Err(undefined(format!(
                    "shfl.sync of lane {lane} reads lane {source}, outside its member mask \
                     {mask:#010x}"
                )));
            }
            let source_thread = warp_start + source as usize;
            let Op::Shfl { a, .. } = instr.op else {
                unreachable!("matched above")
            };
            let value = self.read(source_thread, a);
            results.push((t, dst, pred, value, in_range));
        }
        for (t, dst, pred, value, in_range) in results {
            self.write(t, dst, 32, value);
            if let Some(pred) = pred {
                self.threads[t].preds[usize::from(pred)] = in_range;
            }
            self.threads[t].state = State::Ready;
        }
        Ok(())
    }
}
