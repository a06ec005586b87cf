//! Customer balances as the API shows them: the balance ledger's
//! transfers as balance transactions, its pending transfers as holds, and
//! the reads of both (`store::ledger` holds the engine).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::ledger::{self, Pending, Transfer};
use super::pages::{Filter, PageRequest};
use super::StoreError;
use crate::domain::ledger::balance::Code;
use crate::domain::ledger::{AccountRef, Balance, HoldStatus, Ledger, Phase};

/// A customer's balance in one currency.
#[derive(Debug, Clone, Serialize)]
pub struct CustomerBalance {
    /// The customer.
    pub customer_id: String,
    /// ISO 4217.
    pub currency: String,
    /// What the customer has.
    pub posted: i64,
    /// What live holds hold.
    pub held: i64,
    /// `posted - held`.
    pub available: i64,
}

/// One movement of a customer's balance.
#[derive(Debug, Clone, Serialize)]
pub struct BalanceTransaction {
    /// UUID v7: the ledger transfer's id.
    pub id: Uuid,
    /// The customer.
    pub customer_id: String,
    /// ISO 4217.
    pub currency: String,
    /// `credit`, `debit`, `hold`, `hold_capture`, `hold_release`,
    /// `hold_expiry`, `payment`, `refund`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Always positive: `type` says the direction.
    pub amount: i64,
    /// The balance right after it.
    pub balance: Balance,
    /// Free text.
    pub description: Option<String>,
    /// The payment it paid.
    pub payment_id: Option<Uuid>,
    /// The refund it credited.
    pub refund_id: Option<Uuid>,
    /// The hold it placed or resolved.
    pub hold_id: Option<Uuid>,
    /// When it was made.
    pub created_at: DateTime<Utc>,
}

impl From<&Transfer> for BalanceTransaction {
    fn from(t: &Transfer) -> Self {
        BalanceTransaction {
            id: t.id,
            customer_id: t.holder.clone(),
            currency: t.unit.clone(),
            kind: t.code.clone(),
            amount: t.amount,
            balance: t.after.balance(0),
            description: t.description.clone(),
            payment_id: t.payment_id,
            refund_id: t.refund_id,
            hold_id: match t.phase {
                Phase::Pending => Some(t.id),
                Phase::Post | Phase::Void => t.pending_id,
                Phase::Single => None,
            },
            created_at: t.created_at,
        }
    }
}

/// A hold on a customer's balance (a pending transfer).
#[derive(Debug, Clone, Serialize)]
pub struct BalanceHold {
    /// UUID v7: the pending transfer's id.
    pub id: Uuid,
    /// The customer.
    pub customer_id: String,
    /// ISO 4217.
    pub currency: String,
    /// What it holds.
    pub amount: i64,
    /// What its capture took (0 unless captured).
    pub captured_amount: i64,
    /// `held`, `captured`, `released` or `expired`.
    pub status: &'static str,
    /// When it stops counting against the balance.
    pub expires_at: DateTime<Utc>,
    /// When it was placed.
    pub created_at: DateTime<Utc>,
    /// When its status last changed.
    pub updated_at: DateTime<Utc>,
}

impl BalanceHold {
    /// The hold `pending` is, as of its read.
    pub fn of(pending: &Pending) -> BalanceHold {
        let p = &pending.transfer;
        let expires_at = p.expires_at.unwrap_or(p.created_at);
        let resolution = pending
            .resolution
            .as_ref()
            .map(|r| (r.phase, r.code == Code::HoldExpiry.as_str()));
        let status = HoldStatus::of(resolution, expires_at, pending.now);
        let updated_at = match (&pending.resolution, status) {
            (Some(r), _) => r.created_at,
            (None, HoldStatus::Expired) => expires_at,
            (None, _) => p.created_at,
        };
        BalanceHold {
            id: p.id,
            customer_id: p.holder.clone(),
            currency: p.unit.clone(),
            amount: p.amount,
            captured_amount: match &pending.resolution {
                Some(r) if r.phase == Phase::Post => r.amount,
                _ => 0,
            },
            status: status.as_str(),
            expires_at,
            created_at: p.created_at,
            updated_at,
        }
    }

    /// Its status.
    pub fn status(&self) -> HoldStatus {
        match self.status {
            "held" => HoldStatus::Held,
            "captured" => HoldStatus::Captured,
            "released" => HoldStatus::Released,
            _ => HoldStatus::Expired,
        }
    }
}

/// The customer's balance account in `currency`.
pub fn account(merchant_id: Uuid, customer_id: &str, currency: &str) -> AccountRef {
    AccountRef::holder(merchant_id, Ledger::Balance, currency, customer_id)
}

/// A customer's balance now (zeros when it never moved); holds past their
/// expiry no longer count, swept or not.
pub async fn balance(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    customer_id: &str,
    currency: &str,
) -> Result<CustomerBalance, StoreError> {
    let (totals, overdue) =
        ledger::totals(conn, &account(merchant_id, customer_id, currency)).await?;
    let b = totals.balance(overdue);
    Ok(CustomerBalance {
        customer_id: customer_id.to_string(),
        currency: currency.to_string(),
        posted: b.posted,
        held: b.held,
        available: b.available,
    })
}

/// One of the merchant's balance transactions.
pub async fn transaction(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    id: Uuid,
) -> Result<Option<BalanceTransaction>, StoreError> {
    Ok(ledger::get(conn, merchant_id, Ledger::Balance, id)
        .await?
        .as_ref()
        .map(BalanceTransaction::from))
}

/// One of the merchant's holds.
pub async fn hold(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    id: Uuid,
) -> Result<Option<BalanceHold>, StoreError> {
    Ok(ledger::pending(conn, merchant_id, Ledger::Balance, id)
        .await?
        .as_ref()
        .map(BalanceHold::of))
}

/// One page of a customer's balance transactions, newest first
/// (`page.customer_id` is the customer; `currency` narrows it).
pub async fn list(
    pool: &PgPool,
    merchant_id: Uuid,
    page: &PageRequest,
    currency: Option<String>,
) -> Result<(Vec<BalanceTransaction>, bool), StoreError> {
    let mut page = page.clone();
    page.equals
        .push(("ledger", Filter::Text(Ledger::Balance.as_str().into())));
    if let Some(currency) = currency {
        page.equals.push(("unit", Filter::Text(currency)));
    }
    let (rows, more) = super::pages::fetch(
        pool,
        &format!("SELECT {} FROM ledger_transfer t", ledger::TRANSFER_COLUMNS),
        "t",
        "t.holder",
        merchant_id,
        &page,
        ledger::from_row,
    )
    .await?;
    Ok((rows.iter().map(BalanceTransaction::from).collect(), more))
}

/// Who pays or is paid, and how much: what a balance payment or refund
/// reads from its own rows.
#[derive(Debug, Clone)]
pub struct Party {
    /// The merchant.
    pub merchant_id: Uuid,
    /// The order's customer.
    pub customer_id: String,
    /// The order's currency.
    pub currency: String,
    /// The payment's or refund's amount.
    pub amount: i64,
    /// The payment (paid, or refunded).
    pub payment_id: Uuid,
}

/// Who pays a balance payment (attempt `payment_id`) and how much: its
/// order's merchant, customer and currency, its amount.
pub async fn payer(conn: &mut PgConnection, payment_id: Uuid) -> Result<Option<Party>, StoreError> {
    let row = sqlx::query(
        "SELECT a.merchant_id, o.customer_id, a.currency, a.amount
           FROM payment_attempt a JOIN orders o ON o.id = a.order_id WHERE a.id = $1",
    )
    .bind(payment_id)
    .fetch_optional(conn)
    .await?;
    row.map(|r| {
        use sqlx::Row;
        Ok(Party {
            merchant_id: r.try_get("merchant_id")?,
            customer_id: r.try_get("customer_id")?,
            currency: r.try_get::<String, _>("currency")?.trim().to_string(),
            amount: r.try_get("amount")?,
            payment_id,
        })
    })
    .transpose()
}

/// Who a refund credits (its payment's order's customer) and how much.
pub async fn payee(conn: &mut PgConnection, refund_id: Uuid) -> Result<Option<Party>, StoreError> {
    let row = sqlx::query(
        "SELECT r.merchant_id, o.customer_id, a.currency, r.amount, a.id AS payment_id
           FROM refund r JOIN payment_attempt a ON a.id = r.payment_id
           JOIN orders o ON o.id = a.order_id WHERE r.id = $1",
    )
    .bind(refund_id)
    .fetch_optional(conn)
    .await?;
    row.map(|r| {
        use sqlx::Row;
        Ok(Party {
            merchant_id: r.try_get("merchant_id")?,
            customer_id: r.try_get("customer_id")?,
            currency: r.try_get::<String, _>("currency")?.trim().to_string(),
            amount: r.try_get("amount")?,
            payment_id: r.try_get("payment_id")?,
        })
    })
    .transpose()
}
