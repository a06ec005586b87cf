-- What a payment's disputes hold back from refunds, decided by the
-- database as well as by `domain::refund::plan`: a refund is never created
-- for money the customer's bank has taken back already (refunding a
-- charged-back payment would pay the customer twice).
--
-- An inquiry (Stripe's `warning_*`: the bank asked, took nothing) holds
-- nothing; the adapter says which disputes are inquiries, so no provider's
-- words are in this SQL.
ALTER TABLE dispute ADD COLUMN inquiry boolean NOT NULL DEFAULT false;
UPDATE dispute SET inquiry = true WHERE provider_status LIKE 'warning\_%';

-- The second line of defence of `409 payment_disputed`: a new refund (but
-- an incident's, which returns a charge of a failed attempt) must fit in
-- the payment's amount, less its refunds not failed, less the amounts of
-- its chargebacks open or lost. The command holds the payment's row lock
-- when it inserts a refund and when it applies a dispute, so the sums
-- read here cannot move under it.
CREATE FUNCTION refund_within_disputes() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    paid      bigint;
    committed bigint;
    held      bigint;
BEGIN
    IF NEW.incident THEN
        RETURN NEW;
    END IF;
    SELECT amount INTO paid FROM payment_attempt WHERE id = NEW.payment_id;
    SELECT COALESCE(sum(amount), 0) INTO committed FROM refund
     WHERE payment_id = NEW.payment_id AND status <> 'failed' AND id <> NEW.id;
    SELECT COALESCE(sum(amount), 0) INTO held FROM dispute
     WHERE payment_id = NEW.payment_id AND status <> 'won' AND NOT inquiry;
    IF held > 0 AND NEW.amount + committed + held > paid THEN
        RAISE EXCEPTION 'refund % of payment %: % + % refunded + % disputed exceeds %',
            NEW.id, NEW.payment_id, NEW.amount, committed, held, paid
            USING ERRCODE = 'check_violation', CONSTRAINT = 'refund_within_disputes';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER refund_within_disputes BEFORE INSERT ON refund
    FOR EACH ROW EXECUTE FUNCTION refund_within_disputes();
