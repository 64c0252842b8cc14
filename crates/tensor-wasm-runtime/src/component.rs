//! WebAssembly components (WASI 0.2): recognised at deploy, validated and classified by what
//! they export. HTTP handlers (`wasi:http/incoming-handler`), commands (`wasi:cli/run`) and
//! components with typed exports are deployed and run on wasmtime's WASI 0.2 and `wasi:http`
//! hosts (`ComponentHost`) with the limits of a core module's function; outgoing HTTP reaches
//! the operator's allow-list only, and every call ends at its deadline (`run_until`). A
//! component exporting none of these is refused with an error that says what was found
//! (docs/components.md).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use wasmparser::{ComponentExternalKind, Parser, Payload, Validator, WasmFeatures};
use wasmtime::component::{Component, InstancePre, Linker, ResourceTable};
use wasmtime::{Engine, ResourceLimiter};
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::component_charge::MemoryBudget;
use crate::error::{truncate_message, RuntimeError};
use crate::outgoing_http::{Origin, OutgoingHttp};

/// How a component would be invoked, from its exports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentStyle {
    /// Exports `wasi:http/incoming-handler`: an HTTP handler.
    HttpHandler,
    /// Exports `wasi:cli/run`: a command (stdin in, stdout out).
    Command,
    /// Exports functions of its own (typed exports), by name.
    TypedExports(Vec<String>),
    /// Exports nothing invocable.
    Nothing,
}

impl ComponentStyle {
    fn describe(&self) -> String {
        match self {
            ComponentStyle::HttpHandler => {
                "an HTTP handler (it exports wasi:http/incoming-handler)".into()
            }
            ComponentStyle::Command => "a WASI 0.2 command (it exports wasi:cli/run)".into(),
            ComponentStyle::TypedExports(names) => {
                format!("a component with typed exports ({})", names.join(", "))
            }
            ComponentStyle::Nothing => "a component that exports nothing to invoke".into(),
        }
    }
}

/// Whether `binary` is a component rather than a core module.
pub(crate) fn is_component(binary: &[u8]) -> bool {
    Parser::is_component(binary)
}

/// Validates component `binary` and classifies it by its top-level exports.
///
/// # Errors
/// [`RuntimeError::InvalidModule`] when it is not a valid component.
pub fn classify(binary: &[u8]) -> Result<ComponentStyle, RuntimeError> {
    Validator::new_with_features(WasmFeatures::all())
        .validate_all(binary)
        .map_err(|e| RuntimeError::InvalidModule(format!("invalid component: {e}")))?;
    let mut depth = 0usize;
    let (mut http, mut command, mut funcs) = (false, false, Vec::new());
    for payload in Parser::new(0).parse_all(binary) {
        let payload =
            payload.map_err(|e| RuntimeError::InvalidModule(format!("invalid component: {e}")))?;
        match payload {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentExportSection(exports) if depth == 0 => {
                for export in exports {
                    let export = export.map_err(|e| {
                        RuntimeError::InvalidModule(format!("invalid component: {e}"))
                    })?;
                    let name = export.name.name;
                    match export.kind {
                        ComponentExternalKind::Instance
                            if interface_of(name) == "wasi:http/incoming-handler" =>
                        {
                            http = true;
                        }
                        ComponentExternalKind::Instance if interface_of(name) == "wasi:cli/run" => {
                            command = true;
                        }
                        ComponentExternalKind::Func => funcs.push(name.to_owned()),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(if http {
        ComponentStyle::HttpHandler
    } else if command {
        ComponentStyle::Command
    } else if !funcs.is_empty() {
        ComponentStyle::TypedExports(funcs)
    } else {
        ComponentStyle::Nothing
    })
}

/// `wasi:cli/run` of `wasi:cli/run@0.2.3`: the interface without its version.
fn interface_of(name: &str) -> &str {
    name.split_once('@')
        .map_or(name, |(interface, _)| interface)
}

/// The `wasi:clocks/monotonic-clock` version the WASI 0.2 host registers.
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

/// Replaces `subscribe-duration` and `subscribe-instant` of `wasi:clocks/monotonic-clock` with
/// ones whose pollables are ready at the invocation's deadline at the latest. A component that
/// sleeps (in `wasi:io/poll`, or `pollable.block`) past its deadline then wakes at it, and its
/// next instruction traps at the epoch deadline: its instance slot and thread are free at the
/// deadline, not when the sleep would have ended. Before the deadline a sleep is as asked.
fn deadline_bounded_sleeps(linker: &mut Linker<ComponentState>) -> wasmtime::Result<()> {
    use wasmtime::component::Resource;
    use wasmtime_wasi::p2::DynPollable;
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK)?;
    clock.func_wrap(
        "subscribe-duration",
        |mut store: wasmtime::StoreContextMut<'_, ComponentState>,
         (nanos,): (u64,)|
         -> wasmtime::Result<(Resource<DynPollable>,)> {
            let until =
                std::time::Instant::now().checked_add(std::time::Duration::from_nanos(nanos));
            Ok((store.data_mut().sleep(until)?,))
        },
    )?;
    clock.func_wrap(
        "subscribe-instant",
        |mut store: wasmtime::StoreContextMut<'_, ComponentState>,
         (when,): (u64,)|
         -> wasmtime::Result<(Resource<DynPollable>,)> {
            // Instants are on the clock every component is given.
            let until = Some(crate::wasi_poll::ProcessClock::instant(when));
            Ok((store.data_mut().sleep(until)?,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// Tests only (`RuntimeConfig::test_never_ready_import`): `tensor-wasm:test/never@0.1.0`'s
/// `never`, a `wasi:io/poll` pollable that is never ready. A component waiting on it (in
/// `pollable.block`, or `poll` over a list holding it) waits in the host until its deadline
/// drops the call: the proof that the deadline bounds any host wait, not only those of the
/// interfaces that bound their own (sleeps, bodies, outgoing requests).
fn never_ready_import(linker: &mut Linker<ComponentState>) -> wasmtime::Result<()> {
    use wasmtime::component::Resource;
    use wasmtime_wasi::p2::DynPollable;
    linker.instance("tensor-wasm:test/never@0.1.0")?.func_wrap(
        "never",
        |mut store: wasmtime::StoreContextMut<'_, ComponentState>,
         (): ()|
         -> wasmtime::Result<(Resource<DynPollable>,)> {
            let table = &mut store.data_mut().table;
            let never = table.push(NeverReady)?;
            Ok((wasmtime_wasi::p2::subscribe(table, never)?,))
        },
    )?;
    Ok(())
}

/// A pollable that is never ready.
struct NeverReady;

#[async_trait::async_trait]
impl wasmtime_wasi::p2::Pollable for NeverReady {
    async fn ready(&mut self) {
        std::future::pending::<()>().await;
    }
}

/// A pollable ready at an instant.
struct SleepUntil(tokio::time::Instant);

#[async_trait::async_trait]
impl wasmtime_wasi::p2::Pollable for SleepUntil {
    async fn ready(&mut self) {
        tokio::time::sleep_until(self.0).await;
    }
}

impl ComponentState {
    /// A pollable ready at `until` (`None`: never) or at the invocation's deadline, whichever
    /// comes first.
    fn sleep(
        &mut self,
        until: Option<std::time::Instant>,
    ) -> wasmtime::Result<wasmtime::component::Resource<wasmtime_wasi::p2::DynPollable>> {
        let far = std::time::Instant::now() + std::time::Duration::from_secs(100 * 365 * 86_400);
        let until = match (until, self.deadline) {
            (Some(until), Some(deadline)) => until.min(deadline),
            (Some(until), None) => until,
            (None, Some(deadline)) => deadline,
            (None, None) => far,
        };
        let sleep = self
            .table
            .push(SleepUntil(tokio::time::Instant::from_std(until)))?;
        wasmtime_wasi::p2::subscribe(&mut self.table, sleep)
    }
}

/// Awaits `instantiate` (an `instantiate_async` of a component's store), once more when its
/// first attempt failed to make the component's memory image: wasmtime puts a component's
/// initial memory in a sealed memfd, made at its first instantiation, and Linux refuses the
/// seals (`EBUSY`) while the memfd's pages are transiently pinned, as under heavy memory
/// pressure. Nothing of the guest ran then, and wasmtime makes the image again at the next
/// attempt.
macro_rules! instantiate_retrying {
    ($instantiate:expr) => {
        match $instantiate.await {
            Err(e) if format!("{e:#}").contains("memfd") => {
                tracing::warn!(error = %format!("{e:#}"), "making a component's memory image failed; trying again");
                $instantiate.await
            }
            other => other,
        }
    };
}
pub(crate) use instantiate_retrying;

/// Runs `call`, a component invocation's instantiation and call (borrowing its store), until
/// it ends, `deadline` passes or the invocation's client goes away ([`ClientWatch::scope`]),
/// whichever comes first. At the deadline the call is dropped and this returns
/// [`DeadlineExceeded`](crate::invocation_state::DeadlineExceeded); when the client goes away,
/// [`ClientGone`](crate::stream::ClientGone).
///
/// This is what bounds every wait of a component, whatever it waits in. Component stores are
/// called asynchronously (`instantiate_async`, `call_async`): a host call that has to wait (a
/// stream nobody drains, a pollable that is never ready, a socket, a sleep) suspends the
/// call's future instead of blocking its thread, and dropping the future unwinds the guest's
/// stack and drops everything it held of the host. The caller then discards the store (it is
/// never reused), which frees the instance slot and its memory. Guest code that computes
/// without calling the host is stopped by the epoch deadline instead, as a core module is.
/// The future runs on the calling thread (one per invocation, wasmtime-wasi's `in_tokio`), so
/// a host call that blocks there, such as a GPU launch waiting for its kernel (itself bounded
/// by the deadline), holds only its own invocation.
///
/// `cancelled` counts the calls dropped at their deadline.
pub(crate) fn run_until<T>(
    deadline: Option<std::time::Instant>,
    cancelled: &prometheus::IntCounter,
    call: impl std::future::Future<Output = wasmtime::Result<T>>,
) -> wasmtime::Result<T> {
    let client = CLIENT.take();
    wasmtime_wasi::runtime::in_tokio(async move {
        let timed = async {
            let Some(deadline) = deadline else {
                return call.await;
            };
            match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), call).await {
                Ok(outcome) => outcome,
                Err(_elapsed) => {
                    cancelled.inc();
                    Err(wasmtime::Error::new(
                        crate::invocation_state::DeadlineExceeded,
                    ))
                }
            }
        };
        let gone = async {
            // A send: the client's end was dropped. No send (released), or no watch: never.
            let dropped = match client {
                Some(ClientWatch(rx)) => rx.await.is_ok(),
                None => false,
            };
            if !dropped {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            biased;
            outcome = timed => outcome,
            () = gone => Err(wasmtime::Error::new(crate::stream::ClientGone)),
        }
    })
}

thread_local! {
    /// The watch of the invocation this thread runs ([`ClientWatch::scope`]).
    static CLIENT: std::cell::Cell<Option<ClientWatch>> = const { std::cell::Cell::new(None) };
}

/// The client's end of a [`ClientWatch`]: held for as long as the client waits for the
/// invocation's answer (or reads its streamed body). Dropping it cancels the invocation;
/// [`ClientPresent::release`] stops watching instead.
#[derive(Debug)]
pub struct ClientPresent {
    tx: Option<tokio::sync::oneshot::Sender<()>>,
}

impl ClientPresent {
    /// The client no longer needs the invocation to end with it (its answer is complete):
    /// the invocation goes on to its own end, or its deadline.
    pub fn release(mut self) {
        // Dropped without a send: the watch never fires.
        self.tx.take();
    }
}

impl Drop for ClientPresent {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            // The invocation may have ended already; then nobody listens.
            let _ = tx.send(());
        }
    }
}

/// Watches an invocation's client: a component invocation run in [`ClientWatch::scope`] is
/// dropped, as at its deadline, when the [`ClientPresent`] end is dropped, and fails with
/// [`RuntimeError::ClientGone`]. Core modules are not watched: they end at their deadline.
#[derive(Debug)]
pub struct ClientWatch(tokio::sync::oneshot::Receiver<()>);

impl ClientWatch {
    /// A watch and its client's end.
    pub fn pair() -> (ClientPresent, ClientWatch) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (ClientPresent { tx: Some(tx) }, ClientWatch(rx))
    }

    /// Runs `invocation` (a call of [`crate::Runtime`] that runs a function on this thread)
    /// watching the client: the first component call in it ends when the client goes away.
    pub fn scope<R>(self, invocation: impl FnOnce() -> R) -> R {
        CLIENT.set(Some(self));
        let result = invocation();
        // Not taken when no component ran.
        CLIENT.take();
        result
    }
}

/// Whether `component` exports `wasi:http/incoming-handler` (some 0.2 version): `None` when
/// it does not, `Some(Err)` saying why when its `handle` is not
/// `func(request: incoming-request, response-out: response-outparam)` (two owned resources,
/// no result).
fn http_handler_export(engine: &Engine, component: &Component) -> Option<Result<(), String>> {
    use wasmtime::component::types::{ComponentItem, Type};
    let ty = component.component_type();
    let (name, export) = ty
        .exports(engine)
        .find(|(name, _)| interface_of(name) == "wasi:http/incoming-handler")?;
    let ComponentItem::ComponentInstance(instance) = export.ty else {
        return Some(Err(format!("{name} is not an instance")));
    };
    let handle = instance.get_export(engine, "handle").map(|e| e.ty);
    let Some(ComponentItem::ComponentFunc(func)) = handle else {
        return Some(Err(format!("{name} has no function `handle`")));
    };
    let takes_two_resources =
        func.params().len() == 2 && func.params().all(|(_, t)| matches!(t, Type::Own(_)));
    Some(if takes_two_resources && func.results().len() == 0 {
        Ok(())
    } else {
        Err(format!(
            "{name}'s `handle` is not func(request: incoming-request, response-out: \
             response-outparam)"
        ))
    })
}

/// The refusal of a component with nothing to invoke: what it is, and what runs.
pub(crate) fn refusal(style: &ComponentStyle) -> RuntimeError {
    RuntimeError::UnsupportedFeature(format!(
        "this is {}; a WebAssembly component (WASI 0.2) runs when it exports \
         wasi:http/incoming-handler (an HTTP handler), wasi:cli/run (a command) or functions \
         of its own (typed exports) (docs/components.md)",
        style.describe()
    ))
}

/// A component compiled and linked against the WASI 0.2 host, ready to instantiate.
#[derive(Clone)]
pub(crate) enum LoadedComponent {
    /// It exports `wasi:http/incoming-handler`.
    Http(Arc<ProxyPre<ComponentState>>),
    /// It exports `wasi:cli/run`.
    Command(Arc<CommandPre<ComponentState>>),
    /// It exports functions of its own, called with JSON arguments.
    Exports(Arc<InstancePre<ComponentState>>),
}

/// What a component's store holds: its WASI 0.2 and `wasi:http` contexts, its resources and
/// its memory budget.
pub(crate) struct ComponentState {
    ctx: WasiCtx,
    pub(crate) table: ResourceTable,
    http: WasiHttpCtx,
    /// Outgoing HTTP: to the allow-list's origins only, within the deadline.
    hooks: OutgoingHttp,
    /// Its one memory budget: linear memories, GPU buffers and bytes the host holds for it.
    pub(crate) budget: MemoryBudget,
    /// The bytes one of its `wasi:http` fields resources may hold.
    pub(crate) field_size_limit: usize,
    /// Its outgoing bodies, and which it finished.
    pub(crate) finishing: crate::component_charge::Finishing,
    /// The invocation's deadline: no sleep of the component outlasts it.
    pub(crate) deadline: Option<std::time::Instant>,
    /// The invocation's `tensor-wasm:gpu` state (its buffers and kernels).
    pub(crate) gpu: Option<crate::component_gpu::ComponentGpu>,
    /// The invocation's `wasi:nn` state (its graphs and execution contexts).
    pub(crate) nn: Option<crate::nn::NnHost>,
    /// The component's own spans (`tensor-wasm:trace`).
    pub(crate) spans: crate::guest_trace::GuestSpans,
}

impl WasiHttpView for ComponentState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

impl WasiView for ComponentState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.ctx,
            table: &mut self.table,
        }
    }
}

impl ComponentState {
    /// The state of one invocation: `memory_limit` over all its memories and what it makes
    /// the host hold, at most `limits.max_resources` host resources, outgoing HTTP to the
    /// origins of `outgoing_allow` only.
    pub(crate) fn new(
        ctx: WasiCtx,
        memory_limit: u64,
        limits: crate::ComponentLimits,
        outgoing_allow: Arc<[Origin]>,
    ) -> Self {
        let mut table = ResourceTable::new();
        table.set_max_capacity(limits.max_resources);
        let mut http = WasiHttpCtx::new();
        http.set_field_size_limit(limits.max_field_bytes);
        ComponentState {
            ctx,
            table,
            http,
            hooks: OutgoingHttp::new(outgoing_allow),
            gpu: None,
            nn: None,
            spans: Default::default(),
            deadline: None,
            budget: MemoryBudget::new(memory_limit),
            field_size_limit: limits.max_field_bytes,
            finishing: Default::default(),
        }
    }

    /// Bounds the invocation's sleeps and outgoing HTTP by `deadline`.
    pub(crate) fn set_deadline(&mut self, deadline: std::time::Instant) {
        self.deadline = Some(deadline);
        self.hooks.deadline = Some(deadline);
    }
}

/// Bounds a component's linear memories, with its GPU buffers and the bytes it handed the
/// host, by the function's memory limit, and its tables.
impl ResourceLimiter for MemoryBudget {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        match self.grow_linear(current, desired) {
            Ok(()) => Ok(true),
            Err(message) => Err(wasmtime::Error::msg(message)),
        }
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // As many as a core module's instance may have.
        Ok(desired <= crate::invocation_state::MAX_TABLE_ELEMENTS)
    }
}

/// The component engine, its WASI 0.2 linker, and the components compiled and linked so far
/// (by module sha256).
pub(crate) struct ComponentHost {
    pub(crate) engine: Engine,
    linker: Linker<ComponentState>,
    loaded: RwLock<HashMap<String, LoadedComponent>>,
}

impl ComponentHost {
    /// The host of `engine`; with `never_ready_import` (tests only) it also links
    /// [`never_ready_import`].
    pub(crate) fn new(engine: Engine, never_ready_import: bool) -> Result<Self, RuntimeError> {
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .and_then(|()| wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker))
            .and_then(|()| crate::component_gpu::add_to_linker(&mut linker))
            .and_then(|()| crate::component_trace::add_to_linker(&mut linker))
            .and_then(|()| crate::nn::wit::add_to_linker(&mut linker))
            .and_then(|()| crate::component_charge::charge_http_calls(&mut linker))
            .and_then(|()| deadline_bounded_sleeps(&mut linker))
            .and_then(|()| {
                if never_ready_import {
                    self::never_ready_import(&mut linker)
                } else {
                    Ok(())
                }
            })
            .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        Ok(ComponentHost {
            engine,
            linker,
            loaded: RwLock::new(HashMap::new()),
        })
    }

    /// The component `sha256`, compiled and linked from `binary` unless it is loaded already
    /// or has an artifact in `artifacts`: an HTTP handler when it exports
    /// `wasi:http/incoming-handler`, a command when it exports `wasi:cli/run`, its typed
    /// exports otherwise. A fresh compile's artifact is written when `write_artifact` (a
    /// deploy writes it only once it has committed, with [`ComponentHost::write_artifact`]).
    ///
    /// # Errors
    /// [`RuntimeError::InvalidModule`] when it does not compile or imports what this host
    /// does not provide.
    pub(crate) fn load(
        &self,
        sha256: &str,
        artifacts: &crate::engine::ArtifactCache,
        write_artifact: bool,
        binary: impl FnOnce() -> Result<Vec<u8>, RuntimeError>,
    ) -> Result<LoadedComponent, RuntimeError> {
        if let Some(loaded) = self
            .loaded
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(sha256)
        {
            crate::trace::note_coldstart(false);
            return Ok(loaded.clone());
        }
        crate::trace::note_coldstart(true);
        let invalid = |what: &str, e: wasmtime::Error| {
            RuntimeError::InvalidModule(truncate_message(format!("{what}: {e:#}")))
        };
        // Compiled once: from its artifact on later starts, written once it has linked.
        let (component, compiled) = match artifacts.load_component(&self.engine, sha256) {
            Some(component) => (component, false),
            None => {
                let binary = binary()?;
                let component = Component::from_binary(&self.engine, &binary)
                    .map_err(|e| invalid("the component does not compile", e))?;
                (component, true)
            }
        };
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| invalid("the component imports what this host does not provide", e))?;
        let loaded = match http_handler_export(&self.engine, pre.component()) {
            Some(Err(why)) => {
                return Err(RuntimeError::InvalidModule(truncate_message(format!(
                    "its wasi:http/incoming-handler export cannot be served: {why}"
                ))))
            }
            Some(Ok(())) => {
                LoadedComponent::Http(Arc::new(ProxyPre::new(pre.clone()).map_err(|e| {
                    invalid("its wasi:http/incoming-handler export cannot be served", e)
                })?))
            }
            None => match CommandPre::new(pre.clone()) {
                Ok(command) => LoadedComponent::Command(Arc::new(command)),
                Err(_) => LoadedComponent::Exports(Arc::new(pre)),
            },
        };
        if compiled && write_artifact {
            artifacts.store_component(sha256, &component);
        }
        self.loaded
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(sha256.to_owned(), loaded.clone());
        Ok(loaded)
    }

    /// Writes the artifact of the loaded component `sha256` (after its deploy committed).
    pub(crate) fn write_artifact(&self, sha256: &str, artifacts: &crate::engine::ArtifactCache) {
        let loaded = self
            .loaded
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(sha256)
            .cloned();
        let component = match &loaded {
            Some(LoadedComponent::Http(pre)) => pre.instance_pre().component(),
            Some(LoadedComponent::Command(pre)) => pre.instance_pre().component(),
            Some(LoadedComponent::Exports(pre)) => pre.component(),
            None => return,
        };
        artifacts.store_component(sha256, component);
    }

    /// Forgets the component `sha256` (no function uses it any more).
    pub(crate) fn forget(&self, sha256: &str) {
        self.loaded
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(sha256);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn component(wat: &str) -> Vec<u8> {
        wat::parse_str(wat).expect("a component in the text format")
    }

    /// A component whose core module returns 0 from `run`, lifted as `wasi:cli/run`'s
    /// `run: func() -> result`.
    const COMMAND: &str = r#"(component
        (core module $m (func (export "run") (result i32) i32.const 0))
        (core instance $i (instantiate $m))
        (func $run (result (result)) (canon lift (core func $i "run")))
        (instance $cli (export "run" (func $run)))
        (export "wasi:cli/run@0.2.0" (instance $cli)))"#;

    #[test]
    fn components_are_classified_by_their_exports() {
        assert!(is_component(&component(COMMAND)));
        assert!(!is_component(&wat::parse_str("(module)").unwrap()));
        assert_eq!(
            classify(&component(COMMAND)).unwrap(),
            ComponentStyle::Command
        );
        let typed = component(
            r#"(component
                (core module $m (func (export "add") (param i32 i32) (result i32)
                    local.get 0 local.get 1 i32.add))
                (core instance $i (instantiate $m))
                (func $add (param "a" s32) (param "b" s32) (result s32)
                    (canon lift (core func $i "add")))
                (export "add" (func $add)))"#,
        );
        assert_eq!(
            classify(&typed).unwrap(),
            ComponentStyle::TypedExports(vec!["add".into()])
        );
        let handler = component(
            r#"(component
                (core module $m (func (export "handle")))
                (core instance $i (instantiate $m))
                (func $handle (canon lift (core func $i "handle")))
                (instance $h (export "handle" (func $handle)))
                (export "wasi:http/incoming-handler@0.2.3" (instance $h)))"#,
        );
        assert_eq!(classify(&handler).unwrap(), ComponentStyle::HttpHandler);
        assert_eq!(
            classify(&component("(component)")).unwrap(),
            ComponentStyle::Nothing
        );
    }

    #[test]
    fn a_component_with_nothing_to_invoke_is_refused_saying_what_runs() {
        let err = refusal(&ComponentStyle::Nothing).to_string();
        assert!(err.contains("exports nothing to invoke"), "{err}");
        assert!(
            err.contains("wasi:http/incoming-handler") && err.contains("typed exports"),
            "{err}"
        );
        // Damaged after the header: invalid.
        let mut damaged = component(COMMAND);
        damaged.truncate(damaged.len() - 3);
        assert!(matches!(
            classify(&damaged),
            Err(RuntimeError::InvalidModule(_))
        ));
    }
}
