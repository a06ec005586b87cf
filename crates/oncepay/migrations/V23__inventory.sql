-- Stock for the SKUs a merchant tracks (issue 46), on the ledger of V21:
-- a SKU's stock is a holder account of the ledger 'stock' whose unit is
-- the SKU (`posted` = on hand, `held` = reserved), a reservation is a
-- pending transfer to the merchant's 'sold' system account with an
-- expiry, a conversion its post, a release its void. No new rule is
-- written for stock: the engine's own constraints are the stock rules.
--
-- * on hand never below zero, reserved never above on hand:
--   `ledger_account_never_negative` (posted >= 0, held <= posted);
-- * a reservation resolved (converted, released, expired) at most once:
--   `ledger_transfer_resolved_once`;
-- * a conversion never after the reservation expired:
--   `ledger_post_before_expiry`;
-- * one reservation per order and SKU, one late sale per order and SKU:
--   `ledger_transfer_one_per_key` (keys `reservation:<order>:<sku>`,
--   `sale:<order>:<sku>`).
--
-- What this adds: the ledger's name, the order a transfer is for, the
-- order's own stock fields, and a guard that no order leaves
-- `awaiting_payment` with a reservation still open.

ALTER TABLE ledger_account DROP CONSTRAINT ledger_account_ledger_check;
ALTER TABLE ledger_account ADD CONSTRAINT ledger_account_ledger_check
    CHECK (ledger IN ('balance', 'stock'));

-- The order a stock transfer reserves, converts, releases or sells for.
-- Adding a nullable column rewrites no row (the append-only trigger is
-- not fired by DDL).
ALTER TABLE ledger_transfer ADD COLUMN order_id uuid;
CREATE INDEX ledger_transfer_order_idx ON ledger_transfer (order_id) WHERE order_id IS NOT NULL;

-- `GET /inventory`: a merchant's stock accounts in SKU order (bytewise,
-- as the service sorts them and as locks are taken).
CREATE INDEX ledger_account_stock_idx ON ledger_account (merchant_id, (unit COLLATE "C"))
    WHERE ledger = 'stock' AND kind = 'holder';

-- Until when the order's reservation counts (null: nothing reserved), and
-- what a payment after its expiry could not take: [{sku, missing}].
ALTER TABLE orders ADD COLUMN stock_reserved_until timestamptz;
ALTER TABLE orders ADD COLUMN stock_shortfall jsonb NOT NULL DEFAULT '[]'
    CHECK (jsonb_typeof(stock_shortfall) = 'array');

-- An order that is paid, authorized, refunded or cancelled has no open
-- reservation: whatever statement moved it, its stock was converted or
-- released in the same transaction (`inventory::follow_order`). Checked
-- at commit, after the transaction's transfers; only for orders that
-- reserved stock.
CREATE FUNCTION orders_stock_resolved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM ledger_transfer t JOIN ledger_open_pending o ON o.pending_id = t.id
                WHERE t.order_id = NEW.id) THEN
        RAISE EXCEPTION 'order % is % with its stock reservation still open', NEW.id, NEW.status
            USING ERRCODE = '23514', CONSTRAINT = 'orders_stock_resolved';
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER orders_stock_resolved AFTER UPDATE OF status ON orders
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.stock_reserved_until IS NOT NULL AND NEW.status <> 'awaiting_payment')
    EXECUTE FUNCTION orders_stock_resolved();

-- Inventory events: `inventory.adjusted` (its object the stock item, no
-- order) and `order.stock_*` (their object the order).
ALTER TABLE event DROP CONSTRAINT event_object_type_check;
ALTER TABLE event ADD CONSTRAINT event_object_type_check
    CHECK (object_type IN ('order', 'payment', 'refund', 'dispute', 'balance', 'balance_hold',
                           'inventory'));
