-- A double-entry ledger with two-phase transfers (TigerBeetle's model, in
-- PostgreSQL): customer balances now, stock later (issue 46). Every
-- movement is one transfer between two accounts of one merchant, one
-- ledger and one unit (a currency here); transfers are append-only. The
-- rules the service relies on are enforced here, not only in code:
--
-- * a holder's account (a customer's) never goes below zero and never
--   holds more than it has: `ledger_account_never_negative`;
-- * a transfer is applied to its accounts by the trigger that admits it,
--   so no code path can write one without its effect, or the effect
--   without the transfer;
-- * a pending transfer (a hold) is resolved at most once
--   (`ledger_transfer_resolved_once`), a post never exceeds its pending
--   and is refused once the pending expired;
-- * per merchant, ledger and unit the accounts sum to zero (each transfer
--   takes from one account what it gives the other; `oncepay ledger
--   check` verifies it, with every holder's totals against its transfers).
--
-- Hot accounts: the merchant's side of every customer transfer is a
-- system account ('credit_issued', 'balance_spent', ...). Its row is
-- written once and never updated: its balance is derived from the
-- transfers. Only the holder's row is locked and updated, so transfers of
-- different customers of one merchant never queue behind one row lock.

CREATE TABLE ledger_account (
    id           uuid PRIMARY KEY,
    merchant_id  uuid NOT NULL REFERENCES merchant (id),
    ledger       text NOT NULL CHECK (ledger IN ('balance')),
    unit         text NOT NULL CHECK (length(unit) BETWEEN 1 AND 64),
    -- 'holder': its totals are kept on this row, under its row lock;
    -- 'system': the merchant's side, derived from transfers.
    kind         text NOT NULL CHECK (kind IN ('holder', 'system')),
    owner        text NOT NULL CHECK (length(owner) BETWEEN 1 AND 64),
    -- Posted: what the holder has. Held: what pending transfers from it
    -- hold (counted against what it may spend until they are resolved).
    posted       bigint NOT NULL DEFAULT 0,
    held         bigint NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ledger_account_identity UNIQUE (merchant_id, ledger, unit, kind, owner),
    CONSTRAINT ledger_account_never_negative
        CHECK (posted >= 0 AND held >= 0 AND held <= posted),
    CONSTRAINT ledger_account_system_derived CHECK (kind = 'holder' OR (posted = 0 AND held = 0))
);

CREATE TABLE ledger_transfer (
    id                 uuid PRIMARY KEY,
    merchant_id        uuid NOT NULL,
    ledger             text NOT NULL,
    unit               text NOT NULL,
    debit_account_id   uuid NOT NULL,
    credit_account_id  uuid NOT NULL,
    amount             bigint NOT NULL CHECK (amount BETWEEN 1 AND 1000000000000),
    -- single: posted at once. pending: a hold, counted in the debit
    -- account's `held` until resolved. post: posts its pending (amount at
    -- most the pending's; the rest returns). void: returns its pending
    -- whole (released, or expired).
    phase              text NOT NULL CHECK (phase IN ('single', 'pending', 'post', 'void')),
    pending_id         uuid REFERENCES ledger_transfer (id),
    expires_at         timestamptz,
    -- What the transfer is, in the ledger's words (balance: credit, debit,
    -- hold, hold_capture, hold_release, hold_expiry, payment, refund).
    code               text NOT NULL CHECK (length(code) BETWEEN 1 AND 32),
    -- The holder's side (one of the two accounts), its owner, and its
    -- totals right after this transfer, set by the trigger.
    holder_account_id  uuid NOT NULL,
    holder             text NOT NULL,
    posted_after       bigint NOT NULL DEFAULT 0,
    held_after         bigint NOT NULL DEFAULT 0,
    description        text CHECK (length(description) <= 500),
    payment_id         uuid,
    refund_id          uuid,
    -- The command's key (or `payment:<id>`, `refund:<id>`): one transfer
    -- per key, even after the idempotency record expired.
    idempotency_key    text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    CHECK (debit_account_id <> credit_account_id),
    CHECK (holder_account_id IN (debit_account_id, credit_account_id)),
    CHECK ((phase IN ('post', 'void')) = (pending_id IS NOT NULL)),
    CHECK ((phase = 'pending') = (expires_at IS NOT NULL)),
    CONSTRAINT ledger_transfer_resolved_once UNIQUE (pending_id),
    CONSTRAINT ledger_transfer_one_per_key UNIQUE (merchant_id, idempotency_key)
);
-- GET /customers/{customer_id}/balance/transactions: newest first.
CREATE INDEX ledger_transfer_holder_idx ON ledger_transfer (merchant_id, holder, id);
-- `oncepay ledger check` and the derived balances of accounts.
CREATE INDEX ledger_transfer_debit_idx ON ledger_transfer (debit_account_id);
CREATE INDEX ledger_transfer_credit_idx ON ledger_transfer (credit_account_id);

-- The pending transfers not yet resolved: a work list (inserted and
-- deleted by the trigger below, never by code), so the sweeper and the
-- reads find overdue holds without scanning every hold ever made.
CREATE TABLE ledger_open_pending (
    pending_id   uuid PRIMARY KEY REFERENCES ledger_transfer (id),
    account_id   uuid NOT NULL,
    amount       bigint NOT NULL,
    expires_at   timestamptz NOT NULL
);
CREATE INDEX ledger_open_pending_account_idx ON ledger_open_pending (account_id, expires_at);
CREATE INDEX ledger_open_pending_expires_idx ON ledger_open_pending (expires_at);

-- Admits a transfer: both accounts exist, belong to its merchant, ledger
-- and unit; a post or void names a pending of the same accounts, a post
-- takes at most its amount and only before it expires, a void returns it
-- whole; then applies it to the holder accounts (whose CHECK refuses a
-- negative balance or a hold above it) and records the holder's totals
-- after it on the transfer.
CREATE FUNCTION ledger_transfer_admit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d ledger_account;
    c ledger_account;
    p ledger_transfer;
    d_posted bigint := 0;
    d_held bigint := 0;
    c_posted bigint := 0;
BEGIN
    SELECT * INTO d FROM ledger_account WHERE id = NEW.debit_account_id;
    SELECT * INTO c FROM ledger_account WHERE id = NEW.credit_account_id;
    IF d.id IS NULL OR c.id IS NULL THEN
        RAISE EXCEPTION 'ledger transfer %: unknown account', NEW.id USING ERRCODE = '23503';
    END IF;
    IF d.merchant_id <> NEW.merchant_id OR c.merchant_id <> NEW.merchant_id
       OR d.ledger <> NEW.ledger OR c.ledger <> NEW.ledger
       OR d.unit <> NEW.unit OR c.unit <> NEW.unit THEN
        RAISE EXCEPTION 'ledger transfer %: accounts of another merchant, ledger or unit', NEW.id
            USING ERRCODE = '23514';
    END IF;
    IF NEW.phase IN ('post', 'void') THEN
        SELECT * INTO p FROM ledger_transfer WHERE id = NEW.pending_id;
        IF p.phase IS DISTINCT FROM 'pending'
           OR p.debit_account_id <> NEW.debit_account_id
           OR p.credit_account_id <> NEW.credit_account_id THEN
            RAISE EXCEPTION 'ledger transfer %: % of no pending transfer of these accounts',
                NEW.id, NEW.phase USING ERRCODE = '23514';
        END IF;
        -- Before the pending is applied again below: the unique index
        -- would only be checked after that, behind a balance refusal.
        IF EXISTS (SELECT 1 FROM ledger_transfer r WHERE r.pending_id = NEW.pending_id) THEN
            RAISE EXCEPTION 'ledger transfer %: its pending is already resolved', NEW.id
                USING ERRCODE = '23505', CONSTRAINT = 'ledger_transfer_resolved_once';
        END IF;
        IF NEW.phase = 'post' AND NEW.amount > p.amount THEN
            RAISE EXCEPTION 'ledger transfer %: posts more than its pending', NEW.id
                USING ERRCODE = '23514', CONSTRAINT = 'ledger_post_within_pending';
        END IF;
        IF NEW.phase = 'post' AND p.expires_at <= statement_timestamp() THEN
            RAISE EXCEPTION 'ledger transfer %: posts an expired pending', NEW.id
                USING ERRCODE = '23514', CONSTRAINT = 'ledger_post_before_expiry';
        END IF;
        IF NEW.phase = 'void' AND NEW.amount <> p.amount THEN
            RAISE EXCEPTION 'ledger transfer %: voids another amount than its pending', NEW.id
                USING ERRCODE = '23514';
        END IF;
        DELETE FROM ledger_open_pending WHERE pending_id = NEW.pending_id;
    END IF;
    CASE NEW.phase
        WHEN 'single' THEN d_posted := -NEW.amount; c_posted := NEW.amount;
        WHEN 'pending' THEN d_held := NEW.amount;
        WHEN 'post' THEN d_posted := -NEW.amount; d_held := -p.amount; c_posted := NEW.amount;
        WHEN 'void' THEN d_held := -p.amount;
    END CASE;
    IF d.kind = 'holder' THEN
        UPDATE ledger_account
           SET posted = posted + d_posted, held = held + d_held, updated_at = now()
         WHERE id = d.id
        RETURNING posted, held INTO d.posted, d.held;
    END IF;
    IF c.kind = 'holder' AND c_posted <> 0 THEN
        UPDATE ledger_account
           SET posted = posted + c_posted, updated_at = now()
         WHERE id = c.id
        RETURNING posted, held INTO c.posted, c.held;
    END IF;
    IF NEW.holder_account_id = d.id AND d.kind = 'holder' THEN
        NEW.posted_after := d.posted;
        NEW.held_after := d.held;
    ELSIF NEW.holder_account_id = c.id AND c.kind = 'holder' THEN
        NEW.posted_after := c.posted;
        NEW.held_after := c.held;
    ELSE
        RAISE EXCEPTION 'ledger transfer %: its holder is not a holder account', NEW.id
            USING ERRCODE = '23514';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER ledger_transfer_admit BEFORE INSERT ON ledger_transfer
    FOR EACH ROW EXECUTE FUNCTION ledger_transfer_admit();

CREATE FUNCTION ledger_pending_open() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger_open_pending (pending_id, account_id, amount, expires_at)
    VALUES (NEW.id, NEW.debit_account_id, NEW.amount, NEW.expires_at);
    RETURN NULL;
END
$$;

CREATE TRIGGER ledger_pending_open AFTER INSERT ON ledger_transfer
    FOR EACH ROW WHEN (NEW.phase = 'pending') EXECUTE FUNCTION ledger_pending_open();

-- Entries are facts: a correction is a reversing transfer, never an edit.
CREATE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = '42501';
END
$$;

CREATE TRIGGER ledger_transfer_append_only BEFORE UPDATE OR DELETE ON ledger_transfer
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_transfer_no_truncate BEFORE TRUNCATE ON ledger_transfer
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

-- An account is never deleted, and only its totals change (by the
-- trigger above): its identity is what transfers are checked against.
CREATE FUNCTION ledger_account_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR NEW.id <> OLD.id OR NEW.merchant_id <> OLD.merchant_id
       OR NEW.ledger <> OLD.ledger OR NEW.unit <> OLD.unit OR NEW.kind <> OLD.kind
       OR NEW.owner <> OLD.owner THEN
        RAISE EXCEPTION 'ledger_account: only its totals change (% refused)', TG_OP
            USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER ledger_account_guard BEFORE UPDATE OR DELETE ON ledger_account
    FOR EACH ROW EXECUTE FUNCTION ledger_account_guard();

-- Balance events have no order: their merchant is named, not read from one.
ALTER TABLE event ALTER COLUMN order_id DROP NOT NULL;
ALTER TABLE event DROP CONSTRAINT event_object_type_check;
ALTER TABLE event ADD CONSTRAINT event_object_type_check
    CHECK (object_type IN ('order', 'payment', 'refund', 'dispute', 'balance', 'balance_hold'));

-- First statistics at a thousand rows, as for every growing table (V7).
ALTER TABLE ledger_account SET (autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_threshold = 1000);
ALTER TABLE ledger_transfer SET (autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_threshold = 1000);
ALTER TABLE ledger_open_pending SET (autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_threshold = 1000);

-- Where a refund's money goes: back to the payment's method ('original'),
-- or to the order's customer's balance ('balance', through the balance
-- provider, whatever provider took the payment).
ALTER TABLE refund ADD COLUMN destination text NOT NULL DEFAULT 'original'
    CHECK (destination IN ('original', 'balance'));
