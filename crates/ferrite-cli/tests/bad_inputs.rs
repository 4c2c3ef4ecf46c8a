//! Wrong paths and hostile files given to every command: each gets a sentence that says what the
//! path or file is, not an operating-system error code or a wall of path segments.

use std::io::{Cursor, Write};
use std::path::Path;
use std::process::Command;

fn ferrite(args: &[&str], dir: &Path) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the ferrite binary runs");
    (
        o.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
    )
}

/// A `.pt` zip whose pickle is `pickle` (stored records, as torch.save writes them).
fn pt_zip(pickle: &[u8]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in [("archive/data.pkl", pickle), ("archive/byteorder", b"little"), ("archive/version", b"3\n")] {
        w.start_file(name, opts).unwrap();
        w.write_all(bytes).unwrap();
    }
    w.finish().unwrap().into_inner()
}

#[test]
fn a_directory_where_a_file_belongs_is_called_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("some_dir.pt")).unwrap();
    std::fs::write(dir.path().join("weights.safetensors"), b"not used").unwrap();
    for args in [
        &["inspect", "some_dir.pt"][..],
        &["convert", "some_dir.pt", "out.safetensors"][..],
        &["train", "--resume", "some_dir.pt", "--epochs", "1", "--no-progress"][..],
        &["memory", "replay", "some_dir.pt"][..],
    ] {
        let (code, out) = ferrite(args, dir.path());
        assert_eq!(code, 1, "{args:?}: {out}");
        assert!(out.contains("`some_dir.pt` is a directory, not a file"), "{args:?}: {out}");
        assert!(
            !out.contains("os error") && !out.contains("No such device") && !out.contains("panicked"),
            "{args:?}: {out}"
        );
    }
}

#[test]
fn an_output_path_that_is_a_directory_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("out_dir")).unwrap();
    // A tiny valid input: a ferrite checkpoint with one tensor.
    let mut tree = ferrite_io::Value::dict();
    tree.insert("w", ferrite_io::RawTensor::from_values(vec![2], &[1.0f32, 2.0]).unwrap()).unwrap();
    ferrite_io::save_checkpoint(dir.path().join("in.safetensors"), &tree).unwrap();
    let (code, out) = ferrite(&["convert", "in.safetensors", "out_dir"], dir.path());
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("`out_dir` is a directory, not a file") && !out.contains("os error"), "{out}");
    assert_eq!(std::fs::read_dir(dir.path().join("out_dir")).unwrap().count(), 0);
}

#[test]
fn nesting_errors_abbreviate_the_path() {
    let dir = tempfile::tempdir().unwrap();
    // A pickle nesting 100,000 one-element tuples around None.
    let mut p = vec![0x80, 2, b'N'];
    p.extend(std::iter::repeat_n(0x85u8, 100_000));
    p.push(b'.');
    std::fs::write(dir.path().join("deep.pt"), pt_zip(&p)).unwrap();
    // A ferrite checkpoint whose tree nests 100 lists.
    let mut meta = std::collections::BTreeMap::new();
    meta.insert(
        ferrite_io::CHECKPOINT_TREE_KEY.to_string(),
        format!("{{\"dict\": [[\"x\", {}1{}]]}}", "[".repeat(100), "]".repeat(100)),
    );
    let mut file = Vec::new();
    ferrite_io::write_safetensors_to(&mut file, std::iter::empty::<(&str, &ferrite_io::RawTensor)>(), &meta).unwrap();
    std::fs::write(dir.path().join("deep.safetensors"), file).unwrap();
    for (name, path) in [("deep.pt", "`0/0/0/…/0/0/0`"), ("deep.safetensors", "`x/0/0/…/0/0/0`")] {
        let (code, out) = ferrite(&["inspect", name], dir.path());
        assert_eq!(code, 1, "{name}: {out}");
        assert!(out.contains("nesting depth") && out.contains(path) && out.contains("levels"), "{name}: {out}");
        assert!(out.len() < 400, "{name}: a short message, not the whole path: {out}");
    }
}
