-- Lists page newest first by time-ordered id, per merchant.
CREATE INDEX orders_merchant_id_idx ON orders (merchant_id, id);
CREATE INDEX payment_attempt_merchant_id_idx ON payment_attempt (merchant_id, id);
CREATE INDEX refund_merchant_id_idx ON refund (merchant_id, id);
