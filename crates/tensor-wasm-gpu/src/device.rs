//! Devices: what the operator asks for (`DeviceChoice`), what a backend runs on (`Device`), and
//! what this host has (`discover`).

use std::fmt;
use std::str::FromStr;

use crate::GpuError;

/// Which backend to open, as given on the command line or in configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// The CPU backend, always available.
    Cpu,
    /// CUDA device 0; an error when there is none.
    Cuda,
    /// CUDA device 0 when usable, else the CPU.
    #[default]
    Auto,
}

impl FromStr for DeviceChoice {
    type Err = GpuError;

    /// Parses `cpu`, `cuda` or `auto` (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda),
            "auto" => Ok(DeviceChoice::Auto),
            _ => Err(GpuError::InvalidArgument(format!(
                "unknown device {s:?}: expected cpu, cuda or auto"
            ))),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceChoice::Cpu => "cpu",
            DeviceChoice::Cuda => "cuda",
            DeviceChoice::Auto => "auto",
        })
    }
}

/// What the CUDA driver reports about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDeviceInfo {
    /// Device ordinal (`cuda:N`).
    pub ordinal: u32,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// (major, minor), e.g. (9, 0) for Hopper.
    pub compute_capability: (u32, u32),
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub driver_version: i32,
    /// Device memory in bytes.
    pub total_memory_bytes: u64,
    /// Free device memory in bytes when queried.
    pub free_memory_bytes: u64,
    /// The device can access pageable host memory directly (HMM or ATS).
    pub pageable_memory_access: bool,
    /// The device and host can access managed memory concurrently.
    pub concurrent_managed_access: bool,
    /// Streaming multiprocessors.
    pub multiprocessor_count: u32,
}

impl CudaDeviceInfo {
    /// `sm_XY`, the architecture name of the compute capability.
    pub fn sm_name(&self) -> String {
        let (major, minor) = self.compute_capability;
        format!("sm_{major}{minor}")
    }

    /// `13.0` for a driver version of 13000.
    pub fn driver_version_text(&self) -> String {
        format!(
            "{}.{}",
            self.driver_version / 1000,
            (self.driver_version % 1000) / 10
        )
    }
}

/// The device a backend runs kernels on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(CudaDeviceInfo),
}

impl Device {
    /// Whether this is a CUDA device.
    pub fn is_cuda(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(info) => write!(
                f,
                "cuda:{} ({}, {}, {})",
                info.ordinal,
                info.name,
                info.sm_name(),
                gib(info.total_memory_bytes)
            ),
        }
    }
}

/// The CUDA devices of this host, or why there are none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// Every device the driver reports and this crate could query, by ordinal.
    pub cuda_devices: Vec<CudaDeviceInfo>,
    /// Why CUDA cannot be used: set exactly when `cuda_devices` is empty.
    pub cuda_unavailable: Option<String>,
}

/// Lists the CUDA devices of this host. Never panics: without an NVIDIA driver, or with one but
/// no device, the result has no devices and says why.
pub fn discover() -> Discovery {
    match crate::cuda::query_all_devices() {
        Ok(devices) if !devices.is_empty() => Discovery {
            cuda_devices: devices,
            cuda_unavailable: None,
        },
        Ok(_) => Discovery {
            cuda_devices: Vec::new(),
            cuda_unavailable: Some(String::from("the CUDA driver reports no devices")),
        },
        Err(reason) => Discovery {
            cuda_devices: Vec::new(),
            cuda_unavailable: Some(reason),
        },
    }
}

impl fmt::Display for Discovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cuda_devices.is_empty() {
            let reason = self
                .cuda_unavailable
                .as_deref()
                .unwrap_or("no CUDA device found");
            return writeln!(f, "CPU backend: {reason}");
        }
        writeln!(f, "CUDA devices: {}", self.cuda_devices.len())?;
        for info in &self.cuda_devices {
            writeln!(f, "cuda:{}  {}", info.ordinal, info.name)?;
            writeln!(
                f,
                "  compute capability         {}.{} ({})",
                info.compute_capability.0,
                info.compute_capability.1,
                info.sm_name()
            )?;
            writeln!(
                f,
                "  driver version             {} ({})",
                info.driver_version_text(),
                info.driver_version
            )?;
            writeln!(
                f,
                "  memory                     {} total, {} free",
                gib(info.total_memory_bytes),
                gib(info.free_memory_bytes)
            )?;
            writeln!(
                f,
                "  multiprocessors            {}",
                info.multiprocessor_count
            )?;
            writeln!(
                f,
                "  pageable memory access     {}",
                yes_no(info.pageable_memory_access)
            )?;
            writeln!(
                f,
                "  concurrent managed access  {}",
                yes_no(info.concurrent_managed_access)
            )?;
        }
        Ok(())
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

fn yes_no(value: bool) -> &'static str {
    if value {
        "yes"
    } else {
        "no"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> CudaDeviceInfo {
        CudaDeviceInfo {
            ordinal: 0,
            name: String::from("NVIDIA H100 80GB HBM3"),
            compute_capability: (9, 0),
            driver_version: 13000,
            total_memory_bytes: 85_031_714_816,
            free_memory_bytes: 84_000_000_000,
            pageable_memory_access: false,
            concurrent_managed_access: true,
            multiprocessor_count: 132,
        }
    }

    #[test]
    fn device_choice_parses_and_prints() {
        for (text, choice) in [
            ("cpu", DeviceChoice::Cpu),
            ("cuda", DeviceChoice::Cuda),
            ("auto", DeviceChoice::Auto),
        ] {
            assert_eq!(text.parse::<DeviceChoice>(), Ok(choice));
            assert_eq!(choice.to_string(), text);
        }
        assert_eq!("CUDA".parse::<DeviceChoice>(), Ok(DeviceChoice::Cuda));
        let error = "gpu".parse::<DeviceChoice>().unwrap_err();
        assert!(
            matches!(&error, GpuError::InvalidArgument(m) if m.contains("\"gpu\"")),
            "{error}"
        );
        assert!("".parse::<DeviceChoice>().is_err());
    }

    #[test]
    fn discovery_without_devices_prints_the_reason() {
        let discovery = Discovery {
            cuda_devices: Vec::new(),
            cuda_unavailable: Some(String::from("libcuda.so not found")),
        };
        assert_eq!(discovery.to_string(), "CPU backend: libcuda.so not found\n");
    }

    #[test]
    fn discovery_with_a_device_prints_every_field() {
        let discovery = Discovery {
            cuda_devices: vec![h100()],
            cuda_unavailable: None,
        };
        let text = discovery.to_string();
        for expected in [
            "cuda:0  NVIDIA H100 80GB HBM3",
            "9.0 (sm_90)",
            "13.0 (13000)",
            "79.2 GiB total, 78.2 GiB free",
            "multiprocessors            132",
            "pageable memory access     no",
            "concurrent managed access  yes",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
    }

    #[test]
    fn device_display_names_the_device() {
        assert_eq!(Device::Cpu.to_string(), "cpu");
        assert!(!Device::Cpu.is_cuda());
        let device = Device::Cuda(h100());
        assert!(device.is_cuda());
        assert_eq!(
            device.to_string(),
            "cuda:0 (NVIDIA H100 80GB HBM3, sm_90, 79.2 GiB)"
        );
    }
}
