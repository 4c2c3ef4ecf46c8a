//! Memory timelines as pictures: allocated and reserved bytes over a step or a run, categories
//! stacked, the peak marked, one panel per device.
//!
//! A number says *that* a run peaked at 31 GiB; the timeline says *when* and *of what*: weights
//! flat at the bottom, activations climbing through forward and draining through backward, the
//! reserved line above them and the gap between the two (the allocator's cache and its
//! fragmentation). [`render`] draws one with `plotters` in the format the output file's extension
//! names ([`PlotFormat::from_path`]): `.svg` (one self-contained SVG, text as SVG `<text>`
//! elements), `.html` (that SVG in a page) or `.png` (the bitmap backend, text drawn with the
//! DejaVu Sans font embedded in the binary: no font files or system libraries needed). Any other
//! extension is refused before anything is computed. `ferrite memory plot` calls it for ferrite
//! traces and PyTorch snapshots; `ferrite plan --plot` with the timeline of a planned step.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One device's series.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceTimeline {
    /// Panel title, e.g. `"device 0"` or `"sim:a100-40gb"`.
    pub label: String,
    /// Device capacity in bytes, drawn as a line when known.
    pub capacity: Option<u64>,
    /// What the x axis counts (e.g. `"trace event"`, `"time (ms)"`).
    pub x_label: String,
    /// Names of the stacked categories, in the order of [`TimelinePoint::by_category`] (empty
    /// when the categories are not known: allocated is then drawn as one area).
    pub categories: Vec<String>,
    pub points: Vec<TimelinePoint>,
}

/// Memory at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelinePoint {
    pub t: f64,
    pub allocated: u64,
    pub reserved: u64,
    /// Allocated bytes per category (same length as [`DeviceTimeline::categories`]).
    pub by_category: Vec<u64>,
}

/// Why a timeline could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("nothing to plot: {0}")]
    Empty(String),
    #[error("timeline `{label}`: point {index} has {found} category values, but {expected} categories are named")]
    CategoryMismatch { label: String, index: usize, found: usize, expected: usize },
    #[error("drawing the plot failed: {0}")]
    Draw(String),
    #[error(
        "cannot plot to `{}`: {}; the format follows the file's extension: .svg, .html (or .htm) or .png",
        path.display(),
        match extension { Some(e) => format!("`.{e}` is not a format ferrite draws"), None => "it has no extension".to_string() }
    )]
    UnsupportedFormat { path: PathBuf, extension: Option<String> },
    #[error("`{}` is a directory, not a file: name the picture to write in it, e.g. {}", path.display(), path.join("memory.svg").display())]
    Directory { path: PathBuf },
    #[error("--html writes an HTML page, but `{}` names {found} file: drop --html, or name the output .html", path.display())]
    HtmlFlagConflict { path: PathBuf, found: &'static str },
    #[error(
        "a {width}x{height} PNG is too large to draw ({panels} panels): plot fewer devices or --alloc-conf at a time, or write .svg"
    )]
    TooLarge { width: u32, height: u64, panels: usize },
    #[error("encoding the PNG failed: {0}")]
    Encode(String),
}

/// The file formats a timeline is drawn in, chosen by the output file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlotFormat {
    /// `.svg`: one self-contained SVG document.
    Svg,
    /// `.html` / `.htm`: the SVG in a minimal page.
    Html,
    /// `.png`: a bitmap drawn by plotters' bitmap backend.
    Png,
}

impl PlotFormat {
    /// The format `path`'s extension names (case-insensitive), or a typed error naming the
    /// supported extensions (or saying that `path` is a directory).
    pub fn from_path(path: &Path) -> Result<PlotFormat, PlotError> {
        if path.is_dir() {
            return Err(PlotError::Directory { path: path.to_path_buf() });
        }
        let extension = path.extension().map(|e| e.to_string_lossy().into_owned());
        match extension.as_deref().map(str::to_ascii_lowercase).as_deref() {
            Some("svg") => Ok(PlotFormat::Svg),
            Some("html" | "htm") => Ok(PlotFormat::Html),
            Some("png") => Ok(PlotFormat::Png),
            _ => Err(PlotError::UnsupportedFormat { path: path.to_path_buf(), extension }),
        }
    }

    /// `a PNG`, `an SVG`, `an HTML` (for messages).
    pub fn article_name(self) -> &'static str {
        match self {
            PlotFormat::Svg => "an SVG",
            PlotFormat::Html => "an HTML",
            PlotFormat::Png => "a PNG",
        }
    }
}

/// The timelines drawn as a file of `format`: its bytes. `title` heads the HTML page.
pub fn render(timelines: &[DeviceTimeline], format: PlotFormat, title: &str) -> Result<Vec<u8>, PlotError> {
    match format {
        PlotFormat::Svg => memory_timeline_svg(timelines).map(String::into_bytes),
        PlotFormat::Html => memory_timeline_html(timelines, title).map(String::into_bytes),
        PlotFormat::Png => memory_timeline_png(timelines),
    }
}

/// Pixels per panel and panel width.
const PANEL_HEIGHT: u32 = 360;
const WIDTH: u32 = 1000;
/// Series longer than this are reduced (bucket maxima, so peaks survive).
const MAX_POINTS: usize = 2000;
/// Panels in one picture at most (a 1000 x 46080 PNG, 138 MB of pixels before encoding).
const MAX_PANELS: usize = 128;

/// Text is measured (and, in a PNG, drawn) with DejaVu Sans, embedded in the binary, registered
/// once as plotters' `sans-serif`.
fn register_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if ok { Ok(()) } else { Err(PlotError::Draw("the embedded DejaVu Sans font does not parse".into())) }
}

fn validate(timelines: &[DeviceTimeline]) -> Result<(), PlotError> {
    if timelines.is_empty() {
        return Err(PlotError::Empty("no device timelines".into()));
    }
    for tl in timelines {
        if tl.points.is_empty() {
            return Err(PlotError::Empty(format!("timeline `{}` has no points", tl.label)));
        }
        if let Some((index, p)) = tl.points.iter().enumerate().find(|(_, p)| p.by_category.len() != tl.categories.len())
        {
            return Err(PlotError::CategoryMismatch {
                label: tl.label.clone(),
                index,
                found: p.by_category.len(),
                expected: tl.categories.len(),
            });
        }
    }
    register_font()
}

/// Pixel size of the picture of `panels` panels.
fn picture_size(panels: usize) -> Result<(u32, u32), PlotError> {
    let height = PANEL_HEIGHT as u64 * panels as u64;
    match u32::try_from(height) {
        Ok(h) if panels <= MAX_PANELS => Ok((WIDTH, h)),
        _ => Err(PlotError::TooLarge { width: WIDTH, height, panels }),
    }
}

/// Every panel on `root`, one below the other.
fn draw_panels<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    timelines: &[DeviceTimeline],
) -> Result<(), PlotError> {
    root.fill(&WHITE).map_err(draw_err)?;
    let panels = root.split_evenly((timelines.len(), 1));
    // One y scale for every panel, so devices and configurations compare at a glance.
    let shared_top = timelines.iter().flat_map(|tl| &tl.points).map(|p| p.reserved.max(p.allocated)).max().unwrap_or(0);
    for (area, tl) in panels.iter().zip(timelines) {
        draw_panel(area, tl, shared_top)?;
    }
    root.present().map_err(draw_err)
}

/// The timelines as one SVG document, one panel per device, peaks marked.
pub fn memory_timeline_svg(timelines: &[DeviceTimeline]) -> Result<String, PlotError> {
    validate(timelines)?;
    let size = picture_size(timelines.len())?;
    let mut svg = String::new();
    draw_panels(&SVGBackend::with_string(&mut svg, size).into_drawing_area(), timelines)?;
    Ok(svg)
}

/// The timelines as a PNG file (RGB, 8 bits per channel), the same picture as the SVG.
pub fn memory_timeline_png(timelines: &[DeviceTimeline]) -> Result<Vec<u8>, PlotError> {
    use image::ImageEncoder;
    validate(timelines)?;
    let (w, h) = picture_size(timelines.len())?;
    let mut pixels = vec![0u8; w as usize * h as usize * 3];
    draw_panels(&BitMapBackend::with_buffer(&mut pixels, (w, h)).into_drawing_area(), timelines)?;
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(&pixels, w, h, image::ExtendedColorType::Rgb8)
        .map_err(|e| PlotError::Encode(e.to_string()))?;
    Ok(png)
}

/// The SVG wrapped in a minimal self-contained HTML page.
pub fn memory_timeline_html(timelines: &[DeviceTimeline], title: &str) -> Result<String, PlotError> {
    let svg = memory_timeline_svg(timelines)?;
    let title = title.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    Ok(format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title></head>\n<body>\n<h3>{title}</h3>\n{svg}\n</body></html>\n"
    ))
}

fn draw_err(e: impl std::fmt::Display) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// A byte unit that keeps axis numbers short.
fn unit_for(max: u64) -> (f64, &'static str) {
    const KIB: f64 = 1024.0;
    match max {
        m if m as f64 >= KIB * KIB * KIB => (KIB * KIB * KIB, "GiB"),
        m if m as f64 >= KIB * KIB => (KIB * KIB, "MiB"),
        m if m as f64 >= KIB => (KIB, "KiB"),
        _ => (1.0, "B"),
    }
}

/// At most `MAX_POINTS` points: each bucket keeps its first time and the maximum of every series.
fn reduce(points: &[TimelinePoint]) -> Vec<TimelinePoint> {
    if points.len() <= MAX_POINTS {
        return points.to_vec();
    }
    let per = points.len().div_ceil(MAX_POINTS);
    points
        .chunks(per)
        .map(|c| {
            let mut p = c[0].clone();
            for q in &c[1..] {
                p.allocated = p.allocated.max(q.allocated);
                p.reserved = p.reserved.max(q.reserved);
                for (a, b) in p.by_category.iter_mut().zip(&q.by_category) {
                    *a = (*a).max(*b);
                }
            }
            p
        })
        .collect()
}

/// A step series: memory holds its value until the next event (no slope between two events).
fn steps(points: &[TimelinePoint]) -> Vec<TimelinePoint> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, p) in points.iter().enumerate() {
        if i > 0 {
            out.push(TimelinePoint { t: p.t, ..points[i - 1].clone() });
        }
        out.push(p.clone());
    }
    out
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    tl: &DeviceTimeline,
    shared_top: u64,
) -> Result<(), PlotError> {
    let points = steps(&reduce(&tl.points));
    // Peaks from the full series (not the reduced one), first occurrence.
    let peak_res = tl.points.iter().fold(&tl.points[0], |b, p| if p.reserved > b.reserved { p } else { b });
    let peak_alloc = tl.points.iter().fold(&tl.points[0], |b, p| if p.allocated > b.allocated { p } else { b });
    let top = peak_res.reserved.max(peak_alloc.allocated).max(shared_top).max(1);
    // The capacity line is drawn when it would not flatten the series into the bottom quarter.
    let capacity_drawn = tl.capacity.filter(|&c| c <= top.saturating_mul(4));
    let (unit, unit_name) = unit_for(capacity_drawn.unwrap_or(0).max(top));
    // Headroom above the data for the legend (upper left) and the peak labels.
    let y_max = capacity_drawn.unwrap_or(0).max(top) as f64 / unit * 1.6;
    let x0 = points.first().map(|p| p.t).unwrap_or(0.0);
    let mut x1 = points.last().map(|p| p.t).unwrap_or(1.0);
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let mut caption = tl.label.clone();
    if let Some(c) = tl.capacity {
        caption.push_str(&format!(" (capacity {})", ferrite_memory::format_size(c)));
    }
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, 0f64..y_max)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc(tl.x_label.as_str())
        .y_desc(format!("memory ({unit_name})"))
        .y_label_formatter(&|v| format!("{v:.1}"))
        .draw()
        .map_err(draw_err)?;

    let y = |b: u64| b as f64 / unit;
    if tl.categories.is_empty() {
        chart
            .draw_series(AreaSeries::new(points.iter().map(|p| (p.t, y(p.allocated))), 0.0, BLUE.mix(0.25)))
            .map_err(draw_err)?;
    } else {
        // Stacked: draw the running sums from the top category down, so each lower one covers
        // the part of the area below it.
        for k in (0..tl.categories.len()).rev() {
            let color = Palette99::pick(k).mix(0.55);
            chart
                .draw_series(AreaSeries::new(
                    points.iter().map(|p| (p.t, y(p.by_category[..=k].iter().sum()))),
                    0.0,
                    color,
                ))
                .map_err(draw_err)?
                .label(tl.categories[k].as_str())
                .legend(move |(x, yy)| Rectangle::new([(x, yy - 5), (x + 16, yy + 5)], color.filled()));
        }
    }
    chart
        .draw_series(LineSeries::new(points.iter().map(|p| (p.t, y(p.allocated))), BLUE.stroke_width(2)))
        .map_err(draw_err)?
        .label("allocated")
        .legend(|(x, yy)| PathElement::new(vec![(x, yy), (x + 16, yy)], BLUE.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(points.iter().map(|p| (p.t, y(p.reserved))), RED.stroke_width(2)))
        .map_err(draw_err)?
        .label("reserved")
        .legend(|(x, yy)| PathElement::new(vec![(x, yy), (x + 16, yy)], RED.stroke_width(2)));
    if let Some(c) = capacity_drawn {
        chart
            .draw_series(LineSeries::new(vec![(x0, y(c)), (x1, y(c))], BLACK.stroke_width(1)))
            .map_err(draw_err)?
            .label("capacity")
            .legend(|(x, yy)| PathElement::new(vec![(x, yy), (x + 16, yy)], BLACK));
    }
    // The peaks: a marker and its value, reserved's label above the point, allocated's below;
    // on the right part of the chart the label ends at the point instead of starting there.
    let marks = [
        (peak_res.t, peak_res.reserved, "peak reserved", RED, -18),
        (peak_alloc.t, peak_alloc.allocated, "peak allocated", BLUE, 6),
    ];
    for (t, v, name, color, dy) in marks {
        let label = format!("{name} {}", ferrite_memory::format_size(v));
        let right_half = t > x0 + (x1 - x0) * 0.6;
        let (dx, hpos) = if right_half { (-8, HPos::Right) } else { (8, HPos::Left) };
        let font = ("sans-serif", 13).into_font().color(&color).pos(Pos::new(hpos, VPos::Top));
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((t, y(v))) + Circle::new((0, 0), 5, color.filled()) + Text::new(label, (dx, dy), font),
            ))
            .map_err(draw_err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeline(n: usize, categories: Vec<String>) -> DeviceTimeline {
        let k = categories.len();
        DeviceTimeline {
            label: "device 0".into(),
            capacity: Some(64 << 20),
            x_label: "trace event".into(),
            categories,
            points: (0..n)
                .map(|i| {
                    let a = ((i * 7919) % 40) as u64 * (1 << 20);
                    TimelinePoint {
                        t: i as f64,
                        allocated: a,
                        reserved: a + (4 << 20),
                        by_category: vec![a / k.max(1) as u64; k],
                    }
                })
                .collect(),
        }
    }

    #[test]
    fn reduction_keeps_the_peak() {
        let tl = timeline(10_000, vec![]);
        let r = reduce(&tl.points);
        assert!(r.len() <= MAX_POINTS);
        assert_eq!(r.iter().map(|p| p.reserved).max(), tl.points.iter().map(|p| p.reserved).max());
    }

    #[test]
    fn bad_timelines_are_errors() {
        assert!(matches!(memory_timeline_svg(&[]), Err(PlotError::Empty(_))));
        let mut tl = timeline(3, vec!["a".into()]);
        tl.points[2].by_category.clear();
        assert!(matches!(memory_timeline_svg(&[tl]), Err(PlotError::CategoryMismatch { index: 2, .. })));
    }

    #[test]
    fn svg_is_drawn_with_stacked_categories() {
        let svg = memory_timeline_svg(&[timeline(50, vec!["weights".into(), "activations".into()])]).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
        assert!(svg.contains("peak reserved 43.00 MiB"), "peak label missing");
        assert!(svg.contains("activations"));
    }
}
