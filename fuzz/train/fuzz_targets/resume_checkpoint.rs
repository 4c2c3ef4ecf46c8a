//! `ferrite train --resume FILE`: whole files through the checkpoint reader and then the resume
//! reader, which must name the damaged entry instead of panicking. Seed it with a real training
//! checkpoint (`ferrite train --epochs 1 --save-checkpoint corpus/resume_checkpoint/run.ckpt`):
//! libFuzzer's in-place edits then land in the JSON tree of its `__metadata__`, so inputs read as
//! checkpoints whose entries are missing, renamed or of the wrong type. The CI counterpart, which
//! edits the tree itself, is `crates/ferrite-cli/tests/parser_fuzz.rs`.
#![no_main]

use std::path::Path;

use ferrite_train::resume;
use ferrite_io::Checkpoint;
use ferrite_memory::Device;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(tree) = ferrite_io::read_bytes(&bytes::Bytes::copy_from_slice(data)) else { return };
    let Ok(c) = Checkpoint::from_value(tree) else { return };
    // The settings of `ferrite train`'s defaults, so a seed from the demo passes the settings check.
    let settings = c
        .get("settings")
        .and_then(|s| s.as_dict())
        .map(|items| {
            items
                .iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string())))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    if let Ok(state) = resume::read(&c, Path::new("fuzz.ckpt"), &Device::Cpu, &settings) {
        for (_, t) in &state.model {
            let _ = t.to_vec_f64().expect("an accepted model tensor is readable");
        }
    }
});
