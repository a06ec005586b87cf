//! What an on-call engineer gets on day one: every counter exported at 0
//! from the first scrape, process and pool metrics, and alert rules and a
//! dashboard that name only metrics the service really exports, with the
//! alerts unit-tested by `promtool`.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::json;

use crate::helpers::*;

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// Sample lines (no comments) of a scrape.
async fn scrape(app: &TestApp) -> String {
    app.get("/metrics").await.text().await.expect("text")
}

fn value_of(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn a_fresh_service_exports_every_counter_at_zero_and_its_process() {
    let app = spawn_app().await;
    let text = scrape(&app).await;
    for series in [
        r#"oncepay_incidents_total{kind="charge_on_failed_attempt"}"#,
        r#"oncepay_incidents_total{kind="refund_on_failed_refund"}"#,
        r#"oncepay_pending_alarms_total{kind="payment"}"#,
        r#"oncepay_pending_alarms_total{kind="refund"}"#,
        r#"oncepay_webhook_deliveries_total{outcome="gave_up"}"#,
        r#"oncepay_webhook_deliveries_total{outcome="delivered"}"#,
        r#"oncepay_webhook_confirmations_total{result="mismatch"}"#,
        r#"oncepay_webhooks_total{outcome="bad_signature"}"#,
        r#"oncepay_idempotency_total{outcome="key_reused"}"#,
        r#"oncepay_payment_transitions_total{cause="webhook",status="succeeded"}"#,
        r#"oncepay_refund_transitions_total{cause="reconciler",status="failed"}"#,
        r#"oncepay_provider_calls_total{operation="charge",outcome="unknown"}"#,
        r#"oncepay_provider_calls_total{operation="charge",outcome="our_bug"}"#,
        r#"oncepay_provider_auth_refused_total{operation="charge",provider="stripe"}"#,
        r#"oncepay_reconciler_total{kind="payment",outcome="error"}"#,
        r#"oncepay_oldest_pending_seconds{kind="payment"}"#,
        r#"oncepay_disputes_total{provider="sandbox",status="needs_response"}"#,
        r#"oncepay_disputes_total{provider="stripe",status="lost"}"#,
        "oncepay_disputes_evidence_due_soon",
        "oncepay_sweeper_deleted_total",
        "oncepay_rate_limited_total",
        "oncepay_reconciler_last_pass_timestamp_seconds",
    ] {
        assert_eq!(value_of(&text, series), Some(0.0), "{series} at 0:\n{text}");
    }
    // This scrape itself is in flight.
    assert!(value_of(&text, "oncepay_http_requests_in_flight") >= Some(1.0));
    for series in [
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_start_time_seconds",
        r#"oncepay_db_pool_max_connections{pool="main"}"#,
        r#"oncepay_db_pool_max_connections{pool="claims"}"#,
    ] {
        assert!(
            value_of(&text, series).is_some_and(|v| v > 0.0),
            "{series} > 0:\n{text}"
        );
    }
    for pool in ["main", "claims"] {
        let waited = value_of(
            &text,
            &format!(r#"oncepay_db_pool_acquire_seconds{{pool="{pool}"}}"#),
        );
        assert!(
            waited.is_some_and(|w| (0.0..1.0).contains(&w)),
            "{pool}: {waited:?}"
        );
    }
    let build = text
        .lines()
        .find(|l| l.starts_with("oncepay_build_info{"))
        .expect("build info");
    assert!(build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))));
    assert!(build.ends_with(" 1"), "{build}");
    // Every counter family has samples: none reads "no data".
    let mut counters = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.strip_suffix(" counter") {
                counters.insert(name.to_string());
            }
        }
    }
    for name in counters {
        assert!(
            text.lines()
                .any(|l| !l.starts_with('#') && l.starts_with(&name)),
            "{name} has no sample"
        );
    }
}

/// The metric names an expression file uses (`oncepay_…`, `process_…`).
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    for start in ["oncepay_", "process_"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(start) {
            let at = from + at;
            let boundary = at == 0
                || !(bytes[at - 1].is_ascii_alphanumeric()
                    || bytes[at - 1] == b'_'
                    || bytes[at - 1] == b':');
            let end = text[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(text.len(), |e| at + e);
            if boundary {
                names.insert(text[at..end].to_string());
            }
            from = end;
        }
    }
    names
}

#[tokio::test]
async fn every_metric_the_alerts_and_the_dashboard_name_is_exported() {
    let app = spawn_app().await;
    // A short load: an order paid and refunded, a provider call of each kind.
    let order = app.create_order().await;
    let (_, paid) = app.pay(&order, "tok_visa").await;
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    app.post(&path, "r1", &json!({"amount": 100})).await;
    oncepay::workers::reconciler::pass(&app.ctx)
        .await
        .expect("a reconciler pass");
    let text = scrape(&app).await;
    let exported: BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    for file in ["ops/prometheus/alerts.yml", "ops/grafana/oncepay.json"] {
        let source = std::fs::read_to_string(repo_file(file)).expect(file);
        let names = names_in(&source);
        assert!(names.len() > 10, "{file} names {names:?}");
        for name in names {
            assert!(
                exported.contains(name.as_str()),
                "{file} uses {name}, which a scrape does not show"
            );
        }
    }
}

#[tokio::test]
async fn the_alert_rules_pass_promtool_with_a_firing_and_a_silent_case_each() {
    let found = std::process::Command::new("promtool")
        .arg("--version")
        .output();
    if found.is_err() {
        assert!(
            std::env::var_os("ONCEPAY_REQUIRE_PROMTOOL").is_none(),
            "ONCEPAY_REQUIRE_PROMTOOL is set but promtool is missing (apt-get install prometheus)"
        );
        eprintln!("SKIPPED: no promtool (Debian's prometheus package)");
        return;
    }
    let dir = repo_file("ops/prometheus");
    for args in [
        vec!["check", "rules", "alerts.yml"],
        vec!["test", "rules", "alerts_test.yml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(&args)
            .current_dir(&dir)
            .output()
            .expect("promtool runs");
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Each alert is tested both ways (read with PyYAML, as the rules are YAML).
    let check = r#"
import sys, yaml
rules = yaml.safe_load(open('alerts.yml'))
tests = yaml.safe_load(open('alerts_test.yml'))['tests']
alerts = {r['alert'] for g in rules['groups'] for r in g['rules'] if 'alert' in r}
fires, silent = set(), set()
for t in tests:
    for case in t.get('alert_rule_test', []):
        (fires if case.get('exp_alerts') else silent).add(case['alertname'])
missing = sorted((alerts - fires) | (alerts - silent))
print(len(alerts), 'alerts')
sys.exit('untested both ways: %s' % missing if missing else 0)
"#;
    python_passes(&dir, &["-c", check]);
}
