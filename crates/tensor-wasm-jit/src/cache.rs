//! `KernelCache`: compiled kernels by fingerprint, bounded in memory (LRU by
//! entries and bytes), persisted on disk, compiled once under concurrency.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock};
use std::time::Instant;

use prometheus::{exponential_buckets, Histogram, HistogramOpts, IntCounter, IntGauge, Registry};
use sha2::{Digest, Sha256};

/// What identifies one compiled kernel: the kernel's fingerprint (blueprint,
/// or source + options), the target architecture and the driver version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub fingerprint: [u8; 16],
    /// Compute capability the code was built for; `(0, 0)` for target-independent PTX.
    pub arch: (u32, u32),
    /// CUDA driver version the code was built for; 0 when no device is known.
    pub driver_version: i32,
}

impl CacheKey {
    /// File-name form: `<fingerprint hex>-sm<major><minor>-drv<version>`.
    pub fn file_stem(&self) -> String {
        format!(
            "{}-sm{}{}-drv{}",
            hex::encode(self.fingerprint),
            self.arch.0,
            self.arch.1,
            self.driver_version
        )
    }
}

/// A compiled kernel: PTX text, its entry point, and on CUDA hosts the cubin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledKernel {
    pub ptx: Arc<str>,
    pub entry: Arc<str>,
    pub cubin: Option<Arc<[u8]>>,
}

impl CompiledKernel {
    /// Bytes this entry accounts for in the cache.
    pub fn size_bytes(&self) -> usize {
        self.ptx.len() + self.entry.len() + self.cubin.as_ref().map_or(0, |c| c.len())
    }
}

/// Bounds and location of a [`KernelCache`].
#[derive(Debug, Clone)]
pub struct KernelCacheConfig {
    /// Most entries held in memory.
    pub max_entries: usize,
    /// Most bytes (PTX + cubin) held in memory.
    pub max_bytes: usize,
    /// Directory of the on-disk cache; `None` keeps the cache in memory only.
    pub dir: Option<PathBuf>,
}

impl Default for KernelCacheConfig {
    fn default() -> Self {
        KernelCacheConfig {
            max_entries: 1024,
            max_bytes: 256 << 20,
            dir: None,
        }
    }
}

/// Prometheus handles of a cache.
#[derive(Debug, Clone)]
pub struct KernelCacheMetrics {
    pub hits: IntCounter,
    pub misses: IntCounter,
    pub evictions: IntCounter,
    pub disk_loads: IntCounter,
    pub entries: IntGauge,
    pub compile_seconds: Histogram,
}

impl KernelCacheMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self::unregistered()?;
        registry.register(Box::new(m.hits.clone()))?;
        registry.register(Box::new(m.misses.clone()))?;
        registry.register(Box::new(m.evictions.clone()))?;
        registry.register(Box::new(m.disk_loads.clone()))?;
        registry.register(Box::new(m.entries.clone()))?;
        registry.register(Box::new(m.compile_seconds.clone()))?;
        Ok(m)
    }

    /// Metrics not registered anywhere (tests, benches).
    pub fn unregistered() -> prometheus::Result<Self> {
        Ok(KernelCacheMetrics {
            hits: IntCounter::new(
                "tensor_wasm_kernel_cache_hits_total",
                "Kernel cache hits in memory.",
            )?,
            misses: IntCounter::new(
                "tensor_wasm_kernel_cache_misses_total",
                "Kernel cache misses in memory (then disk or compile).",
            )?,
            evictions: IntCounter::new(
                "tensor_wasm_kernel_cache_evictions_total",
                "Kernels evicted from memory by the entry or byte bound.",
            )?,
            disk_loads: IntCounter::new(
                "tensor_wasm_kernel_cache_disk_loads_total",
                "Misses served from the on-disk cache without compiling.",
            )?,
            entries: IntGauge::new(
                "tensor_wasm_kernel_cache_entries",
                "Kernels held in memory.",
            )?,
            compile_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "tensor_wasm_kernel_compile_duration_seconds",
                    "Time to compile one kernel on a cache miss.",
                )
                .buckets(exponential_buckets(1e-6, 2.0, 28)?),
            )?,
        })
    }
}

struct Entry {
    value: Arc<CompiledKernel>,
    last_used: AtomicU64,
}

/// One compilation in progress, awaited by everyone asking for the same key.
struct Flight {
    done: Mutex<Option<Result<Arc<CompiledKernel>, String>>>,
    ready: Condvar,
}

/// Compiled kernels by [`CacheKey`].
///
/// - Hits take a read lock and bump an atomic recency stamp: no writer
///   contention on the hot path.
/// - Misses are single-flight: concurrent requests for the same missing key
///   wait for one compilation and share its result.
/// - Memory is bounded by entries and bytes; the least recently used entries
///   are evicted first.
/// - With a directory, every compiled kernel is written there (atomically and
///   durably, through [`tensor_wasm_durable`]: one `fsync` per file) and
///   a miss in memory looks on disk before compiling, so a restart does not
///   recompile. Files are named by [`CacheKey::file_stem`]: `.ptx`, `.cubin`
///   and, written last, a `.manifest` with the entry point and the sha256 of
///   each of the others. A file that fails its checksum (a damaged disk, a torn
///   copy) is never loaded: the kernel is compiled again and the files rewritten.
pub struct KernelCache {
    config: KernelCacheConfig,
    entries: RwLock<HashMap<CacheKey, Entry>>,
    bytes: AtomicU64,
    clock: AtomicU64,
    flights: Mutex<HashMap<CacheKey, Arc<Flight>>>,
    metrics: KernelCacheMetrics,
}

impl fmt::Debug for KernelCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelCache")
            .field("config", &self.config)
            .field("entries", &self.len())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl KernelCache {
    /// A cache with `config`, reporting to `metrics`. Creates the directory and
    /// removes the temporary files of writes a crash interrupted.
    pub fn new(config: KernelCacheConfig, metrics: KernelCacheMetrics) -> std::io::Result<Self> {
        if let Some(dir) = &config.dir {
            tensor_wasm_durable::create_dir_all(dir)?;
            if let Err(e) = tensor_wasm_durable::remove_temp_files(dir) {
                tracing::warn!(error = %e, "could not remove partial kernel cache writes");
            }
        }
        Ok(KernelCache {
            config,
            entries: RwLock::new(HashMap::new()),
            bytes: AtomicU64::new(0),
            clock: AtomicU64::new(0),
            flights: Mutex::new(HashMap::new()),
            metrics,
        })
    }

    /// Kernels held in memory.
    pub fn len(&self) -> usize {
        self.entries
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no kernel is held in memory.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held in memory.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The cache's metrics.
    pub fn metrics(&self) -> &KernelCacheMetrics {
        &self.metrics
    }

    /// The kernel for `key` if it is in memory (counts a hit or a miss).
    pub fn get(&self, key: &CacheKey) -> Option<Arc<CompiledKernel>> {
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        match entries.get(key) {
            Some(entry) => {
                entry.last_used.store(
                    self.clock.fetch_add(1, Ordering::Relaxed),
                    Ordering::Relaxed,
                );
                self.metrics.hits.inc();
                Some(entry.value.clone())
            }
            None => {
                self.metrics.misses.inc();
                None
            }
        }
    }

    /// The kernel for `key`: from memory, from disk, or compiled by `compile`
    /// (once, however many threads ask at the same time). A compile error is
    /// returned to every waiter and not cached.
    pub fn get_or_compile(
        &self,
        key: &CacheKey,
        compile: impl FnOnce() -> Result<CompiledKernel, String>,
    ) -> Result<Arc<CompiledKernel>, String> {
        if let Some(hit) = self.get(key) {
            return Ok(hit);
        }
        let (flight, leader) = {
            let mut flights = lock(&self.flights);
            match flights.get(key) {
                Some(f) => (f.clone(), false),
                None => {
                    let f = Arc::new(Flight {
                        done: Mutex::new(None),
                        ready: Condvar::new(),
                    });
                    flights.insert(*key, f.clone());
                    (f, true)
                }
            }
        };
        if !leader {
            let mut done = lock(&flight.done);
            while done.is_none() {
                done = flight
                    .ready
                    .wait(done)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            return done.clone().expect("set before notify");
        }
        // The leader: another leader may have finished just before we registered.
        let result = match self.peek(key) {
            Some(v) => Ok(v),
            None => self.load_or_compile(key, compile),
        };
        *lock(&flight.done) = Some(result.clone());
        flight.ready.notify_all();
        lock(&self.flights).remove(key);
        result
    }

    /// Memory lookup without counting.
    fn peek(&self, key: &CacheKey) -> Option<Arc<CompiledKernel>> {
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        entries.get(key).map(|e| e.value.clone())
    }

    fn load_or_compile(
        &self,
        key: &CacheKey,
        compile: impl FnOnce() -> Result<CompiledKernel, String>,
    ) -> Result<Arc<CompiledKernel>, String> {
        if let Some(value) = self.read_disk(key) {
            self.metrics.disk_loads.inc();
            return Ok(self.insert(*key, value));
        }
        let start = Instant::now();
        let value = compile()?;
        self.metrics
            .compile_seconds
            .observe(start.elapsed().as_secs_f64());
        self.write_disk(key, &value);
        Ok(self.insert(*key, value))
    }

    /// Puts `value` in memory (evicting as needed) and returns it shared.
    pub fn insert(&self, key: CacheKey, value: CompiledKernel) -> Arc<CompiledKernel> {
        let value = Arc::new(value);
        let size = value.size_bytes() as u64;
        let mut entries = self.entries.write().unwrap_or_else(PoisonError::into_inner);
        let stamp = self.clock.fetch_add(1, Ordering::Relaxed);
        if let Some(old) = entries.insert(
            key,
            Entry {
                value: value.clone(),
                last_used: AtomicU64::new(stamp),
            },
        ) {
            self.bytes
                .fetch_sub(old.value.size_bytes() as u64, Ordering::Relaxed);
        }
        self.bytes.fetch_add(size, Ordering::Relaxed);
        while entries.len() > self.config.max_entries.max(1)
            || (self.bytes.load(Ordering::Relaxed) > self.config.max_bytes as u64
                && entries.len() > 1)
        {
            let oldest = entries
                .iter()
                .filter(|(k, _)| **k != key)
                .min_by_key(|(_, e)| e.last_used.load(Ordering::Relaxed))
                .map(|(k, _)| *k);
            let Some(oldest) = oldest else { break };
            if let Some(evicted) = entries.remove(&oldest) {
                self.bytes
                    .fetch_sub(evicted.value.size_bytes() as u64, Ordering::Relaxed);
                self.metrics.evictions.inc();
            }
        }
        self.metrics.entries.set(entries.len() as i64);
        value
    }

    fn paths(&self, key: &CacheKey) -> Option<(PathBuf, PathBuf, PathBuf)> {
        let dir = self.config.dir.as_ref()?;
        let stem = key.file_stem();
        Some((
            dir.join(format!("{stem}.ptx")),
            dir.join(format!("{stem}.manifest")),
            dir.join(format!("{stem}.cubin")),
        ))
    }

    /// The kernel stored for `key`, if every file is there and matches its checksum.
    fn read_disk(&self, key: &CacheKey) -> Option<CompiledKernel> {
        let (ptx_path, manifest_path, cubin_path) = self.paths(key)?;
        let manifest = Manifest::parse(&fs::read_to_string(manifest_path).ok()?);
        let damaged = || {
            tracing::warn!(
                key = %key.file_stem(),
                "a kernel cache file fails its checksum; compiling the kernel again"
            );
        };
        let Some(manifest) = manifest else {
            damaged();
            return None;
        };
        let ptx = fs::read(ptx_path).ok()?;
        if sha256_hex(&ptx) != manifest.ptx_sha256 {
            damaged();
            return None;
        }
        let Ok(ptx) = String::from_utf8(ptx) else {
            damaged();
            return None;
        };
        let cubin = match &manifest.cubin_sha256 {
            None => None,
            Some(expected) => {
                let bytes = fs::read(cubin_path).ok()?;
                if sha256_hex(&bytes) != *expected {
                    damaged();
                    return None;
                }
                Some(Arc::<[u8]>::from(bytes))
            }
        };
        Some(CompiledKernel {
            ptx: ptx.into(),
            entry: manifest.entry.into(),
            cubin,
        })
    }

    fn write_disk(&self, key: &CacheKey, value: &CompiledKernel) {
        let Some((ptx, manifest, cubin)) = self.paths(key) else {
            return;
        };
        let mut result = write_atomic(&ptx, value.ptx.as_bytes());
        if let Some(bytes) = &value.cubin {
            result = result.and_then(|()| write_atomic(&cubin, bytes));
        }
        // The manifest goes last: its presence marks a complete set.
        let text = Manifest::of(value).render();
        result = result.and_then(|()| write_atomic(&manifest, text.as_bytes()));
        if let Err(e) = result {
            tracing::warn!(key = %key.file_stem(), error = %e, "could not write the kernel cache");
        }
    }
}

/// What `<stem>.manifest` records: the entry point and the checksums of the other files.
///
/// ```text
/// entry <name>
/// ptx <sha256 hex>
/// cubin <sha256 hex>      (absent when there is no cubin)
/// ```
#[derive(Debug, PartialEq, Eq)]
struct Manifest {
    entry: String,
    ptx_sha256: String,
    cubin_sha256: Option<String>,
}

impl Manifest {
    fn of(kernel: &CompiledKernel) -> Self {
        Manifest {
            entry: kernel.entry.to_string(),
            ptx_sha256: sha256_hex(kernel.ptx.as_bytes()),
            cubin_sha256: kernel.cubin.as_deref().map(sha256_hex),
        }
    }

    fn render(&self) -> String {
        let mut text = format!("entry {}\nptx {}\n", self.entry, self.ptx_sha256);
        if let Some(cubin) = &self.cubin_sha256 {
            text.push_str(&format!("cubin {cubin}\n"));
        }
        text
    }

    /// `None` for anything [`Manifest::render`] cannot have written.
    fn parse(text: &str) -> Option<Self> {
        let (mut entry, mut ptx, mut cubin) = (None, None, None);
        for line in text.lines() {
            let (field, value) = line.split_once(' ')?;
            let slot = match field {
                "entry" => &mut entry,
                "ptx" => &mut ptx,
                "cubin" => &mut cubin,
                _ => return None,
            };
            if slot.replace(value.to_owned()).is_some() {
                return None;
            }
        }
        let entry = entry.filter(|e: &String| !e.is_empty())?;
        let is_digest = |d: &String| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit());
        let ptx_sha256 = ptx.filter(is_digest)?;
        if cubin.as_ref().is_some_and(|c| !is_digest(c)) {
            return None;
        }
        Some(Manifest {
            entry,
            ptx_sha256,
            cubin_sha256: cubin,
        })
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), tensor_wasm_durable::DurableError> {
    tensor_wasm_durable::write_file(path, bytes, &tensor_wasm_durable::WriteOptions::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Barrier;
    use std::time::Duration;

    fn key(n: u8) -> CacheKey {
        CacheKey {
            fingerprint: [n; 16],
            arch: (9, 0),
            driver_version: 13000,
        }
    }

    fn kernel(n: u8, size: usize) -> CompiledKernel {
        let entry = format!("k{n}");
        CompiledKernel {
            ptx: format!(".visible .entry {entry}() {{}}{}", " ".repeat(size)).into(),
            entry: entry.into(),
            cubin: None,
        }
    }

    fn cache(max_entries: usize, max_bytes: usize, dir: Option<PathBuf>) -> KernelCache {
        KernelCache::new(
            KernelCacheConfig {
                max_entries,
                max_bytes,
                dir,
            },
            KernelCacheMetrics::unregistered().unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn hits_misses_and_lru_eviction_by_entries() {
        let c = cache(2, usize::MAX, None);
        assert!(c.get(&key(1)).is_none());
        c.get_or_compile(&key(1), || Ok(kernel(1, 0))).unwrap();
        c.get_or_compile(&key(2), || Ok(kernel(2, 0))).unwrap();
        assert!(c.get(&key(1)).is_some()); // 1 is now more recent than 2
        c.get_or_compile(&key(3), || Ok(kernel(3, 0))).unwrap();
        assert_eq!(c.len(), 2);
        assert!(c.get(&key(2)).is_none(), "least recently used is evicted");
        assert!(c.get(&key(1)).is_some());
        let m = c.metrics();
        assert_eq!(m.evictions.get(), 1);
        assert_eq!(m.hits.get(), 2);
        assert_eq!(m.misses.get(), 5); // 1 (get) + 3 (get_or_compile) + 1 (get of 2)
        assert_eq!(m.compile_seconds.get_sample_count(), 3);
    }

    #[test]
    fn byte_bound_evicts() {
        let c = cache(100, 3000, None);
        for n in 0..5 {
            c.get_or_compile(&key(n), || Ok(kernel(n, 1000))).unwrap();
        }
        assert!(c.bytes() <= 3000, "{}", c.bytes());
        assert_eq!(c.len(), 2);
        assert_eq!(c.metrics().evictions.get(), 3);
    }

    #[test]
    fn concurrent_misses_compile_once() {
        let c = Arc::new(cache(16, usize::MAX, None));
        let compiles = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(32));
        let handles: Vec<_> = (0..32)
            .map(|_| {
                let (c, compiles, barrier) = (c.clone(), compiles.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    c.get_or_compile(&key(7), || {
                        compiles.fetch_add(1, Ordering::SeqCst);
                        // A slow compile, not synchronisation: it widens the
                        // window in which the other threads miss too.
                        std::thread::sleep(Duration::from_millis(50));
                        Ok(kernel(7, 0))
                    })
                    .unwrap()
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(compiles.load(Ordering::SeqCst), 1);
        assert!(results.iter().all(|r| Arc::ptr_eq(r, &results[0])));
    }

    #[test]
    fn compile_errors_reach_every_waiter_and_are_not_cached() {
        let c = cache(16, usize::MAX, None);
        let err = c.get_or_compile(&key(1), || Err("syntax error".into()));
        assert_eq!(err.unwrap_err(), "syntax error");
        assert!(c.is_empty());
        assert!(c.get_or_compile(&key(1), || Ok(kernel(1, 0))).is_ok());
    }

    #[test]
    fn restart_reuses_the_disk_cache() {
        let dir = tempfile::tempdir().unwrap();
        let first = cache(16, usize::MAX, Some(dir.path().to_owned()));
        let mut k = kernel(5, 10);
        k.cubin = Some(Arc::from(&b"\x7fELF-cubin"[..]));
        first.get_or_compile(&key(5), || Ok(k.clone())).unwrap();
        drop(first);

        let second = cache(16, usize::MAX, Some(dir.path().to_owned()));
        let loaded = second
            .get_or_compile(&key(5), || panic!("must not recompile after a restart"))
            .unwrap();
        assert_eq!(*loaded, k);
        assert_eq!(second.metrics().disk_loads.get(), 1);
        assert_eq!(second.metrics().compile_seconds.get_sample_count(), 0);

        // Another architecture or driver is another key.
        let other = CacheKey {
            driver_version: 12080,
            ..key(5)
        };
        let mut compiled = false;
        second
            .get_or_compile(&other, || {
                compiled = true;
                Ok(kernel(5, 0))
            })
            .unwrap();
        assert!(compiled);
    }

    #[test]
    fn disk_writes_leave_no_temp_files_and_leftovers_are_removed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(16, usize::MAX, Some(dir.path().to_owned()));
        let mut k = kernel(4, 0);
        k.cubin = Some(Arc::from(&b"cubin"[..]));
        c.get_or_compile(&key(4), || Ok(k)).unwrap();
        let stem = key(4).file_stem();
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                format!("{stem}.cubin"),
                format!("{stem}.manifest"),
                format!("{stem}.ptx")
            ]
        );

        // What a crash between create and rename leaves behind.
        let leftover = dir.path().join(format!(".{stem}.ptx.4242-0.partial"));
        fs::write(&leftover, b".visible .entry half").unwrap();
        let _reopened = cache(16, usize::MAX, Some(dir.path().to_owned()));
        assert!(!leftover.exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 3);
    }

    /// Hardening item 11: damage that the old `.entry` check let through (a cubin, or PTX
    /// that still names its entry point) fails the manifest's checksum; the kernel is
    /// compiled again and the rewritten files load after the next restart.
    #[test]
    fn damaged_files_fail_their_checksum_and_are_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let stem = key(6).file_stem();
        let mut k = kernel(6, 4);
        k.cubin = Some(Arc::from(&b"\x7fELF-cubin-bytes"[..]));
        let damages: [(&str, &[u8]); 2] = [
            ("cubin", b"\x7fELF-cubin-bytez"),
            ("ptx", b".visible .entry k6() { st.global.u32 [0], 1; }"),
        ];
        cache(16, usize::MAX, Some(dir.path().to_owned()))
            .get_or_compile(&key(6), || Ok(k.clone()))
            .unwrap();
        for (file, damaged) in damages {
            fs::write(dir.path().join(format!("{stem}.{file}")), damaged).unwrap();
            let c = cache(16, usize::MAX, Some(dir.path().to_owned()));
            let mut compiled = false;
            let loaded = c
                .get_or_compile(&key(6), || {
                    compiled = true;
                    Ok(k.clone())
                })
                .unwrap();
            assert!(compiled, "a damaged .{file} was loaded");
            assert_eq!(*loaded, k);

            let c = cache(16, usize::MAX, Some(dir.path().to_owned()));
            let reloaded = c
                .get_or_compile(&key(6), || panic!("the rebuilt files must load"))
                .unwrap();
            assert_eq!(*reloaded, k);
        }
    }

    #[test]
    fn manifests_round_trip_and_refuse_what_was_not_written() {
        let mut k = kernel(1, 0);
        let plain = Manifest::of(&k);
        assert_eq!(Manifest::parse(&plain.render()), Some(plain));
        k.cubin = Some(Arc::from(&b"c"[..]));
        let with_cubin = Manifest::of(&k);
        assert_eq!(Manifest::parse(&with_cubin.render()), Some(with_cubin));
        for bad in ["", "entry k1\n", "entry k1\nptx 00\n", "k1"] {
            assert_eq!(Manifest::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn corrupt_disk_entries_are_recompiled() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(16, usize::MAX, Some(dir.path().to_owned()));
        c.get_or_compile(&key(9), || Ok(kernel(9, 0))).unwrap();
        fs::write(
            dir.path().join(format!("{}.ptx", key(9).file_stem())),
            "garbage",
        )
        .unwrap();
        let c = cache(16, usize::MAX, Some(dir.path().to_owned()));
        let mut compiled = false;
        c.get_or_compile(&key(9), || {
            compiled = true;
            Ok(kernel(9, 0))
        })
        .unwrap();
        assert!(compiled);
    }
}
