//! The export queue: finished spans wait here for a thread of their own
//! that sends them in batches. Ending a span never waits for the collector:
//! it takes a lock held only to push or to take a batch, and when the queue
//! is full the span is dropped and counted. A collector that is down or slow
//! delays only that thread (each request has the exporter's timeout,
//! `OTEL_EXPORTER_OTLP_TIMEOUT`), and spans it could not take are counted.
//!
//! The SDK's own batch processor does the same but reports its drops only in
//! its internal log; this one counts them as metrics an operator can alert on.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

/// The counters of the export queue.
#[derive(Clone, Debug)]
pub struct ExportStats {
    /// Spans sent and acknowledged by the collector.
    pub exported: IntCounter,
    /// Spans lost, by reason: `queue_full` (the collector could not keep up)
    /// and `export_failed` (the collector refused or did not answer).
    pub dropped: IntCounterVec,
}

impl ExportStats {
    pub(crate) fn new() -> Self {
        ExportStats {
            exported: IntCounter::new(
                "tensor_wasm_otel_spans_exported_total",
                "Spans sent to the OTLP collector and acknowledged",
            )
            .expect("a valid metric"),
            dropped: IntCounterVec::new(
                Opts::new(
                    "tensor_wasm_otel_spans_dropped_total",
                    "Spans lost before the collector had them, by reason",
                ),
                &["reason"],
            )
            .expect("a valid metric"),
        }
    }

    /// Registers the counters in `registry`.
    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.exported.clone()))?;
        registry.register(Box::new(self.dropped.clone()))?;
        // Both series exist from the start, so an alert sees a 0 before the first loss.
        self.dropped.with_label_values(&["queue_full"]);
        self.dropped.with_label_values(&["export_failed"]);
        Ok(())
    }
}

/// What the export thread waits on.
#[derive(Default)]
struct Queue {
    spans: VecDeque<SpanData>,
    /// Flushes asked for: the thread sends everything queued, then counts one up.
    flush_asked: u64,
    flushed: u64,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// The export thread waits here for work; flushers wait here for it.
    wake: Condvar,
    done: Condvar,
    max_queue: usize,
    max_batch: usize,
    stats: ExportStats,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The span processor of the server: see the module documentation.
pub(crate) struct QueueProcessor {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for QueueProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueProcessor")
            .field("max_queue", &self.shared.max_queue)
            .finish()
    }
}

impl QueueProcessor {
    /// Starts the export thread. `exporter` is built on that thread (an HTTP
    /// client that blocks must not be made or dropped on an async runtime's
    /// thread); its error, if any, is returned here.
    pub(crate) fn start<E, B>(
        build: B,
        resource: Resource,
        max_queue: usize,
        max_batch: usize,
        delay: Duration,
        stats: ExportStats,
    ) -> Result<Self, String>
    where
        E: SpanExporter + 'static,
        B: FnOnce() -> Result<E, String> + Send + 'static,
    {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            done: Condvar::new(),
            max_queue,
            max_batch,
            stats,
        });
        let (built_tx, built_rx) = std::sync::mpsc::sync_channel(1);
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                let mut exporter = match build() {
                    Ok(e) => {
                        let _ = built_tx.send(Ok(()));
                        e
                    }
                    Err(e) => {
                        let _ = built_tx.send(Err(e));
                        return;
                    }
                };
                exporter.set_resource(&resource);
                run(&thread_shared, &exporter, delay);
                let _ = exporter.shutdown();
            })
            .map_err(|e| format!("starting the span export thread: {e}"))?;
        built_rx
            .recv()
            .map_err(|_| "the span export thread ended while starting".to_string())??;
        Ok(QueueProcessor {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }
}

/// The export thread: a batch when one is full, when the oldest span has
/// waited `delay`, on a flush and at shutdown.
fn run<E: SpanExporter>(shared: &Shared, exporter: &E, delay: Duration) {
    let mut oldest: Option<Instant> = None;
    loop {
        let (batch, flush_mark, last) = {
            let mut q = shared.lock();
            loop {
                if q.shutdown || q.flush_asked > q.flushed || q.spans.len() >= shared.max_batch {
                    break;
                }
                if !q.spans.is_empty() {
                    let since = *oldest.get_or_insert_with(Instant::now);
                    let left = delay.saturating_sub(since.elapsed());
                    if left.is_zero() {
                        break;
                    }
                    q = shared
                        .wake
                        .wait_timeout(q, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                } else {
                    oldest = None;
                    q = shared.wake.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
            }
            let take = q.spans.len().min(shared.max_batch);
            let batch: Vec<SpanData> = q.spans.drain(..take).collect();
            // A flush (or shutdown) is done when what was queued before it is sent.
            let draining = q.shutdown || q.flush_asked > q.flushed;
            let mark = (draining && q.spans.is_empty()).then_some(q.flush_asked);
            (batch, mark, q.shutdown && q.spans.is_empty())
        };
        oldest = None;
        if !batch.is_empty() {
            let n = batch.len() as u64;
            match futures_executor::block_on(exporter.export(batch)) {
                Ok(()) => shared.stats.exported.inc_by(n),
                Err(_) => shared
                    .stats
                    .dropped
                    .with_label_values(&["export_failed"])
                    .inc_by(n),
            }
        }
        if let Some(mark) = flush_mark {
            shared.lock().flushed = mark;
            shared.done.notify_all();
        }
        if last {
            return;
        }
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let mut q = self.shared.lock();
        if q.shutdown || q.spans.len() >= self.shared.max_queue {
            drop(q);
            self.shared
                .stats
                .dropped
                .with_label_values(&["queue_full"])
                .inc();
            return;
        }
        q.spans.push_back(span);
        let full = q.spans.len() >= self.shared.max_batch;
        let first = q.spans.len() == 1;
        drop(q);
        // The thread sleeps until a batch is full, or (with nothing queued)
        // until the first span starts the delay.
        if full || first {
            self.shared.wake.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        let mut q = self.shared.lock();
        if q.shutdown {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        q.flush_asked += 1;
        let mark = q.flush_asked;
        self.shared.wake.notify_one();
        let deadline = Instant::now() + Duration::from_secs(30);
        while q.flushed < mark {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(OTelSdkError::Timeout(Duration::from_secs(30)));
            }
            q = self
                .shared
                .done
                .wait_timeout(q, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        Ok(())
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        {
            let mut q = self.shared.lock();
            if q.shutdown {
                return Err(OTelSdkError::AlreadyShutdown);
            }
            q.shutdown = true;
        }
        self.shared.wake.notify_one();
        let Some(thread) = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return Ok(());
        };
        // Waits for the last batches at most `timeout`; past it the thread is
        // left to finish (or not) on its own.
        let deadline = Instant::now() + timeout;
        while !thread.is_finished() {
            if Instant::now() >= deadline {
                return Err(OTelSdkError::Timeout(timeout));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = thread.join();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An exporter that counts what it is given and can be made to hang.
    #[derive(Debug, Clone, Default)]
    struct Counting {
        got: Arc<AtomicUsize>,
        stall: Arc<Mutex<()>>,
    }

    impl SpanExporter for Counting {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let _wait = self.stall.lock().unwrap();
            self.got.fetch_add(batch.len(), Ordering::SeqCst);
            Ok(())
        }
    }

    fn provider(exporter: Counting, queue: usize) -> (SdkTracerProvider, ExportStats) {
        let stats = ExportStats::new();
        let processor = QueueProcessor::start(
            move || Ok(exporter),
            Resource::builder_empty().build(),
            queue,
            4,
            Duration::from_millis(20),
            stats.clone(),
        )
        .unwrap();
        (
            SdkTracerProvider::builder()
                .with_span_processor(processor)
                .build(),
            stats,
        )
    }

    #[test]
    fn spans_are_sent_in_batches_and_on_flush() {
        let exporter = Counting::default();
        let (provider, stats) = provider(exporter.clone(), 64);
        let tracer = provider.tracer("t");
        for _ in 0..10 {
            tracer.start("s").end();
        }
        provider.force_flush().unwrap();
        assert_eq!(exporter.got.load(Ordering::SeqCst), 10);
        assert_eq!(stats.exported.get(), 10);
        tracer.start("late").end();
        // The delay sends a lone span without a flush.
        let until = Instant::now() + Duration::from_secs(5);
        while exporter.got.load(Ordering::SeqCst) < 11 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(exporter.got.load(Ordering::SeqCst), 11);
        provider.shutdown().unwrap();
    }

    #[test]
    fn a_stuck_collector_drops_and_counts_without_waiting() {
        let exporter = Counting::default();
        let stall = exporter.stall.lock().unwrap();
        let (provider, stats) = provider(exporter.clone(), 8);
        let tracer = provider.tracer("t");
        let start = Instant::now();
        for _ in 0..1000 {
            tracer.start("s").end();
        }
        // A thousand spans end while the collector answers nothing: none waits for it.
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        let dropped = stats.dropped.with_label_values(&["queue_full"]).get();
        // At most one batch is in the exporter's hands and `8` queued.
        assert!(dropped >= 1000 - 8 - 4, "{dropped}");
        drop(stall);
        provider.force_flush().unwrap();
        assert_eq!(
            exporter.got.load(Ordering::SeqCst) as u64 + dropped,
            1000,
            "every span is either sent or counted"
        );
        provider.shutdown().unwrap();
    }
}
