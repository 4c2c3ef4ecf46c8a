//! The files of a sharded checkpoint (ZeRO over MPI): a directory holding one shard file per rank
//! and one index, written last.
//!
//! Why this layout: under ZeRO no rank holds the whole optimizer state, so no rank can write the
//! ordinary one-file checkpoint without first gathering everything (the memory ZeRO saves). Each
//! rank writes its own part instead, and the checkpoint is *complete only when the index exists*:
//!
//! ```text
//! CKPT/index.safetensors                          rank 0, after every rank's shard is on disk
//! CKPT/shard-<tag>-00000-of-00003.safetensors      rank 0's part
//! CKPT/shard-<tag>-00001-of-00003.safetensors      rank 1's part …
//! ```
//!
//! Every file is a ferrite checkpoint (a [`Checkpoint`] tree in one safetensors file, written
//! atomically). A save draws a fresh `tag` that is part of the shard file names, so a new save
//! never overwrites a shard the current index points to: a crash in the middle of a save (any
//! rank, any moment) leaves the previous index and the previous shards intact, and the new
//! shards are merely unreferenced files. Only once the new index has replaced the old one are
//! the old tag's shards removed. The index records each shard's file name and byte length, and
//! each shard records its rank, the world size and the tag, so a shard that is missing,
//! truncated, or left over from another save is a typed error naming the file — never a silent
//! mix of two saves. What the trees hold is the trainer's business (`ferrite-train`'s
//! `sharded` module); this file only knows the files.

use std::path::{Path, PathBuf};

use crate::error::{IoError, Result};
use crate::training_checkpoint::Checkpoint;
use crate::value::Value;

/// The index's file name inside a sharded checkpoint's directory.
pub const SHARD_INDEX_FILE: &str = "index.safetensors";
/// The `format` entry of an index.
const INDEX_FORMAT: &str = "ferrite-sharded/1";

/// A sharded checkpoint read back: the index and every rank's shard, in rank order.
#[derive(Debug, Clone)]
pub struct ShardedCheckpoint {
    pub dir: PathBuf,
    pub index: Checkpoint,
    /// Shard `r` was written by rank `r` of the saving run.
    pub shards: Vec<Checkpoint>,
}

impl ShardedCheckpoint {
    /// Ranks of the run that saved it.
    pub fn world_size(&self) -> usize {
        self.shards.len()
    }
}

/// Whether `path` is a sharded checkpoint's directory (one that has an index).
pub fn is_sharded_checkpoint(path: &Path) -> bool {
    path.is_dir() && path.join(SHARD_INDEX_FILE).is_file()
}

/// The name of rank `rank`'s shard file of the save `tag` among `world` ranks.
pub fn shard_file_name(tag: &str, rank: usize, world: usize) -> String {
    format!("shard-{tag}-{rank:05}-of-{world:05}.safetensors")
}

/// Writes rank `rank`'s shard of the save `tag` into `dir` (created if need be), atomically, with
/// its identity (`shard/rank`, `shard/world_size`, `shard/tag`) added; returns its length in
/// bytes, which the index records.
pub fn write_shard(dir: &Path, tag: &str, rank: usize, world: usize, shard: &Checkpoint) -> Result<u64> {
    if dir.exists() && !dir.is_dir() {
        return Err(IoError::structure(
            dir.display().to_string(),
            "is a file; a sharded checkpoint (--zero) is a directory: pass a path that is a directory or does not exist yet",
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| IoError::os("create directory", dir, e))?;
    let mut c = shard.clone();
    c.set("shard/rank", rank)?;
    c.set("shard/world_size", world)?;
    c.set("shard/tag", tag)?;
    let path = dir.join(shard_file_name(tag, rank, world));
    c.save(&path)?;
    let bytes = std::fs::metadata(&path).map_err(|e| IoError::os("stat", &path, e))?.len();
    Ok(bytes)
}

/// Writes the index of the save `tag` (its shards, `shard_bytes[r]` bytes each, already on disk),
/// atomically: from this moment the checkpoint is this save. Then removes the shards of earlier
/// saves in `dir` (best effort: a leftover file is unreferenced, not harmful).
pub fn write_shard_index(dir: &Path, tag: &str, shard_bytes: &[u64], index: &Checkpoint) -> Result<()> {
    let world = shard_bytes.len();
    let mut c = index.clone();
    c.set("shards/format", INDEX_FORMAT)?;
    c.set("shards/tag", tag)?;
    c.set("shards/world_size", world)?;
    let files: Vec<Value> = shard_bytes
        .iter()
        .enumerate()
        .map(|(r, &b)| {
            let mut d = Value::dict();
            let _ = d.insert("file", shard_file_name(tag, r, world));
            let _ = d.insert("bytes", b as i64);
            d
        })
        .collect();
    c.set("shards/files", Value::List(files))?;
    c.save(dir.join(SHARD_INDEX_FILE))?;
    remove_stale_shards(dir, tag);
    Ok(())
}

/// Deletes `shard-*` files of other saves than `tag`.
fn remove_stale_shards(dir: &Path, tag: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let current = format!("shard-{tag}-");
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("shard-") && name.ends_with(".safetensors") && !name.starts_with(&current) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Reads the sharded checkpoint in `dir`: its index, then every shard it lists, each checked
/// against the index (present, the recorded length, the same rank, world size and save).
pub fn read_sharded_checkpoint(dir: &Path) -> Result<ShardedCheckpoint> {
    let index_path = dir.join(SHARD_INDEX_FILE);
    if !dir.is_dir() || !index_path.is_file() {
        return Err(IoError::ShardIndexMissing { dir: dir.to_path_buf() });
    }
    let index = Checkpoint::load(&index_path)?;
    match index.get("shards/format").and_then(Value::as_str) {
        Some(INDEX_FORMAT) => {}
        other => {
            return Err(IoError::structure(
                index_path.display().to_string(),
                format!("is not a sharded checkpoint's index (shards/format is {other:?}, expected `{INDEX_FORMAT}`)"),
            ));
        }
    }
    let tag = index.str("shards/tag")?.to_string();
    let world = usize::try_from(index.int("shards/world_size")?)
        .map_err(|_| IoError::structure("shards/world_size", "is negative"))?;
    let files =
        index.require("shards/files")?.as_list().ok_or_else(|| IoError::structure("shards/files", "is not a list"))?;
    if files.len() != world || world == 0 {
        return Err(IoError::structure(
            index_path.display().to_string(),
            format!("lists {} shard files for a world size of {world}", files.len()),
        ));
    }
    let mut shards = Vec::with_capacity(world);
    for (rank, f) in files.iter().enumerate() {
        let name = f
            .get("file")
            .and_then(Value::as_str)
            .ok_or_else(|| IoError::structure("shards/files", "an entry has no `file`"))?;
        let expected = f
            .get("bytes")
            .and_then(Value::as_int)
            .ok_or_else(|| IoError::structure("shards/files", "an entry has no `bytes`"))?;
        let path = dir.join(name);
        let Ok(meta) = std::fs::metadata(&path) else {
            return Err(IoError::ShardMissing { path, rank, world_size: world });
        };
        if meta.len() as i64 != expected {
            return Err(IoError::ShardSize { path, rank, expected: expected.max(0) as u64, found: meta.len() });
        }
        let shard = Checkpoint::load(&path)?;
        for (entry, want) in [("shard/rank", rank as i64), ("shard/world_size", world as i64)] {
            let found = shard.int(entry)?;
            if found != want {
                return Err(IoError::ShardMismatch {
                    path,
                    entry,
                    expected: want.to_string(),
                    found: found.to_string(),
                });
            }
        }
        let found = shard.str("shard/tag")?;
        if found != tag {
            return Err(IoError::ShardMismatch { path, entry: "shard/tag", expected: tag, found: found.to_string() });
        }
        shards.push(shard);
    }
    Ok(ShardedCheckpoint { dir: dir.to_path_buf(), index, shards })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(v: i64) -> Checkpoint {
        let mut c = Checkpoint::new();
        c.set("value", v).unwrap();
        c
    }

    fn save(dir: &Path, tag: &str, world: usize) {
        let bytes: Vec<u64> = (0..world).map(|r| write_shard(dir, tag, r, world, &shard(r as i64)).unwrap()).collect();
        let mut index = Checkpoint::new();
        index.set("epoch", 1i64).unwrap();
        write_shard_index(dir, tag, &bytes, &index).unwrap();
    }

    #[test]
    fn a_save_reads_back_and_replaces_the_previous_one() {
        let dir = tempfile::tempdir().unwrap();
        let ckpt = dir.path().join("ckpt");
        save(&ckpt, "a", 3);
        assert!(is_sharded_checkpoint(&ckpt));
        let back = read_sharded_checkpoint(&ckpt).unwrap();
        assert_eq!(back.world_size(), 3);
        assert_eq!(back.shards[2].int("value").unwrap(), 2);
        // A new save at another world size: the old shards go once its index is written.
        save(&ckpt, "b", 2);
        let names: Vec<String> =
            std::fs::read_dir(&ckpt).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
        assert!(names.iter().all(|n| !n.contains("-a-")), "{names:?}");
        assert_eq!(read_sharded_checkpoint(&ckpt).unwrap().world_size(), 2);
    }

    #[test]
    fn a_save_without_its_index_leaves_the_previous_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), "a", 2);
        // The next save's shards, but no index: a crash before rank 0 wrote it.
        write_shard(dir.path(), "b", 0, 2, &shard(7)).unwrap();
        let back = read_sharded_checkpoint(dir.path()).unwrap();
        assert_eq!(back.shards[0].int("value").unwrap(), 0);
        let empty = tempfile::tempdir().unwrap();
        write_shard(empty.path(), "b", 0, 2, &shard(7)).unwrap();
        let e = read_sharded_checkpoint(empty.path()).unwrap_err();
        assert!(matches!(e, IoError::ShardIndexMissing { .. }), "{e}");
        assert!(e.to_string().contains("index"), "{e}");
    }

    #[test]
    fn missing_truncated_and_foreign_shards_are_named() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), "a", 2);
        let one = dir.path().join(shard_file_name("a", 1, 2));
        let bytes = std::fs::read(&one).unwrap();
        std::fs::write(&one, &bytes[..bytes.len() - 3]).unwrap();
        let e = read_sharded_checkpoint(dir.path()).unwrap_err();
        assert!(matches!(e, IoError::ShardSize { rank: 1, .. }), "{e}");
        assert!(e.to_string().contains(&shard_file_name("a", 1, 2)), "{e}");
        std::fs::remove_file(&one).unwrap();
        let e = read_sharded_checkpoint(dir.path()).unwrap_err();
        assert!(matches!(e, IoError::ShardMissing { rank: 1, world_size: 2, .. }), "{e}");
        // Another save's shard under this save's name (same length by construction).
        std::fs::write(&one, &bytes).unwrap();
        let zero = dir.path().join(shard_file_name("a", 0, 2));
        std::fs::copy(&one, &zero).unwrap();
        let e = read_sharded_checkpoint(dir.path()).unwrap_err();
        assert!(matches!(e, IoError::ShardMismatch { entry: "shard/rank", .. }), "{e}");
    }
}
