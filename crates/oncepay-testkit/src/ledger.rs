//! The sandbox's books (`GET /v1/ledger`): per provider key, the requests
//! received and the effects made. How tests and harnesses count charges.

use serde_json::Value;

/// The totals of the sandbox's ledger at `base` (`GET /v1/ledger/totals`,
/// the `totals` of [`read`]): cheap to poll while load runs.
pub async fn totals(http: &reqwest::Client, base: &str) -> Result<Value, String> {
    get(
        http,
        &format!("{base}/v1/ledger/totals"),
        "the sandbox ledger's totals",
    )
    .await
}

/// The ledger of the sandbox at `base`.
pub async fn read(http: &reqwest::Client, base: &str) -> Result<Value, String> {
    get(http, &format!("{base}/v1/ledger"), "the sandbox ledger").await
}

async fn get(http: &reqwest::Client, url: &str, what: &str) -> Result<Value, String> {
    http.get(url)
        .send()
        .await
        .map_err(|e| format!("reading {what}: {e}"))?
        .json()
        .await
        .map_err(|e| format!("{what} is not JSON: {e}"))
}

/// The ledger entry of the charge made with provider key `key` (our
/// payment attempt id), if the sandbox holds one.
pub fn charge<'a>(ledger: &'a Value, key: &str) -> Option<&'a Value> {
    ledger["charges"]
        .as_array()?
        .iter()
        .find(|c| c["idempotency_key"] == key)
}
