-- A payment that waits for its customer in the shop's own page (Stripe's
-- `use_stripe_sdk`, a payment made without a `return_url`): the
-- PaymentIntent's client secret, for Stripe.js `handleNextAction`. Like a
-- redirect's URL, it is kept while the payment is pending and cleared when
-- it settles; its deadline is `action_required_at` either way.
ALTER TABLE payment_attempt ADD COLUMN next_action_client_secret text;
