//! The Grafana dashboard shipped in `deploy/` only names metrics ferrite exports (this runs
//! without Prometheus; `prometheus_scrape.rs` also evaluates every query on a real server).

use ferrite_memory::Device;
use ferrite_train::observe::RunInfo;
use ferrite_train::observe::exposition::RunMetrics;
use ferrite_train::observe::metrics_text::parse_metrics_text;

#[test]
fn the_dashboard_queries_name_exported_series() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(repo.join("deploy/grafana-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let m = RunMetrics::new(
        RunInfo { version: "v".into(), model: "m".into(), dataset: "d".into(), device: "cpu".into() },
        vec![Device::parse("sim:a100-40gb:3").unwrap()],
    );
    m.live.loss.store(1.0);
    m.live.learning_rate.store(1e-3);
    m.live.grad_scale.store(1024.0);
    let exported = parse_metrics_text(&m.encode_text()).unwrap();
    let mut named = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for (i, _) in expr.match_indices("ferrite_") {
                let name: String = expr[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                assert!(
                    exported.samples.iter().any(|s| s.name == name),
                    "panel `{}` queries `{name}`, which ferrite does not export",
                    panel["title"]
                );
                named += 1;
            }
        }
    }
    assert!(named >= 15, "{named}");
}
