//! Shared pieces of the bench crate: the guest modules every comparison uses, the
//! invoke request body, and the plain pooling engine of the raw-wasmtime peers.
//!
//! The Criterion benches (`benches/`), the minimal reference server
//! (`src/bin/minimal-server.rs`) and the load generator (`src/bin/loadgen.rs`)
//! all take their inputs from here, so every side of a comparison runs the
//! same module with the same request. [`bench_filter`] reads Criterion's
//! filter argument for the bench with its own harness (`benches/tail_latency.rs`).
//!
//! Tools live elsewhere: the CI gates over these benches' results in
//! `tensor-wasm-gates`, the GPU validation suite in `tensor-wasm-gpu-suite`.

pub mod bench_filter;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// The trivial `add(i32, i32) -> i32` function of the HTTP comparisons.
pub const ADD_WAT: &str = r#"(module
  (func (export "add") (param i32 i32) (result i32)
    local.get 0
    local.get 1
    i32.add))
"#;

/// The trivial module of the instantiation comparison: one page of linear
/// memory and a no-argument export `f` returning 42.
pub const TRIVIAL_WAT: &str = r#"(module
  (memory 1)
  (func (export "f") (result i32)
    i32.const 42))
"#;

/// The JSON body posted to `/functions/{id}/invoke` to call [`ADD_WAT`]'s `add`.
pub const INVOKE_ADD_BODY: &str = r#"{"export":"add","args":[1,2]}"#;

/// A wasmtime engine with the pooling allocator and nothing else enabled (no
/// epoch interruption, no fuel): the "raw wasmtime" side of a comparison.
///
/// `slots` instance/memory/table slots, each memory at most `max_memory_bytes`,
/// matching the slot counts of the runtime configuration it is compared with.
pub fn raw_pooling_engine(slots: u32, max_memory_bytes: usize) -> wasmtime::Result<Engine> {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_core_instances(slots)
        .total_memories(slots)
        .total_tables(slots)
        .total_component_instances(0)
        .max_memories_per_module(1)
        .max_tables_per_module(4)
        .max_memory_size(max_memory_bytes);
    let mut config = Config::new();
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::{Linker, Module, Store};

    #[test]
    fn modules_run_on_the_raw_engine() {
        let engine = raw_pooling_engine(4, 1 << 20).unwrap();
        let linker = Linker::<()>::new(&engine);

        let add = linker
            .instantiate_pre(&Module::new(&engine, ADD_WAT).unwrap())
            .unwrap();
        let mut store = Store::new(&engine, ());
        let instance = add.instantiate(&mut store).unwrap();
        let f = instance
            .get_typed_func::<(i32, i32), i32>(&mut store, "add")
            .unwrap();
        assert_eq!(f.call(&mut store, (1, 2)).unwrap(), 3);

        let trivial = linker
            .instantiate_pre(&Module::new(&engine, TRIVIAL_WAT).unwrap())
            .unwrap();
        let mut store = Store::new(&engine, ());
        let instance = trivial.instantiate(&mut store).unwrap();
        let f = instance.get_typed_func::<(), i32>(&mut store, "f").unwrap();
        assert_eq!(f.call(&mut store, ()).unwrap(), 42);
    }

    #[test]
    fn invoke_body_is_the_api_shape() {
        let body: serde_json::Value = serde_json::from_str(INVOKE_ADD_BODY).unwrap();
        assert_eq!(body["export"], "add");
        assert_eq!(body["args"], serde_json::json!([1, 2]));
    }
}
