//! `--metrics-file`: the run's figures as JSON lines, for runs nobody scrapes.
//!
//! A background thread appends one record at the start, one per second while training, one per
//! finished epoch (the record is taken by the training thread at the epoch's end, so its figures
//! are exactly the epoch's, and only written here) and one at the end. Each line goes out in one
//! `write` on a file opened for appending, so readers (`tail -f`, `jq`) never see half a line
//! from this writer. A write that fails (disk full, file removed with its directory) is reported
//! once on stderr and ends the file output; training goes on.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{RecvTimeoutError, Sender};

use super::ObserveError;
use super::exposition::{MetricsRecord, RunMetrics};

/// How often a `progress` record is written while nothing else happens.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

enum FileEvent {
    Record(Box<MetricsRecord>),
    Stop,
}

/// The writer thread; writes the `end` record and stops when [`MetricsFile::stop`] is called or
/// it is dropped.
pub struct MetricsFile {
    tx: Sender<FileEvent>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsFile {
    /// Open `path` for appending (created if missing) and start the writer.
    pub fn start(path: &Path, metrics: Arc<RunMetrics>) -> Result<MetricsFile, ObserveError> {
        if path.is_dir() {
            return Err(ObserveError::MetricsFile {
                path: path.to_path_buf(),
                reason: "it is a directory, not a file".into(),
            });
        }
        let file = OpenOptions::new().create(true).append(true).open(path).map_err(|e| ObserveError::MetricsFile {
            path: path.to_path_buf(),
            reason: match e.kind() {
                std::io::ErrorKind::NotFound => "its directory does not exist".to_string(),
                std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
                std::io::ErrorKind::NotADirectory => "a part of the path is a file, not a directory".to_string(),
                _ => e.to_string(),
            },
        })?;
        let mut writer = LineWriter { file, path: path.to_path_buf(), failed: false };
        writer.write(&metrics.record("start"));
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("ferrite-metrics-file".into())
            .spawn(move || {
                loop {
                    match rx.recv_timeout(PROGRESS_INTERVAL) {
                        Ok(FileEvent::Record(r)) => writer.write(&r),
                        Err(RecvTimeoutError::Timeout) => writer.write(&metrics.record("progress")),
                        Ok(FileEvent::Stop) | Err(RecvTimeoutError::Disconnected) => {
                            writer.write(&metrics.record("end"));
                            break;
                        }
                    }
                }
            })
            .map_err(ObserveError::Thread)?;
        Ok(MetricsFile { tx, thread: Some(thread) })
    }

    /// Queue a record taken by the caller (the training thread at an epoch's end).
    pub fn send(&self, record: MetricsRecord) {
        // The writer only exits after Stop; a send error means it panicked, and it has said so.
        let _ = self.tx.send(FileEvent::Record(Box::new(record)));
    }

    /// Write the `end` record and wait for the writer.
    pub fn stop(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        let _ = self.tx.send(FileEvent::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsFile {
    fn drop(&mut self) {
        self.finish();
    }
}

struct LineWriter {
    file: File,
    path: PathBuf,
    failed: bool,
}

impl LineWriter {
    fn write(&mut self, record: &MetricsRecord) {
        if self.failed {
            return;
        }
        let result = serde_json::to_vec(record).map_err(std::io::Error::other).and_then(|mut line| {
            line.push(b'\n');
            self.file.write_all(&line)
        });
        if let Err(e) = result {
            self.failed = true;
            eprintln!(
                "warning: writing the metrics file `{}` failed ({e}); training goes on without it",
                self.path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::run_figures::RunInfo;
    use ferrite_memory::Device;

    #[test]
    fn writes_start_records_and_end_as_json_lines_and_appends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.jsonl");
        let info = RunInfo { version: "v".into(), model: "m".into(), dataset: "d".into(), device: "cpu".into() };
        for _ in 0..2 {
            let metrics = RunMetrics::new(info.clone(), vec![Device::Cpu]);
            let file = MetricsFile::start(&path, metrics.clone()).unwrap();
            metrics.live.epoch.store(1, std::sync::atomic::Ordering::Relaxed);
            file.send(metrics.record("epoch_end"));
            file.stop();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let events: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["event"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(events, ["start", "epoch_end", "end", "start", "epoch_end", "end"]);
    }

    #[test]
    fn a_directory_or_unwritable_path_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let info = RunInfo { version: "v".into(), model: "m".into(), dataset: "d".into(), device: "cpu".into() };
        let metrics = RunMetrics::new(info, vec![Device::Cpu]);
        let e = MetricsFile::start(dir.path(), metrics.clone()).err().unwrap().to_string();
        assert!(e.contains("directory"), "{e}");
        let e = MetricsFile::start(&dir.path().join("missing/run.jsonl"), metrics).err().unwrap().to_string();
        assert!(e.contains("--metrics-file"), "{e}");
    }
}
