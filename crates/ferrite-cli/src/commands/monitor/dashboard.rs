//! The live terminal view of `ferrite monitor` (ratatui): per-device memory bars (allocated,
//! reserved, capacity), sparklines of memory, loss, throughput and loader wait, refreshed about
//! once a second; `q` quits.
//!
//! Rendering is a pure function of the last scrape and the history, so it is tested on ratatui's
//! `TestBackend`; the loop around it (terminal set-up, keys, scrapes) is tested in a real
//! terminal by `tests/monitor_command.rs` through tmux.

use std::time::{Duration, Instant};

use ferrite_memory::format_size;
use ratatui::Frame;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Sparkline};

use ferrite_train::observe::ObserveError;
use ferrite_train::observe::run_figures::DeviceFigures;

use super::history::{History, tail, tail_scaled};
use super::plain::{clock, loss_text, lr_text};
use super::run_view::RunView;
use super::scrape::Scraper;

/// What the dashboard shows.
pub struct Dashboard {
    pub url: String,
    pub view: RunView,
    pub history: History,
    pub last_scrape: String,
    pub interval: Duration,
}

/// How the interactive loop ended.
pub enum Ended {
    /// The user pressed `q`.
    Quit,
    /// The run stopped answering.
    Lost(ObserveError),
}

/// Run the interactive view until `q` or until the run goes away. `first` is the scrape that
/// showed the run is there (taken before the terminal is switched to the dashboard).
pub fn run(scraper: &Scraper, first: RunView, interval: Duration) -> Result<(Ended, RunView), ObserveError> {
    let mut dash = Dashboard {
        url: scraper.url().to_string(),
        history: History::default(),
        view: first,
        last_scrape: clock(),
        interval,
    };
    dash.history.record(&dash.view);
    let mut terminal = ratatui::try_init().map_err(ObserveError::Terminal)?;
    let ended = event_loop(&mut terminal, scraper, &mut dash);
    ratatui::try_restore().map_err(ObserveError::Terminal)?;
    Ok((ended?, dash.view))
}

fn event_loop(
    terminal: &mut ratatui::DefaultTerminal,
    scraper: &Scraper,
    dash: &mut Dashboard,
) -> Result<Ended, ObserveError> {
    loop {
        terminal.draw(|f| dash.render(f)).map_err(ObserveError::Terminal)?;
        let next = Instant::now() + dash.interval;
        while let Some(left) = next.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            if !event::poll(left).map_err(ObserveError::Terminal)? {
                break;
            }
            match event::read().map_err(ObserveError::Terminal)? {
                Event::Key(k) if k.kind != KeyEventKind::Release => {
                    let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                        return Ok(Ended::Quit);
                    }
                }
                Event::Resize(..) => terminal.draw(|f| dash.render(f)).map(|_| ()).map_err(ObserveError::Terminal)?,
                _ => {}
            }
        }
        match scraper.fetch() {
            Ok(v) => {
                dash.history.record(&v);
                dash.view = v;
                dash.last_scrape = clock();
            }
            Err(e) => return Ok(Ended::Lost(e)),
        }
    }
}

const ALLOCATED: Color = Color::Green;
const RESERVED: Color = Color::Yellow;

impl Dashboard {
    pub fn render(&self, f: &mut Frame<'_>) {
        let v = &self.view;
        let memory_height = 2 + 3 * v.devices.len() as u16;
        let [header, memory, row1, row2, footer] = Layout::vertical([
            Constraint::Length(5),
            Constraint::Length(memory_height),
            Constraint::Min(4),
            Constraint::Min(4),
            Constraint::Length(1),
        ])
        .areas(f.area());

        let t = &v.train;
        let bold = Style::default().add_modifier(Modifier::BOLD);
        let head = vec![
            Line::from(vec![
                Span::styled(format!("{} ", v.info.model), bold),
                Span::raw(format!("on {} · device {} · ferrite {}", v.info.dataset, v.info.device, v.info.version)),
            ]),
            Line::from(format!(
                "epoch {}/{}  steps {}  loss {}  lr {}",
                t.epoch,
                t.epochs,
                t.steps_total,
                loss_text(t.loss),
                lr_text(t.learning_rate),
            )),
            Line::from(format!(
                "{:.0} samples/s  loader wait {:.1}%  grad scale {}  skipped steps {}",
                t.samples_per_second,
                100.0 * t.loader_wait_ratio,
                t.grad_scale.map_or("-".into(), |g| format!("{g}")),
                t.skipped_steps_total,
            )),
        ];
        f.render_widget(
            Paragraph::new(head).block(Block::bordered().title(format!(" ferrite monitor · {} ", self.url))),
            header,
        );

        let mut lines = Vec::new();
        let bar_width = memory.width.saturating_sub(4) as usize;
        for d in &v.devices {
            lines.extend(device_lines(d, bar_width));
        }
        let legend = Line::from(vec![
            Span::raw(" memory: "),
            Span::styled("█ allocated ", Style::default().fg(ALLOCATED)),
            Span::styled("▒ reserved ", Style::default().fg(RESERVED)),
            Span::raw("░ capacity "),
        ]);
        f.render_widget(Paragraph::new(lines).block(Block::bordered().title(legend)), memory);

        let [mem_area, loss_area] = Layout::horizontal([Constraint::Ratio(1, 2); 2]).areas(row1);
        let [sps_area, wait_area] = Layout::horizontal([Constraint::Ratio(1, 2); 2]).areas(row2);
        let main = v.main_device();
        let width = |a: Rect| a.width.saturating_sub(2) as usize;
        let spark = |title: String, data: Vec<u64>, color: Color, area: Rect, f: &mut Frame<'_>| {
            f.render_widget(
                Sparkline::default()
                    .block(Block::bordered().title(title))
                    .data(&data)
                    .style(Style::default().fg(color)),
                area,
            );
        };
        spark(
            format!(
                " {} allocated {} (peak {}) ",
                main.device,
                format_size(main.allocated_bytes),
                format_size(main.peak_allocated_bytes)
            ),
            tail(&self.history.allocated, width(mem_area)),
            ALLOCATED,
            mem_area,
            f,
        );
        spark(
            format!(" loss {} ", loss_text(t.loss)),
            tail_scaled(&self.history.loss, width(loss_area)),
            Color::Cyan,
            loss_area,
            f,
        );
        spark(
            format!(" samples/s {:.0} ", t.samples_per_second),
            tail_scaled(&self.history.samples_per_second, width(sps_area)),
            Color::Magenta,
            sps_area,
            f,
        );
        spark(
            format!(" loader wait {:.1}% ", 100.0 * t.loader_wait_ratio),
            tail_scaled(&self.history.loader_wait_ratio, width(wait_area)),
            Color::Red,
            wait_area,
            f,
        );
        f.render_widget(
            Paragraph::new(format!(
                " q quit · every {:.1} s · last scrape {} UTC · {} scrapes",
                self.interval.as_secs_f64(),
                self.last_scrape,
                self.history.len()
            )),
            footer,
        );
    }
}

/// Three lines for one device: figures, the bar, fragmentation and events.
fn device_lines(d: &DeviceFigures, width: usize) -> Vec<Line<'static>> {
    let capacity = d.capacity_bytes.unwrap_or(0);
    // Without a known capacity the bar spans the peak reservation.
    let full = capacity.max(d.peak_reserved_bytes).max(d.reserved_bytes).max(1);
    // Rounded up: memory in use always shows at least one cell.
    let cells = |b: u64| ((b as f64 / full as f64) * width as f64).ceil() as usize;
    let a = cells(d.allocated_bytes).min(width);
    let r = cells(d.reserved_bytes).clamp(a, width);
    let bar = Line::from(vec![
        Span::raw(" "),
        Span::styled("█".repeat(a), Style::default().fg(ALLOCATED)),
        Span::styled("▒".repeat(r - a), Style::default().fg(RESERVED)),
        Span::raw("░".repeat(width - r)),
    ]);
    let reserved_text = match d.capacity_bytes {
        Some(c) => format!(
            "reserved {} of {} ({:.1}%)",
            format_size(d.reserved_bytes),
            format_size(c),
            100.0 * d.reserved_bytes as f64 / c.max(1) as f64
        ),
        None => format!("reserved {}, capacity unknown (bar: peak reserved)", format_size(d.reserved_bytes)),
    };
    vec![
        Line::from(vec![
            Span::styled(format!(" {:<16}", d.device), Style::default().add_modifier(Modifier::BOLD)),
            Span::styled(
                format!(
                    "allocated {} (peak {})  ",
                    format_size(d.allocated_bytes),
                    format_size(d.peak_allocated_bytes)
                ),
                Style::default().fg(ALLOCATED),
            ),
            Span::styled(reserved_text, Style::default().fg(RESERVED)),
        ]),
        bar,
        Line::from(format!(
            " {:<16}OOMs {}  retries {}  segments {}  cached free {}  largest free block {}",
            "",
            d.ooms_total,
            d.alloc_retries_total,
            d.segments,
            format_size(d.reserved_unallocated_bytes),
            format_size(d.largest_free_block_bytes),
        )),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_train::observe::RunInfo;
    use ferrite_train::observe::run_figures::TrainFigures;
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    fn device(name: &str, allocated: u64, reserved: u64, capacity: Option<u64>) -> DeviceFigures {
        DeviceFigures {
            device: name.into(),
            allocated_bytes: allocated,
            reserved_bytes: reserved,
            peak_allocated_bytes: allocated,
            peak_reserved_bytes: reserved,
            capacity_bytes: capacity,
            reserved_unallocated_bytes: reserved - allocated,
            largest_free_block_bytes: reserved - allocated,
            segments: 3,
            allocations_total: 100,
            frees_total: 90,
            ooms_total: 1,
            alloc_retries_total: 2,
        }
    }

    fn screen(dash: &Dashboard, w: u16, h: u16) -> String {
        let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
        term.draw(|f| dash.render(f)).unwrap();
        let buf = term.backend().buffer().clone();
        (0..h).map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>() + "\n").collect()
    }

    #[test]
    fn shows_bars_figures_and_sparklines() {
        let gib = 1u64 << 30;
        let view = RunView {
            info: RunInfo {
                version: "0.1.0".into(),
                model: "mlp 64-10".into(),
                dataset: "digits".into(),
                device: "sim:a100-40gb:0".into(),
            },
            train: TrainFigures {
                steps_total: 12,
                skipped_steps_total: 0,
                samples_total: 768,
                epoch: 2,
                epochs: 20,
                loss: Some(0.75),
                learning_rate: Some(1e-3),
                samples_per_second: 9000.0,
                loader_wait_ratio: 0.5,
                grad_scale: None,
                batches_total: 12,
                batch_seconds_total: 0.1,
                loader_wait_seconds_total: 0.05,
            },
            devices: vec![
                device("sim:a100-40gb:0", 10 * gib, 20 * gib, Some(40 * gib)),
                device("cpu", 1 << 20, 2 << 20, None),
            ],
        };
        let mut dash = Dashboard {
            url: "http://127.0.0.1:9400/metrics".into(),
            history: History::default(),
            view,
            last_scrape: "12:00:00".into(),
            interval: Duration::from_secs(1),
        };
        for _ in 0..5 {
            dash.history.record(&dash.view.clone());
        }
        let s = screen(&dash, 120, 32);
        for needle in [
            "ferrite monitor · http://127.0.0.1:9400/metrics",
            "epoch 2/20  steps 12  loss 0.7500  lr 1.0e-3",
            "9000 samples/s  loader wait 50.0%  grad scale -  skipped steps 0",
            "allocated 10.00 GiB (peak 10.00 GiB)  reserved 20.00 GiB of 40.00 GiB (50.0%)",
            "capacity unknown",
            "OOMs 1  retries 2  segments 3  cached free 10.00 GiB",
            "q quit",
        ] {
            assert!(s.contains(needle), "missing `{needle}` in\n{s}");
        }
        // The A100's bar: a quarter allocated, a quarter more reserved, half free capacity.
        let bar = s.lines().find(|l| l.contains('█') && l.contains('░')).unwrap();
        let (a, r, c) = (bar.matches('█').count(), bar.matches('▒').count(), bar.matches('░').count());
        assert!(a.abs_diff(r) <= 1 && (a + r).abs_diff(c) <= 1, "{bar}");
        // Sparklines draw bars once there is history.
        assert!(s.contains('█') && s.lines().filter(|l| l.contains("█")).count() > 3, "{s}");
        // A small terminal still renders without panicking.
        let _ = screen(&dash, 20, 5);
    }
}
