-- A refund the provider paid and then failed (Stripe: a card expired or
-- closed; the money went back to the merchant's balance). The refund moves
-- succeeded -> failed and its amount is refundable again; the incident
-- tells a person, once per refund.
ALTER TABLE incident DROP CONSTRAINT incident_kind_check;
ALTER TABLE incident ADD CONSTRAINT incident_kind_check CHECK (kind IN (
    'charge_on_failed_attempt', 'refund_on_failed_refund',
    'orphan_charge', 'books_mismatch', 'missing_at_provider',
    'refund_failed_after_success'));
CREATE UNIQUE INDEX incident_refund_failed_once ON incident (refund_id)
    WHERE kind = 'refund_failed_after_success';
