//! A real Prometheus server (Debian's `prometheus` package) scrapes a running `ferrite train`,
//! and its query API shows the series arrived with sane values. Skips loudly without the package,
//! fails without it when `FERRITE_REQUIRE_SYSTEM_DEPS=1` (CI installs it in `.ci/run`).
//!
//! The server runs the repository's own scrape configuration (`deploy/prometheus.yml`, checked
//! with `promtool`), pointed at the run, and evaluates every query of the Grafana dashboard
//! (`deploy/grafana-dashboard.json`) against the scraped series.
//!
//! Everything stays on loopback: Prometheus listens on 127.0.0.1 and scrapes 127.0.0.1.

mod common;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{require_or_skip, start_live_run, try_http_get, wait_for};

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The result of an instant query: every series as (labels, value); `Err` with Prometheus's
/// message when the query is refused.
fn query_all(api: &str, promql: &str) -> Result<Vec<(serde_json::Value, f64)>, String> {
    let url = format!("{api}/api/v1/query?query={}", encode(promql));
    let (status, body) = try_http_get(&url).map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    if status != 200 || v["status"] != "success" {
        return Err(format!("HTTP {status}: {body}"));
    }
    let series = v["data"]["result"].as_array().cloned().unwrap_or_default();
    Ok(series
        .into_iter()
        .map(|s| {
            let value = s["value"][1].as_str().and_then(|x| x.parse().ok()).unwrap_or(f64::NAN);
            (s["metric"].clone(), value)
        })
        .collect())
}

/// The first result of an instant query, as (labels, value).
fn query(api: &str, promql: &str) -> Option<(serde_json::Value, f64)> {
    let url = format!("{api}/api/v1/query?query={}", encode(promql));
    let (status, body) = try_http_get(&url).ok()?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let first = v["data"]["result"].as_array()?.first()?.clone();
    let value = first["value"][1].as_str()?.parse().ok()?;
    Some((first["metric"].clone(), value))
}

/// Percent-encoding for a query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn prometheus_scrapes_a_training_run() {
    if !require_or_skip("prometheus", "prometheus") {
        return;
    }
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let shipped = std::fs::read_to_string(repo.join("deploy/prometheus.yml")).unwrap();
    if require_or_skip("promtool", "prometheus") {
        let o = Command::new("promtool")
            .arg("check")
            .arg("config")
            .arg(repo.join("deploy/prometheus.yml"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    }
    let dir = tempfile::tempdir().unwrap();
    // f16 autocast, so the GradScaler's series exist too.
    let run = start_live_run(dir.path(), &["--device", "sim:a100-40gb", "--amp", "f16"]);
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // The shipped configuration, pointed at this run and scraping every second to keep the test short.
    assert!(shipped.contains("'127.0.0.1:9400'") && shipped.contains("scrape_interval: 5s"), "{shipped}");
    let config = shipped
        .replace("'127.0.0.1:9400'", &format!("'{}'", run.addr))
        .replace("scrape_interval: 5s", "scrape_interval: 1s")
        .replace("scrape_timeout: 4s", "scrape_timeout: 1s");
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    let _prometheus = Prometheus(
        Command::new("prometheus")
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts"),
    );
    let api = format!("http://127.0.0.1:{port}");
    // Prometheus needs a few seconds to start and scrape twice.
    let steps =
        wait_for(Duration::from_secs(90), || query(&api, "ferrite_train_steps_total").filter(|(_, v)| *v > 0.0))
            .expect("Prometheus has ferrite_train_steps_total from the run within 90 s");
    assert_eq!(steps.0["job"], "ferrite");

    let (up, v) = query(&api, "up{job=\"ferrite\"}").unwrap();
    assert_eq!(v, 1.0, "{up}");
    let (info, _) = query(&api, "ferrite_run_info").unwrap();
    assert_eq!((info["dataset"].as_str(), info["device"].as_str()), (Some("digits"), Some("sim:a100-40gb:0")));
    let gpu = "{device=\"sim:a100-40gb:0\"}";
    let allocated = query(&api, &format!("ferrite_memory_allocated_bytes{gpu}")).unwrap().1;
    let reserved = query(&api, &format!("ferrite_memory_reserved_bytes{gpu}")).unwrap().1;
    let capacity = query(&api, &format!("ferrite_memory_capacity_bytes{gpu}")).unwrap().1;
    // Weights and AdamW's two moments (26,122 f32 each) stay allocated after the first step.
    assert!(allocated >= (3 * 26_122 * 4) as f64 && reserved >= allocated && capacity > 39.0 * (1u64 << 30) as f64);
    assert_eq!(query(&api, &format!("ferrite_memory_ooms_total{gpu}")).unwrap().1, 0.0);
    let loss = query(&api, "ferrite_train_loss").unwrap().1;
    assert!(loss.is_finite() && (0.0..5.0).contains(&loss), "loss {loss}");
    // PromQL over the histogram: the mean batch time is positive and below a second.
    let mean = wait_for(Duration::from_secs(30), || {
        query(
            &api,
            "rate(ferrite_train_batch_duration_seconds_sum[10s]) / rate(ferrite_train_batch_duration_seconds_count[10s])",
        )
        .filter(|(_, v)| v.is_finite())
    })
    .expect("two scrapes of the histogram")
    .1;
    assert!(mean > 0.0 && mean < 1.0, "mean batch time {mean} s");
    let wait = query(&api, "ferrite_train_loader_wait_ratio").unwrap().1;
    assert!((0.0..=1.0).contains(&wait), "{wait}");
    let scale = query(&api, "ferrite_train_grad_scale").unwrap().1;
    assert!(scale >= 1.0 && scale.log2().fract() == 0.0, "loss scale {scale}");

    // Every query of the Grafana dashboard is valid PromQL and finds series of this run.
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo.join("deploy/grafana-dashboard.json")).unwrap()).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap().to_string()))
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    for expr in exprs {
        let promql = expr.replace("$job", "ferrite").replace("$__rate_interval", "10s");
        let series = wait_for(Duration::from_secs(30), || query_all(&api, &promql).ok().filter(|s| !s.is_empty()))
            .unwrap_or_else(|| panic!("the dashboard query `{promql}` found nothing: {:?}", query_all(&api, &promql)));
        assert!(series.iter().any(|(_, v)| v.is_finite()), "`{promql}`: {series:?}");
    }
}
