//! `oncepay-client`: the Rust client from a terminal. `checkout` creates an
//! order and pays it, printing every try, so the behaviour can be watched
//! against `make run`: the payment's first answer is lost on its way back
//! (a proxy in this process drops it once oncepay has answered), the
//! client retries with the same key, gets the first answer replayed
//! (`Idempotent-Replayed: true`), and the order has one payment, charged
//! once (`--lose 0` loses nothing; try `--token tok_visa+drop` or
//! `tok_visa+error=2` for faults between oncepay and the provider); `pay`
//! runs one payment intent; `resume` finishes the open intents a killed
//! process left in the store.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use oncepay_client::{Client, Error, FileStore, LineItem, NewOrder, RetryPolicy};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
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
        /// How many of the payment's answers to lose on their way back to
        /// this client (an http:// base only): the request reaches oncepay,
        /// which pays, and the answer is dropped; the client retries with
        /// the same key. `0`: lose none.
        #[arg(long, default_value_t = 1)]
        lose: u32,
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
    // Every client of this process shares the store, so an intent has one
    // key whichever of them sends it.
    let (store, deadline) = (cli.store, cli.deadline);
    let client_of = |base: &str| -> Result<Client, Error> {
        Client::builder(base, &key)
            .store(FileStore::open(&store)?)
            .policy(RetryPolicy {
                deadline: Duration::from_secs(deadline),
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
            .build()
    };
    let client = client_of(&base)?;
    match cli.command {
        Action::Checkout {
            name,
            amount,
            currency,
            token,
            lose,
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
            // The payment goes through a proxy that loses its first
            // answers: what a timeout, a dropped connection or a proxy's
            // reset does to a real client.
            let proxy = match lossy_proxy(&base, lose).await {
                Ok(proxy) => proxy,
                Err(why) => {
                    eprintln!("losing no answer: {why}");
                    None
                }
            };
            let payer = match &proxy {
                Some(proxy) => {
                    eprintln!(
                        "the first {lose} answer(s) to POST /payments are lost on the way back \
                         (a proxy on {} forwards each request to {base} and drops the answer)",
                        proxy.url
                    );
                    client_of(&proxy.url)?
                }
                None => client.clone(),
            };
            let payment = payer
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
            if let Some(proxy) = &proxy {
                println!(
                    "answers lost on the way back: {}",
                    proxy.lost.load(Ordering::Relaxed)
                );
            }
            // What oncepay holds for the order, read back: however many
            // answers were lost, one payment.
            let attempts = client.list_payments(order.id).await?;
            let ids: Vec<String> = attempts
                .iter()
                .map(|p| format!("{} {:?}", p.id, p.status))
                .collect();
            println!(
                "order {} has {} payment(s): {}",
                order.id,
                attempts.len(),
                ids.join(", ")
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

/// A proxy in front of oncepay that loses answers (see [`lossy_proxy`]).
struct LossyProxy {
    /// `http://127.0.0.1:PORT`, the base the paying client uses.
    url: String,
    /// Answers it has lost so far.
    lost: Arc<AtomicU32>,
}

/// Starts a proxy on a free loopback port in front of `base` that loses
/// the answers of its first `lose` connections: it forwards the request,
/// waits until oncepay starts to answer (so the command has run), then
/// closes both connections instead of relaying the answer. Later
/// connections are relayed as they are. `None` when there is nothing to
/// lose; an error for a base it cannot stand in for (`https://`: the
/// client would check the proxy's address against the certificate).
async fn lossy_proxy(base: &str, lose: u32) -> Result<Option<LossyProxy>, String> {
    if lose == 0 {
        return Ok(None);
    }
    let url = reqwest::Url::parse(base).map_err(|e| format!("{base}: {e}"))?;
    if url.scheme() != "http" {
        return Err(format!(
            "{base} is not http://, and the proxy relays plain HTTP"
        ));
    }
    let upstream = format!(
        "{}:{}",
        url.host_str().unwrap_or("127.0.0.1"),
        url.port_or_known_default().unwrap_or(80)
    );
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("cannot listen on loopback: {e}"))?;
    let proxy = LossyProxy {
        url: format!(
            "http://{}",
            listener.local_addr().map_err(|e| e.to_string())?
        ),
        lost: Arc::new(AtomicU32::new(0)),
    };
    let lost = proxy.lost.clone();
    tokio::spawn(async move {
        let mut to_lose = lose;
        while let Ok((client, _)) = listener.accept().await {
            let losing = to_lose > 0;
            to_lose = to_lose.saturating_sub(1);
            let (upstream, lost) = (upstream.clone(), lost.clone());
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(upstream.as_str()).await else {
                    return; // the client sees the connection closed, and retries
                };
                if losing {
                    if lose_answer(client, server).await {
                        lost.fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    let (mut client, mut server) = (client, server);
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    Ok(Some(proxy))
}

/// Relays the request, waits for the first byte of the answer, then drops
/// both connections: oncepay has answered, the client never hears it.
/// True if there was an answer to lose.
async fn lose_answer(client: TcpStream, server: TcpStream) -> bool {
    let (mut client_read, _client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    });
    let mut first = [0u8; 1];
    let answered = matches!(
        tokio::time::timeout(Duration::from_secs(60), server_read.read(&mut first)).await,
        Ok(Ok(n)) if n > 0
    );
    upstream.abort();
    answered
}
