//! The output protocol (docs/format.md, "Output protocol"): everything is written into a
//! temporary directory beside the destination and moved into place in one atomic step, so a
//! reader never sees a half-written checkpoint, a run never removes what it did not create, and
//! `--overwrite` replaces only a directory this tool wrote.
//!
//! For a destination `DIR/NAME`, a run uses, beside it in `DIR`:
//! - `.NAME.lock`: held (`flock`, exclusive) from [`StagedDir::create`] until the run ends, so
//!   two runs into one destination never overlap; holds the PID of the run that holds it.
//! - `.NAME.partial-PID`: the directory the run writes into, renamed to `NAME` on commit.
//!
//! Every output carries [`MARKER_FILE`]; `--overwrite` replaces only a real directory that has
//! it, an empty directory, or an output of an earlier version (see [`Existing`]).

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::{Component, Path, PathBuf};

use super::{CONFIG_FILE, REPORT_FILE, SMOOTHING_FACTORS_FILE, TOKENIZER_DIR, WEIGHTS_FILE};
use crate::error::{Error, Result};

/// The file written into every output directory: what lets `--overwrite` replace it.
pub const MARKER_FILE: &str = ".oasr-quantize-output";

/// The marker's content: fixed, so outputs stay byte-identical across runs.
const MARKER_TEXT: &str =
    "This directory was written by oasr-quantize; `oasr-quantize --overwrite` may replace it.\n";

/// What an output directory written by a version before the marker holds (docs/format.md).
const LEGACY_ENTRIES: [&str; 5] = [
    CONFIG_FILE,
    WEIGHTS_FILE,
    REPORT_FILE,
    SMOOTHING_FACTORS_FILE,
    TOKENIZER_DIR,
];

/// A temporary directory that becomes the destination on [`StagedDir::commit`] and is removed if
/// dropped uncommitted. It holds the destination's lock for its whole life.
#[derive(Debug)]
pub struct StagedDir {
    tmp: PathBuf,
    dst: PathBuf,
    overwrite: bool,
    committed: bool,
    // Declared last: released after the temporary directory is removed.
    _lock: Lock,
}

/// What is at the destination path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Existing {
    Absent,
    /// A directory `--overwrite` may replace: one with [`MARKER_FILE`], an empty one, or an
    /// output of an earlier version (a real `oasr_config.json` and nothing but
    /// [`LEGACY_ENTRIES`], `tokenizer/` holding only files).
    Replaceable,
}

impl StagedDir {
    /// Checks the destination against the inputs, takes its lock and creates the temporary
    /// directory (with the marker in it).
    ///
    /// Refused, before anything is created: an output that is, contains or lies inside an input;
    /// an existing output unless `overwrite`; with `overwrite`, a symbolic link, a file, or a
    /// directory this tool did not write. Refused after creating the missing parent directories:
    /// a destination another run holds the lock of.
    pub fn create(dst: &Path, overwrite: bool, inputs: &[&Path]) -> Result<Self> {
        let refuse = |message: String| {
            Err(Error::Output {
                path: dst.into(),
                message,
            })
        };
        let resolved = resolve(dst)?;
        for input in inputs {
            let input = input.canonicalize().map_err(|e| Error::io(input, e))?;
            if resolved == input {
                return refuse(format!("is the input {}", crate::error::shown(&input)));
            }
            if resolved.starts_with(&input) {
                return refuse(format!(
                    "lies inside the input {}",
                    crate::error::shown(&input)
                ));
            }
            if input.starts_with(&resolved) {
                return refuse(format!(
                    "contains the input {}",
                    crate::error::shown(&input)
                ));
            }
        }
        let (parent, name) = split(&resolved)?;
        // Checked before anything is created, and again under the lock.
        existing(dst, &resolved, overwrite)?;
        std::fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
        let lock = Lock::acquire(&parent.join(format!(".{name}.lock")), dst)?;
        existing(dst, &resolved, overwrite)?;
        remove_stale(&parent, &name);
        let tmp = parent.join(format!(".{name}.partial-{}", std::process::id()));
        std::fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let staged = StagedDir {
            tmp,
            dst: resolved,
            overwrite,
            committed: false,
            _lock: lock,
        };
        let marker = staged.tmp.join(MARKER_FILE);
        std::fs::write(&marker, MARKER_TEXT).map_err(|e| Error::io(&marker, e))?;
        Ok(staged)
    }

    /// The temporary directory to write into.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// The final destination.
    pub fn destination(&self) -> &Path {
        &self.dst
    }

    /// Moves the temporary directory into place in one atomic step.
    ///
    /// A destination that appeared meanwhile is left as it is and the run fails, unless
    /// `overwrite` and it is one `--overwrite` may replace: then old and new are exchanged
    /// atomically (the destination is at every instant the old output or the new one) and the
    /// old one is removed.
    pub fn commit(mut self) -> Result<PathBuf> {
        let appeared = |e: std::io::Error| -> Error {
            if e.kind() == ErrorKind::AlreadyExists || e.kind() == ErrorKind::DirectoryNotEmpty {
                Error::Output {
                    path: self.dst.clone(),
                    message: "appeared while this run was writing it and was left as it is; \
                              the new output was discarded"
                        .into(),
                }
            } else {
                Error::io(&self.dst, e)
            }
        };
        let state = if self.overwrite {
            existing(&self.dst, &self.dst, true)?
        } else {
            Existing::Absent
        };
        match state {
            Existing::Absent => sys::rename_noreplace(&self.tmp, &self.dst).map_err(appeared)?,
            Existing::Replaceable => {
                let (_, name) = split(&self.dst)?;
                let aside = self
                    .tmp
                    .with_file_name(format!(".{name}.old-{}", std::process::id()));
                let old = sys::replace(&self.tmp, &self.dst, &aside)
                    .map_err(|e| Error::io(&self.dst, e))?;
                // The new output is in place; what is left is the old one, under a name the
                // next run into this destination removes if this fails.
                self.committed = true;
                remove_any(&old).map_err(|e| Error::Output {
                    path: self.dst.clone(),
                    message: format!(
                        "was replaced, but the previous output could not be removed from {}: {e}",
                        crate::error::shown(&old)
                    ),
                })?;
            }
        }
        self.committed = true;
        Ok(self.dst.clone())
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: a failure here leaves a `.partial-PID` the next run removes.
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

/// An absolute, symlink-resolved form of `path`, which need not exist: the longest existing
/// ancestor is canonicalized and the rest appended. Creates nothing. The final component is
/// never resolved (a symbolic link there is refused by [`existing`], not followed).
fn resolve(path: &Path) -> Result<PathBuf> {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        let cwd = std::env::current_dir().map_err(|e| Error::io(".", e))?;
        cwd.join(path)
    };
    let Some(name) = absolute.file_name().map(|n| n.to_os_string()) else {
        // `.`, `..`, `/`: an existing directory (or a refusal from canonicalize).
        return absolute.canonicalize().map_err(|e| Error::io(path, e));
    };
    let parent = absolute.parent().unwrap_or(Path::new("/"));
    let mut missing = Vec::new();
    let mut ancestor = parent;
    let base = loop {
        match ancestor.symlink_metadata() {
            Ok(_) => {
                break ancestor
                    .canonicalize()
                    .map_err(|e| Error::io(ancestor, e))?
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                missing.extend(ancestor.components().next_back());
                ancestor = ancestor.parent().ok_or_else(|| Error::io(path, e))?;
            }
            Err(e) => return Err(Error::io(ancestor, e)),
        }
    };
    // A component that does not exist cannot be a link, so `..` after it is lexical.
    let mut out = base;
    for c in missing.iter().rev() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out.push(name);
    Ok(out)
}

/// The parent directory and final name of a resolved destination.
fn split(resolved: &Path) -> Result<(PathBuf, String)> {
    match (resolved.parent(), resolved.file_name()) {
        (Some(parent), Some(name)) => Ok((parent.to_path_buf(), name.to_string_lossy().into())),
        _ => Err(Error::Output {
            path: resolved.into(),
            message: "is the filesystem root".into(),
        }),
    }
}

/// What is at the destination, or why it may not be written: anything existing without
/// `overwrite`; with it, anything but a directory [`Existing::Replaceable`] describes.
fn existing(dst: &Path, resolved: &Path, overwrite: bool) -> Result<Existing> {
    let refuse = |message: &str| {
        Err(Error::Output {
            path: dst.into(),
            message: message.into(),
        })
    };
    let meta = match resolved.symlink_metadata() {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Existing::Absent),
        Err(e) => return Err(Error::io(dst, e)),
    };
    if !overwrite {
        return refuse("already exists; pass --overwrite to replace it");
    }
    if meta.file_type().is_symlink() {
        return refuse(
            "is a symbolic link; --overwrite never replaces a link or writes through one \
             (remove the link, or name the directory it points to)",
        );
    }
    if !meta.is_dir() {
        return refuse(
            "is not a directory; --overwrite replaces only an output directory of oasr-quantize",
        );
    }
    if replaceable(resolved).map_err(|e| Error::io(dst, e))? {
        Ok(Existing::Replaceable)
    } else {
        refuse(&format!(
            "is a directory oasr-quantize did not write (it has no {MARKER_FILE}, is not empty \
             and is not an output of an earlier version); --overwrite refuses to replace it: \
             remove it yourself or choose another output"
        ))
    }
}

/// Whether a real directory is one `--overwrite` may replace ([`Existing::Replaceable`]).
fn replaceable(dir: &Path) -> std::io::Result<bool> {
    if dir
        .join(MARKER_FILE)
        .symlink_metadata()
        .is_ok_and(|m| m.is_file())
    {
        return Ok(true);
    }
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let kind = entry.file_type()?;
        let known = if name == TOKENIZER_DIR {
            kind.is_dir() && only_files(&entry.path())?
        } else {
            kind.is_file() && LEGACY_ENTRIES.contains(&name.as_str())
        };
        if !known {
            return Ok(false);
        }
        names.push(name);
    }
    Ok(names.is_empty() || names.iter().any(|n| n == CONFIG_FILE))
}

fn only_files(dir: &Path) -> std::io::Result<bool> {
    for entry in std::fs::read_dir(dir)? {
        if !entry?.file_type()?.is_file() {
            return Ok(false);
        }
    }
    Ok(true)
}

fn remove_any(path: &Path) -> std::io::Result<()> {
    match path.symlink_metadata() {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The PID of this tool's temporary `name` for the destination `dst_name`:
/// `.DST.partial-PID` or `.DST.old-PID`.
fn debris_pid(name: &str, dst_name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?.strip_prefix(dst_name)?;
    let pid = rest
        .strip_prefix(".partial-")
        .or_else(|| rest.strip_prefix(".old-"))?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Removes, best effort, the temporaries of earlier runs into `dir/name` whose process is gone
/// (killed). Called under the destination's lock, so a temporary with this process's own PID is
/// one of a dead process that had it before. A live PID's are never touched.
fn remove_stale(dir: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let own = std::process::id();
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = debris_pid(&file_name, name) {
            if pid == own || !sys::alive(pid) {
                let _ = remove_any(&entry.path());
            }
        }
    }
}

/// The destination's lock: `.NAME.lock`, `flock`ed exclusively, with the holder's PID in it.
/// Removed when released (a run that finds it without a holder, after a kill, takes it).
#[derive(Debug)]
struct Lock {
    path: PathBuf,
    file: Option<File>,
}

impl Lock {
    fn acquire(path: &Path, dst: &Path) -> Result<Lock> {
        loop {
            let mut options = OpenOptions::new();
            options.read(true).write(true).create(true).truncate(false);
            // Never through a link planted at the lock's name.
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NOFOLLOW);
            let mut file = options.open(path).map_err(|e| Error::io(path, e))?;
            match sys::try_lock(&file) {
                Ok(true) => {}
                Ok(false) => {
                    let mut text = String::new();
                    let _ = file.read_to_string(&mut text);
                    let pid = match text.trim() {
                        "" => "pid unknown".to_string(),
                        pid => format!("pid {pid}"),
                    };
                    return Err(Error::Output {
                        path: dst.into(),
                        message: format!(
                            "another oasr-quantize run is writing it ({pid}; lock {}); wait for \
                             it to finish",
                            crate::error::shown(path)
                        ),
                    });
                }
                Err(e) => return Err(Error::io(path, e)),
            }
            // The holder before us removes the file before releasing it: the lock counts only
            // if the path still names the file that was locked.
            if !sys::same_file(&file, path) {
                continue;
            }
            file.set_len(0).map_err(|e| Error::io(path, e))?;
            file.write_all(format!("{}\n", std::process::id()).as_bytes())
                .map_err(|e| Error::io(path, e))?;
            return Ok(Lock {
                path: path.into(),
                file: Some(file),
            });
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Removed while still held, then released when the file closes.
        let _ = std::fs::remove_file(&self.path);
        self.file.take();
    }
}

#[cfg(unix)]
mod sys {
    use std::fs::File;
    use std::io;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::io::AsRawFd;
    use std::path::{Path, PathBuf};

    fn cstr(path: &Path) -> io::Result<std::ffi::CString> {
        std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
    }

    /// `flock(LOCK_EX | LOCK_NB)`: `Ok(false)` when another holds it.
    pub fn try_lock(file: &File) -> io::Result<bool> {
        loop {
            // SAFETY: flock on a file descriptor this function borrows for the call.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(true);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) => return Ok(false),
                _ => return Err(e),
            }
        }
    }

    /// Whether `path` names the open `file` (same device and inode).
    pub fn same_file(file: &File, path: &Path) -> bool {
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }

    /// Whether process `pid` exists (`kill(pid, 0)`; EPERM: it exists, as another user's).
    pub fn alive(pid: u32) -> bool {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return true;
        };
        if pid <= 0 {
            return true;
        }
        // SAFETY: signal 0 sends nothing; it only checks that the process exists.
        if unsafe { libc::kill(pid, 0) } == 0 {
            return true;
        }
        io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }

    #[cfg(target_os = "linux")]
    fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
        let (from, to) = (cstr(from)?, cstr(to)?);
        // SAFETY: renameat2 with two NUL-terminated paths that live across the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                flags,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// A filesystem (or kernel) without renameat2's flags.
    #[cfg(target_os = "linux")]
    fn unsupported(e: &io::Error) -> bool {
        matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS))
    }

    /// Renames the directory `from` to `to`, failing (EEXIST or ENOTEMPTY) if `to` exists.
    pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        match renameat2(from, to, libc::RENAME_NOREPLACE) {
            Err(e) if unsupported(&e) => {}
            done => return done,
        }
        // Without RENAME_NOREPLACE: claim `to` with an exclusive mkdir, then rename onto the
        // empty directory just made (rename(2) fails on a non-empty one).
        std::fs::create_dir(to)?;
        std::fs::rename(from, to).inspect_err(|_| {
            let _ = std::fs::remove_dir(to);
        })
    }

    /// Puts the directory `new` at `dst` in place of the existing `dst`, and returns where the
    /// old one now is: `new`'s path after an atomic exchange, or `aside` where the filesystem
    /// cannot exchange (then `dst` is briefly absent between two renames).
    pub fn replace(new: &Path, dst: &Path, aside: &Path) -> io::Result<PathBuf> {
        #[cfg(target_os = "linux")]
        match renameat2(new, dst, libc::RENAME_EXCHANGE) {
            Err(e) if unsupported(&e) => {}
            Err(e) => return Err(e),
            Ok(()) => return Ok(new.to_path_buf()),
        }
        std::fs::rename(dst, aside)?;
        if let Err(e) = rename_noreplace(new, dst) {
            let _ = std::fs::rename(aside, dst);
            return Err(e);
        }
        Ok(aside.to_path_buf())
    }
}

#[cfg(not(unix))]
mod sys {
    use std::fs::File;
    use std::io;
    use std::path::{Path, PathBuf};

    /// No advisory lock on this platform: concurrent runs are not detected.
    pub fn try_lock(_: &File) -> io::Result<bool> {
        Ok(true)
    }

    pub fn same_file(_: &File, path: &Path) -> bool {
        path.exists()
    }

    /// Unknown: the temporaries of other processes are never removed.
    pub fn alive(_: u32) -> bool {
        true
    }

    pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
        if to.symlink_metadata().is_ok() {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        std::fs::rename(from, to)
    }

    pub fn replace(new: &Path, dst: &Path, aside: &Path) -> io::Result<PathBuf> {
        std::fs::rename(dst, aside)?;
        if let Err(e) = std::fs::rename(new, dst) {
            let _ = std::fs::rename(aside, dst);
            return Err(e);
        }
        Ok(aside.to_path_buf())
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn write_output(dst: &Path, overwrite: bool, content: &str) -> Result<PathBuf> {
        let staged = StagedDir::create(dst, overwrite, &[])?;
        std::fs::write(staged.path().join(CONFIG_FILE), content).unwrap();
        staged.commit()
    }

    #[test]
    fn resolve_creates_nothing_and_handles_dots() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().canonicalize().unwrap();
        let r = resolve(&base.join("a/b/../c/d")).unwrap();
        assert_eq!(r, base.join("a/c/d"));
        assert!(names(&base).is_empty());
        std::fs::create_dir(base.join("real")).unwrap();
        std::os::unix::fs::symlink(base.join("real"), base.join("link")).unwrap();
        // Links above the final component are resolved, the final one is not.
        assert_eq!(resolve(&base.join("link/x")).unwrap(), base.join("real/x"));
        assert_eq!(resolve(&base.join("link")).unwrap(), base.join("link"));
        assert_eq!(resolve(&base.join("real/..")).unwrap(), base);
    }

    #[test]
    fn refused_runs_create_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let e = StagedDir::create(&src.join("a/b/c"), false, &[&src]).unwrap_err();
        assert!(e.to_string().contains("lies inside the input"), "{e}");
        assert!(names(&src).is_empty());
        let e = StagedDir::create(tmp.path(), true, &[&src]).unwrap_err();
        assert!(e.to_string().contains("contains the input"), "{e}");
        // An existing output without overwrite: refused before the lock is taken.
        std::fs::create_dir(tmp.path().join("q")).unwrap();
        let e = StagedDir::create(&tmp.path().join("q"), false, &[&src]).unwrap_err();
        assert!(e.to_string().contains("--overwrite"), "{e}");
        assert_eq!(names(tmp.path()), ["q", "src"]);
    }

    #[test]
    fn outputs_carry_the_marker_and_leave_nothing_beside() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("out/q");
        let done = write_output(&dst, false, "1").unwrap();
        assert_eq!(done, tmp.path().canonicalize().unwrap().join("out/q"));
        assert_eq!(names(&dst), [MARKER_FILE, CONFIG_FILE]);
        assert_eq!(
            std::fs::read_to_string(dst.join(MARKER_FILE)).unwrap(),
            MARKER_TEXT
        );
        assert_eq!(names(&tmp.path().join("out")), ["q"]);
        write_output(&dst, true, "2").unwrap();
        assert_eq!(std::fs::read_to_string(dst.join(CONFIG_FILE)).unwrap(), "2");
        assert_eq!(names(&tmp.path().join("out")), ["q"]);
        // Dropped uncommitted: nothing left, not even the lock.
        let staged = StagedDir::create(&tmp.path().join("out/r"), false, &[]).unwrap();
        assert_eq!(names(&tmp.path().join("out")).len(), 3);
        drop(staged);
        assert_eq!(names(&tmp.path().join("out")), ["q"]);
    }

    #[test]
    fn a_destination_that_appears_meanwhile_is_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("q");
        for made in ["empty dir", "dir", "file"] {
            let staged = StagedDir::create(&dst, false, &[]).unwrap();
            std::fs::write(staged.path().join(CONFIG_FILE), "new").unwrap();
            match made {
                "empty dir" => std::fs::create_dir(&dst).unwrap(),
                "dir" => {
                    std::fs::create_dir(&dst).unwrap();
                    std::fs::write(dst.join("sentinel"), "mine").unwrap();
                }
                _ => std::fs::write(&dst, "mine").unwrap(),
            }
            let e = staged.commit().unwrap_err();
            assert!(e.to_string().contains("appeared while"), "{made}: {e}");
            match made {
                "empty dir" => assert!(names(&dst).is_empty()),
                "dir" => assert_eq!(
                    std::fs::read_to_string(dst.join("sentinel")).unwrap(),
                    "mine"
                ),
                _ => assert_eq!(std::fs::read_to_string(&dst).unwrap(), "mine"),
            }
            assert_eq!(names(tmp.path()), ["q"], "{made}");
            remove_any(&dst).unwrap();
        }
    }

    #[test]
    fn overwrite_replaces_only_what_this_tool_wrote() {
        let tmp = tempfile::tempdir().unwrap();
        let project = tmp.path().join("project");
        std::fs::create_dir(&project).unwrap();
        std::fs::write(project.join("sentinel"), "mine").unwrap();
        let e = write_output(&project, true, "x").unwrap_err();
        assert!(e.to_string().contains("did not write"), "{e}");
        // An output-looking directory with one foreign file.
        std::fs::write(project.join(CONFIG_FILE), "{}").unwrap();
        assert!(write_output(&project, true, "x").is_err());
        let file = tmp.path().join("file");
        std::fs::write(&file, "mine").unwrap();
        let e = write_output(&file, true, "x").unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        let target = tmp.path().join("target");
        write_output(&target, false, "old").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = write_output(&link, true, "x").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let dangling = tmp.path().join("dangling");
        std::os::unix::fs::symlink(tmp.path().join("nowhere"), &dangling).unwrap();
        assert!(write_output(&dangling, true, "x").is_err());
        assert!(write_output(&dangling, false, "x").is_err());
        assert_eq!(
            std::fs::read_to_string(target.join(CONFIG_FILE)).unwrap(),
            "old"
        );
        assert_eq!(names(&project), [CONFIG_FILE, "sentinel"]);
        assert_eq!(
            names(tmp.path()),
            ["dangling", "file", "link", "project", "target"]
        );
        // Replaceable: an empty directory, and an output of an earlier version (no marker).
        let empty = tmp.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        write_output(&empty, true, "new").unwrap();
        let legacy = tmp.path().join("legacy");
        std::fs::create_dir_all(legacy.join(TOKENIZER_DIR)).unwrap();
        for f in [CONFIG_FILE, WEIGHTS_FILE, REPORT_FILE] {
            std::fs::write(legacy.join(f), "old").unwrap();
        }
        std::fs::write(legacy.join(TOKENIZER_DIR).join("tokenizer.json"), "{}").unwrap();
        write_output(&legacy, true, "new").unwrap();
        assert_eq!(names(&legacy), [MARKER_FILE, CONFIG_FILE]);
        // Without oasr_config.json it is not an output.
        let weights_only = tmp.path().join("weights_only");
        std::fs::create_dir(&weights_only).unwrap();
        std::fs::write(weights_only.join(WEIGHTS_FILE), "w").unwrap();
        assert!(write_output(&weights_only, true, "new").is_err());
    }

    #[test]
    fn a_second_run_into_a_locked_destination_fails_fast() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("q");
        let first = StagedDir::create(&dst, false, &[]).unwrap();
        for overwrite in [false, true] {
            let e = StagedDir::create(&dst, overwrite, &[]).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("another oasr-quantize run is writing it")
                    && text.contains(&format!("pid {}", std::process::id())),
                "{text}"
            );
        }
        first.commit().unwrap();
        assert_eq!(names(tmp.path()), ["q"]);
        write_output(&dst, true, "again").unwrap();
    }

    #[test]
    fn stale_temporaries_are_removed_and_live_ones_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dead = {
            let mut child = std::process::Command::new("true").spawn().unwrap();
            let pid = child.id();
            child.wait().unwrap();
            pid
        };
        let parent_pid = std::os::unix::process::parent_id();
        for name in [
            format!(".q.partial-{dead}"),
            format!(".q.old-{dead}"),
            format!(".q.partial-{parent_pid}"),
            format!(".other.partial-{dead}"),
            ".q.old".to_string(),
        ] {
            std::fs::create_dir(tmp.path().join(&name)).unwrap();
            std::fs::write(tmp.path().join(&name).join("f"), "x").unwrap();
        }
        // A lock left by a killed run has no holder: it is taken, and removed at the end.
        std::fs::write(tmp.path().join(".q.lock"), format!("{dead}\n")).unwrap();
        write_output(&tmp.path().join("q"), false, "1").unwrap();
        assert_eq!(
            names(tmp.path()),
            [
                format!(".other.partial-{dead}"),
                ".q.old".to_string(),
                format!(".q.partial-{parent_pid}"),
                "q".to_string()
            ]
        );
    }

    #[test]
    fn debris_names_are_parsed_strictly() {
        assert_eq!(debris_pid(".q.partial-12", "q"), Some(12));
        assert_eq!(debris_pid(".q.old-7", "q"), Some(7));
        assert_eq!(debris_pid(".q.old", "q"), None);
        assert_eq!(debris_pid(".q.partial-", "q"), None);
        assert_eq!(debris_pid(".q.partial-1x", "q"), None);
        assert_eq!(debris_pid(".q.partial-+1", "q"), None);
        assert_eq!(debris_pid(".qq.partial-1", "q"), None);
        assert_eq!(debris_pid("q.partial-1", "q"), None);
        assert_eq!(debris_pid(".q.lock", "q"), None);
    }
}
