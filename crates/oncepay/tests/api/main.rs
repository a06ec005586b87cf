//! Black-box tests of oncepay: real PostgreSQL, real sandbox over HTTP, real
//! server over TCP. One binary, one module per concern.

mod alerting;
mod api_keys;
mod balances;
mod books;
mod capture;
mod cards;
mod checkout;
mod checkout_card;
mod customer_action;
mod customer_ids;
mod disputes;
mod events;
mod failover;
mod helpers;
mod hostile_input;
mod idempotency;
mod identity;
mod inbound_webhooks;
mod inventory;
mod ledger_edges;
mod lists;
mod ops;
mod orders;
mod payments;
mod plans;
mod processes;
mod provider_contract;
mod provider_faults;
mod rate_limits;
mod refunds;
mod schema;
mod scopes_and_audit;
mod security;
mod stock_follows_payments;
mod stripe;
