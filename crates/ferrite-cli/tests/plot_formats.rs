//! The format of `ferrite plan --plot FILE` and `ferrite memory plot -o FILE` follows the file's
//! extension: `.svg`, `.html` (or `.htm`) and `.png` (a real PNG, text drawn with the embedded
//! font); any other extension is a typed error naming the supported ones, given before anything is
//! computed and without writing the file.

use std::path::Path;
use std::process::Command;

fn ferrite(args: &[&str], dir: &Path) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(args)
        .current_dir(dir)
        .env("NODEVICE_SELECT", "1")
        .output()
        .expect("ferrite runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A small ferrite trace: a few allocations and frees on a simulated GPU.
fn trace(dir: &Path) -> String {
    let mut events = Vec::new();
    for i in 1..=20u64 {
        events.push(format!(r#"{{"action": "alloc", "id": {i}, "size": {}}}"#, i * 1_048_576));
        if i % 3 == 0 {
            events.push(format!(r#"{{"action": "free", "id": {}}}"#, i - 1));
        }
    }
    let text = format!(r#"{{"device": "sim:t4-16gb", "events": [{}]}}"#, events.join(", "));
    std::fs::write(dir.join("trace.json"), text).unwrap();
    "trace.json".into()
}

/// Checks the PNG signature and IHDR, decodes it and returns (width, height, RGB pixels).
fn read_png(path: &Path) -> (u32, u32, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} is not a PNG", path.display());
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    let (w, h) = (be(16), be(20));
    let img = image::load_from_memory_with_format(&bytes, image::ImageFormat::Png)
        .unwrap_or_else(|e| panic!("{} does not decode: {e}", path.display()))
        .to_rgb8();
    assert_eq!((img.width(), img.height()), (w, h));
    (w, h, img.into_raw())
}

/// Dark pixels (text, axes) in the rows `rows` of an RGB picture of width `w`.
fn dark_pixels(pixels: &[u8], w: u32, rows: std::ops::Range<u32>) -> usize {
    let row = w as usize * 3;
    pixels[rows.start as usize * row..rows.end as usize * row].chunks(3).filter(|p| p.iter().all(|&c| c < 100)).count()
}

#[test]
fn plan_plot_writes_a_png_by_its_extension() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = ferrite(
        &["plan", "--model", "mlp", "--batch", "64", "--device", "sim:t4-16gb", "--plot", "plan.PNG"],
        dir.path(),
    );
    assert!(ok, "{err}");
    assert!(out.contains("wrote plan.PNG"), "{out}");
    let (w, h, pixels) = read_png(&dir.path().join("plan.PNG"));
    assert_eq!((w, h), (1000, 360));
    // The caption (top rows) is drawn text, not an empty band: the font rendered headless.
    assert!(dark_pixels(&pixels, w, 0..30) > 50, "no caption text drawn");
    // The reserved line (red) and allocated (blue) are drawn.
    let has = |f: &dyn Fn(&[u8]) -> bool| pixels.chunks(3).any(f);
    assert!(has(&|p| p[0] > 200 && p[1] < 60 && p[2] < 60), "no red reserved line");
    assert!(has(&|p| p[2] > 200 && p[0] < 60 && p[1] < 60), "no blue allocated line");
    // SVG and HTML as before.
    for (file, start) in [("plan.svg", "<svg"), ("plan.htm", "<!DOCTYPE html>")] {
        let (ok, _, err) = ferrite(&["plan", "--model", "mlp", "--plot", file], dir.path());
        assert!(ok, "{err}");
        assert!(std::fs::read_to_string(dir.path().join(file)).unwrap().starts_with(start), "{file}");
    }
}

#[test]
fn other_extensions_are_refused_naming_the_supported_ones() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    for args in [
        &["plan", "--model", "mlp", "--plot", "p.exe"][..],
        &["plan", "--model", "mlp", "--plot", "plot"][..],
        &["memory", "plot", &t, "-o", "p.exe"][..],
        &["memory", "plot", &t, "-o", "p.jpg"][..],
    ] {
        let (ok, out, err) = ferrite(args, dir.path());
        assert!(!ok, "{args:?} accepted: {out}");
        assert!(err.starts_with("error: cannot plot to `"), "{args:?}: {err}");
        assert!(err.contains(".svg, .html (or .htm) or .png") && !err.contains("panicked"), "{args:?}: {err}");
    }
    let (_, _, err) = ferrite(&["plan", "--model", "mlp", "--plot", "p.exe"], dir.path());
    assert!(err.contains("`.exe` is not a format ferrite draws"), "{err}");
    assert!(!dir.path().join("p.exe").exists() && !dir.path().join("plot").exists());
}

#[test]
fn memory_plot_writes_png_svg_and_html_by_extension() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    let (ok, out, err) = ferrite(
        &["memory", "plot", &t, "-o", "m.png", "--alloc-conf", "default", "--alloc-conf", "expandable_segments:True"],
        dir.path(),
    );
    assert!(ok, "{err}");
    assert!(out.starts_with("wrote m.png ("), "{out}");
    let (w, h, pixels) = read_png(&dir.path().join("m.png"));
    assert_eq!((w, h), (1000, 720), "one panel per --alloc-conf");
    assert!(dark_pixels(&pixels, w, 360..390) > 50, "no caption on the second panel");
    let (ok, _, err) = ferrite(&["memory", "plot", &t, "-o", "m.html"], dir.path());
    assert!(ok, "{err}");
    assert!(std::fs::read_to_string(dir.path().join("m.html")).unwrap().contains("<svg"));
    // --html insists on an .html name; it no longer writes HTML into an .svg or .png.
    for name in ["m2.svg", "m2.png"] {
        let (ok, _, err) = ferrite(&["memory", "plot", &t, "-o", name, "--html"], dir.path());
        assert!(!ok && err.contains("--html writes an HTML page") && err.contains(name), "{err}");
        assert!(!dir.path().join(name).exists());
    }
    let (ok, _, err) = ferrite(&["memory", "plot", &t, "-o", "m2.html", "--html"], dir.path());
    assert!(ok, "{err}");
}
