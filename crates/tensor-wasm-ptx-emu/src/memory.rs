//! Memory accesses of a running block: the entry's parameters, the frame's `.param`
//! variables, shared memory (with the race detector), each thread's local memory, global
//! allocations, and generic addresses resolved to one of them.

use crate::exec::{Allocation, Block, Cell, NOBODY};
use crate::ir::{Addr, Instr, Space, Src, Ty};
use crate::EmuError;

/// Generic addresses `SHARED_WINDOW .. SHARED_WINDOW + 2^32` are shared memory: `cvta.shared`
/// adds this base to a shared offset. The window lies outside every user-space address of
/// x86-64 and AArch64 hosts, so no host allocation a stand-in driver hands out meets it.
pub const SHARED_WINDOW: u64 = 0xffff_8000_0000_0000;
/// Generic addresses `LOCAL_WINDOW .. LOCAL_WINDOW + 2^32` are the thread's local memory.
pub const LOCAL_WINDOW: u64 = 0xffff_c000_0000_0000;
const WINDOW_BYTES: u64 = 1 << 32;
/// Where a block's shared memory starts in the shared state space. As on sm_80 and later
/// GPUs (which reserve the first KiB of the window for the system), shared variables do not
/// start at 0: a kernel assuming they do fails here as it would on the device.
pub const SHARED_BASE: u64 = 1024;

/// The space and address a generic address names.
pub(crate) fn generic(address: u64) -> (Space, u64) {
    let shared = address.wrapping_sub(SHARED_WINDOW);
    if shared < WINDOW_BYTES {
        return (Space::Shared, shared);
    }
    let local = address.wrapping_sub(LOCAL_WINDOW);
    if local < WINDOW_BYTES {
        return (Space::Local, local);
    }
    (Space::Global, address)
}

/// `cvta`: a space's address to a generic one (`to` false), or back.
pub(crate) fn cvta(space: Space, to: bool, value: u64) -> u64 {
    let window = match space {
        Space::Shared => SHARED_WINDOW,
        Space::Local => LOCAL_WINDOW,
        _ => return value,
    };
    if to {
        value.wrapping_sub(window)
    } else {
        value.wrapping_add(window)
    }
}

pub(crate) fn space_name(space: Space) -> &'static str {
    match space {
        Space::Global => "global",
        Space::Shared => "shared",
        Space::Param => "param",
        Space::Frame => "param (frame)",
        Space::Local => "local",
        Space::Generic => "generic",
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

/// The index in the block's shared memory of shared address `address`, if `n` bytes fit.
fn shared_range(address: u64, n: usize, len: usize) -> Option<usize> {
    range(address.checked_sub(SHARED_BASE)?, n, len)
}

/// `start .. start + n` of a buffer of `len` bytes, if it fits.
fn range(address: u64, n: usize, len: usize) -> Option<usize> {
    let start = usize::try_from(address).ok()?;
    (start.checked_add(n)? <= len).then_some(start)
}

impl Block<'_, '_, '_, '_> {
    /// The address an operand names in `space`: a `.local` symbol is relative to the
    /// frame's local memory, everything else absolute.
    pub(crate) fn address(&self, t: usize, space: Space, addr: Addr) -> u64 {
        let base = match addr.base {
            Some(reg) => self.read(t, Src::Reg(reg)),
            None if space == Space::Local => u64::from(self.threads[t].local_base),
            None => 0,
        };
        base.wrapping_add(addr.offset as u64)
    }

    /// A generic address resolved; other spaces as they are.
    pub(crate) fn concrete(space: Space, address: u64) -> (Space, u64) {
        if space == Space::Generic {
            generic(address)
        } else {
            (space, address)
        }
    }

    pub(crate) fn check_alignment(
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

    pub(crate) fn illegal(
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

    /// Reads `size` bytes at `address` of `space` (not generic: see [`Self::concrete`]);
    /// shared reads are recorded for the race detector unless `atomic`.
    pub(crate) fn load(
        &mut self,
        t: usize,
        instr: &Instr,
        space: Space,
        address: u64,
        size: u32,
        atomic: bool,
    ) -> Result<u64, EmuError> {
        let n = size as usize;
        let illegal = |block: &Self| Err(block.illegal(t, instr, space, address, size, "load"));
        let bytes: &[u8] = match space {
            Space::Param => {
                let params = self.launch.params;
                match range(address, n, params.len()) {
                    Some(start) => &params[start..start + n],
                    None => return illegal(self),
                }
            }
            Space::Frame => {
                let frame = &self.threads[t].frame;
                match range(address, n, frame.len()) {
                    Some(start) => &frame[start..start + n],
                    None => return illegal(self),
                }
            }
            Space::Local => {
                let local = &self.threads[t].local;
                match range(address, n, local.len()) {
                    Some(start) => &local[start..start + n],
                    None => return illegal(self),
                }
            }
            Space::Shared => {
                let Some(start) = shared_range(address, n, self.shared.len()) else {
                    return illegal(self);
                };
                if !atomic {
                    self.track(t, instr, start, n, false)?;
                }
                &self.shared[start..start + n]
            }
            Space::Global | Space::Generic => match find(self.memory, address, n) {
                Some((index, start)) => &self.memory[index].bytes[start..start + n],
                None => match self.launch.cancel {
                    Some(word)
                        if address >= word.address && address - word.address + n as u64 <= 4 =>
                    {
                        let value = u64::from(word.value()).to_le_bytes();
                        let start = (address - word.address) as usize;
                        let mut raw = [0u8; 8];
                        raw[..n].copy_from_slice(&value[start..start + n]);
                        self.threads[t].polled_at = self.threads[t].steps;
                        return Ok(u64::from_le_bytes(raw));
                    }
                    _ => return illegal(self),
                },
            },
        };
        let mut raw = [0u8; 8];
        raw[..n].copy_from_slice(bytes);
        Ok(u64::from_le_bytes(raw))
    }

    /// Writes the low bytes of `value` as `ty` at `address` of `space` (not generic);
    /// shared writes are recorded for the race detector unless `atomic`.
    pub(crate) fn store(
        &mut self,
        t: usize,
        instr: &Instr,
        (space, address): (Space, u64),
        ty: Ty,
        value: u64,
        atomic: bool,
    ) -> Result<(), EmuError> {
        let n = ty.bytes() as usize;
        let raw = value.to_le_bytes();
        let illegal =
            |block: &Self| Err(block.illegal(t, instr, space, address, ty.bytes(), "store"));
        let target: &mut [u8] = match space {
            Space::Param => return illegal(self),
            Space::Frame => {
                let len = self.threads[t].frame.len();
                let Some(start) = range(address, n, len) else {
                    return illegal(self);
                };
                &mut self.threads[t].frame[start..start + n]
            }
            Space::Local => {
                let len = self.threads[t].local.len();
                let Some(start) = range(address, n, len) else {
                    return illegal(self);
                };
                &mut self.threads[t].local[start..start + n]
            }
            Space::Shared => {
                let Some(start) = shared_range(address, n, self.shared.len()) else {
                    return illegal(self);
                };
                if !atomic {
                    self.track(t, instr, start, n, true)?;
                }
                &mut self.shared[start..start + n]
            }
            Space::Global | Space::Generic => match find(self.memory, address, n) {
                Some((index, start)) => &mut self.memory[index].bytes[start..start + n],
                None => return illegal(self),
            },
        };
        target.copy_from_slice(&raw[..n]);
        Ok(())
    }

    /// Records thread `t`'s access to shared bytes `start..start + n`; a race if another
    /// thread wrote one of them, or read one this thread writes, in this barrier interval.
    /// Atomic accesses are not recorded: they are ordered among themselves.
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
                    offset: offset as u64 + SHARED_BASE,
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

    pub(crate) fn clear_races(&mut self) {
        for &offset in &self.touched {
            self.race[offset] = Cell::EMPTY;
        }
        self.touched.clear();
    }
}
