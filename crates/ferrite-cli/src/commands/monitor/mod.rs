//! `ferrite monitor HOST:PORT`: the `nvidia-smi` of a ferrite run. It reads the run's
//! `/metrics` (served by `ferrite train --metrics-addr`) and shows memory per device, loss,
//! throughput and loader wait: live in the terminal, once (`--once`) or as fixed columns every
//! interval (`--dmon`).
//!
//! A run that is not there is one line and a non-zero exit, never a frozen screen: the first
//! scrape happens before the terminal is taken over. A run that ends while watched ends the
//! monitor with a line saying so (exit 0: the run ending is the normal case).

mod dashboard;
mod history;
mod plain;
mod run_view;
mod scrape;

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use ferrite_train::observe::ObserveError;
use ferrite_train::observe::metrics_addr::{Target, parse_target};

use self::dashboard::Ended;
use self::run_view::RunView;
use self::scrape::Scraper;
use super::CliResult;

#[derive(clap::Args, Debug, Clone)]
pub struct MonitorArgs {
    /// The run's metrics address: HOST:PORT as given to `ferrite train --metrics-addr`, a port
    /// on this machine, or http://HOST:PORT/metrics.
    #[arg(value_name = "ADDRESS", value_parser = parse_target)]
    pub target: Target,
    /// Print one plain-text snapshot and exit (for scripts).
    #[arg(long, conflicts_with = "dmon")]
    pub once: bool,
    /// Print one line per device every interval with fixed columns (like `nvidia-smi dmon`).
    #[arg(long)]
    pub dmon: bool,
    /// Seconds between scrapes (0.2 to 3600).
    #[arg(long, default_value_t = 1.0, value_parser = parse_interval)]
    pub interval: f64,
    /// With --dmon: stop after this many samples (default: until the run ends).
    #[arg(long, short = 'c', requires = "dmon")]
    pub count: Option<u64>,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.2..=3600.0).contains(&v) => Ok(v),
        Ok(v) => Err(format!("{v} s is outside 0.2 to 3600 seconds")),
        Err(_) => Err(format!("`{s}` is not a number of seconds")),
    }
}

pub fn run(args: MonitorArgs) -> CliResult {
    let scraper = Scraper::new(&args.target);
    let interval = Duration::from_secs_f64(args.interval);
    // The first scrape decides whether there is a run at all.
    let first = scraper.fetch()?;
    if args.once {
        print!("{}", plain::snapshot(scraper.url(), &first));
        return Ok(());
    }
    if args.dmon {
        return dmon(&scraper, first, interval, args.count);
    }
    if !std::io::stdout().is_terminal() {
        return Err(ObserveError::Terminal(std::io::Error::other("standard output is not a terminal")).into());
    }
    let (ended, last) = dashboard::run(&scraper, first, interval)?;
    if let Ended::Lost(e) = ended {
        println!("{}", gone_line(scraper.url(), &last, &e));
    }
    Ok(())
}

/// The line printed when a watched run stops answering.
fn gone_line(url: &str, last: &RunView, e: &ObserveError) -> String {
    // The short form of the reason: "nothing is listening there", not its explanation.
    let reason = match e {
        ObserveError::Unreachable { reason, .. } => reason.split(" (").next().unwrap_or(reason).to_string(),
        other => other.to_string(),
    };
    format!(
        "ferrite monitor: the run at {url} stopped answering at {} UTC ({reason}); last seen at epoch {}/{}, step {}",
        plain::clock(),
        last.train.epoch,
        last.train.epochs,
        last.train.steps_total
    )
}

fn dmon(scraper: &Scraper, first: RunView, interval: Duration, count: Option<u64>) -> CliResult {
    let mut out = std::io::stdout().lock();
    out.write_all(plain::dmon_header().as_bytes())?;
    let mut view = first;
    let mut printed = 0u64;
    loop {
        let started = Instant::now();
        out.write_all(plain::dmon_lines(&plain::clock(), &view).as_bytes())?;
        out.flush()?;
        printed += 1;
        if count.is_some_and(|c| printed >= c) {
            return Ok(());
        }
        std::thread::sleep(interval.saturating_sub(started.elapsed()));
        match scraper.fetch() {
            Ok(v) => view = v,
            Err(e) => {
                writeln!(out, "# {}", gone_line(scraper.url(), &view, &e))?;
                return Ok(());
            }
        }
    }
}
