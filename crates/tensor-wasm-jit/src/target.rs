//! `PtxTarget`: which `.target` and `.version` the emitted PTX declares for a device and driver.

use std::fmt;

use crate::JitError;

/// The architecture and PTX ISA version of emitted PTX.
///
/// A driver refuses PTX whose `.version` is newer than it knows
/// (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`), so the ISA is chosen from the driver version, never
/// from the toolkit this crate was built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PtxTarget {
    /// Compute capability `(major, minor)`: `.target sm_{major}{minor}`.
    pub sm: (u32, u32),
    /// PTX ISA `(major, minor)`: `.version {major}.{minor}`.
    pub ptx_isa: (u32, u32),
}

/// The first driver (`cuDriverGetVersion`: 1000 × major + 10 × minor) to accept each PTX ISA,
/// newest first, from the PTX ISA release history. CUDA 12.6 added no ISA (it stays 8.5) and
/// 12.7 (ISA 8.6) shipped only in some drivers. Drivers newer than the first row get its ISA,
/// the newest this emitter declares.
///
/// | driver (CUDA) | PTX ISA |
/// |---|---|
/// | 13000 (13.0) and newer | 9.0 |
/// | 12090 (12.9) | 8.8 |
/// | 12080 (12.8) | 8.7 |
/// | 12070 (12.7) | 8.6 |
/// | 12050 (12.5), 12060 (12.6) | 8.5 |
/// | 12040 (12.4) | 8.4 |
/// | 12030 / 12020 / 12010 / 12000 | 8.3 / 8.2 / 8.1 / 8.0 |
/// | 11080 ... 11000 (11.8 ... 11.0) | 7.8 ... 7.0 |
pub const DRIVER_PTX_ISA: [(i32, (u32, u32)); 19] = [
    (13000, (9, 0)),
    (12090, (8, 8)),
    (12080, (8, 7)),
    (12070, (8, 6)),
    (12050, (8, 5)),
    (12040, (8, 4)),
    (12030, (8, 3)),
    (12020, (8, 2)),
    (12010, (8, 1)),
    (12000, (8, 0)),
    (11080, (7, 8)),
    (11070, (7, 7)),
    (11060, (7, 6)),
    (11050, (7, 5)),
    (11040, (7, 4)),
    (11030, (7, 3)),
    (11020, (7, 2)),
    (11010, (7, 1)),
    (11000, (7, 0)),
];

/// The oldest PTX ISA that may target each known architecture (`.target sm_XY` needs it).
const SM_MIN_ISA: [((u32, u32), (u32, u32)); 14] = [
    ((7, 0), (6, 0)),
    ((7, 2), (6, 1)),
    ((7, 5), (6, 3)),
    ((8, 0), (7, 0)),
    ((8, 6), (7, 1)),
    ((8, 7), (7, 4)),
    ((8, 9), (7, 8)),
    ((9, 0), (7, 8)),
    ((10, 0), (8, 6)),
    ((10, 1), (8, 6)),
    ((10, 3), (8, 8)),
    ((11, 0), (9, 0)),
    ((12, 0), (8, 7)),
    ((12, 1), (8, 8)),
];

impl Default for PtxTarget {
    /// `sm_80` with ISA 8.0 (CUDA 12.0): loads on any Ampere-or-newer device with a CUDA 12+
    /// driver. Used when no device is known.
    fn default() -> Self {
        Self {
            sm: (8, 0),
            ptx_isa: (8, 0),
        }
    }
}

impl PtxTarget {
    /// The target for a device of `compute_capability` under a driver of `driver_version`
    /// (`cuDriverGetVersion`, e.g. 13000 for CUDA 13.0): the device's own architecture and the
    /// newest ISA the driver accepts (see [`DRIVER_PTX_ISA`]).
    ///
    /// # Errors
    /// [`JitError::UnsupportedDevice`] for drivers older than CUDA 11.0, architectures older
    /// than sm_70, or a known architecture that needs a newer ISA than the driver accepts.
    pub fn for_device(
        compute_capability: (u32, u32),
        driver_version: i32,
    ) -> Result<Self, JitError> {
        let Some(ptx_isa) = ptx_isa_for_driver(driver_version) else {
            return Err(JitError::UnsupportedDevice(format!(
                "driver version {driver_version} is older than CUDA 11.0"
            )));
        };
        let (major, minor) = compute_capability;
        if major < 7 || minor > 9 {
            return Err(JitError::UnsupportedDevice(format!(
                "compute capability {major}.{minor} is not supported (sm_70 or newer)"
            )));
        }
        if let Some((_, needed)) = SM_MIN_ISA.iter().find(|(sm, _)| *sm == compute_capability) {
            if *needed > ptx_isa {
                return Err(JitError::UnsupportedDevice(format!(
                    "sm_{major}{minor} needs PTX ISA {}.{}, driver {driver_version} accepts {}.{}",
                    needed.0, needed.1, ptx_isa.0, ptx_isa.1
                )));
            }
        }
        Ok(Self {
            sm: compute_capability,
            ptx_isa,
        })
    }

    /// `sm_80`, `sm_90`, `sm_120`, ...
    pub fn sm_name(&self) -> String {
        format!("sm_{}{}", self.sm.0, self.sm.1)
    }
}

impl fmt::Display for PtxTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (PTX ISA {}.{})",
            self.sm_name(),
            self.ptx_isa.0,
            self.ptx_isa.1
        )
    }
}

/// The newest PTX ISA a driver of `driver_version` accepts, per [`DRIVER_PTX_ISA`]; `None`
/// before CUDA 11.0.
pub fn ptx_isa_for_driver(driver_version: i32) -> Option<(u32, u32)> {
    DRIVER_PTX_ISA
        .iter()
        .find(|(first, _)| driver_version >= *first)
        .map(|(_, isa)| *isa)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_versions_map_to_the_isa_they_accept() {
        let cases = [
            (13000, (9, 0)),
            (13020, (9, 0)),
            (12090, (8, 8)),
            (12080, (8, 7)),
            (12060, (8, 5)),
            (12040, (8, 4)),
            (12000, (8, 0)),
            (11080, (7, 8)),
        ];
        for (driver, isa) in cases {
            assert_eq!(ptx_isa_for_driver(driver), Some(isa), "driver {driver}");
        }
        assert_eq!(ptx_isa_for_driver(10020), None);
    }

    #[test]
    fn for_device_takes_the_sm_from_the_device_and_the_isa_from_the_driver() {
        let h100 = PtxTarget::for_device((9, 0), 13000).unwrap();
        assert_eq!(
            h100,
            PtxTarget {
                sm: (9, 0),
                ptx_isa: (9, 0)
            }
        );
        assert_eq!(h100.sm_name(), "sm_90");
        let a100 = PtxTarget::for_device((8, 0), 12040).unwrap();
        assert_eq!(a100.ptx_isa, (8, 4));
        let blackwell = PtxTarget::for_device((12, 0), 12080).unwrap();
        assert_eq!(blackwell.sm_name(), "sm_120");
        assert!(PtxTarget::for_device((12, 0), 12040).is_err());
        assert!(PtxTarget::for_device((6, 1), 13000).is_err());
        assert!(PtxTarget::for_device((9, 0), 10000).is_err());
        assert_eq!(PtxTarget::default().to_string(), "sm_80 (PTX ISA 8.0)");
    }
}
