//! The command line: a handful of subcommands, parsed by hand because they
//! are few and take one flag between them.

/// What the binary was asked to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Invocation {
    /// Apply migrations, serve the API and run the workers.
    Serve,
    /// Apply migrations and exit.
    Migrate,
    /// Run the sandbox provider.
    Sandbox,
    /// Create an API key for a merchant.
    CreateApiKey {
        /// The merchant's name (created if new).
        merchant: String,
    },
    /// Print the usage text.
    Help,
    /// Print the version.
    Version,
}

/// The usage text of `oncepay --help`.
pub const USAGE: &str = "\
oncepay — payments microservice: one intent, one effect

USAGE:
    oncepay <COMMAND>

COMMANDS:
    serve                              apply pending migrations, serve the API, run the workers
    migrate                            apply pending migrations and exit
    sandbox                            run the sandbox payment provider
    api-key create --merchant NAME     create a merchant if needed and a new API key (printed once)
    help                               print this text

Configuration is read from environment variables; see the README.
";

/// A command line that makes no sense, with the reason.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}\n\nrun `oncepay --help` for usage")]
pub struct UsageError(pub String);

/// Parses the arguments after the program name.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Invocation, UsageError> {
    let args: Vec<String> = args.into_iter().collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        [] | ["help"] | ["--help"] | ["-h"] => Ok(Invocation::Help),
        ["--version"] | ["-V"] => Ok(Invocation::Version),
        ["serve"] => Ok(Invocation::Serve),
        ["migrate"] => Ok(Invocation::Migrate),
        ["sandbox"] => Ok(Invocation::Sandbox),
        ["api-key", "create", "--merchant", name] | ["api-key", "create", "--merchant=", name] => {
            merchant(name)
        }
        ["api-key", "create", flag] if flag.starts_with("--merchant=") => {
            merchant(flag.trim_start_matches("--merchant="))
        }
        ["api-key", ..] => Err(UsageError(
            "usage: oncepay api-key create --merchant NAME".into(),
        )),
        [other, ..] => Err(UsageError(format!("unknown command {other:?}"))),
    }
}

fn merchant(name: &str) -> Result<Invocation, UsageError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 100 {
        return Err(UsageError(
            "the merchant name must be 1 to 100 characters".into(),
        ));
    }
    Ok(Invocation::CreateApiKey {
        merchant: name.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Invocation, UsageError> {
        parse(s.split_whitespace().map(str::to_string))
    }

    #[test]
    fn subcommands_parse() {
        assert_eq!(p("serve"), Ok(Invocation::Serve));
        assert_eq!(p("migrate"), Ok(Invocation::Migrate));
        assert_eq!(p("sandbox"), Ok(Invocation::Sandbox));
        assert_eq!(p("--help"), Ok(Invocation::Help));
        assert_eq!(p(""), Ok(Invocation::Help));
        assert_eq!(
            p("api-key create --merchant acme"),
            Ok(Invocation::CreateApiKey {
                merchant: "acme".into()
            })
        );
        assert_eq!(
            p("api-key create --merchant=acme"),
            Ok(Invocation::CreateApiKey {
                merchant: "acme".into()
            })
        );
        assert!(p("api-key create").is_err());
        assert!(p("serve now").is_err());
        assert!(p("launch").is_err());
    }
}
