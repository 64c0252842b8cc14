//! A structural check of tenant cubin images before the CUDA driver parses them.
//!
//! `cuModuleLoadData` takes a bare pointer, no length: the driver finds the image's extent from
//! its ELF headers. So before a tenant image reaches it, this checks that it is a 64-bit
//! little-endian ELF file for CUDA (`EM_CUDA`) whose program headers, section headers and
//! section contents all lie inside the bytes given.

use crate::GpuError;

/// `e_machine` of CUDA device code.
const EM_CUDA: u16 = 190;
/// Section type without file contents.
const SHT_NOBITS: u32 = 8;
const ELF64_HEADER_BYTES: usize = 64;
const ELF64_SECTION_HEADER_BYTES: u64 = 64;
const ELF64_PROGRAM_HEADER_BYTES: u64 = 56;
/// Most section or program headers accepted (real cubins have a few dozen).
const MAX_HEADERS: u64 = 1 << 16;

/// Checks that `image` is a well-formed CUDA ELF image (see the module docs).
pub(crate) fn check_cubin(image: &[u8]) -> Result<(), GpuError> {
    let invalid = |why: String| GpuError::InvalidArgument(format!("not a CUDA cubin: {why}"));
    if image.len() < ELF64_HEADER_BYTES || image[..4] != *b"\x7fELF" {
        return Err(invalid(String::from(
            "no ELF header (a cubin starts with \\x7fELF)",
        )));
    }
    if image[4] != 2 || image[5] != 1 {
        return Err(invalid(String::from(
            "only 64-bit little-endian ELF images are accepted",
        )));
    }
    let machine = read_u16(image, 0x12);
    if machine != Some(EM_CUDA) {
        return Err(invalid(format!(
            "ELF machine is {machine:?}, CUDA is {EM_CUDA}"
        )));
    }
    let table = |what: &str, offset_at: usize, entry_size_at: usize, count_at: usize, min: u64| {
        let offset = read_u64(image, offset_at).unwrap_or(u64::MAX);
        let entry_size = read_u16(image, entry_size_at).map_or(0, u64::from);
        let count = read_u16(image, count_at).map_or(0, u64::from);
        if count == 0 {
            return Ok((offset, entry_size, 0));
        }
        if entry_size < min || count > MAX_HEADERS {
            return Err(invalid(format!(
                "{count} {what} headers of {entry_size} bytes"
            )));
        }
        check_range(image.len(), offset, entry_size * count)
            .map_err(|()| invalid(format!("{what} header table lies outside the image")))?;
        Ok((offset, entry_size, count))
    };
    table("program", 0x20, 0x36, 0x38, ELF64_PROGRAM_HEADER_BYTES)?;
    let (sections_at, section_size, sections) =
        table("section", 0x28, 0x3A, 0x3C, ELF64_SECTION_HEADER_BYTES)?;
    for index in 0..sections {
        // Inside the image: the whole table was checked above.
        let header = (sections_at + index * section_size) as usize;
        let kind = read_u32(image, header + 4).unwrap_or(0);
        if kind == SHT_NOBITS {
            continue;
        }
        let offset = read_u64(image, header + 0x18).unwrap_or(u64::MAX);
        let size = read_u64(image, header + 0x20).unwrap_or(u64::MAX);
        check_range(image.len(), offset, size)
            .map_err(|()| invalid(format!("section {index} lies outside the image")))?;
    }
    Ok(())
}

/// `offset..offset + len` inside `0..image_len`, overflow-safe.
fn check_range(image_len: usize, offset: u64, len: u64) -> Result<(), ()> {
    match offset.checked_add(len) {
        Some(end) if end <= image_len as u64 => Ok(()),
        _ => Err(()),
    }
}

fn read_u16(image: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(image.get(at..at + 2)?.try_into().ok()?))
}

fn read_u32(image: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(image.get(at..at + 4)?.try_into().ok()?))
}

fn read_u64(image: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(image.get(at..at + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A minimal CUDA ELF image: header, one program header, and `sections` section headers
    /// each describing `section_bytes` bytes at offset 0.
    pub(crate) fn tiny_cubin(sections: u16, section_bytes: u64) -> Vec<u8> {
        let mut image = vec![0u8; 64];
        image[..4].copy_from_slice(b"\x7fELF");
        image[4] = 2;
        image[5] = 1;
        image[0x12..0x14].copy_from_slice(&EM_CUDA.to_le_bytes());
        let program_at = image.len() as u64;
        image.extend_from_slice(&[0u8; 56]);
        let sections_at = image.len() as u64;
        for _ in 0..sections {
            let mut header = [0u8; 64];
            header[4..8].copy_from_slice(&1u32.to_le_bytes());
            header[0x20..0x28].copy_from_slice(&section_bytes.to_le_bytes());
            image.extend_from_slice(&header);
        }
        image[0x20..0x28].copy_from_slice(&program_at.to_le_bytes());
        image[0x28..0x30].copy_from_slice(&sections_at.to_le_bytes());
        image[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        image[0x38..0x3A].copy_from_slice(&1u16.to_le_bytes());
        image[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
        image[0x3C..0x3E].copy_from_slice(&sections.to_le_bytes());
        image
    }

    #[test]
    fn accepts_a_well_formed_image_and_refuses_broken_ones() {
        let good = tiny_cubin(3, 16);
        assert_eq!(check_cubin(&good), Ok(()));
        let refused = |image: &[u8]| matches!(check_cubin(image), Err(GpuError::InvalidArgument(m)) if m.starts_with("not a CUDA cubin"));
        assert!(refused(b""));
        assert!(refused(b"\x7fELF"));
        assert!(refused(
            b"// PTX text, not a cubin .............................................."
        ));
        // A section whose contents reach past the end.
        assert!(refused(&tiny_cubin(2, good.len() as u64 * 2)));
        // Truncated: the section header table is cut off.
        assert!(refused(&good[..good.len() - 1]));
        // Another machine, 32-bit, big-endian.
        for (at, value) in [(0x12, 62u8), (4, 1), (5, 2)] {
            let mut other = good.clone();
            other[at] = value;
            assert!(refused(&other), "byte {at:#x} = {value}");
        }
        // A section offset that overflows.
        let mut overflow = good.clone();
        let first_section = 64 + 56;
        overflow[first_section + 0x18..first_section + 0x20]
            .copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(refused(&overflow));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
            patch_header in any::<bool>(),
        ) {
            let mut image = bytes;
            if patch_header && image.len() >= 64 {
                image[..4].copy_from_slice(b"\x7fELF");
                image[4] = 2;
                image[5] = 1;
                image[0x12..0x14].copy_from_slice(&EM_CUDA.to_le_bytes());
            }
            let _ = check_cubin(&image);
        }

        #[test]
        fn corrupting_a_good_image_is_caught_or_harmless(at in 0usize..64 + 56 + 3 * 64, value in any::<u8>()) {
            let mut image = tiny_cubin(3, 16);
            image[at] = value;
            if check_cubin(&image).is_ok() {
                // Whatever was accepted still has every table and section inside the image.
                let sections_at = read_u64(&image, 0x28).unwrap();
                let count = u64::from(read_u16(&image, 0x3C).unwrap());
                let size = u64::from(read_u16(&image, 0x3A).unwrap());
                prop_assert!(count == 0 || sections_at + count * size <= image.len() as u64);
            }
        }
    }
}
