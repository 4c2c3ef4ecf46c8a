//! Checkpoints for ferrite: safetensors state_dicts, a safe reader for PyTorch `.pt`/`.pth`
//! files, and atomic training checkpoints.
//!
//! Layers, bottom up:
//! - [`RawTensor`] and [`Value`]: what a file holds (dtype, layout, shared storage bytes; and the
//!   tree of dicts/lists/numbers around the tensors), independent of devices.
//! - Readers: [`read`] recognises PyTorch zip and legacy files (through a restricted unpickler that
//!   refuses anything but weights — see the `pickle` module), safetensors files and ferrite
//!   checkpoints, and memory-maps them.
//! - Writers: [`write_safetensors`] and [`save_checkpoint`], both through [`AtomicFile`] (temporary
//!   file, fsync, rename, directory fsync).
//! - state_dict helpers: [`state_dict_from_value`], [`strip_prefix`], [`check_keys`].
//! - Device tensors: [`load_state_dict`] / [`save_state_dict`] for ferrite `Tensor`s, with
//!   [`LoadOptions`] (`map_location`, dtype on load, prefix stripping, entry of a nested file);
//!   [`TensorLoader`] keeps views of one storage sharing it on the device; [`Checkpoint`] is the
//!   training checkpoint a trainer saves and resumes from (tensors, scalars, generator states).

mod atomic_file;
mod checkpoint_format;
mod error;
mod fault_injection;
mod format;
mod load_options;
mod map_location;
mod mapped_file;
mod pickle;
mod pt_legacy;
mod pt_zip;
mod raw_tensor;
mod read;
mod safetensors_format;
mod sharded_checkpoint;
mod state_dict;
mod tensor_data;
mod tensor_loader;
mod tensor_state_dict;
mod torch_snapshot;
mod training_checkpoint;
mod value;

pub use atomic_file::{AtomicFile, write_atomically};
pub use checkpoint_format::{CHECKPOINT_TREE_KEY, CHECKPOINT_VERSION_KEY, save_checkpoint, write_checkpoint_to};
pub use error::{IoError, Result};
pub use fault_injection::{FAULT_INJECT_ENV, FaultPlan, FaultPoint, fault_injection_armed, fault_point};
pub use format::{FileFormat, detect_format};
pub use load_options::LoadOptions;
pub use map_location::MapLocation;
pub use mapped_file::{map_file, require_file};
pub use pickle::{from_pickle, to_pickle};
pub use raw_tensor::{FileElement, MAX_EXPANDED_VIEW_BYTES, RawTensor, contiguous_strides};
pub use read::{read, read_bytes, read_with_format};
pub use safetensors_format::{
    SafetensorsFile, read_safetensors, read_safetensors_bytes, write_safetensors, write_safetensors_to,
};
pub use sharded_checkpoint::{
    SHARD_INDEX_FILE, ShardedCheckpoint, is_sharded_checkpoint, read_sharded_checkpoint, shard_file_name, write_shard,
    write_shard_index,
};
pub use state_dict::{RawStateDict, check_keys, state_dict_from_value, strip_prefix, strip_prefix_in_tree};
pub use tensor_loader::TensorLoader;
pub use tensor_state_dict::{
    TensorStateDict, load_state_dict, save_state_dict, save_state_dict_with_metadata, state_dict_to_tensors,
};
pub use torch_snapshot::{
    DeviceReplayTrace, RecordedPoint, SnapshotFormat, TorchAction, TorchBlock, TorchSegment, TorchSnapshot,
    TorchTraceEntry, memory_snapshot_to_value, write_torch_snapshot,
};
pub use training_checkpoint::Checkpoint;
pub use value::Value;

/// What a non-strict key check found: the one type for it, shared with `Module::load_state_dict`.
pub use ferrite_nn::IncompatibleKeys;
