//! Fault injection on the built binary: kill -9 at seeded points of a run, concurrent runs into
//! one output, an output that appears mid-run, `--overwrite` onto what the tool did not write, a
//! closed stdout, a full filesystem and a read-only source. Every test asserts the state on disk
//! (docs/format.md, "Output protocol").

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RECIPE: &str = "int8_w8a8_rtn";

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_oasr-quantize"))
}

/// A quantization run of the real tiny.en, quiet.
fn quantize(src: &Path, dst: &Path, overwrite: bool) -> Command {
    let mut c = bin();
    c.arg(src).arg(dst).args(["--recipe", RECIPE]);
    if overwrite {
        c.arg("--overwrite");
    }
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

/// Runs to the end: (success, stderr).
fn finish(mut c: Command) -> (bool, String) {
    let out = c.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A copy of `src` (files only, one level), hard-linked where the filesystem allows: the runs
/// read it, so the real asset cache is never an input a bug could touch.
fn copy_flat(src: &Path, dst: &Path, link: bool) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let to = dst.join(p.file_name().unwrap());
        if !(link && std::fs::hard_link(&p, &to).is_ok()) {
            std::fs::copy(&p, &to).unwrap();
        }
    }
}

/// A deep copy (directories and files).
fn copy_tree(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let to = dst.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_tree(&p, &to);
        } else {
            std::fs::copy(&p, &to).unwrap();
        }
    }
}

/// Seeded, deterministic kill points as fractions of a full run's duration.
fn kill_points(seed: u64, n: usize) -> Vec<f64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // 0.02 .. 1.05 of a run: some land before the lock, most while writing, some in
            // the commit.
            0.02 + 1.03 * ((x >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

/// Every name in `dir` but `keep` is a temporary of one of the killed `pids`.
fn only_debris_of(dir: &Path, keep: &str, pids: &[u32]) {
    for name in names(dir) {
        let ok = name == keep
            || name == format!(".{keep}.lock")
            || pids.iter().any(|p| {
                name == format!(".{keep}.partial-{p}") || name == format!(".{keep}.old-{p}")
            });
        assert!(ok, "unexpected {name} in {}", dir.display());
    }
}

#[test]
fn kill_9_at_any_point_leaves_no_output_the_old_one_or_the_new_one() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    copy_flat(&common::tiny_en(), &src, true);
    let reference = tmp.path().join("reference");
    let (ok, err) = finish(quantize(&src, &reference, false));
    assert!(ok, "{err}");
    let new = common::tree_hashes(&reference);
    // The duration of a warm run, which the kill points are fractions of.
    let warm = tmp.path().join("warm");
    let started = Instant::now();
    let (ok, err) = finish(quantize(&src, &warm, false));
    assert!(ok, "{err}");
    let full = started.elapsed().as_secs_f64();
    assert_eq!(common::tree_hashes(&warm), new, "outputs are deterministic");
    std::fs::remove_dir_all(&warm).unwrap();
    // The previous output: a complete one of an earlier run, with a different report.
    let old_copy = tmp.path().join("old");
    copy_tree(&reference, &old_copy);
    std::fs::write(old_copy.join("quantization_report.json"), "{}\n").unwrap();
    let old = common::tree_hashes(&old_copy);
    assert_ne!(old, new);

    for overwrite in [false, true] {
        let dir = tmp
            .path()
            .join(if overwrite { "overwrite" } else { "plain" });
        std::fs::create_dir(&dir).unwrap();
        let dst = dir.join("q");
        if overwrite {
            copy_tree(&old_copy, &dst);
        }
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        let mut pids = Vec::new();
        for fraction in kill_points(if overwrite { 2 } else { 1 }, 8) {
            let mut child = quantize(&src, &dst, overwrite)
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            pids.push(child.id());
            std::thread::sleep(Duration::from_secs_f64(fraction * full));
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            let state = if dst.exists() {
                common::tree_hashes(&dst)
            } else {
                BTreeMap::new()
            };
            let what = if state == new {
                "new"
            } else if overwrite && state == old {
                "old"
            } else if !overwrite && state.is_empty() && !dst.exists() {
                "absent"
            } else {
                panic!(
                    "after a kill at {fraction:.2} of a run (overwrite {overwrite}), {} is \
                     neither absent, the old output nor the new one: {:?}",
                    dst.display(),
                    state.keys().collect::<Vec<_>>()
                );
            };
            *seen.entry(what).or_default() += 1;
            only_debris_of(&dir, "q", &pids);
            // Back to the starting state, to kill the same transition again.
            if what == "new" {
                std::fs::remove_dir_all(&dst).unwrap();
                if overwrite {
                    copy_tree(&old_copy, &dst);
                }
            }
        }
        eprintln!("overwrite {overwrite}: states after kill -9: {seen:?}");
        // The next run succeeds and removes every temporary of the killed ones.
        let (ok, err) = finish(quantize(&src, &dst, overwrite));
        assert!(ok, "{err}");
        assert_eq!(common::tree_hashes(&dst), new);
        assert_eq!(names(&dir), ["q"]);
    }
}

/// Waits until the run `pid` writes into `dir/.q.partial-PID` (it then holds the lock).
fn wait_for_partial(dir: &Path, pid: u32) {
    let partial = dir.join(format!(".q.partial-{pid}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !partial.exists() {
        assert!(Instant::now() < deadline, "the run never started writing");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn outcome(c: std::process::Child) -> (bool, String) {
    let out = c.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// DST is a complete, loadable output and nothing else is beside it.
fn complete_output_alone(dir: &Path, dst: &Path) {
    let (ok, out, err) = common::cli(&["inspect", dst.to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    let s: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["quantized_layers"], 64, "{out}");
    assert_eq!(names(dir), ["q"]);
}

#[test]
fn concurrent_runs_into_one_output_never_both_succeed() {
    let tmp = tempfile::tempdir().unwrap();
    let src = common::tiny_en();
    let dst = tmp.path().join("q");
    // Started together: exactly one succeeds; the other finds the lock (or, had it come after
    // the first finished, the output).
    let runs: Vec<_> = (0..2)
        .map(|_| quantize(&src, &dst, false).spawn().unwrap())
        .collect();
    let results: Vec<_> = runs.into_iter().map(outcome).collect();
    assert_eq!(
        results.iter().filter(|(ok, _)| *ok).count(),
        1,
        "{results:?}"
    );
    for (ok, err) in &results {
        assert!(
            *ok || err.contains("another oasr-quantize run is writing it (pid")
                || err.contains("already exists"),
            "{err}"
        );
    }
    complete_output_alone(tmp.path(), &dst);
    // A second run, with --overwrite, while the first (also --overwrite) writes: it fails at
    // once naming the first, which replaces the output.
    for second_overwrites in [true, false] {
        let first = quantize(&src, &dst, true).spawn().unwrap();
        let pid = first.id();
        wait_for_partial(tmp.path(), pid);
        let (ok, err) = finish(quantize(&src, &dst, second_overwrites));
        assert!(!ok, "the second run succeeded while the first was writing");
        let expected = if second_overwrites {
            format!("another oasr-quantize run is writing it (pid {pid}")
        } else {
            "already exists".to_string()
        };
        assert!(err.contains(&expected), "{err}");
        let (ok, err) = outcome(first);
        assert!(ok, "{err}");
        complete_output_alone(tmp.path(), &dst);
    }
}

#[test]
fn an_output_that_appears_mid_run_is_not_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("q");
    let child = quantize(&common::tiny_en(), &dst, false).spawn().unwrap();
    wait_for_partial(tmp.path(), child.id());
    // Someone else's directory appears while the run writes.
    std::fs::create_dir(&dst).unwrap();
    std::fs::write(dst.join("sentinel"), "mine").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("appeared while this run was writing it"),
        "{err}"
    );
    assert_eq!(names(&dst), ["sentinel"]);
    assert_eq!(
        std::fs::read_to_string(dst.join("sentinel")).unwrap(),
        "mine"
    );
    assert_eq!(names(tmp.path()), ["q"]);
}

#[test]
fn overwrite_refuses_what_this_tool_did_not_write() {
    let tmp = tempfile::tempdir().unwrap();
    // A project folder holding the source (hard links) and the user's files.
    let project = tmp.path().join("project");
    let src = project.join("model");
    copy_flat(&common::tiny_en(), &src, true);
    std::fs::write(project.join("notes.txt"), "mine").unwrap();
    std::fs::create_dir(project.join("data")).unwrap();
    std::fs::write(project.join("data/x"), "mine").unwrap();
    let unrelated = tmp.path().join("unrelated");
    std::fs::create_dir(&unrelated).unwrap();
    std::fs::write(unrelated.join("sentinel"), "mine").unwrap();
    std::fs::write(unrelated.join("oasr_config.json"), "{}").unwrap();
    let file = tmp.path().join("file");
    std::fs::write(&file, "mine").unwrap();
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let link = tmp.path().join("link");
    symlink(&target, &link).unwrap();
    let before = common::tree_hashes(tmp.path());
    let listing = names(tmp.path());

    let refused = |dst: &Path, cwd: &Path, why: &str| {
        let mut c = quantize(&src, dst, true);
        c.current_dir(cwd);
        let (ok, err) = finish(c);
        assert!(!ok, "{} was replaced", dst.display());
        assert!(err.contains(why), "{}: {err}", dst.display());
    };
    refused(&unrelated, tmp.path(), "did not write");
    refused(Path::new("."), &unrelated, "did not write");
    refused(&file, tmp.path(), "is not a directory");
    refused(&link, tmp.path(), "symbolic link");
    refused(&project, tmp.path(), "contains the input");
    refused(Path::new("."), &project, "contains the input");
    refused(Path::new(".."), &src, "contains the input");
    assert_eq!(common::tree_hashes(tmp.path()), before);
    assert_eq!(names(tmp.path()), listing);
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert!(names(&target).is_empty());
}

#[test]
fn a_refused_output_inside_the_input_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    copy_flat(&common::tiny_en(), &src, true);
    let before = common::tree_hashes(&src);
    for overwrite in [false, true] {
        let (ok, err) = finish(quantize(&src, &src.join("a/b/c"), overwrite));
        assert!(!ok && err.contains("lies inside the input"), "{err}");
    }
    assert!(!src.join("a").exists());
    assert_eq!(common::tree_hashes(&src), before);
    assert_eq!(names(tmp.path()), ["src"]);
}

#[test]
fn a_closed_stdout_ends_the_run_quietly() {
    let tiny = common::tiny_en();
    let tiny = tiny.to_str().unwrap();
    for args in [
        &["recipes"][..],
        &["recipes", "--json"],
        &["inspect", tiny],
        &["--help"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = bin()
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
        // Ended by SIGPIPE like other command-line tools (or done before it noticed).
        assert!(
            out.status.signal() == Some(libc::SIGPIPE) || out.status.success(),
            "{args:?}: {:?} {err}",
            out.status
        );
    }
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn mount(args: &[&str], at: &Path) -> Result<Mount, String> {
    let out = Command::new("mount")
        .args(args)
        .arg(at)
        .output()
        .map_err(|e| format!("cannot run mount: {e}"))?;
    if out.status.success() {
        Ok(Mount(at.into()))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

#[test]
fn a_full_filesystem_fails_the_run_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    // Deterministic everywhere: a file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes every
    // write past 1 MiB fail with EFBIG, as a full disk fails with ENOSPC.
    let limited = tmp.path().join("limited");
    std::fs::create_dir(&limited).unwrap();
    let mut c = quantize(&common::tiny_en(), &limited.join("q"), false);
    // SAFETY: setrlimit and signal are async-signal-safe; nothing else runs in the child.
    unsafe {
        c.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: 1 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let (ok, err) = finish(c);
    assert!(!ok);
    assert!(err.contains("File too large"), "{err}");
    assert!(names(&limited).is_empty(), "{:?}", names(&limited));

    // A real full filesystem: a 1 MiB tmpfs (needs root; skipped, saying so, otherwise).
    let small = tmp.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let _mounted = match mount(&["-t", "tmpfs", "-o", "size=1m", "tmpfs"], &small) {
        Ok(m) => m,
        Err(why) => {
            eprintln!("SKIPPED the full-tmpfs half: cannot mount a tmpfs ({why})");
            return;
        }
    };
    let (ok, err) = finish(quantize(&common::tiny_en(), &small.join("q"), false));
    assert!(!ok);
    assert!(err.contains("No space left on device"), "{err}");
    assert!(names(&small).is_empty(), "{:?}", names(&small));
}

#[test]
fn a_read_only_source_is_read_and_never_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let ro = tmp.path().join("ro");
    let root = unsafe { libc::geteuid() } == 0;
    // Root ignores permission bits: the source is then a read-only bind mount of the model.
    let _mounted = if root {
        std::fs::create_dir(&ro).unwrap();
        let tiny = common::tiny_en();
        let bound = match mount(&["--bind", tiny.to_str().unwrap()], &ro) {
            Ok(m) => m,
            Err(why) => {
                eprintln!("SKIPPED: running as root and cannot bind-mount ({why})");
                return;
            }
        };
        if let Err(why) = mount(&["-o", "remount,ro,bind"], &ro).map(std::mem::forget) {
            eprintln!("SKIPPED: running as root and cannot remount read-only ({why})");
            return;
        }
        Some(bound)
    } else {
        copy_flat(&common::tiny_en(), &ro, false);
        for f in names(&ro) {
            let p = ro.join(f);
            let mut perm = std::fs::metadata(&p).unwrap().permissions();
            perm.set_readonly(true);
            std::fs::set_permissions(&p, perm).unwrap();
        }
        let mut perm = std::fs::metadata(&ro).unwrap().permissions();
        perm.set_readonly(true);
        std::fs::set_permissions(&ro, perm).unwrap();
        None
    };
    // The setup is really read-only.
    assert!(std::fs::write(ro.join("probe"), "x").is_err());
    assert!(std::fs::OpenOptions::new()
        .append(true)
        .open(ro.join("config.json"))
        .is_err());
    let before = common::tree_hashes(&ro);
    let dst = tmp.path().join("q");
    let (ok, err) = finish(quantize(&ro, &dst, false));
    assert!(ok, "{err}");
    assert_eq!(common::tree_hashes(&ro), before);
    assert!(dst.join("model.safetensors").is_file());
    if !root {
        let mut perm = std::fs::metadata(&ro).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perm.set_readonly(false);
        std::fs::set_permissions(&ro, perm).unwrap();
    }
}
