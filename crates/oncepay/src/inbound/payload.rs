//! What PostgreSQL cannot store of a provider's payload: U+0000 in a
//! string or a key (`text` and `jsonb` refuse it). A signed event holding
//! one is kept with its NULs written out, so nothing a provider sends is
//! lost or retried for ever.

use serde_json::Value;

/// The path of the first string or key holding U+0000, which PostgreSQL
/// cannot store (`text`, `jsonb`).
pub(crate) fn nul_at(value: &Value, path: &mut String) -> Option<String> {
    match value {
        Value::String(s) if s.contains('\0') => Some(path.clone()),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| {
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            let found = nul_at(v, path);
            path.truncate(len);
            found
        }),
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            let len = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(k);
            let found = if k.contains('\0') {
                Some(path.clone())
            } else {
                nul_at(v, path)
            };
            path.truncate(len);
            found
        }),
        _ => None,
    }
}

/// Every U+0000 written as the six characters `\u0000`, so the value can
/// be stored and a person reads where it was.
pub(crate) fn without_nul(value: &Value) -> Value {
    let clean = |s: &str| s.replace('\0', "\\u0000");
    match value {
        Value::String(s) => Value::String(clean(s)),
        Value::Array(items) => Value::Array(items.iter().map(without_nul).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (clean(k), without_nul(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}
