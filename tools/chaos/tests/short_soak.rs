//! A short run of the fault harness (`make chaos` runs the full one): its own
//! PostgreSQL cluster, three serve processes, kills, database crashes and
//! provider faults, then every invariant checked by counting; once with the
//! sandbox and once through Stripe (localstripe behind the Stripe layer);
//! and one round of the restore drill (`make chaos-restore` runs five).

/// Runs `oncepay-chaos` with `args`; returns what it printed, after
/// asserting that it succeeded with every invariant holding.
async fn soak(args: &[&str]) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay-chaos"))
        .args(args)
        .output()
        .await
        .expect("run oncepay-chaos");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "chaos run failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("All invariants hold"), "{stdout}");
    stdout
}

/// How many things the invariant `name` checked, as its table row says.
fn checked(stdout: &str, name: &str) -> u64 {
    let row = stdout
        .lines()
        .find(|l| l.starts_with(&format!("| {name} |")))
        .unwrap_or_else(|| panic!("no row {name:?} in:\n{stdout}"));
    row.split('|')
        .nth(2)
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("row {row:?} has no count"))
}

/// Manual payments and balances were in the soak, not only in its table.
fn holds_and_balances_were_exercised(stdout: &str) {
    for name in [
        "captured never exceeds authorized (db, capture rows and provider agree)",
        "no capture after a void or an expiry (db, provider, answers)",
        "every voided or expired authorization released at the provider (none left past its deadline)",
        "one balance transfer per key",
        "no hold resolved twice",
        "no expired hold captured",
        "the ledger sums to zero, every account equals its transfers (oncepay ledger check)",
    ] {
        assert!(checked(stdout, name) > 0, "{name} checked nothing:\n{stdout}");
    }
}

/// Stripe as it answers (issue 55): its three invariants are in the table,
/// and captures were checked (the other two count what the run made).
fn stripe_as_it_answers_was_checked(stdout: &str) {
    let captures = "every capture final within the settle time after the faults stop";
    assert!(
        checked(stdout, captures) > 0,
        "{captures} checked nothing:\n{stdout}"
    );
    checked(
        stdout,
        "no payment the customer approved reads authentication_expired",
    );
    checked(
        stdout,
        "every refund reversal and dispute at the provider is applied here",
    );
}

#[tokio::test]
async fn a_short_chaos_soak_keeps_every_invariant() {
    let stdout = soak(&["--intents", "300", "--concurrency", "16"]).await;
    assert!(
        stdout.contains("| serve process SIGKILLed and restarted |"),
        "{stdout}"
    );
    holds_and_balances_were_exercised(&stdout);
    stripe_as_it_answers_was_checked(&stdout);
}

#[tokio::test]
async fn a_short_chaos_soak_through_stripe_keeps_every_invariant() {
    if !oncepay_testkit::localstripe::available() {
        assert!(
            std::env::var_os("ONCEPAY_REQUIRE_LOCALSTRIPE").is_none(),
            "ONCEPAY_REQUIRE_LOCALSTRIPE is set but localstripe is missing (make localstripe)"
        );
        eprintln!("SKIPPED: no localstripe (make localstripe installs it)");
        return;
    }
    let stdout = soak(&[
        "--provider",
        "stripe",
        "--intents",
        "200",
        "--concurrency",
        "16",
    ])
    .await;
    assert!(
        stdout.contains("(Stripe layer)"),
        "Stripe faults were injected: {stdout}"
    );
    holds_and_balances_were_exercised(&stdout);
    stripe_as_it_answers_was_checked(&stdout);
    assert!(
        stdout.contains("| books pass at the end (oncepay reconcile):"),
        "the books pass ran: {stdout}"
    );
}

#[tokio::test]
async fn one_round_of_the_restore_drill_keeps_every_invariant() {
    let stdout = soak(&["--restore", "--restores", "1", "--traffic", "35s"]).await;
    assert!(stdout.contains("restore 1: back "), "{stdout}");
}
