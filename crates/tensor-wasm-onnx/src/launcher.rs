//! [`BackendLauncher`]: launches straight on a `tensor-wasm-gpu` backend, without the
//! runtime's dispatcher. Constant folding runs on it (on the CPU backend, once per model
//! load), and so do the crate's tests.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use tensor_wasm_gpu::{Backend, DeviceChoice, Kernel, KernelArg, LaunchConfig, TenantKey};
use tensor_wasm_jit::{Blueprint, CompiledBlueprint};

use crate::plan::Launcher;
use crate::{OnnxError, Result};

/// A [`Launcher`] over one backend, loading each blueprint once.
pub struct BackendLauncher {
    backend: Arc<dyn Backend>,
    tenant: TenantKey,
    kernels: HashMap<Blueprint, Kernel>,
}

impl BackendLauncher {
    /// Launches on `backend` for `tenant`.
    pub fn new(backend: Arc<dyn Backend>, tenant: TenantKey) -> Self {
        BackendLauncher {
            backend,
            tenant,
            kernels: HashMap::new(),
        }
    }

    /// Launches on the process's shared CPU backend (opened on first use).
    pub fn cpu() -> Result<Self> {
        static CPU: OnceLock<std::result::Result<Arc<dyn Backend>, String>> = OnceLock::new();
        let backend = CPU
            .get_or_init(|| {
                tensor_wasm_gpu::open_backend(DeviceChoice::Cpu).map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| OnnxError::kernel(format!("the CPU backend: {e}")))?;
        Ok(BackendLauncher::new(backend, TenantKey::new("onnx")))
    }
}

impl Launcher for BackendLauncher {
    fn launch(
        &mut self,
        blueprint: &Blueprint,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &mut [u8],
    ) -> Result<()> {
        let kernel = match self.kernels.get(blueprint) {
            Some(kernel) => kernel.clone(),
            None => {
                let program = Arc::new(CompiledBlueprint::new(*blueprint));
                let kernel = self
                    .backend
                    .load_program(&self.tenant, program)
                    .map_err(|e| OnnxError::kernel(format!("loading {blueprint}: {e}")))?;
                self.kernels.insert(*blueprint, kernel.clone());
                kernel
            }
        };
        tensor_wasm_gpu::launch(
            &*self.backend,
            &self.tenant,
            &kernel,
            config,
            args,
            memory,
            |c| c.wait_mut(),
        )
        .and_then(|r| r)
        .map_err(|e| OnnxError::kernel(format!("{blueprint}: {e}")))
    }
}
