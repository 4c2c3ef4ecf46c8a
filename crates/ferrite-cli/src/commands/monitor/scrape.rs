//! Fetching a run's `/metrics` over HTTP (`ureq`, plain HTTP, no proxy) and turning what comes
//! back into a [`RunView`] or an error that says what is at that address instead.

use std::time::Duration;

use ferrite_train::observe::ObserveError;
use ferrite_train::observe::metrics_addr::Target;
use ferrite_train::observe::metrics_text::parse_metrics_text;

use super::run_view::RunView;

/// A run that does not answer within this time is reported as not answering.
const TIMEOUT: Duration = Duration::from_secs(3);
/// ferrite's exposition is a few kilobytes; anything this large is not a ferrite run.
const MAX_BODY: u64 = 8 << 20;

/// An HTTP client for one target.
pub struct Scraper {
    agent: ureq::Agent,
    url: String,
}

impl Scraper {
    pub fn new(target: &Target) -> Scraper {
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(TIMEOUT))
            .http_status_as_error(false)
            // A run on this machine must not be fetched through an HTTP proxy from the environment.
            .proxy(None)
            .build();
        Scraper { agent: config.new_agent(), url: target.url() }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// One scrape: the body of a 200 answer.
    pub fn fetch_text(&self) -> Result<String, ObserveError> {
        let mut response = self.agent.get(&self.url).call().map_err(|e| self.unreachable(e))?;
        let status = response.status().as_u16();
        if status != 200 {
            let hint = if status == 404 {
                " (a ferrite run serves /metrics; check the path)".to_string()
            } else {
                String::new()
            };
            return Err(ObserveError::HttpStatus { url: self.url.clone(), status, hint });
        }
        response.body_mut().with_config().limit(MAX_BODY).read_to_string().map_err(|e| match e {
            ureq::Error::BodyExceedsLimit(_) => ObserveError::NotFerrite {
                url: self.url.clone(),
                reason: format!("its answer is larger than {} MiB", MAX_BODY >> 20),
            },
            other => self.unreachable(other),
        })
    }

    /// One scrape, read as a ferrite run.
    pub fn fetch(&self) -> Result<RunView, ObserveError> {
        let text = self.fetch_text()?;
        let parsed = parse_metrics_text(&text).map_err(|e| ObserveError::NotFerrite {
            url: self.url.clone(),
            reason: format!("its answer is not in the Prometheus text format (line {}: {})", e.line, e.reason),
        })?;
        RunView::from_metrics(&parsed).map_err(|reason| ObserveError::NotFerrite { url: self.url.clone(), reason })
    }

    fn unreachable(&self, e: ureq::Error) -> ObserveError {
        let reason = match &e {
            ureq::Error::Protocol(p) => {
                return ObserveError::NotFerrite {
                    url: self.url.clone(),
                    reason: format!("it does not answer in HTTP ({p})"),
                };
            }
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                "nothing is listening there (the run has ended, or it was started without --metrics-addr)".to_string()
            }
            ureq::Error::ConnectionFailed => {
                "the connection failed (nothing is listening there, or a firewall drops it)".to_string()
            }
            ureq::Error::Timeout(_) => format!("no answer within {} s", TIMEOUT.as_secs()),
            ureq::Error::HostNotFound => "the host name does not resolve".to_string(),
            ureq::Error::Io(io) => io.to_string(),
            other => other.to_string(),
        };
        ObserveError::Unreachable { url: self.url.clone(), reason }
    }
}
