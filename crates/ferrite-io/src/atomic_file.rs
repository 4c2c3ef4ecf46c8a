//! Writing a file so that readers see either the old version or the complete new one.
//!
//! A training job killed while saving (OOM killer, preemption, Ctrl-C, power loss) must not
//! destroy the last good checkpoint. The new contents go to a temporary file in the same directory,
//! are flushed and fsync'ed, and only then renamed over the target (an atomic replace on POSIX file
//! systems); finally the directory is fsync'ed so the rename itself survives a power cut. Until
//! [`AtomicFile::commit`] returns, the previous file is untouched. Dropping an uncommitted
//! `AtomicFile` removes the temporary file; a process that dies mid-write leaves it behind under a
//! hidden name (`.NAME.tmp-PID-N`) that no loader picks up.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{IoError, Result};

/// A file being written; becomes visible at its path only on [`commit`](AtomicFile::commit).
#[derive(Debug)]
pub struct AtomicFile {
    target: PathBuf,
    temp: PathBuf,
    writer: Option<BufWriter<File>>,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

impl AtomicFile {
    /// Starts writing a new version of `path` (the directory must exist).
    pub fn create(path: impl AsRef<Path>) -> Result<AtomicFile> {
        let target = path.as_ref().to_path_buf();
        // Refused now rather than by the rename after the whole file was written.
        crate::mapped_file::require_file(&target)?;
        let name = target
            .file_name()
            .ok_or_else(|| IoError::os("create", &target, std::io::Error::other("the path names no file")))?
            .to_string_lossy()
            .to_string();
        let dir = parent_dir(&target);
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let temp = dir.join(format!(".{name}.tmp-{}-{n}", std::process::id()));
            match OpenOptions::new().write(true).create_new(true).open(&temp) {
                Ok(f) => {
                    return Ok(AtomicFile { target, temp, writer: Some(BufWriter::with_capacity(1 << 20, f)) });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(IoError::os("create temporary file", temp, e)),
            }
        }
    }

    /// Where the data is being written until the commit.
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    /// Flushes, fsyncs, renames over the target and fsyncs the directory.
    pub fn commit(mut self) -> Result<()> {
        let Some(writer) = self.writer.take() else {
            return Ok(());
        };
        let file = writer.into_inner().map_err(|e| IoError::os("write", &self.temp, e.into_error()))?;
        // Testing hook (`FERRITE_FAULT_INJECT=at:save`): die here, the new contents written to the
        // temporary file and the target not yet replaced, to show the old file survives.
        crate::fault_injection::fault_point(crate::fault_injection::FaultPoint::Save);
        file.sync_all().map_err(|e| IoError::os("fsync", &self.temp, e))?;
        drop(file);
        if let Err(e) = std::fs::rename(&self.temp, &self.target) {
            let _ = std::fs::remove_file(&self.temp);
            return Err(IoError::os("rename into place", &self.target, e));
        }
        sync_dir(&parent_dir(&self.target))
    }

    fn writer(&mut self) -> std::io::Result<&mut BufWriter<File>> {
        self.writer.as_mut().ok_or_else(|| std::io::Error::other("file already committed"))
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writer()?.write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.writer()?.write_all(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.writer()?.flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.writer.take().is_some() {
            // Not committed (an error or early return): the target keeps its previous contents.
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// Writes `path` atomically with the bytes `fill` produces.
pub fn write_atomically(
    path: impl AsRef<Path>,
    fill: impl FnOnce(&mut AtomicFile) -> std::io::Result<()>,
) -> Result<()> {
    let mut f = AtomicFile::create(path)?;
    fill(&mut f).map_err(|e| IoError::os("write", f.temp_path().to_path_buf(), e))?;
    f.commit()
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<()> {
    let d = File::open(dir).map_err(|e| IoError::os("open directory", dir, e))?;
    d.sync_all().map_err(|e| IoError::os("fsync directory", dir, e))
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_replaces_and_abort_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.bin");
        write_atomically(&p, |w| w.write_all(b"one")).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"one");

        let mut f = AtomicFile::create(&p).unwrap();
        f.write_all(b"two-partial").unwrap();
        let temp = f.temp_path().to_path_buf();
        assert!(temp.exists());
        drop(f);
        assert!(!temp.exists(), "an aborted write removes its temporary file");
        assert_eq!(std::fs::read(&p).unwrap(), b"one");

        let err = write_atomically(&p, |w| {
            w.write_all(b"three")?;
            Err(std::io::Error::other("disk full"))
        });
        assert!(err.is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary files left behind");

        write_atomically(&p, |w| w.write_all(b"four")).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"four");
    }

    #[test]
    fn a_directory_target_is_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let err = AtomicFile::create(dir.path()).unwrap_err();
        assert!(matches!(err, IoError::NotAFile { found: "directory", .. }), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no temporary file");
    }

    #[test]
    fn missing_directory_is_a_typed_error() {
        let err = AtomicFile::create("/nonexistent-dir-ferrite/x.ckpt").unwrap_err();
        assert!(err.to_string().contains("create temporary file"), "{err}");
    }
}
