//! schemathesis (PyPI) against the served `openapi.yaml`: generated and
//! stateful requests, every check on (no 5xx; every status, header, content
//! type and body as documented). `make test` installs schemathesis when it
//! is missing; `tests/schemathesis.toml` says why two 422s are expected.

use crate::helpers::*;

#[tokio::test]
async fn the_served_document_holds_under_schemathesis() {
    let app = spawn_app().await;
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/schemathesis.toml");
    let out = tokio::process::Command::new("schemathesis")
        .args(["--config-file", config, "--no-color", "run"])
        .arg(format!("{}/openapi.yaml", app.base))
        .args(["-H", &format!("Authorization: Bearer {}", app.key)])
        // One worker: with two, hypothesis parses lambdas' source with `ast`
        // in two threads at once, which CPython 3.11 answers with a spurious
        // "AST constructor recursion depth mismatch" now and then.
        .args(["--checks", "all", "--max-examples", "40", "--workers", "1"])
        // `--checks all` outranks the config file's switch: ST302's false
        // positive on a replayed, deleted webhook endpoint (see the config)
        // is excluded here, where it holds.
        .args(["--exclude-checks", "ensure_resource_availability"])
        // Minting keys (and expiring the calling one) or revoking one (the
        // stateful phase finds the calling key's id in GET /api_keys) would
        // change the identity the rest of the run authenticates with, and
        // every later request would be a 401; api_keys.rs tests both.
        .args(["--exclude-operation-id", "createApiKey"])
        .args(["--exclude-operation-id", "revokeApiKey"])
        .output()
        .await
        .expect("schemathesis is installed (make test installs it: python3 -m pip install schemathesis)");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        report.contains("Tested: 32"),
        "every operation was exercised:\n{report}"
    );
}
