//! Host-backed guest memories driven through a real wasmtime engine.
// Implementing `MemoryCreator` (an unsafe trait) to record wasmtime's arguments.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex};

use tensor_wasm_mem::{
    configure_engine, with_capacity_hint, MemoryBacking, TensorWasmMemoryCreator,
};
use wasmtime::{
    Config, Engine, Instance, InstanceAllocationStrategy, LinearMemory, Memory, MemoryCreator,
    MemoryType, Module, Store, Trap, TypedFunc,
};

const PAGE: usize = 65536;

/// A guest with a 1..16 page memory, a data segment and accessors.
const GUEST: &str = r#"
(module
  (memory (export "mem") 1 16)
  (data (i32.const 16) "hello, gpu")
  (func (export "load") (param i32) (result i32)
    local.get 0
    i32.load8_u)
  (func (export "store") (param i32 i32)
    local.get 0
    local.get 1
    i32.store8)
  (func (export "load_far") (param i32) (result i32)
    local.get 0
    i32.load offset=1048576)
  (func (export "grow") (param i32) (result i32)
    local.get 0
    memory.grow)
  (func (export "size") (result i32)
    memory.size))
"#;

/// The same guest without a declared maximum.
const GUEST_NO_MAX: &str = r#"
(module
  (memory (export "mem") 1)
  (func (export "grow") (param i32) (result i32)
    local.get 0
    memory.grow))
"#;

fn host_creator(cap_bytes: u64) -> Arc<TensorWasmMemoryCreator> {
    Arc::new(TensorWasmMemoryCreator::new(MemoryBacking::Host, cap_bytes))
}

fn engine_for(creator: &Arc<TensorWasmMemoryCreator>) -> Engine {
    let mut config = Config::new();
    configure_engine(&mut config, Arc::clone(creator));
    Engine::new(&config).expect("engine")
}

struct Guest {
    store: Store<()>,
    memory: Memory,
    load: TypedFunc<i32, i32>,
    store_byte: TypedFunc<(i32, i32), ()>,
    load_far: TypedFunc<i32, i32>,
    grow: TypedFunc<i32, i32>,
    size: TypedFunc<(), i32>,
}

fn instantiate(engine: &Engine, hint: Option<u64>) -> wasmtime::Result<Guest> {
    let module = Module::new(engine, GUEST)?;
    let mut store = Store::new(engine, ());
    let instance = match hint {
        Some(bytes) => with_capacity_hint(bytes, || Instance::new(&mut store, &module, &[]))?,
        None => Instance::new(&mut store, &module, &[])?,
    };
    Ok(Guest {
        memory: instance
            .get_memory(&mut store, "mem")
            .expect("memory export"),
        load: instance.get_typed_func(&mut store, "load")?,
        store_byte: instance.get_typed_func(&mut store, "store")?,
        load_far: instance.get_typed_func(&mut store, "load_far")?,
        grow: instance.get_typed_func(&mut store, "grow")?,
        size: instance.get_typed_func(&mut store, "size")?,
        store,
    })
}

fn assert_oob_trap(result: wasmtime::Result<impl std::fmt::Debug>) {
    let err = result.expect_err("access should trap");
    assert_eq!(
        err.downcast_ref::<Trap>(),
        Some(&Trap::MemoryOutOfBounds),
        "unexpected error: {err:?}"
    );
}

#[test]
fn data_segment_is_visible_and_memory_is_zero_elsewhere() {
    let creator = host_creator(1 << 30);
    let engine = engine_for(&creator);
    let mut g = instantiate(&engine, None).unwrap();
    let data = g.memory.data(&g.store);
    assert_eq!(data.len(), PAGE);
    assert_eq!(&data[16..26], b"hello, gpu");
    assert!(data[..16].iter().chain(&data[26..]).all(|b| *b == 0));
    assert_eq!(g.load.call(&mut g.store, 16).unwrap(), i32::from(b'h'));
}

#[test]
fn guest_writes_land_in_the_buffer_and_host_writes_reach_the_guest() {
    let creator = host_creator(1 << 30);
    let engine = engine_for(&creator);
    let mut g = instantiate(&engine, None).unwrap();
    g.store_byte.call(&mut g.store, (4000, 0xAB)).unwrap();
    assert_eq!(g.memory.data(&g.store)[4000], 0xAB);

    g.memory.data_mut(&mut g.store)[5000] = 0x5C;
    assert_eq!(g.load.call(&mut g.store, 5000).unwrap(), 0x5C);
}

#[test]
fn grows_within_capacity_without_moving_and_fails_beyond() {
    let creator = host_creator(1 << 30);
    let engine = engine_for(&creator);
    let mut g = instantiate(&engine, None).unwrap();
    let base = g.memory.data_ptr(&g.store);

    assert_eq!(g.grow.call(&mut g.store, 7).unwrap(), 1);
    assert_eq!(g.size.call(&mut g.store, ()).unwrap(), 8);
    assert_eq!(g.memory.data_ptr(&g.store), base);
    // Grown pages are zero and usable by the guest.
    assert_eq!(g.load.call(&mut g.store, (8 * PAGE - 1) as i32).unwrap(), 0);
    g.store_byte
        .call(&mut g.store, ((8 * PAGE - 1) as i32, 9))
        .unwrap();
    assert_eq!(g.memory.data(&g.store)[8 * PAGE - 1], 9);

    assert_eq!(g.grow.call(&mut g.store, 8).unwrap(), 8);
    assert_eq!(g.size.call(&mut g.store, ()).unwrap(), 16);
    assert_eq!(
        g.grow.call(&mut g.store, 1).unwrap(),
        -1,
        "past the declared max"
    );
    assert_eq!(g.size.call(&mut g.store, ()).unwrap(), 16);
    assert_eq!(g.memory.data_ptr(&g.store), base);
    assert_eq!(g.memory.data(&g.store)[16], b'h', "contents survive growth");
}

#[test]
fn hint_limits_capacity() {
    let creator = host_creator(1 << 30);
    let engine = engine_for(&creator);
    let mut g = instantiate(&engine, Some(4 * PAGE as u64)).unwrap();
    assert_eq!(g.grow.call(&mut g.store, 3).unwrap(), 1);
    assert_eq!(g.grow.call(&mut g.store, 1).unwrap(), -1, "past the hint");
    assert_eq!(g.size.call(&mut g.store, ()).unwrap(), 4);

    // Host-side growth obeys the same capacity.
    assert!(g.memory.grow(&mut g.store, 1).is_err());

    // Without the hint the next instance gets the declared maximum again.
    let mut g = instantiate(&engine, None).unwrap();
    assert_eq!(g.grow.call(&mut g.store, 15).unwrap(), 1);
}

#[test]
fn cap_limits_capacity_and_minimum_above_it_fails_instantiation() {
    let creator = host_creator(2 * PAGE as u64);
    let engine = engine_for(&creator);
    let mut g = instantiate(&engine, None).unwrap();
    assert_eq!(g.grow.call(&mut g.store, 1).unwrap(), 1);
    assert_eq!(g.grow.call(&mut g.store, 1).unwrap(), -1, "past the cap");

    let module = Module::new(&engine, "(module (memory 3))").unwrap();
    let mut store = Store::new(&engine, ());
    let err = Instance::new(&mut store, &module, &[]).unwrap_err();
    assert!(format!("{err:?}").contains("limit"), "{err:?}");

    let err = with_capacity_hint(0, || Instance::new(&mut store, &module, &[])).unwrap_err();
    assert!(format!("{err:?}").contains("limit"), "{err:?}");
}

#[test]
fn module_without_declared_maximum_gets_cap_or_hint_capacity() {
    let creator = host_creator(8 * PAGE as u64);
    let engine = engine_for(&creator);
    let module = Module::new(&engine, GUEST_NO_MAX).unwrap();

    let mut store = Store::new(&engine, ());
    let instance = Instance::new(&mut store, &module, &[]).unwrap();
    let grow = instance
        .get_typed_func::<i32, i32>(&mut store, "grow")
        .unwrap();
    assert_eq!(grow.call(&mut store, 7).unwrap(), 1);
    assert_eq!(grow.call(&mut store, 1).unwrap(), -1);

    let mut store = Store::new(&engine, ());
    let instance =
        with_capacity_hint(3 * PAGE as u64, || Instance::new(&mut store, &module, &[])).unwrap();
    let grow = instance
        .get_typed_func::<i32, i32>(&mut store, "grow")
        .unwrap();
    assert_eq!(grow.call(&mut store, 2).unwrap(), 1);
    assert_eq!(grow.call(&mut store, 1).unwrap(), -1);
}

#[test]
fn live_memories_return_to_zero_when_stores_drop() {
    let creator = host_creator(1 << 30);
    let engine = engine_for(&creator);
    let a = instantiate(&engine, None).unwrap();
    let b = instantiate(&engine, None).unwrap();
    assert_eq!(creator.live_memories(), 2);
    drop(a);
    assert_eq!(creator.live_memories(), 1);
    // In wasmtime 48 a host-created `Memory::new` does NOT go through the
    // custom creator (its trampoline uses a default on-demand allocator), so
    // such memories are never UVM-backed whatever the backing says.
    let mut store = Store::new(&engine, ());
    let host_mem = Memory::new(&mut store, MemoryType::new(1, Some(2))).unwrap();
    assert_eq!(host_mem.data(&store).len(), PAGE);
    assert_eq!(creator.live_memories(), 1);
    drop(store);
    drop(b);
    assert_eq!(creator.live_memories(), 0);
}

#[test]
fn out_of_bounds_accesses_trap_with_explicit_bounds_checks() {
    let creator = host_creator(1 << 30);
    let engine = engine_for(&creator);
    let mut g = instantiate(&engine, None).unwrap();

    // Page 1 is inside the allocation (capacity is 16 pages) and readable by
    // the host, but beyond memory.size: the guest must trap, not read it.
    assert_oob_trap(g.load.call(&mut g.store, PAGE as i32));
    assert_oob_trap(g.store_byte.call(&mut g.store, (PAGE as i32, 1)));
    assert_oob_trap(g.load.call(&mut g.store, -1));
    assert_oob_trap(g.load_far.call(&mut g.store, 0));
    assert!(g.memory.data(&g.store).iter().skip(26).all(|b| *b == 0));

    // After growth the same address is valid.
    assert_eq!(g.grow.call(&mut g.store, 1).unwrap(), 1);
    assert_eq!(g.load.call(&mut g.store, PAGE as i32).unwrap(), 0);
    // Beyond the capacity (16 pages) is always out of bounds.
    assert_eq!(g.grow.call(&mut g.store, 14).unwrap(), 2);
    assert_oob_trap(g.load.call(&mut g.store, (16 * PAGE) as i32));
    assert_oob_trap(g.load_far.call(&mut g.store, (15 * PAGE) as i32));
}

/// Records what wasmtime passes to a creator, then delegates.
struct RecordingCreator {
    inner: Arc<TensorWasmMemoryCreator>,
    seen: Mutex<Vec<(Option<usize>, usize)>>,
}

// SAFETY: delegates every allocation unchanged to `TensorWasmMemoryCreator`,
// whose memories uphold the `MemoryCreator` contract.
unsafe impl MemoryCreator for RecordingCreator {
    fn new_memory(
        &self,
        ty: MemoryType,
        minimum: usize,
        maximum: Option<usize>,
        reserved_size_in_bytes: Option<usize>,
        guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        self.seen
            .lock()
            .unwrap()
            .push((reserved_size_in_bytes, guard_size_in_bytes));
        self.inner.new_memory(
            ty,
            minimum,
            maximum,
            reserved_size_in_bytes,
            guard_size_in_bytes,
        )
    }
}

fn recorded_arguments(
    config: &mut Config,
    recorder: &Arc<RecordingCreator>,
) -> (Option<usize>, usize) {
    config.with_host_memory(Arc::clone(recorder) as Arc<dyn MemoryCreator>);
    let engine = Engine::new(config).unwrap();
    let module = Module::new(&engine, GUEST).unwrap();
    let mut store = Store::new(&engine, ());
    Instance::new(&mut store, &module, &[]).unwrap();
    let seen = recorder.seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    seen[0]
}

#[test]
fn configure_engine_makes_wasmtime_ask_for_no_reservation_and_no_guard() {
    let creator = host_creator(1 << 30);
    let recorder = Arc::new(RecordingCreator {
        inner: Arc::clone(&creator),
        seen: Mutex::new(Vec::new()),
    });
    let mut config = Config::new();
    configure_engine(&mut config, Arc::clone(&creator));
    // Swap in the recorder; every other setting stays as configure_engine left it.
    let (reserved, guard) = recorded_arguments(&mut config, &recorder);
    assert_eq!(reserved, Some(0));
    assert_eq!(guard, 0);
}

/// An engine that keeps wasmtime's default 4 GiB reservation and 32 MiB guard
/// (bounds checks elided, faults relied upon): host-backed memories must still
/// trap beyond `memory.size`, even inside their pre-allocated capacity.
#[test]
fn default_reservation_and_guard_are_honoured() {
    let creator = host_creator(1 << 30);
    let recorder = Arc::new(RecordingCreator {
        inner: Arc::clone(&creator),
        seen: Mutex::new(Vec::new()),
    });
    let mut config = Config::new();
    config
        .allocation_strategy(InstanceAllocationStrategy::OnDemand)
        .memory_init_cow(false);
    let (reserved, guard) = recorded_arguments(&mut config, &recorder);
    assert!(
        reserved.unwrap() >= 16 * PAGE,
        "default reservation: {reserved:?}"
    );
    assert!(guard > 0, "default guard: {guard}");

    config.with_host_memory(Arc::clone(&creator) as Arc<dyn MemoryCreator>);
    let engine = Engine::new(&config).unwrap();
    let mut g = instantiate(&engine, None).unwrap();
    let base = g.memory.data_ptr(&g.store);
    assert_eq!(&g.memory.data(&g.store)[16..26], b"hello, gpu");
    assert_oob_trap(g.load.call(&mut g.store, PAGE as i32));
    assert_oob_trap(g.load_far.call(&mut g.store, 0));
    assert_eq!(g.grow.call(&mut g.store, 2).unwrap(), 1);
    assert_eq!(g.load.call(&mut g.store, (3 * PAGE - 1) as i32).unwrap(), 0);
    g.store_byte
        .call(&mut g.store, ((3 * PAGE - 1) as i32, 4))
        .unwrap();
    assert_eq!(g.memory.data(&g.store)[3 * PAGE - 1], 4);
    assert_oob_trap(g.load.call(&mut g.store, (3 * PAGE) as i32));
    assert_eq!(g.grow.call(&mut g.store, 13).unwrap(), 3);
    assert_eq!(g.grow.call(&mut g.store, 1).unwrap(), -1);
    assert_eq!(g.memory.data_ptr(&g.store), base);
    drop(g);
    assert_eq!(creator.live_memories(), 0);
}
