//! The command line of the `oncepay` binary (contract section 1), declared
//! with clap: `oncepay --help` lists the subcommands, and a wrong argument
//! is an error that names it. Configuration comes from the environment
//! (see `config`), never from flags, so tools and tests drive every
//! process the same way.

use clap::{Parser, Subcommand};

/// `oncepay`: the service, its migrations, the sandbox provider and API keys.
#[derive(Debug, Parser, PartialEq, Eq)]
#[command(
    name = "oncepay",
    version,
    about = "oncepay — payments microservice: one intent, one effect",
    after_help = "Configuration is read from environment variables: `oncepay serve --help` lists them."
)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand, PartialEq, Eq)]
pub enum Command {
    /// Apply pending migrations, serve the API, run the workers.
    #[command(after_help = crate::config::variables::help())]
    Serve,
    /// Apply pending migrations and exit.
    Migrate,
    /// Run the sandbox payment provider.
    Sandbox,
    /// Manage API keys.
    #[command(subcommand, name = "api-key")]
    ApiKey(ApiKeyCommand),
    /// Manage merchants.
    #[command(subcommand)]
    Merchant(MerchantCommand),
    /// The double-entry ledger of customer balances and stock.
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// Reconcile a window of every configured provider's books with the
    /// database: rebuild rows the database lost from the providers'
    /// metadata, refund (or hold) charges no order can own, and record
    /// every disagreement as an incident. Prints the report.
    Reconcile {
        /// The window's start: a duration before now (`2h`, `90m`) or an
        /// RFC 3339 time.
        #[arg(long, value_parser = point_in_time)]
        since: PointInTime,
        /// The window's end (default: now), in the same forms.
        #[arg(long, value_parser = point_in_time)]
        until: Option<PointInTime>,
        /// Report what would be done, changing nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// A point in time on the command line: a duration back from now, or a
/// moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointInTime {
    /// This long before now.
    Ago(std::time::Duration),
    /// This moment.
    At(chrono::DateTime<chrono::Utc>),
}

impl PointInTime {
    /// The moment, counted back from `now`.
    pub fn resolve(self, now: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
        match self {
            PointInTime::Ago(d) => now - chrono::Duration::from_std(d).unwrap_or_default(),
            PointInTime::At(t) => t,
        }
    }
}

fn display_name(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.chars().count() > 100 || text.chars().any(char::is_control) {
        return Err("1 to 100 characters, no control characters".into());
    }
    Ok(text.to_string())
}

fn point_in_time(text: &str) -> Result<PointInTime, String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(PointInTime::At(t.with_timezone(&chrono::Utc)));
    }
    crate::config::parse_duration(text)
        .map(PointInTime::Ago)
        .map_err(|e| format!("expected a duration before now (2h) or an RFC 3339 time: {e}"))
}

/// `oncepay merchant …`.
#[derive(Debug, Subcommand, PartialEq, Eq)]
pub enum MerchantCommand {
    /// Set what customers see of the merchant on the checkout page.
    Set {
        /// The merchant's name.
        #[arg(long, value_parser = merchant_name)]
        merchant: String,
        /// The name shown to customers (1 to 100 characters; an empty
        /// value shows the merchant's name again).
        #[arg(long, value_parser = display_name)]
        display_name: String,
    },
    /// Give a merchant its own rate limit (every process picks it up within
    /// ONCEPAY_AUTH_CACHE_TTL), or with --default return it to the
    /// process default (ONCEPAY_RATE_LIMIT_PER_SECOND / _BURST).
    RateLimit {
        /// The merchant's name.
        #[arg(long, value_parser = merchant_name)]
        merchant: String,
        /// Requests per second, sustained.
        #[arg(long, required_unless_present = "default", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        per_second: Option<u32>,
        /// Requests admitted at once after a quiet spell.
        #[arg(long, required_unless_present = "default", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        burst: Option<u32>,
        /// Drop the merchant's own limit.
        #[arg(long, conflicts_with_all = ["per_second", "burst"])]
        default: bool,
    },
    /// Trust the merchant's own identity provider: bearer tokens (JWTs)
    /// it issues for --audience, signed by a key of --jwks-url, act as a
    /// customer (on its own orders and payments) or a seller (as a key
    /// with read and write) by their roles claim; or with --remove trust
    /// it no more. Audited. An issuer belongs to at most one merchant.
    Identity {
        /// The merchant's name.
        #[arg(long, value_parser = merchant_name)]
        merchant: String,
        /// The `iss` of its tokens.
        #[arg(long, required_unless_present = "remove", value_parser = identity_text)]
        issuer: Option<String>,
        /// Where its public keys are published (https://; http:// only to
        /// a loopback address).
        #[arg(long, required_unless_present = "remove", value_parser = jwks_url)]
        jwks_url: Option<String>,
        /// What its tokens' `aud` must contain.
        #[arg(long, required_unless_present = "remove", value_parser = identity_text)]
        audience: Option<String>,
        /// The claim holding a token's roles (a string or an array:
        /// `customer`, `seller`).
        #[arg(long, default_value = "roles", value_parser = roles_claim)]
        roles_claim: String,
        /// The one `typ` its tokens must carry (`at+jwt` for RFC 9068
        /// access tokens, say; a media type, `application/` implied).
        /// Without it: no `typ`, `JWT` or `at+jwt`. Tokens of any other
        /// kind it signs (`logout+jwt`, `secevent+jwt`, ...) are refused.
        #[arg(long, value_parser = token_type)]
        token_type: Option<String>,
        /// The algorithms it signs with, comma-separated: RS256, PS256,
        /// ES256, EdDSA. An RSA key of its JWKS that names no `alg`
        /// verifies one of them only: RS256, or PS256 if RS256 is not
        /// listed.
        #[arg(long, default_value = "RS256,PS256,ES256,EdDSA", value_parser = algorithms)]
        algorithms: crate::identity::token::Algorithms,
        /// Trust the merchant's identity provider no more.
        #[arg(long, conflicts_with_all = ["issuer", "jwks_url", "audience", "token_type"])]
        remove: bool,
    },
    /// Show a merchant's settings: its identity provider.
    Show {
        /// The merchant's name.
        #[arg(long, value_parser = merchant_name)]
        merchant: String,
    },
}

/// `oncepay merchant identity`'s issuer and audience: 1 to 2048
/// characters, no control characters.
fn identity_text(text: &str) -> Result<String, String> {
    bounded_text(text, 2048)
}

/// `oncepay merchant identity`'s roles claim: 1 to 100 characters.
fn roles_claim(text: &str) -> Result<String, String> {
    bounded_text(text, 100)
}

/// `oncepay merchant identity --token-type`: a media type of RFC 6838's
/// characters (`at+jwt`, `application/at+jwt`), at most 100 characters.
fn token_type(text: &str) -> Result<String, String> {
    let name = |part: &str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b))
    };
    let fits = text.len() <= 100
        && match text.split_once('/') {
            Some((kind, subtype)) => name(kind) && name(subtype),
            None => name(text),
        };
    if fits {
        Ok(text.to_string())
    } else {
        Err("a media type such as at+jwt or application/at+jwt, at most 100 characters".into())
    }
}

/// `oncepay merchant identity --algorithms`: comma-separated JOSE names.
fn algorithms(text: &str) -> Result<crate::identity::token::Algorithms, String> {
    crate::identity::token::Algorithms::parse(text.split(','))
}

fn bounded_text(text: &str, max: usize) -> Result<String, String> {
    if text.is_empty() || text.chars().count() > max || text.chars().any(char::is_control) {
        return Err(format!("1 to {max} characters, no control characters"));
    }
    Ok(text.to_string())
}

fn jwks_url(text: &str) -> Result<String, String> {
    crate::identity::jwks::check_url(text).map(|_| text.to_string())
}

/// `oncepay ledger …`.
#[derive(Debug, Subcommand, PartialEq, Eq)]
pub enum LedgerCommand {
    /// Verify the ledger's rules: per merchant, ledger and unit the
    /// accounts sum to zero, every holder's totals equal its transfers, no
    /// holder is below zero or holds more than it has, no hold is resolved
    /// twice, captured above itself or after its expiry. Prints one line
    /// per merchant and unit; exits non-zero on any breach.
    Check {
        /// Only this merchant.
        #[arg(long, value_parser = merchant_name)]
        merchant: Option<String>,
    },
}

/// `oncepay api-key …`.
#[derive(Debug, Subcommand, PartialEq, Eq)]
pub enum ApiKeyCommand {
    /// Create a merchant if needed and a new API key; the key is printed
    /// once, alone on the last line (only its hash is stored).
    Create {
        /// The merchant's name, 1 to 100 characters.
        #[arg(long, value_parser = merchant_name)]
        merchant: String,
        /// What the key may do, comma-separated: read (GETs), write
        /// (orders, payments, refunds, cancel, checkout sessions), admin
        /// (API keys, webhook endpoints, redelivery, the audit trail).
        #[arg(long, default_value = "read,write,admin", value_parser = scopes)]
        scope: crate::api_keys::Scopes,
    },
    /// List a merchant's keys (prefix, created, last used, expires, revoked).
    List {
        /// The merchant's name.
        #[arg(long, value_parser = merchant_name)]
        merchant: String,
    },
    /// Revoke a key by its id (as `list` shows it), in every process at once.
    Revoke {
        /// The key's id.
        #[arg(long)]
        id: uuid::Uuid,
    },
}

fn scopes(text: &str) -> Result<crate::api_keys::Scopes, String> {
    crate::api_keys::Scopes::parse(text.split(','))
}

fn merchant_name(name: &str) -> Result<String, String> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 100 {
        return Err("the merchant name must be 1 to 100 characters".into());
    }
    Ok(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("oncepay").chain(s.split_whitespace()))
    }

    fn command(s: &str) -> Command {
        p(s).expect("parses").command
    }

    #[test]
    fn subcommands_parse() {
        assert_eq!(command("serve"), Command::Serve);
        assert_eq!(command("migrate"), Command::Migrate);
        assert_eq!(command("sandbox"), Command::Sandbox);
        let create = Command::ApiKey(ApiKeyCommand::Create {
            merchant: "acme".into(),
            scope: crate::api_keys::Scopes::ALL,
        });
        assert_eq!(command("api-key create --merchant acme"), create);
        assert_eq!(command("api-key create --merchant=acme"), create);
        let read_write = crate::api_keys::Scopes::parse(["read", "write"]).expect("scopes");
        assert_eq!(
            command("api-key create --merchant acme --scope read,write"),
            Command::ApiKey(ApiKeyCommand::Create {
                merchant: "acme".into(),
                scope: read_write,
            })
        );
        assert!(p("api-key create --merchant acme --scope read,root").is_err());
        assert!(p("api-key create --merchant acme --scope ,").is_err());
        assert_eq!(
            command("api-key list --merchant acme"),
            Command::ApiKey(ApiKeyCommand::List {
                merchant: "acme".into()
            })
        );
        assert!(p("api-key revoke --id not-a-uuid").is_err());
        assert_eq!(
            command("merchant rate-limit --merchant acme --per-second 5 --burst 10"),
            Command::Merchant(MerchantCommand::RateLimit {
                merchant: "acme".into(),
                per_second: Some(5),
                burst: Some(10),
                default: false
            })
        );
        assert!(p("merchant rate-limit --merchant acme --default").is_ok());
        assert!(p("merchant rate-limit --merchant acme --per-second 5").is_err());
        assert!(p("merchant rate-limit --merchant acme --per-second 0 --burst 1").is_err());
        assert!(p("merchant rate-limit --merchant acme --default --burst 1").is_err());
        assert_eq!(
            command(
                "merchant identity --merchant acme --issuer https://idp.acme --jwks-url https://idp.acme/jwks --audience oncepay"
            ),
            Command::Merchant(MerchantCommand::Identity {
                merchant: "acme".into(),
                issuer: Some("https://idp.acme".into()),
                jwks_url: Some("https://idp.acme/jwks".into()),
                audience: Some("oncepay".into()),
                roles_claim: "roles".into(),
                token_type: None,
                algorithms: crate::identity::token::Algorithms::ALL,
                remove: false,
            })
        );
        assert_eq!(
            command(
                "merchant identity --merchant acme --issuer https://idp.acme --jwks-url https://idp.acme/jwks --audience oncepay --token-type at+jwt --algorithms PS256,ES256"
            ),
            Command::Merchant(MerchantCommand::Identity {
                merchant: "acme".into(),
                issuer: Some("https://idp.acme".into()),
                jwks_url: Some("https://idp.acme/jwks".into()),
                audience: Some("oncepay".into()),
                roles_claim: "roles".into(),
                token_type: Some("at+jwt".into()),
                algorithms: crate::identity::token::Algorithms::parse(["PS256", "ES256"])
                    .expect("algorithms"),
                remove: false,
            })
        );
        let identity = "merchant identity --merchant acme --issuer i --jwks-url https://idp.acme/jwks --audience a";
        for bad in [
            "--token-type at jwt",
            "--token-type a/b/c",
            "--token-type /jwt",
            "--algorithms HS256",
            "--algorithms RS256,none",
        ] {
            assert!(p(&format!("{identity} {bad}")).is_err(), "{bad}");
        }
        assert!(p("merchant identity --merchant acme --remove --token-type at+jwt").is_err());
        assert!(p("merchant identity --merchant acme --remove").is_ok());
        assert!(p("merchant identity --merchant acme --issuer i --audience a").is_err());
        assert!(p("merchant identity --merchant acme --remove --issuer i").is_err());
        assert!(p(
            "merchant identity --merchant acme --issuer i --jwks-url http://idp.acme/jwks --audience a"
        )
        .is_err());
        assert_eq!(
            command("merchant show --merchant acme"),
            Command::Merchant(MerchantCommand::Show {
                merchant: "acme".into()
            })
        );
        assert_eq!(
            command("ledger check"),
            Command::Ledger(LedgerCommand::Check { merchant: None })
        );
        assert_eq!(
            command("ledger check --merchant acme"),
            Command::Ledger(LedgerCommand::Check {
                merchant: Some("acme".into())
            })
        );
    }

    #[test]
    fn mistakes_are_errors_naming_the_argument() {
        let err = p("api-key create")
            .expect_err("needs a merchant")
            .to_string();
        assert!(err.contains("--merchant"), "{err}");
        assert!(p("serve now").is_err());
        assert!(p("launch").is_err());
        let long = format!("api-key create --merchant {}", "x".repeat(101));
        let err = p(&long).expect_err("too long").to_string();
        assert!(err.contains("1 to 100"), "{err}");
        let help = p("--help").expect_err("help is an early exit");
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        assert!(help.to_string().contains("api-key"));
    }
}
