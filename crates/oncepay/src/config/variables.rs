//! Every environment variable oncepay reads, in one table: `oncepay serve
//! --help` prints it, and a test holds both the README's configuration
//! table and the variables `config.rs` reads to it, so a variable cannot
//! be read without being documented, nor documented without being read.

/// One variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variable {
    /// Its name.
    pub name: &'static str,
    /// The subcommands that read it (`tests`: only the test suite).
    pub used_by: &'static str,
    /// Its default, as the README states it.
    pub default: &'static str,
}

const fn v(name: &'static str, used_by: &'static str, default: &'static str) -> Variable {
    Variable {
        name,
        used_by,
        default,
    }
}

/// The variables, in the README's order (its configuration table says
/// what each means).
pub(crate) const VARIABLES: &[Variable] = &[
    v(
        "DATABASE_URL",
        "serve, migrate, api-key",
        "postgres://postgres@127.0.0.1:5432/oncepay",
    ),
    v("ONCEPAY_BIND", "serve", "127.0.0.1:8080"),
    v("ONCEPAY_PROVIDER", "serve", "sandbox"),
    v("ONCEPAY_PROVIDER_URL", "serve", "http://127.0.0.1:8081"),
    v("ONCEPAY_STRIPE_SECRET_KEY", "serve", "none (Stripe off)"),
    v("ONCEPAY_STRIPE_API_BASE", "serve", "https://api.stripe.com"),
    v("ONCEPAY_STRIPE_TIMEOUT", "serve", "30s"),
    v(
        "ONCEPAY_STRIPE_WEBHOOK_SECRET",
        "serve",
        "none (Stripe webhooks refused)",
    ),
    v(
        "ONCEPAY_STRIPE_PUBLISHABLE_KEY",
        "serve",
        "none (test keys: the checkout takes a pm_… id)",
    ),
    v(
        "ONCEPAY_WEBHOOK_SECRET",
        "serve, sandbox",
        "public dev secret whsec_b25j…, allowed only when the process binds a loopback address",
    ),
    v("ONCEPAY_IDEMPOTENCY_TTL", "serve", "24h"),
    v("ONCEPAY_IDEMPOTENCY_WAIT", "serve", "2s"),
    v("ONCEPAY_IDEMPOTENCY_LEASE", "serve", "30s"),
    v("ONCEPAY_PROVIDER_TIMEOUT", "serve", "5s"),
    v("ONCEPAY_RECONCILE_INTERVAL", "serve", "2s"),
    v("ONCEPAY_RECONCILE_AFTER", "serve", "10s"),
    v("ONCEPAY_WEBHOOK_COMMAND_WAIT", "serve", "250ms"),
    v("ONCEPAY_PENDING_ALARM", "serve", "15m"),
    v("ONCEPAY_CHECKOUT_TTL", "serve", "1h"),
    v("ONCEPAY_ACTION_TIMEOUT", "serve", "1h"),
    v("ONCEPAY_BALANCE_HOLD_TTL", "serve", "15m"),
    v("ONCEPAY_STOCK_RESERVATION_TTL", "serve", "15m"),
    v("ONCEPAY_STOCK_CUSTOMER_OPEN_ORDERS", "serve", "3"),
    v("ONCEPAY_CAPTURE_REMINDER", "serve", "24h"),
    v(
        "ONCEPAY_PROVIDER_PUBLIC_URL",
        "serve",
        "ONCEPAY_PROVIDER_URL",
    ),
    v("ONCEPAY_PUBLIC_URL", "serve", "http:// + the bound address"),
    v("ONCEPAY_SWEEP_INTERVAL", "serve", "60s"),
    v("ONCEPAY_EVENT_RETENTION", "serve", "30d"),
    v("ONCEPAY_BOOKS_INTERVAL", "serve", "1h"),
    v("ONCEPAY_BOOKS_WINDOW", "serve", "26h"),
    v("ONCEPAY_BOOKS_READ_BACK_LIMIT", "serve, reconcile", "1000"),
    v("ONCEPAY_ORPHAN_POLICY", "serve, reconcile", "refund"),
    v("ONCEPAY_DB_START_TIMEOUT", "serve", "60s"),
    v("ONCEPAY_DB_POOL_SIZE", "serve", "8"),
    v("ONCEPAY_AUTH_CACHE_TTL", "serve", "30s"),
    v("ONCEPAY_REPLAY_CACHE_ENTRIES", "serve", "10000"),
    v("ONCEPAY_ORDER_BATCH_MAX", "serve", "64"),
    v("ONCEPAY_ORDER_BATCH_WRITERS", "serve", "1"),
    v("ONCEPAY_GROUP_COMMIT_MAX", "serve", "16"),
    v("ONCEPAY_GROUP_COMMIT_WRITERS", "serve", "2"),
    v("ONCEPAY_HTTP_WORKERS", "serve", "number of CPUs"),
    v("ONCEPAY_MAX_BODY_BYTES", "serve", "65536"),
    v("ONCEPAY_HEADER_TIMEOUT", "serve", "5s"),
    v("ONCEPAY_BODY_TIMEOUT", "serve", "10s"),
    v("ONCEPAY_SLOW_BODIES_PER_CLIENT", "serve", "32"),
    v("ONCEPAY_CHECKOUT_RATE_LIMIT_PER_SECOND", "serve", "2"),
    v("ONCEPAY_CHECKOUT_RATE_LIMIT_BURST", "serve", "20"),
    v(
        "ONCEPAY_CHECKOUT_ADDRESS_RATE_LIMIT_PER_SECOND",
        "serve",
        "20",
    ),
    v("ONCEPAY_CHECKOUT_ADDRESS_RATE_LIMIT_BURST", "serve", "100"),
    v("ONCEPAY_SHUTDOWN_TIMEOUT", "serve", "30s"),
    v("ONCEPAY_RATE_LIMIT_PER_SECOND", "serve", "100"),
    v("ONCEPAY_RATE_LIMIT_BURST", "serve", "200"),
    v("ONCEPAY_AUTH_FAILURE_RATE_LIMIT_PER_SECOND", "serve", "10"),
    v("ONCEPAY_AUTH_FAILURE_RATE_LIMIT_BURST", "serve", "50"),
    v(
        "ONCEPAY_WEBHOOK_SCHEDULE",
        "serve",
        "5s,5m,30m,2h,5h,10h,10h,24h,24h",
    ),
    v("ONCEPAY_WEBHOOK_TIMEOUT", "serve", "10s"),
    v("ONCEPAY_WEBHOOK_ALLOW_PRIVATE", "serve", "false"),
    v("ONCEPAY_WEBHOOK_INTERVAL", "serve", "250ms"),
    v("ONCEPAY_JWKS_MIN_REFRESH", "serve", "30s"),
    v("ONCEPAY_JWKS_MAX_AGE", "serve", "1h"),
    v("ONCEPAY_JWKS_STALE_MAX", "serve", "24h"),
    v("ONCEPAY_SANDBOX_BIND", "sandbox", "127.0.0.1:8081"),
    v(
        "ONCEPAY_SANDBOX_PUBLIC_URL",
        "sandbox",
        "http:// + the bound address",
    ),
    v(
        "ONCEPAY_SANDBOX_WEBHOOK_URL",
        "sandbox",
        "http://127.0.0.1:8080/webhooks/sandbox",
    ),
    v("ONCEPAY_SANDBOX_WEBHOOKS", "sandbox", "on"),
    v("ONCEPAY_SANDBOX_ASYNC_DELAY", "sandbox", "2s"),
    v("ONCEPAY_SANDBOX_CAPTURE_WINDOW", "sandbox", "7d"),
    v("ONCEPAY_SANDBOX_ERROR_RATE", "sandbox", "0"),
    v("ONCEPAY_SANDBOX_DROP_RATE", "sandbox", "0"),
    v("ONCEPAY_SANDBOX_DELAY_RATE", "sandbox", "0"),
    v("ONCEPAY_SANDBOX_DELAY", "sandbox", "0s"),
    v("ONCEPAY_SANDBOX_DUPLICATE_WEBHOOKS", "sandbox", "1"),
    v("ONCEPAY_SANDBOX_REORDER_WEBHOOKS", "sandbox", "off"),
    v("ONCEPAY_SANDBOX_FORGET_TRACE", "sandbox", "off"),
    v("ONCEPAY_LOG", "all", "info,sqlx=warn"),
    v("ONCEPAY_LOG_FORMAT", "all", "text"),
    v(
        "TEST_DATABASE_SERVER",
        "tests",
        "postgres://postgres@127.0.0.1:5432",
    ),
    v("ONCEPAY_TEST_RUN_ID", "tests", "generated"),
];

/// The table as `oncepay serve --help` prints it.
pub fn help() -> String {
    let width = VARIABLES.iter().map(|v| v.name.len()).max().unwrap_or(0);
    let mut out = String::from(
        "Configuration (environment variables; what each means: the README's configuration table):\n",
    );
    for v in VARIABLES.iter().filter(|v| v.used_by != "tests") {
        out += &format!(
            "  {:width$}  [{}] default: {}\n",
            v.name, v.used_by, v.default
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::VARIABLES;

    /// Names between `quote`s that look like variables.
    fn quoted(text: &str, quote: char) -> BTreeSet<String> {
        text.split(quote)
            .filter(|w| {
                (w.starts_with("ONCEPAY_") || ["DATABASE_URL", "TEST_DATABASE_SERVER"].contains(w))
                    && w.bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            })
            .map(str::to_string)
            .collect()
    }

    fn table() -> BTreeSet<String> {
        VARIABLES.iter().map(|v| v.name.to_string()).collect()
    }

    #[test]
    fn every_variable_the_code_reads_is_in_the_table_and_every_one_in_it_is_read() {
        // String literals only: a variable named in a comment is not read.
        let read = quoted(include_str!("../config.rs"), '"');
        let served: BTreeSet<String> = VARIABLES
            .iter()
            .filter(|v| v.used_by != "tests")
            .map(|v| v.name.to_string())
            .collect();
        let unlisted: Vec<_> = read.difference(&served).collect();
        let unread: Vec<_> = served.difference(&read).collect();
        assert!(
            unlisted.is_empty(),
            "read but not in the table: {unlisted:?}"
        );
        assert!(unread.is_empty(), "in the table but never read: {unread:?}");
    }

    #[test]
    fn the_readmes_configuration_table_is_this_table() {
        let readme = include_str!("../../../../README.md");
        let start = readme.find("## Configuration").expect("the section");
        let end = readme[start + 3..]
            .find("\n## ")
            .map_or(readme.len(), |e| start + 3 + e);
        let rows: Vec<&str> = readme[start..end]
            .lines()
            .filter(|l| l.starts_with("| `"))
            .collect();
        let mut documented = BTreeSet::new();
        for row in &rows {
            let first = row.split(" | ").next().unwrap_or_default();
            documented.extend(quoted(first, '`'));
        }
        let table = table();
        let undocumented: Vec<_> = table.difference(&documented).collect();
        let unknown: Vec<_> = documented.difference(&table).collect();
        assert!(
            undocumented.is_empty() && unknown.is_empty(),
            "missing from the README's table: {undocumented:?}; in it but not in config::variables: {unknown:?}"
        );
        for v in VARIABLES {
            let row = rows
                .iter()
                .find(|r| quoted(r.split(" | ").next().unwrap_or_default(), '`').contains(v.name))
                .expect("its row");
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").collect();
            let default = cells
                .get(2)
                .copied()
                .unwrap_or_default()
                .replace(['`', '*'], "");
            assert!(
                default.contains(v.default),
                "{}: the README says default {default:?}, the table {:?}",
                v.name,
                v.default
            );
        }
    }

    #[test]
    fn serve_help_lists_every_variable_the_service_reads() {
        let help = super::help();
        for v in VARIABLES.iter().filter(|v| v.used_by != "tests") {
            assert!(help.contains(v.name), "{}", v.name);
        }
    }
}
