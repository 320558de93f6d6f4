//! A minimal ZIP reader for what `torch.save` writes: stored (uncompressed) entries, found through
//! the central directory, with the ZIP64 extensions a file over 4 GiB needs. Entries are byte
//! ranges of the input; nothing is copied or decompressed, and CRC-32s are not checked (torch.load
//! does not check them either, and `torch.serialization.set_crc32_options(False)` writes files
//! without them).

use std::collections::HashMap;

use super::shown_text;

/// Why an archive is not read: malformed (truncated, inconsistent), or well-formed but using a
/// ZIP feature torch.save never writes.
#[derive(Debug)]
pub(super) enum ZipError {
    Corrupt(String),
    Refused(String),
}

fn corrupt(message: impl Into<String>) -> ZipError {
    ZipError::Corrupt(message.into())
}

/// One stored entry: its name and where its bytes are in the archive.
#[derive(Debug)]
pub(super) struct Entry {
    pub name: String,
    pub start: usize,
    pub len: usize,
}

/// The entries of an archive, in central-directory order, with a name index.
#[derive(Debug)]
pub(super) struct Archive {
    pub entries: Vec<Entry>,
    index: HashMap<String, usize>,
}

impl Archive {
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.index.get(name).map(|&i| &self.entries[i])
    }
}

const LOCAL_HEADER: u32 = 0x0403_4b50;
const CENTRAL_HEADER: u32 = 0x0201_4b50;
const END_OF_CENTRAL_DIRECTORY: u32 = 0x0605_4b50;
const ZIP64_END_OF_CENTRAL_DIRECTORY: u32 = 0x0606_4b50;
const ZIP64_LOCATOR: u32 = 0x0706_4b50;
const ZIP64_EXTRA: u16 = 0x0001;
const CENTRAL_HEADER_LEN: usize = 46;
const EOCD_LEN: usize = 22;
const LOCATOR_LEN: usize = 20;
const ZIP64_EOCD_LEN: usize = 56;

/// Little-endian reads that fail instead of panicking past the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], at: usize) -> Self {
        Reader { bytes, at }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ZipError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| corrupt(format!("truncated {what}")))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u16(&mut self, what: &str) -> Result<u16, ZipError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32, ZipError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64, ZipError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

fn to_usize(v: u64, what: &str) -> Result<usize, ZipError> {
    usize::try_from(v).map_err(|_| corrupt(format!("{what} {v} does not fit this machine")))
}

/// Where the central directory is and how many entries it has.
struct Directory {
    offset: u64,
    size: u64,
    entries: u64,
}

/// Finds the end of central directory record (and its ZIP64 form when there is one).
fn directory(bytes: &[u8]) -> Result<Directory, ZipError> {
    // The record is 22 bytes plus a comment of at most 65535; torch writes no comment.
    let lowest = bytes.len().saturating_sub(EOCD_LEN + u16::MAX as usize);
    let mut found = None;
    let mut at = bytes.len().checked_sub(EOCD_LEN);
    while let Some(pos) = at {
        if pos < lowest {
            break;
        }
        let mut r = Reader::new(bytes, pos);
        if r.u32("end of central directory")? == END_OF_CENTRAL_DIRECTORY {
            let mut c = Reader::new(bytes, pos + 20);
            let comment = c.u16("end of central directory")? as usize;
            if pos + EOCD_LEN + comment == bytes.len() {
                found = Some(pos);
                break;
            }
        }
        at = pos.checked_sub(1);
    }
    let pos = found.ok_or_else(|| {
        corrupt("no end of central directory record: not a zip archive, or truncated")
    })?;
    let mut r = Reader::new(bytes, pos + 4);
    let disk = r.u16("end of central directory")?;
    let directory_disk = r.u16("end of central directory")?;
    let _entries_here = r.u16("end of central directory")?;
    let entries = r.u16("end of central directory")?;
    let size = r.u32("end of central directory")?;
    let offset = r.u32("end of central directory")?;
    // A ZIP64 locator sits right before the record (torch writes one in every archive).
    if let Some(locator) = pos.checked_sub(LOCATOR_LEN) {
        let mut l = Reader::new(bytes, locator);
        if l.u32("ZIP64 locator")? == ZIP64_LOCATOR {
            let zip64_disk = l.u32("ZIP64 locator")?;
            let record = l.u64("ZIP64 locator")?;
            let disks = l.u32("ZIP64 locator")?;
            if zip64_disk != 0 || disks > 1 {
                return Err(ZipError::Refused(format!(
                    "a multi-volume zip archive ({disks} disks)"
                )));
            }
            let record = to_usize(record, "ZIP64 end of central directory offset")?;
            if record
                .checked_add(ZIP64_EOCD_LEN)
                .is_none_or(|end| end > locator)
            {
                return Err(corrupt(
                    "the ZIP64 end of central directory record is out of bounds",
                ));
            }
            let mut z = Reader::new(bytes, record);
            if z.u32("ZIP64 end of central directory")? != ZIP64_END_OF_CENTRAL_DIRECTORY {
                return Err(corrupt(
                    "no ZIP64 end of central directory record where the locator points",
                ));
            }
            let _record_size = z.u64("ZIP64 end of central directory")?;
            let _made_by = z.u16("ZIP64 end of central directory")?;
            let _needed = z.u16("ZIP64 end of central directory")?;
            let disk = z.u32("ZIP64 end of central directory")?;
            let directory_disk = z.u32("ZIP64 end of central directory")?;
            let _entries_here = z.u64("ZIP64 end of central directory")?;
            let entries = z.u64("ZIP64 end of central directory")?;
            let size = z.u64("ZIP64 end of central directory")?;
            let offset = z.u64("ZIP64 end of central directory")?;
            if disk != 0 || directory_disk != 0 {
                return Err(ZipError::Refused("a multi-volume zip archive".into()));
            }
            return Ok(Directory {
                offset,
                size,
                entries,
            });
        }
    }
    if disk != 0 || directory_disk != 0 {
        return Err(ZipError::Refused("a multi-volume zip archive".into()));
    }
    if entries == u16::MAX || size == u32::MAX || offset == u32::MAX {
        return Err(corrupt(
            "the end of central directory record needs ZIP64 values, and there is no ZIP64 record",
        ));
    }
    Ok(Directory {
        offset: offset.into(),
        size: size.into(),
        entries: entries.into(),
    })
}

/// Reads the central directory and every entry's local header.
pub(super) fn parse(bytes: &[u8]) -> Result<Archive, ZipError> {
    let dir = directory(bytes)?;
    let start = to_usize(dir.offset, "central directory offset")?;
    let size = to_usize(dir.size, "central directory size")?;
    let end = start
        .checked_add(size)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| corrupt("the central directory is out of bounds"))?;
    let fits = (size / CENTRAL_HEADER_LEN) as u64;
    if dir.entries > fits {
        return Err(corrupt(format!(
            "the central directory says {} entries, but {size} bytes hold at most {fits}",
            dir.entries
        )));
    }
    let count = dir.entries as usize;
    let mut entries = Vec::with_capacity(count);
    let mut index = HashMap::with_capacity(count);
    let mut r = Reader::new(&bytes[..end], start);
    for n in 0..count {
        let entry = central_entry(bytes, &mut r, n)?;
        if index.insert(entry.name.clone(), entries.len()).is_some() {
            return Err(corrupt(format!(
                "two entries are named `{}`",
                shown_text(&entry.name)
            )));
        }
        entries.push(entry);
    }
    Ok(Archive { entries, index })
}

fn central_entry(bytes: &[u8], r: &mut Reader, n: usize) -> Result<Entry, ZipError> {
    let what = "central directory entry";
    if r.u32(what)? != CENTRAL_HEADER {
        return Err(corrupt(format!(
            "central directory entry {n} has no header signature"
        )));
    }
    let _made_by = r.u16(what)?;
    let _needed = r.u16(what)?;
    let flags = r.u16(what)?;
    let method = r.u16(what)?;
    let _time = r.u16(what)?;
    let _date = r.u16(what)?;
    let _crc = r.u32(what)?;
    let compressed = r.u32(what)?;
    let uncompressed = r.u32(what)?;
    let name_len = r.u16(what)? as usize;
    let extra_len = r.u16(what)? as usize;
    let comment_len = r.u16(what)? as usize;
    let disk = r.u16(what)?;
    let _internal = r.u16(what)?;
    let _external = r.u32(what)?;
    let local = r.u32(what)?;
    let name_bytes = r.take(name_len, what)?;
    let extra = r.take(extra_len, what)?;
    r.take(comment_len, what)?;
    let name = String::from_utf8_lossy(name_bytes).into_owned();
    let shown = shown_text(&name);

    // The ZIP64 extra field holds, in this order, the values whose fields above are saturated.
    let mut uncompressed = u64::from(uncompressed);
    let mut compressed = u64::from(compressed);
    let mut local = u64::from(local);
    let mut disk = u32::from(disk);
    let zip64 =
        extra_field(extra, ZIP64_EXTRA).map_err(|m| corrupt(format!("entry `{shown}`: {m}")))?;
    let saturated = [
        uncompressed == u64::from(u32::MAX),
        compressed == u64::from(u32::MAX),
        local == u64::from(u32::MAX),
        disk == u32::from(u16::MAX),
    ];
    if saturated.iter().any(|&s| s) {
        let data = zip64.ok_or_else(|| {
            corrupt(format!(
                "entry `{shown}` needs ZIP64 sizes or offset, and has no ZIP64 extra field"
            ))
        })?;
        let mut z = Reader::new(data, 0);
        let zwhat = "ZIP64 extra field";
        if saturated[0] {
            uncompressed = z.u64(zwhat).map_err(|_| short_zip64(&shown))?;
        }
        if saturated[1] {
            compressed = z.u64(zwhat).map_err(|_| short_zip64(&shown))?;
        }
        if saturated[2] {
            local = z.u64(zwhat).map_err(|_| short_zip64(&shown))?;
        }
        if saturated[3] {
            disk = z.u32(zwhat).map_err(|_| short_zip64(&shown))?;
        }
    }
    if flags & 0x0001 != 0 || flags & 0x0040 != 0 {
        return Err(ZipError::Refused(format!(
            "entry `{shown}` is encrypted; torch.save never encrypts"
        )));
    }
    if method != 0 {
        let kind = match method {
            8 => " (deflate)",
            9 => " (deflate64)",
            12 => " (bzip2)",
            14 => " (lzma)",
            93 => " (zstd)",
            _ => "",
        };
        return Err(ZipError::Refused(format!(
            "entry `{shown}` is compressed (method {method}{kind}); torch.save stores entries \
             uncompressed, and this reader reads only stored entries (re-save the checkpoint \
             with torch.save instead of re-zipping it)"
        )));
    }
    if disk != 0 {
        return Err(ZipError::Refused(format!(
            "entry `{shown}` is on disk {disk} of a multi-volume archive"
        )));
    }
    if compressed != uncompressed {
        return Err(corrupt(format!(
            "entry `{shown}` is stored but its compressed size {compressed} differs from its \
             size {uncompressed}"
        )));
    }

    // The local header: its name and extra field come before the data (torch pads the extra
    // field so the data is aligned). Its sizes may be zero (they follow in a data descriptor);
    // the central directory's are the ones used.
    let at = to_usize(local, "local header offset")?;
    let mut l = Reader::new(bytes, at);
    let lwhat = "local header";
    let bad_local = |m: &str| corrupt(format!("entry `{shown}`: {m}"));
    if l.u32(lwhat)
        .map_err(|_| bad_local("truncated local header"))?
        != LOCAL_HEADER
    {
        return Err(bad_local(
            "no local header where the central directory points",
        ));
    }
    let _needed = l
        .u16(lwhat)
        .map_err(|_| bad_local("truncated local header"))?;
    let local_flags = l
        .u16(lwhat)
        .map_err(|_| bad_local("truncated local header"))?;
    let local_method = l
        .u16(lwhat)
        .map_err(|_| bad_local("truncated local header"))?;
    l.take(16, lwhat)
        .map_err(|_| bad_local("truncated local header"))?;
    let local_name_len = l
        .u16(lwhat)
        .map_err(|_| bad_local("truncated local header"))? as usize;
    let local_extra_len = l
        .u16(lwhat)
        .map_err(|_| bad_local("truncated local header"))? as usize;
    let local_name = l
        .take(local_name_len, lwhat)
        .map_err(|_| bad_local("truncated local header"))?;
    l.take(local_extra_len, lwhat)
        .map_err(|_| bad_local("truncated local header"))?;
    if local_name != name_bytes {
        return Err(bad_local(&format!(
            "the local header names `{}`",
            shown_text(&String::from_utf8_lossy(local_name))
        )));
    }
    if local_method != method || (local_flags ^ flags) & 0x0041 != 0 {
        return Err(bad_local(
            "the local header's method or encryption flags differ from the central directory's",
        ));
    }
    let start = l.at;
    let len = to_usize(uncompressed, "entry size")?;
    if start.checked_add(len).is_none_or(|end| end > bytes.len()) {
        return Err(bad_local(&format!(
            "its {len} bytes at offset {start} run past the end of the file ({} bytes): \
             truncated",
            bytes.len()
        )));
    }
    Ok(Entry { name, start, len })
}

fn short_zip64(shown: &str) -> ZipError {
    corrupt(format!(
        "entry `{shown}`: the ZIP64 extra field is too short"
    ))
}

/// The data of the extra field with header `id`, if present.
fn extra_field(extra: &[u8], id: u16) -> Result<Option<&[u8]>, String> {
    let mut r = Reader::new(extra, 0);
    while r.at < extra.len() {
        let header = r.u16("extra field").map_err(|_| "truncated extra field")?;
        let size = r.u16("extra field").map_err(|_| "truncated extra field")? as usize;
        let data = r
            .take(size, "extra field")
            .map_err(|_| "truncated extra field")?;
        if header == id {
            return Ok(Some(data));
        }
    }
    Ok(None)
}
