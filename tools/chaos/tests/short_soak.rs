//! A short run of the fault harness (`make chaos` runs the full one): its own
//! PostgreSQL cluster, three serve processes, kills, database crashes and
//! provider faults, then every invariant checked by counting.

#[tokio::test]
async fn a_short_chaos_soak_keeps_every_invariant() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay-chaos"))
        .args(["--intents", "300", "--concurrency", "16"])
        .output()
        .await
        .expect("run oncepay-chaos");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "chaos run failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("All invariants hold"), "{stdout}");
    assert!(
        stdout.contains("| serve process SIGKILLed and restarted |"),
        "{stdout}"
    );
}
