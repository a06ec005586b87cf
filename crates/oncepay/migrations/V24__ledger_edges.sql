-- The edges of the ledger (issue 54): stock that follows a payment's life,
-- the service's transfer keys apart from its clients', and totals that
-- change only through a transfer.

-- 1. An order's stock follows its payments.
--
-- An authorization no longer converts the reservation: it keeps the units
-- reserved (a reservation renewed until the payment's `capture_before`)
-- until a capture sells them or a void, an expiry or the cancel releases
-- them. So an `authorized` order may hold an open reservation; an order
-- that goes back from `authorized` to `awaiting_payment` (its hold voided
-- or expired) may not, nor may a paid, refunded or cancelled one.
CREATE OR REPLACE FUNCTION orders_stock_resolved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM ledger_transfer t JOIN ledger_open_pending o ON o.pending_id = t.id
                WHERE t.order_id = NEW.id) THEN
        RAISE EXCEPTION 'order % is % with its stock reservation still open', NEW.id, NEW.status
            USING ERRCODE = '23514', CONSTRAINT = 'orders_stock_resolved';
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER orders_stock_resolved ON orders;
CREATE CONSTRAINT TRIGGER orders_stock_resolved AFTER UPDATE OF status ON orders
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.stock_reserved_until IS NOT NULL
          AND (NEW.status IN ('paid', 'refunded', 'cancelled')
               OR (OLD.status = 'authorized' AND NEW.status = 'awaiting_payment')))
    EXECUTE FUNCTION orders_stock_resolved();

-- Where the order's reservation stands, for clients (null: it reserved
-- nothing): `reserved` (units held for it), `converted` (sold to it),
-- `released` (returned to the stock: cancelled, voided, expired), `short`
-- (paid after its reservation lapsed, and the stock could not give all).
ALTER TABLE orders ADD COLUMN stock_reservation text
    CHECK (stock_reservation IN ('reserved', 'converted', 'released', 'short'));
ALTER TABLE orders ADD CONSTRAINT orders_stock_reservation_of_a_reserving_order
    CHECK ((stock_reservation IS NULL) = (stock_reserved_until IS NULL));
UPDATE orders o SET stock_reservation = CASE
        WHEN jsonb_array_length(o.stock_shortfall) > 0 THEN 'short'
        WHEN EXISTS (SELECT 1 FROM ledger_transfer t
                      WHERE t.order_id = o.id AND t.ledger = 'stock' AND t.phase = 'post')
            THEN 'converted'
        WHEN EXISTS (SELECT 1 FROM ledger_transfer t JOIN ledger_open_pending p
                             ON p.pending_id = t.id WHERE t.order_id = o.id)
            THEN 'reserved'
        ELSE 'released' END
 WHERE o.stock_reserved_until IS NOT NULL;

-- A customer's unpaid reserving orders, counted against
-- ONCEPAY_STOCK_CUSTOMER_OPEN_ORDERS when its token creates another.
CREATE INDEX orders_customer_reserving_idx ON orders (merchant_id, customer_id)
    WHERE status = 'awaiting_payment' AND stock_reservation = 'reserved';

-- 2. The service's keys and its clients' keys never meet.
--
-- A transfer's key was one text for both: a client's Idempotency-Key and
-- the keys the service derives (`payment:<id>`, `refund:<id>`,
-- `reservation:<order>:<sku>`, `sale:<order>:<sku>`), so a client could
-- take a key the service was about to use. Each key now has its space,
-- and a key is unique within its space only.
ALTER TABLE ledger_transfer ADD COLUMN key_space text
    CHECK (key_space IN ('client', 'service'));
-- Entries are append-only; this one-time backfill of a new column is the
-- migration's, with the guard set aside for it alone.
ALTER TABLE ledger_transfer DISABLE TRIGGER ledger_transfer_append_only;
UPDATE ledger_transfer t SET key_space = CASE
        WHEN t.idempotency_key = 'payment:' || t.payment_id::text
          OR t.idempotency_key = 'refund:' || t.refund_id::text
          OR (t.order_id IS NOT NULL AND t.ledger = 'stock'
              AND (t.idempotency_key LIKE 'reservation:' || t.order_id::text || ':%'
                   OR t.idempotency_key LIKE 'sale:' || t.order_id::text || ':%'))
            THEN 'service'
        ELSE 'client' END
 WHERE t.idempotency_key IS NOT NULL;
ALTER TABLE ledger_transfer ENABLE TRIGGER ledger_transfer_append_only;
ALTER TABLE ledger_transfer ADD CONSTRAINT ledger_transfer_key_has_a_space
    CHECK ((idempotency_key IS NULL) = (key_space IS NULL));
ALTER TABLE ledger_transfer DROP CONSTRAINT ledger_transfer_one_per_key;
ALTER TABLE ledger_transfer ADD CONSTRAINT ledger_transfer_one_per_key
    UNIQUE (merchant_id, key_space, idempotency_key);

-- A service key found on a transfer that is not the one it names (another
-- kind, amount or account): recorded for a person, never reused.
ALTER TABLE incident DROP CONSTRAINT incident_kind_check;
ALTER TABLE incident ADD CONSTRAINT incident_kind_check CHECK (kind IN (
    'charge_on_failed_attempt', 'refund_on_failed_refund',
    'orphan_charge', 'books_mismatch', 'missing_at_provider',
    'refund_failed_after_success', 'ledger_key_conflict'));
CREATE UNIQUE INDEX incident_ledger_key_once ON incident (merchant_id, provider_object_id)
    WHERE kind = 'ledger_key_conflict';

-- 3. Totals change only through a transfer.
--
-- `posted` and `held` are what the transfer trigger applies; a direct
-- UPDATE of them (by any role, the service's own included) would make
-- money or stock out of nothing, spendable at once. The trigger below is
-- reached from `ledger_transfer_admit` at depth 2; a statement of a
-- client is at depth 1.
CREATE OR REPLACE FUNCTION ledger_account_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR NEW.id <> OLD.id OR NEW.merchant_id <> OLD.merchant_id
       OR NEW.ledger <> OLD.ledger OR NEW.unit <> OLD.unit OR NEW.kind <> OLD.kind
       OR NEW.owner <> OLD.owner THEN
        RAISE EXCEPTION 'ledger_account: only its totals change (% refused)', TG_OP
            USING ERRCODE = '42501';
    END IF;
    IF (NEW.posted <> OLD.posted OR NEW.held <> OLD.held) AND pg_trigger_depth() < 2 THEN
        RAISE EXCEPTION 'ledger_account: totals change only through a ledger transfer'
            USING ERRCODE = '42501', CONSTRAINT = 'ledger_totals_by_transfer';
    END IF;
    RETURN NEW;
END
$$;

-- A new account starts at zero: its totals come from transfers only.
CREATE FUNCTION ledger_account_starts_empty() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.posted <> 0 OR NEW.held <> 0 THEN
        RAISE EXCEPTION 'ledger_account: a new account starts at zero (totals change only through a ledger transfer)'
            USING ERRCODE = '42501', CONSTRAINT = 'ledger_totals_by_transfer';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER ledger_account_starts_empty BEFORE INSERT ON ledger_account
    FOR EACH ROW EXECUTE FUNCTION ledger_account_starts_empty();

CREATE TRIGGER ledger_account_no_truncate BEFORE TRUNCATE ON ledger_account
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

-- The open holds are the transfer trigger's work list: written by it
-- alone, never emptied by hand.
CREATE FUNCTION ledger_open_pending_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() < 2 THEN
        RAISE EXCEPTION 'ledger_open_pending is written by ledger transfers only (% refused)',
            TG_OP USING ERRCODE = '42501', CONSTRAINT = 'ledger_totals_by_transfer';
    END IF;
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END
$$;
CREATE TRIGGER ledger_open_pending_guard BEFORE INSERT OR UPDATE OR DELETE ON ledger_open_pending
    FOR EACH ROW EXECUTE FUNCTION ledger_open_pending_guard();
CREATE TRIGGER ledger_open_pending_no_truncate BEFORE TRUNCATE ON ledger_open_pending
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

-- A transfer names its holder as the holder's account does: the owner of
-- the holder account (a customer id, `on_hand`), never another.
CREATE FUNCTION ledger_transfer_holder_is_owner() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM ledger_account a
                    WHERE a.id = NEW.holder_account_id AND a.owner = NEW.holder) THEN
        RAISE EXCEPTION 'ledger transfer %: its holder is not its account''s owner', NEW.id
            USING ERRCODE = '23514', CONSTRAINT = 'ledger_transfer_holder_is_owner';
    END IF;
    RETURN NEW;
END
$$;
-- Named to run before `ledger_transfer_admit` (triggers of one event fire
-- in name order), so a refused transfer moves nothing.
CREATE TRIGGER ledger_transfer_a_holder_is_owner BEFORE INSERT ON ledger_transfer
    FOR EACH ROW EXECUTE FUNCTION ledger_transfer_holder_is_owner();
