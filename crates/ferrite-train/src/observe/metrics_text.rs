//! A reader of the Prometheus text exposition format (version 0.0.4, and OpenMetrics text, whose
//! `# EOF` is a comment here): what `ferrite monitor` parses a `/metrics` response with.
//!
//! Why our own: the monitor needs samples with their labels and nothing else (no timestamps
//! semantics, no exemplars), and a response from an arbitrary server must become a typed error
//! with a line number rather than a panic; the crates that parse this format bring a regex engine
//! and a date library for it. The grammar is small: `name{label="value",...} value [timestamp]`,
//! `# HELP` and `# TYPE` lines, other comments, blank lines.

use std::collections::BTreeMap;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    /// Labels in the order written, values unescaped.
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if present.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// A parsed exposition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsText {
    pub samples: Vec<Sample>,
    /// `# TYPE` declarations: family name → `counter`, `gauge`, `histogram`, `summary`, `untyped`.
    pub types: BTreeMap<String, String>,
}

impl MetricsText {
    /// The value of the first sample named `name` that has every label in `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.find(name, labels).map(|s| s.value)
    }

    /// The first sample named `name` that has every label in `labels`.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<&Sample> {
        self.samples.iter().find(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
    }

    /// Every sample named `name`.
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }
}

/// Where and why a text is not the exposition format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextError {
    /// 1-based line number.
    pub line: usize,
    pub reason: String,
}

/// Longest line accepted (a label value can be long, a megabyte line is not metrics).
const MAX_LINE: usize = 64 * 1024;

/// Parse a whole exposition.
pub fn parse_metrics_text(text: &str) -> Result<MetricsText, TextError> {
    let mut out = MetricsText::default();
    for (i, raw) in text.split('\n').enumerate() {
        let line_no = i + 1;
        let err = |reason: String| TextError { line: line_no, reason };
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line.len() > MAX_LINE {
            return Err(err(format!("the line is {} bytes long (at most {MAX_LINE} expected)", line.len())));
        }
        let trimmed = line.trim_matches(|c| c == ' ' || c == '\t');
        if trimmed.is_empty() {
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            if words.next() == Some("TYPE") {
                let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                    return Err(err("a `# TYPE` line needs a metric name and a type".into()));
                };
                check_name(name).map_err(err)?;
                out.types.insert(name.to_string(), kind.to_string());
            }
            continue;
        }
        out.samples.push(parse_sample(trimmed).map_err(err)?);
    }
    Ok(out)
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if is_name_start(c) && chars.all(is_name_char) => Ok(()),
        _ => Err(format!("`{}` is not a metric name", shorten(name))),
    }
}

/// At most 40 characters of `s`, for messages.
fn shorten(s: &str) -> String {
    if s.chars().count() <= 40 { s.to_string() } else { format!("{}…", s.chars().take(40).collect::<String>()) }
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || !name.starts_with(is_name_start) {
        return Err(format!("expected a metric name at the start of `{}`", shorten(line)));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after_brace) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(after_brace)?;
        labels = parsed;
        rest = after;
    }
    if !rest.starts_with([' ', '\t']) {
        return Err(format!("expected a space and a value after `{}`", shorten(name)));
    }
    let mut fields = rest.split_whitespace();
    let value_text = fields.next().ok_or_else(|| format!("no value for `{}`", shorten(name)))?;
    let value = parse_value(value_text).ok_or_else(|| format!("`{}` is not a number", shorten(value_text)))?;
    if let Some(ts) = fields.next()
        && ts.parse::<i64>().is_err()
    {
        return Err(format!("`{}` is not a timestamp (milliseconds)", shorten(ts)));
    }
    if let Some(extra) = fields.next() {
        return Err(format!("unexpected `{}` after the value", shorten(extra)));
    }
    Ok(Sample { name: name.to_string(), labels, value })
}

/// Label names and unescaped values, in the order written.
type Labels = Vec<(String, String)>;

/// Labels after `{`; returns them and the text after `}`.
fn parse_labels(mut s: &str) -> Result<(Labels, &str), String> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([' ', '\t']);
        if let Some(after) = s.strip_prefix('}') {
            return Ok((labels, after));
        }
        let key_end = s.find(|c: char| !is_name_char(c)).unwrap_or(s.len());
        let key = &s[..key_end];
        if key.is_empty() || key.starts_with(|c: char| c.is_ascii_digit() || c == ':') {
            return Err("expected a label name or `}`".into());
        }
        s = s[key_end..].trim_start_matches([' ', '\t']);
        s = s.strip_prefix('=').ok_or_else(|| format!("expected `=` after the label `{}`", shorten(key)))?;
        s = s.trim_start_matches([' ', '\t']);
        s = s.strip_prefix('"').ok_or_else(|| format!("the value of the label `{}` is not quoted", shorten(key)))?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err(format!("the value of the label `{}` is not closed with `\"`", shorten(key))),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => return Err(format!("unknown escape `\\{c}` in a label value")),
                    None => return Err(format!("the value of the label `{}` is not closed with `\"`", shorten(key))),
                },
                Some((_, c)) => value.push(c),
            }
        };
        labels.push((key.to_string(), value));
        s = s[end + 1..].trim_start_matches([' ', '\t']);
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err("expected `,` or `}` after a label".into());
        }
    }
}

/// A sample value: a float, `NaN`, `+Inf`, `-Inf` (Go's `ParseFloat` spellings).
fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ => {
            // Rust also accepts "infinity" and "nan" spellings the format does not; numbers only.
            if s.chars().all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-')) {
                s.parse().ok()
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_the_format() {
        let text = "# HELP a_total Things.\n# TYPE a_total counter\na_total 3\n\
                    b{device=\"sim:a100-40gb:0\",x=\"q\\\"uo\\\\te\\n\"} 1.5e3 1700000000000\n\
                    c{} +Inf\nd NaN\n# EOF\n";
        let m = parse_metrics_text(text).unwrap();
        assert_eq!(m.types["a_total"], "counter");
        assert_eq!(m.value("a_total", &[]), Some(3.0));
        let b = m.find("b", &[("device", "sim:a100-40gb:0")]).unwrap();
        assert_eq!(b.value, 1500.0);
        assert_eq!(b.label("x"), Some("q\"uo\\te\n"));
        assert_eq!(m.value("c", &[]), Some(f64::INFINITY));
        assert!(m.value("d", &[]).unwrap().is_nan());
        assert_eq!(m.value("b", &[("device", "cpu")]), None);
    }

    #[test]
    fn errors_name_the_line() {
        for (text, line, needle) in [
            ("ok 1\n<html><body>", 2, "metric name"),
            ("a{x=1} 2", 1, "not quoted"),
            ("a{x=\"1} 2", 1, "not closed"),
            ("a 1 2 3", 1, "unexpected"),
            ("a one", 1, "not a number"),
            ("a", 1, "a space and a value"),
            ("a{x=\"1\" y=\"2\"} 1", 1, "`,` or `}`"),
            ("# TYPE\n", 1, "TYPE"),
            ("a infinity", 1, "not a number"),
        ] {
            let e = parse_metrics_text(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e:?}");
            assert!(e.reason.contains(needle), "{text:?}: {e:?}");
        }
    }

    /// A label value as the format writes it.
    fn escape(v: &str) -> String {
        v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC{0,200}") {
            let _ = parse_metrics_text(&text);
        }

        #[test]
        fn never_panics_on_metric_like_text(text in "([a-z_]{1,4}(\\{[a-z]{0,3}(=\"[a-z\\\\\"]{0,4}\"?)?,?\\}?)? ?[-+0-9.eEInfNa]{0,5}( [0-9]{0,3})?\n){0,6}") {
            let _ = parse_metrics_text(&text);
        }

        #[test]
        fn written_samples_read_back(
            name in "[a-zA-Z_:][a-zA-Z0-9_:]{0,20}",
            labels in proptest::collection::vec(("[a-zA-Z_][a-zA-Z0-9_]{0,8}", "\\PC{0,12}"), 0..4),
            value in any::<f64>().prop_filter("finite", |v| v.is_finite()),
        ) {
            let body: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
            let line = format!("{name}{{{}}} {value:e}\n", body.join(","));
            let m = parse_metrics_text(&line).unwrap();
            prop_assert_eq!(m.samples.len(), 1);
            prop_assert_eq!(&m.samples[0].name, &name);
            prop_assert_eq!(&m.samples[0].labels, &labels);
            prop_assert_eq!(m.samples[0].value, value);
        }
    }
}
