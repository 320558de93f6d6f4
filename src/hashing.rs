//! sha256 for provenance: of files and of bytes, as lowercase hex.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Lowercase hex of a digest.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The sha256 of some bytes.
pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The sha256 of a file, read through a read-only map (no copy into a buffer: hashing a
/// multi-gigabyte source spent as long copying as hashing).
pub fn sha256_file(path: &Path) -> Result<String> {
    let len = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len();
    if len == 0 {
        return Ok(sha256_bytes(&[])); // an empty file cannot be mapped
    }
    let map = crate::checkpoint::mmap_file(path)?;
    Ok(sha256_bytes(&map))
}
