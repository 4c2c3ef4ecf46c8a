//! Datasets and data loaders for ferrite.
//!
//! A classic PyTorch bug: data-loader workers forked from one process share a random state and
//! return the same "random" augmentations; the fix (`worker_init_fn`) is folklore. Here the right
//! thing is the only thing:
//!
//! - [`Dataset::get`] receives its random generator as an argument, so augmentation code has no
//!   reason to touch a global RNG;
//! - the loader derives that generator from the epoch's base seed and the sample's position in the
//!   epoch ([`seeding`] documents the exact derivation), so samples and workers never share random
//!   numbers, epochs differ, and the same seed gives bit-identical batches with 0, 1, 2 or 4
//!   workers;
//! - workers are threads that catch panics in user code and report them as a [`DataError`] naming
//!   the worker and the sample index; dropping an epoch (or the loader) mid-way stops and joins them.
//!
//! Modules: [`dataset`] (traits, `Subset`, `map`), [`sampler`], [`collate`], [`examples`] (the
//! built-in samples and batches, below the datasets and the collates), [`batch_collate`] and
//! [`tensor_collate`] (contiguous buffers and tensors), [`loader`] (map-style [`DataLoader`]),
//! [`iterable_loader`], [`loader_builder`] (the options both loaders share), [`staging`] (moving
//! batches to the training device in the background), [`seeding`], and the built-in datasets
//! [`digits`], [`fashion_mnist`] (read with [`idx`]), [`char_text`] (and [`text_streams`] for
//! truncated BPTT), with [`builtin`] as the entry
//! point for the CLI.
//!
//! A user's own data: [`image_folder`] (torchvision's `ImageFolder` layout, decoded with the
//! `image` crate), [`csv_table`] (a CSV file as a [`tabular`] classification table),
//! [`text_files`] (a text file or a folder of `.txt` files), the [`stratified_split`] both
//! classification sources hold out validation with, and [`augment`] (random crop and flip,
//! drawn from the sample's generator); for Hugging Face models, [`tokenizer`] (`tokenizer.json`
//! through the `tokenizers` library), [`documents`] (text, JSON Lines, folders) and
//! [`token_blocks`] (ids cut into blocks of N, as transformers' `group_texts`), and [`seq2seq`]
//! (input/target pairs from JSON Lines, padded with −100 labels, for T5).

pub mod augment;
pub mod batch_collate;
pub mod builtin;
pub mod char_text;
pub mod collate;
pub mod csv_table;
pub mod dataset;
pub mod digits;
pub mod distributed_sampler;
pub mod documents;
pub mod error;
pub mod examples;
pub mod fashion_mnist;
mod fetch;
pub mod file_bytes;
pub mod idx;
pub mod image_classification;
pub mod image_folder;
pub mod iterable_loader;
pub mod loader;
pub mod loader_builder;
pub mod sampler;
pub mod seeding;
pub mod seq2seq;
pub mod staging;
pub mod stratified_split;
pub mod tabular;
pub mod tensor_collate;
pub mod text_files;
pub mod text_streams;
pub mod token_blocks;
pub mod tokenizer;
mod worker_pool;

pub use augment::Augment;
pub use batch_collate::{ImageCollate, TextCollate};
pub use builtin::{DatasetKind, Splits, builtin_dataset};
pub use char_text::CharText;
pub use collate::{Collate, VecCollate, collate_fn};
pub use csv_table::{CsvOptions, CsvTable, load_csv};
pub use dataset::{Dataset, InMemory, IterableDataset, Mapped, Subset, WorkerInfo, worker_info};
pub use distributed_sampler::DistributedSampler;
pub use documents::{read_documents, tokenize_documents};
pub use error::{BoxError, DataError, Origin};
pub use examples::{ImageBatch, ImageExample, TextBatch, TextExample};
pub use image_classification::{ImageClassification, ImageParts, Normalization, Split};
pub use image_folder::{FolderLayout, ImageFolder, ImageFolderOptions, SkippedFile, load_image_folder};
pub use iterable_loader::{IterableEpoch, IterableLoader, IterableLoaderBuilder};
pub use loader::{DataLoader, DataLoaderBuilder, Epoch};
pub use loader_builder::LoaderBuilder;
pub use sampler::{
    BatchSampler, RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler, WeightedRandomSampler,
};
pub use seeding::{EpochSeed, Stream};
pub use seq2seq::{IGNORED_LABEL, Seq2SeqExamples, Seq2SeqPair, Seq2SeqTokens, read_seq2seq_pairs, shift_right};
pub use staging::ToDevice;
pub use stratified_split::{SplitIndices, stratified_split};
pub use tabular::{Standardization, TabularClassification};
pub use tensor_collate::{IntoTensors, StackCollate, Stackable, Tensors};
pub use text_files::read_text_source;
pub use text_streams::TextStreams;
pub use token_blocks::TokenBlocks;
pub use tokenizer::HfTokenizer;

/// The generator type datasets receive, and the tensor type batches are made of (re-exported
/// from `ferrite-tensor`).
pub use ferrite_tensor::{Generator, Tensor};
