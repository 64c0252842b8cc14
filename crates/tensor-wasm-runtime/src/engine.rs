//! The process-wide wasmtime engine, its epoch ticker and the on-disk cache of
//! precompiled module artifacts.

use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tensor_wasm_mem::{MemoryBacking, TensorWasmMemoryCreator};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, Module, PoolingAllocationConfig};

use crate::bounded::{BoundedLru, CacheBounds};
use crate::config::{GuestMemory, RuntimeConfig};
use crate::error::{Result, RuntimeError};
use crate::metrics::CacheGauges;
use crate::store::sha256_hex;

/// The engine and, for unified guest memory, the memory creator behind it.
pub struct EngineParts {
    pub engine: Engine,
    pub memory_creator: Option<Arc<TensorWasmMemoryCreator>>,
}

/// Builds the one engine of the process from the runtime configuration.
///
/// Epoch interruption is always on (deadlines); fuel only when the operator
/// enables it, because metering slows every guest. With pooled guest memory
/// instances come from the pooling allocator, one slot per allowed concurrent
/// instance; with unified guest memory every linear memory is a
/// [`tensor_wasm_mem::UnifiedBuffer`] from [`TensorWasmMemoryCreator`] (CUDA
/// managed memory when the backend is CUDA).
pub fn build_engine(config: &RuntimeConfig) -> Result<EngineParts> {
    let mut wasm = Config::new();
    // One linear memory per module: every memory would be allocated at the
    // function's limit while quotas count one (deploy refuses such modules first,
    // with a clearer error).
    wasm.epoch_interruption(true)
        .consume_fuel(config.fuel_enabled)
        .wasm_multi_memory(false);
    let memory_creator = match config.effective_guest_memory() {
        GuestMemory::Pooled => {
            let mut pool = PoolingAllocationConfig::default();
            let slots = config.max_instances;
            pool.total_core_instances(slots)
                .total_memories(slots)
                .total_tables(slots)
                .total_component_instances(0)
                .max_memories_per_module(1)
                .max_tables_per_module(4)
                .max_memory_size(
                    usize::try_from(config.max_memory_limit_bytes)
                        .expect("memory cap fits in usize"),
                )
                .linear_memory_keep_resident(
                    usize::try_from(config.pool_keep_resident_bytes).unwrap_or(usize::MAX),
                );
            wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
            None
        }
        GuestMemory::Unified => {
            let backing = match config.backend.cuda_context() {
                Some(ctx) => MemoryBacking::Managed(ctx),
                None => MemoryBacking::Host,
            };
            let creator = Arc::new(TensorWasmMemoryCreator::new(
                backing,
                config.max_memory_limit_bytes,
            ));
            tensor_wasm_mem::configure_engine(&mut wasm, creator.clone());
            Some(creator)
        }
    };
    let engine = Engine::new(&wasm).map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
    Ok(EngineParts {
        engine,
        memory_creator,
    })
}

/// Most core instances one component may instantiate (componentize-py's components have 16).
pub const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 64;
/// Most linear memories one component may define (toolchains' components define one).
pub const MAX_MEMORIES_PER_COMPONENT: u32 = 16;
/// Most tables one component may define.
pub const MAX_TABLES_PER_COMPONENT: u32 = 64;

/// Bytes of each pooled component memory and table reset with `memset` (of the pages written,
/// where the kernel can say which) rather than returned to the kernel when a slot is freed:
/// returning them (`madvise`) costs a TLB shootdown on every core per instance.
const COMPONENT_KEEP_RESIDENT: u64 = 1 << 20;

/// The engine for WebAssembly components: the same deadlines (epochs) and fuel as
/// [`build_engine`]'s, and instances from a pool of their own, as core modules' are: one
/// component slot per allowed concurrent instance, each component within
/// [`MAX_CORE_INSTANCES_PER_COMPONENT`], [`MAX_MEMORIES_PER_COMPONENT`] and
/// [`MAX_TABLES_PER_COMPONENT`] (checked when it compiles, so a deploy refuses a component
/// beyond them), on average a quarter of each per slot, every memory at most the largest
/// memory limit. Pooled slots are reused, not mapped and unmapped per instance: that mapping
/// churn (and the TLB shootdowns of its unmapping) dominated a small HTTP handler's requests.
/// A store's limiter bounds the total of a component's memories by its function's limit.
pub fn build_component_engine(config: &RuntimeConfig) -> Result<Engine> {
    let mut wasm = Config::new();
    // Calls on this engine's stores are async (wasmtime 48 needs no setting for that): each
    // runs as a future that is dropped at the invocation's deadline, so a component blocked in
    // any host wait ends then (`component::run_until`).
    wasm.epoch_interruption(true)
        .consume_fuel(config.fuel_enabled)
        .wasm_component_model(true);
    let slots = config.max_instances;
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(slots)
        .total_core_instances(slots.saturating_mul(MAX_CORE_INSTANCES_PER_COMPONENT / 4))
        .total_memories(slots.saturating_mul(MAX_MEMORIES_PER_COMPONENT / 4))
        .total_tables(slots.saturating_mul(MAX_TABLES_PER_COMPONENT / 4))
        .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
        .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
        .table_elements(crate::invocation_state::MAX_TABLE_ELEMENTS)
        .max_memory_size(
            usize::try_from(config.max_memory_limit_bytes).expect("memory cap fits in usize"),
        )
        .linear_memory_keep_resident(
            usize::try_from(config.pool_keep_resident_bytes.max(COMPONENT_KEEP_RESIDENT))
                .unwrap_or(usize::MAX),
        )
        .table_keep_resident(COMPONENT_KEEP_RESIDENT as usize)
        .pagemap_scan(wasmtime::Enabled::Auto);
    wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&wasm).map_err(|e| RuntimeError::Engine(format!("{e:#}")))
}

/// One thread for the process's engines that advances their epochs every `tick`.
///
/// Each store sets its deadline in ticks; a guest past its deadline traps with
/// `Trap::Interrupt` at the next loop header or function entry. The thread
/// stops when this value is dropped.
pub struct EpochTicker {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl EpochTicker {
    /// Starts the ticker thread for `engines`.
    pub fn start(engines: Vec<Engine>, tick: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("tensor-wasm-epoch".into())
            .spawn(move || {
                // The epoch follows wall time, not the number of sleeps: a
                // sleep that overshoots (a loaded host) is caught up on the
                // next wake, so deadlines do not drift late.
                let start = Instant::now();
                let mut ticks: u128 = 0;
                while !flag.load(Ordering::Relaxed) {
                    let due = start.elapsed().as_nanos() / tick.as_nanos().max(1);
                    while ticks < due {
                        for engine in &engines {
                            engine.increment_epoch();
                        }
                        ticks += 1;
                    }
                    let next = start + tick * u32::try_from(ticks + 1).unwrap_or(u32::MAX);
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                }
            })
            .expect("spawning the epoch thread");
        EpochTicker {
            stop,
            handle: Some(handle),
        }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// sha256 feeding `Hasher`, so wasmtime's compatibility hash becomes a stable
/// directory name.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// Hex digest naming everything that makes compiled code of `engine` usable:
/// wasmtime version, compiler settings and target.
pub fn engine_fingerprint(engine: &Engine) -> String {
    let mut hasher = Sha256Hasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hex::encode(&hasher.0.finalize()[..16])
}

/// Where a module was loaded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleSource {
    /// Compiled from wasm bytes by Cranelift.
    Compiled,
    /// Loaded from a precompiled artifact written earlier by this server.
    Artifact,
}

impl ModuleSource {
    /// Label value used in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ModuleSource::Compiled => "compiled",
            ModuleSource::Artifact => "artifact",
        }
    }
}

/// Precompiled module artifacts on disk, under
/// `artifacts/<engine fingerprint>/<module sha256>.cwasm`, each with a
/// `.cwasm.sha256` sidecar holding the digest of the artifact bytes.
///
/// An artifact is host-local cache, not durable state: losing it costs one
/// compile. Because loading one is unchecked native code, only files whose
/// digest matches the sidecar this server wrote are loaded. Temporary files of
/// writes a crash interrupted are removed when the cache opens.
///
/// The directory is bounded ([`crate::CacheLimits`]): an index of the artifacts
/// (rebuilt from the directory at open, oldest modification first) evicts the
/// least recently loaded or stored ones past the entry or byte bound and deletes
/// their files; an evicted module is compiled again from the stored binary on
/// its next load.
#[derive(Debug)]
pub struct ArtifactCache {
    dir: PathBuf,
    /// Module sha256 → nothing; sized by the bytes of artifact and sidecar. Files are
    /// deleted under this lock, so the index and the directory change together.
    index: Mutex<BoundedLru<String, ()>>,
    gauges: CacheGauges,
}

impl ArtifactCache {
    /// Opens the cache for `engine` under `data_dir`, evicting down to `bounds`.
    pub(crate) fn open(
        data_dir: &Path,
        engine: &Engine,
        bounds: CacheBounds,
        gauges: CacheGauges,
    ) -> Result<Self> {
        // Artifacts are of instrumented modules: a new instrumentation is a new directory.
        let dir = data_dir.join("artifacts").join(format!(
            "{}-i{}",
            engine_fingerprint(engine),
            crate::instrument::INSTRUMENTATION_VERSION
        ));
        tensor_wasm_durable::create_dir_all(&dir).map_err(|e| {
            let (path, source) = e.into_parts();
            RuntimeError::storage(path, source)
        })?;
        if let Err(e) = tensor_wasm_durable::remove_temp_files(&dir) {
            tracing::warn!(error = %e, "could not remove partial artifact writes");
        }
        let cache = ArtifactCache {
            dir,
            index: Mutex::new(BoundedLru::new(bounds)),
            gauges,
        };
        cache.index_directory()?;
        Ok(cache)
    }

    /// Fills the index from the directory, oldest artifact first, so that the bound
    /// evicts the oldest when the directory holds more than it allows (a lowered bound).
    /// Sidecars without their artifact are removed.
    fn index_directory(&self) -> Result<()> {
        let entries = fs::read_dir(&self.dir).map_err(|e| RuntimeError::storage(&self.dir, e))?;
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(sha) = name.strip_suffix(".cwasm.sha256") {
                if !self.dir.join(format!("{sha}.cwasm")).exists() {
                    let _ = fs::remove_file(entry.path());
                }
                continue;
            }
            let Some(sha) = name.strip_suffix(".cwasm") else {
                continue;
            };
            let Ok(meta) = entry.metadata() else { continue };
            let sidecar = fs::metadata(self.paths(sha).1).map_or(0, |m| m.len());
            let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            found.push((modified, sha.to_owned(), meta.len() + sidecar));
        }
        found.sort();
        let mut index = self.index.lock().expect("lock");
        let mut evicted = 0;
        for (_, sha, bytes) in found {
            evicted += self.insert_locked(&mut index, sha, bytes);
        }
        self.gauges.observe(&index, evicted);
        Ok(())
    }

    /// Inserts into the locked index and deletes the files of what it evicts; returns
    /// how many were evicted.
    fn insert_locked(&self, index: &mut BoundedLru<String, ()>, sha: String, bytes: u64) -> usize {
        let evicted = index.insert(sha, (), bytes);
        for (sha, ()) in &evicted {
            self.delete_files(sha);
        }
        evicted.len()
    }

    fn delete_files(&self, module_sha256: &str) {
        let (artifact, sidecar) = self.paths(module_sha256);
        for path in [artifact, sidecar] {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "could not delete artifact")
                }
            }
        }
    }

    fn paths(&self, module_sha256: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("{module_sha256}.cwasm")),
            self.dir.join(format!("{module_sha256}.cwasm.sha256")),
        )
    }

    /// Loads the artifact of `module_sha256`, or `None` when there is no usable one.
    pub fn load(&self, engine: &Engine, module_sha256: &str) -> Option<Module> {
        self.load_artifact(engine, module_sha256)
    }

    /// Loads the artifact of component `sha256` (compiled by the component engine, kept in
    /// the same directory: a component's digest is never a core module's), or `None`.
    pub(crate) fn load_component(
        &self,
        engine: &Engine,
        sha256: &str,
    ) -> Option<wasmtime::component::Component> {
        self.load_artifact(engine, sha256)
    }

    fn load_artifact<T: Artifact>(&self, engine: &Engine, module_sha256: &str) -> Option<T> {
        let (artifact, sidecar) = self.paths(module_sha256);
        let loaded = (|| {
            let bytes = fs::read(&artifact).ok()?;
            let expected = fs::read_to_string(&sidecar).ok()?;
            if sha256_hex(&bytes) != expected.trim() {
                tracing::warn!(path = %artifact.display(), "artifact digest mismatch; recompiling");
                return None;
            }
            match T::deserialize(engine, &bytes) {
                Ok(module) => Some((module, bytes.len() + expected.len())),
                Err(e) => {
                    tracing::warn!(path = %artifact.display(), error = %e, "artifact rejected; recompiling");
                    None
                }
            }
        })();
        let mut index = self.index.lock().expect("lock");
        let evicted = match &loaded {
            // Marks it recently used; a file the index lost track of (a race with an
            // eviction or a failed deploy's cleanup) is counted again.
            Some((_, bytes)) if index.get(module_sha256).is_none() => {
                self.insert_locked(&mut index, module_sha256.to_owned(), *bytes as u64)
            }
            Some(_) => 0,
            // Unusable: forget it (a later store writes a good one).
            None => {
                if index.remove(module_sha256).is_some() {
                    self.delete_files(module_sha256);
                }
                0
            }
        };
        self.gauges.observe(&index, evicted);
        loaded.map(|(module, _)| module)
    }

    /// Writes the artifact of a freshly compiled module, then its sidecar, each
    /// durably ([`tensor_wasm_durable::write_file`]), and evicts past the bounds.
    /// Failures only cost a recompile later, so they are logged, not returned.
    pub fn store(&self, module_sha256: &str, module: &Module) {
        self.store_artifact(module_sha256, module);
    }

    /// [`ArtifactCache::store`] for a component that compiled and linked.
    pub(crate) fn store_component(&self, sha256: &str, component: &wasmtime::component::Component) {
        self.store_artifact(sha256, component);
    }

    fn store_artifact<T: Artifact>(&self, module_sha256: &str, module: &T) {
        let (artifact, sidecar) = self.paths(module_sha256);
        let result = (|| -> std::result::Result<u64, String> {
            let bytes = module.serialize().map_err(|e| format!("{e:#}"))?;
            let digest = sha256_hex(&bytes);
            let options = tensor_wasm_durable::WriteOptions::new();
            tensor_wasm_durable::write_file(&artifact, &bytes, &options)
                .map_err(|e| e.to_string())?;
            tensor_wasm_durable::write_file(&sidecar, digest.as_bytes(), &options)
                .map_err(|e| e.to_string())?;
            Ok((bytes.len() + digest.len()) as u64)
        })();
        match result {
            Ok(bytes) => {
                let mut index = self.index.lock().expect("lock");
                let evicted = self.insert_locked(&mut index, module_sha256.to_owned(), bytes);
                self.gauges.observe(&index, evicted);
            }
            Err(e) => {
                tracing::warn!(path = %artifact.display(), error = %e, "could not write artifact")
            }
        }
    }

    /// Deletes the artifact of `module_sha256` (a module no function uses).
    pub fn remove(&self, module_sha256: &str) {
        let mut index = self.index.lock().expect("lock");
        index.remove(module_sha256);
        self.delete_files(module_sha256);
        self.gauges.observe(&index, 0);
    }
}

/// Compiled code the cache keeps: core modules and components, turned back from the artifact
/// bytes [`ArtifactCache::store`] wrote.
trait Artifact: Sized {
    fn serialize(&self) -> wasmtime::Result<Vec<u8>>;
    fn deserialize(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Self>;
}

impl Artifact for Module {
    fn serialize(&self) -> wasmtime::Result<Vec<u8>> {
        Module::serialize(self)
    }

    #[allow(unsafe_code)]
    fn deserialize(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Self> {
        // SAFETY: `Module::deserialize` trusts its input to be code produced by
        // `Module::serialize` of a compatible engine. The bytes come from this
        // server's own artifact directory, which is keyed by the engine's
        // compatibility hash, and their sha256 was just checked against the
        // sidecar written together with them; wasmtime additionally rejects
        // artifacts of another version or configuration.
        unsafe { Module::deserialize(engine, bytes) }
    }
}

impl Artifact for wasmtime::component::Component {
    fn serialize(&self) -> wasmtime::Result<Vec<u8>> {
        wasmtime::component::Component::serialize(self)
    }

    #[allow(unsafe_code)]
    fn deserialize(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Self> {
        // SAFETY: as for `Module::deserialize` above: bytes this server wrote with
        // `Component::serialize`, checked against their sidecar digest just now, from a
        // directory keyed by the core engine's compatibility hash; wasmtime rejects a
        // component compiled by an engine of another version or configuration (the
        // component engine's), which then compiles it again.
        unsafe { wasmtime::component::Component::deserialize(engine, bytes) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_cache(dir: &Path, engine: &Engine, bounds: CacheBounds) -> ArtifactCache {
        let metrics = crate::RuntimeMetrics::register(&prometheus::Registry::new()).unwrap();
        ArtifactCache::open(dir, engine, bounds, metrics.artifact_cache).unwrap()
    }

    fn files_in(cache: &ArtifactCache) -> usize {
        fs::read_dir(&cache.dir).unwrap().count()
    }

    #[test]
    fn artifacts_are_bounded_and_evicted_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        let engine = build_engine(&RuntimeConfig::for_tests(dir.path()))
            .unwrap()
            .engine;
        let cache = open_cache(dir.path(), &engine, CacheBounds::entries(2));
        let module = Module::new(&engine, "(module (func (export \"f\")))").unwrap();
        let [a, b, c] = ["aa", "bb", "cc"].map(|s| s.repeat(32));
        cache.store(&a, &module);
        cache.store(&b, &module);
        assert!(
            cache.load(&engine, &a).is_some(),
            "a is now the most recent"
        );
        cache.store(&c, &module);
        assert_eq!(files_in(&cache), 4, "two artifacts with their sidecars");
        assert!(
            cache.load(&engine, &b).is_none(),
            "b was evicted, files and all"
        );
        assert!(cache.load(&engine, &a).is_some() && cache.load(&engine, &c).is_some());
        let bytes = cache.gauges.bytes.get();
        assert!(bytes > 0 && cache.gauges.entries.get() == 2, "{bytes}");
        assert_eq!(cache.gauges.evictions.get(), 1);

        cache.remove(&a);
        assert_eq!(files_in(&cache), 2);
        assert_eq!(cache.gauges.entries.get(), 1);

        // Reopening with a lower bound evicts down to it; a byte bound too small for any
        // artifact keeps none.
        cache.store(&a, &module);
        drop(cache);
        let cache = open_cache(dir.path(), &engine, CacheBounds::entries(1));
        assert_eq!(files_in(&cache), 2);
        drop(cache);
        let tiny = CacheBounds {
            max_entries: 10,
            max_bytes: 16,
        };
        let cache = open_cache(dir.path(), &engine, tiny);
        assert_eq!(files_in(&cache), 0);
        cache.store(&b, &module);
        assert_eq!(
            files_in(&cache),
            0,
            "an artifact above the byte bound is not kept"
        );
    }

    #[test]
    fn artifacts_round_trip_and_tampering_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let engine = build_engine(&RuntimeConfig::for_tests(dir.path()))
            .unwrap()
            .engine;
        let cache = open_cache(dir.path(), &engine, CacheBounds::entries(8));
        let module = Module::new(
            &engine,
            "(module (func (export \"f\") (result i32) i32.const 7))",
        )
        .unwrap();
        let sha = "ab".repeat(32);
        assert!(cache.load(&engine, &sha).is_none());
        cache.store(&sha, &module);
        let loaded = cache.load(&engine, &sha).expect("artifact loads");
        assert!(loaded.get_export("f").is_some());

        let (artifact, _) = cache.paths(&sha);
        let mut bytes = fs::read(&artifact).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&artifact, bytes).unwrap();
        assert!(cache.load(&engine, &sha).is_none());
    }

    #[test]
    fn the_engine_refuses_more_than_one_memory_in_both_guest_memory_modes() {
        for guest_memory in [GuestMemory::Pooled, GuestMemory::Unified] {
            let dir = tempfile::tempdir().unwrap();
            let config = RuntimeConfig {
                guest_memory,
                ..RuntimeConfig::for_tests(dir.path())
            };
            let engine = build_engine(&config).unwrap().engine;
            Module::new(&engine, "(module (memory 1))").expect("one memory compiles");
            let err = Module::new(&engine, "(module (memory 1) (memory 1))").unwrap_err();
            assert!(format!("{err:#}").contains("multiple memories"), "{err:#}");
        }
    }

    #[test]
    fn fingerprint_is_stable_for_one_engine_config() {
        let dir = tempfile::tempdir().unwrap();
        let config = RuntimeConfig::for_tests(dir.path());
        let a = engine_fingerprint(&build_engine(&config).unwrap().engine);
        let b = engine_fingerprint(&build_engine(&config).unwrap().engine);
        assert_eq!(a, b);
        assert_eq!(a.len(), 32);
    }
}
