//! `CompiledBlueprint`: a blueprint as a [`KernelProgram`] that the GPU backends can load.

use std::sync::Arc;

use tensor_wasm_gpu::{CpuParts, CpuSteps, GpuError, KernelArg, KernelProgram, LaunchConfig};

use crate::{
    Blueprint, CacheKey, CompiledKernel, CpuRun, Fingerprint, JitError, KernelCache, PtxTarget,
};

/// A blueprint ready to hand to `Backend::load_program`: it carries its canonical name and
/// target-independent fingerprint, and emits PTX for whichever device asks.
///
/// Emission is cheap (microseconds) and not cached here; caching loaded modules by fingerprint
/// is the backend's job.
#[derive(Debug, Clone)]
pub struct CompiledBlueprint {
    blueprint: Blueprint,
    name: String,
    fingerprint: Fingerprint,
    cache: Option<Arc<KernelCache>>,
}

impl CompiledBlueprint {
    /// Wraps `blueprint`.
    pub fn new(blueprint: Blueprint) -> Self {
        Self {
            name: blueprint.descriptor(),
            fingerprint: Fingerprint::of_program(&blueprint),
            blueprint,
            cache: None,
        }
    }

    /// Wraps `blueprint`, emitting its PTX through `cache` (one emission per
    /// device target, kept in memory and on disk).
    pub fn with_cache(blueprint: Blueprint, cache: Arc<KernelCache>) -> Self {
        Self {
            cache: Some(cache),
            ..Self::new(blueprint)
        }
    }

    /// Parses `descriptor` and wraps the blueprint.
    ///
    /// # Errors
    /// What [`Blueprint::parse`] reports.
    pub fn parse(descriptor: &str) -> Result<Self, JitError> {
        Blueprint::parse(descriptor).map(Self::new)
    }

    /// The blueprint.
    pub fn blueprint(&self) -> &Blueprint {
        &self.blueprint
    }
}

impl KernelProgram for CompiledBlueprint {
    fn name(&self) -> &str {
        &self.name
    }

    fn fingerprint(&self) -> [u8; 16] {
        self.fingerprint.0
    }

    fn validate(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory_len: usize,
    ) -> Result<(), GpuError> {
        Ok(self.blueprint.validate_launch(config, args, memory_len)?)
    }

    fn run_cpu(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &mut [u8],
    ) -> Result<(), GpuError> {
        Ok(self.blueprint.run_cpu(config, args, memory)?)
    }

    fn cpu_steps(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory_len: usize,
    ) -> Result<Option<Box<dyn CpuSteps>>, GpuError> {
        let run = self.blueprint.cpu_run(config, args, memory_len)?;
        Ok(Some(Box::new(run)))
    }

    fn cpu_parts(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory_len: usize,
        workers: usize,
    ) -> Result<Option<CpuParts>, GpuError> {
        Ok(self
            .blueprint
            .cpu_parts(config, args, memory_len, workers)?)
    }

    /// The emitter writes one PTX parameter per blueprint parameter (the conformance run checks
    /// this for every blueprint of the set).
    fn param_count(&self) -> Option<usize> {
        Some(self.blueprint.params().len())
    }

    fn ptx(
        &self,
        compute_capability: (u32, u32),
        driver_version: i32,
    ) -> Result<(Arc<str>, String), GpuError> {
        let target = PtxTarget::for_device(compute_capability, driver_version)?;
        let emit = || CompiledKernel {
            ptx: Arc::from(self.blueprint.emit_ptx(&target)),
            entry: Arc::from(self.blueprint.entry_name()),
            cubin: None,
        };
        let Some(cache) = &self.cache else {
            let kernel = emit();
            return Ok((kernel.ptx, kernel.entry.to_string()));
        };
        let key = CacheKey {
            fingerprint: self.fingerprint.0,
            arch: compute_capability,
            driver_version,
        };
        let kernel = cache
            .get_or_compile(&key, || Ok(emit()))
            .map_err(GpuError::InvalidArgument)?;
        Ok((kernel.ptx.clone(), kernel.entry.to_string()))
    }
}

impl CpuSteps for CpuRun {
    fn step(&mut self, memory: &mut [u8]) -> Result<bool, GpuError> {
        Ok(CpuRun::step(self, memory)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_forwards_to_the_blueprint() {
        let program = CompiledBlueprint::parse("vector_add[4]").unwrap();
        assert_eq!(program.name(), "vector_add[4]:f32");
        let other = CompiledBlueprint::parse("vector_add[4]:f32").unwrap();
        assert_eq!(program.fingerprint(), other.fingerprint());
        assert_ne!(
            program.fingerprint(),
            CompiledBlueprint::parse("vector_add[8]")
                .unwrap()
                .fingerprint()
        );
        let (ptx, entry) = program.ptx((9, 0), 13000).unwrap();
        assert_eq!(entry, "tw_vector_add_4_f32");
        assert!(ptx.contains(".target sm_90\n"));
        assert!(ptx.contains(".version 9.0\n"));
        assert!(matches!(
            program.ptx((9, 0), 9000),
            Err(GpuError::NotAvailable(_))
        ));

        let config = LaunchConfig::linear(1, 256);
        let args = [
            KernelArg::Buffer { offset: 0, len: 4 },
            KernelArg::Buffer { offset: 16, len: 4 },
            KernelArg::Buffer { offset: 32, len: 4 },
            KernelArg::U32(2),
        ];
        assert!(matches!(
            program.validate(&config, &args, 64),
            Err(GpuError::InvalidArgument(_))
        ));
        let args = [
            KernelArg::Buffer { offset: 0, len: 4 },
            KernelArg::Buffer { offset: 16, len: 4 },
            KernelArg::Buffer { offset: 32, len: 4 },
            KernelArg::U32(1),
        ];
        program.validate(&config, &args, 64).unwrap();
        let mut memory = vec![0u8; 64];
        memory[0..4].copy_from_slice(&1.5f32.to_le_bytes());
        memory[16..20].copy_from_slice(&2.25f32.to_le_bytes());
        program.run_cpu(&config, &args, &mut memory).unwrap();
        assert_eq!(memory[32..36], 3.75f32.to_le_bytes());
    }
}

#[cfg(test)]
mod cache_tests {
    use super::*;
    use crate::{KernelCacheConfig, KernelCacheMetrics};

    #[test]
    fn ptx_goes_through_the_cache_once_per_target() {
        let cache = Arc::new(
            KernelCache::new(
                KernelCacheConfig::default(),
                KernelCacheMetrics::unregistered().unwrap(),
            )
            .unwrap(),
        );
        let blueprint = Blueprint::parse("matmul[16x16x16]").unwrap();
        let program = CompiledBlueprint::with_cache(blueprint, cache.clone());
        let (first, entry) = program.ptx((9, 0), 13000).unwrap();
        let (again, _) = program.ptx((9, 0), 13000).unwrap();
        assert!(
            Arc::ptr_eq(&first, &again),
            "the second call is a cache hit"
        );
        assert_eq!(entry, blueprint.entry_name());
        program.ptx((8, 0), 13000).unwrap();
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.metrics().compile_seconds.get_sample_count(), 2);
        assert_eq!(cache.metrics().hits.get(), 1);
    }
}
