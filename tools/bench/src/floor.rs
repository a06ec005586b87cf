//! What PostgreSQL alone can do for a scenario, measured with `pgbench`, in
//! two ways:
//!
//! - the **ceiling**: the *least* SQL any correct implementation must run
//!   for the scenario, written here once, independent of the service's own
//!   statements (`minimal_*_script`), swept over 4, 8, 16, 32 and 64
//!   connections, the best taken: what the service's throughput is divided
//!   by;
//! - the **same-SQL floor**: the very statements the service runs (the
//!   `pub const`s of `oncepay::store`, `$n` inlined as literals, random per
//!   transaction where the service's would be), in the same transactions,
//!   on the service's number of connections: it tells how much of the gap
//!   is the service's SQL and how much the rest.

use std::process::Stdio;
use std::time::Duration;

use oncepay::idempotency::persistence as idempotency;
use oncepay::store::{audit, captures, events, inbound, inventory, ledger, orders, payments};

/// What pgbench measured.
#[derive(Debug, Clone, Copy)]
pub struct Floor {
    /// Transactions per second (without connection time).
    pub tps: f64,
    /// Transactions committed.
    pub transactions: f64,
    /// The CPU the run spent (PostgreSQL's and pgbench's).
    pub cpu: crate::cpu::Cpu,
}

impl Floor {
    /// CPU milliseconds one transaction cost, by whom (see [`crate::cpu`]).
    pub fn cpu_per_transaction(&self) -> crate::cpu::Cpu {
        self.cpu.per(self.transactions)
    }
}

/// Replaces each parameter `$n` of a service statement with `params[n-1]`,
/// reading the statement as PostgreSQL does: a `$` followed by digits is a
/// parameter (the whole number: `$15` is never `$1` and a `5`), except
/// inside string literals, quoted identifiers, dollar-quoted strings and
/// comments. A statement whose parameters are not exactly `$1..$n` for the
/// `n` values given has drifted from the bench: that panics, naming the
/// statement, since every number the bench printed after it would be false.
fn inline(sql: &str, params: &[&str]) -> String {
    let (out, used) = substitute(sql, params).unwrap_or_else(|e| panic!("{e} in:\n{sql}"));
    let expected: std::collections::BTreeSet<usize> = (1..=params.len()).collect();
    assert_eq!(
        used,
        expected,
        "the statement uses parameters {used:?}, the bench passes {} values:\n{sql}",
        params.len()
    );
    format!("{};\n", out.trim())
}

/// The statement with its parameters substituted, and the numbers used.
fn substitute(
    sql: &str,
    params: &[&str],
) -> Result<(String, std::collections::BTreeSet<usize>), String> {
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 256);
    let mut used = std::collections::BTreeSet::new();
    let mut i = 0;
    // Copies through the first occurrence of `end` at or after `from`.
    let skip_to = |from: usize, end: &str| -> Result<usize, String> {
        sql[from..]
            .find(end)
            .map(|at| from + at + end.len())
            .ok_or_else(|| format!("unterminated {end:?}"))
    };
    while i < bytes.len() {
        let rest = &sql[i..];
        let next = match bytes[i] {
            b'\'' => skip_to(i + 1, "'")?,
            b'"' => skip_to(i + 1, "\"")?,
            b'-' if rest.starts_with("--") => skip_to(i, "\n").unwrap_or(bytes.len()),
            b'/' if rest.starts_with("/*") => skip_to(i + 2, "*/")?,
            b'$' if bytes.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let digits = rest[1..].bytes().take_while(u8::is_ascii_digit).count();
                let n: usize = rest[1..=digits].parse().map_err(|e| format!("{e}"))?;
                let value = params
                    .get(n.wrapping_sub(1))
                    .ok_or_else(|| format!("${n} has no value ({} given)", params.len()))?;
                out.push_str(value);
                used.insert(n);
                i += 1 + digits;
                continue;
            }
            b'$' => {
                // A dollar-quoted string: $tag$ ... $tag$.
                let tag_len = rest[1..].find('$').filter(|t| {
                    rest[1..=*t]
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_')
                });
                match tag_len {
                    Some(t) => skip_to(i + t + 2, &rest[..t + 2])?,
                    None => i + 1,
                }
            }
            _ => {
                let len = rest.chars().next().map_or(1, char::len_utf8);
                i + len
            }
        };
        out.push_str(&sql[i..next]);
        i = next;
    }
    Ok((out, used))
}

fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A representative stored response body of a created order.
pub const ORDER_RESPONSE: &str = "{\"id\":\"01a20143-c7a9-775e-84d1-3b5b659fdc2f\",\"customer_id\":\"cus_42\",\"items\":[{\"sku\":\"book\",\"quantity\":2,\"unit_amount\":1250}],\"amount\":2500,\"currency\":\"EUR\",\"status\":\"awaiting_payment\",\"metadata\":{},\"created_at\":\"2026-11-22T03:19:08.986862Z\",\"updated_at\":\"2026-11-22T03:19:08.986862Z\"}";

/// Prepares `n` orders awaiting payment that the pay scripts take one by
/// one (`bench_floor_orders`, `bench_floor_seq`).
pub async fn prepare_pay_orders(
    db: &sqlx::PgPool,
    merchant: uuid::Uuid,
    n: i32,
) -> Result<(), String> {
    sqlx::raw_sql(
        "CREATE TABLE bench_floor_orders (n bigint PRIMARY KEY, id uuid NOT NULL);
         CREATE SEQUENCE bench_floor_seq;",
    )
    .execute(db)
    .await
    .map_err(|e| e.to_string())?;
    sqlx::query(
        "WITH o AS (
           INSERT INTO orders (id, merchant_id, customer_id, items, amount, currency, status, metadata, created_at, updated_at)
           SELECT gen_random_uuid(), $1, 'cus_floor', '[]', 2800, 'EUR', 'awaiting_payment', '{}', now(), now()
             FROM generate_series(1, $2) RETURNING id)
         INSERT INTO bench_floor_orders SELECT row_number() OVER (), id FROM o",
    )
    .bind(merchant)
    .bind(n)
    .execute(db)
    .await
    .map_err(|e| e.to_string())?;
    Ok(())
}

/// Literals shared by the scripts.
pub struct Fixture {
    /// The bench merchant.
    pub merchant: String,
    /// A representative order body, as the service stores it.
    pub order_request: String,
    /// A representative stored response body.
    pub order_response: String,
}

/// One create-order as the service runs it for a new key: the claim, the
/// order and the completed record in one statement. (API keys are cached
/// by the service, so no authentication query runs per request.)
pub fn create_order_script(f: &Fixture) -> String {
    let key = "'bench-:client_id-:k'";
    let order_id = "md5('o:client_id-:k')::uuid";
    let merchant = quote(&f.merchant);
    let mut s = String::from("\\set k random(1, 9000000000000000)\n");
    s += &inline(
        orders::INSERT_CLAIMING,
        &[
            order_id,
            &merchant,
            "'cus_42'",
            "'[{\"sku\":\"book\",\"quantity\":2,\"unit_amount\":1250}]'",
            "2500",
            "'EUR'",
            "'{}'",
            "now()",
            "201",
            &format!("convert_to({}, 'UTF8')", quote(&f.order_response)),
            "'/orders/x'",
            key,
            "sha256('fp:client_id-:k')",
            "'create_order'",
            &quote(&f.order_request),
            "86400000",
        ],
    );
    s
}

/// One replay of a completed key served from the database: the claim that
/// finds the key taken, and the read of the stored response. (The service
/// does this once per process and key; later repeats come from memory.)
pub fn replay_script(f: &Fixture) -> String {
    let merchant = quote(&f.merchant);
    let mut s = String::new();
    s += &inline(
        idempotency::INSERT_OR_RECLAIM,
        &[
            &merchant,
            "'floor-replay'",
            "sha256('fp')",
            "'create_order'",
            "'{}'",
            "gen_random_uuid()",
            "30000",
            "86400000",
        ],
    );
    s += &inline(idempotency::LOAD_LIVE, &[&merchant, "'floor-replay'"]);
    s
}

/// An event of a batch, for [`event_arrays`]: id, type, object type and
/// object id, as SQL literals or expressions.
struct FloorEvent<'a>(&'a str, &'a str, &'a str, &'a str);

/// An event batch's nine arrays (`store::events::new_events_from_params`)
/// as literals.
fn event_arrays(order: &str, events: &[FloorEvent<'_>]) -> Vec<String> {
    let array = |items: Vec<String>, ty: &str| format!("ARRAY[{}]::{ty}[]", items.join(", "));
    let each = |value: &str| vec![value.to_string(); events.len()];
    vec![
        array(events.iter().map(|e| e.0.to_string()).collect(), "uuid"),
        array(events.iter().map(|e| quote(e.1)).collect(), "text"),
        array(events.iter().map(|e| quote(e.2)).collect(), "text"),
        array(events.iter().map(|e| e.3.to_string()).collect(), "uuid"),
        array(each(order), "uuid"),
        array(each("'{\"status\":\"x\"}'"), "jsonb"),
        array(each("'request'"), "text"),
        array(each("'req-1'"), "text"),
        // Who asked (the event's `actor`): the bench's API key.
        array(each("'{\"type\":\"api_key\",\"id\":\"bench\"}'"), "jsonb"),
    ]
}

/// One payment's statements as the service runs them, without the
/// provider call: step 1 with the claim (and the attempt's event) in one
/// statement; step 3 with the completion (and two
/// events) in one statement; and the sandbox's webhook for the charge,
/// which finds it settled and is recorded in one statement. The first
/// line (taking the next prepared order) is the floor's own overhead.
pub fn pay_script(f: &Fixture) -> String {
    let merchant = quote(&f.merchant);
    let key = "'pay-:client_id-:k'";
    let token = "md5('t:client_id-:k')::uuid";
    let attempt = "md5('a:client_id-:k')::uuid";
    let charge = "'ch-:client_id-:k'";
    let order = "':order_id'::uuid";
    let created = "date_trunc('milliseconds', now())";
    let mut s = String::from("\\set k random(1, 9000000000000000)\n");
    s += "SELECT id AS order_id, updated_at AS order_version FROM bench_floor_orders JOIN orders USING (id) WHERE n = (SELECT nextval('bench_floor_seq')) \\gset\n";
    let mut params = event_arrays(
        order,
        &[FloorEvent(
            "md5('e1:client_id-:k')::uuid",
            "payment.pending",
            "payment",
            attempt,
        )],
    );
    params.extend(
        [
            order,
            &merchant,
            key,
            "sha256('fp:client_id-:k')",
            "'create_payment'",
            "'{}'",
            "'attempt_created'",
            attempt,
            token,
            "30000",
            "86400000",
            "'sandbox'",
            "'tok_visa'",
            created,
            "10000",
            // No return_url: the bench pays without 3-D Secure.
            "NULL",
        ]
        .map(String::from),
    );
    s += &inline(
        payments::INSERT_CLAIMING,
        &params.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let mut params = event_arrays(
        order,
        &[
            FloorEvent(
                "md5('e2:client_id-:k')::uuid",
                "payment.succeeded",
                "payment",
                attempt,
            ),
            FloorEvent("md5('e3:client_id-:k')::uuid", "order.paid", "order", order),
        ],
    );
    params.extend(
        [
            order,
            "'awaiting_payment'",
            "':order_version'",
            "'paid'",
            attempt,
            "'succeeded'",
            charge,
            "NULL",
            "NULL",
            "now()",
            &merchant,
            key,
            token,
            "201",
            &format!("convert_to({}, 'UTF8')", quote(&f.order_response)),
            "'/payments/x'",
            // Whether a decline is still to be confirmed (it succeeded).
            "false",
        ]
        .map(String::from),
    );
    s += &inline(
        payments::SETTLE_COMPLETING,
        &params.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    s += &inline(
        payments::FIND_BY_CHARGE_OR_RECORD_REPEAT,
        &[
            "'sandbox'",
            charge,
            attempt,
            "'evt-:client_id-:k'",
            "'charge.succeeded'",
            "'{}'",
            "'succeeded'",
        ],
    );
    s
}

/// A representative stored answer of a capture (the payment, captured).
pub const CAPTURE_RESPONSE: &str = "{\"id\":\"01a20143-c7a9-775e-84d1-3b5b659fdc2f\",\"order_id\":\"01a20143-c7a9-775e-84d1-3b5b659fdc30\",\"amount\":2800,\"currency\":\"EUR\",\"status\":\"succeeded\",\"payment_method\":\"tok_visa\",\"capture_method\":\"manual\",\"amount_capturable\":0,\"amount_captured\":2800,\"capture_before\":null,\"void_reason\":null,\"refunded_amount\":0,\"failure_code\":null,\"failure_message\":null,\"next_action\":null,\"created_at\":\"2026-11-22T03:19:08.986862Z\",\"updated_at\":\"2026-11-22T03:19:09.123456Z\"}";

/// A representative stored answer of a balance debit (the transaction).
pub const TRANSFER_RESPONSE: &str = "{\"id\":\"01a20143-c7a9-775e-84d1-3b5b659fdc2f\",\"customer_id\":\"cus_xfer_7\",\"currency\":\"EUR\",\"type\":\"debit\",\"amount\":100,\"balance\":{\"posted\":99999999900,\"held\":0,\"available\":99999999900},\"description\":null,\"payment_id\":null,\"refund_id\":null,\"hold_id\":null,\"created_at\":\"2026-11-22T03:19:08.986862Z\"}";

/// Prepares `n` held payments (`requires_capture`, each with an order of
/// its own) that the capture script takes one by one
/// (`bench_floor_holds`, `bench_floor_holds_seq`): copies of `template`, a
/// payment the service authorized and nothing captured (and its order), with new ids, keys and
/// charge ids, so that every constraint the service's rows meet, these
/// meet too. The sandbox never hears of them: the floor sends no capture.
pub async fn prepare_holds(db: &sqlx::PgPool, template: uuid::Uuid, n: i32) -> Result<(), String> {
    // One connection for the whole script: the copies are temporary tables.
    sqlx::raw_sql(&format!(
        "CREATE TABLE bench_floor_holds AS
           SELECT g::bigint AS n, gen_random_uuid() AS id, gen_random_uuid() AS order_id
             FROM generate_series(1, {n}) g;
         ALTER TABLE bench_floor_holds ADD PRIMARY KEY (n);
         CREATE SEQUENCE bench_floor_holds_seq;
         CREATE TEMPORARY TABLE floor_orders AS
           SELECT o.*, h.order_id AS new_id FROM orders o, bench_floor_holds h
            WHERE o.id = (SELECT order_id FROM payment_attempt WHERE id = '{template}');
         UPDATE floor_orders SET id = new_id;
         ALTER TABLE floor_orders DROP COLUMN new_id;
         INSERT INTO orders SELECT * FROM floor_orders;
         CREATE TEMPORARY TABLE floor_payments AS
           SELECT p.*, h.n AS new_n, h.id AS new_id, h.order_id AS new_order
             FROM payment_attempt p, bench_floor_holds h WHERE p.id = '{template}';
         UPDATE floor_payments SET id = new_id, order_id = new_order,
                idempotency_key = 'floor-hold-' || new_n,
                provider_charge_id = 'ch_floor_' || new_n;
         ALTER TABLE floor_payments DROP COLUMN new_n, DROP COLUMN new_id, DROP COLUMN new_order;
         INSERT INTO payment_attempt SELECT * FROM floor_payments;
         DROP TABLE floor_orders, floor_payments;"
    ))
    .execute(db)
    .await
    .map_err(|e| format!("preparing the capture floor's held payments: {e}"))?;
    Ok(())
}

/// One capture as the service runs it (`commands::captures`), without the
/// provider call, in the order PostgreSQL's log showed for one capture:
/// the claim of the key; step 1 (the payment read, its order and itself
/// locked, the capture looked for and inserted, the step recorded) in one
/// transaction; the sandbox's `charge.captured` webhook, sent as the
/// sandbox captures, arriving before step 3 committed: its look for a
/// repeat (none yet) and for a duplicate; step 3 (the capture and payment
/// read, order and payment locked, the payment succeeded with its amount
/// captured, the capture settled, `payment.succeeded`, the order paid,
/// `order.paid`, the answer stored) in another transaction; then the
/// webhook, having waited for the command, recorded under the order's and
/// payment's locks. (A webhook that arrives after step 3 costs one
/// statement instead: it is recorded as a repeat.) The first line (taking
/// the next prepared hold) is the floor's own overhead.
pub fn capture_script(f: &Fixture) -> String {
    let m = format!("{}::uuid", quote(&f.merchant));
    let key = "'cap-:client_id-:k'";
    let token = "md5('l:client_id-:k')::uuid";
    let fingerprint = "sha256('fp:client_id-:k')";
    let capture = "md5('c:client_id-:k')::uuid";
    let payment = "':payment_id'::uuid";
    let order = "':order_id'::uuid";
    let mut s = String::from("\\set k random(1, 9000000000000000)\n");
    s += "SELECT h.id AS payment_id, p.order_id AS order_id, p.provider_charge_id AS charge_id FROM bench_floor_holds h JOIN payment_attempt p USING (id) WHERE h.n = (SELECT nextval('bench_floor_holds_seq')) \\gset\n";
    s += &inline(
        idempotency::INSERT_OR_RECLAIM,
        &[
            &m,
            key,
            fingerprint,
            "'capture_payment'",
            "'{\"path_id\":\":payment_id\",\"body\":{}}'",
            token,
            "30000",
            "86400000",
        ],
    );
    // Step 1.
    s += "BEGIN;\n";
    s += &inline(payments::GET, &[payment, &m]);
    s += &inline(orders::LOCK_BY_ID, &[order]);
    s += &inline(payments::LOCK, &[payment]);
    s += &inline(captures::OF_PAYMENT, &[payment, key]);
    s += &inline(
        captures::INSERT,
        &[capture, &m, payment, "2800", key, fingerprint, "10000"],
    );
    s += &inline(
        idempotency::RECORD_STEP,
        &[&m, key, token, "'capture_created'", capture],
    );
    s += "COMMIT;\n";
    // (Step 2, the provider's capture, is what the floor leaves out.)
    // The webhook arrives: not a repeat yet (the payment is still held).
    let event = "'evt-cap-:client_id-:k'";
    s += &inline(
        payments::FIND_BY_CHARGE_OR_RECORD_REPEAT,
        &[
            "'sandbox'",
            "':charge_id'",
            payment,
            event,
            "'charge.captured'",
            "'{}'",
            "'succeeded'",
        ],
    );
    s += &inline(inbound::EXISTS, &["'sandbox'", event]);
    // Step 3.
    s += "BEGIN;\n";
    s += &inline(captures::BY_ID, &[capture]);
    s += &inline(payments::BY_ID, &[payment]);
    s += &inline(orders::LOCK_BY_ID, &[order]);
    s += &inline(payments::LOCK, &[payment]);
    s += &inline(
        payments::SET_STATUS,
        &[
            payment,
            "'succeeded'",
            "':charge_id'",
            "NULL",
            "NULL",
            "now() + interval '7 days'",
            "2800",
            "'expired'",
        ],
    );
    s += &inline(
        captures::SETTLE_OF_PAYMENT,
        &[payment, "'succeeded'", "NULL", "NULL::bigint"],
    );
    let params = event_arrays(
        order,
        &[FloorEvent(
            "md5('e1:client_id-:k')::uuid",
            "payment.succeeded",
            "payment",
            payment,
        )],
    );
    s += &inline(
        events::APPEND,
        &params.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    s += &inline(orders::SET_STATUS, &[order, "'paid'"]);
    let params = event_arrays(
        order,
        &[FloorEvent(
            "md5('e2:client_id-:k')::uuid",
            "order.paid",
            "order",
            order,
        )],
    );
    s += &inline(
        events::APPEND,
        &params.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    s += &inline(
        idempotency::COMPLETE,
        &[
            &m,
            key,
            token,
            "200",
            &format!("convert_to({}, 'UTF8')", quote(CAPTURE_RESPONSE)),
            "NULL",
        ],
    );
    s += "COMMIT;\n";
    // The webhook, once the command is done: recorded, under the locks.
    s += "BEGIN;\n";
    s += &inline(
        inbound::RECORD,
        &["'sandbox'", event, "'charge.captured'", "'{}'"],
    );
    s += &inline(orders::LOCK_BY_ID, &[order]);
    s += &inline(payments::LOCK, &[payment]);
    s += &inline(
        inbound::SET_OUTCOME,
        &["'sandbox'", event, "'processed'", "true", "NULL"],
    );
    s += "COMMIT;\n";
    s
}

/// The customers of the transfer floor, one per pgbench client
/// (`bench_floor_customers`, by `client` = pgbench's `client_id`): each
/// customer's account, the merchant's system account `balance_spent` that
/// every debit of the service has on its other side, and an account of
/// the customer's own (a system account no other customer uses) for the
/// floor without the merchant's account.
pub async fn prepare_transfer_customers(
    db: &sqlx::PgPool,
    merchant: uuid::Uuid,
    customers: &[String],
) -> Result<(), String> {
    use oncepay::domain::ledger::balance::Code;
    let (_, _, spent) = Code::Debit.shape();
    sqlx::raw_sql(
        "CREATE TABLE bench_floor_customers (client int PRIMARY KEY, holder uuid NOT NULL,
            owner text NOT NULL, shared uuid NOT NULL, shared_owner text NOT NULL,
            own uuid NOT NULL, own_owner text NOT NULL)",
    )
    .execute(db)
    .await
    .map_err(|e| e.to_string())?;
    let mut conn = db.acquire().await.map_err(|e| e.to_string())?;
    for (client, customer) in customers.iter().enumerate() {
        let holder = oncepay::store::balances::account(merchant, customer, "EUR");
        let shared = holder.system(spent);
        let own = holder.system(&format!("floor_{customer}"));
        ledger::ensure(&mut conn, &[&holder, &shared, &own])
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query("INSERT INTO bench_floor_customers VALUES ($1, $2, $3, $4, $5, $6, $7)")
            .bind(client as i32)
            .bind(holder.id())
            .bind(&holder.owner)
            .bind(shared.id())
            .bind(&shared.owner)
            .bind(own.id())
            .bind(&own.owner)
            .execute(&mut *conn)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One balance debit as the service runs it (`commands::balances`,
/// ChargeBalance), for the customer of this pgbench client: the claim of
/// the key; then in one transaction the look for a transfer made under
/// the key, the accounts made sure of, the customer's row locked, the
/// transfer (whose trigger applies it to that row), its audit row,
/// `balance.debited` and the stored answer. With `merchant_account` the
/// transfer's other side is the merchant's `balance_spent`, as the
/// service's; without, an account of the customer's own, so that no row is
/// shared between customers: what issue 45 measures the service against.
/// The first line (reading the client's accounts) is the floor's own
/// overhead.
pub fn transfer_script(f: &Fixture, merchant_account: bool) -> String {
    let m = format!("{}::uuid", quote(&f.merchant));
    let key = "'xfer-:client_id-:k'";
    let token = "md5('l:client_id-:k')::uuid";
    let transfer = "md5('t:client_id-:k')::uuid";
    let other = if merchant_account { "shared" } else { "own" };
    let mut s = String::from("\\set k random(1, 9000000000000000)\n");
    s += &format!(
        "SELECT holder, owner, {other} AS other, {other}_owner AS other_owner FROM bench_floor_customers WHERE client = :client_id \\gset\n"
    );
    s += &inline(
        idempotency::INSERT_OR_RECLAIM,
        &[
            &m,
            key,
            "sha256('fp:client_id-:k')",
            "'charge_balance'",
            "'{\"path_id\":null,\"path_text\":\":owner\",\"body\":{\"amount\":100,\"currency\":\"EUR\"},\"actor\":{\"type\":\"api_key\",\"id\":\"bench\"}}'",
            token,
            "30000",
            "86400000",
        ],
    );
    s += "BEGIN;\n";
    s += &inline(ledger::BY_KEY, &[&m, key, "'client'"]);
    s += &inline(
        ledger::ENSURE,
        &[
            "ARRAY[':holder', ':other']::uuid[]",
            &format!("ARRAY[{m}, {m}]::uuid[]"),
            "ARRAY['balance', 'balance']::text[]",
            "ARRAY['EUR', 'EUR']::text[]",
            "ARRAY['holder', 'system']::text[]",
            "ARRAY[':owner', ':other_owner']::text[]",
        ],
    );
    s += &inline(ledger::LOCK, &["':holder'::uuid"]);
    s += &inline(
        ledger::INSERT,
        &[
            transfer,
            &m,
            "'balance'",
            "'EUR'",
            "':holder'::uuid",
            "':other'::uuid",
            "100",
            "'single'",
            "NULL",
            "NULL",
            "'debit'",
            "':holder'::uuid",
            "':owner'",
            "NULL",
            "NULL",
            "NULL",
            key,
            "NULL",
            "'client'",
        ],
    );
    s += &inline(
        audit::INSERT,
        &[
            "md5('au:client_id-:k')::uuid",
            &m,
            "'api_key'",
            "'bench'",
            "'balance.debited'",
            "'balance_transaction'",
            &format!("{transfer}::text"),
            "'req-1'",
            "'{\"customer_id\":\":owner\",\"currency\":\"EUR\",\"amount\":100}'",
            "NULL",
        ],
    );
    // A balance's event belongs to no order: the nil id, stored as none.
    let mut params = event_arrays(
        "'00000000-0000-0000-0000-000000000000'::uuid",
        &[FloorEvent(
            "md5('e:client_id-:k')::uuid",
            "balance.debited",
            "balance",
            transfer,
        )],
    );
    params.push(m.clone());
    s += &inline(
        events::APPEND_FOR_MERCHANT,
        &params.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    s += &inline(
        idempotency::COMPLETE,
        &[
            &m,
            key,
            token,
            "201",
            &format!("convert_to({}, 'UTF8')", quote(TRANSFER_RESPONSE)),
            "'/balance_transactions/x'",
        ],
    );
    s += "COMMIT;\n";
    s
}

/// A representative stored answer of a reserving order (the order, with
/// its reservation's deadline).
pub const RESERVE_RESPONSE: &str = "{\"id\":\"01a20143-c7a9-775e-84d1-3b5b659fdc2f\",\"customer_id\":\"cus_42\",\"items\":[{\"sku\":\"hot\",\"quantity\":1,\"unit_amount\":1500}],\"amount\":1500,\"currency\":\"EUR\",\"status\":\"awaiting_payment\",\"metadata\":{},\"stock_reserved_until\":\"2026-11-22T03:34:08.986862Z\",\"stock_shortfall\":[],\"created_at\":\"2026-11-22T03:19:08.986862Z\",\"updated_at\":\"2026-11-22T03:19:08.986862Z\"}";

/// The table of the floor's SKUs for reserve-hot (`spread` false) or
/// reserve-spread (true): (`n` from 1, the stock account's `id`, the SKU
/// as `unit`, its `sold` system account).
pub fn stock_table(spread: bool) -> &'static str {
    match spread {
        false => "bench_floor_stock_hot",
        true => "bench_floor_stock_spread",
    }
}

/// Tracks each of `skus` for the merchant with `units` on hand, as its
/// first adjustment does (the stock account and both system accounts its
/// transfers meet, then an `adjustment_in`), and lists them in `table`
/// ([`stock_table`]) for the floor's scripts.
pub async fn prepare_stock(
    db: &sqlx::PgPool,
    merchant: uuid::Uuid,
    table: &str,
    skus: &[String],
    units: i64,
) -> Result<(), String> {
    use oncepay::domain::ledger::stock::Code;
    sqlx::raw_sql(&format!(
        "CREATE TABLE {table} (n int PRIMARY KEY, id uuid NOT NULL, unit text NOT NULL, sold uuid NOT NULL)"
    ))
    .execute(db)
    .await
    .map_err(|e| e.to_string())?;
    let mut tx = db.begin().await.map_err(|e| e.to_string())?;
    for (i, sku) in skus.iter().enumerate() {
        let stock = inventory::account(merchant, sku);
        let (phase, holder_is_debit, system) = Code::AdjustmentIn.shape();
        let adjustments = stock.system(system);
        let sold = stock.system(Code::Reservation.shape().2);
        ledger::ensure(&mut tx, &[&stock, &adjustments, &sold])
            .await
            .map_err(|e| e.to_string())?;
        ledger::insert(
            &mut tx,
            &ledger::NewTransfer {
                id: uuid::Uuid::now_v7(),
                holder: &stock,
                other: &adjustments,
                holder_is_debit,
                amount: units,
                phase,
                pending_id: None,
                expires_at: None,
                code: Code::AdjustmentIn.as_str(),
                description: None,
                payment_id: None,
                refund_id: None,
                order_id: None,
                key: None,
            },
        )
        .await
        .map_err(|e| format!("stocking the floor's {sku}: {e:?}"))?;
        sqlx::query(&format!("INSERT INTO {table} VALUES ($1, $2, $3, $4)"))
            .bind(i as i32 + 1)
            .bind(stock.id())
            .bind(sku)
            .bind(sold.id())
            .execute(&mut *tx)
            .await
            .map_err(|e| e.to_string())?;
    }
    tx.commit().await.map_err(|e| e.to_string())?;
    Ok(())
}

/// The line that picks a transaction's SKU among the `skus` of the
/// floor's table (the first for reserve-hot): the floor's own overhead,
/// a primary-key read outside the transaction and its row lock.
fn pick_sku(spread: bool, skus: usize) -> String {
    format!(
        "\\set n random(1, {})\nSELECT id AS sku_id, unit AS sku, sold AS sold_id FROM {} WHERE n = :n \\gset\n",
        if spread { skus } else { 1 },
        stock_table(spread)
    )
}

/// One reserving order as the service runs it (`commands::orders`,
/// CreateOrder with `reserve_stock`, through `inventory::create_reserving`
/// and `inventory::reserve`), for one unit of one SKU: the claim of the
/// key; then in one transaction which SKUs are tracked (no lock), the
/// order, `order.stock_reserved`, the stored answer and, last, under a
/// savepoint, the reservation in one statement (`ledger::HOLD_ALL`: the
/// SKU's row read and checked, and the pending written, whose trigger
/// locks the row, applies it to its `held` and lists it open). The first
/// lines (picking the SKU) are the floor's own overhead.
pub fn reserve_script(f: &Fixture, spread: bool, skus: usize) -> String {
    let m = format!("{}::uuid", quote(&f.merchant));
    let key = "'reserve-:client_id-:k'";
    let token = "md5('l:client_id-:k')::uuid";
    let order = "md5('o:client_id-:k')::uuid";
    let until = "now() + interval '15 minutes'";
    let body = serde_json::json!({
        "customer_id": "cus_42",
        "currency": "EUR",
        "items": [{"sku": ":sku", "quantity": 1, "unit_amount": 1500}],
        "reserve_stock": true
    });
    let request = serde_json::json!({"path_id": null, "body": body});
    let mut s = String::from("\\set k random(1, 9000000000000000)\n");
    s += &pick_sku(spread, skus);
    s += &inline(
        idempotency::INSERT_OR_RECLAIM,
        &[
            &m,
            key,
            "sha256('fp:client_id-:k')",
            "'create_order'",
            &quote(&request.to_string()),
            token,
            "30000",
            "86400000",
        ],
    );
    s += "BEGIN;\n";
    s += &inline(inventory::TRACKED, &["ARRAY[':sku_id']::uuid[]"]);
    s += &inline(
        orders::INSERT,
        &[
            order,
            &m,
            "'cus_42'",
            "'[{\"sku\":\":sku\",\"quantity\":1,\"unit_amount\":1500}]'",
            "1500",
            "'EUR'",
            "'awaiting_payment'",
            "'{}'",
            until,
            "now()",
            "'reserved'",
        ],
    );
    let params = event_arrays(
        order,
        &[FloorEvent(
            "md5('e:client_id-:k')::uuid",
            "order.stock_reserved",
            "order",
            order,
        )],
    );
    s += &inline(
        events::APPEND,
        &params.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    s += &inline(
        idempotency::COMPLETE,
        &[
            &m,
            key,
            token,
            "201",
            &format!("convert_to({}, 'UTF8')", quote(RESERVE_RESPONSE)),
            "'/orders/x'",
        ],
    );
    s += &hold_statement(Protocol::Simple, &m, order, until);
    s += "COMMIT;\n";
    s
}

/// How a script names the picked SKU and its ids: as text pgbench puts
/// into the statement (`Simple`, pgbench's default protocol, each
/// statement parsed and planned each time), or as parameters (`Prepared`,
/// `-M prepared`: each statement prepared once per connection, as the
/// service's are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `-M simple`.
    Simple,
    /// `-M prepared`.
    Prepared,
}

impl Protocol {
    /// The picked SKU's stock account id.
    fn sku_id(self) -> &'static str {
        match self {
            Protocol::Simple => "':sku_id'::uuid",
            Protocol::Prepared => ":sku_id::uuid",
        }
    }

    /// The picked SKU's `sold` account id.
    fn sold_id(self) -> &'static str {
        match self {
            Protocol::Simple => "':sold_id'::uuid",
            Protocol::Prepared => ":sold_id::uuid",
        }
    }

    /// The picked SKU.
    fn sku(self) -> &'static str {
        match self {
            Protocol::Simple => "':sku'",
            Protocol::Prepared => ":sku::text",
        }
    }

    /// An id of the transaction's own, made from `tag`, the client and `k`.
    fn id(self, tag: &str) -> String {
        match self {
            Protocol::Simple => format!("md5('{tag}:client_id-:k')::uuid"),
            Protocol::Prepared => format!("md5('{tag}:' || :client_id || '-' || :k)::uuid"),
        }
    }

    /// pgbench's `-M` for it.
    fn flag(self) -> &'static str {
        match self {
            Protocol::Simple => "simple",
            Protocol::Prepared => "prepared",
        }
    }
}

/// The reservation's one statement (`ledger::HOLD_ALL`) for one unit of
/// the picked SKU, for `order`, until `until`, under the savepoint
/// `ledger::hold_all` sets before it.
fn hold_statement(p: Protocol, m: &str, order: &str, until: &str) -> String {
    use oncepay::domain::ledger::stock::{Code, HOLDER};
    let array = |v: &str, ty: &str| format!("ARRAY[{v}]::{ty}[]");
    String::from("SAVEPOINT hold_all;\n")
        + &inline(
            ledger::HOLD_ALL,
            &[
                &array(&p.id("t"), "uuid"),
                &array(m, "uuid"),
                &array("'stock'", "text"),
                &array(p.sku(), "text"),
                &array(p.sku_id(), "uuid"),
                &array(p.sold_id(), "uuid"),
                &array("1", "bigint"),
                &array(until, "timestamptz"),
                &array(&quote(Code::Reservation.as_str()), "text"),
                &array(p.sku_id(), "uuid"),
                &array(&quote(HOLDER), "text"),
                &array("NULL", "text"),
                &array("NULL", "uuid"),
                &array("NULL", "uuid"),
                &array(
                    &format!("'reservation:' || {order} || ':' || {}", p.sku()),
                    "text",
                ),
                &array(order, "uuid"),
                &array("'service'", "text"),
            ],
        )
}

/// What a reserving order holds the SKU's row for, alone: the
/// reservation's one statement and the commit (the rest of the order's
/// transaction is written before the row is locked), in `p`'s protocol.
/// Against [`one_row_script`] and [`reservation_floor_script`], how much
/// longer than the database's own floor an order keeps the next one
/// waiting. (Its orders have no row: the transfers name ids no order
/// has, which only the floor's SKUs see.)
pub fn row_hold_script(p: Protocol, f: &Fixture, spread: bool, skus: usize) -> String {
    let m = format!("{}::uuid", quote(&f.merchant));
    let mut s = String::from("\\set k random(1, 9000000000000000)\n");
    s += &pick_sku(spread, skus);
    s += "BEGIN;\n";
    s += &hold_statement(p, &m, &p.id("o"), "now() + interval '15 minutes'");
    s += "COMMIT;\n";
    s
}

/// The database's own floor for a reservation on a SKU's row, on the
/// ledger every reservation is written to, in `p`'s protocol: one
/// pending transfer's `INSERT` (`ledger::INSERT`, whose trigger locks the
/// row as it applies the transfer to `held`, and lists it open) and the
/// commit, and nothing else. No reservation on that row can hold it for
/// less; [`row_hold_script`] against it is what checking the stock in
/// the same statement costs.
pub fn reservation_floor_script(p: Protocol, f: &Fixture, spread: bool, skus: usize) -> String {
    use oncepay::domain::ledger::stock::{Code, HOLDER};
    let m = format!("{}::uuid", quote(&f.merchant));
    let order = p.id("o");
    let mut s = String::from("\\set k random(1, 9000000000000000)\n");
    s += &pick_sku(spread, skus);
    s += "BEGIN;\n";
    s += &inline(
        ledger::INSERT,
        &[
            &p.id("t"),
            &m,
            "'stock'",
            p.sku(),
            p.sku_id(),
            p.sold_id(),
            "1",
            &quote(Code::Reservation.shape().0.as_str()),
            "NULL",
            "now() + interval '15 minutes'",
            &quote(Code::Reservation.as_str()),
            p.sku_id(),
            &quote(HOLDER),
            "NULL",
            "NULL",
            "NULL",
            &format!("'reservation:' || {order} || ':' || {}", p.sku()),
            &order,
            "'service'",
        ],
    );
    s += "COMMIT;\n";
    s
}

/// The database's own floor for a SKU's row: one row lock and one
/// synchronous commit, nothing else (the row written once, as a
/// reservation's trigger writes it; its `updated_at`, since its totals
/// change only through a transfer, a rule the database keeps since
/// issue 54). However the orders for one SKU are made, each holds that
/// row's lock until its commit is flushed, so no implementation of a
/// reservation on that row does more of them a second. The first lines
/// (picking the SKU) are the floor's own overhead.
pub fn one_row_script(p: Protocol, spread: bool, skus: usize) -> String {
    let mut s = pick_sku(spread, skus);
    s += &format!(
        "BEGIN;\nUPDATE ledger_account SET updated_at = now() WHERE id = {};\nCOMMIT;\n",
        p.sku_id()
    );
    s
}

/// The least one idempotent create must do: the idempotency record with
/// its fingerprint and completed response, and the order, in one
/// transaction with one synchronous commit, sent as one statement (one
/// round trip).
pub fn minimal_create_script(f: &Fixture) -> String {
    let m = quote(&f.merchant);
    format!(
        "\\set k random(1, 9000000000000000)
WITH r AS (INSERT INTO idempotency_record (merchant_id, idempotency_key, fingerprint, command, request,
    state, recovery_point, resource_id, response_status, response_body, response_location, expires_at)
  VALUES ({m}, 'min-:client_id-:k', sha256('fp:client_id-:k'), 'create_order', {req}, 'completed',
    'finished', md5('o:client_id-:k')::uuid, 201, convert_to({resp}, 'UTF8'), '/orders/x',
    now() + interval '1 day') RETURNING 1)
INSERT INTO orders (id, merchant_id, customer_id, items, amount, currency, status, metadata, created_at, updated_at)
  VALUES (md5('o:client_id-:k')::uuid, {m}, 'cus_42', '[{{\"sku\":\"book\",\"quantity\":2,\"unit_amount\":1250}}]',
    2500, 'EUR', 'awaiting_payment', '{{}}', now(), now());
",
        req = quote(&f.order_request),
        resp = quote(&f.order_response),
    )
}

/// The least one payment must do (without the provider call): the attempt
/// and its recovery point committed before the call; then the outcome, the
/// order's status and the stored response; then the provider webhook's
/// dedup row and its (no-op) state check. Three transactions, each one
/// statement (three round trips, three synchronous commits). The first
/// line takes the next prepared order (the floor's own overhead).
pub fn minimal_pay_script(f: &Fixture) -> String {
    pay_script_with(f, false)
}

/// [`minimal_pay_script`] with what the merchant-webhooks issue adds to
/// every payment: the transactional outbox's three event rows (the
/// attempt's `payment.created` with step 1, `payment.succeeded` and the
/// order's `order.paid` with the outcome), each carrying an object of the
/// size the service stores. Not the ceiling (the least SQL has no
/// outbox): a second reference that shows how much of the gap is the
/// outbox every correct oncepay must also write.
pub fn minimal_pay_with_outbox_script(f: &Fixture) -> String {
    pay_script_with(f, true)
}

/// The minimal pay script, with or without the outbox's event rows (as
/// extra CTEs of the same statements, so the round trips are the same).
fn pay_script_with(f: &Fixture, outbox: bool) -> String {
    let m = quote(&f.merchant);
    let obj = quote(&f.order_response);
    // Keys of their own, so both scripts can run on one database.
    let tag = if outbox { "minpayo" } else { "minpay" };
    let event = |id: &str, kind: &str, object_type: &str, from: &str, order: &str, seq: u8| {
        format!(
            "SELECT md5('{id}:client_id-:k')::uuid, {m}::uuid, '{kind}', '{object_type}', {from}.id, \
             {order}, {seq}, {obj}::jsonb, 'request' FROM {from}"
        )
    };
    let insert_events = |rows: &[String]| {
        format!(
            ",\n  e AS (INSERT INTO event (id, merchant_id, type, object_type, object_id, order_id, sequence, data, cause)\n    {})",
            rows.join("\n    UNION ALL\n    ")
        )
    };
    let (created, settled) = if outbox {
        (
            insert_events(&[event(
                "e1",
                "payment.created",
                "payment",
                "a",
                "a.order_id",
                1,
            )]),
            insert_events(&[
                event("e2", "payment.succeeded", "payment", "p", "p.order_id", 2),
                event("e3", "order.paid", "order", "o", "o.id", 1),
            ]),
        )
    } else {
        (String::new(), String::new())
    };
    format!(
        "\\set k random(1, 9000000000000000)
SELECT id AS order_id FROM bench_floor_orders WHERE n = (SELECT nextval('bench_floor_seq')) \\gset
WITH a AS (INSERT INTO payment_attempt (id, merchant_id, order_id, idempotency_key, amount, currency,
    status, provider, payment_method, next_check_at, created_at, updated_at)
  VALUES (md5('a:client_id-:k')::uuid, {m}, ':order_id', '{tag}-:client_id-:k', 2800, 'EUR', 'pending',
    'sandbox', 'tok_visa', now() + interval '10 seconds', now(), now()) RETURNING id, order_id){created}
INSERT INTO idempotency_record (merchant_id, idempotency_key, fingerprint, command, request, state,
    recovery_point, resource_id, expires_at)
  SELECT {m}, '{tag}-:client_id-:k', sha256('fp:client_id-:k'), 'create_payment', '{{}}', 'executing',
    'attempt_created', a.id, now() + interval '1 day' FROM a;
WITH p AS (UPDATE payment_attempt SET status = 'succeeded', provider_charge_id = 'ch-:client_id-:k',
    updated_at = now() WHERE id = md5('a:client_id-:k')::uuid RETURNING id, order_id),
  o AS (UPDATE orders SET status = 'paid', updated_at = now() WHERE id IN (SELECT order_id FROM p) RETURNING id){settled}
UPDATE idempotency_record SET state = 'completed', recovery_point = 'finished', response_status = 201,
    response_body = convert_to({obj}, 'UTF8'), updated_at = now()
  WHERE merchant_id = {m} AND idempotency_key = '{tag}-:client_id-:k' AND EXISTS (SELECT 1 FROM o);
WITH w AS (INSERT INTO webhook_event (provider, event_id, event_type, payload, outcome)
  VALUES ('sandbox', '{tag}-evt-:client_id-:k', 'charge.succeeded', '{{}}', 'processed') RETURNING 1)
UPDATE payment_attempt SET updated_at = now()
  WHERE id = md5('a:client_id-:k')::uuid AND status = 'pending' AND EXISTS (SELECT 1 FROM w);
",
    )
}

/// The least a replay must do: one primary-key read of the completed record.
pub fn minimal_replay_script(f: &Fixture) -> String {
    format!(
        "SELECT response_status, response_body FROM idempotency_record
  WHERE merchant_id = {} AND idempotency_key = 'floor-replay';
",
        quote(&f.merchant)
    )
}

/// The connection counts the ceiling is swept over.
pub const SWEEP: [usize; 5] = [4, 8, 16, 32, 64];

/// Runs `script` at every count of [`SWEEP`], `each` long; returns every
/// point (the best is the ceiling).
pub async fn sweep(
    db_url: &str,
    script: &str,
    each: Duration,
) -> Result<Vec<(usize, Floor)>, String> {
    sweep_in(Protocol::Simple, db_url, script, each).await
}

/// [`sweep`] in protocol `p`.
pub async fn sweep_in(
    p: Protocol,
    db_url: &str,
    script: &str,
    each: Duration,
) -> Result<Vec<(usize, Floor)>, String> {
    let mut points = Vec::new();
    for clients in SWEEP {
        let (clients_arg, seconds) = (clients.to_string(), each.as_secs().max(1).to_string());
        let args = [
            "-M",
            p.flag(),
            "-j",
            "2",
            "-c",
            &clients_arg,
            "-T",
            &seconds,
        ];
        points.push((clients, pgbench(db_url, script, &args).await?));
    }
    Ok(points)
}

/// The best point of a sweep.
pub fn best(points: &[(usize, Floor)]) -> Option<(usize, Floor)> {
    points
        .iter()
        .copied()
        .max_by(|a, b| a.1.tps.total_cmp(&b.1.tps))
}

/// Runs `script` with pgbench for `duration` on `clients` connections.
pub async fn run(
    db_url: &str,
    script: &str,
    clients: usize,
    duration: Duration,
) -> Result<Floor, String> {
    let clients = clients.to_string();
    let seconds = duration.as_secs().max(1).to_string();
    pgbench(db_url, script, &["-j", "2", "-c", &clients, "-T", &seconds]).await
}

/// Runs `script` once, as one transaction on one connection: how the test
/// suite checks that every script the bench generates still runs.
#[cfg(test)]
pub async fn run_once(db_url: &str, script: &str) -> Result<Floor, String> {
    run_once_in(Protocol::Simple, db_url, script).await
}

/// [`run_once`] in protocol `p`.
#[cfg(test)]
pub async fn run_once_in(p: Protocol, db_url: &str, script: &str) -> Result<Floor, String> {
    pgbench(db_url, script, &["-M", p.flag(), "-c", "1", "-t", "1"]).await
}

async fn pgbench(db_url: &str, script: &str, args: &[&str]) -> Result<Floor, String> {
    let dir = std::env::temp_dir().join(format!("oncepay-floor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let file = dir.join(format!("{}.sql", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, script).map_err(|e| e.to_string())?;
    let meter = crate::cpu::Meter::start(crate::cpu::Watched::default());
    let out = tokio::process::Command::new("pgbench")
        .arg("-n")
        .args(args)
        .arg("-f")
        .arg(&file)
        .arg(db_url)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("pgbench is needed for the floor: {e}"));
    let cpu = meter.stop().await;
    let _ = std::fs::remove_file(&file);
    let out = out?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let number_after = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l[prefix.len()..].split_whitespace().next())
            // `-t` runs print "done/asked" transactions.
            .and_then(|v| v.split('/').next()?.parse::<f64>().ok())
    };
    let failed = number_after("number of failed transactions: ").unwrap_or(0.0) > 0.0
        || text.contains("aborted");
    let transactions = number_after("number of transactions actually processed: ");
    match (number_after("tps = "), transactions) {
        (Some(tps), Some(transactions)) if out.status.success() && !failed => Ok(Floor {
            tps,
            transactions,
            cpu,
        }),
        _ => Err(format!("pgbench failed:\n{text}\nscript:\n{script}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_read_whole_and_never_inside_literals() {
        let ten = ["x", "y", "c", "d", "e", "f", "g", "h", "i", "z"];
        assert_eq!(
            inline("a $1 $10 $2 $3 $4 $5 $6 $7 $8 $9", &ten),
            "a x z y c d e f g h i;\n"
        );
        assert_eq!(
            inline(
                "SELECT '$1', \"$1\", $q$ $1 $q$, $1 -- $2\n /* $2 */ + $2",
                &["a", "b"]
            ),
            "SELECT '$1', \"$1\", $q$ $1 $q$, a -- $2\n /* $2 */ + b;\n"
        );
    }

    #[test]
    #[should_panic(expected = "$15 has no value (14 given)")]
    fn a_statement_with_more_parameters_than_values_is_refused() {
        // Under plain replacement, $15 became the first value and a "5".
        let values: Vec<String> = (1..=14).map(|n| n.to_string()).collect();
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        let sql = (1..=15).map(|n| format!("${n}")).collect::<Vec<_>>();
        inline(&format!("SELECT {}", sql.join(", ")), &values);
    }

    /// Every script `make bench` generates, run once against the schema
    /// and statements of this build: a statement that drifts from its
    /// script fails here, not in the middle of a bench.
    #[tokio::test]
    async fn every_script_the_bench_generates_runs_once() {
        // Named after this test run: `make test-dbs-drop` drops it, and no other run's.
        let db_url = oncepay_testkit::test_db::database_url();
        oncepay::store::prepare_database(&db_url)
            .await
            .expect("migrate");
        let db = sqlx::PgPool::connect(&db_url).await.expect("pool");
        oncepay::api_keys::create(&db, "bench")
            .await
            .expect("merchant");
        let merchant: uuid::Uuid =
            sqlx::query_scalar("SELECT id FROM merchant WHERE name = 'bench'")
                .fetch_one(&db)
                .await
                .expect("merchant");
        prepare_pay_orders(&db, merchant, 10).await.expect("orders");
        let template = held_payment(&db, merchant).await;
        prepare_holds(&db, template, 3).await.expect("holds");
        prepare_transfer_customers(&db, merchant, &["cus_xfer_0".to_string()])
            .await
            .expect("customers");
        credit(&db, merchant, "cus_xfer_0", 1_000).await;
        prepare_stock(
            &db,
            merchant,
            stock_table(false),
            &["floor-hot".to_string()],
            10,
        )
        .await
        .expect("the hot SKU");
        let spread: Vec<String> = (0..3).map(|i| format!("floor-sku-{i}")).collect();
        prepare_stock(&db, merchant, stock_table(true), &spread, 10)
            .await
            .expect("the spread SKUs");
        let f = Fixture {
            merchant: merchant.to_string(),
            order_request: "{\"path_id\":null,\"body\":{}}".into(),
            order_response: ORDER_RESPONSE.into(),
        };
        let scripts = [
            ("create-order, same SQL", create_order_script(&f)),
            ("create-order, ceiling", minimal_create_script(&f)),
            ("pay, same SQL", pay_script(&f)),
            ("pay, ceiling", minimal_pay_script(&f)),
            (
                "pay, ceiling with the outbox",
                minimal_pay_with_outbox_script(&f),
            ),
            ("replay, same SQL", replay_script(&f)),
            ("replay, ceiling", minimal_replay_script(&f)),
            ("capture, same SQL", capture_script(&f)),
            (
                "transfers, same SQL on the customer's own account",
                transfer_script(&f, false),
            ),
            (
                "transfers, same SQL with the merchant's account",
                transfer_script(&f, true),
            ),
            ("reserve-hot, same SQL", reserve_script(&f, false, 1)),
            ("reserve-spread, same SQL", reserve_script(&f, true, 3)),
            (
                "reserve-hot, the row's own floor",
                one_row_script(Protocol::Simple, false, 1),
            ),
            (
                "reserve-spread, the row's own floor",
                one_row_script(Protocol::Simple, true, 3),
            ),
        ];
        for (name, script) in &scripts {
            run_once(&db_url, script)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let prepared = [
            (
                "reserve-hot, the row's own floor, prepared",
                one_row_script(Protocol::Prepared, false, 1),
            ),
            (
                "reserve-hot, the row as an order holds it, prepared",
                row_hold_script(Protocol::Prepared, &f, false, 1),
            ),
            (
                "reserve-hot, a reservation's own floor, prepared",
                reservation_floor_script(Protocol::Prepared, &f, false, 1),
            ),
        ];
        for (name, script) in &prepared {
            run_once_in(Protocol::Prepared, &db_url, script)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE status = 'paid'")
            .fetch_one(&db)
            .await
            .expect("count");
        assert_eq!(
            orders, 4,
            "each pay script paid one order, and the capture script one"
        );
        let captured: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM payment_capture c JOIN payment_attempt p ON p.id = c.payment_id
              WHERE c.status = 'succeeded' AND p.status = 'succeeded' AND p.amount_captured = 2800",
        )
        .fetch_one(&db)
        .await
        .expect("count");
        assert_eq!(captured, 1, "the capture script captured one hold");
        let (debits, posted): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM ledger_transfer WHERE code = 'debit'),
                    (SELECT posted FROM ledger_account WHERE kind = 'holder' AND owner = 'cus_xfer_0')",
        )
        .fetch_one(&db)
        .await
        .expect("count");
        assert_eq!(
            (debits, posted),
            (2, 800),
            "each transfer script debited the customer 100"
        );
        let (orders, reservations, open, events, completed): (i64, i64, i64, i64, i64) =
            sqlx::query_as(
                "SELECT (SELECT count(*) FROM orders WHERE stock_reserved_until IS NOT NULL),
                        (SELECT count(*) FROM ledger_transfer
                          WHERE ledger = 'stock' AND phase = 'pending' AND code = 'reservation'
                            AND order_id IS NOT NULL),
                        (SELECT count(*) FROM ledger_open_pending),
                        (SELECT count(*) FROM event WHERE type = 'order.stock_reserved'),
                        (SELECT count(*) FROM idempotency_record
                          WHERE idempotency_key LIKE 'reserve-%' AND state = 'completed'
                            AND response_status = 201)",
            )
            .fetch_one(&db)
            .await
            .expect("count");
        assert_eq!(
            (orders, reservations, open, events, completed),
            (2, 4, 4, 2, 2),
            "each reserve script created one order with its open reservation, its event and its completed key; the row's hold and the reservation's floor one reservation each, alone"
        );
        let (on_hand, held): (i64, i64) = sqlx::query_as(
            "SELECT sum(posted)::bigint, sum(held)::bigint FROM ledger_account
              WHERE ledger = 'stock' AND kind = 'holder'",
        )
        .fetch_one(&db)
        .await
        .expect("count");
        assert_eq!(
            (on_hand, held),
            (40, 4),
            "four SKUs stocked with 10 each; four reservations each held one unit (the one-row floors write the row, never its totals)"
        );
        println!(
            "{} bench scripts ran once each",
            scripts.len() + prepared.len()
        );
    }

    /// A manual payment held in `requires_capture` on the 10th prepared
    /// order, as the service leaves one the sandbox authorized: the
    /// template of the capture floor's holds.
    async fn held_payment(db: &sqlx::PgPool, merchant: uuid::Uuid) -> uuid::Uuid {
        let order: uuid::Uuid =
            sqlx::query_scalar("SELECT id FROM bench_floor_orders WHERE n = 10")
                .fetch_one(db)
                .await
                .expect("order");
        let id = uuid::Uuid::now_v7();
        let mut conn = db.acquire().await.expect("connection");
        payments::insert(
            &mut conn,
            &payments::NewAttempt {
                id,
                merchant_id: merchant,
                order_id: order,
                idempotency_key: "floor-template",
                fingerprint: Some(b"fp".as_slice()),
                amount: 2800,
                currency: "EUR",
                provider: "sandbox",
                payment_method: "tok_visa",
                now: chrono::Utc::now(),
                check_after: Duration::from_secs(10),
                return_url: None,
                capture_method: oncepay::domain::payment::CaptureMethod::Manual,
            },
        )
        .await
        .expect("payment");
        sqlx::raw_sql(&format!(
            "UPDATE payment_attempt SET status = 'requires_capture', provider_charge_id = 'ch_template',
                    capture_before = now() + interval '7 days' WHERE id = '{id}';
             UPDATE orders SET status = 'authorized' WHERE id = '{order}';"
        ))
        .execute(&mut *conn)
        .await
        .expect("held");
        id
    }

    /// Credits `customer` `amount`, as a credit of the service would.
    async fn credit(db: &sqlx::PgPool, merchant: uuid::Uuid, customer: &str, amount: i64) {
        use oncepay::domain::ledger::{balance::Code, Phase};
        let holder = oncepay::store::balances::account(merchant, customer, "EUR");
        let issued = holder.system(Code::Credit.shape().2);
        let mut conn = db.acquire().await.expect("connection");
        ledger::ensure(&mut conn, &[&holder, &issued])
            .await
            .expect("accounts");
        ledger::insert(
            &mut conn,
            &ledger::NewTransfer {
                id: uuid::Uuid::now_v7(),
                holder: &holder,
                other: &issued,
                holder_is_debit: false,
                amount,
                phase: Phase::Single,
                pending_id: None,
                expires_at: None,
                code: Code::Credit.as_str(),
                description: None,
                payment_id: None,
                refund_id: None,
                order_id: None,
                key: None,
            },
        )
        .await
        .map_err(|e| format!("{e:?}"))
        .expect("credit");
    }

    #[test]
    fn a_statement_that_skips_a_value_is_refused() {
        let refused = std::panic::catch_unwind(|| inline("SELECT $1, $3", &["a", "b", "c"]));
        assert!(refused.is_err());
    }
}
