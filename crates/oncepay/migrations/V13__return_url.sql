-- Where the customer's bank sends them back after 3-D Secure, as the
-- payment's request gave it: kept on the attempt so that a charge sent
-- again later (after a crash, by the reconciler) carries it too.
ALTER TABLE payment_attempt ADD COLUMN return_url text;
