//! Host-described kernels: the [`KernelProgram`] trait (bounds validation, a CPU implementation
//! and PTX, supplied by host code such as the JIT), and the per-backend cache of loaded programs.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use crate::{GpuError, KernelArg, LaunchConfig};

/// A kernel described by host code: bounds validation, CPU execution and PTX.
///
/// Load one with [`Backend::load_program`](crate::Backend::load_program) and launch it with
/// [`launch`](crate::launch) like any other kernel. Every launch is checked in this order, in the
/// launching thread, before anything runs: the [`LaunchConfig`] against CUDA's limits, every
/// [`KernelArg::Buffer`] against the guest memory (the generic check every kernel gets), then
/// [`KernelProgram::validate`].
///
/// The program is trusted host code: its `validate` is what keeps its kernel inside guest memory,
/// so it must refuse every launch whose grid-covered indices could reach a byte outside a buffer
/// argument. On the CPU backend a launch runs on the worker pool as the parts of
/// [`KernelProgram::cpu_parts`] on every core, else as the steps of
/// [`KernelProgram::cpu_steps`] (either way cancellable and fair between tenants between
/// steps), or as one call of [`KernelProgram::run_cpu`] for a program with neither; on a CUDA
/// backend the PTX entry is called with each buffer argument as its
/// device address (guest memory base plus offset, a 64-bit parameter) and each scalar by value,
/// in argument order, after the driver-reported parameter sizes have been checked against the
/// arguments.
pub trait KernelProgram: Send + Sync + fmt::Debug {
    /// Name for errors and logs, e.g. `"matmul[16x16x16]:f32"`.
    fn name(&self) -> &str;

    /// Stable identity (the JIT's fingerprint): backends cache loaded modules by it.
    ///
    /// Two programs with the same fingerprint must be the same kernel: a backend that already
    /// loaded one returns it for the other.
    fn fingerprint(&self) -> [u8; 16];

    /// Refuses any launch that could touch memory outside `memory_len` bytes or outside its
    /// buffers.
    ///
    /// # Errors
    /// `InvalidArgument` saying what is wrong.
    fn validate(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory_len: usize,
    ) -> Result<(), GpuError>;

    /// Runs on the CPU over guest memory, computing exactly the grid-covered indices.
    ///
    /// Only called after [`KernelProgram::validate`] accepted the same `config` and `args` for
    /// `memory.len()` bytes.
    ///
    /// # Errors
    /// Whatever the kernel reports; the launch's completion ends with it.
    fn run_cpu(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &mut [u8],
    ) -> Result<(), GpuError>;

    /// The CPU run of a launch as bounded, resumable steps, or `None` (the default) to run it
    /// as one [`KernelProgram::run_cpu`] call that nothing can interrupt.
    ///
    /// Only called after [`KernelProgram::validate`] accepted the same `config` and `args` for
    /// `memory_len` bytes; every step then gets that memory. A program whose launches can be
    /// long should have steps: the CPU backend checks for cancellation (the invocation's
    /// deadline) and serves other tenants between them.
    ///
    /// # Errors
    /// Whatever the kernel reports; the launch's completion ends with it.
    fn cpu_steps(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory_len: usize,
    ) -> Result<Option<Box<dyn CpuSteps>>, GpuError> {
        let _ = (config, args, memory_len);
        Ok(None)
    }

    /// The CPU run of a launch as parts that may run on different cores at once, or `None` (the
    /// default) to run it as [`KernelProgram::cpu_steps`] on one core.
    ///
    /// Only called after [`KernelProgram::validate`] accepted the same `config` and `args` for
    /// `memory_len` bytes. `workers` is how many cores the backend has; more parts than that
    /// gain nothing. The backend refuses parts that could race (see [`CpuParts`]) with an
    /// internal error, so a program offers parts only where outputs and inputs are disjoint.
    ///
    /// # Errors
    /// Whatever the kernel reports; the launch's completion ends with it.
    fn cpu_parts(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory_len: usize,
        workers: usize,
    ) -> Result<Option<CpuParts>, GpuError> {
        let _ = (config, args, memory_len, workers);
        Ok(None)
    }

    /// The number of parameters of the PTX entry [`KernelProgram::ptx`] returns, when the
    /// program knows it (its own emitter wrote the PTX), or `None` (the default). With a count
    /// the CUDA backend reads exactly that many parameter sizes from the driver; without one it
    /// reads until the driver refuses an index, an error compute-sanitizer reports.
    fn param_count(&self) -> Option<usize> {
        None
    }

    /// (PTX text, entry name) for a device of this compute capability and driver version
    /// (`cuDriverGetVersion`, e.g. 13000 for CUDA 13.0).
    ///
    /// # Errors
    /// `NotAvailable` when the program has no PTX for such a device.
    fn ptx(
        &self,
        compute_capability: (u32, u32),
        driver_version: i32,
    ) -> Result<(Arc<str>, String), GpuError>;
}

/// A launch of a [`KernelProgram`] on the CPU, computed step by step
/// ([`KernelProgram::cpu_steps`]).
pub trait CpuSteps: Send {
    /// Computes the next step over the guest memory the launch was validated against; `Ok(true)`
    /// once the whole launch is computed. One step should take well under a millisecond on an
    /// optimised build: it is how long a cancelled launch, or another tenant, may wait for it.
    ///
    /// # Errors
    /// Whatever the kernel reports; the launch's completion ends with it and no further step
    /// runs.
    fn step(&mut self, memory: &mut [u8]) -> Result<bool, GpuError>;
}

/// A launch on the CPU as parts that run at once ([`KernelProgram::cpu_parts`]): every part
/// reads the `inputs` byte ranges of guest memory and writes its own output range, nothing else.
/// The backend checks before it runs any part that every range lies inside guest memory and
/// that no output range overlaps another part's output or any input, so parts cannot race.
pub struct CpuParts {
    /// Byte ranges of guest memory every part may read, given to each step in this order.
    pub inputs: Vec<Range<usize>>,
    /// Each part with the byte range of guest memory it writes.
    pub parts: Vec<(Range<usize>, Box<dyn CpuPart>)>,
}

impl fmt::Debug for CpuParts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let outputs: Vec<&Range<usize>> = self.parts.iter().map(|(range, _)| range).collect();
        f.debug_struct("CpuParts")
            .field("inputs", &self.inputs)
            .field("outputs", &outputs)
            .finish()
    }
}

impl CpuParts {
    /// Refuses parts that would reach outside `memory_len` bytes or could race: an output range
    /// overlapping another part's output or any input.
    ///
    /// # Errors
    /// `Cuda` (an internal error of the program that offered the parts).
    pub fn check(&self, memory_len: usize) -> Result<(), GpuError> {
        let overlap = |x: &Range<usize>, y: &Range<usize>| {
            !x.is_empty() && !y.is_empty() && x.start < y.end && y.start < x.end
        };
        let outputs: Vec<&Range<usize>> = self.parts.iter().map(|(range, _)| range).collect();
        let inside = |range: &Range<usize>| range.start <= range.end && range.end <= memory_len;
        let fault = if !self
            .inputs
            .iter()
            .chain(outputs.iter().copied())
            .all(inside)
        {
            Some("a range outside guest memory")
        } else if outputs
            .iter()
            .enumerate()
            .any(|(i, x)| outputs[i + 1..].iter().any(|y| overlap(x, y)))
        {
            Some("two parts writing the same bytes")
        } else if outputs
            .iter()
            .any(|x| self.inputs.iter().any(|y| overlap(x, y)))
        {
            Some("a part writing bytes the parts read")
        } else {
            None
        };
        match fault {
            Some(fault) => Err(GpuError::Cuda(format!(
                "CPU kernel parts refused: {fault} (internal error)"
            ))),
            None => Ok(()),
        }
    }
}

impl CpuParts {
    /// Runs every part on the calling thread, one after another, over `memory` (the guest
    /// memory the launch was planned for), after the same check the CPU backend makes: the
    /// inputs are copied first, then each part steps to its end. For tests and tools; the
    /// backend runs parts on its workers at once.
    ///
    /// # Errors
    /// What [`CpuParts::check`] refuses, or the first error of a part's step.
    pub fn run_in_order(self, memory: &mut [u8]) -> Result<(), GpuError> {
        self.check(memory.len())?;
        let inputs: Vec<Vec<u8>> = self
            .inputs
            .iter()
            .map(|range| memory[range.clone()].to_vec())
            .collect();
        let inputs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        for (range, mut part) in self.parts {
            while !part.step(&inputs, &mut memory[range.clone()])? {}
        }
        Ok(())
    }
}

/// One part of a launch on the CPU ([`CpuParts`]), computed step by step.
pub trait CpuPart: Send {
    /// Computes the next step from `inputs` (the launch's input ranges, in order) into
    /// `output` (this part's range); `Ok(true)` once the part is computed. One step should take
    /// well under a millisecond on an optimised build, as for [`CpuSteps::step`].
    ///
    /// # Errors
    /// Whatever the kernel reports; the launch's completion ends with it and no further step
    /// of this part runs.
    fn step(&mut self, inputs: &[&[u8]], output: &mut [u8]) -> Result<bool, GpuError>;
}

/// Most programs one backend keeps loaded; past it, the oldest is forgotten (kernels already
/// handed out keep their module alive).
pub(crate) const PROGRAM_CACHE_CAPACITY: usize = 1024;

/// Loaded programs of one backend, keyed by fingerprint, oldest evicted first.
pub(crate) struct ProgramCache<T> {
    state: Mutex<CacheState<T>>,
    capacity: usize,
}

struct CacheState<T> {
    entries: HashMap<[u8; 16], T>,
    order: VecDeque<[u8; 16]>,
    loads: u64,
}

impl<T: Clone> ProgramCache<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            state: Mutex::new(CacheState {
                entries: HashMap::new(),
                order: VecDeque::new(),
                loads: 0,
            }),
            capacity: capacity.max(1),
        }
    }

    /// The entry for `fingerprint`, loading it with `load` when missing. The lock is held while
    /// loading, so concurrent loads of one program load it once.
    pub(crate) fn get_or_load(
        &self,
        fingerprint: [u8; 16],
        load: impl FnOnce() -> Result<T, GpuError>,
    ) -> Result<T, GpuError> {
        // Entries are inserted whole, so a poisoned lock still holds a consistent map.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = state.entries.get(&fingerprint) {
            return Ok(entry.clone());
        }
        let entry = load()?;
        state.loads += 1;
        if state.entries.len() >= self.capacity {
            if let Some(oldest) = state.order.pop_front() {
                state.entries.remove(&oldest);
            }
        }
        state.entries.insert(fingerprint, entry.clone());
        state.order.push_back(fingerprint);
        Ok(entry)
    }

    /// How many times an entry was loaded (cache misses that succeeded).
    #[cfg(test)]
    pub(crate) fn loads(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .loads
    }

    /// Entries held now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entries
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_loads_each_fingerprint_once_and_evicts_the_oldest() {
        let cache = ProgramCache::new(2);
        let loaded = |value: u32| move || Ok(value);
        assert_eq!(cache.get_or_load([1; 16], loaded(1)), Ok(1));
        assert_eq!(cache.get_or_load([1; 16], loaded(99)), Ok(1));
        assert_eq!(cache.loads(), 1);
        assert_eq!(cache.get_or_load([2; 16], loaded(2)), Ok(2));
        assert_eq!(cache.get_or_load([3; 16], loaded(3)), Ok(3));
        assert_eq!((cache.loads(), cache.len()), (3, 2));
        // [1] was the oldest: it is loaded again.
        assert_eq!(cache.get_or_load([1; 16], loaded(10)), Ok(10));
        assert_eq!(cache.get_or_load([3; 16], loaded(99)), Ok(3));
        assert_eq!(cache.loads(), 4);
    }

    struct Nothing;

    impl CpuPart for Nothing {
        fn step(&mut self, _: &[&[u8]], _: &mut [u8]) -> Result<bool, GpuError> {
            Ok(true)
        }
    }

    /// Parts pass the check only with every range inside memory, outputs disjoint from each
    /// other and from every input; empty ranges overlap nothing.
    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn parts_that_could_race_or_reach_outside_memory_are_refused() {
        let parts = |inputs: Vec<Range<usize>>, outputs: Vec<Range<usize>>| CpuParts {
            inputs,
            parts: outputs
                .into_iter()
                .map(|range| (range, Box::new(Nothing) as Box<dyn CpuPart>))
                .collect(),
        };
        let refused = |parts: CpuParts, why: &str| match parts.check(100) {
            Err(GpuError::Cuda(message)) => assert!(message.contains(why), "{message}"),
            other => panic!("{parts:?}: {other:?}"),
        };
        assert_eq!(parts(vec![0..40], vec![40..60, 60..100]).check(100), Ok(()));
        assert_eq!(
            parts(vec![0..40, 10..20], vec![40..40, 40..41]).check(100),
            Ok(())
        );
        refused(parts(vec![0..40], vec![40..101]), "outside guest memory");
        refused(parts(vec![90..101], vec![0..10]), "outside guest memory");
        #[allow(clippy::reversed_empty_ranges)]
        refused(parts(vec![], vec![50..40]), "outside guest memory");
        refused(parts(vec![0..40], vec![40..60, 59..70]), "the same bytes");
        refused(parts(vec![0..40], vec![39..60]), "bytes the parts read");
    }

    #[test]
    fn failed_loads_are_not_cached() {
        let cache: ProgramCache<u32> = ProgramCache::new(4);
        let error = GpuError::NotAvailable(String::from("no PTX"));
        assert_eq!(
            cache.get_or_load([7; 16], || Err(error.clone())),
            Err(error)
        );
        assert_eq!((cache.loads(), cache.len()), (0, 0));
        assert_eq!(cache.get_or_load([7; 16], || Ok(5)), Ok(5));
        assert_eq!(cache.loads(), 1);
    }
}
