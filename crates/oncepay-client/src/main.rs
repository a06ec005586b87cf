//! `oncepay-client`: the Rust client from a terminal. `checkout` creates an
//! order and pays it, printing every try, so the behaviour can be watched
//! against `make run` (try `--token tok_visa+drop` or `tok_visa+error=2`);
//! `pay` runs one payment intent; `resume` finishes the open intents a
//! killed process left in the store.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use oncepay_client::{Client, Error, FileStore, LineItem, NewOrder, RetryPolicy};
use uuid::Uuid;

/// oncepay-client — one intent, one key, however often it is sent.
#[derive(Debug, Parser)]
#[command(name = "oncepay-client", version)]
struct Cli {
    /// The API's base URL (default: $ONCEPAY_URL, else http://127.0.0.1:8080).
    #[arg(long)]
    base: Option<String>,
    /// The merchant's API key (default: $ONCEPAY_API_KEY).
    #[arg(long)]
    key: Option<String>,
    /// The folder where intents and their keys are kept.
    #[arg(long, default_value = "oncepay-intents")]
    store: String,
    /// Give up (outcome unknown, intent left open) after this many seconds.
    #[arg(long, default_value_t = 30)]
    deadline: u64,
    /// What to do.
    #[command(subcommand)]
    command: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Create an order and pay it, printing every try.
    Checkout {
        /// Names both intents ("order NAME", "pay NAME"); run again with the
        /// same name and nothing happens twice.
        #[arg(long)]
        name: Option<String>,
        /// Amount in minor units.
        #[arg(long, default_value_t = 2500)]
        amount: i64,
        /// ISO 4217 currency.
        #[arg(long, default_value = "EUR")]
        currency: String,
        /// The provider token (sandbox: tok_visa, tok_declined, tok_async, with +drop, +error=N, +delay=MS).
        #[arg(long, default_value = "tok_visa")]
        token: String,
    },
    /// Pay an order as the intent NAME.
    Pay {
        /// The order.
        #[arg(long)]
        order: Uuid,
        /// The provider token.
        #[arg(long)]
        token: String,
        /// The intent's name.
        #[arg(long)]
        intent: String,
    },
    /// Finish every open intent in the store, with its own key.
    Resume,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oncepay-client: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), Error> {
    let base = cli
        .base
        .or_else(|| std::env::var("ONCEPAY_URL").ok())
        .unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let key = cli
        .key
        .or_else(|| std::env::var("ONCEPAY_API_KEY").ok())
        .ok_or_else(|| Error::Build("give --key or set ONCEPAY_API_KEY".into()))?;
    let client = Client::builder(&base, &key)
        .store(FileStore::open(&cli.store)?)
        .policy(RetryPolicy {
            deadline: Duration::from_secs(cli.deadline),
            ..RetryPolicy::default()
        })
        .on_attempt(|a| {
            let who = if a.intent.is_empty() {
                String::new()
            } else {
                format!("[{} key {}] ", a.intent, a.key)
            };
            eprintln!("{who}{} try {}: {}", a.request, a.attempt, a.outcome);
        })
        .build()?;
    match cli.command {
        Action::Checkout {
            name,
            amount,
            currency,
            token,
        } => {
            let name = name.unwrap_or_else(|| Uuid::new_v4().to_string());
            let items = vec![LineItem {
                sku: "item".into(),
                quantity: 1,
                unit_amount: amount,
            }];
            let order = client
                .intent(&format!("order {name}"))
                .create_order(&NewOrder::new("cus_cli", &currency, items))
                .await?;
            println!("order {} {} {}", order.id, order.amount, order.currency);
            let payment = client
                .intent(&format!("pay {name}"))
                .pay(order.id, &token)
                .await?;
            println!(
                "payment {} {:?}{}",
                payment.id,
                payment.status,
                payment
                    .failure_code
                    .map(|c| format!(" ({c})"))
                    .unwrap_or_default()
            );
        }
        Action::Pay {
            order,
            token,
            intent,
        } => {
            let payment = client.intent(&intent).pay(order, &token).await?;
            println!("payment {} {:?}", payment.id, payment.status);
            if let Some(action) = &payment.next_action {
                println!(
                    "the customer must authenticate at {} (the intent stays open: `resume` once they did)",
                    action.url
                );
            }
        }
        Action::Resume => {
            for open in client.open_intents()? {
                match client.resume(&open).await {
                    Ok(body) => {
                        println!(
                            "resumed {}: {} {}",
                            open.name,
                            body["id"].as_str().unwrap_or("-"),
                            body["status"].as_str().unwrap_or("-")
                        );
                        if let Some(url) = body["next_action"]["url"].as_str() {
                            println!("  still waiting for the customer at {url}");
                        }
                    }
                    Err(e) => println!("resumed {}: {e}", open.name),
                }
            }
        }
    }
    Ok(())
}
