//! Fault injection chosen per request: what a token's suffixes ask for.
//! (The random faults set at start are configuration:
//! `crate::config::FaultRates`.)

use std::time::Duration;

/// A token split into its outcome and the faults its suffixes ask for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenFaults {
    /// The token without suffixes (`tok_visa`).
    pub base: String,
    /// Answer `500` before charging for the key's first N requests.
    pub error: u32,
    /// Charge, then drop the connection, for the key's first N requests.
    pub drop: u32,
    /// Charge, then answer after this long (first request only).
    pub delay: Option<Duration>,
    /// Deliver each webhook three times.
    pub duplicate: bool,
    /// Deliver webhooks in reverse order.
    pub reorder: bool,
}

/// A suffix the sandbox does not know, or a value it cannot read: refused
/// (`400`) rather than ignored, so a misspelt fault never passes a test by
/// silently not happening.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fault suffix +{0} (known: +error[=N], +drop[=N], +delay=MS, +dup, +reorder)")]
pub struct UnknownFault(pub String);

impl TokenFaults {
    /// Parses `tok_visa+drop=2+dup`; see [`UnknownFault`].
    pub fn parse(token: &str) -> Result<TokenFaults, UnknownFault> {
        let mut parts = token.split('+');
        let mut faults = TokenFaults {
            base: parts.next().unwrap_or_default().to_string(),
            ..TokenFaults::default()
        };
        for part in parts {
            let (name, value) = match part.split_once('=') {
                Some((n, v)) => (
                    n,
                    Some(v.parse::<u64>().map_err(|_| UnknownFault(part.into()))?),
                ),
                None => (part, None),
            };
            let count = value.map(|v| v.min(100) as u32).unwrap_or(1);
            match name {
                "error" => faults.error = count,
                "drop" => faults.drop = count,
                "delay" => {
                    faults.delay = Some(Duration::from_millis(value.unwrap_or(1000).min(60_000)))
                }
                "dup" => faults.duplicate = true,
                "reorder" => faults.reorder = true,
                _ => return Err(UnknownFault(part.into())),
            }
        }
        Ok(faults)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_parse() {
        let f = TokenFaults::parse("tok_visa+drop=2+delay=1500+dup+reorder+error").expect("known");
        assert_eq!(f.base, "tok_visa");
        assert_eq!(f.drop, 2);
        assert_eq!(f.error, 1);
        assert_eq!(f.delay, Some(Duration::from_millis(1500)));
        assert!(f.duplicate && f.reorder);
        assert_eq!(
            TokenFaults::parse("tok_visa"),
            Ok(TokenFaults {
                base: "tok_visa".into(),
                ..Default::default()
            })
        );
        for typo in ["tok_visa+dorp", "tok_visa+drop=x", "tok_visa+"] {
            let err = TokenFaults::parse(typo).expect_err("refused");
            assert!(err.to_string().contains("unknown fault suffix"), "{err}");
        }
        assert_eq!(
            TokenFaults::parse("tok_visa+dorp").err(),
            Some(UnknownFault("dorp".into()))
        );
    }
}
