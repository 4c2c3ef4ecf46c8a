//! The built-in datasets and where they are (or which package provides them).

use std::path::Path;

use ferrite_data::{char_text, digits, fashion_mnist};

use super::check::Check;

const SECTION: &str = "datasets";

pub fn checks() -> Vec<Check> {
    let mut out = vec![Check::ok(
        SECTION,
        "digits",
        format!("built in ({} images of 8×8, embedded in the binary)", digits::NUM_SAMPLES),
    )];
    let dir = fashion_mnist::data_dir();
    let from_env = std::env::var_os(fashion_mnist::DIR_ENV_VAR).is_some();
    if fashion_mnist::is_available() {
        out.push(Check::ok(SECTION, "fashion-mnist", format!("{}", dir.display())));
    } else if from_env {
        out.push(Check::warning(
            SECTION,
            "fashion-mnist",
            format!("not found in {} (from {})", dir.display(), fashion_mnist::DIR_ENV_VAR),
            format!(
                "point {} at a directory holding train-images-idx3-ubyte[.gz] and the three other IDX files, or unset it to use Debian's package",
                fashion_mnist::DIR_ENV_VAR
            ),
        ));
    } else {
        out.push(Check::warning(
            SECTION,
            "fashion-mnist",
            format!("not found in {}", dir.display()),
            format!(
                "`apt-get install {}`, or set {} to a directory with the IDX files (needed for `--dataset fashion-mnist`)",
                fashion_mnist::DEBIAN_PACKAGE,
                fashion_mnist::DIR_ENV_VAR
            ),
        ));
    }
    if Path::new(char_text::JARGON_PATH).is_file() {
        out.push(Check::ok(SECTION, "jargon-text", char_text::JARGON_PATH));
    } else {
        out.push(Check::warning(
            SECTION,
            "jargon-text",
            format!("not found at {}", char_text::JARGON_PATH),
            format!(
                "`apt-get install {}` (a text corpus for character-level language models)",
                char_text::JARGON_PACKAGE
            ),
        ));
    }
    out
}
