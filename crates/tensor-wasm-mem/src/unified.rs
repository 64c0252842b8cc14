//! One type for guest memory whichever way it is backed: host pages or CUDA managed memory.

use crate::{GuardedHostBuffer, ManagedBuffer};

/// A guest memory buffer: plain host pages, or CUDA managed memory that kernels
/// can address directly (UVM).
#[derive(Debug)]
pub enum UnifiedBuffer {
    /// Host-only pages followed by a guard region.
    Host(GuardedHostBuffer),
    /// CUDA managed memory, valid on the host and on the device.
    Managed(ManagedBuffer),
}

impl UnifiedBuffer {
    /// Bytes requested at construction.
    pub fn len(&self) -> usize {
        match self {
            UnifiedBuffer::Host(b) => b.len(),
            UnifiedBuffer::Managed(b) => b.len(),
        }
    }

    /// Whether the buffer was created with length zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes reserved before any guard (a host-page multiple, `>= len()`).
    pub fn capacity(&self) -> usize {
        match self {
            UnifiedBuffer::Host(b) => b.capacity(),
            UnifiedBuffer::Managed(b) => b.capacity(),
        }
    }

    /// Base address; page-aligned and constant for the buffer's lifetime.
    pub fn as_ptr(&self) -> *const u8 {
        match self {
            UnifiedBuffer::Host(b) => b.as_ptr(),
            UnifiedBuffer::Managed(b) => b.as_ptr(),
        }
    }

    /// Mutable base address.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            UnifiedBuffer::Host(b) => b.as_mut_ptr(),
            UnifiedBuffer::Managed(b) => b.as_mut_ptr(),
        }
    }

    #[cfg(feature = "wasmtime")]
    pub(crate) fn base_ptr(&self) -> *mut u8 {
        match self {
            UnifiedBuffer::Host(b) => b.base_ptr(),
            UnifiedBuffer::Managed(b) => b.base_ptr(),
        }
    }

    /// The readable bytes (see [`GuardedHostBuffer::as_slice`]).
    pub fn as_slice(&self) -> &[u8] {
        match self {
            UnifiedBuffer::Host(b) => b.as_slice(),
            UnifiedBuffer::Managed(b) => b.as_slice(),
        }
    }

    /// The writable bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            UnifiedBuffer::Host(b) => b.as_mut_slice(),
            UnifiedBuffer::Managed(b) => b.as_mut_slice(),
        }
    }

    /// Whether kernels can address this buffer directly (CUDA managed memory).
    pub fn is_uvm_backed(&self) -> bool {
        matches!(self, UnifiedBuffer::Managed(_))
    }
}

impl From<GuardedHostBuffer> for UnifiedBuffer {
    fn from(buffer: GuardedHostBuffer) -> Self {
        UnifiedBuffer::Host(buffer)
    }
}

impl From<ManagedBuffer> for UnifiedBuffer {
    fn from(buffer: ManagedBuffer) -> Self {
        UnifiedBuffer::Managed(buffer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_variant_delegates() {
        let mut buf = UnifiedBuffer::from(GuardedHostBuffer::new(100, 0).unwrap());
        assert!(!buf.is_uvm_backed());
        assert_eq!(buf.len(), 100);
        assert_eq!(buf.capacity(), crate::host_page_size());
        buf.as_mut_slice()[99] = 1;
        assert_eq!(buf.as_slice().len(), 100);
        assert_eq!(buf.as_slice()[99], 1);
        assert_eq!(buf.as_ptr(), buf.as_mut_ptr().cast_const());
    }
}
